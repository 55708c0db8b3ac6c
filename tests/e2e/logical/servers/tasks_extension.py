"""A small implementation of the tasks extension (``io.modelcontextprotocol/tasks``, its 2026-07-28 revision)
with mcp 2.3's extension interfaces, for tests: the SDK declares the interfaces (``Extension``,
``MethodBinding``, ``ClientExtension``, ``ResultClaim``) but ships no tasks extension.

Server (:class:`TasksExtension`): a ``tools/call`` of a tool in :data:`TASK_TOOLS` from a client that declares
the extension runs the tool at once, keeps its result, and answers a ``CreateTaskResult``
(``resultType: "task"``, status ``working``). ``tasks/get`` answers ``working`` for the first
:data:`WORKING_POLLS` polls, then ``completed`` with the tool's result inlined; ``tasks/cancel`` acknowledges.

Client (:class:`TasksClient`): claims ``resultType: "task"`` and polls ``tasks/get`` until the task is terminal
(``Mcp-Name`` carries the task id, as the extension requires over HTTP), then returns the inlined result.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, ClassVar, Literal

import anyio
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.server.mcpserver import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, Request, RequestParams, Result
from pydantic import TypeAdapter

IDENTIFIER = "io.modelcontextprotocol/tasks"
TASK_TOOLS: tuple[str, ...] = ("slow_report",)
WORKING_POLLS = 2
POLL_INTERVAL_MS = 20
TTL_MS = 60_000


class TaskParams(RequestParams):
    task_id: str


class GetTaskRequest(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param: ClassVar[str | None] = "taskId"


class CreateTaskResult(Result):
    """What a task-augmented tools/call answers (the task's seed state)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class _Task:
    def __init__(self, result: dict[str, Any]) -> None:
        self.id = str(uuid.uuid4())
        self.created = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        self.result = result
        self.polls = 0
        self.cancelled = False

    def state(self, status: str) -> dict[str, Any]:
        return {"taskId": self.id, "status": status, "createdAt": self.created, "lastUpdatedAt": self.created,
                "ttlMs": TTL_MS, "pollIntervalMs": POLL_INTERVAL_MS}


class TasksExtension(Extension):
    identifier = IDENTIFIER

    def __init__(self) -> None:
        self.tasks: dict[str, _Task] = {}

    def methods(self) -> Sequence[MethodBinding]:
        return (MethodBinding("tasks/get", TaskParams, self._get),
                MethodBinding("tasks/cancel", TaskParams, self._cancel))

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        capabilities = ctx.session.client_capabilities
        declared = capabilities.extensions if capabilities is not None else None
        if params.name not in TASK_TOOLS or not declared or IDENTIFIER not in declared:
            return await call_next(ctx)
        result = await call_next(ctx)
        if hasattr(result, "model_dump"):
            result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        result = {k: v for k, v in dict(result).items() if k not in ("resultType", "_meta")}
        task = _Task(result)
        self.tasks[task.id] = task
        return {"resultType": "task", **task.state("working")}

    def _task(self, params: TaskParams) -> _Task:
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(code=-32602, message="Failed to retrieve task: Task not found")
        return task

    async def _get(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        task = self._task(params)
        if task.cancelled:
            return {"resultType": "complete", **task.state("cancelled")}
        task.polls += 1
        if task.polls <= WORKING_POLLS:
            return {"resultType": "complete", **task.state("working")}
        return {"resultType": "complete", **task.state("completed"), "result": task.result}

    async def _cancel(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        self._task(params).cancelled = True
        return {"resultType": "complete"}


_TASK_STATE: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


async def _finish(created: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
    """Poll the task until it is terminal (bounded), and return its result."""
    request = GetTaskRequest(params=TaskParams(task_id=created.task_id))
    delay = (created.poll_interval_ms or POLL_INTERVAL_MS) / 1000
    for _ in range(100):
        await anyio.sleep(delay)
        state = await ctx.session.send_request(request, _TASK_STATE)
        status = state.get("status")
        if status == "completed":
            return CallToolResult.model_validate(state["result"])
        if status in ("failed", "cancelled"):
            raise MCPError(code=-32603, message=f"task {status}")
    raise TimeoutError("the task did not finish")


class TasksClient(ClientExtension):
    identifier = IDENTIFIER

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=CreateTaskResult, resolve=_finish),)
