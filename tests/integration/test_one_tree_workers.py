"""D, B6 (#38): ``GET /v1/tool_calls/{id}`` with two dataplane processes on one port.

Each process knows only the tool calls of the replies it relayed itself; its 404 says
``x-luftpause-dataplane-workers: 2``, and the runtime's lookup then tries again on a new
connection (the kernel picks a process per connection) until one knows the call. Harness
turns, each on a connection of its own, land on both processes; every one of their tool
calls is then found through the shared port, by the runtime's client.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from fullstack import MODEL, write_config

from luftpause.procs import free_port
from luftpause.runtime.llm import DataplaneClient

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "spawn",
            "description": "start a sub-agent",
            "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
        },
    }
]


async def test_a_lookup_finds_a_tool_call_whichever_worker_relayed_it(
    services: Any, tmp_path: Path
) -> None:
    engine = services.start(
        "fake-engine", "--port", "0", "--name", "engine-a", "--time-scale", "20",
        "--log-level", "WARNING", name="engine-a",
    )  # fmt: skip
    port = free_port()
    config = write_config(
        tmp_path / "stack.toml", {"engine-a": engine.urls["http"]}, probe_period_s=0.2
    )
    config.write_text(
        config.read_text().replace("[dataplane]\n", f"[dataplane]\nworkers = 2\nport = {port}\n")
    )
    sched = services.start("scheduler", "--config", str(config), "--port", "0", "--http-port", "0")
    for ident in ("w1", "w2"):
        services.start(
            "dataplane", "--config", str(config), "--port", str(port), "--reuse-port",
            "--dataplane-id", ident, "--scheduler", f"127.0.0.1:{sched.ports['grpc']}",
            name=f"dataplane {ident}",
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    async def harness_turn(i: int) -> tuple[str, str]:
        async with httpx.AsyncClient(timeout=60) as c:  # a connection of its own
            response = await c.post(
                f"{base}/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"task {i} [tool:spawn]"}],
                    "tools": TOOLS,
                    "max_tokens": 64,
                },
                headers={"x-claude-code-session-id": f"sess-{i}"},
            )
        assert response.status_code == 200, response.text
        [call] = response.json()["choices"][0]["message"]["tool_calls"]
        return call["id"], response.headers["x-luftpause-run-id"]

    turns = await asyncio.gather(*(harness_turn(i) for i in range(12)))
    # Both processes relayed turns: some plain lookups (a new connection each) reach one
    # that did not, which says that two processes share the port.
    misses = 0
    for call_id, _ in turns:
        for _ in range(4):
            async with httpx.AsyncClient(timeout=10) as c:
                got = await c.get(f"{base}/v1/tool_calls/{call_id}")
            if got.status_code == 404:
                assert got.headers["x-luftpause-dataplane-workers"] == "2", got.headers
                misses += 1
    assert misses > 0, "every lookup reached the process that relayed the turn"
    client = DataplaneClient(base, token=None, turn_timeout_s=30, retry_after_default_s=1)
    try:
        for call_id, run_id in turns:
            origin = await client.tool_call_origin(call_id)
            assert origin is not None, f"{call_id} of {run_id} not found"
            assert origin.run_id == run_id and origin.tool_call_id == call_id
        assert await client.tool_call_origin("call_nobody_made") is None
    finally:
        await client.aclose()
