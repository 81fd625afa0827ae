"""Fuzzing both turn routes in process (D1, D4–D7, D9, S10, S11).

Hypothesis generates request bodies and luftpause headers: arbitrary JSON (any
type, nesting, size, Unicode), chat- and decide-shaped bodies with every field
the proxy reads replaced by anything, raw bytes in other encodings, and bodies
nested thousands deep. They go through the real dataplane app (ASGI transport)
to a real in-process scheduler core over gRPC and a recording engine that
always answers well, so any 5xx is our own. For every example:

* the answer is never a 5xx (the engine never fails here);
* an error answer is ``{"error": {"message": <str>}}`` (D6) and carries
  ``x-luftpause-run-id``: the run the client named, when it named a usable one;
* afterwards nothing is in flight or held: the scheduler, the dataplane's run
  table (what a resync re-sends) and its gauges are back to zero.

The ASGI transport never reaches the HTTP parser, and uvicorn's parser refuses some
header bytes before any ASGI code runs (its own answer was ``400 text/plain "Invalid
HTTP request received."``). So the header fuzz also runs against the same dataplane
served by the services' uvicorn (``serving.uvicorn_server``) on 127.0.0.1:0, with
header lines written byte for byte over a socket: any byte but CR LF in a header
value, and odd header names. There every answer that is not a 200 must be JSON in
the shape above, with a run, and no non-JSON error body is allowed.

``LUFTPAUSE_FUZZ_EXAMPLES`` sets the examples per route (default 150);
``LUFTPAUSE_FUZZ_REPORT=path.json`` writes the answers counted by route and
status (the figures in docs/benchmarks/reliability.md come from there).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _dataplane_stack import (
    COMPLETION,
    MODEL,
    Seen,
    Stack,
    nothing_in_flight,
    stack_fixture,  # noqa: F401  (provides the stack fixture)
)
from _raw_http import Answer, exchange
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luftpause.serving import bind_socket, bound_port, uvicorn_server, wait_started

EXAMPLES = int(os.environ.get("LUFTPAUSE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ANSWERS: Counter[tuple[str, int]] = Counter()

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
MODELS = st.sampled_from(["m", "clf", "other", ""]) | st.text(max_size=300) | json_values
MESSAGES = st.just([{"role": "user", "content": "hi"}]) | st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["user", "tool", "assistant"]) | json_values,
            "content": json_values,
            "tool_call_id": st.text(max_size=10) | json_values,
        },
    )
    | json_values,
    max_size=4,
)
CHAT_FIELDS = {
    "model": MODELS,
    "messages": MESSAGES | json_values,
    "stream": st.booleans() | json_values,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": json_values})
    | json_values,
    "priority": st.integers(-5, 5) | json_values,
    "tools": json_values,
    "max_tokens": json_values,
}
DECIDE_FIELDS = {"model": MODELS, "input": st.text(max_size=50) | json_values}


def shaped(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """A body of the route's shape: each field present or not, well-formed or anything."""
    return st.fixed_dictionaries({}, optional=fields).map(lambda d: json.dumps(d).encode())


def deep(depth: int, opener: str) -> bytes:
    close = "]" if opener == "[" else "}"
    inner = ('{"a":' if opener == "{" else "[") * depth + "1" + close * depth
    return f'{{"model": "m", "messages": [{{"role": "user", "content": {inner}}}]}}'.encode()


def bodies(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        shaped(fields),
        shaped(fields),  # drawn twice as often: most clients send the right shape
        json_values.map(lambda v: json.dumps(v).encode()),
        st.tuples(shaped(fields), st.sampled_from(["utf-16", "utf-32", "latin-1"])).map(
            lambda t: t[0].decode().encode(t[1], errors="replace")
        ),
        st.binary(max_size=64),
        st.builds(deep, st.integers(1, 3000), st.sampled_from(["[", "{"])),
        st.integers(1, 200_000).map(
            lambda n: json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "x" * n}]}
            ).encode()
        ),
    )


HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "x-luftpause-run-id": st.sampled_from(["run-1", "r" * 300, " ", "run 2"]),
        "x-luftpause-class": st.sampled_from(["interactive", "batch", "BATCH", "urgent", ""]),
        "x-luftpause-caller": st.text(
            st.characters(min_codepoint=32, max_codepoint=255), max_size=300
        ),
    },
)


def engine_reply(seen: Seen) -> httpx.Response:
    """Always a good answer, so that any 5xx the client sees is the dataplane's own."""
    if seen.path == "/classify":
        return httpx.Response(200, json={"data": [{"index": 0, "label": "x", "probs": [1.0]}]})
    try:
        streamed = json.loads(seen.content).get("stream") is True
    except (ValueError, AttributeError, RecursionError):
        streamed = False
    if streamed:
        events = (
            b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
            b"data: [DONE]\n\n"
        )
        return httpx.Response(200, content=events, headers={"content-type": "text/event-stream"})
    return httpx.Response(200, json=COMPLETION)


async def check(stack: Stack, route: str, body: bytes, headers: dict[str, str]) -> None:
    stack.engine.reply = engine_reply
    wire = {k.encode(): v.encode("latin-1") for k, v in headers.items()}  # bytes, as sent
    resp = await stack.client.post(route, content=body, headers=wire)
    ANSWERS[(route, resp.status_code)] += 1
    assert resp.status_code < 500, resp.text[:500]
    if resp.status_code != 200:
        error = resp.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert "Traceback" not in error["message"]
        named = headers.get("x-luftpause-run-id", "").strip()
        if 0 < len(named) <= 256:
            assert resp.headers["x-luftpause-run-id"] == named
        else:  # a run is named all the same (D6)
            assert resp.headers["x-luftpause-run-id"]
    await nothing_in_flight(stack)


@FUZZ
@given(body=bodies(CHAT_FIELDS), headers=HEADERS)
async def test_fuzzed_chat_turns_never_5xx_and_leave_nothing_in_flight(
    stack: Stack, body: bytes, headers: dict[str, str]
) -> None:
    """D1, D4–D6, S10, S11: any body or header on /v1/chat/completions: no 5xx of ours,
    errors in the JSON shape, nothing in flight afterwards."""
    await check(stack, "/v1/chat/completions", body, headers)


@FUZZ
@given(body=bodies(DECIDE_FIELDS), headers=HEADERS)
async def test_fuzzed_decide_turns_never_5xx_and_leave_nothing_in_flight(
    stack: Stack, body: bytes, headers: dict[str, str]
) -> None:
    """D6, D7, S13: any body or header on /v1/decide: no 5xx of ours, errors in the JSON
    shape, nothing in flight afterwards."""
    await check(stack, "/v1/decide", body, headers)


# ------------------------------------------------------------ the same, on a real server


@pytest.fixture
async def served(stack: Stack) -> AsyncIterator[int]:
    """The stack's dataplane app behind the services' uvicorn; its port. The stack
    already runs the app's link, so the server runs no lifespan of its own."""
    app = stack.app
    assert app is not None

    async def without_lifespan(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await app(scope, receive, send)

    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn_server(without_lifespan, malformed=app.malformed)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_started(server, task)
    yield bound_port(sock)
    server.should_exit = True
    async with asyncio.timeout(10):
        await task
    sock.close()


def raw_post(route: str, body: bytes, header_lines: list[bytes]) -> bytes:
    head = [
        f"POST {route} HTTP/1.1".encode(),
        b"Host: 127.0.0.1",
        b"Content-Type: application/json",
        f"Content-Length: {len(body)}".encode(),
        b"Connection: close",
        *header_lines,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def error_of(answer: Answer) -> dict[str, Any]:
    """The error of a non-200 answer, which must be JSON in the route's shape."""
    assert answer.headers.get("content-type") == "application/json", (answer.status, answer.body)
    error = json.loads(answer.body)["error"]
    assert isinstance(error, dict) and isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"]
    return error


GOOD_CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (b"x-luftpause-run-id: r\x01", "'x-luftpause-run-id'"),
        (b"x-luftpause-class: inter\x7factive", "'x-luftpause-class'"),
    ],
)
async def test_a_control_character_in_a_header_is_a_json_400_with_a_run(
    stack: Stack, served: int, line: bytes, named: str
) -> None:
    """D6: uvicorn's parser refuses the request before the app sees it; the answer is
    the dataplane's JSON 400 naming the header, with the run the request named before
    the fault (or a new one), and the connection closes."""
    lines = [b"x-luftpause-run-id: run-named", line] if b"class" in line else [line]
    answer, closed = await exchange(served, raw_post("/v1/chat/completions", GOOD_CHAT, lines))
    assert answer.status == 400 and closed
    error = error_of(answer)
    assert named in error["message"] and "control character" in error["message"]
    assert error["type"] == "invalid_request_error"
    run = answer.headers["x-luftpause-run-id"]
    if b"class" in line:
        assert run == "run-named"  # read before the fault
    else:
        assert run.startswith("run-") and len(run) == len("run-") + 32  # a new run
    assert not stack.engine.seen
    await nothing_in_flight(stack)


async def test_on_the_messages_route_the_400_is_in_anthropics_shape(served: int) -> None:
    """B9: a route of another API gets that API's error shape, here too."""
    answer, _ = await exchange(served, raw_post("/v1/messages", b"{}", [b"x-api-key: k\x01"]))
    assert answer.status == 400 and answer.headers["content-type"] == "application/json"
    body = json.loads(answer.body)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "'x-api-key'" in body["error"]["message"]


RAW_NAMES = st.sampled_from(
    [b"x-luftpause-run-id", b"x-luftpause-class", b"x-luftpause-caller", b"authorization"]
) | st.binary(min_size=1, max_size=12).filter(lambda b: b":" not in b and b"\r\n" not in b)
# Any bytes but a line end (CR LF would start a new header line or end the head).
RAW_VALUES = st.binary(max_size=60).filter(lambda b: b"\r\n" not in b and not b.endswith(b"\r"))
RAW_HEADERS = st.lists(st.tuples(RAW_NAMES, RAW_VALUES), max_size=3)


@FUZZ
@given(body=st.sampled_from([GOOD_CHAT, b"{}", b"not json"]), headers=RAW_HEADERS)
async def test_fuzzed_raw_headers_on_a_real_server_answer_json_and_leave_nothing_in_flight(
    stack: Stack, served: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    """D1, D6, S10: any header bytes, through the real HTTP parser: no 5xx of ours, no
    error answer that is not JSON in the OpenAI shape, a run named on every error, and
    nothing in flight afterwards."""
    stack.engine.reply = engine_reply
    lines = [name + b": " + value for name, value in headers]
    answer, _ = await exchange(served, raw_post("/v1/chat/completions", body, lines))
    ANSWERS[("raw /v1/chat/completions", answer.status)] += 1
    assert answer.status < 500, answer.body[:500]
    if answer.status != 200:
        error_of(answer)
        assert answer.headers["x-luftpause-run-id"]
    await nothing_in_flight(stack)


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    path = os.environ.get("LUFTPAUSE_FUZZ_REPORT")
    if path:
        by_route: dict[str, dict[str, int]] = {}
        for (route, status), n in sorted(ANSWERS.items()):
            by_route.setdefault(route, {})[str(status)] = n
        Path(path).write_text(json.dumps({"examples_per_route": EXAMPLES, "answers": by_route}))
