"""S11, D6: the scheduler is SIGKILLed and restarted in the middle of a flood."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import openai
import pytest
from fullstack import eventually, start_stack
from test_dataplane_stack import agent_run

pytestmark = pytest.mark.integration


async def test_scheduler_killed_mid_flood_loses_nothing(services: Any, tmp_path: Path) -> None:
    """S11, D6: with 12 agent runs in flight the scheduler is SIGKILLed and restarted on the
    same port. Every run finishes without an error, every turn of a run stays on one
    replica, and afterwards the restarted scheduler holds nothing and counts nothing in
    flight."""
    stack = start_stack(services, tmp_path, engine_args=("--time-scale", "2"))
    client = openai.AsyncOpenAI(
        base_url=stack.base_url, api_key="unused", timeout=120, max_retries=0
    )
    runs = [
        asyncio.create_task(
            agent_run(
                client,
                f"flood-{i}",
                topic=f"topic {i}",
                cls="interactive" if i % 4 == 0 else "batch",
            )
        )
        for i in range(12)
    ]

    async def busy() -> bool:
        s = await stack.status()
        return s["counters"].get("admitted", 0) >= 12  # type: ignore[no-any-return]

    await eventually(busy, what="the flood to get going")
    grpc_port, http_port = stack.scheduler.ports["grpc"], stack.scheduler.ports["http"]
    stack.scheduler.stop(signal.SIGKILL)
    await asyncio.sleep(1.0)  # the outage: turns wait, none fails
    assert not any(r.done() and r.exception() for r in runs)
    stack.scheduler = services.start(
        "scheduler",
        "--config",
        str(stack.config),
        "--port",
        str(grpc_port),
        "--http-port",
        str(http_port),
        name="scheduler-restarted",
    )
    results = await asyncio.wait_for(asyncio.gather(*runs), 180)
    for run_id, replicas, turns in results:
        assert turns == 4, f"{run_id} took {turns} turns"
        assert len(replicas) == 1, f"{run_id} moved between replicas: {replicas}"

    async def quiet() -> bool:
        s = await stack.status()
        return s["held_total"] == 0 and s["in_flight_total"] == 0  # type: ignore[no-any-return]

    await eventually(quiet, what="the restarted scheduler to settle")
    assert "resynced" in stack.dataplane.stderr() or "link up" in stack.dataplane.stderr()
