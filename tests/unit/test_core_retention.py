"""Unit tests of B8's retention time in the core: with ``Params.kv_retention`` each
admission carries how long the engine should keep the run's prefix after the turn, the
smoothed time plus one deviation of the slowest tool of the pause the run comes back from;
without it (the default) every admission carries 0."""

from __future__ import annotations

from dataclasses import replace

from luftpause.scheduler.core import Admit, TurnFinished
from luftpause.scheduler.core.leases import retain_time
from luftpause.scheduler.core.state import ToolTime
from tests.unit.test_core_rules import SPEC_RULES, Sim, capped, gen


def admitted(actions: tuple) -> dict[str, float]:
    return {a.turn_id: a.retain_s for a in actions if isinstance(a, Admit)}


def history(kv_retention: bool) -> list[dict[str, float]]:
    """A run back from grep after 3 s, a run back from grep and deploy, a new run."""
    sim = Sim(gen("a"), params=replace(SPEC_RULES, kv_retention=kv_retention))
    capped(sim, "a", 8)
    seen = [admitted(sim.req("t1", "R"))]  # nothing learned yet: no hint
    sim(TurnFinished(sim.t, "t1", paused_on_tool=True, tool_names=("grep",)))
    sim.t = 3.0
    seen.append(admitted(sim.req("t2", "R")))  # grep learned: 3 s, deviation 1.5 s
    sim(TurnFinished(sim.t, "t2", paused_on_tool=True, tool_names=("grep", "deploy")))
    sim.t = 13.0
    seen.append(admitted(sim.req("t3", "R")))  # back after 10 s from grep and deploy
    seen.append(admitted(sim.req("n1", "N")))  # a new run: unnamed tools, none learned
    return seen


def test_admissions_carry_the_runs_usual_tool_time_when_on() -> None:
    """B8: the retention time is the slowest tool's smoothed time + deviation, learned
    from the pause the run is back from; 0 where nothing is learned."""
    grep_after_2 = ToolTime(3.0 + 0.125 * 7.0, 1.5 + 0.25 * (7.0 - 1.5), 2)  # (3 s, then 10 s)
    deploy = ToolTime(10.0, 5.0, 1)
    assert history(kv_retention=True) == [
        {"t1": 0.0},
        {"t2": 4.5},
        {"t3": max(deploy.mean_s + deploy.dev_s, grep_after_2.mean_s + grep_after_2.dev_s)},
        {"n1": 0.0},
    ]


def test_off_every_admission_carries_nothing() -> None:
    """B8: the option off (the default) leaves every admission without a hint."""
    assert all(v == 0.0 for seen in history(kv_retention=False) for v in seen.values())


def test_retain_time_takes_the_slowest_known_tool() -> None:
    """B8: unknown tools do not count; no known tool gives 0; no tools means unnamed."""
    from immutables import Map

    times = Map({"a": ToolTime(2.0, 1.0, 3), "b": ToolTime(5.0, 0.5, 3), "": ToolTime(1.0, 0.0, 1)})
    assert retain_time(times, ("a", "b", "zzz")) == 5.5
    assert retain_time(times, ("zzz",)) == 0.0
    assert retain_time(times, ()) == 1.0
