"""R8: the run journal - typed records, torn last line, durable appends, idempotent
replay, unreadable lines failing only their own run."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from luftpause.runtime.core import (
    Approval,
    RecordError,
    RunState,
    RuntimeState,
    apply,
    encode,
    parse,
    replay,
)
from luftpause.runtime.journal import Journal, read_lines

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


def lines_of(records: list[dict[str, Any]]) -> list[tuple[int, bytes]]:
    return [(i, json.dumps(r).encode()) for i, r in enumerate(records, start=1)]


def replayed(records: list[dict[str, Any]]) -> RuntimeState:
    state = RuntimeState()
    report = replay(state, lines_of(records))
    assert report.problems == []
    return state


def read_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    lines, clean = read_lines(path)
    return [json.loads(raw) for _, raw in lines], clean


def snapshot(reg: RuntimeState) -> dict[str, Any]:
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
    reg = replayed(history())
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
    once, twice, doubled = replayed(history()), RuntimeState(), RuntimeState()
    for _ in range(2):
        replay(twice, lines_of(history()))
    replay(doubled, lines_of([r for rec in history() for r in (rec, rec)]))
    assert snapshot(once) == snapshot(twice) == snapshot(doubled)


def test_records_after_the_end_change_nothing() -> None:
    """R8: a finished run is final, whatever the journal says after its end."""
    reg = replayed(history())
    before = snapshot(reg)
    late = {
        "t": "turn",
        "run": "b",
        "seq": 0,
        "usage": {"turns": 1},
        "message": {
            "role": "assistant",
            "tool_calls": [{"id": "c", "function": {"name": "x", "arguments": "{}"}}],
        },
    }
    assert apply(reg, parse(json.dumps(late).encode())) is None
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

    async def reopen() -> list[tuple[int, bytes]]:
        journal = Journal(tmp_path)
        got = journal.open()
        await journal.append(encode(parse(json.dumps(history()[3]).encode())))
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
        await journal.append(encode(parse(json.dumps(history()[1]).encode())))
        await journal.close()

    asyncio.run(reopen())
    assert [r["run"] for r in read_records(path)[0]] == ["a", "b"]


async def test_concurrent_appends_are_all_durable(tmp_path: Path) -> None:
    """R8: appends waiting together share a write and an fsync; none is lost or torn."""
    journal = Journal(tmp_path)
    journal.open()
    recs = [
        Approval(run="a", key=f"0:{i}", tool="x", arguments={}, allow=i % 2 == 0)
        for i in range(200)
    ]
    await asyncio.gather(*(journal.append(encode(r)) for r in recs))
    await journal.close()
    records, _ = read_records(tmp_path / "runs.jsonl")
    assert sorted(int(r["key"].split(":")[1]) for r in records) == list(range(200))


def test_every_record_survives_encode_and_parse() -> None:
    """R8: ``encode`` and ``parse`` are inverses; a record without ``v`` reads as version 1."""
    for raw in history():
        record = parse(json.dumps(raw).encode())
        assert parse(encode(record)) == record
        assert json.loads(encode(record))["v"] == 1


@pytest.mark.parametrize(
    ("line", "reason", "run"),
    [
        (b'{"t":"spawn","run":"x"}', "spawn record: missing field 'spec'", "x"),
        (b'{"t":"teleport","run":"x"}', "unknown record type 'teleport'", "x"),
        (b'{"t":"budget","run":"x","v":2,"message":"m"}', "format version 2", "x"),
        (b'{"t":"turn","run":"x","seq":-1', "not JSON", "x"),
        (b"[1, 2]", "not a JSON object but list", None),
        (b"garbage", "not JSON", None),
        (
            b'{"t":"turn","run":"x","seq":0,"message":{"role":"assistant","tool_calls":[]}}',
            "turn record: message.tool_calls",
            "x",
        ),
    ],
)
def test_unreadable_lines_raise_a_named_error(line: bytes, reason: str, run: str | None) -> None:
    """R8: a corrupt, unknown, newer or incomplete record is a RecordError naming why
    and, when the line says so, whose it is."""
    with pytest.raises(RecordError) as caught:
        parse(line)
    assert reason in caught.value.reason and caught.value.run == run


def test_an_unreadable_line_fails_only_its_run() -> None:
    """R8: replay marks the run of an unreadable line Failed with the line number and the
    reason; every other run recovers, and replaying again changes nothing."""
    lines = lines_of(history())
    lines.insert(1, (99, b'{"t":"spawn","run":"x"}'))  # the run cannot even be created
    lines.insert(4, (100, b'{"t":"tools","run":"a","seq":0,"results":"oops"}'))
    lines.append((101, b"not json at all"))
    state = RuntimeState()
    report = replay(state, lines)
    assert [(p.line, p.run) for p in report.problems] == [(99, "x"), (100, "a"), (101, None)]
    x, a, b = state.runs["x"], state.runs["a"], state.runs["b"]
    assert x.state is RunState.FAILED and "journal line 99" in (x.error or "")
    assert "missing field 'spec'" in (x.error or "")
    assert a.state is RunState.FAILED and "journal line 100" in (a.error or "")
    assert b.state is RunState.COMPLETED and b.result == "done"
    before = snapshot(state)
    replay(state, lines)
    assert snapshot(state) == before


def _keyed(run: str, key: str, digest: str, task: str = "t") -> dict[str, Any]:
    return {
        "t": "spawn",
        "run": run,
        "spec": {**SPEC, "task": task},
        "created": 100.0,
        "idempotencyKey": key,
        "requestDigest": digest,
    }


def test_replay_binds_each_idempotency_key_to_its_first_run() -> None:
    """R2, R8: a spawn record's idempotency key (and the digest of its arguments) survive
    encode and parse; replay binds the key to its run, a second spawn record with the
    same key (a duplicate) leaves the first bound, and replaying twice changes nothing.
    A spawn record without a key (an older journal) is valid and binds nothing."""
    records = [*history(), _keyed("k1", "job-1", "d1"), _keyed("k2", "job-1", "d2", "x")]
    record = parse(json.dumps(records[-2]).encode())
    assert record.idempotency_key == "job-1" and record.request_digest == "d1"  # type: ignore[union-attr]
    assert parse(encode(record)) == record
    state = replayed(records)
    assert state.idempotency_keys == {(None, "job-1"): "k1"}
    first = state.run_for_key("job-1")
    assert first is not None and first.id == "k1" and first.request_digest == "d1"
    assert state.runs["a"].idempotency_key is None and state.run_for_key("nope") is None
    again = replayed(records)
    replay(again, lines_of(records))
    assert again.idempotency_keys == state.idempotency_keys and snapshot(again) == snapshot(state)


def test_a_key_of_an_unreadable_spawn_is_not_bound() -> None:
    """R2, R8: an empty key is not a record (the line fails its run); a spawn line that
    is unreadable binds no key, so a retry with it starts a run that can be resumed."""
    bad_key = {**_keyed("k1", "", "d")}
    broken = {"t": "spawn", "run": "k2", "idempotencyKey": "job-2"}  # no spec
    state = RuntimeState()
    report = replay(state, lines_of([bad_key, broken]))
    assert [p.line for p in report.problems] == [1, 2]
    assert "idempotencyKey" in report.problems[0].reason
    assert state.idempotency_keys == {}
    assert state.runs["k1"].state is RunState.FAILED and state.runs["k2"].state is RunState.FAILED


def test_the_request_digest_ignores_the_key_and_fills_the_settings_defaults() -> None:
    """R2: two spawns ask for the same thing when their arguments (but the key) are the
    same once the settings' defaults are filled in; any other difference counts."""
    from luftpause.runtime.spawn_args import SpawnArgs, request_digest

    def digest(**kwargs: Any) -> str:
        return request_digest(SpawnArgs(**kwargs), max_tool_calls=8, max_tokens=256)

    base = digest(task="t", idempotency_key="a")
    assert base == digest(task="t", idempotency_key="b", max_tokens=256, max_tool_calls=8)
    assert base == digest(task="t", approve_tools=[])
    assert base != digest(task="t", max_tokens=255)
    assert base != digest(task="u")
    assert base != digest(task="t", tools=[])
    assert base != digest(task="t", model="m")
    assert base != digest(task="t", parent="run-1")
