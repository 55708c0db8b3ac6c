"""One logical call, one measurement, on every path (slow: real SDK sessions, servers and proxies as processes).

An mcp 2.3 client with an elicitation callback calls a ~1,000-token tool that asks for confirmation
(servers/mrtr_server.py ``delete_report``, protocol 2026-07-28): once, three times in a row, and a task-augmented
tool once. The shim's client and server sides in process (direct, and over streamable HTTP on 127.0.0.1), the
stdio proxy and the HTTP proxy (with the shim on the client and on the server subprocess as well) each count one
response per logical call, the ``input_required`` leg's question and the retry's answer under their own
directions, the call's arguments once, no ``repeated`` waste for a retry, a duration per leg and one for the whole
call; and they agree on every figure (paths.py says how they are read and compared).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mcp_token_otel.core.estimators import get_estimator
from mcp_token_otel.core.measure import Policy, measure_request
from mcp_token_otel.recorder.legs import A_LEG, A_LEGS, A_LINK_TYPE
from tests.emitters.test_otlp import Receiver
from tests.helpers.support import global_tracer_provider, make_config

from .paths import (
    SCENARIOS,
    TASK_TOOL,
    TOOL,
    Figures,
    PathRun,
    in_process,
    through_http_proxy,
    through_stdio_proxy,
    value,
)

pytestmark = pytest.mark.slow

EXPORTER = InMemorySpanExporter()
global_tracer_provider(EXPORTER)  # the SDK's own spans go to the global provider (set once per process)

PATHS = ("direct", "http", "stdio proxy", "http proxy")
#: Each path's observers: the shim's sides in this process; the proxy, and the shim on the server subprocess.
OBSERVERS = {"direct": ("client", "server"), "http": ("client", "server"),
             "stdio proxy": ("client", "proxy", "server"), "http proxy": ("client", "proxy", "server")}
TOKENS, RESPONSES = "mcp_token_tokens_total", "mcp_token_responses_total"
WASTED, LEGS, LOGICAL = ("mcp_token_wasted_tokens_total", "mcp_token_operation_duration_seconds_count",
                         "mcp_token_logical_call_duration_seconds_count")


def _spans() -> list[ReadableSpan]:
    return list(EXPORTER.get_finished_spans())


@pytest.fixture(scope="module")
def otlp() -> Iterator[Receiver]:
    receiver = Receiver()
    receiver.thread.start()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


@pytest.fixture(scope="module")
def runs(otlp: Receiver) -> dict[str, PathRun]:
    """Every path, one after the other (each instruments this process for its own run only)."""
    clear: Callable[[], None] = EXPORTER.clear
    out = {"direct": in_process(_spans, clear, over_http=False), "http": in_process(_spans, clear, over_http=True)}
    otlp.bodies.clear()
    out["stdio proxy"] = through_stdio_proxy(_spans, clear, otlp)
    otlp.bodies.clear()
    out["http proxy"] = through_http_proxy(_spans, clear, otlp)
    return out


def _observed(runs: dict[str, PathRun], scenario: str) -> Iterator[tuple[str, str, Figures]]:
    for path in PATHS:
        for observer in OBSERVERS[path]:
            yield path, observer, runs[path].figures[scenario][observer]


def _input_tokens() -> int:
    """What the model wrote for one call: its name and arguments, measured once."""
    params = {"name": TOOL, "arguments": {"path": "q3.pdf"}}
    config = make_config()
    policy = Policy(estimator=get_estimator(config.estimator), estimator_name=config.estimator)
    return measure_request("tools/call", params, policy).total_tokens


def test_one_confirmed_call_is_one_response(runs: dict[str, PathRun]) -> None:
    for path, observer, figs in _observed(runs, "confirmed_once"):
        where = f"{path}/{observer}"
        tiers = {dict(labels)["risk_tier"]: v for (family, labels), v in figs.items()
                 if family == RESPONSES and dict(labels)["tool"] == TOOL}
        assert tiers == {"medium": 1}, where  # one response, the final result's tier
        assert value(figs, WASTED, tool=TOOL, kind="repeated") == 0, where
        assert value(figs, TOKENS, tool=TOOL, direction="input_required") > 0, where
        assert value(figs, TOKENS, tool=TOOL, direction="input_response") > 0, where
        assert value(figs, TOKENS, tool=TOOL, direction="input") == _input_tokens(), where  # once, not per leg
        assert value(figs, TOKENS, tool=TOOL, direction="output") >= 1000, where  # the 4,000-character report
        assert value(figs, LEGS, method="tools/call", tool=TOOL) == 2, where
        assert value(figs, LOGICAL, method="tools/call", tool=TOOL) == 1, where


def test_three_confirmed_calls_are_three_responses_two_of_them_repeats(runs: dict[str, PathRun]) -> None:
    for path, observer, figs in _observed(runs, "confirmed_three"):
        where = f"{path}/{observer}"
        assert value(figs, RESPONSES, tool=TOOL) == value(figs, RESPONSES, tool=TOOL, risk_tier="medium") == 3, where
        output = value(figs, TOKENS, tool=TOOL, direction="output")
        assert output > 0 and output % 3 == 0, where
        assert value(figs, WASTED, tool=TOOL, kind="repeated") == output * 2 / 3, where  # the 2nd and 3rd results
        assert value(figs, TOKENS, tool=TOOL, direction="input") == 3 * _input_tokens(), where
        assert value(figs, LEGS, method="tools/call", tool=TOOL) == 6, where
        assert value(figs, LOGICAL, method="tools/call", tool=TOOL) == 3, where


def test_a_task_result_is_its_tools_output(runs: dict[str, PathRun]) -> None:
    for path, observer, figs in _observed(runs, "task"):
        where = f"{path}/{observer}"
        assert value(figs, RESPONSES, method="tools/call", tool=TASK_TOOL) == 1, where
        assert value(figs, RESPONSES, method="tasks/get") == 0, where
        assert value(figs, TOKENS, method="tools/call", tool=TASK_TOOL, direction="output") >= 1000, where
        assert value(figs, TOKENS, method="tasks/get", direction="output") == 0, where  # polls are not output
        assert value(figs, TOKENS, method="tasks/get", direction="task") > 0, where
        assert value(figs, TOKENS, method="tools/call", tool=TASK_TOOL, direction="task") > 0, where  # the handle
        assert value(figs, LEGS, method="tasks/get") == 3, where  # working, working, completed
        assert value(figs, LOGICAL, method="tools/call", tool=TASK_TOOL) == 1, where


def table(runs: dict[str, PathRun], scenario: str) -> str:
    """The figures of ``scenario`` by observer, one row per figure (what the report and a failure show)."""
    observed = [(f"{path}/{observer}", figs) for path, observer, figs in _observed(runs, scenario)]
    keys = sorted({k for _, figs in observed for k in figs})
    head = "| figure | " + " | ".join(name for name, _ in observed) + " |"
    rows = [head, "|---" * (len(observed) + 1) + "|"]
    for family, labels in keys:
        name = family.removeprefix("mcp_token_") + "{" + ",".join(f"{k}={v}" for k, v in labels if v) + "}"
        rows.append(f"| {name} | " + " | ".join(f"{figs.get((family, labels), 0):g}" for _, figs in observed) + " |")
    return "\n".join(rows)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_path_and_side_measures_the_same(runs: dict[str, PathRun], scenario: str) -> None:
    observed = list(_observed(runs, scenario))
    print(f"\n{scenario}\n{table(runs, scenario)}")
    _, _, reference = observed[0]
    assert value(reference, LOGICAL) == SCENARIOS[scenario][2]
    differing = [f"{path}/{observer}" for path, observer, figs in observed if figs != reference]
    assert not differing, f"{differing} differ from direct/client:\n{table(runs, scenario)}"


# ---------------------------------------------------------------------------------------------- spans


def _legs(spans: list[ReadableSpan], kind: SpanKind) -> list[ReadableSpan]:
    out = [s for s in spans if s.kind is kind and (s.attributes or {}).get("gen_ai.tool.name") == TOOL
           and A_LEG in (s.attributes or {})]
    return sorted(out, key=leg_number)


def leg_number(span: ReadableSpan) -> int:
    return int((span.attributes or {}).get(A_LEG, 0))  # type: ignore[arg-type]


@pytest.mark.parametrize("path", PATHS)
def test_the_retrys_span_links_to_the_first_legs(runs: dict[str, PathRun], path: str) -> None:
    spans = runs[path].spans["confirmed_once"]
    kinds = [SpanKind.CLIENT] + ([SpanKind.SERVER] if path in ("direct", "http") else [])
    for kind in kinds:
        first, retry = _legs(spans, kind)
        assert first.attributes[A_LEG] == 1 and retry.attributes[A_LEG] == 2, kind  # type: ignore[index]
        assert retry.attributes[A_LEGS] == 2 and A_LEGS not in first.attributes, kind  # type: ignore[index, operator]
        (link,) = retry.links
        assert link.context.span_id == first.context.span_id, kind
        assert link.context.trace_id == first.context.trace_id, kind
        assert link.attributes[A_LINK_TYPE] == "retry_of", kind  # type: ignore[index]
        assert not first.links, kind


@pytest.mark.parametrize("path", ["stdio proxy", "http proxy"])
def test_the_proxys_retry_span_links_to_its_first_leg(runs: dict[str, PathRun], path: str) -> None:
    legs: list[tuple[Any, dict[str, Any]]] = sorted(
        ((span, attrs) for span, attrs in runs[path].proxy_spans["all"]
         if attrs.get("gen_ai.tool.name") == TOOL and A_LEG in attrs),
        key=lambda item: (item[0].start_time_unix_nano, item[1][A_LEG]))
    # confirmed_once, then confirmed_three: four calls, each a first leg and its retry, in that order.
    assert [attrs[A_LEG] for _, attrs in legs] == [1, 2] * 4
    for (first, _), (retry, attrs) in zip(legs[::2], legs[1::2], strict=True):
        assert attrs[A_LEGS] == 2
        (link,) = retry.links
        assert (link.trace_id, link.span_id) == (first.trace_id, first.span_id)
        assert {kv.key: kv.value.string_value for kv in link.attributes} == {A_LINK_TYPE: "retry_of"}


@pytest.mark.parametrize("path", ["direct", "http"])
def test_task_messages_link_to_the_call_that_created_the_task(runs: dict[str, PathRun], path: str) -> None:
    spans = runs[path].spans["task"]
    for kind in (SpanKind.CLIENT, SpanKind.SERVER):
        (call,) = [s for s in spans if s.kind is kind and (s.attributes or {}).get("gen_ai.tool.name") == TASK_TOOL]
        polls = [s for s in spans if s.kind is kind and (s.attributes or {}).get("mcp.method.name") == "tasks/get"]
        assert len(polls) == 3, kind
        for poll in polls:
            (link,) = poll.links
            assert link.context.span_id == call.context.span_id, kind
            assert link.attributes[A_LINK_TYPE] == "task_of", kind  # type: ignore[index]
