"""An OTLP/gRPC trace backend for the tests: it stands where Tempo is in the shipped config, and counts the
spans each service sent."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent import futures
from typing import Any

import grpc  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class TraceSink(trace_service_pb2_grpc.TraceServiceServicer):
    """Listens on 127.0.0.1 (``port``); ``spans`` counts spans per service.name, ``attributes`` the span
    attribute keys seen per service."""

    def __init__(self) -> None:
        self.spans: Counter[str] = Counter()
        self.attributes: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def Export(self, request: Any, context: Any) -> Any:  # the generated servicer's method name
        with self._lock:
            for resource_spans in request.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                service = attributes.get("service.name", "")
                keys = self.attributes.setdefault(service, set())
                for scope_spans in resource_spans.scope_spans:
                    self.spans[service] += len(scope_spans.spans)
                    for span in scope_spans.spans:
                        keys.update(a.key for a in span.attributes)
        return trace_service_pb2.ExportTraceServiceResponse()

    def stop(self) -> None:
        self._server.stop(grace=None).wait(10)
