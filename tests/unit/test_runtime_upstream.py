"""R5, R6: the upstream tool list - invalid input schemas found when the list is loaded,
validators built once per tool."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp_types import Tool, ToolAnnotations

from luftpause.runtime import upstream
from luftpause.runtime.hygiene import CompiledSchema, compile_schema
from luftpause.runtime.upstream import ToolHub, UpstreamTool

GOOD = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
BAD = {"type": "object", "properties": {"limit": {"type": "int"}}}


class FakeServer:
    """What ToolHub reads of a connected server: its name and its listed tools."""

    def __init__(self, name: str, tools: list[Tool]) -> None:
        self.name = name
        self.tools = tools
        self.client = object()
        self.error = None
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, name: str, arguments: dict[str, Any]) -> upstream.ToolOutcome:
        self.calls.append((name, arguments))
        return upstream.ToolOutcome("ok", False)


def hub_with(*tools: Tool) -> tuple[ToolHub, FakeServer]:
    hub = ToolHub(())
    server = FakeServer("fake", list(tools))
    hub.servers = {"fake": server}  # type: ignore[dict-item]
    hub._rebuild()
    return hub, server


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every schema compiled by an UpstreamTool, in order."""
    seen: list[Any] = []

    def counting(schema: Any) -> CompiledSchema:
        seen.append(schema)
        return compile_schema(schema)

    monkeypatch.setattr(upstream, "compile_schema", counting)
    return seen


def test_an_invalid_schema_is_found_when_the_list_loads(compiles: list[Any]) -> None:
    """R6: loading the list checks each schema once; the bad tool is listed as unusable with
    the reason, offered to models without its schema, and the good one is untouched."""
    hub, _ = hub_with(Tool(name="lookup", input_schema=GOOD), Tool(name="broken", input_schema=BAD))
    assert len(compiles) == 2  # checked at load, before any call
    broken = hub.tools["broken"].to_json()
    assert broken["usable"] is False
    assert "input schema is invalid" in broken["unusableReason"]
    assert "properties/limit/type" in broken["unusableReason"]
    assert broken["inputSchema"] == BAD  # listed as the server gave it
    good = hub.tools["lookup"].to_json()
    assert good["usable"] is True and good["unusableReason"] is None
    offered = hub.tools["broken"].openai_tool()["function"]
    assert offered["parameters"] == {"type": "object", "properties": {}}
    assert offered["description"].startswith("[unusable: its input schema is invalid")
    assert hub.tools["lookup"].openai_tool()["function"]["parameters"] == GOOD
    (status,) = hub.status()
    assert set(status["unusableTools"]) == {"broken"}


def test_validators_are_built_once_per_tool(compiles: list[Any]) -> None:
    """R6: many calls, one compiled schema; a reload with the same list keeps it; a changed
    schema is compiled again."""
    tool = Tool(name="lookup", input_schema=GOOD, annotations=ToolAnnotations(read_only_hint=True))
    hub, server = hub_with(tool)
    first = hub.tools["lookup"]
    for i in range(20):
        assert first.check(json.dumps({"query": f"q{i}"})).ok
    assert not first.check('{"q": 1}').ok
    hub._rebuild()
    assert hub.tools["lookup"] is first and len(compiles) == 1
    server.tools = [Tool(name="lookup", input_schema={**GOOD, "required": []})]
    hub._rebuild()
    assert hub.tools["lookup"] is not first and len(compiles) == 2


async def test_a_call_to_an_unusable_tool_is_refused_with_the_reason() -> None:
    """R6: the call is refused with the reason and never reaches the tool server."""
    hub, server = hub_with(Tool(name="broken", input_schema=BAD))
    tool = hub.tools["broken"]
    check = tool.check('{"limit": 3}')
    assert not check.ok and check.refusal is not None
    assert "'broken' cannot be used: its input schema is invalid" in check.refusal
    outcome = await hub.call(tool, {"limit": 3})
    assert outcome.is_error and outcome.text == check.refusal
    assert server.calls == []


async def test_a_usable_tool_is_called() -> None:
    hub, server = hub_with(Tool(name="lookup", input_schema=GOOD))
    outcome = await hub.call(hub.tools["lookup"], {"query": "x"})
    assert not outcome.is_error and server.calls == [("lookup", {"query": "x"})]


def test_a_tool_built_by_hand_checks_its_schema_too() -> None:
    """R6: UpstreamTool's own fields are unchanged; the check is derived from them."""
    tool = UpstreamTool(
        name="rm",
        server="s",
        remote_name="rm",
        description="remove",
        input_schema={"type": "object", "required": "path"},
        read_only=False,
        destructive=True,
    )
    assert tool.unusable_reason is not None and "required" in tool.unusable_reason
    assert tool.compiled is tool.compiled
