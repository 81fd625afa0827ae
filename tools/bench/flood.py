"""Side-by-side benchmarks of luftpause against the SGLang Model Gateway, the SGLang router,
vLLM's router and engine priority (H4).

    python tools/bench/flood.py --quick      # time-scaled engines, fewer points: ~11 min
    python tools/bench/flood.py              # full: every load point, 2 repetitions (~4.5 h)
    python tools/bench/flood.py --benches own,light --reps 1 --time-scale 4
    python tools/bench/flood.py --benches own --reps 3 --time-scale 5 \\
        --smg-caps 8,16,24,32 --smg-fifo-caps 16,32 \\
        --plot docs/benchmarks/results/YYYY-MM-DD-flood-smg.svg
    python tools/bench/flood.py --quick --benches own --loads 24 --vllm-router \\
        --arms luftpause,vllm-router,vllm-prog,vllm-prog-kv

Every arm runs on the same two fake engines (``--priority-scheduling`` on, as in
the original testbed), in one run, arms alternated and repeated:

1. ``own``: own-loop flood - 4 interactive agents beside N batch agents,
   ~8,000-character contexts, 3 tool calls per run; arms (a) ``router``: the
   SGLang router (``cache_aware``), no class headers; (b) ``luftpause``: the
   dataplane, class headers set; (c) ``engine-prio``: straight to the engines,
   agent *i* pinned to engine *i* mod 2, ``priority`` in the body (interactive
   10, batch 0); (d) ``smg``: the SGLang Model Gateway (PyPI ``smg``) with its
   priority scheduler, ``x-smg-priority`` interactive/bulk, sticky sessions keyed by
   the run ID and the same body priorities; with ``--smg-caps`` also ``smg-capC``
   (that scheduler given C slots) and with ``--smg-fifo-caps`` ``smg-fifoC`` (SMG's
   FIFO ``--max-concurrent-requests C``): SMG's frontier beside luftpause's point
   (``--plot``); with ``--vllm-router`` also vLLM's router (PyPI ``vllm-router``) in
   front of two more fake engines serving vLLM's metric names (``--metrics vllm``):
   ``vllm-router`` plain, ``vllm-prog`` with its program scheduling (a run is a
   program, named by the run ID in the body's ``vllm_xargs.agentic_context``, sent by
   ``luftpause loadgen --program-context xargs``), ``vllm-prog-kv`` the same with
   ``token_capacity_per_target`` set to the engines' KV pool; each arm's final
   ``/scheduling/diagnostics`` is kept in the JSON. A load sweep over N.
2. ``mcp``: the same mix as sub-agents through the runtime; arms: runtime →
   router, runtime → dataplane, and runtime → SMG (the runtime sending each turn as
   the own-loop ``smg`` arm's load generator does: ``runtime.class_headers``,
   ``run_id_headers`` and ``class_priority``); same sweep.
3. ``light``: ~2,000-character contexts, 24 batch + 4 interactive, the own-loop
   arms (SMG without the capacity sweeps; vLLM's router with ``--vllm-router``): they
   should tie.
4. ``routing``: 8 concurrent sub-agents (no saturation): luftpause affinity vs
   router ``cache_aware`` vs router ``round_robin``: runs/min and cached share.
5. ``fanout``: 16 sub-agents spawned together vs one after another, through
   luftpause and through the router.
6. ``coding``: runs shaped like real coding-agent traces (``--profile coding-agent``,
   docs/guides/workloads.md: ~30 turns, contexts growing to tens of thousands of tokens,
   tool gaps of ~5 s with a heavy tail, parallel sub-agents), 2 interactive agents
   beside N batch agents, the own-loop arms with SMG's priority scheduler. Its runs
   outlast any window a flood can afford, so it is judged by the turns that ended in
   the window: interactive turn p50/p95 and batch reply tokens per minute. Its engines
   need a long context (``--context-length 131072 --kv-tokens 1000000``), so it runs
   alone (``--benches coding``).

``--arms NAME,...`` keeps only the named arms at every point (e.g. luftpause and the
vLLM router arms).

Statistics: with ``--reps N`` every cell is a mean ± the half-width of its 95 %
confidence interval (Student's t); ratios between arms are per repetition. Each
point's arm order is a row of a Williams Latin square (a new row every repetition).
The report names the commit it measured and whether the working tree differed.

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

The report is written to ``docs/benchmarks/results/YYYY-MM-DD-flood.md`` unless ``--out``
says otherwise (that day's UTC date; rename it to say what it measured and list it in
``docs/benchmarks/archive.md``). It states what is particular to the run (command, commit,
date, machine, load, engines, time scale, every arm's command line) and links
``docs/benchmarks/methodology.md`` for the rest: arms, repetitions, intervals, window and
columns are explained there once.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from luftpause.cliargs import positive_float
from luftpause.loadgen import main as loadgen
from luftpause.measure.progress import ArmClock
from luftpause.procs import (
    RouterProcess,
    ServiceProcess,
    launch,
    launch_sglang_router,
    launch_smg,
    launch_vllm_router,
    stop_all,
)
from luftpause.scheduler.core import Params
from luftpause.sim.arms import SMG_STARVATION_S
from luftpause.sim.run import slowdown_arm

MODEL = "llama-3.2-1b"
ROOT = Path(__file__).resolve().parents[2]
INTERACTIVE_AGENTS = 4
PRIORITY = "interactive=10,batch=0"
TOOL_CALLS = 3  # the router drops x-fake-tool-results, so every arm uses the engines' default

# The SGLang Model Gateway (PyPI smg 1.13.0) arms. Interactive turns ask for SMG's
# `interactive` class, batch turns for `bulk` (its class for background and batch jobs:
# the lowest, with the deepest queue; `default` is what unlabelled traffic gets).
SMG_PRIORITY = "interactive=interactive,batch=bulk"
SMG_KEY_HEADER = "x-smg-routing-key"  # the run ID: sticky sessions keep a run on one engine
# Slots the priority scheduler reserves for `interactive`: one per interactive agent, so an
# interactive turn never waits in SMG (and never has to preempt a batch turn). SMG's own
# default (128 slots, or 25 % of capacity) exceeds the small capacities swept here.
SMG_INTERACTIVE_RESERVED = INTERACTIVE_AGENTS
SMG_QUEUE_TIMEOUT_S = 1800.0  # model seconds: no turn fails for waiting in SMG's queues
# SMG's --load-monitor-interval default (10 s), in model seconds like its other times: how
# often it reads each engine's running and waiting requests and KV usage, which its
# cache_aware policy scores a run's first turn by. Left at 10 real seconds, a flood at
# time scale 5 gave it a picture 50 model seconds old: with 36 slots over both engines at
# 48 batch agents that cost SMG about a fifth of its batch runs (docs/benchmarks/fidelity.md).
SMG_LOAD_POLL_S = 10.0
# SMG's built-in starvation thresholds are SMG_STARVATION_S (model seconds; one table
# with the simulator's SMG arms, luftpause.sim.arms).
SMG_QUEUE_SIZE = {"system": 64, "interactive": 256, "default": 512, "bulk": 1024}
SMG_COMMON_FLAGS = (
    "--sticky-sessions", "--routing-key-headers", SMG_KEY_HEADER,
    # A saturated engine sits at KV usage ~0.98, above the default 0.8 veto, which then
    # drops sticky pins (measured): off, as an operator running agents would set it.
    "--disable-worker-overload-protection",
)  # fmt: skip

# vLLM's router (PyPI vllm-router 0.1.17) arms. They run on two more fake engines, the same
# as the others' but serving vLLM's metric names: its program scheduling reads
# vllm:kv_cache_usage_perc and vllm:num_requests_running/_waiting from each engine's /metrics.
VLLM_ENGINE_ARGS = ("--metrics", "vllm")
VLLM_POLICY = "cache_aware"  # its default: where a request without a program goes
# How the load generator names a run's program to the router: the body's
# vllm_xargs.agentic_context (the router's default key), with the run ID as program_id,
# the class as priority and expected_resume false on the run's last turn, so that
# `vllm-prog` runs the router's defaults untouched.
VLLM_PROGRAM_FLAGS = ("--program-context", "xargs")


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
    # Own-loop flood only: SMG with its priority scheduler at these capacities (slots over
    # both engines), and SMG's legacy FIFO admission at these --max-concurrent-requests.
    smg_caps: tuple[int, ...] = ()
    smg_fifo_caps: tuple[int, ...] = ()
    # SMG's --policy: where a run's first turn goes (sticky sessions keep the rest there).
    smg_policy: str = "cache_aware"
    # SMG's --load-monitor-interval in model seconds (÷ the time scale, rounded up to whole
    # real seconds, at least 1): how often it reads each engine's load.
    smg_load_poll_s: float = SMG_LOAD_POLL_S
    # The coding-agent flood: batch agents per point, its window and warm-up (model s).
    coding_loads: tuple[int, ...] = (8, 24)
    coding_window_s: float = 1800.0
    coding_warmup_s: float = 300.0
    # Own-loop floods (own, light, coding): also the vLLM router arms.
    vllm_router: bool = False
    # Only these arms at every point (empty: all).
    arms: tuple[str, ...] = ()
    # Own-loop and coding floods: one more luftpause arm per interactive target, a
    # slowdown over the floor (luftpause-xS: ``interactive_target = "Sx"``).
    luftpause_targets: tuple[str, ...] = ()
    # The same with packing (luftpause-pack-xS: ``target_packing = true`` beside it).
    luftpause_pack_targets: tuple[str, ...] = ()
    # Own-loop and coding floods: one more luftpause arm with working-set admission
    # instead of prefix keeping's run limit (luftpause-wset: ``working_set = "replace"``).
    luftpause_wset: bool = False

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
BENCHES = ("own", "light", "mcp", "routing", "fanout", "coding")
OWN_LOOP = frozenset({"own", "light", "coding"})  # the benches that run own_arms
CODING_INTERACTIVE = 2  # interactive agents beside the coding flood's batch agents
# The coding-agent profile's contexts reach ~100k tokens; only memory changes (a decode
# step still reads every context token's KV at the calibrated bandwidth).
CODING_CONTEXT, CODING_KV_TOKENS = 131_072, 1_000_000
CODING_ENGINE_ARGS = ("--context-length", str(CODING_CONTEXT), "--kv-tokens", str(CODING_KV_TOKENS))


# ------------------------------------------------------------------ the stack


@dataclass
class Stack:
    tmp: Path
    plan: Plan
    services: list[ServiceProcess] = field(default_factory=list)
    routers: dict[str, RouterProcess] = field(default_factory=dict)
    engines: list[str] = field(default_factory=list)
    vllm_engines: list[str] = field(default_factory=list)  # the vLLM router arms' engines
    tools_url: str = ""
    dataplane: str = ""
    # ablations: arm -> the dataplane of a second scheduler with one policy off
    # (luftpause-no-pk: prefix keeping; luftpause-no-pace: the decode pace)
    ablations: dict[str, str] = field(default_factory=dict)
    runtimes: dict[str, str] = field(default_factory=dict)  # arm -> /mcp URL
    setups: dict[str, str] = field(default_factory=dict)  # router arm -> its command line
    # vLLM router arm -> its version, command line and program-scheduling configuration
    router_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    # a luftpause dataplane's URL -> its scheduler's /status (sampled over its arms)
    statuses: dict[str, str] = field(default_factory=dict)

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


def _config(
    path: Path,
    stack: Stack,
    probe_s: float,
    keep_prefixes: bool = True,
    initial_cap: int | None = None,
    pace: bool = True,
    target: str | None = None,
    working_set: str = "off",
    packing: bool = False,
) -> Path:
    """A stack file for one scheduler and dataplane on the stack's engines;
    ``initial_cap`` None leaves the scheduler's default ramp from idle. The decode pace's
    default target is in model time: the engines run ``time_scale`` faster, so it is
    scaled as the probe period is (``pace`` False: off). ``target``: an interactive target
    relative to the floor instead (``"1.3"``: ``interactive_target = "1.3x"``), which
    needs no scaling; ``packing``: with it, ``target_packing = true``."""
    default = Params().interactive_pace_s or 0.0
    pace_ms = default * 1000 / stack.plan.time_scale if pace else 0.0
    text = (
        f"[scheduler]\nprobe_period_s = {probe_s:g}\n"
        f"keep_prefixes = {str(keep_prefixes).lower()}\n"
        + (
            f"interactive_pace_ms = {pace_ms:g}\n"
            if target is None
            else f'interactive_target = "{target}x"\n'
        )
        + ("target_packing = true\n" if packing else "")
        + ("" if working_set == "off" else f'working_set = "{working_set}"\n')
        + ("" if initial_cap is None else f"initial_cap = {initial_cap}\n")
        + "[dataplane]\nreport_reconnect_s = 0.2\n"
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


def scheduler_and_dataplane(
    s: Stack, config: Path, name: str = ""
) -> tuple[ServiceProcess, ServiceProcess]:
    """A scheduler and a dataplane on ``config``, started."""
    sched = s.start(
        "scheduler", "--config", str(config), "--port", "0", "--http-port", "0",
        "--log-level", "WARNING", name=f"scheduler{name}",
    )  # fmt: skip
    dp = s.start(
        "dataplane", "--config", str(config), "--port", "0",
        "--scheduler", f"127.0.0.1:{sched.ports['grpc']}", "--log-level", "WARNING",
        name=f"dataplane{name}",
    )  # fmt: skip
    return sched, dp


def _luftpause(s: Stack, config: Path, name: str) -> str:
    """A scheduler and a dataplane on ``config``; the dataplane's URL (its scheduler's
    ``/status`` is kept in ``s.statuses``)."""
    sched, dp = scheduler_and_dataplane(s, config, name)
    url = str(dp.urls["http"])
    s.statuses[url] = sched.urls["http"] + "/status"
    return url


def _ceil_s(model_s: float, scale: float) -> int:
    """Model seconds as the whole real seconds SMG's settings take (at least 1)."""
    return max(1, math.ceil(model_s / scale))


def smg_scheduler_yaml(scale: float) -> str:
    """SMG 1.13.0's priority-scheduler config (``--priority-scheduler-config``): every
    class needs every field. Times are SMG's real seconds, so they are model seconds ÷
    ``scale`` (rounded up), like the engines' and tools' times."""
    lines = ["classes:"]
    for cls in ("system", "interactive", "default", "bulk"):
        lines += [
            f"  {cls}:",
            f"    reserved_floor: {SMG_INTERACTIVE_RESERVED if cls == 'interactive' else 0}",
            "    reserved_per_slot: 0.0",
            f"    queue_size: {SMG_QUEUE_SIZE[cls]}",
            f"    queue_timeout_secs: {_ceil_s(SMG_QUEUE_TIMEOUT_S, scale)}",
            f"    starvation_threshold_secs: {_ceil_s(SMG_STARVATION_S[cls], scale)}",
            # SMG's defaults: the two upper classes may preempt a lower one before its
            # first byte (the reservation above leaves them no reason to).
            f"    can_preempt: {str(cls in ('system', 'interactive')).lower()}",
        ]
    return "\n".join(lines) + "\n"


def split_capacity(total: int, workers: int) -> list[int]:
    """``total`` slots over ``workers`` as evenly as whole numbers allow (first ones more)."""
    return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]


def smg_arms_config(plan: Plan, yaml_path: Path) -> dict[str, tuple[list[str], list[int] | None]]:
    """Each SMG arm's extra ``smg launch`` flags, and the capacity per engine it registers
    the engines with (None: ``--worker-urls``, SMG reads the engines' own
    ``max_running_requests``, 3,437 each on the fake engine, so nothing ever waits in it)."""
    prio = [
        "--priority-scheduler-enabled",
        # Else x-smg-priority: interactive is clamped down to `default`.
        "--priority-scheduler-default-max-class", "interactive",
        "--priority-scheduler-config", str(yaml_path),
    ]  # fmt: skip
    poll = _ceil_s(plan.smg_load_poll_s, plan.time_scale)
    common = [*SMG_COMMON_FLAGS, "--load-monitor-interval", str(poll)]
    out: dict[str, tuple[list[str], list[int] | None]] = {"smg": ([*common, *prio], None)}
    for cap in plan.smg_caps:
        out[f"smg-cap{cap}"] = ([*common, *prio], split_capacity(cap, 2))
    for cap in plan.smg_fifo_caps:
        out[f"smg-fifo{cap}"] = (
            [
                *common,
                "--max-concurrent-requests", str(cap), "--queue-size", "1024",
                "--queue-timeout-secs", str(_ceil_s(SMG_QUEUE_TIMEOUT_S, plan.time_scale)),
            ],
            None,
        )  # fmt: skip
    return out


def smg_command(flags: list[str], capacity: list[int] | None, policy: str = "cache_aware") -> str:
    """The command line an SMG arm ran (ports and engine URLs by name)."""
    workers = "" if capacity else " --worker-urls ENGINE_A ENGINE_B"
    text = (
        f"smg launch --host 127.0.0.1 --port PORT{workers} --policy {policy} "
        "--prometheus-host 127.0.0.1 --prometheus-port PORT2 --shutdown-grace-period-secs 5 "
        + " ".join(flags)
    )
    if capacity:
        text += (
            "; then POST /workers {url, labels: {max_running_requests}} per engine: "
            + " and ".join(str(c) for c in capacity)
        )
    return text


def kv_pool_tokens(server_infos: list[dict[str, Any]]) -> int:
    """The KV pool of one engine in tokens, from the engines' ``/server_info`` answers
    (``max_total_num_tokens``): the smallest, so that it holds for every engine."""
    sizes = []
    for info in server_infos:
        size = info.get("max_total_num_tokens")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"/server_info gave no positive max_total_num_tokens: {size!r}")
        sizes.append(size)
    if not sizes:
        raise ValueError("no engine to read a KV pool size from")
    return min(sizes)


def vllm_arms_config(kv_tokens: int) -> dict[str, dict[str, Any] | None]:
    """Each vLLM router arm's program-scheduling configuration (None: off): plain; its
    defaults (the load generator names programs as its default key expects, see
    ``VLLM_PROGRAM_FLAGS``); and the same with ``token_capacity_per_target``, the logical
    KV capacity of one engine, set to the engines' pool (``kv_tokens``), which turns on
    its token-based admission (else it guards by program count, 64 per engine)."""
    return {
        "vllm-router": None,
        "vllm-prog": {},
        "vllm-prog-kv": {"token_capacity_per_target": kv_tokens},
    }


def vllm_router_flags(config: dict[str, Any] | None) -> list[str]:
    """The ``vllm-router`` flags of one program-scheduling configuration (None: none)."""
    if config is None:
        return []
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return ["--enable-program-scheduling", "--program-scheduling-config-json", text]


def vllm_router_command(flags: list[str], policy: str = VLLM_POLICY) -> str:
    """The command line a vLLM router arm ran (ports and engine URLs by name)."""
    return shlex.join(
        [
            "vllm-router", "--host", "127.0.0.1", "--port", "PORT",
            "--worker-urls", "VLLM_ENGINE_A", "VLLM_ENGINE_B", "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", "PORT2", *flags,
        ]
    )  # fmt: skip


def package_version(name: str) -> str:
    """The installed version of a distribution, or "not installed"."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def probe_period(plan: Plan) -> float:
    """The scheduler's probe period, scaled with the engines (2 s of model time)."""
    return max(0.05, 2.0 / plan.time_scale)


def start_engines(s: Stack, extra: tuple[str, ...] = (), vllm: bool = False) -> None:
    """The two fake engines (priority scheduling on, as in every arm) and the fake tools;
    ``extra``: more engine flags (the coding flood's long context); ``vllm``: also the
    vLLM router arms' two engines, the same but with vLLM's metric names."""
    ts = f"{s.plan.time_scale:g}"
    pairs = [(("engine-a", "engine-b"), extra, s.engines)]
    if vllm:
        pairs.append((("vllm-engine-a", "vllm-engine-b"), extra + VLLM_ENGINE_ARGS, s.vllm_engines))
    for names, flags, urls in pairs:
        for name in names:
            svc = s.start(
                "fake-engine", "--name", name, "--port", "0", "--time-scale", ts,
                "--priority-scheduling", "--chunk-tokens", str(s.plan.chunk_tokens),
                "--tool-results", str(TOOL_CALLS), "--log-level", "WARNING", *flags,
                name=name,
            )  # fmt: skip
            urls.append(svc.urls["http"])
    tools = s.start(
        "fake-mcp", "--port", "0", "--time-scale", ts, "--log-level", "WARNING", name="fake-mcp"
    )
    s.tools_url = f"{tools.urls['http']}/mcp"


def start_stack(
    plan: Plan, tmp: Path, benches: set[str], ablate: frozenset[str] = frozenset()
) -> Stack:
    """``ablate``: "prefix-keeping" and/or "pace", a luftpause arm each with it off."""
    s = Stack(tmp, plan)
    vllm = plan.vllm_router and bool(benches & OWN_LOOP)
    start_engines(s, CODING_ENGINE_ARGS if "coding" in benches else (), vllm=vllm)
    probe_s = probe_period(plan)
    s.dataplane = _luftpause(s, _config(tmp / "stack.toml", s, probe_s), "")
    if "prefix-keeping" in ablate:
        config = _config(tmp / "stack-no-pk.toml", s, probe_s, keep_prefixes=False)
        s.ablations["luftpause-no-pk"] = _luftpause(s, config, "-no-pk")
    if "pace" in ablate:
        config = _config(tmp / "stack-no-pace.toml", s, probe_s, pace=False)
        s.ablations["luftpause-no-pace"] = _luftpause(s, config, "-no-pace")
    if plan.luftpause_wset:
        config = _config(tmp / "stack-wset.toml", s, probe_s, working_set="replace")
        s.ablations["luftpause-wset"] = _luftpause(s, config, "-wset")
    for slowdown in plan.luftpause_targets:
        config = _config(tmp / f"stack-x{slowdown}.toml", s, probe_s, target=slowdown)
        s.ablations[f"luftpause-x{slowdown}"] = _luftpause(s, config, f"-x{slowdown}")
    for slowdown in plan.luftpause_pack_targets:
        path = tmp / f"stack-pack-x{slowdown}.toml"
        config = _config(path, s, probe_s, target=slowdown, packing=True)
        arm = f"luftpause-pack-x{slowdown}"
        s.ablations[arm] = _luftpause(s, config, f"-pack-x{slowdown}")
    s.routers["cache_aware"] = launch_sglang_router(
        s.engines, "cache_aware", tmp / "router-cache_aware.log", MODEL
    )
    if benches & {"own", "light", "mcp", "coding"}:
        yaml_path = tmp / "smg-priority.yaml"
        yaml_path.write_text(smg_scheduler_yaml(plan.time_scale))
        for name, (flags, capacity) in smg_arms_config(plan, yaml_path).items():
            if name != "smg" and not benches & {"own", "coding"}:
                continue  # the capacity sweeps run in the own-loop and coding floods only
            labels = [{"max_running_requests": str(c)} for c in capacity] if capacity else None
            s.routers[name] = launch_smg(
                s.engines, plan.smg_policy, tmp / f"{name}.log", MODEL,
                extra_args=flags, worker_labels=labels,
            )  # fmt: skip
            shown = [yaml_path.name if f == str(yaml_path) else f for f in flags]
            s.setups[name] = smg_command(shown, capacity, plan.smg_policy)
    if vllm:
        start_vllm_routers(s)
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
            if "mcp" in benches and "smg" in s.routers:
                upstreams["smg"] = s.routers["smg"].url
            for arm, url in upstreams.items():
                cfg = tmp / f"runtime-{arm}.toml"
                cfg.write_text(
                    f'[runtime]\ndataplane_url = "{url}"\nstate_dir = "{tmp / ("state-" + arm)}"\n'
                    f'default_model = "{MODEL}"\n'
                    + (RUNTIME_BEHIND_SMG if arm == "smg" else "")
                    + f'[[runtime.tool_servers]]\nname = "fake"\nurl = "{s.tools_url}"\n'
                )
                rt = s.start(
                    "runtime", "--config", str(cfg), "--port", "0", "--log-level", "WARNING",
                    name=f"runtime-{arm}",
                )  # fmt: skip
                s.runtimes[arm] = f"{rt.urls['http']}/mcp"
    return s


def start_vllm_routers(s: Stack) -> None:
    """vLLM's router, once per arm of ``vllm_arms_config``, in front of the stack's vLLM
    engines; their KV pool read from the engines themselves."""
    with httpx.Client(timeout=5) as c:
        kv = kv_pool_tokens([c.get(f"{url}/server_info").json() for url in s.vllm_engines])
    version = package_version("vllm-router")
    for name, config in vllm_arms_config(kv).items():
        flags = vllm_router_flags(config)
        s.routers[name] = launch_vllm_router(
            s.vllm_engines, VLLM_POLICY, s.tmp / f"{name}.log", MODEL, extra_args=flags
        )
        s.setups[name] = vllm_router_command(flags)
        s.router_info[name] = {
            "router": "vllm-router",
            "version": version,
            "command": s.setups[name],
            "policy": VLLM_POLICY,
            "program_scheduling": config,
            "engines": f"two fake engines with `{' '.join(VLLM_ENGINE_ARGS)}`",
            "kv_pool_tokens": kv,
            "loadgen_program_flags": list(VLLM_PROGRAM_FLAGS),
        }


def runtime_available() -> bool:
    return (ROOT / "src/luftpause/runtime/main.py").exists()


# ------------------------------------------------------------------ observation


def wait_idle(stack: Stack, timeout_s: float = 120.0, engines: list[str] | None = None) -> None:
    """Until both engines (``engines``: these, else the stack's) run and queue nothing
    (the previous arm's requests are gone)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5) as c:
        while time.monotonic() < deadline:
            busy = 0
            for url in engines or stack.engines:
                load = c.get(f"{url}/get_load").json()
                busy += sum(int(x.get("num_reqs", 0)) for x in load)
            if busy == 0:
                return
            time.sleep(0.2)
    print("warning: engines still busy after the idle wait", file=sys.stderr)


# Step counters every fake engine keeps (``/debug/state``): model seconds busy, seconds
# steps started late, model seconds of prefill, decode steps and their summed batch size;
# and the requests it took, and those with the load generator's plan key (a proxy that
# drops custom headers leaves the engines drawing replies from each conversation).
COUNTERS = (
    "busy_s", "late_s", "prefill_s", "decode_steps", "decode_seqs", "submitted", "plan_keyed",
)  # fmt: skip


class EngineWatch:
    """Collects every request the engines finish (``/debug/state`` recent) while it runs."""

    def __init__(self, engines: list[str], period_s: float = 0.25) -> None:
        self.engines = engines
        self.period_s = period_s
        self.seen: dict[str, dict[str, Any]] = {}
        self.before: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start: list[dict[str, float]] = []
        self.each: list[dict[str, float]] = []  # each engine's step counters over the arm
        self.counters = dict.fromkeys(COUNTERS, 0.0)  # the same, summed over the engines

    def _poll(self, c: httpx.Client) -> tuple[list[dict[str, Any]], list[dict[str, float]]]:
        """The engines' recently finished requests (each with ``engine``: its engine's
        index), and each engine's step counters (zeros for one that did not answer)."""
        rows: list[dict[str, Any]] = []
        each: list[dict[str, float]] = []
        for i, url in enumerate(self.engines):
            own = dict.fromkeys(COUNTERS, 0.0)
            each.append(own)
            try:
                state = c.get(f"{url}/debug/state").json()
            except (httpx.HTTPError, ValueError):
                continue
            rows.extend({**r, "engine": i} for r in state.get("recent", []))
            for k in COUNTERS:
                own[k] = float(state.get(k, 0.0))
        return rows, each

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
        pairs = zip(self._start, end, strict=True)
        self.each = [{k: e[k] - s[k] for k in COUNTERS} for s, e in pairs]
        self.counters = {k: sum(e[k] for e in self.each) for k in COUNTERS}

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
            # The share of the arm's requests whose plan key reached the engines
            "plan_keyed_share": c["plan_keyed"] / c["submitted"] if c["submitted"] else None,
            # Engine by engine: how the arm spread the work (a router that piles runs on
            # one engine shows here, not in the sums above).
            "engines": [
                {
                    "requests": sum(1 for r in rows if r.get("engine") == i),
                    "decode_batch": e["decode_seqs"] / e["decode_steps"]
                    if e["decode_steps"]
                    else None,
                }
                for i, e in enumerate(self.each)
            ],
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


# SMG's priority classes as the load generator's (SMG_PRIORITY).
SMG_CLASS_OF = {"interactive": "interactive", "bulk": "batch"}


def smg_wait_totals(metrics_url: str) -> dict[str, tuple[float, float]]:
    """Per class: (seconds turns waited in SMG's priority scheduler, turns it admitted).
    Its wait histogram records only turns that queued; every admission is counted."""
    text = httpx.get(f"{metrics_url}/metrics", timeout=5).text
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if line.startswith("smg_scheduler_queue_wait_seconds_sum{"):
            idx = 0
        elif line.startswith("smg_scheduler_admit_total{") and 'outcome="admitted"' in line:
            idx = 1
        else:
            continue
        smg_cls = line.split('class="', 1)[1].split('"', 1)[0]
        if smg_cls in SMG_CLASS_OF:
            out.setdefault(SMG_CLASS_OF[smg_cls], [0.0, 0.0])[idx] += float(line.split()[-1])
    return {k: (v[0], v[1]) for k, v in out.items()}


@contextmanager
def held_delta(
    into: dict[str, Any], totals: Callable[[], dict[str, tuple[float, float]]]
) -> Iterator[None]:
    """Per class, the mean held seconds per turn over the block, from ``totals``
    (cumulative seconds and turns)."""
    before = totals()
    yield
    after = totals()
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
    smg_metrics: str = ""  # an SMG with its priority scheduler: its metrics (held times)
    engines: list[str] = field(default_factory=list)  # the engines it runs on (empty: the stack's)
    diagnostics: str = ""  # a router's diagnostics, read when the arm ends (vLLM's router)


STATUS_EVERY_S = 1.0  # how often a luftpause arm's scheduler /status is read


class StatusSampler:
    """``/status`` of a scheduler every ``every`` seconds, on a thread."""

    def __init__(self, url: str, every: float = STATUS_EVERY_S) -> None:
        self.url = url
        self.every = every
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StatusSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.is_set():
                try:
                    self.samples.append((time.monotonic(), client.get(self.url).json()))
                except (httpx.HTTPError, ValueError) as exc:
                    self.samples.append((time.monotonic(), {"error": str(exc)}))
                self._stop.wait(self.every)


def window_figures(samples: list[tuple[float, dict[str, Any]]], since: float) -> dict[str, Any]:
    """Medians over the samples taken from ``since`` on: per replica its cap, batch limit
    from the pace and turns in flight; the turns held in all."""
    kept = [s for t, s in samples if t >= since and "replicas" in s]
    if not kept:
        return {}

    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    names = [r["name"] for r in kept[0]["replicas"]]
    replicas = {}
    for name in names:
        rows = [r for s in kept for r in s["replicas"] if r["name"] == name]
        replicas[name] = {
            key: median([r.get(key) for r in rows])
            for key in ("capacity", "batch_limit_from_pace", "in_flight", "engine_running")
        }
    return {
        "samples": len(kept),
        "replicas": replicas,
        "held": median([s.get("held_total") for s in kept]),
    }


def window_start(result: dict[str, Any]) -> float:
    """When the load generator's measured window began, on the monotonic clock, read
    as soon as it has returned ``result``: its window is its last ``window_s`` seconds."""
    return time.monotonic() - float(result.get("window_s") or 0.0)


def loadgen_seeds(arm: Arm, rep: int) -> tuple[str, str]:
    """The load generator's ``--seed`` for one arm's repetition, which names its runs
    and their prompt text (its own, so no arm finds another's prompts cached in the
    shared engines), and its ``--plan-seed``, which draws a coding run's shape (turns,
    tokens, tool gaps, sub-agents) and an own-loop run's or a sub-agent's tool count and
    replies (its plan key, in its task), and is the same for every arm of a repetition:
    the arms are compared on the same runs, slot for slot (common random numbers)."""
    seed = f"{arm.bench}{arm.load}{arm.name}{rep}".replace("-", "")
    return seed, f"{arm.bench}{arm.load}rep{rep}"


def run_loadgen(stack: Stack, arm: Arm, rep: int, out: Path) -> dict[str, Any]:
    """One arm: ``luftpause loadgen`` with the arm's flags, run in this process (the same
    code as the command; saves a start-up per arm)."""
    plan = stack.plan
    path = out / f"{arm.bench}-{arm.load}-{arm.name}-{rep}.json"
    seed, plan_seed = loadgen_seeds(arm, rep)
    argv = [
        *arm.argv, "--json", str(path), "--quiet", "--seed", seed, "--plan-seed", plan_seed,
        "--label", f"{arm.bench}/{arm.name}/{arm.load}/{rep}",
    ]  # fmt: skip
    parser = argparse.ArgumentParser(prog="luftpause loadgen")
    loadgen.add_arguments(parser)
    held: dict[str, Any] = {}
    # a luftpause arm: its scheduler's caps, pace limits and held turns over the window
    status_url = (
        stack.statuses.get(arm.dataplane or stack.dataplane, "")
        if arm.name.startswith("luftpause")
        else ""
    )
    engines = arm.engines or stack.engines
    # every engine the flood runs, not only this arm's: the previous arm may have run on
    # the other pair, and its requests still share this machine's cores
    wait_idle(stack, engines=[*stack.engines, *stack.vllm_engines])
    t0 = time.monotonic()
    with (
        StatusSampler(status_url) if status_url else contextlib.nullcontext() as sampler,
        EngineWatch(engines) as watch,
        held_delta(
            held,
            (lambda: smg_wait_totals(arm.smg_metrics))
            if arm.smg_metrics
            else (lambda: held_totals(arm.dataplane or stack.dataplane)),
        ),
        contextlib.redirect_stdout(io.StringIO()) as table,
    ):
        rc = loadgen.main(parser.parse_args(argv))
    elapsed = time.monotonic() - t0
    if rc not in (0, 3) or not path.exists():  # 3: it ran, some runs failed (counted)
        raise RuntimeError(
            f"loadgen failed for {arm.bench}/{arm.name}/{arm.load} (rc {rc}):\n"
            f"{table.getvalue()[-3000:]}"
        )
    result = dict(json.loads(path.read_text()))
    result["engine_side"] = watch.summary(plan.time_scale)
    if isinstance(sampler, StatusSampler):
        result["scheduler"] = window_figures(sampler.samples, window_start(result))
    result["held_by_class"] = held
    result["wall_s"] = elapsed
    result["rep"] = rep
    if arm.name in stack.setups:
        result["setup"] = stack.setups[arm.name]
    if arm.name in stack.router_info:
        result["router"] = stack.router_info[arm.name]
    if arm.diagnostics:
        result["router_diagnostics"] = read_diagnostics(arm.diagnostics)
    if arm.smg_metrics:
        result["held_in_other"] = True  # the client saw SMG's wait as part of the turn
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


def read_diagnostics(url: str) -> Any:
    """A router's diagnostics (its JSON answer), or what kept it from answering."""
    try:
        r = httpx.get(url, timeout=10)
        r.raise_for_status()
        return r.json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": f"GET {url}: {exc!r}"}


def own_flags(stack: Stack, bench: str, load: int, context: int) -> list[str]:
    """The load generator's flags every own-loop arm shares at one point: the classic
    flood's runs of ``context`` characters, its groups, warm-up, ramp and window."""
    plan = stack.plan
    window = plan.light_window_s if bench == "light" else plan.window_for(load)
    return [
        "--tools-url", stack.tools_url, "--context-chars", str(context),
        "--tool-calls", str(TOOL_CALLS), "--group", f"{load}:batch:crowd",
        "--group", f"{INTERACTIVE_AGENTS}:interactive:people",
        "--warmup-s", f"{plan.real(plan.warmup_for(load)):g}",
        "--ramp-s", f"{plan.real(plan.ramp_for(load)):g}",
        "--duration-s", f"{plan.real(window):g}",
    ]  # fmt: skip


def own_arms(
    stack: Stack, bench: str, load: int, context: int, common: list[str] | None = None
) -> list[Arm]:
    """The own-loop arms at one point; ``common``: the load generator's flags every arm
    shares (default: ``own_flags``)."""
    common = common or own_flags(stack, bench, load, context)
    router = stack.routers["cache_aware"].url
    engines = ",".join(stack.engines)
    ablation = [
        Arm(bench, name, load, ["--target", url, *common], dataplane=url)
        for name, url in stack.ablations.items()
    ]
    # SMG arms: its priority classes and the run ID as sticky key by header, and the same
    # engine priorities in the body as luftpause sends (SMG forwards a body's priority).
    smg_flags = [
        "--no-class-headers", "--priority", PRIORITY, "--smg-priority", SMG_PRIORITY,
        "--routing-key-header", SMG_KEY_HEADER,
    ]  # fmt: skip
    smg = [
        Arm(
            bench,
            name,
            load,
            ["--target", r.url, *smg_flags, *common],
            smg_metrics="" if name.startswith("smg-fifo") else r.metrics_url,
        )
        for name, r in stack.routers.items()
        if name == "smg" or (bench in ("own", "coding") and name.startswith("smg-"))
    ]
    # vLLM router arms: no class headers or priorities (as the SGLang router arm), the run
    # ID as the program's name (VLLM_PROGRAM_FLAGS), on their own engines.
    vllm = [
        Arm(
            bench,
            name,
            load,
            ["--target", r.url, "--no-class-headers", *VLLM_PROGRAM_FLAGS, *common],
            engines=stack.vllm_engines,
            # only a router with program scheduling serves it (404 without)
            diagnostics=f"{r.url}/scheduling/diagnostics"
            if stack.router_info[name].get("program_scheduling") is not None
            else "",
        )
        for name, r in stack.routers.items()
        if name in stack.router_info
    ]
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
        *smg,
        *vllm,
    ]


def coding_arms(stack: Stack, load: int) -> list[Arm]:
    """The coding-agent flood at one point: the own-loop arms (SMG's caps with ``--smg-caps``),
    every run sampled from the ``coding-agent`` profile; its tool times run
    ``--time-scale`` faster, like the engines."""
    plan = stack.plan
    sc = f"{plan.time_scale:g}"
    common = [
        "--tools-url", stack.tools_url, "--profile", "coding-agent", "--time-scale", sc,
        "--group", f"{load}:batch:crowd",
        "--group", f"{CODING_INTERACTIVE}:interactive:people",
        "--warmup-s", f"{plan.real(plan.coding_warmup_s):g}",
        "--ramp-s", f"{plan.real(plan.coding_warmup_s / 2 if plan.ramp else 0.0):g}",
        "--duration-s", f"{plan.real(plan.coding_window_s):g}",
    ]  # fmt: skip
    return own_arms(stack, "coding", load, 0, common)


# The runtime in front of SMG: each turn as the own-loop SMG arm sends it (SMG_PRIORITY
# by class, the run ID as sticky key, the engine priorities of PRIORITY in the body).
RUNTIME_BEHIND_SMG = (
    f'run_id_headers = ["{SMG_KEY_HEADER}"]\n'
    "class_priority = {"
    + ", ".join(f"{c} = {p}" for c, p in (kv.split("=") for kv in PRIORITY.split(",")))
    + "}\n"
    "[runtime.class_headers]\n"
    + "".join(
        f'{c} = {{"x-smg-priority" = "{p}"}}\n'
        for c, p in (kv.split("=") for kv in SMG_PRIORITY.split(","))
    )
)


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
        *(
            [
                Arm(
                    "mcp",
                    "smg",
                    load,
                    ["--runtime", stack.runtimes["smg"], *common],
                    "subagents",
                    smg_metrics=stack.routers["smg"].metrics_url,
                )
            ]
            if "smg" in stack.runtimes
            else []
        ),
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


# ------------------------------------------------------------------ statistics


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified
    Lentz; Numerical Recipes, 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # fmt: skip
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
        + a * math.log(x) + b * math.log1p(-x)
    )  # fmt: skip
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the
    CDF: exact to ~1e-10, e.g. t(0.975, 1) = 12.706, t(0.975, 2) = 4.303)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float | None]:
    """The mean and the half-width of its two-sided ``level`` confidence interval from
    Student's t (n - 1 degrees of freedom: right for the few repetitions a benchmark has).
    The half-width is None for a single value (no interval without a spread)."""
    if not values:
        raise ValueError("mean_ci needs at least one value")
    mean = statistics.fmean(values)
    n = len(values)
    if n < 2:
        return mean, None
    sem = statistics.stdev(values) / math.sqrt(n)
    return mean, t_quantile(0.5 + level / 2.0, n - 1) * sem


def ci_text(values: list[float], digits: int = 1, unit: str = "") -> str:
    """``mean ± half-width`` (95 % t-interval) for several values, the value alone for one."""
    if not values:
        return "-"
    mean, half = mean_ci(values)
    if half is None:
        return f"{mean:.{digits}f}{unit}"
    return f"{mean:.{digits}f}{unit} ± {half:.{digits}f}"


def arm_order(n: int, row: int) -> list[int]:
    """The order of ``n`` arms in round ``row``: row ``row`` mod n of a Williams Latin square
    (0, 1, n-1, 2, n-2, ... shifted by the row). Over n rows every arm runs once in every
    position; in two consecutive rows no arm holds the same position (so, from two
    repetitions on, no arm always runs first or last); with n even every arm also follows
    every other arm once (carry-over balanced)."""
    base = [0]
    lo, hi = 1, n - 1
    while len(base) < n:
        base.append(lo if len(base) % 2 else hi)
        if len(base) % 2:
            hi -= 1
        else:
            lo += 1
    return [(x + row) % n for x in base]


def _spread(values: list[float]) -> str:
    return ci_text(values)


def _range_text(values: list[float]) -> str:
    """Mean (min–max): for what is described, not estimated (the host's load average)."""
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
        held = r.get("held_by_class", {}).get(cls, {}).get("held_s")
        for k in parts:
            if k == "other_s" and r.get("held_in_other") and turn.get(k) is not None:
                # SMG's queue wait, measured by SMG, is out of the client's "other".
                parts[k].append(max(0.0, turn[k] - (held or 0.0)) * scale)
            elif turn.get(k) is not None:
                parts[k].append(turn[k] * scale)
            elif k == "held_s" and held is not None:
                parts[k].append(held * scale)
        if not turn["turns"]:  # sub-agents: the engine's side, all classes together
            e = r.get("engine_side", {})  # (the simulator has none: nothing to add)
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
                f"{_range_text(loads)} |"
            )
    return lines


def rate(result: dict[str, Any], cls: str) -> float:
    """A closed loop's runs/min: agents × 60 / mean run time where known (it does not
    carry the window's rounding of up to one run per agent), else the count."""
    s = result["classes"][cls]
    closed = s.get("runs_per_min_closed")
    return float(closed if closed is not None else s["runs_per_min"])


def paired_ratios(
    results_a: list[dict[str, Any]], results_b: list[dict[str, Any]], cls: str
) -> list[float]:
    """Per repetition, arm a's rate over arm b's: the two ran in the same round, under the
    most alike conditions (host load, the arms before them), so their ratio carries less
    of the round-to-round drift than a ratio of means."""

    def by_rep(results: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        return {int(r.get("rep", i)): r for i, r in enumerate(results)}

    a, b = by_rep(results_a), by_rep(results_b)
    out = []
    for k in sorted(a.keys() & b.keys()):
        if cls in a[k]["classes"] and cls in b[k]["classes"]:
            rb = rate(b[k], cls)
            if rb:
                out.append(rate(a[k], cls) / rb)
    return out


def turn_figure(result: dict[str, Any], cls: str, key: str) -> float | None:
    """From one arm's result, a figure of the turns of ``cls`` that ended in the window
    (engine-model time is left to the caller): ``p50``/``p95`` turn seconds, or
    ``tokens`` (reply tokens per minute)."""
    t = result["classes"].get(cls, {}).get("turns_ended")
    if not t:
        return None
    value = t["completion_tokens_per_min"] if key == "tokens" else t["wall_s"][key]
    return None if value is None else float(value)


def turn_values(results: list[dict[str, Any]], cls: str, key: str, scale: float) -> list[float]:
    """``turn_figure`` of each repetition that has it, in model time (seconds × scale,
    per-minute rates ÷ scale)."""
    values = (turn_figure(r, cls, key) for r in results)
    return [v / scale if key == "tokens" else v * scale for v in values if v is not None]


def paired_turn_ratios(
    results_a: list[dict[str, Any]], results_b: list[dict[str, Any]], cls: str, key: str
) -> list[float]:
    """Per repetition, arm b's turn figure over arm a's (``p50``: how many times longer
    b's turns took than a's) or a's over b's (``tokens``: how much more work a did)."""
    a = {int(r.get("rep", i)): r for i, r in enumerate(results_a)}
    b = {int(r.get("rep", i)): r for i, r in enumerate(results_b)}
    out = []
    for k in sorted(a.keys() & b.keys()):
        fa, fb = turn_figure(a[k], cls, key), turn_figure(b[k], cls, key)
        if key == "tokens":
            if fb:  # luftpause doing no work at all is a ratio of 0, not a gap
                out.append((fa or 0.0) / fb)
        elif fa and fb:
            out.append(fb / fa)
    return out


def coding_table(by_arm: dict[str, list[dict[str, Any]]], scale: float) -> list[str]:
    """The coding flood at one point: the turns that ended in the window, per arm and
    class, in model time (mean ± 95 % interval over the repetitions)."""
    lines = [
        "| arm | class | turns (all reps) | turn p50 s | turn p95 s | reply tokens/min "
        "| runs finished (all reps) | errors (all reps) | load avg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, results in by_arm.items():
        loads = [r["load_avg"][0] for r in results if "load_avg" in r]  # none: simulated
        for cls in ("interactive", "batch"):
            ended = [r["classes"].get(cls, {}).get("turns_ended") for r in results]
            if not any(ended):
                continue
            p50 = turn_values(results, cls, "p50", scale)
            p95 = turn_values(results, cls, "p95", scale)
            tok = turn_values(results, cls, "tokens", scale)
            lines.append(
                f"| {name} | {cls} | {sum(t['turns'] for t in ended if t)} | "
                f"{ci_text(p50, 2)} | {ci_text(p95, 2)} | {ci_text(tok, 0)} | "
                f"{sum(r['classes'].get(cls, {}).get('runs', 0) for r in results)} | "
                f"{sum(r['classes'].get(cls, {}).get('error_count', 0) for r in results)} | "
                f"{_range_text(loads)} |"
            )
    return lines


# The head of coding_goals' table.
CODING_GOALS_HEAD = (
    "| arm | interactive turn p50, arm / luftpause | batch work, luftpause vs arm |",
    "|---|---|---|",
)


def coding_goals(by_arm: dict[str, list[dict[str, Any]]]) -> tuple[list[str], list[str]]:
    """luftpause against each other arm, per repetition: the other arm's interactive turn
    p50 over luftpause's (> 1×: luftpause's interactive turns are faster), and luftpause's
    batch reply tokens/min as a change on the other's. Returns the cells and one line per
    arm for the summary."""
    cells, lines = [], []
    ours = by_arm.get("luftpause", [])
    for name, results in by_arm.items():
        if name == "luftpause" or not ours:
            continue
        inter = ratio_text(paired_turn_ratios(ours, results, "interactive", "p50"))
        batch = ratio_text(paired_turn_ratios(ours, results, "batch", "tokens"), change=True)
        cells.append(f"| {name} | {inter} | {batch} |")
        lines.append(f"{name}: interactive turn p50 {name}/luftpause {inter}, batch work {batch}")
    return cells, lines


def ratio(results_a: list[dict[str, Any]], results_b: list[dict[str, Any]], cls: str) -> float:
    """The mean of the per-repetition ratios (nan when there is none)."""
    values = paired_ratios(results_a, results_b, cls)
    return statistics.fmean(values) if values else float("nan")


def ratio_text(values: list[float], change: bool = False) -> str:
    """A ratio's mean (``1.42×``, or ``+3 %`` as a change) and its 95 % t-interval's
    half-width over the repetitions, where there are several."""
    if not values:
        return "-"
    mean, half = mean_ci(values)
    if change:
        return f"{(mean - 1) * 100:+.0f} %" + (f" ± {half * 100:.0f}" if half is not None else "")
    return f"{mean:.2f}×" + (f" ± {half:.2f}" if half is not None else "")


NO_VERDICT = "no verdict (the luftpause or router arm did not run)"
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
    cells = [
        ratio_text(paired_ratios(lp, ro, "interactive")),
        ratio_text(paired_ratios(lp, ro, "batch"), change=True),
        f"{per_run:.1f}",
    ]
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
        cells.append(ratio_text(paired_ratios(lp, by_arm["engine-prio"], "interactive")))
        if vs_prio < 0.98:
            verdicts.append(f"interactive {vs_prio:.2f}× the engine-priority arm (< 0.98×)")
    if "smg" in by_arm:  # the headline peer: shown, not (yet) part of the verdict
        cells.append(ratio_text(paired_ratios(lp, by_arm["smg"], "interactive")))
        cells.append(ratio_text(paired_ratios(lp, by_arm["smg"], "batch"), change=True))
    if not lp or not ro:  # --arms left one out: nothing to judge
        cells.append(NO_VERDICT)
    else:
        cells.append("met" if not verdicts else "**missed**: " + "; ".join(verdicts))

    def parts(a: dict[str, Any]) -> str:
        return ", ".join(
            f"{k.removesuffix('_s')} {a[k]:.2f}"
            for k in ("held_s", "queued_s", "prefill_s", "decode_s", "other_s")
            if a.get(k) is not None
        )

    smg = (
        f"; SMG {parts(aggregate(by_arm['smg'], 'interactive', scale))}" if "smg" in by_arm else ""
    )
    why = [
        f"interactive turn (s): router {parts(a_ro)}; luftpause {parts(a_lp)}{smg}",
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
            f"cached {_f(cached, pct=True)}, behind {_f(behind, pct=True)}" + _split_text(sides)
        )
    return [f"Engines at {load}: " + "; ".join(parts) + ".", ""] if parts else []


def _per_replica(figures: list[dict[str, Any]], replicas: list[str], key: str) -> str:
    """``key`` of each replica, the mean over repetitions of each window's median."""
    return " / ".join(
        _f(
            _m(
                [
                    f["replicas"][n][key]
                    for f in figures
                    if f["replicas"].get(n, {}).get(key) is not None
                ]
            )
        )
        for n in replicas
    )


def scheduler_lines(by_arm: dict[str, list[dict[str, Any]]], load: int) -> list[str]:
    """What each luftpause arm's scheduler did over the window (medians of its
    ``/status``, mean over repetitions): each replica's cap and batch limit from the
    decode pace, its turns in flight, and the turns held in all."""
    parts = []
    for name, results in by_arm.items():
        figures = [r["scheduler"] for r in results if r.get("scheduler")]
        if not figures:
            continue
        replicas = list(figures[0]["replicas"])
        held = _m([f["held"] for f in figures if f.get("held") is not None])
        parts.append(
            f"{name} cap {_per_replica(figures, replicas, 'capacity')}, batch limit from the "
            f"pace {_per_replica(figures, replicas, 'batch_limit_from_pace')}, in flight "
            f"{_per_replica(figures, replicas, 'in_flight')}, held {_f(held)}"
        )
    if not parts:
        return []
    return [
        f"Scheduler at {load} (medians of its /status over the window, mean over "
        "repetitions; per replica): " + "; ".join(parts) + ".",
        "",
    ]


def _split_text(sides: list[dict[str, Any]]) -> str:
    """How the arm spread its requests and decode batches over the engines, mean over
    repetitions (runs without a per-engine record, from before it existed: "")."""
    per = [e["engines"] for e in sides if len(e.get("engines") or []) > 1]
    if not per:
        return ""
    n = min(len(p) for p in per)
    shares, batches = [], []
    for i in range(n):
        shares.append(
            _m([p[i]["requests"] / total for p in per if (total := sum(x["requests"] for x in p))])
        )
        batches.append(_m([b for p in per if (b := p[i]["decode_batch"]) is not None]))
    return (
        ", requests by engine "
        + " / ".join(_f(v, 0, pct=True) for v in shares)
        + ", decode batch by engine "
        + " / ".join(_f(v) for v in batches)
    )


# ------------------------------------------------------------------ the SMG frontier


@dataclass(frozen=True)
class Point:
    """One arm on the frontier plot: batch runs/min (x) against interactive runs/min (y),
    model time, agents×60/mean; ``xh``/``yh``: 95 % t-interval half-widths (None: one
    repetition)."""

    name: str
    x: float
    y: float
    xh: float | None = None
    yh: float | None = None

    @property
    def kind(self) -> str:
        for prefix in SWEPT:
            rest = self.name.removeprefix(prefix)
            if rest != self.name and _number(rest) is not None:
                return prefix
        return self.name

    @property
    def cap(self) -> float | None:
        """The swept setting of a sweep's point: SMG's capacity C, the decode pace target
        MS, the interactive target's slowdown S, vLLM router's token capacity T."""
        kind = self.kind
        return _number(self.name[len(kind) :]) if kind in SWEPT else None


# Arms swept over a setting written after their name: smg-cap16, luftpause-x1.3 ...
SWEPT = ("smg-cap", "smg-fifo", "luftpause-pace", "luftpause-x", "luftpause-pack-x",
         "vllm-prog-kv")  # fmt: skip
SWEPT_LABEL = {
    "luftpause-pace": "MS", "luftpause-x": "S", "luftpause-pack-x": "S", "vllm-prog-kv": "T",
}  # fmt: skip


def _number(text: str) -> float | None:
    """``"16"`` -> 16, ``"1.3"`` -> 1.3; None for anything else."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 and text.strip() == text else None


FRONTIER_ORDER = ("luftpause", "luftpause-x", "luftpause-pack-x", "luftpause-wset",
                  "luftpause-no-pk", "luftpause-no-pace", "luftpause-pace", "smg", "smg-cap",
                  "smg-fifo", "vllm-router", "vllm-prog", "vllm-prog-kv", "router",
                  "engine-prio")  # fmt: skip
FRONTIER_LABEL = {
    "luftpause": "luftpause",
    "luftpause-no-pk": "luftpause, no prefix keeping",
    "luftpause-no-pace": "luftpause, no decode pace",
    "luftpause-pace": "luftpause, decode pace target MS ms",
    "luftpause-x": "luftpause, interactive target S x the floor",
    "luftpause-pack-x": "luftpause, interactive target S x the floor, packing",
    "luftpause-wset": "luftpause, working-set admission",
    "smg": "SMG (priority scheduler, engines' own capacity)",
    "smg-cap": "SMG priority scheduler, capacity C",
    "smg-fifo": "SMG FIFO cap (--max-concurrent-requests C)",
    "router": "SGLang router (cache_aware)",
    "engine-prio": "engine priority, no proxy",
    "vllm-router": "vLLM router (cache_aware)",
    "vllm-prog": "vLLM router, program scheduling",
    "vllm-prog-kv": "vLLM router, program scheduling, token capacity T",
}


def frontier_points(by_arm: dict[str, list[dict[str, Any]]], scale: float) -> list[Point]:
    """Every arm of one load point as a frontier point, in ``FRONTIER_ORDER`` (caps
    ascending)."""
    return _points(
        by_arm,
        lambda results: (
            aggregate(results, "batch", scale)["rate"],
            aggregate(results, "interactive", scale)["rate"],
        ),
    )


def coding_points(by_arm: dict[str, list[dict[str, Any]]], scale: float) -> list[Point]:
    """The coding flood's arms at one load point as frontier points: batch reply
    tokens/min (x) against the interactive turn p50 in seconds (y, lower is better),
    model time, in ``FRONTIER_ORDER``."""
    return _points(
        by_arm,
        lambda results: (
            turn_values(results, "batch", "tokens", scale),
            turn_values(results, "interactive", "p50", scale),
        ),
    )


def _points(
    by_arm: dict[str, list[dict[str, Any]]],
    figures: Callable[[list[dict[str, Any]]], tuple[list[float], list[float]]],
) -> list[Point]:
    """One point per arm from ``figures`` (an arm's repetitions -> their x and y values):
    the means and 95 % half-widths, arms in ``FRONTIER_ORDER``, a sweep's caps ascending;
    an arm with no values on either axis is left out."""
    points = []
    for name, results in by_arm.items():
        x, y = figures(results)
        if not x or not y:
            continue
        (xm, xh), (ym, yh) = mean_ci(x), mean_ci(y)
        points.append(Point(name, xm, ym, xh, yh))
    return sorted(points, key=_frontier_key)


def _frontier_key(p: Point) -> tuple[int, float]:
    """Arms in ``FRONTIER_ORDER``, a sweep's settings ascending."""
    kind = FRONTIER_ORDER.index(p.kind) if p.kind in FRONTIER_ORDER else len(FRONTIER_ORDER)
    return kind, p.cap or 0


CODING_AXES = {
    "x_label": "batch reply tokens/min (model time)",
    "y_label": "interactive turn p50 s (lower is better)",
}


def frontier_table(by_arm: dict[str, list[dict[str, Any]]], scale: float) -> list[str]:
    """The markdown table of one load point's frontier."""
    lines = [
        "| arm | cap C | interactive runs/min | batch runs/min | interactive p50 s "
        "| batch p50 s | failed runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in frontier_points(by_arm, scale):
        results = by_arm[p.name]
        inter, batch = aggregate(results, "interactive", scale), aggregate(results, "batch", scale)
        lines.append(
            f"| {p.name} | {'-' if p.cap is None else f'{p.cap:g}'} | {ci_text(inter['rate'])} | "
            f"{ci_text(batch['rate'])} | {ci_text(inter['p50'])} | {ci_text(batch['p50'])} | "
            f"{inter['errors'] + batch['errors']} |"
        )
    return lines


PEERS = ("smg", "router", "engine-prio", "vllm-")  # arm name prefixes of the peers


def frontier_goals(
    points: list[Point], floor: float | None = None, lower_is_better: bool = False
) -> list[str]:
    """luftpause's frontier (its default point and its interactive target's points,
    ``luftpause-xS``) against each peer's point, as the goal states it: at the peer's
    batch work, luftpause's interactive service is at least 1.5x the peer's (or within
    1.2x of ``floor``, the interactive figure of the interactive agents alone, whichever
    asks less); at the peer's interactive service, luftpause's batch work is at least
    1.5x the peer's; and the default point's interactive service at least 0.98x the
    peer's. Only measured points count (no interpolation). ``lower_is_better``: the
    interactive figure is a time (a turn p50), so "1.5x better" means 1/1.5 of it."""
    ours = [p for p in points if p.kind in ("luftpause", "luftpause-x")]
    default = next((p for p in points if p.name == "luftpause"), None)

    def better(a: float, b: float, factor: float = 1.0) -> bool:  # a at least factor x b
        return a * factor <= b if lower_is_better else a >= b * factor

    def ratio(a: float, b: float) -> float:  # how many times better a is than b
        return (b / a if a else math.inf) if lower_is_better else (a / b if b else math.inf)

    lines = [
        "| peer | peer interactive / batch | luftpause's best interactive at ≥ its batch "
        "| × (goal) | luftpause's best batch at ≥ its interactive | × (goal 1.5) "
        "| default's interactive × | goals met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for peer in points:
        if not peer.name.startswith(PEERS):
            continue
        goal = 1.5
        if floor is not None:  # within 1.2x of the floor asks less: take it
            near_floor = ratio(floor / 1.2 if not lower_is_better else floor * 1.2, peer.y)
            goal = min(goal, max(near_floor, 0.0))
        at_batch = [p.y for p in ours if p.x >= peer.x]
        best_y = (min if lower_is_better else max)(at_batch) if at_batch else None
        at_inter = [p.x for p in ours if better(p.y, peer.y)]
        best_x = max(at_inter) if at_inter else None
        r1 = None if best_y is None else ratio(best_y, peer.y)
        r2 = None if best_x is None else best_x / peer.x if peer.x else None
        r3 = None if default is None else ratio(default.y, peer.y)
        met = [
            r1 is not None and r1 >= goal - 1e-9,
            r2 is not None and r2 >= 1.5,
            r3 is not None and r3 >= 0.98,
        ]
        lines.append(
            f"| {peer.name} | {peer.y:.1f} / {peer.x:.0f} | "
            f"{'-' if best_y is None else f'{best_y:.1f}'} | "
            f"{'-' if r1 is None else f'{r1:.2f}'} ({goal:.2f}) | "
            f"{'-' if best_x is None else f'{best_x:.0f}'} | "
            f"{'-' if r2 is None else f'{r2:.2f}'} | "
            f"{'-' if r3 is None else f'{r3:.2f}'} | {sum(met)}/3 |"
        )
    return lines


def nice_axis(values: list[float], ticks: int = 5) -> tuple[float, float, list[float]]:
    """An axis that holds ``values``: its ends and about ``ticks`` round tick values
    (steps of 1, 2, 2.5 or 5 × a power of ten)."""
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        lo, hi = lo - max(1.0, abs(lo) * 0.1), hi + max(1.0, abs(hi) * 0.1)
    raw = (hi - lo) / ticks
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw * (1 - 1e-9))
    start, end = math.floor(lo / step) * step, math.ceil(hi / step) * step
    count = round((end - start) / step)
    return start, end, [round(start + i * step, 10) for i in range(count + 1)]


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


SVG_STYLE = {  # kind -> (colour, marker, filled)
    "luftpause": ("#d62728", "circle", True),
    "luftpause-no-pk": ("#d62728", "circle", False),
    "luftpause-no-pace": ("#d62728", "square", False),
    "luftpause-pace": ("#d62728", "square", True),
    "luftpause-x": ("#d62728", "diamond", True),
    "luftpause-pack-x": ("#d62728", "diamond", False),
    "luftpause-wset": ("#d62728", "triangle", True),
    "smg": ("#1f77b4", "circle", False),
    "smg-cap": ("#1f77b4", "circle", True),
    "smg-fifo": ("#ff7f0e", "square", True),
    "router": ("#555555", "triangle", False),
    "engine-prio": ("#555555", "diamond", False),
    "vllm-router": ("#2ca02c", "triangle", False),
    "vllm-prog": ("#2ca02c", "circle", True),
    "vllm-prog-kv": ("#2ca02c", "square", True),
}


def _marker(kind: str, x: float, y: float, r: float = 5.0) -> str:
    colour, shape, filled = SVG_STYLE.get(kind, ("#000000", "circle", False))
    paint = f'fill="{colour if filled else "white"}" stroke="{colour}" stroke-width="1.5"'
    corners = {
        "square": ((-1, -1), (1, -1), (1, 1), (-1, 1)),
        "triangle": ((0, -1.2), (1, 0.8), (-1, 0.8)),
        "diamond": ((0, -1.2), (1, 0), (0, 1.2), (-1, 0)),
    }.get(shape)
    if corners is None:
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {paint}/>'
    pts = " ".join(f"{x + dx * r:.1f},{y + dy * r:.1f}" for dx, dy in corners)
    return f'<polygon points="{pts}" {paint}/>'


def frontier_svg(
    panels: list[tuple[str, list[Point]]],
    title: str,
    subtitle: str = "",
    x_label: str = "batch runs/min (model time)",
    y_label: str = "interactive runs/min",
) -> str:
    """A plain SVG: per panel (one load point), batch work (x) against interactive
    service (y; by default runs/min of each); SMG's capacity sweeps as lines through
    their caps, every other arm a marker; whiskers are 95 % t-intervals over the
    repetitions."""
    pw, ph, ml, mr, mt, mb = 640, 420, 64, 24, 44, 52
    cols = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / cols)
    legend_h = 22 * math.ceil(len(SVG_STYLE) / 2) + 16
    top = 60 if subtitle else 40
    width, height = pw * cols, top + ph * rows + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2:.0f}" y="24" text-anchor="middle" font-size="15">'
        f"{_esc(title)}</text>",
    ]
    if subtitle:
        out.append(
            f'<text x="{width / 2:.0f}" y="44" text-anchor="middle" fill="#555">'
            f"{_esc(subtitle)}</text>"
        )
    for i, (name, points) in enumerate(panels):
        ox, oy = pw * (i % cols), top + ph * (i // cols)
        x0, x1, y0, y1 = ox + ml, ox + pw - mr, oy + mt, oy + ph - mb
        out.append(
            f'<text x="{(x0 + x1) / 2:.0f}" y="{oy + 24}" text-anchor="middle" '
            f'font-size="13">{_esc(name)}</text>'
        )
        if not points:
            continue
        # Rates are never negative: whiskers (and the axes) stop at 0.
        xs = [max(0.0, v) for p in points for v in (p.x - (p.xh or 0), p.x + (p.xh or 0))]
        ys = [max(0.0, v) for p in points for v in (p.y - (p.yh or 0), p.y + (p.yh or 0))]
        xlo, xhi, xticks = nice_axis(xs)
        ylo, yhi, yticks = nice_axis(ys)

        def sx(
            v: float, xlo: float = xlo, xhi: float = xhi, x0: float = x0, x1: float = x1
        ) -> float:
            return x0 + (v - xlo) / (xhi - xlo) * (x1 - x0)

        def sy(
            v: float, ylo: float = ylo, yhi: float = yhi, y0: float = y0, y1: float = y1
        ) -> float:
            return y1 - (v - ylo) / (yhi - ylo) * (y1 - y0)

        out.append(
            f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" '
            'fill="none" stroke="#999"/>'
        )
        for t in xticks:
            out.append(
                f'<line x1="{sx(t):.1f}" y1="{y0}" x2="{sx(t):.1f}" y2="{y1}" stroke="#eee"/>'
            )
            out.append(f'<text x="{sx(t):.1f}" y="{y1 + 16}" text-anchor="middle">{t:g}</text>')
        for t in yticks:
            out.append(
                f'<line x1="{x0}" y1="{sy(t):.1f}" x2="{x1}" y2="{sy(t):.1f}" stroke="#eee"/>'
            )
            out.append(f'<text x="{x0 - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
        out.append(
            f'<text x="{(x0 + x1) / 2:.0f}" y="{y1 + 36}" text-anchor="middle">'
            f"{_esc(x_label)}</text>"
        )
        out.append(
            f'<text x="{ox + 16}" y="{(y0 + y1) / 2:.0f}" text-anchor="middle" '
            f'transform="rotate(-90 {ox + 16} {(y0 + y1) / 2:.0f})">{_esc(y_label)}</text>'
        )
        for kind in ("smg-cap", "smg-fifo", "luftpause-pace", "luftpause-x", "luftpause-pack-x"):
            line = [p for p in points if p.kind == kind]
            if len(line) > 1:
                colour = SVG_STYLE[kind][0]
                pts = " ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in line)
                out.append(
                    f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
                )
        for p in points:
            colour = SVG_STYLE.get(p.kind, ("#000000", "", False))[0]
            cx, cy = sx(p.x), sy(p.y)
            if p.xh:
                out.append(
                    f'<line x1="{sx(max(0.0, p.x - p.xh)):.1f}" y1="{cy:.1f}" '
                    f'x2="{sx(p.x + p.xh):.1f}" y2="{cy:.1f}" stroke="{colour}"/>'
                )
            if p.yh:
                out.append(
                    f'<line x1="{cx:.1f}" y1="{sy(max(0.0, p.y - p.yh)):.1f}" x2="{cx:.1f}" '
                    f'y2="{sy(p.y + p.yh):.1f}" stroke="{colour}"/>'
                )
            out.append(_marker(p.kind, cx, cy))
            if p.cap is not None:  # the other arms' markers are named by the legend
                out.append(
                    f'<text x="{cx + 8:.1f}" y="{cy - 7:.1f}" fill="{colour}" font-size="11">'
                    f"{SWEPT_LABEL.get(p.kind, 'C')}={p.cap:g}</text>"
                )
    ly = top + ph * rows + 8
    for i, (kind, text) in enumerate(FRONTIER_LABEL.items()):
        lx, yy = 24 + (i % 2) * (width / 2), ly + 22 * (i // 2) + 8
        out.append(_marker(kind, lx, yy))
        out.append(f'<text x="{lx + 14:.1f}" y="{yy + 4:.1f}">{_esc(text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_plot(
    path: Path,
    results: dict[str, dict[int, dict[str, list[dict[str, Any]]]]],
    plan: Plan,
    code: str,
) -> bool:
    """The own-loop flood's frontier as an SVG file, or, for a coding flood alone, its
    interactive turn p50 against batch reply tokens/min; False when there is neither."""
    reps = f"{plan.reps} repetition{'s' if plan.reps != 1 else ''}"
    subtitle = (
        f"time scale {plan.time_scale:g}, {reps}, SMG placing runs by {plan.smg_policy}, "
        f"whiskers 95 % t-intervals; code {code or 'unknown'}"
    )
    own = results.get("own")
    if not own:
        coding = results.get("coding")
        if not coding:
            return False
        panels = [
            (f"{load} batch + {CODING_INTERACTIVE} interactive coding agents",
             coding_points(by_arm, plan.time_scale))
            for load, by_arm in sorted(coding.items(), key=lambda kv: int(kv[0]))
        ]  # fmt: skip
        title = "Coding flood: interactive turn p50 against batch reply tokens/min (model time)"
        path.write_text(frontier_svg(panels, title, subtitle, **CODING_AXES))
        return True
    panels = [
        (f"{load} batch + {INTERACTIVE_AGENTS} interactive agents",
         frontier_points(by_arm, plan.time_scale))
        for load, by_arm in sorted(own.items())
    ]  # fmt: skip
    title = "Own-loop flood: interactive against batch runs/min (agents×60/mean, model time)"
    path.write_text(frontier_svg(panels, title, subtitle))
    return True


def code_version() -> str:
    """The checkout's commit (``git rev-parse --short HEAD``) and whether the working tree
    matched it: what a report measured. Dirty: a tracked file changed, or an untracked
    file under src/ or tools/ (code the run may have imported)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all", "--", "."],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
    except OSError:
        return ""
    if not head:
        return ""
    changed = [
        line[3:]
        for line in status
        if not line.startswith("??") or line[3:].startswith(("src/", "tools/"))
    ]
    if not changed:
        return f"{head} (working tree clean)"
    return f"{head} (working tree dirty: {len(changed)} file(s) differ from it)"


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
    setups: dict[str, str] = {}
    routers: dict[str, dict[str, Any]] = {}
    for per_load in results.values():
        for by_arm in per_load.values():
            for name, runs in by_arm.items():
                for r in runs:
                    if r.get("router"):
                        routers.setdefault(name, dict(r["router"]))
                    elif r.get("setup"):
                        setups.setdefault(name, str(r["setup"]))
    smg_lines = (
        [
            "- SMG arms (PyPI `smg` 1.13.0, the SGLang Model Gateway, in front of the same two "
            "engines; [how they run](../methodology.md#smg-arms)): `x-smg-priority` "
            f"interactive / bulk, the run ID in `{SMG_KEY_HEADER}` (sticky sessions), "
            f"`{plan.smg_policy}` placing a run's first turn, engine priorities 10 / 0; "
            f"`smg-capC` with {SMG_INTERACTIVE_RESERVED} of its C slots reserved for "
            f"`interactive`. Queue timeouts {SMG_QUEUE_TIMEOUT_S:g} s, starvation thresholds "
            f"SMG's defaults, its load poll (`--load-monitor-interval`) every "
            f"{plan.smg_load_poll_s:g} s, all in model time (÷ the time scale, rounded up). "
            "Command lines:",
            *(f"  - `{name}`: `{text}`" for name, text in sorted(setups.items())),
            "  - priority-scheduler config (`smg-priority.yaml`), time scale "
            f"{sc:g}: `" + smg_scheduler_yaml(sc).replace("\n", " ").strip() + "`",
        ]
        if setups
        else []
    )
    header = [
        "# Benchmarks",
        "",
        "Measured by `tools/bench/flood.py` (generated file: rerun the command to refresh it). "
        "What is not particular to this run (the arms, repetitions and intervals, the window, "
        "every column and line) is explained once in [Methodology](../methodology.md).",
        "",
        f"- command: `{command}`",
        *(
            [f"- this file: re-rendered from that run's raw results by `{rendered}`"]
            if rendered
            else []
        ),
        f"- code measured: commit {code or 'unknown (not a git checkout)'}",
        f"- date: {started}; duration {minutes:.1f} min",
        f"- machine: {machine()}; load average before the run "
        f"{' / '.join(f'{x:.2f}' for x in load_before)} (other work shares these cores: "
        "each table lists the 1-minute load average of its arms)",
        "- engines: two fake engines (`docs/guides/calibration.md` defaults"
        + (
            f"; the coding flood's with `{' '.join(CODING_ENGINE_ARGS)}`"
            if "coding" in results
            else ""
        )
        + ", `--priority-scheduling`, interactive turns priority 10 and batch 0), "
        f"time scale {sc:g}. **Every time and rate below is in the engine model's time** "
        f"(measured seconds × {sc:g}, runs/min ÷ {sc:g}).",
        "- luftpause arm: the scheduler's defaults (the decode pace's target 100 ms per token "
        "in model time)",
        *smg_lines,
        *vllm_router_lines(routers),
        f"- repetitions: {plan.reps} per arm and load point, arms in Williams Latin square "
        "order; a cell with several shows mean ± the half-width of its 95 % confidence "
        "interval, ratios between arms per repetition",
        f"- window: max({plan.window_s:g} s, 1.5 s × batch agents) measured after "
        f"max({plan.warmup_s:g} s, 1 s × batch agents) of warm-up (floods), the agents "
        + ("starting spread over its first half; " if plan.ramp else "all starting at once; ")
        + f"{plan.light_window_s:g} s (light), {plan.routing_window_s:g} s (routing)",
        f"- every run: system preamble + own task, {TOOL_CALLS} `lookup` calls (fake-mcp, "
        "~1 s each), replies capped at 256 tokens; interactive agents: "
        f"{INTERACTIVE_AGENTS}; replies drawn from each run's plan key (`--plan-seed`, the "
        "same for every arm of a repetition)",
        f"- scheduler lines: its `/status` read every {STATUS_EVERY_S:g} s",
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
        "coding": ("6. Coding-agent runs (shaped like real traces)", 0.0, 0),
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
                out += scheduler_lines(by_arm, load)
                if bench == "own" and any(n.startswith("smg") for n in by_arm):
                    out += [
                        f"SMG's frontier at {load}: every arm's interactive against batch "
                        "runs/min (agents×60/mean, model time), SMG's capacity sweeps by cap C"
                        + (" (plot: the `--plot` SVG)" if len(by_arm) > 1 else "")
                        + ".",
                        "",
                        *frontier_table(by_arm, sc),
                        "",
                    ]
                    floor_p50 = floors.get(ctx)
                    floor_rate = (
                        INTERACTIVE_AGENTS * 60 / floor_p50 if floor_p50 else None
                    )  # (the alone run's p50 as its mean: agents x 60 / run time)
                    out += [
                        "luftpause's frontier (its default and its interactive targets) "
                        "against each peer"
                        + (
                            f" (the floor: {INTERACTIVE_AGENTS} interactive agents alone, "
                            f"~{floor_rate:.1f} runs/min)"
                            if floor_rate
                            else ""
                        )
                        + ":",
                        "",
                        *frontier_goals(frontier_points(by_arm, sc), floor_rate),
                        "",
                    ]
                vs_smg = (
                    "; against SMG (not part of the verdict): interactive "
                    + ratio_text(paired_ratios(by_arm["luftpause"], by_arm["smg"], "interactive"))
                    + ", batch "
                    + ratio_text(
                        paired_ratios(by_arm["luftpause"], by_arm["smg"], "batch"), change=True
                    )
                    if "smg" in by_arm and "luftpause" in by_arm
                    else ""
                )
                judged = "luftpause" in by_arm and "router" in by_arm
                summary.append(
                    f"- {bench} {load}: "
                    + (
                        ("met" if not verdicts else "missed (" + "; ".join(verdicts) + ")")
                        if judged
                        else NO_VERDICT
                    )
                    + vs_smg
                    + vs_vllm_text(by_arm)
                )
            head = (
                "| batch agents | interactive luftpause/router | batch luftpause vs router "
                "| router interactive engine-queue s per run |"
            )
            sep = "|---|---|---|---|"
            if any("engine-prio" in v for v in per_load.values()):
                head += " interactive luftpause/engine-prio |"
                sep += "---|"
            if any("smg" in v for v in per_load.values()):
                head += " interactive luftpause/SMG | batch luftpause vs SMG |"
                sep += "---|---|"
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
        elif bench == "coding":
            out += [
                f"{CODING_INTERACTIVE} interactive agents beside N batch agents, every run "
                "sampled from `--profile coding-agent` (`docs/guides/workloads.md`), "
                f"engines `{' '.join(CODING_ENGINE_ARGS)}`; "
                f"{plan.coding_window_s:g} s measured after {plan.coding_warmup_s:g} s of "
                "warm-up (model time), the agents "
                + ("starting over its first half" if plan.ramp else "all starting at once")
                + ". Every arm of a repetition plays the same runs, slot for slot (the load "
                "generator's `--plan-seed`), under prompt text of its own"
                + ". A run takes longer than the window, so the arms are compared by the "
                "**turns that ended in the window** (finished runs or not): turn time (request "
                "to last token) and reply tokens per minute; a turn that failed is not in "
                "them but under *errors* (its run failed). The SMG arm's engines report a "
                "larger capacity here (their KV pool is larger), still more than the load "
                "ever asks for, so nothing waits in SMG.",
                "",
            ]
            for load, by_arm in sorted(per_load.items()):
                out += [f"### {load} batch + {CODING_INTERACTIVE} interactive", ""]
                out += coding_table(by_arm, sc)
                cells, lines = coding_goals(by_arm)
                out += [
                    "",
                    "luftpause against each arm, per repetition (mean ± 95 % interval): the "
                    "arm's interactive turn p50 over luftpause's (above 1×: luftpause's "
                    "interactive turns are faster), and luftpause's batch reply tokens/min "
                    "as a change on the arm's:",
                    "",
                    *CODING_GOALS_HEAD,
                    *cells,
                    "",
                ]
                out += engine_lines(by_arm, load)
                out += scheduler_lines(by_arm, load)
                summary += [f"- coding {load}: {line}" for line in lines]
    return "\n".join([*header, "## Goals at a glance", "", *summary, "", *out]) + "\n"


def vllm_router_lines(routers: dict[str, dict[str, Any]]) -> list[str]:
    """The report's description of the vLLM router arms that ran (``routers``: arm ->
    its ``router`` record): version, engines, how runs are named, every command line."""
    if not routers:
        return []
    first = next(iter(routers.values()))
    kv = next((r["kv_pool_tokens"] for r in routers.values() if r.get("kv_pool_tokens")), None)
    flags = " ".join(first.get("loadgen_program_flags", []))
    return [
        f"- vLLM router arms (PyPI `vllm-router` {first.get('version', '?')}, vLLM's router) "
        f"in front of two more fake engines, the same but `{' '.join(VLLM_ENGINE_ARGS)}` "
        "(its program scheduling reads vLLM's gauges from each engine's `/metrics`): "
        "`vllm-router` without program scheduling, `vllm-prog` with it (its defaults; the "
        "load generator names each run's program in the body's "
        "`vllm_xargs.agentic_context`), `vllm-prog-kv` the same with `token_capacity_per_target` "
        + (f"{kv} (" if kv else "(")
        + "the engines' KV pool, `max_total_num_tokens` of their `/server_info`). Like the "
        "SGLang router arm, the load generator sends no class headers or priorities; it "
        f"sends the run ID as the program's name (`{flags}`). The router's own times "
        "(metrics poll 1 s, acting TTL at most 10 s, queue timeout 600 s) are real "
        "seconds, not scaled with the engines. Each arm's final `GET "
        "/scheduling/diagnostics` is in the JSON (`router_diagnostics`). Command lines:",
        *(f"  - `{name}`: `{r['command']}`" for name, r in sorted(routers.items())),
    ]


def vs_vllm_text(by_arm: dict[str, list[dict[str, Any]]]) -> str:
    """luftpause against each vLLM router arm at one point, per repetition (not part of
    the verdict): interactive runs/min as a ratio, batch runs/min as a change."""
    lp = by_arm.get("luftpause")
    if not lp:
        return ""
    return "".join(
        f"; against {name} (not part of the verdict): interactive "
        + ratio_text(paired_ratios(lp, results, "interactive"))
        + ", batch "
        + ratio_text(paired_ratios(lp, results, "batch"), change=True)
        for name, results in by_arm.items()
        if any(r.get("router", {}).get("router") == "vllm-router" for r in results)
    )


def select_arms(
    schedule: list[tuple[str, int, list[Arm]]], wanted: tuple[str, ...]
) -> list[tuple[str, int, list[Arm]]]:
    """Only the ``wanted`` arms at every point (empty: all), points left without an arm
    dropped. Raises ValueError naming any wanted arm that is at no point."""
    if not wanted:
        return schedule
    names = {a.name for _, _, arms in schedule for a in arms}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ValueError(
            f"no arm named {', '.join(unknown)} in this run (arms: {', '.join(sorted(names))})"
        )
    kept = [(b, n, [a for a in arms if a.name in wanted]) for b, n, arms in schedule]
    return [(b, n, arms) for b, n, arms in kept if arms]


# ------------------------------------------------------------------ main


def _caps(least: int) -> Any:
    """An argparse type: a comma list of distinct whole numbers, each at least ``least``,
    ascending."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            caps = sorted({int(x) for x in text.split(",") if x.strip()})
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected whole numbers, got {text!r}") from None
        if not caps or caps[0] < least:
            raise argparse.ArgumentTypeError(f"expected numbers of at least {least}, got {text!r}")
        return tuple(caps)

    return parse


def _seconds(least: float, strict: bool) -> Any:
    """An argparse type: seconds above (``strict``) or at least ``least``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
        if value < least or (strict and value == least) or value != value:
            bound = "more than" if strict else "at least"
            raise argparse.ArgumentTypeError(f"expected {bound} {least:g} s, got {text!r}")
        return value

    return parse


positive = _seconds(0.0, strict=True)
non_negative = _seconds(0.0, strict=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="time-scaled, fewer points (~11 min)")
    parser.add_argument(
        "--benches",
        default=",".join(b for b in BENCHES if b != "coding"),
        help=f"comma list of {', '.join(BENCHES)} (default: all but coding, which runs alone)",
    )
    parser.add_argument(
        "--reps",
        type=int,
        help="repetitions per arm and load point (default: 1 quick, 2 full); each cell shows "
        "mean ± its 95 %% t-interval, so 3 or more give usable intervals",
    )
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
    parser.add_argument(
        "--luftpause-targets",
        metavar="S,S,...",
        default="",
        help="own-loop and coding floods: one more luftpause arm per S (luftpause-xS), "
        'its scheduler given interactive_target = "Sx" (a slowdown over the floor, S > 1), '
        "e.g. 1.2,1.5,2: luftpause's frontier (default: none)",
    )
    parser.add_argument(
        "--luftpause-pack-targets",
        metavar="S,S,...",
        default="",
        help="the same with packing (luftpause-pack-xS: target_packing = true beside the "
        "target; default: none)",
    )
    parser.add_argument(
        "--luftpause-wset",
        action="store_true",
        help="own-loop and coding floods: one more luftpause arm with working-set admission "
        'instead of prefix keeping\'s run limit (luftpause-wset: working_set = "replace")',
    )
    parser.add_argument(
        "--ablate-pace",
        action="store_true",
        help="floods also run a luftpause arm with interactive_pace_ms = 0 (luftpause-no-pace)",
    )
    parser.add_argument(
        "--smg-caps",
        type=_caps(SMG_INTERACTIVE_RESERVED + 1),
        metavar="C,C,...",
        help="own-loop and coding floods: one more SMG arm per C (smg-capC), its priority "
        f"scheduler given C slots over both engines ({SMG_INTERACTIVE_RESERVED} reserved for "
        f"interactive, so C > {SMG_INTERACTIVE_RESERVED}); sweeps SMG's frontier, e.g. "
        "8,12,16 (default: none)",
    )
    parser.add_argument(
        "--smg-policy",
        # SMG 1.13 refuses power_of_two without --worker-urls, as the capped arms start.
        choices=("cache_aware", "round_robin", "random"),
        help="SMG's --policy, where a run's first turn goes (sticky sessions keep the rest "
        "there); default cache_aware, SMG's own. On runs with long shared prefixes "
        "cache_aware can put every run on one engine: round_robin spreads them",
    )
    parser.add_argument(
        "--smg-load-poll-s",
        type=positive_float,
        metavar="S",
        help="SMG's --load-monitor-interval in model seconds (default: 10, SMG's own), passed "
        "÷ the time scale and rounded up to whole seconds like SMG's other times: how often "
        "SMG reads the engines' load, which cache_aware scores a run's first turn by",
    )
    parser.add_argument(
        "--smg-fifo-caps",
        type=_caps(1),
        metavar="C,C,...",
        help="own-loop and coding floods: one more SMG arm per C (smg-fifoC): no priority "
        "scheduler, --max-concurrent-requests C with a FIFO queue - a class-blind router queue cap "
        "(default: none)",
    )
    parser.add_argument(
        "--vllm-router",
        action="store_true",
        help="own-loop floods (own, light, coding): also vLLM's router (PyPI vllm-router) "
        "in front of two more fake engines with vLLM's metric names: vllm-router (plain), "
        "vllm-prog (program scheduling), vllm-prog-kv (program scheduling given the "
        "engines' KV pool as token_capacity_per_target)",
    )
    parser.add_argument(
        "--arms",
        metavar="NAME,...",
        help="run only these arms at every point, e.g. luftpause,vllm-prog (default: all)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.svg",
        help="also write the own-loop flood's frontier (interactive against batch runs/min "
        "per arm, SMG's caps as lines, 95 %% intervals as whiskers) as an SVG file; for a "
        "coding flood alone, interactive turn p50 against batch reply tokens/min",
    )
    parser.add_argument(
        "--coding-loads",
        type=_caps(1),
        metavar="N,N,...",
        help="coding flood: batch agents per point (default: "
        + ",".join(map(str, FULL.coding_loads))
        + ")",
    )
    parser.add_argument(
        "--coding-window-s",
        type=positive,
        help=f"coding flood: measured window, model seconds (default {FULL.coding_window_s:g})",
    )
    parser.add_argument(
        "--coding-warmup-s",
        type=non_negative,
        help=f"coding flood: warm-up, model seconds (default {FULL.coding_warmup_s:g})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT
        / "docs/benchmarks/results"
        / f"{time.strftime('%Y-%m-%d', time.gmtime())}-flood.md",
        help="write the report here (default: docs/benchmarks/results/YYYY-MM-DD-flood.md, "
        "today's UTC date)",
    )
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
    if args.smg_caps:
        overrides["smg_caps"] = args.smg_caps
    if args.smg_fifo_caps:
        overrides["smg_fifo_caps"] = args.smg_fifo_caps
    if args.smg_policy:
        overrides["smg_policy"] = args.smg_policy
    if args.smg_load_poll_s is not None:
        overrides["smg_load_poll_s"] = args.smg_load_poll_s
    if args.coding_loads:
        overrides["coding_loads"] = args.coding_loads
    if args.coding_window_s is not None:
        overrides["coding_window_s"] = args.coding_window_s
    if args.coding_warmup_s is not None:
        overrides["coding_warmup_s"] = args.coding_warmup_s
    if args.vllm_router:
        overrides["vllm_router"] = True
    if args.luftpause_wset:
        overrides["luftpause_wset"] = True
    for flag in ("luftpause_targets", "luftpause_pack_targets"):
        if getattr(args, flag):
            targets = tuple(t.strip() for t in getattr(args, flag).split(",") if t.strip())
            for t in targets:
                if slowdown_arm(f"luftpause-x{t}") is None:
                    option = "--" + flag.replace("_", "-")
                    parser.error(f"{option} takes slowdowns above 1, not {t!r}")
            overrides[flag] = targets
    if args.arms:
        overrides["arms"] = tuple(
            dict.fromkeys(a.strip() for a in args.arms.split(",") if a.strip())
        )
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
        if args.plot and write_plot(args.plot, res, plan, saved.get("code", "")):
            print(f"plot: {args.plot}", file=sys.stderr)
        return 0
    benches = {b.strip() for b in args.benches.split(",") if b.strip()}
    unknown = benches - set(BENCHES)
    if unknown:
        parser.error(f"unknown bench(es): {', '.join(sorted(unknown))}")
    if "coding" in benches and len(benches) > 1:
        parser.error(
            "--benches coding runs alone: its engines need a long context "
            f"({' '.join(CODING_ENGINE_ARGS)}), which would change every other bench"
        )
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
        ablate = frozenset(
            name
            for name, on in (
                ("prefix-keeping", args.ablate_prefix_keeping),
                ("pace", args.ablate_pace),
            )
            if on
        )
        stack = start_stack(plan, tmp, benches, ablate=ablate)
        routers = dict(stack.router_info)
        try:
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
            if "coding" in benches:
                schedule += [("coding", n, coding_arms(stack, n)) for n in plan.coding_loads]
            try:
                schedule = select_arms(schedule, plan.arms)
            except ValueError as exc:
                parser.error(str(exc))
            contexts = sorted(
                {8000 for b in benches if b in ("own", "mcp", "routing")}
                | ({2000} if "light" in benches else set())
            )
            for ctx in contexts:
                f = floor(stack, ctx, out)
                floors[ctx] = f["classes"]["interactive"]["run_s"]["p50"] * plan.time_scale
            clock = ArmClock(plan.reps * sum(len(arms) for _, _, arms in schedule))
            for rep in range(plan.reps):
                for index, (bench, load, arms) in enumerate(schedule):
                    # A Williams Latin square's row per repetition, shifted by the point:
                    # no arm keeps its position from one repetition (or neighbouring
                    # point) to the next, and over len(arms) repetitions every arm runs
                    # once in every position.
                    order = [arms[i] for i in arm_order(len(arms), rep + index)]
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
            "routers": routers,  # vLLM router arms: version, command line, configuration
        }
        args.json.write_text(json.dumps(saved, indent=1))
    text = report(plan, command, results, floors, started, minutes, load_before, code=code)
    args.out.write_text(text)
    print(text)
    if args.plot and write_plot(args.plot, results, plan, code):
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
