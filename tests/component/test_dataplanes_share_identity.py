"""B6, D2: several dataplanes on one scheduler. A header-less agent is one run whichever
dataplane each of its turns goes through, and a dataplane that comes back empty (a
restart) still finds it: the scheduler remembers every dataplane's tool calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from _dataplane_stack import (
    MODEL,
    TOOL_COMPLETION,
    Stack,
    chat,
    make_dataplane,
    paused_by_a_tool_call,
    settle,
    stack_fixture,  # noqa: F401  (provides the stack fixture)
)

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.dataplane.app import create_app
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.scheduler_link import SchedulerLink


@asynccontextmanager
async def another_dataplane(stack: Stack, name: str) -> AsyncIterator[httpx.AsyncClient]:
    """A second dataplane process's worth of state (its own run table and tool call
    memory) on the stack's scheduler and engine."""
    dp = make_dataplane(stack.grpc_address, stack.engine.url, name)
    maintain = asyncio.create_task(dp.link.maintain())
    async with asyncio.timeout(5):
        await dp.link.ready.wait()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(create_app(dp)), base_url="http://dp")
    try:
        yield client
    finally:
        await dp.link.close()  # as the dataplane stops: its last reports are written first
        maintain.cancel()
        await client.aclose()
        await dp.http.close()


def continuation() -> dict[str, object]:
    """The agent's next turn: it echoes the tool call it answered, and names no run."""
    return {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "hi"},
            TOOL_COMPLETION["choices"][0]["message"],  # type: ignore[index]
            {"role": "tool", "tool_call_id": "call_abc", "content": "42"},
        ],
    }


async def test_header_less_run_keeps_its_identity_across_dataplanes(stack: Stack) -> None:
    """B6, D2: turn 1 on one dataplane ends in a tool call; turn 2, on a dataplane that
    never saw the run, echoes it and joins the same run on the scheduler (no second
    run is made), which is paused on the tool until then."""
    first = await paused_by_a_tool_call(stack)
    run_id = first.headers["x-luftpause-run-id"]
    async with another_dataplane(stack, "dp-2") as other:
        second = await other.post("/v1/chat/completions", json=continuation())
        assert second.status_code == 200
        assert second.headers["x-luftpause-run-id"] == run_id
        assert second.headers["x-luftpause-replica"] == first.headers["x-luftpause-replica"]
        await settle(stack.host, lambda: not stack.host.state.turns)
        assert set(stack.host.state.runs) == {run_id}
        # Without an echo, the other dataplane starts a run of its own.
        fresh = await other.post("/v1/chat/completions", json=chat())
        assert fresh.headers["x-luftpause-run-id"] != run_id


async def test_a_restarted_dataplane_finds_header_less_runs(stack: Stack) -> None:
    """B6, D2: a dataplane that comes back with an empty run table and memory (as after
    a restart) still puts an echoed tool call's turn in its run; an echo nobody issued
    starts a new run."""
    stack.engine.reply = lambda r: httpx.Response(200, json=TOOL_COMPLETION)
    async with another_dataplane(stack, "dp-before") as before:
        first = await before.post("/v1/chat/completions", json=chat())
    run_id = first.headers["x-luftpause-run-id"]
    await settle(stack.host, lambda: not stack.host.state.turns)
    async with another_dataplane(stack, "dp-after") as after:
        again = await after.post("/v1/chat/completions", json=continuation())
        assert again.headers["x-luftpause-run-id"] == run_id
        stranger = continuation()
        stranger["messages"][-1]["tool_call_id"] = "call_nobody_made"  # type: ignore[index]
        unknown = await after.post("/v1/chat/completions", json=stranger)
        assert unknown.headers["x-luftpause-run-id"] not in (run_id, "")


async def test_a_stopping_dataplane_writes_its_last_reports_first(stack: Stack) -> None:
    """S11, D5: reports queued when a dataplane stops are written before its link closes,
    so its last turns are not left counted on the scheduler until the grace runs out."""
    runs = RunTable(time.monotonic, 1800)
    link = SchedulerLink(stack.grpc_address, "dp-stopping", runs, reconnect_s=0.1)
    maintain = asyncio.create_task(link.maintain())
    try:
        async with asyncio.timeout(5):
            await link.ready.wait()
        for i in range(20):
            admitted = await link.admit(
                pb.AdmitRequest(
                    turn_id=f"t{i}", run_id=f"r{i}", model=MODEL, kind=pb.ENDPOINT_KIND_GENERATIVE
                )
            )
            assert getattr(admitted, "replica", "") == "engine-a"
        assert len(stack.host.state.turns) == 20
        for i in range(20):
            link.report(pb.TurnEvent(turn_id=f"t{i}", run_id=f"r{i}", finished=pb.TurnFinished()))
        await link.close()  # at once: the reports are still queued
    finally:
        maintain.cancel()
        await asyncio.gather(maintain, return_exceptions=True)
    await settle(stack.host, lambda: not stack.host.state.turns)
