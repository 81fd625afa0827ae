"""The journey users come for: a harness fans work out to luftpause sub-agents (R, B4, X5).

``examples/harness_subagents.py`` runs each real CLI (pinned in ``tests/_clients.py``,
installed under ``.cache/node``) the way a user would after ``make run``: a throwaway
home, the runtime added as its MCP server as docs/getting-started/clients.md describes,
and (Claude Code, Codex) its own model turns through the dataplane, whose aliases map the CLIs'
model names to the fake engines'. The fake engine's test-bench directive in the task,
``[tools:spawn+spawn,await]``, makes the model call ``spawn`` twice in one reply (in
parallel), then ``await`` with both handles, then answer with what ``await`` returned.
Claude Code offers MCP tools deferred (by name, loaded with its ``ToolSearch``): the
fake model loads them first, as a real one does.

Gemini CLI speaks the Gemini API, which the dataplane does not serve, so the example
scripts its model turns through its own test mechanism (``--fake-responses-non-strict``):
a first prompt spawns both sub-agents in one reply, a second awaits the handles the
first printed. Its MCP traffic is real.

Each test asserts what a user would check: the CLI printed the sub-agents' results;
the runtime's journal has both runs completed; every turn of theirs went through the
dataplane under their own run id (the dataplane names the run behind each tool call it
relayed); the harness session is one run in the scheduler (B4) that never left its
replica; the run tree the example prints shows both; nothing is left in flight. What
the example printed is attached to the test report (``-rA`` shows it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from _clients import (
    CLAUDE_CODE,
    CODEX,
    GEMINI_CLI,
    HARNESS_ALIASES,
    HARNESS_ENGINE_ARGS,
    REQUIRE_VARS,
)
from _npm import INSTALL_TIMEOUT_S, Bundle, installed_or_skip
from conftest import Services
from fullstack import Stack, start_stack, write_runtime_config

from luftpause.procs import ServiceProcess

pytestmark = [
    pytest.mark.integration,
    # The first test of a fresh checkout installs Node and the client (npm) in its setup.
    pytest.mark.timeout(INSTALL_TIMEOUT_S + 300),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "harness_subagents.py"
RUN_TIMEOUT_S = 240.0


@dataclass
class Journey:
    stack: Stack
    runtime: ServiceProcess
    state: Path

    def journal(self) -> dict[str, list[dict[str, Any]]]:
        """The runtime's journal, its records grouped by run."""
        runs: dict[str, list[dict[str, Any]]] = {}
        path = self.state / "runs.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            record = json.loads(line)
            runs.setdefault(record["run"], []).append(record)
        return runs


@pytest.fixture(scope="module")
def journey(module_services: Services, tmp_path_factory: pytest.TempPathFactory) -> Journey:
    tmp = tmp_path_factory.mktemp("journey")
    stack = start_stack(
        module_services, tmp, engine_args=HARNESS_ENGINE_ARGS, extra_config=HARNESS_ALIASES
    )
    tools = module_services.start("fake-mcp", "--port", "0", "--lookup-delay-s", "0.2")
    config = write_runtime_config(tmp, stack.dataplane.urls["http"], tools.urls["http"])
    runtime = module_services.start("runtime", "--config", str(config), "--port", "0")
    return Journey(stack, runtime, tmp / "state")


@dataclass
class Outcome:
    found: dict[str, Any]  # what the example wrote with --json
    printed: str  # what it printed: the CLI's answer, then the run tree


def run_example(
    journey: Journey, bundle: Bundle, what: str, cli: str, tmp: Path, request: pytest.FixtureRequest
) -> Outcome:
    """``python examples/harness_subagents.py CLI`` against the journey's stack, with the
    pinned CLI first on PATH and nothing of the environment's luftpause settings."""
    installed_or_skip(bundle, what, REQUIRE_VARS)
    out = tmp / "found.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LUFTPAUSE_")}
    argv = [
        sys.executable, str(EXAMPLE), cli,
        "--proxy", str(journey.stack.dataplane.urls["http"]),
        "--runtime", str(journey.runtime.urls["http"]),
        "--scheduler", str(journey.stack.scheduler.urls["http"]),
        "--timeout", str(RUN_TIMEOUT_S),
        "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(
        argv,
        env={**env, "PATH": bundle.path_env()},
        capture_output=True,
        text=True,
        timeout=3 * RUN_TIMEOUT_S,
        check=False,
    )
    request.node.add_report_section("call", f"{cli} journey", done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    return Outcome(json.loads(out.read_text()), done.stdout)


def new_runs(journey: Journey, before: set[str]) -> dict[str, list[dict[str, Any]]]:
    return {run: records for run, records in journey.journal().items() if run not in before}


def check_subagents(journey: Journey, before: set[str], printed: str) -> list[str]:
    """Two new runs, both completed, their results printed by the CLI, every turn of
    theirs relayed by the dataplane under their own run id. Returns their handles."""
    runs = new_runs(journey, before)
    assert len(runs) == 2, sorted(runs)
    for handle, records in runs.items():
        assert records[0]["t"] == "spawn", records[0]
        end = records[-1]
        assert end["t"] == "end" and end["state"] == "Completed", end
        assert end["result"] and end["result"] in printed, (handle, end["result"])
        calls = [
            call["id"]
            for r in records
            if r["t"] == "turn"
            for call in (r["message"].get("tool_calls") or [])
        ]
        assert len(calls) == 2, records  # two tool rounds (the engine's --tool-results)
        for call_id in calls:  # the dataplane relayed the turn that made each call
            made_by = httpx.get(
                f"{journey.stack.dataplane.urls['http']}/v1/tool_calls/{call_id}", timeout=5
            )
            assert made_by.status_code == 200, made_by.text
            assert made_by.json()["runId"] == handle, made_by.json()
    return sorted(runs)


def check_session(journey: Journey, run_id: str, turns: int) -> dict[str, Any]:
    """B4: the harness session is one interactive run that kept its replica."""
    resp = httpx.get(f"{journey.stack.status_url}/runs/{run_id}", timeout=5)
    assert resp.status_code == 200, resp.text
    run = dict(resp.json())
    assert run["turns"] >= turns, run
    assert run["moves"] == 0 and run["service_class"] == "interactive", run
    assert run["in_flight"] == 0 and run["phase"] == "idle", run
    return run


def check_nothing_in_flight(journey: Journey, within_s: float = 10.0) -> None:
    """No turn in flight or held in the scheduler (the last turn's end is reported
    just after the CLI has read it: waited for, bounded), no run still running."""
    deadline = time.monotonic() + within_s
    while True:
        status = httpx.get(journey.stack.status_url, timeout=5).json()
        if status["in_flight_total"] == 0 and status["held_total"] == 0:
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    runtime = httpx.get(journey.runtime.urls["http"] + "/status", timeout=5).json()
    assert set(runtime["byState"]) <= {"Completed"}, runtime["byState"]


def test_claude_code_spawns_and_awaits_subagents(
    journey: Journey, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R (spawn, await), B4, X5: ``claude -p`` with the runtime added by ``claude mcp
    add`` and its model turns on the dataplane loads luftpause's deferred tools with
    ToolSearch, spawns two sub-agents in one reply, awaits both and prints their
    results; the session is one interactive run in the scheduler."""
    before = set(journey.journal())
    seen = run_example(journey, CLAUDE_CODE, "Claude Code", "claude", tmp_path, request)
    handles = check_subagents(journey, before, seen.found["answer"])
    # ToolSearch, both spawns (one reply), await, the answer
    check_session(journey, seen.found["run"], turns=4)
    check_tree(journey, seen.printed, handles, session=seen.found["run"])
    check_nothing_in_flight(journey)


def test_codex_spawns_and_awaits_subagents(
    journey: Journey, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R (spawn, await), B4, X5: ``codex exec`` with the runtime as an MCP server (its
    tools approved in config) and a Responses provider on the dataplane spawns two
    sub-agents in one reply, awaits both and prints their results; its thread is one
    interactive run in the scheduler."""
    before = set(journey.journal())
    seen = run_example(journey, CODEX, "Codex CLI", "codex", tmp_path, request)
    assert seen.found["calls"] == [
        {"tool": "spawn", "status": "completed"},
        {"tool": "spawn", "status": "completed"},
        {"tool": "await", "status": "completed"},
    ], seen.found
    handles = check_subagents(journey, before, seen.found["answer"])
    check_session(journey, seen.found["run"], turns=3)  # both spawns, await, the answer
    check_tree(journey, seen.printed, handles, session=seen.found["run"])
    check_nothing_in_flight(journey)


def test_gemini_spawns_and_awaits_subagents(
    journey: Journey, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R (spawn, await), X5: Gemini CLI with the runtime in ``mcpServers`` (trusted, so
    its tools run without asking) spawns two sub-agents in one scripted reply, then, in
    a second prompt, awaits the handles it was given and prints their results."""
    before = set(journey.journal())
    seen = run_example(journey, GEMINI_CLI, "Gemini CLI", "gemini", tmp_path, request)
    handles = check_subagents(journey, before, seen.found["answer"])
    assert handles == sorted(seen.found["handles"])
    check_tree(journey, seen.printed, handles)
    check_nothing_in_flight(journey)


def check_tree(
    journey: Journey, printed: str, handles: list[str], session: str | None = None
) -> None:
    """One tree: the runtime's ``/status`` puts the sub-agents under the harness session
    that spawned them (when its model turns went through the dataplane), and the tree
    the example printed (``luftpause status --runtime``) shows them there."""
    runtime = httpx.get(journey.runtime.urls["http"] + "/status", timeout=5).json()
    nodes = [
        n for n in runtime["tree"] if set(handles) <= {c["handle"] for c in n.get("children", [])}
    ]
    if session is None:  # (Gemini CLI: nothing to link its MCP calls to)
        assert not nodes and {n.get("handle") for n in runtime["tree"]} >= set(handles), runtime
    else:
        (node,) = nodes
        assert node["session"] == session, node
        assert f"session {session}" in printed, printed
    for handle in handles:
        assert handle in printed, printed
