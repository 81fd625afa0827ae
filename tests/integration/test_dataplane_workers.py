"""B6, S11: two dataplane processes on one port (``--reuse-port``, as ``luftpause up``
starts ``dataplane.workers``) and one scheduler. Both serve turns arriving on the shared
port, the scheduler counts each one's in-flight turns apart, a SIGKILLed one's turns are
released within the grace while the other keeps serving, and a restarted one rejoins."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from fullstack import MODEL, eventually, write_config

from luftpause.procs import free_port

pytestmark = pytest.mark.integration

GRACE_S = 2.0


def start_dataplane(services: Any, config: Path, port: int, sched: Any, ident: str) -> Any:
    return services.start(
        "dataplane", "--config", str(config), "--port", str(port), "--reuse-port",
        "--dataplane-id", ident, "--scheduler", f"127.0.0.1:{sched.ports['grpc']}",
        name=f"dataplane {ident}",
    )  # fmt: skip


async def test_two_dataplanes_share_a_port_and_a_dead_one_is_released(
    services: Any, tmp_path: Path
) -> None:
    engine = services.start(
        "fake-engine", "--port", "0", "--name", "engine-a", "--time-scale", "5",
        "--log-level", "WARNING", name="engine-a",
    )  # fmt: skip
    config = write_config(tmp_path / "stack.toml", {"engine-a": engine.urls["http"]})
    config.write_text(
        config.read_text().replace(
            "[scheduler]\n", f"[scheduler]\ndataplane_grace_s = {GRACE_S}\n", 1
        )
    )
    sched = services.start("scheduler", "--config", str(config), "--port", "0", "--http-port", "0")
    port = free_port()
    workers = {
        ident: start_dataplane(services, config, port, sched, ident) for ident in ("w1", "w2")
    }
    base = f"http://127.0.0.1:{port}/v1"
    status_url = f"{sched.urls['http']}/status"

    async def in_flight() -> dict[str, int]:
        async with httpx.AsyncClient(timeout=5) as c:
            return dict((await c.get(status_url)).json()["in_flight_by_dataplane"])

    async def flood(n: int, tag: str) -> list[asyncio.Task[httpx.Response]]:
        async def one(i: int) -> httpx.Response:
            # A connection of its own per turn: the kernel picks a dataplane per connection.
            async with httpx.AsyncClient(timeout=120) as c:
                return await c.post(
                    f"{base}/chat/completions",
                    json={
                        "model": MODEL,
                        "messages": [{"role": "user", "content": f"{tag} {i}"}],
                        "max_tokens": 300,
                        "ignore_eos": True,
                    },
                    headers={"x-luftpause-run-id": f"{tag}-{i}"},
                )

        return [asyncio.create_task(one(i)) for i in range(n)]

    first = await flood(16, "a")

    async def both_serving() -> bool:
        seen = await in_flight()
        return seen.get("w1", 0) > 0 and seen.get("w2", 0) > 0

    await eventually(both_serving, timeout=30, what="turns in flight on both dataplanes")

    # SIGKILL one mid-flood: its clients see their connections cut; its slots come back
    # once the grace has passed, while the other keeps serving.
    workers["w1"].proc.send_signal(signal.SIGKILL)
    workers["w1"].proc.wait(timeout=10)

    async def w1_released() -> bool:
        return "w1" not in await in_flight()

    await eventually(w1_released, timeout=GRACE_S + 10, what="w1's turns to be released")
    results = await asyncio.gather(*first, return_exceptions=True)
    served = [r for r in results if isinstance(r, httpx.Response) and r.status_code == 200]
    cut = [r for r in results if not isinstance(r, httpx.Response)]
    assert served and cut, results  # w2's turns finished, w1's were cut off
    after = await flood(4, "b")
    assert all(r.status_code == 200 for r in await asyncio.gather(*after))

    # w1 comes back under its name and serves again.
    start_dataplane(services, config, port, sched, "w1")
    again = await flood(16, "c")

    async def w1_serving() -> bool:
        return (await in_flight()).get("w1", 0) > 0

    await eventually(w1_serving, timeout=30, what="the restarted w1 to take turns")
    assert all(r.status_code == 200 for r in await asyncio.gather(*again))
    async with httpx.AsyncClient(timeout=5) as c:
        assert (await c.get(status_url)).json()["dataplanes_lost"] == {}
