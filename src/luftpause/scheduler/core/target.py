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

Packing (a relative target with ``Params.target_packing``, an option). On a pool of
replicas the limit alone plateaus: new interactive runs go where the fewest runs live,
which is where the limit has already kept batch runs out, so every interactive run
gathers on one replica; there the limit stops at one batch turn and the interactive
runs crowd each other's decode steps and prefills, two thirds of the floor on 4-16
replicas. Packing gives interactive runs as many replicas as they need to meet the
target, and batch work the rest:

- ``least_limit``: on a replica where an interactive run lives, a reply slower than the
  target beside one batch turn cuts the limit to 0 (``starved``: no batch turn), but
  only while another healthy replica serving the model is not starved, so batch work
  always has a replica; else the limit stops at 1 as before.
- ``crowded``: a starved replica whose smoothed pace still misses the target: its
  interactive runs crowd it, and no batch turn is left to cut.
- ``pack``: a new interactive run goes to a replica where interactive runs live and that
  is not crowded, the fewest interactive turns first; else to a replica where none
  lives, the fewest runs living first (today's key); else (every replica crowded) to the
  fewest runs living.
- Liveness (S3 bounded): a batch run pinned to a starved replica is pinned no more: its
  next turn is placed as a new run's, and the turns it has held there move to the free
  lane within one clock tick (``decide``'s tick). If every healthy replica of a model is
  starved (the last one became so when an interactive run arrived on a replica whose
  limit was already 0), ``relieve`` names the one that gets one batch turn back, at the
  same tick. So a held batch turn waits at most one tick longer than it would behind a
  limit of 1, and every limit of 0 leaves a replica that takes batch work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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
    least: int = 1,
) -> tuple[int | None, float, float | None, float | None]:
    """A reply of ``completion_tokens`` tokens (timed from ``turn.first_token_at`` to
    ``now``) ended on ``rep``: its new ``(pace_cap, pace_s, pace_set_at, pace_best_s)``.
    As S2's cap, the limit is only set on a replica whose last probe reported its load.
    ``pace_s`` smooths every reply for the status view; the limit follows single replies,
    because a smoothed pace would still remember the turns before a cut and cut again.
    ``least``: the lowest the limit may go (``least_limit``; 1 without packing)."""
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
            lowered = max(least, int(min(batch, batch if cap is None else cap) * BACKOFF))
            if cap is None or lowered < cap:
                cap = lowered
        elif cap is not None and pace < target * HEADROOM and batch >= cap:
            cap += 1
    if cap != rep.pace_cap:
        set_at = now
    return cap, smoothed, set_at, best


# ------------------------------------------------------------------ packing


def packs(params: Params) -> bool:
    """Packing is on: a relative target with ``target_packing``."""
    return params.interactive_slowdown is not None and params.target_packing


def starved(rep: ReplicaState) -> bool:
    """The limit is 0 and an interactive run lives on ``rep``: no batch turn may start
    there, and the batch runs pinned there may move."""
    return rep.pace_cap == 0 and interactive_lives_on(rep)


def crowded(rep: ReplicaState, params: Params) -> bool:
    """``rep`` is starved and its smoothed pace still misses the target: its interactive
    runs crowd it, and there is no batch turn left to cut."""
    if not starved(rep):
        return False
    goal = target_pace(params, rep.pace_best_s)
    return goal is not None and rep.pace_s is not None and rep.pace_s > goal


def least_limit(others: Iterable[ReplicaState]) -> int:
    """The lowest limit a replica may take, given the ``others`` that serve its model: 0
    while one of them is healthy and not starved (batch work keeps a replica), else 1."""
    return 0 if any(r.healthy and not starved(r) for r in others) else 1


def pack(
    candidates: Sequence[tuple[int, ReplicaState]], n: int, seq: int, params: Params
) -> str | None:
    """Where a new interactive run (arrival number ``seq``) goes, of ``candidates``: the
    replicas with room for it, each with its index among the ``n`` serving its model.
    Where interactive runs live and the target holds, the fewest interactive turns
    (in flight or paused) first; else where none lives, the fewest runs living first;
    else the fewest runs living. Then the fewest turns in flight and reserved; ties
    rotate with the arrival order, as ``decide._place``'s own key."""
    best: tuple[int, int, int, int] | None = None
    name = None
    for i, rep in candidates:
        load = rep.in_flight + rep.reserved
        if not interactive_lives_on(rep):
            key = (1, rep.pinned_runs, load, (i + 1 - seq) % n)
        elif crowded(rep, params):
            key = (2, rep.pinned_runs, load, (i + 1 - seq) % n)
        else:
            key = (0, load - rep.batch_in_flight, load, (i + 1 - seq) % n)
        if best is None or key < best:
            best, name = key, rep.spec.name
    return name


def relieve(reps: Sequence[ReplicaState]) -> str | None:
    """Of the replicas serving one model: None while a healthy one is not starved (or
    none is healthy); else the starved replica that gets one batch turn back, the one
    with the fewest interactive turns (in flight or paused), then by name."""
    healthy = [r for r in reps if r.healthy]
    if not healthy or any(not starved(r) for r in healthy):
        return None
    pick = min(healthy, key=lambda r: (r.in_flight + r.reserved - r.batch_in_flight, r.spec.name))
    return pick.spec.name
