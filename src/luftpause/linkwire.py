"""Framing of the Link over plain TCP (see ``LinkHello`` in scheduler.proto), sans I/O.

A frame is a 4-byte big-endian length and that many bytes of one protobuf message.
``frame`` writes one; a ``FrameReader`` is fed whatever the socket delivered and
returns the whole frames in it, keeping a partial one for the next feed. Both the
scheduler and the dataplane use this module and nothing else of each other's.

Also the TCP options both ends set on the connection: no Nagle delay (a frame is
written whole, and the peer is waiting for it), keepalive probes and a user timeout,
so that a peer whose host vanished without closing is noticed within about 20 s,
idle or not, as the gRPC channel's HTTP/2 pings notice it.
"""

from __future__ import annotations

import socket

LENGTH_BYTES = 4
MAX_FRAME = 64 * 1024 * 1024  # a resync-sized message is far below this
# Keepalive probes find a silent peer on an idle connection; TCP_USER_TIMEOUT (ms) ends
# one whose sent data stays unacknowledged that long (else retransmission goes on for
# many minutes), so a vanished peer is found within about 20 s either way.
_KEEPALIVE = (
    ("TCP_KEEPIDLE", 10),
    ("TCP_KEEPINTVL", 5),
    ("TCP_KEEPCNT", 2),
    ("TCP_USER_TIMEOUT", 20_000),
)


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def frame(message: bytes) -> bytes:
    if len(message) > MAX_FRAME:
        raise FrameError(f"a message of {len(message)} bytes exceeds {MAX_FRAME}")
    return len(message).to_bytes(LENGTH_BYTES, "big") + message


class FrameReader:
    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The whole frames completed by ``data``, in order; raises ``FrameError`` on a
        length over ``max_frame`` (the stream cannot be trusted past it)."""
        self._buffer += data
        frames: list[bytes] = []
        start = 0
        buffer = self._buffer
        while len(buffer) - start >= LENGTH_BYTES:
            size = int.from_bytes(buffer[start : start + LENGTH_BYTES], "big")
            if size > self.max_frame:
                raise FrameError(f"frame of {size} bytes announced, over {self.max_frame}")
            end = start + LENGTH_BYTES + size
            if len(buffer) < end:
                break
            frames.append(bytes(buffer[start + LENGTH_BYTES : end]))
            start = end
        if start:
            del buffer[:start]
        return frames

    @property
    def pending(self) -> int:
        """Bytes received that do not yet make a whole frame."""
        return len(self._buffer)


def tune(sock: socket.socket | None) -> None:
    """TCP_NODELAY and keepalive on a Link connection (where the platform has them)."""
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE:
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
