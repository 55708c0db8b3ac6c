"""A recording stdio relay: ``record_relay.py OUT -- COMMAND...`` runs COMMAND and relays its stdin and stdout
line by line, unchanged, appending every line to OUT as one JSON object ``{"direction", "message"}``
(``client_to_server`` or ``server_to_client``; the message parsed, or ``{"unparsed": line}``)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from typing import IO, Any


def main(argv: list[str]) -> int:
    out_path, sep, *command = argv
    if sep != "--" or not command:
        print("usage: record_relay.py OUT -- COMMAND...", file=sys.stderr)
        return 2
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    lock = threading.Lock()
    log = open(out_path, "a", encoding="utf-8")  # noqa: SIM115 - closed below, after both pumps

    def record(direction: str, line: bytes) -> None:
        try:
            message: Any = json.loads(line)
        except ValueError:
            message = {"unparsed": line.decode("utf-8", "replace")}
        with lock:
            log.write(json.dumps({"direction": direction, "message": message}) + "\n")
            log.flush()

    def pump(source: IO[bytes], sink: IO[bytes], direction: str) -> None:
        try:
            for line in iter(source.readline, b""):
                if line.strip():
                    record(direction, line)
                sink.write(line)
                sink.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass
        finally:
            if direction == "client_to_server":
                with contextlib.suppress(OSError):
                    sink.close()

    up = threading.Thread(target=pump, args=(sys.stdin.buffer, child.stdin, "client_to_server"), daemon=True)
    down = threading.Thread(target=pump, args=(child.stdout, sys.stdout.buffer, "server_to_client"), daemon=True)
    up.start()
    down.start()
    down.join()
    code = child.wait(timeout=10)
    log.close()
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
