"""The luftpause arm: its scheduler and dataplane, their config, and what the
scheduler's ``/status`` and the dataplane's ``/metrics`` say over an arm's window.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from luftpause.procs import (
    ServiceProcess,
)
from luftpause.scheduler.core import Params
from tools.bench.arms.plan import MODEL, ROOT, Stack


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


def runtime_available() -> bool:
    return (ROOT / "src/luftpause/runtime/main.py").exists()


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
