"""B11: replicas that join, drain and leave while the scheduler runs, in the pure core.

Scenarios first (what each event does to runs pinned there, turns held for it and
reservations), then a Hypothesis walk over arbitrary interleavings of turns, probes,
ticks and membership events: the invariants hold after every event, no turn is admitted
to a replica that has left, no new run starts on a draining one, and at the end nothing
waits forever: with the remaining replicas healthy every held turn is admitted or
rejected, and every replica that left is dropped once nothing refers to it.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from luftpause.scheduler.core import (
    Action,
    Admit,
    ClockTicked,
    EndpointKind,
    Event,
    Params,
    Reject,
    RejectCode,
    ReplicaDraining,
    ReplicaJoined,
    ReplicaLeft,
    ReplicaProbed,
    ReplicaSpec,
    ServiceClass,
    State,
    TurnFinished,
    TurnRequested,
    decide,
    initial_state,
)
from luftpause.scheduler.core.invariants import violations

GEN = EndpointKind.GENERATIVE
INT, BAT = ServiceClass.INTERACTIVE, ServiceClass.BATCH
PARAMS = Params(initial_cap=None)  # no ramp: room is what the probes say


def spec(name: str, *models: str) -> ReplicaSpec:
    return ReplicaSpec(name, GEN, frozenset(models or ("m",)))


class Pool:
    """``decide`` fed by hand, the invariants checked after every event."""

    def __init__(self, *names: str) -> None:
        self.state: State = initial_state(tuple(spec(n) for n in names), PARAMS)
        self.t = 0.0
        for n in names:
            self(ReplicaProbed(self.t, n, True, 0, 0))

    def __call__(self, ev: Event) -> tuple[Action, ...]:
        self.state, actions = decide(self.state, ev)
        assert violations(self.state) == []
        return actions

    def turn(self, turn_id: str, run_id: str, cls: ServiceClass = BAT, model: str = "m") -> Action:
        self.t += 0.1
        actions = self(TurnRequested(self.t, turn_id, run_id, model, cls, "c", GEN, "dp"))
        mine = [a for a in actions if getattr(a, "turn_id", None) == turn_id]
        return mine[0] if mine else None  # type: ignore[return-value]

    def finish(self, turn_id: str, paused: bool = False) -> tuple[Action, ...]:
        self.t += 0.1
        return self(TurnFinished(self.t, turn_id, paused))


def where(action: Action | None) -> str | None:
    return action.replica if isinstance(action, Admit) else None


def test_a_joined_replica_takes_turns_after_its_first_probe() -> None:
    """B11: a joined replica is unhealthy until probed, then serves its models."""
    pool = Pool("g0")
    pool(ReplicaJoined(pool.t, spec("g1", "m", "m2")))
    assert not pool.state.replicas["g1"].healthy
    assert pool.state.serving[(GEN, "m2")] == ("g1",)
    assert where(pool.turn("t0", "r0", model="m2")) is None  # held: g1 not probed yet
    admitted = pool(ReplicaProbed(pool.t, "g1", True, 0, 0))
    assert [where(a) for a in admitted] == ["g1"]


def test_a_draining_replica_takes_no_new_run_and_its_runs_move_at_their_next_turn() -> None:
    """B11 (S3): drained at once, a run paused on a tool there moves at its next turn;
    a turn in flight there finishes there; new runs go elsewhere."""
    pool = Pool("g0", "g1")
    assert where(pool.turn("t0", "r0")) == "g0"
    assert where(pool.turn("t1", "r1")) == "g1"
    pool.finish("t0", paused=True)  # r0 lives on g0, paused on a tool
    pool(ReplicaDraining(pool.t, "g1"))
    pool.finish("t1")  # the turn in flight on g1 still ends there
    pool(ReplicaDraining(pool.t, "g0"))
    pool(ReplicaJoined(pool.t, spec("g2")))
    pool(ReplicaProbed(pool.t, "g2", True, 0, 0))
    assert where(pool.turn("t2", "r0")) == "g2"  # back from its tool: moved
    assert where(pool.turn("t3", "r9")) == "g2"  # a new run never goes to g0 or g1
    assert pool.state.runs["r0"].moves == 1


def test_a_drain_with_a_deadline_keeps_its_runs_until_then() -> None:
    """B11: before the drain time a pinned run's turns stay on the draining replica
    (its prefix is there); new runs do not go there; after it, the run moves."""
    pool = Pool("g0", "g1")
    assert where(pool.turn("t0", "r0")) == "g0"
    pool.finish("t0", paused=True)
    pool(ReplicaDraining(pool.t, "g0", until=pool.t + 60))
    assert where(pool.turn("t1", "r1")) == "g1"  # new run: not g0
    assert where(pool.turn("t2", "r0")) == "g0"  # pinned, before the deadline
    pool.finish("t2", paused=True)
    pool.t += 61
    pool(ClockTicked(pool.t))
    assert not pool.state.replicas["g0"].healthy
    assert where(pool.turn("t3", "r0")) == "g1"  # after it: moved


def test_a_replica_that_left_gets_nothing_and_is_dropped_when_unused() -> None:
    """B11 (S6): after ReplicaLeft no turn is admitted there; a held turn of a model only
    it served is rejected; its record goes once its last turn in flight ended."""
    pool = Pool("g0")
    pool(ReplicaJoined(pool.t, spec("g1", "m", "solo")))
    for _ in range(PARAMS.queue_probes):  # a lasting queue: capped at 1 (S2)
        pool(ReplicaProbed(pool.t, "g1", True, 1, 1))
    assert where(pool.turn("t0", "r0", model="solo")) == "g1"
    assert where(pool.turn("t1", "r1", model="solo")) is None  # held behind the cap
    actions = pool(ReplicaLeft(pool.t, "g1"))
    assert Reject("t1", RejectCode.UNKNOWN_MODEL, "") in [
        Reject(a.turn_id, a.code, "") for a in actions if isinstance(a, Reject)
    ]
    assert (GEN, "solo") not in pool.state.serving
    assert "g1" in pool.state.replicas  # t0 is still in flight there
    rejected = pool.turn("t2", "r2", model="solo")
    assert isinstance(rejected, Reject) and rejected.code is RejectCode.UNKNOWN_MODEL
    pool.finish("t0", paused=True)  # r0 pauses on a tool where it lives
    assert where(pool.turn("t3", "r0")) == "g0"  # its next turn (model m) moves
    pool(ClockTicked(pool.t + 1))
    assert "g1" not in pool.state.replicas
    assert "g1" not in pool.state.left and "g1" not in pool.state.draining


def test_a_reservation_on_a_replica_that_left_ends_when_its_run_comes_back() -> None:
    """B11 (S4): an interactive run paused on a tool holds a slot where it lives; when that
    replica leaves, the run's next turn goes elsewhere and the slot is given up, and the
    replica's record is dropped after."""
    pool = Pool("g0", "g1")
    assert where(pool.turn("t0", "r0", INT)) == "g0"
    pool.finish("t0", paused=True)
    assert pool.state.replicas["g0"].reserved == 1
    pool(ReplicaLeft(pool.t, "g0"))
    pool(ClockTicked(pool.t + 1))
    assert "g0" in pool.state.replicas  # the paused run still lives (and is reserved) there
    assert where(pool.turn("t1", "r0", INT)) == "g1"
    assert pool.state.runs["r0"].reserved_on is None
    pool(ClockTicked(pool.t + 1))
    assert "g0" not in pool.state.replicas


def test_joining_again_ends_a_drain() -> None:
    """B11: a draining replica joined again (a rollback) takes new runs after its next
    probe; a spec of another kind for a present name is refused."""
    pool = Pool("g0", "g1")
    pool(ReplicaDraining(pool.t, "g1"))
    pool(ReplicaJoined(pool.t, spec("g1")))
    assert "g1" not in pool.state.draining
    pool(ReplicaProbed(pool.t, "g1", True, 0, 0))
    assert pool.state.replicas["g1"].healthy
    pool(ReplicaJoined(pool.t, ReplicaSpec("g1", EndpointKind.SINGLE_PASS, frozenset({"m"}))))
    assert pool.state.replicas["g1"].spec.kind is GEN


# ------------------------------------------------------------------ the walk

NAMES = ["g0", "g1", "g2", "g3"]


class MembershipMachine(RuleBasedStateMachine):
    """Turns, tool pauses, probes, ticks and membership changes in any order."""

    @initialize()
    def setup(self) -> None:
        self.state: State = initial_state((spec("g0"), spec("g1")), PARAMS)
        self.t = 0.0
        self.n = 0
        self.in_flight: dict[str, str] = {}  # turn -> run
        self.runs: list[str] = []
        for name in ("g0", "g1"):
            self.step(ReplicaProbed(self.t, name, True, 2, 1))

    def step(self, ev: Event) -> None:
        left_before = set(self.state.left)
        pinned_before = {r: run.replica for r, run in self.state.runs.items()}
        draining_before = set(self.state.draining)
        self.state, actions = decide(self.state, ev)
        problems = violations(self.state)
        assert problems == [], problems
        for a in actions:
            if isinstance(a, Admit):
                assert a.replica not in left_before, f"{a.turn_id} admitted to {a.replica}"
                assert a.replica not in self.state.left
                run = self.state.turns[a.turn_id].run_id
                if a.replica in draining_before:  # only a run that lived there
                    assert pinned_before.get(run) == a.replica
                self.in_flight[a.turn_id] = run
            elif isinstance(a, Reject):
                self.in_flight.pop(a.turn_id, None)

    @rule(cls=st.sampled_from([INT, BAT]), new=st.booleans(), data=st.data())
    def request(self, cls: ServiceClass, new: bool, data: st.DataObject) -> None:
        self.t += 0.3
        self.n += 1
        if new or not self.runs:
            run = f"r{self.n}"
            self.runs.append(run)
        else:
            run = data.draw(st.sampled_from(self.runs))
        self.step(TurnRequested(self.t, f"t{self.n}", run, "m", cls, "c", GEN, "dp"))

    @rule(data=st.data(), paused=st.booleans())
    def finish(self, data: st.DataObject, paused: bool) -> None:
        live = sorted(t for t in self.in_flight if t in self.state.turns)
        if not live:
            return
        turn = data.draw(st.sampled_from(live))
        self.t += 0.3
        self.step(TurnFinished(self.t, turn, paused))
        self.in_flight.pop(turn, None)

    @rule(name=st.sampled_from(NAMES), healthy=st.booleans(), load=st.sampled_from([0, 1]))
    def probe(self, name: str, healthy: bool, load: int) -> None:
        self.step(ReplicaProbed(self.t, name, healthy, 2, load))

    @rule(dt=st.sampled_from([0.5, 3.0, 40.0, 200.0]))
    def tick(self, dt: float) -> None:
        self.t += dt
        self.step(ClockTicked(self.t))

    @rule(name=st.sampled_from(NAMES))
    def join(self, name: str) -> None:
        self.step(ReplicaJoined(self.t, spec(name)))

    @rule(name=st.sampled_from(NAMES), grace=st.sampled_from([None, 5.0, 60.0]))
    def drain(self, name: str, grace: float | None) -> None:
        until = None if grace is None else self.t + grace
        self.step(ReplicaDraining(self.t, name, until))

    @rule(name=st.sampled_from(NAMES))
    def leave(self, name: str) -> None:
        self.step(ReplicaLeft(self.t, name))

    @invariant()
    def nothing_admitted_is_lost(self) -> None:
        if hasattr(self, "state"):
            for turn_id in self.state.turns:
                assert self.state.turns[turn_id].replica in self.state.replicas

    def teardown(self) -> None:
        """Nothing waits forever: a fresh replica joins, every turn in flight ends, the
        clock runs past every lease; then no turn is held, and no replica that left is
        kept."""
        if not hasattr(self, "state"):
            return
        self.step(ReplicaJoined(self.t, spec("fresh")))
        self.step(ReplicaProbed(self.t, "fresh", True, None, None))  # no load: no limit
        for _ in range(50):
            live = sorted(t for t in self.state.turns)
            if not live and not self.state.held:
                break
            for turn in live:
                self.t += 0.1
                self.step(TurnFinished(self.t, turn, False))
            self.t += 1
            self.step(ClockTicked(self.t))
        assert not self.state.held, sorted(self.state.held)
        self.t += 1000  # past every tool lease: paused runs lapse
        self.step(ClockTicked(self.t))
        self.t += 1
        self.step(ClockTicked(self.t))
        assert not self.state.left, sorted(self.state.left)


TestMembership = MembershipMachine.TestCase
TestMembership.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, derandomize=True
)
