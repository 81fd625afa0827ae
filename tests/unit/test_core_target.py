"""The interactive target (B7; ``scheduler/core/target.py``): its rule, its target
relative to the floor, the batch slots it withholds, and its stability on a step change
of load, on a synthetic engine and in the simulator."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.measure.mix import Group, MixError
from luftpause.scheduler.core import target
from luftpause.scheduler.core.state import ReplicaState, TurnState
from luftpause.scheduler.core.types import EndpointKind, Params, ReplicaSpec, ServiceClass
from luftpause.sim.arms import Ask, LuftpauseArm, TurnEnd
from luftpause.sim.main import arms_from_args
from luftpause.sim.run import SimConfig, simulate, slowdown_arm

SPEC = ReplicaSpec("r", EndpointKind.GENERATIVE, frozenset({"m"}))
TOKENS = 101  # a reply of 101 tokens: its pace is (end - first token) / 100


def replica(**fields: object) -> ReplicaState:
    base = ReplicaState(SPEC, healthy=True, running=4, waiting=0)
    return replace(base, **fields)  # type: ignore[arg-type]


def reply(
    rep: ReplicaState, pace: float, *, beside: int, cls: ServiceClass, now: float, params: Params
) -> ReplicaState:
    """A reply of ``cls`` that streamed at ``pace`` s/token with ``beside`` other batch
    turns, admitted just after the limit last changed; the replica after it."""
    admitted = (rep.pace_set_at or 0.0) + 0.001
    first = now - pace * (TOKENS - 1)
    turn = TurnState(
        "t", "run", "r", "m", cls, "c", EndpointKind.GENERATIVE, "dp", admitted, 1e9,
        started=True, first_token_at=first, batch_beside=beside,
    )  # fmt: skip
    cap, smoothed, set_at, best = target.feedback(rep, turn, TOKENS, now, params)
    return replace(rep, pace_cap=cap, pace_s=smoothed, pace_set_at=set_at, pace_best_s=best)


def test_a_relative_target_is_slowdown_times_the_fastest_reply_seen() -> None:
    """B7: ``interactive_slowdown`` s makes the target s x the replica's floor, the
    fastest pace of a reply with at most one other batch turn beside it; until the
    replica has shown one, the controller seeks it (every reply counts as too slow, so
    the limit falls to one batch turn). The absolute target is never tighter than 1.5x
    that floor."""
    relative = Params(interactive_slowdown=1.5)
    assert target.target_pace(relative, None) is None
    assert target.target_pace(relative, 0.02) == pytest.approx(0.03)
    absolute = Params(interactive_pace_s=0.05)
    assert target.target_pace(absolute, None) == 0.05
    assert target.target_pace(absolute, 0.04) == pytest.approx(0.06)
    assert target.enabled(Params(interactive_pace_s=None, interactive_slowdown=1.2))
    assert not target.enabled(Params(interactive_pace_s=None))

    # No floor yet: a relative target seeks it. A reply beside 10 batch turns is too
    # slow whatever its pace: cut to 3/4 of them; it does not count as the floor.
    rep = replica(in_flight=11, batch_in_flight=10)
    rep = reply(rep, 0.03, beside=10, cls=ServiceClass.INTERACTIVE, now=10, params=relative)
    assert rep.pace_best_s is None and rep.pace_cap == 7 and rep.pace_set_at == 10
    # ... and again, one cut per reply admitted after the last change, down to one
    for now, beside, cap in ((20, 7, 5), (30, 5, 3), (40, 3, 2), (50, 2, 1)):
        rep = replace(rep, batch_in_flight=beside, in_flight=beside + 1)
        rep = reply(
            rep, 0.03, beside=beside, cls=ServiceClass.INTERACTIVE, now=now, params=relative
        )
        assert rep.pace_cap == cap
    # with one batch turn beside it, a reply at 20 ms is the floor: the target is 30 ms
    rep = replace(rep, batch_in_flight=1, in_flight=2)
    rep = reply(rep, 0.02, beside=1, cls=ServiceClass.INTERACTIVE, now=60, params=relative)
    assert rep.pace_best_s == pytest.approx(0.02) and rep.pace_cap == 2  # fast: raised
    # the absolute rule takes the same floor only to loosen its own target
    plain = replica(in_flight=11, batch_in_flight=10)
    plain = reply(plain, 0.2, beside=10, cls=ServiceClass.INTERACTIVE, now=10, params=absolute)
    assert plain.pace_best_s is None and plain.pace_cap == 7  # 200 ms > its 50 ms target
    # a reply between 4/5 of the target and the target changes nothing; one under 4/5 of
    # it, with batch at the limit, raises the limit by one; one over it cuts
    rep = replace(rep, batch_in_flight=2, in_flight=3)
    rep = reply(rep, 0.027, beside=2, cls=ServiceClass.INTERACTIVE, now=70, params=relative)
    assert rep.pace_cap == 2
    rep = reply(rep, 0.021, beside=2, cls=ServiceClass.INTERACTIVE, now=80, params=relative)
    assert rep.pace_cap == 3
    rep = replace(rep, batch_in_flight=3, in_flight=4)
    rep = reply(rep, 0.05, beside=3, cls=ServiceClass.BATCH, now=90, params=relative)
    assert rep.pace_cap == 2  # 3/4 of the batch turns (4, itself included), at most 3
    rep = replace(rep, batch_in_flight=2, in_flight=3)
    rep = reply(rep, 0.05, beside=2, cls=ServiceClass.INTERACTIVE, now=100, params=relative)
    assert rep.pace_cap == 1


def test_withheld_is_the_batch_room_the_cap_would_give_and_the_limit_keeps() -> None:
    """B7's cost: on a capped replica where an interactive run lives, the batch slots the
    cap and the reservations would allow beyond the pace limit; 0 without a limit or an
    interactive run; unknown (None) without a cap."""
    # cap 16, 2 interactive runs paused (reserved), 1 interactive turn in flight, 3 batch
    rep = replica(cap=16, reserved=2, in_flight=4, batch_in_flight=3, pace_cap=3)
    assert target.withheld(rep) == 16 - 2 - 1 - 3
    assert target.withheld(replace(rep, pace_cap=None)) == 0
    nobody = replace(rep, reserved=0, in_flight=3)  # only batch here: no limit applies
    assert target.withheld(nobody) == 0 and not target.paced(nobody)
    assert target.paced(rep)
    assert target.withheld(replace(rep, cap=None)) is None
    assert target.withheld(replace(rep, pace_cap=20)) == 0


def band(pace_at: list[float], goal: float) -> tuple[int, int]:
    """Where the limit must end on an engine whose interactive replies stream at
    ``pace_at[n]`` beside n batch turns (increasing in n): with L* the most batch turns
    that keep the pace within ``goal``, between one cut below L* + 1 and L* + 1; exactly
    the first count above 4/5 of the goal's dead band when one lies in it."""
    best = max((n for n in range(1, len(pace_at)) if pace_at[n] <= goal), default=1)
    # rising from below, the limit stops at the first count whose pace is in or above
    # the dead band
    rest = min((n for n in range(1, len(pace_at)) if pace_at[n] >= 0.8 * goal), default=best)
    low = min(max(1, int(0.75 * (best + 1))), rest)
    return low, best + 1


@settings(max_examples=60, deadline=None)
@given(
    floor=st.floats(0.005, 0.05),
    per_turn=st.floats(0.01, 0.5),
    per_turn_after=st.floats(0.01, 0.5),
    slowdown=st.floats(1.1, 3.0),
    cap=st.integers(2, 48),
)
def test_the_limit_settles_within_one_cut_after_a_step_change_of_load(
    floor: float, per_turn: float, per_turn_after: float, slowdown: float, cap: int
) -> None:
    """B7's stability, on a synthetic engine whose interactive reply pace beside n batch
    turns is floor x (1 + k n), batch work always waiting for the limit: whatever the
    limit was, within cap + 20 replies after a step change of k it stays for good in
    [one cut below L* + 1, L* + 1], L* being the most batch turns that keep replies under
    the target (when no pace within the cap meets it, the limit rests at 1-2), and it
    never leaves that band again: no oscillation grows. Where some count's pace lies in
    the dead band (between 4/5 of the target and the target) the limit comes to rest: no
    oscillation at all. Never 0: batch work always moves."""
    params = Params(interactive_pace_s=None, interactive_slowdown=slowdown)
    rep = replica(cap=cap, in_flight=cap, batch_in_flight=cap - 1)
    now = 0.0
    for k in (per_turn, per_turn_after):
        pace_at = [floor * (1 + k * n) for n in range(cap + 2)]
        seen: list[int] = []
        for _ in range(cap + 60):
            batch = cap - 1 if rep.pace_cap is None else min(rep.pace_cap, cap - 1)
            rep = replace(rep, batch_in_flight=batch, in_flight=batch + 1)
            now += 1.0
            rep = reply(
                rep, pace_at[batch], beside=batch, cls=ServiceClass.INTERACTIVE, now=now,
                params=params,
            )  # fmt: skip
            seen.append(cap if rep.pace_cap is None else rep.pace_cap)
        goal = target.target_pace(params, rep.pace_best_s)
        assert goal is not None
        low, high = band(pace_at[:cap], goal)  # (at most cap - 1 batch turns run)
        settled = seen[cap + 20 :]
        assert min(settled) >= 1
        assert all(min(low, cap - 1) <= n <= max(high, 1) for n in settled), (low, high, settled)
        if any(0.8 * goal <= pace_at[n] <= goal for n in range(1, cap - 1)):
            assert len(set(settled)) == 1, settled  # a count in the dead band: it rests


def step_load(arm: str, seed: int) -> tuple[list[float], list[float]]:
    """Interactive reply paces on a 2-replica pool before and after 36 batch agents
    join 12 at t=150 s (virtual), with ``arm``'s scheduler."""
    config = SimConfig(
        groups=(
            Group("people", 4, "interactive", "people"),
            Group("crowd", 12, "batch", "crowd"),
            Group("step", 36, "batch", "crowd", start_s=150.0),
        ),
        replicas=2,
        duration_s=150.0,
        warmup_s=100.0,
        seed=seed,
    )
    paces: list[tuple[float, float]] = []
    original = LuftpauseArm.finished

    def finished(self: LuftpauseArm, ask: Ask, end: TurnEnd) -> None:
        turn = self.state.turns.get(ask.turn_id)
        first = None if turn is None else turn.first_token_at
        if ask.cls == "interactive" and first is not None and end.completion_tokens > 16:
            paces.append((self.world.now, (self.world.now - first) / end.completion_tokens))
        original(self, ask, end)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LuftpauseArm, "finished", finished)
        simulate(config, arm)
    before = [p for t, p in paces if 60 <= t < 150]
    after = [p for t, p in paces if t >= 190]
    return before, after


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


@pytest.mark.parametrize("seed", [0, 1])
def test_in_the_simulator_a_target_keeps_interactive_replies_through_a_step_of_load(
    seed: int,
) -> None:
    """B7 in the simulator: when batch work quadruples, replies of interactive runs slow
    down far less with a target of 1.3x the floor than with the default absolute pace,
    and after the step they are faster (orderings of virtual-time outcomes)."""
    before_t, after_t = step_load("luftpause-x1.3", seed)
    before_d, after_d = step_load("luftpause", seed)
    assert len(after_t) > 8 and len(after_d) > 8
    assert median(after_t) < median(after_d)
    assert median(after_t) / median(before_t) < median(after_d) / median(before_d)


def test_the_simulators_target_arms_parse_and_bad_ones_are_refused() -> None:
    """B7: ``luftpause sim --arms luftpause-x1.3`` is luftpause with
    ``interactive_target = "1.3x"``; a slowdown of 1 or less, or no number, is no arm."""
    assert slowdown_arm("luftpause-x1.3") == 1.3 and slowdown_arm("luftpause-x2") == 2.0
    for bad in (
        "luftpause-x1",
        "luftpause-x0.9",
        "luftpause-x",
        "luftpause-xnan",
        "luftpause-xinf",
    ):
        assert slowdown_arm(bad) is None
    assert arms_from_args("luftpause,luftpause-x1.5") == ["luftpause", "luftpause-x1.5"]
    with pytest.raises(MixError, match="luftpause-xS"):
        arms_from_args("luftpause-x1")
