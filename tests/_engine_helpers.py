"""Helpers for the fake-engine tests: an in-process server on port 0, bounded polling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from luftpause.fakes.engine.server import ServerConfig, create_app
from luftpause.serving import bind_socket, bound_port, uvicorn_server, wait_started


@contextlib.asynccontextmanager
async def running_engine(config: ServerConfig) -> AsyncIterator[tuple[str, Any]]:
    """Serve a fake engine on 127.0.0.1:0 in this event loop; yields (base URL, app)."""
    app = create_app(config)
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn_server(app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await asyncio.wait_for(wait_started(server, task), 10)
        yield f"http://127.0.0.1:{bound_port(sock)}", app
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def wait_until(
    predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition"
) -> Any:
    """Poll an async predicate until it returns a truthy value; bounded."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


class RecordingEngine:
    """An ASGI app (a fake engine) behind a recorder: each chat request's headers and
    JSON body are kept in ``seen``, then the request goes on to ``app`` unchanged."""

    CHAT = "/v1/chat/completions"

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, body in self.seen]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != self.CHAT:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append((headers, json.loads(raw)))
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:  # after the body, what the transport says (a disconnect at the end)
                return dict(await receive())
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.app(scope, replay, send)
