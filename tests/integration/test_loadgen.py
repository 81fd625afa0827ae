"""H3: ``luftpause loadgen`` as a process against a real stack.

Fake engines (time-scaled), fake MCP tools (short delay), scheduler, dataplane
and the runtime; the load generator runs a few seconds and its JSON is checked
for behaviour only (runs happened, turns per run, usage and held time reported,
errors counted), never for timings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from fullstack import Stack, start_stack

from luftpause.loadgen.main import add_arguments
from luftpause.loadgen.main import main as loadgen_main
from luftpause.procs import free_port

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def stack(module_services: Any, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    tmp = tmp_path_factory.mktemp("loadgen")
    s = start_stack(module_services, tmp)
    tools = module_services.start(
        "fake-mcp", "--port", "0", "--lookup-delay-s", "0.05", name="fake-mcp"
    )
    s.extra["tools_url"] = f"{tools.urls['http']}/mcp"
    config = tmp / "runtime.toml"
    config.write_text(
        f'[runtime]\ndataplane_url = "{s.dataplane.urls["http"]}"\n'
        f'state_dir = "{tmp / "state"}"\n'
        f'[[runtime.tool_servers]]\nname = "fake"\nurl = "{s.extra["tools_url"]}"\n'
    )
    s.extra["runtime"] = module_services.start(
        "runtime", "--config", str(config), "--port", "0", name="runtime"
    )
    return s


async def loadgen(tmp: Path, *argv: str) -> tuple[int, str, str, dict[str, Any]]:
    """``luftpause loadgen`` as its own process."""
    out = tmp / "result.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "luftpause", "loadgen", *argv, "--json", str(out),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            stdout, stderr = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError("loadgen did not stop by itself") from None
    result = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode or 0, stdout.decode(), stderr.decode(), result


async def loadgen_here(tmp: Path, *argv: str) -> tuple[int, str, dict[str, Any]]:
    """The same command in a thread of this process (saves a start-up's imports)."""
    out = tmp / "result.json"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([*argv, "--json", str(out)])

    def call() -> tuple[int, str]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = loadgen_main(args)
        return rc, buf.getvalue()

    async with asyncio.timeout(RUN_TIMEOUT_S):
        rc, stdout = await asyncio.to_thread(call)
    result = json.loads(out.read_text()) if out.exists() else {}
    return rc, stdout, result


async def test_own_loop_groups_through_the_dataplane(stack: Stack, tmp_path: Path) -> None:
    """H3: two groups of own-loop agents in one invocation: runs per class, turns = tool calls
    + 1, cached share within 0..1, held time reported by the dataplane, no errors."""
    rc, stdout, stderr, result = await loadgen(
        tmp_path,
        "--target", stack.base_url, "--tools-url", stack.extra["tools_url"],
        "--group", "3:batch:crowd", "--group", "1:interactive:people",
        "--duration-s", "3", "--context-chars", "2000", "--tool-calls", "2",
        "--max-tokens", "32", "--runs-in-json",
    )  # fmt: skip
    assert rc == 0, stdout + stderr
    assert "runs done" in stderr  # the live progress line
    assert "| interactive |" in stdout and "| batch |" in stdout
    assert result["error_count"] == 0 and result["errors"] == {}
    for cls in ("interactive", "batch"):
        s = result["classes"][cls]
        assert s["runs"] > 0 and s["runs_per_min"] > 0
        assert s["turns_per_run"] == 3.0 and s["tool_calls_per_run"] == 2.0
        assert 0.0 <= s["cached_share"] <= 1.0
        assert s["turn"]["held_s"] is not None and s["turn"]["queued_s"] is not None
        assert s["run_s"]["p50"] <= s["run_s"]["p95"]
    runs = result["runs"]
    assert {r["class"] for r in runs} == {"interactive", "batch"}
    for r in runs:
        assert r["turns"] == r["tool_calls"] + 1
        assert len(r["replicas"]) == 1  # strict affinity through luftpause (S3)
        assert all(t["held_s"] is not None for t in r["turn_records"])
        assert r["cached_tokens"] <= r["prompt_tokens"]


async def test_engine_arm_sends_priority_without_luftpause_headers(
    stack: Stack, tmp_path: Path
) -> None:
    """H3/H4: agents pinned to engines, no class headers, priority in the body; no held time."""
    engines = ",".join(stack.engine_url(n) for n in ("engine-a", "engine-b"))
    rc, stdout, result = await loadgen_here(
        tmp_path,
        "--target", engines, "--tools-url", stack.extra["tools_url"], "--agents", "2",
        "--class", "interactive", "--no-class-headers", "--priority", "interactive=10,batch=0",
        "--max-runs", "4", "--duration-s", "20", "--context-chars", "1000",
        "--tool-calls", "1-2", "--max-tokens", "16", "--quiet", "--runs-in-json",
    )  # fmt: skip
    assert rc == 0, stdout
    s = result["classes"]["interactive"]
    assert s["runs"] >= 4 and s["turn"]["held_s"] is None
    assert result["priority"] == {"interactive": 10, "batch": 0}
    assert all(r["turns"] == r["tool_calls"] + 1 for r in result["runs"])
    assert all(1 <= r["tool_calls"] <= 2 for r in result["runs"])


async def test_errors_are_counted_and_shown(stack: Stack, tmp_path: Path) -> None:
    """H3: a target that refuses connections: every failed run is counted by kind, the table
    is still printed and the exit status says runs failed."""
    refused = f"http://127.0.0.1:{free_port()}"
    rc, stdout, result = await loadgen_here(
        tmp_path,
        "--target", refused, "--tools-url", stack.extra["tools_url"], "--agents", "2",
        "--duration-s", "1", "--quiet",
    )  # fmt: skip
    assert rc == 3
    assert result["error_count"] > 0 and result["classes"]["batch"]["runs"] == 0
    assert set(result["errors"]) <= {"connect", "connection"}
    assert sum(result["errors"].values()) == result["error_count"]
    assert result["error_samples"][0]["class"] == "batch"
    assert "| batch |" in stdout and "errors:" in stdout


async def test_sub_agents_fan_out_and_closed_loop(stack: Stack, tmp_path: Path) -> None:
    """H3: --spawn N through the runtime (together and sequential), and closed-loop sub-agents."""
    runtime = f"{stack.extra['runtime'].urls['http']}/mcp"
    for extra in ((), ("--sequential",)):
        rc, stdout, result = await loadgen_here(
            tmp_path, "--runtime", runtime, "--spawn", "3", "--context-chars", "1000",
            "--max-tokens", "16", "--quiet", *extra,
        )  # fmt: skip
        assert rc == 0, stdout
        fan = result["fan_out"]
        assert fan["completed"] == 3 and fan["failed"] == 0
        assert fan["mode"] == ("sequential" if extra else "together")
        assert "fan-out: 3 sub-agents" in stdout
    rc, stdout, result = await loadgen_here(
        tmp_path, "--runtime", runtime, "--group", "2:batch:crowd:subagents",
        "--group", "1:interactive:me:subagents", "--duration-s", "2",
        "--context-chars", "1000", "--max-tokens", "16", "--quiet",
    )  # fmt: skip
    assert rc == 0, stdout
    for cls in ("interactive", "batch"):
        s = result["classes"][cls]
        assert s["runs"] > 0 and s["turns_per_run"] == s["tool_calls_per_run"] + 1
