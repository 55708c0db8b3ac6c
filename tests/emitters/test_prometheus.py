"""The Prometheus metrics service: families, exemplars, auth, TLS, multiprocess, promtool lint.

Everything goes through a real recorder and a real HTTP server on 127.0.0.1; scrapes are parsed with
prometheus-client's own parser.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.measure import measure_request, measure_result
from mcp_token_otel.emitters.aggregate import label_value
from mcp_token_otel.emitters.prometheus_service import PrometheusService, start_prometheus
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.calls import exchange

BIG = {"content": [{"type": "text", "text": "word " * 14000}]}  # ~10k tokens estimated: critical
SMALL = {"content": [{"type": "text", "text": "ok"}], "_meta": {"k": "v"}}
DUMP = {"name": "dump", "arguments": {"all": True}}


def make_recorder(**config: Any) -> TokenRecorder:
    prometheus = {"host": "127.0.0.1", "port": 0, "tool_output_rate_budget": 42, "service_output_rate_budget": 420,
                  **config.pop("prometheus", {})}
    cfg = config_from_dict({"budget": {"context_window": 20_000}, "prometheus": prometheus, **config})
    return TokenRecorder(cfg, TracerProvider(), MeterProvider())


def serve(recorder: TokenRecorder) -> PrometheusService:
    """/metrics of ``recorder`` on a real server (127.0.0.1, any free port)."""
    service = start_prometheus(recorder, recorder.config.prometheus)
    assert service.server is not None
    return service


def drive(recorder: TokenRecorder, session: str = "sess-secret-1234") -> None:
    # The server declares its tools first (as clients list them before calling): their names become labels.
    exchange(recorder, "server", "tools/list", {}, None, result={"tools": [{"name": "dump"}, {"name": "ping"}]})
    exchange(recorder, "server", "tools/call", DUMP, session, result=BIG)
    exchange(recorder, "server", "tools/call", DUMP, session, result=BIG)  # -> exhausted
    exchange(recorder, "server", "tools/call", {"name": "ping"}, "other", result=SMALL)
    exchange(recorder, "client", "tools/call", {"name": "ping"}, None, error={"code": -32602, "message": "bad"})


@pytest.fixture
def served() -> Iterator[tuple[TokenRecorder, PrometheusService]]:
    recorder = make_recorder()
    service = serve(recorder)
    try:
        yield recorder, service
    finally:
        service.close()
        recorder.close()


def url_of(service: PrometheusService) -> str:
    assert service.server is not None
    return service.server.url


def scrape(url: str, accept: str | None = None, auth: tuple[str, str] | None = None,
           context: ssl.SSLContext | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url)
    if accept:
        request.add_header("Accept", accept)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def samples(body: str, openmetrics: bool = False) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in (openmetrics_families if openmetrics else text_string_to_metric_families)(body):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(found: dict, name: str, **labels: str) -> float:
    return sum(v for lbl, v in found.get(name, []) if all(lbl.get(k) == x for k, x in labels.items()))


def test_families_labels_and_values(served: tuple[TokenRecorder, PrometheusService]) -> None:
    recorder, service = served
    drive(recorder)
    status, ctype, body = scrape(url_of(service))
    assert status == 200 and ctype.startswith("text/plain")
    found = samples(body)
    assert value(found, "mcp_token_message_tokens_count", side="server", tool="dump", direction="output") == 2
    assert value(found, "mcp_token_responses_total", side="server", tool="dump", risk_tier="critical") == 2
    assert not any("risk_tier" in lbl for lbl, _ in found["mcp_token_message_tokens_count"])  # derivable
    # _created series only when asked (prometheus.created_series)
    assert not any(name.endswith("_created") for name in found)
    # requests: their tokens in the counter, no histogram unless metrics.input_histograms
    assert value(found, "mcp_token_tokens_total", direction="input", tool="dump") > 0
    assert not any(lbl["direction"] == "input" for lbl, _ in found["mcp_token_message_tokens_count"])
    assert value(found, "mcp_token_tokens_total", side="server", tool="dump", direction="output") > 16_000
    assert value(found, "mcp_token_responses_total", side="server", method="tools/call", risk_tier="high") == 0
    big, small = (measure_result("tools/call", r, policy=recorder.policy) for r in (BIG, SMALL))
    overhead = value(found, "mcp_token_overhead_tokens_total", side="server", method="tools/call")
    assert overhead == 2 * big.overhead_tokens + small.overhead_tokens > 0
    assert value(found, "mcp_token_responses_total", side="client", risk_tier="low", tool="ping") == 1
    assert value(found, "mcp_token_responses_total", side="client", tool="ping", risk_tier="high") == 0
    # tokens_total is the histogram's sum
    assert value(found, "mcp_token_tokens_total", side="server", tool="dump", direction="output") == value(
        found, "mcp_token_message_tokens_sum", side="server", tool="dump", direction="output")
    assert value(found, "mcp_token_session_transitions_total", side="server", state="warning") == 1
    assert value(found, "mcp_token_session_transitions_total", side="server", state="exhausted") == 1
    assert value(found, "mcp_token_sessions", side="server", state="exhausted") == 1
    assert value(found, "mcp_token_sessions", side="server", state="ok") == 1
    assert value(found, "mcp_token_output_rate_budget_tokens_per_second", scope="tool") == 42
    assert value(found, "mcp_token_output_rate_budget_tokens_per_second", scope="service") == 420
    assert value(found, "mcp_token_instrumentation_errors_total", stage="estimate") == 0
    # the session ended: its utilization is observed once, and it is no longer live
    recorder.end_session("server", "sess-secret-1234")
    found = samples(scrape(url_of(service))[2])
    assert value(found, "mcp_token_session_utilization_ratio_count", side="server") == 1
    assert value(found, "mcp_token_session_utilization_ratio_bucket", side="server", le="0.9") == 0
    assert value(found, "mcp_token_sessions", side="server", state="exhausted") == 0


def test_no_session_id_anywhere_in_the_exposition(served: tuple[TokenRecorder, PrometheusService]) -> None:
    recorder, service = served
    drive(recorder)
    body = scrape(url_of(service))[2]
    assert "sess-secret-1234" not in body and "other" not in body.replace("_other", "")
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            assert not any("session" in label for label in sample.labels), sample


def test_tool_names_overflow_and_are_sanitised() -> None:
    recorder = make_recorder(metrics={"max_tool_names": 3})
    for i in [*range(10), 0]:
        exchange(recorder, "server", "tools/call", {"name": f"tool{i}"}, None, result=SMALL)
    tools = {lbl["tool"] for lbl, _ in samples(_body(recorder))["mcp_token_message_tokens_count"]}
    assert tools == {"tool0", "tool1", "tool2", "_other"}
    assert label_value("bad\ud800name\n" + "x" * 500) == "bad?name_" + "x" * 119
    assert label_value(None) == "" and len(label_value("y" * 1000)) == 128


def test_created_series_only_when_asked() -> None:
    recorder = make_recorder(prometheus={"created_series": True})
    exchange(recorder, "server", "tools/call", {"name": "t"}, None, result=SMALL)
    found = samples(_body(recorder))
    assert value(found, "mcp_token_message_tokens_created", tool="t") > 1_700_000_000
    assert value(found, "mcp_token_tokens_created", tool="t") > 1_700_000_000


def _body(recorder: TokenRecorder) -> str:
    """What /metrics serves for ``recorder`` (its configuration's renderer)."""
    return start_prometheus(recorder, recorder.config.prometheus, serve=False).exposition().decode()


@pytest.mark.parametrize("accept", [None, "application/openmetrics-text; version=1.0.0"])
def test_input_histograms_are_served_only_when_asked(accept: str | None) -> None:
    """metrics.input_histograms: the requests' token histogram on /metrics (both encoders) and in OTel; off,
    their tokens are in tokens_total alone, on both paths."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    for enabled in (False, True):
        cfg = config_from_dict({"metrics": {"input_histograms": enabled, "defer_otel": False},
                                "prometheus": {"host": "127.0.0.1", "port": 0}})
        reader = InMemoryMetricReader()
        recorder = TokenRecorder(cfg, TracerProvider(), MeterProvider(metric_readers=[reader]))
        drive(recorder)
        service = serve(recorder)
        try:
            body = scrape(url_of(service), accept=accept)[2]
        finally:
            service.close()
            recorder.close()
        found = samples(body, openmetrics=accept is not None)
        counts = {lbl["direction"] for lbl, _ in found["mcp_token_message_tokens_count"]}
        assert counts == ({"input", "output"} if enabled else {"output"})
        # drive() sends the request {"name": "dump", "arguments": {"all": true}} twice: a handful of tokens each,
        # counted either way
        assert value(found, "mcp_token_message_tokens_count", direction="input", tool="dump") == 2 * enabled
        request = measure_request("tools/call", DUMP, recorder.policy).total_tokens
        assert 3 <= request <= 20
        assert value(found, "mcp_token_tokens_total", direction="input", tool="dump") == 2 * request
        points = {
            dict(point.attributes).get("mcp_token.direction")
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == "mcp_token.message.tokens"
            for point in metric.data.data_points
        }
        assert points == ({"input", "output"} if enabled else {"output"})


def test_exemplars_carry_the_trace_id_in_openmetrics(served: tuple[TokenRecorder, PrometheusService]) -> None:
    recorder, service = served
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("tools/call dump") as span:
        exchange(recorder, "server", "tools/call", {"name": "dump"}, "s", result=BIG, span=span)
        trace_id = format(span.get_span_context().trace_id, "032x")
    status, ctype, body = scrape(url_of(service), accept="application/openmetrics-text; version=1.0.0")
    assert status == 200 and ctype.startswith("application/openmetrics-text")
    bucket_lines = [line for line in body.splitlines() if line.startswith("mcp_token_message_tokens_bucket")]
    assert any(f'trace_id="{trace_id}"' in line for line in bucket_lines)
    plain = scrape(url_of(service))[2]
    assert "trace_id" not in plain  # the classic text format has no exemplars


def test_basic_auth_on_the_server_and_the_asgi_app() -> None:
    recorder = make_recorder(prometheus={"basic_auth_username": "prom", "basic_auth_password": "s3cret"})
    service = serve(recorder)
    try:
        assert scrape(url_of(service))[0] == 401
        assert scrape(url_of(service), auth=("prom", "wrong"))[0] == 401
        status, _, body = scrape(url_of(service), auth=("prom", "s3cret"))
        assert status == 200 and "mcp_token_output_rate_budget_tokens_per_second" in body
    finally:
        service.close()

    app = service.asgi_app()

    async def call(headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/metrics", "query_string": b"", "headers": headers}
        await app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    assert anyio.run(call, [])[0] == 401
    good = [(b"authorization", b"Basic " + base64.b64encode(b"prom:s3cret"))]
    status, body = anyio.run(call, good)
    assert status == 200 and b"mcp_token_output_rate_budget_tokens_per_second" in body


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")
def test_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    recorder = make_recorder(prometheus={"tls_cert_file": str(cert), "tls_key_file": str(key)})
    service = serve(recorder)
    server = service.server
    assert server is not None
    idle = socket.create_connection((server.host, server.port))  # connects and never sends a ClientHello
    try:
        assert server.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        status, _, body = scrape(server.url, context=context)  # not stuck behind the idle connection
        assert status == 200 and "mcp_token_sessions" in body
    finally:
        service.close()  # returns although the idle connection is still open
        idle.close()


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/system-deps installs it (Debian package prometheus)")
        pytest.skip("promtool not installed")
    return path


def test_promtool_check_metrics_is_clean(served: tuple[TokenRecorder, PrometheusService]) -> None:
    from prometheus_client import generate_latest

    promtool = _promtool()
    recorder, service = served
    drive(recorder)
    recorder.end_session("server", "other")
    body = scrape(url_of(service))[2]
    result = subprocess.run([promtool, "check", "metrics"], input=body.encode(), capture_output=True, timeout=60)
    assert result.returncode == 0 and result.stdout == b"" and result.stderr == b"", result
    # The client's own encoder, on the same data.
    reference = generate_latest(service.registry)
    result = subprocess.run([promtool, "check", "metrics"], input=reference, capture_output=True, timeout=60)
    assert result.returncode == 0 and result.stdout == b"" and result.stderr == b"", result
    # The fast renderer the /metrics service serves for plain-text scrapes, on the same data.
    fast = service.exposition()
    result = subprocess.run([promtool, "check", "metrics"], input=fast, capture_output=True, timeout=60)
    assert result.returncode == 0 and result.stdout == b"" and result.stderr == b"", result


WORKER = textwrap.dedent(
    """
    import sys
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.recorder import TokenRecorder
    recorder = TokenRecorder(config_from_dict({}))

    def exchange(method, params, result, seconds):
        call = recorder.begin("server", method, params, "s", server="mp")
        call.open(started=0.0)
        call.result(result, at=seconds)  # the duration: on open's clock
        call.close()

    for _ in range(int(sys.argv[1])):
        exchange("tools/call", {"name": "t"}, {"content": [{"type": "text", "text": "x"}]}, 0.015)
    exchange("tools/call", {"name": "t"}, {"content": [], "isError": True}, 2.5)
    exchange("tools/list", {}, {"tools": [{"name": "t", "description": "d"}]}, 0.01)
    recorder.close()  # what uninstrument() does at a worker's exit: the live sessions' gauges written
    """
)
READER = textwrap.dedent(
    """
    import sys
    from prometheus_client import generate_latest, multiprocess
    from mcp_token_otel.emitters.prometheus_multiprocess import multiprocess_registry
    for pid in sys.argv[1:]:  # what a server's worker-exit hook does (gunicorn child_exit)
        multiprocess.mark_process_dead(int(pid))
    print(generate_latest(multiprocess_registry()).decode())
    """
)


def test_multiprocess_mode_merges_workers(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    pids = []
    for count in ("3", "4"):
        worker = subprocess.Popen([sys.executable, "-c", WORKER, count], env=env)
        assert worker.wait(timeout=120) == 0
        pids.append(str(worker.pid))

    def read(*dead: str) -> dict:
        out = subprocess.run([sys.executable, "-c", READER, *dead], env=env, check=True, capture_output=True,
                             timeout=120)
        return samples(out.stdout.decode())

    found = read()
    assert value(found, "mcp_token_message_tokens_count", tool="t") == 9  # 3 + 4 results, one error each
    assert value(found, "mcp_token_tokens_total", tool="t") >= 7
    assert value(found, "mcp_token_sessions", state="ok") == 2  # one live session per worker, summed
    assert value(found, "mcp_token_output_rate_budget_tokens_per_second", scope="tool") == 100
    # The RED families and the server dimension in multiprocess mode too.
    assert value(found, "mcp_token_message_tokens_count", tool="t", server="mp") == 9
    assert value(found, "mcp_token_call_errors_total", tool="t", server="mp", error_type="tool_error") == 2
    # Errors and successes in one duration series (no error_type): call_errors_total has the errors.
    assert value(found, "mcp_token_operation_duration_seconds_count", tool="t") == 9
    assert value(found, "mcp_token_operation_duration_seconds_bucket", tool="t", le="0.02") == 7
    assert value(found, "mcp_token_operation_duration_seconds_bucket", tool="t", le="2.0") == 7  # errors took 2.5 s
    assert value(found, "mcp_token_operation_duration_seconds_bucket", tool="t", le="5.0") == 9
    assert value(found, "mcp_token_responses_total", tool="t") == 9
    assert value(found, "mcp_token_bytes_total", tool="t", direction="output") > 0
    assert value(found, "mcp_token_tool_definitions_tokens", server="mp") > 0
    # once the workers are marked dead, their sessions no longer count as live; counters stay
    found = read(*pids)
    assert value(found, "mcp_token_sessions", state="ok") == 0
    assert value(found, "mcp_token_message_tokens_count", tool="t") == 9


def test_instrument_serves_real_mcp_traffic_and_uninstrument_stops_it() -> None:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    from mcp_token_otel.instrumentation import instrument, metrics_app, uninstrument

    if importlib.util.find_spec("mcp.shared.dispatcher") is None:
        pytest.skip("uses the mcp 2.x client")
    recorder = instrument(config_from_dict({"prometheus": {"enabled": True, "port": 0}}),
                          tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    assert recorder is not None
    try:
        from mcp_token_otel.instrumentation import prometheus_service

        url = prometheus_service().server.url
        server = MCPServer("prom")

        @server.tool()
        def dump(n: int) -> str:
            return "word " * n

        async def calls() -> None:
            async with Client(server, mode="legacy") as client:
                for n in (10, 12000):
                    await client.call_tool("dump", {"n": n})

        anyio.run(calls)
        found = samples(scrape(url)[2])
        assert value(found, "mcp_token_message_tokens_count", side="server", tool="dump", direction="output") == 2
        assert value(found, "mcp_token_message_tokens_count", side="client", tool="dump", direction="output") == 2
        assert value(found, "mcp_token_responses_total", side="server", tool="dump", risk_tier="critical") == 1
        assert value(found, "mcp_token_sessions", side="server", state="ok") == 0  # the connection ended

        app = metrics_app("wsgi")
        body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""},
                            lambda status, headers: None))
        assert b"mcp_token_message_tokens_bucket" in body
    finally:
        uninstrument()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


def test_fast_exposition_carries_exactly_what_generate_latest_does() -> None:
    from prometheus_client import generate_latest

    recorder = make_recorder()
    drive(recorder)
    exchange(recorder, "server", "tools/call", {"name": 'we"ird\\name'}, None, result=SMALL)
    exchange(recorder, "server", "tools/call", {"name": "dump"}, None, result=SMALL, started=0.0,
             at=0.25)  # operation_duration
    exchange(recorder, "server", "tools/call", {"name": "dump"}, None, error={"code": -32603, "message": "x"},
             started=0.0, at=2.0)
    recorder.end_session("server", "sess-secret-1234")
    service = start_prometheus(recorder, recorder.config.prometheus, serve=False)
    assert service.collector is not None

    def parsed(body: bytes) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {(s.name, tuple(sorted(s.labels.items())), s.value)
                for family in text_string_to_metric_families(body.decode()) for s in family.samples}

    fast, reference = service.collector.exposition(service.registry), generate_latest(service.registry)
    assert parsed(fast) == parsed(reference) and len(parsed(fast)) > 50
    assert b'mcp_token_operation_duration_seconds_bucket{le="2.0",method="tools/call",' in fast
    assert fast == reference  # byte for byte: labels sorted, numbers formatted as generate_latest does

    # Again after more traffic (the cached label text and line prefixes are reused), with values past 1e6
    # (Go's exponent form: 1.000002e+06), a counter past 1e6, and a collector of the registry's own.
    exchange(recorder, "server", "tools/call", {"name": 'we"ird\\name'}, None, result=BIG)
    for _ in range(1_000_001):
        recorder.aggregate.observe("mcp_token_session_duration_seconds", ("server", ""), 0.01)
    recorder.aggregate.add("mcp_token_cost_usd", ("server", "", "dump"), 2_500_000.5)
    from prometheus_client import Counter

    Counter("app_requests", "Requests of the application itself.", ["path"],
            registry=service.registry).labels("/").inc()
    fast, reference = service.collector.exposition(service.registry), generate_latest(service.registry)
    assert fast == reference
    assert re.search(rb'mcp_token_session_duration_seconds_count\{server="",side="server"\} 1\.00000\de\+06\n', fast)
    assert b"} 2.5000005e+06\n" in fast and b'app_requests_total{path="/"} 1.0\n' in fast


def test_the_server_serves_the_fast_exposition_for_plain_text_and_the_client_encoder_for_openmetrics() -> None:
    from mcp_token_otel.emitters.prometheus_service import start_prometheus

    config = config_from_dict({"estimator": "chars/4", "prometheus": {"port": 0}})
    recorder = TokenRecorder(config)
    service = start_prometheus(recorder, config.prometheus)
    try:
        assert service.server is not None
        drive(recorder)
        url = f"http://127.0.0.1:{service.server.port}/metrics"
        status, content_type, body = scrape(url)
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        assert body.encode() == service.exposition()  # no traffic in between: the same bytes
        status, content_type, body = scrape(url, accept="application/openmetrics-text; version=1.0.0")
        assert status == 200 and content_type.startswith("application/openmetrics-text") and body.endswith("# EOF\n")
    finally:
        service.close()
        recorder.close()
