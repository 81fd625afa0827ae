"""D6, S9: an engine that dies leaves placement at its first refused connection."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fullstack import MODEL, eventually, start_stack

pytestmark = pytest.mark.integration

PROBE_PERIOD_S = 60.0  # so long that no probe can be what takes the dead engine out


async def test_a_killed_engine_leaves_placement_at_its_first_refused_connection(
    services: Any, tmp_path: Path
) -> None:
    """D6, S9: SIGKILL one of two engines. The first turn sent to it fails with a 502;
    from then on, long before any probe could notice, the scheduler shows it unhealthy
    and every new turn goes to the live engine instead of failing on the dead one."""
    stack = start_stack(services, tmp_path, probe_period_s=PROBE_PERIOD_S)

    async def both_healthy() -> bool:
        return all(r["healthy"] for r in (await stack.status())["replicas"])

    await eventually(both_healthy, what="the first probes")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as client:
        stack.engines["engine-a"].stop(signal.SIGKILL)
        killed_at = time.monotonic()
        statuses: list[int] = []
        replicas: list[str] = []
        for i in range(12):
            resp = await client.post(
                "/chat/completions", json=body, headers={"x-luftpause-run-id": f"r{i}"}
            )
            statuses.append(resp.status_code)
            replicas.append(resp.headers.get("x-luftpause-replica", ""))
            if resp.status_code == 502:
                assert resp.json()["error"]["message"].startswith("engine engine-a:")

                async def out_of_placement() -> bool:
                    reps = {r["name"]: r for r in (await stack.status())["replicas"]}
                    return reps["engine-a"]["healthy"] is False

                await eventually(out_of_placement, timeout=5, what="engine-a out of placement")
                status = {r["name"]: r for r in (await stack.status())["replicas"]}
                # not a probe: the last one was before the kill
                assert status["engine-a"]["probed_s_ago"] > time.monotonic() - killed_at
        # At most one turn can have been sent to the dead engine before its failure was
        # reported (the next one may race that report); every later turn went elsewhere.
        failures = [i for i, s in enumerate(statuses) if s == 502]
        assert 1 <= len(failures) <= 2, statuses
        assert all(s == 200 for s in statuses[failures[-1] + 1 :]), statuses
        assert all(r == "engine-b" for r in replicas[failures[-1] + 1 :]), replicas
    assert await stack.dataplane_metric(
        'luftpause_dataplane_turns_total{outcome="engine_unreachable",service_class="batch"}'
    ) == len(failures)
