"""The recorder's guards on its call path (GUARD.md): ``call.guard()`` before the request, ``call.result()`` with
the guards on, ``call.refused()``, the guard and cost metric families (/metrics and OpenTelemetry), span events,
and faults that let the call through."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from mcp_token_otel.core.guard import META_TOKENS_KEY, notices
from mcp_token_otel.core.measure import Policy, measure_request, measure_result
from mcp_token_otel.emitters.prometheus_service import start_prometheus
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.calls import exchange
from tests.helpers.support import make_config, scrape


class Harness:
    """A recorder with an in-memory span exporter and an OTel metric reader; its /metrics read by scrape()."""

    def __init__(self, **config: Any) -> None:
        self.exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.rec = TokenRecorder(make_config(**config), tracer_provider, self.meter_provider)

    def span(self, name: str = "tools/call t") -> Any:
        return self.rec.start_span(name, SpanKind.SERVER)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def value(self, name: str, **labels: str) -> float | None:
        """The sample of ``name`` with exactly ``labels`` on /metrics, None when there is none."""
        found = [v for lab, v in scrape(self.rec).pick(name, **labels) if lab == labels]
        return found[0] if found else None

    def guard(self, side: str, method: str, params: Any, key: str, server: str | None = None,
              span: Any = None) -> dict[str, Any] | None:
        """The request-side guards alone (the request is neither measured nor answered here)."""
        call = self.rec.begin(side, method, params, key, server=server)  # type: ignore[arg-type]
        call.span = span
        refusal = call.guard()
        call.close()
        return refusal

    def inputs(self, method: str, params: Any) -> int:
        """A request's tokens: they go to the budget with the answer's (one exchange, one budget record)."""
        return measure_request(method, params, self.rec.policy).total_tokens

    def otel(self, name: str) -> list[Any]:
        self.rec.flush()
        data = self.reader.get_metrics_data()
        points: list[Any] = []
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        points.extend(metric.data.data_points)
        return points


@pytest.fixture
def harness_factory() -> Iterator[Any]:
    made: list[Harness] = []

    def make(**config: Any) -> Harness:
        h = Harness(**config)
        made.append(h)
        return h

    yield make
    for h in made:
        h.rec.close()
        h.meter_provider.shutdown()


def text_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def prose(chars: int) -> str:
    """Text that no padding check flags (varied words)."""
    return " ".join(f"item{i} of the list" for i in range(chars // 10))[:chars]


def guard_labels(policy: str, action: str, enforced: str, tool: str = "t", side: str = "server") -> dict[str, str]:
    return {"side": side, "server": "_unknown", "policy": policy, "action": action, "enforced": enforced, "tool": tool}


def test_off_by_default_returns_the_result_itself(harness_factory: Any) -> None:
    h = harness_factory()
    assert h.rec.guard_active is False and not h.rec.guards("server")
    result = text_result("hello " * 50)
    params = {"name": "t"}
    span = h.span()
    delivered, m = exchange(h.rec, "server", "tools/call", params, "s1", result=result, span=span, guard=True)
    h.rec.end_span(span)
    assert delivered is result and m is not None
    (s,) = h.spans()
    assert "mcp_token.cost_usd" not in s.attributes
    assert not [e for e in s.events if e.name == "mcp_token.guard"]
    assert h.rec.sessions["server"].get("s1").tokens == h.inputs("tools/call", params) + m.total_tokens


def test_cost_without_guard_uses_the_measurement(harness_factory: Any) -> None:
    h = harness_factory(guard={"model": "claude-sonnet-5-5"})
    assert h.rec.guard_active is False
    span = h.span()
    result = text_result("x" * 4000)
    delivered, m = exchange(h.rec, "server", "tools/call", {"name": "t"}, "s1", result=result, span=span)
    h.rec.end_span(span)
    assert delivered is result and m is not None
    expected = m.total_tokens * 2.0 / 1_000_000  # the result's tokens: what entered the context
    (s,) = h.spans()
    assert s.attributes["mcp_token.cost_usd"] == pytest.approx(expected)
    assert h.value("mcp_token_cost_usd_total", side="server", server="_unknown", tool="t") == pytest.approx(expected)
    (point,) = h.otel("mcp_token.cost")
    assert point.value == pytest.approx(expected)
    assert dict(point.attributes) == {"mcp_token.side": "server", "mcp_token.server.name": "_unknown",
                                     "gen_ai.tool.name": "t"}


def test_session_hard_limit_refuses_and_counts(harness_factory: Any) -> None:
    h = harness_factory(budget={"context_window": 1000}, guard={"mode": "enforce", "session_hard_limit": True})
    assert h.rec.guard_active and h.rec.guards("server")
    span = h.span()
    params = {"name": "t", "arguments": {}}
    # The session's one call: guarded, let through, answered.
    delivered, _ = exchange(h.rec, "server", "tools/call", params, "s1", result=text_result(prose(4000)), span=span,
                            guard=True)
    h.rec.end_span(span)
    assert delivered["content"][0]["text"] == prose(4000)
    budget = h.rec.sessions["server"].get("s1")
    assert budget.state == "exhausted"
    tokens, calls = budget.tokens, 1  # tools/call requests, not messages

    span = h.span()
    call = h.rec.begin("server", "tools/call", params, "s1")
    call.span = span
    refusal = call.guard()
    assert refusal is not None and refusal["isError"] is True and call.refusal is refusal
    assert refusal["content"][0]["text"] == notices.budget_exhausted("t", tokens, 1000, calls)
    # The refusal is the call's answer: a tool error on the span, never guarded again.
    answers: list[Any] = []
    h.rec.listeners.append(lambda _call, m: answers.append(m))
    call.open(span)
    delivered = call.refused()
    call.close()
    h.rec.end_span(span)
    assert delivered is refusal
    (m,) = answers
    assert m.error_type == "tool_error"
    s = h.spans()[-1]
    assert s.attributes["error.type"] == "tool_error"
    (event,) = [e for e in s.events if e.name == "mcp_token.guard"]
    assert event.attributes["mcp_token.guard.policy"] == "session_limit"
    assert event.attributes["mcp_token.guard.action"] == "refused"
    assert event.attributes["mcp_token.guard.enforced"] is True
    assert event.attributes["mcp_token.guard.session_tokens"] == tokens
    assert h.value("mcp_token_guard_actions_total", **guard_labels("session_limit", "refused", "true")) == 1
    # Redesign: OpenTelemetry reads the shared aggregate, so it shows the series /metrics starts at 0 too (here
    # the padding policy's, on by default).
    points = h.otel("mcp_token.guard.actions")
    assert [p.attributes["mcp_token.guard.policy"] for p in points if p.value == 0] == ["padding"]
    assert [(dict(p.attributes), p.value) for p in points if p.value] == [(
        {"mcp_token.side": "server", "mcp_token.server.name": "_unknown", "mcp_token.guard.policy": "session_limit",
         "mcp_token.guard.action": "refused",
         "mcp_token.guard.enforced": True, "gen_ai.tool.name": "t"}, 1)]


def test_response_cap_delivers_the_cut_and_budgets_what_entered(harness_factory: Any) -> None:
    h = harness_factory(guard={"mode": "enforce", "max_response_tokens": 100, "model": "gpt-5.5"})
    result = text_result(prose(10_000))
    params = {"name": "t"}
    span = h.span()
    delivered, m = exchange(h.rec, "server", "tools/call", params, "s1", result=result, span=span)
    h.rec.end_span(span)
    assert m is not None and delivered is not result
    assert delivered["content"][-1]["text"].startswith("\n\n[mcp-token-otel: response truncated to the limit of 100")
    entered = measure_result("tools/call", delivered, tool_name="t", policy=h.rec.policy).total_tokens
    assert entered < m.total_tokens
    # The budget: the request and what entered the context (the cut), together.
    session = h.inputs("tools/call", params) + entered
    assert h.rec.sessions["server"].get("s1").tokens == session
    (s,) = h.spans()
    assert s.attributes["mcp_token.output_tokens"] == m.total_tokens  # what the server sent
    assert s.attributes["mcp_token.session.tokens"] == session  # what the model reads
    assert s.attributes["mcp_token.cost_usd"] == pytest.approx(entered * 5.0 / 1_000_000)
    (event,) = [e for e in s.events if e.name == "mcp_token.guard"]
    assert event.attributes["mcp_token.guard.cap"] == 100
    assert h.value("mcp_token_guard_actions_total", **guard_labels("response_cap", "truncated", "true")) == 1
    assert h.value("mcp_token_cost_usd_total", side="server", server="_unknown", tool="t") == pytest.approx(
        entered * 5.0 / 1_000_000)


def test_observe_counts_without_changing(harness_factory: Any) -> None:
    h = harness_factory(guard={"mode": "observe", "max_response_tokens": 100, "annotate_meta": True})
    result = text_result(prose(10_000))
    params = {"name": "t"}
    span = h.span()
    delivered, m = exchange(h.rec, "server", "tools/call", params, "s1", result=result, span=span)
    h.rec.end_span(span)
    assert delivered is result and m is not None
    assert h.rec.sessions["server"].get("s1").tokens == h.inputs("tools/call", params) + m.total_tokens
    assert h.value("mcp_token_guard_actions_total", **guard_labels("response_cap", "truncated", "false")) == 1
    assert h.value("mcp_token_guard_actions_total", **guard_labels("annotate_meta", "annotated", "false")) == 1


def test_every_method_s_result_is_guarded(harness_factory: Any) -> None:
    """Not only tools/call: a resources/read result goes through the result guards too, and the actions count."""
    h = harness_factory(guard={"mode": "enforce", "annotate_meta": True})
    span = h.span("resources/read")
    result = {"contents": [{"uri": "file:///a", "text": "abc " * 100}]}
    delivered, m = exchange(h.rec, "server", "resources/read", {"uri": "file:///a"}, "s1", result=result, span=span)
    h.rec.end_span(span)
    assert m is not None
    assert h.value("mcp_token_guard_actions_total",
                   **guard_labels("annotate_meta", "annotated", "true", tool="")) == 1
    assert delivered["_meta"][META_TOKENS_KEY]["tokens"] > 0 and "_meta" not in result


def test_errors_are_not_guarded(harness_factory: Any) -> None:
    h = harness_factory(guard={"mode": "enforce", "annotate_meta": True, "model": "gpt-5.5"})
    span = h.span()
    _, m = exchange(h.rec, "server", "tools/call", {"name": "t"}, "s1", error={"code": -32602, "message": "bad"},
                    span=span)
    h.rec.end_span(span)
    assert m is not None and m.error_type == "-32602"
    (s,) = h.spans()
    assert not [e for e in s.events if e.name == "mcp_token.guard"] and "mcp_token.cost_usd" not in s.attributes


def test_sides_limit_where_guards_run(harness_factory: Any) -> None:
    h = harness_factory(guard={"mode": "enforce", "annotate_meta": True, "sides": ["server"]})
    assert h.rec.guards("server") and not h.rec.guards("client")
    result = text_result("hi")
    on_client, _ = exchange(h.rec, "client", "tools/call", {"name": "t"}, "c1", result=result)
    on_server, _ = exchange(h.rec, "server", "tools/call", {"name": "t"}, "s1", result=result)
    assert on_client is result and on_server is not result


def test_rate_limit_counts_each_side_apart(harness_factory: Any) -> None:
    """An in-process client and server that share a session id must not count one call twice."""
    h = harness_factory(guard={"mode": "enforce", "rate_limit": True, "calls_per_minute": 2})
    params = {"name": "t", "arguments": {}}
    for _ in range(2):
        assert h.guard("client", "tools/call", params, "same") is None
        assert h.guard("server", "tools/call", params, "same") is None
    refusal = h.guard("server", "tools/call", params, "same")
    assert refusal is not None and refusal["content"][0]["text"] == notices.rate_limited("t", 2)
    h.rec.end_session("server", "same")  # forgets the server side's window
    assert h.guard("server", "tools/call", params, "same") is None
    assert h.guard("client", "tools/call", params, "same") is not None


def test_engine_faults_let_the_call_through(harness_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness_factory(guard={"mode": "enforce", "session_hard_limit": True, "annotate_meta": True})

    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("guard bug")

    monkeypatch.setattr(h.rec.guard, "on_request", boom)
    monkeypatch.setattr(h.rec.guard, "on_result", boom)
    span = h.span()
    result = text_result("hello")
    params = {"name": "t"}
    delivered, m = exchange(h.rec, "server", "tools/call", params, "s1", result=result, span=span, guard=True)
    h.rec.end_span(span)
    assert delivered is result and m is not None
    assert h.rec.sessions["server"].get("s1").tokens == h.inputs("tools/call", params) + m.total_tokens
    assert h.rec.error_counts["guard"] == 2
    assert h.value("mcp_token_instrumentation_errors_total", stage="guard", server="_unknown") == 2
    (s,) = h.spans()
    assert s.attributes["mcp_token.output_tokens"] == m.total_tokens


def _populated(h: Harness) -> None:
    """Guard and cost series with a server name, a tool, and one with neither."""
    exchange(h.rec, "server", "tools/call", {"name": "t"}, "s1", result=text_result(prose(4000)), server="srv")
    exchange(h.rec, "client", "resources/read", {"uri": "file:///a"}, "c1",
             result={"contents": [{"uri": "file:///a", "text": prose(400)}]})


def test_exposition_and_promtool(harness_factory: Any) -> None:
    """The fast exposition renders the guard families as generate_latest does, and promtool finds them clean."""
    from prometheus_client import generate_latest

    from tests.helpers.support import require_binary

    h = harness_factory(guard={"mode": "enforce", "max_response_tokens": 100, "annotate_meta": True,
                               "model": "gpt-5.5"})
    _populated(h)
    assert h.value("mcp_token_guard_actions_total", **{**guard_labels("response_cap", "truncated", "true"),
                                                       "server": "srv"}) == 1
    assert h.value("mcp_token_guard_actions_total",
                   **guard_labels("annotate_meta", "annotated", "true", tool="", side="client")) == 1
    assert h.value("mcp_token_cost_usd_total", side="client", server="_unknown", tool="") > 0
    service = start_prometheus(h.rec, h.rec.config.prometheus, serve=False)
    assert service.collector is not None
    fast = service.collector.exposition(service.registry)

    def parsed(body: bytes) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {(s.name, tuple(sorted(s.labels.items())), s.value)
                for family in text_string_to_metric_families(body.decode()) for s in family.samples
                if "guard" in s.name or "cost" in s.name}

    assert parsed(fast) == parsed(generate_latest(service.registry)) and len(parsed(fast)) == 5
    promtool = require_binary("promtool")
    done = subprocess.run([promtool, "check", "metrics"], input=fast, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


WORKER = """
from mcp_token_otel.config import config_from_dict
from mcp_token_otel.recorder import TokenRecorder
rec = TokenRecorder(config_from_dict({"estimator": "chars/4", "guard": {"mode": "observe", "annotate_meta": True,
                                                                        "model": "gpt-5.5"}}))
for _ in range(3):
    call = rec.begin("server", "tools/call", {"name": "t"}, "s", server="mp")
    call.open()
    call.result({"content": [{"type": "text", "text": "abcd" * 100}]})
    call.close()
rec.close()
"""
READER = """
from prometheus_client import generate_latest
from mcp_token_otel.emitters.prometheus_multiprocess import multiprocess_registry
print(generate_latest(multiprocess_registry()).decode())
"""


def test_multiprocess_mode(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", WORKER], env=env, check=True, timeout=120)
    out = subprocess.run([sys.executable, "-c", READER], env=env, check=True, capture_output=True, timeout=120)
    families = {f.name: f for f in text_string_to_metric_families(out.stdout.decode())}
    (action,) = families["mcp_token_guard_actions"].samples
    assert action.labels == {"side": "server", "server": "mp", "policy": "annotate_meta", "action": "annotated",
                             "enforced": "false", "tool": "t"}
    assert action.value == 6  # 3 calls in each of 2 workers
    (cost,) = families["mcp_token_cost_usd"].samples
    assert cost.labels == {"side": "server", "server": "mp", "tool": "t"}
    # 6 results of chars/4 tokens each at 5 USD per million.
    tokens = measure_result("tools/call", {"content": [{"type": "text", "text": "abcd" * 100}]},
                            tool_name="t", policy=Policy(estimator=lambda s: -(-len(s) // 4), estimator_name="chars/4"),
                            ).total_tokens
    assert cost.value == pytest.approx(6 * tokens * 5e-6)


def test_refusal_series_start_at_zero(harness_factory: Any) -> None:
    """A tool's first guarded call creates its refusal and padding series at 0 (alerts take increase() of them)."""
    h = harness_factory(guard={"mode": "enforce", "session_hard_limit": True, "rate_limit": True,
                               "tools": {"quiet": {"mode": "observe"}}})
    for tool in ("t", "quiet"):
        assert h.guard("server", "tools/call", {"name": tool}, "s1", server="srv") is None
    for policy in ("session_limit", "rate_limit"):
        assert h.value("mcp_token_guard_actions_total", **{**guard_labels(policy, "refused", "true"),
                                                           "server": "srv"}) == 0
        assert h.value("mcp_token_guard_actions_total", **{**guard_labels(policy, "refused", "false", tool="quiet"),
                                                           "server": "srv"}) == 0
    padding = {**guard_labels("padding", "found", "true"), "server": "srv"}
    assert h.value("mcp_token_guard_actions_total", **padding) == 0
    assert h.value("mcp_token_guard_actions_total", **{**guard_labels("chain_depth", "refused", "true"),
                                                       "server": "srv"}) is None  # not switched on
    h.guard("server", "tools/list", None, "s1")  # no tool: nothing more
    assert len(scrape(h.rec).pick("mcp_token_guard_actions_total")) == 6


def test_guard_sides_config() -> None:
    from mcp_token_otel.config import ConfigError, config_as_dict, config_from_dict, load_config

    assert config_from_dict({}).guard.sides == ["client", "server", "proxy"]
    assert load_config(env={"MCP_TOKEN_OTEL_GUARD_SIDES": "client, server"}).guard.sides == ["client", "server"]
    assert load_config(env={"MCP_TOKEN_OTEL_GUARD_SIDES": "[proxy]"}).guard.sides == ["proxy"]
    assert config_from_dict({"guard": {"sides": "server"}}).guard.sides == ["server"]
    assert config_as_dict(config_from_dict({"guard": {"sides": ["proxy"]}}))["guard"]["sides"] == ["proxy"]
    with pytest.raises(ConfigError, match=r"config key 'guard.sides': expected a list of client, server, proxy"):
        config_from_dict({"guard": {"sides": ["browser"]}})
    with pytest.raises(ConfigError, match=r"config key 'guard.sides': expected a list of names"):
        config_from_dict({"guard": {"sides": 3}})
