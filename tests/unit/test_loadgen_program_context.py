"""The load generator names runs as programs to vllm-router (``--program-context``): the
``vllm_xargs.agentic_context`` each turn's body carries, or Claude Code's session headers
(H3: the baseline arm through vllm-router; H4)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

import pytest

from luftpause.loadgen.agents import (
    AgentOptions,
    Lineage,
    agentic_context,
    run_headers,
    turn_body,
)
from luftpause.loadgen.main import add_arguments
from luftpause.measure.mix import Group

PEOPLE = Group("people", 4, "interactive", "people")
CROWD = Group("crowd", 48, "batch", "crowd")


def context_of(body: dict[str, Any]) -> dict[str, Any]:
    """The decoded context: vLLM's vllm_xargs values are strings or numbers, so it is a
    JSON string (vllm-router decodes one)."""
    raw = body["vllm_xargs"]["agentic_context"]
    assert isinstance(raw, str)
    decoded = json.loads(raw)
    assert isinstance(decoded, dict)
    return decoded


def test_flag_defaults_to_none_and_takes_xargs_or_headers() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args([]).program_context == "none"
    assert p.parse_args(["--program-context", "xargs"]).program_context == "xargs"
    assert p.parse_args(["--program-context", "headers"]).program_context == "headers"
    with pytest.raises(SystemExit):
        p.parse_args(["--program-context", "body"])


def test_xargs_body_names_the_run_its_class_priority_and_its_last_turn() -> None:
    xargs = AgentOptions(model="m", program_context="xargs")
    body = turn_body(PEOPLE, "run-1", False, xargs)
    assert set(body) == {"vllm_xargs"} and set(body["vllm_xargs"]) == {"agentic_context"}
    assert context_of(body) == {"program_id": "run-1", "priority": 1, "expected_resume": True}
    last = context_of(turn_body(CROWD, "run-2", True, xargs))
    assert last == {"program_id": "run-2", "priority": 0, "expected_resume": False}
    # a sub-agent names its parent, which waits for it
    sub = context_of(turn_body(CROWD, "run-2.1.0", False, xargs, parent="run-2"))
    assert sub["parent_program_id"] == "run-2" and sub["blocks_parent"] is True
    # the body priority for engines is sent beside it, unchanged
    both = turn_body(PEOPLE, "run-3", True, replace(xargs, priority={"interactive": 10}))
    assert both["priority"] == 10 and context_of(both)["priority"] == 1
    assert agentic_context(PEOPLE, "run-3", True) == context_of(both)


def test_without_the_option_nothing_is_added() -> None:
    plain = AgentOptions(model="m")
    assert turn_body(PEOPLE, "run-1", True, plain) == {}
    assert turn_body(
        PEOPLE, "run-1", True, AgentOptions(model="m", priority={"interactive": 5})
    ) == {"priority": 5}
    assert "x-claude-code-session-id" not in run_headers(PEOPLE, "run-1", 3, plain)
    assert (
        turn_body(PEOPLE, "run-1", True, AgentOptions(model="m", program_context="headers")) == {}
    )


def test_headers_name_the_run_as_a_claude_code_session() -> None:
    headers = AgentOptions(model="m", class_headers=False, program_context="headers")
    assert run_headers(CROWD, "run-1", 2, headers) == {
        "x-fake-tool-results": "2",
        "x-claude-code-session-id": "run-1",
    }
    child = run_headers(CROWD, "run-1.1.0", 2, headers, Lineage(root="run-1", parent="run-1"))
    assert child["x-claude-code-session-id"] == "run-1"
    assert child["x-claude-code-agent-id"] == "run-1.1.0"
    assert "x-claude-code-parent-agent-id" not in child  # its parent is the session's lead
    grandchild = run_headers(
        CROWD, "run-1.1.0.2.0", 2, headers, Lineage(root="run-1", parent="run-1.1.0")
    )
    assert grandchild["x-claude-code-session-id"] == "run-1"
    assert grandchild["x-claude-code-parent-agent-id"] == "run-1.1.0"
