"""Example tests for the pure scheduling core, one or more per rule of SPEC "Scheduler (S)".

Each test drives ``decide`` with a short, hand-written event sequence and asserts
the actions (and, where the rule is about counts, the S12 status view). Every
step also checks ``violations(state) == []``: the incrementally kept counters
must agree with their from-scratch definition after every event.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from luftpause.scheduler.core import (
    Action,
    Admit,
    ClockTicked,
    DataplaneConnected,
    DataplaneDisconnected,
    DataplaneResynced,
    DropReason,
    DropTurn,
    EndpointKind,
    FirstTokenReceived,
    ForgetRun,
    Params,
    Reject,
    RejectCode,
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
    TurnSnapshot,
    TurnStarted,
    decide,
    initial_state,
)
from luftpause.scheduler.core.events import Event
from luftpause.scheduler.core.invariants import violations
from luftpause.scheduler.core.view import run_status, status

GEN = EndpointKind.GENERATIVE
SP = EndpointKind.SINGLE_PASS
INT = ServiceClass.INTERACTIVE
BAT = ServiceClass.BATCH


def gen(name: str, *models: str) -> ReplicaSpec:
    return ReplicaSpec(name, GEN, frozenset(models or ("m",)))


def single(name: str, *models: str) -> ReplicaSpec:
    return ReplicaSpec(name, SP, frozenset(models or ("cls",)))


class Sim:
    """A tiny host: holds the state and the clock, checks invariants after each event."""

    def __init__(
        self,
        *specs: ReplicaSpec,
        params: Params | None = None,
        queue_probes: int = 1,
        initial_cap: int | None = None,
    ) -> None:
        # One probe with a queue sets the cap here, so each rule's test stays short;
        # the S2 persistence rule (default 2 probes) has tests of its own below. A
        # replica starts unlimited here: the ramp from idle has tests of its own too.
        params = replace(params or Params(), queue_probes=queue_probes, initial_cap=initial_cap)
        self.state: State = initial_state(specs, params)
        self.t = 0.0

    def __call__(self, ev: Event) -> tuple[Action, ...]:
        self.state, actions = decide(self.state, ev)
        assert violations(self.state) == []
        return actions

    # ---- event helpers, all stamped with the current clock
    def req(
        self,
        turn: str,
        run: str,
        model: str = "m",
        cls: ServiceClass = BAT,
        caller: str = "c",
        kind: EndpointKind = GEN,
        dp: str = "dp",
        trace: str = "",
    ) -> tuple[Action, ...]:
        return self(TurnRequested(self.t, turn, run, model, cls, caller, kind, dp, trace))

    def probe(
        self,
        replica: str,
        healthy: bool = True,
        running: int | None = None,
        waiting: int | None = None,
    ) -> tuple[Action, ...]:
        return self(ReplicaProbed(self.t, replica, healthy, running, waiting))

    def finish(
        self, turn: str, paused: bool = False, prompt: int = 0, cached: int = 0, reply: int = 0
    ) -> tuple[Action, ...]:
        return self(
            TurnFinished(
                self.t,
                turn,
                paused_on_tool=paused,
                prompt_tokens=prompt,
                cached_tokens=cached,
                completion_tokens=reply,
            )
        )

    def tick(self, at: float) -> tuple[Action, ...]:
        self.t = at
        return self(ClockTicked(at))

    def resync_generating(self, replica: str, n: int) -> tuple[Action, ...]:
        """A dataplane resyncs ``n`` batch runs generating on ``replica``, one turn each
        in flight there (``r0``/``t0`` …)."""
        return self(
            DataplaneResynced(
                self.t,
                "dp",
                runs=tuple(
                    RunSnapshot(f"r{i}", RunPhase.GENERATING, replica, BAT, "c") for i in range(n)
                ),
                in_flight=tuple(
                    TurnSnapshot(f"t{i}", f"r{i}", replica, "m", BAT, "c", started=True)
                    for i in range(n)
                ),
            )
        )

    def view(self) -> dict[str, Any]:
        return status(self.state, self.t)

    def replica(self, name: str) -> dict[str, Any]:
        for rep in self.view()["replicas"]:
            if rep["name"] == name:
                return dict(rep)
        raise KeyError(name)


def admits(actions: tuple[Action, ...]) -> dict[str, str]:
    return {a.turn_id: a.replica for a in actions if isinstance(a, Admit)}


def admitted_order(actions: tuple[Action, ...]) -> list[str]:
    return [a.turn_id for a in actions if isinstance(a, Admit)]


# The spec's rules alone, without prefix keeping (whose gate on new batch runs would
# hold the extra runs these tests use to fill a replica); prefix keeping has its own tests.
SPEC_RULES = Params(keep_prefixes=False)


def capped(sim: Sim, replica: str, cap: int) -> None:
    """Give ``replica`` a cap of ``cap`` with a probe showing a queue (S2)."""
    sim.probe(replica, True, running=cap, waiting=1)
    assert sim.replica(replica)["capacity"] == cap


# ===================================================================== S2


def test_s2_replica_unhealthy_until_first_probe() -> None:
    """S2/S9: a replica gets no turns before its first healthy probe; the turn waits."""
    sim = Sim(gen("a"))
    assert sim.req("t1", "r1") == ()
    assert sim.view()["held_total"] == 1
    assert admits(sim.probe("a")) == {"t1": "a"}


def test_s2_no_load_numbers_means_unlimited() -> None:
    """S2: a replica that reports no load is not limited."""
    sim = Sim(gen("a"))
    sim.probe("a", True)  # no running/waiting
    assert sim.replica("a")["capacity"] is None
    for i in range(50):
        assert admits(sim.req(f"t{i}", f"r{i}")) == {f"t{i}": "a"}
    assert sim.replica("a")["in_flight"] == 50


def test_s2_empty_queue_without_cap_stays_unlimited() -> None:
    """S2: an engine that never queued is not capped, whatever it runs."""
    sim = Sim(gen("a"))
    sim.probe("a", True, running=7, waiting=0)
    assert sim.replica("a")["capacity"] is None


def test_s2_a_passing_queue_sets_no_cap() -> None:
    """S2: with the default rule a queue must be seen on two probes in a row before the
    replica is capped; a queue that a burst of prefills leaves for one probe does not."""
    sim = Sim(gen("a"), queue_probes=2)
    sim.probe("a", True, running=3, waiting=4)
    assert sim.replica("a")["capacity"] is None
    sim.probe("a", True, running=7, waiting=0)  # drained: the count starts again
    sim.probe("a", True, running=8, waiting=1)
    assert sim.replica("a")["capacity"] is None
    sim.probe("a", True, running=8, waiting=2)  # a queue that stays
    assert sim.replica("a")["capacity"] == 8


def test_s3_new_runs_spread_over_replicas_by_the_runs_living_there() -> None:
    """S3: an idle pool where most runs sit in tool calls (no turn in flight): new runs
    go to the replica with the fewest runs generating or paused there, ties rotating,
    instead of piling onto the first replica by name."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("a")
    sim.probe("b")
    placed: dict[str, int] = {"a": 0, "b": 0}
    for i in range(8):
        replica = admits(sim.req(f"t{i}", f"r{i}"))[f"t{i}"]
        placed[replica] += 1
        sim.finish(f"t{i}", paused=True)  # the run now waits on a tool there
    assert placed == {"a": 4, "b": 4}
    assert sim.replica("a")["runs_pinned"] == 4


def test_s2_queue_sets_cap_to_running() -> None:
    """S2: once the engine queues, in-flight turns are capped at its running count."""
    sim = Sim(gen("a"))
    sim.probe("a", True, running=3, waiting=2)
    assert sim.replica("a")["capacity"] == 3
    got = [admits(sim.req(f"t{i}", f"r{i}")) for i in range(4)]
    assert got == [{"t0": "a"}, {"t1": "a"}, {"t2": "a"}, {}]
    assert sim.view()["held_total"] == 1
    assert admits(sim.finish("t0")) == {"t3": "a"}


def test_s2_queue_with_nothing_running_caps_at_one() -> None:
    """S2: cap = max(1, running): a queue with nothing running still lets one turn in."""
    sim = Sim(gen("a"))
    sim.probe("a", True, running=0, waiting=5)
    assert sim.replica("a")["capacity"] == 1
    assert admits(sim.req("t1", "r1")) == {"t1": "a"}
    assert sim.req("t2", "r2") == ()


def test_s2_cap_sticky_on_empty_queue_below_cap() -> None:
    """S2: an empty-queue probe while below the cap neither drops nor raises the cap."""
    sim = Sim(gen("a"))
    capped(sim, "a", 3)
    sim.req("t1", "r1")
    sim.probe("a", True, running=1, waiting=0)
    assert sim.replica("a")["capacity"] == 3
    assert admits(sim.req("t2", "r2")) == {"t2": "a"}
    assert admits(sim.req("t3", "r3")) == {"t3": "a"}
    assert sim.req("t4", "r4") == ()  # still capped at 3


def test_s2_cap_raised_step_by_step_at_the_cap() -> None:
    """S2: a quiet probe while running at the cap raises it by cap_raise_step, once per probe."""
    sim = Sim(gen("a"))
    capped(sim, "a", 2)
    for i in range(6):
        sim.req(f"t{i}", f"r{i}")
    assert sim.view()["held_total"] == 4
    # engine at the cap with an empty queue: one more slot, one held turn admitted
    assert admits(sim.probe("a", True, running=2, waiting=0)) == {"t2": "a"}
    assert sim.replica("a")["capacity"] == 3
    assert admits(sim.probe("a", True, running=3, waiting=0)) == {"t3": "a"}
    assert sim.replica("a")["capacity"] == 4


def test_s2_cap_rises_only_on_the_engines_running_count() -> None:
    """S2: a cap rises only on evidence from the engine (its running count at the cap,
    queue empty; other clients' load: see the shared-engine test), never because
    luftpause's own in-flight count is high (a turn
    reported late, or leaked): the cap does not drift above what the engine runs.
    The step is a parameter. (Prefix keeping's own raise has tests of its own.)"""
    sim = Sim(gen("a"), params=Params(cap_raise_step=3, keep_prefixes=False))
    capped(sim, "a", 2)
    for i in range(6):
        sim.req(f"t{i}", f"r{i}")
    # our count says 2 in flight; the engine runs 1 and queues nothing: no raise
    for _ in range(5):
        assert sim.probe("a", True, running=1, waiting=0) == ()
    assert sim.replica("a")["capacity"] == 2
    # the engine itself at the cap with an empty queue: up by the step
    acts = sim.probe("a", True, running=2, waiting=0)
    assert sim.replica("a")["capacity"] == 5
    assert admitted_order(acts) == ["t2", "t3", "t4"]


def test_s2_s11_caps_are_learned_again_after_a_restart() -> None:
    """S2, S11: the scheduler keeps nothing on disk, so a restarted one starts uncapped;
    under load it learns each cap again from the engine within two probe periods
    (the default ``queue_probes`` of 2), whatever its in-flight counts say."""
    sim = Sim(gen("a"), gen("b"), queue_probes=2)
    sim.probe("a", True, running=None, waiting=None)
    sim.probe("b", True, running=None, waiting=None)
    sim.tick(1.0)
    sim.resync_generating("a", 6)
    assert sim.replica("a")["capacity"] is None
    sim.t = 2.0
    sim.probe("a", True, running=4, waiting=2)
    sim.t = 4.0
    sim.probe("a", True, running=4, waiting=2)
    assert sim.replica("a")["capacity"] == 4
    assert sim.replica("a")["in_flight"] == 6


def test_s2_cap_set_again_when_queue_reappears() -> None:
    """S2: after raising, a queue sets the cap back to the running count."""
    sim = Sim(gen("a"))
    capped(sim, "a", 2)
    for i in range(4):
        sim.req(f"t{i}", f"r{i}")
    sim.probe("a", True, running=2, waiting=0)
    sim.probe("a", True, running=3, waiting=0)
    assert sim.replica("a")["capacity"] == 4
    assert sim.replica("a")["in_flight"] == 4
    sim.probe("a", True, running=2, waiting=1)
    assert sim.replica("a")["capacity"] == 2
    sim.req("t9", "r9")
    assert sim.finish("t0") == ()  # in flight 3 ≥ 2
    assert sim.finish("t1") == ()  # in flight 2 ≥ 2
    assert admits(sim.finish("t2")) == {"t9": "a"}


def test_s2_probe_without_load_removes_cap() -> None:
    """S2: a probe with no load numbers lifts the cap and admits what was held."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("t1", "r1")
    sim.req("t2", "r2")
    sim.req("t3", "r3")
    assert admits(sim.probe("a", True)) == {"t2": "a", "t3": "a"}
    assert sim.replica("a")["capacity"] is None


def test_s2_a_replica_ramps_from_idle_until_its_engine_first_queues() -> None:
    """S2, a flood from idle: before the engine has queued, a replica takes at most
    ``initial_cap`` turns; each quiet probe that finds the engine running all of them
    doubles the limit; the first lasting queue sets the cap from the running count and
    ends the ramp, after which the cap rises by ``cap_raise_step`` as S2 says."""
    sim = Sim(gen("a"), params=SPEC_RULES, initial_cap=4, queue_probes=2)
    sim.probe("a", True, running=0, waiting=0)
    assert sim.replica("a")["capacity"] == 4 and sim.replica("a")["capacity_ramping"]
    got = [admits(sim.req(f"t{i}", f"r{i}")) for i in range(12)]
    assert [g for g in got if g] == [{f"t{i}": "a"} for i in range(4)]
    assert sim.view()["held_total"] == 8
    # below the limit the engine is not shown to take more: nothing moves
    assert sim.probe("a", True, running=3, waiting=0) == ()
    assert sim.replica("a")["capacity"] == 4
    # running all four, nothing queued: doubled
    assert admitted_order(sim.probe("a", True, running=4, waiting=0)) == ["t4", "t5", "t6", "t7"]
    assert sim.replica("a")["capacity"] == 8
    # one probe with a queue (a burst being prefilled) neither sets a cap nor raises it
    assert sim.probe("a", True, running=6, waiting=2) == ()
    assert sim.replica("a") | {"capacity": 8, "capacity_ramping": True} == sim.replica("a")
    # a queue that stays: the engine's capacity is found
    sim.probe("a", True, running=6, waiting=2)
    assert sim.replica("a")["capacity"] == 6
    assert not sim.replica("a")["capacity_ramping"]
    # from now on, step by step
    for t in ("t0", "t1", "t2"):
        sim.finish(t)
    assert sim.replica("a")["in_flight"] == 6  # three held turns took the freed slots
    sim.probe("a", True, running=6, waiting=0)
    assert sim.replica("a")["capacity"] == 7


def test_s2_the_ramp_holds_only_batch_where_the_engine_orders_classes() -> None:
    """S2, S4: on a replica whose engine orders its queue by class an interactive turn
    always fits, ramp or not; batch turns wait for the ramp."""
    spec = ReplicaSpec("a", GEN, frozenset({"m"}), orders_classes=True)
    sim = Sim(spec, params=SPEC_RULES, initial_cap=2)
    sim.probe("a", True, running=0, waiting=0)
    assert [admits(sim.req(f"b{i}", f"rb{i}")) for i in range(3)][2] == {}
    assert admits(sim.req("i0", "ri0", cls=INT)) == {"i0": "a"}
    assert admits(sim.req("i1", "ri1", cls=INT)) == {"i1": "a"}
    assert sim.view()["held_total"] == 1


def test_s2_a_replica_without_load_numbers_leaves_the_ramp_unlimited() -> None:
    """S2: a replica that reports no load is not limited, ramp or not; one that later
    reports load starts unlimited (it has no ramp to return to) until its engine queues."""
    sim = Sim(gen("a"), params=SPEC_RULES, initial_cap=2)
    sim.probe("a", True)
    assert sim.replica("a")["capacity"] is None
    assert not sim.replica("a")["capacity_ramping"]
    for i in range(5):
        assert admits(sim.req(f"t{i}", f"r{i}")) == {f"t{i}": "a"}
    sim.probe("a", True, running=5, waiting=0)
    assert sim.replica("a")["capacity"] is None


def test_s2_s9_a_replica_that_was_down_ramps_again() -> None:
    """S2, S9: a replica whose probe fails may come back as a restarted engine, idle and
    cold: it ramps from idle again instead of keeping its old cap or losing every
    limit; a healthy replica that reports no load numbers stays unlimited."""
    sim = Sim(gen("a"), params=SPEC_RULES, initial_cap=4)
    sim.probe("a", True, running=6, waiting=3)
    assert sim.replica("a")["capacity"] == 6 and not sim.replica("a")["capacity_ramping"]
    sim.probe("a", False)  # down: no numbers
    assert sim.replica("a")["capacity"] == 4 and sim.replica("a")["capacity_ramping"]
    sim.probe("a", True, running=0, waiting=0)  # back, empty
    got = [admits(sim.req(f"t{i}", f"r{i}")) for i in range(6)]
    assert [g for g in got if g] == [{f"t{i}": "a"} for i in range(4)]
    assert len(admits(sim.probe("a", True, running=4, waiting=0))) == 2  # doubled to 8
    sim.probe("a", True)  # healthy, no numbers: not limited
    assert sim.replica("a")["capacity"] is None and not sim.replica("a")["capacity_ramping"]


def test_s2_s11_a_restarted_scheduler_ramps_above_what_its_dataplanes_resync() -> None:
    """S2, S11: a restarted scheduler starts on the ramp; turns a dataplane resyncs stay
    admitted above the limit, and the engine running them all with no queue doubles it.
    Before the resync, the engine's running turns are not known to be luftpause's, so
    they raise nothing."""
    sim = Sim(gen("a"), params=SPEC_RULES, initial_cap=4)
    # the engine still runs 6 turns from before the restart, nothing queued; no
    # dataplane has resynced them yet
    assert sim.probe("a", True, running=6, waiting=0) == ()
    assert sim.replica("a")["capacity"] == 4
    sim.resync_generating("a", 10)
    assert sim.replica("a")["in_flight"] == 10
    assert sim.req("t10", "r10") == ()
    assert sim.probe("a", True, running=10, waiting=0) == ()  # doubled to 8: still full
    assert sim.replica("a")["capacity"] == 8
    assert admits(sim.probe("a", True, running=10, waiting=0)) == {"t10": "a"}
    assert sim.replica("a")["capacity"] == 16


def test_s2_other_clients_on_a_shared_engine_raise_no_cap() -> None:
    """S2 on a shared engine: requests of other clients make the engine run at (or
    above) the cap with an empty queue, but a cap luftpause's turns do not fill is not
    raised, on the ramp or after it; once luftpause's turns fill it, it rises again.
    (Before this, a cap crept up while luftpause idled beside another client, and its
    next burst went straight into the engine's queue.)"""
    sim = Sim(gen("a"), params=SPEC_RULES, initial_cap=4, queue_probes=2)
    sim.probe("a", True, running=0, waiting=0)
    # on the ramp, luftpause idle, another client runs 9 requests: no doubling
    for _ in range(5):
        assert sim.probe("a", True, running=9, waiting=0) == ()
    assert sim.replica("a") | {"capacity": 4, "capacity_ramping": True} == sim.replica("a")
    # a lasting queue ends the ramp (the engine's capacity is found, whoever fills it)
    sim.probe("a", True, running=9, waiting=3)
    sim.probe("a", True, running=9, waiting=3)
    assert sim.replica("a") | {"capacity": 9, "capacity_ramping": False} == sim.replica("a")
    # luftpause uses 5 of its 9; the engine runs 12: no step
    for i in range(5):
        assert admits(sim.req(f"t{i}", f"r{i}")) == {f"t{i}": "a"}
    for _ in range(3):
        assert sim.probe("a", True, running=12, waiting=0) == ()
    assert sim.replica("a")["capacity"] == 9
    # luftpause's turns fill the cap and one is held: up by the step, the held one in
    for i in range(5, 10):
        sim.req(f"t{i}", f"r{i}")
    assert sim.view()["held_total"] == 1
    assert admits(sim.probe("a", True, running=12, waiting=0)) == {"t9": "a"}
    assert sim.replica("a")["capacity"] == 10


def test_s2_unhealthy_replica_gets_no_turns() -> None:
    """S9: an unhealthy replica gets no turns even with no cap; a healthy one does."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("a", False)
    sim.probe("b", True)
    assert admits(sim.req("t1", "r1")) == {"t1": "b"}
    sim.probe("b", False)
    assert sim.req("t2", "r2") == ()
    assert admits(sim.probe("a", True)) == {"t2": "a"}


# ======================================================= prefix keeping


def test_d6_refused_connection_takes_the_replica_out_until_a_probe() -> None:
    """D6, S9: a turn that failed because its replica refused the connection takes that
    replica out of placement at once: the next turns go elsewhere, not to the dead
    replica with the fewest turns in flight. A healthy probe brings it back."""
    sim = Sim(gen("a"), gen("b"), params=SPEC_RULES)
    sim.probe("a", True)
    sim.probe("b", True)
    for i in range(4):
        sim.req(f"b{i}", f"rb{i}")
    first = admits(sim.req("t0", "r0"))
    dead = first["t0"]
    alive = "b" if dead == "a" else "a"
    sim(TurnFailed(sim.t, "t0", reason="connection refused", replica_unreachable=True))
    assert sim.replica(dead)["healthy"] is False
    assert admits(sim.req("t1", "r1")) == {"t1": alive}
    assert admits(sim.req("t2", "r0")) == {"t2": alive}  # its idle run moves
    sim.probe(dead, True)
    assert sim.replica(dead)["healthy"] is True


def test_d6_an_ordinary_failure_keeps_the_replica_in_placement() -> None:
    """D6: an engine that answered (an error status, a broken stream) stays in rotation;
    only a connection it could not make takes it out."""
    sim = Sim(gen("a"))
    sim.probe("a", True)
    sim.req("t0", "r0")
    sim(TurnFailed(sim.t, "t0", reason="engine a answered 503"))
    assert sim.replica("a")["healthy"] is True
    assert admits(sim.req("t1", "r1")) == {"t1": "a"}


def test_d6_s3_turns_held_for_an_unreachable_replica_move() -> None:
    """D6, S3: turns held for a replica found unreachable may move (its pin lane opens)."""
    sim = Sim(gen("a"), gen("b"), params=SPEC_RULES)
    capped(sim, "a", 1)
    sim.req("t1", "r")  # on a, the only healthy replica
    sim.finish("t1", paused=True)
    sim.req("x", "other")  # fills a
    sim.probe("b", True, running=1, waiting=1)
    sim.req("y", "another")  # fills b
    assert sim.req("t2", "r") == ()  # pinned to a, held
    acts = sim(TurnFailed(sim.t, "x", reason="connection refused", replica_unreachable=True))
    assert admits(acts) == {}  # b is full; a is out
    assert admits(sim.finish("y")) == {"t2": "b"}  # the run moves with its held turn

    run = run_status(sim.state, "r", sim.t)
    assert run is not None and run["turns"] == 2 and run["moves"] == 1 and run["replica"] == "b"


def test_s12_a_run_s_status_counts_its_turns_and_its_moves() -> None:
    """S3, S12: one run's status says where it is and how many of its turns were
    admitted away from the replica of the turn before (a prefix left behind)."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("a")
    sim.probe("b")
    sim.req("t1", "r")
    sim.finish("t1", paused=True)
    sim.req("t2", "r")
    sim.finish("t2", paused=True)
    run = run_status(sim.state, "r", sim.t)
    assert run is not None
    assert run["turns"] == 2 and run["moves"] == 0
    assert run["phase"] == "paused_on_tool" and run["replica"] in ("a", "b")
    assert run_status(sim.state, "nobody", sim.t) is None


def test_prefix_keeping_continuing_turn_goes_before_an_older_new_run() -> None:
    """S2/S5 extension (prefix keeping): within a caller, a held turn of a run pinned to
    the replica (its prefix is cached there) is admitted before an older turn of a run
    new to it; caller fairness (S5) still comes first."""
    for x_caller, first in (("c", "p3"), ("other", "x1")):
        sim = Sim(gen("a"))
        capped(sim, "a", 2)
        sim.req("p1", "P")
        sim.req("p2", "P")  # two turns of one run in flight: one run pinned, cap full
        sim.req("x1", "X", caller=x_caller)  # a new run, held for the slot
        sim.req("p3", "P")  # P's next turn, after X's
        assert admitted_order(sim.finish("p1")) == [first], x_caller


def test_prefix_keeping_new_batch_runs_wait_while_cap_runs_are_pinned() -> None:
    """Prefix keeping: a capped replica starts no new batch run while as many runs as its
    cap are pinned there (generating or paused on a tool), even with a slot free; one
    going idle lets the next in. Interactive runs are exempt (S4)."""
    sim = Sim(gen("a"))
    capped(sim, "a", 2)
    sim.req("p1", "P")
    sim.req("q1", "Q")
    sim.finish("p1", paused=True)
    assert sim.replica("a")["in_flight"] == 1
    assert sim.req("x1", "X") == ()  # a slot is free, but P and Q keep theirs
    assert admits(sim.req("i1", "I", cls=INT)) == {"i1": "a"}
    sim.finish("i1")  # I ends idle: not pinned any more
    assert admits(sim.finish("q1")) == {"x1": "a"}  # Q idle: X may start


def test_prefix_keeping_off_admits_new_runs_by_slots_alone() -> None:
    """keep_prefixes = false: S2's in-flight cap alone decides, as the spec states it."""
    sim = Sim(gen("a"), params=SPEC_RULES)
    capped(sim, "a", 2)
    sim.req("p1", "P")
    sim.req("q1", "Q")
    sim.finish("p1", paused=True)
    assert admits(sim.req("x1", "X")) == {"x1": "a"}


def test_prefix_keeping_an_evicted_prefix_lowers_the_cap_once_per_probe() -> None:
    """Prefix keeping: a continuing turn that finds less than prefix_miss_share of its
    prompt cached lowers its replica's cap by one; more misses before the next probe
    lower it no further, that probe does not raise it, and a later quiet probe at the
    cap raises it again (S2)."""
    sim = Sim(gen("a"))
    capped(sim, "a", 4)
    for run in "PQR":
        sim.req(f"{run}1", run)
    for run in "PQR":
        sim.finish(f"{run}1", paused=True, prompt=1000, cached=900)
    for run in "PQR":
        sim.req(f"{run}2", run)
    sim.finish("P2", paused=True, prompt=1100, cached=400)  # evicted while on its tool
    assert sim.replica("a")["capacity"] == 3
    assert sim.replica("a")["prefix_misses"] == 1
    sim.finish("Q2", paused=True, prompt=1100, cached=100)
    assert sim.replica("a")["capacity"] == 3  # the same over-full moment
    assert sim.replica("a")["prefix_misses"] == 2
    for run in "PQ":
        assert admits(sim.req(f"{run}3", run)) == {f"{run}3": "a"}  # at the cap of 3 again
    sim.probe("a", True, running=3, waiting=0)
    assert sim.replica("a")["capacity"] == 3  # no raise right after a miss
    sim.probe("a", True, running=3, waiting=0)
    assert sim.replica("a")["capacity"] == 4
    sim.finish("R2", paused=True, prompt=1100, cached=1000)  # a hit changes nothing
    assert sim.replica("a")["capacity"] == 4


def test_prefix_keeping_a_miss_among_more_runs_than_the_cap_does_not_lower_it() -> None:
    """Prefix keeping: when more runs are pinned to a replica than its cap - all of them
    admitted before its engine ever queued, as in a flood from idle - a continuing turn
    that finds its prefix evicted says the backlog does not fit, not that the cap is too
    high: lowering the cap would only slow the backlog down (and every later miss of it
    would lower it again, down to 1). The cap stays, and is not raised at the next
    probe; once no more runs are pinned there than the cap, a miss lowers it again."""
    sim = Sim(gen("a"))
    sim.probe("a", True, running=0, waiting=0)
    for run in "PQRST":  # admitted before any queue was seen: no cap yet
        sim.req(f"{run}1", run)
    capped(sim, "a", 2)
    for run in "PQRST":
        sim.finish(f"{run}1", paused=True, prompt=1000, cached=900)
    assert sim.replica("a")["runs_pinned"] == 5
    sim.req("P2", "P")
    sim.req("Q2", "Q")
    sim.finish("P2", paused=True, prompt=1100, cached=100)  # evicted while on its tool
    assert sim.replica("a")["prefix_misses"] == 1
    assert sim.replica("a")["capacity"] == 2
    sim.probe("a", True, running=2, waiting=0)
    assert sim.replica("a")["capacity"] == 2  # the cache is full: no raise either
    for run in "RST":  # three runs end: two are pinned, as many as the cap
        sim.req(f"{run}2", run)
        sim.finish(f"{run}2", paused=False, prompt=1100, cached=1000)
    assert sim.replica("a")["runs_pinned"] == 2
    sim.finish("Q2", paused=True, prompt=1100, cached=100)
    assert sim.replica("a")["capacity"] == 1


def test_prefix_keeping_only_continuing_turns_on_caching_engines_count() -> None:
    """Prefix keeping: a run's first turn on a replica has nothing cached to lose, and an
    engine that has never reported a cached token says nothing about its cache: neither
    lowers the cap. Nor does anything on an uncapped replica."""
    sim = Sim(gen("a"))
    capped(sim, "a", 4)
    sim.req("p1", "P")
    sim.finish("p1", paused=True, prompt=1000, cached=0)  # first turn, and no cache seen
    sim.req("p2", "P")
    sim.finish("p2", paused=True, prompt=1100, cached=0)  # continuing, but no cache seen
    assert sim.replica("a")["capacity"] == 4
    sim.req("q1", "Q")
    sim.finish("q1", paused=True, prompt=1000, cached=10)  # first turn: the engine caches
    assert sim.replica("a")["capacity"] == 4
    sim.req("q2", "Q")
    sim.finish("q2", paused=True, prompt=1100, cached=10)
    assert sim.replica("a")["capacity"] == 3
    free = Sim(gen("b"))
    free.probe("b", True)  # reports no load: never capped
    free.req("u1", "U")
    free.finish("u1", paused=True, prompt=1000, cached=10)
    free.req("u2", "U")
    free.finish("u2", paused=True, prompt=1100, cached=10)
    assert free.replica("b")["capacity"] is None
    assert free.replica("b")["prefix_misses"] == 0


def test_prefix_keeping_judges_the_previous_prompt_not_the_new_tail() -> None:
    """Prefix keeping: what a turn back from a tool should find cached is its run's
    previous prompt; a large tool result makes the new prompt long without any eviction.
    A run's parallel first turns (admitted before any turn of it finished here) are not
    judged."""
    sim = Sim(gen("a"))
    capped(sim, "a", 4)
    sim.req("p1", "P")
    sim.finish("p1", paused=True, prompt=1000, cached=900)
    sim.req("p2", "P")
    sim.finish("p2", paused=True, prompt=2700, cached=1000)  # +1,700 tokens of tool result
    assert sim.replica("a")["capacity"] == 4
    assert sim.replica("a")["prefix_misses"] == 0
    sim.req("q1", "Q")
    sim.req("q2", "Q")  # a second first turn, at once (it waits in Q's pin lane)
    sim.finish("q1", paused=True, prompt=1000, cached=900)
    sim.finish("q2", paused=True, prompt=1000, cached=0)  # nothing of Q's was cached yet
    assert sim.replica("a")["capacity"] == 4


def test_prefix_keeping_a_run_ending_opens_the_gate() -> None:
    """Prefix keeping: a pinned run that ends (RunEnded, or forgotten by the idle expiry)
    frees its place at once: the held new run goes in."""
    sim = Sim(gen("a"), params=Params(run_idle_expiry_s=100))
    capped(sim, "a", 2)
    for run in "PQ":
        sim.req(f"{run}1", run)
        sim.finish(f"{run}1", paused=True)
    assert sim.req("x1", "X") == ()
    assert admits(sim(RunEnded(sim.t, "P"))) == {"x1": "a"}
    sim.finish("x1", paused=True)  # X and Q pinned now
    assert sim.req("y1", "Y") == ()
    assert admits(sim.tick(150)) == {"y1": "a"}  # Q and X forgotten (idle 150 s)


def test_prefix_keeping_a_run_moving_off_an_unhealthy_replica_is_new_elsewhere() -> None:
    """Prefix keeping with S3: a held turn that may move because its replica turned
    unhealthy is a new run to the other replicas, and waits for their gate."""
    sim = Sim(gen("a"), gen("b"))
    capped(sim, "a", 1)  # b is not healthy yet
    sim.req("m1", "M")
    assert sim.req("m2", "M") == ()  # held for a
    capped(sim, "b", 2)
    for run in "PQ":
        assert admits(sim.req(f"{run}1", run)) == {f"{run}1": "b"}
        sim.finish(f"{run}1", paused=True)
    assert admits(sim.probe("a", False)) == {}  # b has slots, but P and Q hold its runs
    assert admits(sim(RunEnded(sim.t, "P"))) == {"m2": "b"}


def test_prefix_keeping_no_raise_while_no_new_run_waits() -> None:
    """Prefix keeping with S2's raise: pinned runs at the cap raise it only while a new
    run is actually held for it (otherwise the runs coming back would over-fill it)."""
    sim = Sim(gen("a"))
    capped(sim, "a", 2)
    for run in "PQ":
        sim.req(f"{run}1", run)
        sim.finish(f"{run}1", paused=True)
    sim.probe("a", True, running=0, waiting=0)
    assert sim.replica("a")["capacity"] == 2


def test_prefix_keeping_resync_pins_a_held_turn_with_its_run() -> None:
    """S11 with prefix keeping: a resync that says a run is paused on a replica moves
    that run's held turn to the replica's pin lane, so the gate on new runs does not
    keep it out when a slot frees."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("x1", "X")
    assert sim.req("r1", "R") == ()  # held as a new run: a is full
    sim(
        DataplaneResynced(
            sim.t,
            "dp",
            runs=(
                RunSnapshot("R", RunPhase.PAUSED_ON_TOOL, "a", BAT, "c"),
                RunSnapshot("X", RunPhase.GENERATING, "a", BAT, "c"),
            ),
            in_flight=(TurnSnapshot("x1", "X", "a", "m", BAT, "c", started=True),),
        )
    )
    assert admits(sim.finish("x1")) == {"r1": "a"}


def test_prefix_keeping_quiet_probe_raises_the_run_limit_not_the_cap_while_new_runs_wait() -> None:
    """Prefix keeping with S2: new runs held by the run limit let one more run live here per
    quiet probe without misses, but the cap (the engine's load) stays: the engine is not
    running at it. Runs waiting behind runs on tools are no evidence of the engine's room."""
    sim = Sim(gen("a"))
    capped(sim, "a", 2)
    sim.req("p1", "P")
    sim.req("q1", "Q")
    sim.finish("p1", paused=True)
    sim.finish("q1", paused=True)  # both on tools: nothing in flight
    assert sim.req("x1", "X") == ()
    assert admits(sim.probe("a", True, running=0, waiting=0)) == {"x1": "a"}
    assert sim.replica("a")["run_limit"] == 3
    assert sim.replica("a")["capacity"] == 2


# ===================================================================== S3


def test_s3_generating_run_stays_on_its_replica_even_when_other_idle() -> None:
    """S3: a generating run's next turn waits for its replica though another is idle."""
    sim = Sim(gen("a"), gen("b"))
    capped(sim, "a", 1)
    assert admits(sim.req("t1", "r")) == {"t1": "a"}  # b not yet healthy
    sim.probe("b", True)
    assert sim.req("t2", "r") == ()  # r is generating on a: held for a
    assert admits(sim.req("x", "other")) == {"x": "b"}  # b really is free
    assert admits(sim.finish("t1")) == {"t2": "a"}


def test_s3_paused_run_stays_on_its_replica_even_when_other_idle() -> None:
    """S3: a run paused on a tool returns only to the replica that served it."""
    sim = Sim(gen("a"), gen("b"), params=SPEC_RULES)
    capped(sim, "a", 1)
    sim.req("t1", "r")
    sim.finish("t1", paused=True)
    assert admits(sim.req("x", "other")) == {"x": "a"}  # b is not healthy yet
    sim.probe("b", True)
    assert sim.req("t2", "r") == ()  # b is idle, but r waits for a
    assert sim.replica("b")["in_flight"] == 0
    assert admits(sim.finish("x")) == {"t2": "a"}


def test_s3_idle_run_may_move() -> None:
    """S3: a run whose last turn ended without a tool call may go to another replica."""
    sim = Sim(gen("a"), gen("b"))
    capped(sim, "a", 1)
    sim.req("t1", "r")
    sim.finish("t1")  # idle
    sim.req("x", "other")  # fills a (b is not healthy yet)
    sim.probe("b", True)
    assert admits(sim.req("t2", "r")) == {"t2": "b"}


def test_s3_idle_run_prefers_last_replica_when_it_has_room() -> None:
    """S3: an idle run goes back to its last replica (prefix cache) over a less loaded one."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("b", True)
    sim.req("t1", "r")  # to b: a is not healthy yet
    sim.finish("t1")
    sim.req("y", "other")  # b now has one in flight
    sim.probe("a", True)
    assert admits(sim.req("t2", "r")) == {"t2": "b"}
    assert admits(sim.req("z", "new")) == {"z": "a"}  # a new run goes to the least loaded


def test_s3_run_on_unhealthy_replica_moves_with_its_held_turns() -> None:
    """S3: when a run's replica turns unhealthy, turns already held for it move elsewhere,
    and the run's next turns are no longer pinned."""
    sim = Sim(gen("a"), gen("b"), params=SPEC_RULES)
    capped(sim, "a", 1)
    sim.req("t1", "r")
    sim.req("u1", "q")  # held: a is full, b not healthy
    sim.probe("b", True)
    assert sim.view()["held_total"] == 0  # u1 (idle run) went to b
    sim.finish("t1", paused=True)
    sim.req("x", "other")  # back on a (b has one in flight)
    assert sim.req("t2", "r") == ()  # pinned to a
    acts = sim.probe("a", False)
    assert admits(acts) == {"t2": "b"}
    sim.finish("t2", paused=True)  # now paused on b
    sim.probe("b", False)
    sim.probe("a", True)
    assert admits(sim.req("t3", "r")) == {"t3": "a"}


def test_s3_paused_run_on_unhealthy_replica_moves_at_once() -> None:
    """S3: a paused run whose replica is unhealthy when its next turn arrives is not pinned."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("a", True)
    sim.req("t1", "r")
    sim.finish("t1", paused=True)
    sim.probe("a", False)
    sim.probe("b", True)
    assert admits(sim.req("t2", "r")) == {"t2": "b"}


def test_s3_turn_held_through_a_health_blip_keeps_affinity() -> None:
    """S3 (BUG): a paused run's held turn must go back to its replica once that replica is
    healthy again, not to another replica: the run is paused on a healthy replica at the
    moment of admission. The core moves the held turn to the free lane when the replica
    turns unhealthy and never pins it again, so one failed probe loses affinity."""
    sim = Sim(gen("a"), gen("b"), params=SPEC_RULES)
    capped(sim, "a", 1)
    capped(sim, "b", 1)
    sim.req("t1", "r")  # a
    sim.req("xb", "rb")  # b
    sim.req("x2", "r2")  # held
    assert admits(sim.finish("t1", paused=True)) == {"x2": "a"}
    assert sim.req("t2", "r") == ()  # pinned to a, a full
    sim.probe("a", False)  # a blip: t2 may move…
    sim.probe("a", True, running=1, waiting=1)  # …but a is back before anything freed
    acts = sim.finish("xb")  # b frees first
    assert admits(acts).get("t2") != "b"


def test_s3_parallel_held_turns_of_one_run_go_to_the_same_replica() -> None:
    """S3 (BUG): two turns of an idle run both held; once the first is admitted the run is
    generating there, so the second must wait for that replica, not go to another one."""
    sim = Sim(gen("a"), gen("b"))
    capped(sim, "a", 1)
    capped(sim, "b", 1)
    sim.req("xa", "ra")
    sim.req("xb", "rb")
    assert sim.req("t1", "r") == ()
    assert sim.req("t2", "r") == ()
    assert admits(sim.finish("xa")) == {"t1": "a"}  # r is now generating on a
    acts = sim.finish("xb")  # b frees while t1 still runs on a
    assert "t2" not in admits(acts)
    assert admits(sim.finish("t1")) == {"t2": "a"}


def test_s3_run_with_a_held_turn_is_not_forgotten() -> None:
    """S10/S3 (BUG): a run whose turn is held is not a run "with no turn"; the idle
    expiry must not forget it. The core forgets it (ForgetRun while its turn waits),
    admits the held turn without run state, and so loses the run's affinity: after that
    turn ends paused on a tool, the run's next turn goes to another replica."""
    params = Params(turn_timeout_s=10_000, run_idle_expiry_s=10, keep_prefixes=False)
    sim = Sim(gen("a"), gen("b"), params=params)
    capped(sim, "a", 1)
    sim.req("t0", "r0")  # a is full
    sim.req("t1", "r1")  # held (b not healthy)
    forgot = sim.tick(12)
    sim.t = 13
    assert admits(sim.finish("t0")) == {"t1": "a"}
    sim.t = 14
    sim.finish("t1", paused=True)  # r1 is paused on a tool on a
    assert admits(sim.req("x", "rx")) == {"x": "a"}  # fills a (b is not healthy yet)
    sim.probe("b", True)
    acts = sim.req("t2", "r1")
    assert "t2" not in admits(acts)  # must wait for a, where r1 is paused
    assert ForgetRun("r1") not in forgot


def test_s3_run_snapshot_on_single_pass_replica_does_not_pin_generative_turns() -> None:
    """S13/S6 (BUG): a generative turn must never be admitted to a single-pass replica.
    A resync that names a single-pass replica as a run's replica (a confused dataplane)
    pins the run there, and its next generative turn is admitted to the classifier."""
    sim = Sim(gen("a", "m"), single("sp", "m"))
    sim.probe("a")
    sim.probe("sp")
    snap = RunSnapshot("r", RunPhase.PAUSED_ON_TOOL, "sp", BAT, "c")
    sim(DataplaneResynced(sim.t, "dp", runs=(snap,)))
    assert admits(sim.req("t", "r")) == {"t": "a"}


# ===================================================================== S4


def test_s4_interactive_before_batch() -> None:
    """S4: with a slot free, a held interactive turn goes before an older held batch one."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("t0", "r0")
    sim.req("b1", "rb", cls=BAT, caller="x")
    sim.req("i1", "ri", cls=INT, caller="y")
    assert admitted_order(sim.finish("t0")) == ["i1"]
    assert admitted_order(sim.finish("i1")) == ["b1"]


def test_s4_batch_leaves_a_slot_per_paused_interactive_run() -> None:
    """S4: batch admissions leave one slot per interactive run paused on a tool there;
    interactive turns are not held back by it; the paused run's return takes the slot."""
    sim = Sim(gen("a"))
    capped(sim, "a", 3)
    sim.req("p1", "P", cls=INT)
    sim.req("q1", "Q", cls=INT)
    sim.finish("p1", paused=True)
    sim.finish("q1", paused=True)
    assert sim.replica("a")["reserved_for_interactive"] == 2
    assert admits(sim.req("b1", "B1")) == {"b1": "a"}  # 1 + 2 reserved = 3 = cap
    assert sim.req("b2", "B2") == ()
    assert admits(sim.req("p2", "P", cls=INT)) == {"p2": "a"}  # its own return
    assert sim.replica("a")["reserved_for_interactive"] == 1
    assert sim.view()["held_total"] == 1  # b2 still leaves Q's slot
    assert admits(sim.req("q2", "Q", cls=INT)) == {"q2": "a"}
    assert sim.replica("a")["in_flight"] == 3


def test_s4_interactive_turn_of_another_run_may_use_a_reserved_slot() -> None:
    """S4: only batch admissions leave the reserved slot free."""
    sim = Sim(gen("a"))
    capped(sim, "a", 2)
    sim.req("p1", "P", cls=INT)
    sim.finish("p1", paused=True)
    sim.req("b1", "B1")
    assert sim.req("b2", "B2") == ()
    assert admits(sim.req("i1", "I", cls=INT)) == {"i1": "a"}


def test_s4_interactive_is_not_held_for_the_cap_where_the_engine_orders_classes() -> None:
    """S4/S2: on a replica whose engine orders its queue by class (the dataplane sends a
    per-class priority), an interactive turn is admitted over the cap, where it waits in
    the engine only behind interactive work; batch is still held at the cap, and a
    replica without engine ordering still holds interactive turns."""
    sim = Sim(replace(gen("a"), orders_classes=True), gen("b"))
    capped(sim, "a", 1)
    capped(sim, "b", 1)
    sim.req("a0", "ra", caller="x")
    sim.req("b0", "rb", caller="y")
    assert sim.replica("a")["in_flight"] == 1 and sim.replica("b")["in_flight"] == 1
    held_batch = sim.req("b1", "rbatch")
    assert admits(held_batch) == {}
    # The interactive run's first turn: placed on a (b would hold it), over a's cap.
    assert admits(sim.req("i1", "ri", cls=INT)) == {"i1": "a"}
    assert sim.replica("a")["in_flight"] == 2
    sim.finish("i1", paused=True)
    # Its return after the tool is admitted at once, though a is still full.
    assert admits(sim.req("i2", "ri", cls=INT)) == {"i2": "a"}
    # Batch waits for the cap: freeing one slot of a (now 2 in flight, cap 1) admits none.
    assert "b1" not in admits(sim.finish("a0"))
    assert admits(sim.finish("i2")) == {"b1": "a"}
    # Without engine ordering the same interactive turn waits for the cap.
    plain = Sim(gen("b"))
    capped(plain, "b", 1)
    plain.req("x0", "rx")
    assert admits(plain.req("j1", "rj", cls=INT)) == {}
    assert admits(plain.finish("x0")) == {"j1": "b"}


def test_s4_batch_runs_paused_on_a_tool_reserve_nothing() -> None:
    """S4: only interactive paused runs reserve a slot."""
    sim = Sim(gen("a"), params=SPEC_RULES)
    capped(sim, "a", 1)
    sim.req("p1", "P", cls=BAT)
    sim.finish("p1", paused=True)
    assert sim.replica("a")["reserved_for_interactive"] == 0
    assert admits(sim.req("b1", "B1")) == {"b1": "a"}


def test_s4_reservation_released_on_run_ended() -> None:
    """S4/D8: RunEnded releases the paused run's reservation; held batch goes in."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("p1", "P", cls=INT)
    sim.finish("p1", paused=True)
    assert sim.req("b1", "B1") == ()
    assert admits(sim(RunEnded(sim.t, "P"))) == {"b1": "a"}
    assert sim.replica("a")["reserved_for_interactive"] == 0


def test_s4_reservation_released_on_idle_expiry() -> None:
    """S4/S10: a paused interactive run forgotten by idle expiry frees its slot."""
    sim = Sim(gen("a"), params=Params(run_idle_expiry_s=100))
    capped(sim, "a", 1)
    sim.req("p1", "P", cls=INT)
    sim.t = 5
    sim.finish("p1", paused=True)
    sim.t = 50
    assert sim.req("b1", "B1") == ()
    assert sim.tick(104) == ()
    acts = sim.tick(105)
    assert acts == (ForgetRun("P"), Admit("b1", "a", 105 - 50))


def test_s4_reservation_released_when_its_next_turn_is_admitted() -> None:
    """S4: the reservation ends when the paused run's next turn is admitted; once that
    turn ends without a tool call, the slot goes to batch."""
    sim = Sim(gen("a"))
    capped(sim, "a", 2)
    sim.req("p1", "P", cls=INT)
    sim.finish("p1", paused=True)
    sim.req("b1", "B1")
    assert sim.req("b2", "B2") == ()
    sim.req("p2", "P", cls=INT)
    assert sim.replica("a")["reserved_for_interactive"] == 0
    assert sim.replica("a")["in_flight"] == 2
    assert admits(sim.finish("p2")) == {"b2": "a"}


def test_s4_a_run_back_from_a_tool_as_batch_is_not_held_by_its_own_reservation() -> None:
    """S4, liveness: an interactive run paused on a tool holds a slot for its return. If
    its next turn comes back as batch (the client changed the class), that turn must not
    wait for the run's own reservation: on a replica capped at 1 it would wait forever.
    The run has returned, so the reservation ends and the turn takes the slot."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("p1", "P", cls=INT)
    sim.finish("p1", paused=True)
    assert sim.replica("a")["reserved_for_interactive"] == 1
    assert admits(sim.req("p2", "P", cls=BAT)) == {"p2": "a"}
    assert sim.replica("a")["reserved_for_interactive"] == 0
    # ... and when the slot is taken by another run's turn, it waits for that, not itself
    sim.finish("p2", paused=True)  # a batch run now: paused without a reservation
    sim.req("q1", "Q", cls=INT)
    assert sim.req("p3", "P", cls=BAT) == ()
    assert admits(sim.finish("q1")) == {"p3": "a"}


def test_s4_reservation_released_when_next_turn_goes_elsewhere() -> None:
    """S4/S3: a paused run whose replica went unhealthy moves, and drops its old reservation."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("a")
    sim.req("p1", "P", cls=INT)
    sim.finish("p1", paused=True)
    sim.probe("a", False)
    sim.probe("b")
    assert admits(sim.req("p2", "P", cls=INT)) == {"p2": "b"}
    assert sim.replica("a")["reserved_for_interactive"] == 0


# ===================================================================== S5


def test_s5_fewest_in_flight_caller_first() -> None:
    """S5: within a class, the caller with the fewest in-flight turns goes first."""
    sim = Sim(gen("a"))
    capped(sim, "a", 2)
    sim.req("x1", "rx1", caller="X")
    sim.req("z1", "rz1", caller="Z")
    sim.req("x2", "rx2", caller="X")  # held first
    sim.req("y1", "ry1", caller="Y")  # held later
    assert admitted_order(sim.finish("z1")) == ["y1"]  # Y has 0 in flight, X has 1


def test_s5_ties_broken_by_arrival() -> None:
    """S5: equal in-flight counts: the earlier held turn goes first."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("z1", "rz", caller="Z")
    sim.req("q1", "rq", caller="Q")
    sim.req("p1", "rp", caller="P")
    assert admitted_order(sim.finish("z1")) == ["q1"]
    assert admitted_order(sim.finish("q1")) == ["p1"]


def test_s5_a_flood_from_one_caller_does_not_starve_another() -> None:
    """S5: caller F floods, caller G sends one turn after the flood; G's turn is admitted
    before the flood's later turns."""
    sim = Sim(gen("a"))
    capped(sim, "a", 2)
    for i in range(10):
        sim.req(f"f{i}", f"rf{i}", caller="F")
    sim.req("g0", "rg", caller="G")
    order: list[str] = []
    for i in range(10):
        order += admitted_order(sim.finish(f"f{i}"))
    assert order[0] == "g0"
    assert order[1:] == [f"f{i}" for i in range(2, 10)]


def test_s5_fairness_within_class_only() -> None:
    """S4 over S5: an interactive turn goes first even when its caller has more in flight."""
    sim = Sim(gen("a"))
    capped(sim, "a", 2)
    sim.req("x1", "rx1", caller="X", cls=INT)
    sim.req("z1", "rz1", caller="Z")
    sim.req("y1", "ry1", caller="Y", cls=BAT)
    sim.req("x2", "rx2", caller="X", cls=INT)
    assert admitted_order(sim.finish("z1")) == ["x2"]


# ===================================================================== S6


def test_s6_unknown_model_rejected_never_held() -> None:
    """S6: an unknown model is rejected at once with the documented message, never queued."""
    sim = Sim(gen("a", "m"))  # a not even healthy: still rejected, not held
    acts = sim.req("t1", "r1", model="nope")
    assert acts == (
        Reject("t1", RejectCode.UNKNOWN_MODEL, "no Generative replica serves model 'nope'"),
    )
    assert sim.view()["held_total"] == 0
    assert sim.view()["runs_total"] == 0
    assert "t1" not in admits(sim.probe("a"))


def test_s6_model_served_only_by_single_pass_is_unknown_for_generative() -> None:
    """S6/S13: a generative turn for a model only a single-pass replica serves is unknown."""
    sim = Sim(gen("a", "m"), single("sp", "cls"))
    sim.probe("a")
    sim.probe("sp")
    acts = sim.req("t1", "r1", model="cls")
    assert acts == (
        Reject("t1", RejectCode.UNKNOWN_MODEL, "no Generative replica serves model 'cls'"),
    )
    assert sim.view()["held_total"] == 0


def test_s6_turn_goes_only_to_a_replica_serving_its_model() -> None:
    """S6: a turn only goes to a replica serving its model, even if another is emptier."""
    sim = Sim(gen("a", "m1"), gen("b", "m1", "m2"))
    sim.probe("a")
    sim.probe("b")
    sim.req("t1", "r1", model="m2")
    sim.req("t2", "r2", model="m2")
    assert admits(sim.req("t3", "r3", model="m2")) == {"t3": "b"}
    assert admits(sim.req("t4", "r4", model="m1")) == {"t4": "a"}


# ===================================================================== S10


def test_s10_unreported_turn_expires_and_frees_its_slot() -> None:
    """S10: a turn never reported finished is dropped after turn_timeout_s (DropTurn
    EXPIRED) and a held turn takes its slot; a late report for it is ignored."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("t1", "r1")
    sim(TurnStarted(0.5, "t1"))
    sim.t = 10
    sim.req("t2", "r2")
    assert sim.tick(599) == ()
    acts = sim.tick(600)
    assert acts == (DropTurn("t1", "a", DropReason.EXPIRED), Admit("t2", "a", 590.0))
    assert sim.finish("t1") == ()
    assert sim.replica("a")["in_flight"] == 1


def test_a_dropped_turn_names_its_trace() -> None:
    """S10, X1: the trace a turn was requested with stays with it once admitted, so the
    drop of an unreported turn (logged by the service) leads to its trace."""
    sim = Sim(gen("a"))
    sim.probe("a")
    sim.req("t1", "r1", trace="ef" * 16)
    assert sim.tick(601) == (DropTurn("t1", "a", DropReason.EXPIRED, "ef" * 16),)


def test_s10_expiry_respects_fractional_deadlines() -> None:
    """S10: a turn admitted at 0.5 is not dropped before 600.5."""
    sim = Sim(gen("a"))
    sim.probe("a")
    sim.t = 0.5
    sim.req("t1", "r1")
    assert sim.tick(600.4) == ()
    assert sim.tick(601) == (DropTurn("t1", "a", DropReason.EXPIRED),)


def test_s10_idle_run_forgotten_and_next_turn_starts_without_affinity() -> None:
    """S10: a run with no turn for run_idle_expiry_s is forgotten (ForgetRun); its next
    turn starts fresh: it no longer prefers its last replica."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("b")
    sim.req("t1", "r")  # b
    sim.t = 10
    sim.finish("t1")  # idle on b
    sim.probe("a")
    assert sim.tick(1809) == ()
    assert sim.tick(1810) == (ForgetRun("r"),)
    assert sim.view()["runs_total"] == 0
    assert admits(sim.req("y", "ry")) == {"y": "b"}  # tie: rotates with arrival order
    sim.finish("y", paused=True)  # ry lives on b now
    # A remembered idle run would go back to b (it has room); a fresh one goes to the
    # least loaded replica.
    assert admits(sim.req("t2", "r")) == {"t2": "a"}


def test_s10_run_with_in_flight_turn_not_forgotten() -> None:
    """S10: a run with an admitted turn is not forgotten, however long the turn runs."""
    sim = Sim(gen("a"), params=Params(turn_timeout_s=10_000, run_idle_expiry_s=100))
    sim.probe("a")
    sim.req("t1", "r")
    assert sim.tick(500) == ()
    assert sim.view()["runs_total"] == 1
    sim.finish("t1")
    assert sim.tick(599) == ()
    assert sim.tick(600) == (ForgetRun("r"),)


def test_s10_new_turn_request_postpones_expiry() -> None:
    """S10: each turn resets the run's idle clock."""
    sim = Sim(gen("a"), params=Params(run_idle_expiry_s=100))
    sim.probe("a")
    sim.req("t1", "r")
    sim.finish("t1")
    sim.t = 90
    sim.req("t2", "r")
    sim.finish("t2")
    assert sim.tick(150) == ()
    assert sim.tick(190) == (ForgetRun("r"),)


def test_s10_run_ended_with_a_turn_in_flight_keeps_counts_sound() -> None:
    """S10/D8 (BUG): RunEnded while a turn is in flight, then a late turn of the same run
    (a confused peer): the core recreates the run with in_flight=0 although the old turn
    is still admitted, so ``violations`` reports a miscount; when the old turn then
    finishes, the run is marked idle while its new turn still generates (affinity lost)."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("a")
    sim.req("t1", "r")
    sim(RunEnded(1, "r"))
    sim.t = 2
    sim.req("t2", "r")  # Sim asserts violations(state) == [] here
    sim.t = 3
    sim.finish("t1")
    sim.probe("b")
    sim.req("x", "other")  # a now has t2 and x
    assert admits(sim.req("t3", "r")) == {"t3": "a"}  # r is generating on a


# ===================================================================== S11


def _resynced(sim: Sim) -> None:
    sim(
        DataplaneResynced(
            sim.t,
            "dp",
            runs=(
                RunSnapshot("P", RunPhase.PAUSED_ON_TOOL, "a", INT, "c1"),
                RunSnapshot("G", RunPhase.GENERATING, "b", BAT, "c2"),
                RunSnapshot("I", RunPhase.IDLE, "b", BAT, "c2"),
            ),
            in_flight=(TurnSnapshot("g1", "G", "b", "m", BAT, "c2", started=True),),
        )
    )


def test_s11_resync_into_fresh_state_restores_counts_and_reservations() -> None:
    """S11: after a restart, in-flight counts, caller counts and reservations are back."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("a", True, running=1, waiting=1)
    sim.probe("b", True)
    _resynced(sim)
    v = sim.view()
    assert sim.replica("a")["reserved_for_interactive"] == 1
    assert sim.replica("b")["in_flight"] == 1
    assert v["callers_in_flight"] == {"c2": 1}
    assert v["runs"] == {
        "generating": {"batch": 1},
        "idle": {"batch": 1},
        "paused_on_tool": {"interactive": 1},
    }
    # a has cap 1 and one reservation: a batch turn of a new run goes to b
    assert admits(sim.req("x", "X")) == {"x": "b"}


def test_s11_resync_restores_affinity() -> None:
    """S11/S3: resynced paused and generating runs are pinned to their replicas; the
    paused interactive run takes its reserved slot; the idle one prefers its last replica."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("a", True, running=1, waiting=1)
    sim.probe("b", True, running=2, waiting=1)
    _resynced(sim)
    assert admits(sim.req("p2", "P", cls=INT, caller="c1")) == {"p2": "a"}
    assert admits(sim.req("i2", "I", caller="c2")) == {"i2": "b"}  # prefers b, has room
    assert sim.req("g2", "G", caller="c2") == ()  # pinned to b, which is full
    assert sim.view()["held_total"] == 1
    assert admits(sim(TurnFinished(sim.t, "g1"))) == {"g2": "b"}


def test_s11_held_turns_rerequested_after_resync_keep_their_ids() -> None:
    """S11: turns held during the outage are re-sent with their IDs and admitted with them."""
    old = Sim(gen("a"))
    capped(old, "a", 1)
    old.req("g1", "G")
    old.req("h1", "H", caller="c3")
    assert old.view()["held_total"] == 1
    # scheduler restarts: a fresh state, the dataplane resyncs and re-sends h1
    sim = Sim(gen("a"))
    sim.probe("a", True, running=1, waiting=1)
    sim(
        DataplaneResynced(
            0,
            "dp",
            runs=(RunSnapshot("G", RunPhase.GENERATING, "a", BAT, "c"),),
            in_flight=(TurnSnapshot("g1", "G", "a", "m", BAT, "c"),),
        )
    )
    assert sim.req("h1", "H", caller="c3") == ()
    assert admits(sim.finish("g1")) == {"h1": "a"}


def test_s11_resent_admit_answers_same_replica() -> None:
    """S11: a re-sent Admit for an admitted turn gets the same replica and takes no slot;
    a re-sent Admit for a held turn keeps its place and is not queued twice."""
    sim = Sim(gen("a"), gen("b"))
    capped(sim, "a", 1)
    sim.probe("b")
    sim.req("t1", "r")
    assert sim.req("t1", "r") == (Admit("t1", "a", 0.0),)
    assert sim.replica("a")["in_flight"] == 1
    sim.probe("b", False)
    sim.req("t2", "r2")
    assert sim.req("t2", "r2") == ()
    assert sim.view()["held_total"] == 1


def test_s11_resync_releases_missing_turns_of_that_dataplane_only() -> None:
    """S11: admitted turns of the resyncing dataplane missing from its list are released
    (DropTurn RELEASED) and their slots freed; other dataplanes' turns are untouched."""
    sim = Sim(gen("a"))
    capped(sim, "a", 3)
    sim.req("t1", "r1", dp="dp1")
    sim.req("t2", "r2", dp="dp1")
    sim.req("t3", "r3", dp="dp2")
    sim.req("h", "rh", dp="dp2")
    keep = TurnSnapshot("t1", "r1", "a", "m", BAT, "c")
    acts = sim(DataplaneResynced(sim.t, "dp1", in_flight=(keep,)))
    assert acts == (DropTurn("t2", "a", DropReason.RELEASED), Admit("h", "a", 0.0))
    assert sim.replica("a")["in_flight"] == 3
    assert sim.finish("t3") == ()  # t3 was untouched and still counted


# ===================================================================== S13


def test_s11_turns_of_a_dataplane_that_never_comes_back_are_released() -> None:
    """S11: when a dataplane stops reporting, its admitted turns stay counted for the
    grace, then are released (slots freed, runs idle, held turns admitted); another
    dataplane's turns are untouched."""
    sim = Sim(gen("a"), params=replace(SPEC_RULES, dataplane_grace_s=15.0))
    capped(sim, "a", 2)
    sim.req("t1", "r1", dp="dead")
    sim.req("t2", "r2", dp="alive")
    assert sim.req("t3", "r3", dp="alive") == ()  # held: a is full
    sim(DataplaneDisconnected(sim.t, "dead"))
    assert sim.tick(14.0) == ()
    assert sim.view()["dataplanes_lost"] == {"dead": 1.0}
    acts = sim.tick(15.0)
    assert [a for a in acts if isinstance(a, DropTurn)] == [
        DropTurn("t1", "a", DropReason.RELEASED)
    ]
    assert admits(acts) == {"t3": "a"}
    assert sim.state.runs["r1"].phase is RunPhase.IDLE
    assert set(sim.state.turns) == {"t2", "t3"}


def test_s11_a_dataplane_back_within_its_grace_keeps_its_turns() -> None:
    """S11: a dataplane whose report stream reopens (or that resyncs) within the grace
    keeps its turns; only a later loss starts a new grace."""
    sim = Sim(gen("a"), params=replace(SPEC_RULES, dataplane_grace_s=15.0))
    sim.probe("a")
    sim.req("t1", "r1", dp="x")
    sim(DataplaneDisconnected(sim.t, "x"))
    sim.t = 1.0
    sim(DataplaneConnected(sim.t, "x"))
    assert sim.tick(30.0) == ()
    sim(DataplaneDisconnected(sim.t, "x"))
    sim(
        DataplaneResynced(
            sim.t, "x", in_flight=(TurnSnapshot("t1", "r1", "a", "m", BAT, "c", started=True),)
        )
    )
    assert sim.tick(60.0) == ()
    assert set(sim.state.turns) == {"t1"}


def test_s13_single_pass_turns_bypass_generative_slots() -> None:
    """S13: single-pass turns go to single-pass replicas at once even when every
    generative replica is full, and never enter run state or caller counts."""
    sim = Sim(gen("a", "m"), single("sp", "cls"))
    capped(sim, "a", 1)
    sim.probe("sp")
    sim.req("t1", "r")
    sim.req("t2", "r2")  # held
    acts = sim.req("s1", "r", model="cls", kind=SP, caller="k")
    assert admits(acts) == {"s1": "sp"}
    v = sim.view()
    assert v["runs_total"] == 2
    assert v["callers_in_flight"] == {"c": 1}
    assert v["in_flight_total"] == 1  # generative only
    assert sim.replica("sp")["in_flight"] == 1
    # finishing the single-pass turn frees no generative slot and touches run r not at all
    assert sim(TurnFinished(sim.t, "s1", paused_on_tool=True)) == ()
    assert sim.view()["held_total"] == 1
    assert sim.replica("a")["reserved_for_interactive"] == 0


def test_s13_single_pass_replicas_have_their_own_caps() -> None:
    """S13: a full single-pass replica holds single-pass turns without touching generative ones."""
    sim = Sim(gen("a", "m"), single("sp", "cls"))
    sim.probe("a")
    capped(sim, "sp", 1)
    sim.req("s1", "x1", model="cls", kind=SP)
    assert sim.req("s2", "x2", model="cls", kind=SP) == ()
    assert admits(sim.req("t1", "r1")) == {"t1": "a"}
    assert admits(sim(TurnFinished(sim.t, "s1"))) == {"s2": "sp"}


def test_s13_abandoned_single_pass_turn_does_not_keep_a_run_alive() -> None:
    """S13, S10: a held single-pass turn that names a generative run and is abandoned
    does not touch that run: it still expires on its own idle clock."""
    sim = Sim(gen("a", "m"), single("sp", "cls"), params=Params(run_idle_expiry_s=60.0))
    sim.probe("a")
    capped(sim, "sp", 1)
    sim.req("s1", "x", model="cls", kind=SP)
    sim.req("t1", "r")
    sim.finish("t1")  # r idle since t=0
    sim.t = 30.0
    assert sim.req("s2", "r", model="cls", kind=SP) == ()  # held behind s1
    sim(TurnAbandoned(sim.t, "s2"))
    assert any(isinstance(a, ForgetRun) and a.run_id == "r" for a in sim.tick(61.0))


def test_s13_unknown_single_pass_model_rejected() -> None:
    """S6/S13: a single-pass turn for a model only generative replicas serve is unknown."""
    sim = Sim(gen("a", "m"), single("sp", "cls"))
    acts = sim.req("s1", "x", model="m", kind=SP)
    assert len(acts) == 1 and isinstance(acts[0], Reject)
    assert acts[0].code is RejectCode.UNKNOWN_MODEL


# ============================================================ abandonment


def test_abandoned_held_turn_leaves_queue_and_is_never_admitted() -> None:
    """A held turn whose client left leaves the queue; freeing capacity never admits it."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("t1", "r1")
    sim.req("t2", "r2")
    sim.req("t3", "r3")
    assert sim(TurnAbandoned(sim.t, "t2")) == ()
    assert sim.view()["held_total"] == 1
    assert admits(sim.finish("t1")) == {"t3": "a"}
    assert admits(sim.finish("t3")) == {}
    assert admits(sim.probe("a")) == {}


def test_abandoned_admitted_turn_before_start_frees_its_slot() -> None:
    """An admitted turn abandoned before it started frees its slot for a held turn."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("t1", "r1")
    sim.req("t2", "r2")
    assert admits(sim(TurnAbandoned(sim.t, "t1"))) == {"t2": "a"}
    assert sim.finish("t1") == ()  # late report of the abandoned turn is ignored
    assert sim.replica("a")["in_flight"] == 1


def test_abandoned_after_start_keeps_the_slot() -> None:
    """Once the engine request started, abandonment does not free the slot (the engine
    still runs it; the finish report frees it)."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("t1", "r1")
    sim(FirstTokenReceived(sim.t, "t1"))
    sim.req("t2", "r2")
    assert sim(TurnAbandoned(sim.t, "t1")) == ()
    assert admits(sim.finish("t1")) == {"t2": "a"}


def test_failed_turn_frees_slot_and_leaves_run_idle() -> None:
    """D5: a failed turn frees its slot and leaves its run idle (free to move)."""
    sim = Sim(gen("a"), gen("b"))
    capped(sim, "a", 1)
    sim.req("t1", "r")
    sim.req("x", "other")
    assert admits(sim(TurnFailed(sim.t, "t1"))) == {"x": "a"}
    sim.probe("b")
    assert admits(sim.req("t2", "r")) == {"t2": "b"}


# ============================================================= bad input


def test_invalid_requests_rejected_not_raised() -> None:
    """Bad input never raises: empty or over-long IDs and an empty model → INVALID_REQUEST."""
    sim = Sim(gen("a"))
    sim.probe("a")
    long_id = "x" * 257
    cases = [
        ("", "r", "m"),
        ("t", "", "m"),
        ("t", "r", ""),
        (long_id, "r", "m"),
        ("t", long_id, "m"),
    ]
    for turn, run, model in cases:
        acts = sim(TurnRequested(0, turn, run, model))
        assert len(acts) == 1 and isinstance(acts[0], Reject), (turn, run, model)
        assert acts[0].code is RejectCode.INVALID_REQUEST
        assert acts[0].turn_id == turn
    v = sim.view()
    assert v["runs_total"] == 0 and v["held_total"] == 0 and v["in_flight_total"] == 0
    ok = "y" * 256
    assert admits(sim(TurnRequested(0, ok, ok, "m"))) == {ok: "a"}


def test_events_for_unknown_things_do_nothing() -> None:
    """Events about unknown turns, runs or replicas are ignored, never raise."""
    sim = Sim(gen("a"))
    sim.probe("a")
    sim.req("t1", "r1")
    before = sim.view()
    events: list[Event] = [
        TurnStarted(1, "nope"),
        FirstTokenReceived(1, "nope"),
        TurnFinished(1, "nope", paused_on_tool=True),
        TurnFailed(1, "nope"),
        TurnAbandoned(1, "nope"),
        RunEnded(1, "nope"),
        ReplicaProbed(1, "nope", True, 1, 1),
        ReplicaProbed(1, "nope", False),
        DataplaneResynced(
            1,
            "dp-x",
            runs=(RunSnapshot("", RunPhase.IDLE, None, BAT, ""),),
            in_flight=(
                TurnSnapshot("z", "rz", "nope", "m", BAT, "c"),
                TurnSnapshot("z2", "rz", "a", "not-served", BAT, "c"),
                TurnSnapshot("", "rz", "a", "m", BAT, "c"),
            ),
        ),
    ]
    for ev in events:
        assert sim(ev) == (), ev
    assert sim.view() == before


def test_event_stamped_in_the_past_does_not_move_clock_back() -> None:
    """S1: the core's clock never runs backwards; a late-stamped event is applied at 'now'."""
    sim = Sim(gen("a"), params=Params(turn_timeout_s=10))
    sim.probe("a")
    sim.tick(100)
    sim(TurnRequested(5, "t1", "r1", "m"))  # stamped before now
    assert sim.tick(109) == ()
    assert sim.tick(110) == (DropTurn("t1", "a", DropReason.EXPIRED),)


# ================================================================ S12 view


def test_status_view_shape() -> None:
    """S12: per replica in-flight and capacity; held by class and caller with oldest wait;
    runs by phase and class."""
    sim = Sim(gen("a", "m"), single("sp", "cls"))
    capped(sim, "a", 1)
    sim.req("t1", "r1", cls=INT, caller="alice")
    sim.t = 2
    sim.req("t2", "r2", cls=BAT, caller="bob")
    sim.t = 3
    sim.req("t3", "r3", cls=BAT, caller="bob", trace="ab" * 16)
    sim.req("t4", "r4", cls=INT, caller="carol", trace="cd" * 16)
    v = status(sim.state, 5.0)
    assert set(v) == {
        "replicas",
        "held",
        "held_total",
        "in_flight_total",
        "runs",
        "runs_total",
        "callers_in_flight",
        "in_flight_by_dataplane",
        "dataplanes_lost",
        "tool_times",
        "interactive_target",
        "batch_withheld_by_target",
        "held_order",
    }
    assert v["interactive_target"] == "100ms" and v["batch_withheld_by_target"] == 0
    assert v["held_order"] == {"fairness": "in_flight", "batch_order": "arrival"}
    assert v["dataplanes_lost"] == {}
    assert v["tool_times"] == {}
    assert sum(v["in_flight_by_dataplane"].values()) == len(sim.state.turns) > 0
    assert [r["name"] for r in v["replicas"]] == ["a", "sp"]
    a = v["replicas"][0]
    assert a == {
        "name": "a",
        "kind": "generative",
        "models": ["m"],
        "healthy": True,
        "in_flight": 1,
        "capacity": 1,
        "capacity_ramping": False,
        "engine_orders_classes": False,
        "reserved_for_interactive": 0,
        "runs_pinned": 1,
        "run_limit": 1,
        "runs_lapsed": 0,
        "engine_running": 1,
        "engine_waiting": 1,
        "kv_usage": None,
        "prefix_misses": 0,
        "batch_in_flight": 0,
        "batch_limit_from_pace": None,
        "pace_s_per_token": None,
        "best_pace_s_per_token": None,
        "target_pace_s_per_token": 0.1,  # the default 100 ms: no reply has set a floor
        "batch_withheld_by_target": 0,  # no interactive run lives there
        "probed_s_ago": 5.0,
        "kv_tokens": None,
        "working_set_tokens": 0,
        "membership": "serving",
        "drain_moves_s_from_now": None,
    }
    sp = v["replicas"][1]
    assert sp["healthy"] is False and sp["probed_s_ago"] is None and sp["kind"] == "single_pass"
    # X1: the oldest held turn's trace (t2 was sent without one; t4 with one).
    assert v["held"] == {
        "batch": {"bob": {"held": 2, "oldest_wait_s": 3.0, "oldest_trace_id": None}},
        "interactive": {"carol": {"held": 1, "oldest_wait_s": 2.0, "oldest_trace_id": "cd" * 16}},
    }
    assert v["held_total"] == 3
    assert v["in_flight_total"] == 1
    assert v["runs"] == {"generating": {"interactive": 1}, "idle": {"batch": 2, "interactive": 1}}
    assert v["runs_total"] == 4
    assert v["callers_in_flight"] == {"alice": 1}


def test_run_ended_with_a_held_turn_keeps_counts_sound() -> None:
    """D8/S10: RunEnded while one of the run's turns is held (its client still waits);
    when that turn is then admitted, the state must stay sound (``violations`` empty:
    every admitted generative turn belongs to a known run) and the turn must finish
    cleanly."""
    sim = Sim(gen("a"))
    capped(sim, "a", 1)
    sim.req("t0", "r0")
    sim.req("t1", "r")  # held
    sim(RunEnded(sim.t, "r"))
    assert admits(sim.finish("t0")) == {"t1": "a"}  # Sim checks violations here
    assert sim.finish("t1") == ()
    assert sim.view()["in_flight_total"] == 0


def test_s13_resync_does_not_count_single_pass_turns_as_run_turns() -> None:
    """S13/S11: single-pass turns never enter run state. An agent run that made a
    classifier call shares its run ID with it; a resync listing both the run and that
    single-pass turn must leave the run's in-flight count at its generative turns only
    (``violations`` empty), so its turns finishing leave it idle and forgettable."""
    sim = Sim(gen("a", "m"), single("sp", "cls"))
    sim.probe("a")
    sim.probe("sp")
    sim.req("t1", "r")
    sim.req("s1", "r", model="cls", kind=SP)
    sim(
        DataplaneResynced(
            sim.t,
            "dp",
            runs=(RunSnapshot("r", RunPhase.GENERATING, "a", BAT, "c"),),
            in_flight=(
                TurnSnapshot("t1", "r", "a", "m", BAT, "c"),
                TurnSnapshot("s1", "r", "sp", "cls", BAT, "c"),
            ),
        )
    )  # Sim checks violations here
    sim.finish("t1")
    assert sim.view()["runs"] == {"idle": {"batch": 1}}


def test_s11_resync_keeps_the_runs_last_replica_from_its_snapshot() -> None:
    """S11/S3: the dataplane's RunSnapshot says which replica served the run's last turn.
    A run with turns in flight on two replicas (one moved off a replica that was
    unhealthy) must keep the snapshot's replica after a resync, whatever the order of
    the listed turns; the core takes the replica of the last listed turn instead."""
    sim = Sim(gen("a"), gen("b"))
    sim.probe("a", True, running=1, waiting=1)  # cap 1
    sim.probe("b")
    sim(
        DataplaneResynced(
            sim.t,
            "dp",
            runs=(RunSnapshot("r", RunPhase.GENERATING, "b", BAT, "c"),),
            in_flight=(
                TurnSnapshot("t1", "r", "b", "m", BAT, "c"),
                TurnSnapshot("t0", "r", "a", "m", BAT, "c"),
            ),
        )
    )
    assert admits(sim.req("t2", "r")) == {"t2": "b"}  # a is full; r belongs on b


def test_s10_idle_clock_starts_when_a_held_turn_is_abandoned() -> None:
    """S10: a held turn is a turn. A run whose only turn waited 50 s and was then
    abandoned has had no turn for 11 s at t=61, not 61 s: it is forgotten at 110, not
    at the first tick past request time + run_idle_expiry_s."""
    sim = Sim(gen("a"), params=Params(turn_timeout_s=10_000, run_idle_expiry_s=60))
    sim.req("t1", "r")  # held: a was never probed healthy
    sim.t = 50
    assert sim(TurnAbandoned(sim.t, "t1")) == ()
    assert sim.tick(61) == ()
    assert sim.tick(110) == (ForgetRun("r"),)


# ===================================================================== decode pace

PACED = Params(interactive_pace_s=0.1)


def streamed(sim: Sim, turn: str, tokens: int, s_per_token: float, **finish: Any) -> tuple:
    """``turn`` streams its first token now and ``tokens`` in all at ``s_per_token``; the
    clock moves to its end."""
    sim(FirstTokenReceived(sim.t, turn))
    sim.t += (tokens - 1) * s_per_token
    return sim.finish(turn, reply=tokens, **finish)


def paced_replica(batch: int = 6, best: float = 0.01) -> Sim:
    """Replica ``a`` (its engine reports no queue: no S2 cap) whose fastest reply so far
    streamed at ``best`` s per token, then an interactive run ``i`` in flight and
    ``batch`` batch turns ``b0``… beside it."""
    sim = Sim(gen("a"), params=PACED)
    sim.probe("a", running=0, waiting=0)
    sim.req("alone", "r-alone")
    streamed(sim, "alone", 21, best)
    assert admits(sim.req("ti", "i", cls=INT, caller="u")) == {"ti": "a"}
    for n in range(batch):
        assert admits(sim.req(f"b{n}", f"rb{n}")) == {f"b{n}": "a"}
    return sim


def test_pace_too_slow_beside_an_interactive_run_limits_batch_turns() -> None:
    """Decode pace: a reply slower than ``interactive_pace_s`` per token, on a replica where
    an interactive run lives, cuts its batch turns to 3/4 of those that ran beside it;
    further batch turns wait while interactive ones still go in."""
    sim = paced_replica(6)
    sim.t = 1.0
    streamed(sim, "b0", 21, 0.3)  # 0.3 s per token, 6 batch turns ran: limit 4
    rep = sim.replica("a")
    assert rep["batch_limit_from_pace"] == 4 and rep["batch_in_flight"] == 5
    assert rep["best_pace_s_per_token"] == 0.01
    assert rep["capacity"] is None  # S2's cap is not touched
    assert sim.req("b9", "rb9") == ()  # held: 5 batch turns in flight, limit 4
    assert admits(sim.req("ti2", "i2", cls=INT, caller="u")) == {"ti2": "a"}
    # a turn admitted before the cut says nothing about the limit as it is: no second cut
    assert streamed(sim, "b1", 21, 0.5) == ()  # 4 batch turns in flight: at the limit
    assert sim.replica("a")["batch_limit_from_pace"] == 4
    assert admits(streamed(sim, "b2", 21, 0.5)) == {"b9": "a"}  # 3: room for one


def test_pace_limit_only_binds_while_an_interactive_run_lives_there() -> None:
    """Decode pace: the limit holds batch turns only while an interactive run is in flight
    or paused on a tool there (S4's reservation); when it leaves, they go in."""
    sim = paced_replica(6)
    sim.t = 1.0
    streamed(sim, "b0", 21, 0.3)
    assert sim.req("b9", "rb9") == ()
    sim.finish("ti", paused=True)  # back to its tool: it lives here still
    assert sim.replica("a")["reserved_for_interactive"] == 1
    assert sim.req("b10", "rb10") == ()
    assert admits(sim.req("ti3", "i", cls=INT, caller="u")) == {"ti3": "a"}
    assert admits(sim.finish("ti3")) == {"b9": "a", "b10": "a"}  # its run is idle: no limit
    assert sim.replica("a")["batch_limit_from_pace"] == 4  # kept for the next one


def test_pace_under_the_target_raises_the_limit_by_one() -> None:
    """Decode pace: a reply faster than 4/5 of the target, admitted after the last change,
    with batch turns at the limit, raises it by one; a reply admitted before the change
    moves nothing, however fast."""
    sim = paced_replica(6)
    sim.t = 1.0
    streamed(sim, "b0", 21, 1.0)  # limit 4
    assert sim.req("b9", "rb9") == ()
    streamed(sim, "b1", 21, 0.001)  # admitted before the cut: nothing changes
    assert sim.replica("a")["batch_limit_from_pace"] == 4
    assert admits(sim.finish("b2")) == {"b9": "a"}  # (unmeasured: no reply tokens)
    assert sim.req("b10", "rb10") == ()  # b3, b4, b5, b9: at the limit
    assert admits(streamed(sim, "b9", 21, 0.07)) == {"b10": "a"}
    rep = sim.replica("a")
    assert rep["batch_limit_from_pace"] == 5
    assert rep["pace_s_per_token"] > 0.1  # the smoothed pace still remembers b0
    streamed(sim, "b10", 21, 0.085)  # fresh, but not under 4/5 of the target
    assert sim.replica("a")["batch_limit_from_pace"] == 5


def test_pace_is_not_judged_on_short_replies_or_without_a_first_token() -> None:
    """Decode pace: replies under ``pace_min_tokens`` and turns whose first token was never
    reported leave the pace and the limit alone; with ``interactive_pace_s`` unset nothing
    is limited however slow the replies."""
    sim = paced_replica(3)
    sim.t = 1.0
    streamed(sim, "b0", 15, 1.0)  # 15 < 16 tokens
    sim.finish("b1", reply=100)  # no first token
    rep = sim.replica("a")
    assert rep["batch_limit_from_pace"] is None and rep["pace_s_per_token"] == 0.01
    off = Sim(gen("a"))
    off.probe("a")
    off.req("ti", "i", cls=INT)
    for n in range(3):
        off.req(f"b{n}", f"rb{n}")
    streamed(off, "b0", 100, 5.0)
    assert off.replica("a")["batch_limit_from_pace"] is None
    assert admits(off.req("b9", "rb9")) == {"b9": "a"}


def test_pace_counts_batch_turns_adopted_on_resync() -> None:
    """Decode pace, S11: a resync's in-flight batch turns count against the limit as
    admitted ones do (the invariants check the count after every event)."""
    sim = Sim(gen("a"), params=PACED)
    sim.probe("a", running=0, waiting=0)
    sim.resync_generating("a", 3)
    sim.finish("t2")  # (not measured)
    sim.req("alone", "r-alone")
    streamed(sim, "alone", 21, 0.01)
    assert sim.replica("a")["batch_in_flight"] == 2
    sim.req("t9", "r9")
    sim.req("ti", "i", cls=INT, caller="u")
    sim.t = 1.0
    streamed(sim, "t0", 21, 0.5)  # 3 batch turns ran beside it: limit 2
    assert sim.replica("a")["batch_limit_from_pace"] == 2
    assert sim.req("b9", "rb9") == ()


def test_pace_limits_no_replica_that_reports_no_load() -> None:
    """Decode pace, S2: a replica whose probe reports no load numbers (a hosted API, whose
    pace is not ours to change) gets no limit, however slow its replies; a probe without
    them lifts a limit set before, and the held batch turns go in."""
    sim = paced_replica(6)
    sim.t = 1.0
    streamed(sim, "b0", 21, 0.3)
    assert sim.req("b9", "rb9") == ()
    assert admits(sim.probe("a")) == {"b9": "a"}
    assert sim.replica("a")["batch_limit_from_pace"] is None
    sim.req("b10", "rb10")
    streamed(sim, "b10", 21, 0.5)  # admitted after: would cut, but no load is reported
    rep = sim.replica("a")
    assert rep["batch_limit_from_pace"] is None and rep["pace_s_per_token"] > 0.1


def test_pace_target_is_at_least_one_and_a_half_times_the_replicas_best() -> None:
    """Decode pace: an engine whose fastest reply with at most one batch turn beside it
    was 0.3 s per token cannot meet a target of 0.1; its target is 1.5 times its best,
    0.45, so a reply at 0.4 cuts nothing and one at 0.5 cuts the batch limit. Faster
    replies with more batch turns beside them do not count as its best."""
    sim = paced_replica(6, best=0.3)
    streamed(sim, "b0", 21, 0.05)  # 5 batch turns left beside it: not its best
    streamed(sim, "b1", 21, 0.4)
    rep = sim.replica("a")
    assert rep["batch_limit_from_pace"] is None and rep["best_pace_s_per_token"] == 0.3
    streamed(sim, "b2", 21, 0.5)  # 4 batch turns ran beside it: limit 3
    assert sim.replica("a")["batch_limit_from_pace"] == 3


def test_pace_counts_the_batch_turns_a_reply_ran_beside_from_its_admission() -> None:
    """Decode pace: an interactive reply admitted beside 6 batch turns that all end before
    it does still ran beside them: its slow pace cuts the limit from 6 (to 4), not from
    the none left at its end; and it is judged though its run goes idle with it."""
    sim = paced_replica(6)
    sim.finish("ti")  # that run is idle; another interactive one arrives after the batch
    assert admits(sim.req("tj", "j", cls=INT, caller="u")) == {"tj": "a"}
    sim.t = 1.0
    for n in range(6):
        sim.finish(f"b{n}")  # (unmeasured)
    streamed(sim, "tj", 21, 0.3)  # its run ends idle: the last interactive run there
    assert sim.replica("a")["batch_limit_from_pace"] == 4


def test_pace_does_not_cut_for_a_reply_no_batch_turn_ran_beside() -> None:
    """Decode pace: an interactive reply slow with no batch turn beside it at any point was
    not slowed by batch work: no limit."""
    sim = paced_replica(0)
    sim.t = 1.0
    streamed(sim, "ti", 21, 0.5)
    assert sim.replica("a")["batch_limit_from_pace"] is None
