"""Guard settings: the ``guard:`` section of the configuration, as plain frozen dataclasses.

They live in the core so the engine needs nothing from the loader; ``mcp_token_otel/config.py`` builds them
from YAML and ``MCP_TOKEN_OTEL_GUARD_*`` variables. Field metadata (``expect``/``ok``) follows the loader's
convention, so a bad value is reported as ``config key 'guard.x': expected ...``; ``__post_init__`` checks
the same rules when the settings are built in code, naming the key as well.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

GUARD_MODES: tuple[str, ...] = ("off", "observe", "enforce")
PADDING_ACTIONS: tuple[str, ...] = ("notice", "strip")
#: Where guards can run (``guard.sides``): the shim's client and server sides and the proxy.
GUARD_SIDES: tuple[str, ...] = ("client", "server", "proxy")

#: Standard-tier list prices in USD per million input tokens (prompts up to 200K tokens where prices are
#: tiered), as published in November 2026 (Anthropic's model pages; OpenAI's and Google's pricing pages as
#: quoted by price trackers). Documented defaults only: prices change, so override them in config.
DEFAULT_PRICING: Mapping[str, float] = {
    "claude-opus-5-5": 4.0,
    "claude-sonnet-5-5": 2.0,
    "claude-haiku-4-5": 1.0,
    "gpt-5.5": 5.0,
    "gpt-5.4": 2.5,
    "gpt-5.4-mini": 0.75,
    "gemini-3.1-pro-preview": 2.0,
    "gemini-2.5-flash": 0.30,
}


def _check(expect: str, ok: Callable[[Any], bool]) -> dict[str, Any]:
    return {"expect": expect, "ok": ok}


_NON_NEGATIVE_INT = _check("a non-negative integer (0 turns the limit off)", lambda v: v >= 0)
_POSITIVE_INT = _check("a positive integer", lambda v: v > 0)
_SECONDS = _check("a positive number of seconds", lambda v: v > 0)
_PAGE_TOKENS = _check("a non-negative integer (0: the response cap of the tool that was cut)", lambda v: v >= 0)
_RATIO = _check("a number in (0, 1]", lambda v: 0 < v <= 1)
_MODE = _check("one of " + ", ".join(GUARD_MODES), lambda v: v in GUARD_MODES)
_ACTION = _check("one of " + ", ".join(PADDING_ACTIONS), lambda v: v in PADDING_ACTIONS)
_SIDES = _check(
    "a list of " + ", ".join(GUARD_SIDES) + " (or one of them)",
    lambda v: isinstance(v, list) and all(side in GUARD_SIDES for side in v),
)


def _optional(check: dict[str, Any]) -> dict[str, Any]:
    return {"expect": check["expect"], "ok": lambda v: v is None or check["ok"](v)}


def _validate(obj: Any, prefix: str) -> None:
    """Run the field checks so settings built in code are held to the loader's rules (key named)."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if not f.metadata or value is None:
            continue
        try:
            ok = not isinstance(value, bool) and bool(f.metadata["ok"](value))
        except TypeError:  # a value of the wrong type
            ok = False
        if not ok:
            raise ValueError(f"{prefix}.{f.name}: expected {f.metadata['expect']}, got {value!r}")


@dataclass(frozen=True)
class PaddingSettings:
    """Padding detection (``guard.padding``): each check reports a finding with its number and threshold."""

    #: Run the checks (on text content of results) whenever guard.mode is observe or enforce.
    enabled: bool = True
    #: In enforce mode: ``notice`` adds a security notice block; ``strip`` also removes invisible characters.
    action: str = field(default="notice", metadata=_ACTION)
    #: Zero-width, bidi-control, tag and other invisible characters: a finding at this many in one text.
    min_invisible_chars: int = field(default=5, metadata=_POSITIVE_INT)
    #: Texts shorter than this skip the statistical checks (unique characters, repetition, compression).
    min_length: int = field(default=1000, metadata=_POSITIVE_INT)
    #: A text of min_length or more written with at most this many distinct characters.
    max_unique_chars: int = field(default=8, metadata=_POSITIVE_INT)
    #: A stretch of text (found from a probe window of repeat_window characters) copied min_repeats times
    #: or more, the copies covering min_repeat_coverage of the text or more.
    repeat_window: int = field(default=32, metadata=_POSITIVE_INT)
    min_repeats: int = field(default=20, metadata=_POSITIVE_INT)
    min_repeat_coverage: float = field(default=0.8, metadata=_RATIO)
    #: A run of this many characters without whitespace.
    max_line_chars: int = field(default=5000, metadata=_POSITIVE_INT)
    #: zlib level 1 output / input below this ratio (natural text ~0.35-0.5, JSON ~0.1-0.3).
    min_compression_ratio: float = field(default=0.03, metadata=_RATIO)

    def __post_init__(self) -> None:
        _validate(self, "guard.padding")


@dataclass(frozen=True)
class ToolGuard:
    """Per-tool overrides (``guard.tools.<name or glob>``); a key left out inherits the section's value."""

    mode: str | None = field(default=None, metadata=_optional(_MODE))
    max_response_tokens: int | None = field(default=None, metadata=_optional(_NON_NEGATIVE_INT))
    annotate_meta: bool | None = None
    padding: bool | None = None
    padding_action: str | None = field(default=None, metadata=_optional(_ACTION))
    #: false keeps this tool's results out of the spill (their cut is final); true keeps them for this tool alone.
    spill: bool | None = None

    def __post_init__(self) -> None:
        _validate(self, "guard.tools.<tool>")


@dataclass(frozen=True)
class GuardSettings:
    """The ``guard:`` section. Nothing is altered unless ``mode`` is ``enforce``; ``off`` costs nothing."""

    #: off: no guard runs; observe: decisions and findings are computed and reported, nothing changes;
    #: enforce: results are cut, annotated or refused as configured.
    mode: str = field(default="off", metadata=_MODE)
    #: Cap on a tool result's data tokens (text, media, structuredContent); 0 = no cap.
    max_response_tokens: int = field(default=0, metadata=_NON_NEGATIVE_INT)
    #: Refuse tools/call once the session is exhausted (budget.exhaustion_ratio of budget.context_window).
    session_hard_limit: bool = False
    #: Append a note to tool results once the session is past budget.warning_ratio.
    session_warning_note: bool = False
    #: Put the token estimate in each result's _meta under META_TOKENS_KEY.
    annotate_meta: bool = False
    #: Limit tool calls per session to calls_per_minute (a sliding 60-second window).
    rate_limit: bool = False
    calls_per_minute: int = field(default=30, metadata=_POSITIVE_INT)
    #: Maximum depth of tools calling tools (0 = the user's own call); 0 = no limit.
    max_chain_depth: int = field(default=0, metadata=_NON_NEGATIVE_INT)
    #: Model whose input price turns response tokens into USD ("" = no cost), and the price table.
    model: str = ""
    pricing: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_PRICING))
    padding: PaddingSettings = field(default_factory=PaddingSettings)
    #: Overrides by tool name or glob (fnmatch: * ? [seq]); an exact name wins over globs, then the first
    #: matching glob in order.
    tools: dict[str, ToolGuard] = field(default_factory=dict)
    #: The sides whose adapters run the guards: an in-process client and server each guard what they
    #: handle; ["server"] leaves clients untouched, ["proxy"] guards only in the proxy.
    sides: list[str] = field(default_factory=lambda: list(GUARD_SIDES), metadata=_SIDES)
    #: Keep a result the response cap cuts whole, readable page by page with resources/read (needs enforce mode
    #: and a cap, in the section or in a tool's override).
    spill: bool = False
    #: Seconds a kept result stays after it was kept or last read.
    spill_ttl: float = field(default=300.0, metadata=_SECONDS)
    #: Memory all kept results of a process may hold together; the least recently read are dropped first.
    spill_max_bytes: int = field(default=64 << 20, metadata=_POSITIVE_INT)
    #: Tokens per page of a kept result; 0: the response cap of the tool that was cut.
    spill_page_tokens: int = field(default=0, metadata=_PAGE_TOKENS)

    def __post_init__(self) -> None:
        if isinstance(self.sides, str):  # one side, or a comma-separated list, as a string
            object.__setattr__(self, "sides", [p.strip() for p in self.sides.split(",") if p.strip()])
        elif isinstance(self.sides, tuple):
            object.__setattr__(self, "sides", list(self.sides))
        _validate(self, "guard")
        # A user's table extends the documented defaults (and overrides their prices).
        object.__setattr__(self, "pricing", {**DEFAULT_PRICING, **self.pricing})
        for name, price in self.pricing.items():
            if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
                raise ValueError(f"guard.pricing.{name}: expected a non-negative number (USD per million input "
                                 f"tokens), got {price!r}")
        if self.model and self.model not in self.pricing:
            raise ValueError(f"guard.model: expected a model named in guard.pricing ({', '.join(self.pricing)}), "
                             f"got {self.model!r}")
        for pattern, override in self.tools.items():
            if not isinstance(override, ToolGuard):
                raise ValueError(f"guard.tools.{pattern}: expected a mapping of overrides, got {override!r}")
        if self.spill and not self.spills:
            raise ValueError(
                "guard.spill: expected guard.mode: enforce and a response cap (guard.max_response_tokens above 0), "
                f"in the section or in one of guard.tools, got mode {self.mode!r} and cap {self.max_response_tokens}"
            )
        for pattern, override in self.tools.items():
            policy = resolve_tool(self, pattern)
            if override.spill and not (policy.enforce and policy.max_response_tokens > 0):
                raise ValueError(
                    f"guard.tools.{pattern}.spill: expected the tool's mode to be enforce and its response cap above "
                    f"0, got mode {policy.mode!r} and cap {policy.max_response_tokens}"
                )

    def spill_page_size(self, cap: int) -> int:
        """Tokens per page of a result cut at ``cap``: guard.spill_page_tokens, never above the cap (0: the cap)."""
        return min(self.spill_page_tokens, cap) if self.spill_page_tokens else cap

    @property
    def spills(self) -> bool:
        """Whether any tool can have a result kept: spill on, enforce mode and a cap, in the section or a tool's
        override (the guard keeps a spill store only then)."""
        policies = [resolve_tool(self, None), *(resolve_tool(self, pattern) for pattern in self.tools)]
        return any(p.spill and p.enforce and p.max_response_tokens > 0 for p in policies)


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """The settings that apply to one tool: the section's values with that tool's overrides applied."""

    mode: str
    max_response_tokens: int
    annotate_meta: bool
    padding: bool
    padding_action: str
    #: Keep this tool's result whole when the cap cuts it (guard.spill, or the tool's override).
    spill: bool = False

    @property
    def active(self) -> bool:
        return self.mode != "off"

    @property
    def enforce(self) -> bool:
        return self.mode == "enforce"


def resolve_tool(settings: GuardSettings, tool: str | None) -> ToolPolicy:
    """The policy for ``tool`` (None: a result that is not a tool's, e.g. resources/read)."""
    override: ToolGuard | None = None
    if tool is not None and settings.tools:
        override = settings.tools.get(tool)
        if override is None:
            for pattern, candidate in settings.tools.items():
                if fnmatch.fnmatchcase(tool, pattern):
                    override = candidate
                    break
    base = ToolPolicy(
        settings.mode, settings.max_response_tokens, settings.annotate_meta, settings.padding.enabled,
        settings.padding.action, settings.spill,
    )
    if override is None:
        return base
    return ToolPolicy(
        override.mode if override.mode is not None else base.mode,
        override.max_response_tokens if override.max_response_tokens is not None else base.max_response_tokens,
        override.annotate_meta if override.annotate_meta is not None else base.annotate_meta,
        override.padding if override.padding is not None else base.padding,
        override.padding_action if override.padding_action is not None else base.padding_action,
        override.spill if override.spill is not None else base.spill,
    )
