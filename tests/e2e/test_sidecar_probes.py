"""The sidecar manifest's probes are paths the proxy serves: the proxy container's arguments are taken from
``deploy/kubernetes/proxy-sidecar.yaml`` and run as a real proxy (loopback addresses and free ports in place of
the pod's), and every probe is sent, to the listener its named port stands for, as the kubelet sends it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml

from tests.helpers.support import free_port
from tests.proxy.conftest import listening, proxy_argv, proxy_env, wait_for
from tests.proxy.test_http import _own_server

SIDECAR = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "proxy-sidecar.yaml"
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def _proxy_container() -> dict[str, Any]:
    deployment = next(d for d in yaml.safe_load_all(SIDECAR.read_text()) if d and d["kind"] == "Deployment")
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c.get("args", [])[:1] == ["proxy"])


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@contextlib.contextmanager
def _serve(app: Any, port: int) -> Iterator[None]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, what="uvicorn started")
        yield
    finally:
        server.should_exit = True
        thread.join(20)


@contextlib.contextmanager
def _proxy(args: list[str]) -> Iterator[None]:
    proc = subprocess.Popen(proxy_argv(*args), env={**os.environ, **proxy_env()}, stderr=subprocess.PIPE, text=True)
    try:
        port = int(_option(args, "--listen").rsplit(":", 1)[1])
        wait_for(lambda: listening(port) or proc.poll() is not None, what="the proxy listening")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_the_sidecar_probes_are_paths_the_proxy_serves() -> None:
    container = _proxy_container()
    probes = {kind: container[kind]["httpGet"] for kind in PROBES if kind in container}
    assert "readinessProbe" in probes and "livenessProbe" in probes, container.keys()
    args = list(container["args"][1:])
    pod_listen = int(_option(args, "--listen").rsplit(":", 1)[1])
    pod_metrics = int(_option(args, "--metrics-port"))
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen, metrics, upstream_port = free_port(), free_port(), free_port()
    local = {pod_listen: listen, pod_metrics: metrics}  # the pod's ports -> this test's
    args[args.index("--listen") + 1] = f"127.0.0.1:{listen}"
    args[args.index("--metrics-host") + 1] = "127.0.0.1"
    args[args.index("--metrics-port") + 1] = str(metrics)
    pod_upstream = _option(args, "--upstream")
    assert pod_upstream.startswith("http://127.0.0.1:"), pod_upstream  # the server container, in the pod
    path = "/" + pod_upstream.split("/", 3)[3]
    args[args.index("--upstream") + 1] = f"http://127.0.0.1:{upstream_port}{path}"

    def url(probe: dict[str, Any]) -> str:
        port = named[probe["port"]] if isinstance(probe["port"], str) else probe["port"]
        assert port in local, f"probe port {probe['port']} is neither --listen nor --metrics-port"
        return f"http://127.0.0.1:{local[port]}{probe['path']}"

    with _proxy(args):
        # Before the server is up, the pod is alive but not ready: readiness says so rather than passing always.
        assert _status(url(probes["livenessProbe"])) == 200
        assert _status(url(probes["readinessProbe"])) == 503
        # The upstream is the Python SDK's app, which answers 404 on these paths: a 200 comes from the proxy.
        with _serve(_own_server().streamable_http_app(), port=upstream_port):
            for kind, probe in probes.items():
                assert _status(url(probe)) == 200, (kind, probe)


@pytest.mark.parametrize("path", ["/readyz", "/livez"])
def test_the_docs_name_the_probes_the_manifest_uses(path: str) -> None:
    root = SIDECAR.parent.parent.parent
    assert path in (root / "docs" / "proxy.md").read_text() and path in (root / "docs" / "deploy.md").read_text()
    assert path in {probe["httpGet"]["path"] for kind in PROBES if (probe := _proxy_container().get(kind))}
