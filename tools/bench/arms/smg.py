"""The SGLang Model Gateway arms (PyPI smg 1.13.0): its priority scheduler's config,
the capped and FIFO sweeps, command lines, and its queue waits from ``/metrics``.
"""

from __future__ import annotations

import math
from pathlib import Path

import httpx

from luftpause.sim.arms import SMG_STARVATION_S
from tools.bench.arms.plan import INTERACTIVE_AGENTS, Plan

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
# SMG's built-in starvation thresholds are SMG_STARVATION_S (model seconds; one table
# with the simulator's SMG arms, luftpause.sim.arms).
SMG_QUEUE_SIZE = {"system": 64, "interactive": 256, "default": 512, "bulk": 1024}
SMG_COMMON_FLAGS = (
    "--sticky-sessions", "--routing-key-headers", SMG_KEY_HEADER,
    # A saturated engine sits at KV usage ~0.98, above the default 0.8 veto, which then
    # drops sticky pins (measured): off, as an operator running agents would set it.
    "--disable-worker-overload-protection",
)  # fmt: skip


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
