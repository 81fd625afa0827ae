"""The simulator's SGLang Model Gateway arms (B1, issue #18): its priority scheduler's
capacity, interactive reservation, class queues and starvation promotion, its legacy FIFO
cap, and sticky sessions, each against a stub pool in virtual time."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from luftpause.measure.mix import Group
from luftpause.sim.arms import Ask, SmgArm, TurnEnd
from luftpause.sim.main import arms_from_args
from luftpause.sim.run import SimConfig, simulate, sized_arm
from luftpause.sim.world import World


@dataclass
class StubReplica:
    name: str
    in_flight: int = 0


class Pool:
    """Two stub replicas behind an arm; records every admission (turn, replica, held s)."""

    def __init__(self, **kwargs: object) -> None:
        self.world = World()
        self.replicas = [StubReplica("a"), StubReplica("b")]
        self.arm = SmgArm(self.world, self.replicas, **kwargs)  # type: ignore[arg-type]
        self.admitted: list[tuple[str, str, float]] = []
        self.asks: dict[str, Ask] = {}

    def ask(self, turn: str, cls: str = "batch", run: str | None = None) -> None:
        a = Ask(turn, run or f"run-{turn}", "m", cls, cls, 0)
        self.asks[turn] = a

        def admitted(replica: str, held_s: float) -> None:
            self.admitted.append((turn, replica, held_s))
            next(r for r in self.replicas if r.name == replica).in_flight += 1

        self.arm.request(a, admitted, lambda why: None)

    def finish(self, turn: str, paused: bool = False) -> None:
        replica = next(r for t, r, _ in self.admitted if t == turn)
        next(r for r in self.replicas if r.name == replica).in_flight -= 1
        self.arm.finished(self.asks[turn], TurnEnd(paused, "stop", 0, 0, 0))

    def at(self, t: float) -> None:
        self.world.run(until=t)

    def order(self) -> list[str]:
        return [t for t, _, _ in self.admitted]


def test_the_priority_scheduler_keeps_reserved_slots_for_interactive_turns() -> None:
    """Capacity 6 with 4 reserved for interactive: batch turns take 2 slots and wait for
    the rest; interactive turns take the reserved slots at once."""
    pool = Pool(capacity=6)
    for i in range(3):
        pool.ask(f"b{i}")
    assert pool.order() == ["b0", "b1"]
    for i in range(4):
        pool.ask(f"i{i}", "interactive")
    assert pool.order() == ["b0", "b1", "i0", "i1", "i2", "i3"]
    pool.ask("i4", "interactive")
    assert len(pool.admitted) == 6  # full: the fifth interactive turn waits too
    pool.at(3.0)
    pool.finish("b0")  # a free slot: interactive before batch
    assert pool.order()[-1] == "i4"
    assert pool.admitted[-1][2] == 3.0  # held from its request to its admission
    pool.finish("i0")  # the reserve is full again (4 interactive in flight): b2 fits
    assert pool.order()[-1] == "b2"


def test_a_starved_batch_head_goes_before_interactive_turns() -> None:
    """SMG's starvation promotion: a queue head that waited longer than its class's
    threshold (bulk: 120 model seconds) is admitted ahead of the classes above it."""

    def run(wait_s: float) -> list[str]:
        pool = Pool(capacity=6)
        for i in range(2):
            pool.ask(f"b{i}")
        for i in range(4):
            pool.ask(f"i{i}", "interactive")
        pool.ask("late-batch")
        pool.at(wait_s)
        pool.ask("late-interactive", "interactive")
        pool.finish("b0")  # one slot, no reserve left to keep: either head fits
        return pool.order()[6:]

    assert run(10.0) == ["late-interactive"]
    assert run(121.0) == ["late-batch"]


def test_the_legacy_cap_is_one_queue_blind_to_classes() -> None:
    """``smg-fifoC``: ``--max-concurrent-requests C`` and one first-come-first-served queue."""
    pool = Pool(capacity=2, priority=False)
    pool.ask("b0")
    pool.ask("b1")
    pool.ask("b2")
    pool.ask("i0", "interactive")
    assert pool.order() == ["b0", "b1"]
    pool.finish("b0")
    pool.finish("b1")
    assert pool.order() == ["b0", "b1", "b2", "i0"]


def test_sticky_sessions_keep_a_run_on_its_first_replica() -> None:
    """A run's turns follow its first turn's replica, however busy it is; a new run goes
    to the replica with the fewest requests (before SMG's first load report); a run that
    ended starts afresh."""
    pool = Pool()
    pool.replicas[1].in_flight = 1  # a request b is busy with
    pool.ask("t1", run="r1")
    assert [r for _, r, _ in pool.admitted] == ["a"]
    pool.finish("t1", paused=True)
    pool.ask("v1", run="r3")  # a is emptier again
    pool.replicas[1].in_flight = 0  # b's request is done: b is now the emptier
    pool.ask("t2", run="r1")  # back from its tool: still a
    assert [r for _, r, _ in pool.admitted] == ["a", "a", "a"]
    assert pool.admitted[-1][2] == 0.0  # no capacity: nothing waits
    pool.finish("t2")  # r1 ends; a run of the same ID is placed afresh: b has none
    pool.ask("t3", run="r1")
    assert pool.admitted[-1][1] == "b"


def test_arm_names_and_their_errors() -> None:
    """``--arms`` takes smg, smg-capC and smg-fifoC; a capacity no larger than the
    interactive reserve is refused with the reason."""
    assert sized_arm("smg-cap16") == ("smg-cap", 16)
    assert sized_arm("smg-fifo36") == ("smg-fifo", 36)
    assert sized_arm("smg-cap") is None and sized_arm("smg-cap0") is None
    assert arms_from_args("smg,smg-cap8,smg-fifo8") == ["smg", "smg-cap8", "smg-fifo8"]
    with pytest.raises(Exception, match="capacity must be more than 4"):
        arms_from_args("smg-cap4")
    with pytest.raises(ValueError, match="more slots"):
        SmgArm(World(), [], capacity=4)


def test_a_capped_smg_trades_batch_for_interactive_as_the_flood_measured() -> None:
    """B1 against the flood's SMG finding (docs/benchmarks/results/2026-12-05-flood-smg.md):
    on a saturated pool, a small capacity makes interactive runs faster than SMG uncapped
    and serves fewer batch runs (orderings in virtual time; no timing is asserted)."""
    config = SimConfig(
        groups=(Group("chat", 2, "interactive", "chat"), Group("crowd", 40, "batch", "crowd")),
        replicas=1,
        duration_s=150.0,
        warmup_s=60.0,
    )
    open_ = simulate(config, "smg")["classes"]
    capped = simulate(config, "smg-cap8")["classes"]
    assert capped["interactive"]["run_s"]["p50"] < open_["interactive"]["run_s"]["p50"]
    assert capped["batch"]["runs_per_min_closed"] < open_["batch"]["runs_per_min_closed"]
    assert capped["batch"]["turn"]["held_s"] > 0
    assert capped["interactive"]["turn"]["held_s"] == 0.0
