"""Every metric family this project emits, declared once.

The Prometheus families (the recorder's aggregate collector, the multiprocess families, the proxy's own
collector), the OpenTelemetry instruments, and the metrics table of docs/instrumentation.md are all built from
:data:`FAMILIES`. Adding a metric is one entry here plus the call that records it.

A family has a Prometheus name, an OpenTelemetry instrument name, or both (the MCP conventions' duration
histograms exist on OpenTelemetry alone, one per side; Prometheus has one family with a ``side`` label).
Label names are the Prometheus ones; :meth:`Family.attributes` gives their OpenTelemetry attribute names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from .semconv import (
    A_ERROR_TYPE,
    A_METHOD,
    A_PROTOCOL,
    A_RISK_TIER,
    A_SERVER_NAME,
    A_SESSION_STATE,
    A_SPILL_OUTCOME,
    A_TOOL,
    A_TRANSPORT,
    M_DIRECTION,
    M_FAMILY,
    M_GUARD_ACTION,
    M_GUARD_ENFORCED,
    M_GUARD_POLICY,
    M_SCOPE,
    M_SIDE,
    M_SPILL_REASON,
    M_STAGE,
    MCP_CLIENT_OPERATION_DURATION,
    MCP_CLIENT_SESSION_DURATION,
    MCP_SERVER_OPERATION_DURATION,
    MCP_SERVER_SESSION_DURATION,
)

Kind = Literal["counter", "histogram", "gauge"]
#: Who records a family: the recorder's sinks (emitters/), or the proxy's own counts (proxy/telemetry.py).
Emitter = Literal["recorder", "proxy"]

#: Powers of 4 from 64 to 1 Mi tokens: the GenAI token usage convention's boundaries without its ends (a
#: message under 64 tokens needs no finer bucket; 1 Mi is the largest context window on sale, so anything
#: above it is one "+Inf" case), which keeps /metrics small at 100 tools.
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(4**i) for i in range(3, 11))
UTILIZATION_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 2.0)
#: The MCP conventions' boundaries for the operation and session durations (seconds).
DURATION_BUCKETS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

#: The label value that series past a family's series cap fold into (see emitters/aggregate.py).
OVERFLOW_VALUE = "_other"

#: This project's attributes of the context-cost families (the others come from semconv).
M_DEFINITION_PART = "mcp_token.definition.part"
M_WASTE_KIND = "mcp_token.waste.kind"
M_STORE_OP = "mcp_token.budget_store.op"
#: The parts of a tool definition the split definition gauge shows; they add up to the definitions' total.
DEFINITION_PARTS: tuple[str, ...] = ("description", "schema", "names")
#: The kinds of wasted output tokens.
WASTE_KINDS: tuple[str, ...] = ("repeated", "duplicated")

#: A Prometheus label's OpenTelemetry attribute (a family may override them: Family.otel_attributes).
LABEL_ATTRIBUTES: dict[str, str] = {
    "side": M_SIDE,
    "server": A_SERVER_NAME,
    "method": A_METHOD,
    "tool": A_TOOL,
    "direction": M_DIRECTION,
    "risk_tier": A_RISK_TIER,
    "error_type": A_ERROR_TYPE,
    "state": A_SESSION_STATE,
    "stage": M_STAGE,
    "scope": M_SCOPE,
    "policy": M_GUARD_POLICY,
    "action": M_GUARD_ACTION,
    "enforced": M_GUARD_ENFORCED,
    "transport": A_TRANSPORT,
    "protocol": A_PROTOCOL,
    "family": M_FAMILY,
    "part": M_DEFINITION_PART,
    "kind": M_WASTE_KIND,
    "op": M_STORE_OP,
    "outcome": A_SPILL_OUTCOME,
    "reason": M_SPILL_REASON,
}


@dataclass(frozen=True)
class Family:
    """One metric family. ``name``: the Prometheus name without the ``_total`` a counter's samples take ("" when
    OpenTelemetry only); ``otel_name``: the instrument ("" when Prometheus only)."""

    name: str
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    otel_name: str = ""
    otel_unit: str = ""
    emitter: Emitter = "recorder"
    #: A counter read from this histogram family's sums at scrape time (no storage of its own).
    sum_of: str = ""
    #: Gauges in multiprocess mode: how the workers' values merge (prometheus-client's multiprocess_mode).
    multiprocess_mode: str = ""
    #: Only where series are capped in memory (single process); absent from multiprocess output.
    capped_only: bool = False
    #: OpenTelemetry attribute names when they differ from LABEL_ATTRIBUTES' (parallel to ``labels``).
    otel_attributes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The family's one name in this project: the Prometheus name, else the OpenTelemetry instrument's."""
        return self.name or self.otel_name

    @property
    def sample_name(self) -> str:
        """The name of the family's plain samples (counters take ``_total``)."""
        return f"{self.name}_total" if self.kind == "counter" else self.name

    def attributes(self) -> tuple[str, ...]:
        """The OpenTelemetry attribute of each label."""
        return self.otel_attributes or tuple(LABEL_ATTRIBUTES[label] for label in self.labels)


_MESSAGE = ("side", "server", "method", "tool", "direction")
_TIER = ("side", "server", "method", "tool", "risk_tier")
#: A request's series: its duration and, on output, its overhead.
_OPERATION = ("side", "server", "method", "tool")
_CALL = (*_OPERATION, "error_type")
_SESSION = ("side", "server")
#: The MCP conventions' instruments: their own attributes, and this project's side where the instrument's name does
#: not say it (the proxy's points, in the client instruments).
_CONVENTION_CALL = ("side", "server", "method", "tool", "error_type", "transport", "protocol")
_CONVENTION_SESSION = ("side", "server", "transport", "protocol")

FAMILIES: tuple[Family, ...] = (
    Family("mcp_token_message_tokens", "histogram", "tokens",
           "Estimated tokens of one MCP message (input: request params; output: the response).",
           _MESSAGE, TOKEN_BUCKETS, "mcp_token.message.tokens", "{token}"),
    Family("mcp_token_tokens", "counter", "tokens",
           "Estimated tokens of MCP messages, by direction: input (a call's name and arguments, once), output (its "
           "final result, once), input_required (the questions and sealed state of a multi round-trip call), "
           "input_response (a retry's answers and echoed state), task (task handles, polls and their answers).",
           _MESSAGE, otel_name="mcp_token.tokens", otel_unit="{token}", sum_of="mcp_token_message_tokens"),
    Family("mcp_token_bytes", "counter", "bytes", "UTF-8 bytes of MCP messages.",
           _MESSAGE, otel_name="mcp_token.bytes", otel_unit="By"),
    Family("mcp_token_responses", "counter", "messages",
           "Output messages per risk tier (the high and critical tiers exist at 0 before their first message).",
           _TIER, otel_name="mcp_token.responses", otel_unit="{message}"),
    Family("mcp_token_call_errors", "counter", "calls",
           "Calls that ended in a JSON-RPC error (error_type: its code) or an isError result (tool_error).",
           _CALL, otel_name="mcp_token.call.errors", otel_unit="{call}"),
    # No error_type: it would add a 17-line series per tool that ever erred (call_errors_total has them in one
    # line each); the conventions' instruments keep error.type, which they require.
    Family("mcp_token_operation_duration_seconds", "histogram", "seconds",
           "Duration of an MCP request, from the request to its response (the MCP conventions' buckets); errors "
           "included (mcp_token_call_errors_total counts them per error_type).",
           _OPERATION, DURATION_BUCKETS),
    Family("mcp_token_logical_call_duration_seconds", "histogram", "seconds",
           "Duration of a logical call (tools/call, prompts/get, resources/read), from its first request to its "
           "final result, across its input_required retries (waiting for the answers included) and its task's "
           "polling; observed for calls that took more than one request (a call answered at once lasts its "
           "mcp_token_operation_duration_seconds).",
           _OPERATION, DURATION_BUCKETS, "mcp_token.logical_call.duration", "s"),
    Family("mcp_token_overhead_tokens", "counter", "tokens",
           "Estimated tokens of output messages that are overhead (framing, _meta, duplicated content); over "
           "mcp_token_tokens_total{direction=\"output\"}: the share of output tokens that is overhead.",
           _OPERATION, otel_name="mcp_token.overhead.tokens", otel_unit="{token}"),
    Family("mcp_token_session_utilization_ratio", "histogram", "ratio",
           "Share of the context window a session had used when it ended.",
           _SESSION, UTILIZATION_BUCKETS, "mcp_token.session.utilization", "1"),
    Family("mcp_token_session_duration_seconds", "histogram", "seconds",
           "Duration of an MCP session, observed when it ended.", _SESSION, DURATION_BUCKETS),
    Family("mcp_token_session_transitions", "counter", "sessions",
           "Sessions entering a context-window budget state.",
           ("side", "server", "state"), otel_name="mcp_token.session.transitions", otel_unit="{transition}"),
    Family("mcp_token_tool_definitions_tokens", "gauge", "tokens",
           "Estimated tokens of a server's tool definitions (its last tools/list result): what every "
           "conversation pays before the first call.",
           ("server",), otel_name="mcp_token.tool_definitions.tokens", otel_unit="{token}", multiprocess_mode="max"),
    Family("mcp_token_tool_definition_tokens", "gauge", "tokens",
           "Estimated tokens of one tool's definition (tools within the tool-name bound).",
           ("server", "tool"), otel_name="mcp_token.tool_definition.tokens", otel_unit="{token}",
           multiprocess_mode="max"),
    Family("mcp_token_tool_definitions_part_tokens", "gauge", "tokens",
           "Estimated tokens of a server's tool definitions (its last tools/list result) by part: description "
           "(the descriptions), schema (inputSchema and outputSchema), names (tool names and JSON framing); the parts "
           "add up to mcp_token_tool_definitions_tokens.",
           ("server", "part"), otel_name="mcp_token.tool_definitions.part.tokens", otel_unit="{token}",
           multiprocess_mode="max"),
    Family("mcp_token_tool_static_max_tokens", "gauge", "tokens",
           "The worst case of a tool's result judged from its tools/list definition (its static profile); only "
           "tools whose result something bounds (tools within the tool-name bound).",
           ("server", "tool"), otel_name="mcp_token.tool.static_max.tokens", otel_unit="{token}",
           multiprocess_mode="max"),
    Family("mcp_token_prompt_cache_invalidations", "counter", "changes",
           "tools/list results whose tools (content or order) differ from the previous one in the same session or "
           "conversation (budget.key): each invalidates the model's prompt cache from the tool definitions on.",
           _SESSION, otel_name="mcp_token.prompt_cache.invalidations", otel_unit="{change}"),
    Family("mcp_token_prompt_cache_resent_tokens", "counter", "tokens",
           "Estimated definition tokens sent again uncached after a tools/list change (the new list's "
           "definitions; the conversation after them is re-read too and is not counted).",
           _SESSION, otel_name="mcp_token.prompt_cache.resent.tokens", otel_unit="{token}"),
    Family("mcp_token_wasted_tokens", "counter", "tokens",
           "Estimated output tokens that add nothing new: kind=repeated (the same tool with the same arguments "
           "again within metrics.repeat_window in one session or conversation), kind=duplicated "
           "(structuredContent that repeats the text content: what a client that forwards both pays).",
           ("side", "server", "tool", "kind"), otel_name="mcp_token.wasted.tokens", otel_unit="{token}"),
    Family("mcp_token_instrumentation_errors", "counter", "errors",
           "Faults caught inside the instrumentation; the MCP call itself went on.",
           ("stage", "server"), otel_name="mcp_token.instrumentation.errors", otel_unit="{error}"),
    Family("mcp_token_guard_actions", "counter", "actions",
           "Guard actions (truncated, refused, warned, found, stripped, annotated) per policy; enforced=false: "
           "observe mode, what enforce mode would have done.",
           ("side", "server", "policy", "action", "enforced", "tool"),
           otel_name="mcp_token.guard.actions", otel_unit="{action}"),
    Family("mcp_token_cost_usd", "counter", "USD",
           "Estimated USD of the results that entered the context (guard.model's input price).",
           ("side", "server", "tool"), otel_name="mcp_token.cost", otel_unit="USD"),
    Family("mcp_token_spilled_tokens", "counter", "tokens",
           "Estimated tokens of tool results the response cap cut and kept whole (guard.spill), readable page by page "
           "through the link in the cut result. mcp_token_spill_read_tokens_total over it is the share the agent read "
           "back: near 0, the cap keeps what is needed; a large share, the cap is too tight for that tool.",
           ("side", "server", "tool"), otel_name="mcp_token.spilled.tokens", otel_unit="{token}"),
    Family("mcp_token_spill_read_tokens", "counter", "tokens",
           "Estimated tokens of the kept pages served to resources/read (guard.spill): what the agent read back of "
           "what the response cap cut.",
           ("side", "server", "tool"), otel_name="mcp_token.spill.read.tokens", otel_unit="{token}"),
    Family("mcp_token_spill_reads", "counter", "reads",
           "Reads of kept results, by outcome: served; expired (the reader's own, gone after guard.spill_ttl without "
           "a read or dropped for room: raise guard.spill_ttl or guard.spill_max_bytes if it grows); not_found (no "
           "such result here: replicas without a shared budget store, or ids being guessed); forbidden (a different "
           "conversation's result, answered as not_found); invalid (a malformed spill URI, a page out of range). "
           "tool is the cut tool's, empty when unknown.",
           ("side", "server", "tool", "outcome"), otel_name="mcp_token.spill.reads", otel_unit="{read}"),
    Family("mcp_token_spills_refused", "counter", "results",
           "Cut results not kept, by reason (the cut is delivered as it is): no_owner (no budget key: see "
           "budget.key), too_large (above guard.spill_max_bytes), too_many_pages (above 10,000 pages: raise "
           "guard.spill_page_tokens), empty, store (the store did not take it).",
           ("side", "server", "tool", "reason"), otel_name="mcp_token.spills.refused", otel_unit="{result}"),
    Family("mcp_token_spill_evictions", "counter", "results",
           "Kept results dropped before their TTL, least recently read first, to stay within guard.spill_max_bytes: "
           "their reads answer expired. Raise guard.spill_max_bytes when it keeps growing.",
           ("side", "server"), otel_name="mcp_token.spill.evictions", otel_unit="{result}"),
    Family("mcp_token_sessions_evicted", "counter", "sessions",
           "Live sessions whose bookkeeping was dropped, least recently used first, to stay within "
           "budget.max_sessions.",
           _SESSION, otel_name="mcp_token.sessions.evicted", otel_unit="{session}"),
    Family("mcp_token_budget_store_errors", "counter", "operations",
           "Budget-store operations answered from this process's own count because the shared store (budget.store) "
           "failed, timed out or was backing off after a failure (op: add, peek, rate, end, flush, probe; spill_put, "
           "spill_get for kept results, then kept in this process or told not_found): the conversation's figures "
           "here are this replica's share until it answers again.",
           ("server", "op"), otel_name="mcp_token.budget_store.errors", otel_unit="{operation}"),
    Family("mcp_token_unbudgeted_tokens", "counter", "tokens",
           "Estimated tokens of messages that no budget key (budget.key) attributed to a conversation: "
           "context use no budget, hard limit or exhaustion alert sees.",
           _SESSION, otel_name="mcp_token.unbudgeted.tokens", otel_unit="{token}"),
    Family("mcp_token_series_overflow", "counter", "records",
           "Records folded into a family's overflow series (every label _other) because the family had reached "
           "its series cap; existing series keep counting.",
           ("family",), otel_name="mcp_token.series.overflow", otel_unit="{record}", capped_only=True),
    Family("mcp_token_output_rate_budget_tokens_per_second", "gauge", "tokens per second",
           "Configured sustained output-token budget, in tokens per second (for alerting).",
           ("scope", "server"), otel_name="mcp_token.output_rate_budget", otel_unit="{token}/s",
           multiprocess_mode="max"),
    Family("mcp_token_sessions", "gauge", "sessions", "Live MCP sessions per context-window budget state.",
           ("side", "server", "state"), otel_name="mcp_token.sessions", otel_unit="{session}",
           multiprocess_mode="livesum"),
    # OpenTelemetry alone: the MCP conventions' durations (one instrument per side, their attributes) and the
    # deferred OpenTelemetry sink's drops.
    Family("", "histogram", "seconds",
           "Duration of an MCP request as the client saw it (client and proxy sides; the proxy's points carry "
           "mcp_token.side=proxy).", _CONVENTION_CALL, DURATION_BUCKETS, MCP_CLIENT_OPERATION_DURATION, "s"),
    Family("", "histogram", "seconds", "Duration of an MCP request as the server saw it.",
           _CONVENTION_CALL, DURATION_BUCKETS, MCP_SERVER_OPERATION_DURATION, "s"),
    Family("", "histogram", "seconds",
           "Duration of an MCP session as the client saw it, observed when it ended (the proxy's points carry "
           "mcp_token.side=proxy).",
           _CONVENTION_SESSION, DURATION_BUCKETS, MCP_CLIENT_SESSION_DURATION, "s"),
    Family("", "histogram", "seconds", "Duration of an MCP session as the server saw it, observed when it ended.",
           _CONVENTION_SESSION, DURATION_BUCKETS, MCP_SERVER_SESSION_DURATION, "s"),
    Family("", "counter", "points",
           "Metric points dropped because the background recorder's queue (100,000 points) was full.",
           ("server",), otel_name="mcp_token.instrumentation.dropped", otel_unit="{point}"),
    # The proxy's own counts (read from its ProxyStats at collection).
    Family("mcp_token_proxy_messages", "counter", "messages",
           "JSON-RPC messages the proxy relayed and measured, by kind.", ("server", "direction", "kind"),
           otel_name="mcp_token.proxy.messages", otel_unit="{message}", emitter="proxy",
           otel_attributes=(A_SERVER_NAME, "mcp_token.proxy.direction", "mcp_token.proxy.kind")),
    Family("mcp_token_proxy_measurement_dropped_bytes", "counter", "bytes",
           "Bytes relayed but not measured because the measuring queue was full.", ("server",),
           otel_name="mcp_token.proxy.measurement.dropped", otel_unit="By", emitter="proxy"),
    Family("mcp_token_proxy_measurement_dropped_chunks", "counter", "chunks",
           "Relayed chunks not measured because the measuring queue was full.", ("server",),
           otel_name="mcp_token.proxy.measurement.dropped_chunks", otel_unit="{chunk}", emitter="proxy"),
    Family("mcp_token_proxy_oversize_messages", "counter", "messages",
           "Messages relayed but not measured because they exceed the measuring size limit.", ("server",),
           otel_name="mcp_token.proxy.oversize_messages", otel_unit="{message}", emitter="proxy"),
)

BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES if f.name}
BY_OTEL_NAME: dict[str, Family] = {f.otel_name: f for f in FAMILIES if f.otel_name}


def prometheus_families(emitter: Emitter) -> Iterator[Family]:
    """The Prometheus families ``emitter`` exposes, in catalog order (the order of the exposition)."""
    return (f for f in FAMILIES if f.name and f.emitter == emitter)


def otel_families(emitter: Emitter) -> Iterator[Family]:
    """The OpenTelemetry instruments ``emitter`` creates, in catalog order."""
    return (f for f in FAMILIES if f.otel_name and f.emitter == emitter)


# ---------------------------------------------------------------------- the docs' metrics table

TABLE_BEGIN = "<!-- metric catalog: generated by `python -m mcp_token_otel.catalog docs/instrumentation.md` -->"
TABLE_END = "<!-- end of metric catalog -->"


def _bounds(buckets: tuple[float, ...]) -> str:
    return ", ".join(f"{int(b)}" if b == int(b) and b >= 1 else f"{b:g}" for b in buckets)


def _row(family: Family) -> str:
    prometheus = f"`{family.sample_name}`" if family.name else "-"
    otel = f"`{family.otel_name}` (`{family.otel_unit}`)" if family.otel_name else "-"
    kind = f"{family.kind} ({_bounds(family.buckets)})" if family.buckets else family.kind
    labels = ", ".join(
        f"`{label}`" if attribute == LABEL_ATTRIBUTES.get(label) else f"`{label}` (`{attribute}`)"
        for label, attribute in zip(family.labels, family.attributes(), strict=True)
    )
    text = family.help.replace("|", "\\|")
    return f"| {prometheus} | {otel} | {kind} | {family.unit} | {labels} | {family.emitter} | {text} |"


def markdown_table() -> str:
    """The docs' metrics table: every family, then each label's OpenTelemetry attribute."""
    header = "| Prometheus | OpenTelemetry (unit) | kind (buckets) | unit | labels | recorded by | meaning |"
    lines = [TABLE_BEGIN, "", header, "|---|---|---|---|---|---|---|", *(_row(f) for f in FAMILIES), "",
             "| label | OpenTelemetry attribute |", "|---|---|",
             *(f"| `{label}` | `{attribute}` |" for label, attribute in LABEL_ATTRIBUTES.items()), "", TABLE_END]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Print the table, or with a path, rewrite the table between its markers in that file."""
    if not argv:
        print(markdown_table())
        return 0
    path = argv[0]
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    start, end = doc.index(TABLE_BEGIN), doc.index(TABLE_END) + len(TABLE_END)
    table = markdown_table()
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc[:start] + table + doc[end:])
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
