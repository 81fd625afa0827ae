"""Where a dataplane (or the scheduler) spends its time under closed-loop streams: a py-spy
profile, summarised by function.

    python tools/bench/dataplane_profile.py                      # 20 streams, 30 s
    python tools/bench/dataplane_profile.py --streams 64 --seconds 20
    python tools/bench/dataplane_profile.py --scheduler-cpu other  # the scheduler moved
    python tools/bench/dataplane_profile.py --process scheduler    # profile the scheduler

Starts one fake engine that answers at once (time scale 1000, 4-token chunks), a
scheduler and a dataplane, pins them as ``overhead.py`` does (this process and the
engine on CPU 0; the dataplane on CPU 1, and the scheduler beside it, or with
``--scheduler-cpu other`` on CPU 0), warms up for 3 s, then runs ``--streams``
closed-loop streams of 16-token turns for ``--seconds`` while ``py-spy record``
samples the chosen process 250 times a second (``--nonblocking``: the process is not
stopped; idle samples are left out). It prints turns/s, the dataplane's CPU per
turn, and the functions with the largest shares of the samples, by their own time and
with their callees; ``--raw FILE`` keeps py-spy's raw folded stacks.

A sample in a function's own time is wall time the process spent there while not
idle, including time the kernel ran another process on its core: with the scheduler
beside the dataplane, the send of an admission request shows the scheduler's work.
Needs ``py-spy`` (``pip install py-spy``; it reads another process's memory, so it
may need the rights to do so). Timings are measured, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if (
    not __package__
):  # run as a file (python tools/bench/dataplane_profile.py): tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp

from luftpause.cliargs import positive_int
from luftpause.procs import ServiceProcess, launch, stop_all
from tools.bench.overhead import cpu_seconds, one_turn, pin, write_config


def summarise(
    folded: str, top: int = 30
) -> tuple[int, list[tuple[float, str]], list[tuple[float, str]]]:
    """From py-spy's raw output (one ``frame;frame;... count`` line per stack): the
    samples in all, and the ``top`` functions by share of them in their own time (the
    innermost frame) and with their callees (any frame; a function counted once per
    sample however often it recurs)."""
    own: collections.Counter[str] = collections.Counter()
    total_with: collections.Counter[str] = collections.Counter()
    total = 0
    for line in folded.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for name in set(frames):
            total_with[name] += n
    if not total:
        return 0, [], []

    def shares(counter: collections.Counter[str]) -> list[tuple[float, str]]:
        return [(n / total, name) for name, n in counter.most_common(top)]

    return total, shares(own), shares(total_with)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--streams", type=positive_int, default=20, help="closed-loop streams (default 20)"
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="profiled seconds (default 30)")
    parser.add_argument(
        "--process", choices=("dataplane", "scheduler"), default="dataplane",
        help="which process py-spy samples (default: the dataplane)",
    )  # fmt: skip
    parser.add_argument(
        "--scheduler-cpu", choices=("same", "other"), default="same",
        help="the scheduler on the dataplane's CPU, as overhead.py pins it (default), or on "
        "the other one, with the load generator and the engine",
    )  # fmt: skip
    parser.add_argument(
        "--top", type=positive_int, default=30, help="functions to list (default 30)"
    )
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw folded stacks here")
    parser.add_argument(
        "--native",
        action="store_true",
        help="sample C frames too (uvloop, httptools, the kernel calls they make); py-spy "
        "then pauses the process for each sample, so the rate it serves drops",
    )
    args = parser.parse_args()
    if not args.seconds >= 1:  # py-spy records whole seconds
        parser.error("--seconds must be at least 1")
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("dataplane_profile: py-spy not found (pip install py-spy)", file=sys.stderr)
        return 2
    if (os.cpu_count() or 1) < 2:
        print("dataplane_profile: needs two CPUs to pin as overhead.py does", file=sys.stderr)
        return 2
    near, far = {0}, {1}
    pin(0, near)
    started: list[ServiceProcess] = []
    with tempfile.TemporaryDirectory(prefix="luftpause-profile-") as tmp_s:
        tmp = Path(tmp_s)

        def start(*argv: str, name: str, cpus: set[int]) -> ServiceProcess:
            svc = launch(
                argv, name=name, ready_file=tmp / f"{name}.json", stderr=tmp / f"{name}.log"
            )
            started.append(svc)
            svc.wait_ready(60)
            pin(svc.pid, cpus)
            return svc

        try:
            engine = start(
                "fake-engine", "--port", "0", "--time-scale", "1000", "--chunk-tokens", "4",
                "--log-level", "WARNING", name="engine", cpus=near,
            ).urls["http"]  # fmt: skip
            config = tmp / "stack.toml"
            write_config(config, [engine], [])
            scheduler = start(
                "scheduler", "--config", str(config), "--log-level", "WARNING",
                name="scheduler", cpus=far if args.scheduler_cpu == "same" else near,
            )  # fmt: skip
            dataplane = start(
                "dataplane", "--config", str(config), "--port", "0",
                "--scheduler", f"127.0.0.1:{scheduler.ports['grpc']}", "--log-level", "WARNING",
                name="dataplane", cpus=far,
            )  # fmt: skip
            target = dataplane if args.process == "dataplane" else scheduler
            raw = args.raw or tmp / "profile.txt"
            turns, rate, cpu_ms = asyncio.run(
                _load(dataplane, target, spy, raw, args.streams, args.seconds, args.native)
            )
        finally:
            stop_all(started)
        if not raw.exists():
            print("dataplane_profile: py-spy wrote no profile", file=sys.stderr)
            return 1
        total, own, with_callees = summarise(raw.read_text(), args.top)
    where = "beside the dataplane" if args.scheduler_cpu == "same" else "on the other CPU"
    print(
        f"{args.streams} streams, {args.seconds:g} s profiled: {turns} turns, {rate:.0f}/s, "
        f"dataplane CPU {cpu_ms:.3f} ms per turn; the scheduler {where}; "
        f"py-spy samples of the {args.process} (not idle): {total}"
    )
    for title, rows in (("own time", own), ("with callees", with_callees)):
        print(f"\n{title}:")
        for share, name in rows:
            print(f"{share * 100:6.1f} %  {name}")
    return 0


async def _load(
    dataplane: ServiceProcess, target: ServiceProcess, spy: str, raw: Path, streams: int,
    seconds: float, native: bool = False,
) -> tuple[int, float, float]:  # fmt: skip
    url = dataplane.urls["http"] + "/v1"
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:

        async def stream(i: int, until: float) -> None:
            nonlocal done
            headers = {"x-luftpause-run-id": f"profile-{i}", "x-luftpause-caller": "profile"}
            while time.perf_counter() < until:
                await one_turn(client, url, headers)
                done += 1

        warm = time.perf_counter() + 3
        await asyncio.gather(*(stream(i, warm) for i in range(streams)))
        record = await asyncio.create_subprocess_exec(
            spy, "record", "-p", str(target.pid), "-r", "250", "-d", str(int(seconds)),
            "-f", "raw", "-o", str(raw), *(["--native"] if native else ["--nonblocking"]),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        cpu0, done, t0 = cpu_seconds(dataplane.pid), 0, time.perf_counter()
        until = t0 + seconds
        await asyncio.gather(*(stream(i, until) for i in range(streams)))
        elapsed = time.perf_counter() - t0
        cpu1 = cpu_seconds(dataplane.pid)
    _, err = await record.communicate()
    if record.returncode != 0:
        raise SystemExit(f"dataplane_profile: py-spy failed: {err.decode(errors='replace')[-500:]}")
    return done, done / elapsed, 1000 * (cpu1 - cpu0) / max(done, 1)


if __name__ == "__main__":
    sys.exit(main())
