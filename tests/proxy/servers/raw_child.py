"""Small stand-in servers for the stdio proxy's edge cases, chosen by argv[1].

responder: answers each JSON-RPC request line with {"result": {"echo": params}} (a batch with a batch),
           sends invalid lines back as they are, and ignores notifications and responses.
echo:      copies stdin to stdout byte for byte.
partial:   writes half a message, then exits with status 5 (a crash mid-stream).
sleeper:   prints its pid, then sleeps without reading stdin (a server that ignores EOF).
exit:      reads stdin to EOF, then exits with status argv[2].
"""

from __future__ import annotations

import json
import os
import sys
import time


def respond(message: object) -> object:
    if isinstance(message, list):
        answers = [respond(m) for m in message]
        return [a for a in answers if a is not None]
    if isinstance(message, dict) and "method" in message and "id" in message:
        return {"jsonrpc": "2.0", "id": message["id"], "result": {"echo": message.get("params")}}
    return None


def main() -> int:
    mode = sys.argv[1]
    out = sys.stdout.buffer
    if mode == "responder":
        for line in sys.stdin.buffer:
            try:
                answer = respond(json.loads(line))
            except ValueError:
                out.write(line)
            else:
                if answer is not None and answer != []:
                    out.write(json.dumps(answer).encode() + b"\n")
            out.flush()
        return 0
    if mode == "echo":
        while chunk := os.read(0, 1 << 16):
            view = memoryview(chunk)
            while view:
                view = view[os.write(1, view):]
        return 0
    if mode == "partial":
        out.write(b'{"jsonrpc": "2.0", "id": 1, "resu')
        out.flush()
        os._exit(5)
    if mode == "sleeper":
        out.write(f"{os.getpid()}\n".encode())
        out.flush()
        time.sleep(120)
        return 0
    if mode == "exit":
        sys.stdin.buffer.read()
        return int(sys.argv[2])
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main())
