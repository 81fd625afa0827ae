"""D (#38): the dataplane's bounded map of the turn behind each tool call, and the
``_meta`` keys under which agent harnesses name the tool call behind an MCP request."""

from __future__ import annotations

import pytest
from _clock import Clock

from luftpause.runtime.protocol import HARNESS_CALL_ID_KEYS, harness_call_id
from luftpause.tool_calls import (
    MAX_CALL_ID_CHARS,
    MAX_CALLS_PER_TURN,
    ToolCallOrigin,
    ToolCallOrigins,
    reportable,
)

ORIGIN = ToolCallOrigin("", "claude-code-s1@m", "interactive", "client:x", None)


def test_each_id_names_its_turn() -> None:
    """D: every ID of a reply maps to that reply's run, class, caller and trace context."""
    origins = ToolCallOrigins(Clock(100.0), 60.0, 10)
    traced = ToolCallOrigin("", "r1", "batch", "c", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    origins.remember(["a", "b", ""], traced)
    found = origins.origin("b")
    assert found is not None and found.to_json() == {
        "toolCallId": "b",
        "runId": "r1",
        "serviceClass": "batch",
        "caller": "c",
        "traceparent": traced.traceparent,
    }
    assert origins.origin("nope") is None and len(origins) == 2  # the empty ID is skipped


def test_the_map_is_bounded_oldest_dropped_first() -> None:
    """D: past ``max_entries`` the oldest entries go; a repeated ID counts as new."""
    origins = ToolCallOrigins(Clock(100.0), 60.0, 3)
    origins.remember(["a", "b", "c"], ORIGIN)
    origins.remember(["a"], ORIGIN)  # moves to the back
    origins.remember(["d"], ORIGIN)
    assert len(origins) == 3
    assert origins.origin("b") is None
    assert [i for i in "acd" if origins.origin(i) is not None] == ["a", "c", "d"]
    with pytest.raises(ValueError, match="max_entries"):
        ToolCallOrigins(Clock(100.0), 60.0, 0)


def test_entries_expire_and_are_swept() -> None:
    """D: an entry older than the run idle expiry is not found, and a sweep drops it."""
    clock = Clock(100.0)
    origins = ToolCallOrigins(clock, 60.0, 100)
    origins.remember(["old"], ORIGIN)
    clock.now += 30
    origins.remember(["new"], ORIGIN)
    clock.now += 30  # "old" is 60 s old now
    assert origins.origin("old") is None and origins.origin("new") is not None
    assert origins.sweep() == 1 and len(origins) == 1
    clock.now += 30
    assert origins.sweep() == 1 and len(origins) == 0


def test_harness_call_ids_from_meta() -> None:
    """R (#38): Claude Code's ``claudecode/toolUseId`` and Codex's ``callId``; anything
    else, empty, too long or unprintable is no ID."""
    assert HARNESS_CALL_ID_KEYS == ("claudecode/toolUseId", "callId")
    assert harness_call_id({"claudecode/toolUseId": "call_c84"}) == "call_c84"
    assert harness_call_id({"callId": "call_afd3", "threadId": "t"}) == "call_afd3"
    assert harness_call_id({"claudecode/toolUseId": "x", "callId": "y"}) == "x"
    for meta in (
        None,
        {},
        {"callId": ""},
        {"callId": 5},
        {"callId": "a\nb"},
        {"callId": "x" * 257},
    ):
        assert harness_call_id(meta) is None


def test_an_id_two_runs_made_names_neither_until_it_expires() -> None:
    """D2, D (#38): engines whose tool call IDs repeat across runs (``functions.spawn:0``)
    must not file one run's turn, or one harness's sub-agent, under another: an ID
    remembered for a second run is ambiguous; the same run again is not; once expired
    the next run owns it."""
    clock = Clock(100.0)
    origins = ToolCallOrigins(clock, 60.0, 100)
    b = ToolCallOrigin("", "run-b", "batch", "other", None)
    origins.remember(["functions.spawn:0"], ORIGIN)
    origins.remember(["functions.spawn:0"], ORIGIN)  # its own run again: still its
    assert origins.lookup(["functions.spawn:0"]) == ORIGIN.run_id
    origins.remember(["functions.spawn:0"], b)
    assert origins.origin("functions.spawn:0") is None
    assert origins.ambiguous("functions.spawn:0")
    assert origins.lookup(["functions.spawn:0", "nope"]) is None
    clock.now += 61
    origins.remember(["functions.spawn:0"], b)
    assert origins.lookup(["functions.spawn:0"]) == "run-b"
    assert not origins.ambiguous("functions.spawn:0")


def test_only_reportable_ids_are_remembered() -> None:
    """D (#38): one turn's IDs count at most MAX_CALLS_PER_TURN, none longer than
    MAX_CALL_ID_CHARS, so one reply cannot flush every other run's entries."""
    origins = ToolCallOrigins(Clock(100.0), 60.0, 1000)
    origins.remember(["keep"], ORIGIN)
    many = [f"c{i}" for i in range(MAX_CALLS_PER_TURN + 10)]
    origins.remember(["x" * (MAX_CALL_ID_CHARS + 1), *many], ORIGIN)
    assert len(origins) == 1 + MAX_CALLS_PER_TURN
    assert origins.origin("keep") is not None and origins.origin(many[-1]) is None
    assert reportable(["", "a", "b" * (MAX_CALL_ID_CHARS + 1)]) == ["a"]
