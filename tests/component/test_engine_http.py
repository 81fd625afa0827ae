"""The dataplane's HTTP/1.1 client towards engines (``dataplane/engine_http.py``),
against a raw socket server that writes exactly the bytes each test needs: kept-alive
connections, both body framings, streaming as bytes arrive, a stale kept connection,
engines failing at each step (D6), and a slow reader slowing the engine."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trustme
import uvloop

from luftpause.dataplane import engine_http
from luftpause.dataplane.engine_http import (
    BadResponse,
    ConnectFailed,
    ConnectTimeout,
    Disconnected,
    EngineClient,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.writers.add(writer)
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.tasks.discard(task)
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """One request read off the connection (head and a Content-Length body)."""
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return head + body

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()  # every handler's next read or write ends it
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 10)


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[RawServer, str, EngineClient]]:
    server = RawServer(handler)
    url = await server.start()
    client = EngineClient(2.0)
    try:
        yield server, url, client
    finally:
        await client.close()
        await server.stop()


def sized(body: bytes, *, status: str = "200 OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_a_kept_connection_serves_the_next_request() -> None:
    """D1: Two requests, one connection; the request carries host, the headers given and
    the body's length."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.request(reader)
            writer.write(sized(b'{"ok": true}', extra="x-one: a\r\nX-One: b\r\n"))

    async with serving(handler) as (server, url, client):
        for _ in range(2):
            response = await client.post(f"{url}/v1/chat/completions", b'{"a": 1}', {"x-k": "v"})
            assert response.status == 200
            assert response.headers["content-type"] == "application/json"
            assert response.headers["x-one"] == "a, b"  # repeated headers joined
            assert await response.read() == b'{"ok": true}'
            assert response.at_eof()
            response.release()
        assert server.connections == 1
        first = server.requests[0]
        assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        port = url.rsplit(":", 1)[1]
        assert f"host: 127.0.0.1:{port}\r\n".encode() in first
        assert b"x-k: v\r\n" in first and b"content-length: 8\r\n" in first
        assert first.endswith(b'\r\n\r\n{"a": 1}')


async def test_a_chunked_stream_arrives_piece_by_piece() -> None:
    """D1: Each piece is handed on as it arrives, before the engine has sent the next; the
    chunk framing is taken off."""
    sent_second = asyncio.Event()
    go_on = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n")
        )
        await go_on.wait()
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        sent_second.set()
        await reader.read()

    async with serving(handler) as (server, url, client):
        response = await client.post(f"{url}/s", b"{}", {})
        pieces = response.chunks()
        assert await anext(pieces) == b"data: 1\n\n"
        assert not sent_second.is_set()
        go_on.set()
        assert [p async for p in pieces] == [b"data: [DONE]\n\n"]
        assert response.at_eof()
        response.release()


async def test_an_idle_connection_the_engine_closed_is_replaced_unseen() -> None:
    """D1: The engine closes a kept connection after its answer (as servers do after
    their keep-alive time): the next request goes out on a new connection."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(sized(b"{}"))
        await writer.drain()
        # and close, though the reply said nothing of it

    async with serving(handler) as (server, url, client):
        for _ in range(3):
            response = await client.post(f"{url}/x", b"{}", {})
            assert await response.read() == b"{}"
            response.release()
            await asyncio.sleep(0.05)  # the close arrives while the connection is idle
        assert server.connections == 3


async def test_a_close_that_crosses_the_request_is_retried_once_on_a_new_connection() -> None:
    """D1: The engine closes a kept connection just as the next request goes out (no byte of
    a reply came back): that request is sent again on a new connection."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(sized(b"{}"))
        await writer.drain()
        if server.connections == 1:
            await reader.readuntil(b"\r\n\r\n")  # the second request: dropped unanswered
            return
        while True:
            await server.request(reader)
            writer.write(sized(b"{}"))

    async with serving(handler) as (server, url, client):
        for _ in range(2):
            response = await client.post(f"{url}/x", b"{}", {})
            assert await response.read() == b"{}"
            response.release()
        assert server.connections == 2


async def test_an_engine_that_stops_mid_reply_is_an_error_not_an_end() -> None:
    """D6: a stream cut before its end raises, for the relay to report the turn failed;
    the connection is not kept."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n")
        )
        await writer.drain()

    async with serving(handler) as (server, url, client):
        response = await client.post(f"{url}/x", b"{}", {})
        got = []
        with pytest.raises(Disconnected):
            async for piece in response.chunks():
                got.append(piece)
        assert got == [b"data: 1\n\n"] and not response.at_eof()
        response.release()
        response = await client.post(f"{url}/x", b"{}", {})
        response.close()
        assert server.connections == 2


async def test_a_reply_that_is_not_http_is_a_bad_response() -> None:
    """D6: bytes that are not an HTTP/1.1 reply fail the request (a 502 for the client)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await reader.read()

    async with serving(handler) as (server, url, client):
        with pytest.raises(BadResponse, match=r"not HTTP/1\.1"):
            await client.post(f"{url}/x", b"{}", {})


async def test_an_engine_that_closes_before_answering_is_disconnected() -> None:
    """D6: an engine that closes without a reply fails the request (a 502 for the client)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)

    async with serving(handler) as (server, url, client):
        with pytest.raises(Disconnected):
            await client.post(f"{url}/x", b"{}", {})


async def test_a_body_that_ends_with_the_connection_is_complete() -> None:
    """D1: A reply with neither a length nor chunks ends where the connection does."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async with serving(handler) as (server, url, client):
        response = await client.post(f"{url}/x", b"{}", {})
        assert await response.read() == b"all of it"
        assert response.at_eof()
        response.release()


async def test_an_interim_reply_is_skipped() -> None:
    """D1, D6: a 1xx reply is passed over; the status that follows (here 429) is the answer."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + sized(b"{}", status="429 Too Many"))
        await reader.read()

    async with serving(handler) as (server, url, client):
        response = await client.post(f"{url}/x", b"{}", {})
        assert response.status == 429 and await response.read() == b"{}"
        response.release()


async def test_releasing_an_unfinished_reply_closes_its_connection() -> None:
    """D6: A client that leaves mid-stream: the engine sees its connection close (and stops
    generating)."""
    engine_saw_close = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"a"))
        await writer.drain()
        assert await reader.read() == b""
        engine_saw_close.set()

    async with serving(handler) as (server, url, client):
        response = await client.post(f"{url}/x", b"{}", {})
        assert await anext(response.chunks()) == b"a"
        response.release()
        await asyncio.wait_for(engine_saw_close.wait(), 10)


async def test_a_reader_that_does_not_read_slows_the_engine() -> None:
    """D1: Unread bytes are bounded: the client stops reading the socket, the engine's
    writes back up; everything arrives once it is read."""
    total = 64 << 20
    written = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        await server.request(reader)
        writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {total}\r\n\r\n".encode())
        piece = b"x" * (1 << 16)
        while written < total:
            writer.write(piece)
            written += len(piece)
            await writer.drain()
        await reader.read()

    async with serving(handler) as (server, url, client):
        response = await client.post(f"{url}/x", b"{}", {})
        await asyncio.sleep(0.5)
        stalled = written
        await asyncio.sleep(0.3)
        assert written == stalled < total  # the engine waits on us
        assert response._unread <= engine_http._PAUSE_AT + (1 << 18)  # + one socket read
        received = 0
        async for piece in response.chunks():
            received += len(piece)
        assert received == total
        response.release()


async def test_refused_and_unknown_hosts_are_unreachable() -> None:
    """D6: what says the engine is down is told apart from this machine's limits."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        client = EngineClient(2.0)
        with pytest.raises(ConnectFailed) as refused:
            await client.post(f"http://127.0.0.1:{port}/x", b"{}", {})
    assert refused.value.unreachable
    with pytest.raises(ConnectFailed) as unknown:
        await client.post("http://no-such-engine.invalid/x", b"{}", {})
    assert unknown.value.unreachable
    await client.close()


async def test_a_connect_that_takes_too_long_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """D6: the connect timeout is the only timeout, and says how long it was."""

    loop = asyncio.get_running_loop()

    async def hanging(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(60)

    monkeypatch.setattr(loop, "create_connection", hanging)
    client = EngineClient(0.05)
    with pytest.raises(ConnectTimeout, match=r"within 0\.05 s"):
        await client.post("http://127.0.0.1:9/x", b"{}", {})


async def test_bad_urls_and_headers_are_refused_before_anything_is_sent() -> None:
    """D6: an engine URL it cannot serve, a header with a line break, a closed client:
    refused, nothing sent."""

    client = EngineClient(2.0)
    with pytest.raises(ValueError, match="only http"):
        await client.post("ftp://engine/x", b"{}", {})
    with pytest.raises(ValueError, match="no host"):
        await client.post("http:///x", b"{}", {})
    for bad in ({"x-a": "b\r\nx-injected: 1"}, {"x-a\n": "b"}, {"x-a": "b\rc"}):
        with pytest.raises(ValueError, match="line break"):
            await client.post("http://127.0.0.1:9/x", b"{}", bad)
    await client.close()
    with pytest.raises(RuntimeError, match="closed"):
        await client.post("http://127.0.0.1:9/x", b"{}", {})


def test_the_same_under_uvloop() -> None:
    """D1: The services run on uvloop (whose transports are not asyncio's classes): a kept
    connection and a chunked stream, there."""

    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.request(reader)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                    + chunk(b"data: 1\n\n")
                    + chunk(b"data: [DONE]\n\n")
                    + b"0\r\n\r\n"
                )

        async with serving(handler) as (server, url, client):
            for _ in range(3):
                response = await client.post(f"{url}/s", b"{}", {})
                assert await response.read() == b"data: 1\n\ndata: [DONE]\n\n"
                response.release()
            assert server.connections == 1

    uvloop.run(scenario())


async def test_an_https_engine_is_reached_with_its_certificate_checked() -> None:
    """D1, D6: An engine behind TLS: the request goes over it; a certificate for another name is
    refused, as a connection failure."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(sized(b'{"tls": true}'))
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    client = EngineClient(5.0, ssl_context=client_ctx)
    try:
        for _ in range(2):
            response = await client.post(f"https://127.0.0.1:{port}/x", b"{}", {})
            assert await response.read() == b'{"tls": true}'
            response.release()
        with pytest.raises(ConnectFailed, match="certificate"):
            await client.post(f"https://localhost:{port}/x", b"{}", {})
    finally:
        await client.close()
        server.close()


async def test_a_close_long_after_the_request_is_not_retried() -> None:
    """D6: A kept connection that closes well after the request went out (the engine may
    have begun the work: a non-streamed reply sends nothing until it is done) fails the
    request; it is never sent a second time."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(sized(b"{}"))
        await server.request(reader)
        await asyncio.sleep(0.6)  # working on it ... and then the connection is gone

    async with serving(handler) as (server, url, client):
        response = await client.post(f"{url}/x", b"{}", {})
        assert await response.read() == b"{}"
        response.release()
        with pytest.raises(Disconnected):
            await client.post(f"{url}/x", b'{"second": 1}', {})
        assert server.connections == 1
        assert sum(b'{"second": 1}' in r for r in server.requests) == 1


async def test_a_body_cut_by_a_reset_connection_is_not_complete() -> None:
    """D6: A reply delimited by the end of its connection is complete only if the connection
    ended in order, not by a reset."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n{"choices":[')
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # with SO_LINGER 0: a reset, not a FIN

    async with serving(handler) as (server, url, client):
        response = await client.post(f"{url}/x", b"{}", {})
        with pytest.raises(Disconnected):
            await response.read()
        assert not response.at_eof()
        response.release()


async def test_trailers_are_headers_of_neither_this_reply_nor_the_next() -> None:
    """D1: a chunked reply's trailer is not a header of that reply, nor of the next on
    its connection."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            + chunk(b"a")
            + b"0\r\nretry-after: 99\r\n\r\n"
        )
        await server.request(reader)
        writer.write(sized(b"b"))
        await reader.read()

    async with serving(handler) as (server, url, client):
        for body in (b"a", b"b"):
            response = await client.post(f"{url}/x", b"{}", {})
            assert await response.read() == body
            assert "retry-after" not in response.headers
            response.release()
        assert server.connections == 1


async def test_a_reply_nobody_asked_for_closes_the_connection() -> None:
    """D6: An engine that answers twice to one request: the first reply is read, the
    connection is not used again (the next reply on it could belong to either)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if server.connections == 1:
            await server.request(reader)
            writer.write(sized(b"mine") + sized(b"nobody's"))
        while True:
            await server.request(reader)
            writer.write(sized(b"fresh"))

    async with serving(handler) as (server, url, client):
        response = await client.post(f"{url}/x", b"{}", {})
        assert await response.read() == b"mine"
        response.release()
        await asyncio.sleep(0.05)
        response = await client.post(f"{url}/x", b"{}", {})
        assert await response.read() == b"fresh"
        response.release()
        assert server.connections == 2
