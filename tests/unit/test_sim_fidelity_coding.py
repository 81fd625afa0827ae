"""tools/bench/sim_fidelity.py: on a coding-agent flood, the simulator given the flood's
plan and both read by the turns that ended in the window; on any flood, several seeds
read as a mean and its range."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tools.bench import sim_fidelity as fidelity
from tools.bench.arms.plan import CODING_ENGINE_ARGS, CODING_INTERACTIVE, FULL


def ended(tokens: float, p50: float | None) -> dict[str, Any]:
    return {
        "turns": 3,
        "turns_per_min": 1.0,
        "wall_s": {"p50": p50, "p95": p50},
        "completion_tokens_per_min": tokens,
    }


def test_coding_plan_is_the_floods() -> None:
    """B1, B10: the simulator runs the coding flood's point as the flood ran it - its two
    interactive agents beside N batch agents, every run from the coding-agent profile,
    the same long-context engines, warm-up, ramp and window."""
    plan = {**FULL.__dict__, "coding_warmup_s": 200.0, "coding_window_s": 900.0}
    config = fidelity.coding_config(plan, 24, seed=3)
    assert [(g.count, g.cls, g.profile) for g in config.groups] == [
        (CODING_INTERACTIVE, "interactive", "coding-agent"),
        (24, "batch", "coding-agent"),
    ]
    assert (config.warmup_s, config.ramp_s, config.duration_s, config.seed) == (
        200.0, 100.0, 900.0, 3,
    )  # fmt: skip
    args = dict(zip(CODING_ENGINE_ARGS[::2], CODING_ENGINE_ARGS[1::2], strict=True))
    assert config.engine.context_length == int(args["--context-length"])
    assert config.engine.kv_tokens == int(args["--kv-tokens"])
    assert config.engine.priority_scheduling
    assert fidelity.coding_config({**plan, "ramp": False}, 24, seed=3).ramp_s == 0.0


def test_turn_figures_in_model_time() -> None:
    """The flood's figures (real seconds at its time scale) are averaged over repetitions
    and turned into model time; a class with a repetition that ended no turn is left
    out rather than averaged with a hole."""
    reps = [
        {"classes": {"interactive": {"turns_ended": ended(100.0, 2.0)},
                     "batch": {"turns_ended": ended(50.0, None)}}},
        {"classes": {"interactive": {"turns_ended": ended(300.0, 4.0)},
                     "batch": {"turns_ended": ended(70.0, 1.0)}}},
    ]  # fmt: skip
    assert fidelity.real_turn_figures(reps, 10.0) == {"interactive": (20.0, 30.0)}
    sim = {"classes": {"interactive": {"turns_ended": ended(12.0, 5.0)}, "batch": {}}}
    assert fidelity.sim_turn_figures(sim) == {"interactive": (12.0, 5.0)}
    assert fidelity.pct(11.0, 10.0) == "+10 %"
    assert fidelity.real_turn_figures([{"classes": {"interactive": {}}}], 1.0) == {}


def test_several_seeds_give_a_mean_and_its_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """B1: with ``--seeds N`` each point is simulated with N seeds; a sim cell is their
    mean with their lowest and highest, and the summary counts the flood figures that
    lie inside that range as well as those within ±10 % of the mean."""
    rep = {
        "classes": {
            cls: {"runs_per_min_closed": rate, "run_s": {"p50": p50}}
            for cls, rate, p50 in (("interactive", 8.0, 20.0), ("batch", 4.0, 25.0))
        }
    }
    plan = {"time_scale": 1.0, "warmup_s": 10.0, "window_s": 60.0, "reps": 1}
    # a flood before plan keys: its replies were drawn from each conversation
    code = fidelity.FIRST_TOKEN_ALONE
    data = {"plan": plan, "results": {"own": {"2": {"router": [rep]}}}, "code": code}
    (tmp_path / "json").write_text(json.dumps(data))
    out = tmp_path / "doc.md"
    out.write_text("before\n<!-- fidelity-x:start -->\nold\n<!-- fidelity-x:end -->\nafter\n")
    argv = ["sim_fidelity.py", "--flood", str(tmp_path / "json"), "--seeds", "3"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out), "--part", "x"])
    assert fidelity.main() == 0
    capsys.readouterr()
    text = out.read_text()
    assert text.startswith("before\n<!-- fidelity-x:start -->\nCommand:") and "old" not in text
    assert "--seeds 3" in text and "seeds 0–2" in text and "one repetition" in text
    rows = [line for line in text.splitlines() if line.startswith("| 2 | router |")]
    assert len(rows) == 2
    for row in rows:
        mean, low, high = (float(x) for x in re.findall(r"([\d.]+) \(([\d.]+)–([\d.]+)\)", row)[0])
        assert low <= mean <= high
    assert re.search(r"2 rows; the flood inside the seeds' range on both: \d of 2\.", text)
    monkeypatch.setattr(sys, "argv", [*argv[:-1], "0"])
    with pytest.raises(SystemExit):
        fidelity.main()


def test_smg_is_simulated_with_the_load_poll_the_flood_gave_it() -> None:
    """B1: the simulator reads the engines' load as often as SMG did in the flood: the
    ``--load-monitor-interval`` each repetition's ``smg launch`` passed, SMG's default of
    10 s where none was passed, in model seconds at the flood's time scale; repetitions
    that disagree are refused rather than averaged."""
    passed = {"setup": "smg launch --policy cache_aware --load-monitor-interval 2 --sticky"}
    assert fidelity.smg_poll_s([passed, passed], 5.0) == 10.0
    assert fidelity.smg_poll_s([{"setup": "smg launch --policy cache_aware"}], 10.0) == 100.0
    assert fidelity.smg_poll_s([{}], 5.0) == 50.0
    with pytest.raises(ValueError, match="different intervals"):
        fidelity.smg_poll_s([passed, {"setup": "smg launch"}], 5.0)
    for broken in ("smg launch --load-monitor-interval", "smg --load-monitor-interval x"):
        with pytest.raises(ValueError, match="unreadable --load-monitor-interval"):
            fidelity.smg_poll_s([{"setup": broken}], 5.0)


def test_a_coding_flood_is_simulated_with_the_runs_each_repetition_drew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """B1, B10: a coding repetition's runs come from its load generator's plan seed (its
    seed, before --plan-seed existed), which the simulator is given; a coding flood with
    a repetition that recorded neither is refused, and so are --seeds and --seed, which
    do not apply to it."""
    assert fidelity.plan_seed_of({"seed": "coding24router0"}) == "coding24router0"
    assert fidelity.plan_seed_of({"seed": "x", "plan_seed": "coding24rep0"}) == "coding24rep0"
    assert fidelity.plan_seed_of({}) is None
    plan = {**FULL.__dict__, "coding_warmup_s": 10.0, "coding_window_s": 20.0}
    rep = {"seed": "coding2router0", "classes": {}}
    path = tmp_path / "coding.json"
    for reps, extra, why in (
        ([rep, {"classes": {}}], [], "no recorded seed in repetitions of 2/router"),
        ([rep], ["--seeds", "3"], "--seeds and --seed do not apply"),
        ([rep], ["--seed", "4"], "--seeds and --seed do not apply"),
    ):
        path.write_text(json.dumps({"plan": plan, "results": {"coding": {"2": {"router": reps}}}}))
        monkeypatch.setattr(sys, "argv", ["sim_fidelity.py", "--flood", str(path), *extra])
        assert fidelity.main() == 2
        assert why in capsys.readouterr().out


def test_each_coding_repetition_is_simulated_with_its_own_plan_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """B1, B10: the simulator is run once per repetition of a coding flood's arm, given
    that repetition's plan seed (its seed where it recorded none), and the table says
    so; an arm the simulator does not have is neither simulated nor asked for seeds."""
    plan = {**FULL.__dict__, "coding_warmup_s": 10.0, "coding_window_s": 20.0}
    reps = [
        {"seed": "coding2router0", "plan_seed": "coding2rep0", "classes": {}},
        {"seed": "coding2router1", "classes": {}},
    ]
    data = {
        "plan": {**plan, "reps": 2},
        "results": {"coding": {"2": {"router": reps, "luftpause-no-pk": [{"classes": {}}]}}},
        "code": "HEAD",
    }
    path = tmp_path / "coding.json"
    path.write_text(json.dumps(data))
    seen: list[tuple[str, str | None]] = []

    def fake_simulate(config: Any, arm: str) -> dict[str, Any]:
        seen.append((arm, config.plan_seed))
        return {"classes": {}, "requests_by_replica": {"a": 1}}

    monkeypatch.setattr(fidelity, "simulate", fake_simulate)
    monkeypatch.setattr(sys, "argv", ["sim_fidelity.py", "--flood", str(path)])
    assert fidelity.main() == 0
    assert seen == [("router", "coding2rep0"), ("router", "coding2router1")]
    assert "each repetition simulated once, with the runs it drew" in capsys.readouterr().out


def test_an_mcp_flood_is_simulated_as_own_loop_agents_with_the_pace_as_it_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """B1: a flood of sub-agents over MCP is read like an own-loop flood (the same plan
    and figures) and says that the runtime is not modelled; its luftpause arm gets the
    decode pace only where the flood's runtime streamed its turns, so the pace could time
    them (from RUNTIME_STREAMS on); the scheduler's figures, the flood's as it read them
    and the simulator's, are set side by side."""

    def scheduler(cap: float, limit: float | None, held: float) -> dict[str, Any]:
        replicas = {
            name: {"capacity": cap, "batch_limit_from_pace": limit, "in_flight": cap - 1}
            for name in ("engine-a", "engine-b")
        }
        return {"samples": 60, "replicas": replicas, "held": held}

    rep = {
        "classes": {
            cls: {"runs_per_min_closed": 6.0, "run_s": {"p50": 30.0}}
            for cls in ("interactive", "batch")
        },
        "scheduler": scheduler(24.0, 15.0, 7.0),
        "engine_side": {"prefill_share": 0.53, "decode_batch": 15.4},
    }
    plan = {"time_scale": 1.0, "warmup_s": 10.0, "window_s": 60.0, "reps": 1}
    seen: list[str] = []

    def fake_simulate(config: Any, arm: str) -> dict[str, Any]:
        seen.append(arm)
        limit = 16.0 if arm == "luftpause" else None
        return {
            "classes": rep["classes"],
            "requests_by_replica": {"a": 1},
            "scheduler": scheduler(25.0, limit, 9.0),
            "engines": {"prefill_share": 0.52, "decode_batch": 17.1},
        }

    monkeypatch.setattr(fidelity, "simulate", fake_simulate)
    path = tmp_path / "mcp.json"
    for code, arm in (
        (fidelity.RUNTIME_STREAMS, "luftpause"),
        (f"{fidelity.PACE_ON} (working tree clean)", "luftpause-no-pace"),
    ):
        # a flood of both benches: --bench picks the MCP one (own-loop would come first)
        results = {"own": {"3": {"router": [rep]}}, "mcp": {"2": {"luftpause": [rep]}}}
        path.write_text(json.dumps({"plan": plan, "results": results, "code": code}))
        argv = ["sim_fidelity.py", "--flood", str(path), "--bench", "mcp"]
        monkeypatch.setattr(sys, "argv", argv)
        seen.clear()
        assert fidelity.main() == 0
        out = capsys.readouterr().out
        assert seen == [arm]
        assert "plays them as own-loop agents" in out
        assert ("the runtime sent its turns unstreamed" in out) == (arm != "luftpause")
        assert "| 2 | luftpause | interactive | 6.0 | 6.0 | +0 % | 30.0 | 30.0 | +0 % |" in out
        # the scheduler side by side: cap, the pace's batch limit, in flight, held
        sim_limit = "16.0 / 16.0" if arm == "luftpause" else "– / –"
        assert (
            f"| 2 | luftpause | 24.0 / 24.0 | 25.0 / 25.0 | 15.0 / 15.0 | {sim_limit} "
            "| 23.0 / 23.0 | 24.0 / 24.0 | 7.0 | 9.0 |"
        ) in out
        assert "| 2 | luftpause | 53 % | 52 % | 15.4 | 17.1 |" in out


def test_an_own_loop_flood_with_plan_keys_is_simulated_with_each_repetitions_replies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """B1, B10: an own-loop flood from PLAN_KEYS on drew its replies from each
    repetition's plan seed where the arm's plan keys reached the engines (as the engines
    counted them, or, uncounted, through the dataplane or no proxy at all): each such
    repetition is simulated with its plan seed, under each of --seeds seeds, and the
    table says so; an arm whose proxy kept the keys back (the router's drops custom
    headers) is simulated under the seeds alone, and a keyed arm without a recorded plan
    seed is refused. A flood from before is simulated under the seeds alone, and one
    whose commit git cannot place is refused in one line."""
    classes = {
        cls: {"runs_per_min_closed": 6.0, "run_s": {"p50": 30.0}}
        for cls in ("interactive", "batch")
    }

    # the load generator's groups, as a repetition records them: a plan key names its group
    groups = [
        {"name": "crowd", "count": 2, "class": "batch", "caller": "crowd", "kind": "agents",
         "context_chars": 8000, "tool_calls": "3", "max_tokens": 256, "profile": None},
        {"name": "people", "count": 4, "class": "interactive", "caller": "people",
         "kind": "agents", "context_chars": 8000, "tool_calls": "1-3", "max_tokens": 256,
         "profile": None},
    ]  # fmt: skip

    def reps(arm: str, keyed: float | None = None) -> list[dict[str, Any]]:
        side = {} if keyed is None else {"engine_side": {"plan_keyed_share": keyed}}
        return [
            {"classes": classes, "seed": f"own2{arm}{i}", "plan_seed": f"own2rep{i}",
             "groups_config": groups, **side}
            for i in range(2)
        ]  # fmt: skip

    plan = {"time_scale": 1.0, "warmup_s": 10.0, "window_s": 60.0, "reps": 2}
    seen: list[tuple[str, str | None, int]] = []

    simulated_groups: set[tuple[tuple[str, int, str, str], ...]] = set()

    def fake_simulate(config: Any, arm: str) -> dict[str, Any]:
        seen.append((arm, config.plan_seed, config.seed))
        assert all(g.kind == "agents" for g in config.groups)  # sub-agents played as agents
        simulated_groups.add(
            tuple((g.name, g.count, g.cls, str(g.tool_calls)) for g in config.groups)
        )
        return {"classes": classes, "requests_by_replica": {"a": 1}}

    monkeypatch.setattr(fidelity, "simulate", fake_simulate)
    path = tmp_path / "own.json"

    def run(code: str, arms: dict[str, Any], *extra: str) -> tuple[int, str]:
        path.write_text(json.dumps({"plan": plan, "results": {"own": {"2": arms}}, "code": code}))
        monkeypatch.setattr(sys, "argv", ["sim_fidelity.py", "--flood", str(path), *extra])
        seen.clear()
        return fidelity.main(), capsys.readouterr().out

    arms = {"luftpause": reps("luftpause"), "router": reps("router")}
    rc, out = run("HEAD (working tree clean)", arms, "--seeds", "2")
    assert rc == 0
    assert seen == [
        ("luftpause", "own2rep0", 0), ("luftpause", "own2rep0", 1),
        ("luftpause", "own2rep1", 0), ("luftpause", "own2rep1", 1),
        ("router", None, 0), ("router", None, 1),
    ]  # fmt: skip
    assert "each repetition simulated with the tool counts and replies it drew" in out
    assert "router, whose proxy kept the plan keys from the engines: seeds 0–1" in out
    assert "the flood inside the simulations' range on both: 4 of 4." in out
    # every arm of the point runs the flood's own groups, under their names
    assert simulated_groups == {(("crowd", 2, "batch", "3"), ("people", 4, "interactive", "1-3"))}
    # the engines' count decides where there is one
    counted = {"router": reps("router", keyed=1.0), "smg": reps("smg", keyed=0.0)}
    rc, out = run("HEAD", counted)
    assert rc == 0
    assert seen == [("router", "own2rep0", 0), ("router", "own2rep1", 0), ("smg", None, 0)]
    rc, out = run("HEAD", {"luftpause": [reps("luftpause")[0], {"classes": classes}]})
    assert rc == 2 and "no recorded plan seed in repetitions of 2/luftpause" in out
    bare = [{k: v for k, v in rep.items() if k != "groups_config"} for rep in reps("luftpause")]
    rc, out = run("HEAD", {"luftpause": bare})
    assert rc == 2 and "2 batch agents: no repetition recorded its groups" in out
    rc, out = run(fidelity.FIRST_TOKEN_ALONE, arms, "--seeds", "2")
    assert rc == 0 and "seeds 0–1" in out
    assert seen == [("luftpause", None, 0), ("luftpause", None, 1), ("router", None, 0),
                    ("router", None, 1)]  # fmt: skip
    for code, why in (("", "recorded no commit"), ("0123abc", "cannot place")):
        rc, out = run(code, arms)
        assert rc == 2 and why in out and "Traceback" not in out and seen == []
    # sub-agents over MCP: paired from PLAN_MARKERS on (their keys ride in the task),
    # played as own-loop agents of the flood's groups
    groups[:] = [{**g, "kind": "subagents"} for g in groups]
    for code, paired in ((fidelity.PLAN_MARKERS, True), (fidelity.PLAN_KEYS, False)):
        path.write_text(json.dumps(
            {"plan": plan, "results": {"mcp": {"2": {"luftpause": reps("luftpause", 1.0)}}},
             "code": code}
        ))  # fmt: skip
        monkeypatch.setattr(sys, "argv", ["sim_fidelity.py", "--flood", str(path)])
        seen.clear()
        simulated_groups.clear()
        assert fidelity.main() == 0
        capsys.readouterr()
        if paired:
            assert seen == [("luftpause", "own2rep0", 0), ("luftpause", "own2rep1", 0)]
            assert simulated_groups == {
                (("crowd", 2, "batch", "3"), ("people", 4, "interactive", "1-3"))
            }
        else:
            assert seen == [("luftpause", None, 0)]


def test_a_floods_vllm_arms_are_simulated_at_its_time_scale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """B1: sim_fidelity simulates a flood's vLLM router arms, and with the router's clock
    at the flood's time scale (the flood speeds up the engines and tools, not the
    router); other arms keep the model's clock."""
    assert all(fidelity.simulated(a) for a in ("vllm-router", "vllm-prog", "vllm-prog-kv"))
    scales: dict[str, float] = {}

    def simulate(config: Any, arm: str) -> dict[str, Any]:
        scales[arm] = config.vllm_clock_scale
        raise SystemExit(0)  # seen what it was given; the rest is not under test

    monkeypatch.setattr(fidelity, "simulate", simulate)
    data = json.loads(Path("docs/benchmarks/results/2026-12-06-flood-target.json").read_text())
    own = data["results"]["own"]
    flood_file = tmp_path / "json"
    for arm in ("luftpause", "vllm-prog"):
        data["results"] = {"own": {"48": {arm: own["48"][arm]}}}
        flood_file.write_text(json.dumps(data))
        monkeypatch.setattr(sys, "argv", ["sim_fidelity.py", "--flood", str(flood_file)])
        with pytest.raises(SystemExit):
            fidelity.main()
    assert data["plan"]["time_scale"] == 5.0
    assert scales == {"luftpause": 1.0, "vllm-prog": 5.0}
