"""profile, lock and check with observations, against a real instrumented mcp 2.x server over streamable HTTP on
127.0.0.1 with its /metrics, after real tool calls; and through a real Prometheus scraping it (slow).

The server (this module, run as ``python -m tests.cli.test_observed_profile_live HTTP_PORT METRICS_PORT``) is shaped
like the npm filesystem server, but its ``read_file`` declares a bounded result (``content`` with a maxLength of
2,000) and answers the whole file in its text block: declared bounded, observed large. ``search`` is bounded by a
``limit`` input and answers little; ``list_allowed_directories`` has no outputSchema; ``write_file`` is never
called.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers.support import ROOT, free_port, require_binary

from .test_governance_live import cli

pytestmark = pytest.mark.slow  # every test here drives a live server and the CLI in subprocesses

NAME = "observed-fixture"
CONTENT_MAX = 2000
FILE_BYTES = 100_000


def serve(http_port: int, metrics_port: int) -> None:
    """The instrumented server: MCP on HTTP_PORT (/mcp), /metrics on METRICS_PORT."""
    import mcp_types as types
    import uvicorn
    from mcp.server.lowlevel.server import Server

    from mcp_token_otel import instrumentation
    from mcp_token_otel.config import config_from_dict

    config = config_from_dict({"prometheus": {"enabled": True, "host": "127.0.0.1", "port": metrics_port}})
    if instrumentation.instrument(config) is None or instrumentation.prometheus_service() is None:
        raise SystemExit("instrumentation or /metrics failed to start")
    path = {"type": "string"}
    tools = [
        types.Tool(name="read_file", description="Read a file as text.",
                   input_schema={"type": "object", "properties": {"path": path}, "required": ["path"]},
                   output_schema={"type": "object", "required": ["content"], "properties": {
                       "content": {"type": "string", "maxLength": CONTENT_MAX}}}),
        types.Tool(name="search", description="Search files for a pattern.",
                   input_schema={"type": "object", "required": ["pattern"], "properties": {
                       "pattern": {"type": "string"},
                       "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 20}}},
                   output_schema={"type": "object", "required": ["matches"], "properties": {
                       "matches": {"type": "array", "items": {"type": "object", "properties": {
                           "path": path, "line": {"type": "integer"}}}}}}),
        types.Tool(name="list_allowed_directories", description="The directories this server may read.",
                   input_schema={"type": "object", "properties": {}}),
        types.Tool(name="write_file", description="Write a file.",
                   input_schema={"type": "object", "properties": {"path": path, "content": {"type": "string"}},
                                 "required": ["path", "content"]}),
    ]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = dict(params.arguments or {})
        if params.name == "read_file":  # the whole file as text; the structured part keeps to its maxLength
            text = Path(str(args["path"])).read_text(encoding="utf-8")
            structured: dict[str, Any] = {"content": text[:CONTENT_MAX]}
        elif params.name == "search":
            structured = {"matches": [{"path": "src/a.py", "line": 3}, {"path": "src/b.py", "line": 9}]}
            text = json.dumps(structured)
        else:
            return types.CallToolResult(content=[types.TextContent(type="text", text=str(Path.cwd()))])
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structured_content=structured)

    server = Server(NAME, version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool)
    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=http_port, log_level="warning")


# --------------------------------------------------------------------------- fixtures


def _open(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answers
    except OSError:
        return False


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 100 KB of real text: this project's own sources."""
    sources = sorted((ROOT / "mcp_token_otel").rglob("*.py"))
    text = "".join(p.read_text(encoding="utf-8") for p in sources)[:FILE_BYTES]
    assert len(text) == FILE_BYTES
    path = tmp_path_factory.mktemp("observed") / "sources.txt"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def fixture_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    http_port, metrics_port = free_port(), free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.cli.test_observed_profile_live", str(http_port),
                                 str(metrics_port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    urls: dict[str, Any] = {"mcp": f"http://127.0.0.1:{http_port}/mcp", "metrics": f"http://127.0.0.1:{metrics_port}/metrics",
            "proc": proc, "metrics_port": metrics_port}
    try:
        deadline = time.monotonic() + 60
        while not (_open(urls["metrics"]) and _open(urls["mcp"])):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield urls
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def call_tools(url: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    from mcp import Client

    async def run() -> None:
        async with Client(url, mode="auto") as client:
            for name, arguments in calls:
                result = await client.call_tool(name, arguments)
                assert not result.is_error, result

    anyio.run(run)


@pytest.fixture(scope="module")
def called(fixture_server: dict[str, Any], text_file: Path) -> dict[str, Any]:
    """Three reads of the 100 KB file, two searches and one directory listing."""
    read = ("read_file", {"path": str(text_file)})
    call_tools(fixture_server["mcp"], [read, read, read, ("search", {"pattern": "x"}), ("search", {"pattern": "y"}),
                                       ("list_allowed_directories", {})])
    return fixture_server


def by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in data["tools"]}


# --------------------------------------------------------------------------- /metrics


def test_profile_observed_json(called: dict[str, Any]) -> None:
    out = cli("profile", "--json", "--observed", called["metrics"], "--url", called["mcp"])
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    tools = by_name(data)
    read = tools["read_file"]
    # static fields keep their names: declared bounded by its maxLength, low
    assert read["bounded"] is True and read["risk"] == "low" and read["max_tokens"] < 1000
    seen = read["observed"]
    assert seen["calls"] == 3 and seen["risk"] == "critical" and read["effective_risk"] == "critical"
    assert 16_384 < seen["p50"] <= seen["p95"] <= seen["max"] <= 65_536 and not seen["max_exact"]
    assert FILE_BYTES / 5 < seen["mean"] < FILE_BYTES / 3  # about 100 KB of text, in tokens
    assert data["bounded_but_observed_large"] == ["read_file"]
    search = tools["search"]
    assert search["risk"] == "medium" and search["observed"]["calls"] == 2
    assert search["observed"]["risk"] == "low" and search["effective_risk"] == "medium"
    listing = tools["list_allowed_directories"]
    assert listing["bounded"] is None and listing["observed"]["calls"] == 1 and listing["effective_risk"] == "high"
    assert tools["write_file"]["observed"] is None and tools["write_file"]["effective_risk"] == "high"
    assert data["effective_risk"] == "critical" and data["overall_risk"] == "high"
    assert data["observation"] == {"source": called["metrics"], "server": NAME, "tools_observed": 3, "calls": 6,
                                   "other_servers": []}
    assert data["observed_unlisted_tools"] == []
    assert [w["rule"] for w in data["warnings"]] == ["observed result size"]
    assert data["warnings"][0]["subject"] == "read_file" and data["warnings"][0]["limit"] == 25_000


def test_profile_observed_table(called: dict[str, Any]) -> None:
    out = cli("profile", "--observed", called["metrics"], "--url", called["mcp"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1] == f"observed: {called['metrics']}, server '{NAME}': 3 tools, 6 calls"
    assert lines[2].split()[:4] == ["tool", "definition", "static", "bounded"]
    first = lines[3].split()
    assert first[0] == "read_file" and first[2:4] == ["low", "yes"] and first[5] == "3"  # listed first
    assert first[9:11] == ["critical", "critical"]
    never = next(line for line in lines if line.split()[:1] == ["write_file"])
    assert "not observed" in never
    assert "effective risk (static and observed): critical" in lines
    assert any(line.startswith("declared bounded but observed large: read_file (p95 ") for line in lines)
    assert any(line.startswith("warning: read_file: observed p95 result is ") and "over 25,000" in line
               for line in lines)


def test_observed_but_not_listed_and_another_server(called: dict[str, Any], tmp_path: Path) -> None:
    from mcp_token_otel.adapters.discovery import Target, discover

    found = discover(Target(url=called["mcp"]), timeout=30)
    listing = tmp_path / "listing.json"
    listing.write_text(json.dumps({"serverInfo": {"name": NAME}, "tools": [
        t for t in found.tools if t["name"] != "list_allowed_directories"]}))
    data = json.loads(cli("profile", "--json", "--observed", called["metrics"], str(listing)).stdout)
    assert [t["name"] for t in data["observed_unlisted_tools"]] == ["list_allowed_directories"]
    assert data["observed_unlisted_tools"][0]["observed"]["calls"] == 1
    table = cli("profile", "--observed", called["metrics"], str(listing)).stdout
    assert any(line.split()[:2] == ["list_allowed_directories", "-"] and "not listed" in line
               for line in table.splitlines())
    other = cli("profile", "--server", "elsewhere", "--observed", called["metrics"], str(listing))
    assert f"no tool calls of server 'elsewhere' (the metrics name '{NAME}'; choose one with --server)" in other.stdout
    assert "not observed" in other.stdout


def test_lock_and_check_use_the_effective_tier(called: dict[str, Any], tmp_path: Path) -> None:
    static_lock, observed_lock = tmp_path / "static.lock.json", tmp_path / "observed.lock.json"
    assert cli("lock", "-o", str(static_lock), "--url", called["mcp"]).returncode == 0
    made = cli("lock", "-o", str(observed_lock), "--observed", called["metrics"], "--url", called["mcp"])
    assert made.returncode == 0, made.stderr
    locked = json.loads(observed_lock.read_text())["tools"]
    assert locked["read_file"]["risk"] == "low" and locked["read_file"]["effective_risk"] == "critical"
    assert "effective_risk" not in json.loads(static_lock.read_text())["tools"]["read_file"]
    # Against the static lock, the observations make read_file worse: RISKY.
    out = cli("check", "--lock", str(static_lock), "--fail-on", "risky", "--observed", called["metrics"],
              "--url", called["mcp"])
    assert out.returncode == 1, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert ["RISKY", "tool", "read_file", "effective", "risk", "tier", "up", "low", "->", "critical"] in [
        r[:10] for r in rows]
    assert any(line.startswith("warning: read_file: observed p95") for line in out.stdout.splitlines())
    # Without observations, check stays static: clean.
    assert cli("check", "--lock", str(static_lock), "--fail-on", "risky", "--url", called["mcp"]).returncode == 0
    # Against a lock made with the same observations: no difference.
    same = cli("check", "--json", "--lock", str(observed_lock), "--fail-on", "risky", "--observed", called["metrics"],
               "--url", called["mcp"])
    assert same.returncode == 0, same.stdout
    report = json.loads(same.stdout)
    assert report["differences"] == [] and report["observation"]["tools_observed"] == 3


@pytest.mark.parametrize(("args", "message"), [
    (("--observed", "http://127.0.0.1:1/metrics"), "error: http://127.0.0.1:1/metrics: "),
    (("--observed", "ftp://x/metrics"), "error: ftp://x/metrics: expected an http:// or https:// URL"),
    (("--window", "1h"), "error: --window needs --observed or --prometheus"),
    (("--prometheus", "http://127.0.0.1:1", "--window", "an hour"), "error: --window: expected a Prometheus"),
])
def test_observation_errors_are_one_line(called: dict[str, Any], args: tuple[str, ...], message: str) -> None:
    out = cli("profile", *args, "--url", called["mcp"])
    assert out.returncode == 2 and out.stderr.startswith(message) and out.stderr.count("\n") == 1, out.stderr


# --------------------------------------------------------------------------- Prometheus


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return list(json.loads(response.read())["data"]["result"])


def test_profile_from_prometheus(called: dict[str, Any], text_file: Path, tmp_path: Path) -> None:
    prometheus = require_binary("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": [{
        "job_name": "mcp-token-otel", "static_configs": [{"targets": [f"127.0.0.1:{called['metrics_port']}"]}]}]}))
    url = f"http://127.0.0.1:{port}"
    count = 'mcp_token_message_tokens_count{tool="read_file",direction="output"}'
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def wait_for(expr: str, least: float) -> None:
            deadline = time.monotonic() + 60
            while True:
                found = _open(f"{url}/-/ready") and _query(url, expr)
                if found and float(found[0]["value"][1]) >= least:
                    return
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
                time.sleep(0.5)

        wait_for(count, 3)  # the calls made before Prometheus started are its first sample
        call_tools(called["mcp"], [("read_file", {"path": str(text_file)})] * 3)
        wait_for(count, 6)
        out = cli("profile", "--json", "--prometheus", url, "--window", "5m", "--url", called["mcp"])
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        read = by_name(data)["read_file"]
        assert read["risk"] == "low" and read["observed"]["risk"] == "critical" and read["effective_risk"] == "critical"
        assert read["observed"]["calls"] >= 3 and data["bounded_but_observed_large"] == ["read_file"]
        assert data["observation"]["source"] == f"{url}, last 5m"
        # Prometheus's own median over the same window, which the sum may only lower.
        median = _query(url, 'histogram_quantile(0.5, sum by (le) (increase(mcp_token_message_tokens_bucket'
                             '{tool="read_file",direction="output",method="tools/call"}[5m])))')
        assert 16_384 < read["observed"]["p50"] <= float(median[0]["value"][1]) + 1
    finally:
        proc.terminate()
        proc.wait(timeout=20)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
