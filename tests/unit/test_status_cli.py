"""``luftpause status`` rendering (S12) against canned ``/status`` JSON: no sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from luftpause.status_cli import base_url, count, render, seconds

DATA = Path(__file__).resolve().parents[1] / "data" / "status"


def canned(name: str) -> dict[str, Any]:
    return dict(json.loads((DATA / name).read_text()))


def test_replicas_show_in_flight_vs_cap_engine_queue_and_health() -> None:
    text = render(canned("scheduler.json"), "http://s:5001")
    lines = text.splitlines()
    assert lines[:2] == [
        "luftpause status - scheduler http://s:5001 - up 2m05s",
        "turns in flight 3 - held 12 - runs 24 - replicas healthy 2/3",
    ]
    rows = {ln.split()[0]: ln.split() for ln in lines[lines.index("REPLICAS") + 2 :][:3]}
    # name, kind, health, in flight/cap, bar, engine running, queue, KV, pinned, reserved
    assert rows["engine-a"][:10] == [
        "engine-a", "generative", "healthy", "3/3", "[########]", "3", "1", "42%", "7", "1"
    ]  # fmt: skip
    assert rows["engine-b"][:8] == ["engine-b", "generative", "DOWN", "0/-", "-", "-", "-", "0"]
    assert rows["classifier"][:4] == ["classifier", "single-pass", "not", "probed"]
    assert rows["classifier"][-1] == "never"


def test_held_turns_interactive_first_with_the_oldest_wait() -> None:
    lines = render(canned("scheduler.json"), "s").splitlines()
    start = lines.index("HELD TURNS (12)")
    assert [ln.split() for ln in lines[start + 2 : start + 4]] == [
        ["interactive", "alice", "2", "250ms"],
        ["batch", "crowd", "10", "5.0s"],
    ]


def test_the_run_tree_nests_children_and_pairs_own_with_subtree() -> None:
    text = render(
        canned("scheduler.json"), "s", tree=canned("runtime.json"), runtime="http://r:7000"
    )
    tree = text[text.index("RUN TREE") :].splitlines()
    assert tree[0] == "RUN TREE - runtime http://r:7000 - 4 runs: Running 3, Completed 1"
    handles = [ln.split("  ")[0].strip() for ln in tree[2:6]]
    assert handles == ["run-root", "|- run-kid-1", "`- run-kid-2", "run-batch"]
    kid = tree[3].split()
    assert kid[:8] == [
        "|-",
        "run-kid-1",
        "Completed",
        "interactive",
        "2/2",
        "1/1",
        "1/1",
        "240/240",
    ]
    assert tree[-1] == "  a/b: the run's own work / its whole subtree (T: time)"


def test_an_agent_harness_session_groups_its_sub_agents() -> None:
    """R9, S12 (#38): a session node (the harness's run) with the runs it spawned under it,
    and their subtree totals on its row."""
    tree = canned("runtime.json")
    root = tree["tree"].pop(0)
    tree["tree"].insert(
        0,
        {"session": "claude-code-s1@m", "runs": 1, "subtree": root["subtree"], "children": [root]},
    )
    text = render(None, "s", tree=tree, runtime="r")
    lines = text[text.index("RUN TREE") :].splitlines()
    handles = [ln[: ln.index("  ", len(ln) - len(ln.lstrip()))] for ln in lines[2:7]]
    assert handles == [
        "session claude-code-s1@m",
        "`- run-root",
        "   |- run-kid-1",
        "   `- run-kid-2",
        "run-batch",
    ]
    assert "agent harness session: 1 sub-agent run(s)" in lines[2]
    assert lines[2].split()[2].startswith("-/")  # no work of its own: the subtree's


def test_a_tree_cut_below_64_levels_and_an_empty_tree() -> None:
    tree = canned("runtime.json")
    tree["tree"][1]["children"] = ["run-deep"]
    text = render(None, "s", tree=tree, runtime="r")
    assert "`- run-deep" in text and "(deeper)" in text
    empty = render(None, "s", tree={"runs": 0, "byState": {}, "tree": []}, runtime="r")
    assert empty.splitlines() == ["", "RUN TREE - runtime r - 0 runs", "  no runs"]


def test_errors_come_first_and_a_terminal_width_cuts_long_lines() -> None:
    text = render(canned("scheduler.json"), "s", errors=["the runtime at r refused the token"])
    assert text.startswith("error: the runtime at r refused the token\n\nluftpause status")
    cut = render(canned("scheduler.json"), "s", width=40)
    assert max(len(ln) for ln in cut.splitlines()) <= 40
    assert any(ln.endswith("~") for ln in cut.splitlines())


def test_nothing_held_and_no_runs_say_so() -> None:
    status = canned("scheduler.json") | {"held": {}, "held_total": 0, "runs": {}, "runs_total": 0}
    text = render(status, "s")
    assert "HELD TURNS (0)\n  no turns held" in text and "RUNS (0)\n  no runs" in text


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("127.0.0.1:5001", "http://127.0.0.1:5001"),
        ("http://h:5001/", "http://h:5001"),
        ("http://h:5001/status", "http://h:5001"),
        (" https://h/ ", "https://h"),
    ],
)
def test_base_url(given: str, want: str) -> None:
    assert base_url(given) == want


def test_runtime_url_may_be_the_mcp_url() -> None:
    assert base_url("http://h:7000/mcp", ("/status", "/mcp")) == "http://h:7000"


def test_number_formats() -> None:
    assert [seconds(v) for v in (None, 0.25, 1.25, 75.5, 3700)] == [
        "-", "250ms", "1.2s", "1m16s", "1h01m"
    ]  # fmt: skip
    assert [count(v) for v in (None, 999, 12_400, 3_200_000)] == ["-", "999", "12.4k", "3.2M"]


def test_a_draining_or_leaving_replica_says_so_beside_its_health() -> None:
    """B11: the membership of a replica that takes no new runs shows in its health cell."""
    data = canned("scheduler.json")
    data["replicas"][0]["membership"] = "draining"
    data["replicas"][1]["membership"] = "leaving"
    lines = render(data, "http://s:5001").splitlines()
    rows = {ln.split()[0]: ln for ln in lines[lines.index("REPLICAS") + 2 :][:3]}
    assert "healthy, draining" in rows["engine-a"]
    assert "DOWN, leaving" in rows["engine-b"]
