"""The dataplane's other routes: a FastAPI app behind the turn routes' ASGI layer.

``GET /v1/models``, ``DELETE /v1/runs/{id}`` (and the engines' retention release,
B8), ``GET /v1/tool_calls/{id}`` (#38), ``GET /metrics``, ``GET /health``; the 404
and 405 answers in the error shape of the API whose route a path is under (D6); the
lifespan, which keeps the scheduler link and the sweeper running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from luftpause.callers import KeyedCaller, Trusted
from luftpause.config import (
    KvRetention,
)
from luftpause.dataplane import identity
from luftpause.dataplane.apis import ClientApi
from luftpause.dataplane.asgi import early_run, not_allowed
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.engine_http import (
    ENGINE_ERRORS,
)
from luftpause.dataplane.errors import (
    Unauthorized,
    error_response,
    openai_error,
    shown,
)
from luftpause.dataplane.routes.inbound import authorize
from luftpause.members import entry_of
from luftpause.telemetry import fastapi_telemetry
from luftpause.tool_calls import WORKERS_HEADER

log = logging.getLogger("luftpause.dataplane")


RELEASE_TIMEOUT_S = 2.0  # B8: how long a run's end waits for an engine's release answer


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    """The FastAPI routes' errors are JSON too (D6): an exception no route expected is
    logged with its traceback and answered as a 500 in the OpenAI error shape."""

    @functools.wraps(handler)
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception:
            log.exception("internal error on %s %s", request.method, request.url.path)
            return error_response(
                500, "internal error in the dataplane (logged)", early_run(request.headers, "run")
            )

    return route


_ROUTES = (
    "POST /v1/chat/completions, POST /v1/messages, POST /v1/responses, POST /v1/decide, "
    "GET /v1/models, DELETE /v1/runs/{run_id}, GET /v1/tool_calls/{tool_call_id}, "
    "GET /metrics, GET /health"
)


async def _sweep(dp: Dataplane) -> None:
    while True:
        await asyncio.sleep(dp.settings.tool_call_id_sweep_s)
        dp.memory.sweep()
        dp.runs.prune()


async def release_retention(dp: Dataplane, run_id: str) -> None:
    """B8: the run ended: end what each endpoint that takes a release keeps for it
    (``kv_retention = "fake"``: ``POST /kv_retention/release``). Best effort, bounded:
    an engine that does not answer in time keeps the prefix until its hint runs out."""
    for endpoint in dp.endpoints.values():
        if endpoint.kv_retention is not KvRetention.FAKE:
            continue
        body = json.dumps({"program_id": run_id}).encode()
        headers = {"content-type": "application/json"}
        key = dp.secrets.api_keys.get(entry_of(endpoint.name))
        if key:
            headers["authorization"] = f"Bearer {key}"
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT_S):
                response = await dp.http.post(f"{endpoint.url}/kv_retention/release", body, headers)
                try:
                    await response.read()
                finally:
                    response.release()
        except (*ENGINE_ERRORS, TimeoutError) as exc:
            log.info("kv retention release for run %s at %s failed: %s", run_id, endpoint.name, exc)


def rest_app(dp: Dataplane, apis: tuple[ClientApi, ...]) -> FastAPI:
    """Every route but the turn routes, the 404/405 answers (in the shape of the API
    whose route a path is under) and the lifespan (the scheduler link, the sweeper)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(dp.link.maintain(), name="scheduler-link"),
            asyncio.create_task(_sweep(dp), name="sweeper"),
        ]
        try:
            yield
        finally:
            await dp.link.close()  # the last reports go out before the link is torn down
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    app = FastAPI(
        title="luftpause dataplane",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        telemetry=fastapi_telemetry(),
    )

    @app.exception_handler(StarletteHTTPException)
    async def no_such_route(request: Request, exc: StarletteHTTPException) -> Response:
        """Unknown routes and wrong methods answer in the same shape as every other
        error of ours (D6), naming what the dataplane does serve."""
        run_id = early_run(request.headers, "run")
        method, path = request.method, request.url.path
        # Under an API's route (e.g. /v1/messages/count_tokens), in that API's shape.
        shape = next((a.error_body for a in apis if path.startswith(a.route + "/")), openai_error)
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            return not_allowed(method, path, allowed, run_id, shape)
        if exc.status_code == 404:
            return error_response(
                404,
                f"no route {method} {path}; this proxy serves {_ROUTES}",
                run_id,
                code="not_found",
                shape=shape,
            )
        return error_response(exc.status_code, str(exc.detail), run_id, shape=shape)

    @app.get("/v1/models")
    @_guarded
    async def models(request: Request) -> Response:
        run_id = early_run(request.headers, "run")
        try:
            authorize(dp, request.headers)
        except Unauthorized as exc:
            return exc.response(run_id)
        data: list[dict[str, Any]] = []
        for e in dp.endpoints.values():
            for m in e.models:
                if all(d["id"] != m for d in data):
                    data.append({"id": m, "object": "model", "created": 0, "owned_by": e.name})
        return JSONResponse({"object": "list", "data": data}, headers={identity.RUN_HEADER: run_id})

    @app.delete("/v1/runs/{run_id}")
    @_guarded
    async def end_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            principal = authorize(dp, request.headers)
        except Unauthorized as exc:
            return exc.response(run_id)
        known = dp.runs.runs.get(run_id)
        if (
            isinstance(principal, KeyedCaller)
            and known is not None
            and known.caller.partition("/")[0] != principal.name
        ):  # B13: a key ends only its own caller's runs (of those this dataplane knows)
            return error_response(
                403,
                f"run {shown(run_id)} is not one of caller {principal.name!r}'s",
                run_id,
                code="run_not_yours",
            )
        dp.runs.end_run(run_id)  # turns still in flight end normally (and stay listed)
        await dp.link.run_ended(run_id)
        await release_retention(dp, run_id)
        return JSONResponse(
            {"run_id": run_id, "ended": True}, headers={identity.RUN_HEADER: run_id}
        )

    @app.get("/v1/tool_calls/{tool_call_id:path}")
    @_guarded
    async def tool_call(request: Request) -> Response:
        """Which turn made the tool call (#38): the runtime asks it on a ``spawn`` that a
        harness's tool call made, to record the harness's run as the new run's session."""
        call_id = request.path_params["tool_call_id"]
        try:
            principal = authorize(dp, request.headers)
        except Unauthorized as exc:
            return exc.response(None)
        if not isinstance(principal, Trusted):  # B13: the services' route (the runtime's)
            return error_response(
                403,
                "GET /v1/tool_calls is for the luftpause services: it needs LUFTPAUSE_TOKEN, "
                "not a caller's key",
                code="token_required",
            )
        origin = dp.memory.origin(call_id)
        if origin is not None:
            return JSONResponse(origin.to_json())
        if dp.memory.ambiguous(call_id):
            return error_response(
                409,
                f"tool call {shown(call_id)} was made by more than one run (the engine's "
                "tool call IDs are not unique): it names none of them",
                code="tool_call_ambiguous",
            )
        return error_response(
            404,
            f"no tool call {shown(call_id)} in a reply this dataplane relayed in the "
            f"last {dp.memory.ttl_s:g} s",
            headers={WORKERS_HEADER: str(dp.settings.workers)},
            code="tool_call_not_found",
        )

    @app.get("/metrics")
    @_guarded
    async def metrics(request: Request) -> Response:
        body, content_type = dp.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/health")
    @_guarded
    async def health(request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "scheduler": "up" if dp.link.ready.is_set() else "unreachable"}
        )

    return app
