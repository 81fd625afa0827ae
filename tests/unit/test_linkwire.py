"""The Link over TCP's framing (luftpause.linkwire): frames survive any split of the
byte stream, and a length the protocol cannot mean is refused."""

from __future__ import annotations

import itertools
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from luftpause.linkwire import FrameError, FrameReader, frame, tune


@given(
    messages=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
)
def test_frames_come_out_whole_and_in_order_however_the_bytes_arrive(
    messages: list[bytes], cuts: list[int]
) -> None:
    """D4 (the Link's carriage): whatever chunks TCP delivers, each message comes out
    once, whole, in order, and nothing is left over at the end."""
    stream = b"".join(frame(m) for m in messages)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    reader = FrameReader()
    out: list[bytes] = []
    for a, b in itertools.pairwise(points):
        out += reader.feed(stream[a:b])
    assert out == messages
    assert reader.pending == 0


def test_a_partial_frame_waits_for_the_rest() -> None:
    reader = FrameReader()
    data = frame(b"hello")
    assert reader.feed(data[:3]) == []
    assert reader.feed(data[3:7]) == []
    assert reader.pending == 7
    assert reader.feed(data[7:] + frame(b"")) == [b"hello", b""]


def test_an_oversized_length_is_refused_naming_it() -> None:
    """A peer that is not speaking this protocol (or a corrupt stream) is not buffered
    without bound: the announced length is refused."""
    reader = FrameReader(max_frame=1024)
    with pytest.raises(FrameError, match="2000 bytes"):
        reader.feed((2000).to_bytes(4, "big") + b"x")
    with pytest.raises(FrameError, match="exceeds"):
        frame(b"x" * (64 * 1024 * 1024 + 1))


def test_a_link_socket_gets_no_delay_keepalive_and_a_user_timeout() -> None:
    """Both ends of the Link over TCP: frames go out at once, and a vanished peer is
    found within about 20 s whether the connection is idle (keepalive) or has data
    unacknowledged (user timeout)."""
    with socket.socket() as sock:
        tune(sock)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 20_000
    tune(None)  # a transport without a socket: nothing to set
