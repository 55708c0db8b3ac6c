"""A process that writes into a host store the way a measuring process does (Writer.attach, then
prometheus-client values in the store's files), driven line by line on stdin, for the store's own tests.

    python writer_child.py DIR
    stdin: "count N" | "observe X" | "max V" | "live V" | "sync" (answers "ok") | "close" (compacts its own
    files, as a proxy does at exit) | "exit" (ends without compacting, as a killed one)
"""

from __future__ import annotations

import os
import sys

from mcp_token_otel.emitters.host_store import Writer


def main() -> int:
    writer = Writer.attach(sys.argv[1], "writer")
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    registry = CollectorRegistry()
    calls = Counter("hs_calls", "Calls.", ["server"], registry=registry)
    seconds = Histogram("hs_seconds", "Durations.", ["server"], buckets=(0.1, 1.0), registry=registry)
    biggest = Gauge("hs_definitions", "Definitions.", ["server"], registry=registry, multiprocess_mode="max")
    live = Gauge("hs_live", "Live sessions.", ["server"], registry=registry, multiprocess_mode="livesum")
    server = os.environ.get("HS_SERVER", "s")
    print(writer.ident, flush=True)
    for line in sys.stdin:
        op, _, arg = line.strip().partition(" ")
        if op == "count":
            calls.labels(server).inc(float(arg))
        elif op == "observe":
            seconds.labels(server).observe(float(arg))
        elif op == "max":
            biggest.labels(server).set(float(arg))
        elif op == "live":
            live.labels(server).set(float(arg))
        elif op == "sync":
            print("ok", flush=True)
        elif op == "close":
            writer.close()
            print("closed", flush=True)
            return 0
        elif op == "exit":
            os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
