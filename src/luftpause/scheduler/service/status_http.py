"""HTTP :5001: ``GET /status`` (S12 JSON) and ``GET /health``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from luftpause.scheduler.core.view import status
from luftpause.scheduler.service.host import Host


def status_app(
    host: Host, clock: Callable[[], float], extra: Callable[[], dict[str, Any]]
) -> Starlette:
    async def get_status(request: Request) -> JSONResponse:
        body = status(host.state, clock())
        body["counters"] = dict(sorted(host.counters.items()))
        body.update(extra())
        return JSONResponse(body)

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/status", get_status), Route("/health", health)])
