"""Logical calls: the requests that make up one MCP call, told apart and joined.

Since protocol 2026-07-28 one call can take several requests (legs):

* **Multi round-trip requests.** A ``tools/call``, ``prompts/get`` or ``resources/read`` may be answered
  ``resultType: "input_required"``: questions for the user or the client's model in ``inputRequests``, the
  server's sealed ``requestState``, or both. The client asks, then sends the same request again with
  ``inputResponses`` and the state echoed, until a final result.
* **Tasks** (the ``io.modelcontextprotocol/tasks`` extension). A ``tools/call`` may be answered with a task
  handle (``resultType: "task"``; on 2025-11-25 a result holding ``task``) whose result comes later: inlined in
  the ``tasks/get`` answer that reports the task ``completed`` (or its error, ``failed``), from ``tasks/result``
  (2025-11-25), or in a ``notifications/tasks`` notification.

:class:`LogicalCalls` joins them: :meth:`~LogicalCalls.request` says what a request is (a call's first leg, a
retry continuing a call, a task message, or none of these), :meth:`~LogicalCalls.result`,
:meth:`~LogicalCalls.error` and :meth:`~LogicalCalls.notification` what its answer is (a question, a task
handle or status, or the call's final result). A recorder can then count one call, one response and one risk
tier for the final result, and the legs' own tokens apart.

**Correlation.** A retry is a request that carries ``requestState`` or ``inputResponses``. With a state, it
continues the call whose ``input_required`` answer carried that state, matched by a digest (the state itself
is never kept: it may hold the user's earlier answers). Without one, it continues the oldest call with the
same method, target, arguments and budget key whose last answer was ``input_required`` without a state.
Either only within ``window`` seconds of that answer. A retry that matches nothing (its first leg was not seen,
or too long ago) starts a call marked ``partial``. A task's messages are attributed, by a digest of the task
id, to the call whose answer created the task.

**Bounds.** At most ``max_entries`` calls awaiting a retry (per way of matching) and ``max_entries`` tasks,
each kept ``window`` seconds (a task: its ``ttlMs``, at most ``task_window``); when full, the least recent goes
first. A call dropped before its final answer is handed to ``on_abandoned``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import count
from typing import Any

#: Methods whose answer may be ``input_required`` (multi round-trip requests) and that may create a task.
MRTR_METHODS = frozenset({"tools/call", "prompts/get", "resources/read"})
#: The tasks extension's requests (``tasks/result`` and ``tasks/list``: 2025-11-25) and notifications.
TASK_REQUESTS = frozenset({"tasks/get", "tasks/update", "tasks/cancel", "tasks/result", "tasks/list"})
TASK_NOTIFICATIONS = frozenset({"notifications/tasks", "notifications/tasks/status"})
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})

# What a request is (Leg.role).
CALL = "call"  # a call's first leg (or its only one)
RETRY = "retry"  # a later leg of a call: carries inputResponses and/or the echoed requestState
TASK = "task"  # a request of the tasks extension
PLAIN = "plain"  # anything else: a request of its own, as before 2026-07-28

# What an answer is (Outcome.kind).
FINAL = "final"  # the call's final result or error, answered to its own method
INPUT_REQUIRED = "input_required"  # questions and/or state: the call goes on with a retry
TASK_CREATED = "task_created"  # a task handle: the call's result comes through the task
TASK_STATUS = "task_status"  # a task message that is not the call's result (a poll, an acknowledgement)
TASK_RESULT = "task_result"  # the call's final result or error, delivered through its task
# PLAIN: the answer to a plain request.

#: Parameters of a retry that answer the questions (what the client sends beyond the call itself).
ANSWER_KEYS = ("inputResponses", "requestState")
#: Fields of an input_required answer that are the questions and the state.
QUESTION_KEYS = ("inputRequests", "requestState")
#: Calls with the same digest awaiting a retry without a state (concurrent identical calls), at most.
MAX_SAME = 8


def digest(value: str) -> bytes:
    """A 16-byte BLAKE2b digest of a string (lone surrogates included): what is kept of a state or a task id."""
    return hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).digest()


#: Canonical JSON: the same arguments in any key order give the same digest.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def arguments_digest(*parts: Any) -> bytes | None:
    """A digest of values as canonical JSON (a call's budget key, method, target, arguments); None when JSON
    cannot hold them (a circular structure)."""
    try:
        text = _CANONICAL.encode(parts)
    except (ValueError, TypeError, RecursionError):
        return None
    return digest(text)


def result_type(result: Any) -> str | None:
    """A result's ``resultType`` (None when absent: a result before 2026-07-28, or not a mapping)."""
    value = result.get("resultType") if isinstance(result, (dict, Mapping)) else None
    return value if isinstance(value, str) else None


def is_retry(params: Any) -> bool:
    """Whether request params carry what only a retry carries: ``requestState`` or ``inputResponses``."""
    return isinstance(params, (dict, Mapping)) and (
        params.get("requestState") is not None or params.get("inputResponses") is not None
    )


def call_target(method: str, params: Any) -> str | None:
    """What a call names: the tool or prompt (``name``), the resource (``uri``)."""
    if not isinstance(params, (dict, Mapping)):
        return None
    value = params.get("uri" if method == "resources/read" else "name")
    return value if isinstance(value, str) else None


def _parts(value: Any, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """The entries of ``keys`` present (not null) in a mapping, or None."""
    if not isinstance(value, (dict, Mapping)):
        return None
    found = {k: value[k] for k in keys if value.get(k) is not None}
    return found or None


@dataclass(slots=True, eq=False)
class LogicalCall:
    """One call, however many requests it takes. ``link`` and ``data`` are the recorder's (the first leg's
    span context, for the later legs' span links; anything it accumulates)."""

    id: int
    method: str
    target: str | None
    key: str | None
    started: float
    legs: int = 1
    #: input_required answers so far.
    questions: int = 0
    #: Its first leg was not seen: a retry that matched no call.
    partial: bool = False
    #: Its result comes through a task.
    task: bool = False
    ended: bool = False
    link: Any = None
    data: Any = None


@dataclass(slots=True, eq=False)
class Leg:
    """One request and what it is. ``index``: 0 for a call's first leg (and a plain or task request), 1 for the
    first retry, and so on."""

    role: str
    method: str
    call: LogicalCall | None = None
    index: int = 0
    key: str | None = None
    #: A retry's ``inputResponses`` and echoed ``requestState``; a ``tasks/update``'s ``inputResponses``.
    answers: dict[str, Any] | None = None
    #: A call leg's arguments (referenced, not copied), until its answer: to await a retry without a state.
    arguments: Any = None
    #: The digest of the task a task request names.
    task_digest: bytes | None = None
    answered: bool = False

    @property
    def retry(self) -> bool:
        return self.role == RETRY

    @property
    def link(self) -> Any:
        """What the recorder keeps for span links: the first leg's span context, on a later leg."""
        call = self.call
        return call.link if call is not None and self.role != CALL else None


@dataclass(slots=True, eq=False)
class Outcome:
    """What an answer is. ``result``: for FINAL and TASK_RESULT the call's result (a task's result, unwrapped),
    otherwise the answer itself; ``error``: the call's JSON-RPC error; ``question``: the questions and state of
    an ``input_required`` answer (or an ``input_required`` task); ``envelope``: the task fields around an
    inlined task result (task bookkeeping, not the call's output); ``duration``: seconds from the call's first
    leg to its final result."""

    kind: str
    call: LogicalCall | None = None
    result: Any = None
    error: Any = None
    question: dict[str, Any] | None = None
    envelope: dict[str, Any] | None = None
    status: str | None = None
    duration: float | None = None

    @property
    def final(self) -> bool:
        """The call's final answer: count its response, its risk tier and its duration now."""
        return self.kind in (FINAL, TASK_RESULT)


@dataclass(slots=True, eq=False)
class _Entry:
    call: LogicalCall
    expires: float


class _Table:
    """Entries by digest, in insertion order (so the oldest is first), at most ``limit``."""

    __slots__ = ("entries", "limit")

    def __init__(self, limit: int) -> None:
        self.entries: dict[bytes, list[_Entry]] = {}
        self.limit = limit

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, key: bytes, entry: _Entry, dropped: list[_Entry], now: float) -> None:
        entries = self.entries
        same = entries.pop(key, None) or []  # re-inserted last: the dict's order stays the order of use
        same = [e for e in same if e.expires >= now]
        same.append(entry)
        if len(same) > MAX_SAME:
            dropped.append(same.pop(0))
        while len(entries) >= self.limit:
            dropped.extend(entries.pop(next(iter(entries))))
        entries[key] = same

    def take(self, key: bytes, now: float, match: Callable[[LogicalCall], bool]) -> LogicalCall | None:
        """Remove and return the oldest live entry under ``key`` that ``match``es."""
        same = self.entries.get(key)
        if not same:
            return None
        for i, entry in enumerate(same):
            if entry.expires >= now and match(entry.call):
                del same[i]
                if not same:
                    del self.entries[key]
                return entry.call
        return None

    def get(self, key: bytes, now: float) -> LogicalCall | None:
        same = self.entries.get(key)
        if same and same[-1].expires >= now:
            return same[-1].call
        return None

    def expire(self, now: float, dropped: list[_Entry], full: bool = False) -> None:
        """Drop expired entries: from the oldest on, stopping at the first key with a live entry (``full``:
        every key)."""
        entries = self.entries
        for key in list(entries) if full else _head(entries):
            same = entries[key]
            live = [e for e in same if e.expires >= now]
            if len(live) == len(same):
                if not full:
                    return
                continue
            dropped.extend(e for e in same if e.expires < now)
            if live:
                entries[key] = live
                if not full:
                    return
            else:
                del entries[key]


def _head(entries: dict[bytes, list[_Entry]]) -> Iterator[bytes]:
    """The keys from the oldest on, read one at a time (the caller deletes as it goes)."""
    while entries:
        yield next(iter(entries))


class LogicalCalls:
    """Joins the legs of logical calls, for one side of one process (a client, a server, a proxy): legs of
    one call may arrive on different connections, so this is shared, not per connection.

    ``window``: seconds a call awaits its retry; ``task_window``: the longest a task is followed (its own
    ``ttlMs`` when shorter); ``max_entries``: bound of each table; ``clock``: seconds (injectable for tests;
    every method also takes ``now``); ``on_abandoned(call)``: a call dropped before its final answer (expired,
    evicted). Thread-safe."""

    def __init__(
        self,
        *,
        window: float = 600.0,
        task_window: float = 3600.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        on_abandoned: Callable[[LogicalCall], None] | None = None,
    ) -> None:
        if not window > 0 or not task_window > 0:
            raise ValueError(f"logical calls: windows must be positive, got {window!r} and {task_window!r}")
        if max_entries < 1:
            raise ValueError(f"logical calls: max_entries must be a positive integer, got {max_entries!r}")
        self.window = window
        self.task_window = task_window
        self._clock = clock
        self._on_abandoned = on_abandoned
        self._by_state = _Table(max_entries)
        self._by_arguments = _Table(max_entries)
        self._tasks = _Table(max_entries)
        self._ids = count(1)
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Entries held: calls awaiting a retry, tasks followed (a property, not ``len()``: a tracker holding
        nothing is still a tracker, never falsy)."""
        return len(self._by_state) + len(self._by_arguments) + len(self._tasks)

    # ------------------------------------------------------------------ requests

    def request(self, method: str, params: Any, key: str | None = None, now: float | None = None) -> Leg:
        """A request was sent (client, proxy) or received (server): what it is. ``key``: the budget key it counts
        toward (None: unbudgeted)."""
        if method in MRTR_METHODS:
            return self._call_leg(method, params, key, self._clock() if now is None else now)
        if method in TASK_REQUESTS:
            leg = Leg(TASK, method, key=key)
            task_id = params.get("taskId") if isinstance(params, (dict, Mapping)) else None
            if isinstance(task_id, str):
                leg.task_digest = digest(task_id)
                with self._lock:
                    leg.call = self._tasks.get(leg.task_digest, self._clock() if now is None else now)
            if method == "tasks/update":
                leg.answers = _parts(params, ("inputResponses",))
            return leg
        return Leg(PLAIN, method, key=key)

    def _call_leg(self, method: str, params: Any, key: str | None, now: float) -> Leg:
        target = call_target(method, params)
        arguments = params.get("arguments") if isinstance(params, (dict, Mapping)) else None
        if not is_retry(params):
            return Leg(CALL, method, LogicalCall(next(self._ids), method, target, key, now), 0, key,
                       arguments=arguments)
        answers = _parts(params, ANSWER_KEYS)
        state = params.get("requestState")

        def same_call(call: LogicalCall) -> bool:
            return call.method == method and call.target == target

        dropped: list[_Entry] = []
        call: LogicalCall | None = None
        with self._lock:
            if isinstance(state, str):
                call = self._by_state.take(digest(state), now, same_call)
            else:
                found = arguments_digest(key, method, target, arguments)
                if found is not None:
                    call = self._by_arguments.take(found, now, same_call)
            self._expire_head(now, dropped)
        self._abandoned(dropped)
        if call is None:  # its first leg was not seen, or too long ago: a call of its own from here
            call = LogicalCall(next(self._ids), method, target, key, now, partial=True)
            return Leg(RETRY, method, call, 1, key, answers, arguments)
        call.legs += 1
        return Leg(RETRY, method, call, call.legs - 1, key, answers, arguments)

    # ------------------------------------------------------------------ answers

    def result(self, leg: Leg, result: Any, now: float | None = None) -> Outcome:
        """The result answering ``leg``."""
        leg.answered = True
        if leg.role == PLAIN:
            return Outcome(PLAIN, result=result)
        now = self._clock() if now is None else now
        if leg.role == TASK:
            return self._task_answer(leg, result, now)
        call = leg.call
        if call is None:  # not made by request(): nothing to join
            return Outcome(PLAIN, result=result)
        arguments, leg.arguments = leg.arguments, None
        kind = result_type(result)
        if kind == "input_required":
            return self._input_required(leg, call, result, arguments, now)
        task_id, ttl = _created_task(kind, result)
        if task_id is not None:
            call.task = True
            dropped: list[_Entry] = []
            with self._lock:
                expires = now + (min(ttl, self.task_window) if ttl is not None else self.task_window)
                self._tasks.add(digest(task_id), _Entry(call, expires), dropped, now)
            self._abandoned(dropped)
            return Outcome(TASK_CREATED, call, result=result, status=_status(result))
        call.ended = True
        return Outcome(FINAL, call, result=result, duration=max(0.0, now - call.started))

    def _input_required(self, leg: Leg, call: LogicalCall, result: Any, arguments: Any, now: float) -> Outcome:
        call.questions += 1
        question = _parts(result, QUESTION_KEYS)
        state = result.get("requestState") if isinstance(result, (dict, Mapping)) else None
        dropped: list[_Entry] = []
        with self._lock:
            entry = _Entry(call, now + self.window)
            if isinstance(state, str):
                self._by_state.add(digest(state), entry, dropped, now)
            else:
                found = arguments_digest(call.key, call.method, call.target, arguments)
                if found is not None:
                    self._by_arguments.add(found, entry, dropped, now)
            self._expire_head(now, dropped)
        self._abandoned(dropped)
        return Outcome(INPUT_REQUIRED, call, result=result, question=question)

    def _task_answer(self, leg: Leg, result: Any, now: float) -> Outcome:
        call = leg.call
        status = _status(result)
        question = _parts(result, ("inputRequests",)) if status == "input_required" else None
        if call is None or call.ended:
            return Outcome(TASK_STATUS, call, result=result, status=status, question=question)
        if leg.method == "tasks/result":  # 2025-11-25: the payload itself, once the task is terminal
            return self._task_done(call, now, status, result=result)
        if leg.method == "tasks/get" and _delivers(result, status):
            return self._task_done(call, now, status, delivery=result)
        return Outcome(TASK_STATUS, call, result=result, status=status, question=question)

    def error(self, leg: Leg, error: Any, now: float | None = None) -> Outcome:
        """The JSON-RPC error answering ``leg``: a call's final answer (a retry's too: the call is over), a
        ``tasks/result``'s the task's call's; another task request's is its own."""
        leg.answered = True
        leg.arguments = None
        call = leg.call
        if leg.role == PLAIN or call is None:
            return Outcome(PLAIN if leg.role == PLAIN else TASK_STATUS, call, error=error)
        now = self._clock() if now is None else now
        if leg.role == TASK:
            if leg.method == "tasks/result" and not call.ended:
                return self._task_done(call, now, "failed", error=error)
            return Outcome(TASK_STATUS, call, error=error)
        call.ended = True
        return Outcome(FINAL, call, error=error, duration=max(0.0, now - call.started))

    def notification(self, method: str, params: Any, now: float | None = None) -> Outcome | None:
        """A notification: None unless it is about a task. A ``notifications/tasks`` that reports a followed task
        terminal delivers its call's result (the first delivery only; polls that repeat it are task status)."""
        if method not in TASK_NOTIFICATIONS:
            return None
        task_id = params.get("taskId") if isinstance(params, (dict, Mapping)) else None
        if not isinstance(task_id, str):
            return Outcome(TASK_STATUS, result=params)
        now = self._clock() if now is None else now
        with self._lock:
            call = self._tasks.get(digest(task_id), now)
        status = _status(params)
        # The extension's notification carries the whole task state, its result or error inlined.
        if method == "notifications/tasks" and call is not None and not call.ended and status in TERMINAL_STATUSES:
            return self._task_done(call, now, status, delivery=params)
        return Outcome(TASK_STATUS, call, result=params, status=status)

    def _task_done(self, call: LogicalCall, now: float, status: str | None, *, result: Any = None,
                   error: Any = None, delivery: Any = None) -> Outcome:
        """The call's result arrived through its task: unwrapped from a task state (``delivery``), or whole."""
        envelope = None
        if isinstance(delivery, (dict, Mapping)):
            envelope = {k: v for k, v in delivery.items() if k not in ("result", "error")}
            result, error = delivery.get("result"), delivery.get("error")
        call.ended = True
        return Outcome(TASK_RESULT, call, result=result, error=error, envelope=envelope, status=status,
                       duration=max(0.0, now - call.started))

    def abandon(self, leg: Leg) -> LogicalCall | None:
        """``leg`` will never be answered (its connection closed, or it was evicted): its call ends unfinished.
        Returns the call when the leg was a call's, for the recorder to close."""
        leg.arguments = None
        call = leg.call
        if leg.answered or leg.role not in (CALL, RETRY) or call is None or call.ended:
            return None
        leg.answered = True
        call.ended = True
        return call

    # ------------------------------------------------------------------ bounds

    def expire(self, now: float | None = None) -> int:
        """Drop every entry past its time (the recorder's periodic sweep); the count dropped."""
        now = self._clock() if now is None else now
        dropped: list[_Entry] = []
        with self._lock:
            for table in (self._by_state, self._by_arguments, self._tasks):
                table.expire(now, dropped, full=True)
        self._abandoned(dropped)
        return len(dropped)

    def _expire_head(self, now: float, dropped: list[_Entry]) -> None:
        # Calls awaiting a retry all wait the same window, so the oldest entries expire first: a sweep from the
        # head stops at the first live entry (amortised O(1) per call).
        self._by_state.expire(now, dropped)
        self._by_arguments.expire(now, dropped)

    def _abandoned(self, dropped: list[_Entry]) -> None:
        """Calls dropped before their final answer (a call retried since is not: it moved on). Every one is
        ended and handed over even when the callback raises; then its first exception is raised."""
        ended = [entry.call for entry in dropped if not entry.call.ended]
        for call in ended:
            call.ended = True
        callback, failure = self._on_abandoned, None
        if callback is None:
            return
        for call in ended:
            try:
                callback(call)
            except Exception as exc:  # the recorder counts it; the other calls are still handed over
                failure = failure or exc
        if failure is not None:
            raise failure


def _status(value: Any) -> str | None:
    status = value.get("status") if isinstance(value, (dict, Mapping)) else None
    return status if isinstance(status, str) else None


def _delivers(state: Any, status: str | None) -> bool:
    """Whether a task state delivers its call's end: the extension inlines a terminal task's ``result`` or
    ``error`` (and a cancelled task has neither); on 2025-11-25 ``tasks/get`` reports the status alone (no
    ``resultType``) and ``tasks/result`` delivers."""
    if status not in TERMINAL_STATUSES or not isinstance(state, (dict, Mapping)):
        return False
    return "result" in state or "error" in state or (status == "cancelled" and "resultType" in state)


def _created_task(kind: str | None, result: Any) -> tuple[str | None, float | None]:
    """(task id, seconds to follow it or None) when ``result`` is a task handle: ``resultType: "task"`` with
    ``taskId`` and ``ttlMs`` (the extension), or a result holding ``task`` with ``taskId`` and ``ttl``
    (2025-11-25); (None, None) otherwise."""
    if not isinstance(result, (dict, Mapping)):
        return None, None
    if kind == "task":
        task_id, ttl = result.get("taskId"), result.get("ttlMs")
    elif kind is None and isinstance(result.get("task"), Mapping) and "content" not in result:
        task = result["task"]
        task_id, ttl = task.get("taskId"), task.get("ttl")
    else:
        return None, None
    if not isinstance(task_id, str):
        return None, None
    seconds = ttl / 1000 if isinstance(ttl, (int, float)) and not isinstance(ttl, bool) and ttl >= 0 else None
    return task_id, seconds
