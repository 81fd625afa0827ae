"""Packing under a relative interactive target (B7; ``scheduler/core/target.py``,
"Packing"): the rule's units, a starved replica's batch runs moving (S3 bounded by a
clock tick), the relief when every replica is starved, and the effect in the simulator
on four replicas."""

from __future__ import annotations

from dataclasses import replace

from _core_host import CoreHost

from luftpause.measure.mix import Group
from luftpause.scheduler.core import (
    Admit,
    ClockTicked,
    EndpointKind,
    FirstTokenReceived,
    Params,
    ReplicaSpec,
    ServiceClass,
    TurnFinished,
    TurnRequested,
    target,
)
from luftpause.scheduler.core.state import ReplicaState, TurnState
from luftpause.sim.run import SimConfig, simulate

GEN = EndpointKind.GENERATIVE
INT = ServiceClass.INTERACTIVE
BAT = ServiceClass.BATCH
# No ramp; one probe with a queue caps; replies of 2 tokens or more are judged.
PACKING = Params(
    initial_cap=None,
    queue_probes=1,
    interactive_pace_s=None,
    interactive_slowdown=1.2,
    pace_min_tokens=2,
    target_packing=True,
)
ALONE = replace(PACKING, target_packing=False)


def rep(name: str = "g0", **fields: object) -> ReplicaState:
    base = ReplicaState(
        ReplicaSpec(name, GEN, frozenset({"m"})), healthy=True, running=4, waiting=0
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def test_the_rules_units() -> None:
    """B7 packing: a replica is starved at a limit of 0 with an interactive run living
    there; crowded when starved and its pace still misses the target; the limit may
    reach 0 only while another healthy replica is not starved; relief names the starved
    replica with the fewest interactive turns when no healthy one is left unstarved."""
    assert target.packs(PACKING) and not target.packs(ALONE)
    assert not target.packs(Params())  # no relative target: no packing
    lives = rep(in_flight=1, pace_cap=0)  # an interactive turn in flight, no batch
    assert target.starved(lives)
    assert not target.starved(rep(pace_cap=0))  # nobody interactive lives there
    assert not target.starved(rep(in_flight=1, pace_cap=1))
    slow = replace(lives, pace_best_s=0.02, pace_s=0.03)  # target 24 ms
    assert target.crowded(slow, PACKING)
    assert not target.crowded(replace(slow, pace_s=0.02), PACKING)
    assert not target.crowded(replace(slow, pace_cap=1), PACKING)  # batch left to cut
    assert target.least_limit([rep("g1")]) == 0
    assert target.least_limit([rep("g1", in_flight=1, pace_cap=0)]) == 1
    assert target.least_limit([rep("g1", healthy=False)]) == 1
    assert target.least_limit([]) == 1
    a = rep("g0", in_flight=3, pace_cap=0)
    b = rep("g1", in_flight=1, reserved=1, pace_cap=0)
    assert target.relieve([a, b]) == "g1"  # 2 interactive turns (1 paused) against 3
    assert target.relieve([a, b, rep("g2")]) is None


def test_pack_prefers_hosts_that_meet_the_target_then_fresh_replicas() -> None:
    """B7 packing's placement of a new interactive run: where interactive runs live and
    the target holds (fewest interactive turns first), else where none lives (fewest
    runs living first), else the crowded ones (fewest runs living)."""
    host = rep("g0", in_flight=3, batch_in_flight=1, pace_cap=1, pinned_runs=9)
    busier = rep("g1", in_flight=4, batch_in_flight=0, pace_cap=0, pinned_runs=4)
    fresh = rep("g2", in_flight=20, batch_in_flight=20, pinned_runs=20)
    fresher = rep("g3", in_flight=20, batch_in_flight=20, pinned_runs=18)
    crowded = rep("g4", in_flight=8, pace_cap=0, pinned_runs=8, pace_best_s=0.02, pace_s=0.05)
    every = list(enumerate([host, busier, fresh, fresher, crowded]))
    assert target.pack(every, 5, 0, PACKING) == "g0"  # 2 interactive turns against 4
    assert target.pack(every[1:], 5, 0, PACKING) == "g1"
    assert target.pack(every[2:], 5, 0, PACKING) == "g3"  # fewest runs living
    assert target.pack(every[4:], 5, 0, PACKING) == "g4"
    assert target.pack([], 5, 0, PACKING) is None


class Host(CoreHost):
    """Feeds ``decide`` a pool's events, checking the invariants after each."""

    def __init__(self, params: Params, cap: int = 4, replicas: int = 2) -> None:
        super().__init__(params, cap, replicas)

    def req(self, turn: str, run: str, cls: ServiceClass = BAT) -> str | None:
        actions = self(TurnRequested(self.t, turn, run, "m", cls, "c", GEN, "dp"))
        return next((a.replica for a in actions if isinstance(a, Admit)), None)

    def finish(self, turn: str, pace: float = 0.0, paused: bool = False) -> None:
        """A reply of 11 tokens that streamed at ``pace`` s/token (0: not timed)."""
        if pace:
            self(FirstTokenReceived(self.t, turn))
            self.t += 10 * pace
        self(TurnFinished(self.t, turn, paused_on_tool=paused, completion_tokens=11))
        self.admitted.pop(turn, None)

    def starve(self, name: str) -> None:
        """Set ``name``'s batch limit to 0 (as a slow reply beside one batch turn would)."""
        r = self.state.replicas[name]
        self.state = replace(
            self.state, replicas=self.state.replicas.set(name, replace(r, pace_cap=0))
        )


def test_a_reply_missing_the_target_beside_one_batch_turn_cuts_to_the_least_limit() -> None:
    """B7 packing: beside one batch turn, an interactive reply slower than the target
    cuts the limit to ``least`` (0 while another replica takes batch work); a reply under
    4/5 of the target raises it from 0 to 1 (at 1.5x: at 1.2x no reply is both slower
    than the floor and under 4/5 of 1.2 times it). Without a ``least`` the limit stops
    at 1."""
    here = rep(in_flight=2, batch_in_flight=1, pace_cap=1, pace_best_s=0.02, pace_set_at=0.0)
    turn = TurnState(
        "t", "run", "g0", "m", INT, "c", GEN, "dp", 1.0, 1e9,
        started=True, first_token_at=2.0, batch_beside=1,
    )  # fmt: skip
    slow = 2.0 + 0.03 * 10  # 30 ms a token against a target of 24 ms
    assert target.feedback(here, turn, 11, slow, PACKING, 0)[0] == 0
    assert target.feedback(here, turn, 11, slow, PACKING)[0] == 1
    starved = replace(here, pace_cap=0, batch_in_flight=0, in_flight=1)
    alone = replace(turn, batch_beside=0)
    looser = replace(PACKING, interactive_slowdown=1.5)  # target 30 ms, raise under 24
    fast = 2.0 + 0.022 * 10
    assert target.feedback(starved, alone, 11, fast, looser, 0)[0] == 1


def test_a_starved_replicas_batch_run_moves_at_its_next_turn_and_at_the_tick() -> None:
    """B7 packing, S3 bounded: a batch run pinned to a starved replica is placed as a
    new run's at its next turn, and a batch turn held in that replica's pin lane when it
    became starved moves at the next clock tick. Without packing both wait there."""
    for params in (PACKING, ALONE):
        host = Host(params, cap=4)
        assert host.req("i1", "ri", INT) == "g0"
        assert host.req("b1", "rb1", BAT) == "g1"
        assert host.req("b2", "rb2", BAT) == "g0"
        assert host.req("b3", "rb3", BAT) == "g1"
        host.t = 1.0
        host.finish("b2", paused=True)  # rb2 pinned to g0, paused on a tool
        host.req("b4", "rb3", BAT)  # rb3's second turn: parallel, g1
        # g0's limit: 1, then 0 where packing allows it; rb2 comes back
        r = host.state.replicas["g0"]
        host.state = replace(
            host.state, replicas=host.state.replicas.set("g0", replace(r, pace_cap=1))
        )
        host.req("b5", "rb5", BAT)
        assert host.admitted.get("b5") == "g0"  # one batch turn beside i1
        host.req("b6", "rb2", BAT)  # pinned to g0, at its limit: held there
        assert "b6" not in host.admitted
        if params is PACKING:
            host.starve("g0")
        host.t = 2.0
        host(ClockTicked(host.t))
        if params is PACKING:
            assert host.admitted.get("b6") == "g1"  # moved at the tick
        else:
            assert "b6" not in host.admitted


def test_when_every_replica_is_starved_one_gets_a_batch_turn_back() -> None:
    """B7 packing's liveness: interactive runs came to both replicas whose limits were 0
    already; at the next tick the one with fewer interactive turns gets a limit of 1 and
    a held batch turn is admitted there."""
    host = Host(PACKING, cap=4)
    assert host.req("i1", "ri1", INT) == "g0"
    assert host.req("i2", "ri2", INT) == "g0"  # packed where interactive runs live
    r = host.state.replicas["g0"]  # ... until they crowd it: the next goes to g1
    crowded = replace(r, pace_cap=0, pace_best_s=0.02, pace_s=0.05)
    host.state = replace(host.state, replicas=host.state.replicas.set("g0", crowded))
    assert host.req("i3", "ri3", INT) == "g1"
    host.starve("g1")  # its limit was 0 already
    assert host.req("b1", "rb1", BAT) is None  # no room anywhere
    host.t = 1.0
    host(ClockTicked(host.t))
    assert host.state.replicas["g1"].pace_cap == 1  # 1 interactive turn against 2
    assert host.state.replicas["g0"].pace_cap == 0
    assert host.admitted.get("b1") == "g1"


def test_in_the_simulator_packing_lifts_interactive_runs_on_four_replicas() -> None:
    """B7 packing in the simulator: on 4 replicas with 8 interactive agents beside 96
    batch agents, a 1.2x target serves more interactive runs with packing than without
    it (orderings of virtual-time outcomes)."""
    config = SimConfig(
        groups=(
            Group("interactive", 8, "interactive", "interactive"),
            Group("batch", 96, "batch", "batch"),
        ),
        replicas=4,
        duration_s=180.0,  # the own-loop flood's window, warm-up and ramp at 96
        warmup_s=96.0,
        ramp_s=48.0,
        seed=0,
    )
    on = simulate(config, "luftpause-pack-x1.2")
    off = simulate(config, "luftpause-x1.2")
    rate = "runs_per_min_closed"
    assert on["classes"]["interactive"][rate] > off["classes"]["interactive"][rate]
    assert on["classes"]["batch"][rate] > 0
