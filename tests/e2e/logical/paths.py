"""The same multi round-trip and task exchanges, measured on every path that can see them: the shim's client and
server sides in process (direct and over streamable HTTP on 127.0.0.1), and through the stdio and HTTP proxies
(subprocesses), with the shim on the client in this process and on the server subprocess too.

Each path runs each scenario in a client session of its own, and a conversation of its own (the
``gen_ai.conversation.id`` baggage: the budget key where the protocol has no session, 2026-07-28 HTTP), so one
scenario's calls are never another's repeats. What each observer measured is read from its /metrics (the
recorder of this process through :func:`tests.helpers.support.scrape`, the subprocesses' served /metrics) as the change
over the scenario, reduced to the figures that must agree (:func:`figures`).

The test server seals its multi round-trip state with whole-second claims (``mrtr_server.py --steady-seal``): the
SDK's own sealing writes float times whose length varies from round to round, which would make every run's
``input_required`` and ``input_response`` figures differ by a token or two.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from opentelemetry import baggage, context
from opentelemetry.sdk.trace import ReadableSpan

from tests.helpers.support import ROOT, Scrape, free_port, make_config, scrape

from .capture import client_options

SERVERS = Path(__file__).resolve().parent / "servers"
sys.path.insert(0, str(SERVERS))
from mrtr_server import make_server  # noqa: E402

#: The tool every confirmed call calls, and the task tool.
TOOL, TASK_TOOL = "delete_report", "slow_report"

#: Figure: (family, labels that must agree) -> value.
Figures = dict[tuple[str, tuple[tuple[str, str], ...]], float]

#: The families compared, each by the labels that say what was measured (never side or server: they name the
#: observer). Session families are left out: a proxy's session is its stream or HTTP exchange, the shim's its
#: client or connection, so their counts and durations differ by design.
COMPARED: dict[str, tuple[str, ...]] = {
    "mcp_token_tokens_total": ("method", "tool", "direction"),
    "mcp_token_bytes_total": ("method", "tool", "direction"),
    "mcp_token_responses_total": ("method", "tool", "risk_tier"),
    "mcp_token_call_errors_total": ("method", "tool", "error_type"),
    "mcp_token_overhead_tokens_total": ("method", "tool"),
    "mcp_token_wasted_tokens_total": ("tool", "kind"),
    "mcp_token_operation_duration_seconds_count": ("method", "tool"),
    "mcp_token_logical_call_duration_seconds_count": ("method", "tool"),
}
#: Only what a scenario's calls did: the client's own start (server/discover) and the SDK's implicit tools/list
#: after the first call_tool are measured too, but are not what is compared here.
SCENARIO_METHODS = frozenset({"tools/call", "tasks/get", "tasks/update", "tasks/cancel", "tasks/result"})


def figures(scraped: Scrape, side: str) -> Figures:
    """What ``side`` measured, by the labels that must agree across observers (zero values left out)."""
    out: Figures = {}
    for family, labels in COMPARED.items():
        for sample_labels, value in scraped.pick(family, side=side):
            if "method" in labels and sample_labels.get("method") not in SCENARIO_METHODS:
                continue
            key = (family, tuple((name, sample_labels.get(name, "")) for name in labels))
            out[key] = out.get(key, 0.0) + value
    return {k: v for k, v in out.items() if v}


def delta(after: Figures, before: Figures) -> Figures:
    out = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v}


def value(figs: Figures, family: str, **labels: str) -> float:
    """The sum of the figures of ``family`` whose labels include ``labels``."""
    return sum(v for (name, lab), v in figs.items() if name == family and all(
        dict(lab).get(k) == x for k, x in labels.items()))


# ---------------------------------------------------------------------------------------------- scenarios


async def confirmed_once(client: Client) -> None:
    result = await client.call_tool(TOOL, {"path": "q3.pdf"})
    assert not result.is_error and result.content, result


async def confirmed_three(client: Client) -> None:
    for _ in range(3):  # the same arguments: the second and third calls are real repeats
        result = await client.call_tool(TOOL, {"path": "q3.pdf"})
        assert not result.is_error and result.content, result


async def task(client: Client) -> None:
    result = await client.call_tool(TASK_TOOL, {"n": 4000})
    assert not result.is_error and result.content, result


Script = Callable[[Client], Awaitable[None]]
#: name -> (script, whether the client declares the tasks extension, the logical calls it makes)
SCENARIOS: dict[str, tuple[Script, bool, int]] = {
    "confirmed_once": (confirmed_once, False, 1),
    "confirmed_three": (confirmed_three, False, 3),
    "task": (task, True, 1),
}


@dataclass
class PathRun:
    """One path's measurements: scenario -> observer -> figures; and the spans this process saw."""

    name: str
    figures: dict[str, dict[str, Figures]] = field(default_factory=dict)
    spans: dict[str, list[ReadableSpan]] = field(default_factory=dict)
    #: The proxy's spans, as (span, attributes) from the OTLP receiver, by scenario.
    proxy_spans: dict[str, list[tuple[Any, dict[str, Any]]]] = field(default_factory=dict)


@contextlib.contextmanager
def conversation(name: str) -> Iterator[None]:
    """The scenario's conversation: the baggage every JSON-RPC request carries in ``params._meta``."""
    token = context.attach(baggage.set_baggage("gen_ai.conversation.id", name))
    try:
        yield
    finally:
        context.detach(token)


def run_client(target: Any, scenario: str) -> None:
    script, tasks, _ = SCENARIOS[scenario]

    async def main() -> None:
        with conversation(scenario), anyio.fail_after(60):
            async with Client(target, **client_options(tasks)) as client:
                await script(client)

    anyio.run(main)


# ---------------------------------------------------------------------------------------------- processes


def subprocess_env(metrics_file: Path | None = None, otlp_port: int | None = None) -> dict[str, str]:
    """A proxy's or server's environment: this checkout first, chars/4 estimates, spans to ``otlp_port``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MCP_TOKEN_OTEL_ESTIMATOR": "chars/4",
           "OTEL_METRIC_EXPORT_INTERVAL": "3600000", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    if metrics_file is not None:
        env["MRTR_METRICS_FILE"] = str(metrics_file)
    if otlp_port is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{otlp_port}"
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    return env


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll ``predicate`` (bounded); its first truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def read_metrics(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=5) as response:
        return Scrape(response.read().decode())


def metrics_url_in(path: Path, pattern: str = r"/metrics at (\S+)") -> str | None:
    """The /metrics URL a process wrote to ``path`` (the proxy's stderr line, the server's file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    if pattern == "":
        return text.strip() or None
    found = re.search(pattern, text)
    return found.group(1) if found else None


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def settled(url: str, side: str, calls: int) -> Figures:
    """What the observer at ``url`` measured once it has recorded ``calls`` logical calls (a proxy measures on
    its own thread or process, after relaying)."""

    def ready() -> tuple[Figures] | None:  # in a tuple: no figures yet is an answer too
        try:
            figs = figures(read_metrics(url), side)
        except OSError:
            return None
        return (figs,) if value(figs, "mcp_token_logical_call_duration_seconds_count") >= calls else None

    found: tuple[Figures] = wait_for(ready, f"{calls} logical calls on {url}")
    return found[0]


# ---------------------------------------------------------------------------------------------- paths


def serve_http(scenario: str) -> None:
    """``scenario`` against a uvicorn server on 127.0.0.1 in this process, over streamable HTTP."""
    import uvicorn

    port = free_port()
    app = make_server(steady_seal=True).streamable_http_app()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, "uvicorn started")
        run_client(f"http://127.0.0.1:{port}/mcp", scenario)
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def in_process(otel_spans: Callable[[], list[ReadableSpan]], clear: Callable[[], None], over_http: bool) -> PathRun:
    """The shim on both sides of one process: ``Client(server)`` (direct) or a client over streamable HTTP to a
    uvicorn server on 127.0.0.1."""
    from mcp_token_otel.instrumentation import instrument, uninstrument

    run = PathRun("http" if over_http else "direct")
    recorder = instrument(make_config())
    assert recorder is not None
    try:
        for scenario in SCENARIOS:
            clear()
            before = {side: figures(scrape(recorder), side) for side in ("client", "server")}
            if over_http:
                serve_http(scenario)
            else:
                run_client(make_server(steady_seal=True), scenario)
            after = scrape(recorder)
            run.figures[scenario] = {side: delta(figures(after, side), before[side]) for side in ("client", "server")}
            run.spans[scenario] = otel_spans()
    finally:
        uninstrument()
    return run


def stdio_proxy_run(scenario: str, otlp: Any) -> dict[str, Figures]:
    """``scenario`` through a stdio proxy that this client starts; what the proxy and the server measured, read
    while they live (they end with the client's session)."""
    from mcp.client.stdio import StdioServerParameters, stdio_client

    script, tasks, calls = SCENARIOS[scenario]
    seen: dict[str, Figures] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stderr, server_file = Path(tmp) / "proxy.err", Path(tmp) / "server.url"
        server = [sys.executable, str(SERVERS / "mrtr_server.py"), "--steady-seal"]
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "mcp_token_otel.cli", "proxy", "--metrics-port", "0", "--", *server],
            env=subprocess_env(server_file, otlp.port))

        def read() -> None:
            proxy_url = wait_for(lambda: metrics_url_in(stderr), "the proxy's /metrics URL")
            server_url = wait_for(lambda: metrics_url_in(server_file, ""), "the server's /metrics")
            seen["proxy"] = settled(proxy_url, "proxy", calls)
            seen["server"] = settled(server_url, "server", calls)

        async def main() -> None:
            with stderr.open("w") as errlog, conversation(scenario), anyio.fail_after(90):
                async with Client(stdio_client(params, errlog=errlog), **client_options(tasks)) as client:
                    await script(client)
                    await anyio.to_thread.run_sync(read)

        anyio.run(main)
    return seen


def through_stdio_proxy(otel_spans: Callable[[], list[ReadableSpan]], clear: Callable[[], None],
                        otlp: Any) -> PathRun:
    """The shim on the client here -> ``mcp-token-otel proxy --metrics-port 0 -- python mrtr_server.py`` (one proxy
    per client session, as a stdio client starts it) -> the server with the shim on (its own /metrics)."""
    from mcp_token_otel.instrumentation import instrument, uninstrument

    run = PathRun("stdio proxy")
    recorder = instrument(make_config())
    assert recorder is not None
    try:
        for scenario in SCENARIOS:
            clear()
            before = figures(scrape(recorder), "client")
            seen = stdio_proxy_run(scenario, otlp)
            seen["client"] = delta(figures(scrape(recorder), "client"), before)
            run.figures[scenario] = seen
            run.spans[scenario] = otel_spans()
    finally:
        uninstrument()
    run.proxy_spans = {"all": otlp_spans(otlp)}
    return run


def through_http_proxy(otel_spans: Callable[[], list[ReadableSpan]], clear: Callable[[], None],
                       otlp: Any) -> PathRun:
    """The shim on the client here -> ``mcp-token-otel proxy --listen --upstream`` -> ``mrtr_server.py --http PORT``
    with the shim on; one proxy and one server for every scenario (their figures are read as changes)."""
    from mcp_token_otel.instrumentation import instrument, uninstrument

    run = PathRun("http proxy")
    with tempfile.TemporaryDirectory() as tmp:
        server_port, proxy_port = free_port(), free_port()
        server_file, proxy_err = Path(tmp) / "server.url", Path(tmp) / "proxy.err"
        server_argv = [sys.executable, str(SERVERS / "mrtr_server.py"), "--http", str(server_port), "--steady-seal"]
        proxy_argv = [sys.executable, "-m", "mcp_token_otel.cli", "proxy", "--listen", f"127.0.0.1:{proxy_port}",
                      "--upstream", f"http://127.0.0.1:{server_port}/mcp", "--metrics-port", "0"]
        with process(server_argv, subprocess_env(server_file), Path(tmp) / "server.err"), \
                process(proxy_argv, subprocess_env(otlp_port=otlp.port), proxy_err):
            wait_for(lambda: listening(server_port), "the server listening")
            wait_for(lambda: listening(proxy_port), "the proxy listening")
            proxy_url = wait_for(lambda: metrics_url_in(proxy_err), "the proxy's /metrics URL")
            server_url = wait_for(lambda: metrics_url_in(server_file, ""), "the server's /metrics")
            recorder = instrument(make_config())
            assert recorder is not None
            try:
                done = 0
                for scenario in SCENARIOS:
                    clear()
                    before = {"client": figures(scrape(recorder), "client"),
                              "proxy": settled(proxy_url, "proxy", done),
                              "server": settled(server_url, "server", done)}
                    run_client(f"http://127.0.0.1:{proxy_port}/mcp", scenario)
                    done += SCENARIOS[scenario][2]
                    after = {"client": figures(scrape(recorder), "client"),
                             "proxy": settled(proxy_url, "proxy", done),
                             "server": settled(server_url, "server", done)}
                    run.figures[scenario] = {k: delta(after[k], before[k]) for k in after}
                    run.spans[scenario] = otel_spans()
            finally:
                uninstrument()
    run.proxy_spans = {"all": otlp_spans(otlp)}
    return run


def otlp_spans(otlp: Any, wait: float = 10.0) -> list[tuple[Any, dict[str, Any]]]:
    """The proxy's spans the receiver got (its batch processor exports every 50 ms here, and at exit)."""
    spans = wait_for(lambda: otlp.spans() or None, "the proxy's spans", timeout=wait)
    return [(span, attrs) for _, span, attrs in spans]
