"""The standalone /metrics server under load and abuse: bounded threads, refusal past the connection cap,
a deadline for slow-drip clients, every request answered, IPv6, and TLS errors that name their file.

No assertion here is on time: timing figures come from benchmarks/metrics_server_abuse.py. Loops that wait
for the server are bounded and fail with a message when the bound is reached.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from mcp_token_otel.emitters.metrics_server import DEFAULT_WORKERS, LISTEN_BACKLOG, MetricsServer, tls_context


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    counter = Counter("demo_things", "things", ["tool"], registry=reg)
    for i in range(50):
        counter.labels(tool=f"t{i}").inc(i)
    return reg


@pytest.fixture
def start() -> Iterator[Callable[..., MetricsServer]]:
    servers: list[MetricsServer] = []

    def make(**kwargs: object) -> MetricsServer:
        server = MetricsServer.start(str(kwargs.pop("host", "127.0.0.1")), 0, registry(), **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def scrape(url: str, timeout: float = 30) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read()
        assert b"demo_things_total" in body
        return int(response.status)


def wait_for(condition: Callable[[], bool], what: str, bound: float = 30.0) -> None:
    end = time.monotonic() + bound
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.02)


def drip_client(server: MetricsServer) -> socket.socket:
    """A client that sends the start of a request head and then stalls (one more line now and then)."""
    sock = socket.create_connection((server.host, server.port), timeout=30)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    return sock


def server_threads() -> int:
    return sum(t.name.startswith("mcp-token-otel-http") for t in threading.enumerate())


def test_backlog_is_sized_for_bursts() -> None:
    assert LISTEN_BACKLOG >= 512  # the standard library's 5 overflowed under 50 parallel scrapers


def test_concurrent_scrapers_are_all_answered(start: Callable[..., MetricsServer]) -> None:
    server = start()
    with ThreadPoolExecutor(50) as pool:
        statuses = list(pool.map(lambda _: scrape(server.url), range(500)))
    assert statuses == [200] * 500
    assert server_threads() == 1 + DEFAULT_WORKERS
    wait_for(lambda: server.open_connections == 0, "every connection to be closed")
    assert server.served == 500 and server.refused == 0


def test_slow_drip_clients_hold_no_thread_and_are_cut_at_the_deadline(start: Callable[..., MetricsServer]) -> None:
    server = start(request_timeout=1.0)
    threads_before = threading.active_count()
    clients = [drip_client(server) for _ in range(300)]
    try:
        wait_for(lambda: server.open_connections == 300, "300 open connections")
        assert threading.active_count() == threads_before  # sockets, not threads
        assert server_threads() == 1 + DEFAULT_WORKERS
        assert scrape(server.url) == 200  # a real scrape is served meanwhile
        for sock in clients[:50]:
            sock.sendall(b"X-Drip: 1\r\n")  # still dripping: the deadline is for the whole head
        closed = 0
        for sock in clients:  # the server hangs up on every one of them once their deadline passes
            sock.settimeout(30)
            try:
                closed += sock.recv(1024) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == 300
        wait_for(lambda: server.timed_out == 300, "300 timed-out clients")
        wait_for(lambda: server.open_connections == 0, "every connection to be closed")
    finally:
        for sock in clients:
            sock.close()


def test_connections_past_the_cap_are_refused_at_once(start: Callable[..., MetricsServer]) -> None:
    server = start(max_connections=20, request_timeout=60.0)
    clients = [drip_client(server) for _ in range(20)]
    try:
        wait_for(lambda: server.open_connections == 20, "20 open connections")
        with pytest.raises(urllib.error.HTTPError) as info:
            scrape(server.url)
        assert info.value.code == 503 and info.value.headers["Retry-After"] == "1"
        assert server.refused == 1 and server_threads() == 1 + DEFAULT_WORKERS
    finally:
        for sock in clients:
            sock.close()
    wait_for(lambda: server.open_connections == 0, "the stalled connections to be closed")
    assert scrape(server.url) == 200


def test_a_client_that_sends_garbage_or_hangs_up_is_dropped(start: Callable[..., MetricsServer]) -> None:
    server = start()
    for payload in (b"\x16\x03\x01\x00\x05hello\r\n\r\n", b"GET /metrics HTTP/1.1\r\n", b"X" * 40_000):
        with socket.create_connection((server.host, server.port), timeout=30) as sock:
            sock.sendall(payload)
    assert scrape(server.url) == 200
    wait_for(lambda: server.open_connections == 0, "every connection to be closed")


def test_ipv6_address() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    server = MetricsServer.start("::1", 0, registry())
    try:
        assert server.url.startswith("http://[::1]:") and server.host == "::1"
        assert scrape(server.url) == 200
    finally:
        server.close()


def test_ipv6_from_the_configuration(caplog: pytest.LogCaptureFixture) -> None:
    """prometheus.host: "::1" as a user writes it, through start_prometheus (an address-family error before)."""
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.emitters.prometheus_service import start_prometheus
    from mcp_token_otel.recorder import TokenRecorder

    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    config = config_from_dict({"prometheus": {"host": "::1", "port": 0}})
    recorder = TokenRecorder(config)
    service = start_prometheus(recorder, config.prometheus)
    try:
        if service.server is None and ("Address family" in caplog.text or "Cannot assign" in caplog.text):
            pytest.skip("no IPv6 loopback on this machine")
        assert service.server is not None, caplog.text
        with urllib.request.urlopen(service.server.url, timeout=30) as response:
            assert response.status == 200
    finally:
        service.close()
        recorder.close()


def _openssl_pair(tmp_path: Path, name: str) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    cert, key = tmp_path / f"{name}-cert.pem", tmp_path / f"{name}-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_errors_name_the_file(tmp_path: Path) -> None:
    missing, text = tmp_path / "missing.pem", tmp_path / "text.pem"
    text.write_text("not a certificate\n")
    cert, key = _openssl_pair(tmp_path, "a")
    other_cert, _ = _openssl_pair(tmp_path, "b")
    cases = [
        ((missing, key), f"cannot read TLS certificate file '{missing}'"),
        ((cert, missing), f"cannot read TLS key file '{missing}'"),
        ((text, key), f"TLS certificate file '{text}' holds no PEM certificate"),
        ((cert, text), f"TLS key file '{text}' holds no PEM private key"),
        ((other_cert, key), f"cannot use TLS certificate file '{other_cert}' with key file '{key}'"),
    ]
    for (c, k), message in cases:
        with pytest.raises(ValueError) as info:
            tls_context(str(c), str(k))
        assert message in str(info.value)
    assert isinstance(tls_context(str(cert), str(key)), ssl.SSLContext)


def test_tls_file_errors_reach_the_log_and_leave_the_port_free(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.emitters.prometheus_service import start_prometheus
    from mcp_token_otel.recorder import TokenRecorder

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    missing = tmp_path / "nope.pem"
    config = config_from_dict({"prometheus": {"port": port, "tls_cert_file": str(missing),
                                              "tls_key_file": str(missing)}})
    recorder = TokenRecorder(config)
    service = start_prometheus(recorder, config.prometheus)
    recorder.close()
    assert service.server is None
    assert f"cannot read TLS certificate file '{missing}'" in caplog.text
    with socket.socket() as again:  # nothing was left bound to the port
        again.bind(("127.0.0.1", port))


def test_tls_slow_handshakes_do_not_hold_threads(tmp_path: Path, start: Callable[..., MetricsServer]) -> None:
    cert, key = _openssl_pair(tmp_path, "c")
    server = start(tls_cert_file=str(cert), tls_key_file=str(key), request_timeout=1.0)
    idle = [socket.create_connection((server.host, server.port), timeout=30) for _ in range(50)]  # no ClientHello
    try:
        wait_for(lambda: server.open_connections == 50, "50 idle TLS connections")
        assert server_threads() == 1 + DEFAULT_WORKERS
        context = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(server.url, timeout=30, context=context) as response:
            assert response.status == 200
        wait_for(lambda: server.timed_out == 50, "the idle handshakes to time out")
    finally:
        for sock in idle:
            sock.close()


def test_concurrent_scrapes_share_renderings_but_never_across_credentials(
    start: Callable[..., MetricsServer],
) -> None:
    """Scrapes that arrive during a rendering share it; the credentials are part of what is shared, so a
    request without them never gets the body rendered for one with them."""
    import base64

    from mcp_token_otel.emitters.metrics_server import BasicAuth

    server = start(auth=BasicAuth("prom", "s3cret"))
    good = {"Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()}

    def fetch(authorised: bool) -> tuple[bool, int, bytes]:
        request = urllib.request.Request(server.url, headers=good if authorised else {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return authorised, response.status, response.read()
        except urllib.error.HTTPError as exc:
            return authorised, exc.code, exc.read()

    with ThreadPoolExecutor(40) as pool:
        results = list(pool.map(fetch, [i % 2 == 0 for i in range(400)]))
    for authorised, status, body in results:
        if authorised:
            assert status == 200 and b"demo_things_total" in body
        else:
            assert status == 401 and b"demo_things" not in body


def test_a_sequential_scrape_sees_what_was_recorded_before_it() -> None:
    reg = CollectorRegistry()
    counter = Counter("fresh", "freshness", registry=reg)
    server = MetricsServer.start("127.0.0.1", 0, reg)
    try:
        for i in range(1, 30):
            counter.inc()
            with urllib.request.urlopen(server.url, timeout=30) as response:
                assert f"fresh_total {float(i)}".encode() in response.read()
    finally:
        server.close()


def _fresh_value(url: str) -> float:
    with urllib.request.urlopen(url, timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("fresh_total "):
                return float(line.split()[1])
    raise AssertionError("fresh_total missing")


def test_scrapes_while_others_are_connected_share_a_recent_rendering() -> None:
    """With another client connected, a scrape may get the last rendering if it began within
    render_max_age; once no one else is connected, a scrape renders afresh and sees the new value."""
    reg = CollectorRegistry()
    counter = Counter("fresh", "freshness", registry=reg)
    server = MetricsServer.start("127.0.0.1", 0, reg, render_max_age=60.0)
    try:
        counter.inc()
        assert _fresh_value(server.url) == 1.0 and server.renders == 1
        wait_for(lambda: server.open_connections == 0, "the first scrape's connection to be closed")
        other = drip_client(server)  # another client connected: the server is busy
        try:
            wait_for(lambda: server.open_connections == 1, "the other client to be connected")
            for _ in range(5):
                counter.inc()
                assert _fresh_value(server.url) == 1.0  # the shared rendering, under a minute old
            assert server.renders == 1
        finally:
            other.close()
        wait_for(lambda: server.open_connections == 0, "every connection to be closed")
        assert _fresh_value(server.url) == 6.0 and server.renders == 2  # alone again: a new rendering
    finally:
        server.close()


@pytest.mark.parametrize(("max_age", "pause", "scrapes"), [(0.05, 0.1, 3), (0, 0.0, 10)])
def test_a_rendering_too_old_to_share_is_not_reused(max_age: float, pause: float, scrapes: int) -> None:
    """Past its max age (0.05 s, each scrape 0.1 s after the last), or with a max age of 0 (only a rendering
    in progress is shared), every scrape renders afresh while another client stays connected."""
    reg = CollectorRegistry()
    counter = Counter("fresh", "freshness", registry=reg)
    server = MetricsServer.start("127.0.0.1", 0, reg, render_max_age=max_age)
    other = drip_client(server)
    try:
        wait_for(lambda: server.open_connections == 1, "the other client to be connected")
        for i in range(1, scrapes + 1):
            counter.inc()
            time.sleep(pause)
            assert _fresh_value(server.url) == float(i)
        assert server.renders == scrapes
    finally:
        other.close()
        server.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _counting_app(bodies: list[bytes]) -> Callable[..., list[bytes]]:
    def app(environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
        bodies.append(f"render {len(bodies) + 1} for {environ.get('HTTP_ACCEPT', '')}".encode())
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [bodies[-1]]

    return app


def _call(app: Callable[..., Iterable[bytes]], accept: str = "text/plain") -> bytes:
    return b"".join(app({"PATH_INFO": "/metrics", "HTTP_ACCEPT": accept}, lambda status, headers: None))


def test_shared_rendering_policy_by_age() -> None:
    """Under 1/2 max age: reused. Between 1/2 and the max age: the request refreshes it (others would keep
    getting the old one meanwhile). Past the max age or on an idle server: a new rendering."""
    from mcp_token_otel.emitters import shared_renders

    bodies: list[bytes] = []
    clock, busy = _Clock(), [True]
    shared = shared_renders.SingleFlight(_counting_app(bodies), 1.0, busy=lambda: busy[0], clock=clock)
    assert _call(shared) == b"render 1 for text/plain"
    clock.now += 0.4
    assert _call(shared) == b"render 1 for text/plain"  # 0.4 s old: shared
    clock.now += 0.2
    assert _call(shared) == b"render 2 for text/plain"  # 0.6 s old: refreshed by this request
    clock.now += 0.3
    assert _call(shared) == b"render 2 for text/plain"
    clock.now += 1.5
    assert _call(shared) == b"render 3 for text/plain"  # too old
    busy[0] = False
    assert _call(shared) == b"render 4 for text/plain"  # idle server: always a new rendering
    busy[0] = True
    assert _call(shared, "application/openmetrics-text") == b"render 5 for application/openmetrics-text"
    assert _call(shared) == b"render 4 for text/plain"  # one kept rendering per request shape
    for i in range(100):  # a client varying its headers cannot grow what is kept
        _call(shared, f"text/x-{i}")
    assert len(shared._finished) <= shared_renders.KEPT_RENDERS


def test_while_one_request_refreshes_the_others_get_the_kept_rendering() -> None:
    from mcp_token_otel.emitters import shared_renders

    bodies: list[bytes] = []
    clock, release = _Clock(), threading.Event()
    counting = _counting_app(bodies)

    def slow(environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
        if bodies:  # every rendering after the first waits until released
            assert release.wait(30)
        return counting(environ, start_response)

    shared = shared_renders.SingleFlight(slow, 1.0, busy=lambda: True, clock=clock)
    assert _call(shared) == b"render 1 for text/plain"
    clock.now += 0.7
    with ThreadPoolExecutor(1) as pool:
        refreshing = pool.submit(_call, shared)
        wait_for(lambda: bool(shared._flights), "the refresh to start")
        assert [_call(shared) for _ in range(3)] == [b"render 1 for text/plain"] * 3  # nobody waits for it
        release.set()
        assert refreshing.result(timeout=30) == b"render 2 for text/plain"
    assert _call(shared) == b"render 2 for text/plain"


def _raw(server: MetricsServer, request: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Send a raw request; the status line, headers and body of the answer (the server closes after it)."""
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return status.encode(), headers, body


def test_requests_are_answered_as_http(start: Callable[..., MetricsServer]) -> None:
    """The worker parses request heads itself: methods, gzip, HEAD, bad heads and header names."""
    import gzip

    server = start()
    status, headers, body = _raw(server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == b"HTTP/1.1 200 OK" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body) and b"demo_things_total" in body and "date" in headers
    status, headers, zipped = _raw(server, b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n")
    assert headers["content-encoding"] == "gzip" and gzip.decompress(zipped) == body
    status, headers, empty = _raw(server, b"HEAD /metrics HTTP/1.1\n\n")  # bare LF line ends too
    assert empty == b"" and int(headers["content-length"]) > 0
    status, headers, body = _raw(server, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 405") and headers["allow"] == "OPTIONS,GET"
    for bad in (b"GET /metrics\r\n\r\n", b"\x00\x01 garbage\r\n\r\n", b"GET / SPDY/3\r\n\r\n"):
        status, _, body = _raw(server, bad)
        assert status == b"HTTP/1.1 400 Bad Request" and body == b""
    wait_for(lambda: server.open_connections == 0, "every connection to be closed")


def test_header_names_with_underscores_cannot_pose_as_credentials() -> None:
    import base64

    from mcp_token_otel.emitters.metrics_server import BasicAuth

    server = MetricsServer.start("127.0.0.1", 0, registry(), auth=BasicAuth("prom", "pw"))
    token = base64.b64encode(b"prom:pw")
    try:
        status, _, _ = _raw(server, b"GET /metrics HTTP/1.1\r\nAuthorization_: Basic " + token + b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 401")
        status, _, body = _raw(server, b"GET /metrics HTTP/1.1\r\nauthorization:  Basic " + token + b"\r\n\r\n")
        assert status == b"HTTP/1.1 200 OK" and b"demo_things_total" in body
    finally:
        server.close()


def test_a_failing_rendering_answers_500_and_the_next_scrape_renders_again() -> None:
    calls: list[int] = []

    def render() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("collector failed")
        return b"demo_things_total 1.0\n"

    server = MetricsServer.start("127.0.0.1", 0, registry(), render=render)
    try:
        status, _, body = _raw(server, b"GET /metrics HTTP/1.1\r\nAccept: text/plain\r\n\r\n")
        assert status == b"HTTP/1.1 500 Internal Server Error" and body == b""
        status, _, body = _raw(server, b"GET /metrics HTTP/1.1\r\nAccept: text/plain\r\n\r\n")
        assert status == b"HTTP/1.1 200 OK" and body == b"demo_things_total 1.0\n" and len(calls) == 2
        status, _, _ = _raw(server, b"POST /metrics HTTP/1.1\r\nAccept: text/plain\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 405") and len(calls) == 2  # the fast renderer answers GET only
    finally:
        server.close()
