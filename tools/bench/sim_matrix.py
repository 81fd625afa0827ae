"""Arms against a baseline arm in the simulator, over cells × seeds, paired by seed.

    python tools/bench/sim_matrix.py --arms luftpause,luftpause-vtc,luftpause-attained \\
        --seeds 0,1,2 --json matrix.json \\
        --cell "48b=--replicas 2 --group 4:interactive --group 48:batch --warmup-s 96 \\
                --ramp-s 48 --duration-s 144" \\
        --cell "fair=--group 8:batch:alice --group 40:batch:bob" --groups

Each cell is a ``luftpause sim`` command line (its load and simulation flags, without
``--arms``, ``--seed`` and ``--json``); every (cell, seed) is one ``luftpause sim`` run
of all the arms with that seed, so each arm meets the same load and the same random
draws, and an arm's change against the first arm (the baseline) is taken seed by seed:
``100 × (arm − baseline) / baseline``. The table shows, per cell and metric, the
baseline's mean and each arm's mean change with its 95 % t-interval over the seeds
(``tools.bench.stats.mean_ci``), marked ``+`` where the interval lies wholly on the better side and
``−`` wholly on the worse one. Metrics, per service class (and per group with
``--groups``): runs/min (closed loop, agents × 60 / mean run time), run p50 and p95,
turn p50 (turns that ended in the window), reply tokens/min. ``--jobs`` runs that many
``luftpause sim`` processes at once. A measurement: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if (
    not __package__
):  # run as a file (python tools/bench/sim_matrix.py): tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.stats import mean_ci

# (label, path into a class's or group's figures, higher is better)
METRICS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("runs/min", ("runs_per_min_closed",), True),
    ("run p50 s", ("run_s", "p50"), False),
    ("run p95 s", ("run_s", "p95"), False),
    ("turn p50 s", ("turns_ended", "wall_s", "p50"), False),
    ("reply tok/min", ("turns_ended", "completion_tokens_per_min"), True),
)


def parse_cell(text: str) -> tuple[str, list[str]]:
    """``NAME=FLAGS`` -> (NAME, the flags split as a shell would)."""
    name, sep, flags = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"a cell is NAME=FLAGS, got {text!r}")
    args = shlex.split(flags)
    for reserved in ("--arms", "--seed", "--json"):
        if reserved in args:
            raise argparse.ArgumentTypeError(f"cell {name!r}: {reserved} is set by sim_matrix")
    return name.strip(), args


def run_sim(flags: list[str], arms: list[str], seed: int) -> list[dict[str, Any]]:
    """One ``luftpause sim`` of every arm at ``seed``: its results, one per arm."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sim.json"
        cmd = [sys.executable, "-m", "luftpause", "sim", *flags]
        cmd += ["--arms", ",".join(arms), "--seed", str(seed), "--json", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed:\n{done.stderr[-2000:]}")
        results: list[dict[str, Any]] = json.loads(out.read_text())["results"]
    return results


def figure(result: dict[str, Any], scope: str, name: str, path: tuple[str, ...]) -> float | None:
    value: Any = result.get(scope, {}).get(name)
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def rows_for(
    cell: str, runs: dict[int, list[dict[str, Any]]], arms: list[str], groups: bool
) -> list[dict[str, Any]]:
    """Per (scope, metric): the baseline's mean and each arm's paired changes."""
    first = next(iter(runs.values()))[0]
    scopes = [("classes", c) for c in sorted(first["classes"])]
    if groups:
        scopes += [("groups", g) for g in sorted(first["groups"])]
    rows = []
    for scope, name in scopes:
        for label, path, higher in METRICS:
            base: list[float] = []
            changes: dict[str, list[float]] = {arm: [] for arm in arms[1:]}
            values: dict[str, list[float]] = {arm: [] for arm in arms}
            for results in runs.values():
                by_arm = {r["arm"]: r for r in results}
                b = figure(by_arm[arms[0]], scope, name, path)
                if b is None:
                    continue
                base.append(b)
                values[arms[0]].append(b)
                for arm in arms[1:]:
                    v = figure(by_arm[arm], scope, name, path)
                    if v is None:
                        continue
                    values[arm].append(v)
                    if b != 0:
                        changes[arm].append(100.0 * (v - b) / b)
            if not base:
                continue
            rows.append(
                {
                    "cell": cell,
                    "scope": f"{scope[:-2] if scope == 'classes' else 'group'} {name}",
                    "metric": label,
                    "higher_is_better": higher,
                    "values": values,
                    "change_pct": changes,
                }
            )
    return rows


def change_text(changes: list[float], higher: bool) -> str:
    if not changes:
        return "-"
    mean, half = mean_ci(changes)
    if half is None:
        return f"{mean:+.1f} %"
    mark = ""
    if mean - half > 0 or mean + half < 0:
        better = (mean > 0) == higher
        mark = " +" if better else " −"
    return f"{mean:+.1f} ± {half:.1f} %{mark}"


def table(rows: list[dict[str, Any]], arms: list[str]) -> str:
    head = f"| cell | scope | metric | {arms[0]} | " + " | ".join(arms[1:]) + " |"
    lines = [head, "|" + "---|" * (3 + len(arms))]
    for row in rows:
        base = row["values"][arms[0]]
        base_text = f"{sum(base) / len(base):.4g}"
        cells = [change_text(row["change_pct"][arm], row["higher_is_better"]) for arm in arms[1:]]
        lines.append(
            f"| {row['cell']} | {row['scope']} | {row['metric']} | {base_text} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cell",
        type=parse_cell,
        action="append",
        required=True,
        metavar="NAME=FLAGS",
        help="a cell: a name and `luftpause sim` flags (repeatable)",
    )
    parser.add_argument(
        "--arms", required=True, help="arms, comma-separated; the first is the baseline"
    )
    parser.add_argument("--seeds", default="0,1,2", help="seeds, comma-separated (default 0,1,2)")
    parser.add_argument(
        "--groups", action="store_true", help="also show each group (per caller loads)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="sim processes at once (default 1)")
    parser.add_argument("--json", type=Path, help="write every run's figures and the rows here")
    args = parser.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if len(arms) < 2:
        parser.error("--arms needs a baseline and at least one arm")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    jobs = [(name, flags, seed) for name, flags in args.cell for seed in seeds]
    started = time.perf_counter()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {
            (name, seed): pool.submit(run_sim, flags, arms, seed) for name, flags, seed in jobs
        }
        done = {key: f.result() for key, f in futures.items()}
    rows: list[dict[str, Any]] = []
    for name, _ in args.cell:
        rows += rows_for(name, {s: done[(name, s)] for s in seeds}, arms, args.groups)
    print(f"seeds {','.join(map(str, seeds))}; change vs {arms[0]}, paired by seed")
    print(f"({time.perf_counter() - started:.0f} s of wall time)\n")
    print(table(rows, arms))
    if args.json is not None:
        cells = {name: shlex.join(flags) for name, flags in args.cell}
        runs = {f"{name}/{seed}": results for (name, seed), results in done.items()}
        args.json.write_text(
            json.dumps(
                {"arms": arms, "seeds": seeds, "cells": cells, "rows": rows, "runs": runs},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
