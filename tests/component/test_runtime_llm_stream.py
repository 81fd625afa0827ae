"""R4, R14: the runtime's streamed turns against an in-process fake dataplane - what a
stream asks for, and a stream that breaks off, says it failed or is not a chat
completion stream. (Every behaviour the two modes share is tested in both modes in
``test_runtime_llm_client.py``, whose fake this reuses.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from test_runtime_llm_client import (
    BODY,
    IDENTITY,
    REPLY,
    FakeDataplane,
    chat,
    chunks_of,
    event_stream,
    ok,
    sse,
)

from luftpause.runtime.llm import TurnFailed


async def test_a_streamed_turn_asks_for_usage_and_keeps_its_own_stream_options() -> None:
    """R4: the usage the run's budgets count must come back, so a streamed turn asks for
    it (the dataplane would otherwise ask itself and hide it); a turn's own stream
    options go too."""
    fake = FakeDataplane(ok())
    body = {**BODY, "stream_options": {"continuous_usage_stats": True}}
    data = await chat(fake.client(), body)
    sent = json.loads(fake.chat_requests[0].content)
    assert sent["stream"] is True
    assert sent["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
    assert data == REPLY


async def test_a_turn_can_be_sent_unstreamed() -> None:
    """R4, R13: ``stream_turns = false``, or ``stream=False`` for one turn (decide's
    one-token turn): the body goes as given, without ``stream``."""
    fake = FakeDataplane(ok())
    await chat(fake.client(stream_turns=False))
    client = fake.client()
    try:
        async with asyncio.timeout(10):
            data = await client.chat(BODY, IDENTITY, stream=False)
    finally:
        await client.aclose()
    assert [json.loads(r.content) for r in fake.chat_requests] == [BODY, BODY]
    assert data == REPLY


def breaks_after(events: bytes) -> httpx.Response:
    """A stream that sends ``events`` and then loses its connection."""

    async def body() -> AsyncIterator[bytes]:
        yield events
        raise httpx.ReadError("connection reset mid-stream")

    return event_stream(body())


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(event_stream(sse(chunks_of(REPLY)[:3], done=False)), id="no-done"),
        pytest.param(breaks_after(sse(chunks_of(REPLY)[:3], done=False)), id="reset"),
        pytest.param(
            event_stream(sse([*chunks_of(REPLY)[:2], {"error": {"message": "engine died"}}])),
            id="error-event",
        ),
    ],
)
async def test_a_stream_that_breaks_off_is_retried_and_the_turn_succeeds(
    broken: httpx.Response,
) -> None:
    """R14, D1 (an engine that fails mid-stream: the chunks so far, then the connection
    closes without [DONE]): the turn is sent again, as after a 5xx, and the reply is
    the one whole stream's, nothing of the broken one mixed in."""
    fake = FakeDataplane(broken, ok())
    data = await chat(fake.client())
    assert len(fake.chat_requests) == 2
    assert data == REPLY


async def test_a_stream_that_keeps_breaking_off_fails_the_turn() -> None:
    """R14: the retries a 5xx gets, then TurnFailed saying why."""
    fake = FakeDataplane(event_stream(sse(chunks_of(REPLY)[:2], done=False)))
    with pytest.raises(TurnFailed, match=r"the stream ended before \[DONE\]"):
        await chat(fake.client(transient_retries=2))
    assert len(fake.chat_requests) == 3
    fake = FakeDataplane(event_stream(sse([{"error": {"message": "out of memory"}}])))
    with pytest.raises(TurnFailed, match="the stream ended with an error: out of memory"):
        await chat(fake.client(transient_retries=1))
    assert len(fake.chat_requests) == 2
    fake = FakeDataplane(breaks_after(sse(chunks_of(REPLY)[:2], done=False)))
    with pytest.raises(TurnFailed, match=r"the stream broke off: ReadError\('connection reset"):
        await chat(fake.client(transient_retries=0))
    assert len(fake.chat_requests) == 1


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"data: <html>\n\ndata: [DONE]\n\n", "an event of the stream is not JSON"),
        (b"data: [1, 2]\n\ndata: [DONE]\n\n", "not a JSON object"),
        (b'data: {"id": "x", "choices": []}\n\ndata: [DONE]\n\n', "no choices"),
        (b": only a comment\n\ndata: [DONE]\n\n", "no choices"),
    ],
)
async def test_a_stream_that_is_not_a_chat_completion_fails_the_turn_at_once(
    content: bytes, why: str
) -> None:
    """R4: a 200 stream that is not a chat completion fails the turn (never a crash in
    the loop, never a retry: sending it again would get the same)."""
    fake = FakeDataplane(event_stream(content))
    with pytest.raises(TurnFailed, match=why):
        await chat(fake.client())
    assert len(fake.chat_requests) == 1


async def test_a_cancelled_streamed_turn_closes_its_stream() -> None:
    """R4, D1 (client leaves mid-stream: the dataplane ends the engine's request): a run
    cancelled while its reply streams closes the response, and nothing is sent again."""
    closed = asyncio.Event()
    streaming = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        try:
            yield sse(chunks_of(REPLY)[:2], done=False)
            streaming.set()
            await asyncio.Event().wait()  # the rest never comes
            yield b""
        finally:
            closed.set()

    fake = FakeDataplane(event_stream(body()))
    client = fake.client()
    task = asyncio.create_task(client.chat(BODY, IDENTITY))
    try:
        async with asyncio.timeout(10):
            await streaming.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await closed.wait()
    finally:
        await client.aclose()
    assert len(fake.chat_requests) == 1


async def test_a_whole_stream_whose_connection_then_fails_is_kept() -> None:
    """R4: a transport error after [DONE] does not cost the reply (nor a second turn)."""
    fake = FakeDataplane(breaks_after(sse(chunks_of(REPLY))), ok())
    data = await chat(fake.client())
    assert len(fake.chat_requests) == 1
    assert data == REPLY


async def test_an_error_event_is_read_by_its_code() -> None:
    """R14: an error event with a 4xx code (SGLang and vLLM send a bad request's error
    in the stream) fails the turn at once, as that status would; a 429 waits and the
    turn is sent again; a 5xx or no code is retried."""
    bad = event_stream(sse([{"error": {"message": "prompt too long", "code": 400}}]))
    fake = FakeDataplane(bad)
    with pytest.raises(TurnFailed, match="the stream ended with an error: 400 prompt too long"):
        await chat(fake.client())
    assert len(fake.chat_requests) == 1
    busy = event_stream(sse([{"error": {"message": "queue full", "code": 429}}]))
    fake = FakeDataplane(busy, ok())
    assert await chat(fake.client(transient_retries=0)) == REPLY
    assert len(fake.chat_requests) == 2
    failing = event_stream(sse([{"error": {"message": "engine died", "code": "500"}}]))
    fake = FakeDataplane(failing, ok())
    assert await chat(fake.client()) == REPLY
    assert len(fake.chat_requests) == 2


async def test_events_sent_under_another_content_type_are_read_as_events() -> None:
    """R4: a proxy that drops the event-stream content type still delivers the reply."""
    fake = FakeDataplane(httpx.Response(200, content=sse(chunks_of(REPLY))))
    assert await chat(fake.client()) == REPLY


async def test_a_stream_without_usage_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """R4, R10: an upstream that ignores include_usage leaves runs' token counts at 0;
    the runtime says so (once), naming the way out."""
    no_usage = sse([c for c in chunks_of(REPLY) if c["choices"]])
    fake = FakeDataplane(event_stream(no_usage))
    client = fake.client()
    try:
        async with asyncio.timeout(10):
            for _ in range(2):
                data = await client.chat(BODY, IDENTITY)
    finally:
        await client.aclose()
    assert "usage" not in data
    warnings = [r for r in caplog.records if "without usage" in r.getMessage()]
    assert len(warnings) == 1 and "stream_turns = false" in warnings[0].getMessage()
