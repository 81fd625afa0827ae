"""A flood from idle: interactive runs in its first minute against once it has settled.

Every agent starts at once on idle engines (4 interactive beside N batch, the flood's
own-loop plan). The figure is the median run time of interactive runs *started* in the
first 60 model seconds, against that of runs started once the flood has settled (from
120 to 300 s); runs are followed to their end, so a slow first run is counted, not cut
off by the window. Batch throughput is batch runs ended per minute in the same spans.

Two arms: ``ramp`` (the scheduler's default ``initial_cap``) and ``no-ramp``
(``initial_cap = 0``: unlimited until an engine has queued on two probes).

    python tools/bench/first_minute.py                      # the simulator, 4 seeds
    python tools/bench/first_minute.py --flood --loads 48,96 --reps 2   # the real stack

``--flood`` starts fresh fake engines, fake tools, a scheduler and a dataplane for every
run (a flood from idle needs cold engines and a scheduler that has learned no cap) and
runs ``luftpause loadgen`` through them at ``--time-scale`` (default 5), the arms
alternated repetition by repetition at each load as
[Methodology](docs/benchmarks/methodology.md#alternation) describes, their runs pooled
over repetitions. Output: a Markdown table (``--out``) and every figure as JSON
(``--json``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from luftpause.loadgen import main as loadgen
from luftpause.scheduler.core import Params
from luftpause.sim.agents import Records
from luftpause.sim.main import add_arguments as sim_arguments
from luftpause.sim.main import config_from_args
from luftpause.sim.run import SimConfig, simulate
from tools.bench.arms.luftpause import _config, _luftpause
from tools.bench.arms.plan import INTERACTIVE_AGENTS, QUICK, TOOL_CALLS, Stack, probe_period
from tools.bench.arms.stack import start_engines as start_fake_engines

FIRST = (0.0, 60.0)  # model seconds: runs started here are the first minute's
STEADY = (120.0, 300.0)  # ... and here, once settled
HORIZON_S = 420.0  # long enough for every run started in STEADY to end
ARMS = {"ramp": Params().initial_cap, "no-ramp": None}


def commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or "unknown"


def span_figures(runs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per span: interactive run times (started there) and batch runs ended per minute."""
    runs = list(runs)
    out: dict[str, Any] = {}
    for name, (lo, hi) in (("first", FIRST), ("steady", STEADY)):
        inter = [
            r["duration_s"] for r in runs if r["class"] == "interactive" and lo <= r["start_s"] < hi
        ]
        ended = [
            r for r in runs if r["class"] == "batch" and lo <= r["start_s"] + r["duration_s"] < hi
        ]
        out[name] = {
            "interactive_run_s": inter,
            "batch_runs_per_min": len(ended) * 60.0 / (hi - lo),
        }
    return out


def sim_once(load: int, seed: int, initial_cap: int | None) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    sim_arguments(parser)
    args = parser.parse_args(
        ["--group", f"{INTERACTIVE_AGENTS}:interactive", "--group", f"{load}:batch",
         "--seed", str(seed), "--warmup-s", "0", "--duration-s", f"{HORIZON_S:g}",
         "--tool-calls", str(TOOL_CALLS)]
    )  # fmt: skip
    config: SimConfig = config_from_args(args)
    config = replace(config, params=replace(config.params, initial_cap=initial_cap))
    records = Records()
    simulate(config, "luftpause", records=records)
    runs = [
        {"class": r.cls, "start_s": r.start_s, "duration_s": r.end_s - r.start_s}
        for r in records.runs
    ]
    return span_figures(runs)


def flood_once(
    load: int, rep: int, initial_cap: int | None, scale: float, tmp: Path
) -> dict[str, Any]:
    """One flood from idle on a fresh stack; figures in model seconds."""
    plan = replace(QUICK, time_scale=scale)
    stack = Stack(tmp, plan)
    try:
        start_fake_engines(stack)
        config = _config(
            tmp / "stack.toml", stack, probe_period(plan), initial_cap=0 if initial_cap is None
            else initial_cap,
        )  # fmt: skip
        dataplane = _luftpause(stack, config, "")
        path = tmp / "loadgen.json"
        argv = [
            "--target", dataplane, "--tools-url", stack.tools_url,
            "--context-chars", "8000", "--tool-calls", str(TOOL_CALLS),
            "--group", f"{load}:batch:crowd", "--group", f"{INTERACTIVE_AGENTS}:interactive:people",
            "--warmup-s", "0", "--duration-s", f"{HORIZON_S / scale:g}",
            "--json", str(path), "--runs-in-json", "--quiet", "--seed", f"fm{load}{rep}",
        ]  # fmt: skip
        parser = argparse.ArgumentParser(prog="luftpause loadgen")
        loadgen.add_arguments(parser)
        with contextlib.redirect_stdout(io.StringIO()) as table:
            rc = loadgen.main(parser.parse_args(argv))
        if rc not in (0, 3) or not path.exists():
            raise RuntimeError(f"loadgen failed (rc {rc}):\n{table.getvalue()[-3000:]}")
        result = json.loads(path.read_text())
    finally:
        stack.stop()
    runs = [
        {
            "class": r["class"],
            "start_s": r["start_s"] * scale,
            "duration_s": r["duration_s"] * scale,
        }
        for r in result["runs"]
    ]
    figures = span_figures(runs)
    figures["load_avg"] = result.get("load_avg")
    return figures


def summarise(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool the interactive run times of every seed or repetition of one cell."""
    out: dict[str, Any] = {}
    for span in ("first", "steady"):
        pooled = [x for c in cells for x in c[span]["interactive_run_s"]]
        out[span] = {
            "interactive_runs": len(pooled),
            "interactive_p50_s": statistics.median(pooled) if pooled else None,
            "batch_runs_per_min": statistics.mean(c[span]["batch_runs_per_min"] for c in cells),
        }
    f, s = out["first"]["interactive_p50_s"], out["steady"]["interactive_p50_s"]
    out["ratio"] = f / s if f is not None and s else None
    return out


def render(results: dict[str, Any]) -> str:
    def fmt(x: float | None, spec: str) -> str:
        return "–" if x is None else format(x, spec)

    lines = [
        f"Command: `{results['command']}` at commit {results['commit']}; "
        f"{results['where']}, {results['samples']}.",
        "",
        "| batch agents | arm | interactive p50, first 60 s | settled (120–300 s) | ratio "
        "| batch runs/min, first 60 s | settled |",
        "|---|---|---|---|---|---|---|",
    ]
    for load, arms in results["cells"].items():
        for arm, c in arms.items():
            f, s = c["first"], c["steady"]
            lines.append(
                f"| {load} | {arm} | {fmt(f['interactive_p50_s'], '.1f')} s "
                f"({f['interactive_runs']} runs) | {fmt(s['interactive_p50_s'], '.1f')} s "
                f"({s['interactive_runs']} runs) | {fmt(c['ratio'], '.2f')}× "
                f"| {f['batch_runs_per_min']:.1f} | {s['batch_runs_per_min']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", default="8,24,48,96,144", help="batch agents per load point")
    p.add_argument("--seeds", type=int, default=4, help="simulator: seeds per cell")
    p.add_argument("--flood", action="store_true", help="the real stack instead of the simulator")
    p.add_argument("--reps", type=int, default=2, help="--flood: repetitions per cell")
    p.add_argument("--time-scale", type=float, default=5.0, help="--flood: engine/tool speed-up")
    p.add_argument("--out", type=Path, help="also write the table here")
    p.add_argument("--json", type=Path, help="also write every figure here")
    args = p.parse_args(argv)
    try:
        loads = [int(x) for x in args.loads.split(",") if x.strip()]
    except ValueError:
        p.error(f"--loads takes whole numbers separated by commas, not {args.loads!r}")
    if not loads or min(loads) < 1 or args.seeds < 1 or args.reps < 1 or args.time_scale <= 0:
        p.error("--loads, --seeds, --reps and --time-scale must be positive")
    command = "python tools/bench/first_minute.py " + " ".join(argv or sys.argv[1:])
    cells: dict[str, dict[str, Any]] = {}
    raw: list[dict[str, Any]] = []
    started = time.monotonic()
    total = len(loads) * len(ARMS) * (args.reps if args.flood else args.seeds)
    done = 0
    for load in loads:
        per_arm: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
        for i in range(args.reps if args.flood else args.seeds):
            order = list(ARMS) if i % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                if args.flood:
                    with tempfile.TemporaryDirectory(prefix="luftpause-fm-") as tmp:
                        cell = flood_once(load, i, ARMS[arm], args.time_scale, Path(tmp))
                else:
                    cell = sim_once(load, i, ARMS[arm])
                per_arm[arm].append(cell)
                raw.append({"load": load, "arm": arm, "i": i, **cell})
                done += 1
                print(
                    f"[{done}/{total}] {load} batch, {arm}, {'rep' if args.flood else 'seed'} "
                    f"{i}: interactive runs {len(cell['first']['interactive_run_s'])} first / "
                    f"{len(cell['steady']['interactive_run_s'])} settled "
                    f"({time.monotonic() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        cells[str(load)] = {arm: summarise(per_arm[arm]) for arm in ARMS}
    results = {
        "command": command.strip(),
        "commit": commit(),
        "where": (
            f"real-time flood at time scale {args.time_scale:g}, times in model seconds"
            if args.flood
            else "simulator"
        ),
        "samples": (
            f"{args.reps} repetitions pooled" if args.flood else f"seeds 0–{args.seeds - 1} pooled"
        ),
        "initial_cap": ARMS["ramp"],
        "cells": cells,
        "raw": raw,
    }
    table = render(results)
    print(table)
    if args.out:
        args.out.write_text(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
