"""HTTP :5001: ``GET /status`` (S12 JSON), ``GET /metrics`` (Prometheus) and ``GET /health``;
``GET /`` is the live status page (S12, see :mod:`.page`).

With a token (X2), ``/status`` and the page's data route ``/ui/runtime-status`` need
``Authorization: Bearer <token>``; the page itself and its assets are served to anyone
(they hold no data: the page asks for the token and sends it), as are ``/health`` and
``/metrics``.

The admin routes (B11) change the replica set while the scheduler runs and always need
the token (without one configured they answer 403): ``POST
/admin/endpoints/{endpoint}/members`` ``{"url": ...}`` adds a replica of a configured
endpoint, ``POST /admin/replicas/{name}/drain`` (optional ``{"deadline_s": N}``) drains
one, ``DELETE /admin/replicas/{name}`` removes one (:mod:`.membership`).

Errors are JSON, ``{"error": {"message": ...}}``: an unknown route lists the routes
served, a wrong method names the allowed ones, a bug is a 500 (logged), where
Starlette would answer in plain text (:class:`luftpause.http_errors.JsonErrorAnswers`)."""

from __future__ import annotations

import json
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
from luftpause.scheduler.service.callers_view import callers_status
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.membership import Membership, UnknownReplica
from luftpause.scheduler.service.page import page_routes


def status_app(
    host: Host,
    clock: Callable[[], float],
    extra: Callable[[], dict[str, Any]],
    *,
    runtimes: Iterable[str] = (),  # runtime base URLs the page may show besides loopback ones
    token: str | None = None,
    membership: Membership | None = None,  # the admin routes' (B11); None: not served
) -> ASGIApp:
    async def get_status(request: Request) -> JSONResponse:
        state, now = host.state, clock()
        body = status(state, now)
        body.update(callers_status(state, host.quotas, now, host.wall()))  # B13
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
            *(admin_routes(membership, token) if membership is not None else ()),
        ],
        middleware=[Middleware(BearerAuth, token=token, guarded=_needs_token)],
    )
    return JsonErrorAnswers(app, refusal_body)


ROUTES = (
    "GET /status, GET /status/runs/{run_id}, GET /health, GET /metrics, the status page "
    "(GET /, /ui/status.js, /ui/status.css, /ui/runtime-status) and the admin routes "
    "(POST /admin/endpoints/{endpoint}/members, POST /admin/replicas/{name}/drain, "
    "DELETE /admin/replicas/{name})"
)


def _error(status_code: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status_code)


async def _json_object(request: Request, *, optional: bool = False) -> dict[str, Any]:
    """The request's JSON object (``{}`` for an empty body where ``optional``); raises
    ``ValueError`` naming the problem."""
    raw = await request.body()
    if not raw.strip() and optional:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    return body


def admin_routes(membership: Membership, token: str | None) -> list[Route]:
    """B11's admin routes (see the module docstring)."""

    def refused() -> JSONResponse | None:
        if token is None:
            return _error(403, "the admin routes need LUFTPAUSE_TOKEN set on the scheduler")
        return None

    async def add_member(request: Request) -> JSONResponse:
        if (no := refused()) is not None:
            return no
        entry = request.path_params["endpoint"]
        try:
            url = (await _json_object(request)).get("url")
            if not isinstance(url, str):
                raise ValueError('give the replica\'s base URL as {"url": "http://host:port"}')
            name = membership.add(entry, url)
        except UnknownReplica as exc:
            return _error(404, str(exc))
        except ValueError as exc:
            return _error(400, str(exc))
        return JSONResponse({"replica": name, "endpoint": entry, "url": url}, status_code=201)

    async def drain(request: Request) -> JSONResponse:
        if (no := refused()) is not None:
            return no
        name = request.path_params["name"]
        try:
            deadline = (await _json_object(request, optional=True)).get("deadline_s")
            if deadline is not None and (
                isinstance(deadline, bool)
                or not isinstance(deadline, int | float)
                or not 0 <= deadline <= 86_400
            ):
                raise ValueError("deadline_s must be a number of seconds from 0 to 86400")
            membership.drain(name, None if deadline is None else float(deadline))
        except UnknownReplica as exc:
            return _error(404, str(exc))
        except ValueError as exc:
            return _error(400, str(exc))
        return JSONResponse({"replica": name, "draining": True, "deadline_s": deadline}, 202)

    async def remove(request: Request) -> JSONResponse:
        if (no := refused()) is not None:
            return no
        name = request.path_params["name"]
        try:
            membership.remove(name)
        except UnknownReplica as exc:
            return _error(404, str(exc))
        return JSONResponse({"replica": name, "left": True}, status_code=202)

    return [
        Route("/admin/endpoints/{endpoint}/members", add_member, methods=["POST"]),
        Route("/admin/replicas/{name}/drain", drain, methods=["POST"]),
        Route("/admin/replicas/{name}", remove, methods=["DELETE"]),
    ]


def refusal_body(refusal: Refusal) -> dict[str, Any]:
    """The scheduler's JSON for an error Starlette answers in plain text (404, 405, 500)."""
    return {"error": {"message": refusal_message(refusal, "scheduler", ROUTES)}}


def _needs_token(path: str) -> bool:
    return (
        path.startswith("/admin/")
        or path.rstrip("/") == "/status"
        or path.startswith("/status/")
        or path.startswith("/ui/runtime-status")
    )
