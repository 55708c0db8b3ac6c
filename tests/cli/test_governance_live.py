"""profile, lock and check run as a user runs them, against real servers: the project's stdio test server,
mcp-server-time and mcp-server-git (PyPI) over stdio, server-everything (npm, Node 24) over stdio and
streamable HTTP on 127.0.0.1. Every subprocess has a timeout; every server stops with its test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.support import ROOT, free_port, node_env, npm_peer

pytestmark = pytest.mark.slow  # every test here runs real servers or the CLI in subprocesses

STDIO_SERVER = ROOT / "tests" / "adapters" / "mcp_v2" / "servers" / "stdio_server.py"
LOOPBACK = Path(__file__).resolve().parent / "servers" / "loopback.cjs"
BIN = Path(sys.executable).parent


def env(**extra: str) -> dict[str, str]:
    out = {**node_env(), "PYTHONPATH": str(ROOT), **extra}
    out.pop("MCP_TOKEN_OTEL_CONFIG", None)
    return out


def cli(*args: str, python: str = sys.executable, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "mcp_token_otel.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env(), cwd=cwd, check=False)


def console_script(name: str) -> str:
    path = shutil.which(name, path=str(BIN))
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing (the test extra installs it)")
        pytest.skip(f"{name} not installed")
    return path


def everything_stdio() -> list[str]:
    return [npm_peer("mcp-server-everything"), "stdio"]


@pytest.fixture(scope="module")
def everything_url() -> Iterator[str]:
    """server-everything over streamable HTTP, held on 127.0.0.1 by a preloaded listen() default."""
    exe = npm_peer("mcp-server-everything")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "streamableHttp"], env=env(PORT=str(port), NODE_OPTIONS=f"--require {LOOPBACK}"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        ready = False
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stderr.readline() if proc.stderr else ""
            if "listening on port" in line:
                ready = True
                break
        assert ready, f"server-everything did not start (exit {proc.poll()})"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def time_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mcp-server-time's listing, fetched once through the discovery adapter and saved as a file."""
    from mcp_token_otel.adapters.discovery import Target, discover

    found = discover(Target(command=(console_script("mcp-server-time"),)), timeout=60)
    path = tmp_path_factory.mktemp("time") / "time.json"
    path.write_text(json.dumps({"serverInfo": {"name": found.server_name, "version": found.server_version},
                                "tools": list(found.tools)}))
    return path


def profile_json(*target: str) -> dict[str, Any]:
    out = cli("profile", "--json", *target)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# --------------------------------------------------------------------------- profile


def test_profile_the_projects_stdio_server() -> None:
    data = profile_json("--stdio", "--", sys.executable, str(STDIO_SERVER))
    assert data["server"]["name"] == "stdio-test"
    assert [t["name"] for t in data["tools"]] == ["big", "boom"]
    big = data["tools"][0]
    # MCPServer wraps a str result as {"result": string}: the result's only field, a string with no maxLength:
    # unbounded (it carries whatever the tool returns), with its reason.
    assert big["bounded"] is False and big["fields"] == ["result"] and big["limit_source"] == "none"
    assert big["risk"] == "critical" and big["max_tokens"] is None
    assert big["reason"] == 'unbounded: string field "result" has no maxLength; no limit parameter'
    assert big["definition_tokens"] > 20 and data["definition_tokens"] == data["tool_definition_tokens"]


def test_profile_mcp_server_time_table_and_exact_estimator(time_file: Path) -> None:
    exe = console_script("mcp-server-time")
    out = cli("profile", "--stdio", "--", exe)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("server: mcp-time ") and "(2 tools, 0 resources" in lines[0]
    assert any(line.split()[0] == "get_current_time" for line in lines[2:4])
    assert any(line.startswith("server total: ") and "context window" in line for line in lines)
    assert "aggregate risk: low" in out.stdout
    assert cli("profile", str(time_file)).stdout == out.stdout  # the saved listing reads the same
    exact = profile_json("--estimator", "tiktoken:o200k_base", str(time_file))
    assert exact["estimator"] == "tiktoken:o200k_base" and exact["definition_tokens"] > 0
    default = profile_json(str(time_file))
    assert abs(exact["definition_tokens"] - default["definition_tokens"]) <= 0.15 * exact["definition_tokens"]


def test_profile_mcp_server_git_markdown() -> None:
    exe = console_script("mcp-server-git")
    out = cli("profile", "--markdown", "--stdio", "--", exe)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("### MCP token profile: mcp-git ")
    assert "| `git_status` |" in text and "|---|---:|" in text
    # No git tool declares an outputSchema: every one is unknown (rated high), and the same advice for all of them
    # is one line that names them.
    assert "Aggregate risk: **high**" in text
    [advice] = [line for line in text.splitlines() if line.startswith("- **high**: ")]
    assert advice.startswith("- **high**: Tools 'git_status', ") and "'git_log'" in advice
    assert "no result fields declared (no outputSchema)" in advice
    assert "| high | unknown | unknown |" in text and "unknown: no outputSchema" in text


def test_profile_everything_over_stdio_and_http_agree(everything_url: str) -> None:
    over_stdio = profile_json("--stdio", "--", *everything_stdio())
    over_http = profile_json("--url", everything_url, "--header", "X-Test: governance")
    assert over_stdio["counts"] == over_http["counts"]
    assert over_stdio["counts"]["tools"] >= 10 and over_stdio["counts"]["resources"] >= 1
    assert over_stdio["counts"]["resource_templates"] >= 1 and over_stdio["counts"]["prompts"] >= 1
    assert over_stdio["definition_tokens"] == over_http["definition_tokens"]
    total = over_stdio["definition_tokens"]
    assert total == over_stdio["tool_definition_tokens"] + sum(
        i["definition_tokens"] for k in ("resources", "resource_templates", "prompts") for i in over_stdio[k])
    assert over_stdio["context_share"] == round(total / over_stdio["context_window"], 6)
    tools = {t["name"]: t for t in over_stdio["tools"]}
    assert tools["get-structured-content"]["bounded"] and tools["get-structured-content"]["risk"] == "low"
    assert not tools["echo"]["bounded"] and tools["echo"]["risk"] == "high"
    assert tools["echo"]["bounded"] is None and tools["echo"]["max_tokens"] is None  # no outputSchema: unknown
    # Recommendations: tier order, critical first.
    tiers = ["critical", "high", "medium", "low"]
    ranks = [min(tiers.index(t["risk"]) for t in over_stdio["tools"] if f"'{t['name']}'" in r)
             for r in over_stdio["recommendations"]]
    assert ranks == sorted(ranks)


def test_seed_rule_reproduces_the_seed_example(tmp_path: Path) -> None:
    users = {"tools": [{"name": "users", "inputSchema": {"type": "object"}, "outputSchema": {
        "type": "object", "properties": {"users": {"type": "array", "maxItems": 50, "items": {
            "type": "object", "properties": {k: {"type": "string"} for k in ("id", "name", "email", "address")}}}}}}]}
    path = tmp_path / "users.json"
    path.write_text(json.dumps(users))
    seed = profile_json("--rule", "seed", str(path))["tools"][0]
    assert profile_json("--rule", "compact", str(path))["tools"][0] == seed
    default = profile_json(str(path))["tools"][0]
    assert (seed["max_tokens"], seed["risk"], seed["limit"], seed["limit_source"]) == (1450, "medium", 50, "maxItems")
    assert (default["max_tokens"], default["risk"]) == (2200, "medium")


# --------------------------------------------------------------------------- lock


def test_lock_is_byte_identical_twice_and_across_transports(tmp_path: Path, everything_url: str) -> None:
    first, second, http = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    for path in (first, second):
        out = cli("lock", "-o", str(path), "--stdio", "--", *everything_stdio())
        assert out.returncode == 0, out.stderr
    assert cli("lock", "-o", str(http), "--url", everything_url).returncode == 0
    assert first.read_bytes() == second.read_bytes() == http.read_bytes()
    data = json.loads(first.read_text())
    assert data["lock_version"] == 1 and data["server"]["name"] == "mcp-servers/everything"


def test_lock_default_path_and_stdout(tmp_path: Path, time_file: Path) -> None:
    exe = console_script("mcp-server-time")
    out = cli("lock", "--stdio", "--", exe, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    written = (tmp_path / "mcp-token-otel.lock.json").read_text()
    assert out.stderr.startswith("wrote mcp-token-otel.lock.json: 2 tools")
    piped = cli("lock", "-o", "-", str(time_file))
    assert piped.stdout == written  # a saved listing locks to the same bytes as the live server


def test_lock_on_mcp_1x_matches_mcp_2x(tmp_path: Path) -> None:
    v1 = ROOT / ".venv-mcp1" / "bin" / "python"
    if not v1.exists():
        if os.environ.get("CI"):
            pytest.fail(".venv-mcp1 is missing (scripts/test creates it)")
        pytest.skip(".venv-mcp1 not set up")
    exe = console_script("mcp-server-time")
    out1 = cli("lock", "-o", "-", "--stdio", "--", exe, python=str(v1))
    out2 = cli("lock", "-o", "-", "--stdio", "--", exe)
    assert out1.returncode == 0, out1.stderr
    assert out1.stdout == out2.stdout


# --------------------------------------------------------------------------- check


def saved_lists(tmp_path: Path, url: str) -> tuple[Path, dict[str, Any]]:
    """Everything server-everything lists, saved by the test (through the discovery adapter) as a file."""
    from mcp_token_otel.adapters.discovery import Target, discover

    found = discover(Target(url=url), timeout=60)
    listing = {
        "serverInfo": {"name": found.server_name, "version": found.server_version},
        "tools": list(found.tools),
        "resources": list(found.resources),
        "resourceTemplates": list(found.resource_templates),
        "prompts": list(found.prompts),
    }
    path = tmp_path / "listing.json"
    path.write_text(json.dumps(listing))
    return path, listing


def test_check_clean_then_breaking_then_risky(tmp_path: Path, everything_url: str) -> None:
    lock = tmp_path / "mcp-token-otel.lock.json"
    assert cli("lock", "-o", str(lock), "--url", everything_url).returncode == 0
    clean = cli("check", "--lock", str(lock), "--url", everything_url)
    assert (clean.returncode, clean.stdout.strip()) == (0, "no differences: the server matches the lock")

    path, listing = saved_lists(tmp_path, everything_url)
    assert cli("check", "--lock", str(lock), str(path)).returncode == 0  # the saved file is the same server
    echo = next(t for t in listing["tools"] if t["name"] == "echo")
    # A release that drops a tool and makes another unbounded.
    listing["tools"].remove(echo)
    for t in listing["tools"]:
        if t["name"] == "get-structured-content":
            t["outputSchema"]["properties"]["history"] = {"type": "array", "items": {"type": "number"}}
    path.write_text(json.dumps(listing))
    breaking = cli("check", "--lock", str(lock), str(path))
    assert breaking.returncode == 1, breaking.stderr
    lines = breaking.stdout.splitlines()
    assert lines[0].split() == ["class", "kind", "subject", "change", "detail"]
    rows = [line.split() for line in lines[1:-1]]
    assert rows[0][:4] == ["BREAKING", "tool", "echo", "tool"]
    assert ["RISKY", "tool", "get-structured-content", "became", "unbounded"] in [r[:5] for r in rows]
    assert lines[-1].endswith("FAIL (--fail-on breaking)")

    # Only the RISKY change left: passes at --fail-on breaking, fails at --fail-on risky.
    listing["tools"].insert(0, echo)
    path.write_text(json.dumps(listing))
    assert cli("check", "--lock", str(lock), str(path)).returncode == 0
    risky = cli("check", "--lock", str(lock), "--fail-on", "risky", "--json", str(path))
    assert risky.returncode == 1, risky.stderr
    report = json.loads(risky.stdout)
    assert report["failed"] and report["counts"]["BREAKING"] == 0 and report["counts"]["RISKY"] >= 1
    assert {d["class"] for d in report["differences"]} <= {"RISKY", "SAFE"}
    md = cli("check", "--lock", str(lock), "--markdown", str(path))
    assert md.returncode == 0 and "| **RISKY** | tool | `get-structured-content` | became unbounded |" in md.stdout


def test_check_budget_and_percentage_flags(tmp_path: Path, time_file: Path) -> None:
    lock = tmp_path / "time.lock.json"
    assert cli("lock", "-o", str(lock), str(time_file)).returncode == 0
    total = json.loads(lock.read_text())["totals"]["definition_tokens"]
    over = cli("check", "--lock", str(lock), "--token-budget", str(total - 1), "--fail-on", "risky", str(time_file))
    assert over.returncode == 1 and "RISKY" in over.stdout and "over the token budget" in over.stdout
    assert cli("check", "--lock", str(lock), "--token-budget", str(total), "--fail-on", "risky",
               str(time_file)).returncode == 0
    # A longer description: +x% tokens is RISKY only above --max-token-increase.
    listing = json.loads(time_file.read_text())
    listing["tools"][0]["description"] += " Returns the time, the timezone and whether DST is in effect." * 3
    grown = tmp_path / "grown.json"
    grown.write_text(json.dumps(listing))
    report = json.loads(cli("check", "--lock", str(lock), "--json", str(grown)).stdout)
    up = next(d for d in report["differences"] if d["subject"] == "get_current_time" and "tokens" in d["change"])
    pct = float(up["detail"].split("(")[1].split("%")[0])
    assert pct > 10 and up["class"] == "RISKY"  # above the default 10%
    strict = cli("check", "--lock", str(lock), "--fail-on", "risky", "--max-token-increase", str(pct - 1),
                 str(grown))
    loose = cli("check", "--lock", str(lock), "--fail-on", "risky", "--max-token-increase", str(pct + 1),
                "--json", str(grown))
    assert strict.returncode == 1 and loose.returncode == 0
    assert {d["class"] for d in json.loads(loose.stdout)["differences"]} == {"SAFE"}
    bad = cli("check", "--lock", str(lock), "--max-token-increase", "nan", str(grown))
    assert bad.returncode == 2 and "expected a percentage" in bad.stderr


# --------------------------------------------------------------------------- errors: one line, exit 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("profile",), "give exactly one of FILE, --url URL or --stdio -- COMMAND"),
        (("profile", "--url", "http://127.0.0.1:9/mcp", "x.json"), "(got FILE, --url)"),
        (("profile", "--stdio"), "--stdio needs a command"),
        (("profile", "--header", "A:b", "x.json"), "--header needs --url"),
        (("profile", "--stdio", "--", "/nonexistent/mcp-server"), "cannot start '/nonexistent/mcp-server'"),
        (("profile", "--timeout", "0", "--stdio", "--", "x"), "--timeout: expected a positive number"),
        (("check", "--lock", "/nonexistent/lock.json", "x.json"), "cannot read lockfile /nonexistent/lock.json"),
        (("profile", "--url", "http://127.0.0.1:9/mcp", "--timeout", "10"), "http://127.0.0.1:9/mcp"),
    ],
)
def test_errors_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    out = cli(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_a_dying_server_and_a_silent_one(tmp_path: Path) -> None:
    dying = cli("profile", "--stdio", "--", sys.executable, "-c", "import sys; sys.exit('no config found')")
    assert dying.returncode == 2 and dying.stderr.count("\n") == 1
    assert "server stderr: no config found" in dying.stderr
    silent = cli("profile", "--timeout", "2", "--stdio", "--", sys.executable, "-c", "import time; time.sleep(60)")
    assert silent.returncode == 2 and "no complete answer" in silent.stderr and "within 2 s" in silent.stderr


def test_bad_lockfiles(tmp_path: Path) -> None:
    bad = tmp_path / "lock.json"
    for content, message in (("{", "not JSON"), ('{"lock_version": 99}', "lock_version 99 is not supported"),
                             ('{"lock_version": 1, "tools": []}', "'tools' is missing or not a dict")):
        bad.write_text(content)
        out = cli("check", "--lock", str(bad), str(ROOT / "examples" / "tools_list_response.json"))
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_server_chosen_text_cannot_break_the_outputs(tmp_path: Path) -> None:
    # Regression: a tool name with a backtick closed its code span (raw HTML/links reached the PR comment),
    # newlines broke table rows, and terminal escapes reached the terminal.
    listing = tmp_path / "odd.json"
    name = "a|b\n| c |<img src=x>`[l](http://e)\x1b[31m"
    listing.write_text(json.dumps({"serverInfo": {"name": "s\n# evil"}, "tools": [{"name": name}]}))
    md = cli("profile", "--markdown", str(listing))
    assert md.returncode == 0, md.stderr
    row = next(line for line in md.stdout.splitlines() if line.startswith("| ``"))
    assert row.startswith("| ``a\\|b \\| c \\|<img src=x>`[l](http://e) [31m`` | ")
    assert "\n# evil" not in md.stdout and "\\<img" in md.stdout  # the recommendations escape it as prose
    table = cli("profile", str(listing))
    assert "\x1b" not in table.stdout and "\n| c" not in table.stdout


def test_lock_errors_leave_no_temporary_file(tmp_path: Path) -> None:
    # Regression: `lock -o DIR` failed after writing DIR.tmp and left it behind.
    target = tmp_path / "dir"
    target.mkdir()
    out = cli("lock", "-o", str(target), str(ROOT / "examples" / "tools_list_response.json"))
    assert out.returncode == 2 and out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({"tools": [{"name": "a"}, {"name": "a", "description": "b"}]}))
    out = cli("lock", "-o", str(tmp_path / "x.lock"), str(twice))
    assert out.returncode == 2 and "tool 'a' is listed twice" in out.stderr and out.stderr.count("\n") == 1
    assert not (tmp_path / "x.lock").exists()


# --------------------------------------------------------------------------- pagination

PAGED_SERVER = Path(__file__).resolve().parent / "servers" / "paged_server.py"


def test_every_list_is_followed_through_its_pages() -> None:
    data = profile_json("--stdio", "--", sys.executable, str(PAGED_SERVER))
    assert data["counts"] == {"tools": 7, "resources": 5, "resource_templates": 2, "prompts": 3}
    assert [t["name"] for t in data["tools"]] == [f"tool_{i}" for i in range(7)]
    assert [t["limit"] for t in data["tools"]] == [10 * (i + 1) for i in range(7)]
    assert [r["key"] for r in data["resources"]] == [f"paged://resource/{i}" for i in range(5)]
    only_tools = profile_json("--stdio", "--", sys.executable, str(PAGED_SERVER), "tools-only")
    assert only_tools["counts"] == {"tools": 7, "resources": 0, "resource_templates": 0, "prompts": 0}


def test_mcp_1x_client_follows_pages_too() -> None:
    v1 = ROOT / ".venv-mcp1" / "bin" / "python"
    if not v1.exists():
        if os.environ.get("CI"):
            pytest.fail(".venv-mcp1 is missing (scripts/test creates it)")
        pytest.skip(".venv-mcp1 not set up")
    out = cli("profile", "--json", "--stdio", "--", sys.executable, str(PAGED_SERVER), python=str(v1))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["counts"] == {"tools": 7, "resources": 5, "resource_templates": 2, "prompts": 3}


def test_a_cursor_that_never_ends_is_an_error() -> None:
    out = cli("profile", "--stdio", "--", sys.executable, str(PAGED_SERVER), "loop")
    assert out.returncode == 2 and "tools/list: the server repeated the cursor '0'" in out.stderr
    assert out.stderr.count("\n") == 1


# --------------------------------------------------------------------------- the CI recipe


def test_example_workflow_commands_run_as_written(tmp_path: Path) -> None:
    """The commands of examples/github-workflow-token-check.yml, with the project's test server standing in
    for ``python -m my_mcp_server``."""
    import shlex

    import yaml

    workflow = yaml.safe_load((ROOT / "examples" / "github-workflow-token-check.yml").read_text())
    steps = workflow["jobs"]["token-check"]["steps"]
    script = "\n".join(step.get("run", "") for step in steps).replace("\\\n", " ")
    commands = [shlex.split(line.split(">")[0]) for line in script.splitlines()
                if line.strip().startswith("mcp-token-otel ")]
    assert [c[1] for c in commands] == ["profile", "check"]
    server = [sys.executable, str(STDIO_SERVER)]

    def args(command: list[str]) -> list[str]:
        index = command.index("--stdio")
        assert command[index + 1 : index + 5] == ["--", "python", "-m", "my_mcp_server"]
        return [*command[1 : index + 2], *server]

    assert cli("lock", "-o", str(tmp_path / "mcp-token-otel.lock.json"), "--stdio", "--", *server).returncode == 0
    for command in commands:
        out = cli(*args(command), cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    assert "no differences" in out.stdout


# --------------------------------------------------------------------------- headers


@pytest.fixture(scope="module")
def guarded_url() -> Iterator[str]:
    """An MCPServer over streamable HTTP on 127.0.0.1 that answers 401 without ``Authorization: Bearer s3cret``."""
    import threading

    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("guarded")

    @server.tool()
    def whoami() -> str:
        """Who the caller is."""
        return "you"

    inner = server.streamable_http_app()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (b"authorization", b"Bearer s3cret") not in scope["headers"]:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await inner(scope, receive, send)

    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.05)
    assert uv.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        uv.should_exit = True
        thread.join(timeout=10)


def test_headers_reach_the_server(guarded_url: str) -> None:
    data = profile_json("--url", guarded_url, "--header", "Authorization: Bearer s3cret")
    assert data["server"]["name"] == "guarded" and [t["name"] for t in data["tools"]] == ["whoami"]
    refused = cli("profile", "--url", guarded_url, "--timeout", "20")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(f"error: {guarded_url}: ") and "(HTTP 401)" in refused.stderr
    bad = cli("profile", "--url", guarded_url, "--header", "no-colon")
    assert bad.returncode == 2 and "expected NAME:VALUE" in bad.stderr
