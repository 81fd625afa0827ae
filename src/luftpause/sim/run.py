"""One simulation: a load on engine replicas in virtual time, under one arm (B1).

:class:`SimConfig` is the load and the replicas, :func:`simulate` runs it under one arm
(:func:`make_arm` builds the arm a name gives; :func:`slowdown_arm` and :func:`sized_arm`
read the names with a number in them) and returns its summary, which :func:`render`
writes as the load generator's table per arm, and a comparison. ``sim.main`` (the
command line) and ``sim.sweep`` (replica counts and targets) run it.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from luftpause.config import parse_interactive_target
from luftpause.fakes.engine.model import EngineParams
from luftpause.fakes.engine.results import StepTally
from luftpause.fakes.engine.script import ScriptOptions
from luftpause.measure import stats
from luftpause.measure.mix import CLASSES, Group
from luftpause.measure.trace import TraceRun, trace_groups
from luftpause.measure.workload import PROFILES, Profile
from luftpause.scheduler.core import Admit, Event, Params
from luftpause.scheduler.core.types import WorkingSet
from luftpause.sim.agents import Agent, Records
from luftpause.sim.arms import (
    ARMS,
    ORDER_ARMS,
    SIZED_ARMS,
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
from luftpause.sim.placement import SMG_LOAD_POLL_S, smg_placement
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


# Up to this many replicas the scheduler's line names each one's figures; above it, a
# fleet's spread (the least, the median and the most).
EACH_REPLICA_UP_TO = 16


def scheduler_line(figures: Mapping[str, Any]) -> str:
    """The scheduler over the window (medians of a reading every second), per replica, or
    for a fleet the least, median and most of them."""
    if not figures:
        return ""
    replicas = figures["replicas"]
    if len(replicas) > EACH_REPLICA_UP_TO:

        def spread(key: str) -> str:
            values = sorted(v for v in (replicas[n][key] for n in replicas) if v is not None)
            if not values:
                return "–"
            middle = statistics.median(values)
            return " / ".join(cell(v) for v in (values[0], middle, values[-1]))

        return (
            f"Scheduler over the window (medians of a reading every second; least / median / "
            f"most of {len(replicas)} replicas): cap {spread('capacity')}, batch limit from "
            f"the decode pace {spread('batch_limit_from_pace')} (– : none limited), in flight "
            f"{spread('in_flight')}, held {cell(figures['held'])}"
        )

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
