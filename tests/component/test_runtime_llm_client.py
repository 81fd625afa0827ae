"""R4, R14, R15, X2: the runtime's dataplane client against an in-process fake dataplane.

The fake is an ``httpx.MockTransport`` handler scripted per test: a list of answers
(a status, a ``Retry-After``, a body, or an exception to raise), the last one repeated.
Every request it sees is kept (method, path, headers, JSON body). Every test runs with
turns streamed (the default: the fake's good answer is then an event stream of the
reply, cut into chunks as engines cut it) and not streamed (``stream_turns=False``).
No test asserts on timing beyond "it retried" / "it failed"; every wait is bounded by
``asyncio.timeout``.
A wait the client must *not* take (the configured 429 default when ``Retry-After`` is
given, a long backoff) is made longer than that bound, so taking it fails the test.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from luftpause.runtime.llm import DataplaneClient, Identity, TurnFailed

BOUND_S = 10.0  # no test waits longer than this for anything
IDENTITY = Identity("run-1", "interactive", "session-7")
BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hello"}],
    "max_tokens": 32,
    "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}],
    "parallel_tool_calls": False,
}
REPLY: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                    }
                ],
            },
        }
    ],
    "usage": {
        "prompt_tokens": 11,
        "completion_tokens": 3,
        "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 8},
        "luftpause_timing": {"queued_s": 0.1},
    },
}

Answer = httpx.Response | Exception | Callable[[httpx.Request], Any]
STREAMED = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(autouse=True, params=["streamed", "unary"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test twice: turns streamed (the default) and not (``stream_turns=False``)."""
    FakeDataplane.stream_turns = request.param == "streamed"
    yield request.param
    FakeDataplane.stream_turns = True


def sent(body: dict[str, Any]) -> dict[str, Any]:
    """The body on the wire for a turn whose body is ``body``, in this test's mode."""
    return {**body, **STREAMED} if FakeDataplane.stream_turns else body


def chunks_of(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat completion as an engine streams it: a role chunk, the content and each tool
    call's arguments in pieces, the finish reason, then a usage-only chunk."""
    head = {k: reply[k] for k in ("id", "created", "model") if k in reply}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {**head, "choices": [choice], "usage": None}

    message = reply["choices"][0]["message"]
    out = [chunk({"role": "assistant", "content": ""})]
    content = message.get("content") or ""
    for i in range(0, len(content), 3):
        out.append(chunk({"content": content[i : i + 3]}))
    for n, call in enumerate(message.get("tool_calls") or ()):
        args = call["function"]["arguments"]
        first = {"index": n, "id": call["id"], "type": call["type"]}
        first["function"] = {"name": call["function"]["name"], "arguments": args[:4]}
        out.append(chunk({"tool_calls": [first]}))
        for i in range(4, len(args), 4):
            rest = {"index": n, "function": {"arguments": args[i : i + 4]}}
            out.append(chunk({"tool_calls": [rest]}))
    out.append(chunk({}, reply["choices"][0]["finish_reason"]))
    out.append({**head, "choices": [], "usage": reply["usage"]})
    return out


def sse(events: list[dict[str, Any]], done: bool = True) -> bytes:
    lines = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]
    return b"".join(lines) + (b"data: [DONE]\n\n" if done else b"")


def event_stream(content: Any) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)


class FakeDataplane:
    """Answers in order (the last one for ever); records every request."""

    stream_turns = True  # what ``client()`` gives the client (set per test by ``mode``)

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers) or [ok()]
        self.requests: list[httpx.Request] = []
        self.seen = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.seen.set()
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if callable(answer) and not isinstance(answer, httpx.Response):
            answer = await answer(request)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, httpx.Response)
        return answer

    def client(self, **kwargs: Any) -> DataplaneClient:
        options: dict[str, Any] = {
            "stream_turns": self.stream_turns,
            "token": None,
            "turn_timeout_s": 30.0,
            "retry_after_default_s": 0.01,
            "transient_backoff_s": 0.001,
        }
        options.update(kwargs)
        return DataplaneClient(
            "http://dataplane.test", transport=httpx.MockTransport(self), **options
        )

    @property
    def chat_requests(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path == "/v1/chat/completions"]


def ok(body: dict[str, Any] | None = None) -> Callable[[httpx.Request], Any]:
    """The reply: streamed when the request asks for a stream, else as one JSON body."""
    reply = REPLY if body is None else body

    async def answer(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("stream"):
            return event_stream(sse(chunks_of(reply)))
        return httpx.Response(200, json=reply)

    return answer


def error(status: int, message: str, **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message}}, headers=headers)


async def chat(client: DataplaneClient, body: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        async with asyncio.timeout(BOUND_S):
            return await client.chat(body or BODY, IDENTITY)
    finally:
        await client.aclose()


async def test_a_turn_sends_identity_and_token_and_returns_the_reply() -> None:
    """R4, X2: run id, class, caller and the Bearer token are sent; the body goes out as
    given; the reply comes back as the JSON object loop.py reads (extra fields kept)."""
    fake = FakeDataplane(ok())
    data = await chat(fake.client(token="s3cret"))
    (request,) = fake.requests
    assert request.method == "POST" and request.url.path == "/v1/chat/completions"
    assert request.headers["x-luftpause-run-id"] == "run-1"
    assert request.headers["x-luftpause-class"] == "interactive"
    assert request.headers["x-luftpause-caller"] == "session-7"
    assert request.headers["authorization"] == "Bearer s3cret"
    assert json.loads(request.content) == sent(BODY)
    assert data == REPLY
    assert data["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup"
    assert data["usage"]["prompt_tokens"] == 11


async def test_behind_another_gateway_a_turn_carries_its_class_headers_and_priority() -> None:
    """R4: for an upstream that is not a luftpause dataplane (runtime.class_headers,
    run_id_headers, class_priority): the class's headers, the run ID under each named
    header and the class's body priority go with every turn of that class; a turn's own
    priority is kept; the luftpause identity headers are still sent."""
    fake = FakeDataplane(ok())
    options = {
        "class_headers": {"interactive": {"x-smg-priority": "interactive"}},
        "run_id_headers": ("x-smg-routing-key",),
        "class_priority": {"interactive": 10, "batch": 0},
    }
    await chat(fake.client(**options))
    (request,) = fake.requests
    assert request.headers["x-smg-priority"] == "interactive"
    assert request.headers["x-smg-routing-key"] == "run-1"
    assert request.headers["x-luftpause-run-id"] == "run-1"
    assert json.loads(request.content) == sent({**BODY, "priority": 10})
    fake = FakeDataplane(ok())
    await chat(fake.client(**options), {**BODY, "priority": 3})
    assert json.loads(fake.requests[0].content)["priority"] == 3
    fake = FakeDataplane(ok())
    client = fake.client(**options)
    try:
        async with asyncio.timeout(BOUND_S):
            await client.chat(BODY, Identity("run-2", "batch", "crowd"))
    finally:
        await client.aclose()
    (request,) = fake.requests
    assert "x-smg-priority" not in request.headers  # no headers given for batch
    assert request.headers["x-smg-routing-key"] == "run-2"
    assert json.loads(request.content)["priority"] == 0


async def test_without_a_token_no_authorization_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """X2: no token, no Authorization header - not even the user's OPENAI_API_KEY, nor the
    organisation/project headers the openai client would take from the environment."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-the-dataplane")
    monkeypatch.setenv("OPENAI_ORG_ID", "org-x")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-x")
    fake = FakeDataplane(ok())
    await chat(fake.client(token=None))
    headers = fake.requests[0].headers
    assert "authorization" not in headers
    assert "openai-organization" not in headers and "openai-project" not in headers
    assert headers["x-luftpause-run-id"] == "run-1"


async def test_5xx_is_retried_then_succeeds() -> None:
    """R14: 5xx answers are retried (with backoff) and the turn succeeds."""
    fake = FakeDataplane(error(503, "busy"), error(502, "engine x: refused"), ok())
    data = await chat(fake.client())
    assert len(fake.chat_requests) == 3
    assert data["choices"][0]["message"]["role"] == "assistant"


async def test_5xx_retries_run_out_and_the_turn_fails() -> None:
    """R14: after the last retry, TurnFailed with the status and the dataplane's message."""
    fake = FakeDataplane(error(502, "engine a: connection refused"))
    with pytest.raises(TurnFailed, match="502 engine a: connection refused"):
        await chat(fake.client(transient_retries=2))
    assert len(fake.chat_requests) == 3  # the first try and two retries


async def test_connection_errors_are_retried_then_succeed() -> None:
    """R14: a dataplane that cannot be reached for a moment: retried, then the turn works."""
    refused = httpx.ConnectError("connection refused")
    fake = FakeDataplane(refused, httpx.ReadError("reset"), ok())
    data = await chat(fake.client())
    assert len(fake.chat_requests) == 3 and data["id"] == "chatcmpl-1"


async def test_connection_errors_that_last_fail_the_turn() -> None:
    """R14: a dataplane that stays unreachable fails the turn, naming where it was sought."""
    fake = FakeDataplane(httpx.ConnectError("connection refused"))
    with pytest.raises(TurnFailed, match=r"dataplane unreachable at http://dataplane\.test"):
        await chat(fake.client(transient_retries=3))
    assert len(fake.chat_requests) == 4


async def test_429_waits_retry_after_seconds() -> None:
    """R14: 429 with Retry-After in seconds: that wait, not the default (which is longer
    than the test's bound), then the same turn again."""
    fake = FakeDataplane(error(429, "slow down", **{"Retry-After": "0"}), ok())
    data = await chat(fake.client(retry_after_default_s=3600))
    assert len(fake.chat_requests) == 2 and data["id"] == "chatcmpl-1"
    bodies = [json.loads(r.content) for r in fake.chat_requests]
    assert bodies[0] == bodies[1] == sent(BODY)
    assert {r.headers["x-luftpause-run-id"] for r in fake.chat_requests} == {"run-1"}


async def test_429_waits_retry_after_as_an_http_date() -> None:
    """R14: 429 with Retry-After as an HTTP date (already reached): no default wait."""
    date = email.utils.formatdate(time.time() - 5, usegmt=True)
    fake = FakeDataplane(error(429, "slow down", **{"Retry-After": date}), ok())
    await chat(fake.client(retry_after_default_s=3600))
    assert len(fake.chat_requests) == 2


async def test_429_without_retry_after_waits_the_default() -> None:
    """R14: 429 without Retry-After (or an unreadable one): the configured default."""
    fake = FakeDataplane(
        error(429, "slow down"), error(429, "again", **{"Retry-After": "soon"}), ok()
    )
    await chat(fake.client(retry_after_default_s=0.01))
    assert len(fake.chat_requests) == 3


async def test_429_is_retried_until_the_run_is_cancelled() -> None:
    """R14: 429s are retried for as long as the run lives - past the transient retry count
    and past the turn timeout - and cancelling the run cancels the wait."""
    fake = FakeDataplane(error(429, "queue full", **{"Retry-After": "0.01"}))
    client = fake.client(turn_timeout_s=0.2, transient_retries=1)
    task = asyncio.create_task(client.chat(BODY, IDENTITY))
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        async with asyncio.timeout(BOUND_S):
            while len(fake.chat_requests) < 10 or loop.time() - started < 0.6:
                assert not task.done(), task.exception()
                await asyncio.sleep(0.01)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seen = len(fake.chat_requests)
        await asyncio.sleep(0.05)
        assert len(fake.chat_requests) == seen  # nothing is sent after the cancel
    finally:
        task.cancel()
        await client.aclose()


async def test_a_turn_longer_than_the_turn_timeout_fails() -> None:
    """R14: a request the dataplane does not answer within turn_timeout_s fails the turn."""
    never = asyncio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        await never.wait()
        return ok()

    fake = FakeDataplane(hang)
    with pytest.raises(TurnFailed, match=r"turn timed out after 0\.2 s"):
        await chat(fake.client(turn_timeout_s=0.2))
    assert len(fake.chat_requests) == 1


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (404, "no Generative replica serves model 'nope'"),
        (400, "messages: field required"),
        (401, "missing or invalid bearer token"),
        (413, "request body too large"),
    ],
)
async def test_other_statuses_fail_at_once_with_the_dataplanes_message(
    status: int, message: str
) -> None:
    """R14, D6: any other status fails the turn at once with the error body's message."""
    fake = FakeDataplane(error(status, message))
    with pytest.raises(TurnFailed) as caught:
        await chat(fake.client())
    assert str(caught.value) == f"turn failed: {status} {message}"
    assert len(fake.chat_requests) == 1


async def test_a_plain_text_error_body_is_shown() -> None:
    """R14: an error that is not luftpause's JSON shape still says what the body said."""
    fake = FakeDataplane(httpx.Response(400, text="bad request from a proxy"))
    with pytest.raises(TurnFailed, match="400 bad request from a proxy"):
        await chat(fake.client())


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (httpx.Response(200, text="<html>hello</html>"), "non-JSON body"),
        (httpx.Response(200, json={"id": "x"}), "no choices"),
        (httpx.Response(200, json={"choices": []}), "no choices"),
        (httpx.Response(200, json={"choices": ["x"]}), "no choices"),
        (httpx.Response(200, json=[1, 2]), "not a JSON object"),
    ],
)
async def test_a_reply_without_a_choice_fails_the_turn(reply: httpx.Response, why: str) -> None:
    """R4: a 200 that is not a chat completion fails the turn (never a crash in the loop)."""
    fake = FakeDataplane(reply)
    with pytest.raises(TurnFailed, match=why):
        await chat(fake.client())


async def test_models_are_listed_with_the_token_and_cached() -> None:
    """R4: GET /v1/models with the token; the list is asked for once."""
    listing = {"object": "list", "data": [{"id": "llama", "object": "model"}, {"id": "qwen"}]}
    fake = FakeDataplane(httpx.Response(200, json=listing))
    client = fake.client(token="t0k")
    try:
        async with asyncio.timeout(BOUND_S):
            assert await client.models() == ["llama", "qwen"]
            assert await client.models() == ["llama", "qwen"]
    finally:
        await client.aclose()
    (request,) = fake.requests
    assert request.method == "GET" and request.url.path == "/v1/models"
    assert request.headers["authorization"] == "Bearer t0k"


async def test_models_refused_is_a_turn_failure_with_the_reason() -> None:
    """X2: a dataplane that refuses the token says so when models are listed."""
    fake = FakeDataplane(error(401, "missing or invalid bearer token"))
    client = fake.client()
    try:
        with pytest.raises(TurnFailed, match="cannot list models: 401 missing or invalid"):
            async with asyncio.timeout(BOUND_S):
                await client.models()
    finally:
        await client.aclose()


async def test_models_unreachable_is_a_turn_failure() -> None:
    fake = FakeDataplane(httpx.ConnectError("connection refused"))
    client = fake.client()
    try:
        with pytest.raises(TurnFailed, match=r"cannot list models at http://dataplane\.test"):
            async with asyncio.timeout(BOUND_S):
                await client.models()
    finally:
        await client.aclose()


async def test_end_run_sends_delete_with_the_token_and_never_raises() -> None:
    """R15: DELETE /v1/runs/{id} with the token; a 404 or an outage is only logged."""
    fake = FakeDataplane(error(404, "unknown run"), httpx.ConnectError("down"))
    client = fake.client(token="t0k")
    try:
        async with asyncio.timeout(BOUND_S):
            await client.end_run("run-9")
            await client.end_run("run-9")
    finally:
        await client.aclose()
    first = fake.requests[0]
    assert first.method == "DELETE" and first.url.path == "/v1/runs/run-9"
    assert first.headers["authorization"] == "Bearer t0k"
    assert len(fake.requests) == 2
