"""The dataplane of several commits side by side: added latency and CPU per turn, one at a time.

    python tools/bench/dataplane_ab.py cfab26b HEAD          # two commits
    python tools/bench/dataplane_ab.py cfab26b 014f276 .     # '.' is the working tree
    python tools/bench/dataplane_ab.py --turns 1000 --json ab.json HEAD~3 HEAD
    python tools/bench/dataplane_ab.py --streams 20 --turns 2000 HEAD .   # 20 at once

Starts one fake engine (time-scaled so it takes almost no time itself), one scheduler
from the working tree, and one dataplane per commit given, each run from a temporary
``git worktree`` of that commit (``PYTHONPATH`` pointing at its ``src``). Then sends
streamed 16-token turns one at a time, rotating over the engine directly and every
dataplane turn by turn, each round starting one arm further on, with 10 ms of quiet
after each turn: a dataplane writes a turn's last report up to 5 ms after the turn
(``report_flush_ms``), and without the quiet that write lands in the next arm's turn
(two dataplanes of one commit then measured 0.4 ms apart). So each arm sees the same
machine: what differs between the arms is the dataplane's code. Reports each
dataplane's p50 and the p50 added over the direct arm, and its own CPU time per turn
(from ``/proc``), and its own time per turn where its commit has the
``luftpause_dataplane_own_seconds`` histogram. With ``--streams N`` the turns go N at
a time: N closed-loop streams on one arm for a block of turns, then the next arm,
each round starting one arm further on. Timings are measured, never asserted.
Every process runs on this machine, pinned as ``overhead.py`` pins them (this
process and the engine on the first CPU, the scheduler and every dataplane on the
second); ``--no-pin`` leaves them to the kernel.

A dataplane of an older commit speaks whatever the scheduler of the working tree still
serves (``Admit`` and ``Report`` are kept beside ``Link``); a commit whose dataplane
cannot start against it fails with its log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp

# A streamed 16-token turn, timed request to [DONE], as overhead.py sends it.
from luftpause.procs import ServiceProcess, launch, stop_all
from tools.bench.overhead import (
    MODEL,
    add_delta,
    cpu_seconds,
    one_turn,
    own_buckets,
    own_summary,
    pin,
)

ROOT = Path(__file__).resolve().parents[2]
GAP_S = 0.01  # between two turns
BLOCK_TURNS = 5  # per worker and block, with --streams
BLOCK_GAP_S = 0.05  # between two blocks


def worktree(rev: str, into: Path) -> tuple[str, str]:
    """The ``src`` directory of ``rev`` ('.' = the working tree) and its short name."""
    if rev == ".":
        return str(ROOT / "src"), "working tree"
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(into), sha],
        check=True,
    )
    return str(into / "src"), sha


async def measure(
    engine: str,
    dataplanes: dict[str, ServiceProcess],
    turns: int,
    streams: int = 1,
    scheduler_pid: int | None = None,
) -> dict[str, Any]:
    """``scheduler_pid``: also report the scheduler's CPU time per dataplane turn (its
    probes included: one every 2 s)."""
    arms = [("direct", f"{engine}/v1")] + [
        (name, f"{dp.urls['http']}/v1") for name, dp in dataplanes.items()
    ]
    latencies: dict[str, list[float]] = {name: [] for name, _ in arms}
    own: dict[str, dict[str, Any]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        for _ in range(50):  # warm-up: connections, caches
            for name, url in arms:
                await one_turn(client, url, {"x-luftpause-run-id": f"warm-{name}"})
        own0 = {name: await own_buckets(client, dp.urls["http"]) for name, dp in dataplanes.items()}
        cpu0 = {name: cpu_seconds(dp.pid) for name, dp in dataplanes.items()}
        sched0 = cpu_seconds(scheduler_pid) if scheduler_pid is not None else 0.0
        if streams > 1:
            await _blocks(client, arms, latencies, turns, streams)
        for i in range(turns if streams == 1 else 0):
            # Each round starts one arm further on, so every arm takes every place in
            # the order equally often and no arm ever runs two turns in a row.
            for name, url in arms[i % len(arms) :] + arms[: i % len(arms)]:
                run = {"x-luftpause-run-id": f"ab-{name}"}
                latencies[name].append(await one_turn(client, url, run))
                # A quiet machine for the next turn: the dataplane writes a turn's last
                # report up to report_flush_ms (5 ms) after it ends, which would land in
                # whichever arm's turn comes next and favour some arms over others.
                await asyncio.sleep(GAP_S)
            if (i + 1) % 100 == 0:
                print(f"  {i + 1}/{turns} rounds", file=sys.stderr, flush=True)
        cpu1 = {name: cpu_seconds(dp.pid) for name, dp in dataplanes.items()}
        sched1 = cpu_seconds(scheduler_pid) if scheduler_pid is not None else 0.0
        for name, dp in dataplanes.items():
            grew: dict[float, float] = {}  # empty for a commit without the histogram
            add_delta(grew, own0[name], await own_buckets(client, dp.urls["http"]))
            own[name] = own_summary(grew) if grew else {}
    direct = statistics.median(latencies["direct"]) * 1000
    dataplane_turns = sum(len(latencies[name]) for name in dataplanes)
    return {
        "scheduler_cpu_ms_per_turn": (
            (sched1 - sched0) / dataplane_turns * 1000 if scheduler_pid is not None else None
        ),
        "turns_per_arm": len(latencies["direct"]),
        "streams": streams,
        "direct_p50_ms": direct,
        "dataplanes": {
            name: {
                "p50_ms": statistics.median(latencies[name]) * 1000,
                "added_p50_ms": statistics.median(latencies[name]) * 1000 - direct,
                "cpu_ms_per_turn": (cpu1[name] - cpu0[name]) / len(latencies[name]) * 1000,
                "own_p50_ms": own[name].get("p50_ms"),
                "own_p99_ms": own[name].get("p99_ms"),
            }
            for name in dataplanes
        },
    }


async def _blocks(
    client: aiohttp.ClientSession,
    arms: list[tuple[str, str]],
    latencies: dict[str, list[float]],
    turns: int,
    streams: int,
) -> None:
    """``streams`` closed-loop workers on one arm at a time, ``BLOCK_TURNS`` turns each,
    the arms taken in turn (each round starting one arm further on) until every arm has
    had at least ``turns`` (whole blocks); quiet between blocks, as between single turns."""
    per_block = streams * BLOCK_TURNS
    rounds = max(1, math.ceil(turns / per_block))
    for i in range(rounds):
        for name, url in arms[i % len(arms) :] + arms[: i % len(arms)]:

            async def worker(w: int, name: str = name, url: str = url) -> None:
                run = {"x-luftpause-run-id": f"ab-{name}-{w}"}
                for _ in range(BLOCK_TURNS):
                    latencies[name].append(await one_turn(client, url, run))

            await asyncio.gather(*(worker(w) for w in range(streams)))
            await asyncio.sleep(BLOCK_GAP_S)
        if (i + 1) % 10 == 0:
            print(f"  {i + 1}/{rounds} rounds", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="+", metavar="REV", help="commits to compare ('.' = now)")
    parser.add_argument("--turns", type=int, default=500, help="turns per arm (default 500)")
    parser.add_argument(
        "--streams",
        type=int,
        default=1,
        help="concurrent streams (default 1: turns one at a time, rotated turn by turn; "
        f"more: blocks of {BLOCK_TURNS} turns per stream, rotated block by block)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave every process to the kernel's scheduler instead of pinning them",
    )
    args = parser.parse_args()
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    if args.streams < 1:
        parser.error("--streams must be at least 1")
    if args.pin and (os.cpu_count() or 1) < 2:
        print("one CPU: nothing to pin to; running unpinned", file=sys.stderr)
        args.pin = False
    if args.pin:
        pin(0, {0})
    started: list[ServiceProcess] = []
    trees: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="luftpause-ab-") as tmp_s:
        tmp = Path(tmp_s)

        def start(*a: str, name: str, env: dict[str, str] | None = None) -> ServiceProcess:
            svc = launch(
                a, name=name, ready_file=tmp / f"{name}.json", stderr=tmp / f"{name}.log", env=env
            )
            started.append(svc)
            try:
                svc.wait_ready(60)
            except Exception:
                log = (tmp / f"{name}.log").read_text(errors="replace")[-2000:]
                raise SystemExit(f"{name} did not start:\n{log}") from None
            if args.pin:  # as overhead.py: client and engine on one CPU, the hop on the other
                pin(svc.pid, {0} if name == "engine" else {1})
            return svc

        try:
            engine = start(
                "fake-engine", "--port", "0", "--time-scale", "1000", "--chunk-tokens", "4",
                "--log-level", "WARNING", name="engine",
            ).urls["http"]  # fmt: skip
            config = tmp / "stack.toml"
            config.write_text(
                "[scheduler]\ngrpc_port = 0\nhttp_port = 0\n"
                f'[[endpoints]]\nname = "engine"\nurl = "{engine}"\nmodels = ["{MODEL}"]\n'
                'metrics = "sglang"\n'
            )
            sched = start(
                "scheduler", "--config", str(config), "--log-level", "WARNING", name="scheduler"
            )
            dataplanes: dict[str, ServiceProcess] = {}
            for k, rev in enumerate(args.revs):
                src, label = worktree(rev, tmp / f"tree-{k}")
                if rev != ".":
                    trees.append(tmp / f"tree-{k}")
                name = label if label not in dataplanes else f"{label} ({k})"
                dataplanes[name] = start(
                    "dataplane", "--config", str(config), "--port", "0",
                    "--scheduler", f"127.0.0.1:{sched.ports['grpc']}", "--log-level", "WARNING",
                    "--dataplane-id", f"ab-{k}", name=f"dataplane-{k}", env={"PYTHONPATH": src},
                )  # fmt: skip
            what = "rounds" if args.streams == 1 else f"turns per arm, {args.streams} at once"
            print(f"measuring {args.turns} {what} (progress on stderr)", file=sys.stderr)
            try:
                result = asyncio.run(
                    measure(engine, dataplanes, args.turns, args.streams, sched.pid)
                )
            except RuntimeError as exc:  # a turn failed: say where, with the logs
                logs = "".join(
                    f"\n--- {name} ---\n{dp.stderr_path.read_text(errors='replace')[-3000:]}"
                    for name, dp in dataplanes.items()
                    if dp.stderr_path is not None
                )
                raise SystemExit(f"{exc}\n{logs}") from None
        finally:
            stop_all(started)
            for tree in trees:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    check=False,
                )
    streams = f" --streams {args.streams}" if args.streams > 1 else ""
    print(
        f"Command: python tools/bench/dataplane_ab.py --turns {args.turns}{streams} "
        f"{' '.join(args.revs)}"
    )
    print()
    print(f"Direct to the engine: p50 {result['direct_p50_ms']:.2f} ms")
    print()
    print(
        "| dataplane at | p50 ms | added p50 ms | dataplane CPU ms per turn "
        "| own time p50 / p99 ms |"
    )
    print("|---|---|---|---|---|")
    for name, m in result["dataplanes"].items():
        own = (
            f"{m['own_p50_ms']:.2f} / {m['own_p99_ms']:.2f}"
            if m["own_p50_ms"] is not None and m["own_p99_ms"] is not None
            else "–"
        )
        print(
            f"| {name} | {m['p50_ms']:.2f} | {m['added_p50_ms']:+.2f} | "
            f"{m['cpu_ms_per_turn']:.2f} | {own} |"
        )
    print()
    how = (
        "turns one at a time, arms rotated turn by turn"
        if args.streams == 1
        else f"{args.streams} concurrent streams, arms rotated block by block"
    )
    print(
        f"Machine: {os.cpu_count()} cores, {'pinned' if args.pin else 'unpinned'}; "
        "load average at the end "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; {how}, "
        f"{result['turns_per_arm']} turns per arm. Own time: the dataplane's "
        "luftpause_dataplane_own_seconds (commits that have it). The scheduler (the "
        "working tree's, on the dataplanes' CPU when pinned) used "
        f"{result['scheduler_cpu_ms_per_turn']:.2f} ms of CPU per dataplane turn, its "
        "probes included."
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
