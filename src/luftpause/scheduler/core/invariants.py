"""Recompute every derived counter from scratch and compare (for tests).

``decide`` maintains counters incrementally for speed; this module is the slow,
obviously-correct definition they must always agree with.
"""

from __future__ import annotations

from luftpause.scheduler.core import order
from luftpause.scheduler.core.state import State
from luftpause.scheduler.core.types import EndpointKind, RunPhase, ServiceClass


def over_limit(state: State) -> list[str]:
    """Accounts with more generative turns in flight than their ``max_in_flight`` (B13).
    Never, unless a dataplane's resync handed the scheduler turns admitted before it
    (re-adopted turns are counted, not refused)."""
    totals: dict[str, int] = {}
    for t in state.turns.values():
        if t.kind is EndpointKind.GENERATIVE:
            name = order.account(t.caller)
            totals[name] = totals.get(name, 0) + 1
    return [
        f"caller {name} has {n} turns in flight, over its limit of {limit}"
        for name, n in sorted(totals.items())
        if (limit := order.in_flight_limit(state.params, name)) is not None and n > limit
    ]


def violations(state: State) -> list[str]:
    """Every way ``state`` disagrees with its own definition; empty when sound."""
    problems: list[str] = []
    in_flight: dict[str, int] = {}
    batch: dict[str, int] = {}
    callers: dict[str, int] = {}
    run_turns: dict[str, int] = {}
    for t in state.turns.values():
        in_flight[t.replica] = in_flight.get(t.replica, 0) + 1
        if t.kind is EndpointKind.GENERATIVE:
            callers[t.caller] = callers.get(t.caller, 0) + 1
            run_turns[t.run_id] = run_turns.get(t.run_id, 0) + 1
            if t.service_class is ServiceClass.BATCH:
                batch[t.replica] = batch.get(t.replica, 0) + 1
    reserved: dict[str, int] = {}
    for r in state.runs.values():
        if r.reserved_on is not None:
            reserved[r.reserved_on] = reserved.get(r.reserved_on, 0) + 1
            if r.phase is not RunPhase.PAUSED_ON_TOOL:
                problems.append(f"run {r.run_id} holds a reservation while {r.phase.value}")
            if r.service_class is not ServiceClass.INTERACTIVE:
                problems.append(f"batch run {r.run_id} holds a reservation")
            if r.lapsed:
                problems.append(f"lapsed run {r.run_id} holds a reservation")
        if r.lapsed and (r.phase is not RunPhase.PAUSED_ON_TOOL or r.in_flight > 0):
            problems.append(f"run {r.run_id} lapsed while {r.phase.value}")
        if r.in_flight != run_turns.get(r.run_id, 0):
            problems.append(
                f"run {r.run_id} counts {r.in_flight} turns, has {run_turns.get(r.run_id, 0)}"
            )
        if r.in_flight > 0 and r.phase is not RunPhase.GENERATING:
            problems.append(f"run {r.run_id} has turns in flight but is {r.phase.value}")
    pinned: dict[str, int] = {}
    ws: dict[str, tuple[int, int]] = {}  # working sets: known tokens, runs with one
    for r in state.runs.values():
        if r.phase is not RunPhase.IDLE and r.replica is not None and not r.lapsed:
            pinned[r.replica] = pinned.get(r.replica, 0) + 1
            tokens, known = ws.get(r.replica, (0, 0))
            ws[r.replica] = (tokens + r.last_prompt, known + (1 if r.last_prompt > 0 else 0))
    for name, rep in state.replicas.items():
        if (rep.cap is None) != (rep.run_limit is None) or (
            rep.cap is not None and rep.run_limit is not None and rep.run_limit < rep.cap
        ):
            problems.append(f"replica {name}: run limit {rep.run_limit} under cap {rep.cap}")
        if rep.pinned_runs != pinned.get(name, 0):
            problems.append(
                f"replica {name} counts {rep.pinned_runs} pinned runs, has {pinned.get(name, 0)}"
            )
        if (rep.ws_tokens, rep.ws_known) != ws.get(name, (0, 0)):
            problems.append(
                f"replica {name} counts a working set of {rep.ws_tokens} tokens in "
                f"{rep.ws_known} runs, has {ws.get(name, (0, 0))}"
            )
        if rep.in_flight != in_flight.get(name, 0):
            problems.append(
                f"replica {name} counts {rep.in_flight} in flight, has {in_flight.get(name, 0)}"
            )
        if rep.batch_in_flight != batch.get(name, 0):
            problems.append(
                f"replica {name} counts {rep.batch_in_flight} batch in flight, "
                f"has {batch.get(name, 0)}"
            )
        if rep.reserved != reserved.get(name, 0):
            problems.append(
                f"replica {name} counts {rep.reserved} reserved, has {reserved.get(name, 0)}"
            )
    if dict(state.caller_in_flight.items()) != callers:
        problems.append(f"caller counts {dict(state.caller_in_flight.items())} != {callers}")
    subs: dict[str, int] = {}
    for caller, n in callers.items():
        if "/" in caller:
            name = order.account(caller)
            subs[name] = subs.get(name, 0) + n
    if dict(state.sub_in_flight.items()) != subs:
        problems.append(f"sub-caller counts {dict(state.sub_in_flight.items())} != {subs}")
    queued = 0
    for (lane, cls, caller), fifo in state.queues.items():
        for slot, turn_id in fifo.items.items():
            held = state.held.get(turn_id)
            if held is None or held.slot != slot or held.lane != lane:
                problems.append(f"queue {lane}/{cls.value}/{caller} slot {slot} is stale")
            elif (
                order.queue_caller(held.caller, held.tier) != caller
                or held.service_class is not cls
            ):
                problems.append(f"held turn {turn_id} is in the wrong queue")
            queued += 1
        if caller not in state.waiting_callers.get((lane, cls), {}):
            problems.append(f"caller {caller} missing from waiting set of {lane}/{cls.value}")
    if queued != len(state.held):
        problems.append(f"{len(state.held)} held turns but {queued} queued")
    by_run: dict[str, set[str]] = {}
    for h in state.held.values():
        if h.kind is EndpointKind.GENERATIVE:
            by_run.setdefault(h.run_id, set()).add(h.turn_id)
    indexed = {run: set(turns) for run, turns in state.held_by_run.items()}
    if indexed != by_run:
        problems.append(f"held_by_run {indexed} != held turns by run {by_run}")
    for r in state.runs.values():
        if r.ended and r.in_flight == 0:
            problems.append(f"ended run {r.run_id} lingers with no turn in flight")
    for t in state.turns.values():
        if t.kind is EndpointKind.GENERATIVE and t.run_id not in state.runs:
            problems.append(f"turn {t.turn_id} belongs to unknown run {t.run_id}")
    for name, rep in state.replicas.items():
        if rep.spec.kind is EndpointKind.GENERATIVE and (name in state.unhealthy) == rep.healthy:
            problems.append(f"replica {name}: unhealthy index disagrees with its health")
    for turn_id in state.held:
        if turn_id in state.turns:
            problems.append(f"turn {turn_id} is both held and admitted")
    # membership: a replica that left serves nothing; a drained one past its time takes
    # no turn (it counts as unhealthy)
    for (kind, model), names in state.serving.items():
        for name in names:
            if name not in state.replicas or name in state.left:
                problems.append(f"{name} serves {kind.value} {model} but is gone or leaving")
    for name in state.left:
        if name not in state.draining:
            problems.append(f"replica {name} left but is not draining")
    for name, until in state.draining.items():
        drained = state.replicas.get(name)
        if drained is None:
            problems.append(f"draining replica {name} is unknown")
        elif until <= state.now and drained.healthy:
            problems.append(f"replica {name} drained at {until} still takes turns")
    return problems
