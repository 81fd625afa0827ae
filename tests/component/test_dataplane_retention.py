"""Component tests of B8 through the dataplane and the scheduler (in process, a recording
engine on 127.0.0.1:0): with an endpoint's ``kv_retention`` set, a turn of a run whose tool
time is known carries ``vllm_xargs.agentic_context`` {program_id, kv_retention_ttl_seconds};
a client's own ``vllm_xargs`` is kept; ``DELETE /v1/runs/{id}`` sends the fake engine's
release; with ``kv_retention = "none"`` nothing changes."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from _dataplane_stack import (
    MODEL,
    TOOL_COMPLETION,
    Stack,
    chat,
    paused_by_a_tool_call,
    settle,
    stack_fixture,  # noqa: F401  (provides the stack fixture)
)

from luftpause.config import KvRetention


def retention_on(stack: Stack, mechanism: KvRetention) -> None:
    stack.host.state = replace(
        stack.host.state, params=replace(stack.host.state.params, kv_retention=True)
    )
    stack.dp.endpoints["engine-a"] = stack.dp.endpoints["engine-a"].model_copy(
        update={"kv_retention": mechanism}
    )


async def back_from_the_tool(stack: Stack, **extra: Any) -> tuple[str, dict[str, Any]]:
    """A run pauses on ``lookup``, comes back 50 ms later: its run ID and the body the
    engine got for the turn after the tool."""
    first = await paused_by_a_tool_call(stack)
    run_id = first.headers["x-luftpause-run-id"]
    assert "vllm_xargs" not in json.loads(stack.engine.seen[-1].content)  # nothing learned
    await asyncio.sleep(0.05)
    messages = [
        {"role": "user", "content": "hi"},
        TOOL_COMPLETION["choices"][0]["message"],  # type: ignore[index]
        {"role": "tool", "tool_call_id": "call_abc", "content": "42"},
    ]
    second = await stack.client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages, **extra}
    )
    assert second.status_code == 200 and second.headers["x-luftpause-run-id"] == run_id
    return run_id, json.loads(stack.engine.seen[-1].content)


async def test_a_run_back_from_a_tool_asks_the_engine_to_keep_its_prefix(stack: Stack) -> None:
    """B8: the turn after a tool carries the run's usual tool time as the hint, in the
    shape vllm-router and the fake engine read (a JSON string context); the run's end
    releases it at the fake engine."""
    retention_on(stack, KvRetention.FAKE)
    run_id, body = await back_from_the_tool(stack)
    context = json.loads(body["vllm_xargs"]["agentic_context"])
    assert context["program_id"] == run_id
    learned = stack.host.state.tool_times["lookup"]
    assert context["kv_retention_ttl_seconds"] == round(learned.mean_s + learned.dev_s, 3) > 0
    seen = len(stack.engine.seen)
    ended = await stack.client.delete(f"/v1/runs/{run_id}")
    assert ended.status_code == 200
    await settle(stack.host, lambda: len(stack.engine.seen) > seen)
    release = stack.engine.seen[-1]
    assert release.path == "/kv_retention/release"
    assert json.loads(release.content) == {"program_id": run_id}
    assert release.headers["authorization"].startswith("Bearer ")


async def test_the_router_mechanism_sends_the_hint_but_no_release(stack: Stack) -> None:
    """B8: ``vllm-router`` has no release: the run's end sends nothing to the engine."""
    retention_on(stack, KvRetention.VLLM_ROUTER)
    run_id, body = await back_from_the_tool(stack)
    assert json.loads(body["vllm_xargs"]["agentic_context"])["program_id"] == run_id
    seen = len(stack.engine.seen)
    assert (await stack.client.delete(f"/v1/runs/{run_id}")).status_code == 200
    assert len(stack.engine.seen) == seen


async def test_a_clients_own_vllm_xargs_is_kept(stack: Stack) -> None:
    """B8: a body that carries its own ``vllm_xargs`` reaches the engine as sent."""
    retention_on(stack, KvRetention.FAKE)
    own = {"agentic_context": '{"program_id":"mine"}'}
    _, body = await back_from_the_tool(stack, vllm_xargs=own)
    assert body["vllm_xargs"] == own


async def test_without_the_option_bodies_are_unchanged(stack: Stack) -> None:
    """B8: ``kv_retention = "none"`` (the default) adds nothing, even with times known."""
    stack.host.state = replace(
        stack.host.state, params=replace(stack.host.state.params, kv_retention=True)
    )
    _, body = await back_from_the_tool(stack)
    assert "vllm_xargs" not in body
    raw = json.dumps(chat()).encode()
    await stack.client.post("/v1/chat/completions", content=raw)
    assert stack.engine.seen[-1].content == raw
