"""The user-service files for ``mcp-token-otel serve`` (deploy/host/): the systemd unit passes
``systemd-analyze verify``, the launchd agent is a valid property list, and each one's command line, run as the
service manager would run it (the program path swapped for this checkout's), serves /metrics and stops cleanly
on the signal the manager sends (exit 0: not restarted)."""

from __future__ import annotations

import plistlib
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.support import ROOT, free_port

from .conftest import child_env

HOST = ROOT / "deploy" / "host"
UNIT = HOST / "mcp-token-otel.service"
AGENT = HOST / "io.github.mcp-token-otel.serve.plist"


def unit_sections() -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = {}
        else:
            key, _, value = line.partition("=")
            sections[current][key] = value
    return sections


def run_as_service(argv: list[str], home: Path) -> None:
    """``argv`` (after the program) as the manager starts it: HOME set, no XDG_STATE_HOME, no shell."""
    port = free_port()
    env = child_env(HOME=str(home), MCP_TOKEN_OTEL_PROMETHEUS_PORT=str(port))
    env.pop("XDG_STATE_HOME", None)
    proc = subprocess.Popen([sys.executable, "-m", "mcp_token_otel", *argv], env=env, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        store = home / ".local" / "state" / "mcp-token-otel" / "metrics"
        assert f"http://127.0.0.1:{port}/metrics" in line and str(store) in line, line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert response.status == 200  # nothing measured yet: an empty exposition
        assert store.is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0  # a clean stop: Restart=on-failure / KeepAlive SuccessfulExit=false leave it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_systemd_unit(tmp_path: Path) -> None:
    sections = unit_sections()
    service = sections["Service"]
    program, *argv = shlex.split(service["ExecStart"])
    assert program == "%h/.local/bin/mcp-token-otel" and argv == ["serve"]
    assert service["Restart"] == "on-failure" and service["KillSignal"] == "SIGTERM"
    assert sections["Install"]["WantedBy"] == "default.target"  # a user unit: started with the user's session
    analyze = shutil.which("systemd-analyze")
    if analyze:
        checked = tmp_path / UNIT.name
        checked.write_text(UNIT.read_text().replace("%h/.local/bin/mcp-token-otel",
                                                    f"{sys.executable} -m mcp_token_otel"))
        done = subprocess.run([analyze, "verify", str(checked)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    run_as_service(argv, tmp_path / "home")


def test_the_launchd_agent(tmp_path: Path) -> None:
    agent = plistlib.loads(AGENT.read_bytes())
    assert agent["Label"] == "io.github.mcp-token-otel.serve" == AGENT.stem
    program, *argv = agent["ProgramArguments"]
    assert program == "/Users/YOU/.local/bin/mcp-token-otel" and argv == ["serve"]
    assert agent["RunAtLoad"] is True and agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["StandardErrorPath"].startswith("/Users/YOU/")  # the sed line in its header makes it $HOME
    run_as_service(argv, tmp_path / "home")


@pytest.mark.parametrize("path", [UNIT, AGENT])
def test_the_service_files_say_how_to_install_them(path: Path) -> None:
    text = path.read_text()
    assert ("systemctl --user" in text) if path is UNIT else ("launchctl bootstrap" in text)
    assert "XDG_STATE_HOME" in text or path is AGENT


def test_serve_takes_the_metrics_servers_basic_auth(tmp_path: Path) -> None:
    """On a host shared with other users, the address is reachable by them: serve applies prometheus.*'s basic
    auth as any /metrics server here does."""
    import base64
    import urllib.error

    from .conftest import Serve

    serve = Serve(tmp_path / "metrics", env=child_env(MCP_TOKEN_OTEL_PROMETHEUS_BASIC_AUTH_USERNAME="me",
                                                      MCP_TOKEN_OTEL_PROMETHEUS_BASIC_AUTH_PASSWORD="s3cret"))
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(serve.url, timeout=10)
        assert refused.value.code == 401
        request = urllib.request.Request(serve.url, headers={
            "Authorization": "Basic " + base64.b64encode(b"me:s3cret").decode()})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    finally:
        serve.stop()
