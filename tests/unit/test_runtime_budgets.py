"""R9, R10, R13: subtree usage, budget checks and messages; first-token label scoring."""

from __future__ import annotations

import json
from typing import Any

import pytest

from luftpause.runtime.core import Budget, RuntimeState, Usage, apply, parse
from luftpause.runtime.decide import score_labels


def spawn(reg: RuntimeState, run: str, parent: str | None = None, **budget: Any) -> None:
    spec = {"task": "t", "model": "m", "serviceClass": "batch", **budget}
    line = {"t": "spawn", "run": run, "spec": spec, "parent": parent, "created": 1000.0}
    apply(reg, parse(json.dumps(line).encode()))


def tree() -> RuntimeState:
    reg = RuntimeState()
    spawn(reg, "root", budgetTokens=100, budgetToolCalls=3, budgetSeconds=10)
    spawn(reg, "mid", "root")
    spawn(reg, "leaf", "mid", budgetToolCalls=1)
    return reg


def test_usage_adds_up_the_tree() -> None:
    """R9: own work stays on the run; subtree totals include every descendant."""
    reg = tree()
    reg.add_usage(reg.runs["leaf"], Usage(turns=1, prompt_tokens=30, tool_calls=1))
    reg.add_usage(reg.runs["mid"], Usage(turns=2, completion_tokens=5, failed_tool_calls=1))
    root, mid, leaf = (reg.runs[k] for k in ("root", "mid", "leaf"))
    assert root.own.turns == 0 and root.subtree.turns == 3
    assert mid.subtree.tokens == 35 and leaf.subtree.tokens == 30
    assert root.subtree.failed_tool_calls == 1 and leaf.own.tool_calls == 1


def test_token_budget_covers_descendants() -> None:
    """R10: tokens used anywhere below count; breached when a turn begins at >= limit."""
    reg = tree()
    leaf = reg.runs["leaf"]
    assert reg.budget_breach(leaf, 1001.0) is None
    reg.add_usage(leaf, Usage(prompt_tokens=60, completion_tokens=40))
    owner, message = reg.budget_breach(leaf, 1001.0) or (None, "")
    assert owner is reg.runs["root"] and message == "budget exceeded: tokens 100/100"


def test_tool_call_budget_counts_the_round_that_would_exceed_it() -> None:
    """R10: the nearest budget that a round would take past its limit is reported."""
    reg = tree()
    leaf = reg.runs["leaf"]
    assert reg.budget_breach(leaf, 1001.0, new_tool_calls=1) is None
    owner, message = reg.budget_breach(leaf, 1001.0, new_tool_calls=2) or (None, "")
    assert owner is leaf and message == "budget exceeded: toolCalls 2/1"
    reg.add_usage(reg.runs["mid"], Usage(tool_calls=3))
    owner, message = reg.budget_breach(reg.runs["mid"], 1001.0, new_tool_calls=1) or (None, "")
    assert owner is reg.runs["root"] and message == "budget exceeded: toolCalls 4/3"


def test_seconds_budget_and_runs_spawned_later() -> None:
    """R10: wall seconds since the budgeted run's spawn, also for runs spawned later."""
    reg = tree()
    spawn(reg, "late", "mid")
    assert reg.budget_breach(reg.runs["late"], 1009.9) is None
    owner, message = reg.budget_breach(reg.runs["late"], 1012.25) or (None, "")
    assert owner is reg.runs["root"] and message == "budget exceeded: seconds 12.2/10"


def test_budget_json_and_a_recorded_breach() -> None:
    """R10: status shows limits, used and exceeded; a journaled breach stays breached."""
    reg = tree()
    root = reg.runs["root"]
    view = reg.budget_json(root, 1002.0)
    assert view == {
        "limits": {"tokens": 100, "toolCalls": 3, "seconds": 10},
        "used": {"tokens": 0, "toolCalls": 0, "seconds": 2.0},
        "exceeded": None,
    }
    apply(reg, Budget(run="root", message="budget exceeded: seconds 10.0/10"))
    assert reg.budget_breach(reg.runs["leaf"], 1003.0) == (root, root.budget_exceeded)
    assert reg.budget_json(reg.runs["mid"], 1002.0) is None


@pytest.mark.parametrize(
    ("top", "expected", "unscored"),
    [
        ([("urg", -0.1), (" look", -2.0), ("The", -3.0)], {"urgent", "lookup"}, ["chitchat"]),
        ([("Chit", -0.5), ("chitc", -0.7)], {"chitchat"}, ["urgent", "lookup"]),
        ([("The", -0.1)], set(), ["urgent", "lookup", "chitchat"]),
    ],
)
def test_first_token_scoring(
    top: list[tuple[str, float]], expected: set[str], unscored: list[str]
) -> None:
    """R13: labels scored by their first token's probability, normalised; others unscored."""
    probs, left = score_labels(["urgent", "lookup", "chitchat"], top)
    assert set(probs) == expected and left == unscored
    if probs:
        assert abs(sum(probs.values()) - 1.0) < 1e-9
    if expected == {"urgent", "lookup"}:
        assert probs["urgent"] > probs["lookup"]
