"""The interactive target (decode pace, B7): how many batch turns a replica runs beside
an interactive run.

Reads: a finished turn's reply (its first-token time, its completion tokens, the batch
turns that ran beside it) and the replica's record (its batch turns in flight, its
reservations, the limit and its history); ``Params.interactive_pace_s`` (an absolute
target, seconds per reply token) or ``Params.interactive_slowdown`` (a target relative
to the replica's floor).

Decides: the replica's batch limit (``ReplicaState.pace_cap``), which ``paced`` turns
into "no room for batch" while an interactive run lives there. Nothing else: placement
and ordering read ``paced`` and never the pace itself.

Why decode pace: every request an engine runs shares each decode step, so a reply's
seconds per token (first token to end) say how crowded the engine is, whatever the cause
(more requests, longer contexts, prefills stalling the step). Some overload never shows
as a queue, so the cap (S2) cannot see it.

The controller. A reply that ended on a replica speaks for the limit only if its turn
was admitted after the limit last changed, so the limit changes at most once per turn's
length, as a congestion window changes once per round trip. While an interactive run
lives on the replica (or the reply is that run's):

- a reply slower than the target, with other batch turns beside it, cuts the limit to
  ``BACKOFF`` (3/4) of the batch turns it ran beside (at most the limit, at least 1);
- a reply faster than ``HEADROOM`` (4/5) of the target, with batch turns at the limit,
  raises the limit by one.

Stability. The cut is multiplicative and the raise additive with a dead band between
them (replies between 4/5 of the target and the target change nothing), so after a step
change of load the limit falls geometrically to the largest count that keeps replies
under the target and then stays within one cut of it: it never grows an oscillation
whose amplitude exceeds the last cut, and each change waits for a turn admitted after
the previous one. A lasting overload (the target unreachable even at one batch turn)
holds the limit at 1; it never reaches 0, so batch work always moves.

The target, per replica:

- ``interactive_slowdown`` = s (a target relative to the floor): s × the replica's
  floor, the fastest pace a reply there had with at most one other batch turn beside
  it. Until the replica has shown one, the controller seeks it: every reply counts as
  too slow, so the limit falls (a cut per turn's length) to one batch turn, the next
  reply sets the floor, and the limit rises from there as the target allows. A floor
  learned from whatever replies came (the fastest of a replica that was always
  crowded) would be the crowded pace itself, and a target relative to it would never
  cut.
- else ``interactive_pace_s`` (absolute), but never tighter than ``BEST_FACTOR`` (1.5)
  times the fastest reply with at most one other batch turn beside it, so an engine
  slower than the target even then still runs batch work beside an interactive run.

The batch cost of meeting the target is ``withheld``: the batch slots the limit keeps
empty on a capped replica while its cap would allow them.
"""

from __future__ import annotations

from luftpause.scheduler.core.state import ReplicaState, TurnState
from luftpause.scheduler.core.types import Params, ServiceClass

# The weight of each new reply in the smoothed pace the status view shows, the share of
# the batch turns kept when a reply is too slow, the share of the target a reply must
# stay under for the limit to rise, and the floor on an absolute target, as a multiple of
# the replica's fastest reply.
WEIGHT = 0.25
BACKOFF = 0.75
HEADROOM = 0.8
BEST_FACTOR = 1.5


def enabled(params: Params) -> bool:
    """Whether replies are timed at all."""
    return params.interactive_slowdown is not None or params.interactive_pace_s is not None


def target_pace(params: Params, best: float | None) -> float | None:
    """Seconds per token replies on a replica whose fastest pace is ``best`` should stay
    under; None: no target yet (a relative target before any reply) or none set."""
    slowdown = params.interactive_slowdown
    if slowdown is not None:
        return None if best is None else slowdown * best
    target = params.interactive_pace_s
    if target is None or best is None:
        return target
    return max(target, BEST_FACTOR * best)


def interactive_lives_on(rep: ReplicaState) -> bool:
    """An interactive run has a turn in flight on ``rep`` (every turn there that is not
    batch is interactive) or is paused on a tool there (S4's reservation)."""
    return rep.reserved > 0 or rep.in_flight > rep.batch_in_flight


def paced(rep: ReplicaState) -> bool:
    """The replica's batch turns are at the limit its pace set, and an interactive run
    lives there: no room for another batch turn."""
    return (
        rep.pace_cap is not None
        and rep.batch_in_flight >= rep.pace_cap
        and interactive_lives_on(rep)
    )


def withheld(rep: ReplicaState) -> int | None:
    """Batch slots the limit keeps empty now that the cap (S2) and the interactive
    reservations would allow: what meeting the target costs batch work on ``rep``.
    None where the replica has no cap (nothing says what it could take)."""
    if rep.cap is None:
        return None
    if rep.pace_cap is None or not interactive_lives_on(rep):
        return 0
    interactive = rep.in_flight - rep.batch_in_flight
    room = rep.cap - rep.reserved - interactive  # batch turns the cap alone would allow
    return max(0, room - rep.pace_cap)


def feedback(
    rep: ReplicaState,
    turn: TurnState,
    completion_tokens: int,
    now: float,
    params: Params,
) -> tuple[int | None, float, float | None, float | None]:
    """A reply of ``completion_tokens`` tokens (timed from ``turn.first_token_at`` to
    ``now``) ended on ``rep``: its new ``(pace_cap, pace_s, pace_set_at, pace_best_s)``.
    As S2's cap, the limit is only set on a replica whose last probe reported its load.
    ``pace_s`` smooths every reply for the status view; the limit follows single replies,
    because a smoothed pace would still remember the turns before a cut and cut again."""
    assert turn.first_token_at is not None
    pace = max(0.0, now - turn.first_token_at) / (completion_tokens - 1)
    smoothed = pace if rep.pace_s is None else rep.pace_s + WEIGHT * (pace - rep.pace_s)
    # Other batch turns that ran beside it: as many as were in flight when it was
    # admitted or are when it ends, whichever is more (a reply the batch turns left just
    # before its end still ran beside them).
    others = max(turn.batch_beside, rep.batch_in_flight)
    is_batch = turn.service_class is ServiceClass.BATCH
    best = rep.pace_best_s
    # the floor: a reply with at most one other batch turn beside it
    if others <= 1 and (best is None or pace < best):
        best = pace
    target = target_pace(params, best)
    cap = rep.pace_cap
    set_at = rep.pace_set_at
    if target is None:  # a relative target with no floor yet: seek it (any reply is slow)
        target = 0.0
    # (the interactive turn itself counts, whether or not its run lives on)
    interactive_here = not is_batch or interactive_lives_on(rep)
    reports_load = rep.running is not None and rep.waiting is not None  # (last probe)
    if reports_load and interactive_here and (set_at is None or turn.admitted_at >= set_at):
        batch = others + is_batch  # the batch turns of that moment, itself included
        if pace > target and others > 0:  # (alone, batch work did not slow it)
            lowered = max(1, int(min(batch, batch if cap is None else cap) * BACKOFF))
            if cap is None or lowered < cap:
                cap = lowered
        elif cap is not None and pace < target * HEADROOM and batch >= cap:
            cap += 1
    if cap != rep.pace_cap:
        set_at = now
    return cap, smoothed, set_at, best
