"""``POST /v1/decide`` (D7): a single-pass turn to a classifier replica.

Authenticated, parsed and admitted like a generative turn (as ``interactive``, with
no run state, S13), then posted to the replica's ``/classify`` and answered whole.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.responses import Response

from luftpause.dataplane import identity, tracing
from luftpause.dataplane.admission import admit, new_turn_id
from luftpause.dataplane.asgi import Incoming, early_run
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.errors import (
    BadRequest,
    EngineRejected,
    TurnError,
    UnknownModel,
    shown,
)
from luftpause.dataplane.link_codec import Admitted
from luftpause.dataplane.outcome import TurnOutcome
from luftpause.dataplane.request import (
    decide_request,
)
from luftpause.dataplane.routes.engine import (
    engine_headers_of,
    engine_post,
    read_whole,
    reply_headers_of,
)
from luftpause.dataplane.routes.inbound import authorize, read_body, served_class
from luftpause.dataplane.routes.placing import serve_placing_again
from luftpause.dataplane.runs import TurnRecord
from luftpause.dataplane.turn import Turn


async def decide_route(dp: Dataplane, incoming: Incoming) -> Response:
    """D7: a single-pass turn to a classifier replica (vLLM ``/classify`` format)."""
    run_id = incoming.run_id = early_run(incoming.headers, "decide")
    cls = "interactive"
    try:
        principal = authorize(dp, incoming.headers)
        decide = decide_request(await read_body(incoming, dp.settings.max_body_bytes))
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
        cls = served_class(dp, incoming, principal, cls)  # (D7's turns ask for interactive)
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

    return await serve_placing_again(dp, incoming, turn, admitted, forward, "decide")


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
    engine_headers = {
        **engine_headers_of(dp, incoming, replica),
        "content-type": "application/json",
    }
    response = await engine_post(dp, incoming, turn, f"{base}/classify", payload, engine_headers)
    status = response.status
    content = await read_whole(incoming, response, replica)
    headers = reply_headers_of(turn.record, admitted)
    for name in ("retry-after", "content-type"):
        if name in response.headers:
            headers[name] = response.headers[name]
    if status != 200:
        raise EngineRejected(f"engine answered {status}", replica, status, content, headers)
    turn.finished(TurnOutcome())
    return Response(content, status_code=status, headers=headers)
