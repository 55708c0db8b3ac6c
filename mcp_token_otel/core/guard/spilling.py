"""The spill step of the response cap: a result the cap cut is kept whole (core/spill/) and the cut result says
where to read the rest. Pure, like the engine that calls it: the store is handed in, the clock's ``now`` too.

A result is not kept (the cut stays as it is, the reason counted) when the call has no budget key to own it
(``no_owner``), when it takes more than ``guard.spill_max_bytes`` (``too_large``), when it would need more than
10,000 pages (``too_many_pages``), when it has nothing to keep (``empty``) or when the store refuses it. A fault
while keeping it (``fault``) delivers the plain cut too: the caller counts it as an instrumentation fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..measure import Policy
from ..spill import (
    NO_OWNER,
    SpillRefused,
    SpillStore,
    build_spill,
    is_spill_link,
    link_block,
    resume_page,
    spill_uri,
    summaries,
    with_spill,
)
from . import notices
from .report import CapReport
from .settings import GuardSettings

#: SpillNote.refused when keeping the result failed (a fault, not a decision).
FAULT = "fault"


@dataclass(frozen=True, slots=True)
class SpillNote:
    """What the spill did with one cut result: kept (on ``pages`` pages of ``tokens`` in all) or not (``refused``:
    why); ``evicted``: older spills dropped to make room for it."""

    tool: str | None
    tokens: int = 0
    pages: int = 0
    refused: str | None = None
    evicted: int = 0


def spill_cut(
    store: SpillStore,
    settings: GuardSettings,
    policy: Policy,
    result: Mapping[str, Any],
    cut: Mapping[str, Any],
    report: CapReport,
    *,
    tool: str | None,
    cap: int,
    owner: str | None,
    now: float,
    tokens: int,
) -> tuple[Mapping[str, Any], SpillNote]:
    """Keep ``result`` (which the cap cut to ``cut``, as ``report`` says) for ``owner``: the cut result with the
    spill's sentence in its notice and the resource link after it, or ``cut`` itself when it is not kept.
    ``tokens``: the whole result's data tokens (already measured). ``report.notice_tokens`` follows the new notice
    and link."""
    if not owner:
        return cut, SpillNote(tool, refused=NO_OWNER)
    try:
        return _keep(store, settings, policy, result, cut, report, tool, cap, owner, now, tokens)
    except Exception:  # never worse than the plain cut
        return cut, SpillNote(tool, refused=FAULT)


def _keep(store: SpillStore, settings: GuardSettings, policy: Policy, result: Mapping[str, Any],
          cut: Mapping[str, Any], report: CapReport, tool: str | None, cap: int, owner: str, now: float,
          tokens: int) -> tuple[Mapping[str, Any], SpillNote]:
    notice_was, notice_tokens_was = report.notice, report.notice_tokens
    try:
        spill = build_spill(result, settings.spill_page_size(cap), policy=policy, tokens=tokens, tool=tool,
                            max_bytes=settings.spill_max_bytes)
    except SpillRefused as exc:
        return cut, SpillNote(tool, refused=exc.reason)
    stored = store.put(owner, spill, now)
    if stored.spill_id is None:
        return cut, SpillNote(tool, refused=stored.refused or "store", evicted=stored.evicted)
    hint = notices.spill_hint(
        spill_uri(stored.spill_id), resume=resume_page(spill, result, cut), pages=spill.page_count,
        page_tokens=spill.page_tokens, tokens=spill.tokens, ttl=settings.spill_ttl, summaries=summaries(spill),
        omitted=spill.omitted,
    )
    notice = notices.truncated(report, tool, hint)
    link = link_block(spill, stored.spill_id)
    estimator = policy.estimator
    report.notice_tokens = (notice_tokens_was + estimator(notice) - estimator(notice_was) + estimator(link["uri"])
                            + estimator(link["name"]))
    report.notice = notice
    # Counted as its pages' tokens: what reading all of it costs (the reads count the pages they serve).
    paged = sum(piece.tokens for page in spill.pages for piece in page)
    return with_spill(cut, notice, link), SpillNote(tool, paged, spill.page_count, None, stored.evicted)


def guard_blocks(content: Any, is_notice: Any) -> list[int]:
    """Indexes of the blocks a guard upstream added to ``content``: the notices and spill links that end it, and
    a notice that leads it (``is_notice`` tells a notice block). A guard downstream does not count them as the
    tool's data, so it never cuts a cut result again."""
    out: list[int] = []
    if not isinstance(content, list):
        return out
    for index in range(len(content) - 1, -1, -1):
        block = content[index]
        if not (is_spill_link(block) or is_notice(block)):
            break
        out.append(index)
    if content and 0 not in out and len(out) < len(content) and is_notice(content[0]):
        out.append(0)
    return out
