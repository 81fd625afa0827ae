"""Helpers for the fake-engine tests: an in-process server on port 0, bounded polling."""

from __future__ import annotations

import asyncio
import contextlib
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
