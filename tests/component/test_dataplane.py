"""The dataplane app in process: a real in-process scheduler over gRPC, mock engines.

Covers D1–D10 and S6 rows that need no real engine process; streaming,
disconnects and mid-stream failures are covered in tests/integration.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest
from _dataplane_stack import (
    COMPLETION,
    MODEL,
    TOOL_COMPLETION,
    Stack,
    chat,
    nothing_in_flight,
    paused_by_a_tool_call,
    settle,
    stack_fixture,  # noqa: F401  (provides the stack fixture)
)

from luftpause.config import ClassPriority
from luftpause.dataplane.app import create_app
from luftpause.scheduler.core import ReplicaProbed, RunPhase


async def test_plain_reply_passes_through_unchanged(stack: Stack) -> None:
    """D1, D5: the engine's bytes reach the client unchanged; headers name run and replica."""
    stack.engine.reply = lambda r: httpx.Response(
        200, content=b'{"exact":  "bytes"}', headers={"content-type": "application/json"}
    )
    resp = await stack.client.post(
        "/v1/chat/completions", json=chat(), headers={"x-luftpause-run-id": "run-1"}
    )
    assert resp.status_code == 200 and resp.content == b'{"exact":  "bytes"}'
    assert resp.headers["x-luftpause-run-id"] == "run-1"
    assert resp.headers["x-luftpause-replica"] == "engine-a"
    assert int(resp.headers["x-luftpause-held-ms"]) >= 0
    await settle(stack.host, lambda: not stack.host.state.turns)
    assert stack.host.state.runs["run-1"].phase is RunPhase.IDLE


async def test_tool_call_pauses_run_and_echoed_id_finds_it(stack: Stack) -> None:
    """D2, D5: a reply in tool calls pauses the run; the echoed tool_call_id names the run."""
    first = await paused_by_a_tool_call(stack)
    run_id = first.headers["x-luftpause-run-id"]
    messages = [
        {"role": "user", "content": "hi"},
        TOOL_COMPLETION["choices"][0]["message"],  # type: ignore[index]
        {"role": "tool", "tool_call_id": "call_abc", "content": "42"},
    ]
    second = await stack.client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages}
    )
    assert second.headers["x-luftpause-run-id"] == run_id
    third = await stack.client.post("/v1/chat/completions", json=chat())
    assert third.headers["x-luftpause-run-id"] != run_id  # no header, no echo: a new run


async def test_class_and_caller_headers(stack: Stack) -> None:
    """D3: class is interactive|batch; caller truncated to 128 bytes; bad class is a 400."""
    long_caller = ("é" * 100).encode()  # 200 bytes of UTF-8
    resp = await stack.client.post(
        "/v1/chat/completions",
        json=chat(),
        headers={
            b"x-luftpause-run-id": b"r",
            b"x-luftpause-class": b"interactive",
            b"x-luftpause-caller": long_caller,
        },
    )
    assert resp.status_code == 200
    run = stack.host.state.runs["r"]
    assert run.caller == "é" * 64 and run.service_class.value == "interactive"
    bad = await stack.client.post(
        "/v1/chat/completions", json=chat(), headers={"x-luftpause-class": "urgent"}
    )
    assert bad.status_code == 400
    assert "x-luftpause-class" in bad.json()["error"]["message"]


async def test_unknown_model_is_404_before_queueing(stack: Stack) -> None:
    """S6, D6: 404 with the exact message and the run header; no engine request."""
    resp = await stack.client.post("/v1/chat/completions", json=chat(model="other"))
    assert resp.status_code == 404
    assert resp.json() == {
        "error": {
            "message": "no Generative replica serves model 'other'",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
    assert "x-luftpause-run-id" in resp.headers
    assert not stack.engine.seen and not stack.host.state.held


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1]", "JSON object"),
        (b'{"messages": []}', "'model' is required"),
        (b'{"model": "m"}', "'messages'"),
    ],
)
async def test_bad_request_bodies(stack: Stack, body: bytes, problem: str) -> None:
    """Bad input gets a clear 400 naming the problem."""
    resp = await stack.client.post("/v1/chat/completions", content=body)
    assert resp.status_code == 400 and problem in resp.json()["error"]["message"]


@pytest.mark.parametrize("status", [429, 503])
async def test_engine_rejection_passes_status_body_and_retry_after(
    stack: Stack, status: int
) -> None:
    """D6: engine 429/5xx: status and body unchanged, with Retry-After; turn reported failed."""
    stack.engine.reply = lambda r: httpx.Response(
        status, content=b"slow down", headers={"retry-after": "3"}
    )
    resp = await stack.client.post(
        "/v1/chat/completions", json=chat(), headers={"x-luftpause-run-id": "r"}
    )
    assert (resp.status_code, resp.content, resp.headers["retry-after"]) == (
        status,
        b"slow down",
        "3",
    )
    assert resp.headers["x-luftpause-run-id"] == "r"
    await settle(stack.host, lambda: not stack.host.state.turns)
    assert stack.host.state.runs["r"].phase is RunPhase.IDLE
    assert stack.host.state.replicas["engine-a"].in_flight == 0


async def test_engine_unreachable_is_502_naming_the_replica(stack: Stack) -> None:
    """D6: connection failure → 502 `engine <replica>: <error>`; slot freed."""

    await stack.engine.stop()  # nothing listens there any more: connection refused
    resp = await stack.client.post("/v1/chat/completions", json=chat())
    assert resp.status_code == 502
    assert resp.json()["error"]["message"].startswith("engine engine-a: connection failed")
    assert "x-luftpause-run-id" in resp.headers
    await settle(stack.host, lambda: stack.host.state.replicas["engine-a"].in_flight == 0)


@pytest.mark.parametrize("stack", ["s3cret"], indirect=True)
async def test_auth_token_and_engine_keys(stack: Stack) -> None:
    """D9: bearer token required; the client's Authorization never reaches the engine,
    which gets its own configured key."""
    missing = await stack.client.post("/v1/chat/completions", json=chat())
    assert missing.status_code == 401 and "bearer" in missing.json()["error"]["message"]
    wrong = await stack.client.get("/v1/models", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = await stack.client.post(
        "/v1/chat/completions", json=chat(), headers={"authorization": "Bearer s3cret"}
    )
    assert ok.status_code == 200
    # B9: Anthropic's clients send the token as x-api-key; it is never forwarded either.
    keyed = await stack.client.post(
        "/v1/chat/completions", json=chat(), headers={"x-api-key": "s3cret"}
    )
    assert keyed.status_code == 200
    wrong_key = await stack.client.post(
        "/v1/chat/completions", json=chat(), headers={"x-api-key": "nope"}
    )
    assert wrong_key.status_code == 401
    assert [r.headers.get("authorization") for r in stack.engine.seen] == ["Bearer engine-key"] * 2
    assert all("x-api-key" not in r.headers for r in stack.engine.seen)
    assert (await stack.client.get("/health")).status_code == 200  # not a /v1 route


async def test_headers_forwarded_except_hop_by_hop_and_ours(stack: Stack) -> None:
    """D1, X1: trace context and custom headers reach the engine; luftpause's do not."""
    await stack.client.post(
        "/v1/chat/completions",
        json=chat(),
        headers={
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "x-custom": "1",
            "x-luftpause-class": "batch",
        },
    )
    sent = stack.engine.seen[0].headers
    assert sent["traceparent"].startswith("00-0af7") and sent["x-custom"] == "1"
    assert "x-luftpause-class" not in sent


async def test_streaming_asks_engine_for_usage(stack: Stack) -> None:
    """D5: a stream without include_usage is sent with it, so usage can be reported."""
    body = (
        b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
        b"data: [DONE]\n\n"
    )

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 7):  # arbitrary splits, as a network would
            yield body[i : i + 7]

    stack.engine.reply = lambda r: httpx.Response(
        200, content=chunks(), headers={"content-type": "text/event-stream"}
    )
    resp = await stack.client.post("/v1/chat/completions", json=chat(stream=True))
    assert resp.status_code == 200
    assert b'"usage"' not in resp.content and resp.content.endswith(b"data: [DONE]\n\n")
    assert json.loads(stack.engine.seen[0].content)["stream_options"] == {"include_usage": True}
    asked = await stack.client.post(
        "/v1/chat/completions", json=chat(stream=True, stream_options={"include_usage": True})
    )
    assert asked.content == body


@pytest.mark.parametrize("stream", [True, False])
async def test_only_a_streamed_reply_reports_its_first_token(stack: Stack, stream: bool) -> None:
    """D5, decode pace: the scheduler reads a replica's pace from a reply's first token
    to its end, so a streamed reply reports its first token and one that arrives whole
    (which would read as instant) does not."""
    state = stack.host.state
    stack.host.state = replace(state, params=replace(state.params, interactive_pace_s=0.1))
    usage = {"prompt_tokens": 3, "completion_tokens": 20}
    if stream:
        body = (
            b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
            b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
            b'data: {"choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\n"
            b"data: [DONE]\n\n"
        )
        stack.engine.reply = lambda r: httpx.Response(
            200, content=body, headers={"content-type": "text/event-stream"}
        )
    else:
        stack.engine.reply = lambda r: httpx.Response(200, json={**COMPLETION, "usage": usage})
    resp = await stack.client.post("/v1/chat/completions", json=chat(stream=stream))
    assert resp.status_code == 200
    await settle(stack.host, lambda: not stack.host.state.turns)
    paces = [r.pace_s for r in stack.host.state.replicas.values()]
    assert (paces.count(None) == len(paces) - 1) if stream else set(paces) == {None}


async def test_class_priority_is_sent_to_engines_that_order_by_it(stack: Stack) -> None:
    """S4, D1: an endpoint with class_priority gets each turn's class priority in the
    body; a client's own priority is kept; an endpoint without it gets the body as sent."""
    raw = json.dumps(chat()).encode()
    await stack.client.post("/v1/chat/completions", content=raw)
    assert stack.engine.seen[-1].content == raw  # untouched without class_priority
    stack.dp.endpoints["engine-a"] = stack.dp.endpoints["engine-a"].model_copy(
        update={"class_priority": ClassPriority(interactive=10, batch=0)}
    )
    for cls, expected in (("interactive", 10), ("batch", 0)):
        resp = await stack.client.post(
            "/v1/chat/completions", json=chat(), headers={"x-luftpause-class": cls}
        )
        assert resp.status_code == 200
        assert json.loads(stack.engine.seen[-1].content)["priority"] == expected
    await stack.client.post(
        "/v1/chat/completions", json=chat(priority=3), headers={"x-luftpause-class": "batch"}
    )
    assert json.loads(stack.engine.seen[-1].content)["priority"] == 3
    await stack.client.post("/v1/chat/completions", json=chat(stream=True))
    sent = json.loads(stack.engine.seen[-1].content)
    assert sent["priority"] == 0 and sent["stream_options"] == {"include_usage": True}


def body_then_disconnect(
    body: bytes, gone: asyncio.Event
) -> Callable[[], Awaitable[dict[str, Any]]]:
    """An ASGI ``receive``: the whole request body, then "disconnect" once ``gone`` is set."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    return receive


def chat_scope(run_id: str) -> dict[str, Any]:
    """An ASGI scope for ``POST /v1/chat/completions`` naming ``run_id``, for tests that
    drive the app with their own ``receive`` and ``send``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"x-luftpause-run-id", run_id.encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("dp", 80),
    }


async def test_turn_admitted_as_its_client_leaves_frees_its_slot(stack: Stack) -> None:
    """D4, S10 (BUG): a client that leaves while its turn waits cancels the Admit call.
    If the scheduler admitted the turn before that cancel reached it (or its answer
    arrived as the client left), nothing ever reported the turn: its slot stayed taken
    until the 10-minute turn timeout, and under load such slots piled up. The dataplane
    now reports the abandoned turn as failed, which frees an admitted one."""
    real_admit = stack.dp.link.admit

    async def admitted_but_answer_lost(req: Any) -> Any:
        await real_admit(req)  # the scheduler admits and counts it in flight ...
        await asyncio.Event().wait()  # ... but the answer is still on its way

    stack.dp.link.admit = admitted_but_answer_lost  # type: ignore[method-assign]
    leave = asyncio.Event()
    receive = body_then_disconnect(json.dumps(chat()).encode(), leave)

    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scope = chat_scope("r-left")
    replica = lambda: stack.host.state.replicas["engine-a"]  # noqa: E731
    call = asyncio.create_task(create_app(stack.dp)(scope, receive, send))
    await settle(stack.host, lambda: replica().in_flight == 1)
    leave.set()
    await asyncio.wait_for(call, 5)
    assert statuses == [499]
    await settle(stack.host, lambda: replica().in_flight == 0)
    assert "r-left" not in {t.run_id for t in stack.host.state.turns.values()}
    assert stack.engine.seen == []  # the engine never heard of it


@pytest.mark.parametrize("stream", [True, False])
async def test_the_end_of_the_answer_is_not_the_client_leaving(stack: Stack, stream: bool) -> None:
    """D5, D6: once the answer is complete, uvicorn's ``receive`` says "disconnect"
    whatever the client does. A server whose ``send`` yields (its socket buffer was full)
    lets the client watch see that before the turn ends: the turn must still end
    finished, and the answer be complete, not be taken for a client that left."""
    if stream:
        events = (
            b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
            b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
            b"data: [DONE]\n\n"
        )
        stack.engine.reply = lambda r: httpx.Response(
            200, content=events, headers={"content-type": "text/event-stream"}
        )
    complete = asyncio.Event()
    receive = body_then_disconnect(json.dumps(chat(stream=stream)).encode(), complete)

    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                complete.set()  # as uvicorn marks the response complete ...
        await asyncio.sleep(0)  # ... and lets other tasks run while it drains

    scope = chat_scope("r-end")
    await asyncio.wait_for(create_app(stack.dp)(scope, receive, send), 5)
    answer = b"".join(chunks)
    assert answer.endswith(b"data: [DONE]\n\n") if stream else json.loads(answer)["choices"]
    text = stack.dp.metrics.render()[0].decode()
    assert 'luftpause_dataplane_turns_total{outcome="finished",service_class="batch"} 1.0' in text
    assert "client_left" not in text


async def test_models_run_end_and_metrics(stack: Stack) -> None:
    """D1 /v1/models, D8 DELETE /v1/runs/{id}, D10 /metrics."""
    models = (await stack.client.get("/v1/models")).json()
    assert {m["id"] for m in models["data"]} == {MODEL, "clf"}
    await stack.client.post(
        "/v1/chat/completions", json=chat(), headers={"x-luftpause-run-id": "gone"}
    )
    await settle(stack.host, lambda: "gone" in stack.host.state.runs)
    resp = await stack.client.delete("/v1/runs/gone")
    assert resp.status_code == 200 and resp.json() == {"run_id": "gone", "ended": True}
    # Forgotten once its turn's report (which may arrive after the RunEnded) is applied.
    await settle(stack.host, lambda: "gone" not in stack.host.state.runs)
    text = (await stack.client.get("/metrics")).text
    assert 'luftpause_dataplane_turns_total{outcome="finished",service_class="batch"} 1.0' in text
    assert "luftpause_dataplane_held_seconds_bucket" in text
    assert "luftpause_dataplane_time_to_first_token_seconds" in text


async def test_run_end_lets_a_turn_in_flight_end_normally(stack: Stack) -> None:
    """D8, S11: ``DELETE /v1/runs/{id}`` while a turn of the run is in flight: the turn
    stays in the run table, so a resync meanwhile (a restarted scheduler) still lists
    it and the scheduler keeps it admitted; the turn then ends normally, the restarted
    scheduler hears of the run's end, and both sides forget the run after that turn."""
    gate = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        await gate.wait()
        yield json.dumps(COMPLETION).encode()

    stack.engine.reply = lambda r: httpx.Response(
        200, content=slow_body(), headers={"content-type": "application/json"}
    )
    turn = asyncio.ensure_future(
        stack.client.post(
            "/v1/chat/completions", json=chat(), headers={"x-luftpause-run-id": "ending"}
        )
    )
    await settle(stack.host, lambda: bool(stack.engine.seen))
    resp = await stack.client.delete("/v1/runs/ending")
    assert resp.status_code == 200 and resp.json() == {"run_id": "ending", "ended": True}
    assert [t.run_id for t in stack.dp.link.snapshot().in_flight] == ["ending"]

    await stack.stop_scheduler()  # a resync while the turn runs
    await settle(stack.host, lambda: not stack.dp.link.ready.is_set())
    await stack.start_scheduler()
    async with asyncio.timeout(5):
        await stack.dp.link.ready.wait()
    assert [t.run_id for t in stack.host.state.turns.values()] == ["ending"]
    await settle(stack.host, lambda: stack.host.state.runs["ending"].ended)

    gate.set()
    answer = await asyncio.wait_for(turn, 5)
    assert answer.status_code == 200 and answer.json()["choices"]
    await settle(stack.host, lambda: "ending" not in stack.host.state.runs)
    assert "ending" not in stack.dp.runs.runs
    await nothing_in_flight(stack)


async def test_decide_goes_to_the_classifier(stack: Stack) -> None:
    """D7, S13: /v1/decide forwards to a single-pass replica's /classify, outside run
    state; its answer names the replica (``x-luftpause-replica``) as a chat answer does."""
    answer = {
        "object": "list",
        "data": [{"index": 0, "label": "urgent", "probs": [0.9, 0.1], "num_classes": 2}],
    }
    stack.engine.reply = lambda r: httpx.Response(200, json=answer)
    resp = await stack.client.post("/v1/decide", json={"input": "the pager rang"})
    assert resp.status_code == 200 and resp.json() == answer
    assert resp.headers["x-luftpause-replica"] == "classifier"
    assert resp.headers["x-luftpause-run-id"].startswith("decide-")
    sent = stack.engine.seen[0]
    assert sent.path == "/classify"
    assert json.loads(sent.content)["model"] == "clf"
    assert not any(r.startswith("decide-") for r in stack.host.state.runs)
    missing = await stack.client.post("/v1/decide", json={"input": "x", "model": "nope"})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "no SinglePass replica serves model 'nope'"


async def test_turn_waits_while_scheduler_is_down_then_resyncs(stack: Stack) -> None:
    """D6, S11: with the scheduler gone the turn waits; a restarted scheduler is resynced
    (runs, affinity) before the waiting turn is admitted."""
    stack.engine.reply = lambda r: httpx.Response(200, json=TOOL_COMPLETION)
    await stack.client.post(
        "/v1/chat/completions", json=chat(), headers={"x-luftpause-run-id": "keep"}
    )
    await settle(
        stack.host,
        lambda: (
            "keep" in stack.host.state.runs
            and stack.host.state.runs["keep"].phase is RunPhase.PAUSED_ON_TOOL
        ),
    )
    await stack.stop_scheduler()
    await settle(stack.host, lambda: not stack.dp.link.ready.is_set())
    stack.engine.reply = lambda r: httpx.Response(200, json=COMPLETION)
    waiting = asyncio.ensure_future(
        stack.client.post(
            "/v1/chat/completions", json=chat(), headers={"x-luftpause-run-id": "keep"}
        )
    )
    await asyncio.sleep(0.5)
    assert not waiting.done() and len(stack.engine.seen) == 1  # held: no engine request
    await stack.start_scheduler()  # a fresh, empty scheduler on the same address
    resp = await asyncio.wait_for(waiting, 10)
    assert resp.status_code == 200 and resp.headers["x-luftpause-replica"] == "engine-a"
    await settle(stack.host, lambda: not stack.host.state.turns)
    run = stack.host.state.runs["keep"]
    assert run.replica == "engine-a" and stack.dp.link.connects >= 2


def _own_seconds(stack: Stack) -> tuple[float | None, float | None]:
    """The own-time histogram's count and sum."""
    registry = stack.dp.metrics.registry
    return (
        registry.get_sample_value("luftpause_dataplane_own_seconds_count"),
        registry.get_sample_value("luftpause_dataplane_own_seconds_sum"),
    )


@pytest.mark.parametrize("stream", [True, False])
async def test_own_time_leaves_out_the_engines_reply(stack: Stack, stream: bool) -> None:
    """D10: ``luftpause_dataplane_own_seconds`` counts a turn whose engine reply came in
    whole, once, and leaves the engine's time out of it: an engine that takes at least
    0.3 s over its reply leaves the turn's own time at most the client's wall time less
    those 0.3 s. A turn refused before it reached an engine is not counted."""
    pause_s = 0.3

    async def slow_events() -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
        await asyncio.sleep(pause_s)
        yield b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
        yield b"data: [DONE]\n\n"

    async def slow_json() -> AsyncIterator[bytes]:
        await asyncio.sleep(pause_s)
        yield json.dumps(COMPLETION).encode()

    stack.engine.reply = lambda r: httpx.Response(
        200,
        content=slow_events() if stream else slow_json(),
        headers={"content-type": "text/event-stream" if stream else "application/json"},
    )
    refused = await stack.client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert refused.status_code == 400
    assert _own_seconds(stack) == (0.0, 0.0)

    started = time.monotonic()
    resp = await stack.client.post("/v1/chat/completions", json=chat(stream=stream))
    wall_s = time.monotonic() - started
    assert resp.status_code == 200
    count, total = _own_seconds(stack)
    assert count == 1.0
    assert total is not None and 0.0 < total <= wall_s - pause_s


async def test_own_time_leaves_out_the_schedulers_hold(stack: Stack) -> None:
    """D10, D4: a turn the scheduler holds for capacity is counted without its hold; a
    turn whose engine answered other than 200 is not counted. With room for one turn,
    the first turn's engine keeps its slot for 0.6 s and then answers 503; the second
    turn, sent once the engine has the first, is held until then, so its own time is at
    most its wall time less its engine's 0.3 s and most of that hold."""
    await stack.host.apply(
        lambda at: ReplicaProbed(at=at, replica="engine-a", healthy=True, running=1, waiting=1)
    )

    async def slowly(pause_s: float, body: bytes) -> AsyncIterator[bytes]:
        await asyncio.sleep(pause_s)
        yield body

    def reply(seen: Any) -> httpx.Response:
        if len(stack.engine.seen) == 1:
            busy = json.dumps({"error": {"message": "busy"}}).encode()
            return httpx.Response(
                503, content=slowly(0.6, busy), headers={"content-type": "application/json"}
            )
        return httpx.Response(
            200,
            content=slowly(0.3, json.dumps(COMPLETION).encode()),
            headers={"content-type": "application/json"},
        )

    stack.engine.reply = reply
    first = asyncio.ensure_future(
        stack.client.post("/v1/chat/completions", json=chat(), headers={"x-luftpause-run-id": "a"})
    )
    async with asyncio.timeout(5):
        while not stack.engine.seen:
            await asyncio.sleep(0.005)
    started = time.monotonic()
    second = await stack.client.post(
        "/v1/chat/completions", json=chat(), headers={"x-luftpause-run-id": "b"}
    )
    wall_s = time.monotonic() - started
    assert (await first).status_code == 503
    assert second.status_code == 200
    assert int(second.headers["x-luftpause-held-ms"]) >= 300  # it was held
    count, total = _own_seconds(stack)
    assert count == 1.0  # the 503 is not counted
    assert total is not None and 0.0 < total <= wall_s - 0.3 - 0.25
