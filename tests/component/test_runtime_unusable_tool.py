"""R5, R6: a tool whose input schema is invalid, through a sub-agent's loop.

The run is offered the tool with an empty schema (the engine never sees the invalid
one) and the reason in its description; when the model calls it anyway, the call is
refused with the reason and never reaches the tool server; the run goes on.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from mcp_types import Tool

from luftpause.config import RuntimeSettings
from luftpause.runtime.core import RunState
from luftpause.runtime.journal import Journal
from luftpause.runtime.llm import DataplaneClient
from luftpause.runtime.loop import Runtime
from luftpause.runtime.spawn_args import SpawnArgs
from luftpause.runtime.upstream import ToolHub, ToolOutcome, UpstreamTool

BAD_SCHEMA = {"type": "object", "properties": {"limit": {"type": "int"}}}


class Server:
    name = "fake"
    client = object()
    error = None
    tools = [Tool(name="broken", input_schema=BAD_SCHEMA)]


class Hub(ToolHub):
    def __init__(self) -> None:
        super().__init__(())
        self.servers = {"fake": Server()}  # type: ignore[dict-item]
        self._rebuild()  # as when the list is loaded from the server
        self.sent: list[dict[str, Any]] = []

    async def call(self, tool: UpstreamTool, arguments: dict[str, Any]) -> ToolOutcome:
        outcome = await super().call(tool, arguments)  # refuses without a server
        self.sent.append(arguments)
        return outcome

    async def refresh(self) -> None:
        return None


class Dataplane:
    """Calls "broken" once, then answers; keeps every turn's body."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        self.bodies.append(body)
        if not any(m["role"] == "tool" for m in body["messages"]):
            call = {"id": "c0", "type": "function",
                    "function": {"name": "broken", "arguments": '{"limit": 3}'}}  # fmt: skip
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            message = {"role": "assistant", "content": "answered without the tool"}
        return httpx.Response(200, json={"choices": [{"index": 0, "message": message}]})


async def test_a_call_to_a_tool_with_an_invalid_schema_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    """R6: offered without its schema, refused with the reason, never executed."""
    hub = Hub()
    assert hub.tools["broken"].unusable_reason is not None
    dataplane = Dataplane()
    journal = Journal(tmp_path)
    records = journal.open()
    llm = DataplaneClient(
        "http://dataplane.test", token=None, turn_timeout_s=30, retry_after_default_s=0.01,
        transport=httpx.MockTransport(dataplane),
    )  # fmt: skip
    rt = Runtime(RuntimeSettings(state_dir=str(tmp_path), default_model="m"), journal, llm, hub)
    rt.recover(records)
    try:
        run = await rt.spawn(SpawnArgs(task="use the tool"), caller="test")
        async with asyncio.timeout(10):
            while not run.done:
                await asyncio.sleep(0.005)
        assert run.state is RunState.COMPLETED, run
        first, second = dataplane.bodies
        (offered,) = first["tools"]
        assert offered["function"]["parameters"] == {"type": "object", "properties": {}}
        assert offered["function"]["description"].startswith("[unusable: its input schema")
        (result,) = [m for m in second["messages"] if m["role"] == "tool"]
        assert "'broken' cannot be used: its input schema is invalid" in result["content"]
        assert "properties/limit/type" in result["content"]
        assert hub.sent == []  # refused before the hub: nothing was sent to the server
        assert run.own.failed_tool_calls == 1
    finally:
        await rt.shutdown()
        await llm.aclose()
