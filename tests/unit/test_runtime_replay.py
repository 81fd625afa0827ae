"""R8-R11: replay over checked-in ``runs.jsonl`` histories (``tests/data/journals``).

Each history is a journal as the runtime writes it. Replaying one gives the
expected runs (state, resume point, usage, tree, approvals), and replay is
idempotent: replaying the same lines again onto the replayed state, or twice
into a fresh one, changes nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from luftpause.runtime.core import Run, RunState, RuntimeState, replay
from luftpause.runtime.journal import read_lines

HISTORIES = Path(__file__).parent.parent / "data" / "journals"


def load(name: str) -> tuple[RuntimeState, list[tuple[int, bytes]]]:
    lines, _ = read_lines(HISTORIES / f"{name}.jsonl")
    state = RuntimeState()
    report = replay(state, lines)
    assert report.problems == [], report.problems
    return state, lines


def snapshot(state: RuntimeState) -> dict[str, Any]:
    def one(r: Run) -> tuple[Any, ...]:
        return (
            r.state,
            r.parent,
            list(r.children),
            dict(r.turns),
            dict(r.results),
            dict(r.approvals),
            r.own.to_json(),
            r.subtree.to_json(),
            r.result,
            r.error,
            r.ended,
            r.budget_exceeded,
        )

    return {rid: one(r) for rid, r in state.runs.items()}


@pytest.mark.parametrize(
    "name",
    [
        "finished",
        "mid_round",
        "approval_pending",
        "budget_tripped",
        "cancelled_tree",
        "torn_tail",
    ],
)
def test_replaying_twice_changes_nothing(name: str) -> None:
    """R8: recovery is idempotent, on the replayed state and from scratch."""
    state, lines = load(name)
    before = snapshot(state)
    again = replay(state, lines)
    assert again.problems == [] and snapshot(state) == before
    fresh = RuntimeState()
    replay(fresh, lines)
    assert snapshot(fresh) == before


def test_finished_runs_answer_with_their_result() -> None:
    """R8: finished runs come back finished, with result and usage; a record written
    before records carried a version reads as version 1."""
    state, _ = load("finished")
    a = state.runs["run-finished00001"]
    assert a.state is RunState.COMPLETED and a.result == "Paris, about 2.1 million people."
    assert a.own.turns == 3 and a.own.tool_calls == 2
    assert a.own.prompt_tokens == 240 and a.own.completion_tokens == 33
    assert a.open_seq is None and a.ended == 1764000010.0
    b = state.runs["run-finished00002"]
    assert b.state is RunState.COMPLETED and b.result == "hi" and b.own.turns == 1


def test_mid_round_resumes_at_the_open_round() -> None:
    """R8: the last turn has no tool results: it is not asked again, its calls run again;
    the conversation sent next holds only the complete round."""
    state, _ = load("mid_round")
    run = state.runs["run-midround00001"]
    assert run.state is RunState.RUNNING and run.open_seq == 1
    assert [c["id"] for c in run.turns[1]["tool_calls"]] == ["c1", "c2"]
    assert [m["role"] for m in run.conversation()] == ["user", "assistant", "tool"]
    assert run.calls_made == 3 and run.own.tool_calls == 1
    assert run.spec.parallel_tool_calls is True


def test_approval_pending_reuses_answers_and_asks_the_open_one() -> None:
    """R11: answered approvals are reused after a restart; the open one is asked again
    (it is not in ``approvals``, and no ``pending`` survives a restart)."""
    state, _ = load("approval_pending")
    run = state.runs["run-approval00001"]
    assert run.state is RunState.RUNNING and run.pending is None
    assert run.approvals == {"0:0": True, "1:0": False}
    assert "1:1" not in run.approvals and run.open_seq == 1
    assert run.results[0][0]["content"] == "deleted record 7"


def test_budget_tripped_subtree_is_cancelled_with_the_message() -> None:
    """R10: the owner carries the breach; the whole subtree ended Cancelled with it."""
    state, _ = load("budget_tripped")
    root = state.runs["run-budgetroot0001"]
    child = state.runs["run-budgetchild001"]
    msg = "budget exceeded: toolCalls 3/2"
    assert root.budget_exceeded == msg and child.budget_exceeded is None
    assert root.state is child.state is RunState.CANCELLED
    assert root.error == child.error == msg
    assert root.children == [child.id] and child.parent == root.id
    assert root.subtree.tool_calls == 1 and root.subtree.turns == 2
    assert state.budget_json(root, now=1764000100.0) == {
        "limits": {"toolCalls": 2},
        "used": {"toolCalls": 1},
        "exceeded": msg,
    }


def test_cancelled_tree_keeps_what_finished_before() -> None:
    """R9: cancelling a tree ends its running runs; a child that had finished stays so."""
    state, _ = load("cancelled_tree")
    runs = state.runs
    root, kid1, kid2, grand = (
        runs[k]
        for k in (
            "run-tree000000root",
            "run-tree00000kid1",
            "run-tree00000kid2",
            "run-tree0000grand",
        )
    )
    assert kid1.state is RunState.COMPLETED and kid1.result == "one done"
    for run in (root, kid2, grand):
        assert run.state is RunState.CANCELLED and run.error == "cancelled by the client"
    assert [r.id for r in state.descendants(root)] == [root.id, kid1.id, kid2.id, grand.id]
    assert root.subtree.prompt_tokens == 70 and root.own.prompt_tokens == 0
    assert kid2.spec.service_class == "batch"


def test_torn_tail_is_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """R8: a torn last line is ignored with a warning; the run resumes after its last
    complete round."""
    with caplog.at_level(logging.WARNING):
        state, lines = load("torn_tail")
    assert "torn last line 4" in caplog.text and len(lines) == 3
    run = state.runs["run-torntail00001"]
    assert run.state is RunState.RUNNING and run.open_seq is None and run.next_seq == 1
