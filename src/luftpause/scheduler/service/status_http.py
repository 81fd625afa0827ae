"""HTTP :5001: ``GET /status`` (S12 JSON), ``GET /metrics`` (Prometheus) and ``GET /health``;
``GET /`` is the live status page (S12, see :mod:`.page`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from luftpause.scheduler.core.view import status
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.page import page_routes


def status_app(
    host: Host,
    clock: Callable[[], float],
    extra: Callable[[], dict[str, Any]],
    *,
    runtimes: Iterable[str] = (),  # runtime base URLs the page may show besides loopback ones
) -> Starlette:
    async def get_status(request: Request) -> JSONResponse:
        body = status(host.state, clock())
        body["counters"] = dict(sorted(host.counters.items()))
        body.update(extra())
        return JSONResponse(body)

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def metrics(request: Request) -> Response:
        body, content_type = host.metrics.render()
        return Response(body, headers={"content-type": content_type})

    return Starlette(
        routes=[
            Route("/status", get_status),
            Route("/health", health),
            Route("/metrics", metrics),
            *page_routes(runtimes),  # GET / (the live page) and its assets
        ]
    )
