"""R12, R11: the runtime's ``run`` as an MCP task, in process, over raw JSON-RPC.

The runtime's MCP server (with the Tasks extension mounted, as ``luftpause
runtime`` serves it) runs over ``httpx.ASGITransport``; the dataplane is scripted
(the model calls the destructive ``rm`` twice, then answers) and the tool hub
counts calls (``tests/_runtime_fakes.py``). Every wait is bounded.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from _mcp_raw import WAIT_S, RawMcp
from _runtime_fakes import Hub, served_runtime, until

from luftpause.runtime.core import RunState
from luftpause.runtime.loop import DECLINED, Runtime
from luftpause.runtime.mcp_tasks import RESTART_ERROR


class Served(RawMcp):
    def __init__(self, http: httpx.AsyncClient, rt: Runtime, hub: Hub) -> None:
        super().__init__(http, client_name="tasks-client")
        self.rt = rt
        self.hub = hub

    async def call(self, tool: str, arguments: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return (
            await self.modern("tools/call", {"name": tool, "arguments": arguments}, **kwargs)
        ).result

    def payload(self, result: dict[str, Any]) -> dict[str, Any]:
        data = json.loads(result["content"][0]["text"])
        assert isinstance(data, dict)
        return data


@asynccontextmanager
async def serving(state: Path, hub: Hub | None = None) -> AsyncIterator[Served]:
    hub = hub or Hub()
    async with served_runtime(state, hub, WAIT_S * 3) as (http, rt):
        yield Served(http, rt, hub)


async def test_run_as_a_task_with_approvals_via_tasks_update(tmp_path: Path) -> None:
    """R12, R11: a Tasks client gets a task; each approval shows as input_required with an
    elicitation form; tasks/update answers it (journaled); the result is inlined when the
    run ends; the task record names its run."""
    async with serving(tmp_path) as s:
        created = await s.call("run", {"task": "clean up", "tools": ["rm"]})
        assert created["resultType"] == "task" and created["status"] == "working"
        task_id = created["taskId"]
        for allow in (True, False):
            task = await s.wait_for(task_id, "input_required", keys=1)
            [(key, request)] = task["inputRequests"].items()
            assert request["method"] == "elicitation/create"
            assert "rm" in request["params"]["message"]
            assert request["params"]["requestedSchema"]["properties"]["allow"]["type"] == "boolean"
            answer = {key: {"action": "accept", "content": {"allow": allow}}}
            ack = await s.modern("tasks/update", {"taskId": task_id, "inputResponses": answer})
            assert ack.result["resultType"] == "complete"
            if allow:
                await until(lambda: s.hub.calls == [{"path": "/a"}], "the allowed call")
        done = await s.wait_for(task_id, "completed")
        result = s.payload(done["result"])
        assert result["state"] == "Completed" and result["finished"] is True
        assert (result["toolCalls"], result["failedToolCalls"]) == (2, 1)
        assert s.hub.calls == [{"path": "/a"}]
        run = s.rt.state.runs[result["handle"]]
        assert run.approvals == {"0:0": True, "1:0": False}
        assert run.results[1][0]["content"] == DECLINED
    records = [json.loads(line) for line in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    assert {r["task"]["attachment"] for r in records if r["task"].get("attachment")} == {
        result["handle"]
    }


async def test_an_approval_answered_elsewhere_withdraws_the_request(tmp_path: Path) -> None:
    """R11, R12: ``approve`` from any client answers the call; the task's input request
    for it goes away and the task goes on."""
    async with serving(tmp_path) as s:
        task_id = (await s.call("run", {"task": "clean up", "tools": ["rm"]}))["taskId"]
        await s.wait_for(task_id, "input_required", keys=1)
        [run] = s.rt.state.runs.values()
        ok = s.payload(await s.call("approve", {"handle": run.id, "allow": True}, caps={}))
        assert ok["allowed"] is True
        await until(lambda: run.pending is not None and run.pending.key == "1:0", "next call")
        task = await s.wait_for(task_id, "input_required", keys=1)
        assert all("/1:0/" in key for key in task["inputRequests"]), task["inputRequests"]
        assert s.hub.calls == [{"path": "/a"}]
        await s.modern("tasks/cancel", {"taskId": task_id})


async def test_tasks_cancel_cancels_the_run_tree(tmp_path: Path) -> None:
    """R12, R9: tasks/cancel cancels the run (and its tree); the task reads cancelled."""
    async with serving(tmp_path) as s:
        task_id = (await s.call("run", {"task": "clean up", "tools": ["rm"]}))["taskId"]
        await s.wait_for(task_id, "input_required", keys=1)
        [run] = s.rt.state.runs.values()
        ack = await s.modern("tasks/cancel", {"taskId": task_id})
        assert ack.result["resultType"] == "complete"
        await until(lambda: run.done, "the run cancelled")
        assert run.state is RunState.CANCELLED and "tasks/cancel" in (run.error or "")
        assert (await s.get(task_id))["status"] == "cancelled"
        assert s.hub.calls == []


async def test_a_task_open_at_shutdown_fails_on_restart_while_its_run_resumes(
    tmp_path: Path,
) -> None:
    """R12, R8: the task was open when the runtime stopped: after the restart it reads
    failed; its run resumes from the journal and can still be approved and finish."""
    async with serving(tmp_path) as s:
        task_id = (await s.call("run", {"task": "clean up", "tools": ["rm"]}))["taskId"]
        await s.wait_for(task_id, "input_required", keys=1)
        [run_id] = s.rt.state.runs
    async with serving(tmp_path) as s2:
        task = await s2.get(task_id)
        assert task["status"] == "failed" and task["error"]["message"] == RESTART_ERROR
        run = s2.rt.state.runs[run_id]
        for _ in range(2):
            await until(lambda: run.pending is not None, "asked again")
            await s2.rt.decide_approval(run, True)
        await until(lambda: run.done, "the resumed run")
        assert run.state is RunState.COMPLETED and s2.hub.calls == [{"path": "/a"}, {"path": "/b"}]


async def test_without_the_extension_run_is_a_blocking_call(tmp_path: Path) -> None:
    """R12: a client that did not declare Tasks gets the blocking ``run``; with no
    elicitation either, it comes back at once with the approval to answer."""
    async with serving(tmp_path) as s:
        result = await s.call("run", {"task": "clean up", "tools": ["rm"]}, caps={})
        assert result.get("resultType") != "task"
        out = s.payload(result)
        assert out["state"] == "AwaitingApproval" and out["awaitingApproval"][0]["tool"] == "rm"
        await s.call("cancel", {"handle": out["handle"]}, caps={})


async def test_input_required_state_cannot_be_edited_or_moved(tmp_path: Path) -> None:
    """R11: the requestState a modern client echoes back is sealed: an edited one, or one
    sent with other arguments (another run), is refused; the genuine one is accepted."""
    caps = {"elicitation": {"form": {}}}
    async with serving(tmp_path) as s:
        first = await s.call("run", {"task": "clean up", "tools": ["rm"]}, caps=caps)
        assert first["resultType"] == "input_required", first
        state = first["requestState"]
        [key] = first["inputRequests"]
        answer = {key: {"action": "accept", "content": {"allow": True}}}
        base = {"name": "run", "arguments": {"task": "clean up", "tools": ["rm"]}}
        edited = state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")
        for params in (
            {**base, "requestState": edited, "inputResponses": answer},
            {
                "name": "run",
                "arguments": {"task": "something else", "tools": ["rm"]},
                "requestState": state,
                "inputResponses": answer,
            },
        ):
            reply = await s.modern("tools/call", params, caps=caps)
            assert "error" in reply.body, reply.body
            assert reply.body["error"]["code"] == -32602
        assert s.hub.calls == []
        ok = await s.modern(
            "tools/call", {**base, "requestState": state, "inputResponses": answer}, caps=caps
        )
        assert ok.result["resultType"] == "input_required"  # the second call now asks
        await until(lambda: s.hub.calls == [{"path": "/a"}], "the allowed call")


async def test_a_task_cancelled_at_once_leaves_no_run_behind(tmp_path: Path) -> None:
    """R12, R9: tasks/cancel right after the task is created (while its spawn may still
    be journaled) ends the run the spawn starts; nothing keeps running."""
    async with serving(tmp_path) as s:
        task_ids = [
            (await s.call("run", {"task": f"quick {i}", "tools": ["rm"]}))["taskId"]
            for i in range(3)
        ]
        for task_id in task_ids:
            await s.modern("tasks/cancel", {"taskId": task_id})
        await until(
            lambda: len(s.rt.state.runs) == 3 and all(r.done for r in s.rt.state.runs.values()),
            "every run ended",
        )
        assert {r.state for r in s.rt.state.runs.values()} == {RunState.CANCELLED}
        for task_id in task_ids:
            assert (await s.get(task_id))["status"] == "cancelled"
        assert s.hub.calls == []
