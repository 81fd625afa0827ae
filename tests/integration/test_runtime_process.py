"""The runtime as a real process, driven by the official MCP client in both eras (R1-R15, X2).

Stack per module: a fake engine (time-scaled), fake MCP tools, and between the
runtime and the engine a small *dataplane stand-in* running in this process. It
forwards turns to the engine (unstreamed: it answers a streamed turn with the whole
reply) and records what the runtime sent (luftpause headers, tool messages, run
ends), and lets a test shape replies through tags in
the task text: ``[wrong-types]``, ``[text-calls]``, ``[results=N]`` (engine
script overrides), ``[bad-args]`` (first turn: a call whose arguments cannot fit),
``[parallel]`` (first turn: three calls in one reply) and ``[429]`` (the first two
turns of the run are refused with 429), ``[coerce]`` (first turn: a call with an
integer written as a string) and ``[unique]`` (each call's query names its run and
round, so the tool counters tell calls apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from _mcp_raw import RawMcp
from _serve import ThreadServer
from conftest import Services
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ElicitResult
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from luftpause.procs import ServiceProcess
from luftpause.runtime.core import RuntimeState, replay
from luftpause.runtime.journal import read_lines

pytestmark = pytest.mark.integration

MODES = ("legacy", "auto")
CALL_TIMEOUT_S = 60.0
DEEP_SEARCH_S = 30.0  # "slow tool": long enough that only cancellation ends it


# ----------------------------------------------------------------------------- stand-in


class Standin:
    """Dataplane stand-in: forwards to the engine, records, injects scripted replies."""

    def __init__(self, engine_url: str) -> None:
        self.engine_url = engine_url
        self.turns: list[dict[str, Any]] = []  # {"headers", "body"}
        self.ended: list[str] = []
        self.refused: dict[str, int] = {}
        self._client = httpx.AsyncClient(base_url=engine_url, timeout=60.0)
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/decide", self.decide, methods=["POST"]),
                Route("/v1/runs/{run_id}", self.end, methods=["DELETE"]),
            ]
        )
        self._server = ThreadServer(app)
        self.url = self._server.url

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    def turns_of(self, run_id: str) -> list[dict[str, Any]]:
        return [t for t in self.turns if t["headers"].get("x-luftpause-run-id") == run_id]

    async def models(self, _: Request) -> Response:
        r = await self._client.get("/v1/models")
        return JSONResponse(r.json(), r.status_code)

    async def decide(self, request: Request) -> Response:
        r = await self._client.post("/classify", json=await request.json())
        return JSONResponse(r.json(), r.status_code)

    async def end(self, request: Request) -> Response:
        self.ended.append(request.path_params["run_id"])
        return Response(status_code=204)

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.turns.append({"headers": headers, "body": body})
        run_id = headers.get("x-luftpause-run-id", "")
        task = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
        first_turn = not any(m["role"] == "tool" for m in body["messages"])
        if "[429]" in task and self.refused.get(run_id, 0) < 2:
            self.refused[run_id] = self.refused.get(run_id, 0) + 1
            return JSONResponse(
                {"error": {"message": "slow down"}}, 429, headers={"Retry-After": "0"}
            )
        scripted = ("[bad-args]", "[parallel]", "[coerce]")
        if first_turn and body.get("tools") and any(tag in task for tag in scripted):
            if "[bad-args]" in task:
                calls = [("lookup", {"query": "rivers", "limit": "many"})]
            elif "[coerce]" in task:
                calls = [("lookup", {"query": "coerced", "limit": "2"})]
            else:
                calls = [("deep_search", {"query": f"q{i}", "depth": 1}) for i in range(3)]
            return JSONResponse(_scripted_calls(calls))
        extra: dict[str, str] = {}
        if "[wrong-types]" in task:
            extra["x-fake-wrong-types"] = "1"
        if "[text-calls]" in task:
            extra["x-fake-text-tool-calls"] = "1"
        match = re.search(r"\[results=(\d+)\]", task)
        if match:
            extra["x-fake-tool-results"] = match.group(1)
        # Asked unstreamed, answered with JSON, which the runtime reads as the reply to
        # its streamed request (test_runtime_fullstack.py streams through the real one).
        unstreamed = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        r = await self._client.post("/v1/chat/completions", json=unstreamed, headers=extra)
        reply = r.json()
        if "[unique]" in task and r.status_code == 200:
            # Filler queries repeat across runs; make each (run, round) call distinct and
            # deterministic, as a real model's would be for the same conversation.
            rounds = sum(1 for m in body["messages"] if m["role"] == "tool")
            for call in reply["choices"][0]["message"].get("tool_calls") or []:
                call["function"]["arguments"] = json.dumps({"query": f"{run_id}/{rounds}"})
        return JSONResponse(reply, r.status_code)


def _scripted_calls(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {
        "id": "scripted",
        "object": "chat.completion",
        "model": "llama-3.2-1b",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_s{i}",
                            "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)},
                        }
                        for i, (name, args) in enumerate(calls)
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


# ----------------------------------------------------------------------------- stack


def write_config(path: Path, dataplane: str, tools_url: str, state: Path) -> Path:
    path.write_text(
        f'[runtime]\ndataplane_url = "{dataplane}"\nstate_dir = "{state}"\n'
        f'[[runtime.tool_servers]]\nname = "fake"\nurl = "{tools_url}/mcp"\n'
    )
    return path


class Stack:
    def __init__(self, services: Services, tmp: Path) -> None:
        self.services = services
        self.tmp = tmp
        self.engine = services.start(
            "fake-engine", "--port", "0", "--time-scale", "50", "--tool-results", "2"
        )
        self.tools = services.start(
            "fake-mcp",
            "--port",
            "0",
            "--lookup-delay-s",
            "0.05",
            "--deep-search-delay-s",
            str(DEEP_SEARCH_S),
        )
        self.standin = Standin(self.engine.urls["http"])
        self.standin.start()
        self.runtime = self.start_runtime("main")

    def start_runtime(
        self, name: str, *, tools: ServiceProcess | None = None, env: dict[str, str] | None = None
    ) -> ServiceProcess:
        state = self.tmp / f"state-{name}"
        config = write_config(
            self.tmp / f"{name}.toml",
            self.standin.url,
            (tools or self.tools).urls["http"],
            state,
        )
        return self.services.start(
            "runtime", "--config", str(config), "--port", "0", name=f"runtime-{name}", env=env
        )

    @property
    def mcp_url(self) -> str:
        return self.runtime.urls["http"] + "/mcp"

    async def counts(self, tools: ServiceProcess | None = None) -> dict[str, Any]:
        r = await request("GET", (tools or self.tools).urls["http"] + "/counts")
        return dict(r.json())


async def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.request(method, url, **kwargs)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("runtime")
    services = Services(tmp)
    s: Stack | None = None
    try:
        s = Stack(services, tmp)
        yield s
    finally:
        if s is not None:
            s.standin.stop()
        services.stop_all()


@pytest.fixture(autouse=True)
def _attach_stderr(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "stack" in request.fixturenames:
        st: Stack = request.getfixturevalue("stack")
        for svc in st.services.started:
            request.node.add_report_section("call", f"stderr of {svc.name}", svc.stderr()[-8000:])


@asynccontextmanager
async def connect(url: str, mode: str, **kwargs: Any) -> AsyncIterator[Client]:
    async with asyncio.timeout(CALL_TIMEOUT_S * 2):
        async with Client(url, mode=mode, read_timeout_seconds=CALL_TIMEOUT_S, **kwargs) as c:
            yield c


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    text = result.content[0].text  # type: ignore[union-attr]
    return dict(json.loads(text))


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result.content
    return str(result.content[0].text)  # type: ignore[union-attr]


async def spawn(c: Client, task: str, **args: Any) -> str:
    return str(data(await c.call_tool("spawn", {"task": task, **args}))["handle"])


async def await_all(c: Client, handles: list[str], timeout: float = 30) -> dict[str, Any]:
    return data(await c.call_tool("await", {"handles": handles, "timeout": timeout}))


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("mode", MODES)
async def test_spawn_and_await_all_and_any(stack: Stack, mode: str) -> None:
    """R1-R4, R15: spawn returns at once; await any/all; results carry toolCalls/failedToolCalls;
    turns carry run id, class and caller and are streamed with usage asked for; every run
    end is reported to the dataplane."""
    async with connect(stack.mcp_url, mode) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert names == {"spawn", "await", "run", "status", "cancel", "approve", "tools", "decide"}
        handles = [await spawn(c, f"{mode} fan-out task {i}", tools=["lookup"]) for i in range(3)]
        first = data(await c.call_tool("await", {"handles": handles, "mode": "any"}))
        assert first["mode"] == "any" and first["finished"]
        assert any(r["state"] == "Completed" for r in first["results"])
        done = await await_all(c, handles)
    assert done["finished"] and not done["timedOut"]
    for r in done["results"]:
        assert r["state"] == "Completed", r
        assert (r["toolCalls"], r["failedToolCalls"], r["turns"]) == (2, 0, 3)
        assert r["serviceClass"] == "interactive" and r["result"]
        turns = stack.standin.turns_of(r["handle"])
        assert len(turns) == 3
        callers = {t["headers"]["x-luftpause-caller"] for t in turns}
        assert len(callers) == 1 and callers != {""}
        assert {t["headers"]["x-luftpause-class"] for t in turns} == {"interactive"}
        assert "authorization" not in turns[0]["headers"]
        assert turns[0]["body"]["max_tokens"] == 256
        assert [t["function"]["name"] for t in turns[0]["body"]["tools"]] == ["lookup"]
        # streamed, asking for the usage the budgets count (R4, runtime.stream_turns)
        assert {(t["body"]["stream"], str(t["body"]["stream_options"])) for t in turns} == {
            (True, "{'include_usage': True}")
        }
    deadline = time.monotonic() + 10
    while not set(handles) <= set(stack.standin.ended):
        assert time.monotonic() < deadline, "run ends not reported (R15)"
        await asyncio.sleep(0.02)


async def test_await_timeout_clamp_and_errors(stack: Stack) -> None:
    """R3: await returns the current state at its timeout; a timeout above 600 s is clamped
    and says so; bad input is a tool error naming the problem."""
    async with connect(stack.mcp_url, "legacy") as c:
        slow = await spawn(c, "slow one", tools=["deep_search"])
        out = data(await c.call_tool("await", {"handles": [slow], "timeout": 0.3}))
        assert out["timedOut"] and not out["finished"]
        assert out["results"][0]["state"] == "Running"
        quick = await spawn(c, "quick one", tools=["lookup"], maxToolCalls=0)
        out = data(await c.call_tool("await", {"handles": [quick], "timeout": 5000}))
        assert out["finished"] and "clamped" in out["note"] and "600" in out["note"]
        assert out["results"][0]["turns"] == 1 and out["results"][0]["toolCalls"] == 0
        msg = error_text(await c.call_tool("await", {"handles": ["run-nope"]}))
        assert "unknown handle" in msg and "run-nope" in msg
        msg = error_text(await c.call_tool("spawn", {"task": "x", "maxToolCalls": 999}))
        assert "maxToolCalls" in msg
        msg = error_text(await c.call_tool("spawn", {"task": "x", "tools": ["nope"]}))
        assert "unknown tool" in msg and "lookup" in msg
        msg = error_text(await c.call_tool("spawn", {"task": "x", "parent": "run-nope"}))
        assert "unknown parent" in msg
        await c.call_tool("cancel", {"handle": slow})


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_tree_and_status(stack: Stack, mode: str) -> None:
    """R9: spawn(parent) builds a tree; cancel cancels running descendants; status and
    GET /status show parent/children and subtree totals."""
    async with connect(stack.mcp_url, mode) as c:
        root = await spawn(c, "root", tools=["deep_search"])
        child = await spawn(c, "child", tools=["deep_search"], parent=root)
        grandchild = await spawn(c, "grandchild", tools=["lookup"], parent=child, maxToolCalls=0)
        await await_all(c, [grandchild])
        st = data(await c.call_tool("status", {"handle": root}))
        assert st["children"] == [child] and st["parent"] is None
        cancelled = data(await c.call_tool("cancel", {"handle": root}))["cancelled"]
        assert set(cancelled) == {root, child}  # the grandchild had finished already
        out = await await_all(c, [root, child, grandchild])
        states = [r["state"] for r in out["results"]]
        assert states == ["Cancelled", "Cancelled", "Completed"]
        assert out["results"][0]["error"] == "cancelled by the client"
    tree = (await request("GET", stack.runtime.urls["http"] + "/status")).json()
    node = next(n for n in tree["tree"] if n["handle"] == root)
    assert node["children"][0]["handle"] == child
    assert node["children"][0]["children"][0]["handle"] == grandchild
    assert node["subtree"]["turns"] >= node["own"]["turns"] + 1
    for key in (
        "turns",
        "toolCalls",
        "failedToolCalls",
        "promptTokens",
        "completionTokens",
        "turnSeconds",
        "toolSeconds",
    ):
        assert key in node["subtree"] and key in node["own"]


async def test_budgets_trip_on_each_dimension(stack: Stack) -> None:
    """R10: tokens, tool calls and seconds (an idle subtree trips by the timer); the subtree
    is cancelled with `budget exceeded: <which> <used>/<limit>`; status shows the budget."""
    async with connect(stack.mcp_url, "legacy") as c:
        tokens = await spawn(c, "tokens [results=5]", tools=["lookup"], budgetTokens=50)
        calls = await spawn(c, "calls [results=5]", tools=["lookup"], budgetToolCalls=1)
        idle = await spawn(c, "idle parent", tools=["deep_search"], budgetSeconds=1)
        idle_child = await spawn(c, "idle child", tools=["deep_search"], parent=idle)
        out = await await_all(c, [tokens, calls, idle, idle_child], timeout=20)
    assert out["finished"]
    by = {r["handle"]: r for r in out["results"]}
    assert re.fullmatch(r"budget exceeded: tokens \d+/50", by[tokens]["error"])
    assert by[tokens]["budget"]["exceeded"] == by[tokens]["error"]
    assert by[tokens]["budget"]["limits"] == {"tokens": 50}
    assert by[calls]["error"] == "budget exceeded: toolCalls 2/1"
    assert by[calls]["toolCalls"] == 1 and by[calls]["budget"]["used"]["toolCalls"] == 1
    for h in (idle, idle_child):
        assert by[h]["state"] == "Cancelled"
        assert re.fullmatch(r"budget exceeded: seconds \d+\.\d/1", by[h]["error"]), by[h]
    assert by[idle]["budget"]["exceeded"].startswith("budget exceeded: seconds")


async def test_tool_budget_then_answer(stack: Stack) -> None:
    """R7: after maxToolCalls no tools are offered and the model must answer."""
    async with connect(stack.mcp_url, "legacy") as c:
        h = await spawn(c, "budget [results=9]", tools=["lookup"], maxToolCalls=2, maxTokens=0)
        r = (await await_all(c, [h]))["results"][0]
    assert r["state"] == "Completed" and r["toolCalls"] == 2 and r["turns"] == 3
    turns = stack.standin.turns_of(h)
    assert ["tools" in t["body"] for t in turns] == [True, True, False]
    assert all("max_tokens" not in t["body"] for t in turns)  # maxTokens 0: engine decides


async def test_hygiene_coercion_refusal_text_calls(stack: Stack) -> None:
    """R6: string scalars are coerced (the fake tools refuse them), a call that cannot fit is
    refused with the expected shape and never executed, text tool calls are recovered."""
    async with connect(stack.mcp_url, "auto") as c:
        wrong = await spawn(c, "coerce me [coerce]", tools=["lookup"])
        text = await spawn(c, "text calls [text-calls]", tools=["lookup"])
        bad = await spawn(c, "bad args [bad-args] [results=1]", tools=["lookup"])
        out = await await_all(c, [wrong, text, bad])
    by = {r["handle"]: r for r in out["results"]}
    assert (by[wrong]["toolCalls"], by[wrong]["failedToolCalls"]) == (2, 0)
    assert '{"limit":2,"query":"coerced"}' in (await stack.counts())["completed"]["lookup"]
    assert (by[text]["toolCalls"], by[text]["failedToolCalls"], by[text]["turns"]) == (2, 0, 3)
    second = stack.standin.turns_of(text)[1]["body"]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "lookup"
    assert by[bad]["failedToolCalls"] == 1 and by[bad]["state"] == "Completed"
    refusal = stack.standin.turns_of(bad)[1]["body"]["messages"][-1]
    assert refusal["role"] == "tool"
    assert "Expected arguments" in refusal["content"] and '"limit"' in refusal["content"]
    started = (await stack.counts())["started"].get("lookup", {})
    assert not any('"many"' in key for key in started)


async def test_parallel_tool_calls_and_429(stack: Stack) -> None:
    """R5, R14: with parallelToolCalls the three calls of one reply run at once (all started,
    none completed); a 429 is retried after Retry-After with the same run id."""
    async with connect(stack.mcp_url, "legacy") as c:
        h = await spawn(c, "fan [parallel] [429]", tools=["deep_search"], parallelToolCalls=True)
        deadline = time.monotonic() + 20
        while True:
            started = (await stack.counts())["started"].get("deep_search", {})
            wanted = {f'{{"depth":1,"query":"q{i}"}}' for i in range(3)}
            if wanted <= set(started):
                break
            assert time.monotonic() < deadline, started
            await asyncio.sleep(0.05)
        assert stack.standin.refused[h] == 2
        assert len(stack.standin.turns_of(h)) == 3  # two refused, then the scripted reply
        await c.call_tool("cancel", {"handle": h})


async def _elicit_allow_then_deny(answers: list[bool]) -> Any:
    async def callback(context: Any, params: Any) -> ElicitResult:
        assert "delete_record" in params.message
        assert params.requested_schema["properties"]["allow"]["type"] == "boolean"
        allow = answers.pop(0)
        return ElicitResult(action="accept", content={"allow": allow})

    return callback


@pytest.mark.parametrize("mode", MODES)
async def test_approval_by_elicitation(stack: Stack, mode: str) -> None:
    """R11: a destructive tool waits for the user; legacy sessions are asked mid-call, modern
    clients through an input-required result; a declined call tells the model so."""
    answers = [True, False]
    callback = await _elicit_allow_then_deny(answers)
    async with connect(stack.mcp_url, mode, elicitation_callback=callback) as c:
        h = await spawn(c, f"delete things {mode}", tools=["delete_record"])
        r = (await await_all(c, [h]))["results"][0]
    assert answers == []
    assert r["state"] == "Completed", r
    assert (r["toolCalls"], r["failedToolCalls"]) == (2, 1)
    last = stack.standin.turns_of(h)[-1]["body"]["messages"][-1]
    assert last["content"] == "Error: the user declined this tool call"


async def test_approval_by_approve_tool(stack: Stack) -> None:
    """R11: a client that cannot be asked sees AwaitingApproval with pendingApproval and
    answers with approve(); approveTools makes a read-only tool need approval too."""
    async with connect(stack.mcp_url, "legacy") as c:
        h = await spawn(c, "approve me", tools=["lookup"], approveTools=["lookup"])
        allowed = 0
        while True:
            out = await await_all(c, [h])
            r = out["results"][0]
            if r["state"] != "AwaitingApproval":
                break
            assert r["pendingApproval"]["tool"] == "lookup"
            assert "query" in r["pendingApproval"]["arguments"]
            ok = data(await c.call_tool("approve", {"handle": h, "allow": True}))
            assert ok["allowed"] is True
            allowed += 1
        msg = error_text(await c.call_tool("approve", {"handle": h, "allow": True}))
        assert "not waiting for an approval" in msg
    assert allowed == 2 and r["state"] == "Completed" and r["failedToolCalls"] == 0


async def test_run_blocks_until_done(stack: Stack) -> None:
    """R12 (blocking form): run takes spawn's arguments and returns the finished run."""
    async with connect(stack.mcp_url, "auto") as c:
        r = data(await c.call_tool("run", {"task": "blocking", "tools": ["lookup"]}))
    assert r["state"] == "Completed" and r["toolCalls"] == 2


async def test_default_tools_leave_out_destructive_ones(stack: Stack) -> None:
    """R5, R11: without ``tools`` a sub-agent is offered the read-only tools only; a
    destructive tool is offered to a run that names it."""
    async with connect(stack.mcp_url, "legacy") as c:
        h = await spawn(c, "default tools", maxToolCalls=1)
        named = await spawn(c, "named", tools=["delete_record"], maxToolCalls=0)
        await await_all(c, [h])
        await c.call_tool("cancel", {"handle": named})
    offered = {t["function"]["name"] for t in stack.standin.turns_of(h)[0]["body"]["tools"]}
    assert offered == {"lookup", "deep_search"}


@pytest.mark.parametrize("mode", MODES)
async def test_run_hands_approvals_back_to_a_client_that_cannot_be_asked(
    stack: Stack, mode: str
) -> None:
    """R11, R12: ``run`` for a client without elicitation returns at once when its run waits
    for approval, saying at top level which call waits and how to answer; after
    ``approve`` an ``await`` on the handle collects the run."""
    async with connect(stack.mcp_url, mode) as c:
        out = data(
            await c.call_tool(
                "run", {"task": f"run needs approval {mode}", "tools": ["delete_record"]}
            )
        )
        assert out["state"] == "AwaitingApproval" and out["finished"] is False
        [waiting] = out["awaitingApproval"]
        h = out["handle"]
        assert waiting["handle"] == h and waiting["tool"] == "delete_record"
        assert waiting["answerWith"] == {"tool": "approve", "arguments": {"handle": h}}
        assert "approve(handle" in out["next"]
        answered = 0
        while True:
            ok = data(await c.call_tool("approve", {"handle": h, "allow": False}))
            assert ok["allowed"] is False
            answered += 1
            got = await await_all(c, [h])
            if got["finished"]:
                break
            assert got["awaitingApproval"][0]["handle"] == h
    r = got["results"][0]
    assert answered == 2 and r["state"] == "Completed" and r["failedToolCalls"] == 2
    assert "awaitingApproval" not in got


async def test_run_as_a_task_with_approval_by_tasks_update(stack: Stack) -> None:
    """R12, R11: over raw JSON-RPC, a client that declared Tasks gets ``run`` as a task;
    each approval is an input request answered by tasks/update; the result is inlined."""
    async with httpx.AsyncClient(base_url=stack.runtime.urls["http"], timeout=30) as http:
        raw = RawMcp(http)
        created = (
            await raw.modern(
                "tools/call",
                {
                    "name": "run",
                    "arguments": {"task": "task approvals", "tools": ["delete_record"]},
                },
            )
        ).result
        assert created["resultType"] == "task"
        task_id = created["taskId"]
        for allow in (True, False):
            task = await raw.wait_for(task_id, "input_required", keys=1)
            [key] = task["inputRequests"]
            answer = {key: {"action": "accept", "content": {"allow": allow}}}
            await raw.modern("tasks/update", {"taskId": task_id, "inputResponses": answer})
        done = await raw.wait_for(task_id, "completed")
    out = json.loads(done["result"]["content"][0]["text"])
    assert out["state"] == "Completed" and (out["toolCalls"], out["failedToolCalls"]) == (2, 1)


async def test_run_returns_at_its_timeout(stack: Stack) -> None:
    """R12: ``run`` never waits silently past its timeout: it returns the run's current
    state, its handle and what to do next."""
    async with connect(stack.mcp_url, "legacy") as c:
        out = data(
            await c.call_tool("run", {"task": "slow run", "tools": ["deep_search"], "timeout": 0.5})
        )
        assert out["finished"] is False and out["timedOut"] is True
        assert out["state"] == "Running" and out["handle"] in out["next"]
        await c.call_tool("cancel", {"handle": out["handle"]})


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def test_metrics(stack: Stack) -> None:
    """R1 (operations): ``GET /metrics`` serves runs by state, turns and tool calls by
    outcome, approvals pending, journal fsync latency and process metrics."""
    url = stack.runtime.urls["http"] + "/metrics"
    before = _samples((await request("GET", url)).text)
    async with connect(stack.mcp_url, "legacy") as c:
        r = data(await c.call_tool("run", {"task": "counted", "tools": ["lookup"]}))
    assert r["state"] == "Completed" and r["toolCalls"] == 2
    response = await request("GET", url)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    after = _samples(response.text)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("luftpause_runtime_runs_started_total") == 1
    assert delta('luftpause_runtime_turns_total{outcome="ok"}') == 3
    assert delta('luftpause_runtime_tool_calls_total{outcome="ok"}') == 2
    assert delta('luftpause_runtime_tool_calls_total{outcome="declined"}') == 0
    assert delta('luftpause_runtime_runs{state="Completed"}') == 1
    assert after["luftpause_runtime_approvals_pending"] >= 0
    assert delta("luftpause_runtime_journal_fsync_seconds_count") >= 4  # spawn, 2 rounds, end
    assert "process_resident_memory_bytes" in after


@pytest.mark.parametrize("mode", MODES)
async def test_decide_both_ways(stack: Stack, mode: str) -> None:
    """R13: no labels -> the classifier; 2-20 labels -> one 1-token interactive turn scored
    by first-token logprobs (sent unstreamed, where sub-agents' turns are streamed, R4);
    returns label, probabilities, unscored."""
    async with connect(stack.mcp_url, mode) as c:
        labels = ["urgent", "lookup", "chitchat"]
        r = data(
            await c.call_tool("decide", {"input": "servers down, pager ringing", "labels": labels})
        )
        assert r["label"] in labels
        assert abs(sum(r["probabilities"].values()) - 1) < 1e-3
        assert set(r["probabilities"]) | set(r["unscored"]) == set(labels)
        r2 = data(await c.call_tool("decide", {"input": "what is the population of Oslo"}))
        assert r2["label"] in {"lookup", "urgent", "chitchat"} and r2["via"] == "classifier"
        msg = error_text(await c.call_tool("decide", {"input": "x", "labels": ["one"]}))
        assert "2-20 labels" in msg
    turn = [t for t in stack.standin.turns if t["body"].get("max_tokens") == 1][-1]
    assert turn["body"]["logprobs"] is True and turn["body"]["top_logprobs"] == 20
    assert turn["headers"]["x-luftpause-class"] == "interactive"
    # one token: nothing for the decode pace to time, so it goes unstreamed
    assert "stream" not in turn["body"] and "stream_options" not in turn["body"]


async def test_auth_token(stack: Stack) -> None:
    """X2: with LUFTPAUSE_TOKEN, /mcp and /status need the bearer token (401 JSON otherwise)
    and the runtime sends the token to the dataplane."""
    rt = stack.start_runtime("auth", env={"LUFTPAUSE_TOKEN": "s3cret"})
    base = rt.urls["http"]
    r = await request("GET", base + "/status")
    assert r.status_code == 401 and "bearer token" in r.json()["error"]["message"]
    wrong = await request("GET", base + "/status", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert (await request("POST", base + "/mcp", json={})).status_code == 401
    ok = await request("GET", base + "/status", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    async with (
        httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret"}) as http,
        Client(
            streamable_http_client(base + "/mcp", http_client=http),
            mode="legacy",
            read_timeout_seconds=CALL_TIMEOUT_S,
        ) as c,
    ):
        h = await spawn(c, "with token", tools=["lookup"], maxToolCalls=0)
        await await_all(c, [h])
    assert stack.standin.turns_of(h)[0]["headers"]["authorization"] == "Bearer s3cret"
    rt.stop()
    assert "LUFTPAUSE_TOKEN is not set" in stack.runtime.stderr()


def _journal(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a torn last line
            out.append(json.loads(line))
    return out


async def test_sigkill_mid_run_then_restart(stack: Stack) -> None:
    """R8, R12: a runtime SIGKILLed while 10 sub-agents run and 3 ``run`` tasks are open
    resumes every run after a restart (the tasks' runs too); no tool call of a journaled
    (complete) round is executed again; finished runs answer; the open tasks report
    failed; the journal replays to the same state twice."""
    tools = stack.services.start(
        "fake-mcp", "--port", "0", "--lookup-delay-s", "0.3", name="fake-mcp-restart"
    )
    rt = stack.start_runtime("restart", tools=tools)
    state_dir = stack.tmp / "state-restart"
    journal = state_dir / "runs.jsonl"
    async with connect(rt.urls["http"] + "/mcp", "legacy") as c:
        quick = await spawn(c, "done before the kill", tools=["lookup"], maxToolCalls=0)
        await await_all(c, [quick])
        handles = [
            await spawn(c, f"survivor {i} [results=4] [unique]", tools=["lookup"])
            for i in range(10)
        ]
    async with httpx.AsyncClient(base_url=rt.urls["http"], timeout=30) as http:
        raw = RawMcp(http)
        task_ids = []
        for i in range(3):
            created = (
                await raw.modern(
                    "tools/call",
                    {
                        "name": "run",
                        "arguments": {
                            "task": f"task {i} [results=4] [unique]",
                            "tools": ["lookup"],
                        },
                    },
                )
            ).result
            assert created["resultType"] == "task", created
            task_ids.append(created["taskId"])

    def attached() -> list[str]:
        """The runs the tasks follow, as journaled (a task's work starts its run and
        attaches it after ``tools/call`` has answered)."""
        tasks_journal = state_dir / "tasks.jsonl"
        if not tasks_journal.exists():
            return []
        records = _journal(tasks_journal)
        return sorted({r["task"]["attachment"] for r in records if r["task"].get("attachment")})

    # Killed once every task follows its run and the runs are under way.
    deadline = time.monotonic() + 30
    while sum(1 for r in _journal(journal) if r["t"] == "tools") < 5 or len(attached()) < 3:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    rt.stop(signal.SIGKILL)
    before = _journal(journal)
    ended_before = {r["run"] for r in before if r["t"] == "end"}
    assert not set(handles) <= ended_before, "every run ended before the kill"
    task_runs = attached()
    assert len(task_runs) == 3
    complete = {(r["run"], r["seq"]) for r in before if r["t"] == "tools"}
    journaled_calls = [
        json.dumps(json.loads(call["function"]["arguments"]), sort_keys=True, separators=(",", ":"))
        for r in before
        if r["t"] == "turn" and (r["run"], r["seq"]) in complete
        for call in r["message"]["tool_calls"]
    ]
    rt2 = stack.services.start(*rt_args(stack, "restart"), name="runtime-restart-2")
    async with httpx.AsyncClient(base_url=rt2.urls["http"], timeout=30) as http:
        raw = RawMcp(http)
        for task_id in task_ids:
            task = await raw.get(task_id)
            assert task["status"] == "failed", task
            assert "restarted" in task["error"]["message"]
    async with connect(rt2.urls["http"] + "/mcp", "auto") as c:
        out = await await_all(c, [quick, *handles, *task_runs], timeout=60)
    assert out["finished"]
    for r in out["results"][1:]:
        assert r["state"] == "Completed", r
        assert r["toolCalls"] == 4 and r["failedToolCalls"] == 0
    assert out["results"][0]["state"] == "Completed"
    completed = (await stack.counts(tools))["completed"]["lookup"]
    assert journaled_calls and all(completed[key] == 1 for key in journaled_calls)
    assert all(n <= 2 for n in completed.values())  # only an in-flight round may run twice
    rt2.stop()
    lines, _ = read_lines(journal)
    once, twice = RuntimeState(), RuntimeState()
    assert replay(once, lines).problems == []
    replay(twice, lines)
    replay(twice, lines)
    assert _state_view(once) == _state_view(twice)
    assert all(run.done for run in once.runs.values())


async def test_an_idempotency_key_survives_a_restart(stack: Stack) -> None:
    """R2, R8: a spawn with an ``idempotencyKey``, the runtime SIGKILLed, then the same
    spawn from a new client (the other protocol era): the same handle comes back marked
    ``reused``, no second run starts (one spawn record carries the key), and other
    arguments with the key are refused naming it."""
    rt = stack.start_runtime("idem")
    journal = stack.tmp / "state-idem" / "runs.jsonl"
    args = {"task": "keyed [results=1]", "tools": ["lookup"], "idempotencyKey": "retry-me"}
    async with connect(rt.urls["http"] + "/mcp", "legacy") as c:
        first = data(await c.call_tool("spawn", args))
    assert "reused" not in first
    rt.stop(signal.SIGKILL)
    rt2 = stack.services.start(*rt_args(stack, "idem"), name="runtime-idem-2")
    async with connect(rt2.urls["http"] + "/mcp", "auto") as c:
        again = data(await c.call_tool("spawn", args))
        other = error_text(await c.call_tool("spawn", {**args, "task": "other"}))
        out = await await_all(c, [first["handle"]])
    rt2.stop()
    assert again["handle"] == first["handle"] and again["reused"] is True
    assert f"idempotencyKey 'retry-me' was already used by run {first['handle']}" in other
    assert out["results"][0]["state"] == "Completed"
    spawns = [r for r in _journal(journal) if r["t"] == "spawn"]
    assert [(r["run"], r["idempotencyKey"]) for r in spawns] == [(first["handle"], "retry-me")]


def _state_view(state: RuntimeState) -> dict[str, Any]:
    return {
        rid: (r.state, r.turns, r.results, r.approvals, r.own.to_json(), r.subtree.to_json())
        for rid, r in state.runs.items()
    }


def rt_args(stack: Stack, name: str) -> list[str]:
    return ["runtime", "--config", str(stack.tmp / f"{name}.toml"), "--port", "0"]


async def test_stdio_tool_server(stack: Stack) -> None:
    """R5: upstream tool servers over stdio work like HTTP ones (the runtime starts them)."""
    state = stack.tmp / "state-stdio"
    counts = stack.tmp / "stdio-counts.jsonl"
    command = json.dumps(
        [
            sys.executable,
            "-m",
            "luftpause",
            "fake-mcp",
            "--stdio",
            "--lookup-delay-s",
            "0",
            "--counts-file",
            str(counts),
        ]
    )
    config = stack.tmp / "stdio.toml"
    config.write_text(
        f'[runtime]\ndataplane_url = "{stack.standin.url}"\nstate_dir = "{state}"\n'
        f'[[runtime.tool_servers]]\nname = "local"\ncommand = {command}\n'
    )
    rt = stack.services.start(
        "runtime", "--config", str(config), "--port", "0", name="runtime-stdio"
    )
    async with connect(rt.urls["http"] + "/mcp", "legacy") as c:
        listed = data(await c.call_tool("tools", {}))
        assert {t["name"] for t in listed["tools"]} == {"lookup", "deep_search", "delete_record"}
        assert listed["servers"][0]["connected"] is True
        h = await spawn(c, "stdio tools", tools=["lookup"])
        r = (await await_all(c, [h]))["results"][0]
    assert r["state"] == "Completed" and (r["toolCalls"], r["failedToolCalls"]) == (2, 0)
    lines = [json.loads(line) for line in counts.read_text().splitlines()]
    assert [line["tool"] for line in lines] == ["lookup", "lookup"]
    rt.stop()
