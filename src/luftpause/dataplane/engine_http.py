"""The dataplane's HTTP/1.1 client towards engines.

Every admitted turn is one ``POST`` to an engine, most of them streamed. This client
does that and nothing else, at a fraction of a general client's cost per request (see
docs/benchmarks/history.md, "Dataplane overhead"): the request goes out as one write of
bytes built in one pass, the response is parsed by ``httptools`` (the parser uvicorn serves
with) straight into a list of body pieces, and connections are kept per engine and reused.

- ``EngineClient.post`` connects (or reuses an idle connection), writes the request
  and returns an ``EngineResponse`` once the status line and headers have arrived.
  Only the connect has a timeout (``connect_timeout_s``): a reply may take as long as
  the engine takes.
- ``EngineResponse.chunks()`` yields the body as it arrives, each time everything
  received so far (chunked transfer coding removed); ``read()`` returns all of it.
  When more than ``_PAUSE_AT`` bytes wait unread, the client stops reading from the
  socket until they are taken, so a slow client slows the engine instead of filling
  our memory.
- ``release()`` puts a connection whose response was read to the end back among the
  idle ones; ``close()`` closes it (an engine notices and stops generating).
- A request on a reused connection that the engine had closed meanwhile (the close
  crossed the request: it came within ``_CROSSED_S`` of the write, before any byte
  of a reply) is sent once more on a new connection. A close later than that may
  come after the engine began the work (a non-streamed reply sends nothing until it
  is done), so it is raised like any other failure, as one of ``ENGINE_ERRORS``:
  a turn is never sent to an engine twice for that.
- ``ConnectFailed`` and ``ConnectTimeout`` (``NOT_SENT``) say that the engine never
  received the request: no connection was made for it, so not a byte of it was
  written. (One that follows a crossed close is the same: the engine had closed
  that connection before the request reached it, which is why it may be sent once
  more.) Every other failure may come after the engine read the request.

Only ``http`` and ``https`` URLs; no proxies, redirects, cookies or decompression (the
dataplane asks engines for ``accept-encoding: identity`` and passes bytes through).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import socket
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

# Unread body bytes at which the socket stops being read (until they are taken).
_PAUSE_AT = 1 << 20
# A close this soon after a request on a kept connection crossed it (see above).
_CROSSED_S = 0.25


class EngineHttpError(Exception):
    """An engine request failed; the subclass says how."""


class ConnectFailed(EngineHttpError):
    """No connection: ``os_error`` says why (refused, unreachable, no such host...)."""

    def __init__(self, host: str, port: int, os_error: OSError) -> None:
        self.os_error = os_error
        reason = os_error.strerror or str(os_error) or type(os_error).__name__
        super().__init__(f"cannot connect to {host}:{port}: {reason}")

    @property
    def unreachable(self) -> bool:
        """The engine cannot be reached, as opposed to this machine being out of
        something (open files, local ports, buffer space): only the first says the
        replica is down."""
        if isinstance(self.os_error, socket.gaierror):
            return True
        return self.os_error.errno in _UNREACHABLE_ERRNOS


class ConnectTimeout(EngineHttpError, TimeoutError):
    """The connection was not made within the connect timeout."""


class Disconnected(EngineHttpError):
    """The engine closed the connection before its reply ended."""


class BadResponse(EngineHttpError):
    """The engine's bytes are not an HTTP/1.1 response."""


ENGINE_ERRORS = (EngineHttpError, OSError)
# Failures after which the engine cannot have received the request (module docstring).
NOT_SENT = (ConnectFailed, ConnectTimeout)

# Connect errors that say the engine cannot be reached.
_UNREACHABLE_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT}
)


class EngineResponse:
    """An engine's reply: ``status`` and ``headers`` (names in lower case, repeated
    headers joined with ", ") are there; the body is read with ``chunks()`` or
    ``read()``; then ``release()`` or ``close()``."""

    __slots__ = (
        "_conn",
        "_done",
        "_error",
        "_pieces",
        "_unread",
        "_waiter",
        "ended_at",
        "headers",
        "sent_at",
        "status",
    )

    def __init__(self, conn: _Connection, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers
        # ``time.monotonic()`` when the request was written, and when the reply's last
        # byte was parsed (0.0 while it has not: its body is still coming, or broke off).
        self.sent_at = conn.sent_at
        self.ended_at = 0.0
        self._conn: _Connection | None = conn
        self._pieces: list[bytes] = []
        self._unread = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def at_eof(self) -> bool:
        """The whole body has arrived and been read."""
        return self._done and not self._pieces

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises one of ``ENGINE_ERRORS`` if the engine stops
        before its end."""
        while True:
            if self._pieces:
                yield self._take()
                continue
            if self._error is not None:
                raise self._error
            if self._done:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read(self) -> bytes:
        parts = [piece async for piece in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Done with the response: its connection is kept for another request if the
        body was read to the end and the engine keeps it open, else closed."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.at_eof() and self._error is None:
            conn.finished()
        else:
            conn.close()

    def close(self) -> None:
        """Done with the response, read or not: its connection is closed."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _take(self) -> bytes:
        pieces = self._pieces
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        self._unread = 0
        if self._conn is not None:
            self._conn.resume()
        return data

    # Called by the connection.
    def _feed(self, data: bytes) -> None:
        self._pieces.append(data)
        self._unread += len(data)
        if self._unread >= _PAUSE_AT and self._conn is not None:
            self._conn.pause()
        self._wake()

    def _end(self, error: BaseException | None) -> None:
        if not self._done and self._error is None:
            if error is None:
                self._done = True
                self.ended_at = time.monotonic()
            else:
                self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One connection to an engine, carrying one request at a time."""

    def __init__(self, pool: EngineClient, key: _Key) -> None:
        self._pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self.idle_since = 0.0
        self.got_bytes = False  # a byte of the current reply has arrived
        self.sent_at = 0.0  # when the current request was written
        self.lost_at = 0.0  # when the connection closed
        self._parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[EngineResponse] | None = None
        self._response: EngineResponse | None = None
        self._headers: dict[str, str] = {}
        self._paused = False
        self._eof_ends_body = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._head is None and self._response is None:
            self.close()  # bytes nobody asked for: this connection cannot be trusted
            return
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"the engine's reply is not HTTP/1.1: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self.lost_at = time.monotonic()
        self._pool._forget(self)
        response = self._response
        if response is not None and self._eof_ends_body and self._head is None and exc is None:
            response._end(None)  # a body delimited by the (orderly) end of the connection
        reason = f" ({exc})" if exc else ""
        self._fail(Disconnected(f"the engine closed the connection before its reply ended{reason}"))

    def pause_writing(self) -> None:  # the request is in memory already
        pass

    def resume_writing(self) -> None:
        pass

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self._response is not None:
            return  # a chunked body's trailer: not headers of this reply, nor of the next
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim reply: the real one follows
            self._headers = {}
            return
        if self._head is None:
            # A reply to no request of ours: nothing this connection reads can be
            # trusted to belong to a request any more.
            self._fail(BadResponse("the engine sent a reply nobody asked for"))
            self._response = None  # its body, parsed on from here, goes nowhere
            self.close()
            return
        self.reusable = bool(self._parser.should_keep_alive())
        headers, self._headers = self._headers, {}
        self._eof_ends_body = "content-length" not in headers and "chunked" not in headers.get(
            "transfer-encoding", ""
        )
        response = self._response = EngineResponse(self, status, headers)
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_result(response)

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        if self._response is not None and self._head is None:
            self._response._end(None)

    # for the client and the response
    def send(self, data: bytes, body: bytes) -> asyncio.Future[EngineResponse]:
        assert self.transport is not None
        self.got_bytes = False
        self.sent_at = time.monotonic()
        self._response = None
        self._headers = {}
        self._head = asyncio.get_running_loop().create_future()
        if len(body) <= 65536:
            self.transport.write(data + body)
        else:
            self.transport.write(data)
            self.transport.write(body)
        return self._head

    def finished(self) -> None:
        """The reply was read to its end: back to the pool, or closed."""
        self._response = None
        if self.reusable and not self.closed and not self._paused:
            self._pool._put(self)
        else:
            self.close()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.close()

    def pause(self) -> None:
        if not self._paused and self.transport is not None and not self.closed:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def _fail(self, error: EngineHttpError) -> None:
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_exception(error)
        if self._response is not None:
            self._response._end(error)


_Key = tuple[str, str, int]  # scheme, host, port


class _Target:
    """What a URL means to a request, worked out once per URL."""

    __slots__ = ("host", "host_header", "key", "port", "ssl", "start")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"engine URL {url!r}: only http:// and https:// are served")
        if not parts.hostname:
            raise ValueError(f"engine URL {url!r} has no host")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = parts.scheme == "https"
        self.key: _Key = (parts.scheme, self.host, self.port)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        host_header = parts.netloc.rpartition("@")[2]
        self.start = f"POST {target} HTTP/1.1\r\nhost: {host_header}\r\n".encode("latin-1")


class EngineClient:
    """Requests to engines over kept-alive HTTP/1.1 connections (module docstring).

    ``idle_s``: how long an unused connection is kept. ``ssl_context``: for ``https``
    engines (default: the system's certificate authorities, host names checked)."""

    def __init__(
        self,
        connect_timeout_s: float,
        *,
        idle_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.idle_s = idle_s
        self._idle: dict[_Key, collections.deque[_Connection]] = {}
        self._targets: dict[str, _Target] = {}
        self._all: set[_Connection] = set()
        self._ssl = ssl_context
        self._closed = False

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> EngineResponse:
        """POST ``body`` to ``url`` with ``headers`` (``host`` and ``content-length``
        are set here): the response, its body still to come."""
        if self._closed:
            raise RuntimeError("the engine client is closed")
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _Target(url)
        lines = [target.start]
        for name, value in headers.items():
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))
        lines.append(b"content-length: %d\r\n\r\n" % len(body))
        head = b"".join(lines)
        breaks = len(lines) + 2  # one per line, the start's two and the empty line's
        if head.count(b"\n") != breaks or head.count(b"\r") != breaks:
            raise ValueError("a header name or value holds a line break")
        conn = self._reuse(target.key)
        if conn is not None:
            try:
                return await self._exchange(conn, head, body)
            except Disconnected:
                if conn.got_bytes or conn.lost_at - conn.sent_at > _CROSSED_S:
                    raise
                # The engine closed the idle connection as the request went out.
        conn = await self._connect(target)
        return await self._exchange(conn, head, body)

    async def close(self) -> None:
        """Close every connection, in use or idle."""
        self._closed = True
        for conn in list(self._all):
            conn.close()
        self._idle.clear()

    async def _exchange(self, conn: _Connection, head: bytes, body: bytes) -> EngineResponse:
        try:
            return await conn.send(head, body)
        except BaseException:
            conn.close()  # cancelled or failed before the reply: never reused
            raise

    def _reuse(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used
            if not conn.closed and now - conn.idle_since < self.idle_s:
                return conn
            conn.close()
        return None

    def _put(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(conn.key, collections.deque())
        while idle and (idle[0].closed or conn.idle_since - idle[0].idle_since >= self.idle_s):
            idle.popleft().close()
        idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._all.discard(conn)

    async def _connect(self, target: _Target) -> _Connection:
        if self._closed:
            raise RuntimeError("the engine client is closed")
        loop = asyncio.get_running_loop()
        conn = _Connection(self, target.key)
        context = None
        if target.ssl:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await loop.create_connection(lambda: conn, target.host, target.port, ssl=context)
        except TimeoutError:
            raise ConnectTimeout(
                f"no connection to {target.host}:{target.port} within {self.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise ConnectFailed(target.host, target.port, exc) from None
        self._all.add(conn)
        return conn
