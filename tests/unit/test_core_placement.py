"""Placement (``scheduler/core/placement.py``; S2, S3, S4, S9, B5, B7): each filter on its
own and inside the pick, the score's order, ties rotating with arrivals, the pinned-lane
and last-replica rules, and Hypothesis properties that the fused pick equals a
brute-force reference (the least ``score`` among the replicas passing every filter of
``filters``) and that ``has_room`` is the conjunction of its filters."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from immutables import Map

from luftpause.scheduler.core import (
    EndpointKind,
    Params,
    ReplicaSpec,
    RunPhase,
    ServiceClass,
    WorkingSet,
)
from luftpause.scheduler.core import placement as pl
from luftpause.scheduler.core.state import ReplicaState, RunState, free_lane, pin_lane

GEN = EndpointKind.GENERATIVE
SP = EndpointKind.SINGLE_PASS
INT = ServiceClass.INTERACTIVE
BAT = ServiceClass.BATCH
PARAMS = Params()  # prefix keeping on, working-set admission off
WSET = replace(PARAMS, working_set=WorkingSet.BOTH, working_set_share=0.5)
FREE = free_lane(GEN, "m")
NO_UNHEALTHY: Map[str, None] = Map()


def rep(name: str = "r0", orders_classes: bool = False, **kw: object) -> ReplicaState:
    spec = ReplicaSpec(name, GEN, frozenset({"m"}), orders_classes=orders_classes)
    return replace(ReplicaState(spec=spec, healthy=True), **kw)  # type: ignore[arg-type]


def pool(*reps: ReplicaState) -> tuple[dict[str, ReplicaState], tuple[str, ...]]:
    return {r.spec.name: r for r in reps}, tuple(r.spec.name for r in reps)


def pick(
    *reps: ReplicaState,
    cls: ServiceClass = BAT,
    params: Params = PARAMS,
    kind: EndpointKind = GEN,
    seq: int = 1,
) -> str | None:
    replicas, names = pool(*reps)
    return pl.least_loaded(replicas, names, params, kind, cls, seq)


# A replica that scores best (no run lives there, nothing in flight) but for the one
# property a filter reads, beside a busier one that passes every filter.
BUSY = rep("busy", pinned_runs=3, in_flight=2)


# ------------------------------------------------------------------ each filter


def test_healthy_rejects_an_unhealthy_replica() -> None:
    """S9: an unhealthy replica takes no turn, however idle."""
    sick = rep("idle", healthy=False)
    assert not pl.healthy(sick) and pl.healthy(rep())
    assert pick(sick, BUSY) == "busy"
    assert pick(sick, BUSY, cls=INT) == "busy"
    assert pick(sick) is None


def test_under_pace_limit_rejects_a_paced_replica_for_batch_only() -> None:
    """B7: batch turns at the target's limit while an interactive run lives there (a
    reservation) leave no room for another batch turn; an interactive turn still fits,
    and the same limit with no interactive run there limits nothing."""
    paced = rep("idle", pace_cap=1, batch_in_flight=1, in_flight=1, reserved=1)
    assert not pl.under_pace_limit(paced)
    assert pl.under_pace_limit(replace(paced, reserved=0))  # no interactive run there
    assert pick(paced, BUSY) == "busy"
    assert pick(paced, BUSY, cls=INT) == "idle"
    assert pick(replace(paced, reserved=0), BUSY) == "idle"


def test_room_by_cap_rejects_a_full_replica_by_class() -> None:
    """S2, S4: a batch turn needs the cap over turns in flight plus reservations; an
    interactive turn the cap over turns in flight, or none where the engine orders its
    queue by class."""
    reserved_full = rep("idle", cap=2, run_limit=2, in_flight=1, reserved=1)
    assert not pl.room_by_cap(reserved_full, BAT) and pl.room_by_cap(reserved_full, INT)
    assert pick(reserved_full, BUSY) == "busy"
    assert pick(reserved_full, BUSY, cls=INT) == "idle"
    full = rep("idle", cap=2, run_limit=2, in_flight=2)
    assert not pl.room_by_cap(full, INT)
    assert pick(full, BUSY, cls=INT) == "busy"
    ordered = rep("idle", orders_classes=True, cap=2, run_limit=2, in_flight=2)
    assert pl.room_by_cap(ordered, INT) and not pl.room_by_cap(ordered, BAT)
    assert pick(ordered, BUSY, cls=INT) == "idle"
    assert pick(ordered, BUSY) == "busy"
    assert pl.room_by_cap(rep("idle", in_flight=99), BAT)  # no cap: not limited


def test_under_run_limit_rejects_new_batch_runs_at_the_run_limit() -> None:
    """Prefix keeping: a replica where as many runs live as its run limit takes no new
    batch run, though it has slots; interactive turns, single-pass turns, prefix keeping
    off and working-set admission REPLACE are not limited by it."""
    at_limit = rep("idle", cap=8, run_limit=2, pinned_runs=2)
    busier = rep("busy", pinned_runs=3, in_flight=2)
    assert not pl.under_run_limit(at_limit)
    assert pl.under_run_limit(replace(at_limit, run_limit=3))
    assert pick(at_limit, busier) == "busy"
    assert pick(at_limit, busier, cls=INT) == "idle"
    assert pick(at_limit, busier, kind=SP) == "idle"
    assert pick(at_limit, busier, params=replace(PARAMS, keep_prefixes=False)) == "idle"
    replace_mode = replace(PARAMS, working_set=WorkingSet.REPLACE)
    assert pick(at_limit, busier, params=replace_mode) == "idle"


def test_working_set_admits_rejects_a_replica_whose_pool_is_taken() -> None:
    """B5: with working-set admission on, a replica whose runs' contexts plus a new run's
    estimate exceed the share of its pool takes no new batch run."""
    crowded = rep("idle", kv_tokens=10_000, pinned_runs=1, ws_tokens=4000, ws_known=1)
    busier = rep("busy", pinned_runs=2, in_flight=2)
    assert not pl.working_set_admits(crowded, WSET)  # 4000 + 4000 > 0.5 x 10000
    assert pl.working_set_admits(crowded, replace(WSET, working_set_share=0.8))
    assert pick(crowded, busier, params=WSET) == "busy"
    assert pick(crowded, busier, params=PARAMS) == "idle"  # the option off
    assert pick(crowded, busier, params=WSET, cls=INT) == "idle"


def test_filters_compose_from_the_turn_and_params() -> None:
    """The filters that apply: every turn is filtered by health and the cap; batch by
    the pace limit; a generative batch turn (a new run) by the run limit unless
    working-set admission replaces it, and by the working set where that is on."""

    def names(params: Params, kind: EndpointKind, cls: ServiceClass) -> list[str]:
        return [getattr(f, "func", f).__name__ for f in pl.filters(params, kind, cls)]

    assert names(PARAMS, GEN, INT) == ["healthy", "room_by_cap"]
    assert names(PARAMS, SP, BAT) == ["healthy", "under_pace_limit", "room_by_cap"]
    assert names(PARAMS, GEN, BAT) == [
        "healthy",
        "under_pace_limit",
        "room_by_cap",
        "under_run_limit",
    ]
    assert names(WSET, GEN, BAT)[-2:] == ["under_run_limit", "working_set_admits"]
    replace_mode = replace(PARAMS, working_set=WorkingSet.REPLACE)
    assert names(replace_mode, GEN, BAT)[-2:] == ["room_by_cap", "working_set_admits"]
    no_keep = replace(PARAMS, keep_prefixes=False)
    assert names(no_keep, GEN, BAT)[-1] == "room_by_cap"


# ------------------------------------------------------------------ score and pick


def test_the_score_orders_by_runs_living_there_then_load_then_rotation() -> None:
    """S3 placement: fewer runs living there wins over fewer turns in flight; with as
    many runs, fewer turns in flight plus reservations wins."""
    assert pl.score(rep(pinned_runs=1, in_flight=5), 1) < pl.score(rep(pinned_runs=2), 0)
    assert pl.score(rep(in_flight=1), 2) < pl.score(rep(in_flight=1, reserved=1), 0)
    few_runs = rep("a", pinned_runs=1, in_flight=5)
    many_runs = rep("b", pinned_runs=2, in_flight=0)
    assert pick(many_runs, few_runs) == "a"
    reserved = rep("a", pinned_runs=1, in_flight=1, reserved=1)
    loaded_less = rep("b", pinned_runs=1, in_flight=1)
    assert pick(reserved, loaded_less) == "b"


def test_ties_rotate_with_the_arrival_order() -> None:
    """Equal replicas take successive arrivals in turn, each once per round."""
    reps = tuple(rep(f"r{i}") for i in range(4))
    picks = [pick(*reps, seq=seq) for seq in range(1, 9)]
    assert sorted(picks[:4]) == ["r0", "r1", "r2", "r3"]
    assert picks[4:] == picks[:4]
    # and the rotation decides only ties: a less loaded replica wins on any arrival
    loaded = tuple(replace(r, in_flight=1) if r.spec.name != "r2" else r for r in reps)
    assert {pick(*loaded, seq=seq) for seq in range(1, 9)} == {"r2"}


# ------------------------------------------------------------------ the rules


def _run(replica: str | None, phase: RunPhase = RunPhase.IDLE) -> RunState:
    return RunState("run", phase, replica, BAT, "c", 0.0)


def test_the_pinned_lane_rule_binds_a_turn_to_its_healthy_replica() -> None:
    """S3: a turn in a healthy replica's pin lane goes there if it has room, else it is
    held, even with another replica idle; pinned to an unhealthy replica it moves."""
    home = rep("home", cap=1, run_limit=1, in_flight=1, pinned_runs=1)
    idle = rep("idle")
    replicas, names = pool(home, idle)
    run = _run("home", RunPhase.GENERATING)
    lane = pin_lane("home")
    assert pl.pinned_lane_rule(lane, NO_UNHEALTHY) == "home"
    assert pl.place(replicas, NO_UNHEALTHY, PARAMS, run, names, GEN, BAT, lane, 1) is None
    roomy = {**replicas, "home": replace(home, cap=2, run_limit=2)}
    assert pl.place(roomy, NO_UNHEALTHY, PARAMS, run, names, GEN, BAT, lane, 1) == "home"
    down = Map({"home": None})
    sick = {**replicas, "home": replace(home, healthy=False)}
    assert pl.pinned_lane_rule(lane, down) is None
    assert pl.place(sick, down, PARAMS, run, names, GEN, BAT, lane, 1) == "idle"


def test_last_replica_first_while_it_has_room_and_may_start_the_run() -> None:
    """A free turn of a known run goes back to its last replica (its prefix may be
    cached there) over a less loaded one, unless that has no room or is at its run
    limit; a replica not serving the model is no last replica."""
    last = rep("last", cap=4, run_limit=4, pinned_runs=2, in_flight=2)
    idle = rep("idle")
    replicas, names = pool(last, idle)
    run = _run("last")
    assert pl.last_replica_first(replicas, run, names, BAT, PARAMS) == "last"
    assert pl.place(replicas, NO_UNHEALTHY, PARAMS, run, names, GEN, BAT, FREE, 1) == "last"
    at_limit = {**replicas, "last": replace(last, run_limit=4, pinned_runs=4)}
    assert pl.last_replica_first(at_limit, run, names, BAT, PARAMS) is None
    assert pl.place(at_limit, NO_UNHEALTHY, PARAMS, run, names, GEN, BAT, FREE, 1) == "idle"
    full = {**replicas, "last": replace(last, in_flight=4)}
    assert pl.place(full, NO_UNHEALTHY, PARAMS, run, names, GEN, BAT, FREE, 1) == "idle"
    assert pl.last_replica_first(replicas, run, ("idle",), BAT, PARAMS) is None
    assert pl.place(replicas, NO_UNHEALTHY, PARAMS, None, names, GEN, BAT, FREE, 1) == "idle"


def test_may_start_run_gates_only_batch_runs_new_to_the_replica() -> None:
    """Prefix keeping's run limit and working-set admission gate a batch run's start
    (by the mode), never an interactive one."""
    at_limit = rep(cap=4, run_limit=2, pinned_runs=2, kv_tokens=10**6)
    assert not pl.may_start_run(at_limit, BAT, PARAMS)
    assert pl.may_start_run(at_limit, INT, PARAMS)
    assert pl.may_start_run(at_limit, BAT, replace(PARAMS, keep_prefixes=False))
    assert pl.may_start_run(at_limit, BAT, replace(PARAMS, working_set=WorkingSet.REPLACE))
    assert not pl.may_start_run(at_limit, BAT, WSET)
    crowded = rep(kv_tokens=10_000, pinned_runs=1, ws_tokens=9000, ws_known=1)
    assert not pl.may_start_run(crowded, BAT, replace(WSET, working_set=WorkingSet.REPLACE))
    assert pl.may_start_run(crowded, INT, WSET)


# ------------------------------------------------------------------ properties


@st.composite
def replica_states(draw: st.DrawFn, name: str) -> ReplicaState:
    """A replica record as the core keeps them: the run limit is None exactly while the
    cap is, and never below it (``invariants.py``)."""
    cap = draw(st.none() | st.integers(1, 4))
    run_limit = None if cap is None else cap + draw(st.integers(0, 3))
    in_flight = draw(st.integers(0, 5))
    batch_in_flight = draw(st.integers(0, in_flight))
    pinned = draw(st.integers(0, 5))
    known = draw(st.integers(0, pinned))
    return rep(
        name,
        orders_classes=draw(st.booleans()),
        healthy=draw(st.booleans() | st.just(True)),
        cap=cap,
        run_limit=run_limit,
        in_flight=in_flight,
        batch_in_flight=batch_in_flight,
        reserved=draw(st.integers(0, 2)),
        pinned_runs=pinned,
        pace_cap=draw(st.none() | st.integers(1, 3)),
        kv_tokens=draw(st.none() | st.sampled_from([2000, 8000, 30_000])),
        kv_usage=draw(st.none() | st.floats(0, 1)),
        ws_tokens=draw(st.integers(0, 4000)) * known,
        ws_known=known,
    )


@st.composite
def params_(draw: st.DrawFn) -> Params:
    return replace(
        PARAMS,
        keep_prefixes=draw(st.booleans()),
        working_set=draw(st.sampled_from(WorkingSet)),
        working_set_share=draw(st.sampled_from([0.3, 0.6, 0.9])),
        working_set_kv_usage=draw(st.none() | st.floats(0.1, 0.9)),
    )


@st.composite
def pools(draw: st.DrawFn) -> list[ReplicaState]:
    n = draw(st.integers(1, 7))
    return [draw(replica_states(f"r{i}")) for i in range(n)]


@settings(max_examples=400, deadline=None)
@given(
    reps=pools(),
    params=params_(),
    kind=st.sampled_from(EndpointKind),
    cls=st.sampled_from(ServiceClass),
    seq=st.integers(0, 50),
)
def test_the_pick_is_the_least_score_among_replicas_passing_every_filter(
    reps: list[ReplicaState],
    params: Params,
    kind: EndpointKind,
    cls: ServiceClass,
    seq: int,
) -> None:
    """S2, S3, S4, S9, B5, B7: ``least_loaded`` (filters and score inlined) picks what
    the brute-force reference picks: the least ``score`` over the replicas that pass
    every filter ``filters`` names for the turn."""
    replicas, names = pool(*reps)
    checks = pl.filters(params, kind, cls)
    n = len(names)
    passing = [
        (pl.score(replicas[name], pl.rotation(i, n, seq)), name)
        for i, name in enumerate(names)
        if all(f(replicas[name]) for f in checks)
    ]
    want = min(passing)[1] if passing else None
    assert pl.least_loaded(replicas, names, params, kind, cls, seq) == want


@settings(max_examples=300, deadline=None)
@given(r=replica_states("r0"), cls=st.sampled_from(ServiceClass))
def test_has_room_is_health_the_pace_limit_and_room_by_cap(
    r: ReplicaState, cls: ServiceClass
) -> None:
    """S2, S4, S9, B7: ``has_room`` (inlined for ``_fill``) is the conjunction of the
    filters every turn passes, whether or not its run lives on the replica."""
    want = pl.healthy(r) and (cls is INT or pl.under_pace_limit(r)) and pl.room_by_cap(r, cls)
    assert pl.has_room(r, cls) == want
