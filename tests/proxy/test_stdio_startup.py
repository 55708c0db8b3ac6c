"""The stdio proxy's first response never waits on the proxy's own start-up: the relay runs while the measuring
process is still starting, and what went through meanwhile is measured once it is ready (asserted by order, not
by time: the measuring process is held before its start until the answers came back)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from mcp_token_otel.proxy.measure_process import RemoteMeasurer
from mcp_token_otel.proxy.stdio import StdioProxy

from .conftest import free_port, proxy_env, sample, scrape, wait_for

CHILD = Path(__file__).parent / "servers" / "raw_child.py"
HELD = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
from mcp_token_otel.proxy.measure_process import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_relay_answers_before_the_measuring_process_is_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in proxy_env().items():
        monkeypatch.setenv(name, value)
    gate, port = tmp_path / "go", free_port()
    measurer = RemoteMeasurer([sys.executable, "-c", HELD, str(gate), "--name", "held", "--metrics-port", str(port)])
    client_in, proxy_in = os.pipe()
    proxy_out, client_out = os.pipe()
    proxy = StdioProxy([sys.executable, str(CHILD), "responder"], name="held", stdin_fd=client_in,
                       stdout_fd=client_out, shutdown_grace=5)
    proxy.start()
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(proxy.run(SimpleNamespace(measurer=measurer))))
    runner.start()
    try:
        os.write(proxy_in, b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n{"jsonrpc":"2.0","id":2,"method":"ping"}\n')
        answers = b""
        while answers.count(b"\n") < 2:
            answers += os.read(proxy_out, 1 << 16)
        assert not measurer.ready and not gate.exists()  # both answered while measuring had not started
        gate.touch()

        def measured() -> str | None:
            try:
                text = scrape(port)
            except OSError:
                return None
            return text if sample(text, "mcp_token_proxy_messages_total", kind="response") >= 2 else None

        text = wait_for(measured, timeout=60, what="the early messages measured")
        assert sample(text, "mcp_token_proxy_messages_total", direction="client_to_server", kind="request") == 2
        assert sample(text, "mcp_token_proxy_measurement_dropped_chunks_total") == 0
    finally:
        gate.touch()
        os.close(proxy_in)
        runner.join(30)
        measurer.close()
        for fd in (client_in, proxy_out):
            os.close(fd)
    assert codes == [0]
