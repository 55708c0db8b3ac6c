"""The demo's live table shows what entered the agents' context (results after the guards' cut) and the calls the
guards refused in a column of their own, never as the tool's errors. A real demo run, guards on."""

from __future__ import annotations

import io

import anyio
import pytest

from mcp_token_otel.cli.demo import DEMO_CAP, DemoOptions, run_demo
from mcp_token_otel.config import config_from_dict

#: The one demo tool that fails now and then (an isError result of its own).
FAILING = "lookup_user"


@pytest.mark.slow
def test_demo_table_shows_sizes_after_the_cut_and_refusals_apart() -> None:
    # A small context window: sessions exhaust within seconds and their next call is refused.
    options = DemoOptions(duration=6, rate=40, sessions=3, context_window=20_000, metrics_port=0, quiet=True,
                          keyless_client=False)
    out = io.StringIO()
    stats = anyio.run(run_demo, config_from_dict({"estimator": "chars/4"}), options, out)  # sizes as in the docs
    text = out.getvalue()
    header, *rows = text.split("final summary", 1)[1].splitlines()[1:]
    assert header.split() == ["tool", "calls", "p50", "tok", "p95", "tok", "max", "tok", "tier", "(p95)", "overhead",
                              "errors", "refused"]
    refused = sum(s.refused for s in stats.tools.values())
    assert refused > 0, text
    for name, s in stats.tools.items():
        # A refusal is the guard's answer, not the tool's error: only the failing tool has errors.
        if name != FAILING:
            assert s.errors == 0, (name, text)
        row = next(r for r in rows if r.split()[:1] == [name])
        assert row.split()[-2:] == [str(s.errors), str(s.refused)]
        assert s.calls >= len(s.tokens) + s.refused - 1  # a refusal the agent had not received when the run ended
    # Sizes are what entered the context: export_table's results are cut to the cap (plus the notice and the
    # framing), while the tool itself returns up to ~15,000 tokens.
    export = stats.tools["export_table"]
    assert export.tokens and max(export.tokens) <= DEMO_CAP + 200, text
