"""``luftpause sim``: agent load on engine replicas in virtual time, arm by arm (B1).

    luftpause sim --group 4:interactive --group 48:batch            # every arm
    luftpause sim --group 4:interactive --group 48:batch --arms luftpause,router
    luftpause sim --mix mix.toml --replicas 4 --duration-s 600 --json sim.json
    luftpause sim --group 4:interactive --group 96:batch --sweep replicas=1,2,4 \
        --target-p50 40 --plot sweep.svg                               # how many replicas?

The groups are the load generator's (``--group``, ``--mix``, ``--agents``;
own-loop agents only). Each arm runs the same load from the same seed on fresh
replicas; the report is the load generator's table per arm, and a comparison.
See the package docstring for what each arm models.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from luftpause.cliargs import non_negative_float, positive_float, positive_int
from luftpause.fakes.engine.model import EngineParams
from luftpause.fakes.engine.script import ScriptOptions
from luftpause.fakes.engine.tokens import CHARS_PER_TOKEN
from luftpause.loadgen import stats
from luftpause.loadgen.main import add_run_shape, build_groups
from luftpause.loadgen.mix import CLASSES, Group, MixError
from luftpause.loadgen.progress import LiveLine
from luftpause.scheduler.core import Admit, Event, Params
from luftpause.sim.agents import Agent, Records
from luftpause.sim.arms import ARMS, Arm, EnginePriorityArm, LuftpauseArm, RouterArm
from luftpause.sim.fleet import Replica
from luftpause.sim.world import World

MODEL = "llama-3.2-1b"


@dataclass(frozen=True)
class SimConfig:
    groups: tuple[Group, ...]
    replicas: int = 2
    duration_s: float = 300.0
    warmup_s: float = 60.0
    ramp_s: float = 0.0
    seed: int = 0
    probe_s: float = 2.0
    # As tools/bench/flood.py starts the fake engines: queues ordered by priority.
    engine: EngineParams = field(default_factory=lambda: EngineParams(priority_scheduling=True))
    params: Params = field(default_factory=Params)
    # luftpause arm: engines get each turn's class priority (interactive 10, batch 0), as
    # the flood's stack files declare with ``class_priority``.
    class_priority: bool = True
    script: ScriptOptions = field(default_factory=ScriptOptions)


@dataclass
class Trace:
    """What the luftpause arm's core saw and did, in order (for replay)."""

    events: list[Event] = field(default_factory=list)
    admits: list[Admit] = field(default_factory=list)


def make_arm(name: str, world: World, replicas: list[Replica], config: SimConfig,
             trace: Trace | None = None) -> Arm:  # fmt: skip
    if name == "luftpause":
        return LuftpauseArm(
            world, replicas, frozenset({MODEL}), config.params, config.probe_s,
            log=None if trace is None else trace.events,
            admits=None if trace is None else trace.admits,
            class_priority=config.class_priority,
        )  # fmt: skip
    if name == "router":
        return RouterArm(replicas)
    if name == "engine-prio":
        return EnginePriorityArm(replicas)
    raise ValueError(f"unknown arm {name!r}; arms are {', '.join(ARMS)}")


def simulate(
    config: SimConfig,
    arm_name: str,
    progress: Callable[[float, int], None] | None = None,
    trace: Trace | None = None,
) -> dict[str, Any]:
    """One arm under the configured load; the load generator's summary plus the run's
    own figures (virtual and wall time, events)."""
    world = World()
    replicas = [Replica(f"engine-{i}", config.engine, world) for i in range(config.replicas)]
    arm = make_arm(arm_name, world, replicas, config, trace)
    by_name = {r.name: r for r in replicas}
    records = Records()
    agents: list[Agent] = []
    for group in config.groups:
        for i in range(group.count):
            agent = Agent(
                len(agents), group, MODEL, world, arm, by_name, records, config.seed, config.script
            )
            agents.append(agent)
            agent.start(config.ramp_s * i / group.count)
    arm.start()
    end = config.warmup_s + config.duration_s
    started = time.perf_counter()
    world.run(end, None if progress is None else lambda t: progress(t, world.events))
    wall = time.perf_counter() - started
    summary = stats.summarise(
        records.runs,
        records.errors,
        (config.warmup_s, end),
        [(g.name, g.cls) for g in config.groups],
        {g.name: g.count for g in config.groups},
    )
    return {
        **summary,
        "arm": arm_name,
        "seed": config.seed,
        "replicas": config.replicas,
        "virtual_s": end,
        "wall_s": round(wall, 3),
        "speedup": round(end / wall, 1) if wall > 0 else None,
        "events": world.events,
        "turns": records.turns,
        "engine_busy_share": {r.name: round(r.busy_s / end, 3) if end else 0.0 for r in replicas},
    }


def comparison(results: list[dict[str, Any]]) -> str:
    """One line per arm: runs/min and run time per class."""
    head = "| arm |"
    rule = "|---|"
    for cls in CLASSES:
        head += f" {cls} runs/min | {cls} run p50 s |"
        rule += "---|---|"
    lines = [head, rule]
    for result in results:
        row = f"| {result['arm']} |"
        for cls in CLASSES:
            c = result["classes"].get(cls)
            if c is None:
                row += " – | – |"
                continue
            p50 = c["run_s"]["p50"]
            row += f" {c['runs_per_min']:.1f} | {'–' if p50 is None else f'{p50:.1f}'} |"
        lines.append(row)
    return "\n".join(lines)


def render(results: list[dict[str, Any]], config: SimConfig, command: str) -> str:
    lines = [
        f"Command: {command}",
        "",
        f"Simulated: {config.replicas} replicas, {sum(g.count for g in config.groups)} agents "
        f"({', '.join(f'{g.count} {g.cls} {g.name}' for g in config.groups)}), "
        f"{config.warmup_s:g} s warm-up + {config.duration_s:g} s measured, seed {config.seed}.",
        "",
    ]
    for result in results:
        lines += [
            f"## {result['arm']}",
            "",
            stats.table(result),
            "",
            f"{result['events']:,} events, {result['turns']:,} turns in {result['wall_s']:.1f} s "
            f"of wall time ({result['speedup']}× real time)",
            "",
        ]
        if result["error_count"]:
            kinds = ", ".join(f"{k} {v}" for k, v in result["errors"].items())
            lines += [f"errors: {kinds}", ""]
    if len(results) > 1:
        lines += ["## Arms side by side", "", comparison(results), ""]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    load = parser.add_argument_group("load (as luftpause loadgen)")
    load.add_argument("--agents", type=positive_int, help="own-loop agents in one group")
    load.add_argument(
        "--class", dest="cls", choices=CLASSES, help="class of the --agents group (default: batch)"
    )
    load.add_argument("--caller", help="caller of the --agents group (default: the group name)")
    load.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="N:CLASS[:CALLER]",
        help="a group of N own-loop agents (repeatable)",
    )
    load.add_argument("--mix", type=Path, metavar="FILE", help="TOML file of [[group]] tables")
    add_run_shape(load, "tool calls per run (default: 3)")
    sim = parser.add_argument_group("simulation")
    sim.add_argument(
        "--arms",
        default=",".join(ARMS),
        metavar="ARM[,ARM...]",
        help=f"arms to run, in order (default: {','.join(ARMS)})",
    )
    sim.add_argument(
        "--replicas", type=positive_int, default=2, help="engine replicas (default: 2)"
    )
    sim.add_argument(
        "--duration-s",
        type=positive_float,
        default=300.0,
        help="measured window, virtual seconds (default: 300)",
    )
    sim.add_argument(
        "--warmup-s",
        type=non_negative_float,
        default=60.0,
        help="virtual seconds before the window opens (default: 60)",
    )
    sim.add_argument(
        "--ramp-s",
        type=non_negative_float,
        default=0.0,
        help="start each group's agents spread over this many seconds (default: 0)",
    )
    sim.add_argument("--seed", type=int, default=0, help="seed of every random choice (default: 0)")
    sim.add_argument(
        "--probe-s",
        type=positive_float,
        default=2.0,
        help="luftpause arm: seconds between probes of the replicas (default: 2)",
    )
    sim.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    plan = parser.add_argument_group("capacity planning")
    plan.add_argument(
        "--sweep",
        metavar="replicas=N,N,...",
        help="run every arm at each replica count (e.g. replicas=1,2,4,8) and compare",
    )
    plan.add_argument(
        "--target-p50",
        type=positive_float,
        metavar="SECONDS",
        help="with --sweep: the fewest replicas whose interactive run p50 is at most this",
    )
    plan.add_argument(
        "--plot", type=Path, metavar="FILE.svg", help="with --sweep: draw the sweep as SVG"
    )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    args.subagents = None
    groups = build_groups(args)
    if not groups:
        raise MixError("no load: give --group, --mix or --agents")
    subagents = [g.name for g in groups if g.kind != "agents"]
    if subagents:
        raise MixError(
            f"group(s) {', '.join(subagents)}: the simulator runs own-loop agents only "
            '(kind = "agents")'
        )
    context = EngineParams().context_length
    for g in groups:
        if g.context_chars < 400:
            raise MixError(f"group {g.name}: context_chars must be at least 400")
        if g.context_chars // CHARS_PER_TOKEN + g.max_tokens >= context:
            raise MixError(
                f"group {g.name}: {g.context_chars} characters of context and {g.max_tokens} "
                f"reply tokens do not fit the engine's context of {context} tokens "
                f"({CHARS_PER_TOKEN} characters a token)"
            )
    return SimConfig(
        groups=tuple(groups),
        replicas=args.replicas,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        ramp_s=args.ramp_s,
        seed=args.seed,
        probe_s=args.probe_s,
    )


def arms_from_args(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise MixError(
            f"unknown arm(s) {', '.join(unknown) or '(none given)'}; arms are {', '.join(ARMS)}"
        )
    return list(dict.fromkeys(arms))


@dataclass
class _Progress:
    """The live line while an arm runs: ``arm 2/3 router: 120/360 virtual s, 9,812 events``."""

    label: str
    end: float
    t: float = 0.0
    events: int = 0

    def update(self, t: float, events: int) -> None:
        self.t, self.events = t, events

    def line(self) -> str:
        return f"{self.label}: {self.t:.0f}/{self.end:.0f} virtual s, {self.events:,} events"


def run(configs: list[SimConfig], arms: list[str], stream: TextIO) -> list[dict[str, Any]]:
    """Every arm on every configuration, in that order, with one progress line each."""
    results = []
    total = len(configs) * len(arms)
    for k, (config, arm) in enumerate(((c, a) for c in configs for a in arms), 1):
        end = config.warmup_s + config.duration_s
        where = f", {config.replicas} replicas" if len(configs) > 1 else ""
        progress = _Progress(f"run {k}/{total} {arm}{where}", end)
        with LiveLine(stream, progress.line) as live:
            results.append(simulate(config, arm, progress.update))
            progress.t = end
            live.refresh()
    return results


def main(args: argparse.Namespace) -> int:
    from luftpause.sim import sweep

    try:
        config = config_from_args(args)
        arms = arms_from_args(args.arms)
        counts = sweep.parse_sweep(args.sweep) if args.sweep else None
        if counts is None and (args.target_p50 is not None or args.plot is not None):
            raise MixError("--target-p50 and --plot go with --sweep replicas=N,N,...")
    except (MixError, OSError) as exc:
        print(f"luftpause sim: {exc}", file=sys.stderr)
        return 2
    configs = sweep.points(config, counts) if counts else [config]
    results = run(configs, arms, sys.stderr)
    command = "luftpause sim " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "luftpause sim"
    if counts is None:
        print(render(results, config, command))
    else:
        print(f"Command: {command}\n")
        print(sweep.table(results))
        if args.target_p50 is not None:
            print()
            for arm, n in sweep.fewest(results, args.target_p50).items():
                answer = (
                    f"{n} replica{'s' if n != 1 else ''}"
                    if n is not None
                    else f"more than {counts[-1]} replicas"
                )
                print(f"interactive run p50 ≤ {args.target_p50:g} s under {arm}: {answer}")
        if args.plot is not None:
            title = (
                f"{', '.join(f'{g.count} {g.cls}' for g in config.groups)} agents, "
                f"seed {config.seed}"
            )
            args.plot.write_text(sweep.svg(results, title))
            print(f"\nplot: {args.plot}")
    if args.json is not None:
        payload = {
            "config": {
                "groups": [
                    {**{k: v for k, v in vars(g).items() if k != "tool_calls"},
                     "tool_calls": [g.tool_calls.lo, g.tool_calls.hi]}
                    for g in config.groups
                ],
                "replicas": counts or config.replicas,
                "duration_s": config.duration_s,
                "warmup_s": config.warmup_s,
                "seed": config.seed,
            },
            "machine": {"cpus": os.cpu_count()},
            "results": results,
        }  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=2))
    return 0
