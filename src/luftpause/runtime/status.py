"""``GET /status`` (R9): the run tree with each run's own work and its subtree totals, and
the lines of ``runs.jsonl`` and ``tasks.jsonl`` that replay could not use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from luftpause.runtime.core import Run
    from luftpause.runtime.loop import Runtime
    from luftpause.runtime.mcp_tasks import TaskStore


def _node(rt: Runtime, run: Run, now: float, depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {
        "handle": run.id,
        "state": run.state.value,
        "parent": run.parent,
        "task": run.spec.task[:120],
        "model": run.spec.model,
        "serviceClass": run.spec.service_class,
        "own": run.own.to_json(),
        "subtree": run.subtree.to_json(),
    }
    if run.error:
        node["error"] = run.error
    if run.pending is not None:
        node["pendingApproval"] = run.pending.to_json()
    budget = rt.state.budget_json(run, now)
    if budget is not None:
        node["budget"] = budget
    children = [rt.state.runs[c] for c in run.children if c in rt.state.runs]
    # Deep trees are cut at 64 levels; the handles below are still listed.
    node["children"] = (
        [_node(rt, c, now, depth + 1) for c in children] if depth < 64 else [c.id for c in children]
    )
    return node


def status_tree(rt: Runtime, tasks: TaskStore | None = None) -> dict[str, Any]:
    """The tree, with the problems replay found in ``runs.jsonl`` (``journal``) and, given
    the MCP tasks store, in ``tasks.jsonl`` (``tasks``): each ``line N: what (effect)``."""
    now = rt.clock()
    runs = rt.state.runs
    roots = [r for r in runs.values() if r.parent is None or r.parent not in runs]
    counts: dict[str, int] = {}
    for r in runs.values():
        counts[r.state.value] = counts.get(r.state.value, 0) + 1
    out: dict[str, Any] = {
        "service": "runtime",
        "runs": len(runs),
        "byState": counts,
        "tools": rt.hub.status(),
        "journal": {
            "path": str(rt.journal.path),
            "problems": [str(p) for p in rt.replay_report.problems],
        },
    }
    if tasks is not None:
        out["tasks"] = {"path": str(tasks.path), "problems": [str(p) for p in tasks.problems]}
    out["tree"] = [_node(rt, r, now, 0) for r in roots]
    return out
