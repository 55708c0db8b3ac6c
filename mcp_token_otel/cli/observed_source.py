"""Where observations come from: this project's /metrics (``--observed URL``) or a Prometheus server's HTTP API
(``--prometheus URL``, over ``--window``). Both give the same (name, labels, value) samples of the per-tool
output-token histogram to :mod:`..core.observed`.

/metrics is cumulative since the measured process started; Prometheus gives the ``increase()`` over the window
(extrapolated by Prometheus, so counts may be fractional and are rounded; a series' first scrape is its start).
"""

from __future__ import annotations

import argparse
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ..core.labels import server_label_name
from ..core.observed import DIRECTION, FAMILY, METHOD, Observed, histograms, observe_all, servers_seen
from ..core.risk import RiskThresholds

Sample = tuple[str, Mapping[str, str], float]
DEFAULT_WINDOW = "1d"
#: A Prometheus duration: one or more number-unit pairs.
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
#: /metrics larger than this is not a /metrics of this project.
_MAX_BYTES = 64 * 1024 * 1024


class ObservedSourceError(ValueError):
    """An endpoint that cannot be read or does not answer as expected; one ``error:`` line."""


@dataclass(frozen=True, slots=True)
class Observations:
    source: str  # "/metrics URL" or "Prometheus URL, last WINDOW"
    server: str  # the server label read
    tools: dict[str, Observed]
    other_servers: tuple[str, ...] = ()  # servers the metrics do have, when the chosen one has no tool calls


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--observed", metavar="URL",
                       help="read what the tools returned from this /metrics of mcp-token-otel, e.g. "
                            "http://127.0.0.1:9464/metrics")
    group.add_argument("--prometheus", metavar="URL",
                       help="read what the tools returned from this Prometheus server, e.g. http://127.0.0.1:9090")
    parser.add_argument("--window", default=None, metavar="DURATION",
                        help=f"with --prometheus: the range observed (default {DEFAULT_WINDOW}), e.g. 1h, 7d")
    parser.add_argument("--server", default=None, metavar="NAME",
                        help="with --observed or --prometheus: the server label to read (default: the server's own "
                             "name)")


def _get(url: str, timeout: float, accept: str) -> bytes:
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ObservedSourceError(f"{url}: expected an http:// or https:// URL")
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body: bytes = response.read(_MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ObservedSourceError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise ObservedSourceError(f"{url}: {reason}") from None
    if len(body) > _MAX_BYTES:
        raise ObservedSourceError(f"{url}: answer larger than {_MAX_BYTES // (1024 * 1024)} MiB")
    return body


def metrics_samples(url: str, timeout: float) -> list[Sample]:
    """The output-token histogram samples of a /metrics page (Prometheus text format)."""
    body = _get(url, timeout, "text/plain;version=0.0.4")
    try:
        families = list(text_string_to_metric_families(body.decode("utf-8")))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ObservedSourceError(f"{url}: not Prometheus text ({exc})") from None
    return [(s.name, s.labels, float(s.value)) for f in families if f.name == FAMILY for s in f.samples]


def _query(base: str, expr: str, timeout: float) -> list[dict[str, Any]]:
    url = f"{base.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    body = _get(url, timeout, "application/json")
    try:
        answer = json.loads(body)
    except ValueError:
        raise ObservedSourceError(f"{base}: not a Prometheus API answer") from None
    data = answer.get("data") if isinstance(answer, dict) else None
    if answer.get("status") != "success" or not isinstance(data, dict) or data.get("resultType") != "vector":
        raise ObservedSourceError(f"{base}: query failed: {answer.get('error', 'no vector result')}")
    return [r for r in data.get("result", []) if isinstance(r, dict)]


def prometheus_samples(base: str, server: str | None, window: str, timeout: float) -> list[Sample]:
    """The increase over ``window`` of the histogram's buckets, sums and counts, by side, server and tool."""
    matcher = f'direction="{DIRECTION}",method="{METHOD}"'
    if server is not None:
        matcher += f",server={json.dumps(server)}"
    out: list[Sample] = []
    for suffix, by in (("bucket", "side, server, tool, le"), ("sum", "side, server, tool"),
                       ("count", "side, server, tool")):
        name = f"{FAMILY}_{suffix}"
        expr = f"sum by ({by}) (increase({name}{{{matcher}}}[{window}]))"
        for row in _query(base, expr, timeout):
            labels = {str(k): str(v) for k, v in row.get("metric", {}).items()}
            value = row.get("value")
            if isinstance(value, list) and len(value) == 2:
                out.append((name, {**labels, "method": METHOD, "direction": DIRECTION}, float(value[1])))
    return out


def load(args: argparse.Namespace, server_name: str, thresholds: RiskThresholds) -> Observations | None:
    """The observations the command line asks for; None without ``--observed`` or ``--prometheus``."""
    url: str | None = getattr(args, "observed", None)
    prom: str | None = getattr(args, "prometheus", None)
    if url is None and prom is None:
        for option in ("window", "server"):
            if getattr(args, option, None) is not None:
                raise ObservedSourceError(f"--{option} needs --observed or --prometheus")
        return None
    if url is not None and args.window is not None:
        raise ObservedSourceError("--window needs --prometheus (a /metrics page holds everything since its "
                                  "process started)")
    # The server's own name as the proxy and the shim label it (normalized), unless --server says otherwise.
    server = args.server if args.server is not None else server_label_name(server_name)
    if url is not None:
        samples, source = metrics_samples(url, args.timeout), url
    else:
        assert prom is not None  # one of the two: checked above
        window = args.window or DEFAULT_WINDOW
        if not _DURATION.match(window):
            raise ObservedSourceError(f"--window: expected a Prometheus duration such as 1h or 7d, got {window!r}")
        samples = prometheus_samples(prom, server, window, args.timeout)
        source = f"{prom}, last {window}"
    tools = observe_all(histograms(samples, server), thresholds)
    others: list[str] = []
    if not tools:
        if prom is not None:  # the query above asked for this server only
            samples = prometheus_samples(prom, None, args.window or DEFAULT_WINDOW, args.timeout)
        others = [s for s in servers_seen(samples) if s != server]
    return Observations(source, server, tools, tuple(others))
