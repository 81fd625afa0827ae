"""The generative turn routes: Chat Completions, Messages and Responses (B9).

``generative`` is one turn's path up to its replica: authenticate, read and parse the
body, resolve run, class and caller, pick the served model, admit, open the ``Turn``;
then it hands the turn to ``placing.serve_placing_again`` with the API's forwarder
(``chat.forward_chat`` or ``translated.forward_api``).
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.responses import Response

from luftpause.dataplane import identity, tracing
from luftpause.dataplane.admission import admit, new_turn_id
from luftpause.dataplane.apis import ClientApi, Translated
from luftpause.dataplane.asgi import Incoming, early_run
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.errors import (
    BadRequest,
    TurnError,
)
from luftpause.dataplane.link_codec import Admitted
from luftpause.dataplane.request import (
    ChatRequest,
    chat_request,
    with_members,
)
from luftpause.dataplane.routes.chat import forward_chat
from luftpause.dataplane.routes.inbound import authorize, read_body, served_class
from luftpause.dataplane.routes.placing import serve_placing_again
from luftpause.dataplane.routes.translated import api_request, forward_api
from luftpause.dataplane.runs import TurnRecord
from luftpause.dataplane.turn import Turn


async def chat_route(dp: Dataplane, incoming: Incoming) -> Response:
    return await generative(dp, incoming, None)


async def generative(dp: Dataplane, incoming: Incoming, api: ClientApi | None) -> Response:
    """A generative turn on Chat Completions (``api`` None) or on another client API,
    which is translated to Chat Completions unless the replica serves it natively (B9).
    Either way the turn is scheduled the same."""
    incoming.run_id = early_run(incoming.headers, "run")
    if api is not None:
        incoming.shape = api.error_body
    cls = "batch"
    translated: Translated | None = None
    chat: ChatRequest | None = None
    try:
        principal = authorize(dp, incoming.headers)
        raw = await read_body(incoming, dp.settings.max_body_bytes)
        if api is None:
            chat = chat_request(raw)
            asked, conversation = chat.model, chat.body
        else:
            translated = api_request(dp, api, raw)
            asked, conversation = translated.model, translated.chat
        try:
            cls = identity.service_class(incoming.headers)
            run_id, echoed = identity.resolve_run_id(
                incoming.headers, conversation, dp.memory, dp.settings.session_headers, asked
            )
            caller = identity.caller(incoming.headers, dp.settings.caller_max_bytes, principal)
        except identity.BadHeader as exc:
            raise BadRequest(str(exc)) from None
        cls = served_class(dp, incoming, principal, cls)  # B13: one its key may use
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
            return forward_chat(dp, incoming, chat, turn, admitted)
        assert translated is not None
        return forward_api(dp, incoming, api, translated, native_body, turn, admitted)

    route = api.name if api is not None else "chat"
    return await serve_placing_again(dp, incoming, turn, admitted, forward, route)
