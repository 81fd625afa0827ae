"""The flood's luftpause arm on a stack of its own: nothing else on the engines, ever.

    python tools/bench/arm_alone.py                          # 48 batch agents, time scale 2
    python tools/bench/arm_alone.py --loads 24,48 --json alone.json   # one after the other

``tools/bench/flood.py`` runs every arm on one pair of engines, one arm at a time, and
keeps one scheduler for the luftpause arm through the whole flood: between its blocks
the other arms load the engines it probes. This runs the luftpause arm alone, with the
flood's plan and settings (``start_engines``, ``_config``, the own-loop
load generator flags and seeds of ``own_flags``/``run_loadgen``), on fresh
engines, tools, scheduler and dataplane, the loads in the order given on that one
stack. So a figure that differs from the flood's comes from what the flood's shared
stack carries between arms, and one that differs from ``luftpause sim`` from the model.

Beside the load generator's line it samples the scheduler's ``/status`` every
``--every`` seconds and reports, over each load's measured window, the median of each
replica's cap (``capacity``), batch limit from the decode pace, turns in flight, and
the turns held. Output: a table on stdout, every sample and result with ``--json``.
Timings are measured, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

if (
    not __package__
):  # run as a file (python tools/bench/arm_alone.py): tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.arms.luftpause import (
    StatusSampler,
    _config,
    scheduler_and_dataplane,
    window_figures,
    window_start,
)
from tools.bench.arms.plan import FULL, Arm, Stack, probe_period
from tools.bench.arms.schedule import own_flags
from tools.bench.arms.stack import run_loadgen, start_engines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--loads", default="48", help="batch agents per point, in order (default 48)"
    )
    parser.add_argument(
        "--time-scale", type=float, default=2.0, help="engine/tool speed-up (default 2)"
    )
    parser.add_argument("--every", type=float, default=0.5, help="status sample period, s")
    parser.add_argument("--json", type=Path, help="also write every result and sample here")
    args = parser.parse_args()
    try:
        loads = [int(x) for x in args.loads.split(",")]
    except ValueError:
        parser.error(f"--loads: whole numbers separated by commas, not {args.loads!r}")
    if not loads or min(loads) < 1:
        parser.error("--loads: at least one load, each at least 1")
    if args.time_scale <= 0 or args.every <= 0:
        parser.error("--time-scale and --every must be positive")
    plan = replace(FULL, time_scale=args.time_scale, reps=1)
    out: dict[str, Any] = {"loads": loads, "time_scale": args.time_scale, "points": []}
    with tempfile.TemporaryDirectory(prefix="luftpause-alone-") as tmp_s:
        tmp = Path(tmp_s)
        stack = Stack(tmp, plan)
        try:
            start_engines(stack)
            config = _config(tmp / "stack.toml", stack, probe_period(plan))
            sched, dp = scheduler_and_dataplane(stack, config)
            stack.dataplane = dp.urls["http"]
            with StatusSampler(sched.urls["http"] + "/status", args.every) as sampler:
                for load in loads:
                    flags = own_flags(stack, "own", load, 8000)
                    arm = Arm("own", "luftpause", load, ["--target", stack.dataplane, *flags])
                    result = run_loadgen(stack, arm, 0, tmp)
                    window = window_start(result)
                    figures = window_figures(sampler.samples, window)
                    out["points"].append({"load": load, "result": result, "status": figures})
            out["samples"] = sampler.samples
        finally:
            stack.stop()
    scale = args.time_scale
    print(f"The luftpause arm alone, time scale {scale:g}, loads in this order: {args.loads}")
    print()
    print(
        "| batch agents | interactive runs/min | batch runs/min | interactive p50 s "
        "| batch p50 s | cap per replica | pace limit | in flight | held |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for point in out["points"]:
        classes = point["result"]["classes"]
        status = point["status"]
        reps = status.get("replicas", {})

        def each(key: str, reps: dict[str, Any] = reps) -> str:
            return " / ".join("–" if r[key] is None else f"{r[key]:g}" for r in reps.values())

        rate = {c: classes[c]["runs_per_min_closed"] / scale for c in classes}
        p50 = {c: (classes[c]["run_s"]["p50"] or 0) * scale for c in classes}
        print(
            f"| {point['load']} | {rate.get('interactive', 0):.1f} | {rate.get('batch', 0):.1f} "
            f"| {p50.get('interactive', 0):.1f} | {p50.get('batch', 0):.1f} "
            f"| {each('capacity')} | {each('batch_limit_from_pace')} | {each('in_flight')} "
            f"| {status.get('held', '–')} |"
        )
    print()
    print(
        "Rates: closed-loop runs/min (agents × 60 / mean run time), model time. Cap, pace "
        "limit, in flight, held: medians of the scheduler's /status over the window."
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
