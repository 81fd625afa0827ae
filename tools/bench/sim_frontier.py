"""SGLang Model Gateway's frontier in the simulator, with luftpause placed on it.

    python tools/bench/sim_frontier.py --loads 48,96,144 --seeds 3 \\
        --smg-caps 8,12,16,24,36 --smg-fifo-caps 36 \\
        --out docs/benchmarks/results/YYYY-MM-DD-sim-smg.md \\
        --plot docs/benchmarks/results/YYYY-MM-DD-sim-smg.svg
    python tools/bench/sim_frontier.py --profile coding-agent --loads 8,24 --seeds 3 \\
        --smg-caps 8,12,16 --smg-fifo-caps ''      # the coding flood's plan

The own-loop flood's plan at each load point (4 interactive agents beside N batch
agents, its warm-up, ramp and window: ``arms.plan.FULL``), run by ``luftpause sim``
for every arm: luftpause, the router, engine priority, SMG with its engines' capacity,
SMG's priority scheduler at each capacity C (``smg-capC``) and its FIFO cap
(``smg-fifoC``), luftpause with each decode pace target (``luftpause-paceMS``,
``--luftpause-paces``) and with the decode pace off (``luftpause-no-pace``,
``--ablate-pace``). Each seed is one repetition, summarised as the flood summarises
repetitions (``docs/benchmarks/methodology.md``); the frontier table and SVG are drawn
by the flood's own report code (``flood_report``). Rates are closed-loop runs/min
(agents × 60 / mean run time) in the engine model's time. A measurement:
nothing is asserted.

With ``--profile coding-agent`` it runs the coding flood's plan instead
(``flood.py --benches coding``: 2 interactive agents beside N batch agents, runs
from the coding-agent profile, long-context engines, ``--window-s`` and
``--warmup-s`` in model seconds), and reports what that flood reports: per arm the
turns that ended in the window (interactive turn p50, batch reply tokens/min) and
luftpause against each arm; ``--plot`` draws the interactive turn p50 against batch
reply tokens/min.

Reports go to ``docs/benchmarks/results/YYYY-MM-DD-sim-NAME.{md,json,svg}`` (listed in
``docs/benchmarks/archive.md``); each states its command, commit and seeds and links
``docs/benchmarks/methodology.md`` for how to read it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from luftpause.measure.mix import Group, MixError
from luftpause.sim.main import arms_from_args
from luftpause.sim.placement import SMG_POLICIES
from luftpause.sim.run import SimConfig, simulate, slowdown_arm
from tools.bench.arms.plan import CODING_INTERACTIVE, FULL, INTERACTIVE_AGENTS
from tools.bench.flood_report import (
    CODING_AXES,
    CODING_GOALS_HEAD,
    coding_goals,
    coding_points,
    coding_table,
    frontier_goals,
    frontier_points,
    frontier_svg,
    frontier_table,
)
from tools.bench.sim_fidelity import busiest_share, coding_config

BASE_ARMS = ("luftpause", "router", "engine-prio", "smg")


def caps(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"sim_frontier: {what} takes whole numbers, not {text!r}") from None
    if any(v < 1 for v in values):
        raise SystemExit(f"sim_frontier: {what} must be positive")
    return values


def targets(text: str) -> list[str]:
    """``--luftpause-targets``: slowdowns above 1, as the arms write them."""
    values = [t.strip() for t in text.split(",") if t.strip()]
    for t in values:
        if slowdown_arm(f"luftpause-x{t}") is None:
            raise SystemExit(
                f"sim_frontier: --luftpause-targets takes slowdowns above 1, not {t!r}"
            )
    return values


def _as_both(result: dict[str, Any]) -> dict[str, Any]:
    """A run of interactive agents alone, with an empty batch class, so the frontier's
    figures (which read both classes) take it."""
    classes = dict(result["classes"])
    classes.setdefault("batch", classes["interactive"])
    return {**result, "classes": classes}


def placement_table(arms_at: dict[str, list[dict[str, Any]]], policy: str) -> list[str]:
    """Each arm's busiest replica's share of the requests, mean over the seeds."""
    lines = [
        f"Busiest replica's share of the requests (SMG placing runs by `{policy}`):",
        "",
        "| arm | share |",
        "|---|---|",
    ]
    for arm, runs in arms_at.items():
        shares = [
            share
            for result in runs
            if (share := busiest_share(list(result["requests_by_replica"].values()))) is not None
        ]
        if shares:
            lines.append(f"| {arm} | {100 * sum(shares) / len(shares):.0f} % |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", default="96", help="batch agents per load point (default: 96)")
    p.add_argument("--seeds", type=int, default=3, help="seeds (repetitions) per arm")
    p.add_argument("--smg-caps", default="8,12,16,24,36", help="SMG priority-scheduler caps")
    p.add_argument("--smg-fifo-caps", default="36", help="SMG FIFO caps (empty: none)")
    p.add_argument(
        "--luftpause-paces",
        default="",
        help="also luftpause with these decode pace targets, ms per token "
        "(interactive_pace_ms; arms luftpause-paceMS; default: none)",
    )
    p.add_argument(
        "--luftpause-targets",
        default="",
        help="also luftpause with these interactive targets, slowdowns over the floor "
        '(interactive_target = "Sx"; arms luftpause-xS; e.g. 1.2,1.5,2; default: none)',
    )
    p.add_argument(
        "--vllm",
        action="store_true",
        help="also vLLM's router: plain (vllm-router), program scheduling with its "
        "defaults (vllm-prog) and with the engines' KV pool as its token capacity "
        "(vllm-prog-kv)",
    )
    p.add_argument(
        "--vllm-clock-scale",
        type=float,
        default=1.0,
        help="with --vllm: model seconds per second of vLLM's router's own clock (default "
        "1: a real deployment); a flood's --time-scale to reproduce it (the flood speeds up "
        "the engines and tools, not the router)",
    )
    p.add_argument(
        "--base-arms",
        default=",".join(BASE_ARMS),
        help=f"the arms besides the sweeps (default: {','.join(BASE_ARMS)})",
    )
    p.add_argument("--replicas", type=int, default=2, help="engine replicas (default: 2)")
    p.add_argument(
        "--interactive",
        type=int,
        help="interactive agents (default: the flood's, "
        f"{INTERACTIVE_AGENTS}; with --profile {CODING_INTERACTIVE})",
    )
    p.add_argument(
        "--context-chars",
        type=int,
        help="own-loop runs' context in characters (default: the load generator's)",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also run the interactive agents alone (luftpause, no batch work) and judge "
        "the goals against that floor",
    )
    p.add_argument(
        "--ablate-pace",
        action="store_true",
        help="also luftpause with the decode pace off (arm luftpause-no-pace)",
    )
    p.add_argument(
        "--smg-policy",
        choices=SMG_POLICIES,
        default="cache_aware",
        help="where SMG's arms place a run's first turn (SMG's --policy; default cache_aware, "
        "its own, as the flood runs it; round_robin spreads runs whatever their prefix)",
    )
    p.add_argument("--out", type=Path, help="also write the tables here")
    p.add_argument("--plot", type=Path, help="also write the frontier as SVG")
    p.add_argument("--json", type=Path, help="also write every result")
    p.add_argument(
        "--profile",
        choices=("coding-agent",),
        help="the coding flood's plan (runs from this profile) instead of the own-loop flood's",
    )
    p.add_argument(
        "--window-s",
        type=float,
        default=FULL.coding_window_s,
        help=f"--profile: measured window, model seconds (default {FULL.coding_window_s:g})",
    )
    p.add_argument(
        "--warmup-s",
        type=float,
        default=FULL.coding_warmup_s,
        help=f"--profile: warm-up, model seconds (default {FULL.coding_warmup_s:g})",
    )
    args = p.parse_args(argv)
    if args.profile and (args.window_s <= 0 or args.warmup_s < 0):
        p.error("--window-s must be above 0 and --warmup-s at least 0")
    loads = caps(args.loads, "--loads")
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    if args.replicas < 1 or (args.interactive is not None and args.interactive < 1):
        p.error("--replicas and --interactive must be at least 1")
    if not args.vllm_clock_scale > 0:
        p.error("--vllm-clock-scale must be positive")
    try:
        arms = arms_from_args(
            ",".join(
                [a for a in args.base_arms.split(",") if a.strip()]
                + [f"luftpause-x{t}" for t in targets(args.luftpause_targets)]
                + [f"smg-cap{c}" for c in caps(args.smg_caps, "--smg-caps")]
                + [f"smg-fifo{c}" for c in caps(args.smg_fifo_caps, "--smg-fifo-caps")]
                + [f"luftpause-pace{ms}" for ms in caps(args.luftpause_paces, "--luftpause-paces")]
                + (["luftpause-no-pace"] if args.ablate_pace else [])
                + (["vllm-router", "vllm-prog", "vllm-prog-kv"] if args.vllm else [])
            )
        )
    except MixError as exc:
        p.error(str(exc))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    command = "python tools/bench/sim_frontier.py " + shlex.join(argv or sys.argv[1:])
    started = time.monotonic()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    total, done = len(loads) * len(arms) * args.seeds, 0
    coding = {"coding_window_s": args.window_s, "coding_warmup_s": args.warmup_s}
    floors: dict[str, float | None] = {}
    for load in loads:
        interactive = args.interactive or (
            CODING_INTERACTIVE if args.profile else INTERACTIVE_AGENTS
        )
        extra = {} if args.context_chars is None else {"context_chars": args.context_chars}
        config = SimConfig(
            groups=(
                Group("interactive", interactive, "interactive", "interactive", **extra),
                Group("batch", load, "batch", "batch", **extra),
            ),
            duration_s=FULL.window_for(load),
            warmup_s=FULL.warmup_for(load),
            ramp_s=FULL.ramp_for(load),
        )
        if args.profile:
            config = coding_config(coding, load, 0)
            if args.interactive:
                people = replace(config.groups[0], count=args.interactive)
                config = replace(config, groups=(people, *config.groups[1:]))
        config = replace(
            config, smg_policy=args.smg_policy, replicas=args.replicas,
            vllm_clock_scale=args.vllm_clock_scale,
        )  # fmt: skip
        if args.floor:  # the interactive agents alone: what no scheduler can beat
            alone = [
                simulate(replace(config, groups=config.groups[:1], seed=seed), "luftpause")
                for seed in range(args.seeds)
            ]
            figures = (coding_points if args.profile else frontier_points)(
                {"luftpause": [_as_both(r) for r in alone]}, 1.0
            )
            floors[str(load)] = figures[0].y if figures else None
        by_arm: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
        for seed in range(args.seeds):
            for arm in arms:
                by_arm[arm].append(simulate(replace(config, seed=seed), arm))
                done += 1
                print(
                    f"[{done}/{total}] {load} batch agents, {arm}, seed {seed} "
                    f"({time.monotonic() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        results[str(load)] = by_arm
    lines = [
        f"Command: `{command.strip()}` at commit {commit or 'unknown'}; simulator, seeds "
        f"0–{args.seeds - 1} as repetitions (mean ± 95 % t-interval), "
        f"{time.monotonic() - started:.0f} s of wall time. "
        + (
            "Turns that ended in the window (turn p50 s, reply tokens/min), model time."
            if args.profile
            else "Closed-loop runs/min and p50 run times in the engine model's time."
        )
        + " How to read it: [Methodology](../methodology.md#the-simulators-reports).",
        "",
    ]
    for point, arms_at in results.items():
        interactive = args.interactive or (
            CODING_INTERACTIVE if args.profile else INTERACTIVE_AGENTS
        )
        lines += [f"### {point} batch + {interactive} interactive agents", ""]
        measured = (coding_points if args.profile else frontier_points)(arms_at, 1.0)
        if args.profile:
            cells, _ = coding_goals(arms_at)
            lines += coding_table(arms_at, 1.0)
            lines += ["", *CODING_GOALS_HEAD, *cells]
        else:
            lines += frontier_table(arms_at, 1.0)
        floor = floors.get(point)
        lines += [
            "",
            "luftpause's frontier against each peer"
            + (
                f" (the floor: the interactive agents alone, {floor:.2f}"
                + (" s interactive turn p50)" if args.profile else " interactive runs/min)")
                if floor is not None
                else ""
            )
            + ":",
            "",
            *frontier_goals(measured, floor, lower_is_better=args.profile is not None),
        ]
        lines += ["", *placement_table(arms_at, args.smg_policy)]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.plot:
        coding_plan = args.profile is not None
        points = coding_points if coding_plan else frontier_points
        interactive = CODING_INTERACTIVE if coding_plan else INTERACTIVE_AGENTS
        panels = [
            (f"{point} batch + {interactive} interactive", points(arms_at, 1.0))
            for point, arms_at in results.items()
        ]
        args.plot.write_text(
            frontier_svg(
                panels,
                "SMG's frontier and luftpause"
                + (" on coding-agent runs" if coding_plan else "")
                + ", in the simulator",
                f"luftpause sim at {commit}, {args.seeds} seeds, SMG placing runs by "
                f"{args.smg_policy}; model time",
                **(CODING_AXES if coding_plan else {}),
            )
        )
    if args.json:
        args.json.write_text(
            json.dumps({"command": command.strip(), "commit": commit, "results": results})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
