"""R1-R3, R11: argument errors of the runtime's tools read like a person wrote them:
which argument, what was expected, what was given; never pydantic's dump or a link."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from luftpause.config import RuntimeSettings
from luftpause.runtime.journal import Journal
from luftpause.runtime.llm import DataplaneClient
from luftpause.runtime.loop import Runtime
from luftpause.runtime.server import build_mcp
from luftpause.runtime.upstream import ToolHub


@asynccontextmanager
async def connected(tmp_path: Path) -> AsyncIterator[Client]:
    settings = RuntimeSettings(state_dir=str(tmp_path), default_model="m")
    journal = Journal(tmp_path)
    journal.open()
    llm = DataplaneClient(
        "http://127.0.0.1:9", token=None, turn_timeout_s=1, retry_after_default_s=0.01
    )
    rt = Runtime(settings, journal, llm, ToolHub(()))
    async with Client(build_mcp(rt)) as c:
        yield c
    await rt.shutdown()
    await llm.aclose()


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("spawn", {"task": "x", "maxToolCalls": 99}, "'maxToolCalls' must be at most 64 (got 99)"),
        ("spawn", {"task": ""}, "argument 'task' must not be empty"),
        ("spawn", {}, "spawn: argument 'task' is required"),
        ("run", {"task": "x", "timeout": 0}, "argument 'timeout' must be greater than 0 (got 0)"),
        ("await", {"handles": "abc"}, "'handles' must be a list (a JSON array) (got \"abc\")"),
        ("await", {"handles": []}, "argument 'handles' must have at least 1 item(s)"),
        (
            "spawn",
            {"task": "x", "serviceClass": "fast", "budgetSeconds": "nan"},
            "argument 'serviceClass' must be one of 'interactive' or 'batch' (got \"fast\"); "
            "argument 'budgetSeconds' must be a finite number",
        ),
        ("approve", {"handle": "h", "allow": "maybe"}, "argument 'allow' must be true or false"),
        ("spawn", {"task": "x", "budgetTokens": "many"}, "argument 'budgetTokens'"),
        ("spawn", {"task": "y" * 10, "tools": "lookup"}, "argument 'tools'"),
    ],
)  # fmt: skip
async def test_argument_errors_name_the_argument(
    tmp_path: Path, tool: str, arguments: dict[str, Any], message: str
) -> None:
    async with connected(tmp_path) as client:
        result = await client.call_tool(tool, arguments)
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert message in text, text
    assert "pydantic" not in text and "http" not in text and "validation error" not in text


async def test_a_long_rejected_value_is_cut(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        result = await client.call_tool("spawn", {"task": "x", "serviceClass": "z" * 500})
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error and len(text) < 200 and text.count("z") < 70


HUGE = "h" * 10_000


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("await", {"handles": [HUGE]}, "unknown handle(s): 'hhh"),
        ("await", {"handles": [f"{HUGE}{i}" for i in range(50)]}, "(and 45 more)"),
        ("status", {"handle": HUGE}, "unknown handle(s): 'hhh"),
        ("cancel", {"handle": HUGE}, "unknown handle(s): 'hhh"),
        ("approve", {"handle": HUGE, "allow": True}, "unknown handle(s): 'hhh"),
        ("spawn", {"task": "x", "parent": HUGE}, "unknown parent handle 'hhh"),
        ("run", {"task": "x", "parent": HUGE}, "unknown parent handle 'hhh"),
        ("spawn", {"task": "x", "tools": [HUGE]}, "tools: unknown tool(s) 'hhh"),
        ("spawn", {"task": "x", "approveTools": [HUGE]}, "approveTools: unknown tool(s) 'hhh"),
        ("spawn", {"task": "x", "serviceClass": HUGE}, "argument 'serviceClass' must be one of"),
        ("spawn", {"task": "x", "idempotencyKey": HUGE}, "must be at most 256 characters long"),
        (HUGE, {}, "Unknown tool: 'hhh"),
    ],
)  # fmt: skip
async def test_values_quoted_back_are_cut(
    tmp_path: Path, tool: str, arguments: dict[str, Any], message: str
) -> None:
    """R1-R3, R9, R11: a tool error quotes a caller's value (a 10,000-character handle,
    parent, tool name, key) cut after 64 characters with its length, as the dataplane
    does; a long list of them shows the first five. They used to come back whole."""
    async with connected(tmp_path) as client:
        result = await client.call_tool(tool, arguments)
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert message in text, text[:500]
    assert re.search(r"… \(1000[01] characters\)", text), text[:500]
    assert len(text) < 800, len(text)
