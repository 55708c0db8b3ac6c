"""Capture a real 2025-11-25 task exchange: an mcp 1.x client calls a tool as a task on servers/tasks_v1_server.py
(the SDK's experimental tasks), polls ``tasks/get`` and fetches ``tasks/result``; recorded over stdio by
servers/record_relay.py. Run with the mcp 1.x interpreter:

    PYTHONPATH=. .venv-mcp1/bin/python -m tests.e2e.logical.capture_v1 tests/fixtures/logical_calls
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

SERVERS = Path(__file__).resolve().parent / "servers"
warnings.simplefilter("ignore")


async def capture() -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "wire.jsonl"
        relay = [str(SERVERS / "record_relay.py"), str(log), "--"]
        params = StdioServerParameters(command=sys.executable, env={**os.environ},
                                       args=[*relay, sys.executable, str(SERVERS / "tasks_v1_server.py")])
        with anyio.fail_after(60):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                created = await session.experimental.call_tool_as_task("report", {"n": 4000})
                task_id = created.task.taskId
                for _ in range(200):
                    status = await session.experimental.get_task(task_id)
                    if status.status == "completed":
                        break
                    await anyio.sleep(0.02)
                result = await session.experimental.get_task_result(task_id, types.CallToolResult)
                assert result.content and not result.isError, result
        return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path("tests/fixtures/logical_calls")
    messages = anyio.run(capture)
    fixture = {"scenario": "task_v1", "transport": "stdio", "protocol": "2025-11-25",
               "source": f"captured from mcp {importlib.metadata.version('mcp')} (tests/e2e/logical/capture_v1.py)",
               "messages": messages}
    path = folder / "task_v1.stdio.json"
    path.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{path}: {len(messages)} messages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
