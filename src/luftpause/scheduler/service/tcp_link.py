"""The Link over plain TCP: the dataplane's admission round trip without HTTP/2.

Every turn waits for one admission answer, so the Link's round trip is on every
turn's path. Over gRPC it costs about 0.3 ms between two Python processes on
loopback before any of our code runs; framed protobuf on a TCP connection read
by an ``asyncio.Protocol`` costs about a sixth of that. The messages and their
meaning are the Link rpc's (see ``LinkHello`` in scheduler.proto); only the
carriage differs:

* the dataplane learns the port from ``ResyncResponse.link_port`` and connects to
  the host it reached the scheduler at; its first frame is a ``LinkHello`` (its
  ID and, with ``LUFTPAUSE_TOKEN``, the token), answered by a ``LinkWelcome``;
* a wrong token is refused in the welcome and the connection closed;
* a connection must earn its file descriptor: one whose whole hello has not arrived
  within ``hello_timeout_s`` (``scheduler.link_hello_timeout_s``; a partial hello
  counts as none) is closed, and while ``max_unauthenticated`` connections
  (``scheduler.link_max_unauthenticated``) wait for their welcome a new one is closed
  at once, logged at most once per ``REFUSAL_LOG_EVERY_S``. Welcomed dataplanes are
  never counted nor timed; a dataplane closed so uses the Link rpc instead, as when
  the port cannot be reached. A hello over ``HELLO_MAX_BYTES`` ends the connection
  too, so that the waiting connections cannot make the scheduler buffer much either;
* each ``LinkUp`` frame is applied at once, from the protocol's callback, and
  answers decided in one pass of the event loop go out in one ``LinkDown`` frame;
* the dataplane half-closing, or the connection closing, ends the stream: held
  turns are abandoned, and the dataplane's turns are released after the grace
  unless it comes back (S11), as when the Link rpc ends.

Nothing here decides anything: ``LinkSession`` (link_session.py) does what the rpc
does with each message.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import cast

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.auth import REFUSED, bearer_ok
from luftpause.linkwire import FrameError, FrameReader, frame, tune
from luftpause.scheduler.service.link_session import LinkSession, Servicer

log = logging.getLogger("luftpause.scheduler.link")

# A LinkHello is a dataplane ID and a bearer token: far below this. Until the welcome,
# more than this received without a whole hello ends the connection.
HELLO_MAX_BYTES = 64 * 1024
# Connections refused over the limit are logged at most once per this many seconds
# (the line counts those refused since the last one).
REFUSAL_LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class LinkLimits:
    """What a connection that has not been welcomed may hold (the defaults are
    ``scheduler.link_hello_timeout_s`` and ``scheduler.link_max_unauthenticated``)."""

    hello_timeout_s: float = 5.0  # a whole, welcomed hello within this, or closed
    max_unauthenticated: int = 64  # connections waiting for their welcome, at most


DEFAULT_LIMITS = LinkLimits()


class _LinkProtocol(asyncio.Protocol):
    def __init__(self, link: TcpLink) -> None:
        self.link = link
        self.servicer = link.servicer
        self.token = link.token
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.session: LinkSession | None = None
        self.dataplane_id = ""
        self._answers: list[pb.AdmitAnswer] = []
        self._deciding = False  # inside data_received's drain: it flushes the answers
        self._closed = False
        self._hello_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        self.transport = cast(asyncio.Transport, transport)
        link = self.link
        if len(link.unauthenticated) >= link.limits.max_unauthenticated:
            link.refused_over_limit(self._peer())
            self._closed = True  # never counted, nothing to end
            self.transport.abort()
            return
        link.connections.add(self)
        link.unauthenticated.add(self)
        self._hello_timer = asyncio.get_running_loop().call_later(
            link.limits.hello_timeout_s, self._hello_late
        )
        tune(self.transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            frames = self.reader.feed(data)
        except FrameError as exc:
            self._drop(f"not a Link frame ({exc})")
            return
        for message in frames:
            if self._closed:
                return
            try:
                if self.session is None:
                    if len(message) > HELLO_MAX_BYTES:
                        self._drop(f"a hello of {len(message)} bytes, over {HELLO_MAX_BYTES}")
                        return
                    self._hello(pb.LinkHello.FromString(message))
                else:
                    self.session.up(pb.LinkUp.FromString(message))
            except DecodeError as exc:
                self._drop(f"a frame did not parse ({exc})")
                return
        if self.session is None and self.reader.pending > HELLO_MAX_BYTES:
            self._drop(f"over {HELLO_MAX_BYTES} bytes received and no whole hello")
            return
        if frames and self.session is not None:
            # Decide now what these frames asked, and answer in this callback: an
            # admission waits for nothing else on the event loop.
            self._deciding = True
            try:
                self.servicer.host.drain()
            finally:
                self._deciding = False
            self._flush()

    def eof_received(self) -> bool:
        # The dataplane half-closed: the stream is over. Answers decided so far go out
        # first (closing the transport writes what it buffered).
        self._flush()
        self._end()
        return False  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.connections.discard(self)
        self._end()

    # ------------------------------------------------------------- protocol

    def _hello_late(self) -> None:
        self._hello_timer = None
        received = self.reader.pending
        self._drop(
            f"no hello within {self.link.limits.hello_timeout_s:g} s"
            + (f" ({received} bytes of one received)" if received else "")
        )

    def _hello(self, hello: pb.LinkHello) -> None:
        if self.token is not None and not bearer_ok(hello.authorization or None, self.token):
            log.warning("refused a Link connection from %s: %s", self._peer(), REFUSED)
            self._write(pb.LinkWelcome(refused=True, message=f"the scheduler refused: {REFUSED}"))
            self._close()
            return
        self._welcomed()
        self.dataplane_id = hello.dataplane_id
        self.servicer.stream_opened(self.dataplane_id)
        self.session = LinkSession(self.servicer, self._send, self._fail)
        self._write(pb.LinkWelcome())

    def _send(self, answer: pb.AdmitAnswer) -> None:
        # Answers decided in one pass of the loop share a frame (the writer often
        # admits several turns at once, e.g. when a slot frees up for held ones).
        if not self._answers and not self._deciding:  # else data_received flushes
            asyncio.get_running_loop().call_soon(self._flush)
        self._answers.append(answer)

    def _flush(self) -> None:
        if self._answers and not self._closed:
            answers, self._answers = self._answers, []
            self._write(pb.LinkDown(answers=answers))

    def _fail(self) -> None:
        self._flush()
        self._close()

    def _write(self, message: pb.LinkDown | pb.LinkWelcome) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(message.SerializeToString()))

    def _drop(self, why: str) -> None:
        log.warning("closing a Link connection from %s: %s", self._peer(), why)
        self._close()

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"

    def _close(self) -> None:
        self._end()
        if self.transport is not None:
            self.transport.close()

    def _welcomed(self) -> None:
        """No longer waiting for a hello: not timed, not counted against the limit."""
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        self.link.unauthenticated.discard(self)

    def _end(self) -> None:
        """Once: abandon what still waits, and say the stream ended (S11)."""
        if self._closed:
            return
        self._closed = True
        self._welcomed()
        self._answers.clear()
        if self.session is not None:
            self.session.close()
            self.session = None
            self.servicer.stream_closed(self.dataplane_id)


class TcpLink:
    """The listener of the Link over TCP and its open connections."""

    def __init__(
        self, servicer: Servicer, token: str | None, limits: LinkLimits = DEFAULT_LIMITS
    ) -> None:
        self.servicer = servicer
        self.token = token
        self.limits = limits
        self.connections: set[_LinkProtocol] = set()  # open ones, closed when it stops
        self.unauthenticated: set[_LinkProtocol] = set()  # of those, the not yet welcomed
        self.server: asyncio.Server | None = None
        self.port = 0
        self._refused = 0  # over the limit since the last line logged about it
        self._refusal_logged_at: float | None = None

    def refused_over_limit(self, peer: str) -> None:
        """Log a connection closed over the limit: the first at once, then at most one
        line per ``REFUSAL_LOG_EVERY_S`` counting those since (a flood, one line)."""
        self._refused += 1
        now = asyncio.get_running_loop().time()
        last = self._refusal_logged_at
        if last is not None and now - last < REFUSAL_LOG_EVERY_S:
            return
        others = self._refused - 1
        self._refused = 0
        self._refusal_logged_at = now
        log.warning(
            "closed a Link connection from %s at once: %d connections already wait for "
            "their hello (scheduler.link_max_unauthenticated)%s",
            peer,
            len(self.unauthenticated),
            f"; {others} more closed so since the last such line" if others else "",
        )

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 picks a free port); return the port."""
        loop = asyncio.get_running_loop()
        try:
            self.server = await loop.create_server(
                lambda: _LinkProtocol(self),
                host,
                port,
                reuse_address=True,
            )
        except OSError as exc:
            raise SystemExit(f"cannot listen on {host}:{port} for the Link: {exc}") from None
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    def close(self) -> None:
        """Stop listening and end every open Link (each dataplane reconnects and resyncs
        with whoever listens next, as when a gRPC server stops)."""
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections):
            connection._close()
