"""The simulator's vLLM router arms (B1): program scheduling's request pool, progress TTL,
resume order by priority, consistent-hash binding and the arm names, against a stub pool
in virtual time (``luftpause.sim.vllm_router``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from luftpause.measure.mix import MixError
from luftpause.sim.arms import Ask, TurnEnd, VllmRouterArm
from luftpause.sim.main import arms_from_args
from luftpause.sim.run import SimConfig, make_arm, sized_arm
from luftpause.sim.vllm_router import (
    MAX_ACTIVE_PROGRAMS_PER_TARGET,
    ConsistentHashRing,
    ProgramScheduler,
    Retained,
    fitted_acting_ttl_s,
)
from luftpause.sim.world import World


class Sent:
    """A one-engine scheduler (``e0``) and what it sent, in order."""

    def __init__(self, token_capacity: int | None = None, window: int = 100) -> None:
        self.order: list[str] = []
        self.s = ProgramScheduler(
            ["e0"], lambda r, t: self.order.append(r.token), token_capacity, stats_window=window
        )

    def ask(self, program: str, at: float, *, turn: str | None = None, priority: int = 0,
            ttl: float | None = None, tokens: int = 1000) -> Retained:  # fmt: skip
        r = Retained(turn or program, at, tokens, priority, ttl)
        self.s.acquire(program, r, at)
        return r

    def done(self, program: str, at: float, tokens: int = 1000) -> None:
        self.s.complete(program, tokens, 10, 0, at)


def test_a_paused_program_keeps_its_reservation_while_its_ttl_runs_then_frees_it() -> None:
    """A request's ``kv_retention_ttl_seconds`` keeps its program active (its count and
    tokens held, its next request sent at once) until the TTL is out; then it is paused
    and a program waiting for the engine goes in."""
    pool = Sent(token_capacity=2000)
    pool.s.observe("e0", 0.0, 0, 0, 0.0)
    pool.ask("a", 0.0, turn="a1", ttl=5.0)
    pool.done("a", 1.0)
    pool.ask("b", 1.5, turn="b1")  # 1100 held by a + 1100 > 2000: b waits
    assert pool.order == ["a1"]
    assert pool.s.usage("e0", 1.5) == pytest.approx(1100.0)
    pool.s.tick(5.9)
    assert pool.order == ["a1"]  # a's TTL still runs
    pool.s.tick(6.0)
    assert pool.order == ["a1", "b1"]  # out at 1 + 5 s: a paused, b admitted
    assert not pool.s.programs["a"].active


def test_a_program_returning_within_its_ttl_goes_straight_to_its_engine() -> None:
    """The reservation's point: a program back from its tool before its TTL ends skips the
    pool, though another waits there."""
    pool = Sent(token_capacity=2000)
    pool.s.observe("e0", 0.0, 0, 0, 0.0)
    pool.ask("a", 0.0, turn="a1", ttl=5.0)
    pool.done("a", 1.0)
    pool.ask("b", 1.2, turn="b1")
    pool.ask("a", 2.0, turn="a2", ttl=5.0)
    assert pool.order == ["a1", "a2"]


def test_the_fitted_ttl_is_zero_until_the_window_fills_then_capped() -> None:
    """No TTL before ``stats_window_size`` return intervals; short returns against a
    costly recompute give a TTL, never more than min(10 s, the recompute cost)."""
    assert fitted_acting_ttl_s([1.0] * 99, 6.0) == 0.0
    ttl = fitted_acting_ttl_s([0.8, 1.0, 1.2, 0.9, 1.1] * 20, 6.0)
    assert 1.0 < ttl <= 6.0
    assert fitted_acting_ttl_s([0.8, 1.0, 1.2, 0.9, 1.1] * 20, 60.0) <= 10.0 + 1e-9
    assert fitted_acting_ttl_s([50.0, 60.0] * 50, 6.0) == 0.0  # returns too late to pay


def test_without_a_ttl_a_finished_program_frees_its_engine_at_once() -> None:
    """Cold windows give a zero TTL: the program is paused on completion and the next
    waiter goes in (here under the default count guard)."""
    pool = Sent()
    pool.s.observe("e0", 0.0, 0, 0, 0.0)
    for i in range(MAX_ACTIVE_PROGRAMS_PER_TARGET + 1):
        pool.ask(f"p{i}", 0.0)
    assert len(pool.order) == MAX_ACTIVE_PROGRAMS_PER_TARGET  # the 65th waits
    pool.done("p0", 1.0)
    assert pool.order[-1] == f"p{MAX_ACTIVE_PROGRAMS_PER_TARGET}"


def test_terminate_releases_a_program_at_once_and_expected_resume_alone_does_not() -> None:
    """The core releases a program told to terminate at once, TTL or not; the HTTP path
    (and so the arm) never tells it, so ``expected_resume: false`` keeps the TTL."""
    pool = Sent(token_capacity=2000)
    pool.s.observe("e0", 0.0, 0, 0, 0.0)
    pool.ask("a", 0.0, turn="a1", ttl=5.0)
    pool.ask("b", 0.1, turn="b1")
    pool.s.complete("a", 1000, 10, 0, 1.0, terminate=True)
    assert pool.order == ["a1", "b1"]
    assert "a" not in pool.s.programs

    world = World()
    arm = VllmRouterArm(world, [StubReplica("e0")], token_capacity=2000)
    arm.start()
    sent: list[str] = []
    last = Ask("t1", "run-a", "m", "batch", "batch", 0, expected_resume=False, context_tokens=1000)
    arm.request(last, lambda r, h: sent.append("t1"), lambda why: None)
    arm.scheduler.programs["run-a"].in_flight[0].kv_retention_ttl_s = 5.0
    world.run(until=1.0)
    arm.finished(last, TurnEnd(False, "stop", 1000, 10, 0))
    assert arm.scheduler.programs["run-a"].active  # held for its TTL all the same
    world.run(until=6.5)
    assert not arm.scheduler.programs["run-a"].active


def test_waiting_programs_resume_by_priority_then_most_recently_finished() -> None:
    """Larger ``priority`` first; among equals, the program that finished a request most
    recently (MRU), a new one last."""
    pool = Sent()
    pool.s.observe("e0", 0.0, 0, 1, 0.0)  # the engine reports a waiting request: gate shut
    pool.ask("old", 0.0, turn="old1")
    pool.ask("low", 0.0, turn="low1")
    assert pool.order == []
    pool.s.observe("e0", 0.0, 0, 0, 0.5)
    pool.s.tick(0.5)
    assert sorted(pool.order) == ["low1", "old1"]
    pool.done("old", 1.0)
    pool.done("low", 2.0)
    pool.s.observe("e0", 0.0, 0, 1, 2.5)
    pool.ask("old", 3.0, turn="old2")
    pool.ask("low", 3.0, turn="low2")
    pool.ask("high", 3.0, turn="high1", priority=10)
    pool.s.observe("e0", 0.0, 0, 0, 3.5)
    pool.s.tick(3.5)
    assert pool.order[2:] == ["high1", "low2", "old2"]


@dataclass
class StubReplica:
    name: str
    in_flight: int = 0

    def metrics(self) -> object:
        @dataclass
        class M:
            token_usage: float = 0.0
            running_gauge: int = 0
            queue_gauge: int = 0

        return M()


def test_a_program_stays_on_the_engine_its_id_hashes_to() -> None:
    """Consistent-hash binding: every request of a program goes to one engine, the ring's
    for its ID, whatever the load; different programs spread over the engines."""
    world = World()
    replicas = [StubReplica(f"e{i}") for i in range(4)]
    arm = VllmRouterArm(world, replicas)
    arm.start()
    ring = ConsistentHashRing([r.name for r in replicas])
    placed: dict[str, set[str]] = {}
    for k in range(3):
        for i in range(40):
            run = f"run-{i}"
            ask = Ask(f"{run}-{k}", run, "m", "batch", "batch", i, context_tokens=100)
            arm.request(ask, lambda r, h, run=run: placed.setdefault(run, set()).add(r), print)
            world.run(until=world.now + 0.5)
            arm.finished(ask, TurnEnd(k < 2, "stop", 100, 10, 0))
    assert all(engines == {ring.target(run)} for run, engines in placed.items())
    assert len({e for engines in placed.values() for e in engines}) == 4


def test_the_arm_names_parse() -> None:
    """``--arms`` takes the three vLLM router arms and a sized capacity; make_arm builds
    them (the bare cap: the engine's KV pool)."""
    arms = arms_from_args("vllm-prog,vllm-router,vllm-prog-kv,vllm-prog-kv30000")
    assert arms == ["vllm-prog", "vllm-router", "vllm-prog-kv", "vllm-prog-kv30000"]
    assert sized_arm("vllm-prog-kv30000") == ("vllm-prog-kv", 30000)
    with pytest.raises(MixError):
        arms_from_args("vllm-prog-kvx")
    config = SimConfig(groups=[])
    world = World()
    replicas = [StubReplica("e0")]
    capped = make_arm("vllm-prog-kv", world, replicas, config)  # type: ignore[arg-type]
    assert isinstance(capped, VllmRouterArm)
    assert capped.scheduler.token_capacity == config.engine.kv_tokens
    sized = make_arm("vllm-prog-kv30000", world, replicas, config)  # type: ignore[arg-type]
    assert isinstance(sized, VllmRouterArm) and sized.scheduler.token_capacity == 30000
    default = make_arm("vllm-prog", world, replicas, config)  # type: ignore[arg-type]
    assert isinstance(default, VllmRouterArm) and default.scheduler.token_capacity is None
    assert make_arm("vllm-router", world, replicas, config).name == "vllm-router"  # type: ignore[arg-type]


@dataclass
class CountingReplica(StubReplica):
    reads: int = 0

    def metrics(self) -> object:
        self.reads += 1
        return super().metrics()


def test_the_router_keeps_its_own_clock_at_a_floods_time_scale() -> None:
    """B1: with ``clock_scale`` S (a flood's ``--time-scale``: engines and tools S times
    faster, vLLM's router in real seconds) the router reads the engines' metrics every S
    model seconds and a TTL of one of its seconds holds a program S model seconds; the
    wait a turn is told is in model seconds."""
    world = World()
    replica = CountingReplica("e0")
    arm = VllmRouterArm(world, [replica], token_capacity=2000, clock_scale=5.0)
    arm.start()
    world.run(until=10.5)
    assert replica.reads == 3  # at 0, 5 and 10 model seconds (11 at scale 1)
    waits: list[float] = []
    ask = Ask("t1", "run-a", "m", "batch", "batch", 0, context_tokens=1000)
    arm.request(ask, lambda r, waited: waits.append(waited), lambda why: None)
    arm.scheduler.programs["run-a"].in_flight[0].kv_retention_ttl_s = 1.0
    world.run(until=11.0)
    arm.finished(ask, TurnEnd(True, "stop", 1000, 10, 0))
    world.run(until=15.9)
    assert arm.scheduler.programs["run-a"].active  # 1 router second: 5 model seconds
    world.run(until=20.1)  # out at 16 model seconds, paused at the next read (20)
    assert not arm.scheduler.programs["run-a"].active
    assert waits == [0.0]


def _admissions_of_a_steady_program(clock_scale: float) -> int:
    """One program on one engine, 130 turns of 0.5 model seconds with a 1-second tool
    call between: how many of its last 20 turns had to be admitted again."""
    world = World()
    arm = VllmRouterArm(world, [StubReplica("e0")], token_capacity=55000, clock_scale=clock_scale)
    arm.start()
    for k in range(130):
        ask = Ask(f"t{k}", "run-a", "m", "batch", "batch", 0, context_tokens=2000)
        arm.request(ask, lambda r, waited: None, lambda why: None)
        world.run(until=world.now + 0.5)
        arm.finished(ask, TurnEnd(True, "stop", 2000, 10, 0))
        world.run(until=world.now + 1.0)
    admits = [t for t, p, what in arm.scheduler.transitions if what == "admit"]
    return sum(1 for t in admits if t * clock_scale >= world.now - 20 * 1.5)


def test_the_progress_ttl_covers_a_tool_call_only_where_the_router_clock_is_slower() -> None:
    """B1: the fitted TTL is capped at the recompute cost (about 0.37 router seconds for
    2,000 uncached tokens). A 1-model-second tool call returns in 1 router second at
    scale 1, past the TTL, so every turn is paused and admitted again; at a flood's time
    scale 5 it returns in 0.2 router seconds, inside it, and the program stays active."""
    assert _admissions_of_a_steady_program(1.0) == 20
    assert _admissions_of_a_steady_program(5.0) == 0
