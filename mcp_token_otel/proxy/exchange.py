"""One HTTP exchange through the relay: a client's request (its body whole or streamed, within its deadline),
the round trip on a pooled upstream connection, and the response relayed as its bytes arrive (whole when a
guard holds it, by length, or as a stream watched for the client leaving). See http.py for the connection
around it."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from .guard import held_request
from .http1 import (
    CHUNK,
    CLOSED,
    DATA,
    END,
    ERROR,
    HEAD,
    Body,
    Head,
    HttpError,
    UpstreamBroken,
    Wire,
    answer_json,
    hop_by_hop,
    refuse,
)
from .jsonrpc import BODY, C2S, S2C, SSE, dumps
from .transport import Channel, http_origin

if TYPE_CHECKING:
    from .http import Conn, Relay

logger = logging.getLogger("mcp_token_otel.proxy")

#: Request bodies up to this size are read whole and sent with the head in one write; larger or chunked
#: ones stream.
SMALL_BODY = 1024 * 1024
#: ``error_type`` of a call the upstream never answered: it could not be reached, or it closed the connection
#: (or sent what is not HTTP) after the request was sent, before the response was whole.
UNAVAILABLE, CLOSED_EARLY = "upstream_unavailable", "upstream_closed"
#: The JSON-RPC error code the client gets for such a call (the SDKs' "connection closed").
GATEWAY_ERROR = -32000


class UpstreamFailed(Exception):
    """No response from the upstream: ``error_type`` says whether it was reached at all."""

    def __init__(self, error_type: str, detail: object) -> None:
        super().__init__(str(detail) or type(detail).__name__)
        self.error_type = error_type


class ClientGone(Exception):
    """The client left (or was cut off at the body deadline) in the middle of its request body."""


def request_ids(body: bytes) -> tuple[list[Any], bool]:
    """The ids of the JSON-RPC requests in a body, and whether it is a batch (nothing readable: none)."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return [], False
    batch = isinstance(message, list)
    items = message if batch else [message]
    return [m["id"] for m in items if isinstance(m, dict) and "method" in m and "id" in m], batch


class Exchange:
    """One request of a client connection and its response; :meth:`run` says whether the connection goes on."""

    def __init__(self, relay: Relay, wire: Wire, writer: asyncio.StreamWriter, request: Head, keep: bool) -> None:
        self.relay = relay
        self.measurer = relay.telemetry.measurer
        self.wire = wire
        self.writer = writer
        self.request = request
        self.keep = keep
        self.session_id: str | None = None
        self.tracker: Any = None
        self.up: Any = None  # the request body's measuring stream, until the request is measured or dropped
        self.body = b""  # a body read whole: measured once the upstream accepted it; its ids answer a failure
        self.streamed = False  # pieces of a streamed body were handed to ``up``
        self.measured = False  # the request was measured: a failure after it is the call's error
        #: When the request started upstream (``time.time_ns()``): measured later (once accepted), at this time.
        self.sent_at: int | None = None

    def _upstream_head(self) -> tuple[list[bytes], bool, str | None]:
        """The request head towards the upstream without its framing; whether the client expects a 100
        Continue; the protocol version it named."""
        request = self.request
        drop = hop_by_hop(request)
        out = [request.method + b" " + request.target + b" HTTP/1.1\r\n"]
        expect = False
        version: str | None = None
        for lower, (name, value) in zip(request.names, request.headers, strict=True):
            if lower in drop or lower == b"content-length":  # framing is written by the caller
                continue
            if lower == b"expect":  # answered here: the body is read before anything goes upstream
                expect = value.lower() == b"100-continue"
                if expect:
                    continue
            if lower == b"mcp-session-id":
                self.session_id = value.decode("latin-1")
            elif lower == b"mcp-protocol-version":
                version = value.decode("latin-1")
            out.append(name + b": " + value + b"\r\n")
        return out, expect, version

    async def run(self) -> bool:
        """Relay the exchange; True when the client connection may take another request."""
        request, measurer = self.request, self.measurer
        length, chunked = request.length, request.chunked
        out, expect, version = self._upstream_head()
        tracker = self.tracker = self.relay.tracker(self.session_id, self._origin) \
            if not request.target.startswith(b"/.well-known/") else None
        if tracker is not None and version and self.relay.versions.get(self.session_id) != version:
            measurer.set_tracker(tracker, protocol_version=version)
            if self.session_id is not None and self.session_id in self.relay.sessions:
                self.relay.versions[self.session_id] = version  # told once per session, not with every request
        if tracker is not None and request.method == b"POST":
            self.up = measurer.stream(tracker, C2S, BODY)
        if expect and (length or chunked):
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if length is not None and length <= SMALL_BODY:  # the usual POST: whole, then sent with the head
            body = await self._small_body()
            if body is None:
                return self._unmeasured(False)
            refusal, body = self._guard_request(body)
            if refusal is not None:  # refused: the proxy answers, the server never sees the call
                await answer_json(self.writer, refusal, self.keep)
                return self._unmeasured(self.keep)
            self.body = body
            out.append(b"content-length: %d\r\n\r\n" % len(body))
            return await self._forward(b"".join(out), body, None)
        if length is not None or chunked:
            out.append(b"content-length: %d\r\n\r\n" % length if length is not None
                       else b"transfer-encoding: chunked\r\n\r\n")
            return await self._forward(b"".join(out), None, self._body())
        out.append(b"\r\n")  # GET, DELETE...: no body
        return await self._forward(b"".join(out), b"", None)

    def _origin(self) -> dict[str, Any]:
        """What a budget key may read besides the body: the request's headers, the client's address."""
        return http_origin(self.request.headers, self.writer.get_extra_info("peername"))

    def _unmeasured(self, keep: bool) -> bool:
        """The exchange ends: a request not measured by now never will be; a session-less tracker closes."""
        self._measure_request(False)
        if self.tracker is not None and self.session_id is None:
            self.measurer.close_tracker(self.tracker)
        return keep

    def _measure_request(self, accepted: bool) -> None:
        """Measure the request once the upstream accepted it (a 2xx head) or failed it (no answer: the call
        happened and failed); a request the upstream refused (413, 400, 415...) is not a call."""
        up, self.up = self.up, None
        if up is None:
            return
        if accepted:
            self.measured = True
            self.measurer.put(up, self.body, self.sent_at)
        elif self.streamed:  # pieces already handed over: marked lost, they are dropped, not measured
            up.lost = True
            self.measurer.put(up, b" ")
        self.measurer.finish(up, self.sent_at)

    async def _body(self) -> Any:
        """The request body's pieces as they arrive (chunked framing removed), within the body deadline: a
        client that dribbles its body is cut off (its connection closed) when the deadline passes."""
        wire = self.wire
        timer = asyncio.get_running_loop().call_later(self.relay.proxy.body_timeout, wire.transport.abort)
        try:
            while True:
                kind, value = await wire.next()
                if kind == DATA:
                    yield value
                elif kind == END:
                    return
                elif kind == ERROR:
                    raise value
                else:
                    raise ClientGone()
        finally:
            timer.cancel()

    async def _small_body(self) -> bytes | None:
        """The whole body; None when the client left, was cut off, or sent it malformed (answered 400)."""
        body = self.wire.ready_body()
        if body is not None:  # the usual case: it came with its head, no deadline to watch
            return body
        try:
            return b"".join([piece async for piece in self._body()])
        except (ClientGone, ConnectionError):
            return None
        except HttpError as exc:
            await refuse(self.writer, exc)
            return None

    def _guard_request(self, body: bytes) -> tuple[bytes | None, bytes]:
        """Context injection, then the request guards on a whole body: (the proxy's answer when refused,
        the body to send on)."""
        tracker, relay = self.tracker, self.relay
        if relay.injector is not None and tracker is not None and body:
            body = relay.injector.rewrite_body(tracker, body, self.request.get(b"baggage"))
        if relay.guard and self.up is not None and held_request(body):
            # What a guard may refuse (a tools/call), answer (a read of a kept result, a resources listing) or
            # change (the client's result to a server's request) is handled before it goes upstream, so it is
            # measured whatever the upstream answers; other requests are measured after the response head, as
            # without guards (an initialize's span then carries the session it created).
            forward, reply = self.measurer.message(self.up, body)
            self.up = None  # handled
            self.measured = True
            if reply is not None:
                return reply, body
            if forward is not None:
                body = forward
        return None, body

    async def _forward(self, head: bytes, body: bytes | None, source: Any) -> bool:
        """Send the request upstream and relay its response; True when the client connection goes on."""
        request, session_id = self.request, self.session_id
        conn: Conn | None = None
        reusable = response_started = False
        self.sent_at = time.time_ns()  # the call's span starts here, though measured once the upstream accepts
        try:
            try:
                conn, response, uwire = await self._send(head, body, source)
            except HttpError as exc:
                await refuse(self.writer, exc)
                return False
            except ClientGone:
                return False  # nobody to answer
            except UpstreamFailed as exc:
                logger.warning("mcp-token-otel proxy: upstream %s %s failed: %s", request.method.decode("latin-1"),
                               _path(request.target), exc)
                self._measure_request(True)  # the call happened, and failed
                self._failed(exc.error_type)
                await self._answer_failure(exc.error_type)
                return False
            self.relay.ready = True
            self._session(response)
            self._measure_request(200 <= response.status < 300)
            response_started = True
            reusable, completed = await self._respond(response, uwire)
            if session_id is not None and response.status == 404:
                self.relay.end_session(session_id)  # gone upstream: its budget closes
            return completed and self.keep
        except (UpstreamBroken, asyncio.IncompleteReadError, HttpError, ValueError) as exc:
            logger.warning("mcp-token-otel proxy: upstream response broken: %s", exc or type(exc).__name__)
            reusable = False
            self._failed(CLOSED_EARLY)
            if not response_started:
                await self._answer_failure(CLOSED_EARLY)
            return False
        except (OSError, asyncio.CancelledError):
            reusable = False
            raise
        finally:
            if source is not None:
                await source.aclose()  # its body deadline ends with it
            if conn is not None:
                if reusable:
                    self.relay.upstream.give_back(conn)
                else:
                    conn.writer.close()
            self._unmeasured(False)
            if session_id is not None and request.method == b"DELETE":
                self.relay.end_session(session_id)  # the client ended it, whatever the upstream answered (502)

    def _session(self, response: Head) -> None:
        """A response that created a session (``initialize``): this exchange's tracker becomes the session's."""
        new_session = response.get(b"mcp-session-id")
        tracker = self.tracker
        if tracker is not None and self.session_id is None and new_session:
            new_id = new_session.decode("latin-1")
            self.measurer.set_tracker(tracker, session_key=new_id, session_id=new_id)  # joins the session
            if self.relay.adopt(new_id, tracker):  # and goes on as it: the session ends once, at its end
                self.session_id = new_id

    def _failed(self, error_type: str) -> None:
        """The upstream failed a measured call: each of its requests gets an error of ``error_type`` (counted in
        the call errors), handed over as the answer the measuring side pairs with the request."""
        if not self.measured or self.tracker is None:
            return
        self.measured = False  # once
        ids, batch = request_ids(self.body)
        if not ids:
            return
        errors = [{"jsonrpc": "2.0", "id": i, "error": {"code": error_type, "message": _REASONS[error_type]}}
                  for i in ids]
        stream = self.measurer.stream(self.tracker, S2C, BODY)
        self.measurer.put(stream, dumps(errors if batch else errors[0]))
        self.measurer.finish(stream)

    async def _answer_failure(self, error_type: str) -> None:
        """What the client gets when the upstream never answered: 502 with a JSON-RPC error per request."""
        ids, batch = request_ids(self.body) if self.body else ([], False)
        error = {"code": GATEWAY_ERROR, "message": _REASONS[error_type]}
        errors = [{"jsonrpc": "2.0", "id": i, "error": error} for i in ids] or [
            {"jsonrpc": "2.0", "id": None, "error": error}]
        await answer_json(self.writer, dumps(errors if batch else errors[0]), False, b"502 Bad Gateway")

    async def _send(self, head: bytes, body: bytes | None, source: Any) -> tuple[Conn, Head, Wire]:
        """Send the request upstream and read the response head (1xx answers are skipped, not relayed). Sent
        once: a request the upstream may have received is never sent again (a tool would run twice)."""
        upstream = self.relay.upstream
        first = head + body if body is not None and len(body) <= CHUNK else head
        conn = upstream.take()  # an idle connection found closed is never used
        if conn is not None:
            conn.writer.write(first)
            if conn.writer.transport.is_closing():  # the write failed at once: not a byte left, safe to send anew
                conn.writer.close()
                conn = None
        if conn is None:
            try:
                conn = await upstream.connect()
            except (OSError, TimeoutError) as exc:
                raise UpstreamFailed(UNAVAILABLE, exc) from None
            conn.writer.write(first)
        uwriter = conn.writer
        try:
            await self._send_rest(uwriter, head, body, source)
            uwire = conn.response_wire()
            while True:
                kind, value = await uwire.next()
                if kind == HEAD and not (100 <= value.status < 200 and value.status != 101):
                    return conn, value, uwire
                if kind == ERROR:
                    raise UpstreamFailed(CLOSED_EARLY, f"bad response head: {value.reason}")
                if kind == CLOSED:
                    raise UpstreamFailed(CLOSED_EARLY, "closed before answering")
                # an interim answer (100 Continue...) and its end: not relayed
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
            uwriter.close()
            raise UpstreamFailed(CLOSED_EARLY, exc) from None
        except BaseException:
            uwriter.close()
            raise

    async def _send_rest(self, uwriter: asyncio.StreamWriter, head: bytes, body: bytes | None, source: Any) -> None:
        """After the first write (the head, with a small body): the rest of the body."""
        up, measurer, chunked = self.up, self.measurer, self.request.chunked
        if body is not None:
            if len(body) > CHUNK:
                uwriter.write(body)
        else:
            async for data in source:
                if up is not None:
                    measurer.put(up, data)
                    self.streamed = True
                uwriter.write(b"%x\r\n" % len(data) + data + b"\r\n" if chunked else data)
                await uwriter.drain()
            if chunked:
                uwriter.write(b"0\r\n\r\n")
        await _drained(uwriter)

    def _response_head(self, response: Head) -> tuple[list[bytes], bool]:
        """The response head towards the client, as lines; whether the response has no body."""
        status, rheaders = response.status, response.headers
        no_body = self.request.method == b"HEAD" or status in (204, 304)
        drop = hop_by_hop(response)
        rout = [b"HTTP/1.1 %d " % status + response.reason + b"\r\n"]
        rout += [n + b": " + v + b"\r\n" for lower, (n, v) in zip(response.names, rheaders, strict=True)
                 if lower not in drop]
        if not no_body and response.length is None and self.keep:
            rout.append(b"transfer-encoding: chunked\r\n")  # else: until close
        if not self.keep:
            rout.append(b"connection: close\r\n")
        rout.append(b"\r\n")
        return rout, no_body

    async def _respond(self, response: Head, uwire: Wire) -> tuple[bool, bool]:
        """Relay the response (its head is read); (upstream connection reusable, client connection usable)."""
        writer, rlength = self.writer, response.length
        rout, no_body = self._response_head(response)
        rhead = b"".join(rout)
        reusable = response.keep_alive and response.version == b"HTTP/1.1"
        if no_body or rlength == 0:
            writer.write(rhead)
            await writer.drain()
            return reusable, True
        channel = self._response_channel(response)
        body = Body(uwire, rlength is None and not response.chunked)
        if channel is not None and channel.holds_body and rlength is not None:
            # Guards on: a JSON body is held whole, guarded, then sent (re-serialised: its own length).
            whole = await body.whole()
            forward = channel.whole(whole)
            channel.finish()
            if forward is not whole:
                rhead = b"".join(line for line in rout[:-1] if not line.lower().startswith(b"content-length:")) \
                    + b"content-length: %d\r\n\r\n" % len(forward)
            writer.write(rhead + forward)
            await writer.drain()
            return reusable and uwire.spent, True
        if rlength is not None:
            await self._relay(rhead, body, channel, False)
            return reusable and uwire.spent, True
        # Streams (SSE...): relayed as they come while watching the client for a disconnect.
        completed = await self._relay(rhead, body, channel, True)
        return completed and reusable and response.chunked and uwire.spent, completed

    async def _relay(self, rhead: bytes, body: Body, channel: Channel | None, stream: bool) -> bool:
        """Relay a body as its bytes arrive: what was read goes on at once, in one write (the head with the
        first bytes, the last bytes with the end of a chunked stream). A stream (``stream``: no length) goes
        chunked towards a kept-alive client, else until close, and while it waits for the upstream, a client
        that goes away closes the upstream request. True when the body went through whole."""
        writer, hook = self.writer, self.wire.hook
        framed = stream and self.keep
        out = rhead
        finished = gone = False

        def check() -> None:  # the client sent, ended or lost its connection while we wait for the upstream
            nonlocal gone
            reader = self.wire.reader
            if not gone and (reader.at_eof() or reader.exception() is not None):
                gone = True
                body.wire.transport.abort()  # ends the wait below; the upstream connection is not reused

        try:
            while True:
                data = body.take()
                if channel is not None:
                    if data:  # with guards on, whole events go on once guarded
                        data = channel.feed(data)[0]
                    if body.ended:
                        finished = True
                        rest = channel.finish()[0]
                        data = data + rest if rest else data
                pieces = [out] if out and (data or stream or body.ended) else []  # a length's head waits for bytes
                if pieces:
                    out = b""
                if framed:
                    if data:
                        pieces += (b"%x\r\n" % len(data), data, b"\r\n")
                    if body.ended:
                        pieces.append(b"0\r\n\r\n")
                elif data:
                    pieces.append(data)
                if pieces:
                    writer.write(pieces[0] if len(pieces) == 1 else b"".join(pieces))  # one copy, one send
                    await _drained(writer)
                if body.ended:
                    return True
                if stream and hook is not None and hook.on_change is None:
                    hook.on_change = check
                    check()
                if not gone:
                    try:
                        await body.more()
                    except UpstreamBroken:
                        if not gone:
                            raise
                    if not gone:
                        continue
                logger.info("mcp-token-otel proxy: client went away mid-stream; upstream request closed")
                return False
        except (ConnectionError, OSError):  # writing to the client failed: it is gone
            if not stream:
                raise
            return False
        finally:
            if hook is not None:
                hook.on_change = None
            if channel is not None and not finished:
                channel.measurer.finish(channel.stream)

    def _response_channel(self, response: Head) -> Channel | None:
        """How a response body is measured (and guarded): JSON bodies and SSE streams, uncompressed; None: not."""
        if self.tracker is None or response.status in (401, 403):
            return None
        encoding = (response.get(b"content-encoding") or b"identity").lower()
        if encoding != b"identity":
            return None  # relayed as is; compressed bodies are not measured
        ctype = (response.get(b"content-type") or b"").split(b";")[0].strip().lower()
        measurer = self.measurer
        if ctype == b"text/event-stream":
            return Channel(measurer, self.tracker, S2C, SSE)
        if ctype == b"application/json":
            # Guards on, a body known to be too large to hold is measured as it passes, never held.
            large = self.relay.guard and response.length is not None and response.length > measurer.max_message
            return Channel(measurer, self.tracker, S2C, BODY, guard=not large)
        return None


async def _drained(writer: asyncio.StreamWriter) -> None:
    """``writer.drain()`` when it has anything to do: what was written is still buffered (the peer is slower:
    wait, backpressure) or the connection is lost (it raises); a write the socket took whole needs neither."""
    transport = writer.transport
    if transport.get_write_buffer_size() or transport.is_closing():
        await writer.drain()


_REASONS = {UNAVAILABLE: "upstream unavailable", CLOSED_EARLY: "upstream closed the connection before answering"}


def _path(target: bytes) -> str:
    """A request target for a log line: its path (a query may carry credentials)."""
    return target.split(b"?", 1)[0].decode("latin-1")
