"""A runtime in process for component tests: a scripted dataplane (an
``httpx.MockTransport``) and a tool hub with one destructive tool, ``rm``, whose calls
are counted and can be held open (``gate``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx

from luftpause.config import RuntimeSettings
from luftpause.runtime.journal import Journal
from luftpause.runtime.llm import DataplaneClient
from luftpause.runtime.loop import Runtime
from luftpause.runtime.mcp_tasks import TasksExtension, TaskStore
from luftpause.runtime.server import build_mcp, transport_security_for
from luftpause.runtime.upstream import ToolHub, ToolOutcome, UpstreamTool

RM = UpstreamTool(
    name="rm", server="fake", remote_name="rm", description="remove a file",
    input_schema={"type": "object", "properties": {"path": {"type": "string"}},
                  "required": ["path"]},
    read_only=False, destructive=True,
)  # fmt: skip


class Hub(ToolHub):
    def __init__(self) -> None:
        super().__init__(())
        self.tools = {"rm": RM}
        self.calls: list[dict[str, Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def call(self, tool: UpstreamTool, arguments: dict[str, Any]) -> ToolOutcome:
        await self.gate.wait()
        self.calls.append(arguments)
        return ToolOutcome(f"removed {arguments['path']}", False)

    async def refresh(self) -> None:
        return None


def model(request: httpx.Request) -> httpx.Response:
    """Calls rm on /a, then on /b, then answers; DELETE /v1/runs/... is a 404 (engine)."""
    if request.method == "DELETE":
        return httpx.Response(404, json={"detail": "Not Found"})
    body = json.loads(request.content)
    done = sum(1 for m in body["messages"] if m["role"] == "tool")
    if done < 2 and body.get("tools"):
        path = "/a" if done == 0 else "/b"
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": f"c{done}", "type": "function",
                            "function": {"name": "rm", "arguments": json.dumps({"path": path})}}],
        }  # fmt: skip
    else:
        message = {"role": "assistant", "content": "all done"}
    return httpx.Response(
        200,
        json={"choices": [{"index": 0, "message": message}],
              "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
    )  # fmt: skip


def runtime(state: Path, hub: Hub) -> tuple[Runtime, list[tuple[int, bytes]]]:
    """A runtime over ``state`` (its journal opened, not yet recovered) and the lines read."""
    settings = RuntimeSettings(state_dir=str(state), default_model="m")
    journal = Journal(state)
    records = journal.open()
    llm = DataplaneClient(
        "http://dataplane.test", token=None, turn_timeout_s=30, retry_after_default_s=0.01,
        transport=httpx.MockTransport(model),
    )  # fmt: skip
    return Runtime(settings, journal, llm, hub), records


async def until(predicate: Any, what: str) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.005)


@asynccontextmanager
async def served_runtime(
    state: Path, hub: Hub, bound_s: float
) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    """The runtime's MCP server with the Tasks extension, as ``luftpause runtime`` serves
    it, over ``httpx.ASGITransport`` (its journal in ``state`` recovered first): a client
    for it and the runtime, shut down on the way out; all of it within ``bound_s``."""
    rt, lines = runtime(state, hub)
    tasks = TasksExtension(TaskStore(state))
    async with tasks.running(), mcp_client(rt, lines, bound_s, tasks) as http:
        yield http, rt


@asynccontextmanager
async def mcp_client(
    rt: Runtime,
    lines: list[tuple[int, bytes]],
    bound_s: float,
    tasks: TasksExtension | None = None,
) -> AsyncIterator[httpx.AsyncClient]:
    """``rt``'s MCP server (``/mcp``, with ``tasks`` when given) over
    ``httpx.ASGITransport``, the journal's ``lines`` recovered first: a client for it;
    the runtime shut down on the way out; all of it within ``bound_s``."""
    mcp = build_mcp(rt, tasks=tasks, request_state_key=b"k" * 32)
    app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=False,
        transport_security=transport_security_for("127.0.0.1"),
    )
    with anyio.fail_after(bound_s):
        async with mcp.session_manager.run():
            rt.recover(lines)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                try:
                    yield http
                finally:
                    await rt.shutdown()
