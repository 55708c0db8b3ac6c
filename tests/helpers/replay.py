"""The logical-call fixtures (tests/fixtures/logical_calls/) and a replay of one through the correlation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_token_otel.core.logical_calls import Leg, LogicalCalls, Outcome

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logical_calls"
C2S, S2C = "client_to_server", "server_to_client"


def load(name: str) -> dict[str, Any]:
    """A fixture by file stem, e.g. ``elicit_once.http``."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return data


def names(pattern: str = "*") -> list[str]:
    return sorted(p.name[: -len(".json")] for p in FIXTURES.glob(f"{pattern}.json"))


@dataclass
class Step:
    """One message replayed: a request's leg, an answer's outcome, or a notification's outcome."""

    message: dict[str, Any]
    leg: Leg | None = None
    outcome: Outcome | None = None


@dataclass
class Replay:
    steps: list[Step] = field(default_factory=list)

    def legs(self, method: str | None = None) -> list[Leg]:
        return [s.leg for s in self.steps if s.leg is not None and (method is None or s.leg.method == method)]

    def outcomes(self, *kinds: str) -> list[Outcome]:
        return [s.outcome for s in self.steps if s.outcome is not None and (not kinds or s.outcome.kind in kinds)]

    def calls(self) -> list[Any]:
        """The logical calls, in the order of their first leg."""
        seen: dict[int, Any] = {}
        for leg in self.legs():
            if leg.call is not None:
                seen.setdefault(leg.call.id, leg.call)
        return list(seen.values())


def replay(fixture: dict[str, Any], tracker: LogicalCalls | None = None, key: str | None = "conversation=1",
           clock: list[float] | None = None) -> Replay:
    """Feed the fixture's messages to ``tracker``: requests paired with their answers by direction and id, as the
    proxy pairs them. ``clock`` (one float in a list): advanced by one second per message, passed as ``now``."""
    tracker = LogicalCalls() if tracker is None else tracker
    pending: dict[tuple[str, Any], Leg] = {}
    out = Replay()
    for entry in fixture["messages"]:
        direction, message = entry["direction"], entry["message"]
        now = None
        if clock is not None:
            clock[0] += 1.0
            now = clock[0]
        step = Step(message)
        method = message.get("method")
        if isinstance(method, str) and "id" in message:
            step.leg = tracker.request(method, message.get("params"), key, now=now)
            pending[(direction, message["id"])] = step.leg
        elif isinstance(method, str):
            step.outcome = tracker.notification(method, message.get("params"), now=now)
        else:
            requester = S2C if direction == C2S else C2S
            leg = pending.pop((requester, message.get("id")))
            if "error" in message:
                step.outcome = tracker.error(leg, message["error"], now=now)
            else:
                step.outcome = tracker.result(leg, message["result"], now=now)
        out.steps.append(step)
    return out
