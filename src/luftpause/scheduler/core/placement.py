"""Placement: which replica a new turn is admitted to right now (S2, S3, S4, B5, B7).

A policy unit of the core, built as the Gateway API Inference Extension's endpoint
picker builds its scheduler: **filter → score → pick**. ``decide.py``'s theory of
operation says how it composes with the rest: a new turn is tried here the moment it
arrives (``decide._Tx._place`` is a call of ``place``); if no replica is returned it is
held, and ``_fill`` later takes it when a replica has room (asking ``has_room`` and
``may_start_run`` of this module and ``order.py`` for which held turn goes first).

What it reads: the replicas' records (``ReplicaState``): health, the cap (S2), turns in
flight, interactive reservations (S4), the runs living there (``pinned_runs``, S3),
prefix keeping's run limit, the batch limit of the interactive target (``pace_cap``,
through ``target.paced``), the working-set sums (through ``working_set.admits``) and
whether the engine orders its queue by class (``ReplicaSpec.orders_classes``); the new
turn's run (its last replica), kind, class, lane and arrival number; the replicas
marked unhealthy; ``Params.keep_prefixes`` and ``Params.working_set``.

What it decides: the replica of ``names`` (those of the turn's kind serving its model)
the turn is admitted to, or None (it is held). Nothing else: it changes no record.

The rules, in order:

1. **The pinned-lane rule** (S3, strict affinity): a turn in its run's pin lane, the
   run's replica healthy, goes there if it has room (``has_room``), and nowhere else.
2. **Last replica first**: a turn of a known run (free, or pinned to an unhealthy
   replica: then the run may move) goes to the run's last replica if that serves the
   model, has room and may start the run there (``may_start_run``): its prefix may still
   be cached there.
3. **Packing** (``packing_rule``, B7; only with a relative interactive target and
   ``Params.target_packing``): a new generative interactive turn goes where interactive
   runs live and meet the target, else where none lives, else to a crowded replica
   (``target.py``, "Packing").
4. **Least loaded** (``least_loaded``): filter, score, pick.

The filters a replica must pass, each a predicate of its own (``filters`` composes the
ones that apply to a turn from its kind, its class and ``Params``):

- ``healthy``: always (S9);
- ``under_pace_limit``: batch turns (B7: an interactive run lives there and its batch
  turns are at the limit the interactive target set);
- ``room_by_cap``: always (S2, S4): no cap, or an interactive turn under the cap (or on
  a replica whose engine orders its queue by class: it always fits there), or a batch
  turn with the cap over its turns in flight plus the interactive reservations;
- ``under_run_limit``: generative batch turns with prefix keeping on and working-set
  admission not ``REPLACE``: fewer runs live there than prefix keeping's run limit;
- ``working_set_admits``: generative batch turns with working-set admission on
  (``working_set.admits``).

The score (``score``, least first): the runs living there (generating or paused on a
tool: they come back), then the turns in flight plus reservations, then the rotation.
The pick: the replica of least score. The rotation is ``(i + 1 - seq) mod n`` for the
i-th of n names and the turn's arrival number ``seq``: distinct per replica, so the
pick is a total order (deterministic), and ties of load rotate with the arrivals.

Speed (S1): ``least_loaded`` runs over every replica of the model for each turn of a new
run, so the filters are inlined in its loop, each as the one-line predicate of the same
name, and so is the score, compared part by part with the best so far (a call of
``score`` per replica, and a tuple to compare, made the loop 1.3-1.7x slower where most
replicas have room). ``tests/unit/test_core_placement.py`` checks, over random replica
states and parameters, that its pick is the replica of least ``score`` among those
passing every filter of ``filters``. ``score`` is the definition: a new part of it (one
only some configurations use, as a term that spreads interactive runs) goes there and
in the loop's comparison, and the property fails until the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

from luftpause.scheduler.core import target, working_set
from luftpause.scheduler.core.state import Lane, ReplicaState, RunState
from luftpause.scheduler.core.target import paced
from luftpause.scheduler.core.types import EndpointKind, Params, ServiceClass, WorkingSet

Filter = Callable[[ReplicaState], bool]
_BATCH = ServiceClass.BATCH
_GENERATIVE = EndpointKind.GENERATIVE

# ------------------------------------------------------------------ filters


def healthy(rep: ReplicaState) -> bool:
    """S9: the last probe (or no failed connection since) found it healthy."""
    return rep.healthy


def under_pace_limit(rep: ReplicaState) -> bool:
    """B7, batch turns: not at the batch limit of the interactive target
    (``target.paced``: an interactive run lives there and its batch turns are at it)."""
    return not paced(rep)


def room_by_cap(rep: ReplicaState, cls: ServiceClass) -> bool:
    """S2, S4: the cap leaves a slot for a turn of class ``cls``. An interactive turn
    fits under the cap, or always where the engine orders its queue by class (it waits
    there only behind other interactive turns); a batch turn fits while the turns in
    flight plus the interactive runs' reservations are under the cap."""
    cap = rep.cap
    if cap is None:
        return True
    if cls is _BATCH:
        return rep.in_flight + rep.reserved < cap
    return rep.spec.orders_classes or rep.in_flight < cap


def under_run_limit(rep: ReplicaState) -> bool:
    """Prefix keeping, for a batch run new to the replica: fewer runs live there than its
    run limit (None: not limited; it is None exactly while the cap is)."""
    return rep.run_limit is None or rep.pinned_runs < rep.run_limit


def working_set_admits(rep: ReplicaState, params: Params) -> bool:
    """B5, for a batch run new to the replica: ``working_set.admits``."""
    return working_set.admits(rep, params)


def has_room(rep: ReplicaState, cls: ServiceClass) -> bool:
    """Room for a turn of class ``cls`` (whether or not its run lives there): the filters
    ``healthy``, ``under_pace_limit`` (batch) and ``room_by_cap``, inlined. ``_fill`` asks
    it of a replica before taking a held turn; the pinned-lane and last-replica rules
    ask it too."""
    if not rep.healthy:
        return False
    if cls is _BATCH and paced(rep):
        return False
    cap = rep.cap
    if cap is None:
        return True
    if cls is _BATCH:
        return rep.in_flight + rep.reserved < cap
    # An engine that orders its queue by class puts the turn ahead of every batch
    # request it has queued: holding it here could only add a wait.
    return rep.spec.orders_classes or rep.in_flight < cap


def may_start_run(rep: ReplicaState, cls: ServiceClass, params: Params) -> bool:
    """Whether ``rep`` may take a turn of class ``cls`` of a run not living there: the
    new-run filters (a replica with room passes the others). Prefix keeping: a capped
    replica takes a batch run that is not already there only while fewer runs than its
    run limit live there, so the prefixes of the runs it serves stay in the engine's
    cache between their turns. Working-set admission (``Params.working_set``): also, or
    instead, only while the runs' contexts leave room for its own in the KV pool."""
    if params.working_set is not WorkingSet.OFF and cls is _BATCH:
        if not working_set.admits(rep, params):
            return False
        if params.working_set is WorkingSet.REPLACE:
            return True
    if not params.keep_prefixes or rep.run_limit is None:
        return True
    if cls is ServiceClass.INTERACTIVE:
        return True  # S4: interactive first, new runs included; they are few
    return rep.pinned_runs < rep.run_limit


def filters(params: Params, kind: EndpointKind, cls: ServiceClass) -> tuple[Filter, ...]:
    """The filters a replica must pass for a new free turn of ``kind`` and ``cls``, as
    ``least_loaded`` applies them (inlined there)."""
    out: list[Filter] = [healthy]
    if cls is _BATCH:
        out.append(under_pace_limit)
    out.append(partial(room_by_cap, cls=cls))
    if cls is _BATCH and kind is _GENERATIVE:  # a new run's turn: prefix keeping, B5
        if params.keep_prefixes and params.working_set is not WorkingSet.REPLACE:
            out.append(under_run_limit)
        if params.working_set is not WorkingSet.OFF:
            out.append(partial(working_set_admits, params=params))
    return tuple(out)


# ------------------------------------------------------------------ score and pick


def rotation(i: int, n: int, seq: int) -> int:
    """The tie-break of the ``i``-th of ``n`` replicas for the turn of arrival number
    ``seq``: distinct per replica, and each arrival moves which one is least."""
    return (i + 1 - seq) % n


def score(rep: ReplicaState, rot: int) -> tuple[int, int, int]:
    """A replica's placement score, least first: the runs living there (generating or
    paused on a tool: they come back), the turns in flight plus reservations, then its
    ``rotation``."""
    return (rep.pinned_runs, rep.in_flight + rep.reserved, rot)


def least_loaded(
    replicas: Mapping[str, ReplicaState],
    names: tuple[str, ...],
    params: Params,
    kind: EndpointKind,
    cls: ServiceClass,
    seq: int,
) -> str | None:
    """Of ``names``, the replica passing every filter of ``filters(params, kind, cls)``
    with the least ``score``; None if none passes."""
    batch = cls is _BATCH
    # which filters apply, as ``filters`` composes them
    wset = batch and kind is _GENERATIVE and params.working_set is not WorkingSet.OFF
    limit_runs = (
        batch
        and kind is _GENERATIVE
        and params.keep_prefixes
        and params.working_set is not WorkingSet.REPLACE
    )
    n = len(names)
    choice = None
    best_pinned = best_load = best_rot = 0
    for i, name in enumerate(names):
        rep = replicas[name]
        # The filters, inlined (each the predicate of the same name).
        if not rep.healthy:  # healthy
            continue
        load = rep.in_flight + rep.reserved
        pinned = rep.pinned_runs
        if batch:
            if rep.pace_cap is not None and paced(rep):  # under_pace_limit
                continue
            cap = rep.cap
            if cap is not None and (  # room_by_cap; under_run_limit (None without a cap)
                load >= cap
                or (limit_runs and rep.run_limit is not None and pinned >= rep.run_limit)
            ):
                continue
            if wset and not working_set.admits(rep, params):  # working_set_admits
                continue
        else:
            cap = rep.cap
            if cap is not None and rep.in_flight >= cap and not rep.spec.orders_classes:
                continue  # room_by_cap
        # The score, inlined: ``score(rep, rotation(i, n, seq))`` less than the best's,
        # compared part by part (a new part of ``score`` goes here too).
        if choice is not None:
            if pinned != best_pinned:
                if pinned > best_pinned:
                    continue
            elif load != best_load:
                if load > best_load:
                    continue
            elif (i + 1 - seq) % n > best_rot:
                continue
        choice, best_pinned, best_load, best_rot = name, pinned, load, (i + 1 - seq) % n
    return choice


# ------------------------------------------------------------------ the rules


def pinned_lane_rule(lane: Lane, unhealthy: Mapping[str, object]) -> str | None:
    """S3: the replica a turn in ``lane`` is bound to (strict affinity), or None: a free
    lane, or the pin lane of an unhealthy replica (the run may move)."""
    if lane[0] == "pin" and lane[1] not in unhealthy:
        return lane[1]
    return None


def last_replica_first(
    replicas: Mapping[str, ReplicaState],
    run: RunState,
    names: tuple[str, ...],
    cls: ServiceClass,
    params: Params,
) -> str | None:
    """The run's last replica if it serves the model, has room and may start the run
    there (its prefix may still be cached there); else None."""
    last = run.replica
    if last is not None and last in names:
        rep = replicas[last]
        if has_room(rep, cls) and may_start_run(rep, cls, params):
            return last
    return None


def place(
    replicas: Mapping[str, ReplicaState],
    unhealthy: Mapping[str, object],
    params: Params,
    run: RunState | None,
    names: tuple[str, ...],
    kind: EndpointKind,
    cls: ServiceClass,
    lane: Lane,
    seq: int,
) -> str | None:
    """The replica a new turn (arrival number ``seq``, in ``lane``) is admitted to now,
    of ``names``, the replicas of its kind serving its model; None: it is held. ``run``:
    its run, if generative and known."""
    pinned = pinned_lane_rule(lane, unhealthy)
    if pinned is not None:
        return pinned if has_room(replicas[pinned], cls) else None
    if run is not None:
        last = last_replica_first(replicas, run, names, cls, params)
        if last is not None:
            return last
    if cls is ServiceClass.INTERACTIVE and kind is _GENERATIVE and target.packs(params):
        return packing_rule(replicas, names, params, seq)
    return least_loaded(replicas, names, params, kind, cls, seq)


def packing_rule(
    replicas: Mapping[str, ReplicaState], names: tuple[str, ...], params: Params, seq: int
) -> str | None:
    """A relative target packs new interactive turns (``target.pack``): of the replicas
    with room for one."""
    room = [
        (i, rep)
        for i, name in enumerate(names)
        if has_room(rep := replicas[name], ServiceClass.INTERACTIVE)
    ]
    return target.pack(room, len(names), seq, params)
