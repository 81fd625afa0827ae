"""H3: ``luftpause loadgen`` as a process against a real stack.

Fake engines (time-scaled), fake MCP tools (short delay), scheduler, dataplane
and the runtime; the load generator runs a few seconds and its JSON is checked
for behaviour only (runs happened, turns per run, usage and held time reported,
errors counted), never for timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from fullstack import Stack, loadgen_here, start_stack

from luftpause.measure.mix import Defaults, ToolCalls, parse_group
from luftpause.procs import free_port
from luftpause.sim.agents import Records
from luftpause.sim.run import SimConfig, simulate

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


async def loadgen(
    tmp: Path, *argv: str, env: dict[str, str] | None = None
) -> tuple[int, str, str, dict[str, Any]]:
    """``luftpause loadgen`` as its own process (``env``: its whole environment)."""
    out = tmp / "result.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "luftpause", "loadgen", *argv, "--json", str(out),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
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


async def test_own_loop_groups_through_the_dataplane(stack: Stack, tmp_path: Path) -> None:
    """H3: two groups of own-loop agents in one invocation: runs per class, turns = tool calls
    + 1, cached share within 0..1, held time reported by the dataplane, no errors; every
    turn of a run that began and ended inside the window is among the turns that ended in
    it (B10: the second table)."""
    rc, stdout, stderr, result = await loadgen(
        tmp_path,
        "--target", stack.base_url, "--tools-url", stack.extra["tools_url"],
        "--group", "3:batch:crowd", "--group", "1:interactive:people",
        "--duration-s", "3", "--context-chars", "2000", "--tool-calls", "2",
        "--max-tokens", "32", "--runs-in-json",
    )  # fmt: skip
    assert rc == 0, stdout + stderr
    assert "\r" not in stderr and "runs done" not in stderr  # progress: terminals only
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
    assert "| turns ended in the window |" in stdout
    start, end = result["warmup_s"], result["warmup_s"] + result["window_s"]
    for cls in ("interactive", "batch"):
        inside = [
            r
            for r in runs
            if r["class"] == cls and start <= r["start_s"] and r["start_s"] + r["duration_s"] <= end
        ]
        ended = result["classes"][cls]["turns_ended"]
        assert ended["turns"] >= sum(r["turns"] for r in inside) > 0
        assert ended["completion_tokens_per_min"] > 0 and ended["wall_s"]["p50"] > 0
    assert (
        result["groups"]["people"]["turns_ended"]["turns"]
        == (result["classes"]["interactive"]["turns_ended"]["turns"])
    )


def completion_tokens(runs: list[dict[str, Any]]) -> list[list[int]]:
    """Each run's reply lengths, turn by turn, in the order the runs started."""
    ordered = sorted(runs, key=lambda r: r["start_s"])
    return [[t["completion_tokens"] for t in r["turn_records"]] for r in ordered]


async def test_a_plan_seed_gives_loads_and_the_simulator_the_same_replies(
    stack: Stack, tmp_path: Path
) -> None:
    """B1, B10: with one --plan-seed, two loads (two arms of a flood's repetition, each
    with its own --seed, so its own prompt text) get the same tool counts and the same
    reply lengths from the fake engines, run for run, and `luftpause sim --plan-seed`
    plays them too; another plan seed draws other replies."""

    async def one_agent(seed: str, plan_seed: str) -> list[list[int]]:
        rc, stdout, stderr, result = await loadgen(
            tmp_path,
            "--target", stack.base_url, "--tools-url", stack.extra["tools_url"],
            "--group", "1:batch:crowd", "--duration-s", "3", "--warmup-s", "0",
            "--context-chars", "2000", "--tool-calls", "0-3", "--max-tokens", "64",
            "--seed", seed, "--plan-seed", plan_seed, "--runs-in-json", "--quiet",
        )  # fmt: skip
        assert rc == 0 and result["error_count"] == 0, stdout + stderr
        assert result["plan_seed"] == plan_seed
        return completion_tokens(result["runs"])

    arm_a = await one_agent("own1luftpause0", "own1rep0")
    arm_b = await one_agent("own1router0", "own1rep0")
    other = await one_agent("own1luftpause1", "own1rep1")
    n = min(len(arm_a), len(arm_b), len(other))
    assert n >= 3, (arm_a, arm_b, other)
    assert arm_a[:n] == arm_b[:n]
    assert len({len(run) for run in arm_a}) > 1  # tool counts vary from run to run
    assert other[:n] != arm_a[:n]

    def simulated(plan_seed: str | None) -> list[list[int]]:
        defaults = Defaults(context_chars=2000, tool_calls=ToolCalls.parse("0-3"), max_tokens=64)
        group = parse_group("1:batch:crowd", 0, defaults)
        records = Records()
        config = SimConfig(groups=(group,), duration_s=120, warmup_s=0, plan_seed=plan_seed)
        simulate(config, "router", records=records)
        runs = sorted(records.runs, key=lambda r: r.start_s)
        return [[t.completion_tokens or 0 for t in r.turn_records] for r in runs]

    assert simulated("own1rep0")[:n] == arm_a[:n]
    assert simulated(None)[:n] != arm_a[:n]  # drawn from each conversation instead


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


SAMPLE_TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "sample.jsonl"


async def test_a_trace_is_replayed_through_the_dataplane(stack: Stack, tmp_path: Path) -> None:
    """B10, H3: ``--trace`` replays every run of the sample trace through the dataplane and
    stops when the last one ends: the trace's turns per run, each prompt padded to the
    trace's length (the fake engine counts as the replay does), each answer exactly the
    trace's length (``max_tokens`` + ``ignore_eos``), each tool call the nearest of the
    replay's sizes, held time reported, no errors."""
    planned = {}
    for text in SAMPLE_TRACE.read_text().splitlines():
        run = json.loads(text)
        planned[len(run["turns"]), run["turns"][0]["prompt_tokens"]] = run["turns"]
    rc, stdout, stderr, result = await loadgen(
        tmp_path,
        "--target", stack.base_url, "--trace", str(SAMPLE_TRACE), "--time-scale", "20",
        "--runs-in-json",
    )  # fmt: skip
    assert rc == 0, stdout + stderr
    assert "| group nightly |" in stdout
    assert result["error_count"] == 0 and result["trace"]["runs"] == 6
    assert len(result["runs"]) == 6
    for r in result["runs"]:
        records = r["turn_records"]
        turns = planned[len(records), records[0]["planned_prompt_tokens"]]
        assert r["turns"] == len(turns) and r["tool_calls"] == len(turns) - 1
        assert len(r["replicas"]) == 1  # strict affinity through luftpause (S3)
        for t, plan in zip(records, turns, strict=True):
            assert t["prompt_tokens"] == plan["prompt_tokens"]
            assert t["held_s"] is not None
        assert records[-1]["completion_tokens"] == turns[-1]["completion_tokens"]
        for t, plan in zip(records[:-1], turns[:-1], strict=True):
            assert plan["completion_tokens"] / 1.5 <= t["completion_tokens"]
            assert t["completion_tokens"] <= plan["completion_tokens"] * 1.5
        assert r["cached_tokens"] <= r["prompt_tokens"]
    # The window runs from 0 to the last run's end: every turn of every run ended in it.
    ended = sum(c["turns_ended"]["turns"] for c in result["classes"].values())
    assert ended == sum(r["turns"] for r in result["runs"])


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
        assert "turns_ended" not in s  # sub-agents' turns are the runtime's, not logged here


TOKEN = "loadgen-test-token"


@pytest.fixture(scope="module")
def token_stack(
    stack: Stack, module_services: Any, tmp_path_factory: pytest.TempPathFactory
) -> Stack:
    """X2, D9: a second stack whose dataplane and runtime require TOKEN (the tool server is
    the first stack's, which asks for nothing)."""
    tmp = tmp_path_factory.mktemp("loadgen-token")
    env = {"LUFTPAUSE_TOKEN": TOKEN}
    s = start_stack(module_services, tmp, engines=("engine-t",), dataplane_env=env)
    config = tmp / "runtime.toml"
    config.write_text(
        f'[runtime]\ndataplane_url = "{s.dataplane.urls["http"]}"\n'
        f'state_dir = "{tmp / "state"}"\n'
        f'[[runtime.tool_servers]]\nname = "fake"\nurl = "{stack.extra["tools_url"]}"\n'
    )
    runtime = module_services.start(
        "runtime", "--config", str(config), "--port", "0", name="runtime-t", env=env
    )
    s.extra["tools_url"] = stack.extra["tools_url"]
    s.extra["runtime"] = f"{runtime.urls['http']}/mcp"
    return s


def no_token_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LUFTPAUSE_TOKEN"}


async def test_a_missing_or_wrong_token_is_one_clear_line(
    token_stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """X2, H3: a dataplane or runtime that answers 401 stops the load before it starts with
    one line naming the service and the fix - no traceback, no exception group; exit 2."""
    monkeypatch.delenv("LUFTPAUSE_TOKEN", raising=False)
    dataplane = token_stack.base_url
    rc, stdout, stderr, result = await loadgen(
        tmp_path, "--target", token_stack.base_url.removesuffix("/v1"),
        "--tools-url", token_stack.extra["tools_url"], "--agents", "1", "--duration-s", "1",
        "--quiet", env=no_token_env(),
    )  # fmt: skip
    assert rc == 2 and result == {}, stdout + stderr
    assert stderr.strip() == (
        f"luftpause loadgen: the dataplane at {dataplane} requires a token (401): "
        "set --token or LUFTPAUSE_TOKEN"
    )
    runtime = token_stack.extra["runtime"]
    rc, stdout, stderr, _ = await loadgen(
        tmp_path, "--runtime", runtime, "--spawn", "1", "--token", "wrong", "--quiet",
        env=no_token_env(),
    )  # fmt: skip
    assert rc == 2, stdout + stderr
    assert stderr.strip() == (
        f"luftpause loadgen: the runtime at {runtime} refused the token (401): "
        "set --token or LUFTPAUSE_TOKEN"
    )
    # The same in process: a wrong token for the dataplane, none for the runtime.
    for argv, line in (
        (
            ["--target", dataplane, "--tools-url", token_stack.extra["tools_url"],
             "--agents", "1", "--token", "wrong"],
            f"the dataplane at {dataplane} refused the token (401)",
        ),
        (
            ["--runtime", runtime, "--group", "1:batch:me:subagents"],
            f"the runtime at {runtime} requires a token (401)",
        ),
    ):  # fmt: skip
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc, stdout, result = await loadgen_here(tmp_path, *argv, "--duration-s", "1", "--quiet")
        assert rc == 2 and result == {}, stdout + err.getvalue()
        assert err.getvalue() == f"luftpause loadgen: {line}: set --token or LUFTPAUSE_TOKEN\n"


async def test_the_token_goes_to_the_dataplane_and_the_runtime(
    token_stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """X2, H3: with the token (from LUFTPAUSE_TOKEN, or --token) own-loop agents go through
    the dataplane and sub-agents through the runtime, without errors."""
    monkeypatch.setenv("LUFTPAUSE_TOKEN", TOKEN)
    rc, stdout, result = await loadgen_here(
        tmp_path, "--target", token_stack.base_url, "--tools-url", token_stack.extra["tools_url"],
        "--agents", "2", "--max-runs", "2", "--duration-s", "20", "--context-chars", "1000",
        "--tool-calls", "1", "--max-tokens", "16", "--quiet",
    )  # fmt: skip
    assert rc == 0, stdout
    assert result["error_count"] == 0 and result["classes"]["batch"]["runs"] >= 2
    assert result["model"] == "llama-3.2-1b"  # listed by the dataplane, with the token
    monkeypatch.delenv("LUFTPAUSE_TOKEN")
    rc, stdout, result = await loadgen_here(
        tmp_path, "--runtime", token_stack.extra["runtime"], "--spawn", "2", "--token", TOKEN,
        "--context-chars", "1000", "--max-tokens", "16", "--quiet",
    )  # fmt: skip
    assert rc == 0, stdout
    assert result["fan_out"]["completed"] == 2 and result["fan_out"]["failed"] == 0
