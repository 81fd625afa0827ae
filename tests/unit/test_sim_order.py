"""The held-turn order options in the simulator (B1, B2, B3; docs/benchmarks/policies.md): the
effect each documents appears as an ordering of outcomes between arms on the same load
and seed, never as a timing."""

from __future__ import annotations

from luftpause.measure.mix import Group, ToolCalls
from luftpause.sim.run import SimConfig, simulate


def test_token_fairness_moves_waiting_from_the_light_caller_to_the_heavy_one() -> None:
    """B3: two batch callers with as many agents on one replica, alice's turns light
    (short context, short replies), bob's heavy. By turns in flight (the default) they
    are taken in arrival order; by virtual tokens alice's counter stays behind bob's, so
    her turns go first: she waits less and is served more reply tokens than by the
    default, and bob waits more."""
    light = Group("alice", 30, "batch", "alice", context_chars=2000, max_tokens=32)
    heavy = Group("bob", 30, "batch", "bob", context_chars=16000, max_tokens=512)
    config = SimConfig(groups=(light, heavy), replicas=1, duration_s=120, warmup_s=60, ramp_s=20)
    plain = simulate(config, "luftpause")["groups"]
    fair = simulate(config, "luftpause-vtc")["groups"]
    assert fair["alice"]["turn"]["held_s"] < plain["alice"]["turn"]["held_s"]
    assert fair["bob"]["turn"]["held_s"] > plain["bob"]["turn"]["held_s"]
    alice_tokens = fair["alice"]["turns_ended"]["completion_tokens_per_min"]
    assert alice_tokens > plain["alice"]["turns_ended"]["completion_tokens_per_min"]
    assert (
        fair["alice"]["turns_ended"]["wall_s"]["p50"] < fair["bob"]["turns_ended"]["wall_s"]["p50"]
    )


def test_attained_service_order_finishes_short_runs_earlier() -> None:
    """B2: one caller's short runs (one turn) beside its long ones (seven turns) on one
    replica. Least attained service first takes a short run's turn before the later
    turns of the long runs, so the short runs' median run time is shorter than in
    arrival order, and more of them finish."""
    short = Group("short", 40, "batch", "acme", tool_calls=ToolCalls(0, 0))
    long_ = Group("long", 40, "batch", "acme", tool_calls=ToolCalls(6, 6))
    config = SimConfig(groups=(short, long_), replicas=1, duration_s=120, warmup_s=60, ramp_s=20)
    arrival = simulate(config, "luftpause")["groups"]["short"]
    attained = simulate(config, "luftpause-attained")["groups"]["short"]
    assert attained["run_s"]["p50"] < arrival["run_s"]["p50"]
    assert attained["runs"] > arrival["runs"]
