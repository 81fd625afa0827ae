"""``GET /status`` (R9): the run tree with each run's own work and its subtree totals, and
the lines of ``runs.jsonl`` and ``tasks.jsonl`` that replay could not use.

Root runs that an agent harness's session spawned (the same ``session``, #38) are
grouped under one node for that session: ``{"session": <the harness's run id>,
"runs": <root runs under it>, "subtree": <their subtree totals summed>, "children":
[<run nodes>]}``, in the place of its first root; every other root is listed as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from luftpause.runtime.core import Usage

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
    out["tree"] = _grouped(rt, roots, now)
    return out


def _grouped(rt: Runtime, roots: list[Run], now: float) -> list[dict[str, Any]]:
    """The root nodes, those of one harness session under one session node."""
    tree: list[dict[str, Any]] = []
    sessions: dict[str, tuple[dict[str, Any], Usage]] = {}
    for run in roots:
        node = _node(rt, run, now, 0)
        if run.session is None:
            tree.append(node)
            continue
        group = sessions.get(run.session)
        if group is None:
            group = sessions[run.session] = ({"session": run.session, "children": []}, Usage())
            tree.append(group[0])
        group[0]["children"].append(node)
        group[1].add(run.subtree)
    for node, total in sessions.values():
        node["runs"] = len(node["children"])
        node["subtree"] = total.to_json()
    return tree
