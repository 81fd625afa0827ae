"""HTTP :5001: ``GET /status`` (S12 JSON), ``GET /metrics`` (Prometheus) and ``GET /health``;
``GET /`` is the live status page (S12, see :mod:`.page`).

With a token (X2), ``/status`` and the page's data route ``/ui/runtime-status`` need
``Authorization: Bearer <token>``; the page itself and its assets are served to anyone
(they hold no data: the page asks for the token and sends it), as are ``/health`` and
``/metrics``.

Errors are JSON, ``{"error": {"message": ...}}``: an unknown route lists the routes
served, a wrong method names the allowed ones, a bug is a 500 (logged), where
Starlette would answer in plain text (:class:`luftpause.http_errors.JsonErrorAnswers`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from luftpause.auth import BearerAuth
from luftpause.http_errors import ASGIApp, JsonErrorAnswers, Refusal, refusal_message
from luftpause.scheduler.core.view import run_status, status
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.page import page_routes


def status_app(
    host: Host,
    clock: Callable[[], float],
    extra: Callable[[], dict[str, Any]],
    *,
    runtimes: Iterable[str] = (),  # runtime base URLs the page may show besides loopback ones
    token: str | None = None,
) -> ASGIApp:
    async def get_status(request: Request) -> JSONResponse:
        body = status(host.state, clock())
        body["counters"] = dict(sorted(host.counters.items()))
        body.update(extra())
        return JSONResponse(body)

    async def get_run(request: Request) -> JSONResponse:
        run_id = request.path_params["run_id"]
        body = run_status(host.state, run_id, clock())
        if body is None:
            return JSONResponse(
                {"error": {"message": f"no run {run_id!r} (never seen, or forgotten)"}},
                status_code=404,
            )
        return JSONResponse(body)

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def metrics(request: Request) -> Response:
        body, content_type = host.metrics.render()
        return Response(body, headers={"content-type": content_type})

    app = Starlette(
        routes=[
            Route("/status", get_status),
            Route("/status/runs/{run_id:path}", get_run),
            Route("/health", health),
            Route("/metrics", metrics),
            *page_routes(runtimes),  # GET / (the live page) and its assets
        ],
        middleware=[Middleware(BearerAuth, token=token, guarded=_needs_token)],
    )
    return JsonErrorAnswers(app, refusal_body)


ROUTES = (
    "GET /status, GET /status/runs/{run_id}, GET /health, GET /metrics and the status page "
    "(GET /, /ui/status.js, /ui/status.css, /ui/runtime-status)"
)


def refusal_body(refusal: Refusal) -> dict[str, Any]:
    """The scheduler's JSON for an error Starlette answers in plain text (404, 405, 500)."""
    return {"error": {"message": refusal_message(refusal, "scheduler", ROUTES)}}


def _needs_token(path: str) -> bool:
    return (
        path.rstrip("/") == "/status"
        or path.startswith("/status/")
        or path.startswith("/ui/runtime-status")
    )
