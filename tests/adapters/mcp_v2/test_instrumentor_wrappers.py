"""mcp 2.x: our hooks are wrapt wrappers, and ``uninstrument()`` removes only ours. Another library's wrapper on the
same SDK function, added after ours or before it, keeps working; ours no longer measures. A call measured or not,
and the entry points: tests/adapters/scenarios/entry_points.py."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import IS_MCP_V2, Otel

if not IS_MCP_V2:
    pytest.skip("mcp 2.x only", allow_module_level=True)

import mcp.shared.jsonrpc_dispatcher as jrd
import wrapt
from mcp.client.session import ClientSession
from mcp.server.lowlevel.server import Server

import mcp_token_otel
from tests.adapters.scenarios.entry_points import measured, on

# A class's __init__, a module function the SDK looks up at call time, and the __init__ the server is built with:
# each runs at least once per call below.
TARGETS = [(ClientSession, "__init__"), (jrd, "otel_span"), (Server, "__init__")]
IDS = ["ClientSession.__init__", "jsonrpc_dispatcher.otel_span", "Server.__init__"]
#: Whether ours calls what it wraps while it measures. Not otel_span: for a request being measured, ours opens the
#: SDK's CLIENT span with the SDK's own tracer and leaves it open until the response is measured, which the
#: SDK's context manager (and anything wrapped around it before us) cannot do; every other span goes through.
THROUGH = {"otel_span": False}


class Counting:
    """Another library's wrapt wrapper: counts the calls it sees."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls += 1
        return wrapped(*args, **kwargs)


#: The targets as the SDK defines them, before any test here.
ORIGINAL = {(owner, name): vars(owner)[name] for owner, name in TARGETS}


@pytest.fixture(autouse=True)
def _left_uninstrumented() -> Iterator[None]:
    yield
    mcp_token_otel.uninstrument()
    # The plain-wrapper test's monkeypatch puts back what it replaced: our wrapper of that moment, which no
    # instrumentor owns any more. Put the SDK's own functions back so no later module sees it.
    for (owner, name), original in ORIGINAL.items():
        if vars(owner)[name] is not original:
            setattr(owner, name, original)


@pytest.mark.parametrize(("owner", "name"), TARGETS, ids=IDS)
def test_a_wrapper_added_after_ours_survives_our_uninstrument(otel: Otel, owner: Any, name: str) -> None:
    original = vars(owner)[name]
    assert on("function", otel) is not None
    counting = Counting()
    theirs = wrapt.wrap_function_wrapper(owner, name, counting)
    assert measured(otel) and counting.calls >= 1
    mcp_token_otel.uninstrument()
    assert vars(owner)[name] is theirs and theirs.__wrapped__ is original  # ours spliced out from under theirs
    seen = counting.calls
    assert not measured(otel)  # ours no longer measures
    assert counting.calls > seen  # theirs still counts
    wrapt.unwrap_object(owner, name, theirs)
    assert vars(owner)[name] is original


@pytest.mark.parametrize(("owner", "name"), TARGETS, ids=IDS)
def test_a_wrapper_added_before_ours_survives_our_uninstrument(otel: Otel, owner: Any, name: str) -> None:
    original = vars(owner)[name]
    counting = Counting()
    theirs = wrapt.wrap_function_wrapper(owner, name, counting)
    try:
        assert on("function", otel) is not None
        assert vars(owner)[name] is not theirs
        assert measured(otel)
        assert (counting.calls >= 1) is THROUGH.get(name, True)
        mcp_token_otel.uninstrument()
        assert vars(owner)[name] is theirs  # exactly what was there before us
        seen = counting.calls
        assert not measured(otel)
        assert counting.calls > seen
    finally:
        wrapt.unwrap_object(owner, name, theirs)
    assert vars(owner)[name] is original


def test_a_plain_wrapper_over_ours_keeps_working_and_ours_stops_measuring(
    otel: Otel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrapper that is not wrapt's (a functools.wraps closure) cannot be relinked: ours stays under it as a
    pass-through, and instrumenting again measures each call once."""
    assert on("function", otel) is not None
    ours = ClientSession.__init__
    calls: list[Any] = []

    @functools.wraps(ours)
    def plain(self: ClientSession, *args: Any, **kwargs: Any) -> None:
        calls.append(self)
        ours(self, *args, **kwargs)

    monkeypatch.setattr(ClientSession, "__init__", plain)
    mcp_token_otel.uninstrument()
    assert ClientSession.__init__ is plain
    assert not measured(otel) and len(calls) == 1
    assert on("function", otel) is not None
    assert measured(otel) and len(calls) == 2
    points = [p for p in otel.metrics()["mcp_token.message.tokens"]
              if p.attributes.get("gen_ai.tool.name") == "echo" and p.attributes["mcp_token.side"] == "client"]
    assert [(p.attributes["mcp_token.direction"], p.count) for p in points] == [("output", 1)]  # measured once
    mcp_token_otel.uninstrument()
    assert ClientSession.__init__ is plain
    assert not measured(otel) and len(calls) == 3
