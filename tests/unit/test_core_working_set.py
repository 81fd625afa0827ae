"""Working-set admission (B5, S3, S4; ``scheduler/core/working_set.py``): the rule on its
own, through ``decide`` in each mode, the incremental sums against a from-scratch
recomputation over arbitrary histories, liveness with the option on, and its effect in
the simulator."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from luftpause.fakes.engine.model import EngineParams
from luftpause.measure.mix import Group
from luftpause.scheduler.core import (
    Action,
    Admit,
    ClockTicked,
    DataplaneResynced,
    EndpointKind,
    Params,
    ReplicaProbed,
    ReplicaSpec,
    RunEnded,
    RunPhase,
    RunSnapshot,
    ServiceClass,
    State,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
    TurnRequested,
    TurnStarted,
    WorkingSet,
    decide,
    initial_state,
)
from luftpause.scheduler.core import working_set as ws
from luftpause.scheduler.core.events import Event
from luftpause.scheduler.core.invariants import violations
from luftpause.scheduler.core.state import ReplicaState
from luftpause.scheduler.core.view import status
from luftpause.sim.run import SimConfig, simulate

GEN = EndpointKind.GENERATIVE
INT = ServiceClass.INTERACTIVE
BAT = ServiceClass.BATCH
SPEC = ReplicaSpec("r0", GEN, frozenset({"m"}))
# no cap, no decode pace: only the working set (and, where asked, the run limit) gates
PARAMS = Params(
    initial_cap=None,
    interactive_pace_s=None,
    working_set=WorkingSet.REPLACE,
    working_set_share=0.5,
)


def rep(**kw: object) -> ReplicaState:
    return replace(ReplicaState(spec=SPEC, healthy=True), **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the rule


def test_the_rule_admits_while_the_working_set_and_the_estimate_fit_the_share() -> None:
    """B5: known contexts plus a run without one at their mean, plus the new run's
    estimate (the same mean), against ``working_set_share`` x the pool."""
    # two runs live there: one known at 3000 tokens, one whose first turn runs
    r = rep(kv_tokens=20_000, pinned_runs=2, ws_tokens=3000, ws_known=1)
    assert ws.estimate(r) == 3000
    assert ws.working_set(r) == 6000
    assert ws.admits(r, replace(PARAMS, working_set_share=0.45))  # 9000 <= 9000
    assert not ws.admits(r, replace(PARAMS, working_set_share=0.44))  # 9000 > 8800


def test_an_unknown_pool_or_an_empty_replica_is_not_limited() -> None:
    """B5: no pool reported: not limited; no run living there: a new run always starts,
    even one the pool could not hold (nothing there to protect)."""
    full = rep(kv_tokens=None, pinned_runs=5, ws_tokens=10**9, ws_known=5)
    assert ws.admits(full, PARAMS)
    empty = rep(kv_tokens=100, pinned_runs=0, kv_usage=0.99)
    assert ws.admits(empty, replace(PARAMS, working_set_kv_usage=0.5))


def test_the_engines_kv_usage_gates_too_when_a_threshold_is_set() -> None:
    """B5: with ``working_set_kv_usage``, a replica whose engine reported that much of its
    pool in use takes no new batch run, whatever the working set."""
    r = rep(kv_tokens=100_000, pinned_runs=1, ws_tokens=100, ws_known=1, kv_usage=0.85)
    assert ws.admits(r, PARAMS)
    assert not ws.admits(r, replace(PARAMS, working_set_kv_usage=0.8))
    assert ws.admits(replace(r, kv_usage=0.5), replace(PARAMS, working_set_kv_usage=0.8))


# -------------------------------------------------------------- through decide


class Core:
    def __init__(self, params: Params, kv_tokens: int | None = 10_000) -> None:
        self.state: State = initial_state((SPEC,), params)
        self.t = 0.0
        self.kv_tokens = kv_tokens
        self.probe()

    def feed(self, ev: Event) -> tuple[Action, ...]:
        self.state, actions = decide(self.state, ev)
        assert violations(self.state) == []
        return actions

    def probe(self, kv_usage: float = 0.1, running: int = 0, waiting: int = 0) -> set[str]:
        self.t += 1
        ev = ReplicaProbed(self.t, "r0", True, running, waiting, kv_usage, self.kv_tokens)
        return admitted(self.feed(ev))

    def req(self, turn: str, run: str, cls: ServiceClass = BAT) -> set[str]:
        self.t += 1
        return admitted(self.feed(TurnRequested(self.t, turn, run, "m", cls, caller=run)))

    def fin(self, turn: str, prompt: int, paused: bool = True) -> set[str]:
        self.t += 1
        self.feed(TurnStarted(self.t, turn))
        ev = TurnFinished(self.t, turn, paused_on_tool=paused, prompt_tokens=prompt)
        return admitted(self.feed(ev))


def admitted(actions: tuple[Action, ...]) -> set[str]:
    return {a.turn_id for a in actions if isinstance(a, Admit)}


def test_a_new_batch_run_waits_while_the_runs_living_there_fill_the_share() -> None:
    """B5, S3, S4: a run paused on a tool with a 4,000-token context leaves no room for
    another of its size in half a 10,000-token pool: a new batch run is held, an
    interactive one is not, the living run's next turn is not; when that run goes idle,
    the held run starts. Off, the same history starts it at once."""
    core = Core(PARAMS)
    assert core.req("a1", "a") == {"a1"}
    core.fin("a1", 4000)
    assert ws.working_set(core.state.replicas["r0"]) == 4000
    assert core.req("b1", "b") == set()  # 4000 + 4000 > 5000
    assert core.req("c1", "c", INT) == {"c1"}  # S4: interactive is never gated
    assert core.req("a2", "a") == {"a2"}  # its own run's turn: already lives there
    assert core.fin("a2", 4100, paused=False) == {"b1"}  # a idle: its share frees
    off = Core(replace(PARAMS, working_set=WorkingSet.OFF))
    off.req("a1", "a")
    off.fin("a1", 4000)
    assert off.req("b1", "b") == {"b1"}


def test_replace_starts_runs_past_the_run_limit_and_both_does_not() -> None:
    """B5 vs prefix keeping: with a cap of 1 (and so a run limit of 1) and a run paused
    there, a new batch run is held by the run limit; ``REPLACE`` starts it because the
    working set fits, ``BOTH`` and ``OFF`` hold it."""
    capped = replace(PARAMS, initial_cap=1, working_set_share=0.9)
    got = {}
    for mode in WorkingSet:
        core = Core(replace(capped, working_set=mode))
        core.req("a1", "a")
        core.fin("a1", 1000)
        rep0 = core.state.replicas["r0"]
        assert (rep0.cap, rep0.run_limit, rep0.pinned_runs) == (1, 1, 1)
        got[mode] = core.req("b1", "b")
    assert got == {WorkingSet.OFF: set(), WorkingSet.REPLACE: {"b1"}, WorkingSet.BOTH: set()}


def test_a_probe_that_shows_room_admits_held_new_runs() -> None:
    """B5: a held new run starts at the probe that reports the pool it fits in, and at the
    probe whose KV usage falls below the threshold."""
    core = Core(replace(PARAMS, working_set_kv_usage=0.8), kv_tokens=1000)
    core.req("a1", "a")
    core.fin("a1", 2000)
    assert core.req("b1", "b") == set()
    core.kv_tokens = 100_000
    assert core.probe(kv_usage=0.9) == set()  # the pool fits it, the engine is full
    assert core.probe(kv_usage=0.5) == {"b1"}
    view = status(core.state, core.t)["replicas"][0]
    assert view["kv_tokens"] == 100_000
    assert view["working_set_tokens"] == 4000  # a at 2000, b (no turn ended) at the mean


def test_one_run_larger_than_the_pool_starts_and_holds_new_runs_only_while_it_lives() -> None:
    """B5, S10 (tool leases): a run whose context alone exceeds the pool starts on an empty
    replica; new batch runs wait while it lives there, and start when its pause outlives
    its lease (it lapses: it no longer lives there), so none starves behind it."""
    core = Core(PARAMS, kv_tokens=1000)
    assert core.req("a1", "a") == {"a1"}
    core.fin("a1", 50_000)
    assert core.req("b1", "b") == set()
    core.t += PARAMS.tool_lease_default_s - 2
    assert admitted(core.feed(ClockTicked(core.t))) == set()  # within its lease
    core.t += 4  # past the default lease of a tool no run came back from
    assert admitted(core.feed(ClockTicked(core.t))) == {"b1"}
    assert core.state.runs["a"].lapsed


# ------------------------------------------------------------------ properties

_turns = st.sampled_from([f"t{i}" for i in range(6)])
_runs = st.sampled_from(["a", "b", "c", "d"])
_replicas = st.sampled_from(["r0", "r1"])
_steps = st.one_of(
    st.tuples(st.just("req"), _turns, _runs, st.sampled_from([INT, BAT])),
    # a turn of a run that is admitted at once ends (paused or not) with a prompt
    st.tuples(st.just("round"), _runs, st.booleans(), st.integers(0, 9000)),
    st.tuples(st.just("fin"), _turns, st.booleans(), st.integers(0, 9000)),
    st.tuples(st.just("abandon"), _turns),
    st.tuples(st.just("fail"), _turns),
    st.tuples(st.just("end"), _runs),
    st.tuples(
        st.just("probe"),
        _replicas,
        st.booleans(),
        st.one_of(st.none(), st.integers(0, 3)),
        st.one_of(st.none(), st.integers(1000, 30_000)),
        st.floats(0, 1),
    ),
    st.tuples(st.just("tick"), st.floats(0, 400)),
    st.tuples(
        st.just("resync"),
        st.lists(
            st.tuples(
                _runs, st.booleans(), st.sampled_from(list(RunPhase)), _replicas, st.booleans()
            ),
            max_size=3,
        ),
    ),
)
POOL = (SPEC, ReplicaSpec("r1", GEN, frozenset({"m"})))


def event(step: tuple[object, ...], t: float, state: State) -> Event:
    kind = step[0]
    if kind == "req":
        _, turn, run, cls = step
        return TurnRequested(t, str(turn), str(run), "m", cls, caller=str(run))  # type: ignore[arg-type]
    if kind == "fin":
        _, turn, paused, prompt = step
        return TurnFinished(t, str(turn), paused_on_tool=bool(paused), prompt_tokens=int(prompt))  # type: ignore[call-overload]
    if kind == "abandon":
        return TurnAbandoned(t, str(step[1]))
    if kind == "fail":
        return TurnFailed(t, str(step[1]))
    if kind == "end":
        return RunEnded(t, str(step[1]))
    if kind == "probe":
        _, name, healthy, load, pool, usage = step
        n = None if load is None else int(load)  # type: ignore[call-overload]
        return ReplicaProbed(t, str(name), bool(healthy), n, n, float(usage), pool)  # type: ignore[arg-type]
    if kind == "tick":
        return ClockTicked(t)
    snaps = []
    for run_id, as_known, phase, replica, interactive in step[1]:  # type: ignore[attr-defined]
        known = state.runs.get(run_id)
        if as_known and known is not None and known.replica is not None:
            # the dataplane's view of a run the core knows (its prompt is not in it)
            phase, replica = known.phase, known.replica
        snaps.append(RunSnapshot(run_id, phase, replica, INT if interactive else BAT, run_id))
    return DataplaneResynced(t, "", tuple(snaps), ())


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    mode=st.sampled_from(list(WorkingSet)),
    steps=st.lists(_steps, min_size=10, max_size=60),
)
# a resync rewrites a run living on its replica without its prompt (the same replica,
# another known context), then it comes back and moves
@example(
    mode=WorkingSet.REPLACE,
    steps=[
        ("round", "a", True, 5000),
        ("round", "b", True, 3000),
        ("resync", [("a", True, RunPhase.IDLE, "r0", False)]),
        ("round", "a", False, 7000),
        ("probe", "r0", False, 0, 20_000, 0.1),
        ("round", "b", True, 2000),
    ],
)
def test_the_working_sets_equal_a_recomputation_after_any_history(
    mode: WorkingSet, steps: list[tuple[object, ...]]
) -> None:
    """B5, S3, S10, S11: after every event of any history (turns finishing with any prompt,
    pauses, failures, abandons, runs ending, lapsing and expiring, resyncs rewriting runs,
    probes with any pool), each replica's working-set sums equal the sums recomputed from
    its runs (``invariants.violations``); then, with the option on, every held turn is
    admitted once every admitted turn ends and the clock passes the runs' leases."""
    params = replace(PARAMS, working_set=mode, initial_cap=2, run_idle_expiry_s=600.0)
    state = initial_state(POOL, params)
    for name in ("r0", "r1"):  # (healthy until a step says otherwise)
        state, _ = decide(state, ReplicaProbed(0.0, name, True, 0, 0, 0.1, 20_000))
    t = 0.0
    for i, step in enumerate(steps):
        t += float(step[1]) if step[0] == "tick" else 1.0  # type: ignore[arg-type]
        if step[0] == "round":
            _, run, paused, prompt = step
            turn = f"round{i}"
            state, actions = decide(state, TurnRequested(t, turn, str(run), "m", BAT))
            if turn in admitted(actions):
                step = ("fin", turn, paused, prompt)
            else:
                continue
        state, _ = decide(state, event(step, t, state))
        assert violations(state) == []
    # Liveness: the engines are healthy and quiet; every admitted turn ends, the clock
    # runs past every lease and expiry, until nothing is held (bounded: each round admits).
    for _ in range(2 + len(steps)):
        if not state.held:
            break
        t += 1
        for name in ("r0", "r1"):
            state, _ = decide(state, ReplicaProbed(t, name, True, 0, 0, 0.1, 10_000))
        for turn_id in sorted(state.turns):
            state, _ = decide(state, TurnFinished(t, turn_id, prompt_tokens=6000))
        t += params.tool_lease_default_s * params.tool_lease_factor + 1
        state, _ = decide(state, ClockTicked(t))
        assert violations(state) == []
    assert not state.held


# ------------------------------------------------------------------ simulator


def test_in_the_simulator_working_set_admission_serves_more_batch_runs_where_kv_binds() -> None:
    """B5, B1: two replicas with a 30,000-token pool, 4 interactive and 48 batch agents
    (the KV-bound cell of docs/benchmarks/policies.md): prefix keeping's run limit, raised by
    quiet probes, lets more runs live on a replica than its cache holds, and their prefixes are
    evicted; working-set admission keeps them cached and ends more batch runs in the
    window, with a larger cached share (an ordering, in virtual time)."""
    config = SimConfig(
        groups=(
            Group("people", 4, "interactive", "people"),
            Group("crowd", 48, "batch", "crowd"),
        ),
        replicas=2,
        duration_s=144.0,
        warmup_s=96.0,
        ramp_s=48.0,
        engine=EngineParams(priority_scheduling=True, kv_tokens=30_000),  # (--kv-tokens)
    )
    plain = simulate(config, "luftpause")["classes"]["batch"]
    wset = simulate(config, "luftpause-wset")["classes"]["batch"]
    assert wset["cached_share"] > plain["cached_share"]
    assert wset["runs_per_min"] > plain["runs_per_min"]
    explicit = replace(config, params=replace(config.params, working_set=WorkingSet.REPLACE))
    assert simulate(explicit, "luftpause")["classes"]["batch"] == wset
