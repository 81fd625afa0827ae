"""The dataplane's HTTP surface (D1–D10).

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /v1/decide``,
``DELETE /v1/runs/{id}``, ``GET /v1/tool_calls/{id}`` (which turn made a tool call:
its run, class, caller and span, #38), ``GET /metrics``, ``GET /health``.

A chat turn: authenticate (D9) → parse and validate every field the proxy reads or
rewrites (``request.py``) → resolve run, class, caller (D2, D3) → unknown model is a
404 before queueing (S6), images for a model not every endpoint of which sets
``vision = true`` a 400 (B9) → Admit through the scheduler (``admission.py``),
waiting with no deadline, abandoning if the client leaves (D4) → from here a
``Turn`` owns the turn's lifetime (``turn.py``): it is ended exactly once, by this
module or by the stream relay → forward to the admitted replica with that replica's
own key → relay the reply unchanged → report started, first token, finished or
failed (D5). A turn whose engine connection failed (so the engine never saw it) is
admitted once more, elsewhere, as a new turn (``_serve_placing_again``).

Failures are raised as ``errors.TurnError`` members, which carry their outcome
and their HTTP answer (D6). Anything else a route raises is a bug of ours: it
is logged with its traceback and answered as a JSON 500, and an admitted turn
it interrupts still ends.

The turn routes are served as plain ASGI by ``DataplaneApp`` (``asgi.py``), with
the client's leaving watched by ``ClientWatch`` (``watch.py``); the other routes,
the 404/405 answers and the lifespan are a FastAPI app behind it. What every route
shares is the ``Dataplane`` (``context.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from luftpause import callers
from luftpause.callers import KeyedCaller, Principal, Trusted
from luftpause.config import (
    Endpoint,
    KvRetention,
    NativeApi,
)
from luftpause.dataplane import identity, tracing
from luftpause.dataplane.admission import admit, new_turn_id
from luftpause.dataplane.apis import ClientApi, Translated, Untranslated, client_apis
from luftpause.dataplane.asgi import DataplaneApp, Incoming, Route, early_run, not_allowed
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.engine_http import (
    ENGINE_ERRORS,
    NOT_SENT,
    ConnectFailed,
    ConnectTimeout,
    EngineResponse,
)
from luftpause.dataplane.errors import (
    BadRequest,
    BodyTooLarge,
    ClientLeft,
    EngineFailed,
    EngineRejected,
    EngineUnreachable,
    Forbidden,
    InternalError,
    NotJson,
    TurnError,
    Unauthorized,
    UnknownModel,
    error_response,
    openai_error,
    shown,
)
from luftpause.dataplane.link_codec import Admitted
from luftpause.dataplane.outcome import TurnOutcome, loads
from luftpause.dataplane.relay import NativeTap, RelayStream, SseTap, TranslatingTap
from luftpause.dataplane.request import (
    ChatRequest,
    chat_request,
    decide_request,
    dumps,
    parse_object,
    with_members,
)
from luftpause.dataplane.runs import TurnRecord
from luftpause.dataplane.turn import PlaceAgain, Turn, serve
from luftpause.members import SEPARATOR, entry_of
from luftpause.telemetry import fastapi_telemetry
from luftpause.tool_calls import WORKERS_HEADER

log = logging.getLogger("luftpause.dataplane")

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
    "x-api-key",
}
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


def create_app(dp: Dataplane) -> DataplaneApp:
    apis = client_apis()
    for api in apis:  # the translators' wire types, imported now rather than at a first turn
        api.load()

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
            _authorize(dp, request.headers)
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
            principal = _authorize(dp, request.headers)
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
        await _release_retention(dp, run_id)
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
            principal = _authorize(dp, request.headers)
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

    routes: dict[str, Route] = {"/v1/chat/completions": _chat, "/v1/decide": _decide}
    for api in apis:
        routes[api.route] = functools.partial(_generative, api=api)
    return DataplaneApp(dp, app, routes, {api.route: api.error_body for api in apis})


async def _sweep(dp: Dataplane) -> None:
    while True:
        await asyncio.sleep(dp.settings.tool_call_id_sweep_s)
        dp.memory.sweep()
        dp.runs.prune()


def _authorize(dp: Dataplane, headers: Headers) -> Principal:
    """Who the request is (D9, B13): with a token set, every /v1 route needs
    ``Authorization: Bearer <token>`` (the scheme is case-insensitive, as every HTTP auth
    scheme is) or, as Anthropic's clients send it, ``x-api-key: <token>``; with
    ``[[callers]]``, a caller's key in either header instead makes it that caller's."""
    principal = dp.gate.principal(headers.get("authorization"), headers.get("x-api-key"))
    if principal is not None:
        return principal
    if dp.gate.keyring is not None:
        raise Unauthorized(
            "missing or unknown key (set Authorization: Bearer <your key>, or x-api-key: "
            "<your key>)"
        )
    raise Unauthorized(
        "missing or wrong bearer token (set Authorization: Bearer <token>, or x-api-key: <token>)"
    )


def _served_class(dp: Dataplane, principal: Principal, asked: str) -> tuple[str, str | None]:
    """The class a turn is served in and the class its key may not use (B13), counted."""
    try:
        served, denied = callers.served_class(principal, asked)
    except callers.ClassDenied as exc:
        assert isinstance(principal, KeyedCaller)
        dp.metrics.class_denied(principal.name, "refused").inc()
        raise Forbidden(str(exc)) from None
    if denied is not None:
        assert isinstance(principal, KeyedCaller)
        dp.metrics.class_denied(principal.name, "downgraded").inc()
    return served, denied


_DENIED = callers.DENIED_HEADER.encode()

_ROUTES = (
    "POST /v1/chat/completions, POST /v1/messages, POST /v1/responses, POST /v1/decide, "
    "GET /v1/models, DELETE /v1/runs/{run_id}, GET /v1/tool_calls/{tool_call_id}, "
    "GET /metrics, GET /health"
)


async def _body(incoming: Incoming, limit: int) -> bytes:
    """The request body, if it is JSON (or says nothing of its type) and at most
    ``limit`` bytes: a larger one is refused before the rest of it is read, so it
    never reaches an engine."""
    headers = incoming.headers
    content_type = headers.get("content-type", "")
    media = content_type.partition(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise NotJson(f"Content-Type must be application/json, got {shown(content_type)}")
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(_too_large(int(declared), limit))
    parts: list[bytes] = []
    size = 0
    while True:
        message = await incoming.receive()
        if message["type"] == "http.disconnect":
            raise ClientLeft("client left while sending its request")
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise BodyTooLarge(_too_large(None, limit))
        parts.append(part)
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _too_large(size: int | None, limit: int) -> str:
    what = f"{size} bytes" if size is not None else "more"
    return (
        f"request body is {what}; this proxy takes at most {limit} bytes (dataplane.max_body_bytes)"
    )


def _engine_headers(dp: Dataplane, incoming: Incoming, replica: str) -> dict[str, str]:
    headers = {
        k: v
        for k, v in incoming.headers.items()
        if k not in _DROP and not k.startswith("x-luftpause-")
    }
    key = dp.secrets.api_keys.get(entry_of(replica))  # (a discovered replica: its entry's)
    if key:
        headers["authorization"] = f"Bearer {key}"
    headers["accept-encoding"] = "identity"
    headers.setdefault("content-type", "application/json")
    return headers


def _api_request(dp: Dataplane, api: ClientApi, raw: bytes) -> Translated:
    """The request translated; or, when the proxy cannot translate it but every endpoint
    serving its model serves the API natively, the request to pass through as it is
    (the proxy's refusals are about what it cannot translate)."""
    try:
        return api.parse(raw)
    except BadRequest as refused:
        body = parse_object(raw)
        asked = body.get("model")
        stream = body.get("stream", False)
        if not isinstance(asked, str) or not asked or not isinstance(stream, bool):
            raise
        try:
            served = dp.served_model(asked)
        except UnknownModel:
            raise refused from None
        if not dp.native_for(api.name, served, everywhere=True):
            raise
        return Untranslated(asked, stream, {"model": asked, "messages": []}, refused.message)


async def _chat(dp: Dataplane, incoming: Incoming) -> Response:
    return await _generative(dp, incoming, None)


async def _generative(dp: Dataplane, incoming: Incoming, api: ClientApi | None) -> Response:
    """A generative turn on Chat Completions (``api`` None) or on another client API,
    which is translated to Chat Completions unless the replica serves it natively (B9).
    Either way the turn is scheduled the same."""
    incoming.run_id = early_run(incoming.headers, "run")
    if api is not None:
        incoming.shape = api.error_body
    cls = "batch"
    denied: str | None = None
    translated: Translated | None = None
    chat: ChatRequest | None = None
    try:
        principal = _authorize(dp, incoming.headers)
        raw = await _body(incoming, dp.settings.max_body_bytes)
        if api is None:
            chat = chat_request(raw)
            asked, conversation = chat.model, chat.body
        else:
            translated = _api_request(dp, api, raw)
            asked, conversation = translated.model, translated.chat
        try:
            cls = identity.service_class(incoming.headers)
            run_id, echoed = identity.resolve_run_id(
                incoming.headers, conversation, dp.memory, dp.settings.session_headers, asked
            )
            caller = identity.caller(incoming.headers, dp.settings.caller_max_bytes, principal)
        except identity.BadHeader as exc:
            raise BadRequest(str(exc)) from None
        cls, denied = _served_class(dp, principal, cls)
        if denied is not None:  # B13: served in a class its key may use, and told so
            incoming.extra_headers.append((_DENIED, denied.encode()))
        incoming.run_id = run_id
        model = dp.served_model(asked)
        if api is not None and translated is not None and translated.image_at is not None:
            refusal = dp.vision_refusal(api.name, model, asked)
            if refusal is not None:
                raise BadRequest(f"{translated.image_at}: {refusal}")
        if chat is not None:
            chat = chat.for_model(model)
        native_body = raw
        if api is not None and model != asked and dp.native_for(api.name, model):
            native_body = with_members(raw, {"model": model})  # the alias's target
        turn_id = new_turn_id()
        dp.runs.touch(run_id, cls, caller)
        span = tracing.start_turn(
            incoming.headers,
            route=api.name if api is not None else "chat",
            model=model,
            service_class=cls,
            run_id=run_id,
        )
        admitted = await admit(
            dp,
            incoming,
            span,
            turn_id=turn_id,
            run_id=run_id,
            model=model,
            cls=cls,
            caller=caller,
            echoed_tool_call_ids=echoed,
        )
    except TurnError as exc:  # never admitted: nothing to end
        dp.metrics.turns_of(cls, exc.outcome.value).inc()
        return exc.response(incoming.run_id, incoming.shape)
    if admitted.run_id and admitted.run_id != run_id:
        # The scheduler knew the echoed tool calls: the turn continues that run, whichever
        # dataplane its earlier turns went through (D2).
        dp.runs.forget(run_id)
        run_id = incoming.run_id = admitted.run_id
        dp.runs.touch(run_id, cls, caller)
        tracing.renamed_run(span, run_id)

    turn = Turn(
        TurnRecord(turn_id, run_id, admitted.replica, model, cls, caller),
        link=dp.link,
        metrics=dp.metrics,
        runs=dp.runs,
        memory=dp.memory,
        span=span,
    )

    def forward(turn: Turn, admitted: Admitted) -> Awaitable[Response]:
        if api is None:
            assert chat is not None
            return _forward_chat(dp, incoming, chat, turn, admitted)
        assert translated is not None
        return _forward_api(dp, incoming, api, translated, native_body, turn, admitted)

    route = api.name if api is not None else "chat"
    return await _serve_placing_again(dp, incoming, turn, admitted, forward, route)


Forward = Callable[[Turn, Admitted], Awaitable[Response]]


async def _serve_placing_again(
    dp: Dataplane,
    incoming: Incoming,
    turn: Turn,
    admitted: Admitted,
    forward: Forward,
    route: str,
) -> Response:
    """Serve ``turn`` (``forward`` sends it to its replica and passes the reply on).
    If its engine never received the request (the connection failed) and another
    replica serves its model, the turn ends as ``placed_again`` (reported failed, with
    ``replica_unreachable`` when the engine cannot be reached, so the scheduler takes
    the replica out of placement) and the scheduler is asked once more, for a new turn
    of the same run, class, caller and model; the client sees only the second one.
    If that lands on the same replica again, or its engine fails too, the client gets
    the error as without placing again."""
    record = turn.record
    try:
        return await serve(
            turn,
            forward(turn, admitted),
            incoming.shape,
            # (asked when it fails: a run its client ended meanwhile is not revived)
            may_place_again=lambda: (
                _another_replica(dp, record.model, record.replica)
                and not dp.runs.is_over(record.run_id)
            ),
        )
    except PlaceAgain as refused:
        error = refused.error
    cls = record.service_class
    single_pass = route == "decide"
    turn_id = f"{record.turn_id}-again"
    span = tracing.start_turn(
        incoming.headers, route=route, model=record.model, service_class=cls, run_id=record.run_id
    )
    try:
        again = await admit(
            dp,
            incoming,
            span,
            turn_id=turn_id,
            run_id=record.run_id,
            model=record.model,
            cls=cls,
            caller=record.caller,
            single_pass=single_pass,
        )
    except TurnError as exc:  # never admitted: nothing to end
        dp.metrics.turns_of(cls, exc.outcome.value).inc()
        return exc.response(record.run_id, incoming.shape)
    second = turn.successor(turn_id, again.replica, span)
    if again.replica == record.replica:
        # The scheduler does not take the replica out (yet, or any more): the client
        # gets the first turn's error, and the second turn is given back unsent.
        second.failed(
            error,
            reason=f"placed again on {record.replica}, whose connection failed for turn "
            f"{record.turn_id} just before; not sent",
            replica_unreachable=False,
        )
        return error.response(record.run_id, incoming.shape)
    log.info(
        "turn %s of run %s placed again on %s as %s: %s",
        record.turn_id,
        record.run_id,
        again.replica,
        turn_id,
        error.message[:200],
    )
    return await serve(second, forward(second, again), incoming.shape)


def _another_replica(dp: Dataplane, model: str, replica: str) -> bool:
    """Whether an endpoint other than ``replica`` serves ``model`` (of the same kind):
    only then can a turn be placed again elsewhere."""
    endpoint = dp.endpoints.get(replica)
    return any(
        e.name != replica
        and model in e.models
        and (endpoint is None or e.kind is endpoint.kind)
        and (e.discover == "static" or SEPARATOR in e.name)  # (a DNS pool's entry is none)
        for e in dp.endpoints.values()
    )


async def _forward_chat(
    dp: Dataplane, incoming: Incoming, chat: ChatRequest, turn: Turn, admitted: Admitted
) -> Response:
    """Send the turn to its replica and pass the reply on. Ends ``turn`` itself, raises a
    ``TurnError`` (``serve`` ends it then), or hands it to the stream relay."""
    record = turn.record
    endpoint = dp.endpoints.get(record.replica)
    base = endpoint.url if endpoint is not None else admitted.url.rstrip("/")
    raw = chat.engine_body_for(
        _class_priority(endpoint, record, chat.has_priority),
        _retention(endpoint, record, admitted, "vllm_xargs" in chat.body),
    )
    reply_headers = _reply_headers(record, admitted)
    response = await _post_to_engine(
        dp, incoming, turn, f"{base}/v1/chat/completions", raw, reply_headers, in_client_shape=True
    )
    content_type = response.headers.get("content-type", "application/json")
    if chat.stream and content_type.startswith("text/event-stream"):
        with _closed_on_error(response):
            stream_headers = [
                (b"content-type", content_type.encode()),
                *_STREAM_HEADERS,
                *((k.encode(), v.encode()) for k, v in reply_headers.items()),
            ]
            tap = SseTap(
                TurnOutcome(),
                chat.hide_usage,
                endpoint.null_usage_when_asked if endpoint is not None else True,
            )
        # From here the relay owns the turn and the response: its ``finally`` ends both.
        return RelayStream(response, tap, stream_headers, turn, incoming.watch)

    whole = await _read_whole(incoming, response, record.replica)
    outcome = TurnOutcome()
    outcome.read_completion_bytes(whole)
    if outcome.first_token:
        turn.first_token(streamed=False)
    turn.finished(outcome)
    return Response(whole, status_code=200, headers={**reply_headers, "content-type": content_type})


def _class_priority(endpoint: Endpoint | None, record: TurnRecord, has_own: bool) -> int | None:
    """The ``priority`` to send an engine that orders its own queue by class; None when
    it does not, or when the client set its own (which is kept)."""
    if endpoint is None or endpoint.class_priority is None or has_own:
        return None
    return endpoint.class_priority.for_class(record.service_class)


def _retention(
    endpoint: Endpoint | None, record: TurnRecord, admitted: Admitted, has_own: bool
) -> dict[str, Any] | None:
    """B8: the ``vllm_xargs`` member asking the engine to keep the run's prefix for
    ``admitted.retain_s`` after this turn, for an endpoint that declares the mechanism;
    None without a hint, or when the client sent its own ``vllm_xargs`` (kept as sent).
    The context is a JSON string: vLLM's ``vllm_xargs`` takes only strings and numbers,
    and vllm-router (like the fake engine) decodes a string context."""
    if (
        endpoint is None
        or endpoint.kv_retention is KvRetention.NONE
        or not admitted.retain_s > 0
        or has_own
    ):
        return None
    context = {"program_id": record.run_id, "kv_retention_ttl_seconds": round(admitted.retain_s, 3)}
    return {"agentic_context": json.dumps(context, separators=(",", ":"))}


async def _release_retention(dp: Dataplane, run_id: str) -> None:
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


def _reply_headers(record: TurnRecord, admitted: Admitted) -> dict[str, str]:
    return {
        identity.RUN_HEADER: record.run_id,
        identity.REPLICA_HEADER: record.replica,
        identity.HELD_HEADER: str(round(admitted.held_s * 1000)),
    }


async def _post_to_engine(
    dp: Dataplane,
    incoming: Incoming,
    turn: Turn,
    url: str,
    body: bytes,
    reply_headers: dict[str, str],
    *,
    in_client_shape: bool,
    extra_headers: dict[str, str] | None = None,
) -> EngineResponse:
    """Send the turn to its replica: the engine's 200 response, its body still to come;
    any other status is an ``EngineRejected`` carrying the engine's answer (D6), which is
    already in the client's API (``in_client_shape``) or is re-worded into it."""
    replica = turn.record.replica
    headers = _engine_headers(dp, incoming, replica)
    if extra_headers:
        headers.update(extra_headers)
    response = await _engine_post(dp, incoming, turn, url, body, headers)
    if response.status == 200:
        return response
    try:  # D6: engine rejects: status, body, Retry-After unchanged
        content = await response.read()
    except ENGINE_ERRORS:
        content = b""
    finally:
        response.release()
    headers = dict(reply_headers)
    for name in ("retry-after", "content-type"):
        if name in response.headers:
            headers[name] = response.headers[name]
    raise EngineRejected(
        f"engine {replica} answered {response.status}",
        replica,
        response.status,
        content,
        headers,
        in_client_shape=in_client_shape,
    )


async def _engine_post(
    dp: Dataplane, incoming: Incoming, turn: Turn, url: str, body: bytes, headers: dict[str, str]
) -> EngineResponse:
    """POST to the turn's replica, under a client span of the turn's (X1) that the
    engine's ``traceparent`` names: the response once its headers are in."""
    span = tracing.start_engine_request(turn.span, url)
    tracing.inject(span or turn.span, headers)
    try:
        response = incoming.engine = await dp.http.post(url, body, headers)
    except ENGINE_ERRORS as exc:
        tracing.end_engine_request(span, error=type(exc).__name__)
        raise _engine_error(turn.record.replica, exc) from None
    except asyncio.CancelledError:
        tracing.end_engine_request(span, error="cancelled")
        if incoming.watch.left_now():
            raise ClientLeft("client left before the engine answered") from None
        raise
    except BaseException as exc:
        tracing.end_engine_request(span, error=type(exc).__name__)
        raise
    tracing.end_engine_request(span, status=response.status)
    return response


@contextlib.contextmanager
def _closed_on_error(response: EngineResponse) -> Iterator[None]:
    """Whatever fails before the relay takes the response over closes it: its
    connection would otherwise stay open, the engine's reply stalled, for good."""
    try:
        yield
    except BaseException:
        response.close()
        raise


async def _read_whole(incoming: Incoming, response: EngineResponse, replica: str) -> bytes:
    """A non-streamed reply's body; the connection is dropped if it is not read to the end."""
    try:
        return await response.read()
    except ENGINE_ERRORS as exc:
        raise EngineFailed(f"engine {replica} failed: {_describe(exc)}", replica) from None
    except asyncio.CancelledError:
        if incoming.watch.left_now():
            raise ClientLeft("client left while the engine was answering") from None
        raise
    finally:
        response.release()  # unfinished: the connection is dropped, so the engine stops


_STREAM_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


async def _forward_api(
    dp: Dataplane,
    incoming: Incoming,
    api: ClientApi,
    translated: Translated,
    native_body: bytes,
    turn: Turn,
    admitted: Admitted,
) -> Response:
    """A turn of another client API (B9): passed through to a replica that serves the
    API itself (``native_body``: the client's bytes, an alias's target model written
    in), translated to Chat Completions (and its reply back) for any other. Ends
    ``turn`` itself, raises a ``TurnError`` (``serve`` ends it then), or hands it to
    the stream relay."""
    record = turn.record
    endpoint = dp.endpoints.get(record.replica)
    base = endpoint.url if endpoint is not None else admitted.url.rstrip("/")
    native = endpoint is not None and api.name in endpoint.native_apis
    extra_headers: dict[str, str] = {}
    if native:
        url = f"{base}{api.route}"
        if incoming.query:  # e.g. Claude Code's ?beta=true
            url += "?" + incoming.query.decode("latin-1")
        body = native_body
        key = dp.secrets.api_keys.get(entry_of(record.replica))
        if key and api.name == NativeApi.MESSAGES:
            extra_headers["x-api-key"] = key  # how Anthropic's API takes a key
    elif isinstance(translated, Untranslated):
        # Only endpoints serving the API natively serve this model (checked before
        # admission): a placement elsewhere is a configuration the checks missed.
        raise InternalError(
            f"replica {record.replica} does not serve {api.route} natively and the "
            f"request cannot be translated: {translated.reason}",
            record.replica,
        )
    else:
        url = f"{base}/v1/chat/completions"
        chat = {**translated.chat, "model": record.model}
        if translated.stream:
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}
        priority = _class_priority(endpoint, record, "priority" in translated.chat)
        if priority is not None:
            chat["priority"] = priority
        retention = _retention(endpoint, record, admitted, "vllm_xargs" in translated.chat)
        if retention is not None:
            chat["vllm_xargs"] = retention
        body = dumps(chat)
    reply_headers = _reply_headers(record, admitted)
    response = await _post_to_engine(
        dp,
        incoming,
        turn,
        url,
        body,
        reply_headers,
        in_client_shape=native,
        extra_headers=extra_headers,
    )
    content_type = response.headers.get("content-type", "application/json")
    if translated.stream and content_type.startswith("text/event-stream"):
        with _closed_on_error(response):
            outcome = TurnOutcome()
            tap: SseTap = (
                NativeTap(outcome, api)
                if native
                else TranslatingTap(outcome, translated.stream_translator())
            )
            headers = [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                *_STREAM_HEADERS,
                *((k.encode(), v.encode()) for k, v in reply_headers.items()),
            ]
        # From here the relay owns the turn and the response: its ``finally`` ends both.
        return RelayStream(response, tap, headers, turn, incoming.watch)
    whole = await _read_whole(incoming, response, record.replica)
    body_json = loads(whole)
    outcome = TurnOutcome()
    if not isinstance(body_json, dict) or (translated.stream and not native):
        what = "a stream" if translated.stream else "a JSON object"
        raise EngineFailed(
            f"engine {record.replica} answered 200 with {content_type}, not {what}",
            record.replica,
        )
    if native:
        api.observe_reply(body_json, outcome)
        reply = whole
    else:
        outcome.read_completion(body_json)
        reply = dumps(translated.reply(body_json))
    if outcome.first_token:
        turn.first_token(streamed=False)
    turn.finished(outcome)
    return Response(
        reply,
        status_code=200,
        headers={**reply_headers, "content-type": content_type if native else "application/json"},
    )


async def _decide(dp: Dataplane, incoming: Incoming) -> Response:
    """D7: a single-pass turn to a classifier replica (vLLM ``/classify`` format)."""
    run_id = incoming.run_id = early_run(incoming.headers, "decide")
    cls = "interactive"
    try:
        principal = _authorize(dp, incoming.headers)
        decide = decide_request(await _body(incoming, dp.settings.max_body_bytes))
        if len(incoming.headers.get(identity.RUN_HEADER, "").strip()) > identity.MAX_RUN_ID:
            raise BadRequest(
                f"{identity.RUN_HEADER} is longer than {identity.MAX_RUN_ID} characters"
            )
        default = dp.single_pass_models[0] if dp.single_pass_models else ""
        model = decide.model or default
        if model not in dp.single_pass_models:
            raise UnknownModel(f"no SinglePass replica serves model {shown(model)}")
        payload = decide.engine_body(model)
        caller = identity.caller(incoming.headers, dp.settings.caller_max_bytes, principal)
        cls, denied = _served_class(dp, principal, cls)  # (D7's turns ask for interactive)
        if denied is not None:
            incoming.extra_headers.append((_DENIED, denied.encode()))
        turn_id = new_turn_id()
        span = tracing.start_turn(
            incoming.headers,
            route="decide",
            model=model,
            service_class=cls,
            run_id=run_id,
        )
        admitted = await admit(
            dp,
            incoming,
            span,
            turn_id=turn_id,
            run_id=run_id,
            model=model,
            cls=cls,
            caller=caller,
            single_pass=True,
        )
    except TurnError as exc:  # never admitted: nothing to end
        dp.metrics.turns_of(cls, exc.outcome.value).inc()
        return exc.response(incoming.run_id)

    turn = Turn(
        TurnRecord(turn_id, run_id, admitted.replica, model, cls, caller),
        link=dp.link,
        metrics=dp.metrics,
        span=span,
    )

    def forward(turn: Turn, admitted: Admitted) -> Awaitable[Response]:
        return _classify(dp, incoming, payload, turn, admitted)

    return await _serve_placing_again(dp, incoming, turn, admitted, forward, "decide")


async def _classify(
    dp: Dataplane,
    incoming: Incoming,
    payload: bytes,
    turn: Turn,
    admitted: Admitted,
) -> Response:
    replica = turn.record.replica
    endpoint = dp.endpoints.get(replica)
    base = endpoint.url if endpoint is not None else admitted.url.rstrip("/")
    engine_headers = {**_engine_headers(dp, incoming, replica), "content-type": "application/json"}
    response = await _engine_post(dp, incoming, turn, f"{base}/classify", payload, engine_headers)
    status = response.status
    content = await _read_whole(incoming, response, replica)
    headers = _reply_headers(turn.record, admitted)
    for name in ("retry-after", "content-type"):
        if name in response.headers:
            headers[name] = response.headers[name]
    if status != 200:
        raise EngineRejected(f"engine answered {status}", replica, status, content, headers)
    turn.finished(TurnOutcome())
    return Response(content, status_code=status, headers=headers)


def _engine_error(replica: str, exc: BaseException) -> TurnError:
    """An engine request that raised: the engine cannot be reached (the replica leaves
    placement until its probe passes), or something else broke before the reply."""
    message = f"engine {replica}: {_describe(exc)}"
    not_sent = isinstance(exc, NOT_SENT)  # the engine never saw it: it may be placed again
    # A connect that failed for want of something here (open files, local ports,
    # buffer space) is this machine's trouble, not the engine's: it must not take a
    # healthy replica out of placement.
    if isinstance(exc, ConnectTimeout) or (isinstance(exc, ConnectFailed) and exc.unreachable):
        return EngineUnreachable(message, replica, not_sent=not_sent)
    return EngineFailed(message, replica, not_sent=not_sent)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectTimeout):
        return "connect timeout"
    if isinstance(exc, ConnectFailed):
        return f"connection failed: {exc.os_error.strerror or exc.os_error}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
