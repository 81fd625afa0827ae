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
on a tool there: they will come back and find a slot. On a replica whose engine
orders its own queue by class (``ReplicaSpec.orders_classes``: the dataplane
sends a per-class ``priority``), an interactive turn always fits: in the engine's
queue it waits only behind other interactive turns, while here it would wait for
the cap to clear. The cap and the reservations still bound batch work there.

Which held turn goes first when a replica has room (S4, S5): interactive before
batch; within a class, the caller with the fewest in-flight turns; ties by
arrival order. The candidates are the heads of the caller FIFOs in the lanes
that replica can serve: its own pin lane and the free lanes of its models.

Affinity (S3): a run that is generating or paused on a tool is pinned: its
turns wait in that replica's pin lane even if another replica is idle. While the
replica is unhealthy, every other replica serving the model may draw from that
lane (the run may move); once it is healthy again the lane is its alone, so a
probe blip costs no affinity. A run's held turns follow it: pinned where it is
admitted, freed when it goes idle. A free turn prefers its run's last replica
(its prefix may still be cached), else the least loaded replica: fewest runs
living there (generating or paused on a tool, because they come back), then fewest
turns in flight, ties rotating with arrival order.

Run lifetime (S10, D8): a held turn counts as activity, so a run waiting for a
slot is not forgotten. ``RunEnded`` forgets a run at once unless turns of it are
still admitted; then it is marked and forgotten after the last of them.

The cap (S2): a queue seen on ``Params.queue_probes`` consecutive probes (default
2: one probe period) sets ``cap = max(1, running)``; a passing queue, such as a
burst of prompts being prefilled in chunks, does not. A probe with an empty queue
never lowers the cap; it raises it by
``Params.cap_raise_step`` when the engine reports running at the cap
(``running`` ≥ cap), so capacity is found step by step instead of letting the
next burst straight back into the engine's queue. Only the engine's numbers
raise it: luftpause's own in-flight count says what it sent, not what the
engine can run. A probe without load numbers removes the cap. The scheduler
keeps nothing on disk, so a restarted one starts uncapped and sets each cap
again from the first queue it sees (``queue_probes`` probes under load).

Health (S9, D6): a probe sets it; a turn that failed because the dataplane
could not connect to its replica (``TurnFailed.replica_unreachable``) clears it
at once, so the next turns do not follow the dead replica until its probe
fails. The next healthy probe restores it.

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
"""

from __future__ import annotations

from immutables import Map

from luftpause.scheduler.core.actions import Action, Admit, DropTurn, ForgetRun, Reject
from luftpause.scheduler.core.events import (
    ClockTicked,
    DataplaneConnected,
    DataplaneDisconnected,
    DataplaneResynced,
    Event,
    FirstTokenReceived,
    ReplicaProbed,
    RunEnded,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
    TurnRequested,
    TurnSnapshot,
    TurnStarted,
)
from luftpause.scheduler.core.state import (
    Fifo,
    HeldTurn,
    Lane,
    ReplicaState,
    RunState,
    State,
    TurnState,
    free_lane,
    pin_lane,
)
from luftpause.scheduler.core.types import (
    DropReason,
    EndpointKind,
    RejectCode,
    RunPhase,
    ServiceClass,
)

_CLASS_ORDER = (ServiceClass.INTERACTIVE, ServiceClass.BATCH)
_KIND_LABEL = {EndpointKind.GENERATIVE: "Generative", EndpointKind.SINGLE_PASS: "SinglePass"}
_MAX_ID = 256  # longest turn/run ID accepted from a peer


def decide(state: State, event: Event) -> tuple[State, tuple[Action, ...]]:
    """Apply one event; return the new state and what the host must do."""
    tx = _Tx(state, max(state.now, event.at))
    match event:
        case TurnRequested():
            tx.on_requested(event)
        case TurnAbandoned():
            tx.on_abandoned(event)
        case TurnStarted():
            tx.on_started(event)
        case FirstTokenReceived():
            tx.on_first_token(event)
        case TurnFinished():
            tx.on_finished(event)
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
    tx.fill_dirty()
    return tx.freeze(), tuple(tx.actions)


class _Tx:
    """One event's work: the state's fields as locals, rebound as maps change."""

    __slots__ = (
        "actions",
        "caller_in_flight",
        "dirty",
        "held",
        "held_by_run",
        "lost_dataplanes",
        "now",
        "params",
        "queues",
        "replicas",
        "run_deadlines",
        "runs",
        "seq",
        "serving",
        "swept_until",
        "turn_deadlines",
        "turns",
        "unhealthy",
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
        self.actions: list[Action] = []
        self.dirty: set[str] = set()

    def freeze(self) -> State:
        return State(
            params=self.params,
            now=self.now,
            seq=self.seq,
            replicas=self.replicas,
            serving=self.serving,
            runs=self.runs,
            turns=self.turns,
            held=self.held,
            held_by_run=self.held_by_run,
            unhealthy=self.unhealthy,
            queues=self.queues,
            waiting_callers=self.waiting_callers,
            caller_in_flight=self.caller_in_flight,
            turn_deadlines=self.turn_deadlines,
            run_deadlines=self.run_deadlines,
            swept_until=self.swept_until,
            lost_dataplanes=self.lost_dataplanes,
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
        if (ev.kind, ev.model) not in self.serving:  # S6: never queued
            label = _KIND_LABEL[ev.kind]
            msg = f"no {label} replica serves model '{ev.model}'"
            self.actions.append(Reject(ev.turn_id, RejectCode.UNKNOWN_MODEL, msg))
            return
        lane = self._lane_for(ev.run_id, ev.kind, ev.model)
        self.seq += 1
        held = HeldTurn(
            turn_id=ev.turn_id,
            run_id=ev.run_id,
            model=ev.model,
            service_class=ev.service_class,
            caller=ev.caller,
            kind=ev.kind,
            dataplane_id=ev.dataplane_id,
            requested_at=self.now,
            seq=self.seq,
            lane=lane,
            slot=-1,
            trace_id=ev.trace_id,
        )
        if ev.kind is EndpointKind.GENERATIVE:
            self._touch_run(ev.run_id, ev.service_class, ev.caller)
        target = self._place(held)
        if target is not None:
            self._admit(held, target)
        else:
            self._hold(held)

    def _lane_for(self, run_id: str, kind: EndpointKind, model: str) -> Lane:
        if kind is EndpointKind.GENERATIVE:
            run = self.runs.get(run_id)
            if run is not None and run.replica is not None and run.phase is not RunPhase.IDLE:
                rep = self.replicas.get(run.replica)
                if (
                    rep is not None
                    and rep.spec.kind is EndpointKind.GENERATIVE
                    and model in rep.spec.models
                ):
                    return pin_lane(run.replica)  # S3: strict affinity
        return free_lane(kind, model)

    def _place(self, held: HeldTurn) -> str | None:
        """The replica a turn can be admitted to right now, if any."""
        if held.lane[0] == "pin" and held.lane[1] not in self.unhealthy:
            name = held.lane[1]
            return name if _has_room(self.replicas[name], held.service_class) else None
        # Free, or pinned to an unhealthy replica (S3: then the run may move).
        run = self.runs.get(held.run_id) if held.kind is EndpointKind.GENERATIVE else None
        names = self.serving[(held.kind, held.model)]
        best: tuple[int, int, int] | None = None
        choice = None
        for i, name in enumerate(names):
            rep = self.replicas[name]
            if not _has_room(rep, held.service_class):
                continue
            if held.kind is EndpointKind.GENERATIVE and not self._may_start_run(
                rep, held.service_class
            ):
                continue
            if run is not None and run.replica == name:
                return name  # its prefix may still be cached there
            # Least loaded: runs living there (generating or paused on a tool: they come
            # back), then turns in flight; ties rotate with the arrival order.
            key = (rep.pinned_runs, rep.in_flight + rep.reserved, (i + 1 - held.seq) % len(names))
            if best is None or key < best:
                best, choice = key, name
        return choice

    def _hold(self, held: HeldTurn) -> None:
        qkey = (held.lane, held.service_class, held.caller)
        fifo, slot = self.queues.get(qkey, _EMPTY_FIFO).push(held.turn_id)
        self.queues = self.queues.set(qkey, fifo)
        wkey = (held.lane, held.service_class)
        callers = self.waiting_callers.get(wkey, _EMPTY_SET)
        if held.caller not in callers:
            self.waiting_callers = self.waiting_callers.set(wkey, callers.set(held.caller, None))
        self.held = self.held.set(held.turn_id, _held_with(held, slot=slot))
        if held.kind is EndpointKind.GENERATIVE:  # single-pass turns have no run (S13)
            mine = self.held_by_run.get(held.run_id, _EMPTY_SET)
            self.held_by_run = self.held_by_run.set(held.run_id, mine.set(held.turn_id, None))

    def _unhold(self, held: HeldTurn) -> None:
        qkey = (held.lane, held.service_class, held.caller)
        fifo = self.queues[qkey].remove(held.slot)
        if len(fifo) == 0:
            self.queues = self.queues.delete(qkey)
            wkey = (held.lane, held.service_class)
            callers = self.waiting_callers[wkey].delete(held.caller)
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
                self._unhold(held)
                self._hold(_held_with(held, lane=lane))
                self.dirty.update(self.serving[(held.kind, held.model)])

    def _admit(self, held: HeldTurn, replica: str) -> None:
        now = self.now
        deadline = now + self.params.turn_timeout_s
        self.turns = self.turns.set(
            held.turn_id,
            TurnState(
                turn_id=held.turn_id,
                run_id=held.run_id,
                replica=replica,
                model=held.model,
                service_class=held.service_class,
                caller=held.caller,
                kind=held.kind,
                dataplane_id=held.dataplane_id,
                admitted_at=now,
                deadline=deadline,
                expect_cached=self._expect_cached(held, replica),
                trace_id=held.trace_id,
            ),
        )
        self.turn_deadlines = _bucket_add(self.turn_deadlines, deadline, held.turn_id)
        self._bump_replica(replica, in_flight=1)
        if held.kind is EndpointKind.GENERATIVE:
            self._count_caller(held.caller, 1)
            if held.run_id not in self.runs:
                # Ended (RunEnded) while this turn was held: serve the turn, keep the counts
                # sound, and forget the run again once its last turn is over.
                self._touch_run(held.run_id, held.service_class, held.caller)
                ended = _run_with(self.runs[held.run_id], ended=True)
                self._put_run(held.run_id, ended)
            run = self.runs.get(held.run_id)
            if run is not None:
                self._release_reservation(run)
                run = self.runs[held.run_id]
                self._put_run(
                    run.run_id,
                    _run_with(
                        run,
                        phase=RunPhase.GENERATING,
                        replica=replica,
                        service_class=held.service_class,
                        caller=held.caller,
                        last_active=now,
                        in_flight=run.in_flight + 1,
                        turns=run.turns + 1,
                        moves=run.moves + (run.replica is not None and run.replica != replica),
                    ),
                )
                self._move_run_held(run.run_id, replica)  # S3: it is generating there now
        self.actions.append(Admit(held.turn_id, replica, now - held.requested_at))

    # ------------------------------------------------------------ turn reports

    def _expect_cached(self, held: HeldTurn, replica: str) -> int:
        """Prefix keeping: a turn taken from its run's pin lane here (the run is back from
        a tool) should find the run's previous prompt on this replica cached."""
        if held.lane != pin_lane(replica):
            return 0
        run = self.runs.get(held.run_id)
        if run is None or run.last_prompt_on != replica:
            return 0
        return run.last_prompt

    def on_abandoned(self, ev: TurnAbandoned) -> None:
        held = self.held.get(ev.turn_id)
        if held is not None:
            self._unhold(held)
            # A held turn was a turn: the idle clock starts now (S10). A single-pass turn
            # never enters run state (S13), even when it names a generative run.
            run = self.runs.get(held.run_id) if held.kind is EndpointKind.GENERATIVE else None
            if run is not None:
                self._put_run(run.run_id, _run_with(run, last_active=self.now))
                self._schedule_run_expiry(held.run_id)
            return
        turn = self.turns.get(ev.turn_id)
        if turn is not None and not turn.started:
            # Admitted but its client left before the engine request: free the slot.
            self.end_turn(ev.turn_id, paused_on_tool=False)

    def on_started(self, ev: TurnStarted) -> None:
        turn = self.turns.get(ev.turn_id)
        if turn is not None and not turn.started:
            self.turns = self.turns.set(ev.turn_id, _turn_with(turn, started=True))

    def on_first_token(self, ev: FirstTokenReceived) -> None:
        turn = self.turns.get(ev.turn_id)
        if turn is not None and turn.first_token_at is None:
            self.turns = self.turns.set(
                ev.turn_id, _turn_with(turn, started=True, first_token_at=self.now)
            )

    def on_finished(self, ev: TurnFinished) -> None:
        turn = self.end_turn(
            ev.turn_id, paused_on_tool=ev.paused_on_tool, prompt_tokens=ev.prompt_tokens
        )
        if turn is not None and self.params.keep_prefixes:
            self._prefix_feedback(turn, ev)

    def on_failed(self, ev: TurnFailed) -> None:
        turn = self.end_turn(ev.turn_id, paused_on_tool=False)
        if turn is not None and ev.replica_unreachable:
            self._set_health(turn.replica, healthy=False)

    def _prefix_feedback(self, turn: TurnState, ev: TurnFinished) -> None:
        """Prefix keeping: a turn back from a tool on a capped replica that found less than
        ``prefix_miss_share`` of its run's previous prompt cached shows the engine's cache
        is over-committed: one slot less (at most one per probe period), and no raise at
        the next probe. Judged only on an engine that reports caching at all. With more
        runs pinned there than the cap (a backlog admitted before the engine first
        queued), a miss blocks the raise but does not lower the cap: that backlog does
        not fit whatever the cap, and lowering it would only slow the backlog down, each
        of its later misses lowering it again."""
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
        if missed and cap is not None and not rep.missed_since_probe and rep.pinned_runs <= cap:
            # One step per probe period, as the raise: misses come in bursts (one
            # over-full moment evicts several paused runs), and each would otherwise
            # take a slot away for the same cause.
            cap = max(1, cap - 1)
        self.replicas = self.replicas.set(
            turn.replica,
            _replica_with(
                rep,
                cap=cap,
                reports_cache=reports_cache,
                prefix_misses=rep.prefix_misses + (1 if missed else 0),
                missed_since_probe=rep.missed_since_probe or missed,
            ),
        )

    def end_turn(
        self, turn_id: str, *, paused_on_tool: bool, prompt_tokens: int = 0
    ) -> TurnState | None:
        """Free an admitted turn's slot and move its run on (D5). ``prompt_tokens``: the
        finished turn's reported prompt, remembered for prefix keeping."""
        turn = self.turns.get(turn_id)
        if turn is None:
            return None
        self.turns = self.turns.delete(turn_id)
        if turn.replica in self.replicas:
            self._bump_replica(turn.replica, in_flight=-1)
        if turn.kind is not EndpointKind.GENERATIVE:
            return turn
        self._count_caller(turn.caller, -1)
        run = self.runs.get(turn.run_id)
        if run is None:
            return turn  # the run ended meanwhile
        in_flight = max(0, run.in_flight - 1)
        if run.ended and in_flight == 0:  # RunEnded arrived while this turn ran
            self._release_reservation(run)
            self._drop_run(run.run_id)
            self._move_run_held(run.run_id, None)
            return turn
        if in_flight > 0:
            phase = RunPhase.GENERATING
        elif paused_on_tool:
            phase = RunPhase.PAUSED_ON_TOOL
        else:
            phase = RunPhase.IDLE
        self._release_reservation(run)
        run = self.runs[turn.run_id]
        reserved_on = None
        if (
            phase is RunPhase.PAUSED_ON_TOOL
            and run.service_class is ServiceClass.INTERACTIVE
            and turn.replica in self.replicas
        ):
            reserved_on = turn.replica  # S4: keep a slot for its return
            self._bump_replica(turn.replica, reserved=1)
        if prompt_tokens > 0:
            run = _run_with(run, last_prompt=prompt_tokens, last_prompt_on=turn.replica)
        self._put_run(
            run.run_id,
            _run_with(
                run,
                phase=phase,
                replica=turn.replica,
                last_active=self.now,
                in_flight=in_flight,
                reserved_on=reserved_on,
            ),
        )
        if phase is RunPhase.IDLE:
            self._move_run_held(run.run_id, None)  # S3: an idle run may move
        self._schedule_run_expiry(run.run_id)
        return turn

    # ------------------------------------------------------------------ runs

    def _touch_run(self, run_id: str, service_class: ServiceClass, caller: str) -> None:
        run = self.runs.get(run_id)
        if run is None:
            run = RunState(
                run_id=run_id,
                phase=RunPhase.IDLE,
                replica=None,
                service_class=service_class,
                caller=caller,
                last_active=self.now,
            )
        else:  # ended=False: a new turn after RunEnded, the run lives on
            run = _run_with(run, caller=caller, last_active=self.now, ended=False)
        self._put_run(run_id, run)
        self._schedule_run_expiry(run_id)

    def _put_run(self, run_id: str, run: RunState) -> None:
        """Every run write goes here, so each replica's count of pinned runs stays true."""
        before = _pinned_to(self.runs.get(run_id))
        self.runs = self.runs.set(run_id, run)
        self._repin(before, _pinned_to(run))

    def _drop_run(self, run_id: str) -> None:
        before = _pinned_to(self.runs.get(run_id))
        self.runs = self.runs.delete(run_id)
        self._repin(before, None)

    def _repin(self, before: str | None, after: str | None) -> None:
        if before == after:
            return
        if before is not None and before in self.replicas:
            self._bump_replica(before, pinned=-1)
        if after is not None and after in self.replicas:
            self._bump_replica(after, pinned=1)

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
        queued = rep.queued_probes
        if ev.running is None or ev.waiting is None:
            cap, queued = None, 0  # S2: a replica that reports no load is not limited
        elif ev.waiting > 0:
            queued += 1
            if queued >= self.params.queue_probes:
                cap = max(1, ev.running)  # the engine keeps a queue: hold the rest ourselves
        else:
            queued = 0
            if (
                cap is not None
                and (
                    # Evidence from the engine only: our own in-flight count may be
                    # high for reasons of ours (a turn reported late, or never).
                    ev.running >= cap
                    # prefix keeping: new runs wait for the cap too
                    or (
                        self.params.keep_prefixes
                        and rep.pinned_runs >= cap
                        and self._new_runs_waiting(rep)
                    )
                )
                and not rep.missed_since_probe  # prefix keeping: the cache is full already
            ):
                cap += self.params.cap_raise_step  # quiet at the cap: probe for more
        self._set_health(ev.replica, healthy=ev.healthy)
        self.replicas = self.replicas.set(
            ev.replica,
            ReplicaState(
                spec=rep.spec,
                healthy=ev.healthy,
                cap=cap,
                in_flight=rep.in_flight,
                reserved=rep.reserved,
                pinned_runs=rep.pinned_runs,
                queued_probes=queued,
                running=ev.running,
                waiting=ev.waiting,
                kv_usage=ev.kv_usage,
                probed_at=self.now,
                reports_cache=rep.reports_cache,
                prefix_misses=rep.prefix_misses,
                missed_since_probe=False,
            ),
        )
        if cap != rep.cap:
            self.dirty.add(ev.replica)

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
        self, name: str, *, in_flight: int = 0, reserved: int = 0, pinned: int = 0
    ) -> None:
        rep = self.replicas[name]
        self.replicas = self.replicas.set(
            name,
            _replica_with(
                rep,
                in_flight=max(0, rep.in_flight + in_flight),
                reserved=max(0, rep.reserved + reserved),
                pinned_runs=max(0, rep.pinned_runs + pinned),
            ),
        )
        if in_flight < 0 or reserved < 0 or pinned < 0:
            self.dirty.add(name)

    def _count_caller(self, caller: str, delta: int) -> None:
        n = self.caller_in_flight.get(caller, 0) + delta
        if n > 0:
            self.caller_in_flight = self.caller_in_flight.set(caller, n)
        elif caller in self.caller_in_flight:
            self.caller_in_flight = self.caller_in_flight.delete(caller)

    # ---------------------------------------------------------------- admission

    def fill_dirty(self) -> None:
        # Admitting may end a reservation elsewhere and so dirty another replica:
        # loop until none is left. Each pass admits or leaves, so this terminates.
        while self.dirty:
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
                held = self._best_held(rep, cls, self._may_start_run(rep, cls))
                if held is not None:
                    self._unhold(held)
                    self._admit(held, name)
                    break
            else:
                return

    def _new_runs_waiting(self, rep: ReplicaState) -> bool:
        """Whether a batch turn of a run new to ``rep`` is held where ``rep`` could take
        it: a free lane of a model it serves, or an unhealthy replica's pin lane."""
        lanes = [free_lane(rep.spec.kind, m) for m in rep.spec.models]
        lanes.extend(pin_lane(u) for u in self.unhealthy if u != rep.spec.name)
        return any((lane, ServiceClass.BATCH) in self.waiting_callers for lane in lanes)

    def _may_start_run(self, rep: ReplicaState, cls: ServiceClass) -> bool:
        """Prefix keeping: a capped replica takes a batch run that is not already there
        only while fewer runs than its cap are pinned there, so the prefixes of the runs
        it serves stay in the engine's cache between their turns."""
        if not self.params.keep_prefixes or rep.cap is None:
            return True
        if cls is ServiceClass.INTERACTIVE:
            return True  # S4: interactive first, new runs included; they are few
        return rep.pinned_runs < rep.cap

    def _best_held(
        self, rep: ReplicaState, cls: ServiceClass, new_runs: bool = True
    ) -> HeldTurn | None:
        """Of the turns ``rep`` may serve in class ``cls``: fewest caller in-flight, then
        (prefix keeping) a turn whose run's prefix is here, then oldest. ``new_runs``:
        whether turns of runs not pinned here may be taken."""
        best: tuple[int, int, int] | None = None
        best_turn: str | None = None
        own = pin_lane(rep.spec.name)
        keep = self.params.keep_prefixes
        lanes = [own]
        if new_runs:
            lanes.extend(free_lane(rep.spec.kind, m) for m in rep.spec.models)
        if new_runs and rep.spec.kind is EndpointKind.GENERATIVE:
            # S3: turns pinned to an unhealthy replica may move here (if we serve the model).
            lanes.extend(pin_lane(name) for name in sorted(self.unhealthy) if name != rep.spec.name)
        for lane in lanes:
            callers = self.waiting_callers.get((lane, cls))
            if callers is None:
                continue
            for caller in callers:
                qkey = (lane, cls, caller)
                first = self.queues[qkey].first()
                if first is None:  # pragma: no cover - empty FIFOs are removed
                    continue
                fifo, _, turn_id = first
                if fifo is not self.queues[qkey]:
                    self.queues = self.queues.set(qkey, fifo)  # keep the hole-skipping
                if self.held[turn_id].model not in rep.spec.models:
                    continue  # a moved turn of another model: not ours to take
                key = (
                    self.caller_in_flight.get(caller, 0),
                    0 if keep and lane == own else 1,
                    self.held[turn_id].seq,
                )
                if best is None or key < best:
                    best, best_turn = key, turn_id
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
                expiry = self.params.run_idle_expiry_s
                if (
                    run is not None
                    and run.in_flight == 0
                    and run_id not in self.held_by_run  # a held turn is a turn (S10)
                    and run.last_active + expiry <= self.now
                ):
                    self.forget_run(run_id)
                    self.actions.append(ForgetRun(run_id))
            self.run_deadlines = self.run_deadlines.delete(second)
        self.swept_until = until

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
            reserved_on = None
            if (
                replica is not None
                and phase is RunPhase.PAUSED_ON_TOOL
                and snap.service_class is ServiceClass.INTERACTIVE
            ):
                reserved_on = replica
                self._bump_replica(replica, reserved=1)
            in_flight = per_run.get(snap.run_id, 0)
            self._put_run(
                snap.run_id,
                RunState(
                    run_id=snap.run_id,
                    phase=phase,
                    replica=replica,
                    service_class=snap.service_class,
                    caller=snap.caller,
                    last_active=self.now,
                    in_flight=in_flight,
                    reserved_on=reserved_on,
                ),
            )
            # S3: turns it has held follow it (the snapshot may pin a run held as idle)
            self._move_run_held(snap.run_id, replica if phase is not RunPhase.IDLE else None)
            self._schedule_run_expiry(snap.run_id)
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
            ),
        )
        self.turn_deadlines = _bucket_add(self.turn_deadlines, deadline, t.turn_id)
        self._bump_replica(t.replica, in_flight=1)
        if rep.spec.kind is not EndpointKind.GENERATIVE:
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
            )
        self._put_run(t.run_id, run)
        self._schedule_run_expiry(t.run_id)


# -------------------------------------------------------------------- helpers

_EMPTY_FIFO = Fifo()
_EMPTY_SET: Map[str, None] = Map()


def _invalid(ev: TurnRequested) -> str | None:
    if not ev.turn_id or len(ev.turn_id) > _MAX_ID:
        return f"turn_id must be 1..{_MAX_ID} characters"
    if not ev.run_id or len(ev.run_id) > _MAX_ID:
        return f"run_id must be 1..{_MAX_ID} characters"
    if not ev.model:
        return "model is required"
    return None


def _has_room(rep: ReplicaState, cls: ServiceClass) -> bool:
    if not rep.healthy:
        return False
    if rep.cap is None:
        return True
    if cls is ServiceClass.INTERACTIVE:
        # An engine that orders its queue by class puts the turn ahead of every batch
        # request it has queued: holding it here could only add a wait.
        return rep.spec.orders_classes or rep.in_flight < rep.cap
    return rep.in_flight + rep.reserved < rep.cap


Buckets = Map[int, Map[str, None]]


def _bucket_add(buckets: Buckets, due: float, key: str) -> Buckets:
    second = int(due) + (0 if due == int(due) else 1)  # ceil: never before it is due
    return buckets.set(second, buckets.get(second, _EMPTY_SET).set(key, None))


def _due(buckets: Buckets, after: int, until: int) -> list[int]:
    """Bucket seconds in (after, until], cheaply whether the gap is small or huge."""
    if until - after <= len(buckets):
        return [s for s in range(after + 1, until + 1) if s in buckets]
    return sorted(s for s in buckets if after < s <= until)


def _held_with(h: HeldTurn, *, lane: Lane | None = None, slot: int = -1) -> HeldTurn:
    """A copy of a held turn in another lane and/or FIFO slot (-1: not yet placed)."""
    return HeldTurn(
        h.turn_id,
        h.run_id,
        h.model,
        h.service_class,
        h.caller,
        h.kind,
        h.dataplane_id,
        h.requested_at,
        h.seq,
        h.lane if lane is None else lane,
        slot,
        h.trace_id,
    )


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
) -> RunState:
    """A copy of ``r`` with some fields changed. Hand-written rather than
    ``dataclasses.replace``, which costs several microseconds per call on this path."""
    return RunState(
        run_id=r.run_id,
        phase=r.phase if isinstance(phase, _Keep) else phase,
        replica=r.replica if isinstance(replica, _Keep) else replica,
        service_class=r.service_class if isinstance(service_class, _Keep) else service_class,
        caller=r.caller if isinstance(caller, _Keep) else caller,
        last_active=r.last_active if isinstance(last_active, _Keep) else last_active,
        in_flight=r.in_flight if isinstance(in_flight, _Keep) else in_flight,
        reserved_on=r.reserved_on if isinstance(reserved_on, _Keep) else reserved_on,
        ended=r.ended if isinstance(ended, _Keep) else ended,
        last_prompt=r.last_prompt if isinstance(last_prompt, _Keep) else last_prompt,
        last_prompt_on=r.last_prompt_on if isinstance(last_prompt_on, _Keep) else last_prompt_on,
        turns=r.turns if isinstance(turns, _Keep) else turns,
        moves=r.moves if isinstance(moves, _Keep) else moves,
    )


def _pinned_to(run: RunState | None) -> str | None:
    """The replica a run is pinned to (S3): generating or paused there."""
    if run is None or run.phase is RunPhase.IDLE:
        return None
    return run.replica


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
) -> ReplicaState:
    """A copy of ``rep`` with some counters changed (hand-written, as ``_run_with``)."""
    return ReplicaState(
        spec=rep.spec,
        healthy=rep.healthy if isinstance(healthy, _Keep) else healthy,
        cap=rep.cap if isinstance(cap, _Keep) else cap,
        in_flight=rep.in_flight if isinstance(in_flight, _Keep) else in_flight,
        reserved=rep.reserved if isinstance(reserved, _Keep) else reserved,
        pinned_runs=rep.pinned_runs if isinstance(pinned_runs, _Keep) else pinned_runs,
        queued_probes=rep.queued_probes,
        running=rep.running,
        waiting=rep.waiting,
        kv_usage=rep.kv_usage,
        probed_at=rep.probed_at,
        reports_cache=rep.reports_cache if isinstance(reports_cache, _Keep) else reports_cache,
        prefix_misses=rep.prefix_misses if isinstance(prefix_misses, _Keep) else prefix_misses,
        missed_since_probe=(
            rep.missed_since_probe if isinstance(missed_since_probe, _Keep) else missed_since_probe
        ),
    )


def _turn_with(t: TurnState, *, started: bool, first_token_at: float | None = None) -> TurnState:
    return TurnState(
        turn_id=t.turn_id,
        run_id=t.run_id,
        replica=t.replica,
        model=t.model,
        service_class=t.service_class,
        caller=t.caller,
        kind=t.kind,
        dataplane_id=t.dataplane_id,
        admitted_at=t.admitted_at,
        deadline=t.deadline,
        started=started,
        first_token_at=first_token_at if first_token_at is not None else t.first_token_at,
        expect_cached=t.expect_cached,
        trace_id=t.trace_id,
    )
