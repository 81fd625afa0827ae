"""Caps that follow the engine, and tool leases (docs/concepts/admission.md "Tool
leases"): the pure core's rules for runs a client left mid-tool.

A run paused on a tool lives on its replica (S3's pinned count, which prefix keeping's
run limit gates new batch runs by) and, when interactive, holds a slot there (S4). A
client that leaves mid-tool never sends the run's next turn, so both would last until the
run's idle expiry (S10, 30 min). A pause that outlives its lease, learned per tool from
the runs that came back from it, stops counting, and comes back in full if the run
returns. And no cap rises for runs that wait behind such runs (S2: only the engine's
load raises it).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.scheduler.core import (
    Admit,
    ClockTicked,
    DataplaneResynced,
    EndpointKind,
    Params,
    ReplicaProbed,
    ReplicaSpec,
    RunPhase,
    RunSnapshot,
    ServiceClass,
    TurnAbandoned,
    TurnFinished,
    TurnRequested,
    decide,
    initial_state,
)
from luftpause.scheduler.core.events import Event
from luftpause.scheduler.core.invariants import violations
from luftpause.scheduler.core.view import run_status
from tests.unit.test_core_rules import SPEC_RULES, Sim, admits, capped, gen

GEN = EndpointKind.GENERATIVE
INT = ServiceClass.INTERACTIVE
BAT = ServiceClass.BATCH


def pause(sim: Sim, turn: str, run: str, tool: str, cls: ServiceClass = BAT) -> None:
    """A turn of ``run`` is admitted and ends calling ``tool``."""
    assert admits(sim.req(turn, run, cls=cls)), (turn, run)
    sim(TurnFinished(sim.t, turn, paused_on_tool=True, tool_names=(tool,)))


def test_a_run_paused_past_the_default_lease_stops_living_on_its_replica() -> None:
    """Tool leases, S3, S4: an interactive run paused on a tool no run came back from
    lapses after ``tool_lease_default_s``: not pinned, no reservation; it keeps its
    replica as its last."""
    sim = Sim(gen("a"), params=replace(SPEC_RULES, tool_lease_default_s=30.0))
    capped(sim, "a", 2)
    pause(sim, "t1", "r", "browse", INT)
    assert sim.replica("a")["reserved_for_interactive"] == 1
    assert sim.replica("a")["runs_pinned"] == 1
    sim.tick(29.0)
    assert sim.replica("a")["reserved_for_interactive"] == 1  # not yet
    sim.tick(31.0)
    view = sim.replica("a")
    assert (view["reserved_for_interactive"], view["runs_pinned"], view["runs_lapsed"]) == (0, 0, 1)
    run = run_status(sim.state, "r", sim.t)
    assert run is not None and run["lapsed"] and run["replica"] == "a"
    assert run["phase"] == RunPhase.PAUSED_ON_TOOL.value


def test_a_lapsed_slot_goes_to_batch_work_and_comes_back_with_the_run() -> None:
    """Tool leases, S4: while an interactive run is away past its lease, its reserved slot
    takes batch work; when it returns it is pinned and reserved again and is admitted on
    its replica (S3) as soon as a slot frees, before held batch turns."""
    sim = Sim(gen("a"), gen("b"), params=replace(SPEC_RULES, tool_lease_default_s=30.0))
    capped(sim, "a", 2)
    pause(sim, "i1", "I", "browse", INT)
    assert admits(sim.req("b1", "B1")) == {"b1": "a"}  # b not healthy: only a
    assert sim.req("b2", "B2") == ()  # the last slot is I's
    sim.tick(31.0)  # I lapses: its slot frees for the held batch turn
    view = sim.replica("a")
    assert view["reserved_for_interactive"] == 0 and view["in_flight"] == 2
    sim.probe("b", True)  # another replica is idle, but I comes back to its own (S3)
    assert sim.req("i2", "I", cls=INT) == ()
    assert sim.replica("a")["reserved_for_interactive"] == 1
    assert sim.replica("a")["runs_lapsed"] == 0
    assert sim.req("b3", "B3") != ()  # batch goes to b
    assert admits(sim.finish("b1")) == {"i2": "a"}


def test_a_lapsed_slot_is_freed_for_a_held_batch_turn_at_the_lease() -> None:
    """Tool leases, S4: the tick at which a reservation lapses admits the batch turn that
    waited for that slot."""
    sim = Sim(gen("a"), params=replace(SPEC_RULES, tool_lease_default_s=30.0))
    capped(sim, "a", 2)
    pause(sim, "i1", "I", "browse", INT)
    assert admits(sim.req("b1", "B1")) == {"b1": "a"}
    assert sim.req("b2", "B2") == ()
    assert admits(sim.tick(31.0)) == {"b2": "a"}


def test_leases_are_learned_per_tool_from_the_runs_that_came_back() -> None:
    """Tool leases: a run back from ``grep`` after 3 s teaches the core how long grep takes
    (lease 2 x (3 + 4 x 1.5) = 18 s), so the next run paused on grep lapses after 18 s,
    while one paused on a tool never seen back keeps the default."""
    sim = Sim(gen("a"), params=SPEC_RULES)
    capped(sim, "a", 8)
    pause(sim, "t1", "R", "grep")
    sim.t = 3.0
    assert admits(sim.req("t2", "R")) == {"t2": "a"}  # back after 3 s
    times = sim.view()["tool_times"]
    assert times["grep"] == {"mean_s": 3.0, "dev_s": 1.5, "samples": 1, "lease_s": 18.0}
    sim.finish("t2")
    pause(sim, "g1", "G", "grep")
    pause(sim, "u1", "U", "deploy")
    run = run_status(sim.state, "G", sim.t)
    assert run is not None and run["lease_s"] == 18.0
    sim.tick(3.0 + 18.0 + 1.0)
    assert run_status(sim.state, "G", sim.t)["lapsed"]  # type: ignore[index]
    assert not run_status(sim.state, "U", sim.t)["lapsed"]  # type: ignore[index]
    sim.tick(3.0 + 120.0 + 1.0)
    assert run_status(sim.state, "U", sim.t)["lapsed"]  # type: ignore[index]


def test_a_lease_never_ends_before_the_minimum() -> None:
    """Tool leases: a tool that returns at once still gets ``tool_lease_min_s``."""
    sim = Sim(gen("a"), params=SPEC_RULES)
    capped(sim, "a", 8)
    pause(sim, "t1", "R", "echo")
    assert admits(sim.req("t2", "R")) == {"t2": "a"}  # back at once
    sim.finish("t2")
    pause(sim, "t3", "S", "echo")
    sim.tick(9.0)
    assert not run_status(sim.state, "S", sim.t)["lapsed"]  # type: ignore[index]
    sim.tick(11.0)
    assert run_status(sim.state, "S", sim.t)["lapsed"]  # type: ignore[index]


def test_the_lease_is_checked_again_when_its_tool_proved_slower_meanwhile() -> None:
    """Tool leases: a pause checked at its lease finds its tool's estimate grew since (a
    run came back from it late); it lapses only at the longer lease."""
    sim = Sim(gen("a"), params=replace(SPEC_RULES, tool_lease_min_s=1.0))
    capped(sim, "a", 8)
    pause(sim, "a1", "A", "build")
    sim.t = 2.0
    assert admits(sim.req("a2", "A"))  # build took 2 s: lease 2 x (2 + 4) = 12 s
    sim.finish("a2")
    pause(sim, "b1", "B", "build")  # paused at 2.0, due at 14.0
    pause(sim, "c1", "C", "build")
    sim.t = 12.0
    assert admits(sim.req("c2", "C"))  # build took 10 s this time: the lease grows
    sim.finish("c2")
    sim.tick(14.5)
    assert not run_status(sim.state, "B", sim.t)["lapsed"]  # type: ignore[index]
    lease = run_status(sim.state, "B", sim.t)["lease_s"]  # type: ignore[index]
    assert lease > 12.5
    sim.tick(2.0 + lease + 1.0)
    assert run_status(sim.state, "B", sim.t)["lapsed"]  # type: ignore[index]


def test_tool_names_are_bounded() -> None:
    """Tool leases: a peer naming endless tools fills at most ``tool_estimates_max``
    estimates; names are cut to 64 characters."""
    sim = Sim(gen("a"), params=replace(SPEC_RULES, tool_estimates_max=3))
    capped(sim, "a", 100)
    for i in range(6):
        pause(sim, f"t{i}", f"R{i}", f"tool{i}" + "x" * 100)
        sim.t += 1.0
        assert admits(sim.req(f"u{i}", f"R{i}"))
        sim.finish(f"u{i}")
    times = sim.view()["tool_times"]
    assert len(times) == 3 and all(len(name) == 64 for name in times)


def test_abandoned_runs_do_not_raise_caps_and_stop_blocking_new_runs() -> None:
    """S2 and tool leases, the reproducer as a client would play it: 40 one-turn runs that
    end in a tool call and never come back, then single small turns. No cap moves from
    the ramp's 16 (the engine never runs more than one turn); the run limit lets new runs
    in meanwhile; after the lease the abandoned runs no longer live there."""
    params = replace(Params(), queue_probes=2)  # the defaults: ramp from 16, keep prefixes
    sim = Sim(gen("a"), gen("b"), params=params, queue_probes=2, initial_cap=16)
    sim.probe("a", True, running=0, waiting=0)
    sim.probe("b", True, running=0, waiting=0)
    for i in range(40):
        sim.t = i * 0.5
        acts = sim.req(f"t{i}", f"gone{i}")
        if not admits(acts):  # held behind the runs living there: a probe lets it in
            for name in ("a", "b"):
                acts += sim.probe(name, True, running=0, waiting=0)
        assert f"t{i}" in admits(acts), i
        sim(TurnFinished(sim.t, f"t{i}", paused_on_tool=True, tool_names=("lookup",)))
        sim(ClockTicked(sim.t))
    t = end = sim.t
    end += 20.0
    while t < end:
        t += 1.0
        sim.t = t
        sim.probe("a", True, running=1, waiting=0)
        sim.probe("b", True, running=1, waiting=0)
        assert admits(sim.req(f"s{t}", f"single{t}")), t
        sim.finish(f"s{t}")
        sim.tick(t)
    for name in ("a", "b"):
        assert sim.replica(name)["capacity"] == 16
    sim.tick(t + 121.0)
    for name in ("a", "b"):
        view = sim.replica(name)
        assert view["capacity"] == 16 and view["runs_pinned"] == 0, view
    assert sum(sim.replica(n)["runs_lapsed"] for n in ("a", "b")) == 40


# ------------------------------------------------------------------ properties

SPECS = (
    ReplicaSpec("g0", GEN, frozenset({"m"})),
    ReplicaSpec("g1", GEN, frozenset({"m"})),
)
LEASE_PARAMS = Params(initial_cap=4, queue_probes=1, run_idle_expiry_s=600.0)

_step = st.one_of(
    st.tuples(st.just("req"), st.integers(0, 11), st.sampled_from([INT, BAT])),
    st.tuples(st.just("finish"), st.integers(0, 11), st.sampled_from(["stop", "grep", "x"])),
    st.tuples(st.just("abandon"), st.integers(0, 11), st.just(None)),
    st.tuples(st.just("probe"), st.integers(0, 1), st.integers(0, 3)),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 5.0, 30.0]), st.just(None)),
)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(_step, max_size=80))
def test_without_engine_load_no_cap_exceeds_the_ramps_initial_cap(steps: list[tuple]) -> None:
    """S2: over any history whose probes never show the engine running at the cap or
    queueing (running below ``initial_cap``, nothing waiting), every cap stays at most
    ``initial_cap``, however many runs wait behind runs paused on tools."""
    state = initial_state(SPECS, LEASE_PARAMS)
    now = 0.0
    n = 0
    for name in ("g0", "g1"):
        state, _ = decide(state, ReplicaProbed(now, name, True, 0, 0))
    admitted: dict[str, str] = {}  # turn -> run
    for kind, a, b in steps:
        ev: Event
        if kind == "req":
            n += 1
            ev = TurnRequested(now, f"t{n}", f"r{a}", "m", b, "c")
        elif kind == "finish":
            if not admitted:
                continue
            turn = sorted(admitted)[a % len(admitted)]
            admitted.pop(turn)
            tools = () if b == "stop" else (b,)
            ev = TurnFinished(now, turn, paused_on_tool=bool(tools), tool_names=tools)
        elif kind == "abandon":
            ev = TurnAbandoned(now, f"t{max(1, n - a)}")
        elif kind == "probe":
            ev = ReplicaProbed(now, f"g{a}", True, b, 0)  # running < initial_cap = 4
        else:
            now += a
            ev = ClockTicked(now)
        state, actions = decide(state, ev)
        assert violations(state) == []
        for act in actions:
            if isinstance(act, Admit):
                admitted[act.turn_id] = ""
        for rep in state.replicas.values():
            assert rep.cap is not None and rep.cap <= 4, rep


@settings(max_examples=100, deadline=None)
@given(
    others=st.lists(
        st.tuples(st.sampled_from(["grep", "build"]), st.sampled_from([0.5, 3.0, 40.0])),
        max_size=12,
    ),
    cls=st.sampled_from([INT, BAT]),
    ticks=st.lists(st.sampled_from([0.3, 1.0, 7.0, 25.0]), min_size=1, max_size=30),
)
def test_an_abandoned_run_stops_holding_a_reservation_within_its_lease(
    others: list[tuple[str, float]], cls: ServiceClass, ticks: list[float]
) -> None:
    """Tool leases, S4: a run that pauses on a tool and never returns, among runs that come
    back from other tools after varied times, holds its reservation and its place no longer
    than its lease (the default: no run came back from its tool) plus the clock's tick, and
    until then it holds them."""
    params = replace(LEASE_PARAMS, initial_cap=None)
    state = initial_state(SPECS, params)
    for name in ("g0", "g1"):
        state, _ = decide(state, ReplicaProbed(0.0, name, True, 8, 1))  # cap 8
    state, _ = decide(state, TurnRequested(0.0, "gone-1", "gone", "m", cls, "c"))
    state, _ = decide(state, TurnFinished(0.0, "gone-1", True, tool_names=("never-back",)))
    now = 0.0
    for i, (tool, took) in enumerate(others):
        state, _ = decide(state, TurnRequested(now, f"o{i}a", f"o{i}", "m", BAT, "c"))
        state, _ = decide(state, TurnFinished(now, f"o{i}a", True, tool_names=(tool,)))
        state, _ = decide(state, TurnRequested(now + took, f"o{i}b", f"o{i}", "m", BAT, "c"))
        state, _ = decide(state, TurnFinished(now + took, f"o{i}b"))
        now = state.now
    lease = params.tool_lease_default_s
    for dt in ticks:
        now += dt
        state, _ = decide(state, ClockTicked(now))
        assert violations(state) == []
        run = state.runs["gone"]
        living = sum(rep.pinned_runs for rep in state.replicas.values())
        reserved = sum(rep.reserved for rep in state.replicas.values())
        if now >= lease + 1.0:
            assert run.lapsed and run.reserved_on is None, (now, run)
        elif now < lease:
            assert not run.lapsed and living >= 1, (now, run)
            assert (reserved == 1) == (cls is INT)


def test_a_run_that_leaves_while_its_next_turn_is_held_still_lapses() -> None:
    """Tool leases, S4: a run back from its tool whose next turn is held, and whose client
    then leaves, is as away as a pause: it lapses one lease after it left (a check that
    fell due while its turn was held does not count)."""
    sim = Sim(gen("a"), params=replace(SPEC_RULES, tool_lease_default_s=30.0))
    capped(sim, "a", 1)
    pause(sim, "t1", "A", "browse", INT)
    sim.t = 1.0
    assert admits(sim.req("b1", "B", cls=INT)) == {"b1": "a"}  # an interactive turn fits
    sim.t = 5.0
    assert sim.req("t2", "A", cls=INT) == ()  # A is back, but a's one slot is B's
    sim.tick(31.0)  # A's first lease check falls due while its turn is held: skipped
    sim.t = 35.0
    sim(TurnAbandoned(35.0, "t2"))  # A's client leaves
    sim.finish("b1")
    sim.tick(64.0)
    assert not run_status(sim.state, "A", sim.t)["lapsed"]  # type: ignore[index]
    sim.tick(66.0)
    assert run_status(sim.state, "A", sim.t)["lapsed"]  # type: ignore[index]
    assert sim.replica("a")["reserved_for_interactive"] == 0


def test_parallel_turns_pause_on_every_tool_they_called() -> None:
    """Tool leases: a run whose parallel turns end in calls to different tools pauses on
    all of them, and its lease is that of the slowest."""
    sim = Sim(gen("a"), params=replace(SPEC_RULES, tool_lease_min_s=1.0))
    capped(sim, "a", 8)
    pause(sim, "s1", "S", "slow_build")  # teach the estimates: slow_build 40 s, ls 1 s
    sim.t = 40.0
    assert admits(sim.req("s2", "S"))
    sim.finish("s2")
    pause(sim, "l1", "L", "ls")
    sim.t = 41.0
    assert admits(sim.req("l2", "L"))
    sim.finish("l2")
    assert admits(sim.req("p1", "P")) and admits(sim.req("p2", "P"))  # two turns at once
    sim(TurnFinished(sim.t, "p1", paused_on_tool=True, tool_names=("slow_build",)))
    sim(TurnFinished(sim.t, "p2", paused_on_tool=True, tool_names=("ls",)))
    run = run_status(sim.state, "P", sim.t)
    assert run is not None and run["paused_tools"] == ["ls", "slow_build"]
    assert run["lease_s"] == sim.view()["tool_times"]["slow_build"]["lease_s"]


def test_a_resync_keeps_the_pause_it_does_not_change() -> None:
    """Tool leases, S11: a dataplane resyncing a run paused on a tool the scheduler knew
    keeps the pause's start and tools, so the time the run comes back after is a sample
    of its tool's whole time, not of the time since the resync."""
    sim = Sim(gen("a"), params=SPEC_RULES)
    capped(sim, "a", 8)
    pause(sim, "t1", "R", "build")
    sim.t = 60.0
    sim(
        DataplaneResynced(
            60.0, "dp", runs=(RunSnapshot("R", RunPhase.PAUSED_ON_TOOL, "a", BAT, "c"),)
        )
    )
    sim.t = 61.0
    assert admits(sim.req("t2", "R"))
    assert sim.view()["tool_times"]["build"]["mean_s"] == 61.0


def test_one_return_far_past_its_lease_counts_as_a_few_leases() -> None:
    """Tool leases: a return far later than the pause's lease (a person away) counts as
    ``MAX_SAMPLE_LEASES`` leases at most, so one outlier does not make the tool's lease
    outlast the run idle expiry."""
    sim = Sim(gen("a"), params=SPEC_RULES)
    capped(sim, "a", 8)
    pause(sim, "t1", "R", "grep")  # never seen back: lease 120 s
    sim.t = 3000.0
    assert admits(sim.req("t2", "R"))
    assert sim.view()["tool_times"]["grep"]["mean_s"] == 4 * 120.0
