"""R9, D, X1 (#38, "one tree"): an agent harness's session as the parent of the
sub-agents its tool calls spawn.

The real dataplane (ASGI transport) in front of a recording engine and a real
in-process scheduler (``_dataplane_stack``) relays a harness's turn whose reply is a
tool call; the runtime, in process with its MCP server, gets a ``spawn`` whose
``_meta`` names that call (Claude Code's ``claudecode/toolUseId``, Codex's
``callId``), asks the dataplane's ``GET /v1/tool_calls/{id}`` which run made it and
records that run as the new run's ``session``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from _dataplane_stack import COMPLETION, MODEL, TOOL_COMPLETION, Stack, chat, stack_fixture
from _otel import memory_spans, named
from _runtime_fakes import Hub, mcp_client, until

from luftpause.config import RuntimeSettings
from luftpause.procs import free_port
from luftpause.runtime.journal import Journal
from luftpause.runtime.llm import DataplaneClient
from luftpause.runtime.loop import Runtime
from luftpause.runtime.status import status_tree

__all__ = ["stack_fixture"]

MODERN = "2026-07-28"
TOKEN = "one-tree-token"


async def harness_turn(stack: Stack, call_id: str = "call_abc", **headers: str) -> str:
    """One harness turn through the dataplane whose reply calls a tool ``call_id``; its run."""
    reply = json.loads(json.dumps(TOOL_COMPLETION))
    reply["choices"][0]["message"]["tool_calls"][0]["id"] = call_id
    stack.engine.reply = lambda r: httpx.Response(200, json=reply)
    sent = {"x-claude-code-session-id": "sess-1", **headers}
    first = await stack.client.post("/v1/chat/completions", json=chat(), headers=sent)
    assert first.status_code == 200, first.text
    memory = stack.dp.memory
    remembered = lambda: memory.origin(call_id) is not None or memory.ambiguous(call_id)  # noqa: E731
    await until(remembered, "tool call remembered")
    stack.engine.reply = lambda r: httpx.Response(200, json=COMPLETION)  # sub-agents answer
    return first.headers["x-luftpause-run-id"]


@asynccontextmanager
async def runtime_on(
    state: Path, dataplane: httpx.AsyncBaseTransport | None, base_url: str, token: str | None
) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    """The runtime and its MCP server (``/mcp`` over ASGI), its dataplane at ``base_url``."""
    journal = Journal(state)
    lines = journal.open()
    llm = DataplaneClient(
        base_url, token=token, turn_timeout_s=30, retry_after_default_s=0.01,
        transport=dataplane, transient_retries=0,
    )  # fmt: skip
    rt = Runtime(RuntimeSettings(state_dir=str(state), default_model=MODEL), journal, llm, Hub())
    try:
        async with mcp_client(rt, lines, 20) as http:
            yield http, rt
    finally:
        await llm.aclose()


async def spawn(
    http: httpx.AsyncClient, arguments: dict[str, Any], meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A 2026-07-28 ``tools/call`` of ``spawn`` with extra ``_meta``; its structured result."""
    params = {
        "name": "spawn",
        "arguments": arguments,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2.1.332"},
            **(meta or {}),
        },
    }
    response = await http.post(
        "/mcp",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "tools/call",
            "Mcp-Name": "spawn",
        },
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    result = body["result"]
    assert not result.get("isError"), result
    payload = result["structuredContent"]
    assert isinstance(payload, dict)
    return payload


async def test_tool_call_endpoint_found_and_404(stack: Stack) -> None:
    """D (#38): ``GET /v1/tool_calls/{id}`` names the run, class and caller of the turn
    whose reply made the call; an unknown ID is a 404 in the OpenAI error shape that says
    how many dataplane processes share the port."""
    harness = await harness_turn(stack, "call_abc", **{"x-luftpause-class": "batch"})
    assert harness.startswith("claude-code-sess-1")
    found = await stack.client.get("/v1/tool_calls/call_abc")
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["toolCallId"] == "call_abc" and body["runId"] == harness
    assert body["serviceClass"] == "batch" and isinstance(body["caller"], str)
    assert "traceparent" in body
    missing = await stack.client.get("/v1/tool_calls/call_nope")
    assert missing.status_code == 404
    assert missing.headers["x-luftpause-dataplane-workers"] == "1"
    error = missing.json()["error"]
    assert error["code"] == "tool_call_not_found" and "call_nope" in error["message"]


async def test_a_repeated_tool_call_id_names_no_run(stack: Stack, tmp_path: Path) -> None:
    """D, D2 (#38): an engine whose tool call IDs repeat across runs (``functions.x:0``,
    with a ``/`` too) does not put one harness's sub-agents under another's session: the
    lookup of an ID two runs made is a 409 and the spawn gets no session."""
    call_id = "functions/spawn:0"
    first = await harness_turn(stack, call_id)
    found = await stack.client.get(f"/v1/tool_calls/{quote(call_id, safe='')}")
    assert found.status_code == 200 and found.json()["runId"] == first, found.text
    await harness_turn(stack, call_id, **{"x-claude-code-session-id": "sess-2"})
    clash = await stack.client.get(f"/v1/tool_calls/{quote(call_id, safe='')}")
    assert clash.status_code == 409, clash.text
    assert clash.json()["error"]["code"] == "tool_call_ambiguous"
    transport = httpx.ASGITransport(stack.app)
    async with runtime_on(tmp_path, transport, "http://dp", None) as (http, _):
        made = await spawn(http, {"task": "sub"}, {"claudecode/toolUseId": call_id})
        assert made["session"] is None


@pytest.mark.parametrize("stack", [TOKEN], indirect=True)
async def test_tool_call_endpoint_needs_the_token_and_the_runtime_sends_it(
    stack: Stack, tmp_path: Path
) -> None:
    """D9, X2 (#38): the lookup is authenticated as every /v1 route; the runtime sends
    the token, so a spawn still finds its session."""
    harness = await harness_turn(stack, **{"authorization": f"Bearer {TOKEN}"})
    refused = await stack.client.get("/v1/tool_calls/call_abc")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert "bearer" in refused.headers["www-authenticate"].lower()
    ok = await stack.client.get(
        "/v1/tool_calls/call_abc", headers={"authorization": f"Bearer {TOKEN}"}
    )
    assert ok.status_code == 200 and ok.json()["runId"] == harness
    transport = httpx.ASGITransport(stack.app)
    async with runtime_on(tmp_path, transport, "http://dp", TOKEN) as (http, _):
        made = await spawn(http, {"task": "sub"}, {"claudecode/toolUseId": "call_abc"})
        assert made["session"] == harness
        async with runtime_on(tmp_path / "no-token", transport, "http://dp", None) as (h2, _):
            alone = await spawn(h2, {"task": "sub"}, {"claudecode/toolUseId": "call_abc"})
            assert alone["session"] is None  # refused lookup: no session, the spawn works


@pytest.mark.parametrize("key", ["claudecode/toolUseId", "callId"])
async def test_spawn_from_a_harness_tool_call_is_grouped_under_its_session(
    stack: Stack, tmp_path: Path, key: str
) -> None:
    """R9 (#38): a spawn whose ``_meta`` names a harness's tool call records the harness's
    run as its ``session`` (spawn's and status's results); ``GET /status``'s tree groups
    the runs of one session under one node, a child spawned with ``parent`` stays under
    its parent, a run with no known call stays a root of its own; after a restart the
    journal gives every run its session again."""
    harness = await harness_turn(stack, "call_h1")
    transport = httpx.ASGITransport(stack.app)
    async with runtime_on(tmp_path, transport, "http://dp", None) as (http, rt):
        first = await spawn(http, {"task": "one"}, {key: "call_h1"})
        second = await spawn(http, {"task": "two"}, {key: "call_h1", "threadId": "t"})
        child = await spawn(http, {"task": "kid", "parent": first["handle"]}, {key: "call_h1"})
        plain = await spawn(http, {"task": "plain"}, {key: "call_unknown"})
        assert first["session"] == second["session"] == harness
        assert child["session"] is None and child["parent"] == first["handle"]
        assert plain["session"] is None
        await until(lambda: all(r.done for r in rt.state.runs.values()), "runs done")
        assert rt.run_json(rt.state.runs[first["handle"]])["session"] == harness

        def tree(rt: Runtime) -> list[dict[str, Any]]:
            nodes = status_tree(rt)["tree"]
            assert isinstance(nodes, list)
            return nodes

        [group, alone] = tree(rt)
        assert alone["handle"] == plain["handle"] and "session" not in alone
        assert group["session"] == harness and group["runs"] == 2
        assert [n["handle"] for n in group["children"]] == [first["handle"], second["handle"]]
        assert [n["handle"] for n in group["children"][0]["children"]] == [child["handle"]]
        assert group["subtree"]["turns"] == 3  # one turn each: first, its child, second
        before = tree(rt)
    async with runtime_on(tmp_path, transport, "http://dp", None) as (_, rt2):
        assert rt2.state.runs[first["handle"]].session == harness
        assert tree(rt2) == before


async def test_a_dataplane_that_is_down_costs_no_spawn(tmp_path: Path) -> None:
    """R2 (#38): with the dataplane unreachable the lookup fails quietly: the spawn
    returns its handle with no session."""
    base = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with runtime_on(tmp_path, None, base, None) as (http, rt):
        made = await spawn(http, {"task": "sub"}, {"claudecode/toolUseId": "call_abc"})
        assert made["session"] is None and made["handle"] in rt.state.runs


async def test_the_sub_agent_joins_the_harness_turns_trace(stack: Stack, tmp_path: Path) -> None:
    """X1 (#38): a spawn whose MCP request brought no trace context makes the sub-agent's
    ``invoke_agent`` span a child of the dataplane's span of the harness turn that made
    the call, with ``luftpause.session``; one that brought its own keeps it."""
    spans = memory_spans()
    harness = await harness_turn(stack, "call_t1")
    origin = stack.dp.memory.origin("call_t1")
    assert origin is not None and origin.traceparent is not None
    _, turn_trace, turn_span, _ = origin.traceparent.split("-")
    own = "00-" + "c" * 32 + "-" + "d" * 16 + "-01"
    transport = httpx.ASGITransport(stack.app)
    async with runtime_on(tmp_path, transport, "http://dp", None) as (http, rt):
        joined = await spawn(http, {"task": "one"}, {"claudecode/toolUseId": "call_t1"})
        kept = await spawn(
            http, {"task": "two"}, {"claudecode/toolUseId": "call_t1", "traceparent": own}
        )
        await until(lambda: all(r.done for r in rt.state.runs.values()), "runs done")
    agents = {
        (s.attributes or {}).get("gen_ai.agent.id"): s
        for s in named(spans.get_finished_spans(), "invoke_agent")
    }
    span = agents[joined["handle"]]
    assert span.context is not None and span.parent is not None
    assert f"{span.context.trace_id:032x}" == turn_trace
    assert f"{span.parent.span_id:016x}" == turn_span
    assert (span.attributes or {})["luftpause.session"] == harness
    other = agents[kept["handle"]]
    assert other.context is not None and f"{other.context.trace_id:032x}" == "c" * 32
    assert (other.attributes or {})["luftpause.session"] == harness
