"""The spill on the recorder's call path: ``call.guard()`` answers a read of a kept result in the server's place
(``call.refusal``: a page; ``call.refusal_error``: its JSON-RPC error), its families on /metrics and OpenTelemetry
with every outcome, span attributes without the uri, the resources capability and the listings answered only when
it was added here, the client side never keeping anything."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.spill import META_SPILL_KEY, is_spill_link
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.semconv import A_SPILL_OUTCOME, A_SPILL_PAGE
from tests.helpers.calls import exchange
from tests.helpers.spill_support import source_file
from tests.helpers.support import scrape

CALL = {"name": "read_file", "arguments": {"path": "/big.txt"}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A recorder with spans and an OpenTelemetry reader, and the engine's clock in hand."""

    def __init__(self, **guard: Any) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        config = config_from_dict({"guard": {"mode": "enforce", "max_response_tokens": 2000, "spill": True,
                                             "spill_ttl": 60, **guard}})
        self.rec = TokenRecorder(config, provider, MeterProvider(metric_readers=[self.reader]), server_name="fs")
        self.clock = Clock()
        self.rec.guard.clock = self.clock

    def call(self, side: str = "server", key: str | None = "conv-a", text: str | None = None) -> Any:
        text = text if text is not None else source_file(8000)
        result = {"content": [{"type": "text", "text": json.dumps({"content": text})}],
                  "structuredContent": {"content": text}}
        delivered, _ = exchange(self.rec, side, "tools/call", CALL, key, result=result, guard=True)
        return delivered

    def read(self, uri: str, key: str | None = "conv-a", side: str = "server") -> tuple[Any, Any]:
        """(the page or error answered, the request's span)."""
        span = self.rec.start_span("resources/read", SpanKind.SERVER)
        call = self.rec.begin(side, "resources/read", {"uri": uri}, key)  # type: ignore[arg-type]
        call.span = span
        page = call.guard()
        error = call.refusal_error
        call.open(span)
        answered = call.refused() if page is not None or error is not None else None
        call.close()
        self.rec.end_span(span)
        return answered, self.exporter.get_finished_spans()[-1]

    def otel(self, name: str) -> dict[tuple[Any, ...], float]:
        self.rec.flush()
        data = self.reader.get_metrics_data()
        out: dict[tuple[Any, ...], float] = {}
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            out[tuple(sorted(point.attributes.items()))] = point.value
        return out


@pytest.fixture
def rig() -> Iterator[Rig]:
    made: list[Rig] = []

    def make(**guard: Any) -> Rig:
        made.append(Rig(**guard))
        return made[-1]

    yield make  # type: ignore[misc]
    for r in made:
        r.rec.close()


def test_every_read_outcome_is_answered_and_counted(rig: Any) -> None:
    r = rig()
    text = source_file(8000)
    cut = r.call(text=text)
    uri = cut["content"][-1]["uri"]
    pages = cut["content"][-1]["_meta"][META_SPILL_KEY]["pages"]
    texts = []
    for page in range(1, pages + 1):
        answer, span = r.read(f"{uri}?page={page}")
        texts.extend(item["text"] for item in answer["contents"])
        assert span.attributes[A_SPILL_OUTCOME] == "served" and span.attributes[A_SPILL_PAGE] == page
        assert not any(uri in str(v) for v in span.attributes.values())  # the id is a secret: never on a span
    assert "".join(texts) == text
    forbidden, _ = r.read(uri, key="conv-b")
    assert forbidden["code"] == -32602 and forbidden["data"]["reason"] == "not_found"
    invalid, span = r.read(uri + "?page=x")
    assert invalid["data"]["reason"] == "malformed" and span.attributes[A_SPILL_OUTCOME] == "invalid"
    unknown, _ = r.read("mcp-token-otel://spill/" + "0" * 32)
    assert unknown["data"]["reason"] == "not_found"
    r.clock.now += 61
    expired, span = r.read(uri)
    assert expired["data"]["reason"] == "expired" and span.attributes[A_SPILL_OUTCOME] == "expired"
    m = scrape(r.rec)
    base = {"side": "server", "server": "fs"}
    assert m.value("mcp_token_spill_reads_total", **base, tool="read_file", outcome="served") == pages
    for outcome in ("expired", "forbidden", "invalid"):
        assert m.value("mcp_token_spill_reads_total", **base, tool="read_file", outcome=outcome) == (
            1 if outcome != "invalid" else 0), outcome
    # A read that names no known result has no tool to name (invalid and unknown ids: the empty tool).
    assert m.value("mcp_token_spill_reads_total", **base, tool="", outcome="invalid") == 1
    assert m.value("mcp_token_spill_reads_total", **base, tool="", outcome="not_found") == 1
    spilled = m.value("mcp_token_spilled_tokens_total", **base, tool="read_file")
    read = m.value("mcp_token_spill_read_tokens_total", **base, tool="read_file")
    assert spilled > 7000 and read == spilled  # every page read once: all of it read back
    assert m.value("mcp_token_guard_actions_total", **base, policy="response_cap", action="spilled",
                   enforced="true", tool="read_file") == 1
    # The pages read entered the conversation's budget as resources/read output, as any read does.
    assert m.value("mcp_token_tokens_total", **base, method="resources/read", direction="output") > 7000
    # OpenTelemetry reads the same aggregate: the same figures under the attribute names.
    reads = r.otel("mcp_token.spill.reads")
    served = [v for attrs, v in reads.items() if ("mcp_token.spill.outcome", "served") in attrs]
    assert served == [pages]
    assert sum(r.otel("mcp_token.spill.read.tokens").values()) == read


def test_the_spill_event_is_on_the_tool_calls_span_and_refusals_are_counted(rig: Any) -> None:
    r = rig(spill_max_bytes=400_000)
    span = r.rec.start_span("tools/call read_file", SpanKind.SERVER)
    text = source_file(8000)
    result = {"content": [{"type": "text", "text": text}]}
    exchange(r.rec, "server", "tools/call", CALL, "conv-a", result=result, span=span)
    r.rec.end_span(span)
    events = [e.attributes for e in r.exporter.get_finished_spans()[-1].events if e.name == "mcp_token.guard"]
    assert [e["mcp_token.guard.action"] for e in events] == ["truncated", "spilled"]
    assert events[1]["mcp_token.guard.pages"] >= 4
    r.call(key=None)  # no budget key: no owner to keep it for
    r.call(text=source_file(150_000))  # more than spill_max_bytes
    for _ in range(12):  # each kept result pushes out older ones
        r.call()
    m = scrape(r.rec)
    base = {"side": "server", "server": "fs", "tool": "read_file"}
    assert m.value("mcp_token_spills_refused_total", **base, reason="no_owner") == 1
    assert m.value("mcp_token_spills_refused_total", **base, reason="too_large") == 1
    assert m.value("mcp_token_spill_evictions_total", side="server", server="fs") > 0
    # The reads' series exist from the first kept result on (alerts take increase()).
    assert m.value("mcp_token_spill_reads_total", **base, outcome="expired") == 0
    assert m.pick("mcp_token_spill_reads_total", **base, outcome="expired")


def test_the_client_side_keeps_nothing_and_declares_nothing(rig: Any) -> None:
    r = rig()
    cut = r.call(side="client")
    assert not any(is_spill_link(b) for b in cut["content"]) and "truncated" in cut["content"][-1]["text"]
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "fs", "version": "1"}}
    delivered, _ = exchange(r.rec, "client", "initialize", {}, "conv-a", result=init)
    assert delivered is init
    answer, _ = r.read("mcp-token-otel://spill/" + "0" * 32, side="client")
    assert answer is None  # the client's read goes to its server
    assert not scrape(r.rec).pick("mcp_token_spills_refused_total")


def test_listings_are_answered_only_when_the_capability_was_added_here(rig: Any) -> None:
    r = rig()
    bare = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "fs"}}

    def initialize(result: dict[str, Any], server: str) -> Any:
        return exchange(r.rec, "server", "initialize", {}, "conv-a", result=result, server=server)[0]

    def listing(method: str, server: str) -> Any:
        return exchange(r.rec, "server", method, {}, "conv-a", guard=True, server=server)[0]

    assert initialize(bare, "fs")["capabilities"]["resources"] == {}
    assert listing("resources/list", "fs") == {"resources": []}
    assert listing("resources/templates/list", "fs") == {"resourceTemplates": []}
    assert listing("resources/subscribe", "fs") is None  # every other resources request goes on
    declared = {**bare, "capabilities": {"resources": {}}}
    assert initialize(declared, "docs") is declared
    assert listing("resources/list", "docs") is None  # the server lists its own
    # A read of any other uri goes on to the server.
    assert exchange(r.rec, "server", "resources/read", {"uri": "file:///x"}, "conv-a", guard=True)[0] is None


def test_a_fault_while_keeping_is_counted_and_the_cut_delivered(rig: Any) -> None:
    from tests.core.spill.test_guard_spill import BrokenStore

    r = rig()
    r.rec.guard.spill_store = BrokenStore()
    cut = r.call()
    assert "truncated" in cut["content"][-1]["text"] and not is_spill_link(cut["content"][-1])
    m = scrape(r.rec)
    assert m.value("mcp_token_instrumentation_errors_total", stage="guard") == 1
    assert not m.pick("mcp_token_spills_refused_total")
    # A read that meets a broken store is a fault too: the request goes on to the server, unanswered here.
    answer, _ = r.read("mcp-token-otel://spill/" + "0" * 32)
    assert answer is None
    assert scrape(r.rec).value("mcp_token_instrumentation_errors_total", stage="guard") == 2
