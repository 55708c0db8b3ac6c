"""TokenRecorder on its own: span attributes and events, metrics, bounded labels, faults never raise."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from mcp_token_otel.catalog import TOKEN_BUCKETS
from mcp_token_otel.core.measure import Policy
from mcp_token_otel.core.risk import BREACH_TIERS
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.faults import BrokenMeterProvider, break_aggregate, raising_estimator
from tests.helpers.support import Otel, make_config, scrape


def tool_result(text: str, *, is_error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def new_recorder(otel: Otel, **config: Any) -> TokenRecorder:
    return TokenRecorder(make_config(**config), otel.tracer_provider, otel.meter_provider)


def one_call(rec: TokenRecorder, text: str, tool: str = "big", session: str | None = "s1", **kw: Any) -> None:
    span = rec.start_span(f"tools/call {tool}", SpanKind.CLIENT)
    params = {"name": tool, "arguments": {"q": "abcd" * 4}}
    call = rec.begin("client", "tools/call", params, session)
    call.open(span)
    call.result(tool_result(text, **kw))
    call.close()
    rec.end_span(span)


def test_span_attributes_and_risk_event(otel: Otel) -> None:
    rec = new_recorder(otel)
    one_call(rec, "x" * 40_000)
    (span,) = otel.spans()
    attrs = span.attributes
    assert attrs["mcp_token.input_tokens"] > 0
    assert attrs["mcp_token.output_tokens"] >= 10_000
    assert attrs["mcp_token.overhead_tokens"] >= 0
    assert 0 <= attrs["mcp_token.overhead_ratio"] <= 1
    assert attrs["mcp_token.risk_tier"] == "critical"
    assert attrs["mcp_token.estimator"] == "chars/4"
    assert attrs["mcp_token.session.state"] == "ok"
    assert (
        attrs["mcp_token.session.tokens"]
        == attrs["mcp_token.input_tokens"] + attrs["mcp_token.output_tokens"]
    )
    assert attrs["mcp_token.session.utilization"] == pytest.approx(
        attrs["mcp_token.session.tokens"] / 200_000
    )
    assert not any(k.startswith("gen_ai.usage") for k in attrs)
    assert "gen_ai.tool.call.result" not in attrs and "gen_ai.tool.call.arguments" not in attrs
    (event,) = [e for e in span.events if e.name == "mcp_token.risk"]
    assert event.attributes["mcp_token.risk_tier"] == "critical"
    assert "critical" in event.attributes["mcp_token.advisory"]
    assert span.status.status_code is StatusCode.UNSET


def test_tool_error_sets_error_type(otel: Otel) -> None:
    rec = new_recorder(otel)
    one_call(rec, "bad input", is_error=True)
    (span,) = otel.spans()
    assert span.attributes["error.type"] == "tool_error"
    assert span.status.status_code is StatusCode.ERROR


def test_jsonrpc_error(otel: Otel) -> None:
    rec = new_recorder(otel)
    span = rec.start_span("tools/call x", SpanKind.SERVER)
    error = {"code": -32602, "message": "Invalid params"}
    measured: list[Any] = []
    rec.listeners.append(lambda _call, m: measured.append(m))
    call = rec.begin("server", "tools/call", {"name": "x"}, "s")
    call.open(span)
    call.error(error)
    call.close()
    rec.end_span(span)
    (m,) = measured
    assert m.error_type == "-32602"
    (s,) = otel.spans()
    assert s.attributes["error.type"] == "-32602"
    assert s.attributes["rpc.response.status_code"] == "-32602"
    assert s.status.status_code is StatusCode.ERROR


def test_metrics_names_buckets_and_no_session_id(otel: Otel) -> None:
    rec = new_recorder(otel, budget={"context_window": 20_000})
    one_call(rec, "x" * 40_000)  # ~10k tokens: critical, half the window
    one_call(rec, "x" * 40_000)  # past 100%: enters warning and exhausted at once
    rec.end_session("client", "s1")
    points = otel.metrics()
    tokens = points["mcp_token.message.tokens"]
    # requests' tokens go to the counter only, unless metrics.input_histograms
    assert {p.attributes["mcp_token.direction"] for p in tokens} == {"output"}
    assert {p.attributes["mcp_token.direction"] for p in points["mcp_token.tokens"]} == {"input", "output"}
    out = next(p for p in tokens if p.attributes["mcp_token.direction"] == "output")
    assert out.attributes == {
        "mcp_token.side": "client",
        "mcp.method.name": "tools/call",
        "gen_ai.tool.name": "big",
        "mcp_token.direction": "output",
        "mcp_token.server.name": "_unknown",  # no server named itself: the placeholder, never empty
    }  # the risk tier is derivable from the value: not a dimension of the histogram
    assert tuple(out.explicit_bounds) == TOKEN_BUCKETS
    assert TOKEN_BUCKETS[0] == 64 and TOKEN_BUCKETS[-1] == 1048576
    assert points["mcp_token.overhead.tokens"]
    breaches = [p.value for p in points["mcp_token.responses"] if p.attributes["mcp_token.risk_tier"] in BREACH_TIERS]
    assert sum(breaches) == 2
    transitions = {
        p.attributes["mcp_token.session.state"]: p.value for p in points["mcp_token.session.transitions"]
    }
    assert transitions == {"warning": 1, "exhausted": 1}
    (util,) = points["mcp_token.session.utilization"]
    assert util.count == 1 and util.sum > 1.0
    for name, pts in points.items():
        for p in pts:
            assert "mcp.session.id" not in p.attributes and "mcp_token.session.id" not in p.attributes, name
            assert "s1" not in p.attributes.values(), name


def test_budget_events(otel: Otel) -> None:
    rec = new_recorder(otel, budget={"context_window": 1000})
    one_call(rec, "x" * 3200)  # ~800 tokens -> warning
    one_call(rec, "x" * 800)  # -> exhausted
    first, second = otel.spans()
    assert [
        e.attributes["mcp_token.session.state"] for e in first.events if e.name == "mcp_token.budget"
    ] == ["warning"]
    assert [
        e.attributes["mcp_token.session.state"] for e in second.events if e.name == "mcp_token.budget"
    ] == ["exhausted"]
    assert second.attributes["mcp_token.session.state"] == "exhausted"


def test_tool_names_overflow(otel: Otel) -> None:
    rec = new_recorder(otel, metrics={"max_tool_names": 3})
    for i in range(6):
        one_call(rec, "ok", tool=f"t{i}", session=None)
    tools = {p.attributes.get("gen_ai.tool.name") for p in otel.metrics()["mcp_token.message.tokens"]}
    assert tools == {"t0", "t1", "t2", "_other"}
    names = {s.attributes.get("mcp_token.output_tokens") is not None for s in otel.spans()}
    assert names == {True}  # spans keep measuring every call


def test_capture_content_truncated(otel: Otel) -> None:
    rec = new_recorder(otel, spans={"capture_content": True, "max_content_chars": 10})
    one_call(rec, "y" * 100)
    (span,) = otel.spans()
    assert len(span.attributes["gen_ai.tool.call.arguments"]) == 10
    assert len(span.attributes["gen_ai.tool.call.result"]) == 10


def test_faults_never_raise_and_are_counted(otel: Otel) -> None:
    rec = new_recorder(otel)
    rec.policy = Policy(estimator=raising_estimator, estimator_name="broken")
    one_call(rec, "text")
    assert rec.error_counts["estimate"] == 2
    errors = otel.metrics()["mcp_token.instrumentation.errors"]
    assert {p.attributes["mcp_token.stage"]: p.value for p in errors} == {"estimate": 2}


def test_a_failing_metrics_store_never_raises_and_is_counted(otel: Otel) -> None:
    rec = new_recorder(otel)
    break_aggregate(rec)  # every write into the one aggregate the emitters read raises
    one_call(rec, "text")
    assert rec.error_counts["metrics"] >= 2

    rec = new_recorder(otel)
    break_aggregate(rec, ("add_message", "add_duration", "observe"))  # the message path only: faults still counted
    one_call(rec, "text")
    assert rec.error_counts["metrics"] >= 2
    assert scrape(rec).value("mcp_token_instrumentation_errors_total", stage="metrics") == rec.error_counts["metrics"]


def test_a_failing_meter_never_raises_and_is_counted(otel: Otel) -> None:
    rec = TokenRecorder(make_config(), otel.tracer_provider, BrokenMeterProvider())
    one_call(rec, "text")
    one_call(rec, "text")
    rec.flush()
    assert rec.error_counts["metrics"] >= 2


def test_odd_calls_never_raise(otel: Otel) -> None:
    rec = new_recorder(otel)
    odd = object()  # a result no measurement can read
    call = rec.begin("client", "tools/call", {}, None)
    call.open()
    assert call.result(odd) is odd  # handed on as it came
    call.close()
    rec.end_session("server", "never-seen")
    rec.end_span(None)


def test_otel_metrics_carry_the_same_families_as_the_prometheus_endpoint(otel: Otel) -> None:
    """Through a Collector the dashboards and alerts need tokens, live sessions and the budgets too."""
    rec = TokenRecorder(make_config(prometheus={"tool_output_rate_budget": 42}), otel.tracer_provider,
                        otel.meter_provider)
    call = rec.begin("server", "tools/call", {"name": "t"}, "s1")
    call.open()
    call.result({"content": [{"type": "text", "text": "x" * 40}]})
    call.close()
    found = otel.metrics()
    (total,) = [p for p in found["mcp_token.tokens"] if p.attributes["mcp_token.direction"] == "output"]
    assert total.value >= 10 and "mcp_token.risk_tier" not in total.attributes
    assert total.attributes["gen_ai.tool.name"] == "t" and total.attributes["mcp_token.direction"] == "output"
    sessions = {(p.attributes["mcp_token.side"], p.attributes["mcp_token.session.state"]): p.value
                for p in found["mcp_token.sessions"]}
    assert sessions[("server", "ok")] == 1 and sessions.get(("client", "ok"), 0) == 0
    budgets = {p.attributes["mcp_token.scope"]: p.value for p in found["mcp_token.output_rate_budget"]}
    assert budgets == {"tool": 42, "service": 500}
    rec.close()


def test_failing_tool_names_cannot_use_up_the_label_places(otel: Otel) -> None:
    rec = new_recorder(otel, metrics={"max_tool_names": 8})
    for i in range(10):  # an agent inventing tools: every call fails
        one_call(rec, "unknown tool", tool=f"made_up_{i}", session=None, is_error=True)
    listing = rec.begin("client", "tools/list", {}, None)
    listing.open()
    listing.result({"tools": [{"name": "declared"}]})
    listing.close()
    for tool in ("declared", "search", "fetch", "third", "fourth"):
        one_call(rec, "ok", tool=tool, session=None)
    tools = {p.attributes.get("gen_ai.tool.name") for p in otel.metrics()["mcp_token.message.tokens"]
             if p.attributes["mcp.method.name"] == "tools/call" and p.attributes["mcp_token.direction"] == "output"}
    # Invented names took at most half of the 8 places; the declared tool and real ones got the rest.
    assert tools == {"made_up_0", "made_up_1", "made_up_2", "made_up_3", "declared", "search", "fetch", "third",
                     "_other"}


LATE_METER_PROVIDER = textwrap.dedent(
    """
    import json
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from mcp_token_otel.recorder import TokenRecorder
    result = {"content": [{"type": "text", "text": "word " * 50}]}
    recorder = TokenRecorder()

    def call():
        c = recorder.begin("server", "tools/call", {"name": "t"}, "s")
        c.open()
        c.result(result)
        c.close()

    call()
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    call()
    data = reader.get_metrics_data()
    points = {m.name: m.data.data_points for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics}
    print(json.dumps({"tokens": sum(p.count for p in points["mcp_token.message.tokens"]),
                      "responses": sum(p.value for p in points["mcp_token.responses"])}))
    """
)


def test_a_meter_provider_set_later_is_picked_up() -> None:
    # The global MeterProvider can be set once per process: a fresh interpreter.
    out = subprocess.run([sys.executable, "-c", LATE_METER_PROVIDER], check=True, capture_output=True, timeout=120)
    # The instruments made on the API's proxy turn real once a provider is set. Histogram points are recorded in
    # the call: only the message after it. Counters are read from the shared aggregate at collection (a behaviour
    # change of the one-aggregate design): they count every message, as /metrics does.
    assert json.loads(out.stdout) == {"tokens": 1, "responses": 2}
