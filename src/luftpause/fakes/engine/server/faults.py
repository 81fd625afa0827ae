"""Fault injection (H1, for D6): how the fake engine fails on purpose.

Per request with header ``x-fake-fault``, per server with ``--fault``:

* ``refuse`` closes the connection without answering. Per server it applies to
  every path (the engine looks down), before routing.
* ``midstream`` streams ``MIDSTREAM_CHUNKS`` content chunks and then drops the
  connection without ``[DONE]``; not streamed, it drops the connection once the
  reply is half done.
* ``429`` answers with ``Retry-After`` (header ``x-fake-retry-after``, default 1).
* ``500`` / ``503`` answer that status.
* ``stall`` never answers until the client leaves.

The other per-server faults apply to chat completions. Dropping a connection
needs uvicorn's transport, which ``TransportMiddleware`` stashes in the scope
(an ASGI wrapper around the app would hide it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from luftpause.fakes.engine.server.wire import error

FAULTS = ("refuse", "midstream", "429", "500", "503", "stall")
MIDSTREAM_CHUNKS = 3  # content chunks sent before a midstream fault drops the connection
TRANSPORT_KEY = "luftpause.fake_engine.transport"


class TransportMiddleware:
    """Stashes uvicorn's transport in the scope so faults can drop the connection;
    with the server-wide ``refuse`` fault, drops every connection at once."""

    def __init__(self, app: FastAPI, fault: str | None) -> None:
        self.app = app
        self.fault = fault
        self.state = app.state  # driver, config, model_dir

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            scope[TRANSPORT_KEY] = transport
            if self.fault == "refuse":
                drop(transport)
                await asyncio.sleep(0)
                return
        await self.app(scope, receive, send)


def transport_of(request: Request) -> Any:
    return request.scope.get(TRANSPORT_KEY)


def drop(transport: Any) -> None:
    """Close the client connection without (further) answer."""
    if transport is not None:
        transport.close()


async def wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_done_or_disconnect(request: Request, work: Awaitable[Any]) -> tuple[bool, Any]:
    """Await ``work``; returns (False, None) if the client disconnects first."""
    work_task = asyncio.ensure_future(work)
    leave_task = asyncio.ensure_future(wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({work_task, leave_task}, return_when=asyncio.FIRST_COMPLETED)
        if work_task in done:
            return True, work_task.result()
        return False, None
    finally:
        for task in (work_task, leave_task):
            if not task.done():
                task.cancel()
        for task in (work_task, leave_task):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def answer_fault(request: Request, fault: str, retry_after: int | None) -> Response | None:
    """The response of a fault that answers before any generation; None for ``midstream``
    (it needs a reply in progress)."""
    if fault == "refuse":
        drop(transport_of(request))
        await asyncio.sleep(0)
        return Response(status_code=500)  # never reaches the client
    if fault == "429":
        return JSONResponse(
            {
                "error": {
                    "message": "rate limited by fake engine",
                    "type": "rate_limit_error",
                    "code": 429,
                }
            },
            429,
            headers={"Retry-After": str(1 if retry_after is None else retry_after)},
        )
    if fault in ("500", "503"):
        status = int(fault)
        return error(status, f"fake engine fault {status}", "InternalServerError")
    if fault == "stall":
        await wait_disconnect(request)
        return Response(status_code=499)
    return None
