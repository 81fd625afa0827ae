"""What a flood runs: its plan (QUICK, FULL), the stack's handles, an arm, and the
numbers every arm shares (model, agents, tool calls, the coding flood's engines).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from luftpause.procs import (
    RouterProcess,
    ServiceProcess,
    launch,
    stop_all,
)

MODEL = "llama-3.2-1b"
ROOT = Path(__file__).resolve().parents[3]  # the checkout
INTERACTIVE_AGENTS = 4
PRIORITY = "interactive=10,batch=0"
TOOL_CALLS = 3  # the router drops x-fake-tool-results, so every arm uses the engines' default


# ------------------------------------------------------------------ settings


# SMG's --load-monitor-interval default (10 s), in model seconds like its other times: how
# often it reads each engine's running and waiting requests and KV usage, which its
# cache_aware policy scores a run's first turn by. Left at 10 real seconds, a flood at
# time scale 5 gave it a picture 50 model seconds old: with 36 slots over both engines at
# 48 batch agents that cost SMG about a fifth of its batch runs (docs/benchmarks/fidelity.md).
SMG_LOAD_POLL_S = 10.0


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


# The coding-agent profile's contexts reach ~100k tokens; only memory changes (a decode
# step still reads every context token's KV at the calibrated bandwidth).
CODING_CONTEXT, CODING_KV_TOKENS = 131_072, 1_000_000
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


def package_version(name: str) -> str:
    """The installed version of a distribution, or "not installed"."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def probe_period(plan: Plan) -> float:
    """The scheduler's probe period, scaled with the engines (2 s of model time)."""
    return max(0.05, 2.0 / plan.time_scale)


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
