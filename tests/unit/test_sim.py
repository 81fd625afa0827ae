"""``luftpause sim`` (B1): the pure core and the engine model in virtual time."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from luftpause.config import SchedulerSettings
from luftpause.fakes.engine.model import EngineParams
from luftpause.measure.mix import Group, MixError
from luftpause.scheduler.core import (
    Admit,
    DropTurn,
    EndpointKind,
    ForgetRun,
    Params,
    Reject,
    ReplicaSpec,
    initial_state,
)
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.main import core_params
from luftpause.sim.arms import counted_median
from luftpause.sim.run import MODEL, SimConfig, Trace, scheduler_line, simulate
from luftpause.sim.sweep import fewest, parse_sweep
from luftpause.sim.world import World

SMALL = SimConfig(
    groups=(Group("chat", 2, "interactive", "chat"), Group("crowd", 40, "batch", "crowd")),
    replicas=1,
    duration_s=120.0,
    warmup_s=30.0,
)


def test_world_runs_events_in_time_order_ties_in_scheduling_order() -> None:
    """B1: virtual time only moves forward, event to event; equal times keep their order."""
    world = World()
    seen: list[tuple[float, str]] = []
    world.at(2.0, lambda: seen.append((world.now, "b")))
    world.at(1.0, lambda: seen.append((world.now, "a")))
    world.at(2.0, lambda: seen.append((world.now, "c")))
    world.at(1.0, lambda: world.after(0.5, lambda: seen.append((world.now, "d"))))
    world.at(9.0, lambda: seen.append((world.now, "late")))
    world.run(until=5.0)
    assert seen == [(1.0, "a"), (1.5, "d"), (2.0, "b"), (2.0, "c")]
    assert world.now == 5.0 and world.events == 5


def test_the_same_seed_gives_the_same_report() -> None:
    """B1: a simulation is a function of its configuration and seed."""
    first = simulate(SMALL, "luftpause")
    again = simulate(SMALL, "luftpause")
    for key in ("classes", "groups", "errors", "events", "turns"):
        assert first[key] == again[key]
    assert first["turns"] > 100  # it did simulate a load


def specs() -> tuple[ReplicaSpec, ...]:
    """The replicas as the scheduler service builds them from the flood's stack file,
    whose endpoints declare ``class_priority`` (so their engines order classes)."""
    return tuple(
        ReplicaSpec(f"engine-{i}", EndpointKind.GENERATIVE, frozenset({MODEL}), True)
        for i in range(SMALL.replicas)
    )


@pytest.mark.parametrize("class_priority", [True, False])
def test_the_luftpause_arm_sees_replicas_as_the_service_does(class_priority: bool) -> None:
    """B1, S4: with class priority the service's replicas order classes (an interactive
    turn is never held for the cap); the simulator's luftpause arm builds them alike."""
    from dataclasses import replace

    from luftpause.fakes.engine.model import EngineParams
    from luftpause.sim.fleet import Replica
    from luftpause.sim.run import make_arm

    world = World()
    replicas = [Replica(f"engine-{i}", EngineParams(), world) for i in range(2)]
    arm = make_arm("luftpause", world, replicas, replace(SMALL, class_priority=class_priority))
    state = arm.state  # type: ignore[attr-defined]
    assert {r.spec.orders_classes for r in state.replicas.values()} == {class_priority}


def test_the_core_decides_the_same_in_the_simulator_and_in_the_service() -> None:
    """B1, S1: the events the simulator fed to ``decide``, applied by the scheduler
    service's own writer (``Host``), give the admissions the simulation made, in the
    same order."""
    trace = Trace()
    simulate(SMALL, "luftpause", trace=trace)
    log = trace.events
    assert len(log) > 500
    simulated = [(a.turn_id, a.replica) for a in trace.admits]
    served: list[tuple[str, str]] = []

    async def through_the_host() -> None:
        host = Host(initial_state(specs(), SMALL.params, 0.0), clock=lambda: 0.0)
        execute = host._execute

        def recording(action: Admit | Reject | DropTurn | ForgetRun) -> None:
            if isinstance(action, Admit):
                served.append((action.turn_id, action.replica))
            execute(action)

        host._execute = recording  # type: ignore[method-assign]
        writer = asyncio.create_task(host.run())
        for event in log:  # each stamped with its own simulated time
            await host.apply(lambda at, event=event: event)
        writer.cancel()

    asyncio.run(through_the_host())
    assert served == simulated
    assert len(simulated) > 100


def test_luftpause_keeps_interactive_runs_fast_where_a_router_does_not() -> None:
    """B1, S4: on one saturated replica, interactive runs finish sooner under the
    luftpause arm than behind a router that admits everything (an ordering, in
    virtual time: no wall-clock timing is asserted)."""
    ours = simulate(SMALL, "luftpause")["classes"]["interactive"]
    router = simulate(SMALL, "router")["classes"]["interactive"]
    assert ours["run_s"]["p50"] < router["run_s"]["p50"]
    assert ours["runs_per_min"] > router["runs_per_min"]


def test_engine_priority_pins_agents_round_robin() -> None:
    """The engine-prio arm sends agent i to replica i mod N (as the flood's arm does)."""
    config = SimConfig(
        groups=(Group("crowd", 4, "batch", "crowd"),), replicas=2, duration_s=30, warmup_s=0
    )
    result = simulate(config, "engine-prio")
    assert result["turns"] > 0
    assert set(result["engine_busy_share"]) == {"engine-0", "engine-1"}
    assert all(share > 0 for share in result["engine_busy_share"].values())


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "luftpause", "sim", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_reports_every_arm_and_writes_json(tmp_path: Path) -> None:
    """B1: ``luftpause sim`` prints the load generator's table per arm and a comparison,
    no progress line when stderr is not a terminal, and the same figures as JSON."""
    out = run_cli(
        "--group", "1:interactive", "--group", "6:batch", "--duration-s", "40",
        "--warmup-s", "10", "--json", str(tmp_path / "sim.json"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for arm in ("## luftpause", "## router", "## engine-prio", "## smg", "## Arms side by side"):
        assert arm in out.stdout
    assert out.stderr == ""
    data = json.loads((tmp_path / "sim.json").read_text())
    assert [r["arm"] for r in data["results"]] == ["luftpause", "router", "engine-prio", "smg"]
    assert data["config"]["groups"][0]["cls"] == "interactive"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "no load"),
        (("--group", "2:batch:c:subagents"), "own-loop agents only"),
        (("--group", "2:batch", "--arms", "luftpause,smg-max"), "unknown arm(s) smg-max"),
        (("--group", "2:batch", "--arms", "smg-cap3"), "capacity must be more than 4"),
        (("--group", "2:batch", "--arms", "luftpause-pace"), "unknown arm(s) luftpause-pace"),
        (("--group", "2:batch", "--sweep", "target=1.5", "--target-p50", "9"), "go with"),
        (("--group", "2:nightly"), "class must be interactive or batch"),
        (("--agents", "2", "--context-chars", "40000"), "do not fit the engine's context"),
    ],
)
def test_cli_refuses_bad_input_with_a_clear_error(args: tuple[str, ...], message: str) -> None:
    out = run_cli(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_params_are_the_services_defaults() -> None:
    """The luftpause arm runs the core with the scheduler's default policy constants,
    the ramp from idle (S2) and the decode pace included, which the service's default
    settings give the core."""
    assert SimConfig(groups=SMALL.groups).params == Params()
    assert core_params(SchedulerSettings()) == Params()


def test_a_decode_pace_target_speeds_up_interactive_turns_beside_long_batch_contexts() -> None:
    """Decode pace, B1, B10: one long-context replica, one interactive coding agent beside
    twelve batch ones. Nothing queues there, so S2's cap never engages; with
    ``interactive_pace_s`` (the default, 0.1 s per token) the batch turns beside the
    interactive run are limited and its turns end sooner than with it off, and batch
    work goes on (an ordering, in virtual time). The arm ``luftpause-pace100`` is the
    same target, ``luftpause-no-pace`` the target off."""
    engine = EngineParams(priority_scheduling=True, context_length=131072, kv_tokens=1_000_000)
    config = SimConfig(
        groups=(
            Group("people", 1, "interactive", "people", profile="coding-agent"),
            Group("crowd", 12, "batch", "crowd", profile="coding-agent"),
        ),
        replicas=1,
        duration_s=300.0,
        warmup_s=120.0,
        engine=engine,
    )
    assert config.params.interactive_pace_s == 0.1
    off = replace(config, params=replace(config.params, interactive_pace_s=None))
    plain = simulate(off, "luftpause")["classes"]
    paced = simulate(config, "luftpause")["classes"]
    assert simulate(config, "luftpause-pace100")["classes"] == paced
    assert simulate(config, "luftpause-no-pace")["classes"] == plain
    turn_p50 = [r["interactive"]["turns_ended"]["wall_s"]["p50"] for r in (plain, paced)]
    assert turn_p50[1] < turn_p50[0]
    assert paced["batch"]["turns_ended"]["completion_tokens_per_min"] > 0


def test_the_scheduler_is_read_over_the_window_as_the_flood_reads_its_status() -> None:
    """B1, S2, S12: a luftpause arm reports its core's figures as the flood reports the
    service's /status: read every second of the window, medians per replica. Under a
    flood the replica is capped, and the decode pace limits batch beside the interactive
    runs only where it is on; an arm with no scheduler reports none. The engines' share
    of busy time in prefill and their decode batch are reported over the window, as
    the flood's engine counters give them."""
    config = replace(SMALL, warmup_s=30.0, duration_s=60.0)
    paced = simulate(config, "luftpause")["scheduler"]
    assert paced["samples"] == 61  # at 30, 31, ..., 90 s
    (figures,) = paced["replicas"].values()
    assert figures["capacity"] is not None and figures["capacity"] >= 1
    assert figures["batch_limit_from_pace"] is not None
    assert 0 < figures["in_flight"] <= figures["capacity"] + 2  # 2 interactive beside
    assert paced["held"] > 0  # 40 batch agents wait for the cap
    engines = simulate(config, "luftpause")["engines"]
    assert 0 < engines["prefill_share"] < 1 and engines["decode_batch"] > 1
    unpaced = simulate(config, "luftpause-no-pace")["scheduler"]
    assert [r["batch_limit_from_pace"] for r in unpaced["replicas"].values()] == [None]
    assert simulate(config, "router")["scheduler"] == {}


def test_a_median_of_counted_readings_is_the_median_of_the_readings() -> None:
    """B1: the scheduler's readings are kept as counts per value; their median is the
    one ``statistics.median`` gives over the readings themselves, "not limited" (None)
    left out."""
    rng = random.Random(7)
    for _ in range(500):
        readings = [rng.choice([None, 1, 2, 3, 5, 8, 13]) for _ in range(rng.randint(0, 12))]
        known = [r for r in readings if r is not None]
        expected = statistics.median(known) if known else None
        assert counted_median(Counter(readings)) == expected, readings


def test_sweep_values_are_checked() -> None:
    """B1 capacity planning: ``--sweep replicas=…`` takes whole counts ≥ 1, sorted;
    B7: ``--sweep target=…`` slowdowns above 1, sorted, the same value once."""
    assert parse_sweep("replicas=4,1,2,2") == ("replicas", [1, 2, 4])
    assert parse_sweep("target=2,1.2,1.20, 1.5") == ("target", ["1.2", "1.5", "2"])
    for bad in (
        "replicas", "gpus=1,2", "replicas=0,1", "replicas=a", "replicas=",
        "target=", "target=1", "target=0.5,2", "target=fast",
    ):  # fmt: skip
        with pytest.raises(MixError):
            parse_sweep(bad)


def test_cli_sweeps_the_interactive_target_and_draws_its_frontier(tmp_path: Path) -> None:
    """B7: ``--sweep target=…`` runs luftpause with each target beside the arms given and
    ``--plot`` draws the frontier: interactive against batch runs/min, luftpause's
    points joined by one line, a capped peer's by another (well-formed SVG)."""
    plot = tmp_path / "frontier.svg"
    out = run_cli(
        "--group", "1:interactive", "--group", "8:batch", "--duration-s", "60",
        "--warmup-s", "20", "--arms", "smg-cap6,smg-cap8", "--sweep", "target=1.5,3",
        "--plot", str(plot),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for arm in ("luftpause", "luftpause-x1.5", "luftpause-x3", "smg-cap6", "smg-cap8"):
        assert f"## {arm}\n" in out.stdout
    root = ElementTree.fromstring(plot.read_text())
    assert root.tag.endswith("svg")
    labels = {t.text for t in root.iter() if t.tag.endswith("text")}
    assert {"luftpause", "luftpause-x1.5", "luftpause-x3", "smg-cap6", "smg-cap8"} <= labels
    assert sum(1 for e in root.iter() if e.tag.endswith("polyline")) == 2


def test_fewest_replicas_meeting_an_interactive_target() -> None:
    """B1: the answer to "how many replicas for this interactive p50?", per arm."""

    def result(arm: str, replicas: int, p50: float | None) -> dict[str, object]:
        classes = (
            {}
            if p50 is None
            else {"interactive": {"runs_per_min_closed": 1.0, "run_s": {"p50": p50}}}
        )
        return {"arm": arm, "replicas": replicas, "classes": classes}

    results = [
        result("luftpause", 1, 50.0), result("luftpause", 2, 30.0), result("luftpause", 4, 20.0),
        result("router", 1, None), result("router", 2, 90.0), result("router", 4, 45.0),
    ]  # fmt: skip
    assert fewest(results, 40.0) == {"luftpause": 2, "router": None}
    assert fewest(results, 60.0) == {"luftpause": 1, "router": 4}


def test_fewest_replicas_meeting_an_interactive_turn_target() -> None:
    """B1, B10: for runs that outlast the window (no run p50 at all), the target is an
    interactive turn's p50, read from the turns that ended in the window."""

    def result(arm: str, replicas: int, turn_p50: float | None) -> dict[str, object]:
        ended = {"completion_tokens_per_min": 10.0, "wall_s": {"p50": turn_p50}}
        classes = {"interactive": {"runs_per_min_closed": None, "run_s": {"p50": None},
                                   "turns_ended": ended}}  # fmt: skip
        return {"arm": arm, "replicas": replicas, "classes": classes}

    results = [
        result("luftpause", 1, 9.0), result("luftpause", 2, 4.0),
        result("router", 1, 20.0), result("router", 2, None),
    ]  # fmt: skip
    assert fewest(results, 5.0, "turn") == {"luftpause": 2, "router": None}
    assert fewest(results, 10.0, "turn") == {"luftpause": 1, "router": None}
    assert fewest(results, 1000.0) == {"luftpause": None, "router": None}  # no run ended


def test_the_plot_draws_turns_where_runs_leave_holes() -> None:
    """B1, B10: the sweep's plot draws run figures, unless the target is a turn's or a
    point finished no run of a class (its run figure would be a hole in the plot)."""
    from luftpause.sim.sweep import plotted

    def result(inter_p50: float | None, batch_rate: float | None) -> dict[str, object]:
        return {"classes": {
            "interactive": {"runs_per_min_closed": 1.0, "run_s": {"p50": inter_p50}},
            "batch": {"runs_per_min_closed": batch_rate, "run_s": {"p50": 1.0}},
        }}  # fmt: skip

    whole = [result(10.0, 50.0), result(8.0, 60.0)]
    assert plotted(whole, turn_target=False) == "run"
    assert plotted(whole, turn_target=True) == "turn"
    assert plotted([*whole, result(None, 50.0)], turn_target=False) == "turn"
    assert plotted([*whole, result(9.0, None)], turn_target=False) == "turn"


def test_cli_sweep_on_turns_for_runs_that_outlast_the_window(tmp_path: Path) -> None:
    """B1, B10: a sweep of coding-agent runs, too long to finish in a short window, still
    answers "how many replicas" from interactive turns, and plots turns, not runs."""
    plot = tmp_path / "sweep.svg"
    out = run_cli(
        "--group", "1:interactive", "--group", "2:batch", "--profile", "coding-agent",
        "--context-length", "131072", "--kv-tokens", "1000000", "--duration-s", "60",
        "--warmup-s", "20", "--arms", "luftpause", "--sweep", "replicas=1,2",
        "--target-turn-p50", "1000", "--plot", str(plot),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "interactive turn p50 ≤ 1000 s under luftpause: 1 replica" in out.stdout
    assert "interactive turn p50 (s)" in plot.read_text()
    root = ElementTree.fromstring(plot.read_text())
    assert len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 2


def test_cli_sweep_prints_the_table_the_answer_and_a_plot(tmp_path: Path) -> None:
    """B1: a sweep over replica counts, every arm at each, with the fewest replicas meeting
    the target and an SVG plot with one line per arm in each panel."""
    plot = tmp_path / "sweep.svg"
    out = run_cli(
        "--group", "1:interactive", "--group", "8:batch", "--duration-s", "30", "--warmup-s",
        "10", "--arms", "luftpause,router", "--sweep", "replicas=1,2", "--target-p50", "1000",
        "--plot", str(plot),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "| 1 | luftpause |" in out.stdout and "| 2 | router |" in out.stdout
    assert "interactive run p50 ≤ 1000 s under luftpause: 1 replica" in out.stdout
    root = ElementTree.fromstring(plot.read_text())
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 4  # two arms × two panels


def test_cli_plot_needs_a_sweep() -> None:
    out = run_cli("--group", "2:batch", "--plot", "x.svg")
    assert out.returncode == 2
    assert "--plot goes with --sweep replicas=N,N,... or --sweep target=S,S,..." in out.stderr


def test_a_prompt_the_engine_refuses_fails_the_run_and_the_agent_goes_on() -> None:
    """A run whose prompt is longer than the engine's context is refused by the engine
    (its 400): counted as an error by kind, and the agent starts its next run a second
    later, so the simulation neither stops nor spins in one instant."""
    config = SimConfig(
        groups=(Group("huge", 2, "batch", "huge", context_chars=40_000),),
        duration_s=20.0,
        warmup_s=0.0,
    )
    result = simulate(config, "router")
    assert result["errors"] == {"http_400": result["error_count"]}
    assert 30 <= result["error_count"] <= 2 * 21  # one per agent per second, about
    assert result["turns"] == result["error_count"]


@pytest.mark.parametrize(("first_chunk", "reply"), [(1, 20), (8, 20), (8, 3)])
def test_a_replica_shows_the_first_token_when_its_first_chunk_is_streamed(
    first_chunk: int, reply: int
) -> None:
    """B1, H1: a replica reports a reply's first token at the end of the step that made
    its ``first_chunk_tokens``-th token (1: the token itself, as SGLang streams it); a
    reply shorter than the chunk shows it at its end, before the end is reported."""
    from luftpause.fakes.engine.model import EngineModel, EngineRequest
    from luftpause.sim.fleet import Replica

    def request() -> EngineRequest:
        return EngineRequest("r1", "word " * 40, reply_tokens=reply, max_new_tokens=64)

    # The model alone, stepped back to back from 0: each step's end that made one of
    # the reply's tokens.
    model = EngineModel(EngineParams())
    model.submit(request(), now=0.0)
    produced: list[float] = []
    t = 0.0
    while model.has_work():
        step = model.step(t)
        t = step.end
        produced.extend(t for _ in step.tokens)

    world = World()
    replica = Replica("engine-0", EngineParams(), world, first_chunk_tokens=first_chunk)
    seen: list[tuple[str, float]] = []
    replica.submit(
        request(),
        lambda: seen.append(("first", world.now)),
        lambda done: seen.append(("end", world.now)),
    )
    world.run(until=60.0)
    assert len(produced) == reply
    first_at = produced[min(first_chunk, reply) - 1]
    assert seen == [("first", first_at), ("end", produced[-1])]
    if first_chunk < reply:
        assert first_at < produced[-1]


def test_the_retain_arm_sends_hints_the_engines_keep_and_releases_at_run_end() -> None:
    """B8: ``luftpause-retain`` admits with retention times once a tool time is learned
    (about the lookup tool's time); the engine model keeps the prompts and, under this
    crowd, evicts some kept ones. The plain arm sends none."""
    admits: list[Admit] = []
    trace = Trace(events=[], admits=admits)
    retain = simulate(SMALL, "luftpause-retain", trace=trace)
    hinted = [a.retain_s for a in admits if a.retain_s > 0]
    assert len(hinted) > len(admits) // 2
    assert all(0.5 <= s <= 3.0 for s in hinted)  # the lookup tool: 0.5-1.5 s
    engines = retain["engines"]
    assert engines["retention_evicted_tokens"] > 0
    plain_admits: list[Admit] = []
    plain = simulate(SMALL, "luftpause", trace=Trace(events=[], admits=plain_admits))
    assert all(a.retain_s == 0 for a in plain_admits)
    assert "retention_evicted_tokens" not in plain["engines"]


def test_target_arm_names_set_the_options_they_name() -> None:
    """B1, B5, B7: ``luftpause-xS`` sets a relative target (packing off, as configured by
    default), ``luftpause-pack-xS`` the same with ``target_packing = true``,
    ``luftpause-wset-xS`` working-set admission beside the target; a name whose
    slowdown is not one (``luftpause-x1``, a prefix twice) is no arm."""
    from luftpause.scheduler.core import WorkingSet
    from luftpause.sim.fleet import Replica
    from luftpause.sim.run import make_arm, slowdown_arm
    from luftpause.sim.world import World

    config = SimConfig(groups=SMALL.groups)
    world = World()
    replicas = [Replica("engine-0", config.engine, world, config.first_chunk_tokens)]

    def params(name: str) -> Params:
        arm = make_arm(name, world, replicas, config)
        return arm.state.params  # type: ignore[attr-defined,no-any-return]

    plain, packed, wset = (
        params("luftpause-x1.2"),
        params("luftpause-pack-x1.2"),
        params("luftpause-wset-x2"),
    )
    assert (plain.interactive_slowdown, plain.target_packing) == (1.2, False)
    assert (packed.interactive_slowdown, packed.target_packing) == (1.2, True)
    assert (wset.interactive_slowdown, wset.working_set) == (2.0, WorkingSet.REPLACE)
    assert params("luftpause").working_set is WorkingSet.OFF
    for bad in ("luftpause-x1", "luftpause-wset-xluftpause-x1.2", "luftpause-pack-x"):
        assert slowdown_arm(bad) is None
        with pytest.raises(ValueError, match="unknown arm"):
            make_arm(bad, world, replicas, config)


def test_the_scheduler_line_names_each_replica_of_a_pool_and_a_fleet_s_spread() -> None:
    """B1, B12: the report's scheduler line gives each replica's figures for a pool, and
    for a fleet (more than 16 replicas) the least, median and most, so a report of 1,000
    replicas stays a line to read."""

    def figures(n: int) -> dict[str, Any]:
        replicas = {
            f"engine-{i}": {
                "capacity": float(10 + i % 7),
                "batch_limit_from_pace": None,
                "in_flight": float(i % 3),
            }
            for i in range(n)
        }
        return {"replicas": replicas, "held": 4.0}

    pool = scheduler_line(figures(3))
    assert "per replica" in pool and "cap 10.0 / 11.0 / 12.0" in pool
    fleet = scheduler_line(figures(1000))
    assert "least / median / most of 1000 replicas" in fleet
    assert "cap 10.0 / 13.0 / 16.0" in fleet and "in flight 0.0 / 1.0 / 2.0" in fleet
    assert "decode pace – (– : none limited)" in fleet and "held 4.0" in fleet
    assert len(fleet) < 400
