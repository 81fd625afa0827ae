"""R8: the run journal - torn last line, durable appends, idempotent replay."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from luftpause.runtime.journal import Journal, read_records
from luftpause.runtime.runs import Registry, RunState

SPEC = {"task": "t", "model": "m", "serviceClass": "batch", "maxToolCalls": 8}


def history() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    return [
        {"t": "spawn", "run": "a", "spec": SPEC, "parent": None, "created": 100.0, "caller": "x"},
        {"t": "spawn", "run": "b", "spec": SPEC, "parent": "a", "created": 101.0, "caller": "x"},
        {
            "t": "turn",
            "run": "a",
            "seq": 0,
            "usage": {"turns": 1, "promptTokens": 10},
            "message": {"role": "assistant", "content": None, "tool_calls": [call]},
        },
        {
            "t": "tools",
            "run": "a",
            "seq": 0,
            "usage": {"toolCalls": 1},
            "results": [{"role": "tool", "tool_call_id": "c1", "content": "r"}],
        },
        {
            "t": "turn",
            "run": "a",
            "seq": 1,
            "usage": {"turns": 1, "promptTokens": 20},
            "message": {"role": "assistant", "content": None, "tool_calls": [call]},
        },
        {
            "t": "approval",
            "run": "a",
            "key": "1:0",
            "tool": "lookup",
            "arguments": {},
            "allow": True,
        },
        {
            "t": "end",
            "run": "b",
            "state": "Completed",
            "result": "done",
            "error": None,
            "usage": {"turns": 1, "completionTokens": 5},
            "time": 102.0,
        },
    ]


def snapshot(reg: Registry) -> dict[str, Any]:
    return {
        rid: (
            r.state,
            r.turns,
            r.results,
            r.approvals,
            r.own.to_json(),
            r.subtree.to_json(),
            r.children,
            r.result,
            r.open_seq,
        )
        for rid, r in reg.runs.items()
    }


def test_replay_rebuilds_runs_and_the_open_round() -> None:
    """R8, R9: replay gives the tree, subtree usage, the open round and its approval."""
    reg = Registry()
    for rec in history():
        reg.apply(rec)
    a, b = reg.runs["a"], reg.runs["b"]
    assert a.children == ["b"] and b.parent == "a"
    assert b.state is RunState.COMPLETED and b.result == "done"
    assert a.state is RunState.RUNNING and a.open_seq == 1 and a.calls_made == 2
    assert a.approvals == {"1:0": True}
    assert a.own.prompt_tokens == 30 and a.subtree.completion_tokens == 5
    conv = a.conversation()
    assert [m["role"] for m in conv] == ["user", "assistant", "tool"]  # open round not included


def test_recovery_is_idempotent() -> None:
    """R8: replaying twice, or a journal holding records twice, gives the same state."""
    once, twice, doubled = Registry(), Registry(), Registry()
    for rec in history():
        once.apply(rec)
    for _ in range(2):
        for rec in history():
            twice.apply(rec)
    for rec in history():
        doubled.apply(rec)
        doubled.apply(json.loads(json.dumps(rec)))
    assert snapshot(once) == snapshot(twice) == snapshot(doubled)


def test_records_after_the_end_change_nothing() -> None:
    """R8: a finished run is final, whatever the journal says after its end."""
    reg = Registry()
    for rec in history():
        reg.apply(rec)
    before = snapshot(reg)
    late = {
        "t": "turn",
        "run": "b",
        "seq": 0,
        "usage": {"turns": 1},
        "message": {"role": "assistant", "tool_calls": []},
    }
    assert reg.apply(late) is False
    assert snapshot(reg) == before


def test_torn_last_line_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """R8: a SIGKILL mid-write leaves a torn last line; it is ignored and cut off."""
    path = tmp_path / "runs.jsonl"
    lines = [json.dumps(r) for r in history()[:3]]
    path.write_text("\n".join(lines) + "\n" + lines[2][:25])
    with caplog.at_level(logging.WARNING):
        records, clean = read_records(path)
    assert len(records) == 3 and "torn last line" in caplog.text
    assert clean == len(("\n".join(lines) + "\n").encode())

    async def reopen() -> list[dict[str, Any]]:
        journal = Journal(tmp_path)
        got = journal.open()
        await journal.append(history()[3])
        await journal.close()
        return got

    assert len(asyncio.run(reopen())) == 3
    records, _ = read_records(path)
    assert [r["t"] for r in records] == ["spawn", "spawn", "turn", "tools"]


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    """R8: only an unparsable tail is dropped; a whole record missing its newline is kept."""
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(history()[0]))

    async def reopen() -> None:
        journal = Journal(tmp_path)
        assert len(journal.open()) == 1
        await journal.append(history()[1])
        await journal.close()

    asyncio.run(reopen())
    assert [r["run"] for r in read_records(path)[0]] == ["a", "b"]


async def test_concurrent_appends_are_all_durable(tmp_path: Path) -> None:
    """R8: appends waiting together share a write and an fsync; none is lost or torn."""
    journal = Journal(tmp_path)
    journal.open()
    recs = [
        {
            "t": "approval",
            "run": "a",
            "key": str(i),
            "tool": "x",
            "arguments": {},
            "allow": i % 2 == 0,
        }
        for i in range(200)
    ]
    await asyncio.gather(*(journal.append(r) for r in recs))
    await journal.close()
    records, _ = read_records(tmp_path / "runs.jsonl")
    assert sorted(int(r["key"]) for r in records) == list(range(200))
