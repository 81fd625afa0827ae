"""A harness's own session headers name its run when no luftpause header does (B4, D2)."""

from __future__ import annotations

import json

import pytest

from luftpause.dataplane.identity import MAX_RUN_ID, harness_run, resolve_run_id
from luftpause.tool_calls import ToolCallMemory

SESSION = "3f1c0a52-6d1e-4f55-9a54-0d1a7c2b9e10"
METADATA = json.dumps(
    {"session_id": SESSION, "thread_id": "th-1", "turn_id": "t-9", "agent_name": "/root"}
)


@pytest.mark.parametrize(
    ("headers", "run"),
    [
        ({"x-claude-code-session-id": SESSION}, f"claude-code-{SESSION}"),
        (  # a Claude Code sub-agent: a conversation, and so a run, of its own
            {"x-claude-code-session-id": SESSION, "x-claude-code-agent-id": "a1b2c3"},
            f"claude-code-{SESSION}/a1b2c3",
        ),
        (  # Codex: the thread its turn metadata names goes first
            {"x-codex-turn-metadata": METADATA, "session-id": SESSION, "thread-id": SESSION},
            "codex-th-1",
        ),
        ({"thread-id": "th-2", "session-id": SESSION}, "codex-th-2"),
        ({"session-id": SESSION}, f"codex-{SESSION}"),
        ({"x-codex-turn-metadata": "not json", "session-id": SESSION}, f"codex-{SESSION}"),
        ({"x-codex-turn-metadata": "[" * 5000, "session-id": SESSION}, f"codex-{SESSION}"),
        ({"x-session-affinity": "oc-1"}, "session-oc-1"),  # OpenCode
        ({"x-session-id": "oc-2"}, "session-oc-2"),
        ({"x-other": "nothing"}, None),
        ({"x-claude-code-session-id": "  "}, None),
    ],
)
def test_harness_headers_name_the_run(headers: dict[str, str], run: str | None) -> None:
    """B4: Claude Code's session (and sub-agent), Codex's thread, the configured list."""
    assert harness_run(headers, ("x-session-affinity", "x-session-id")) == run


def test_configured_session_headers_only() -> None:
    """B4: other harnesses' headers count only when configured, in their order."""
    headers = {"x-session-id": "b", "x-my-agent-session": "a"}
    assert harness_run(headers, ()) is None
    assert harness_run(headers, ("x-my-agent-session", "x-session-id")) == "session-a"


def test_a_long_session_id_is_hashed_to_fit() -> None:
    """B4: a session ID longer than a run ID may be is hashed, the same every time."""
    long = "s" * 1000
    run = harness_run({"x-claude-code-session-id": long})
    assert run is not None and len(run) <= MAX_RUN_ID and run.startswith("claude-code-")
    assert run == harness_run({"x-claude-code-session-id": long})


def test_order_run_header_then_harness_then_echoed_tool_calls() -> None:
    """D2, B4: the luftpause header wins; a harness session beats echoed tool call IDs,
    which still name the run when no header says anything."""
    memory = ToolCallMemory(lambda: 0.0, 60.0)
    memory.remember(["call_1"], "run-known")
    body = {"messages": [{"role": "tool", "tool_call_id": "call_1", "content": "x"}]}
    harness = {"x-claude-code-session-id": SESSION}
    named = {**harness, "x-luftpause-run-id": "mine"}
    assert resolve_run_id(named, body, memory) == ("mine", [])
    assert resolve_run_id(harness, body, memory) == (f"claude-code-{SESSION}", [])
    assert resolve_run_id({}, body, memory) == ("run-known", [])


def test_the_model_asked_for_is_part_of_a_harness_run() -> None:
    """B4, S3: a side request of the same session on another model (Claude Code's small,
    fast model) is a run of its own, so it never moves the session's run or ends its
    pause; the same model keeps the same run."""
    headers = {"x-claude-code-session-id": SESSION}
    main = harness_run(headers, (), "claude-sonnet-4-5")
    side = harness_run(headers, (), "claude-haiku-4-5")
    assert main == f"claude-code-{SESSION}@claude-sonnet-4-5"
    assert side == f"claude-code-{SESSION}@claude-haiku-4-5"
    assert harness_run(headers, (), "claude-sonnet-4-5") == main
    memory = ToolCallMemory(lambda: 0.0, 60.0)
    assert resolve_run_id(headers, {}, memory, (), "m") == (f"claude-code-{SESSION}@m", [])
