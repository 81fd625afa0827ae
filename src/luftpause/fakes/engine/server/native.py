"""``POST /v1/messages`` and ``POST /v1/responses`` (H1), served by the engine itself as
vLLM now serves both: the request is translated to Chat Completions (with the
dataplane's own translation, ``luftpause.dataplane.apis``), run as any chat turn,
and its reply translated back, streamed event by event or whole. This lets tests
pass a turn through the dataplane to an endpoint that serves the API natively
(``native_apis``, B9) and see that its bytes arrive unchanged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from luftpause.dataplane.apis import ClientApi, StreamTranslator
from luftpause.dataplane.errors import BadRequest

ChatHandler = Callable[[Request], Awaitable[Response]]


async def native(request: Request, api: ClientApi, chat: ChatHandler) -> Response:
    raw = await request.body()
    try:
        translated = api.parse(raw)
    except BadRequest as exc:
        return JSONResponse(api.error_body(400, exc.message, None), 400)
    body: dict[str, Any] = dict(translated.chat)
    if translated.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    reply = await chat(_with_body(request, json.dumps(body).encode()))
    if reply.status_code != 200:
        kept = {k: v for k, v in reply.headers.items() if k.lower() == "retry-after"}
        return JSONResponse(
            api.error_body(reply.status_code, _message(reply), None),
            reply.status_code,
            headers=kept,
        )
    if isinstance(reply, StreamingResponse):
        events = _translated(reply.body_iterator, translated.stream_translator())
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return JSONResponse(translated.reply(json.loads(bytes(reply.body))))


def _with_body(request: Request, body: bytes) -> Request:
    """``request`` with ``body`` as its body; later reads of ``receive`` (the client
    leaving) go to the real one."""
    sent = False

    async def receive() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    scope = dict(request.scope)
    scope["headers"] = [(k, v) for k, v in request.scope["headers"] if k != b"content-length"]
    return Request(scope, receive)


def _message(reply: Response) -> str:
    try:
        error = json.loads(bytes(reply.body)).get("error", {})
        return str(error.get("message", "")) or f"status {reply.status_code}"
    except (ValueError, AttributeError):
        return f"status {reply.status_code}"


async def _translated(
    chunks: AsyncIterable[str | bytes | memoryview], translator: StreamTranslator
) -> AsyncIterator[bytes]:
    buffer = b""
    async for piece in chunks:
        buffer += piece.encode() if isinstance(piece, str) else bytes(piece)
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.splitlines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    yield translator.done()
                else:
                    yield translator.chunk(json.loads(payload))
