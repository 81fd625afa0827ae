"""The proxy is faithful (D1, D6): a client gets the bytes the engine would have sent it
for its own request, and every error of the proxy's own is OpenAI's shape with a run ID.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from _dataplane_stack import (
    MODEL,
    Seen,
    Stack,
    chat,
    nothing_in_flight,
    stack_fixture,  # noqa: F401  (provides the stack fixture)
)

RUN = "x-luftpause-run-id"


def openai_like_reply(compact: bool, always_null: bool = False) -> Any:
    """An engine answering as OpenAI documents it: with ``stream_options.include_usage``
    every chunk carries ``"usage": null`` and a usage-only chunk comes last; without it,
    neither (``always_null``: the nulls come either way, as an engine serialising every
    field does). ``compact`` JSON as pydantic writes it, else ``json.dumps``' spacing."""
    separators = (",", ":") if compact else (", ", ": ")

    def line(payload: object) -> bytes:
        return b"data: " + json.dumps(payload, separators=separators).encode() + b"\n\n"

    def reply(seen: Seen) -> httpx.Response:
        body = json.loads(seen.content)
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        if not body.get("stream"):
            whole = {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "a b c"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
            return httpx.Response(
                200,
                content=json.dumps(whole, separators=separators).encode(),
                headers={"content-type": "application/json"},
            )
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks: list[bytes] = []
        for i, delta in enumerate(
            (
                {"role": "assistant", "content": ""},
                {"content": "a"},
                {"content": ' "usage": null'},
                {},
            )
        ):
            chunk: dict[str, Any] = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "logprobs": None,
                        "finish_reason": "stop" if i == 3 else None,
                    }
                ],
            }
            if include or always_null:
                chunk["usage"] = None
            chunks.append(line(chunk))
        if include:
            chunks.append(
                line(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": body["model"],
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        chunks.append(b"data: [DONE]\n\n")
        raw = b"".join(chunks)

        async def split() -> AsyncIterator[bytes]:
            for i in range(0, len(raw), 11):  # arbitrary splits, as a network would
                yield raw[i : i + 11]

        return httpx.Response(200, content=split(), headers={"content-type": "text/event-stream"})

    return reply


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "spaced"])
@pytest.mark.parametrize(
    "extra",
    [
        {"stream": True},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"stream": True, "stream_options": {"include_usage": False}},
        {"stream": True, "stream_options": {}},
        {"stream": True, "stream_options": None},
        {"stream": False},
    ],
    ids=["no-options", "usage", "usage-false", "empty-options", "null-options", "plain"],
)
async def test_proxied_reply_is_the_direct_reply_byte_for_byte(
    stack: Stack, compact: bool, extra: dict[str, Any]
) -> None:
    """D1, D5: the same request straight to the engine and through the proxy gives the
    same bytes, also when the proxy asked the engine for usage on its own behalf (it
    still reports that usage)."""
    stack.engine.reply = openai_like_reply(compact)
    request = chat(**extra)
    async with httpx.AsyncClient() as direct_client:
        direct = await direct_client.post(f"{stack.engine.url}/v1/chat/completions", json=request)
    proxied = await stack.client.post("/v1/chat/completions", json=request)
    assert proxied.status_code == direct.status_code == 200
    assert proxied.content == direct.content
    asked_engine = json.loads(stack.engine.seen[-1].content)
    if extra.get("stream"):
        assert asked_engine["stream_options"]["include_usage"] is True
    reported = stack.dp.metrics.registry.get_sample_value(
        "luftpause_dataplane_turns_total", {"service_class": "batch", "outcome": "finished"}
    )
    assert reported == 1
    await nothing_in_flight(stack)


async def test_bytes_after_the_last_event_reach_the_client_in_order(stack: Stack) -> None:
    """D1: what an engine writes after ``[DONE]`` (held by the relay until the reply ends,
    so the end goes out in one write) still reaches the client, after ``[DONE]``."""
    events = [
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},'
        b'"finish_reason":null}]}\n\n',
        b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
        b"data: [DONE]\n\n",
        b": a comment after the end\n\n",
        b"data: [DONE]\n\n",
    ]

    def reply(seen: Seen) -> httpx.Response:
        async def pieces() -> AsyncIterator[bytes]:
            for event in events:
                yield event

        return httpx.Response(200, content=pieces(), headers={"content-type": "text/event-stream"})

    stack.engine.reply = reply
    proxied = await stack.client.post(
        "/v1/chat/completions", json=chat(stream=True, stream_options={"include_usage": True})
    )
    assert proxied.status_code == 200
    assert proxied.content == b"".join(events)
    await nothing_in_flight(stack)


async def _error(resp: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    assert error["code"] == code
    assert resp.headers[RUN].strip()
    return dict(error)


async def test_unknown_route_and_wrong_method_answer_in_openai_shape(stack: Stack) -> None:
    """D6: an unknown route is a 404 and a wrong method a 405 (with ``Allow``), both
    ``{"error": {...}}`` naming what is served, with the client's run ID or a new one."""
    missing = await stack.client.post("/v1/completions", json={}, headers={RUN: "r-1"})
    error = await _error(missing, 404, "not_found")
    assert "/v1/completions" in error["message"] and "/v1/chat/completions" in error["message"]
    assert missing.headers[RUN] == "r-1"
    wrong = await stack.client.get("/v1/chat/completions")
    error = await _error(wrong, 405, "method_not_allowed")
    assert wrong.headers["allow"] == "POST" and "POST" in error["message"]
    assert wrong.headers[RUN].startswith("run-")
    assert not stack.engine.seen


async def test_body_that_is_not_json_is_415_and_untyped_json_is_served(stack: Stack) -> None:
    """D6: a body declared as something other than JSON is refused before admission; a
    JSON body with no Content-Type or with a charset parameter is served."""
    raw = json.dumps(chat()).encode()
    form = await stack.client.post(
        "/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/x-www-form-urlencoded", RUN: "r-2"},
    )
    error = await _error(form, 415, "unsupported_media_type")
    assert "application/x-www-form-urlencoded" in error["message"]
    assert form.headers[RUN] == "r-2"
    assert not stack.engine.seen
    for headers in ({"content-type": "application/json; charset=utf-8"}, {}):
        ok = await stack.client.post("/v1/chat/completions", content=raw, headers=headers)
        assert ok.status_code == 200, ok.text
    assert len(stack.engine.seen) == 2
    await nothing_in_flight(stack)


async def test_oversized_body_is_413_and_never_reaches_an_engine(stack: Stack) -> None:
    """D6: a body over ``dataplane.max_body_bytes`` is a 413, whether its length is
    declared or it arrives chunked; nothing is admitted or forwarded."""
    stack.dp.settings = stack.dp.settings.model_copy(update={"max_body_bytes": 4096})
    big = json.dumps(chat(padding="x" * 10_000)).encode()
    declared = await stack.client.post("/v1/chat/completions", content=big)
    error = await _error(declared, 413, "request_too_large")
    assert "4096" in error["message"] and "max_body_bytes" in error["message"]

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    chunked = await stack.client.post(
        "/v1/chat/completions", content=pieces(), headers={"content-type": "application/json"}
    )
    await _error(chunked, 413, "request_too_large")
    decide = await stack.client.post("/v1/decide", content=big)
    await _error(decide, 413, "request_too_large")
    assert not stack.engine.seen
    small = await stack.client.post("/v1/chat/completions", json=chat())
    assert small.status_code == 200
    await nothing_in_flight(stack)


@pytest.mark.parametrize("stack", ["s3cret"], indirect=True)
async def test_every_401_names_a_run_and_the_scheme(stack: Stack) -> None:
    """D6, D9: a 401 on any /v1 route carries ``WWW-Authenticate: Bearer`` and a run ID."""
    for method, path in (
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/decide"),
        ("GET", "/v1/models"),
        ("DELETE", "/v1/runs/r-9"),
    ):
        resp = await stack.client.request(method, path, json=chat())
        await _error(resp, 401, "invalid_api_key")
        assert resp.headers["www-authenticate"].lower().startswith("bearer")


async def test_chat_with_a_single_pass_model_points_to_decide(stack: Stack) -> None:
    """D7, S6: chatting with a classifier listed by /v1/models says to use /v1/decide."""
    listed = {m["id"] for m in (await stack.client.get("/v1/models")).json()["data"]}
    assert {"clf", MODEL} <= listed
    resp = await stack.client.post("/v1/chat/completions", json=chat(model="clf"))
    error = await _error(resp, 404, "model_not_found")
    assert "/v1/decide" in error["message"] and "'clf'" in error["message"]
    assert not stack.engine.seen


@pytest.mark.parametrize("extra", [{}, {"stream_options": {"include_usage": True}}])
async def test_engine_that_always_writes_null_usage_is_relayed_as_sent(
    stack: Stack, extra: dict[str, Any]
) -> None:
    """D1: for an endpoint configured with ``null_usage_when_asked = false`` (its engine
    writes ``"usage": null`` whether asked or not) the proxied stream is still the
    direct one, byte for byte."""
    stack.engine.reply = openai_like_reply(compact=True, always_null=True)
    stack.dp.endpoints["engine-a"] = stack.dp.endpoints["engine-a"].model_copy(
        update={"null_usage_when_asked": False}
    )
    request = chat(stream=True, **extra)
    async with httpx.AsyncClient() as direct_client:
        direct = await direct_client.post(f"{stack.engine.url}/v1/chat/completions", json=request)
    proxied = await stack.client.post("/v1/chat/completions", json=request)
    assert b'"usage":null' in direct.content
    assert proxied.content == direct.content
    await nothing_in_flight(stack)


async def test_models_and_operational_routes_answer_with_a_run_id_and_json_errors(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D6: ``GET /v1/models`` names a run like every other /v1 answer; a failure inside
    ``/metrics`` is a JSON 500 with a run ID, not a bare text page."""
    listed = await stack.client.get("/v1/models", headers={RUN: "r-7"})
    assert listed.status_code == 200 and listed.headers[RUN] == "r-7"

    def broken() -> tuple[bytes, str]:
        raise RuntimeError("registry broke")

    monkeypatch.setattr(stack.dp.metrics, "render", broken)
    failed = await stack.client.get("/metrics")
    await _error(failed, 500, None)


async def test_vllm_xargs_reaches_the_engine_unchanged(stack: Stack) -> None:
    """D1: ``vllm_xargs`` (a program-scheduling router's ``agentic_context``, in the
    string and the object form) is the engine's business: the proxy passes it on as the
    client wrote it, when it adds members of its own too."""
    stack.engine.reply = openai_like_reply(True)
    for context in ('{"program_id":"run-1","expected_resume":false}', {"program_id": "run-2"}):
        request = chat(stream=True, vllm_xargs={"agentic_context": context, "n": 1})
        proxied = await stack.client.post("/v1/chat/completions", json=request)
        assert proxied.status_code == 200
        asked_engine = json.loads(stack.engine.seen[-1].content)
        assert asked_engine["vllm_xargs"] == request["vllm_xargs"]
        assert asked_engine["stream_options"] == {"include_usage": True}  # the proxy's own
    await nothing_in_flight(stack)
