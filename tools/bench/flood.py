"""Side-by-side benchmarks of luftpause against the SGLang router and engine priority (H4).

    python tools/bench/flood.py --quick      # time-scaled engines, fewer points: < 10 min
    python tools/bench/flood.py              # full: every load point, 2 repetitions (~4 h)
    python tools/bench/flood.py --benches own,light --reps 1 --time-scale 4

Every arm runs on the same two fake engines (``--priority-scheduling`` on, as in
the original testbed), in one run, arms alternated and repeated:

1. ``own``: own-loop flood - 4 interactive agents beside N batch agents,
   ~8,000-character contexts, 3 tool calls per run; arms (a) ``router``: the
   SGLang router (``cache_aware``), no class headers; (b) ``luftpause``: the
   dataplane, class headers set; (c) ``engine-prio``: straight to the engines,
   agent *i* pinned to engine *i* mod 2, ``priority`` in the body (interactive
   10, batch 0). A load sweep over N.
2. ``mcp``: the same mix as sub-agents through the runtime; arms: runtime →
   router vs runtime → dataplane; same sweep.
3. ``light``: ~2,000-character contexts, 24 batch + 4 interactive, the three
   own-loop arms: they should tie.
4. ``routing``: 8 concurrent sub-agents (no saturation): luftpause affinity vs
   router ``cache_aware`` vs router ``round_robin``: runs/min and cached share.
5. ``fanout``: 16 sub-agents spawned together vs one after another, through
   luftpause and through the router.

The floor: one interactive agent alone on an idle engine, a few runs per
context size; each arm's p50 is divided by it ("slowdown").

Time: the engines, the fake tools and the scheduler's probe period all run
``--time-scale`` times faster than real time; every time and rate in the report
is converted back to the engine model's time (seconds × scale, runs/min ÷ scale)
so quick and full runs read alike. The engine model's calibration is untouched.

Where a turn's time went: own-loop arms report it per class from the loadgen
(held in luftpause, engine queue, prefill, decode); sub-agent arms report the
engine's side from ``/debug/state`` (all classes together) and luftpause's held
time per class from the dataplane's ``/metrics``.

This machine's cores are shared by every process (engines, proxy, router,
load generator); the report records the load average of every arm.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from luftpause.loadgen import main as loadgen
from luftpause.loadgen.progress import ArmClock
from luftpause.procs import (
    RouterProcess,
    ServiceProcess,
    launch,
    launch_sglang_router,
    stop_all,
)

MODEL = "llama-3.2-1b"
ROOT = Path(__file__).resolve().parents[2]
INTERACTIVE_AGENTS = 4
PRIORITY = "interactive=10,batch=0"
TOOL_CALLS = 3  # the router drops x-fake-tool-results, so every arm uses the engines' default


# ------------------------------------------------------------------ settings


@dataclass(frozen=True)
class Plan:
    time_scale: float
    reps: int
    loads: tuple[int, ...]
    mcp_loads: tuple[int, ...]
    warmup_s: float  # model seconds
    window_s: float  # model seconds
    light_window_s: float
    routing_window_s: float
    floor_runs: int
    fanout_n: int = 16
    routing_agents: int = 8
    light_batch: int = 24
    chunk_tokens: int = 8
    ramp: bool = True  # False: a flood from idle, every agent starting at once

    def real(self, model_s: float) -> float:
        return model_s / self.time_scale

    def warmup_for(self, load: int) -> float:
        """Model seconds of warm-up: at least one saturated run's length (~0.9 s per agent
        at 48, less above). The agents start spread over its first half (``ramp_for``),
        so the first runs do not all finish together inside the window."""
        return max(self.warmup_s, 1.0 * load)

    def ramp_for(self, load: int) -> float:
        return self.warmup_for(load) / 2 if self.ramp else 0.0

    def window_for(self, load: int) -> float:
        """Model seconds measured: at least about two saturated run lengths."""
        return max(self.window_s, 1.5 * load)


QUICK = Plan(
    time_scale=5.0,
    reps=1,
    loads=(48, 144),
    mcp_loads=(48,),
    warmup_s=25.0,
    window_s=90.0,
    light_window_s=50.0,
    routing_window_s=50.0,
    floor_runs=4,
)
FULL = Plan(
    time_scale=1.0,
    reps=2,
    loads=(24, 48, 96, 144),
    mcp_loads=(24, 48, 96, 144),
    warmup_s=60.0,
    window_s=180.0,
    light_window_s=120.0,
    routing_window_s=120.0,
    floor_runs=6,
)
BENCHES = ("own", "light", "mcp", "routing", "fanout")


# ------------------------------------------------------------------ the stack


@dataclass
class Stack:
    tmp: Path
    plan: Plan
    services: list[ServiceProcess] = field(default_factory=list)
    routers: dict[str, RouterProcess] = field(default_factory=dict)
    engines: list[str] = field(default_factory=list)
    tools_url: str = ""
    dataplane: str = ""
    dataplane_no_pk: str = ""  # a second scheduler and dataplane without prefix keeping
    runtimes: dict[str, str] = field(default_factory=dict)  # arm -> /mcp URL

    def start(self, *args: str, name: str) -> ServiceProcess:
        n = len(self.services)
        svc = launch(
            args,
            name=name,
            ready_file=self.tmp / f"{n}-{name}.ready",
            stderr=self.tmp / f"{n}-{name}.log",
        )
        self.services.append(svc)
        svc.wait_ready(60)
        return svc

    def stop(self) -> None:
        for r in self.routers.values():
            r.stop()
        stop_all(self.services)


def _config(path: Path, stack: Stack, probe_s: float, keep_prefixes: bool = True) -> Path:
    text = (
        f"[scheduler]\nprobe_period_s = {probe_s:g}\n"
        f"keep_prefixes = {str(keep_prefixes).lower()}\n"
        "[dataplane]\nreport_reconnect_s = 0.2\n"
    )
    for i, url in enumerate(stack.engines):
        text += (
            f'[[endpoints]]\nname = "engine-{"ab"[i]}"\nurl = "{url}"\nmodels = ["{MODEL}"]\n'
            'metrics = "sglang"\n'
            # The engines run --priority-scheduling (higher first), as in every arm.
            "class_priority = { interactive = 10, batch = 0 }\n"
        )
    path.write_text(text)
    return path


def _luftpause(s: Stack, config: Path, name: str) -> str:
    """A scheduler and a dataplane on ``config``; the dataplane's URL."""
    sched = s.start(
        "scheduler", "--config", str(config), "--port", "0", "--http-port", "0",
        "--log-level", "WARNING", name=f"scheduler{name}",
    )  # fmt: skip
    dp = s.start(
        "dataplane", "--config", str(config), "--port", "0",
        "--scheduler", f"127.0.0.1:{sched.ports['grpc']}", "--log-level", "WARNING",
        name=f"dataplane{name}",
    )  # fmt: skip
    return dp.urls["http"]


def start_stack(plan: Plan, tmp: Path, benches: set[str], ablate: bool = False) -> Stack:
    s = Stack(tmp, plan)
    ts = f"{plan.time_scale:g}"
    for name in ("engine-a", "engine-b"):
        svc = s.start(
            "fake-engine", "--name", name, "--port", "0", "--time-scale", ts,
            "--priority-scheduling", "--chunk-tokens", str(plan.chunk_tokens),
            "--tool-results", str(TOOL_CALLS), "--log-level", "WARNING",
            name=name,
        )  # fmt: skip
        s.engines.append(svc.urls["http"])
    tools = s.start(
        "fake-mcp", "--port", "0", "--time-scale", ts, "--log-level", "WARNING", name="fake-mcp"
    )
    s.tools_url = f"{tools.urls['http']}/mcp"
    # The scheduler's probe period scales with the engines (2 s of model time).
    probe_s = max(0.05, 2.0 / plan.time_scale)
    s.dataplane = _luftpause(s, _config(tmp / "stack.toml", s, probe_s), "")
    if ablate:
        config = _config(tmp / "stack-no-pk.toml", s, probe_s, keep_prefixes=False)
        s.dataplane_no_pk = _luftpause(s, config, "-no-pk")
    s.routers["cache_aware"] = launch_sglang_router(
        s.engines, "cache_aware", tmp / "router-cache_aware.log", MODEL
    )
    if "routing" in benches:
        s.routers["round_robin"] = launch_sglang_router(
            s.engines, "round_robin", tmp / "router-round_robin.log", MODEL
        )
    if benches & {"mcp", "routing", "fanout"}:
        if not runtime_available():
            print("runtime not installed: skipping mcp, routing and fanout", file=sys.stderr)
        else:
            upstreams = {"luftpause": s.dataplane, "router": s.routers["cache_aware"].url}
            if "round_robin" in s.routers:
                upstreams["router-rr"] = s.routers["round_robin"].url
            for arm, url in upstreams.items():
                cfg = tmp / f"runtime-{arm}.toml"
                cfg.write_text(
                    f'[runtime]\ndataplane_url = "{url}"\nstate_dir = "{tmp / ("state-" + arm)}"\n'
                    f'default_model = "{MODEL}"\n'
                    f'[[runtime.tool_servers]]\nname = "fake"\nurl = "{s.tools_url}"\n'
                )
                rt = s.start(
                    "runtime", "--config", str(cfg), "--port", "0", "--log-level", "WARNING",
                    name=f"runtime-{arm}",
                )  # fmt: skip
                s.runtimes[arm] = f"{rt.urls['http']}/mcp"
    return s


def runtime_available() -> bool:
    return (ROOT / "src/luftpause/runtime/main.py").exists()


# ------------------------------------------------------------------ observation


def wait_idle(stack: Stack, timeout_s: float = 120.0) -> None:
    """Until both engines run and queue nothing (the previous arm's requests are gone)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5) as c:
        while time.monotonic() < deadline:
            busy = 0
            for url in stack.engines:
                load = c.get(f"{url}/get_load").json()
                busy += sum(int(x.get("num_reqs", 0)) for x in load)
            if busy == 0:
                return
            time.sleep(0.2)
    print("warning: engines still busy after the idle wait", file=sys.stderr)


# Step counters every fake engine keeps (``/debug/state``): model seconds busy, seconds
# steps started late, model seconds of prefill, decode steps and their summed batch size.
COUNTERS = ("busy_s", "late_s", "prefill_s", "decode_steps", "decode_seqs")


class EngineWatch:
    """Collects every request the engines finish (``/debug/state`` recent) while it runs."""

    def __init__(self, engines: list[str], period_s: float = 0.25) -> None:
        self.engines = engines
        self.period_s = period_s
        self.seen: dict[str, dict[str, Any]] = {}
        self.before: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start = dict.fromkeys(COUNTERS, 0.0)
        self.counters = dict.fromkeys(COUNTERS, 0.0)  # the engines' step counters over the arm

    def _poll(self, c: httpx.Client) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The engines' recently finished requests, and their step counters summed."""
        rows: list[dict[str, Any]] = []
        counters = dict.fromkeys(COUNTERS, 0.0)
        for url in self.engines:
            try:
                state = c.get(f"{url}/debug/state").json()
            except (httpx.HTTPError, ValueError):
                continue
            rows.extend(state.get("recent", []))
            for k in COUNTERS:
                counters[k] += float(state.get(k, 0.0))
        return rows, counters

    def _run(self) -> None:
        with httpx.Client(timeout=5) as c:
            while not self._stop.is_set():
                for r in self._poll(c)[0]:
                    if r["request_id"] not in self.before:
                        self.seen.setdefault(r["request_id"], r)
                self._stop.wait(self.period_s)

    def __enter__(self) -> EngineWatch:
        # The engines' recent list still holds earlier arms' requests: not this arm's.
        with httpx.Client(timeout=5) as c:
            rows, self._start = self._poll(c)
        self.before = {r["request_id"] for r in rows}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with httpx.Client(timeout=5) as c:
            _, end = self._poll(c)
        self.counters = {k: end[k] - self._start[k] for k in COUNTERS}

    def summary(self, scale: float) -> dict[str, Any]:
        rows = list(self.seen.values())
        prompt = sum(int(r["prompt_tokens"]) for r in rows)
        cached = sum(int(r["cached_tokens"]) for r in rows)

        c = self.counters
        busy, late = c["busy_s"], c["late_s"]

        def mean(key: str) -> float | None:
            vals = [float(r["timing"][key]) * scale for r in rows]
            return statistics.fmean(vals) if vals else None

        return {
            "requests": len(rows),
            "cached_share": cached / prompt if prompt else None,
            "queued_s": mean("queued_s"),
            "prefill_s": mean("prefill_s"),
            "decode_s": mean("decode_s"),
            # The share of the engines' busy wall time lost to steps starting late (the
            # host's CPU could not keep up with the model): 0 when the model ran exactly.
            "behind": late / (busy + late) if busy else None,
            "prefill_share": c["prefill_s"] / busy if busy else None,
            "decode_batch": c["decode_seqs"] / c["decode_steps"] if c["decode_steps"] else None,
        }


def held_totals(dataplane: str) -> dict[str, tuple[float, float]]:
    """Per class: (sum of held seconds, turns) from the dataplane's histogram."""
    text = httpx.get(f"{dataplane}/metrics", timeout=5).text
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for suffix, idx in (("_sum", 0), ("_count", 1)):
            head = f"luftpause_dataplane_held_seconds{suffix}{{"
            if line.startswith(head):
                cls = line.split('service_class="', 1)[1].split('"', 1)[0]
                out.setdefault(cls, [0.0, 0.0])[idx] = float(line.split()[-1])
    return {k: (v[0], v[1]) for k, v in out.items()}


@contextmanager
def held_delta(dataplane: str, into: dict[str, Any]) -> Iterator[None]:
    before = held_totals(dataplane)
    yield
    after = held_totals(dataplane)
    for cls, (s, n) in after.items():
        s0, n0 = before.get(cls, (0.0, 0.0))
        if n - n0 > 0:
            into[cls] = {"turns": n - n0, "held_s": (s - s0) / (n - n0)}


# ------------------------------------------------------------------ running arms


@dataclass
class Arm:
    bench: str
    name: str
    load: int
    argv: list[str]
    kind: str = "agents"  # or "subagents"
    fan: bool = False
    dataplane: str = ""  # the luftpause dataplane it goes through, if any (held times)


def run_loadgen(stack: Stack, arm: Arm, rep: int, out: Path) -> dict[str, Any]:
    """One arm: ``luftpause loadgen`` with the arm's flags, run in this process (the same
    code as the command; saves a start-up per arm)."""
    plan = stack.plan
    path = out / f"{arm.bench}-{arm.load}-{arm.name}-{rep}.json"
    seed = f"{arm.bench}{arm.load}{arm.name}{rep}".replace("-", "")
    argv = [
        *arm.argv, "--json", str(path), "--quiet", "--seed", seed,
        "--label", f"{arm.bench}/{arm.name}/{arm.load}/{rep}",
    ]  # fmt: skip
    parser = argparse.ArgumentParser(prog="luftpause loadgen")
    loadgen.add_arguments(parser)
    held: dict[str, Any] = {}
    wait_idle(stack)
    t0 = time.monotonic()
    with (
        EngineWatch(stack.engines) as watch,
        held_delta(arm.dataplane or stack.dataplane, held),
        contextlib.redirect_stdout(io.StringIO()) as table,
    ):
        rc = loadgen.main(parser.parse_args(argv))
    elapsed = time.monotonic() - t0
    if rc not in (0, 3) or not path.exists():
        raise RuntimeError(
            f"loadgen failed for {arm.bench}/{arm.name}/{arm.load} (rc {rc}):\n"
            f"{table.getvalue()[-3000:]}"
        )
    result = dict(json.loads(path.read_text()))
    result["engine_side"] = watch.summary(plan.time_scale)
    result["held_by_class"] = held
    result["wall_s"] = elapsed
    print(
        f"  {arm.bench:8} load {arm.load:3} {arm.name:12} rep {rep}: "
        + "; ".join(
            f"{c} {s['runs']} runs, {s['runs_per_min'] / plan.time_scale:.1f}/min, "
            f"p50 {(s['run_s']['p50'] or 0) * plan.time_scale:.1f} s"
            for c, s in result["classes"].items()
        )
        + (f"; errors {result['errors']}" if result["error_count"] else "")
        + f" (load avg {result['load_avg'][0]})",
        file=sys.stderr,
        flush=True,
    )
    return result


def own_arms(stack: Stack, bench: str, load: int, context: int) -> list[Arm]:
    plan = stack.plan
    window = plan.light_window_s if bench == "light" else plan.window_for(load)
    common = [
        "--tools-url", stack.tools_url, "--context-chars", str(context),
        "--tool-calls", str(TOOL_CALLS), "--group", f"{load}:batch:crowd",
        "--group", f"{INTERACTIVE_AGENTS}:interactive:people",
        "--warmup-s", f"{plan.real(plan.warmup_for(load)):g}",
        "--ramp-s", f"{plan.real(plan.ramp_for(load)):g}",
        "--duration-s", f"{plan.real(window):g}",
    ]  # fmt: skip
    router = stack.routers["cache_aware"].url
    engines = ",".join(stack.engines)
    ablation = (
        [
            Arm(
                bench,
                "luftpause-no-pk",
                load,
                ["--target", stack.dataplane_no_pk, *common],
                dataplane=stack.dataplane_no_pk,
            )
        ]
        if stack.dataplane_no_pk
        else []
    )
    return [
        Arm(bench, "router", load, ["--target", router, "--no-class-headers", *common]),
        Arm(bench, "luftpause", load, ["--target", stack.dataplane, *common]),
        *ablation,
        Arm(
            bench,
            "engine-prio",
            load,
            ["--target", engines, "--no-class-headers", "--priority", PRIORITY, *common],
        ),
    ]


def mcp_arms(stack: Stack, load: int, context: int) -> list[Arm]:
    plan = stack.plan
    common = [
        "--context-chars", str(context), "--group", f"{load}:batch:crowd:subagents",
        "--group", f"{INTERACTIVE_AGENTS}:interactive:people:subagents",
        "--warmup-s", f"{plan.real(plan.warmup_for(load)):g}",
        "--ramp-s", f"{plan.real(plan.ramp_for(load)):g}",
        "--duration-s", f"{plan.real(plan.window_for(load)):g}",
    ]  # fmt: skip
    return [
        Arm("mcp", "router", load, ["--runtime", stack.runtimes["router"], *common], "subagents"),
        Arm(
            "mcp",
            "luftpause",
            load,
            ["--runtime", stack.runtimes["luftpause"], *common],
            "subagents",
        ),
    ]


def routing_arms(stack: Stack) -> list[Arm]:
    plan = stack.plan
    common = [
        "--context-chars", "8000", "--subagents", str(plan.routing_agents), "--class", "batch",
        "--warmup-s", f"{plan.real(plan.warmup_s / 2):g}",
        "--ramp-s", f"{plan.real(plan.warmup_s / 4):g}",
        "--duration-s", f"{plan.real(plan.routing_window_s):g}",
    ]  # fmt: skip
    return [
        Arm("routing", "luftpause", plan.routing_agents,
            ["--runtime", stack.runtimes["luftpause"], *common], "subagents"),
        Arm("routing", "router-cache", plan.routing_agents,
            ["--runtime", stack.runtimes["router"], *common], "subagents"),
        Arm("routing", "router-rr", plan.routing_agents,
            ["--runtime", stack.runtimes["router-rr"], *common], "subagents"),
    ]  # fmt: skip


def fanout_arms(stack: Stack) -> list[Arm]:
    n = str(stack.plan.fanout_n)
    out = []
    for name in ("luftpause", "router"):
        base = ["--runtime", stack.runtimes[name], "--spawn", n, "--context-chars", "11000"]
        out.append(Arm("fanout", name, int(n), base, "subagents", fan=True))
    # One after another, as the original measured it (through luftpause; on an idle pool the
    # path does not matter).
    base = ["--runtime", stack.runtimes["luftpause"], "--spawn", n, "--context-chars", "11000"]
    out.append(Arm("fanout", "sequential", int(n), [*base, "--sequential"], "subagents", fan=True))
    return out


def floor(stack: Stack, context: int, out: Path) -> dict[str, Any]:
    """One interactive agent alone on an idle engine: the run time nothing can beat."""
    plan = stack.plan
    arm = Arm(
        "floor",
        f"ctx{context}",
        1,
        [
            "--target", stack.engines[0], "--no-class-headers", "--agents", "1",
            "--class", "interactive", "--tools-url", stack.tools_url,
            "--context-chars", str(context), "--tool-calls", str(TOOL_CALLS),
            "--max-runs", str(plan.floor_runs), "--duration-s", f"{plan.real(600):g}",
        ],
    )  # fmt: skip
    return run_loadgen(stack, arm, 0, out)


# ------------------------------------------------------------------ report


def _m(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def _f(value: float | None, digits: int = 1, pct: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.0f}%" if pct else f"{value:.{digits}f}"


def aggregate(results: list[dict[str, Any]], cls: str, scale: float) -> dict[str, Any]:
    """Across repetitions: rates and times in model time."""
    rpm, rate, p50, p95, cached = [], [], [], [], []
    parts: dict[str, list[float]] = {
        k: [] for k in ("held_s", "queued_s", "prefill_s", "decode_s", "other_s")
    }
    errors = 0
    for r in results:
        s = r["classes"].get(cls)
        if s is None:
            continue
        rpm.append(s["runs_per_min"] / scale)
        if s.get("runs_per_min_closed") is not None:
            rate.append(s["runs_per_min_closed"] / scale)
        if s["run_s"]["p50"] is not None:
            p50.append(s["run_s"]["p50"] * scale)
            p95.append(s["run_s"]["p95"] * scale)
        if s["cached_share"] is not None:
            cached.append(s["cached_share"])
        errors += s["error_count"]
        turn = s["turn"]
        for k in parts:
            if turn.get(k) is not None:
                parts[k].append(turn[k] * scale)
            elif k == "held_s" and cls in r.get("held_by_class", {}):
                parts[k].append(r["held_by_class"][cls]["held_s"] * scale)
        if not turn["turns"]:  # sub-agents: the engine's side, all classes together
            e = r["engine_side"]
            for k in ("queued_s", "prefill_s", "decode_s"):
                if e.get(k) is not None:
                    parts[k].append(e[k])
            if e.get("cached_share") is not None and not s["cached_share"]:
                cached.append(e["cached_share"])
    return {
        "rpm": rpm,
        "rate": rate,
        "p50": p50,
        "p95": p95,
        "cached": _m(cached),
        "errors": errors,
        "runs": sum(r["classes"].get(cls, {}).get("runs", 0) for r in results),
        **{k: _m(v) for k, v in parts.items()},
    }


def arm_table(
    rows: list[tuple[str, list[dict[str, Any]]]], scale: float, floor_s: float | None
) -> list[str]:
    lines = [
        "| arm | class | runs | runs/min | agents×60/mean | p50 s | p95 s | p50 / floor | "
        "cached | held s | queued s | prefill s | decode s | other s | errors | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, results in rows:
        loads = [r["load_avg"][0] for r in results]
        for cls in ("interactive", "batch"):
            a = aggregate(results, cls, scale)
            if not a["rpm"]:
                continue
            p50 = _m(a["p50"])
            slow = (p50 / floor_s) if (p50 is not None and floor_s) else None
            lines.append(
                f"| {name} | {cls} | {a['runs']} | {_spread(a['rpm'])} | {_spread(a['rate'])} | "
                f"{_spread(a['p50'])} | "
                f"{_spread(a['p95'])} | {_f(slow, 2)} | {_f(a['cached'], pct=True)} | "
                f"{_f(a['held_s'], 2)} | {_f(a['queued_s'], 2)} | {_f(a['prefill_s'], 2)} | "
                f"{_f(a['decode_s'], 2)} | {_f(a['other_s'], 2)} | {a['errors']} | "
                f"{_spread(loads)} |"
            )
    return lines


def rate(result: dict[str, Any], cls: str) -> float:
    """A closed loop's runs/min: agents × 60 / mean run time where known (it does not
    carry the window's rounding of up to one run per agent), else the count."""
    s = result["classes"][cls]
    closed = s.get("runs_per_min_closed")
    return float(closed if closed is not None else s["runs_per_min"])


def ratio(results_a: list[dict[str, Any]], results_b: list[dict[str, Any]], cls: str) -> float:
    a = _m([rate(r, cls) for r in results_a if cls in r["classes"]])
    b = _m([rate(r, cls) for r in results_b if cls in r["classes"]])
    return (a / b) if a is not None and b else float("nan")


SATURATED_QUEUE_S = (
    2.0  # router arm: interactive engine-queue seconds per run that count as "seconds"
)


def goals_own(
    by_arm: dict[str, list[dict[str, Any]]], scale: float, target: float
) -> tuple[list[str], list[str], list[str]]:
    """Cells, missed goals and an explanation for one load point of a flood."""
    lp, ro = by_arm.get("luftpause", []), by_arm.get("router", [])
    inter = ratio(lp, ro, "interactive")
    batch = ratio(lp, ro, "batch")
    a_ro, a_lp = aggregate(ro, "interactive", scale), aggregate(lp, "interactive", scale)
    b_lp = aggregate(lp, "batch", scale)
    turns = _m([r["classes"]["interactive"]["turns_per_run"] or 0 for r in ro]) or 0.0
    router_queue = a_ro["queued_s"]
    per_run = (router_queue or 0.0) * turns
    saturated = per_run >= SATURATED_QUEUE_S
    cells = [f"{inter:.2f}×", f"{(batch - 1) * 100:+.0f} %", f"{per_run:.1f}"]
    verdicts = []
    if inter < 0.98:
        verdicts.append(f"interactive {inter:.2f}× < 0.98× the router")
    if inter < 1.1 and abs(batch - 1) > 0.05:
        verdicts.append(f"batch {(batch - 1) * 100:+.0f} % where the gain is < 1.1× (limit ±5 %)")
    elif batch < 0.9:
        verdicts.append(f"batch {(batch - 1) * 100:+.0f} % (limit −10 %)")
    if saturated and target > 1 and inter < target:
        verdicts.append(f"saturated (router queue {per_run:.1f} s/run): {inter:.2f}× < {target}×")
    if "engine-prio" in by_arm:
        vs_prio = ratio(lp, by_arm["engine-prio"], "interactive")
        cells.append(f"{vs_prio:.2f}×")
        if vs_prio < 0.98:
            verdicts.append(f"interactive {vs_prio:.2f}× the engine-priority arm (< 0.98×)")
    cells.append("met" if not verdicts else "**missed**: " + "; ".join(verdicts))

    def parts(a: dict[str, Any]) -> str:
        return ", ".join(
            f"{k.removesuffix('_s')} {a[k]:.2f}"
            for k in ("held_s", "queued_s", "prefill_s", "decode_s", "other_s")
            if a.get(k) is not None
        )

    why = [
        f"interactive turn (s): router {parts(a_ro)}; luftpause {parts(a_lp)}",
        f"batch turn through luftpause (s): {parts(b_lp)}",
    ]
    return cells, verdicts, why


def engine_lines(by_arm: dict[str, list[dict[str, Any]]], load: int) -> list[str]:
    """What the two engines did during each arm (all classes): the share of their busy
    time spent prefilling, their mean decode batch, the cached share of the prompt tokens
    they served, and how far the host's CPU let them fall behind the model."""
    parts = []
    for name, results in by_arm.items():
        sides = [r.get("engine_side", {}) for r in results]
        pre = _m([e["prefill_share"] for e in sides if e.get("prefill_share") is not None])
        batch = _m([e["decode_batch"] for e in sides if e.get("decode_batch") is not None])
        cached = _m([e["cached_share"] for e in sides if e.get("cached_share") is not None])
        behind = _m([e["behind"] for e in sides if e.get("behind") is not None])
        if pre is None:
            continue
        parts.append(
            f"{name} prefill {_f(pre, pct=True)} of busy time, decode batch {_f(batch)}, "
            f"cached {_f(cached, pct=True)}, behind {_f(behind, pct=True)}"
        )
    return [f"Engines at {load}: " + "; ".join(parts) + ".", ""] if parts else []


def code_version() -> str:
    """The checkout's commit, marked when files differ from it (what a report measured)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return ""
    return f"{head} (with uncommitted changes)" if head and dirty else head


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )


def report(
    plan: Plan,
    command: str,
    results: dict[str, dict[int, dict[str, list[dict[str, Any]]]]],
    floors: dict[int, float],
    started: str,
    minutes: float,
    load_before: tuple[float, ...],
    rendered: str = "",
    code: str = "",
) -> str:
    """The markdown report. ``rendered``: the ``--report-from`` command that re-rendered
    a saved run (the results are that run's; only the text around them is newer)."""
    sc = plan.time_scale
    header = [
        "# Benchmarks",
        "",
        "Measured by `tools/bench/flood.py` (generated file: rerun the command to refresh it).",
        "",
        f"- command: `{command}`",
        *(
            [f"- this file: re-rendered from that run's raw results by `{rendered}`"]
            if rendered
            else []
        ),
        "- full mode (not what this file shows unless the command above says so): "
        "`python tools/bench/flood.py` - time scale 1, loads 24/48/96/144 for both floods, "
        "2 repetitions, about 4 hours (estimated from the plan; never run here); "
        "`--quick` is time scale 5, loads 48 and 144 (MCP: 48), 1 repetition, under 10 minutes",
        f"- date: {started}; duration {minutes:.1f} min"
        + (f"; code: commit {code}" if code else ""),
        f"- machine: {machine()}; load average before the run "
        f"{' / '.join(f'{x:.2f}' for x in load_before)} (other work shares these cores: "
        "each table lists the 1-minute load average of its arms)",
        "- engines: two fake engines (`docs/calibration.md` defaults, `--priority-scheduling`; "
        "luftpause's endpoints declare it with `class_priority`, so the dataplane sends "
        "interactive turns priority 10 and batch 0, and the router arm sends none), "
        f"time scale {sc:g}: tools, engines and the scheduler's probe period run {sc:g}× faster "
        "than real time. **Every time and rate below is in the engine model's time** "
        f"(measured seconds × {sc:g}, runs/min ÷ {sc:g}).",
        "- luftpause arm: the scheduler's defaults (prefix keeping on); an arm "
        "`luftpause-no-pk`, where present (`--ablate-prefix-keeping`), is a second scheduler "
        "and dataplane with `keep_prefixes = false` on the same engines",
        f"- repetitions: {plan.reps} per arm and load point, arms alternated (each point's "
        "order reversed from one repetition to the next, and between neighbouring points); "
        "a cell with several repetitions shows mean (min–max)",
        f"- window: max({plan.window_s:g} s, 1.5 s × batch agents) measured after "
        f"max({plan.warmup_s:g} s, 1 s × batch agents) of warm-up (floods), the agents "
        + ("starting spread over its first half; " if plan.ramp else "all starting at once; ")
        + f"{plan.light_window_s:g} s (light), {plan.routing_window_s:g} s (routing); closed loop: "
        "a finished run is replaced at once; runs in flight at the end are not counted",
        f"- every run: system preamble + own task, {TOOL_CALLS} `lookup` calls (fake-mcp, "
        "~1 s each), replies capped at 256 tokens; interactive agents: "
        f"{INTERACTIVE_AGENTS}",
        "",
        "Columns: *runs/min* counts the runs that finished inside the window; "
        "*agents×60/mean* is the same closed loop's rate from its mean run time (Little's "
        "law), which does not carry the window's rounding of up to one run per agent - "
        "with 4 interactive agents that rounding alone is worth tens of percent, so **the "
        "goal ratios use agents×60/mean**. *p50 / floor* divides the arm's p50 run time by "
        "the same run alone on an idle engine; *held* is time a turn waited in luftpause, "
        "*queued* in the engine's waiting queue, *prefill*/*decode* the engine's work, "
        "*other* the rest of the turn's wall time "
        "(proxy, router, streaming, client, and CPU contention: the engines are Python "
        "processes on shared cores) - means per turn. Own-loop arms report "
        "these per class from the load generator; sub-agent arms report the engine's side for "
        "all classes together (`/debug/state`) and held time per class from the dataplane's "
        "metrics; their cached share is the engines' (all classes). *Engines at N* lines "
        "give, per arm, the share of the engines' busy time spent prefilling, their mean "
        "decode batch, the cached share of all prompt tokens they served, and *behind*: "
        "the share of wall time their steps started late because the host's CPU was busy "
        "(0 % = the model ran exactly on time).",
        "",
    ]
    out: list[str] = []
    if floors:
        out += ["## Floor (one interactive agent alone on an idle engine)", ""]
        out += ["| context chars | p50 run s |", "|---|---|"]
        out += [f"| {c} | {v:.1f} |" for c, v in sorted(floors.items())]
        out.append("")
    titles = {
        "own": ("1. Own-loop flood", 2.0, 8000),
        "mcp": ("2. MCP flood (sub-agents through the runtime)", 2.7, 8000),
        "light": ("3. Light load (2,000-character contexts)", 0.0, 2000),
        "routing": ("4. Routing only (8 sub-agents, no saturation)", 0.0, 8000),
        "fanout": ("5. Fan-out (16 sub-agents)", 0.0, 11000),
    }
    summary: list[str] = []
    for bench, (title, target, ctx) in titles.items():
        if bench not in results:
            continue
        out += [f"## {title}", ""]
        per_load = results[bench]
        if bench in ("own", "mcp", "light"):
            goal_rows = []
            for load, by_arm in sorted(per_load.items()):
                out += [f"### {load} batch + {INTERACTIVE_AGENTS} interactive", ""]
                out += arm_table(list(by_arm.items()), sc, floors.get(ctx))
                out.append("")
                cells, verdicts, why = goals_own(by_arm, sc, target)
                goal_rows.append(f"| {load} | " + " | ".join(cells) + " |")
                out += [f"Where the time went at {load}: " + "; ".join(why) + ".", ""]
                out += engine_lines(by_arm, load)
                summary.append(
                    f"- {bench} {load}: "
                    + ("met" if not verdicts else "missed (" + "; ".join(verdicts) + ")")
                )
            head = (
                "| batch agents | interactive luftpause/router | batch luftpause vs router "
                "| router interactive engine-queue s per run |"
            )
            sep = "|---|---|---|---|"
            if any("engine-prio" in v for v in per_load.values()):
                head += " interactive luftpause/engine-prio |"
                sep += "---|"
            out += ["Goals:", "", head + " verdict |", sep + "---|", *goal_rows, ""]
        elif bench == "routing":
            by_arm = per_load[plan.routing_agents]
            out += arm_table(list(by_arm.items()), sc, floors.get(ctx))
            aff = aggregate(by_arm.get("luftpause", []), "batch", sc)["cached"]
            ca = aggregate(by_arm.get("router-cache", []), "batch", sc)["cached"]
            ok = aff is not None and ca is not None and aff >= ca - 0.005
            line = (
                f"Affinity's cached share {_f(aff, pct=True)} vs router cache_aware "
                f"{_f(ca, pct=True)}: {'met' if ok else '**missed**'}."
            )
            out += ["", line, ""]
            summary.append(f"- routing: {'met' if ok else 'missed'} ({line})")
        elif bench == "fanout":
            out += [
                "| arm | wall s (all 16) | vs sequential | per sub-agent p50 s | p95 s | failed |",
                "|---|---|---|---|---|---|",
            ]
            by_arm = per_load[plan.fanout_n]
            seq = [r["fan_out"] for r in by_arm.get("sequential", [])]
            ws = _m([f["wall_s"] * sc for f in seq])
            for name in ("luftpause", "router", "sequential"):
                rows = [r["fan_out"] for r in by_arm.get(name, [])]
                if not rows:
                    continue
                w = _m([f["wall_s"] * sc for f in rows])
                gain = (ws / w) if (ws and w) else None
                label = "one after another" if name == "sequential" else f"{name}, all together"
                out.append(
                    f"| {label} | {_spread([f['wall_s'] * sc for f in rows])} | "
                    + ("—" if name == "sequential" else f"{_f(gain)}×")
                    + f" | {_f(_m([(f['subagent_s']['p50'] or 0) * sc for f in rows]))} | "
                    f"{_f(_m([(f['subagent_s']['p95'] or 0) * sc for f in rows]))} | "
                    f"{sum(f['failed'] for f in rows)} |"
                )
                if name != "sequential":
                    ok = gain is not None and gain >= 5
                    summary.append(
                        f"- fan-out via {name}: {_f(gain)}× sequential "
                        f"({'met' if ok else 'missed'}: goal ≥ 5×)"
                    )
            out.append("")
    return "\n".join([*header, "## Goals at a glance", "", *summary, "", *out]) + "\n"


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="time-scaled, fewer points (<10 min)")
    parser.add_argument(
        "--benches", default=",".join(BENCHES), help=f"comma list of {', '.join(BENCHES)}"
    )
    parser.add_argument("--reps", type=int, help="repetitions per arm and load point")
    parser.add_argument("--loads", help="batch agents per load point, e.g. 24,48,96,144")
    parser.add_argument("--time-scale", type=float, help="engine/tool speed-up")
    parser.add_argument("--window-s", type=float, help="measured window, model seconds")
    parser.add_argument("--warmup-s", type=float, help="warm-up, model seconds")
    parser.add_argument(
        "--no-ramp",
        action="store_true",
        help="floods from idle: every agent starts at once instead of over the warm-up's "
        "first half",
    )
    parser.add_argument(
        "--ablate-prefix-keeping",
        action="store_true",
        help="floods also run a luftpause arm with keep_prefixes = false (luftpause-no-pk)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs/benchmarks.md")
    parser.add_argument("--json", type=Path, help="also write every raw result here")
    parser.add_argument(
        "--report-from", type=Path, metavar="JSON", help="only re-render a --json file's report"
    )
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.reps:
        overrides["reps"] = args.reps
    if args.loads:
        loads = tuple(int(x) for x in args.loads.split(","))
        overrides["loads"] = loads
        overrides["mcp_loads"] = loads
    if args.time_scale:
        overrides["time_scale"] = args.time_scale
    if args.window_s:
        overrides["window_s"] = args.window_s
    if args.warmup_s is not None:
        overrides["warmup_s"] = args.warmup_s
    if args.no_ramp:
        overrides["ramp"] = False
    if overrides:
        from dataclasses import replace

        plan = replace(plan, **overrides)
    if args.report_from:
        saved = json.loads(args.report_from.read_text())
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in saved["plan"].items()
        }
        plan = Plan(**fields)
        res = {b: {int(n): arms for n, arms in per.items()} for b, per in saved["results"].items()}
        text = report(
            plan,
            saved["command"],
            res,
            {int(k): v for k, v in saved["floors"].items()},
            saved["started"],
            saved["minutes"],
            tuple(saved["load_before"]),
            rendered="python tools/bench/flood.py " + " ".join(sys.argv[1:]),
            code=saved.get("code", ""),
        )
        args.out.write_text(text)
        print(text)
        return 0
    benches = {b.strip() for b in args.benches.split(",") if b.strip()}
    unknown = benches - set(BENCHES)
    if unknown:
        parser.error(f"unknown bench(es): {', '.join(sorted(unknown))}")
    command = "python tools/bench/flood.py " + " ".join(sys.argv[1:])
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    code = code_version()
    load_before = os.getloadavg()
    t0 = time.monotonic()
    results: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = {}
    floors: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="luftpause-flood-") as tmp_name:
        tmp = Path(tmp_name)
        out = tmp / "results"
        out.mkdir()
        print(f"starting the stack (logs in {tmp})", file=sys.stderr)
        stack = start_stack(plan, tmp, benches, ablate=args.ablate_prefix_keeping)
        try:
            contexts = sorted(
                {8000 for b in benches if b in ("own", "mcp", "routing")}
                | ({2000} if "light" in benches else set())
            )
            for ctx in contexts:
                f = floor(stack, ctx, out)
                floors[ctx] = f["classes"]["interactive"]["run_s"]["p50"] * plan.time_scale
            schedule: list[tuple[str, int, list[Arm]]] = []
            if "own" in benches:
                schedule += [("own", n, own_arms(stack, "own", n, 8000)) for n in plan.loads]
            if "light" in benches:
                schedule.append(
                    ("light", plan.light_batch, own_arms(stack, "light", plan.light_batch, 2000))
                )
            if stack.runtimes:
                if "mcp" in benches:
                    schedule += [("mcp", n, mcp_arms(stack, n, 8000)) for n in plan.mcp_loads]
                if "routing" in benches:
                    schedule.append(("routing", plan.routing_agents, routing_arms(stack)))
                if "fanout" in benches:
                    schedule.append(("fanout", plan.fanout_n, fanout_arms(stack)))
            clock = ArmClock(plan.reps * sum(len(arms) for _, _, arms in schedule))
            for rep in range(plan.reps):
                for index, (bench, load, arms) in enumerate(schedule):
                    # Each point's order flips from one repetition to the next (and
                    # between neighbouring points), whatever the schedule's length.
                    order = arms if (rep + index) % 2 == 0 else list(reversed(arms))
                    for arm in order:
                        print(
                            f"[{clock.start()}] {arm.bench} load {arm.load} {arm.name} rep {rep}",
                            file=sys.stderr,
                            flush=True,
                        )
                        r = run_loadgen(stack, arm, rep, out)
                        clock.finished()
                        results.setdefault(bench, {}).setdefault(load, {}).setdefault(
                            arm.name, []
                        ).append(r)
                # Keep the arms' display order stable whatever order they ran in.
                for bench, load, arms in schedule:
                    by = results.get(bench, {}).get(load, {})
                    results[bench][load] = {a.name: by[a.name] for a in arms if a.name in by}
        finally:
            stack.stop()
    minutes = (time.monotonic() - t0) / 60
    if args.json:
        saved = {
            "plan": plan.__dict__,
            "results": results,
            "floors": floors,
            "command": command,
            "started": started,
            "minutes": minutes,
            "load_before": list(load_before),
            "code": code,
        }
        args.json.write_text(json.dumps(saved, indent=1))
    text = report(plan, command, results, floors, started, minutes, load_before, code=code)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
