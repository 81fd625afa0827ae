"""The dataplane's end of the Link over plain TCP (see ``LinkHello`` in scheduler.proto).

``TcpLinkCall.open`` connects to the port the scheduler advertised on resync, says
hello (this dataplane's ID and token) and waits for the welcome. Then
``write_nowait`` sends a ``LinkUp`` frame at once, from the caller (no writer task
in between: an admission request is on its turn's path). Frames written after it in
the same pass of the event loop (a burst of turns arriving together, reports of
turns ending together) are joined and sent in one write at the end of that pass:
one send instead of one per frame, where sends were the dataplane's largest cost
per turn under load. ``write`` and
``done_writing`` (a half-close: the stream is over, as ending the rpc's requests)
are awaitable as the rpc call's are, so the link's one writer serves both. Every
``LinkDown`` frame is handed to ``on_down`` from the protocol's callback, which
resolves the waiting admissions directly. ``wait_closed`` returns when the
scheduler has closed its side, and raises ``LinkBroken`` if the connection failed
instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.dataplane import link_codec
from luftpause.linkwire import FrameError, FrameReader, frame, tune

CONNECT_TIMEOUT_S = 2.0


class LinkRefused(Exception):
    """The scheduler refused this dataplane's token on the Link."""


class LinkBroken(Exception):
    """The Link connection failed (reset, or a frame that does not parse)."""


class _Protocol(asyncio.Protocol):
    def __init__(self, on_down: Callable[[pb.LinkDown], None]) -> None:
        loop = asyncio.get_running_loop()
        self.on_down = on_down
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.welcome: asyncio.Future[pb.LinkWelcome] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        self.transport = cast(asyncio.Transport, transport)
        tune(self.transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        try:
            for message in self.reader.feed(data):
                if not self.welcome.done():
                    self.welcome.set_result(link_codec.welcome(message))
                else:
                    self.on_down(link_codec.link_down(message))
        except (FrameError, DecodeError) as exc:
            self._fail(LinkBroken(f"the scheduler sent what is not a Link frame ({exc})"))

    def eof_received(self) -> bool:
        return False  # the scheduler ended the stream: close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        broken = LinkBroken(f"connection lost ({exc})" if exc else "connection closed")
        if not self.welcome.done():
            self.welcome.set_exception(broken)
        if not self.closed.done():
            if exc is None:
                self.closed.set_result(None)
            else:
                self.closed.set_exception(broken)

    def _fail(self, exc: LinkBroken) -> None:
        if not self.closed.done():
            self.closed.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()


class TcpLinkCall:
    def __init__(self, protocol: _Protocol, transport: asyncio.Transport, where: str) -> None:
        self._protocol = protocol
        self._transport = transport
        self.where = where
        # None: nothing sent in this pass of the loop; a list: frames waiting for its end
        self._pending: list[bytes] | None = None

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        dataplane_id: str,
        authorization: str,
        on_down: Callable[[pb.LinkDown], None],
        timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> TcpLinkCall:
        """Connect, say hello and wait for the welcome; raises ``OSError`` or
        ``TimeoutError`` (unreachable), ``LinkBroken`` or ``LinkRefused``."""
        loop = asyncio.get_running_loop()
        transport, protocol = await asyncio.wait_for(
            loop.create_connection(lambda: _Protocol(on_down), host, port), timeout_s
        )
        hello = link_codec.hello(dataplane_id, authorization)
        transport.write(frame(hello.SerializeToString()))
        try:
            welcome = await asyncio.wait_for(asyncio.shield(protocol.welcome), timeout_s)
        except BaseException:
            transport.abort()
            raise
        if welcome.refused:
            transport.abort()
            raise LinkRefused(welcome.message)
        return cls(protocol, transport, f"{host}:{port}")

    def write_nowait(self, up: pb.LinkUp) -> None:
        """Send a LinkUp frame: now if it is the first of this pass of the event loop,
        else with the others at the pass's end (the order kept)."""
        if self._transport.is_closing():
            return
        data = frame(up.SerializeToString())
        if self._pending is None:
            loop = asyncio.get_running_loop()
            self._transport.write(data)
            self._pending = []
            loop.call_soon(self._flush)
        else:
            self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(b"".join(pending))

    async def write(self, up: pb.LinkUp) -> None:
        """As the rpc call's ``write``, so one writer serves both."""
        self.write_nowait(up)

    async def done_writing(self) -> None:
        """As the rpc call's ``done_writing``: half-close, the stream is over."""
        self._flush()
        if not self._transport.is_closing() and self._transport.can_write_eof():
            self._transport.write_eof()

    def done(self) -> bool:
        return self._protocol.closed.done()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._protocol.closed)

    def close(self) -> None:
        self._flush()  # what was written goes out before the close
        self._transport.close()
