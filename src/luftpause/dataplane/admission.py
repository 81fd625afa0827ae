"""Admission: asking the scheduler for a turn's slot and waiting while it is held.

``admit`` sends the turn's admission request over the scheduler link and waits with
no deadline (D4): the turn comes out admitted (the caller then owns it and its
span), refused (a ``TurnError``: unknown model, over quota, bad request), or
abandoned because the client left while it was held (``abandoned`` tells the
scheduler, in case it admitted the turn as the client went). ``new_turn_id`` names
turns.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import time
from collections.abc import Sequence

from opentelemetry.trace import Span

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.dataplane import link_codec, tracing
from luftpause.dataplane.asgi import Incoming
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.errors import Abandoned, BadRequest, OverQuota, TurnError, UnknownModel
from luftpause.dataplane.link_codec import Admitted, Rejected


async def admit(
    dp: Dataplane,
    incoming: Incoming,
    span: Span,
    *,
    turn_id: str,
    run_id: str,
    model: str,
    cls: str,
    caller: str,
    single_pass: bool = False,
    echoed_tool_call_ids: Sequence[str] = (),
) -> Admitted:
    """Ask the scheduler and wait while held (D4). On the way out, the turn is either
    admitted (and the caller owns it and its ``span``) or it never took a slot: the
    client left (``Abandoned``) or the scheduler refused it, and its span is ended."""
    req = link_codec.admit_request(
        turn_id,
        run_id,
        model,
        cls,
        caller,
        single_pass=single_pass,
        echoed_tool_call_ids=echoed_tool_call_ids,
        traceparent=tracing.traceparent_of(span),
    )
    try:
        admitted = await _admit_untraced(dp, incoming, req, cls)
    except BaseException as exc:
        tracing.end(span, exc.outcome.value if isinstance(exc, TurnError) else "abandoned")
        raise
    tracing.admitted(span, replica=admitted.replica, held_s=admitted.held_s)
    return admitted


async def _admit_untraced(
    dp: Dataplane, incoming: Incoming, req: pb.AdmitRequest, cls: str
) -> Admitted:
    t0 = time.monotonic()
    holding = dp.metrics.holding_of(cls)
    holding.inc()
    incoming.watch.start()
    try:
        outcome = await dp.link.admit(req)
    except asyncio.CancelledError:
        abandoned(dp, req.turn_id, req.run_id)
        if incoming.watch.left_now():  # D4: the client left while held; no engine request
            raise Abandoned("client left while the turn was held") from None
        raise
    finally:
        holding.dec()
    if isinstance(outcome, Rejected):
        if outcome.unknown_model:
            raise UnknownModel(outcome.message)
        if outcome.over_quota:
            dp.metrics.over_quota_of(outcome.limit or "unknown").inc()
            raise OverQuota(outcome.message, outcome.retry_after_s, outcome.limit)
        raise BadRequest(outcome.message)
    # Everything the dataplane held it for, a scheduler outage included (the
    # scheduler's own held_s starts again with each retry).
    held_s = time.monotonic() - t0
    dp.metrics.held_of(cls).observe(held_s)
    incoming.scheduler_held_s += outcome.held_s  # (a turn placed again asks twice)
    dp.learn_replica(outcome.replica, outcome.url)
    return Admitted(outcome.replica, outcome.url, held_s, outcome.run_id, outcome.retain_s)


def abandoned(dp: Dataplane, turn_id: str, run_id: str) -> None:
    """The client left while its turn was held. Cancelling the Admit call abandons a
    turn the scheduler still holds, but not one it admitted while the cancel was on its
    way (or whose answer arrived as the client left): report that one as failed, so its
    slot is freed now rather than at the turn timeout. A held or unknown turn ignores it.
    """
    dp.link.report(link_codec.failed(turn_id, run_id, "client left while the turn was held"))


class _TurnIds:
    """Turn IDs unique across dataplanes and restarts, without a ``uuid4`` per turn (its
    system call and object were about 2 % of the dataplane's CPU per turn): this
    process's random 64-bit prefix, then a counter. A forked child draws its own prefix.
    (Run IDs the dataplane makes stay ``uuid4``: a client may hold one for the run's
    life, and it must not be guessable from another.)"""

    def __init__(self) -> None:
        self.reset()
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self.prefix = f"turn-{secrets.token_hex(8)}"
        self.numbers = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.numbers):016x}"


new_turn_id = _TurnIds()
