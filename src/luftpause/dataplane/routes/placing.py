"""Serving an admitted turn, and placing it again if its engine never received it.

``serve_placing_again`` runs the route's forwarder under ``turn.serve``; when the
engine connection failed before the request went out and another replica serves the
model, the turn ends as ``placed_again`` and is admitted once more as a new turn.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.responses import Response

from luftpause.dataplane import tracing
from luftpause.dataplane.admission import admit
from luftpause.dataplane.asgi import Incoming
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.errors import (
    TurnError,
)
from luftpause.dataplane.link_codec import Admitted
from luftpause.dataplane.turn import PlaceAgain, Turn, serve
from luftpause.members import SEPARATOR

log = logging.getLogger("luftpause.dataplane")


Forward = Callable[[Turn, Admitted], Awaitable[Response]]


async def serve_placing_again(
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
