"""``luftpause sim``: agent load on engine replicas in virtual time, arm by arm (B1).

    luftpause sim --group 4:interactive --group 48:batch            # every arm
    luftpause sim --group 4:interactive --group 48:batch --arms luftpause,router
    luftpause sim --mix mix.toml --replicas 4 --duration-s 600 --json sim.json
    luftpause sim --group 4:interactive --group 96:batch --sweep replicas=1,2,4 \
        --target-p50 40 --plot sweep.svg                               # how many replicas?
    luftpause sim --group 4:interactive --group 48:batch --arms smg-cap8,smg-cap16 \
        --sweep target=1.2,1.5,2 --plot frontier.svg     # what an interactive target costs
    luftpause sim --group 2:interactive --group 8:batch --profile coding-agent \
        --context-length 131072 --kv-tokens 1000000 --duration-s 1800  # trace-shaped runs
    luftpause sim --trace my-runs.jsonl --context-length 32768         # replay a trace

The groups are the load generator's (``--group``, ``--mix``, ``--agents``;
own-loop agents only), shaped like real agent traces with ``--profile``; ``--trace``
replays a trace's runs beside them or alone (``sim.shaped``; docs/guides/workloads.md).
Each arm runs the same load from the same seed on fresh replicas; the report is the
load generator's table per arm, and a comparison.
See the package docstring for what each arm models.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from luftpause.cliargs import non_negative_float, positive_float, positive_int
from luftpause.config import parse_interactive_target
from luftpause.fakes.engine.model import EngineParams, StepTally
from luftpause.fakes.engine.script import ScriptOptions
from luftpause.fakes.engine.tokens import CHARS_PER_TOKEN
from luftpause.loadgen import stats
from luftpause.loadgen.main import add_run_shape, add_trace_argument, build_groups, trace_groups
from luftpause.loadgen.mix import CLASSES, Group, MixError
from luftpause.loadgen.progress import LiveLine
from luftpause.loadgen.trace import TraceRun, load_trace
from luftpause.loadgen.workload import PROFILES, Profile
from luftpause.scheduler.core import Admit, Event, Params
from luftpause.scheduler.core.types import WorkingSet
from luftpause.sim.agents import Agent, Records
from luftpause.sim.arms import (
    ABLATED_ARMS,
    ARMS,
    ORDER_ARMS,
    RETAIN_ARMS,
    SIZED_ARMS,
    VLLM_ROUTER_ARMS,
    WSET_ARMS,
    Arm,
    EnginePriorityArm,
    LuftpauseArm,
    RouterArm,
    SmgArm,
    VllmRouterArm,
)
from luftpause.sim.fleet import Replica
from luftpause.sim.partition import GC_YOUNG, Engines, engines
from luftpause.sim.placement import SMG_LOAD_POLL_S, SMG_POLICIES, smg_placement
from luftpause.sim.shaped import ShapedAgent
from luftpause.sim.world import World

MODEL = "llama-3.2-1b"
DEFAULT_DURATION_S = 300.0
DEFAULT_WARMUP_S = 60.0
REPLAY_STEP_S = 60.0  # a replay to its end runs in slices this long
REPLAY_LIMIT_S = 7 * 24 * 3600.0  # ... and stops here if some run never ends


@dataclass(frozen=True)
class SimConfig:
    groups: tuple[Group, ...]
    replicas: int = 2
    duration_s: float | None = DEFAULT_DURATION_S  # None: until every replayed run ends
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
    # SMG arms: where SMG places a run's first turn (its ``--policy``; placement.py)
    smg_policy: str = "cache_aware"
    # ... and how often SMG reads the engines' load (``--load-monitor-interval``), which
    # its cache_aware and least_load price engines by
    smg_load_poll_s: float = SMG_LOAD_POLL_S
    # B10: the runs drawn as `luftpause loadgen --plan-seed` draws them: profile groups'
    # runs, own-loop agents' tool counts and replies (None: profile runs from ``seed``,
    # own-loop replies from each conversation)
    plan_seed: str | None = None
    script: ScriptOptions = field(default_factory=ScriptOptions)
    # B10: runs of a trace to replay (beside the groups or alone), and the profiles a
    # group's ``profile`` names.
    replay: tuple[TraceRun, ...] = ()
    profiles: Mapping[str, Profile] = field(default_factory=lambda: dict(PROFILES))
    # Tokens in a reply's first streamed chunk (fleet.Replica): 1 as real engines and the
    # fake engine stream; sim_fidelity sets the --chunk-tokens of floods from before 47dc5bb.
    first_chunk_tokens: int = 1
    # vLLM router arms: model seconds per second of the router's own clock (its metrics
    # interval, progress TTL, force-resume and queue timeouts, the return intervals and
    # latencies it measures). 1: a real deployment. tools/bench/flood.py runs the engines
    # and tools ``--time-scale`` times faster than real time but vLLM's router in real
    # seconds; to reproduce such a flood, its time scale.
    vllm_clock_scale: float = 1.0
    # Prompts rendered and hashed as text at every turn, as the fake engine reads them
    # (True), or carried as block chains (agents.py, shaped.py): the same runs.
    text_prompts: bool = False
    # Processes that step the engine models (sim.partition): 1 steps them in this
    # process; any number gives the same report.
    workers: int = 1


@dataclass
class Trace:
    """What the luftpause arm's core saw and did, in order (for replay)."""

    events: list[Event] = field(default_factory=list)
    admits: list[Admit] = field(default_factory=list)


def make_arm(name: str, world: World, replicas: list[Replica], config: SimConfig,
             trace: Trace | None = None) -> Arm:  # fmt: skip
    size = sized_arm(name)
    paced = size is not None and size[0] == "luftpause-pace"
    slowdown = slowdown_arm(name)
    wset_target = name.startswith("luftpause-wset-x") and slowdown is not None
    packed = name.startswith("luftpause-pack-x") and slowdown is not None
    if (
        name in ("luftpause", "luftpause-no-pace", "luftpause-retain", *WSET_ARMS, *ORDER_ARMS)
        or paced
        or slowdown is not None
    ):
        params = config.params  # luftpause-paceMS: another target; luftpause-no-pace: none
        if slowdown is not None:  # luftpause-xS: the target S x the floor
            params = replace(params, interactive_slowdown=slowdown)
        if packed:  # luftpause-pack-xS: the same with packing (target_packing = true)
            params = replace(params, target_packing=True)
        if name == "luftpause-retain":  # B8: retention hints to the engines
            params = replace(params, kv_retention=True)
        if name in WSET_ARMS or wset_target:  # luftpause-wset[-both][-xS]: working-set admission
            params = replace(params, working_set=WSET_ARMS.get(name, WorkingSet.REPLACE))
        if name in ORDER_ARMS:  # a held-turn order option on
            params = replace(params, **ORDER_ARMS[name])  # type: ignore[arg-type]
        elif name != "luftpause":
            pace = size[1] / 1000 if size is not None and paced else None
            params = replace(params, interactive_pace_s=pace)
        return LuftpauseArm(
            world, replicas, frozenset({MODEL}), params, config.probe_s,
            log=None if trace is None else trace.events,
            admits=None if trace is None else trace.admits,
            class_priority=config.class_priority, name=name,
        )  # fmt: skip
    if name == "router":
        return RouterArm(replicas)
    if name == "engine-prio":
        return EnginePriorityArm(replicas)
    if name == "smg":
        return SmgArm(
            world, replicas, placement=smg_placement(config.smg_policy, config.seed),
            poll_s=config.smg_load_poll_s,
        )  # fmt: skip
    if name == "vllm-prog":
        return VllmRouterArm(world, replicas, clock_scale=config.vllm_clock_scale)
    if name == "vllm-router":
        # Assumption: vLLM's router's default ``--policy cache_aware`` is the SGLang
        # router's (its source's lineage), with the same defaults (0.3, 64, 1.5).
        return RouterArm(replicas, name=name)
    if name == "vllm-prog-kv" or (size is not None and size[0] == "vllm-prog-kv"):
        capacity = config.engine.kv_tokens if size is None else size[1]
        return VllmRouterArm(
            world, replicas, token_capacity=capacity, name=name,
            clock_scale=config.vllm_clock_scale,
        )  # fmt: skip
    if size is not None:
        return SmgArm(
            world, replicas, size[1], priority=size[0] == "smg-cap", name=name,
            placement=smg_placement(config.smg_policy, config.seed),
            poll_s=config.smg_load_poll_s,
        )  # fmt: skip
    raise ValueError(
        f"unknown arm {name!r}; arms are {', '.join(ARMS)}, smg-capC, smg-fifoC, "
        "luftpause-paceMS, luftpause-no-pace, luftpause-retain, luftpause-wset, "
        "luftpause-wset-both, luftpause-wset-xS, luftpause-pack-xS, luftpause-vtc, "
        "luftpause-attained, "
        "luftpause-attained-time, vllm-router, vllm-prog, vllm-prog-kv[T]"
    )


SLOWDOWN_PREFIXES = ("luftpause-wset-x", "luftpause-pack-x", "luftpause-x")


def slowdown_arm(name: str) -> float | None:
    """``luftpause-x1.3`` -> 1.3 (luftpause with ``interactive_target = "1.3x"``, by the
    config's own rule for a slowdown; ``luftpause-wset-x1.3``: the same with working-set
    admission); None for any other name."""
    prefix = next((p for p in SLOWDOWN_PREFIXES if name.startswith(p)), None)
    rest = name if prefix is None else name.removeprefix(prefix)
    if rest == name:
        return None
    try:
        return parse_interactive_target(f"{rest}x")[1]
    except ValueError:
        return None


def sized_arm(name: str) -> tuple[str, int] | None:
    """``smg-cap16`` -> ("smg-cap", 16); None for a name that is not a sized arm."""
    for prefix in SIZED_ARMS:
        rest = name.removeprefix(prefix)
        if rest != name and rest.isdigit() and int(rest) > 0:
            return prefix, int(rest)
    return None


def simulate(
    config: SimConfig,
    arm_name: str,
    progress: Callable[[float, int], None] | None = None,
    trace: Trace | None = None,
    records: Records | None = None,
) -> dict[str, Any]:
    """One arm under the configured load; the load generator's summary plus the run's
    own figures (virtual and wall time, events)."""
    world = World()
    fleet = engines(world, config.engine, config.replicas, config.workers)
    threshold = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, *threshold[1:])  # (restored on the way out)
    try:
        return _simulate(config, arm_name, progress, trace, records, world, fleet)
    finally:
        fleet.close()  # the worker processes stop whatever happened
        gc.set_threshold(*threshold)


def _simulate(
    config: SimConfig,
    arm_name: str,
    progress: Callable[[float, int], None] | None,
    trace: Trace | None,
    records: Records | None,
    world: World,
    fleet: Engines,
) -> dict[str, Any]:
    replicas = [
        Replica(f"engine-{i}", config.engine, world, config.first_chunk_tokens, fleet)
        for i in range(config.replicas)
    ]
    arm = make_arm(arm_name, world, replicas, config, trace)
    by_name = {r.name: r for r in replicas}
    records = Records() if records is None else records
    agents: list[Agent | ShapedAgent] = []
    for group in config.groups:
        for i in range(group.count):
            agent: Agent | ShapedAgent
            if group.profile is not None:
                agent = ShapedAgent(
                    len(agents), group, MODEL, world, arm, by_name, records, config.seed,
                    config.profiles[group.profile], config.plan_seed, slot=i,
                    text_prompts=config.text_prompts,
                )  # fmt: skip
            else:
                agent = Agent(
                    len(agents), group, MODEL, world, arm, by_name, records, config.seed,
                    config.script, config.plan_seed, slot=i, text_prompts=config.text_prompts,
                )  # fmt: skip
            agents.append(agent)
            agent.start(group.start_s + config.ramp_s * i / group.count)
    replayed = trace_groups(list(config.replay))
    by_group = {g.name: g for g in replayed}
    players: list[ShapedAgent] = []
    for run in config.replay:
        player = ShapedAgent(
            len(agents) + len(players), by_group[run.group], MODEL, world, arm, by_name, records,
            config.seed, text_prompts=config.text_prompts,
        )  # fmt: skip
        player.replay(run.plan, run.id, run.start_s)
        players.append(player)
    arm.start()
    if isinstance(arm, LuftpauseArm) and config.duration_s is not None:
        arm.watch(config.warmup_s)
    at_window: list[StepTally] = []  # each replica's tally when the window opens
    world.at(config.warmup_s, lambda: at_window.extend(replace(r.tally) for r in replicas))
    report = None if progress is None else (lambda t: progress(t, world.events))
    started = time.perf_counter()
    if config.duration_s is not None:
        end = config.warmup_s + config.duration_s
        world.run(end, report)
    else:  # a replay, to its last run's end
        end = 0.0
        while end < REPLAY_LIMIT_S and any(p.unfinished for p in players):
            end += REPLAY_STEP_S
            world.run(end, report)
        ends = [r.end_s for r in records.runs] + [e.at_s for e in records.errors]
        end = min(end, max([config.warmup_s, *ends]))
    fleet.finish()  # every model's last iterations and metrics, then the workers stop
    wall = time.perf_counter() - started
    window = (config.warmup_s, max(end, config.warmup_s + 1e-3))
    summary = stats.summarise(
        records.runs,
        records.errors,
        window,
        [(g.name, g.cls) for g in (*config.groups, *replayed)],
        {g.name: g.count for g in config.groups},
        turns=records.ended,
    )
    return {
        **summary,
        "arm": arm_name,
        "seed": config.seed,
        "replicas": config.replicas,
        "virtual_s": round(window[1], 3),
        "unfinished_replays": sum(p.unfinished for p in players),
        "wall_s": round(wall, 3),
        "speedup": round(window[1] / wall, 1) if wall > 0 else None,
        "events": world.events,
        "turns": records.turns,
        "engine_busy_share": {
            r.name: round(r.tally.busy_s / window[1], 3) if window[1] else 0.0 for r in replicas
        },
        # requests each replica was sent, the whole run (warm-up included)
        "requests_by_replica": {r.name: r.submitted for r in replicas},
        # the engines over the window, as the flood's "Engines at" line reads them
        "engines": engine_figures(replicas, at_window),
        # a luftpause arm's scheduler over the window, as the flood reads its /status
        "scheduler": arm.scheduler_figures() if isinstance(arm, LuftpauseArm) else {},
    }


def engine_figures(replicas: list[Replica], at_window: list[StepTally]) -> dict[str, float | None]:
    """Over the window (all replicas): the share of busy time spent prefilling, and the
    mean decode batch (sequences per decode step)."""
    pairs = list(zip(replicas, at_window or [StepTally()] * len(replicas), strict=True))
    busy = sum(r.tally.busy_s - s.busy_s for r, s in pairs)
    prefill = sum(r.tally.prefill_s - s.prefill_s for r, s in pairs)
    steps = sum(r.tally.decode_steps - s.decode_steps for r, s in pairs)
    seqs = sum(r.tally.decode_seqs - s.decode_seqs for r, s in pairs)
    figures: dict[str, float | None] = {
        "prefill_share": round(prefill / busy, 4) if busy else None,
        "decode_batch": round(seqs / steps, 2) if steps else None,
    }
    metrics = [r.metrics() for r in replicas]
    if any(m.retention_evicted_tokens or m.retentions for m in metrics):
        # B8: tokens kept by a retention hint and evicted before it ran out (whole run),
        # and what hints keep at the end
        figures["retention_evicted_tokens"] = sum(m.retention_evicted_tokens for m in metrics)
        figures["retained_tokens"] = sum(m.retained_tokens for m in metrics)
    return figures


def engines_line(figures: Mapping[str, Any]) -> str:
    """The engines over the window: prefill's share of their busy time, the decode batch."""
    if figures.get("prefill_share") is None:
        return ""
    return (
        f"Engines over the window: prefill {100 * figures['prefill_share']:.0f} % of busy "
        f"time, decode batch {cell(figures['decode_batch'])}"
    )


def scheduler_line(figures: Mapping[str, Any]) -> str:
    """The scheduler over the window (medians of a reading every second), per replica."""
    if not figures:
        return ""
    replicas = figures["replicas"]

    def each(key: str) -> str:
        return " / ".join(cell(replicas[name][key]) for name in replicas)

    return (
        "Scheduler over the window (medians of a reading every second; per replica): cap "
        f"{each('capacity')}, batch limit from the decode pace {each('batch_limit_from_pace')}"
        f" (– : not limited), in flight {each('in_flight')}, held {cell(figures['held'])}"
    )


def cell(value: float | None, digits: int = 1) -> str:
    """A table cell: the value to ``digits`` places, or a dash where there is none."""
    return "–" if value is None else f"{value:.{digits}f}"


def shares(counts: Mapping[str, int]) -> str:
    """``engine-0 60 %, engine-1 40 %``: each replica's share of the requests."""
    total = sum(counts.values())
    if not total:
        return "none"
    return ", ".join(f"{name} {100 * n / total:.0f} %" for name, n in counts.items())


def comparison(results: list[dict[str, Any]]) -> str:
    """One line per arm: runs/min and run time per class, then the turns that ended in
    the window (turn p50 and reply tokens/min per class: the view that still reads when
    runs outlast the window)."""
    head = "| arm |"
    rule = "|---|"
    for cls in CLASSES:
        head += f" {cls} runs/min | {cls} run p50 s |"
        rule += "---|---|"
    for cls in CLASSES:
        head += f" {cls} turn p50 s | {cls} reply tokens/min |"
        rule += "---|---|"
    lines = [head, rule]
    for result in results:
        row = f"| {result['arm']} |"
        for cls in CLASSES:
            c = result["classes"].get(cls)
            if c is None:
                row += " – | – |"
                continue
            row += f" {c['runs_per_min']:.1f} | {cell(c['run_s']['p50'], 1)} |"
        for cls in CLASSES:
            t = result["classes"].get(cls, {}).get("turns_ended")
            if t is None:
                row += " – | – |"
                continue
            row += f" {cell(t['wall_s']['p50'], 2)} | {cell(t['completion_tokens_per_min'], 0)} |"
        lines.append(row)
    return "\n".join(lines)


def render(results: list[dict[str, Any]], config: SimConfig, command: str) -> str:
    load = []
    if config.groups:
        load.append(
            f"{sum(g.count for g in config.groups)} agents ("
            + ", ".join(
                f"{g.count} {g.cls} {g.name}" + (f" [{g.profile}]" if g.profile else "")
                for g in config.groups
            )
            + ")"
        )
    if config.replay:
        load.append(f"{len(config.replay)} trace runs replayed")
    measured = (
        f"{config.duration_s:g} s measured"
        if config.duration_s is not None
        else "measured until the last replayed run ended"
    )
    engine = config.engine
    lines = [
        f"Command: {command}",
        "",
        f"Simulated: {config.replicas} replicas (context {engine.context_length:,} tokens, "
        f"KV pool {engine.kv_tokens:,} tokens each), {' and '.join(load)}, "
        f"{config.warmup_s:g} s warm-up + {measured}, seed {config.seed}.",
        "",
    ]
    for result in results:
        lines += [
            f"## {result['arm']}",
            "",
            stats.table(result),
            "",
            *([turns, ""] if (turns := stats.turns_table(result)) else []),
            f"{result['events']:,} events, {result['turns']:,} turns in {result['wall_s']:.1f} s "
            f"of wall time ({result['speedup']}× real time)",
            "",
            f"Requests by replica (the whole run): {shares(result['requests_by_replica'])}",
            "",
            *([line, ""] if (line := engines_line(result.get("engines") or {})) else []),
            *([line, ""] if (line := scheduler_line(result.get("scheduler") or {})) else []),
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
    add_trace_argument(load)
    add_run_shape(load, "tool calls per run (default: 3)")
    sim = parser.add_argument_group("simulation")
    sim.add_argument(
        "--arms",
        default=",".join(ARMS),
        metavar="ARM[,ARM...]",
        help=f"arms to run, in order (default: {','.join(ARMS)}); also smg-capC (SMG's "
        "priority scheduler with C slots over all replicas), smg-fifoC (its FIFO cap of C), "
        "luftpause-paceMS (luftpause limiting batch turns beside interactive runs to keep "
        "replies at MS ms per token: interactive_pace_ms), luftpause-xS (the same with a "
        'target of S times the replica\'s floor, S > 1: interactive_target = "Sx"), '
        "luftpause-no-pace (the decode "
        "pace off), luftpause-retain (luftpause asking the engines to keep a paused run's "
        "prefix for its usual tool time: kv_retention), luftpause-wset (working-set "
        'admission instead of prefix keeping\'s run limit: working_set = "replace"), '
        'luftpause-wset-both (beside it: "both"), luftpause-wset-xS (working-set admission '
        "with a target of S times the floor), luftpause-pack-xS (a target of S with "
        "packing: target_packing = true), vllm-router (vLLM's router without "
        "program scheduling), luftpause-vtc (held turns ordered by token fairness: "
        "fairness = tokens), luftpause-attained (batch runs by least attained service in "
        "tokens: batch_order = attained; luftpause-attained-time: in turn time), vllm-prog "
        "(with it, its defaults) and vllm-prog-kvT (the same with token_capacity_per_target "
        "T; vllm-prog-kv: the engine's KV pool), as tools/bench/flood.py names its arms",
    )
    sim.add_argument(
        "--replicas", type=positive_int, default=2, help="engine replicas (default: 2)"
    )
    sim.add_argument(
        "--duration-s",
        type=positive_float,
        help="measured window, virtual seconds (default: 300; a --trace without groups: "
        "until its last run ends)",
    )
    sim.add_argument(
        "--warmup-s",
        type=non_negative_float,
        help="virtual seconds before the window opens (default: 60; a --trace without groups: 0)",
    )
    defaults = EngineParams()
    sim.add_argument(
        "--context-length",
        type=positive_int,
        default=defaults.context_length,
        help="each engine's context in tokens (default: %(default)s, the calibrated laptop "
        "replica; --profile coding-agent needs 131072)",
    )
    sim.add_argument(
        "--kv-tokens",
        type=positive_int,
        default=defaults.kv_tokens,
        help="each engine's KV pool in tokens (default: %(default)s; long contexts need "
        "more, e.g. 1000000)",
    )
    sim.add_argument(
        "--ramp-s",
        type=non_negative_float,
        default=0.0,
        help="start each group's agents spread over this many seconds (default: 0)",
    )
    sim.add_argument("--seed", type=int, default=0, help="seed of every random choice (default: 0)")
    sim.add_argument(
        "--plan-seed",
        metavar="TEXT",
        help="draw the runs as `luftpause loadgen --plan-seed TEXT` does: a --profile "
        "group's runs, slot for slot, served at their planned lengths (the load generator "
        "rounds a tool turn's reply up to a power of two), and an own-loop agent's tool "
        "counts and replies, run for run; a flood's repetition records it as plan_seed, or "
        "as seed where it has none; default: profile runs from --seed, own-loop replies "
        "from each conversation",
    )
    sim.add_argument(
        "--text-prompts",
        action="store_true",
        help="render and hash every prompt as text at every turn, as the fake engine reads it "
        "(slower; the same runs as the default, which carries prompts as block chains)",
    )
    sim.add_argument(
        "--probe-s",
        type=positive_float,
        default=2.0,
        help="luftpause arm: seconds between probes of the replicas (default: 2)",
    )
    sim.add_argument(
        "--smg-policy",
        choices=SMG_POLICIES,
        default="cache_aware",
        help="SMG arms: where a run's first turn goes (SMG's --policy; default cache_aware, "
        "its own, which follows the longest shared prefix among replicas not far busier "
        "than the rest, else the least expected wait); round_robin spreads them, "
        "least_load picks the replica of least expected wait, random any replica",
    )
    sim.add_argument(
        "--smg-load-poll-s",
        type=positive_float,
        default=SMG_LOAD_POLL_S,
        help="SMG arms: seconds between SMG's reads of the engines' load (its "
        "--load-monitor-interval), which cache_aware and least_load price engines by "
        f"(default: {SMG_LOAD_POLL_S:g}, SMG's own)",
    )
    sim.add_argument(
        "--vllm-clock-scale",
        type=positive_float,
        default=1.0,
        help="vLLM router arms: model seconds per second of the router's own clock (its "
        "metrics interval, progress TTL and timeouts); 1 (default): a real deployment; to "
        "reproduce a tools/bench/flood.py run, its --time-scale (the flood speeds up the "
        "engines and tools, not vLLM's router)",
    )
    sim.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="processes that step the engine models, the replicas dealt among them; 1 "
        "(default): no worker processes, every model stepped in this one. The report is "
        "the same for any number; more than 1 is slower on a 2-core machine (the models "
        "are about 40 %% of the work, and their results are awaited every ~30 ms of virtual "
        "time)",
    )
    sim.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    plan = parser.add_argument_group("capacity planning")
    plan.add_argument(
        "--sweep",
        metavar="replicas=N,N,...|target=S,S,...",
        help="run every arm at each replica count (e.g. replicas=1,2,4,8) and compare; or "
        "target=S,S,...: add luftpause with each interactive target (a slowdown over the "
        "floor, luftpause-xS) to the arms, and --plot their frontier",
    )
    plan.add_argument(
        "--target-p50",
        type=positive_float,
        metavar="SECONDS",
        help="with --sweep: the fewest replicas whose interactive run p50 is at most this",
    )
    plan.add_argument(
        "--target-turn-p50",
        type=positive_float,
        metavar="SECONDS",
        help="with --sweep: the fewest replicas whose interactive turn p50 (turns that ended "
        "in the window) is at most this: the target for runs that outlast the window",
    )
    plan.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.svg",
        help="with --sweep: draw the sweep as SVG (a target sweep: its frontier, interactive "
        "against batch runs/min)",
    )


def _fits(needed: int, what: str, engine: EngineParams) -> None:
    """Refuse a load whose turns cannot all run on the simulated engines."""
    if needed > engine.context_length:
        raise MixError(
            f"{what} needs {needed:,} tokens of context (prompt + reply); the simulated engines "
            f"hold {engine.context_length:,}: give --context-length {needed} or more "
            f"(and a --kv-tokens pool that holds several such runs)"
        )
    if needed + 1 > engine.kv_tokens:
        raise MixError(
            f"{what} needs {needed:,} tokens of KV; the simulated engines' pool holds "
            f"{engine.kv_tokens:,}: give --kv-tokens {needed * 8} or so"
        )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    args.subagents = None
    groups = build_groups(args)
    replay = load_trace(args.trace) if args.trace is not None else []
    if not groups and not replay:
        raise MixError("no load: give --group, --mix, --agents or --trace")
    subagents = [g.name for g in groups if g.kind != "agents"]
    if subagents:
        raise MixError(
            f"group(s) {', '.join(subagents)}: the simulator runs own-loop agents only "
            '(kind = "agents")'
        )
    clash = sorted({g.name for g in trace_groups(replay)} & {g.name for g in groups})
    if clash:
        raise MixError(f"trace caller(s) {', '.join(clash)} also name a group; rename one")
    engine = EngineParams(
        priority_scheduling=True, context_length=args.context_length, kv_tokens=args.kv_tokens
    )
    context = engine.context_length
    for run in replay:
        _fits(run.plan.max_context(), f"trace line {run.line} (run {run.id!r})", engine)
    for g in groups:
        if g.profile is not None:
            _fits(PROFILES[g.profile].max_context(), f"profile {g.profile!r}", engine)
            continue
        if g.context_chars < 400:
            raise MixError(f"group {g.name}: context_chars must be at least 400")
        if g.context_chars // CHARS_PER_TOKEN + g.max_tokens >= context:
            raise MixError(
                f"group {g.name}: {g.context_chars} characters of context and {g.max_tokens} "
                f"reply tokens do not fit the engine's context of {context} tokens "
                f"({CHARS_PER_TOKEN} characters a token)"
            )
    alone = bool(replay) and not groups  # a trace alone plays to its end
    duration = args.duration_s if args.duration_s is not None else DEFAULT_DURATION_S
    warmup = args.warmup_s if args.warmup_s is not None else DEFAULT_WARMUP_S
    return SimConfig(
        groups=tuple(groups),
        replicas=args.replicas,
        duration_s=None if alone and args.duration_s is None else duration,
        warmup_s=0.0 if alone and args.warmup_s is None else warmup,
        ramp_s=args.ramp_s,
        seed=args.seed,
        probe_s=args.probe_s,
        engine=engine,
        replay=tuple(replay),
        smg_policy=args.smg_policy,
        smg_load_poll_s=args.smg_load_poll_s,
        plan_seed=args.plan_seed,
        vllm_clock_scale=args.vllm_clock_scale,
        text_prompts=args.text_prompts,
        workers=args.workers,
    )


def arms_from_args(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    known = (*ARMS, *ABLATED_ARMS, *RETAIN_ARMS, *WSET_ARMS, *ORDER_ARMS, *VLLM_ROUTER_ARMS)
    unknown = [
        a for a in arms if a not in known and sized_arm(a) is None and slowdown_arm(a) is None
    ]
    if unknown or not arms:
        raise MixError(
            f"unknown arm(s) {', '.join(unknown) or '(none given)'}; arms are "
            f"{', '.join(ARMS)}, smg-capC / smg-fifoC for a capacity of C slots, "
            "luftpause-paceMS for a decode pace target of MS ms per token, luftpause-xS for "
            "an interactive target of S (> 1) times the floor, luftpause-no-pace, "
            "luftpause-retain, luftpause-wset, luftpause-wset-both, luftpause-vtc, "
            "luftpause-attained, luftpause-attained-time, vllm-router, vllm-prog, "
            "and vllm-prog-kv / vllm-prog-kvT "
            "for a token capacity of the engine's KV pool / T tokens"
        )
    small = [a for a in arms if (s := sized_arm(a)) and s[0] == "smg-cap" and s[1] <= 4]
    if small:
        raise MixError(
            f"{', '.join(small)}: SMG's priority scheduler reserves 4 slots for interactive "
            "turns, so its capacity must be more than 4"
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
        until = f"/{self.end:.0f}" if math.isfinite(self.end) else ""
        return f"{self.label}: {self.t:.0f}{until} virtual s, {self.events:,} events"


def run(configs: list[SimConfig], arms: list[str], stream: TextIO) -> list[dict[str, Any]]:
    """Every arm on every configuration, in that order, with one progress line each."""
    results = []
    total = len(configs) * len(arms)
    for k, (config, arm) in enumerate(((c, a) for c in configs for a in arms), 1):
        end = config.warmup_s + (config.duration_s if config.duration_s is not None else math.inf)
        where = f", {config.replicas} replicas" if len(configs) > 1 else ""
        progress = _Progress(f"run {k}/{total} {arm}{where}", end)
        with LiveLine(stream, progress.line) as live:
            results.append(simulate(config, arm, progress.update))
            progress.t = results[-1]["virtual_s"]
            live.refresh()
    return results


def main(args: argparse.Namespace) -> int:
    from luftpause.sim import sweep

    try:
        config = config_from_args(args)
        arms = arms_from_args(args.arms)
        swept, values = sweep.parse_sweep(args.sweep) if args.sweep else ("", [])
        counts = [int(v) for v in values] if swept == "replicas" else None
        if swept == "target":
            arms = sweep.target_arms(arms, [str(v) for v in values])
        targets = (args.target_p50, args.target_turn_p50)
        if counts is None and any(t is not None for t in targets):
            raise MixError("--target-p50 and --target-turn-p50 go with --sweep replicas=N,N,...")
        if not swept and args.plot is not None:
            raise MixError("--plot goes with --sweep replicas=N,N,... or --sweep target=S,S,...")
    except (MixError, OSError) as exc:
        print(f"luftpause sim: {exc}", file=sys.stderr)
        return 2
    configs = sweep.points(config, counts) if counts else [config]
    results = run(configs, arms, sys.stderr)
    command = "luftpause sim " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "luftpause sim"
    if counts is None:
        print(render(results, config, command))
        if swept == "target" and args.plot is not None:
            mix = ", ".join(f"{g.count} {g.cls}" for g in config.groups)
            title = (
                f"the interactive target's frontier: {mix} agents, "
                f"{config.replicas} replicas, seed {config.seed}"
            )
            args.plot.write_text(sweep.frontier_svg(results, title))
            print(f"\nplot: {args.plot}")
    else:
        print(f"Command: {command}\n")
        print(sweep.table(results))
        for of, target in (("run", args.target_p50), ("turn", args.target_turn_p50)):
            if target is None:
                continue
            print()
            for arm, n in sweep.fewest(results, target, of).items():
                answer = (
                    f"{n} replica{'s' if n != 1 else ''}"
                    if n is not None
                    else f"more than {counts[-1]} replicas"
                )
                print(f"interactive {of} p50 ≤ {target:g} s under {arm}: {answer}")
        if args.plot is not None:
            load = [f"{', '.join(f'{g.count} {g.cls}' for g in config.groups)} agents"]
            if config.replay:
                load = [*load[: bool(config.groups)], f"{len(config.replay)} trace runs"]
            title = f"{', '.join(load)}, seed {config.seed}"
            of = sweep.plotted(results, turn_target=args.target_turn_p50 is not None)
            args.plot.write_text(sweep.svg(results, title, of))
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
                "plan_seed": config.plan_seed,
                "smg_policy": config.smg_policy,
                "smg_load_poll_s": config.smg_load_poll_s,
                "vllm_clock_scale": config.vllm_clock_scale,
                "context_length": config.engine.context_length,
                "kv_tokens": config.engine.kv_tokens,
                "trace": (
                    {"file": str(args.trace), "runs": len(config.replay)}
                    if config.replay else None
                ),
            },
            "machine": {"cpus": os.cpu_count()},
            "results": results,
        }  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=2))
    return 0
