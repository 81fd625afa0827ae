"""B13, R11, R12: callers' keys on ``/mcp`` in process - approvals and tasks.

The runtime's MCP server with the Tasks extension runs over ``httpx.ASGITransport``
behind :class:`~luftpause.runtime.server.CallerAuth` with a gate of two callers; the
dataplane is scripted and the tool hub holds one destructive tool, ``rm``, whose
calls wait for approval (``tests/_runtime_fakes.py``). Every wait is bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
from _mcp_raw import EXT_CAPS, WAIT_S, RawMcp
from _runtime_fakes import Hub, runtime, until

from luftpause.callers import gate_for, new_key
from luftpause.config import CallerConfig
from luftpause.runtime.core import RunState
from luftpause.runtime.loop import Runtime
from luftpause.runtime.mcp_tasks import TasksExtension, TaskStore
from luftpause.runtime.server import CallerAuth, build_mcp, transport_security_for

TOKEN = "services-own-token-" + "t" * 24
ALICE = new_key()
BOB = new_key()
CALLERS = (
    CallerConfig(name="alice", key_env="ALICE_KEY", classes=("interactive", "batch")),
    CallerConfig(name="bob", key_env="BOB_KEY"),
)


@asynccontextmanager
async def served(state: Path) -> AsyncIterator[tuple[dict[str, RawMcp], Runtime]]:
    """The runtime behind the callers' gate; a client per credential."""
    rt, lines = runtime(state, Hub())
    tasks = TasksExtension(TaskStore(state))
    mcp = build_mcp(rt, tasks=tasks, request_state_key=b"k" * 32)
    app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=False,
        transport_security=transport_security_for("127.0.0.1"),
    )
    gate = gate_for(CALLERS, {"ALICE_KEY": ALICE, "BOB_KEY": BOB}, TOKEN)
    transport = httpx.ASGITransport(app=CallerAuth(app, gate))
    with anyio.fail_after(WAIT_S * 3):
        async with tasks.running(), mcp.session_manager.run():
            rt.recover(lines)
            clients = {
                name: httpx.AsyncClient(
                    transport=transport,
                    base_url="http://127.0.0.1",
                    headers={"Authorization": f"Bearer {key}"},
                )
                for name, key in (("alice", ALICE), ("bob", BOB), ("token", TOKEN))
            }
            try:
                yield {name: RawMcp(http, f"{name}-client") for name, http in clients.items()}, rt
            finally:
                await rt.shutdown()
                for http in clients.values():
                    await http.aclose()


async def call(client: RawMcp, tool: str, arguments: dict[str, Any], **params: Any) -> Any:
    reply = await client.modern(
        "tools/call", {"name": tool, "arguments": arguments, **params}, caps={}
    )
    return reply.result


async def test_an_approval_of_another_callers_run_cannot_be_answered(tmp_path: Path) -> None:
    """B13, R11: an ``inputResponses`` answer naming another caller's run (in an ``await``
    of one's own run) is ignored, as an answer to a run that does not exist is; with
    its own key the caller answers it; ``approve`` with the other key is refused."""
    async with served(tmp_path) as (c, rt):
        mine = (await call(c["alice"], "spawn", {"task": "a", "tools": ["rm"]}))[
            "structuredContent"
        ]
        theirs = (await call(c["bob"], "spawn", {"task": "b", "tools": ["rm"]}))[
            "structuredContent"
        ]
        run = rt.state.runs[mine["handle"]]
        await until(lambda: run.pending is not None, "alice's approval")
        await until(lambda: rt.state.runs[theirs["handle"]].pending is not None, "bob's")
        answer = {f"approve/{run.id}/0:0": {"action": "accept", "content": {"allow": True}}}
        await call(
            c["bob"],
            "await",
            {"handles": [theirs["handle"]], "timeout": 0.05},
            inputResponses=answer,
        )
        assert run.approvals == {} and run.state is RunState.AWAITING_APPROVAL
        refused = await call(c["bob"], "approve", {"handle": run.id, "allow": True})
        assert refused["isError"] is True
        await call(
            c["alice"], "await", {"handles": [run.id], "timeout": 0.05}, inputResponses=answer
        )
        assert run.approvals == {"0:0": True}
        await call(c["token"], "cancel", {"handle": run.id})
        await call(c["token"], "cancel", {"handle": theirs["handle"]})


async def test_a_run_task_runs_as_its_keys_caller(tmp_path: Path) -> None:
    """B13, R12: ``run`` as an MCP task, created with a caller's key, spawns a run of that
    caller in a class it may use; another caller's ``await`` does not see it."""
    async with served(tmp_path) as (c, rt):
        reply = await c["bob"].modern(
            "tools/call",
            {"name": "run", "arguments": {"task": "t", "tools": [], "serviceClass": "interactive"}},
            caps=EXT_CAPS,
        )
        assert reply.result["resultType"] == "task", reply.body
        await until(lambda: len(rt.state.runs) == 1, "the task's run")
        [run] = rt.state.runs.values()
        assert (run.caller, run.owner) == ("bob", "bob")
        assert (run.spec.service_class, run.class_denied) == ("batch", "interactive")
        hidden = await call(c["alice"], "await", {"handles": [run.id], "timeout": 0.05})
        assert hidden["isError"] is True
        await until(lambda: run.done, "the run")
