"""Small stand-in servers for the stdio proxy's edge cases, chosen by argv[1].

responder: answers each JSON-RPC request line with {"result": {"echo": params}} (a batch with a batch),
           sends invalid lines back as they are, and ignores notifications and responses.
echo:      copies stdin to stdout byte for byte.
partial:   writes half a message, then exits with status 5 (a crash mid-stream).
sleeper:   prints its pid, then sleeps without reading stdin (a server that ignores EOF).
exit:      reads stdin to EOF, then exits with status argv[2].
flood:     writes argv[2] bytes of lines to stdout (from a thread) while it appends each stdin line to the file
           argv[3]: its input must flow while its output is stuck.
deaf:      never reads stdin; writes a line every 20 ms: its output must flow while its input is stuck.
"""

from __future__ import annotations

import json
import os
import sys
import threading
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
    if mode == "flood":
        size = int(sys.argv[2])

        def flood() -> None:
            line = b"x" * 1023 + b"\n"
            for _ in range(size // len(line)):
                out.write(line)
            out.flush()

        writer = threading.Thread(target=flood)
        writer.start()
        with open(sys.argv[3], "ab", buffering=0) as log:
            for line in sys.stdin.buffer:
                log.write(line)
        writer.join()
        return 0
    if mode == "deaf":
        for n in range(3000):
            out.write(b'{"tick":%d}\n' % n)
            out.flush()
            time.sleep(0.02)
        return 0
    if mode == "exit":
        sys.stdin.buffer.read()
        return int(sys.argv[2])
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main())
