"""The dataplane's HTTP surface (D1–D10).

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /v1/decide``,
``DELETE /v1/runs/{id}``, ``GET /metrics``, ``GET /health``.

A chat turn: authenticate (D9) → parse → resolve run, class, caller (D2, D3)
→ unknown model is a 404 before queueing (S6) → Admit through the scheduler,
waiting with no deadline, abandoning if the client leaves (D4) → forward to
the admitted replica with that replica's own key → relay the reply unchanged
→ report started, first token, finished or failed (D5). Every failure maps to
one row of the failure table (D6); this module is the one place that turns
internal failures into HTTP errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.config import DataplaneSettings, Endpoint, EndpointKind, Secrets
from luftpause.dataplane import identity
from luftpause.dataplane.identity import ToolCallMemory
from luftpause.dataplane.metrics import Metrics, Outcome
from luftpause.dataplane.relay import RelayStream, SseTap, TurnOutcome
from luftpause.dataplane.runs import RunTable, TurnRecord
from luftpause.dataplane.scheduler_link import Admitted, Rejected, SchedulerLink

log = logging.getLogger("luftpause.dataplane")

T = TypeVar("T")

# Client headers never forwarded to an engine: hop-by-hop, our own, the client's credentials.
_DROP = {
    "host",
    "content-length",
    "authorization",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-authorization",
    "accept-encoding",
    "cookie",
}
_CLASS_PB = {"interactive": pb.SERVICE_CLASS_INTERACTIVE, "batch": pb.SERVICE_CLASS_BATCH}


@dataclass
class Dataplane:
    """Everything the routes share; built once in the entry point."""

    settings: DataplaneSettings
    endpoints: dict[str, Endpoint]
    secrets: Secrets
    link: SchedulerLink
    runs: RunTable
    memory: ToolCallMemory
    http: aiohttp.ClientSession  # towards engines: no read timeout, 2 s connect timeout
    metrics: Metrics

    @property
    def generative_models(self) -> set[str]:
        return {
            m
            for e in self.endpoints.values()
            if e.kind is EndpointKind.GENERATIVE
            for m in e.models
        }

    @property
    def single_pass_models(self) -> list[str]:
        seen: list[str] = []
        for e in self.endpoints.values():
            if e.kind is EndpointKind.SINGLE_PASS:
                seen.extend(m for m in e.models if m not in seen)
        return seen


def error(
    status: int, message: str, run_id: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The one error shape (D6): ``{"error": {"message": ...}}``."""
    hdrs = dict(headers or {})
    if run_id:
        hdrs[identity.RUN_HEADER] = run_id
    return JSONResponse({"error": {"message": message}}, status_code=status, headers=hdrs)


def create_app(dp: Dataplane) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(dp.link.maintain(), name="scheduler-link"),
            asyncio.create_task(_sweep(dp), name="sweeper"),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    app = FastAPI(
        title="luftpause dataplane",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _chat(dp, request)

    @app.post("/v1/decide")
    async def decide(request: Request) -> Response:
        return await _decide(dp, request)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        denied = _authorize(dp, request)
        if denied is not None:
            return denied
        data: list[dict[str, Any]] = []
        for e in dp.endpoints.values():
            for m in e.models:
                if all(d["id"] != m for d in data):
                    data.append({"id": m, "object": "model", "created": 0, "owned_by": e.name})
        return JSONResponse({"object": "list", "data": data})

    @app.delete("/v1/runs/{run_id}")
    async def end_run(run_id: str, request: Request) -> Response:
        denied = _authorize(dp, request, run_id)
        if denied is not None:
            return denied
        dp.runs.forget(run_id)
        await dp.link.run_ended(run_id)
        return JSONResponse(
            {"run_id": run_id, "ended": True}, headers={identity.RUN_HEADER: run_id}
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = dp.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse(
            {"status": "ok", "scheduler": "up" if dp.link.ready.is_set() else "unreachable"}
        )

    return app


async def _sweep(dp: Dataplane) -> None:
    while True:
        await asyncio.sleep(dp.settings.tool_call_id_sweep_s)
        dp.memory.sweep()
        dp.runs.prune()


def _authorize(dp: Dataplane, request: Request, run_id: str | None = None) -> Response | None:
    """D9: with a token set, every /v1 route needs ``Authorization: Bearer <token>``."""
    token = dp.secrets.token
    if token is None:
        return None
    given = request.headers.get("authorization", "")
    if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return None
    return error(401, "missing or wrong bearer token (set Authorization: Bearer <token>)", run_id)


async def _read_json(request: Request) -> dict[str, Any] | str:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError as exc:
        return f"request body is not valid JSON: {exc}"
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    return body


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Run ``work``; if the client leaves first, cancel it and return None."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _engine_headers(dp: Dataplane, request: Request, replica: str) -> dict[str, str]:
    headers = {
        k: v
        for k, v in request.headers.items()
        if k not in _DROP and not k.startswith("x-luftpause-")
    }
    key = dp.secrets.api_keys.get(replica)
    if key:
        headers["authorization"] = f"Bearer {key}"
    headers["accept-encoding"] = "identity"
    headers.setdefault("content-type", "application/json")
    return headers


async def _admit(
    dp: Dataplane, request: Request, req: pb.AdmitRequest
) -> Admitted | Rejected | None:
    t0 = time.monotonic()
    outcome = await _until_disconnect(request, dp.link.admit(req))
    cls = "interactive" if req.service_class == pb.SERVICE_CLASS_INTERACTIVE else "batch"
    if isinstance(outcome, Admitted):
        dp.metrics.held.labels(cls).observe(time.monotonic() - t0)
    return outcome


def _abandoned(dp: Dataplane, turn_id: str, run_id: str) -> None:
    """The client left while its turn was held. Cancelling the Admit call abandons a
    turn the scheduler still holds, but not one it admitted while the cancel was on its
    way (or whose answer arrived as the client left): report that one as failed, so its
    slot is freed now rather than at the turn timeout. A held or unknown turn ignores it.
    """
    dp.link.report(
        pb.TurnEvent(
            turn_id=turn_id,
            run_id=run_id,
            failed=pb.TurnFailed(reason="client left while the turn was held"),
        )
    )


async def _turn_request(
    dp: Dataplane, request: Request
) -> tuple[str | None, dict[str, Any]] | Response:
    """What every turn route does first (D9, then the body): the run header and the
    parsed JSON body, or the error response to send instead."""
    header_run = request.headers.get(identity.RUN_HEADER) or None
    denied = _authorize(dp, request, header_run)
    if denied is not None:
        return denied
    body = await _read_json(request)
    if isinstance(body, str):
        return error(400, body, header_run)
    return header_run, body


async def _chat(dp: Dataplane, request: Request) -> Response:
    parsed = await _turn_request(dp, request)
    if isinstance(parsed, Response):
        return parsed
    header_run, body = parsed
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return error(400, "'model' is required and must be a string", header_run)
    if not isinstance(body.get("messages"), list):
        return error(400, "'messages' is required and must be a list", header_run)
    try:
        run_id = identity.resolve_run_id(request.headers, body, dp.memory)
        cls = identity.service_class(request.headers)
        caller = identity.caller(request.headers, dp.settings.caller_max_bytes)
    except identity.BadHeader as exc:
        return error(400, str(exc), header_run)
    if model not in dp.generative_models:
        dp.metrics.turns.labels(cls, Outcome.REJECTED.value).inc()
        return error(404, f"no Generative replica serves model '{model}'", run_id)

    turn_id = f"turn-{uuid.uuid4().hex}"
    dp.runs.touch(run_id, cls, caller)
    dp.metrics.holding.labels(cls).inc()
    try:
        outcome = await _admit(
            dp,
            request,
            pb.AdmitRequest(
                turn_id=turn_id,
                run_id=run_id,
                model=model,
                service_class=_CLASS_PB[cls],
                caller=caller,
                kind=pb.ENDPOINT_KIND_GENERATIVE,
                traceparent=request.headers.get("traceparent", ""),
            ),
        )
    finally:
        dp.metrics.holding.labels(cls).dec()
    if outcome is None:  # D4: the client left while held; no engine request
        _abandoned(dp, turn_id, run_id)
        dp.metrics.turns.labels(cls, Outcome.ABANDONED.value).inc()
        return Response(status_code=499)
    if isinstance(outcome, Rejected):
        dp.metrics.turns.labels(cls, Outcome.REJECTED.value).inc()
        return error(404 if outcome.unknown_model else 400, outcome.message, run_id)

    turn = TurnRecord(turn_id, run_id, outcome.replica, model, cls, caller)
    return await _forward_chat(dp, request, body, turn, outcome)


async def _forward_chat(
    dp: Dataplane, request: Request, body: dict[str, Any], turn: TurnRecord, admitted: Admitted
) -> Response:
    endpoint = dp.endpoints.get(admitted.replica)
    base = endpoint.url if endpoint is not None else admitted.url.rstrip("/")
    dp.runs.admitted(turn)
    dp.runs.started(turn.turn_id)
    dp.link.report(pb.TurnEvent(turn_id=turn.turn_id, run_id=turn.run_id, started=pb.TurnStarted()))
    dp.metrics.in_flight.labels(turn.service_class).inc()
    started = time.monotonic()
    stream = bool(body.get("stream"))
    hide_usage = False
    raw = await request.body()
    changed = False
    if stream:
        options = body.get("stream_options")
        if not (isinstance(options, dict) and options.get("include_usage")):
            # Ask for usage for our reports; the client will not see the extra chunk.
            body = {**body, "stream_options": {**(options or {}), "include_usage": True}}
            changed = hide_usage = True
    if endpoint is not None and endpoint.class_priority is not None and "priority" not in body:
        # The engine orders its own queue by class; a client's own priority is kept.
        body = {**body, "priority": endpoint.class_priority.for_class(turn.service_class)}
        changed = True
    if changed:
        raw = json.dumps(body).encode()
    url = f"{base}/v1/chat/completions"
    reported = False

    async def finish(outcome: TurnOutcome, failure: str | None) -> None:
        nonlocal reported
        if reported:
            return
        reported = True
        dp.metrics.in_flight.labels(turn.service_class).dec()
        if failure is None:
            dp.memory.remember(outcome.tool_call_ids, turn.run_id)
            dp.link.report(
                pb.TurnEvent(
                    turn_id=turn.turn_id,
                    run_id=turn.run_id,
                    finished=pb.TurnFinished(
                        usage=pb.Usage(
                            prompt_tokens=outcome.prompt_tokens,
                            completion_tokens=outcome.completion_tokens,
                            cached_tokens=outcome.cached_tokens,
                        ),
                        finish_reason=outcome.finish_reason,
                        paused_on_tool=outcome.paused_on_tool,
                    ),
                )
            )
            dp.runs.ended(turn.turn_id, paused_on_tool=outcome.paused_on_tool)
            label = Outcome.PAUSED_ON_TOOL if outcome.paused_on_tool else Outcome.FINISHED
        else:
            dp.link.report(
                pb.TurnEvent(
                    turn_id=turn.turn_id, run_id=turn.run_id, failed=pb.TurnFailed(reason=failure)
                )
            )
            dp.runs.ended(turn.turn_id, paused_on_tool=False)
            label = _failure_outcome(failure)
        dp.metrics.turns.labels(turn.service_class, label.value).inc()

    def first_token() -> None:
        dp.metrics.ttft.labels(turn.service_class).observe(time.monotonic() - started)
        dp.link.report(
            pb.TurnEvent(turn_id=turn.turn_id, run_id=turn.run_id, first_token=pb.FirstToken())
        )

    run_header = {
        identity.RUN_HEADER: turn.run_id,
        identity.REPLICA_HEADER: turn.replica,
        identity.HELD_HEADER: str(round(admitted.held_s * 1000)),
    }
    try:
        response = await _until_disconnect(
            request,
            dp.http.post(url, data=raw, headers=_engine_headers(dp, request, turn.replica)),
        )
    except ENGINE_ERRORS as exc:
        reason = f"engine {turn.replica}: {_describe(exc)}"
        await finish(TurnOutcome(), reason)
        return error(502, reason, turn.run_id, {identity.REPLICA_HEADER: turn.replica})
    if response is None:
        await finish(TurnOutcome(), "client left before the engine answered")
        return Response(status_code=499)

    if response.status != 200:  # D6: engine rejects: status, body, Retry-After unchanged
        try:
            content = await response.read()
        except ENGINE_ERRORS:
            content = b""
        finally:
            response.release()
        await finish(TurnOutcome(), f"engine {turn.replica} answered {response.status}")
        headers = dict(run_header)
        for name in ("retry-after", "content-type"):
            if name in response.headers:
                headers[name] = response.headers[name]
        return Response(content, status_code=response.status, headers=headers)

    content_type = response.headers.get("content-type", "application/json")
    if stream and content_type.startswith("text/event-stream"):
        stream_headers = [
            (b"content-type", content_type.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            *((k.encode(), v.encode()) for k, v in run_header.items()),
        ]
        tap = SseTap(TurnOutcome(), hide_usage)
        return RelayStream(response, tap, stream_headers, turn.replica, first_token, finish)

    try:
        whole = await _until_disconnect(request, response.read())
    except ENGINE_ERRORS as exc:
        reason = f"engine {turn.replica} failed: {_describe(exc)}"
        await finish(TurnOutcome(), reason)
        return error(502, reason, turn.run_id, {identity.REPLICA_HEADER: turn.replica})
    finally:
        if response.content.at_eof():
            response.release()
        else:
            response.close()  # unfinished: drop the connection so the engine stops
    if whole is None:
        await finish(TurnOutcome(), "client left while the engine was answering")
        return Response(status_code=499)
    outcome = TurnOutcome()
    with contextlib.suppress(ValueError):
        outcome.read_completion(json.loads(whole))
    if outcome.first_token:
        first_token()
    await finish(outcome, None)
    return Response(whole, status_code=200, headers={**run_header, "content-type": content_type})


def _failure_outcome(failure: str) -> Outcome:
    if "client left" in failure:
        return Outcome.CLIENT_LEFT
    if "mid-stream" in failure or "without [DONE]" in failure:
        return Outcome.ENGINE_BROKE
    if " answered " in failure:
        return Outcome.ENGINE_REJECTED
    return Outcome.ENGINE_UNREACHABLE


async def _decide(dp: Dataplane, request: Request) -> Response:
    """D7: a single-pass turn to a classifier replica (vLLM ``/classify`` format)."""
    parsed = await _turn_request(dp, request)
    if isinstance(parsed, Response):
        return parsed
    header_run, body = parsed
    if "input" not in body:
        return error(400, "'input' is required (a string or a list of strings)", header_run)
    model = body.get("model") or (dp.single_pass_models[0] if dp.single_pass_models else "")
    run_id = header_run or f"decide-{uuid.uuid4().hex}"
    if not isinstance(model, str) or model not in dp.single_pass_models:
        return error(404, f"no SinglePass replica serves model '{model}'", run_id)
    try:
        caller = identity.caller(request.headers, dp.settings.caller_max_bytes)
    except identity.BadHeader as exc:
        return error(400, str(exc), run_id)
    turn_id = f"turn-{uuid.uuid4().hex}"
    outcome = await _admit(
        dp,
        request,
        pb.AdmitRequest(
            turn_id=turn_id,
            run_id=run_id,
            model=model,
            service_class=pb.SERVICE_CLASS_INTERACTIVE,
            caller=caller,
            kind=pb.ENDPOINT_KIND_SINGLE_PASS,
        ),
    )
    if outcome is None:
        _abandoned(dp, turn_id, run_id)
        return Response(status_code=499)
    if isinstance(outcome, Rejected):
        return error(404 if outcome.unknown_model else 400, outcome.message, run_id)
    endpoint = dp.endpoints.get(outcome.replica)
    base = endpoint.url if endpoint is not None else outcome.url.rstrip("/")
    dp.link.report(pb.TurnEvent(turn_id=turn_id, run_id=run_id, started=pb.TurnStarted()))
    payload = {**body, "model": model}
    try:
        async with dp.http.post(
            f"{base}/classify",
            data=json.dumps(payload).encode(),
            headers={
                **_engine_headers(dp, request, outcome.replica),
                "content-type": "application/json",
            },
        ) as response:
            status, content = response.status, await response.read()
            engine_headers = dict(response.headers)
    except ENGINE_ERRORS as exc:
        reason = f"engine {outcome.replica}: {_describe(exc)}"
        dp.link.report(
            pb.TurnEvent(turn_id=turn_id, run_id=run_id, failed=pb.TurnFailed(reason=reason))
        )
        return error(502, reason, run_id)
    if status == 200:
        dp.link.report(pb.TurnEvent(turn_id=turn_id, run_id=run_id, finished=pb.TurnFinished()))
    else:
        dp.link.report(
            pb.TurnEvent(
                turn_id=turn_id,
                run_id=run_id,
                failed=pb.TurnFailed(reason=f"engine answered {status}"),
            )
        )
    headers = {identity.RUN_HEADER: run_id}
    for name in ("Retry-After", "Content-Type"):
        if name in engine_headers:
            headers[name.lower()] = engine_headers[name]
    return Response(content, status_code=status, headers=headers)


ENGINE_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ConnectionTimeoutError | TimeoutError):
        return "connect timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connection failed: {exc.os_error.strerror or exc.os_error}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
