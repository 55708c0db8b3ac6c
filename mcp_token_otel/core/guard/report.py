"""What the response cap did to one result: read by the notice, the pagination hint and the engine."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CapReport:
    """What the cap did (or, in observe mode, would do) to one result."""

    cap: int
    total_tokens: int
    kept_tokens: int = 0
    notice_tokens: int = 0
    text_blocks_cut: int = 0
    blocks_dropped: int = 0
    media_replaced: int = 0
    arrays: list[tuple[str, int, int]] = field(default_factory=list)
    strings: list[str] = field(default_factory=list)
    #: (where, JSON pointer) of each JSON value cut to a document-order prefix (the wide/deep fallback).
    prefixes: list[tuple[str, str]] = field(default_factory=list)
    #: Text blocks that looked like JSON too large or too deep to parse, cut as plain text (no longer JSON).
    json_as_text: list[str] = field(default_factory=list)
    #: The cut could not reach the cap (minItems or constrained strings): tokens above it.
    over_cap_tokens: int = 0
    #: An outputSchema constrained the cut (else only the JSON's shape can keep it above the cap).
    schema_bound: bool = False
    notice: str = ""
