"""R1 (HTTP transport): request header values reach the app without surrounding OWS (RFC 9110 §5.5).

``StripHeaderWhitespace`` is checked as a plain ASGI callable, and once behind a real
uvicorn with the httptools parser (what the runtime serves with), which keeps trailing
whitespace in a header value when nothing strips it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from hypothesis import given
from hypothesis import strategies as st

from luftpause.runtime.http_headers import StripHeaderWhitespace, strip_header_values


class Recorder:
    """An ASGI app that remembers the scope it was called with."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(_: Any) -> None:
    return None


def http_scope(headers: list[tuple[bytes, bytes]], kind: str = "http") -> dict[str, Any]:
    return {"type": kind, "path": "/mcp", "method": "POST", "headers": headers}


async def test_strips_sp_and_htab_around_every_value() -> None:
    app = Recorder()
    headers = [
        (b"mcp-name", b"  lookup \t "),
        (b"mcp-method", b"\ttools/call"),
        (b"host", b"127.0.0.1:7000 "),
        (b"x-inner", b"a  b\tc"),
        (b"x-empty", b" \t "),
        (b"mcp-name", b" second "),
    ]
    scope = http_scope(headers)
    await StripHeaderWhitespace(app)(scope, _receive, _send)
    (seen,) = app.scopes
    assert seen["headers"] == [
        (b"mcp-name", b"lookup"),
        (b"mcp-method", b"tools/call"),
        (b"host", b"127.0.0.1:7000"),
        (b"x-inner", b"a  b\tc"),  # whitespace inside a value is the value's own
        (b"x-empty", b""),
        (b"mcp-name", b"second"),  # order and repeated names kept
    ]
    assert seen["path"] == "/mcp" and seen["method"] == "POST"
    # The caller's scope is not changed in place.
    assert scope["headers"] is headers and headers[0] == (b"mcp-name", b"  lookup \t ")


async def test_only_sp_and_htab_are_whitespace() -> None:
    """OWS is SP / HTAB; other bytes at the edges (CR, VT, NBSP in UTF-8) are left alone."""
    app = Recorder()
    value = b"\x0bname\xc2\xa0"
    await StripHeaderWhitespace(app)(http_scope([(b"x", value)]), _receive, _send)
    assert app.scopes[0]["headers"] == [(b"x", value)]


async def test_clean_scope_passes_through_unchanged() -> None:
    app = Recorder()
    scope = http_scope([(b"mcp-name", b"lookup"), (b"accept", b"application/json")])
    await StripHeaderWhitespace(app)(scope, _receive, _send)
    assert app.scopes[0] is scope


async def test_websocket_scope_is_stripped_and_lifespan_untouched() -> None:
    app = Recorder()
    await StripHeaderWhitespace(app)(
        http_scope([(b"origin", b" http://127.0.0.1 ")], "websocket"), _receive, _send
    )
    lifespan = {"type": "lifespan", "asgi": {"version": "3.0"}}
    await StripHeaderWhitespace(app)(lifespan, _receive, _send)
    assert app.scopes[0]["headers"] == [(b"origin", b"http://127.0.0.1")]
    assert app.scopes[1] is lifespan


async def test_missing_headers_key_is_fine() -> None:
    app = Recorder()
    scope = {"type": "http", "path": "/"}
    await StripHeaderWhitespace(app)(scope, _receive, _send)
    assert app.scopes[0] is scope


@given(
    st.lists(
        st.tuples(
            st.binary(min_size=1, max_size=8),
            st.builds(
                lambda a, b, c: a + b + c,
                st.sampled_from([b"", b" ", b"\t", b" \t "]),
                st.binary(max_size=12),
                st.sampled_from([b"", b" ", b"\t", b"\t \t"]),
            ),
        ),
        max_size=6,
    )
)
def test_strip_is_idempotent_and_edge_free(headers: list[tuple[bytes, bytes]]) -> None:
    once = strip_header_values(headers)
    assert strip_header_values(once) == once
    assert [n for n, _ in once] == [n for n, _ in headers]
    for (_, new), (_, old) in zip(once, headers, strict=True):
        assert new in old
        assert not new.startswith((b" ", b"\t")) and not new.endswith((b" ", b"\t"))


# ----------------------------------------------------------------------------- behind uvicorn


async def echo_mcp_name(scope: Any, receive: Any, send: Any) -> None:
    """Answers with the raw ``mcp-name`` value it received, in brackets."""
    if scope["type"] != "http":
        return
    value = next((v for n, v in scope["headers"] if n == b"mcp-name"), b"")
    body = b"[" + value + b"]"
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app: Any) -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", http="httptools")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return int(sock.getsockname()[1])

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def raw_get(port: int, header_line: bytes) -> bytes:
    """One request written byte for byte (HTTP clients tidy header values themselves)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + header_line
            + b"\r\nConnection: close\r\n\r\n"
        )
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return reply.partition(b"\r\n\r\n")[2]


def test_uvicorn_httptools_keeps_trailing_ows_and_the_middleware_removes_it(serve: Any) -> None:
    line = b"Mcp-Name:   lookup \t "
    bare = serve(echo_mcp_name)
    wrapped = serve(StripHeaderWhitespace(echo_mcp_name))
    assert raw_get(bare, line) != b"[lookup]"  # why the middleware exists
    assert raw_get(wrapped, line) == b"[lookup]"
