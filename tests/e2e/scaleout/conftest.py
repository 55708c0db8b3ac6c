"""Scaled-out deployments on 127.0.0.1 for the end-to-end tests: N replicas of an instrumented MCP server (each a
process of its own, as a Deployment's pods are) or N HTTP proxies in front of one upstream server, sharing budgets
through a real redis-server; an instrumented mcp 2.x client in the test that sends one conversation's calls
round-robin to them (``gen_ai.conversation.id`` baggage, ``budget.propagate: true``); each replica's /metrics read
and summed as Prometheus would sum them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types
from opentelemetry import baggage, context

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.budget_key import CONVERSATION_ID
from tests.helpers.redis_server import RedisServer
from tests.helpers.support import Scrape, free_port, fresh_otel_globals, make_config
from tests.proxy.conftest import proxy_argv, proxy_env, wait_for

SERVER_SCRIPT = Path(__file__).parent / "replica_server.py"
#: The conversation of the report: 20 calls of about 4 KB against a 15,000-token window.
CALLS = 20
WINDOW = 15_000
#: Seconds a replica has to start listening (a loaded CI machine imports slowly).
_START_S = 60.0
#: A deadline for one Redis operation that a loaded test machine does not turn into an outage (the default, 50 ms,
#: is for production; the fault tests set their own).
STORE_TIMEOUT = "2.0"

_prefixes = itertools.count()


@dataclass
class Replica:
    """One process of the deployment: where MCP clients reach it and where its /metrics is."""

    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    metrics_port: int | None
    log: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def metrics(self) -> Scrape:
        assert self.metrics_port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            return Scrape(response.read().decode())

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def running(replicas: Sequence[Replica]) -> Iterator[Sequence[Replica]]:
    """Start every replica at once, wait until each listens (and serves /metrics), stop them all at the end."""
    try:
        for replica in replicas:
            with replica.log.open("wb") as log:
                replica.process = subprocess.Popen(replica.argv, env=replica.env, stdin=subprocess.DEVNULL,
                                                   stdout=log, stderr=subprocess.STDOUT)
        for replica in replicas:
            ports = [replica.port] + ([replica.metrics_port] if replica.metrics_port is not None else [])

            def up(replica: Replica = replica, ports: list[int] = ports) -> bool:
                assert replica.process is not None
                if replica.process.poll() is not None:
                    raise AssertionError(f"{replica.name} exited with {replica.process.returncode}:\n"
                                         f"{replica.output()}")
                return all(_listening(port) for port in ports)

            wait_for(up, timeout=_START_S, what=f"{replica.name} listening")
        yield replicas
    finally:
        for replica in replicas:
            if replica.process is not None and replica.process.poll() is None:
                replica.process.terminate()
        for replica in replicas:
            if replica.process is not None:
                try:
                    replica.process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    replica.process.kill()
                    replica.process.wait(timeout=20)


def store_env(redis: RedisServer | None, prefix: str, **extra: str) -> dict[str, str]:
    """The environment of a replica: this checkout, the budget window and, with ``redis``, the shared store under
    a key prefix of the test's own (``None``: the default memory store)."""
    env = {**os.environ, **proxy_env(None), "MCP_TOKEN_OTEL_ESTIMATOR": "default",
           "MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW": str(WINDOW)}
    if redis is not None:
        env.update({"MCP_TOKEN_OTEL_BUDGET_STORE": redis.url, "MCP_TOKEN_OTEL_BUDGET_STORE_PREFIX": prefix,
                    "MCP_TOKEN_OTEL_BUDGET_STORE_TIMEOUT": STORE_TIMEOUT})
    env.update(extra)
    return env


def server_replicas(n: int, tmp_path: Path, redis: RedisServer | None, prefix: str, **extra: str) -> list[Replica]:
    """N instrumented servers (side ``server``), each serving its /metrics (``prometheus.enabled``)."""
    out = []
    for i in range(n):
        port, metrics_port = free_port(), free_port()
        env = store_env(redis, prefix, MCP_TOKEN_OTEL_PROMETHEUS_ENABLED="true",
                        MCP_TOKEN_OTEL_PROMETHEUS_PORT=str(metrics_port), **extra)
        out.append(Replica(f"server-{i}", [sys.executable, str(SERVER_SCRIPT), str(port)], env, port, metrics_port,
                           tmp_path / f"server-{i}.log"))
    return out


def upstream_server(tmp_path: Path) -> Replica:
    """The one upstream server behind the proxies (not instrumented: the proxies measure)."""
    port = free_port()
    return Replica("upstream", [sys.executable, str(SERVER_SCRIPT), str(port), "--plain"],
                   {**os.environ, **proxy_env(None)}, port, None, tmp_path / "upstream.log")


def proxy_replicas(n: int, tmp_path: Path, upstream: Replica, redis: RedisServer | None, prefix: str,
                   **extra: str) -> list[Replica]:
    """N HTTP proxies (``mcp-token-otel proxy --listen --upstream``, side ``proxy``) in front of ``upstream``."""
    out = []
    for i in range(n):
        port, metrics_port = free_port(), free_port()
        argv = proxy_argv("--listen", f"127.0.0.1:{port}", "--upstream", upstream.url, "--name", "scaleout",
                          "--metrics-port", str(metrics_port))
        out.append(Replica(f"proxy-{i}", argv, store_env(redis, prefix, **extra), port, metrics_port,
                           tmp_path / f"proxy-{i}.log"))
    return out


@contextlib.contextmanager
def deployment(kind: str, n: int, tmp_path: Path, redis: RedisServer | None, prefix: str,
               **extra: str) -> Iterator[tuple[Sequence[Replica], str]]:
    """``kind`` "server": N instrumented servers; "proxy": N proxies and their upstream. Yields the replicas and the
    side their metrics are counted on."""
    if kind == "server":
        with running(server_replicas(n, tmp_path, redis, prefix, **extra)) as replicas:
            yield replicas, "server"
        return
    upstream = upstream_server(tmp_path)
    with running([upstream]), running(proxy_replicas(n, tmp_path, upstream, redis, prefix, **extra)) as proxies:
        yield proxies, "proxy"


def total(replicas: Sequence[Replica], name: str, **labels: str) -> float:
    """A sample summed over every replica's /metrics, as ``sum(...)`` over the job in Prometheus."""
    return sum(replica.metrics().value(name, **labels) for replica in replicas)


def budgeted(replicas: Sequence[Replica], side: str) -> tuple[float, float]:
    """(tokens, exchanges) the replicas counted toward budgets: every exchange but the unbudgeted ones (the
    client's server/discover, sent as it connects, outside the conversation)."""
    tokens = total(replicas, "mcp_token_tokens_total", side=side) - total(
        replicas, "mcp_token_unbudgeted_tokens_total", side=side)
    exchanges = total(replicas, "mcp_token_operation_duration_seconds_count", side=side) - total(
        replicas, "mcp_token_operation_duration_seconds_count", side=side, method="server/discover")
    return tokens, exchanges


def wait_measured(replicas: Sequence[Replica], side: str, calls: int) -> None:
    """Until every replica has measured the calls it answered (the HTTP proxy measures off the relay path)."""
    wait_for(lambda: total(replicas, "mcp_token_operation_duration_seconds_count", side=side,
                           method="tools/call") >= calls, timeout=30, what=f"{calls} calls measured")


def transitions(replicas: Sequence[Replica], side: str) -> tuple[int, int]:
    """(warning, exhausted) transitions summed over the replicas."""
    return (round(total(replicas, "mcp_token_session_transitions_total", side=side, state="warning")),
            round(total(replicas, "mcp_token_session_transitions_total", side=side, state="exhausted")))


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    """A Redis key prefix no other test uses (the module's redis-server is shared)."""
    return f"scaleout-{next(_prefixes)}-{request.node.name[:40]}:"


@pytest.fixture
def propagating_client() -> Iterator[None]:
    """The test process as the agent: an instrumented mcp 2.x client with ``budget.propagate: true`` and no
    recording tracer, so that the conversation reaches the servers through ``budget.propagate`` alone."""
    from mcp_token_otel.instrumentation import instrument, uninstrument

    with fresh_otel_globals():
        assert instrument(make_config(budget={"propagate": True})) is not None
        try:
            yield
        finally:
            uninstrument()


@contextlib.asynccontextmanager
async def clients(replicas: Sequence[Replica]) -> AsyncIterator[list[Client]]:
    """One connected client per replica (the 2026-07-28 protocol: no session ties a call to a replica)."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Client(replica.url, mode="auto")) for replica in replicas]


@contextlib.contextmanager
def conversation(value: str) -> Iterator[None]:
    """What an agent framework does around a conversation's calls."""
    token = context.attach(baggage.set_baggage(CONVERSATION_ID, value))
    try:
        yield
    finally:
        context.detach(token)


async def round_robin(targets: Sequence[Client], conversation_id: str, calls: int, start: int = 0,
                      n: int = 4000) -> list[types.CallToolResult]:
    """``calls`` tools/call of ``n`` characters in one conversation, call i to ``targets[(start + i) % N]``."""
    with conversation(conversation_id):
        return [await targets[(start + i) % len(targets)].call_tool("fetch", {"n": n}) for i in range(calls)]


def run_conversation(replicas: Sequence[Replica], conversation_id: str, calls: int = CALLS,
                     n: int = 4000) -> list[types.CallToolResult]:
    async def main() -> list[types.CallToolResult]:
        with anyio.fail_after(60):
            async with clients(replicas) as targets:
                return await round_robin(targets, conversation_id, calls, n=n)

    return anyio.run(main)


def shared_budget(redis: RedisServer, prefix: str, side: str, conversation_id: str) -> Any:
    """The conversation's budget as the store holds it (read through the store API, as a replica reads it)."""
    from mcp_token_otel.store.redis_store import RedisStore

    budget = config_from_dict({"budget": {"store": redis.url, "store_prefix": prefix, "context_window": WINDOW,
                                          "store_timeout": 5.0}}).budget
    store = RedisStore(budget)
    try:
        return store.peek(side, f"baggage:{CONVERSATION_ID}={conversation_id}")  # the key budget.key makes
    finally:
        store.close()


__all__ = ["CALLS", "WINDOW", "Replica", "budgeted", "clients", "conversation", "deployment", "round_robin",
           "run_conversation", "shared_budget", "total", "transitions", "wait_measured"]
