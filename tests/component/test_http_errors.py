"""D6, R1, S12 (error shapes below the apps): ``luftpause.http_errors``.

uvicorn's parser refuses a request with a control character in a header value
before any ASGI code runs; behind :func:`luftpause.serving.uvicorn_server` that
refusal is a JSON 400 naming the problem (raw sockets against a real uvicorn on
127.0.0.1:0), while good requests keep their keep-alive connection. A Hypothesis
fuzz sends arbitrary header bytes to that real server: every answer is the app's
200 or a JSON 400. ``JsonErrorAnswers`` reshapes plain-text and empty error
answers and lets everything else through byte for byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from _raw_http import exchange, read_answer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from luftpause.http_errors import (
    JsonErrorAnswers,
    Malformed,
    Refusal,
    describe_parser_error,
    refusal_message,
)
from luftpause.serving import bind_socket, bound_port, uvicorn_server, wait_started

WAIT_S = 10.0


def get(header_line: bytes, path: bytes = b"/") -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header_line + b"\r\n\r\n"


async def ok_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def served() -> AsyncIterator[int]:
    """``ok_app`` behind the services' uvicorn (``serving.uvicorn_server``); its port."""
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn_server(ok_app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_started(server, task)
    yield bound_port(sock)
    server.should_exit = True
    async with asyncio.timeout(WAIT_S):
        await task
    sock.close()


# ----------------------------------------------------------------- the parser's refusals


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (b"x-luftpause-run-id: r\x01", "'x-luftpause-run-id' holds a control character (0x01)"),
        (
            b"x-luftpause-class: inter\x7factive",
            "'x-luftpause-class' holds a control character (0x7f)",
        ),
        (b"x-a: nul\x00", "'x-a' holds a control character (0x00)"),
    ],
)
async def test_a_control_character_in_a_header_value_is_a_json_400_naming_the_header(
    served: int, line: bytes, named: str
) -> None:
    """D6: uvicorn's own answer is ``400 text/plain "Invalid HTTP request received."``."""
    answer, closed = await exchange(served, get(line))
    assert answer.status == 400
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["connection"] == "close" and closed
    message = answer.json()["error"]["message"]
    assert message.startswith("malformed HTTP request: ") and named in message
    assert "visible characters, spaces and tabs only" in message


@pytest.mark.parametrize(
    ("request_bytes", "said"),
    [
        (get(b"Ho st: a"), "header name 'Ho st' holds a character a header name may not hold"),
        (get(b"x-a: a\rb"), "bare CR or LF"),
        (b"\x16\x03\x01\x02\x00\x01\x00", "TLS sent to a plain-HTTP port"),
        (b"G@T / HTTP/1.1\r\n\r\n", "the method is not an HTTP method"),
        (get(b"x: y", path=b"/\x01"), "the request target holds a character a URL may not hold"),
        (b"GET / HTTP/9.1\r\nHost: a\r\n\r\n", "the HTTP parser refused it: Invalid HTTP version"),
        (
            b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
            "the request line is not 'METHOD target HTTP/1.1'",
        ),
        (b"GET http://x:y:z/ HTTP/1.1\r\nHost: a\r\n\r\n", "the request target is not a URL"),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "Duplicate Content-Length",
        ),
    ],
)
async def test_every_refusal_of_the_parser_is_json_and_says_what_was_wrong(
    served: int, request_bytes: bytes, said: str
) -> None:
    answer, closed = await exchange(served, request_bytes)
    assert (answer.status, answer.headers["content-type"], closed) == (
        400,
        "application/json",
        True,
    )
    assert said in answer.json()["error"]["message"]


async def test_good_requests_keep_their_connection_and_a_bad_one_on_it_is_json(served: int) -> None:
    """Keep-alive is uvicorn's as before: two good requests on one connection, then a bad
    one on the same connection gets the JSON 400 and the close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served)
    try:
        for _ in range(2):
            writer.write(get(b"x-a: fine \xff obs-text"))
            answer = await read_answer(reader)
            assert (answer.status, answer.body) == (200, b"ok")
            assert answer.headers.get("connection") != "close"
        writer.write(get(b"x-a: bad\x01"))
        answer = await read_answer(reader)
        assert answer.status == 400 and "'x-a'" in answer.json()["error"]["message"]
        async with asyncio.timeout(WAIT_S):
            assert await reader.read(1) == b""
    finally:
        writer.close()


async def test_an_upgrade_request_is_answered_by_the_app(served: int) -> None:
    """No service speaks WebSocket: a handshake reaches the app as plain HTTP instead of
    the websockets library's empty 403."""
    handshake = (
        b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", served)
    try:
        writer.write(get(handshake))
        answer = await read_answer(reader)
    finally:
        writer.close()
    assert (answer.status, answer.body) == (200, b"ok")


async def test_the_answer_is_the_services_own_and_sees_what_was_read() -> None:
    """A service's answer gets the target and the headers read before the fault."""
    seen: list[Malformed] = []

    def answer(request: Malformed) -> tuple[dict[str, Any], dict[str, str]]:
        seen.append(request)
        return {"shape": "ours", "why": request.problem}, {"x-run": "r-1"}

    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn_server(ok_app, malformed=answer)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_started(server, task)
    try:
        reply, _ = await exchange(
            bound_port(sock), get(b"x-named: n1\r\nx-bad: \x02", b"/v1/x?q=1")
        )
    finally:
        server.should_exit = True
        async with asyncio.timeout(WAIT_S):
            await task
        sock.close()
    assert reply.status == 400 and reply.headers["x-run"] == "r-1"
    assert reply.json()["shape"] == "ours"
    [request] = seen
    assert (request.target, request.path) == ("/v1/x?q=1", "/v1/x")
    assert request.header(b"x-named") == "n1" and request.header(b"x-bad") is None


@pytest.mark.parametrize("fault", ["raises", "header with a line break"])
async def test_an_answer_that_fails_still_gives_the_client_a_json_400(fault: str) -> None:
    def answer(request: Malformed) -> tuple[dict[str, Any], dict[str, str]]:
        if fault == "raises":
            raise RuntimeError("a bug in the answer")
        return {"never": "sent"}, {"x-run": "a\r\nx-injected: 1"}

    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn_server(ok_app, malformed=answer)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_started(server, task)
    try:
        reply, closed = await exchange(bound_port(sock), get(b"x-bad: \x02"))
    finally:
        server.should_exit = True
        async with asyncio.timeout(WAIT_S):
            await task
        sock.close()
    assert (reply.status, reply.headers["content-type"], closed) == (400, "application/json", True)
    assert "'x-bad'" in reply.json()["error"]["message"]
    assert "x-run" not in reply.headers and "x-injected" not in reply.headers


def test_the_message_without_a_parser_error_is_still_a_message() -> None:
    assert describe_parser_error(None, b"") == "malformed HTTP request: the HTTP parser refused it"


# A header line of anything but CR LF (which would end it), on a request that is fine
# otherwise: whatever the parser makes of it, the answer is the app's or JSON.
HEADER_NAMES = st.sampled_from([b"x-luftpause-run-id", b"x-luftpause-class", b"x-a"]) | st.binary(
    min_size=1, max_size=12
).filter(lambda b: b":" not in b and b"\r\n" not in b)
HEADER_VALUES = st.binary(max_size=40).filter(lambda b: b"\r\n" not in b and not b.endswith(b"\r"))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=HEADER_NAMES, value=HEADER_VALUES)
async def test_fuzzed_header_bytes_get_the_apps_answer_or_a_json_400(
    served: int, name: bytes, value: bytes
) -> None:
    answer, _ = await exchange(served, get(name + b": " + value + b"\r\nConnection: close"))
    if answer.status != 200:
        assert answer.status == 400, answer.body
        assert answer.headers["content-type"] == "application/json", answer.body
        assert answer.json()["error"]["message"].startswith("malformed HTTP request: ")


# ----------------------------------------------------------------- answers of layers below the app


def shaped(refusal: Refusal) -> dict[str, Any]:
    return {"error": {"message": refusal_message(refusal, "test service", "GET /json, GET /text")}}


def inner_app() -> Starlette:
    async def text(_: Request) -> Response:
        return PlainTextResponse("nope", status_code=409)

    async def empty(_: Request) -> Response:
        return Response(status_code=406)

    async def json_error(_: Request) -> Response:
        return JSONResponse({"theirs": True}, status_code=418)

    async def events(_: Request) -> Response:
        return Response("data: 1\n\n", media_type="text/event-stream")

    async def accepted(_: Request) -> Response:
        return Response(status_code=202)

    async def boom(_: Request) -> Response:
        raise RuntimeError("a bug")

    return Starlette(
        routes=[
            Route("/text", text),
            Route("/empty", empty),
            Route("/json", json_error),
            Route("/events", events),
            Route("/accepted", accepted, methods=["POST"]),
            Route("/boom", boom),
        ]
    )


@pytest.fixture
async def reshaped() -> AsyncIterator[httpx.AsyncClient]:
    app = JsonErrorAnswers(inner_app(), shaped)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client


async def test_plain_text_and_empty_error_answers_become_json(reshaped: httpx.AsyncClient) -> None:
    text = await reshaped.get("/text")
    assert (text.status_code, text.headers["content-type"]) == (409, "application/json")
    assert text.json() == {"error": {"message": "nope"}}  # the lower layer's own words
    empty = await reshaped.get("/empty")
    assert (empty.status_code, empty.json()) == (406, {"error": {"message": "Not Acceptable"}})
    unknown = await reshaped.get("/nowhere")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == (
        "no route GET /nowhere; the test service serves GET /json, GET /text"
    )
    wrong = await reshaped.get("/accepted")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["message"] == "GET /accepted: method not allowed; use POST"
    boom = await reshaped.get("/boom")
    assert boom.status_code == 500
    assert boom.json()["error"]["message"] == "internal error in the test service (logged)"
    for answer in (text, empty, unknown, wrong, boom):
        assert int(answer.headers["content-length"]) == len(answer.content)


async def test_json_errors_and_good_answers_pass_unchanged(reshaped: httpx.AsyncClient) -> None:
    theirs = await reshaped.get("/json")
    assert (theirs.status_code, theirs.json()) == (418, {"theirs": True})
    events = await reshaped.get("/events")
    assert events.status_code == 200 and events.text == "data: 1\n\n"
    assert events.headers["content-type"].startswith("text/event-stream")
    accepted = await reshaped.post("/accepted")
    assert (accepted.status_code, accepted.content) == (202, b"")


def test_a_long_path_is_cut_in_the_message() -> None:
    refusal = Refusal(404, "GET", "/" + "p" * 500, Headers(), "", Headers())
    message = refusal_message(refusal, "svc", "GET /")
    assert "p" * 199 + "…;" in message and "p" * 201 not in message
