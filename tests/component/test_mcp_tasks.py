"""Component tests of the MCP Tasks layer (R12; approvals surface as input_required, R11).

Served in process: the test fixture server (``tests/fixtures/mcp_tasks_fixture.py``)
plus a few test-only task tools whose work a ``Gate`` holds, driven by raw JSON-RPC
over ``httpx.ASGITransport`` in both protocol eras (2026-07-28 per-request
envelopes, 2025-11-25 ``initialize`` sessions), and ``TaskStore`` directly for the
journal (``tasks.jsonl``) and its replay. Every wait is bounded by
``anyio.fail_after``; work is held and released by events, not by sleeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from _mcp_raw import WAIT_S, RawMcp
from fixtures.mcp_tasks_fixture import (
    FixtureSettings,
    build_server,
    text,
    transport_security,
)
from mcp import Client
from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, ElicitRequestParams, ElicitResult

from luftpause.runtime.mcp_tasks import (
    JOURNAL_NAME,
    RELATED_TASK_META,
    RESTART_ERROR,
    TASKS_EXTENSION,
    TaskHandle,
    TasksExtension,
    TaskStore,
    elicitation_request,
)

TASK_KEYS = {
    "resultType",
    "taskId",
    "status",
    "createdAt",
    "lastUpdatedAt",
    "ttlMs",
    "pollIntervalMs",
}


# --------------------------------------------------------------------------- harness


@dataclass
class Gate:
    """Holds the work of the ``gated`` task tool until the test releases it."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    callbacks: list[str] = field(default_factory=list)
    saw: dict[str, bool] = field(default_factory=dict)

    async def work(self, handle: TaskHandle, arguments: dict[str, Any]) -> CallToolResult:
        await handle.attach(f"run-{arguments.get('label', 'x')}")

        async def async_callback() -> None:
            self.callbacks.append("async")

        handle.on_cancel(lambda: self.callbacks.append("sync"))
        handle.on_cancel(async_callback)
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.saw = {
                "cancel_requested": handle.cancel_requested,
                "shutting_down": handle.shutting_down,
            }
            raise
        finally:
            self.ended.set()
        return text("released")


async def withdrawing_work(handle: TaskHandle, arguments: dict[str, Any]) -> CallToolResult:
    """Asks a question, then answers it itself once ``go`` is answered (withdraws ``ask``)."""
    question = asyncio.create_task(
        handle.require_input({"ask": elicitation_request("Ask?", {"type": "object"})})
    )
    other = asyncio.create_task(
        handle.require_input({"go": elicitation_request("Go?", {"type": "object"})})
    )
    await other
    question.cancel()
    with pytest.raises(asyncio.CancelledError):
        await question
    return text("withdrawn")


async def related_meta_work(handle: TaskHandle, arguments: dict[str, Any]) -> CallToolResult:
    result = text("with meta")
    result.meta = {RELATED_TASK_META: {"taskId": "old"}, "keep": 1}
    return result


class Harness(RawMcp):
    def __init__(self, http: httpx.AsyncClient, tasks: TasksExtension, gate: Gate) -> None:
        super().__init__(http)
        self.tasks = tasks
        self.gate = gate


@asynccontextmanager
async def serving(state_dir: Path) -> AsyncIterator[Harness]:
    """The fixture server plus test-only task tools, in process."""
    mcp, tasks = build_server(FixtureSettings(state_dir=state_dir, job_delay_s=0.0))
    gate = Gate()
    tasks.task_tool("gated", gate.work)
    tasks.task_tool("withdrawing", withdrawing_work)
    tasks.task_tool("related_meta", related_meta_work)

    @mcp.tool(structured_output=False)
    async def gated(ctx: Context[Any, Any], label: str = "x") -> Any:
        return await tasks.run_inline("gated", {"label": label}, ctx)

    @mcp.tool(structured_output=False)
    async def withdrawing(ctx: Context[Any, Any]) -> Any:
        return await tasks.run_inline("withdrawing", {}, ctx)

    @mcp.tool(structured_output=False)
    async def related_meta(ctx: Context[Any, Any]) -> Any:
        return await tasks.run_inline("related_meta", {}, ctx)

    app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=False,
        transport_security=transport_security("127.0.0.1"),
    )
    with anyio.fail_after(WAIT_S):
        async with tasks.running(), mcp.session_manager.run():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                yield Harness(http, tasks, gate)


def journal_lines(state_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state_dir / JOURNAL_NAME).read_text().splitlines()]


# --------------------------------------------------------------------------- the wire


async def test_discover_advertises_extension(tmp_path: Path) -> None:
    """R12: ``server/discover`` advertises the Tasks extension under
    ``capabilities.extensions`` (never ``capabilities.tasks``)."""
    async with serving(tmp_path) as h:
        caps = (await h.modern("server/discover")).result["capabilities"]
    assert caps["extensions"][TASKS_EXTENSION] == {}
    assert "tasks" not in caps


async def test_task_lifecycle_modern_with_extension(tmp_path: Path) -> None:
    """R12: a Tasks client gets a flat CreateTaskResult at once, ``tasks/get`` shows it
    ``working`` and then ``completed`` with the result inlined (no related-task
    ``_meta``); the task is journaled before the CreateTaskResult goes out."""
    async with serving(tmp_path) as h:
        created = await h.create("gated", {"label": "a"})
        assert set(created) - {"_meta"} == TASK_KEYS
        assert created["status"] == "working"
        assert created["ttlMs"] > 0 and created["pollIntervalMs"] > 0
        task_id = created["taskId"]
        first = journal_lines(tmp_path)[0]["task"]
        assert (first["taskId"], first["status"]) == (task_id, "working")

        with anyio.fail_after(WAIT_S):
            await h.gate.started.wait()
        working = await h.get(task_id)
        assert working["status"] == "working" and working["resultType"] == "complete"
        assert not {"result", "error", "inputRequests", "requestState"} & set(working)
        assert h.tasks.get(task_id) is not None
        assert h.tasks.get(task_id).attachment == "run-a"  # type: ignore[union-attr]

        h.gate.release.set()
        done = await h.wait_for(task_id, "completed")
        assert done["result"]["content"] == [{"type": "text", "text": "released"}]
        assert done["result"]["isError"] is False
        assert "error" not in done

        meta_task = await h.create("related_meta")
        with_meta = await h.wait_for(meta_task["taskId"], "completed")
        assert with_meta["result"]["_meta"] == {"keep": 1}

    statuses = [
        (line["task"]["taskId"], line["task"]["status"]) for line in journal_lines(tmp_path)
    ]
    assert (task_id, "completed") in statuses


async def test_tool_error_completes_and_protocol_error_fails(tmp_path: Path) -> None:
    """R12: a tool error is ``completed`` with ``isError``; a protocol error is
    ``failed`` with the JSON-RPC ``error`` (and a ``statusMessage``), no result."""
    async with serving(tmp_path) as h:
        tool_error = await h.create("failing_job")
        done = await h.wait_for(tool_error["taskId"], "completed", "failed")
        assert done["status"] == "completed" and done["result"]["isError"] is True

        protocol = await h.create("protocol_error_job")
        failed = await h.wait_for(protocol["taskId"], "completed", "failed")
        assert failed["status"] == "failed"
        assert failed["error"]["code"] == -32603
        assert "on purpose" in failed["error"]["message"]
        assert failed["statusMessage"] == failed["error"]["message"]
        assert "result" not in failed


async def test_without_extension_the_call_is_synchronous(tmp_path: Path) -> None:
    """R12: a 2026-07-28 client that did not declare the extension gets the blocking
    call from a task tool, -32021 (with ``data.requiredCapabilities``) from a tool that
    only runs as a task and from ``tasks/*``."""
    async with serving(tmp_path) as h:
        sync = (
            await h.modern(
                "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0}}, caps={}
            )
        ).result
        assert sync["resultType"] == "complete" and "taskId" not in sync
        assert sync["content"][0]["text"].startswith("computed")

        required = await h.modern("tools/call", {"name": "failing_job", "arguments": {}}, caps={})
        assert required.error["code"] == -32021
        assert required.error["data"]["requiredCapabilities"]["extensions"] == {TASKS_EXTENSION: {}}

        created = await h.create("slow_compute", {"seconds": 0})
        for method, params in [
            ("tasks/get", {"taskId": created["taskId"]}),
            ("tasks/update", {"taskId": created["taskId"], "inputResponses": {}}),
            ("tasks/cancel", {"taskId": created["taskId"]}),
        ]:
            reply = await h.modern(method, params, caps={"elicitation": {}})
            assert reply.status == 400
            assert reply.error["code"] == -32021, method
            assert TASKS_EXTENSION in reply.error["data"]["requiredCapabilities"]["extensions"]

        # A task tool that needs input cannot ask a modern client in a blocking call.
        blocked = (
            await h.modern(
                "tools/call", {"name": "confirm_delete", "arguments": {"filename": "f"}}, caps={}
            )
        ).result
        assert blocked["isError"] is True
        assert TASKS_EXTENSION in blocked["content"][0]["text"]
    assert len(journal_lines(tmp_path)) == 2  # only the one task, created and completed


async def test_legacy_session_never_gets_a_task(tmp_path: Path) -> None:
    """R12: on a 2025-11-25 session (even one that declared the extension at
    ``initialize``) a task tool runs synchronously and ``tasks/*`` do not exist."""
    async with serving(tmp_path) as h:
        session = await h.legacy_session({"extensions": {TASKS_EXTENSION: {}}, "elicitation": {}})
        reply = await h.legacy(
            session,
            "tools/call",
            {"name": "slow_compute", "arguments": {"seconds": 0, "label": "l"}},
        )
        result = reply.result
        assert "taskId" not in result and result.get("resultType") != "task"
        assert result["content"][0]["text"] == "computed l after 0 s"

        required = await h.legacy(session, "tools/call", {"name": "failing_job", "arguments": {}})
        assert required.error["code"] == -32021

        gone = await h.legacy(session, "tasks/get", {"taskId": "anything"})
        assert gone.error["code"] == -32601
    assert not (tmp_path / JOURNAL_NAME).read_text()


async def test_legacy_blocking_call_elicits_mid_call(tmp_path: Path) -> None:
    """R12/R11: the blocking path of a task tool that needs input asks a legacy
    client that supports elicitation in the middle of the call (``run_inline``)."""
    mcp, tasks = build_server(FixtureSettings(state_dir=tmp_path, job_delay_s=0.0))
    asked: list[str] = []

    async def answer(context: Any, params: ElicitRequestParams) -> ElicitResult:
        asked.append(getattr(params, "message", ""))
        return ElicitResult(action="accept", content={"confirm": True})

    with anyio.fail_after(WAIT_S):
        async with (
            tasks.running(),
            Client(mcp, mode="legacy", elicitation_callback=answer) as client,
        ):
            result = await client.call_tool("confirm_delete", {"filename": "a.txt"})
    assert asked == ["Delete a.txt?"]
    assert not result.is_error
    assert result.content[0].text == "Deleted a.txt"  # type: ignore[union-attr]


async def test_routing_header_unknown_task_and_removed_methods(tmp_path: Path) -> None:
    """R12: ``Mcp-Name`` must equal ``taskId`` on ``tasks/*`` (-32020, HTTP 400, also
    when missing); an unknown task is -32602; ``tasks/result`` and ``tasks/list`` are
    -32601."""
    async with serving(tmp_path) as h:
        created = await h.create("slow_compute", {"seconds": 0})
        task_id = created["taskId"]
        for method in ("tasks/get", "tasks/cancel"):
            wrong = await h.modern(method, {"taskId": task_id}, headers={"Mcp-Name": "other-task"})
            assert (wrong.status, wrong.error["code"]) == (400, -32020), method
        missing = await h.modern("tasks/get", {"taskId": task_id}, name_header=False)
        assert missing.error["code"] == -32020
        padded = await h.modern(
            "tasks/get", {"taskId": task_id}, headers={"Mcp-Name": f"  {task_id} "}
        )
        assert padded.result["taskId"] == task_id

        probes: list[tuple[str, dict[str, Any]]] = [
            ("tasks/get", {"taskId": "no-such-task"}),
            ("tasks/update", {"taskId": "no-such-task", "inputResponses": {}}),
            ("tasks/cancel", {"taskId": "no-such-task"}),
        ]
        for method, params in probes:
            unknown = await h.modern(method, params)
            assert unknown.error["code"] == -32602, method

        for method in ("tasks/result", "tasks/list"):
            removed = await h.modern(
                method, {"taskId": task_id} if method == "tasks/result" else {}
            )
            assert removed.error["code"] == -32601, method


async def test_an_unknown_task_id_is_quoted_cut(tmp_path: Path) -> None:
    """R12: a 10,000-character unknown ``taskId`` is -32602 whose message quotes it cut
    after 64 characters with its length (it used to come back whole, also in ``data``)."""
    async with serving(tmp_path) as h:
        task_id = "t" * 10_000
        for method in ("tasks/get", "tasks/cancel"):
            unknown = await h.modern(method, {"taskId": task_id})
            error = unknown.error
            assert error["code"] == -32602, method
            assert "(10000 characters)" in error["message"] and len(error["message"]) < 200
            assert "data" not in error or "taskId" not in (error["data"] or {})
        short = await h.modern("tasks/get", {"taskId": "no-such-task"})
        assert short.error["data"] == {"taskId": "no-such-task"}


# --------------------------------------------------------------------------- input


async def test_input_required_update_completes(tmp_path: Path) -> None:
    """R12/R11: ``require_input`` sets ``input_required`` with full elicitation
    requests; ``tasks/update`` ignores keys that are not pending, refuses an answer of
    the wrong shape (-32602), and a valid answer resumes the work to ``completed``."""
    async with serving(tmp_path) as h:
        created = await h.create("confirm_delete", {"filename": "x.txt"})
        task_id = created["taskId"]
        waiting = await h.wait_for(task_id, "input_required", keys=1)
        request = waiting["inputRequests"]["confirm_delete"]
        assert request["method"] == "elicitation/create"
        assert request["params"]["mode"] == "form"
        assert request["params"]["requestedSchema"]["properties"] == {
            "confirm": {"type": "boolean"}
        }

        ignored = await h.modern(
            "tasks/update", {"taskId": task_id, "inputResponses": {"nope": {"x": 1}}}
        )
        assert set(ignored.result) - {"_meta"} == {"resultType"}
        assert ignored.result["resultType"] == "complete"
        assert (await h.get(task_id))["status"] == "input_required"

        bad = await h.modern(
            "tasks/update",
            {"taskId": task_id, "inputResponses": {"confirm_delete": {"action": "maybe"}}},
        )
        assert bad.error["code"] == -32602

        ack = await h.modern(
            "tasks/update",
            {
                "taskId": task_id,
                "inputResponses": {
                    "confirm_delete": {"action": "accept", "content": {"confirm": True}}
                },
            },
        )
        assert ack.result["resultType"] == "complete"
        done = await h.wait_for(task_id, "completed")
        assert done["result"]["content"][0]["text"] == "Deleted x.txt"
        assert "inputRequests" not in done

        # Answering again after the end is acknowledged and changes nothing.
        again = await h.modern(
            "tasks/update",
            {"taskId": task_id, "inputResponses": {"confirm_delete": {"action": "decline"}}},
        )
        assert again.result["resultType"] == "complete"
    snapshots = [
        line["task"] for line in journal_lines(tmp_path) if line["task"]["taskId"] == task_id
    ]
    assert [s["status"] for s in snapshots] == ["working", "input_required", "working", "completed"]


async def test_partial_update_leaves_unanswered_keys(tmp_path: Path) -> None:
    """R12: two questions pending at once; answering one leaves only the other
    pending (still ``input_required``); answering it completes the task."""
    async with serving(tmp_path) as h:
        task_id = (await h.create("multi_input"))["taskId"]
        waiting = await h.wait_for(task_id, "input_required", keys=2)
        assert set(waiting["inputRequests"]) == {"name", "confirm"}

        await h.modern(
            "tasks/update",
            {
                "taskId": task_id,
                "inputResponses": {"name": {"action": "accept", "content": {"name": "Ada"}}},
            },
        )
        partial = await h.get(task_id)
        assert partial["status"] == "input_required"
        assert set(partial["inputRequests"]) == {"confirm"}

        await h.modern(
            "tasks/update",
            {
                "taskId": task_id,
                "inputResponses": {"confirm": {"action": "accept", "content": {"confirm": True}}},
            },
        )
        done = await h.wait_for(task_id, "completed")
        assert done["result"]["content"][0]["text"] == "name=Ada confirm=True"


async def test_cancelled_require_input_withdraws_its_keys(tmp_path: Path) -> None:
    """R12/R11: when the work stops waiting for a question (answered another way),
    its key leaves ``inputRequests`` and a late answer to it is ignored."""
    async with serving(tmp_path) as h:
        task_id = (await h.create("withdrawing"))["taskId"]
        await h.wait_for(task_id, "input_required", keys=2)
        await h.modern(
            "tasks/update",
            {"taskId": task_id, "inputResponses": {"go": {"action": "accept", "content": {}}}},
        )
        done = await h.wait_for(task_id, "completed")
        assert done["result"]["content"][0]["text"] == "withdrawn"
        late = await h.modern(
            "tasks/update",
            {"taskId": task_id, "inputResponses": {"ask": {"action": "accept", "content": {}}}},
        )
        assert late.result["resultType"] == "complete"
    statuses = [line["task"]["status"] for line in journal_lines(tmp_path)]
    assert statuses[-2:] == ["working", "completed"]


async def test_mrtr_then_task(tmp_path: Path) -> None:
    """R12: a tool with a ``prepare`` step gathers input over the multi-round-trip flow
    first (no task yet), then the retry carrying the answer creates the task."""
    async with serving(tmp_path) as h:
        first = (
            await h.modern("tools/call", {"name": "test_tool_with_task", "arguments": {}})
        ).result
        assert first["resultType"] == "input_required" and "taskId" not in first
        key = next(iter(first["inputRequests"]))
        params: dict[str, Any] = {
            "name": "test_tool_with_task",
            "arguments": {},
            "inputResponses": {key: {"action": "accept", "content": {"name": "Alice"}}},
        }
        if "requestState" in first:
            params["requestState"] = first["requestState"]
        second = (await h.modern("tools/call", params)).result
        assert second["resultType"] == "task" and "requestState" not in second
        done = await h.wait_for(second["taskId"], "completed")
        assert "Alice" in done["result"]["content"][0]["text"]


# --------------------------------------------------------------------------- cancel


async def test_client_cancel_is_idempotent_and_tells_the_work(tmp_path: Path) -> None:
    """R12: ``tasks/cancel`` answers the empty ack, journals ``cancelled`` before it
    answers, runs the ``on_cancel`` callbacks and cancels the work with
    ``cancel_requested`` (not ``shutting_down``); cancelling again, or a finished
    task, is the same ack and changes nothing."""
    async with serving(tmp_path) as h:
        task_id = (await h.create("gated"))["taskId"]
        with anyio.fail_after(WAIT_S):
            await h.gate.started.wait()
        ack = await h.modern("tasks/cancel", {"taskId": task_id})
        assert (
            set(ack.result) - {"_meta"} == {"resultType"} and ack.result["resultType"] == "complete"
        )
        assert (await h.get(task_id))["status"] == "cancelled"
        assert h.gate.callbacks == ["sync", "async"]
        with anyio.fail_after(WAIT_S):
            await h.gate.ended.wait()
        assert h.gate.saw == {"cancel_requested": True, "shutting_down": False}

        again = await h.modern("tasks/cancel", {"taskId": task_id})
        assert again.result["resultType"] == "complete"
        cancelled = await h.get(task_id)
        assert cancelled["status"] == "cancelled" and "result" not in cancelled

        finished = (await h.create("slow_compute", {"seconds": 0}))["taskId"]
        await h.wait_for(finished, "completed")
        late = await h.modern("tasks/cancel", {"taskId": finished})
        assert late.result["resultType"] == "complete"
        assert (await h.get(finished))["status"] == "completed"
    snapshots = [
        line["task"] for line in journal_lines(tmp_path) if line["task"]["taskId"] == task_id
    ]
    assert snapshots[-1]["status"] == "cancelled"
    assert snapshots[-1]["attachment"] == "run-x"


async def test_cancel_while_input_required(tmp_path: Path) -> None:
    """R12/R11: cancelling a task that waits for input ends it ``cancelled`` with no
    pending input requests left."""
    async with serving(tmp_path) as h:
        task_id = (await h.create("confirm_delete", {"filename": "y"}))["taskId"]
        await h.wait_for(task_id, "input_required", keys=1)
        await h.modern("tasks/cancel", {"taskId": task_id})
        cancelled = await h.get(task_id)
        assert cancelled["status"] == "cancelled" and "inputRequests" not in cancelled


# --------------------------------------------------------------------------- restart


async def test_restart_fails_open_tasks_and_keeps_finished_ones(tmp_path: Path) -> None:
    """R12: on shutdown the work is cancelled with ``shutting_down`` and its task left
    open; on the next start that task is ``failed`` ("the server restarted while the
    task was open"), journaled, with its attachment; finished tasks answer as before."""
    async with serving(tmp_path) as h:
        open_id = (await h.create("gated", {"label": "r"}))["taskId"]
        done_id = (await h.create("slow_compute", {"seconds": 0, "label": "kept"}))["taskId"]
        await h.wait_for(done_id, "completed")
        with anyio.fail_after(WAIT_S):
            await h.gate.started.wait()
        gate = h.gate
    assert gate.saw == {"cancel_requested": False, "shutting_down": True}
    assert journal_lines(tmp_path)[-1]["task"]["status"] != "cancelled"

    async with serving(tmp_path) as h:
        failed = await h.get(open_id)
        assert failed["status"] == "failed"
        assert failed["error"]["message"] == RESTART_ERROR
        assert failed["statusMessage"] == RESTART_ERROR
        assert h.tasks.get(open_id).attachment == "run-r"  # type: ignore[union-attr]
        kept = await h.get(done_id)
        assert kept["status"] == "completed"
        assert kept["result"]["content"][0]["text"] == "computed kept after 0 s"
    last = journal_lines(tmp_path)[-1]["task"]
    assert (last["taskId"], last["status"]) == (open_id, "failed")


async def test_replay_tolerates_a_torn_tail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """R12: a torn last line (the process died mid-write) is cut off with a warning; an
    unreadable line elsewhere is skipped with a warning; appends go on cleanly."""
    store = TaskStore(tmp_path)
    await store.open()
    first = await store.create("tool")
    await store.finish(first.task_id, "completed", result={"content": []})
    second = await store.create("tool")
    await store.close()
    path = tmp_path / JOURNAL_NAME
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(
        lines[0] + b"{not json}\n" + b"".join(lines[1:]) + b'{"v":1,"task":{"taskId":"to'
    )

    caplog.set_level(logging.WARNING)
    store = TaskStore(tmp_path)
    await store.open()
    assert "torn last line" in caplog.text
    assert "unreadable task record" in caplog.text
    [problem] = store.problems  # what GET /status lists; the torn tail is not a problem
    assert problem.line == 2 and problem.reason.startswith("not JSON (")
    assert store.get(first.task_id).status == "completed"  # type: ignore[union-attr]
    reopened = store.get(second.task_id)
    assert reopened is not None and reopened.status == "failed"
    third = await store.create("tool")
    await store.close()
    records = [json.loads(line) for line in path.read_text().splitlines() if line != "{not json}"]
    assert [r["task"]["taskId"] for r in records][-2:] == [second.task_id, third.task_id]


async def test_unreadable_lines_are_kept_as_problems(tmp_path: Path) -> None:
    """R12, R9: each line replay skips is kept with its number and what was wrong (for
    ``GET /status``)."""
    store = TaskStore(tmp_path)
    await store.open()
    kept = await store.create("tool")
    await store.close()
    path = tmp_path / JOURNAL_NAME
    with path.open("a") as f:
        f.write("[1, 2]\n")
        f.write('{"v": 2, "task": {}}\n')
        f.write('{"v": 1, "task": {"taskId": "x", "tool": "t", "status": "odd"}}\n')
        f.write('{"v": 1, "task": {"tool": "t"}}\n')
        f.write("not json\n")
    store = TaskStore(tmp_path)
    await store.open()
    assert store.get(kept.task_id) is not None
    assert [str(p) for p in store.problems] == [
        "line 2: not a version-1 task record (skipped; no task restored from it)",
        "line 3: not a version-1 task record (skipped; no task restored from it)",
        "line 4: unknown status 'odd' (skipped; no task restored from it)",
        "line 5: missing field 'status' (skipped; no task restored from it)",
        "line 6: not JSON (Expecting value: line 1 column 1 (char 0)) (skipped; no task "
        "restored from it)",
    ]
    await store.close()


async def test_open_task_fails_on_restart_store_level(tmp_path: Path) -> None:
    """R12: a task left ``input_required`` by a stopped process is ``failed`` on the
    next open, with no input requests, and that transition is journaled."""
    store = TaskStore(tmp_path)
    await store.open()
    rec = await store.create("run", attachment="run-7")
    await store.request_input(rec.task_id, {"k": elicitation_request("?", {"type": "object"})})
    await store.close()

    store = TaskStore(tmp_path)
    await store.open()
    failed = store.get(rec.task_id)
    assert failed is not None and failed.status == "failed"
    assert failed.error == {"code": -32603, "message": RESTART_ERROR}
    assert failed.input_requests == {} and failed.attachment == "run-7"
    await store.close()
    assert journal_lines(tmp_path)[-1]["task"]["status"] == "failed"

    # Replayed again, it stays failed (no second transition is journaled).
    count = len(journal_lines(tmp_path))
    store = TaskStore(tmp_path)
    await store.open()
    await store.close()
    assert len(journal_lines(tmp_path)) == count


async def test_ttl_expiry_and_compaction(tmp_path: Path) -> None:
    """R12: a finished task is kept at least ``ttlMs`` after it finished (``ttlMs``
    grows) and then expires (unknown); an open task never expires; a journal that
    grew well past its live tasks is compacted on start."""
    now = [1000.0]
    store = TaskStore(tmp_path, ttl_ms=1000, clock=lambda: now[0])
    await store.open()
    finished = await store.create("t")
    still_open = await store.create("t")
    now[0] += 0.5
    await store.finish(finished.task_id, "completed", result={"content": []})
    assert store.get(finished.task_id).ttl_ms == 1500  # type: ignore[union-attr]
    now[0] += 0.9  # 1.4 s after creation, 0.9 s after it finished
    assert store.get(finished.task_id) is not None
    now[0] += 0.2
    assert store.get(finished.task_id) is None
    now[0] += 1000
    assert store.get(still_open.task_id) is not None
    for _ in range(300):
        await store.set_status_message(still_open.task_id, "busy")
    await store.close()
    assert len(journal_lines(tmp_path)) > 300

    store = TaskStore(tmp_path, ttl_ms=1000, clock=lambda: now[0])
    await store.open()
    assert [r.task_id for r in store.records()] == [still_open.task_id]
    await store.close()
    assert len(journal_lines(tmp_path)) == 1


async def test_expired_task_is_unknown_on_the_wire(tmp_path: Path) -> None:
    """R12: once expired, ``tasks/get`` answers -32602 like for a task never created."""
    async with serving(tmp_path) as h:
        task_id = (await h.create("slow_compute", {"seconds": 0}))["taskId"]
        await h.wait_for(task_id, "completed")
        store = h.tasks.store
        record = store.get(task_id)
        assert record is not None
        store._clock = lambda: record.created + (record.ttl_ms or 0) / 1000 + 1
        reply = await h.modern("tasks/get", {"taskId": task_id})
        assert reply.error["code"] == -32602
