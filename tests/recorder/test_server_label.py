"""The ``server`` label on recorder faults and on an ``initialize`` that never gets its result or gets an error,
recorded without an SDK (through real sessions of either SDK major: tests/adapters/scenarios/test_server_label.py)."""

from __future__ import annotations

from mcp_token_otel.core.measure import Policy, measure_request
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.support import Otel, make_config
from tests.helpers.support import scrape as scrape_recorder

Found = dict[str, list[tuple[dict[str, str], float]]]


def scrape(recorder: TokenRecorder) -> Found:
    return scrape_recorder(recorder).samples


def value(found: Found, name: str, **labels: str) -> float:
    rows = [v for lab, v in found.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(rows) == 1, (name, labels, found.get(name))
    return rows[0]


def _raising_estimator(text: str) -> int:
    raise RuntimeError("estimator down")


def test_faults_without_a_configured_name_carry_the_proxy_name_or_the_placeholder(otel: Otel) -> None:
    for name, expected in ((None, "_unknown"), ("px", "px")):
        recorder = TokenRecorder(make_config(), otel.tracer_provider, otel.meter_provider, server_name=name)
        recorder.policy = Policy(estimator=_raising_estimator, estimator_name="broken")
        call = recorder.begin("client", "tools/call", {"name": "t"}, "s1")
        call.open()  # a fault
        call.close()
        found = scrape(recorder)
        assert recorder.error_counts["estimate"] == 1
        assert value(found, "mcp_token_instrumentation_errors_total", stage="estimate", server=expected) == 1
        recorder.close()


def test_an_initialize_that_never_gets_its_result_is_still_recorded(otel: Otel) -> None:
    recorder = TokenRecorder(make_config(), otel.tracer_provider, otel.meter_provider)
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}
    measured = measure_request("initialize", params, recorder.policy)
    call = recorder.begin("client", "initialize", params, "conn-1")
    call.open()
    found = scrape(recorder)
    assert "mcp_token_tokens_total" not in found or not [
        lab for lab, _ in found["mcp_token_tokens_total"] if lab["method"] == "initialize"]
    call.close()  # the connection dropped before the result
    recorder.end_session("client", "conn-1")
    found = scrape(recorder)
    assert value(found, "mcp_token_tokens_total", side="client", method="initialize",
                 direction="input") == measured.total_tokens
    recorder.close()


def test_a_failed_initialize_is_recorded_with_its_error(otel: Otel) -> None:
    recorder = TokenRecorder(make_config(), otel.tracer_provider, otel.meter_provider)
    call = recorder.begin("client", "initialize", {"protocolVersion": "1999-01-01"}, "conn-2")
    call.open()
    call.error({"code": -32602, "message": "bad version"})
    call.close()
    found = scrape(recorder)
    # one request and its error, each counted once (requests have no histogram by default: their counter)
    assert value(found, "mcp_token_tokens_total", side="client", server="_unknown", method="initialize",
                 direction="input") > 0
    assert value(found, "mcp_token_message_tokens_count", side="client", server="_unknown", method="initialize",
                 direction="output") == 1
    recorder.close()
