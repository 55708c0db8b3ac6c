"""A stdio server that answers every request it has read before it exits, as server-everything does: requests
are handled concurrently (``tools/call`` takes argv[1] seconds); at EOF on stdin it waits for them, then exits
with status argv[2]."""

from __future__ import annotations

import json
import sys
import threading
import time

lock = threading.Lock()


def answer(message: dict[str, object], delay: float) -> None:
    if message.get("method") == "tools/call":
        time.sleep(delay)
    reply = {"jsonrpc": "2.0", "id": message["id"], "result": {"content": [{"type": "text", "text": "done"}]}}
    with lock:
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def main() -> int:
    delay, status = float(sys.argv[1]), int(sys.argv[2])
    workers = []
    for line in sys.stdin:
        message = json.loads(line)
        if "id" in message and "method" in message:
            worker = threading.Thread(target=answer, args=(message, delay))
            worker.start()
            workers.append(worker)
    for worker in workers:
        worker.join()
    return status


if __name__ == "__main__":
    sys.exit(main())
