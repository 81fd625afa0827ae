"""B10: agent-shaped workloads - the coding-agent profile, trace replay, both in the simulator.

Statistical checks sample with a fixed seed and use tolerant bounds around the
values docs/guides/workloads.md documents (and cites).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from luftpause.fakes.engine.model import EngineParams
from luftpause.loadgen import shaped
from luftpause.loadgen.agents import Reply
from luftpause.loadgen.main import add_arguments as loadgen_arguments
from luftpause.measure.cli import build_groups
from luftpause.measure.mix import Defaults, Group, MixError, parse_group, parse_mix
from luftpause.measure.shaped import shared_text
from luftpause.measure.stats import RunRecord, TurnRecord, percentile
from luftpause.measure.trace import TraceError, load_trace, parse_trace
from luftpause.measure.workload import (
    CODING_AGENT,
    CODING_SUBAGENT,
    LogNormal,
    Mixture,
    RunPlan,
    TurnPlan,
    run_rng,
)
from luftpause.sim.agents import Records
from luftpause.sim.main import add_arguments as sim_arguments
from luftpause.sim.main import config_from_args
from luftpause.sim.run import SimConfig, simulate

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "traces" / "sample.jsonl"
N_RUNS = 3000


@pytest.fixture(scope="module")
def runs() -> list[RunPlan]:
    return [CODING_AGENT.sample(run_rng(0, "test", i, 1)) for i in range(N_RUNS)]


def growth_pairs(runs: list[RunPlan]) -> list[tuple[TurnPlan, TurnPlan]]:
    """Consecutive turns where the conversation grew (no compaction in between)."""
    return [
        (a, b)
        for r in runs
        for a, b in zip(r.turns, r.turns[1:], strict=False)
        if b.prompt_tokens >= a.prompt_tokens
    ]


# ------------------------------------------------------------------ the profile


def test_turns_per_run_are_a_distribution_with_median_about_30(runs: list[RunPlan]) -> None:
    """B10: turns per run have a median of ~30 (SWE-agent trajectories on SWE-Bench Pro:
    medians 29-78 by model) with a spread: p10 ~12, p90 ~70, never fewer than 2."""
    turns = [len(r.turns) for r in runs]
    assert 27 <= percentile(turns, 50)  <= 33  # fmt: skip
    assert 9 <= percentile(turns, 10) <= 15
    assert 55 <= percentile(turns, 90) <= 90
    assert min(turns) >= 2 and max(turns) <= 250
    assert len(set(turns)) > 50  # a distribution, not a constant


def test_first_prompt_is_the_shared_system_prompt_plus_a_task(runs: list[RunPlan]) -> None:
    """B10: the first prompt is ~25k tokens, 21k of them the system prompt and tools every
    run shares (a Claude Code session's first request: 25,407 tokens, ~21k tools + system)."""
    first = [r.turns[0].prompt_tokens for r in runs]
    assert 22_000 <= percentile(first, 50) <= 28_000
    assert all(r.shared_tokens == 21_000 < r.turns[0].prompt_tokens for r in runs)


def test_each_prompt_is_the_previous_prompt_plus_reply_plus_tool_result(
    runs: list[RunPlan],
) -> None:
    """B10: context growth: each turn's prompt = previous prompt + previous reply + a tool
    result (≥ 1 token), and the appended tail has TraceLab's median of ~800-950 tokens
    per step with a heavy tail (p90 a few thousand)."""
    pairs = growth_pairs(runs)
    assert len(pairs) > 50_000
    appended = [b.prompt_tokens - a.prompt_tokens for a, b in pairs]
    assert all(b.prompt_tokens >= a.prompt_tokens + a.completion_tokens + 1 for a, b in pairs)
    assert 750 <= percentile(appended, 50) <= 1_000
    assert 2_500 <= percentile(appended, 90) <= 5_000
    assert 9_000 <= percentile(appended, 99) <= 20_000


def test_most_of_every_prompt_is_a_cached_prefix(runs: list[RunPlan]) -> None:
    """B10: the share of each prompt that is the previous prompt (what an engine that kept
    it would serve from cache): ~97 % of tokens over all turns (TraceLab: 96 % of input
    tokens read from cache; LMCache's Claude Code trace: 92 % prefix reuse), over 90 %
    for nine turns in ten."""
    pairs = growth_pairs(runs)
    shares = [a.prompt_tokens / b.prompt_tokens for a, b in pairs]
    assert percentile(shares, 10) >= 0.9
    weighted = sum(a.prompt_tokens for a, _ in pairs) / sum(b.prompt_tokens for _, b in pairs)
    assert 0.92 <= weighted <= 0.99


def test_contexts_grow_to_tens_of_thousands_and_compact_at_the_cap(runs: list[RunPlan]) -> None:
    """B10: contexts reach tens of thousands of tokens (median largest prompt 50-90k) and
    never pass the cap; a run that would compacts to its first prompt plus a summary."""
    largest = [max(t.prompt_tokens for t in r.turns) for r in runs]
    assert 50_000 <= percentile(largest, 50) <= 90_000
    assert max(largest) <= CODING_AGENT.context_cap
    compactions = 0
    for r in runs:
        first = r.turns[0].prompt_tokens
        for a, b in zip(r.turns, r.turns[1:], strict=False):
            if b.prompt_tokens < a.prompt_tokens:
                compactions += 1
                assert a.prompt_tokens + a.completion_tokens > CODING_AGENT.context_cap - 32_768
                assert first < b.prompt_tokens <= first + 16_000
    assert 0.05 * N_RUNS <= compactions <= 0.5 * N_RUNS
    assert max(r.max_context() for r in runs) <= CODING_AGENT.max_context() <= 131_072


def test_tool_gaps_have_tracelabs_median_and_heavy_tail(runs: list[RunPlan]) -> None:
    """B10: tool time per call: TraceLab's Claude Code and Codex trace has p50 0.3 s,
    p90 13.6 s, p99 216 s; the profile's (cut at 10 minutes) is within tolerant bounds."""
    gaps = [t.tool_s for r in runs for t in r.turns[:-1] if not t.subagents]
    assert 0.2 <= percentile(gaps, 50) <= 0.45
    assert 9.0 <= percentile(gaps, 90) <= 22.0
    assert 120.0 <= percentile(gaps, 99) <= 330.0
    assert max(gaps) <= 600.0 and min(gaps) > 0
    assert all(t.tool_s == 0.0 for r in runs for t in r.turns[-1:])


def test_replies_are_short_beside_the_context(runs: list[RunPlan]) -> None:
    """B10: replies: median ~200 tokens, mean ~350 (TraceLab: long contexts, short
    outputs; 523 output tokens per step on average, Codex's reasoning included)."""
    out = [t.completion_tokens for r in runs for t in r.turns]
    assert 170 <= percentile(out, 50) <= 230
    assert 280 <= sum(out) / len(out) <= 450


def test_sub_agents_are_spawned_in_parallel_now_and_then(runs: list[RunPlan]) -> None:
    """B10: now and then a tool step starts 2-4 sub-agents in parallel (a Claude Code
    session spawned 4 at once): about 2 % of tool steps, so about 40 % of runs; each
    sub-agent is a shorter run (median ~8 turns) with a system prompt of its own."""
    tool_steps = [t for r in runs for t in r.turns[:-1]]
    fanouts = [t for t in tool_steps if t.subagents]
    assert 0.012 <= len(fanouts) / len(tool_steps) <= 0.03
    assert all(2 <= len(t.subagents) <= 4 and t.tool_s == 0.0 for t in fanouts)
    assert 0.3 <= sum(1 for r in runs if r.subagent_count) / N_RUNS <= 0.6
    subs = [s for t in fanouts for s in t.subagents]
    assert 6 <= percentile([len(s.turns) for s in subs], 50) <= 10
    assert all(s.prefix == CODING_SUBAGENT.name and not s.subagent_count for s in subs)


def test_a_run_is_a_function_of_its_seed() -> None:
    """B10, B1: the same seed and place in the load give the same run; others differ."""
    one = CODING_AGENT.sample(run_rng(7, "g", 0, 1))
    assert one == CODING_AGENT.sample(run_rng(7, "g", 0, 1))
    assert one != CODING_AGENT.sample(run_rng(8, "g", 0, 1))
    assert one != CODING_AGENT.sample(run_rng(7, "g", 0, 2))


def test_truncated_log_normal_and_mixture() -> None:
    """B10: a truncated log-normal keeps its median (bounds far away) and never leaves its
    range; a mixture draws from each part by weight."""
    d = LogNormal(median=10.0, sigma=1.0, lo=1.0, hi=1000.0)
    assert d.quantile(0.5) == pytest.approx(10.0, rel=0.02)
    rng = random.Random(1)
    xs = [d.sample(rng) for _ in range(5000)]
    assert all(1.0 <= x <= 1000.0 for x in xs)
    tight = LogNormal(median=10.0, sigma=3.0, lo=5.0, hi=20.0)
    assert all(5.0 <= tight.sample(rng) <= 20.0 for _ in range(1000))
    m = Mixture(0.5, LogNormal(1.0, 0.0, 1.0, 1.0), LogNormal(9.0, 0.0, 9.0, 9.0))
    draws = [m.sample(rng) for _ in range(2000)]
    assert set(draws) == {1.0, 9.0} and 0.45 <= draws.count(1.0) / 2000 <= 0.55
    with pytest.raises(ValueError):
        LogNormal(median=0.0, sigma=1.0, lo=1.0, hi=2.0)


# ------------------------------------------------------------------ groups


def test_profile_option_shapes_own_loop_groups_only() -> None:
    """B10, H3: ``--profile`` shapes every own-loop group (and a mix file's ``profile``);
    naming an unknown profile, or one for sub-agents over MCP, is refused."""
    p = argparse.ArgumentParser()
    loadgen_arguments(p)
    args = p.parse_args(["--group", "2:batch", "--agents", "1", "--profile", "coding-agent"])
    assert [g.profile for g in build_groups(args)] == ["coding-agent", "coding-agent"]
    assert parse_group("2:batch:x:subagents", 0, Defaults(profile="coding-agent")).profile is None
    groups = parse_mix({"group": [{"count": 2, "class": "batch", "profile": "coding-agent"}]})
    assert groups[0].profile == "coding-agent"
    with pytest.raises(MixError, match="unknown profile"):
        Group("g", 1, "batch", "g", profile="chatbot")
    with pytest.raises(MixError, match="own-loop agents only"):
        Group("g", 1, "batch", "g", kind="subagents", profile="coding-agent")


# ------------------------------------------------------------------ the trace format


def test_the_sample_trace_parses() -> None:
    """B10: the shipped sample: six runs, both classes, start times, a shared system
    prompt, a compaction (a prompt shorter than the one before) and a caller of its own."""
    runs = load_trace(SAMPLE)
    assert [r.id for r in runs][:2] == ["fix-login-bug", "add-tests"]
    assert {r.cls for r in runs} == {"interactive", "batch"}
    assert {r.group for r in runs} == {"trace-interactive", "trace-batch", "nightly"}
    assert all(r.plan.prefix == "trace" for r in runs)
    assert runs[0].plan.shared_tokens == 1000 and runs[0].plan.turns[0].tool_s == 0.4
    assert runs[2].start_s == 0.5 and runs[2].line == 3
    assert any(
        b.prompt_tokens < a.prompt_tokens
        for r in runs
        for a, b in zip(r.plan.turns, r.plan.turns[1:], strict=False)
    )


def line(**run: Any) -> str:
    base: dict[str, Any] = {"id": "a", "turns": [{"prompt_tokens": 10, "completion_tokens": 5}]}
    base.update(run)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


GOOD = line()
BAD_TURN = {"prompt_tokens": 20, "completion_tokens": -5}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "line 1: not valid JSON"),
        ("[1, 2]", "line 1: expected a JSON object, got list"),
        (line(id=...), "line 1: field 'id' is required"),
        (line(id=True), "line 1: field 'id' must be a non-empty string or an integer"),
        (line(id=""), "line 1: field 'id' must be a non-empty string"),
        (GOOD + "\n\n" + GOOD, "line 3: field 'id' \"a\" repeats line 1"),
        (line(**{"class": "gold"}), "line 1: field 'class' must be interactive or batch"),
        (line(caller=""), "line 1: field 'caller' must be a non-empty string"),
        (line(start_s=-1), "line 1: field 'start_s' must be a number of seconds ≥ 0, got -1"),
        (line(start_s="soon"), "field 'start_s' must be a number of seconds"),
        (line(turn=[]), "line 1: unknown field(s) turn"),
        (line(turns=...), "line 1: field 'turns' must be a non-empty list"),
        (line(turns=[]), "line 1: field 'turns' must be a non-empty list"),
        (line(turns={"prompt_tokens": 1}), "field 'turns' must be a non-empty list"),
        (line(turns=[3]), "line 1: turns[0] must be an object"),
        (line(turns=[{"completion_tokens": 5}]), "line 1: turns[0].prompt_tokens is required"),
        (
            line(turns=[{"prompt_tokens": 10, "completion_tokens": 5, "tools": 1}]),
            "line 1: turns[0]: unknown field(s) tools",
        ),
        (
            line(turns=[{"prompt_tokens": 0, "completion_tokens": 5}]),
            "line 1: turns[0].prompt_tokens must be an integer ≥ 1, got 0",
        ),
        (
            line(turns=[{"prompt_tokens": 10.5, "completion_tokens": 5}]),
            "turns[0].prompt_tokens must be an integer ≥ 1, got 10.5",
        ),
        (
            line(turns=[{"prompt_tokens": "10", "completion_tokens": 5}]),
            "turns[0].prompt_tokens must be an integer",
        ),
        (
            line(turns=[*[{"prompt_tokens": 10, "completion_tokens": 5}] * 2, BAD_TURN]),
            "line 1: turns[2].completion_tokens must be an integer ≥ 1, got -5",
        ),
        (
            line(turns=[{"prompt_tokens": 10, "completion_tokens": 5, "tool_s": -0.5}]),
            "line 1: turns[0].tool_s must be a number of seconds ≥ 0, got -0.5",
        ),
        (
            '{"id": 1, "turns": [{"prompt_tokens": 10, "completion_tokens": 5, "tool_s": NaN}]}',
            "turns[0].tool_s must be a number of seconds",
        ),
        (line(shared_tokens=10), "field 'shared_tokens' (10) must be less than the first prompt"),
        (line(shared_tokens=-1), "field 'shared_tokens' must be an integer ≥ 0"),
        ("\n\n", "no runs in it"),
    ],
)
def test_each_kind_of_bad_line_is_named(text: str, message: str) -> None:
    """B10: a trace that cannot be replayed is refused with the line and the field."""
    with pytest.raises(TraceError) as caught:
        parse_trace(text)
    assert message in str(caught.value)


def test_bad_files_name_the_file(tmp_path: Path) -> None:
    """B10: the file's name leads the message; unreadable and non-UTF-8 files too."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD + "\n" + line(id="b", start_s=-2) + "\n")
    with pytest.raises(TraceError, match=r"^trace .*bad\.jsonl: line 2: field 'start_s'"):
        load_trace(bad)
    with pytest.raises(TraceError, match="cannot read it"):
        load_trace(tmp_path / "missing.jsonl")
    (tmp_path / "latin.jsonl").write_bytes(b'{"id": "\xe9"}\n')
    with pytest.raises(TraceError, match="not UTF-8"):
        load_trace(tmp_path / "latin.jsonl")
    ok = parse_trace(line(id=7, start_s=1, caller="me") + "\n")
    assert ok[0].id == "7" and ok[0].group == "me" and ok[0].cls == "batch"


@pytest.mark.parametrize("command", ["loadgen", "sim"])
def test_cli_refuses_a_bad_trace_without_a_traceback(command: str, tmp_path: Path) -> None:
    """B10: ``luftpause loadgen|sim --trace FILE`` with a bad line: exit 2, one clear line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD + "\n" + '{"id": "b", "turns": [{"prompt_tokens": 5}]}\n')
    out = subprocess.run(
        [sys.executable, "-m", "luftpause", command, "--trace", str(bad)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert "line 2: turns[0].completion_tokens is required" in out.stderr
    assert "Traceback" not in out.stderr


# ------------------------------------------------------------------ the load generator's replay


def fake_reply(completion: int, prompt: int | None, calls: int = 1) -> Reply:
    tool_calls = [
        {"id": f"call_{i}", "name": "emit_64", "arguments": '{"text": "' + "x" * 40 + '"}'}
        for i in range(calls)
    ]
    turn = TurnRecord(wall_s=0.1, prompt_tokens=prompt, completion_tokens=completion)
    return Reply("", tool_calls, "tool_calls", turn)


def test_conversation_pads_to_the_planned_prompts() -> None:
    """B10: the replay's conversation reaches each planned prompt length as the fake engine
    counts it (corrected by what the engine reported), asks the last turn for exactly its
    reply with ``ignore_eos``, and a tool turn for the tool-call size nearest the plan."""
    plan = RunPlan(
        (
            TurnPlan(3000, 100, 0.5),
            TurnPlan(4200, 50, 0.1),
            TurnPlan(2500, 30, 0.0),  # compacted
            TurnPlan(2900, 700),
        ),
        shared_tokens=1000,
        prefix="t",
    )
    conv = shaped.Conversation(plan, "run-1", shaped.TOOLS)
    assert conv.count(conv.messages) == 3000
    system = [conv.messages[0]]
    assert conv.count(system) == 1000  # tools and system prompt: the shared part
    assert system[0]["content"] == shared_text("t", len(system[0]["content"]) // 4)
    max_tokens, fields, results = conv.request(0)
    assert fields["tool_choice"]["function"]["name"] == "emit_128" and results == 1
    assert max_tokens >= 128
    conv.replied(0, fake_reply(13, prompt=3007))  # the engine counted 7 more than we did
    assert conv.drift == 7 and conv.results == 1
    assert conv.count(conv.messages) + conv.drift == 4200
    conv.request(1)
    conv.replied(1, fake_reply(13, prompt=4200 + 7))
    assert conv.count(conv.messages) + conv.drift == 2500  # a fresh conversation
    assert conv.results == 0 and len(conv.messages) == 2
    conv.request(2)
    conv.replied(2, fake_reply(13, prompt=2507, calls=2))
    assert conv.results == 2
    max_tokens, fields, results = conv.request(3)
    assert (max_tokens, fields, results) == (700, {"tool_choice": "none", "ignore_eos": True}, 2)
    assert shaped.bucket(1) == 16 and shaped.bucket(100) == 128 and shaped.bucket(10**6) == 4096


def test_a_tool_turn_without_a_tool_call_fails_the_run() -> None:
    conv = shaped.Conversation(RunPlan((TurnPlan(500, 10, 1.0), TurnPlan(600, 10))), "r", [])
    conv.request(0)
    reply = fake_reply(10, 500, calls=0)
    with pytest.raises(Exception, match="was to call a tool"):
        conv.replied(0, reply)


# ------------------------------------------------------------------ the simulator

SMALL_SUB = replace(
    CODING_SUBAGENT,
    turns=LogNormal(3, 0.3, 2, 5),
    shared_tokens=400,
    task_tokens=LogNormal(200, 0.3, 50, 400),
    completion_tokens=LogNormal(60, 0.6, 4, 400),
    result_tokens=LogNormal(200, 0.8, 4, 1500),
    context_cap=4000,
)
SMALL = replace(
    CODING_AGENT,
    turns=LogNormal(5, 0.4, 2, 10),
    shared_tokens=1500,
    task_tokens=LogNormal(500, 0.5, 100, 1500),
    completion_tokens=LogNormal(60, 0.6, 4, 400),
    result_tokens=LogNormal(200, 0.8, 4, 1500),
    context_cap=4000,
    fanout_p=0.3,
    subagent=SMALL_SUB,
)


def test_the_small_profile_fits_the_default_engine() -> None:
    assert SMALL.max_context() <= EngineParams().context_length


def small_config(seed: int = 0) -> SimConfig:
    groups = (
        Group("people", 1, "interactive", "people", profile="coding-agent"),
        Group("crowd", 4, "batch", "crowd", profile="coding-agent"),
    )
    return SimConfig(
        groups=groups,
        replicas=1,
        duration_s=240.0,
        warmup_s=0.0,
        seed=seed,
        profiles={"coding-agent": SMALL},
    )


def test_sim_profile_runs_are_deterministic_per_seed_and_finish() -> None:
    """B10, B1: profile agents in the simulator: the same seed gives the same report, another
    seed another; runs finish with sub-agents counted, every turn gets exactly its planned
    prompt and reply, and most of each prompt comes from the engine's prefix cache."""
    first = simulate(small_config(), "luftpause")
    again = simulate(small_config(), "luftpause")
    for key in ("classes", "groups", "errors", "events", "turns"):
        assert first[key] == again[key]
    assert simulate(small_config(seed=1), "luftpause")["events"] != first["events"]
    assert first["error_count"] == 0
    batch = first["classes"]["batch"]
    assert batch["runs"] >= 5 and batch["cached_share"] > 0.6
    runs = simulate_runs(small_config())
    assert any(r.subagents for r in runs)
    for r in runs:
        for t in r.turn_records:
            assert t.prompt_tokens == t.planned_prompt_tokens
            assert t.completion_tokens == t.planned_completion_tokens


def simulate_runs(config: SimConfig) -> list[RunRecord]:
    """The run records of one simulation (the router arm)."""
    records = Records()
    simulate(config, "router", records=records)
    return records.runs


def test_sim_runs_the_full_coding_agent_profile_on_long_context_engines() -> None:
    """B10: the profile itself (contexts of tens of thousands of tokens) on engines with a
    128k context and a 1M-token KV pool: deterministic, no errors, cached share high."""
    config = SimConfig(
        groups=(Group("crowd", 2, "batch", "crowd", profile="coding-agent"),),
        replicas=1,
        duration_s=400.0,
        warmup_s=0.0,
        engine=EngineParams(priority_scheduling=True, context_length=131_072, kv_tokens=1_000_000),
    )
    first = simulate(config, "luftpause")
    assert first == {**simulate(config, "luftpause"), "wall_s": first["wall_s"],
                     "speedup": first["speedup"]}  # fmt: skip
    assert first["error_count"] == 0 and first["turns"] >= 20


def test_sim_reports_turns_of_runs_that_outlast_the_window() -> None:
    """B10, H3: runs of the full profile outlast a short window, so runs/min says nothing;
    the turns that ended inside it still show each class's turn time and work done, and
    they are exactly the logged turns whose end falls in the window."""
    config = SimConfig(
        groups=(
            Group("people", 1, "interactive", "people", profile="coding-agent"),
            Group("crowd", 2, "batch", "crowd", profile="coding-agent"),
        ),
        replicas=1,
        duration_s=60.0,
        warmup_s=30.0,
        engine=EngineParams(priority_scheduling=True, context_length=131_072, kv_tokens=1_000_000),
    )
    records = Records()
    result = simulate(config, "luftpause", records=records)
    for cls in ("interactive", "batch"):
        c = result["classes"][cls]
        assert c["runs"] == 0
        in_window = [t for t in records.ended if t.cls == cls and 30.0 <= t.end_s <= 90.0]
        assert in_window and c["turns_ended"]["turns"] == len(in_window)
        assert c["turns_ended"]["wall_s"]["p50"] > 0
        assert c["turns_ended"]["completion_tokens_per_min"] == round(
            sum(t.turn.completion_tokens or 0 for t in in_window), 1
        )


def sim_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    sim_arguments(p)
    return p.parse_args(list(argv))


def test_sim_replays_the_sample_trace_to_its_end_deterministically() -> None:
    """B10, B1: every run of the sample trace finishes, alone it is measured from 0 to its
    last run's end, the same twice; each turn gets exactly the trace's prompt and reply."""
    config = config_from_args(sim_args("--trace", str(SAMPLE)))
    assert config.duration_s is None and config.warmup_s == 0.0
    for arm in ("luftpause", "router", "engine-prio"):
        result = simulate(config, arm)
        assert result["error_count"] == 0 and result["unfinished_replays"] == 0
        assert sum(c["runs"] for c in result["classes"].values()) == 6
        assert result["turns"] == 24
        assert result == {**simulate(config, arm), "wall_s": result["wall_s"],
                          "speedup": result["speedup"]}  # fmt: skip
    runs = simulate_runs(config)
    planned = {
        (t.prompt_tokens, t.completion_tokens) for r in load_trace(SAMPLE) for t in r.plan.turns
    }
    seen = {(t.prompt_tokens, t.completion_tokens) for r in runs for t in r.turn_records}
    assert seen == planned
    assert max(r.end_s for r in runs) == pytest.approx(
        simulate(config, "router")["virtual_s"], abs=1e-3
    )
    starts = sorted(r.start_s for r in runs)
    assert starts == [0.0, 0.0, 0.5, 1.0, 1.5, 2.0]


def test_sim_replays_a_trace_beside_groups_within_the_window(tmp_path: Path) -> None:
    """B10: a trace replayed beside closed-loop groups is measured in the groups' window."""
    config = config_from_args(
        sim_args("--trace", str(SAMPLE), "--group", "3:batch:crowd", "--duration-s", "60")
    )
    assert config.duration_s == 60.0 and config.warmup_s == 60.0
    result = simulate(config, "luftpause")
    assert {"crowd", "trace-batch", "trace-interactive", "nightly"} <= set(result["groups"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--profile", "coding-agent", "--agents", "2"), "--context-length 128192 or more"),
        (
            ("--profile", "coding-agent", "--agents", "2", "--context-length", "131072"),
            "--kv-tokens",
        ),
        (("--trace", str(SAMPLE), "--context-length", "2500"), "trace line 1 (run 'fix-login"),
        (("--trace", str(SAMPLE), "--group", "2:batch:nightly"), "also name a group"),
    ],
)
def test_sim_refuses_a_load_the_engines_cannot_hold(argv: tuple[str, ...], message: str) -> None:
    """B10: a profile or a trace whose turns do not fit the simulated engines is refused
    before anything runs, saying which flag to give."""
    with pytest.raises(MixError) as caught:
        config_from_args(sim_args(*argv))
    assert message in str(caught.value)


def test_sim_cli_replays_the_sample_trace(tmp_path: Path) -> None:
    """B10: ``luftpause sim --trace``: every arm's table and the trace in the JSON."""
    out = subprocess.run(
        [sys.executable, "-m", "luftpause", "sim", "--trace", str(SAMPLE), "--arms",
         "luftpause,router", "--json", str(tmp_path / "sim.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "6 trace runs replayed" in out.stdout and "| group nightly |" in out.stdout
    data = json.loads((tmp_path / "sim.json").read_text())
    assert data["config"]["trace"]["runs"] == 6 and data["config"]["duration_s"] is None
    assert all(math.isfinite(r["virtual_s"]) for r in data["results"])


def test_a_plan_seed_draws_the_same_runs_in_the_load_generator_and_the_simulator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """B1, B10: `luftpause loadgen --plan-seed P` and `luftpause sim --plan-seed P` play
    the same coding runs, slot for slot and run for run, whatever the load generator's
    --seed names them; without a plan seed the two draw from their own seeds."""
    import luftpause.loadgen.main as loadgen_main
    from luftpause.loadgen.agents import AgentOptions
    from luftpause.sim.shaped import ShapedAgent
    from luftpause.sim.world import World

    group = Group("crowd", 3, "batch", "crowd", profile="coding-agent")
    played: list[RunPlan] = []

    async def capture(client: Any, plan: RunPlan, *args: Any, **kwargs: Any) -> RunPlan:
        played.append(plan)
        return plan

    monkeypatch.setattr(loadgen_main.shaped, "play", capture)

    def loadgen_runs(seed: str, plan_seed: str, slot: int) -> list[RunPlan]:
        played.clear()
        options = AgentOptions(model="m", nonce=seed, plan_seed=plan_seed)
        once = loadgen_main._shaped_runner(None, group, slot, options, lambda: 0.0, 1.0)  # type: ignore[arg-type]
        for number in range(3):
            coroutine = once(f"{seed}-crowd-{slot}-{number}", number)
            with pytest.raises(StopIteration):
                coroutine.send(None)
        return list(played)

    def sim_runs(plan_seed: str | None, slot: int, index: int) -> list[RunPlan]:
        agent = ShapedAgent(
            index, group, "m", World(), None, {}, Records(), 0,  # type: ignore[arg-type]
            CODING_AGENT, plan_seed, slot=slot,
        )  # fmt: skip
        drawn: list[RunPlan] = []
        monkeypatch.setattr(agent, "_begin", lambda plan, *rest: drawn.append(plan))
        for _ in range(3):
            agent._next_profile_run()
        return drawn

    arm_a = loadgen_runs("coding24luftpause0", "coding24rep0", slot=1)
    arm_b = loadgen_runs("coding24router0", "coding24rep0", slot=1)
    assert arm_a == arm_b  # two arms of a repetition: the same runs
    assert len({(p.turns[0].prompt_tokens, len(p.turns)) for p in arm_a}) > 1
    # the simulator, given the plan seed, plays them too (slot 1 of its group, whatever
    # its index among all agents)
    assert sim_runs("coding24rep0", slot=1, index=5) == arm_a
    assert sim_runs("coding24rep0", slot=2, index=5) != arm_a
    # before --plan-seed, a flood's repetition drew its runs from its --seed
    assert loadgen_runs("coding24luftpause0", "coding24luftpause0", slot=1) != arm_a
    assert sim_runs("coding24luftpause0", slot=1, index=0) == loadgen_runs(
        "coding24luftpause0", "coding24luftpause0", slot=1
    )


def test_the_plan_seed_reaches_the_runs_a_load_and_a_simulation_play(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """B10: `luftpause loadgen --plan-seed P` hands P to every profile slot (slot i of its
    group) and records it as plan_seed, the seed where none is given; `luftpause sim
    --plan-seed P` hands P to its agents with their slot in the group, so both play the
    runs drawn from (P, group, slot, n)."""
    import asyncio

    import luftpause.loadgen.main as loadgen_main
    from luftpause.sim import shaped as sim_shaped

    async def no_models(target: str, token: str | None) -> list[str]:
        return ["m"]

    played: dict[str, list[RunPlan]] = {}

    async def play(client: Any, plan: RunPlan, group: Group, key: str, *rest: Any) -> RunRecord:
        played.setdefault(key.rsplit("-", 1)[0], []).append(plan)
        await asyncio.sleep(10)  # the load stops first
        raise AssertionError("unreachable")

    monkeypatch.setattr(loadgen_main, "_models_of", no_models)
    monkeypatch.setattr(loadgen_main.shaped, "play", play)

    def load(*argv: str) -> dict[str, Any]:
        played.clear()
        parser = argparse.ArgumentParser()
        loadgen_arguments(parser)
        args = parser.parse_args(
            ["--target", "http://127.0.0.1:1/v1", "--group", "2:batch:crowd",
             "--profile", "coding-agent", "--duration-s", "0.2", "--warmup-s", "0",
             "--quiet", *argv]
        )  # fmt: skip
        groups = build_groups(args)
        return asyncio.run(loadgen_main.run_load(args, groups, sys.stderr))

    expected = {slot: CODING_AGENT.sample(run_rng("P", "crowd", slot, 0)) for slot in (0, 1)}
    result = load("--seed", "arm-a", "--plan-seed", "P")
    assert result["seed"] == "arm-a" and result["plan_seed"] == "P"
    assert played == {f"arm-a-crowd-{slot}": [expected[slot]] for slot in (0, 1)}
    result = load("--seed", "arm-b")
    assert result["plan_seed"] == "arm-b"
    assert played["arm-b-crowd-1"] == [CODING_AGENT.sample(run_rng("arm-b", "crowd", 1, 0))]

    begun: list[tuple[int, RunPlan]] = []
    monkeypatch.setattr(
        sim_shaped.ShapedAgent, "_begin", lambda self, plan, *rest: begun.append((self.slot, plan))
    )
    parser = argparse.ArgumentParser()
    sim_arguments(parser)
    args = parser.parse_args(
        ["--group", "1:interactive:people", "--group", "2:batch:crowd", "--profile",
         "coding-agent", "--context-length", "131072", "--kv-tokens", "1000000",
         "--plan-seed", "P", "--duration-s", "1", "--warmup-s", "0"]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.plan_seed == "P"
    simulate(config, "router")
    crowd = [(slot, plan) for slot, plan in begun if plan != CODING_AGENT.sample(
        run_rng("P", "people", 0, 0))]  # fmt: skip
    assert crowd == [(0, expected[0]), (1, expected[1])]
