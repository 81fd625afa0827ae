"""S7 end to end: a real router as one luftpause replica, its load read from its engines.

Real processes on loopback: two fake engines (each running one request at a time),
a real router in front of them (the SGLang router, and SMG), and the scheduler
and dataplane with a config whose only generative endpoint is the router's URL
with ``load_from`` = the engines' URLs (docs/guides/routers.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fullstack import MODEL, eventually, start_engines, start_scheduler_and_dataplane

from luftpause.procs import RouterProcess, launch_sglang_router, launch_smg

pytestmark = pytest.mark.integration

Launcher = Callable[[list[str], str, Path, str], RouterProcess]
ROUTERS: dict[str, Launcher] = {"sglang-router": launch_sglang_router, "smg": launch_smg}
# At time scale 10: ~11 s of decoding per slow turn, so the probes (every 2 s) see the
# load however busy this machine is; the turns are cut off once it has been seen.
SLOW_TOKENS = 6000


def router_config(path: Path, router_url: str, engine_urls: list[str]) -> Path:
    load_from = ", ".join(f'"{u}"' for u in engine_urls)
    path.write_text(
        "[scheduler]\nprobe_period_s = 0.2\n[dataplane]\nreport_reconnect_s = 0.2\n"
        f'[[endpoints]]\nname = "router"\nurl = "{router_url}"\nmodels = ["{MODEL}"]\n'
        f'metrics = "sglang"\nload_from = [{load_from}]\n'
    )
    return path


async def submitted(c: httpx.AsyncClient, url: str) -> int:
    return int((await c.get(f"{url}/debug/state", timeout=5)).json()["submitted"])


@pytest.mark.parametrize("router_name", list(ROUTERS))
async def test_router_as_a_replica_with_load_from_its_engines(
    router_name: str, services: Any, tmp_path: Path
) -> None:
    """S7, S6, S9: turns through the dataplane reach the engines via the router; the
    scheduler's /status shows the router replica's load as read from the engines
    (running and queued while slow turns are in flight); an unknown model is a 404 from
    the dataplane that never reaches an engine."""
    started = start_engines(
        services, ("engine-a", "engine-b"), "--time-scale", "10", "--max-running", "1"
    )
    engines = [e.urls["http"] for e in started.values()]
    router = await asyncio.to_thread(
        ROUTERS[router_name], engines, "round_robin", tmp_path / "router.stderr", MODEL
    )
    try:
        config = router_config(tmp_path / "stack.toml", router.url, engines)
        sched, dp = start_scheduler_and_dataplane(services, config)
        base = f"{dp.urls['http']}/v1"
        status_url = f"{sched.urls['http']}/status"
        async with httpx.AsyncClient(timeout=60) as c:

            async def replica() -> dict[str, Any]:
                status = (await c.get(status_url, timeout=5)).json()
                [rep] = [r for r in status["replicas"] if r["name"] == "router"]
                return dict(rep)

            async def probed_healthy() -> bool:
                rep = await replica()
                return bool(rep["healthy"]) and rep["probed_s_ago"] is not None

            await eventually(probed_healthy, what="the router replica to be probed healthy")
            idle = await replica()
            assert (idle["engine_running"], idle["engine_waiting"]) == (0, 0)

            # Turns through the dataplane reach the engines via the router.
            before = [await submitted(c, u) for u in engines]
            for i in range(2):
                resp = await c.post(
                    f"{base}/chat/completions",
                    json={
                        "model": MODEL,
                        "messages": [{"role": "user", "content": f"question {i}"}],
                        "max_tokens": 4,
                    },
                    headers={"x-luftpause-run-id": f"quick-{i}"},
                )
                assert resp.status_code == 200, resp.text
                assert resp.headers["x-luftpause-replica"] == "router"
                assert resp.json()["model"] == MODEL
            after = [await submitted(c, u) for u in engines]
            assert sum(after) - sum(before) == 2
            assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)

            # Three slow turns: round robin puts two on one engine, which runs one and
            # queues the other. The replica's load comes from the engines' /metrics.
            async def slow(i: int) -> httpx.Response:
                return await c.post(
                    f"{base}/chat/completions",
                    json={
                        "model": MODEL,
                        "messages": [{"role": "user", "content": f"write at length {i}"}],
                        "max_tokens": SLOW_TOKENS,
                        "ignore_eos": True,
                    },
                    headers={"x-luftpause-run-id": f"slow-{i}"},
                )

            slow_turns = [asyncio.create_task(slow(i)) for i in range(3)]

            async def loaded() -> bool:
                rep = await replica()
                return bool(rep["engine_running"] == 2 and rep["engine_waiting"] >= 1)

            await eventually(loaded, what="running 2 and queued 1 read from the engines")
            engine_states = [
                (await c.get(f"{u}/debug/state", timeout=5)).json()["metrics"] for u in engines
            ]
            assert sum(m["running"] for m in engine_states) == 2
            for turn in slow_turns:  # the clients leave: the engines stop generating (D6)
                turn.cancel()
            await asyncio.gather(*slow_turns, return_exceptions=True)

            async def drained() -> bool:
                rep = await replica()
                return (rep["engine_running"], rep["engine_waiting"]) == (0, 0)

            await eventually(drained, what="the engines' load to drop back to zero")

            # S6: an unknown model is a 404 from the dataplane, never sent on.
            before = [await submitted(c, u) for u in engines]
            unknown = await c.post(
                f"{base}/chat/completions",
                json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
            )
            assert unknown.status_code == 404
            assert unknown.json()["error"]["message"] == (
                "no Generative replica serves model 'no-such-model'"
            )
            assert [await submitted(c, u) for u in engines] == before
    except BaseException:
        print(f"--- {router.name} stderr ---\n{router.stderr()}")
        raise
    finally:
        await asyncio.to_thread(router.stop)
