"""Start a real stack (fake engines, scheduler, dataplane) for integration tests."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from luftpause.loadgen.main import add_arguments
from luftpause.loadgen.main import main as loadgen_main

MODEL = "llama-3.2-1b"
LOADGEN_TIMEOUT_S = 60.0  # a load generator run in a test stops by itself well before


@dataclass
class Stack:
    engines: dict[str, Any]  # name -> Service
    scheduler: Any
    dataplane: Any
    config: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"{self.dataplane.urls['http']}/v1"

    @property
    def status_url(self) -> str:
        return f"{self.scheduler.urls['http']}/status"

    def engine_url(self, name: str) -> str:
        return str(self.engines[name].urls["http"])

    async def status(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as c:
            return dict((await c.get(self.status_url, timeout=5)).json())

    async def engine_state(self, name: str) -> dict[str, Any]:
        async with httpx.AsyncClient() as c:
            return dict((await c.get(f"{self.engine_url(name)}/debug/state", timeout=5)).json())

    async def dataplane_metric(self, needle: str) -> float:
        async with httpx.AsyncClient() as c:
            text = (await c.get(f"{self.dataplane.urls['http']}/metrics", timeout=5)).text
        for line in text.splitlines():
            if line.startswith(needle + " "):
                return float(line.split()[-1])
        return 0.0


def write_config(
    path: Path, engines: dict[str, str], extra: str = "", probe_period_s: float = 0.2
) -> Path:
    text = (
        f"[scheduler]\nprobe_period_s = {probe_period_s}\n[dataplane]\nreport_reconnect_s = 0.2\n"
    )
    for name, url in engines.items():
        text += (
            f'[[endpoints]]\nname = "{name}"\nurl = "{url}"\nmodels = ["{MODEL}"]\n'
            'metrics = "sglang"\n'
        )
    path.write_text(text + extra)
    return path


def write_runtime_config(tmp: Path, dataplane_url: str, tools_url: str) -> Path:
    """``tmp/runtime.toml``: a runtime on ``dataplane_url`` with the fake tool server at
    ``tools_url`` (its base URL) and its state in ``tmp/state``."""
    path = tmp / "runtime.toml"
    path.write_text(
        f'[runtime]\ndataplane_url = "{dataplane_url}"\n'
        f'state_dir = "{tmp / "state"}"\ndefault_model = "{MODEL}"\n'
        f'[[runtime.tool_servers]]\nname = "fake"\nurl = "{tools_url}/mcp"\n'
    )
    return path


def start_stack(
    services: Any,
    tmp: Path,
    engine_args: tuple[str, ...] = ("--time-scale", "20"),
    engines: tuple[str, ...] = ("engine-a", "engine-b"),
    extra_config: str = "",
    dataplane_env: dict[str, str] | None = None,
    probe_period_s: float = 0.2,
    scheduler_env: dict[str, str] | None = None,
) -> Stack:
    started = start_engines(services, engines, *engine_args)
    config = write_config(
        tmp / "stack.toml",
        {n: s.urls["http"] for n, s in started.items()},
        extra_config,
        probe_period_s,
    )
    sched, dp = start_scheduler_and_dataplane(services, config, dataplane_env, scheduler_env)
    return Stack(started, sched, dp, config)


def start_engines(services: Any, names: Sequence[str], *args: str) -> dict[str, Any]:
    """Fake engines named ``names`` on free ports, each with ``args``."""
    common = ("--port", "0", "--log-level", "WARNING")
    return {n: services.start("fake-engine", "--name", n, *common, *args, name=n) for n in names}


def start_scheduler_and_dataplane(
    services: Any,
    config: Path,
    dataplane_env: dict[str, str] | None = None,
    scheduler_env: dict[str, str] | None = None,
) -> tuple[Any, Any]:
    """The scheduler and a dataplane linked to it, on free ports, from ``config``."""
    sched = services.start(
        "scheduler", "--config", str(config), "--port", "0", "--http-port", "0", env=scheduler_env
    )
    dp = services.start(
        "dataplane",
        "--config",
        str(config),
        "--port",
        "0",
        "--scheduler",
        f"127.0.0.1:{sched.ports['grpc']}",
        env=dataplane_env,
    )
    return sched, dp


async def eventually(check: Any, timeout: float = 15.0, what: str = "condition") -> None:
    """Poll an async predicate until it holds (bounded)."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


async def loadgen_here(tmp: Path, *argv: str) -> tuple[int, str, dict[str, Any]]:
    """The same command in a thread of this process (saves a start-up's imports)."""
    out = tmp / "result.json"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([*argv, "--json", str(out)])

    def call() -> tuple[int, str]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = loadgen_main(args)
        return rc, buf.getvalue()

    async with asyncio.timeout(LOADGEN_TIMEOUT_S):
        rc, stdout = await asyncio.to_thread(call)
    result = json.loads(out.read_text()) if out.exists() else {}
    return rc, stdout, result
