"""R2, R8, R12: ``spawn``'s ``idempotencyKey``, through MCP, in process.

The runtime's MCP server (with the Tasks extension, as ``luftpause runtime``
serves it) runs over ``httpx.ASGITransport``; requests are raw JSON-RPC in both
protocol eras (``tests/_mcp_raw.py``). The dataplane is scripted and the tool hub
counts calls (``tests/_runtime_fakes.py``). A spawn is held "under way" by a journal
write that waits on a ``threading.Event``. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from _mcp_raw import WAIT_S, RawMcp
from _runtime_fakes import Hub, served_runtime, until

from luftpause.runtime.loop import Runtime


class Served(RawMcp):
    def __init__(self, http: httpx.AsyncClient, rt: Runtime) -> None:
        super().__init__(http, client_name="idempotency-client")
        self.rt = rt

    async def call(
        self, tool: str, arguments: dict[str, Any], caps: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A modern tools/call (no Tasks unless ``caps`` declares them); its result."""
        reply = await self.modern(
            "tools/call", {"name": tool, "arguments": arguments}, caps=caps or {}
        )
        return reply.result

    async def spawn(self, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self.call("spawn", arguments)
        assert not result.get("isError"), result
        payload = result["structuredContent"]
        assert isinstance(payload, dict)
        return payload

    def spawn_records(self) -> list[dict[str, Any]]:
        lines = (self.rt.journal.path).read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["t"] == "spawn"]


@asynccontextmanager
async def serving(state: Path) -> AsyncIterator[Served]:
    async with served_runtime(state, Hub(), WAIT_S * 3) as (http, rt):
        yield Served(http, rt)


def text_of(result: dict[str, Any]) -> str:
    return "\n".join(c.get("text", "") for c in result.get("content") or [])


@contextmanager
def held_journal(rt: Runtime) -> Iterator[threading.Event]:
    """Journal writes wait until the event is set: a spawn stays under way meanwhile."""
    release = threading.Event()
    write = rt.journal._write_sync

    def held_write(data: bytes) -> None:
        release.wait(WAIT_S)
        write(data)

    rt.journal._write_sync = held_write  # type: ignore[method-assign]
    try:
        yield release
    finally:
        release.set()
        rt.journal._write_sync = write  # type: ignore[method-assign]


ARGS = {"task": "clean up", "tools": ["rm"], "idempotencyKey": "job-7"}


async def test_the_same_key_returns_the_same_run_and_journals_one_spawn(tmp_path: Path) -> None:
    """R2, R8: a spawn retried with its key gets the same handle, marked ``reused``, from
    another caller too (a legacy session, as a client reconnecting after losing the
    answer); one run, one spawn record carrying the key. Omitting a defaulted argument
    is the same request as giving its default."""
    async with serving(tmp_path) as s:
        first = await s.spawn(ARGS)
        assert "reused" not in first
        again = await s.spawn({**ARGS, "maxTokens": 256})  # the default, spelled out
        assert again["handle"] == first["handle"] and again["reused"] is True
        session = await s.legacy_session({})
        reply = await s.legacy(session, "tools/call", {"name": "spawn", "arguments": ARGS})
        assert reply.result["structuredContent"]["handle"] == first["handle"]
        assert list(s.rt.state.runs) == [first["handle"]]
        [record] = s.spawn_records()
        assert record["idempotencyKey"] == "job-7" and len(record["requestDigest"]) == 64
        other = await s.spawn({**ARGS, "idempotencyKey": "job-8"})
        assert other["handle"] != first["handle"]
        for run in list(s.rt.state.runs.values()):
            await s.rt.cancel_tree(run, "test over")


@pytest.mark.parametrize(
    "change",
    [{"task": "something else"}, {"maxTokens": 9}, {"tools": None}, {"parent": None}],
)
async def test_the_same_key_with_other_arguments_is_refused(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    """R2: the same key with other arguments is a tool error that says so, names the run
    the key started and starts nothing."""
    async with serving(tmp_path) as s:
        first = await s.spawn(ARGS)
        changed = {k: v for k, v in {**ARGS, **change}.items() if v is not None}
        if "parent" in change:
            changed["parent"] = first["handle"]
        result = await s.call("spawn", changed)
        assert result["isError"] is True
        text = text_of(result)
        assert "idempotencyKey 'job-7' was already used by run" in text, text
        assert first["handle"] in text and "other arguments" in text
        assert list(s.rt.state.runs) == [first["handle"]]
        await s.rt.cancel_tree(s.rt.state.runs[first["handle"]], "test over")


async def test_a_retry_while_the_first_spawn_is_under_way_waits_for_it(tmp_path: Path) -> None:
    """R2, R8: while the first spawn with a key is still being journaled, a retry with the
    key waits and gets its run (never a second run), and one with other arguments is
    refused at once; a first caller that goes away does not stop the spawn."""
    async with serving(tmp_path) as s:
        with held_journal(s.rt) as release:
            first = asyncio.create_task(s.spawn(ARGS))
            await until(lambda: (None, "job-7") in s.rt._keyed, "the first spawn under way")
            retry = asyncio.create_task(s.spawn(ARGS))
            other = await s.call("spawn", {**ARGS, "task": "other"})
            assert other["isError"] is True
            assert "already used by a spawn still under way" in text_of(other)
            first.cancel()  # the first client gives up; its spawn goes on
            await asyncio.gather(first, return_exceptions=True)
            assert not retry.done()
            release.set()
            async with asyncio.timeout(WAIT_S):
                got = await retry
        assert got["reused"] is True
        assert list(s.rt.state.runs) == [got["handle"]]
        assert [r["run"] for r in s.spawn_records()] == [got["handle"]]
        await s.rt.cancel_tree(s.rt.state.runs[got["handle"]], "test over")


async def test_a_failed_keyed_spawn_binds_nothing(tmp_path: Path) -> None:
    """R2: a spawn refused (unknown tool) leaves its key free: a corrected retry with the
    key starts the run."""
    async with serving(tmp_path) as s:
        bad = await s.call("spawn", {**ARGS, "tools": ["nope"]})
        assert bad["isError"] is True and "unknown tool(s) 'nope'" in text_of(bad)
        assert not s.rt._keyed and not s.rt.state.runs
        good = await s.spawn(ARGS)
        assert list(s.rt.state.runs) == [good["handle"]]
        await s.rt.cancel_tree(s.rt.state.runs[good["handle"]], "test over")


async def test_run_and_run_as_a_task_honour_the_key(tmp_path: Path) -> None:
    """R2, R12: ``run`` (blocking) and ``run`` as an MCP task take the key too: with the key
    a ``spawn`` used, each follows that run instead of starting another."""
    async with serving(tmp_path) as s:
        spawned = await s.spawn({"task": "answer", "idempotencyKey": "k1"})
        blocking = await s.call("run", {"task": "answer", "idempotencyKey": "k1", "timeout": 5})
        assert blocking["structuredContent"]["handle"] == spawned["handle"]
        assert blocking["structuredContent"]["state"] == "Completed"
        created = await s.create("run", {"task": "answer", "idempotencyKey": "k1"})
        task = await s.wait_for(created["taskId"], "completed")
        result = json.loads(task["result"]["content"][0]["text"])
        assert result["handle"] == spawned["handle"]
        mismatch = await s.create("run", {"task": "other", "idempotencyKey": "k1"})
        failed = await s.wait_for(mismatch["taskId"], "completed")
        assert failed["result"]["isError"] is True
        assert "already used by run" in failed["result"]["content"][0]["text"]
        assert list(s.rt.state.runs) == [spawned["handle"]]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("k" * 10_000, "argument 'idempotencyKey' must be at most 256 characters long"),
        ("", "argument 'idempotencyKey' must not be empty"),
        (7, "argument 'idempotencyKey' must be a string"),
        (["a"], "argument 'idempotencyKey' must be a string"),
        ({"k": 1}, "argument 'idempotencyKey' must be a string"),
        (True, "argument 'idempotencyKey' must be a string"),
    ],
)
async def test_a_bad_key_is_a_tool_error_naming_it(tmp_path: Path, key: Any, message: str) -> None:
    """R2: a key of the wrong type, empty or over 256 characters is a tool error naming
    ``idempotencyKey`` (a huge one quoted cut), and starts nothing."""
    async with serving(tmp_path) as s:
        result = await s.call("spawn", {"task": "x", "idempotencyKey": key})
        assert result["isError"] is True
        text = text_of(result)
        assert message in text, text
        assert len(text) < 300, len(text)
        assert not s.rt.state.runs


async def test_a_key_with_a_lone_surrogate_is_refused(tmp_path: Path) -> None:
    """R2, R8: a key UTF-8 cannot encode (``\\ud800`` in the JSON; it could not be
    journaled) is a tool error naming ``idempotencyKey``, and starts nothing."""
    body = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "tools/call",
        "params": {
            "name": "spawn",
            "arguments": {"task": "x", "idempotencyKey": "a\ud800"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            },
        },
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "spawn",
    }
    async with serving(tmp_path) as s:
        sent = json.dumps(body, ensure_ascii=True).encode()  # the surrogate as an escape
        response = await s.http.post("/mcp", content=sent, headers=headers)
        result = response.json()["result"]
        assert result["isError"] is True
        assert "argument 'idempotencyKey' must be valid Unicode" in text_of(result)
        assert not s.rt.state.runs
