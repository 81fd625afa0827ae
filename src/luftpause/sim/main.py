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
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from luftpause.cliargs import non_negative_float, positive_float, positive_int
from luftpause.fakes.engine.model import EngineParams
from luftpause.fakes.engine.tokens import CHARS_PER_TOKEN
from luftpause.measure.cli import add_run_shape, add_trace_argument, build_groups
from luftpause.measure.mix import CLASSES, MixError
from luftpause.measure.progress import LiveLine
from luftpause.measure.trace import load_trace, trace_groups
from luftpause.measure.workload import PROFILES
from luftpause.sim import sweep
from luftpause.sim.arms import (
    ABLATED_ARMS,
    ARMS,
    ORDER_ARMS,
    RETAIN_ARMS,
    VLLM_ROUTER_ARMS,
    WSET_ARMS,
)
from luftpause.sim.placement import SMG_LOAD_POLL_S, SMG_POLICIES
from luftpause.sim.run import (
    DEFAULT_DURATION_S,
    DEFAULT_WARMUP_S,
    SimConfig,
    render,
    simulate,
    sized_arm,
    slowdown_arm,
)


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
