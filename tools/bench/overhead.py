"""What the dataplane costs: added latency, and turns per second next to the SGLang router.

    python tools/bench/overhead.py            # full: ~10 minutes on 2 cores
    python tools/bench/overhead.py --quick    # fewer turns, shorter runs
    python tools/bench/overhead.py --tracing  # the same, the dataplane and scheduler
                                              # exporting spans to a local OTLP sink
    python tools/bench/overhead.py --report-from run.json  # re-print a --json run's
                                              # report, byte for byte; starts nothing

Starts two fake engines with a fixed short reply (16 tokens, time-scaled so the
engine itself takes almost no time), the scheduler and the dataplane, and the
real SGLang router (``cache_aware``) in front of the same engines. Then, in one
run (the latency phases in blocks, the throughput runs in repetitions, the arms
alternated as [Methodology](docs/benchmarks/methodology.md#alternation) describes):

(a) latency of a streamed turn (request sent → ``[DONE]`` read) in five arms:
    straight to an engine, through one dataplane, through two dataplane processes
    sharing one port (``--reuse-port``, as ``dataplane.workers = 2``), through the
    router, and through the *floor*: ``bare_relay.py``, a raw ASGI app on the
    dataplane's own server (uvicorn's httptools protocol on uvloop) that relays each
    turn to an engine with the dataplane's engine client and does nothing else - the
    floor of the dataplane's stack; one at a time and with 20 concurrent streams; the
    added latency is the difference of an arm's percentiles and the direct arm's;
(b) closed-loop throughput (turns/s) with 64 concurrent streams in the same five
    arms, with each proxy's own CPU time per turn (the dataplanes', the scheduler's,
    the router's) and what that makes of one CPU-second: turns per CPU-second, the
    proxy's capacity on a core of its own, which the engines here cannot reach;
(c) latency at 20 concurrent streams *at an engine's pace*: on two more fake engines
    running at the calibrated model's speed (time scale 1) behind a second router,
    each turn asking for 8-48 tokens (``ignore_eos``), so a turn takes the engine tens
    to hundreds of milliseconds and the streams' turns end at different times, as
    agents' do. In (a) the engines answer at once, so 20 closed-loop streams keep the
    hop saturated and a turn's own time is mostly its wait behind the other 19; here
    the hop has the headroom a real engine leaves it;
(d) the same as (c) with each block warmed first: in (c) an arm's block starts after
    the other arms' blocks, by when the servers have closed its idle connections, so
    the block's first turns all open connections at once; here one unmeasured turn per
    worker opens them, and the workers start 40 ms apart, so the measured turns are
    those of streams already running and out of phase.

Everything runs on this machine, pinned as the methodology says (``--no-pin`` to
leave the processes to the kernel): this process (the load generator) and the
engines on the first CPU, the scheduler, the dataplanes, the router and the
floor on the second, so whichever of them an arm uses has a core to itself. The
load generator is one ``aiohttp`` session. The table reports the pinning, the
load average and each process's CPU seconds.

With ``--tracing`` the scheduler and the dataplane run with
``OTEL_EXPORTER_OTLP_ENDPOINT`` pointed at an OTLP/HTTP sink in this process
(it accepts and drops every export), so the dataplane's added latency includes
making and exporting its spans; run once with and once without to see the cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp

from luftpause.measure.progress import ArmClock
from luftpause.procs import (
    ServiceProcess,
    free_port,
    launch,
    launch_sglang_router,
    popen_child,
    stop_all,
)
from tools.bench.stats import mean_or_none, nearest_rank

MODEL = "llama-3.2-1b"
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "say something short"}],
    "max_tokens": 16,
    "stream": True,
}


@dataclass
class Arm:
    name: str
    urls: list[str]  # base URLs (…/v1); requests rotate over them
    headers: Callable[[int], dict[str, str]] = lambda worker: {}
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # kind -> count; shown, never hidden


_BODY = json.dumps(BODY).encode()
PACED_MODEL = "llama-3.2-1b-paced"  # served by the engines at the model's own speed
PACED_TOKENS = range(8, 49)
PACED_TURN_S = 0.8  # about the p50 of such a turn on the paced engines, 20 at a time
PACED_WARM = "20, paced, warm"
_PACED_BODIES = [
    json.dumps({**BODY, "model": PACED_MODEL, "max_tokens": n, "ignore_eos": True}).encode()
    for n in PACED_TOKENS
]


def paced_body(worker: int, i: int) -> bytes:
    """Turn ``i`` of worker ``worker`` at an engine's pace: 8-48 tokens, the same
    sequence in every arm."""
    return _PACED_BODIES[(worker * 7 + i * 13) % len(_PACED_BODIES)]


async def one_turn(
    client: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes = _BODY
) -> float:
    headers = {"content-type": "application/json", **headers}
    try:
        return await _one_turn(client, url, headers, body)
    except aiohttp.ServerDisconnectedError:
        # A kept connection the server closed while it sat idle (the paced blocks leave
        # an arm's connections idle longer than uvicorn's keep-alive): once more, on a
        # new connection, as HTTP clients retry a request that got no reply.
        return await _one_turn(client, url, headers, body)


async def _one_turn(
    client: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes
) -> float:
    t0 = time.perf_counter()
    async with client.post(f"{url}/chat/completions", data=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.read())[:200]!r}")
        tail = b""
        async for chunk in r.content.iter_any():
            tail = (tail + chunk)[-32:]
        if b"[DONE]" not in tail:
            raise RuntimeError(f"{url}: stream ended without [DONE]")
    return time.perf_counter() - t0


async def latency_block(
    client: aiohttp.ClientSession,
    arm: Arm,
    concurrency: int,
    turns: int,
    offset: int,
    body: Callable[[int, int], bytes] | None = None,
    stagger_s: float = 0.0,
    record: bool = True,
) -> None:
    """``turns`` turns spread over ``concurrency`` closed-loop workers (``body``: worker
    and turn number -> the request body; default the short fixed turn). Worker ``w``
    starts ``w × stagger_s`` late; ``record`` False: the latencies are not kept."""
    per_worker = max(1, turns // concurrency)

    async def worker(w: int) -> None:
        if stagger_s:
            await asyncio.sleep(w * stagger_s)
        for i in range(per_worker):
            url = arm.urls[(offset + w + i) % len(arm.urls)]
            data = _BODY if body is None else body(w, offset * per_worker + i)
            latency = await one_turn(client, url, arm.headers(w), data)
            if record:
                arm.latencies.append(latency)

    await asyncio.gather(*(worker(w) for w in range(concurrency)))


async def latency_phase(
    client: aiohttp.ClientSession,
    arms: list[Arm],
    one: Arm,
    dataplane: str,
    concurrency: int,
    turns: int,
    blocks: int,
    clock: ArmClock,
    body: Callable[[int, int], bytes] | None = None,
    label: str = "",
    warm_stagger_s: float | None = None,
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """``turns`` turns per arm at ``concurrency``, in ``blocks`` blocks with the arms'
    order reversed every other block; the one dataplane's own time (its histogram,
    scraped around each of its blocks: the two-process arm is left out, a scrape
    reaches one of the two) and every arm's latency percentiles.

    An arm's block starts cold: the other arms ran for many seconds meanwhile, so the
    servers have closed its idle connections (uvicorn's keep-alive is 5 s) and every
    worker opens new ones at once. With ``warm_stagger_s`` each block first runs one
    turn per worker that is not measured (the connections are open again), and the
    workers start ``warm_stagger_s`` apart, so the measured turns are those of streams
    already running and out of phase, as agents' are."""
    for arm in arms:
        arm.latencies.clear()
    own: dict[float, float] = {}
    for b in range(blocks):
        order = arms if b % 2 == 0 else list(reversed(arms))
        for arm in order:
            print(
                f"[{clock.start()}] latency c={concurrency}{label} block {b + 1}/{blocks}: "
                f"{arm.name}",
                file=sys.stderr,
                flush=True,
            )
            stagger = warm_stagger_s or 0.0
            if warm_stagger_s is not None:
                await latency_block(
                    client, arm, concurrency, concurrency, b, body, stagger, record=False
                )
            if arm is one:
                before = await own_buckets(client, dataplane)
            await latency_block(client, arm, concurrency, turns // blocks, b, body, stagger)
            if arm is one:
                add_delta(own, before, await own_buckets(client, dataplane))
            clock.finished()
    latency = {
        arm.name: {
            "n": len(arm.latencies),
            "p50_ms": nearest_rank(arm.latencies, 50) * 1000,
            "p99_ms": nearest_rank(arm.latencies, 99) * 1000,
            "mean_ms": statistics.fmean(arm.latencies) * 1000,
        }
        for arm in arms
    }
    return own_summary(own), latency


async def throughput(
    client: aiohttp.ClientSession, arm: Arm, concurrency: int, seconds: float
) -> float:
    done = 0
    stop_at = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop_at:
            try:
                await one_turn(client, arm.urls[(w + i) % len(arm.urls)], arm.headers(w))
                done += 1
            except (aiohttp.ClientError, RuntimeError) as exc:
                kind = f"{type(exc).__name__}: {str(exc)[:80]}"
                arm.errors[kind] = arm.errors.get(kind, 0) + 1
            i += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return done / (time.perf_counter() - t0)


OWN = "luftpause_dataplane_own_seconds_bucket"


async def own_buckets(client: aiohttp.ClientSession, dataplane: str) -> dict[float, float]:
    """The dataplane's own-time histogram (``luftpause_dataplane_own_seconds``): upper
    bucket edge in seconds -> cumulative count."""
    async with client.get(f"{dataplane}/metrics") as r:
        return parse_own(await r.text())


def parse_own(text: str) -> dict[float, float]:
    """The own-time histogram's buckets in a Prometheus text exposition: upper edge in
    seconds -> cumulative count (empty when the dataplane has no such histogram)."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(OWN + "{"):
            edge = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(edge)] = float(line.rsplit(" ", 1)[1])
    return buckets


def add_delta(
    total: dict[float, float], before: dict[float, float], after: dict[float, float]
) -> None:
    """Add what a histogram's cumulative bucket counts grew by between two scrapes."""
    for edge, count in after.items():
        total[edge] = total.get(edge, 0.0) + count - before.get(edge, 0.0)


def own_summary(counts: dict[float, float]) -> dict[str, Any]:
    """The turns in cumulative bucket counts (those ``add_delta`` summed between scrapes):
    how many, p50 and p99 (interpolated within a bucket, as Prometheus'
    histogram_quantile does) and the share at most 1, 2 and 5 ms (exact: those are
    bucket edges)."""
    edges = sorted(counts)
    cumulative = [counts[e] for e in edges]
    n = cumulative[-1] if cumulative else 0.0

    def quantile(q: float) -> float | None:
        if not n:
            return None
        rank, low, below = q * n, 0.0, 0.0
        for edge, count in zip(edges, cumulative, strict=True):
            if count >= rank:
                if edge == float("inf"):
                    return low * 1000
                inside = count - below
                return (low + (edge - low) * ((rank - below) / inside if inside else 1)) * 1000
            low, below = edge, count
        return None

    def share(limit: float) -> float | None:
        count = dict(zip(edges, cumulative, strict=True)).get(limit)
        return count / n if n and count is not None else None

    return {
        "n": n,
        "p50_ms": quantile(0.5),
        "p99_ms": quantile(0.99),
        "share_le_1ms": share(0.001),
        "share_le_2ms": share(0.002),
        "share_le_5ms": share(0.005),
    }


def pin(pid: int, cpus: set[int]) -> None:
    """Keep every thread of process ``pid`` (0: this one) on ``cpus``; threads it starts
    later inherit that."""
    tasks = Path(f"/proc/{pid or os.getpid()}/task")
    for tid in tasks.iterdir():
        with contextlib.suppress(ProcessLookupError, PermissionError):  # a thread that ended
            os.sched_setaffinity(int(tid.name), cpus)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_config(path: Path, engines: list[str], paced: list[str]) -> None:
    text = "[scheduler]\ngrpc_port = 0\nhttp_port = 0\n"
    for prefix, model, urls in (("engine", MODEL, engines), ("paced", PACED_MODEL, paced)):
        for i, url in enumerate(urls):
            text += (
                f'[[endpoints]]\nname = "{prefix}-{i}"\nurl = "{url}"\nmodels = ["{model}"]\n'
                'metrics = "sglang"\n'
            )
    path.write_text(text)


@dataclass
class Stack:
    """The URLs and process IDs the arms use."""

    engines: list[str]
    dataplane: str  # one dataplane process
    dataplanes: str  # two dataplane processes sharing one port (--reuse-port)
    router: str
    paced_engines: list[str]  # the engines at the model's own speed, and their router
    paced_router: str
    floor: str  # the bare relay in front of the engines, and one in front of the paced ones
    paced_floor: str
    procs: dict[str, int]  # name -> pid
    proxy_pids: dict[str, list[int]]  # arm name -> the proxy processes it uses (the
    # dataplanes, or the router; the scheduler is counted apart)


async def measure(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:

    def ours(w: int) -> dict[str, str]:
        return {"x-luftpause-run-id": f"bench-{w}", "x-luftpause-caller": "bench"}

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        direct = Arm("engine (direct)", [f"{u}/v1" for u in stack.engines])
        one = Arm("dataplane", [f"{stack.dataplane}/v1"], ours)
        two = Arm("2 dataplanes, one port", [f"{stack.dataplanes}/v1"], ours)
        router = Arm(ROUTER, [f"{stack.router}/v1"])
        floor = Arm(FLOOR, [f"{stack.floor}/v1"])
        arms = [direct, one, two, router, floor]
        # Warm-up: connections, caches, JIT-free Python paths.
        for arm in arms:
            await latency_block(client, arm, 4, 40, 0)
            arm.latencies.clear()
        latency: dict[str, dict[str, dict[str, float]]] = {}
        # The one dataplane's own time per turn, from its histogram, scraped around each of
        # its blocks (the two-process arm is left out: a scrape reaches one of the two).
        own: dict[str, dict[str, Any]] = {}
        clock = ArmClock(4 * args.blocks * len(arms) + len(arms) * args.repeat)
        for concurrency, turns in ((1, args.sequential_turns), (20, args.concurrent_turns)):
            key = str(concurrency)
            own[key], latency[key] = await latency_phase(
                client, arms, one, stack.dataplane, concurrency, turns, args.blocks, clock
            )
        # (c) 20 streams at an engine's pace: the same arms on the paced engines.
        paced = [
            Arm(direct.name, [f"{u}/v1" for u in stack.paced_engines]),
            Arm(one.name, one.urls, ours),
            Arm(two.name, two.urls, ours),
            Arm(router.name, [f"{stack.paced_router}/v1"]),
            Arm(floor.name, [f"{stack.paced_floor}/v1"]),
        ]
        for arm in paced:  # warm-up
            await latency_block(client, arm, 4, 8, 0, paced_body)
            arm.latencies.clear()
        own["20, paced"], latency["20, paced"] = await latency_phase(
            client, paced, paced[1], stack.dataplane, 20, args.paced_turns, args.blocks, clock,
            body=paced_body, label=" at an engine's pace",
        )  # fmt: skip
        # (d) the same with each block warmed and its streams out of phase.
        own[PACED_WARM], latency[PACED_WARM] = await latency_phase(
            client, paced, paced[1], stack.dataplane, 20, args.paced_turns, args.blocks, clock,
            body=paced_body, label=" at an engine's pace, warm",
            warm_stagger_s=PACED_TURN_S / 20,
        )  # fmt: skip
        through: dict[str, list[float]] = {arm.name: [] for arm in arms}
        # Each proxy's own CPU time per turn (the dataplanes', the router's), measured per
        # throughput run: what a turn costs the proxy itself, apart from the load generator
        # and engines sharing the machine's cores.
        cpu_per_turn: dict[str, list[float]] = {name: [] for name in stack.proxy_pids}
        scheduler_per_turn: dict[str, list[float]] = {one.name: [], two.name: []}
        scheduler = stack.procs["scheduler"]
        cpu_before = {name: cpu_seconds(pid) for name, pid in stack.procs.items()}
        own_through: dict[float, float] = {}
        for rep in range(args.repeat):
            order = arms if rep % 2 == 0 else list(reversed(arms))
            for arm in order:
                print(f"[{clock.start()}] throughput: {arm.name}", file=sys.stderr, flush=True)
                pids = stack.proxy_pids.get(arm.name, [])
                if arm is one:
                    before = await own_buckets(client, stack.dataplane)
                cpu0 = sum(cpu_seconds(pid) for pid in pids)
                sched0 = cpu_seconds(scheduler)
                t0 = time.perf_counter()
                rate = await throughput(client, arm, args.throughput_concurrency, args.seconds)
                turns = rate * (time.perf_counter() - t0)
                if arm is one:
                    after = await own_buckets(client, stack.dataplane)
                    add_delta(own_through, before, after)
                if pids and turns:
                    used = sum(cpu_seconds(pid) for pid in pids) - cpu0
                    cpu_per_turn[arm.name].append(used / turns * 1000)
                if arm.name in scheduler_per_turn and turns:
                    sched_used = cpu_seconds(scheduler) - sched0
                    scheduler_per_turn[arm.name].append(sched_used / turns * 1000)
                clock.finished()
                through[arm.name].append(rate)
                print(f"  throughput {arm.name}: {rate:.0f} turns/s", file=sys.stderr)
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in stack.procs.items()}
        errors = {arm.name: arm.errors for arm in arms if arm.errors}
        own[str(args.throughput_concurrency)] = own_summary(own_through)
    return {
        "latency": latency,
        "dataplane_own": own,
        "throughput": through,
        "proxy_cpu_ms_per_turn": cpu_per_turn,
        "scheduler_cpu_ms_per_turn": scheduler_per_turn,
        "errors": errors,
        "cpu_s_during_throughput": cpu,
    }


FULL = {
    "sequential_turns": 300,
    "concurrent_turns": 1200,
    "blocks": 6,
    "seconds": 10.0,
    "repeat": 3,
    "throughput_concurrency": 64,
    "paced_turns": 1200,
}
QUICK = {
    **FULL,
    "sequential_turns": 100,
    "concurrent_turns": 400,
    "blocks": 4,
    "seconds": 5.0,
    "repeat": 2,
    "paced_turns": 400,
}


def command(quick: bool, tracing: bool, pinned: bool) -> str:
    """The command line that runs these settings."""
    flags = (" --quick" if quick else "") + (" --tracing" if tracing else "")
    return f"python tools/bench/overhead.py{flags}" + ("" if pinned else " --no-pin")


def saved_settings(result: dict[str, Any]) -> dict[str, Any]:
    """The run's settings (``result["settings"]``). A result saved before it kept them:
    the plan (full or ``--quick``) whose turns one at a time equal the direct arm's
    ``n`` there, with the repetitions and concurrency the throughput figures show."""
    if "settings" in result:
        settings: dict[str, Any] = result["settings"]
        return settings
    n = result["latency"]["1"]["engine (direct)"]["n"]
    quick = n == (QUICK["sequential_turns"] // QUICK["blocks"]) * QUICK["blocks"]
    plan = QUICK if quick else FULL
    rates = next(iter(result["throughput"].values()))
    concurrency = [k for k in result["dataplane_own"] if k.isdigit() and k not in ("1", "20")]
    return {
        **plan,
        "repeat": len(rates),
        "throughput_concurrency": int(concurrency[0]) if concurrency else 64,
        "quick": quick,
        "tracing": "otlp_exports" in result,
        "pin": result["pinning"] != "Not pinned.",
    }


def this_machine() -> dict[str, Any]:
    """What the report says of the machine: its cores and the load average now."""
    return {"cores": os.cpu_count(), "loadavg_end": list(os.getloadavg())}


def render(result: dict[str, Any]) -> str:
    """The printed report of a run (what ``--json`` saved), a function of ``result``
    alone: the same result renders the same bytes. A result saved before ``settings``,
    ``machine`` and ``command`` were kept gets the settings :func:`saved_settings`
    infers, the command line they make, and this machine's cores and load average."""
    settings = saved_settings(result)
    host = result.get("machine") or this_machine()
    cmd = result.get("command") or command(settings["quick"], settings["tracing"], settings["pin"])
    head = f"Command: {cmd}\n\n"
    if "otlp_exports" in result:
        head += f"Tracing on: {result['otlp_exports']} OTLP exports received by the sink.\n\n"
    return head + _table(result, settings, host) + "\n"


def _table(result: dict[str, Any], settings: dict[str, Any], host: dict[str, Any]) -> str:
    lines = [
        "## Added latency (streamed turn, request → [DONE]; 16 tokens at once, or 8-48 "
        "tokens at the model's speed in the *20, paced* rows; *warm*: each block warmed first "
        "and its streams out of phase)",
        "",
    ]
    lines.append("| concurrency | arm | n | p50 ms | p99 ms | added p50 ms | added p99 ms |")
    lines.append("|---|---|---|---|---|---|---|")
    for conc, arms in result["latency"].items():
        direct = arms["engine (direct)"]
        for name, m in arms.items():
            added = name != "engine (direct)"
            extra = "– | – |"
            if added:
                d50, d99 = m["p50_ms"] - direct["p50_ms"], m["p99_ms"] - direct["p99_ms"]
                extra = f"{d50:+.2f} | {d99:+.2f} |"
            lines.append(
                f"| {conc} | {name} | {m['n']} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | {extra}"
            )
    lines += [
        "",
        "## The dataplane's own time per turn (its `luftpause_dataplane_own_seconds`)",
        "",
        "| concurrent streams | turns | p50 ms | p99 ms | ≤ 1 ms | ≤ 2 ms | ≤ 5 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for conc, o in result["dataplane_own"].items():
        cells = [_ms(o["p50_ms"]), _ms(o["p99_ms"])]
        cells += [_pct(o[k]) for k in ("share_le_1ms", "share_le_2ms", "share_le_5ms")]
        lines.append(f"| {conc} | {o['n']:.0f} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Own time is measured inside the one dataplane process: from its turn route being "
        "called to the answer's last byte handed to the server, less the engine's reply "
        "(request written to last byte read) and the scheduler's hold for capacity. It "
        "includes the admission round trip and the event loop's waits outside the engine's "
        "reply; not the time bytes sit in a socket before the loop reads them, nor the "
        "relay's work while the engine still replies (a lower bound). p50/p99 are "
        "interpolated within buckets, the shares are exact.",
        "",
        f"## Throughput ({settings['throughput_concurrency']} concurrent streams, "
        f"{settings['seconds']:.0f} s per arm, {settings['repeat']} repetitions)",
        "",
    ]
    lines.append(
        "| arm | turns/s (each repetition) | mean | proxy CPU ms per turn "
        "| scheduler CPU ms per turn | turns per CPU-second, proxy and scheduler |"
    )
    lines.append("|---|---|---|---|---|---|")
    per_cpu_s = turns_per_cpu_second(result)
    sched = result["scheduler_cpu_ms_per_turn"]
    for name, rates in result["throughput"].items():
        each = ", ".join(f"{r:.0f}" for r in rates)
        own = _ms(mean_or_none(result["proxy_cpu_ms_per_turn"].get(name)))
        theirs = _ms(mean_or_none(sched.get(name)))
        capacity = f"{per_cpu_s[name]:,.0f}" if name in per_cpu_s else "–"
        lines.append(
            f"| {name} | {each} | {statistics.fmean(rates):.0f} | {own} | {theirs} | {capacity} |"
        )
    t = {k: statistics.fmean(v) for k, v in result["throughput"].items()}
    router = t[ROUTER]
    lines += [
        "",
        f"dataplane / router throughput: {t['dataplane'] / router:.2f}; "
        f"2 dataplanes / 1: {t['2 dataplanes, one port'] / t['dataplane']:.2f}",
    ]
    cpu = {k: mean_or_none(v) for k, v in result["proxy_cpu_ms_per_turn"].items()}
    floor_ms, ours_ms = cpu.get(FLOOR), cpu.get("dataplane")
    if floor_ms and ours_ms:
        lines.append(
            f"The dataplane's CPU per turn against the floor of its stack: {ours_ms:.3f} / "
            f"{floor_ms:.3f} ms = {ours_ms / floor_ms:.2f}× (the goal is at most 1.2×)"
        )
    if "dataplane" in per_cpu_s and ROUTER in per_cpu_s:
        share = per_cpu_s["dataplane"] / per_cpu_s[ROUTER]
        lines.append(
            "Turns per CPU-second (what one core could serve if the proxy were the only "
            f"limit): dataplane and scheduler / router {share:.2f}"
        )
    lines.append("")
    for name, kinds in result["errors"].items():
        lines.append(f"Errors in {name}: " + "; ".join(f"{n}× {k}" for k, n in kinds.items()))
    lines.append(
        "CPU seconds used by each process during the throughput runs: "
        + ", ".join(f"{k} {v:.1f}" for k, v in result["cpu_s_during_throughput"].items())
    )
    lines.append(
        f"Machine: {host['cores']} cores; load average at the end "
        f"{', '.join(f'{x:.2f}' for x in host['loadavg_end'])}. {result['pinning']}"
    )
    c1, c20 = result["latency"]["1"], result["latency"]["20"]
    added1 = c1["dataplane"]["p50_ms"] - c1["engine (direct)"]["p50_ms"]
    added50 = c20["dataplane"]["p50_ms"] - c20["engine (direct)"]["p50_ms"]
    added99 = c20["dataplane"]["p99_ms"] - c20["engine (direct)"]["p99_ms"]
    ratio = t["dataplane"] / router
    met = {True: "met", False: "missed"}

    def own_text(key: str) -> str:
        o = result["dataplane_own"].get(key)
        if o is None:
            return "not measured"
        ok = (o["share_le_2ms"] or 0) >= 0.5 and (o["share_le_5ms"] or 0) >= 0.99
        return (
            f"{_ms(o['p50_ms'])} / {_ms(o['p99_ms'])} ms, {_pct(o['share_le_2ms'])} of turns "
            f"≤ 2 ms and {_pct(o['share_le_5ms'])} ≤ 5 ms: {met[ok]}"
        )

    # At an engine's pace the end-to-end difference is the engines' batching, hundreds of
    # milliseconds either way: only the dataplane's own time says what the hop costs.
    paced_text = (
        f"; at 20 streams at an engine's pace, own time {own_text('20, paced')} with each "
        f"block starting cold, {own_text(PACED_WARM)} warm and out of phase"
        if PACED_WARM in result["dataplane_own"]
        else ""
    )
    lines += [
        "",
        f"Targets: added p50 ≤ 1 ms one at a time (measured {added1:+.2f} ms: "
        f"{met[added1 <= 1]}); ≤ 2 ms p50 and ≤ 5 ms p99 at 20 streams, end to end "
        f"(measured {added50:+.2f} / {added99:+.2f} ms: {met[added50 <= 2 and added99 <= 5]}) "
        f"and of the dataplane's own time ({own_text('20')}){paced_text}; one "
        f"dataplane ≥ 1.5× the router's turns/s (measured {ratio:.2f}×: {met[ratio >= 1.5]}).",
        "Added latency is end to end: the difference of an arm's percentile and the direct "
        "arm's. With pinning, the hop (dataplane and scheduler, or the router) has a core "
        "of its own, apart from the load generator and engines; the CPU ms per turn "
        "columns are each process's own time.",
    ]
    return "\n".join(lines)


ROUTER = "sglang router (cache_aware)"
FLOOR = "floor (bare relay)"
BARE_RELAY = Path(__file__).resolve().parent / "bare_relay.py"


def turns_per_cpu_second(result: dict[str, Any]) -> dict[str, float]:
    """Per proxy arm, the turns one CPU-second of its processes served in the throughput
    runs: 1000 / (proxy CPU ms per turn + the scheduler's, for a dataplane arm). What one
    core could serve if the proxy were the only limit."""
    out: dict[str, float] = {}
    for name, values in result["proxy_cpu_ms_per_turn"].items():
        ms = mean_or_none(values)
        if ms is None:
            continue
        ms += mean_or_none(result["scheduler_cpu_ms_per_turn"].get(name)) or 0.0
        if ms > 0:
            out[name] = 1000.0 / ms
    return out


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that accepts every export and keeps nothing."""

    exports = 0

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        type(self).exports += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


def start_sink() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns, shorter runs")
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the results as JSON here (what --report-from re-renders)",
    )
    parser.add_argument(
        "--report-from",
        type=Path,
        metavar="JSON",
        help="only print the report of a run saved with --json; starts nothing",
    )
    parser.add_argument("--logs", metavar="DIR", help="keep every process's log in DIR")
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="run the scheduler and dataplane with tracing on, exporting to a local OTLP sink",
    )
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave every process to the kernel's scheduler instead of pinning them",
    )
    args = parser.parse_args()
    if args.report_from:
        try:
            saved = json.loads(args.report_from.read_text())
            text = render(saved)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            what = f"{type(exc).__name__}: {exc}"
            parser.error(f"--report-from {args.report_from}: not a saved run ({what})")
        sys.stdout.write(text)
        return 0
    if args.pin and (os.cpu_count() or 1) < 2:
        print("one CPU: nothing to pin to; running unpinned", file=sys.stderr)
        args.pin = False
    near, far = {0}, {1}  # load generator and engines; the hop under test
    if args.pin:
        pin(0, near)
    settings = {**(QUICK if args.quick else FULL)}
    settings.update(quick=args.quick, tracing=args.tracing, pin=args.pin)
    vars(args).update(settings)
    with tempfile.TemporaryDirectory(prefix="luftpause-bench-") as tmp_s:
        tmp = Path(args.logs) if args.logs else Path(tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        started: list[ServiceProcess] = []

        sink, sink_url = start_sink() if args.tracing else (None, "")
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink_url} if args.tracing else {}

        def start(*a: str, name: str, env: dict[str, str] | None = None) -> ServiceProcess:
            svc = launch(
                a,
                name=name,
                ready_file=tmp / f"{name}.json",
                stderr=tmp / f"{name}.log",
                env=env,
            )
            started.append(svc)
            svc.wait_ready(60)
            if args.pin:
                pin(svc.pid, near if name.startswith(("engine", "paced")) else far)
            return svc

        def start_floor(name: str, urls: list[str]) -> ServiceProcess:
            ready = tmp / f"{name}.json"
            argv = [sys.executable, str(BARE_RELAY), "--ready-file", str(ready)]
            argv += [a for url in urls for a in ("--engine", url)]
            with (tmp / f"{name}.log").open("wb") as out:
                svc = ServiceProcess(name, popen_child(argv, out), ready, tmp / f"{name}.log")
            started.append(svc)
            svc.wait_ready(60)
            if args.pin:
                pin(svc.pid, far)
            return svc

        router = paced_router = None
        try:

            def fake_engines(prefix: str, time_scale: str) -> list[str]:
                return [
                    start(
                        "fake-engine",
                        "--port",
                        "0",
                        "--time-scale",
                        time_scale,
                        "--chunk-tokens",
                        "4",
                        "--log-level",
                        "WARNING",
                        name=f"{prefix}-{i}",
                    ).urls["http"]
                    for i in range(2)
                ]

            # Engines that take almost no time themselves, and two at the model's speed.
            engines = fake_engines("engine", "1000")
            paced_engines = fake_engines("paced", "1")
            write_config(tmp / "stack.toml", engines, paced_engines)
            sched = start(
                "scheduler",
                "--config",
                str(tmp / "stack.toml"),
                "--log-level",
                "WARNING",
                name="scheduler",
                env=otel,
            )

            def dataplane(name: str, port: str, *extra: str) -> ServiceProcess:
                return start(
                    "dataplane", "--config", str(tmp / "stack.toml"), "--port", port,
                    "--scheduler", f"127.0.0.1:{sched.ports['grpc']}", "--log-level", "WARNING",
                    "--dataplane-id", name, *extra, name=name, env=otel,
                )  # fmt: skip

            dp = dataplane("dataplane", "0")
            shared = str(free_port())
            pair = [dataplane(f"dataplane-{k}", shared, "--reuse-port") for k in (1, 2)]
            router = launch_sglang_router(engines, "cache_aware", tmp / "router.log", MODEL)
            paced_router = launch_sglang_router(
                paced_engines, "cache_aware", tmp / "router-paced.log", PACED_MODEL
            )
            floor = start_floor("floor", engines)
            paced_floor = start_floor("floor-paced", paced_engines)
            if args.pin:
                pin(router.proc.pid, far)
                pin(paced_router.proc.pid, far)
            procs = {s.name: s.pid for s in started}
            procs["sglang-router"] = router.proc.pid
            stack = Stack(
                engines,
                dp.urls["http"],
                f"http://127.0.0.1:{shared}",
                router.url,
                paced_engines,
                paced_router.url,
                floor.urls["http"],
                paced_floor.urls["http"],
                procs,
                {
                    "dataplane": [dp.pid],
                    "2 dataplanes, one port": [p.pid for p in pair],
                    ROUTER: [router.proc.pid],
                    FLOOR: [floor.pid],
                },
            )
            print("stack up; measuring (progress on stderr)", file=sys.stderr)
            result = asyncio.run(measure(args, stack))
            result["pinning"] = (
                "Pinned: load generator and engines on CPU 0; scheduler, dataplanes and "
                "router on CPU 1."
                if args.pin
                else "Not pinned."
            )
        finally:
            if router is not None:
                router.stop()
            if paced_router is not None:
                paced_router.stop()
            stop_all(started)
            if sink is not None:
                sink.shutdown()
    # Everything the report reads, kept in the result so that it re-renders byte for
    # byte (--report-from); the load average is read once the stack has stopped.
    result["settings"] = settings
    result["machine"] = this_machine()
    result["command"] = command(args.quick, args.tracing, args.pin)
    if args.tracing:
        result["otlp_exports"] = _Sink.exports
    sys.stdout.write(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
