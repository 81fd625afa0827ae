"""``decide(state, event) -> (state, actions)``: every scheduling policy, in one place.

Theory of operation
-------------------
A turn asks to enter an engine (``TurnRequested``). It is either admitted at
once or *held* in a lane (see ``state.py``) until a slot frees. The invariant
kept after every event is: **no held turn could be admitted now**. So only two
things ever admit:

1. a new turn, tried on its own the moment it arrives (if it fits, nothing held
   competes for that slot, else that held turn would already have been admitted);
2. ``_fill(replica)`` for every replica whose room may have grown during the
   event (a slot freed, a cap rose, a reservation ended, it became healthy).

Room on a replica (S2, S4): an unhealthy replica has none. A replica with no cap
(it reports no load, or its engine never queued) has unlimited room. Otherwise
an interactive turn fits while ``in_flight < cap``; a batch turn fits while
``in_flight + reserved < cap``, where ``reserved`` counts interactive runs paused
on a tool there: they will come back and find a slot (a run that comes back as
batch, its client having changed the class, gives its own slot up before it is
placed). On a replica whose engine orders its own queue by class
(``ReplicaSpec.orders_classes``: the dataplane sends a per-class ``priority``), an
interactive turn always fits: in the engine's queue it waits only behind other
interactive turns, while here it would wait for the cap to clear. The cap and the
reservations still bound batch work there.

Which held turn goes first when a replica has room (S4, S5): interactive before
batch; within a class, by the held-turn order (``order.py``, a policy unit whose
docstring says what it reads and decides): the caller first (``Params.fairness``:
fewest turns in flight, the default, or least virtual tokens, B3), then (prefix
keeping) a turn whose run lives on that replica, then in the batch class (with
``Params.batch_order = "attained"``, B2) the run with least attained service, then
arrival order. ``_best_held`` gathers the candidates and keeps the least by
``order.held_key`` (the key, built once per pick from the options and the class):
the candidates are the heads of the caller FIFOs in the lanes that replica can serve,
its own pin lane and (where ``placement.may_start_run`` lets it take new runs) the
free lanes of its models and the pin lanes of unhealthy replicas (under the attained
order a caller has one FIFO per service level in each lane, so the heads still include
each level's oldest turn). The counters the order reads are kept where turns are held
(``_hold``), admitted (``_admit``), finish (``on_finished``) and end (``end_turn``),
only while the option that reads them is on.

Affinity (S3): a run that is generating or paused on a tool is pinned: its
turns wait in that replica's pin lane even if another replica is idle. While the
replica is unhealthy, every other replica serving the model may draw from that
lane (the run may move); once it is healthy again the lane is its alone, so a
probe blip costs no affinity. A run's held turns follow it: pinned where it is
admitted, freed when it goes idle.

Placement (``placement.py``, a policy unit whose docstring says what it reads and
decides): a new turn is tried by three rules in order. The pinned-lane rule (S3: its
run's healthy replica or nothing); last replica first (a free turn's run's last
replica, its prefix may still be cached there, if it has room and may start the run);
else filter → score → pick: the replicas passing every filter that applies to the
turn (healthy; batch: under the interactive target's pace limit; room by the cap and
class, S2/S4; a new batch run: prefix keeping's run limit and working-set admission,
below), the least by ``placement.score``: fewest runs living there (generating or
paused on a tool, because they come back), then fewest turns in flight, ties rotating
with arrival order. The same filters say whether ``_fill`` may take a held turn on a
replica: ``placement.has_room`` (health, pace limit, cap) and
``placement.may_start_run`` (the new-run filters, for turns of runs not living there).

Run lifetime (S10, D8): a held turn counts as activity, so a run waiting for a
slot is not forgotten. ``RunEnded`` forgets a run at once unless turns of it are
still admitted; then it is marked and forgotten after the last of them.

Tool leases (``leases.py``): a run paused on a tool lives on its replica (the
pinned count) and, if interactive, holds a reservation there. Each pause gets a
lease from its tools' learned times; the clock tick checks it when it may have run
out (its bucket in ``run_deadlines``, beside the run's idle expiry) and a pause
that outlived it *lapses*: ``working_set.contribution`` no longer counts the run and its
reservation is released. The run keeps its replica as its last, so its next turn
still waits in that pin lane; ``_back_from_tool`` (on that turn's request) learns
the pause's length and restores the pinned count and the reservation.

The interactive target (``target.py``): while an interactive run lives on a replica,
its batch turns are limited (``ReplicaState.pace_cap``) so that replies there stream
under a target pace, absolute (``interactive_pace_s``) or relative to the replica's
floor (``interactive_slowdown``). Each reply that ends there may move the limit;
``target.paced`` is how room (``placement.has_room``) and placement see it: a paced
replica has no room for batch turns, as a full one has none.

Prefix keeping's run limit (``ReplicaState.run_limit``): new batch runs start on a
capped replica only while fewer runs than it live there. It is never below the
cap; a lasting queue sets it to the cap; a quiet probe raises it while new batch
runs wait for it (doubling on the ramp); a returning turn that found its prefix
evicted lowers it by one and the cap to no more than it. It is the run limit, not
the cap, that rises for runs waiting behind runs: those may be on tools or gone.

Working-set admission (``working_set.py``, ``Params.working_set``; off by default):
a second gate on new batch runs, by the engine's KV pool (``ReplicaProbed.kv_tokens``)
instead of a count of runs. A new batch run starts on a replica only while the known
contexts of the runs living there, plus an estimate of its own, fit in a share of the
pool; with ``REPLACE`` the run limit no longer gates them, with ``BOTH`` both do. The
sums are kept on each replica's record where runs pin, unpin and finish turns
(``_bump_replica``), so its filter in placement (``placement.least_loaded`` and
``placement.may_start_run``) is O(1).

The cap (S2): a queue seen on ``Params.queue_probes`` consecutive probes (default
2: one probe period) sets ``cap = max(1, running)``; a passing queue, such as a
burst of prompts being prefilled in chunks, does not. A probe with an empty queue
never lowers the cap; it raises it by
``Params.cap_raise_step`` when the engine reports running at the cap
(``running`` ≥ cap) while luftpause's own turns fill it (in flight plus reserved
≥ cap), so capacity is found step by step instead of letting the next burst
straight back into the engine's queue. Both must hold: luftpause's own in-flight
count says what it sent, not what the engine can run, and the engine's count
includes other clients on a shared engine, which would raise a cap luftpause does
not use. A probe without load numbers removes the cap.

The ramp from idle (S2, ``Params.initial_cap``): before its engine has first
queued, a replica's cap is a ramp that starts at ``initial_cap`` and doubles on
each quiet probe that finds the engine running at it (the raise rule above, by
the cap instead of the step). The first lasting queue sets the cap from the
running count and ends the ramp; a healthy probe without load numbers ends it
too, and an unhealthy one starts it again (the engine may come back restarted,
idle and cold, with every run pinned to it returning at once). So a
flood from idle meets a limit before two probes have seen a queue, and a light
load, which never reaches it, meets none. The scheduler keeps nothing on disk,
so a restarted one starts on the ramp again and sets each cap from the first
queue it sees (``queue_probes`` probes under load).

Health (S9, D6): a probe sets it; a turn that failed because the dataplane
could not connect to its replica (``TurnFailed.replica_unreachable``) clears it
at once, so the next turns do not follow the dead replica until its probe
fails. The next healthy probe restores it.

Membership (``ReplicaJoined``, ``ReplicaDraining``, ``ReplicaLeft``): the replica set
changes while the scheduler runs. A replica that joins starts as a restarted one:
unhealthy until its first probe, then on the ramp from idle. A draining replica takes no
new runs from the moment it drains (``_place`` leaves it out and ``_fill`` draws only
its own pin lane), while the runs living there keep their turns there until the drain
time (``ReplicaDraining.until``, or at once); from then it counts as unhealthy whatever
its probes say, so its runs' next turns move as S3 lets a run leave an unhealthy
replica (their cached prefix is lost), and turns held in its pin lane are drawn by the
others. A replica that leaves does the same at once and also stops serving its models:
no turn is admitted to it again, and a held turn of a model no replica serves any
longer is rejected (S6) rather than left waiting. Its record stays while turns are in
flight there (their reports still find it) or runs are pinned or reserved there, and
is dropped on the first clock tick after: a run that comes back later finds no replica
of that name and is placed as a run without one. Reservations of interactive runs paused
there end when those runs come back elsewhere or lapse (``leases.py``).

A dataplane that dies (S11): when its last report stream ends, its admitted
turns stay counted for ``Params.dataplane_grace_s``; a dataplane that
reconnects or resyncs by then keeps them. After that they are released, as a
resync would release turns its dataplane no longer lists: the process died, or
came back under another ID and will never list them. A dataplane that returns
later still re-adopts what it lists.

Expiry (S10) uses deadline buckets keyed by whole seconds and checked lazily:
an entry whose turn ended, or whose run was active since, is skipped.

Determinism: every choice uses a total order (counts, arrival sequence, names);
nothing depends on map iteration order, so replaying an event log yields the
same actions in any process.

``decide`` never raises on a peer's input: malformed requests are rejected,
events about unknown turns or runs are ignored.

Speed (S1; ``tools/bench/core.py``): an event rebuilds each record it changes once.
``_admit`` and ``end_turn`` write the run's new record in one go and change each
replica's counters in one new record (``_bump_replicas``), rather than through the
general helpers (``_touch_run``, ``_release_reservation``, ``_put_run``), which the
rarer events still use; a turn that starts or gets its first token skips the
transaction altogether (``_on_progress``). Records are built with ``state.new_*``.
"""

from __future__ import annotations

from dataclasses import replace

from immutables import Map

from luftpause.scheduler.core import leases, order, placement, target, working_set
from luftpause.scheduler.core.actions import Action, Admit, DropTurn, ForgetRun, Reject
from luftpause.scheduler.core.events import (
    ClockTicked,
    DataplaneConnected,
    DataplaneDisconnected,
    DataplaneResynced,
    Event,
    FirstTokenReceived,
    ReplicaDraining,
    ReplicaJoined,
    ReplicaLeft,
    ReplicaProbed,
    RunEnded,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
    TurnRequested,
    TurnSnapshot,
    TurnStarted,
)
from luftpause.scheduler.core.placement import has_room as _has_room
from luftpause.scheduler.core.placement import may_start_run as _may_start_run
from luftpause.scheduler.core.state import (
    Fifo,
    HeldTurn,
    Lane,
    ReplicaState,
    RunState,
    State,
    TurnState,
    free_lane,
    new_held,
    new_replica,
    new_run,
    new_state,
    new_turn,
    pin_lane,
)
from luftpause.scheduler.core.types import (
    DropReason,
    EndpointKind,
    RejectCode,
    ReplicaSpec,
    RunPhase,
    ServiceClass,
    WorkingSet,
)

_CLASS_ORDER = (ServiceClass.INTERACTIVE, ServiceClass.BATCH)
_KIND_LABEL = {EndpointKind.GENERATIVE: "Generative", EndpointKind.SINGLE_PASS: "SinglePass"}
_MAX_ID = 256  # longest turn/run ID accepted from a peer


def decide(state: State, event: Event) -> tuple[State, tuple[Action, ...]]:
    """Apply one event; return the new state and what the host must do."""
    if isinstance(event, (TurnStarted, FirstTokenReceived)):  # (a tuple: faster than X | Y)
        # Half of all events: one turn record changes, nothing is admitted or freed.
        return _on_progress(state, event), ()
    tx = _Tx(state, max(state.now, event.at))
    if tx.draining:  # (membership: a drain time may have come; rare, a few replicas)
        tx._membership_tick()
    match event:
        case TurnRequested():
            tx.on_requested(event)
        case TurnFinished():
            tx.on_finished(event)
        case TurnAbandoned():
            tx.on_abandoned(event)
        case TurnFailed():
            tx.on_failed(event)
        case RunEnded():
            tx.forget_run(event.run_id)
        case ReplicaProbed():
            tx.on_probed(event)
        case ClockTicked():
            tx.on_tick()
        case DataplaneResynced():
            tx.on_resynced(event)
        case DataplaneConnected():
            tx.dataplane_back(event.dataplane_id)
        case DataplaneDisconnected():
            tx.lost_dataplanes = tx.lost_dataplanes.set(
                event.dataplane_id, tx.now + tx.params.dataplane_grace_s
            )
        case ReplicaJoined():
            tx.on_joined(event)
        case ReplicaDraining():
            tx.on_draining(event)
        case ReplicaLeft():
            tx.on_left(event)
    tx.fill_dirty()
    return tx.freeze(), tuple(tx.actions)


def _on_progress(state: State, ev: TurnStarted | FirstTokenReceived) -> State:
    """A turn started (its engine request was sent) or got its first token."""
    now = max(state.now, ev.at)
    turns = state.turns
    turn = turns.get(ev.turn_id)
    if turn is not None:
        if isinstance(ev, FirstTokenReceived):
            if turn.first_token_at is None:
                turns = turns.set(ev.turn_id, _turn_with(turn, True, now))
        elif not turn.started:
            turns = turns.set(ev.turn_id, _turn_with(turn, True, None))
    return _state_with(state, now, turns)


class _Tx:
    """One event's work: the state's fields as locals, rebound as maps change."""

    __slots__ = (
        "actions",
        "caller_held",
        "caller_in_flight",
        "dirty",
        "draining",
        "held",
        "held_by_run",
        "left",
        "lost_dataplanes",
        "now",
        "params",
        "queues",
        "replicas",
        "run_deadlines",
        "runs",
        "seq",
        "serving",
        "sub_in_flight",
        "swept_until",
        "tool_times",
        "turn_deadlines",
        "turns",
        "unhealthy",
        "vtc",
        "waiting_callers",
    )

    def __init__(self, s: State, now: float) -> None:
        self.params = s.params
        self.now = now
        self.seq = s.seq
        self.replicas = s.replicas
        self.serving = s.serving
        self.runs = s.runs
        self.turns = s.turns
        self.held = s.held
        self.held_by_run = s.held_by_run
        self.unhealthy = s.unhealthy
        self.queues = s.queues
        self.waiting_callers = s.waiting_callers
        self.caller_in_flight = s.caller_in_flight
        self.turn_deadlines = s.turn_deadlines
        self.run_deadlines = s.run_deadlines
        self.swept_until = s.swept_until
        self.lost_dataplanes = s.lost_dataplanes
        self.tool_times = s.tool_times
        self.vtc = s.vtc
        self.caller_held = s.caller_held
        self.draining = s.draining
        self.left = s.left
        self.sub_in_flight = s.sub_in_flight
        self.actions: list[Action] = []
        self.dirty: set[str] = set()

    def freeze(self) -> State:
        return new_state(
            self.params,
            self.now,
            self.seq,
            self.replicas,
            self.serving,
            self.runs,
            self.turns,
            self.held,
            self.held_by_run,
            self.unhealthy,
            self.queues,
            self.waiting_callers,
            self.caller_in_flight,
            self.turn_deadlines,
            self.run_deadlines,
            self.swept_until,
            self.lost_dataplanes,
            self.tool_times,
            self.vtc,
            self.caller_held,
            self.draining,
            self.left,
            self.sub_in_flight,
        )

    # ------------------------------------------------------------------ requests

    def on_requested(self, ev: TurnRequested) -> None:
        problem = _invalid(ev)
        if problem is not None:
            self.actions.append(Reject(ev.turn_id, RejectCode.INVALID_REQUEST, problem))
            return
        admitted = self.turns.get(ev.turn_id)
        if admitted is not None:  # a re-sent Admit: same answer again
            self.actions.append(Admit(ev.turn_id, admitted.replica, 0.0))
            return
        if ev.turn_id in self.held:  # a re-sent Admit while held: keep its place
            return
        names = self.serving.get((ev.kind, ev.model))
        if names is None:  # S6: never queued
            label = _KIND_LABEL[ev.kind]
            msg = f"no {label} replica serves model '{ev.model}'"
            self.actions.append(Reject(ev.turn_id, RejectCode.UNKNOWN_MODEL, msg))
            return
        # single-pass turns never enter run state (S13), even when they name a run
        run = self.runs.get(ev.run_id) if ev.kind is EndpointKind.GENERATIVE else None
        if run is not None and run.phase is RunPhase.PAUSED_ON_TOOL and run.in_flight == 0:
            run = self._back_from_tool(run, ev.service_class)
        lane = self._lane_for(run, ev.kind, ev.model)
        self.seq += 1
        target = None
        if not (
            self.params.callers
            and ev.kind is EndpointKind.GENERATIVE
            and order.at_limit(self.params, self.caller_in_flight, self.sub_in_flight, ev.caller)
        ):  # (a caller at its in-flight limit is held whatever the room, B13)
            target = self._place(run, names, ev.kind, ev.service_class, lane, self.seq)
        if target is not None:  # admitting touches the run (a turn is activity, S10)
            self._admit(
                run,
                target,
                ev.turn_id,
                ev.run_id,
                ev.model,
                ev.service_class,
                ev.caller,
                ev.kind,
                ev.dataplane_id,
                self.now,
                lane,
                ev.trace_id,
                requested=True,
            )
            return
        if ev.kind is EndpointKind.GENERATIVE:
            self._touch_run(ev.run_id, ev.service_class, ev.caller)
        self._hold(
            ev.turn_id,
            ev.run_id,
            ev.model,
            ev.service_class,
            ev.caller,
            ev.kind,
            ev.dataplane_id,
            self.now,
            self.seq,
            lane,
            ev.trace_id,
        )

    def _lane_for(self, run: RunState | None, kind: EndpointKind, model: str) -> Lane:
        if (
            kind is EndpointKind.GENERATIVE
            and run is not None
            and run.replica is not None
            and run.phase is not RunPhase.IDLE
        ):
            rep = self.replicas.get(run.replica)
            if (
                rep is not None
                and rep.spec.kind is EndpointKind.GENERATIVE
                and model in rep.spec.models
                # packing (target.py): a batch run on a starved replica may move
                and not (rep.pace_cap == 0 and _starved_batch(run, rep))
            ):
                return pin_lane(run.replica)  # S3: strict affinity
        return free_lane(kind, model)

    def _place(
        self,
        run: RunState | None,
        names: tuple[str, ...],
        kind: EndpointKind,
        service_class: ServiceClass,
        lane: Lane,
        seq: int,
    ) -> str | None:
        """The replica a new turn (arrival number ``seq``) can be admitted to right now,
        of ``names``, the replicas of its kind serving its model; ``run``: its run, if
        generative and known (``placement.py``: the rules, filters, score and pick). A
        draining replica takes no new runs: only the pinned-lane rule may name it."""
        if self.draining:
            names = tuple(n for n in names if n not in self.draining)
        return placement.place(
            self.replicas, self.unhealthy, self.params, run, names, kind, service_class, lane, seq
        )

    def _hold(
        self,
        turn_id: str,
        run_id: str,
        model: str,
        service_class: ServiceClass,
        caller: str,
        kind: EndpointKind,
        dataplane_id: str,
        requested_at: float,
        seq: int,
        lane: Lane,
        trace_id: str,
    ) -> None:
        tier = 0
        if (
            service_class is ServiceClass.BATCH
            and kind is EndpointKind.GENERATIVE
            and self.params.batch_order == "attained"
        ):
            run = self.runs.get(run_id)
            tier = 0 if run is None else order.tier(self.params, run.attained)
        qcaller = caller if tier == 0 else order.queue_caller(caller, tier)
        qkey = (lane, service_class, qcaller)
        fifo, slot = self.queues.get(qkey, _EMPTY_FIFO).push(turn_id)
        self.queues = self.queues.set(qkey, fifo)
        wkey = (lane, service_class)
        callers = self.waiting_callers.get(wkey, _EMPTY_SET)
        if qcaller not in callers:
            self.waiting_callers = self.waiting_callers.set(wkey, callers.set(qcaller, None))
        self.held = self.held.set(
            turn_id,
            new_held(
                turn_id,
                run_id,
                model,
                service_class,
                caller,
                kind,
                dataplane_id,
                requested_at,
                seq,
                lane,
                slot,
                trace_id,
                tier,
            ),
        )
        if kind is EndpointKind.GENERATIVE:  # single-pass turns have no run (S13)
            mine = self.held_by_run.get(run_id, _EMPTY_SET)
            self.held_by_run = self.held_by_run.set(run_id, mine.set(turn_id, None))
            if self.params.fairness == "tokens":
                name = order.account(caller)
                self._vtc_activate(name)
                self.caller_held = self.caller_held.set(name, self.caller_held.get(name, 0) + 1)

    def _unhold(self, held: HeldTurn) -> None:
        qcaller = held.caller if held.tier == 0 else order.queue_caller(held.caller, held.tier)
        qkey = (held.lane, held.service_class, qcaller)
        fifo = self.queues[qkey].remove(held.slot)
        if len(fifo) == 0:
            self.queues = self.queues.delete(qkey)
            wkey = (held.lane, held.service_class)
            callers = self.waiting_callers[wkey].delete(qcaller)
            self.waiting_callers = (
                self.waiting_callers.set(wkey, callers)
                if len(callers)
                else self.waiting_callers.delete(wkey)
            )
        else:
            self.queues = self.queues.set(qkey, fifo)
        self.held = self.held.delete(held.turn_id)
        if held.kind is EndpointKind.GENERATIVE:
            mine = self.held_by_run[held.run_id].delete(held.turn_id)
            self.held_by_run = (
                self.held_by_run.set(held.run_id, mine)
                if len(mine)
                else self.held_by_run.delete(held.run_id)
            )
            name = order.account(held.caller) if self.caller_held else ""
            n = self.caller_held.get(name) if self.caller_held else None
            if n is not None:  # (token fairness; its counter stays: the turn is admitted,
                # moved, or its account is checked for anything left, on_abandoned)
                self.caller_held = (
                    self.caller_held.set(name, n - 1) if n > 1 else self.caller_held.delete(name)
                )

    def _rehold(self, held: HeldTurn, lane: Lane) -> None:
        """Hold ``held`` in ``lane`` instead (its place in arrival order kept)."""
        self._unhold(held)
        self._hold(
            held.turn_id,
            held.run_id,
            held.model,
            held.service_class,
            held.caller,
            held.kind,
            held.dataplane_id,
            held.requested_at,
            held.seq,
            lane,
            held.trace_id,
        )

    def _move_run_held(self, run_id: str, replica: str | None) -> None:
        """Re-lane a run's held turns: to ``replica``'s pin lane, or free (None)."""
        mine = self.held_by_run.get(run_id)
        if mine is None:
            return
        for turn_id in sorted(mine, key=lambda t: self.held[t].seq):
            held = self.held[turn_id]
            if replica is not None and held.model in self.replicas[replica].spec.models:
                lane = pin_lane(replica)
            else:
                lane = free_lane(held.kind, held.model)
            if lane != held.lane:
                self._rehold(held, lane)
                self.dirty.update(self.serving[(held.kind, held.model)])

    def _admit(
        self,
        run: RunState | None,
        replica: str,
        turn_id: str,
        run_id: str,
        model: str,
        service_class: ServiceClass,
        caller: str,
        kind: EndpointKind,
        dataplane_id: str,
        requested_at: float,
        lane: Lane,
        trace_id: str,
        *,
        requested: bool,
    ) -> None:
        """Admit a turn to ``replica``: one that was held, or (``requested``) one that
        arrives in this event, whose run is touched here (S10: a turn is activity).
        ``run``: the turn's run as it is (None if unknown, or the turn is single-pass
        and arrives now)."""
        now = self.now
        deadline = now + self.params.turn_timeout_s
        # Prefix keeping: a turn taken from its run's pin lane here (the run is back from
        # a tool) should find the run's previous prompt on this replica cached.
        expect_cached = 0
        if (
            run is not None
            and lane[0] == "pin"
            and lane[1] == replica
            and run.last_prompt_on == replica
        ):
            expect_cached = run.last_prompt
        self.turns = self.turns.set(
            turn_id,
            new_turn(
                turn_id,
                run_id,
                replica,
                model,
                service_class,
                caller,
                kind,
                dataplane_id,
                now,
                deadline,
                False,  # started
                None,  # first_token_at
                expect_cached,
                trace_id,
                self.replicas[replica].batch_in_flight,  # (decode pace)
            ),
        )
        self.turn_deadlines = _bucket_add(self.turn_deadlines, deadline, turn_id)
        if self.params.kv_retention and kind is EndpointKind.GENERATIVE:  # B8
            retain_s = leases.retain_time(self.tool_times, run.paused_tools if run else ())
            self.actions.append(Admit(turn_id, replica, now - requested_at, retain_s))
        else:
            self.actions.append(Admit(turn_id, replica, now - requested_at))
        if kind is not EndpointKind.GENERATIVE:
            self._bump_replica(replica, 1)
            return
        batch = 1 if service_class is ServiceClass.BATCH else 0
        if requested and self.params.fairness == "tokens":
            self._vtc_activate(order.account(caller))
        self._count_caller(caller, 1)
        if requested:
            ended = False  # a new turn after RunEnded: the run lives on
            self._schedule_run_expiry(run_id)
        elif run is None:
            # Ended (RunEnded) while this turn was held: serve the turn, keep the counts
            # sound, and forget the run again once its last turn is over.
            ended = True
            self._schedule_run_expiry(run_id)
        else:
            ended = run.ended
        # The run's reservation ends (it is back) and it is pinned here now (S3); each
        # replica's counters change once.
        # S3: where it lived (a lapsed run lived nowhere: on_requested restores it first)
        before = None if run is None or run.phase is RunPhase.IDLE or run.lapsed else run.replica
        moved = before != replica
        reserved_on = None if run is None else run.reserved_on
        if reserved_on is not None and reserved_on not in self.replicas:
            reserved_on = None
        if moved and before is not None and before not in self.replicas:
            before = None
        # (its known context moves with it: working_set.contribution)
        ws = 0 if run is None or not moved else run.last_prompt
        known = 1 if ws > 0 else 0
        if reserved_on is None and (before is None or not moved):
            self._bump_replica(replica, 1, 0, 1 if moved else 0, batch, ws, known)
        else:
            self._bump_replicas(
                (replica, 1, 0, 1 if moved else 0, batch, ws, known),
                (reserved_on, 0, -1, 0, 0, 0, 0),
                (before if moved else None, 0, 0, -1, 0, -ws, -known),
            )
        if run is None:
            run = new_run(
                run_id,
                RunPhase.GENERATING,
                replica,
                service_class,
                caller,
                now,
                1,  # in_flight
                None,  # reserved_on
                ended,
                0,  # last_prompt
                None,  # last_prompt_on
                1,  # turns
                0,  # moves
                (),  # paused_tools
                False,  # lapsed
                0.0,  # attained
            )
        else:
            run = new_run(
                run_id,
                RunPhase.GENERATING,
                replica,
                service_class,
                caller,
                now,
                run.in_flight + 1,
                None,
                ended,
                run.last_prompt,
                run.last_prompt_on,
                run.turns + 1,
                run.moves + (run.replica is not None and run.replica != replica),
                (),  # paused_tools: it is back
                False,  # lapsed
                run.attained,
            )
        self.runs = self.runs.set(run_id, run)
        self._move_run_held(run_id, replica)  # S3: it is generating there now

    # ------------------------------------------------------------ tool leases

    def _back_from_tool(self, run: RunState, service_class: ServiceClass) -> RunState:
        """A run paused on a tool asks for its next turn, of ``service_class``: the pause's
        length is a sample of its tools' times, and a lapsed run lives on its replica
        again, with its reservation (S4) if it is interactive. A run that comes back as
        batch (its client changed the class) keeps no reservation: its turn must not
        wait behind its own slot. The run's record keeps its ``paused_tools`` here: the
        turn's admission (``_admit``) or hold (``_touch_run``) clears them in the write it
        makes anyway, so the pause is sampled once."""
        if run.paused_tools:  # (empty: sampled already, when a turn of it was first held)
            self.tool_times = leases.learn(
                self.params, self.tool_times, run.paused_tools, self.now - run.last_active
            )
        keeps_slot = service_class is ServiceClass.INTERACTIVE
        if not run.lapsed:
            if run.reserved_on is None or keeps_slot:
                return run
            self._release_reservation(run)
            return self.runs[run.run_id]
        reserved_on = None
        if (
            keeps_slot
            and run.service_class is ServiceClass.INTERACTIVE
            and run.replica is not None
            and run.replica in self.replicas
        ):
            reserved_on = run.replica
            self._bump_replica(run.replica, reserved=1)
        back = _run_with(run, lapsed=False, reserved_on=reserved_on, paused_tools=())
        self._put_run(run.run_id, back)  # (counts it as living on its replica again)
        return back

    def _lease(self, tools: tuple[str, ...]) -> float:
        """How long a pause on ``tools`` keeps its run living on its replica."""
        return leases.tool_lease(self.params, self.tool_times, tools)

    def _check_lease_at(self, run_id: str, due: float) -> None:
        """The clock tick looks at ``run_id``'s pause again at ``due`` (``on_tick``)."""
        self.run_deadlines = _bucket_add(self.run_deadlines, due, run_id)

    def _check_pause(self, run_id: str, since: float, tools: tuple[str, ...]) -> None:
        """One check for a pause that began at ``since``: at its lease, or at the run's
        idle expiry if that comes first (``on_tick`` forgets the run, lapses the pause, or
        looks again). A paused run needs no other expiry entry until it lapses."""
        wait = self._lease(tools)
        if wait > self.params.run_idle_expiry_s:
            wait = self.params.run_idle_expiry_s
        self._check_lease_at(run_id, since + wait)

    def _lapse(self, run: RunState) -> None:
        """The run's pause outlived its lease: it no longer lives on its replica (S3's
        pinned count, which new batch runs wait behind) nor holds a slot (S4). It keeps
        its replica as its last (its prefix may still be there) and comes back in full
        when it returns (``_back_from_tool``)."""
        self._release_reservation(run)
        self._put_run(run.run_id, _run_with(self.runs[run.run_id], lapsed=True))
        # (its pause's checks were its only expiry entries: S10 forgets it from here)
        self._check_lease_at(run.run_id, run.last_active + self.params.run_idle_expiry_s)

    # ------------------------------------------------------------ turn reports

    def on_abandoned(self, ev: TurnAbandoned) -> None:
        held = self.held.get(ev.turn_id)
        if held is not None:
            self._unhold(held)
            if self.vtc:
                self._vtc_drop_if_idle(held.caller)
            # A held turn was a turn: the idle clock starts now (S10). A single-pass turn
            # never enters run state (S13), even when it names a generative run.
            run = self.runs.get(held.run_id) if held.kind is EndpointKind.GENERATIVE else None
            if run is not None:
                self._put_run(run.run_id, _run_with(run, last_active=self.now))
                self._schedule_run_expiry(held.run_id)
                if (
                    run.phase is RunPhase.PAUSED_ON_TOOL
                    and run.in_flight == 0
                    and not run.lapsed
                    and run.run_id not in self.held_by_run
                ):
                    # Tool leases: it asked for its next turn and left before getting it,
                    # so it is as away as a pause: its lease runs from now (a check due
                    # while the turn was held was skipped).
                    self._check_lease_at(run.run_id, self.now + self._lease(run.paused_tools))
            return
        turn = self.turns.get(ev.turn_id)
        if turn is not None and not turn.started:
            # Admitted but its client left before the engine request: free the slot.
            self.end_turn(ev.turn_id, paused_on_tool=False)

    def on_finished(self, ev: TurnFinished) -> None:
        params = self.params
        served = 0.0
        if params.fairness == "tokens" or params.batch_order == "attained":
            served = self._account(ev)
        turn = self.end_turn(
            ev.turn_id,
            paused_on_tool=ev.paused_on_tool,
            prompt_tokens=ev.prompt_tokens,
            tool_names=ev.tool_names,
            served=served,
        )
        if turn is None:
            return
        if self.params.keep_prefixes and ev.prompt_tokens > 0:
            self._prefix_feedback(turn, ev)  # (nothing to judge without reported usage)
        if (
            target.enabled(self.params)
            and turn.first_token_at is not None
            and ev.completion_tokens >= max(2, self.params.pace_min_tokens)
            and turn.kind is EndpointKind.GENERATIVE
        ):
            self._pace_feedback(turn, ev.completion_tokens)

    def _account(self, ev: TurnFinished) -> float:
        """Held-turn order's bookkeeping for a finished turn (``order.py``): token
        fairness advances its caller's counter; returns what attained service its run
        gains (0 unless ``batch_order = "attained"``)."""
        turn = self.turns.get(ev.turn_id)
        if turn is None or turn.kind is not EndpointKind.GENERATIVE:
            return 0.0
        params = self.params
        if params.fairness == "tokens":
            name = order.account(turn.caller)
            base = self.vtc.get(name)
            if base is None:  # (a turn adopted on resync, before any of it was held)
                base = order.lift(self.vtc)
            cost = order.turn_cost(params, name, ev.prompt_tokens, ev.completion_tokens)
            self.vtc = self.vtc.set(name, base + cost)
        if params.batch_order != "attained":
            return 0.0
        return order.served(
            params,
            ev.prompt_tokens,
            ev.cached_tokens,
            ev.completion_tokens,
            self.now - turn.admitted_at,
        )

    def _vtc_activate(self, name: str) -> None:
        """Token fairness: an account with nothing held or in flight starts from the least
        counter of those that have (VTC's lift)."""
        if name not in self.vtc:
            self.vtc = self.vtc.set(name, order.lift(self.vtc))

    def _vtc_drop_if_idle(self, caller: str) -> None:
        """Token fairness: an account (``caller``'s) with nothing held or in flight keeps
        no counter."""
        name = order.account(caller)
        if (
            name in self.vtc
            and name not in self.caller_in_flight
            and name not in self.sub_in_flight
            and name not in self.caller_held
        ):
            self.vtc = self.vtc.delete(name)

    def _pace_feedback(self, turn: TurnState, completion_tokens: int) -> None:
        """The interactive target (``target.py``) learns from a reply that ended."""
        rep = self.replicas.get(turn.replica)
        if rep is None or turn.first_token_at is None:
            return
        least = 1
        if target.packs(self.params):  # the limit may reach 0 while batch keeps a replica
            replicas = self.replicas
            least = target.least_limit(
                replicas[name]
                for name in self.serving[(turn.kind, turn.model)]
                if name != turn.replica
            )
        cap, smoothed, set_at, best = target.feedback(
            rep, turn, completion_tokens, self.now, self.params, least
        )
        if cap != rep.pace_cap:
            self.dirty.add(turn.replica)  # (a raise makes room; a cut changes nothing held)
        self.replicas = self.replicas.set(
            turn.replica,
            _replica_with(rep, pace_cap=cap, pace_s=smoothed, pace_set_at=set_at, pace_best_s=best),
        )
        if cap == 0 and rep.pace_cap != 0:
            self._unpin_batch(turn.replica)

    def _unpin_batch(self, name: str) -> None:
        """Packing: ``name`` is starved; the batch turns held in its pin lane move to their
        free lanes, keeping their arrival order, where any replica may take them."""
        lane = pin_lane(name)
        if (lane, ServiceClass.BATCH) not in self.waiting_callers:
            return
        moved = sorted(
            (
                h
                for h in self.held.values()
                if h.lane == lane and h.service_class is ServiceClass.BATCH
            ),
            key=lambda h: h.seq,
        )
        for held in moved:
            self._rehold(held, free_lane(held.kind, held.model))
            self.dirty.update(self.serving[(held.kind, held.model)])

    def _packing_tick(self) -> None:
        """Packing's liveness, once a second (``target.py``): the batch turns held on a
        starved replica move; a model whose every healthy replica is starved gets one
        batch turn back on one of them (``target.relieve``)."""
        replicas = self.replicas
        for name in sorted(replicas):
            if target.starved(replicas[name]):
                self._unpin_batch(name)
        for key in sorted(self.serving, key=lambda k: (k[0].value, k[1])):
            if key[0] is not EndpointKind.GENERATIVE:
                continue
            relieved = target.relieve([self.replicas[n] for n in self.serving[key]])
            if relieved is not None:
                rep = self.replicas[relieved]
                self.replicas = self.replicas.set(
                    relieved, _replica_with(rep, pace_cap=1, pace_set_at=self.now)
                )
                self.dirty.add(relieved)

    def on_failed(self, ev: TurnFailed) -> None:
        turn = self.end_turn(ev.turn_id, paused_on_tool=False)
        if turn is not None and ev.replica_unreachable:
            self._set_health(turn.replica, healthy=False)

    def _prefix_feedback(self, turn: TurnState, ev: TurnFinished) -> None:
        """Prefix keeping: a turn back from a tool on a capped replica that found less than
        ``prefix_miss_share`` of its run's previous prompt cached shows the engine's cache
        is over-committed: one run less may live there (at most one per probe period), the
        cap no higher than that, and no raise at the next probe. Judged only on an engine
        that reports caching at all. With more runs living there than the run limit (a
        backlog admitted before the engine first queued), a miss blocks the raise but
        lowers nothing: that backlog does not fit whatever the limit, and lowering it
        would only slow the backlog down, each of its later misses lowering it again."""
        rep = self.replicas.get(turn.replica)
        if rep is None or ev.prompt_tokens <= 0:  # no usage reported: nothing to judge
            return
        reports_cache = rep.reports_cache or ev.cached_tokens > 0
        missed = (
            turn.expect_cached > 0
            and reports_cache  # an engine that never reports cached tokens says nothing
            and rep.cap is not None
            and ev.cached_tokens < self.params.prefix_miss_share * turn.expect_cached
        )
        if not missed and reports_cache == rep.reports_cache:
            return
        cap = rep.cap
        run_limit = rep.run_limit
        if (
            missed
            and cap is not None
            and run_limit is not None
            and not rep.missed_since_probe
            and rep.pinned_runs <= run_limit
        ):
            # One step per probe period, as the raise: misses come in bursts (one
            # over-full moment evicts several paused runs), and each would otherwise
            # take a slot away for the same cause.
            run_limit = max(1, run_limit - 1)
            cap = min(cap, run_limit)
        self.replicas = self.replicas.set(
            turn.replica,
            _replica_with(
                rep,
                cap=cap,
                run_limit=run_limit,
                reports_cache=reports_cache,
                prefix_misses=rep.prefix_misses + (1 if missed else 0),
                missed_since_probe=rep.missed_since_probe or missed,
            ),
        )

    def end_turn(
        self,
        turn_id: str,
        *,
        paused_on_tool: bool,
        prompt_tokens: int = 0,
        tool_names: tuple[str, ...] = (),
        served: float = 0.0,
    ) -> TurnState | None:
        """Free an admitted turn's slot and move its run on (D5). ``prompt_tokens``: the
        finished turn's reported prompt, remembered for prefix keeping; ``tool_names``: the
        tools it called, whose lease the run's pause gets; ``served``: what it adds to its
        run's attained service (``order.py``)."""
        turn = self.turns.get(turn_id)
        if turn is None:
            return None
        self.turns = self.turns.delete(turn_id)
        here = turn.replica if turn.replica in self.replicas else None
        run = None
        batch = 0
        if turn.kind is EndpointKind.GENERATIVE:
            self._count_caller(turn.caller, -1)
            if self.vtc:
                self._vtc_drop_if_idle(turn.caller)
            run = self.runs.get(turn.run_id)
            batch = -1 if turn.service_class is ServiceClass.BATCH else 0
        if run is None or (run.ended and run.in_flight <= 1):
            if here is not None:
                self._bump_replica(here, -1, 0, 0, batch)  # (_drop_run unpins the run)
            if run is not None:  # RunEnded arrived while this turn ran: its last one
                self._release_reservation(run)
                self._drop_run(run.run_id)
                self._move_run_held(run.run_id, None)
            return turn  # (or a single-pass turn, or its run ended meanwhile)
        in_flight = max(0, run.in_flight - 1)
        if in_flight > 0:
            phase = RunPhase.GENERATING
        elif paused_on_tool:
            phase = RunPhase.PAUSED_ON_TOOL
        else:
            phase = RunPhase.IDLE
        # Counters: the turn's slot frees, the run's reservation (if any) ends, a paused
        # interactive run reserves a slot for its return (S4), and the run is pinned
        # here or nowhere (S3); each replica's record is rebuilt once.
        released = run.reserved_on
        if released is not None and released not in self.replicas:
            released = None
        reserved_on = None
        if (
            phase is RunPhase.PAUSED_ON_TOOL
            and run.service_class is ServiceClass.INTERACTIVE
            and here is not None
        ):
            reserved_on = here  # S4: keep a slot for its return
        # S3: where it is pinned (a lapsed run nowhere; it has no turn in flight, so
        # this is a guard for peers that report turns it never had)
        before = None if run.phase is RunPhase.IDLE or run.lapsed else run.replica
        after = None if phase is RunPhase.IDLE else turn.replica
        # Working sets (working_set.contribution): the run's known context leaves the
        # replica it lived on and joins the one it lives on now, the new prompt if the turn
        # reported one.
        old_ws = run.last_prompt
        last_prompt: int = old_ws
        last_prompt_on: str | None = run.last_prompt_on
        if prompt_tokens > 0:
            last_prompt, last_prompt_on = prompt_tokens, turn.replica
        ws_from, ws_to = before, after
        if before == after:
            before = after = None
        else:
            if before is not None and before not in self.replicas:
                before = None
            if after is not None and after not in self.replicas:
                after = None
        if released is None and (before is None or before == here) and (after in (None, here)):
            if here is not None:  # (then the run lived, and lives, here or nowhere)
                ws = (0 if ws_to is None else last_prompt) - (old_ws if ws_from == here else 0)
                known = (0 if ws_to is None or last_prompt <= 0 else 1) - (
                    1 if ws_from == here and old_ws > 0 else 0
                )
                self._bump_replica(
                    here,
                    -1,
                    0 if reserved_on is None else 1,
                    (0 if before is None else -1) + (0 if after is None else 1),
                    batch,
                    ws,
                    known,
                )
        else:
            if ws_from is not None and ws_from not in self.replicas:
                ws_from = None
            if ws_to is not None and ws_to not in self.replicas:
                ws_to = None
            self._bump_replicas(
                (here, -1, 0 if reserved_on is None else 1, 0, batch, 0, 0),
                (released, 0, -1, 0, 0, 0, 0),
                (before, 0, 0, -1, 0, 0, 0),
                (after, 0, 0, 1, 0, 0, 0),
                (ws_from, 0, 0, 0, 0, -old_ws, -1 if old_ws > 0 else 0),
                (ws_to, 0, 0, 0, 0, last_prompt, 1 if last_prompt > 0 else 0),
            )
        paused_tools: tuple[str, ...] = ()
        if phase is RunPhase.PAUSED_ON_TOOL or (in_flight > 0 and paused_on_tool):
            # (with parallel turns, the tools of those that ended before it count too)
            named = run.paused_tools + tool_names if run.paused_tools else tool_names
            paused_tools = leases.tool_keys(named) if named else leases.UNNAMED
        self.runs = self.runs.set(
            run.run_id,
            new_run(
                run.run_id,
                phase,
                turn.replica,
                run.service_class,
                run.caller,
                self.now,
                in_flight,
                reserved_on,
                run.ended,
                last_prompt,
                last_prompt_on,
                run.turns,
                run.moves,
                paused_tools,
                False,  # lapsed
                run.attained + served,
            ),
        )
        if phase is RunPhase.IDLE:
            self._move_run_held(run.run_id, None)  # S3: an idle run may move
        elif phase is RunPhase.PAUSED_ON_TOOL:
            # Tool lease: checked when it may have run out, or the run expires (on_tick).
            self._check_pause(run.run_id, self.now, paused_tools)
            return turn
        self._schedule_run_expiry(run.run_id)
        return turn

    # ------------------------------------------------------------------ runs

    def _touch_run(self, run_id: str, service_class: ServiceClass, caller: str) -> None:
        run = self.runs.get(run_id)
        if run is None:
            run = new_run(
                run_id,
                RunPhase.IDLE,
                None,
                service_class,
                caller,
                self.now,
                0,
                None,
                False,
                0,
                None,
                0,
                0,
                (),
                False,
                0.0,
            )
        else:  # ended=False: a new turn after RunEnded, the run lives on; a run back from
            # a tool has been sampled (_back_from_tool)
            run = _run_with(run, caller=caller, last_active=self.now, ended=False, paused_tools=())
        self._put_run(run_id, run)
        self._schedule_run_expiry(run_id)

    def _put_run(self, run_id: str, run: RunState) -> None:
        """Every run write goes here, so each replica's count of pinned runs stays true
        (but for ``_admit`` and ``end_turn``, which count it themselves)."""
        before = working_set.contribution(self.runs.get(run_id))
        self.runs = self.runs.set(run_id, run)
        self._repin(before, working_set.contribution(run))

    def _drop_run(self, run_id: str) -> None:
        before = working_set.contribution(self.runs.get(run_id))
        self.runs = self.runs.delete(run_id)
        self._repin(before, _NOWHERE)

    def _repin(
        self, before: tuple[str | None, int, int], after: tuple[str | None, int, int]
    ) -> None:
        """A run moved from living where ``before`` says to where ``after`` says (each as
        ``working_set.contribution``): the pinned counts and working sets follow."""
        if before == after:
            return
        was, now = before[0], after[0]
        if was == now:  # (same replica, another known context)
            if was is not None and was in self.replicas:
                self._bump_replica(was, 0, 0, 0, 0, after[1] - before[1], after[2] - before[2])
            return
        if was is not None and was in self.replicas:
            self._bump_replica(was, 0, 0, -1, 0, -before[1], -before[2])
        if now is not None and now in self.replicas:
            self._bump_replica(now, 0, 0, 1, 0, after[1], after[2])

    def forget_run(self, run_id: str) -> None:
        """D8/S10: forget affinity and reservation. A run with turns still in flight is
        only marked: its counts stay sound until its last turn ends."""
        run = self.runs.get(run_id)
        if run is None:
            return
        self._release_reservation(run)
        run = self.runs[run_id]
        if run.in_flight > 0:
            self._put_run(run_id, _run_with(run, ended=True))
            return
        self._drop_run(run_id)
        self._move_run_held(run_id, None)

    def _release_reservation(self, run: RunState) -> None:
        if run.reserved_on is None:
            return
        if run.reserved_on in self.replicas:
            self._bump_replica(run.reserved_on, reserved=-1)
        self._put_run(run.run_id, _run_with(run, reserved_on=None))

    def _schedule_run_expiry(self, run_id: str) -> None:
        due = self.now + self.params.run_idle_expiry_s
        self.run_deadlines = _bucket_add(self.run_deadlines, due, run_id)

    # --------------------------------------------------------------- replicas

    def on_probed(self, ev: ReplicaProbed) -> None:
        rep = self.replicas.get(ev.replica)
        if rep is None:
            return
        cap = rep.cap
        run_limit = rep.run_limit
        queued = rep.queued_probes
        ramping = rep.ramping
        pace_cap, pace_set_at = rep.pace_cap, rep.pace_set_at
        if ev.running is None or ev.waiting is None:
            # decode pace: as S2, a replica that reports no load is not limited (its pace
            # may not be ours to change: a hosted API's is not)
            pace_cap, pace_set_at = None, None
            if not ev.healthy and self.params.initial_cap is not None:
                # down: it may come back as a restarted engine, idle and cold, so it
                # ramps from idle again (S2)
                cap, queued, ramping = self.params.initial_cap, 0, True
                run_limit = cap
            else:
                # S2: a replica that reports no load is not limited
                cap, queued, ramping = None, 0, False
        elif ev.waiting > 0:
            queued += 1
            if queued >= self.params.queue_probes:
                cap = max(1, ev.running)  # the engine keeps a queue: hold the rest ourselves
                run_limit = cap  # prefix keeping: as many runs live here as it runs
                ramping = False  # its capacity is found: from now on the cap rises by steps
        elif cap is not None and not rep.missed_since_probe:  # (a miss: the cache is full)
            queued = 0
            step = self.params.cap_raise_step
            # The cap rises only on the engine's evidence: it runs at the cap with an empty
            # queue, and luftpause's turns fill it. The engine's count alone is no
            # evidence: requests of other clients on a shared engine would raise a cap
            # luftpause does not use, without bound while it idles (and double it on the
            # ramp), so its next burst would go straight into the engine's queue. Our own
            # count alone is none either: it may be high for reasons of ours (a turn
            # reported late, or never). Runs waiting behind runs placed here are none
            # either: those may be paused on tools, or gone (a client that left mid-tool).
            if ev.running >= cap and rep.in_flight + rep.reserved >= cap:
                # quiet at the cap: probe for more (doubling while it ramps from idle)
                cap += max(cap, step) if ramping else step
            # Prefix keeping: new batch runs wait while the runs living here reach the run
            # limit; with the engine quiet, one more may live here each probe (doubling
            # while the replica ramps from idle, so that new runs are not held a probe
            # each behind runs that may be gone). A miss (a returning run lost its prefix)
            # lowers it again.
            if (
                self.params.keep_prefixes
                and run_limit is not None
                and rep.pinned_runs >= run_limit
                and self._new_runs_waiting(rep)
            ):
                run_limit += max(run_limit, step) if ramping else step
        else:
            queued = 0
        if cap is None:
            run_limit = None
        elif run_limit is None or run_limit < cap:
            run_limit = cap  # (never below the cap: a run with a turn in flight lives here)
        # a drained replica past its drain time, or one that left, takes no turn however
        # its engine answers
        healthy = ev.healthy and not self._moved_off(ev.replica)
        self._set_health(ev.replica, healthy=healthy)
        self.replicas = self.replicas.set(
            ev.replica,
            new_replica(
                rep.spec,
                healthy,
                cap,
                rep.in_flight,
                rep.reserved,
                rep.pinned_runs,
                queued,
                ev.running,
                ev.waiting,
                ev.kv_usage,
                self.now,
                rep.reports_cache,
                rep.prefix_misses,
                False,
                ramping,
                rep.batch_in_flight,
                pace_cap,
                rep.pace_s,
                pace_set_at,
                rep.pace_best_s,
                run_limit,
                ev.kv_tokens,
                rep.ws_tokens,
                rep.ws_known,
            ),
        )
        if cap != rep.cap or pace_cap != rep.pace_cap or run_limit != rep.run_limit:
            self.dirty.add(ev.replica)
        if self.params.working_set is not WorkingSet.OFF:
            self.dirty.add(ev.replica)  # (its pool or KV usage may admit new runs now)

    def _set_health(self, name: str, *, healthy: bool) -> None:
        """A replica became healthy (a probe) or not (a probe, or a connection the
        dataplane could not make). Unhealthy: it gets no turns, and every other
        replica may draw from its pin lane (S3: its runs may move)."""
        rep = self.replicas.get(name)
        if rep is None or rep.healthy == healthy:
            return
        self.replicas = self.replicas.set(name, _replica_with(rep, healthy=healthy))
        if rep.spec.kind is EndpointKind.GENERATIVE:
            self.unhealthy = (
                self.unhealthy.delete(name) if healthy else self.unhealthy.set(name, None)
            )
        if healthy:
            self.dirty.add(name)
        else:
            self.dirty.update(self.replicas.keys())

    def _bump_replica(
        self,
        name: str,
        in_flight: int = 0,
        reserved: int = 0,
        pinned: int = 0,
        batch: int = 0,
        ws: int = 0,
        known: int = 0,
    ) -> None:
        """Change ``name``'s counters: turns in flight, reservations, runs living there,
        batch turns in flight, and its working set's known tokens and runs with one."""
        if in_flight < 0 or reserved < 0 or pinned < 0 or batch < 0 or ws < 0:
            self.dirty.add(name)  # room may have grown
        rep = self.replicas[name]
        in_flight += rep.in_flight  # the new counts, never below zero
        reserved += rep.reserved
        pinned += rep.pinned_runs
        batch += rep.batch_in_flight
        ws += rep.ws_tokens
        known += rep.ws_known
        self.replicas = self.replicas.set(
            name,
            new_replica(
                rep.spec,
                rep.healthy,
                rep.cap,
                in_flight if in_flight > 0 else 0,
                reserved if reserved > 0 else 0,
                pinned if pinned > 0 else 0,
                rep.queued_probes,
                rep.running,
                rep.waiting,
                rep.kv_usage,
                rep.probed_at,
                rep.reports_cache,
                rep.prefix_misses,
                rep.missed_since_probe,
                rep.ramping,
                batch if batch > 0 else 0,
                rep.pace_cap,
                rep.pace_s,
                rep.pace_set_at,
                rep.pace_best_s,
                rep.run_limit,
                rep.kv_tokens,
                ws if ws > 0 else 0,
                known if known > 0 else 0,
            ),
        )

    def _bump_replicas(self, *bumps: tuple[str | None, int, int, int, int, int, int]) -> None:
        """Several ``_bump_replica`` (name, in_flight, reserved, pinned, batch, ws, known) at
        once, one new record per replica (a None name is skipped). Counters stay sound
        (never below zero on the way), so summing the changes first gives the same counts;
        a replica is dirty if any change lowered one of its counters, as one by one (its
        working set: if the changes lowered it in all)."""
        merged: dict[str, list[int]] = {}
        dirty: set[str] = set()
        for name, in_flight, reserved, pinned, batch, ws, known in bumps:
            if name is None:
                continue
            if in_flight < 0 or reserved < 0 or pinned < 0 or batch < 0:
                dirty.add(name)
            m = merged.get(name)
            if m is None:
                merged[name] = [in_flight, reserved, pinned, batch, ws, known]
            else:
                m[0] += in_flight
                m[1] += reserved
                m[2] += pinned
                m[3] += batch
                m[4] += ws
                m[5] += known
        for name, (in_flight, reserved, pinned, batch, ws, known) in merged.items():
            self._bump_replica(name, in_flight, reserved, pinned, batch, ws, known)
        self.dirty |= dirty

    def _count_caller(self, caller: str, delta: int) -> None:
        n = self.caller_in_flight.get(caller, 0) + delta
        if n > 0:
            self.caller_in_flight = self.caller_in_flight.set(caller, n)
        elif caller in self.caller_in_flight:
            self.caller_in_flight = self.caller_in_flight.delete(caller)
        if "/" in caller:  # a sub-caller: its account's count too (order.py)
            name = caller.partition("/")[0]
            n = self.sub_in_flight.get(name, 0) + delta
            if n > 0:
                self.sub_in_flight = self.sub_in_flight.set(name, n)
            elif name in self.sub_in_flight:
                self.sub_in_flight = self.sub_in_flight.delete(name)
        if delta < 0 and self.params.callers:
            self._below_limit(caller)

    def _below_limit(self, caller: str) -> None:
        """A turn of ``caller`` ended: if that takes its account just below its in-flight
        limit, its held turns may go again, wherever there is room (they were held for
        the limit, not for room, so every replica is offered them)."""
        name = order.account(caller)
        limit = order.in_flight_limit(self.params, name)
        if (
            limit is not None
            and order.account_in_flight(self.caller_in_flight, self.sub_in_flight, name)
            == limit - 1
        ):
            self.dirty.update(self.replicas)

    # ---------------------------------------------------------------- admission

    def fill_dirty(self) -> None:
        # Admitting may end a reservation elsewhere and so dirty another replica:
        # loop until none is left. Each pass admits or leaves, so this terminates.
        while self.dirty:
            if not self.waiting_callers:  # nothing is held: nothing to admit anywhere
                self.dirty.clear()
                return
            name = min(self.dirty)
            self.dirty.discard(name)
            self._fill(name)

    def _fill(self, name: str) -> None:
        """Admit held turns to ``name`` while it has room (S4 order, then S5)."""
        while True:
            rep = self.replicas[name]
            for cls in _CLASS_ORDER:
                if not _has_room(rep, cls):
                    continue
                new_runs = _may_start_run(rep, cls, self.params) and name not in self.draining
                held = self._best_held(rep, cls, new_runs)
                if held is not None:
                    self._unhold(held)
                    self._admit(
                        self.runs.get(held.run_id),
                        name,
                        held.turn_id,
                        held.run_id,
                        held.model,
                        held.service_class,
                        held.caller,
                        held.kind,
                        held.dataplane_id,
                        held.requested_at,
                        held.lane,
                        held.trace_id,
                        requested=False,
                    )
                    break
            else:
                return

    def _new_runs_waiting(self, rep: ReplicaState) -> bool:
        """Whether a batch turn of a run new to ``rep`` is held where ``rep`` could take
        it: a free lane of a model it serves, or an unhealthy replica's pin lane."""
        lanes = [free_lane(rep.spec.kind, m) for m in rep.spec.models]
        lanes.extend(pin_lane(u) for u in self.unhealthy if u != rep.spec.name)
        return any((lane, ServiceClass.BATCH) in self.waiting_callers for lane in lanes)

    def _best_held(
        self, rep: ReplicaState, cls: ServiceClass, new_runs: bool = True
    ) -> HeldTurn | None:
        """Of the turns ``rep`` may serve in class ``cls``, the first by ``order.held_key``
        (the caller, then a turn whose run's prefix is here, then the run's level under
        the attained order, then oldest): this gathers the candidates, the heads of the
        caller FIFOs in the lanes ``rep`` may draw from. ``new_runs``: whether turns of
        runs not pinned here may be taken (``placement.may_start_run``)."""
        best: tuple[float, ...] | None = None
        best_turn: str | None = None
        own = pin_lane(rep.spec.name)
        generative = rep.spec.kind is EndpointKind.GENERATIVE
        key: order.HeldKey | None = None  # built for the first lane with turns held
        limited = False
        lanes = [own]
        if new_runs:
            lanes += [free_lane(rep.spec.kind, m) for m in rep.spec.models]
        if new_runs and generative and self.unhealthy:
            # S3: turns pinned to an unhealthy replica may move here (if we serve the model).
            lanes += [pin_lane(name) for name in sorted(self.unhealthy) if name != rep.spec.name]
        # The candidates: the head of each caller's FIFO (per service level, under the
        # attained order) in those lanes.
        for lane in lanes:
            callers = self.waiting_callers.get((lane, cls))
            if callers is None:
                continue
            if key is None:
                key = order.held_key(
                    self.params,
                    self.caller_in_flight,
                    self.sub_in_flight,
                    self.vtc,
                    cls,
                    generative,
                    own,
                )
                limited = generative and order.limited(self.params)
            for caller in callers:
                qkey = (lane, cls, caller)
                first = self.queues[qkey].first()
                if first is None:  # pragma: no cover - empty FIFOs are removed
                    continue
                fifo, _, turn_id = first
                if fifo is not self.queues[qkey]:
                    self.queues = self.queues.set(qkey, fifo)  # keep the hole-skipping
                held = self.held[turn_id]
                if held.model not in rep.spec.models:
                    continue  # a moved turn of another model: not ours to take
                if limited and order.at_limit(
                    self.params, self.caller_in_flight, self.sub_in_flight, held.caller
                ):
                    continue  # its account is at its in-flight limit (B13)
                k = key(lane, held)
                if best is None or k < best:
                    best, best_turn = k, turn_id
        return None if best_turn is None else self.held[best_turn]

    # ------------------------------------------------------------------ expiry

    def on_tick(self) -> None:
        for dataplane_id, due in sorted(self.lost_dataplanes.items()):
            if due <= self.now:  # S11: it never came back: its turns end here
                self.lost_dataplanes = self.lost_dataplanes.delete(dataplane_id)
                self._release_turns_of(dataplane_id, keep=frozenset())
        until = int(self.now)
        if until <= self.swept_until:
            return
        for second in _due(self.turn_deadlines, self.swept_until, until):
            for turn_id in sorted(self.turn_deadlines[second]):
                turn = self.turns.get(turn_id)
                if turn is not None and turn.deadline <= self.now:
                    self.end_turn(turn_id, paused_on_tool=False)
                    self.actions.append(
                        DropTurn(turn_id, turn.replica, DropReason.EXPIRED, turn.trace_id)
                    )
            self.turn_deadlines = self.turn_deadlines.delete(second)
        for second in _due(self.run_deadlines, self.swept_until, until):
            for run_id in sorted(self.run_deadlines[second]):
                run = self.runs.get(run_id)
                if (
                    run is None
                    or run.in_flight > 0
                    or run_id in self.held_by_run  # a held turn is a turn (S10)
                ):
                    continue
                if run.last_active + self.params.run_idle_expiry_s <= self.now:
                    self.forget_run(run_id)
                    self.actions.append(ForgetRun(run_id))
                elif run.phase is RunPhase.PAUSED_ON_TOOL and not run.lapsed:
                    due = run.last_active + self._lease(run.paused_tools)
                    if due <= self.now:
                        self._lapse(run)
                    else:  # its tools' estimates grew since it paused
                        self._check_pause(run_id, run.last_active, run.paused_tools)
            self.run_deadlines = self.run_deadlines.delete(second)
        self.swept_until = until
        if target.packs(self.params):
            self._packing_tick()

    # --------------------------------------------------------------- membership

    def on_joined(self, ev: ReplicaJoined) -> None:
        """A replica joins, or one draining or leaving is taken back (its drain ends).
        New, it starts as a restarted replica: unhealthy until its first probe, then on
        the ramp from idle (S2). A name already present keeps its counters and takes the
        new spec's models; a spec of another kind is refused (leave first)."""
        spec = ev.spec
        name = spec.name
        if not name or len(name) > _MAX_ID:
            return
        rep = self.replicas.get(name)
        if rep is not None and rep.spec.kind is not spec.kind:
            return
        if name in self.draining:
            self.draining = self.draining.delete(name)
        if name in self.left:
            self.left = self.left.delete(name)
        if rep is None:
            cap = self.params.initial_cap
            self.replicas = self.replicas.set(
                name, ReplicaState(spec=spec, cap=cap, ramping=cap is not None, run_limit=cap)
            )
            if spec.kind is EndpointKind.GENERATIVE:
                self.unhealthy = self.unhealthy.set(name, None)
        elif rep.spec != spec:
            self.replicas = self.replicas.set(name, replace(rep, spec=spec))
        self._serve(spec)
        self.dirty.add(name)

    def on_draining(self, ev: ReplicaDraining) -> None:
        """A replica takes no new runs from now; its runs move at ``ev.until`` (or now)."""
        if ev.replica not in self.replicas or ev.replica in self.left:
            return
        until = self.now if ev.until is None else max(self.now, ev.until)
        self.draining = self.draining.set(ev.replica, until)
        self._membership_tick()

    def on_left(self, ev: ReplicaLeft) -> None:
        """A replica is gone: it serves nothing from now, its runs move, and held turns
        of a model no replica serves any longer are rejected (S6)."""
        name = ev.replica
        if name not in self.replicas or name in self.left:
            return
        self._unserve(name)
        self.left = self.left.set(name, None)
        self.draining = self.draining.set(name, self.now)
        self._membership_tick()
        self._reject_unservable()

    def _moved_off(self, name: str) -> bool:
        """A drained replica past its drain time, or one that left: it takes no turn."""
        until = self.draining.get(name) if self.draining else None
        return until is not None and until <= self.now

    def _membership_tick(self) -> None:
        """Drained replicas whose drain time came count as unhealthy from now (their
        runs' turns move: other replicas draw from their pin lanes, S3); a replica that
        left is dropped once nothing in flight, pinned, reserved or held refers to it."""
        for name, until in sorted(self.draining.items()):
            if until <= self.now:
                self._set_health(name, healthy=False)
        for name in sorted(self.left):
            rep = self.replicas[name]
            own = pin_lane(name)
            if (
                rep.in_flight == 0
                and rep.reserved == 0
                and rep.pinned_runs == 0
                and not any((own, cls) in self.waiting_callers for cls in _CLASS_ORDER)
            ):
                self.replicas = self.replicas.delete(name)
                self.left = self.left.delete(name)
                self.draining = self.draining.delete(name)
                if name in self.unhealthy:
                    self.unhealthy = self.unhealthy.delete(name)
                self.dirty.discard(name)

    def _serve(self, spec: ReplicaSpec) -> None:
        """``spec``'s replica serves exactly its models (``serving``)."""
        self._unserve(spec.name)
        for model in sorted(spec.models):
            key = (spec.kind, model)
            names = {*self.serving.get(key, ()), spec.name}
            self.serving = self.serving.set(key, tuple(sorted(names)))

    def _unserve(self, name: str) -> None:
        for key, names in list(self.serving.items()):  # (each key apart: order is moot)
            if name in names:
                rest = tuple(n for n in names if n != name)
                self.serving = self.serving.set(key, rest) if rest else self.serving.delete(key)

    def _reject_unservable(self) -> None:
        """Held turns of a model no replica of their kind serves any longer can never be
        admitted: each is answered with a Reject, as a new turn for it would be (S6)."""
        stranded = sorted(
            (h for h in self.held.values() if (h.kind, h.model) not in self.serving),
            key=lambda h: h.seq,
        )
        for held in stranded:
            self.on_abandoned(TurnAbandoned(self.now, held.turn_id))
            label = _KIND_LABEL[held.kind]
            msg = f"no {label} replica serves model '{held.model}' any more"
            self.actions.append(Reject(held.turn_id, RejectCode.UNKNOWN_MODEL, msg))

    # ------------------------------------------------------------------ resync

    def on_resynced(self, ev: DataplaneResynced) -> None:
        """S11: adopt a dataplane's view of its runs and admitted turns."""
        self.dataplane_back(ev.dataplane_id)
        self._release_turns_of(ev.dataplane_id, keep=frozenset(t.turn_id for t in ev.in_flight))
        per_run: dict[str, int] = {}
        for turn in self.turns.values():
            if turn.kind is EndpointKind.GENERATIVE:
                per_run[turn.run_id] = per_run.get(turn.run_id, 0) + 1
        for snap in ev.runs:
            if not snap.run_id or len(snap.run_id) > _MAX_ID:
                continue
            old = self.runs.get(snap.run_id)
            if old is not None:
                self._release_reservation(old)
            rep = self.replicas.get(snap.replica) if snap.replica else None
            generative = rep is not None and rep.spec.kind is EndpointKind.GENERATIVE
            replica = snap.replica if generative else None
            phase = snap.phase if replica is not None else RunPhase.IDLE
            in_flight = per_run.get(snap.run_id, 0)
            # Tool leases: the same pause as the scheduler knew keeps its start, its tools
            # and whether it lapsed (a resync is no turn, S10, and the time it comes back
            # after is a sample of its tools); a pause new to it starts now.
            same_pause = (
                old is not None
                and phase is RunPhase.PAUSED_ON_TOOL
                and in_flight == 0
                and old.phase is RunPhase.PAUSED_ON_TOOL
                and old.replica == replica
            )
            lapsed = same_pause and old is not None and old.lapsed
            reserved_on = None
            if (
                replica is not None
                and phase is RunPhase.PAUSED_ON_TOOL
                and snap.service_class is ServiceClass.INTERACTIVE
                and not lapsed
            ):
                reserved_on = replica
                self._bump_replica(replica, reserved=1)
            self._put_run(
                snap.run_id,
                RunState(
                    run_id=snap.run_id,
                    phase=phase,
                    replica=replica,
                    service_class=snap.service_class,
                    caller=snap.caller,
                    last_active=old.last_active if same_pause and old is not None else self.now,
                    in_flight=in_flight,
                    reserved_on=reserved_on,
                    paused_tools=old.paused_tools if same_pause and old is not None else (),
                    lapsed=lapsed,
                ),
            )
            # S3: turns it has held follow it (the snapshot may pin a run held as idle)
            self._move_run_held(snap.run_id, replica if phase is not RunPhase.IDLE else None)
            self._schedule_run_expiry(snap.run_id)
            if phase is RunPhase.PAUSED_ON_TOOL and in_flight == 0 and not lapsed:
                run = self.runs[snap.run_id]
                due = max(self.now + 1.0, run.last_active + self._lease(run.paused_tools))
                self._check_lease_at(snap.run_id, due)
        for t in ev.in_flight:
            if t.turn_id in self.turns or t.replica not in self.replicas:
                continue
            rep = self.replicas[t.replica]
            if t.model not in rep.spec.models or not t.turn_id or len(t.turn_id) > _MAX_ID:
                continue
            stale_held = self.held.get(t.turn_id)
            if stale_held is not None:
                self._unhold(stale_held)
            self._adopt_turn(t, ev.dataplane_id, rep)
        self.dirty.update(self.replicas.keys())

    def dataplane_back(self, dataplane_id: str) -> None:
        """A dataplane reports again (or resynced): its turns are its own again."""
        if dataplane_id in self.lost_dataplanes:
            self.lost_dataplanes = self.lost_dataplanes.delete(dataplane_id)

    def _release_turns_of(self, dataplane_id: str, keep: frozenset[str]) -> None:
        """End the admitted turns of ``dataplane_id`` not in ``keep``: the dataplane no
        longer has them (resync) or is gone (its grace ran out)."""
        stale = sorted(
            t.turn_id
            for t in self.turns.values()
            if t.dataplane_id == dataplane_id and t.turn_id not in keep
        )
        for turn_id in stale:
            turn = self.end_turn(turn_id, paused_on_tool=False)
            if turn is not None:
                self.actions.append(
                    DropTurn(turn_id, turn.replica, DropReason.RELEASED, turn.trace_id)
                )

    def _adopt_turn(self, t: TurnSnapshot, dataplane_id: str, rep: ReplicaState) -> None:
        deadline = self.now + self.params.turn_timeout_s
        self.turns = self.turns.set(
            t.turn_id,
            TurnState(
                turn_id=t.turn_id,
                run_id=t.run_id,
                replica=t.replica,
                model=t.model,
                service_class=t.service_class,
                caller=t.caller,
                kind=rep.spec.kind,
                dataplane_id=dataplane_id,
                admitted_at=self.now,
                deadline=deadline,
                started=t.started,
                batch_beside=self.replicas[t.replica].batch_in_flight,
            ),
        )
        self.turn_deadlines = _bucket_add(self.turn_deadlines, deadline, t.turn_id)
        generative = rep.spec.kind is EndpointKind.GENERATIVE
        batch = 1 if generative and t.service_class is ServiceClass.BATCH else 0
        self._bump_replica(t.replica, in_flight=1, batch=batch)
        if not generative:
            return
        self._count_caller(t.caller, 1)
        run = self.runs.get(t.run_id)
        if run is None:
            run = RunState(
                run_id=t.run_id,
                phase=RunPhase.GENERATING,
                replica=t.replica,
                service_class=t.service_class,
                caller=t.caller,
                last_active=self.now,
                in_flight=1,
            )
        else:
            self._release_reservation(run)
            run = self.runs[t.run_id]
            # The run snapshot names the replica of its last turn; keep it (S3).
            run = _run_with(
                run,
                phase=RunPhase.GENERATING,
                replica=run.replica if run.replica is not None else t.replica,
                last_active=self.now,
                in_flight=run.in_flight + 1,
                paused_tools=(),
                lapsed=False,  # it is back
            )
        self._put_run(t.run_id, run)
        self._schedule_run_expiry(t.run_id)


# -------------------------------------------------------------------- helpers

_EMPTY_FIFO = Fifo()
_NOWHERE: tuple[str | None, int, int] = (None, 0, 0)  # a run living nowhere (working sets)
_EMPTY_SET: Map[str, None] = Map()


def _invalid(ev: TurnRequested) -> str | None:
    if not ev.turn_id or len(ev.turn_id) > _MAX_ID:
        return f"turn_id must be 1..{_MAX_ID} characters"
    if not ev.run_id or len(ev.run_id) > _MAX_ID:
        return f"run_id must be 1..{_MAX_ID} characters"
    if not ev.model:
        return "model is required"
    return None


def _starved_batch(run: RunState, rep: ReplicaState) -> bool:
    """Packing: ``run`` is batch and ``rep``, its replica, is starved (``target.py``)."""
    return run.service_class is ServiceClass.BATCH and target.starved(rep)


Buckets = Map[int, Map[str, None]]


def _bucket_add(buckets: Buckets, due: float, key: str) -> Buckets:
    second = int(due)
    if second != due:
        second += 1  # ceil: never before it is due
    return buckets.set(second, buckets.get(second, _EMPTY_SET).set(key, None))


def _due(buckets: Buckets, after: int, until: int) -> list[int]:
    """Bucket seconds in (after, until], cheaply whether the gap is small or huge."""
    if until - after <= len(buckets):
        return [s for s in range(after + 1, until + 1) if s in buckets]
    return sorted(s for s in buckets if after < s <= until)


class _Keep:
    """Marks a field an update leaves as it is (None is a real value for some)."""


_KEEP = _Keep()


def _run_with(
    r: RunState,
    *,
    phase: RunPhase | _Keep = _KEEP,
    replica: str | _Keep | None = _KEEP,
    service_class: ServiceClass | _Keep = _KEEP,
    caller: str | _Keep = _KEEP,
    last_active: float | _Keep = _KEEP,
    in_flight: int | _Keep = _KEEP,
    reserved_on: str | _Keep | None = _KEEP,
    ended: bool | _Keep = _KEEP,
    last_prompt: int | _Keep = _KEEP,
    last_prompt_on: str | _Keep | None = _KEEP,
    turns: int | _Keep = _KEEP,
    moves: int | _Keep = _KEEP,
    paused_tools: tuple[str, ...] | _Keep = _KEEP,
    lapsed: bool | _Keep = _KEEP,
) -> RunState:
    """A copy of ``r`` with some fields changed. Hand-written rather than
    ``dataclasses.replace``, which costs several microseconds per call; the hot paths
    (``_admit``, ``end_turn``) call ``new_run`` with every field instead."""
    return new_run(
        r.run_id,
        r.phase if isinstance(phase, _Keep) else phase,
        r.replica if isinstance(replica, _Keep) else replica,
        r.service_class if isinstance(service_class, _Keep) else service_class,
        r.caller if isinstance(caller, _Keep) else caller,
        r.last_active if isinstance(last_active, _Keep) else last_active,
        r.in_flight if isinstance(in_flight, _Keep) else in_flight,
        r.reserved_on if isinstance(reserved_on, _Keep) else reserved_on,
        r.ended if isinstance(ended, _Keep) else ended,
        r.last_prompt if isinstance(last_prompt, _Keep) else last_prompt,
        r.last_prompt_on if isinstance(last_prompt_on, _Keep) else last_prompt_on,
        r.turns if isinstance(turns, _Keep) else turns,
        r.moves if isinstance(moves, _Keep) else moves,
        r.paused_tools if isinstance(paused_tools, _Keep) else paused_tools,
        r.lapsed if isinstance(lapsed, _Keep) else lapsed,
        r.attained,
    )


def _replica_with(
    rep: ReplicaState,
    *,
    healthy: bool | _Keep = _KEEP,
    cap: int | _Keep | None = _KEEP,
    in_flight: int | _Keep = _KEEP,
    reserved: int | _Keep = _KEEP,
    pinned_runs: int | _Keep = _KEEP,
    reports_cache: bool | _Keep = _KEEP,
    prefix_misses: int | _Keep = _KEEP,
    missed_since_probe: bool | _Keep = _KEEP,
    pace_cap: int | _Keep | None = _KEEP,
    pace_s: float | _Keep | None = _KEEP,
    pace_set_at: float | _Keep | None = _KEEP,
    pace_best_s: float | _Keep | None = _KEEP,
    run_limit: int | _Keep | None = _KEEP,
) -> ReplicaState:
    """A copy of ``rep`` with some counters changed (hand-written, as ``_run_with``)."""
    return new_replica(
        rep.spec,
        rep.healthy if isinstance(healthy, _Keep) else healthy,
        rep.cap if isinstance(cap, _Keep) else cap,
        rep.in_flight if isinstance(in_flight, _Keep) else in_flight,
        rep.reserved if isinstance(reserved, _Keep) else reserved,
        rep.pinned_runs if isinstance(pinned_runs, _Keep) else pinned_runs,
        rep.queued_probes,
        rep.running,
        rep.waiting,
        rep.kv_usage,
        rep.probed_at,
        rep.reports_cache if isinstance(reports_cache, _Keep) else reports_cache,
        rep.prefix_misses if isinstance(prefix_misses, _Keep) else prefix_misses,
        rep.missed_since_probe if isinstance(missed_since_probe, _Keep) else missed_since_probe,
        rep.ramping,
        rep.batch_in_flight,
        rep.pace_cap if isinstance(pace_cap, _Keep) else pace_cap,
        rep.pace_s if isinstance(pace_s, _Keep) else pace_s,
        rep.pace_set_at if isinstance(pace_set_at, _Keep) else pace_set_at,
        rep.pace_best_s if isinstance(pace_best_s, _Keep) else pace_best_s,
        rep.run_limit if isinstance(run_limit, _Keep) else run_limit,
        rep.kv_tokens,
        rep.ws_tokens,
        rep.ws_known,
    )


def _turn_with(t: TurnState, started: bool, first_token_at: float | None) -> TurnState:
    """``t`` with ``started``, and its first token at ``first_token_at`` (None: as was)."""
    return new_turn(
        t.turn_id,
        t.run_id,
        t.replica,
        t.model,
        t.service_class,
        t.caller,
        t.kind,
        t.dataplane_id,
        t.admitted_at,
        t.deadline,
        started,
        first_token_at if first_token_at is not None else t.first_token_at,
        t.expect_cached,
        t.trace_id,
        t.batch_beside,
    )


def _state_with(s: State, now: float, turns: Map[str, TurnState]) -> State:
    """``s`` at time ``now`` with another turn map (the rest shared)."""
    return new_state(
        s.params,
        now,
        s.seq,
        s.replicas,
        s.serving,
        s.runs,
        turns,
        s.held,
        s.held_by_run,
        s.unhealthy,
        s.queues,
        s.waiting_callers,
        s.caller_in_flight,
        s.turn_deadlines,
        s.run_deadlines,
        s.swept_until,
        s.lost_dataplanes,
        s.tool_times,
        s.vtc,
        s.caller_held,
        s.draining,
        s.left,
        s.sub_in_flight,
    )
