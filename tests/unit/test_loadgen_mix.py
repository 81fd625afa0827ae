"""H3: groups for the load generator - --group strings, mix files, flags."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest

from luftpause.fakes.engine.script import plan_key_in
from luftpause.loadgen.main import add_arguments, parse_priority
from luftpause.loadgen.spawn import SpawnOptions, spawn_args
from luftpause.measure import content
from luftpause.measure.cli import build_groups
from luftpause.measure.mix import (
    Defaults,
    Group,
    MixError,
    ToolCalls,
    load_mix,
    parse_group,
    parse_mix,
)
from luftpause.measure.workload import plan_key


def args_of(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_parse_group_forms() -> None:
    """H3: a group is reported under the name its user gave it (its caller), else
    ``<class>-<index>``."""
    g = parse_group("48:batch:crowd", 0)
    assert (g.name, g.count, g.cls, g.caller, g.kind) == ("crowd", 48, "batch", "crowd", "agents")
    g = parse_group("4:interactive", 1, Defaults(context_chars=2000))
    assert g.caller == g.name == "interactive-1" and g.context_chars == 2000
    g = parse_group("2:interactive:me:subagents", 2)
    assert g.kind == "subagents"
    for bad in ("48", "x:batch", "4:gold", "0:batch", "4:batch:me:robots", "1:batch:a:b:c"):
        with pytest.raises(MixError):
            parse_group(bad, 0)


def test_tool_calls_fixed_and_range() -> None:
    assert ToolCalls.parse("3") == ToolCalls(3, 3)
    assert ToolCalls.parse(2) == ToolCalls(2, 2)
    r = ToolCalls.parse("1-3")
    picks = {r.pick(i) for i in range(200)}
    assert picks == {1, 2, 3}
    assert r.pick(7) == r.pick(7)
    for bad in ("3-1", "-1", "a", "1-2-3"):
        with pytest.raises(MixError):
            ToolCalls.parse(bad)


def test_mix_file(tmp_path: Path) -> None:
    path = tmp_path / "mix.toml"
    path.write_text(
        '[[group]]\ncount = 48\nclass = "batch"\ncaller = "crowd"\n'
        '[[group]]\ncount = 4\nclass = "interactive"\ncontext_chars = 2000\ntool_calls = "1-3"\n'
        '[[group]]\ncount = 2\nclass = "batch"\nname = "crowd"\nkind = "subagents"\n'
        "start_s = 90.5\n"
    )
    groups = load_mix(path, Defaults(max_tokens=64))
    assert [(g.name, g.count, g.cls) for g in groups] == [
        ("crowd", 48, "batch"),  # named by its caller
        ("interactive-1", 4, "interactive"),
        ("crowd-2", 2, "batch"),  # the same name again: told apart
    ]
    assert groups[0].caller == "crowd" and groups[0].max_tokens == 64
    assert groups[1].context_chars == 2000 and groups[1].tool_calls == ToolCalls(1, 3)
    assert groups[2].kind == "subagents"
    assert groups[2].start_s == 90.5 and groups[0].start_s == 0.0  # a step of load


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"group": []},
        {"group": [{"class": "batch"}]},
        {"group": [{"count": 1, "class": "batch", "colour": "red"}]},
        {"group": [{"count": 1, "class": "batch"}], "duration": 3},
        {"group": [{"count": "many", "class": "batch"}]},
        {"group": [{"count": 1, "class": "batch", "start_s": -1}]},
        {"group": [{"count": 1, "class": "batch", "start_s": "soon"}]},
        {"group": [{"count": 1, "class": "batch", "start_s": float("nan")}]},
    ],
)
def test_bad_mix_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(MixError):
        parse_mix(data)


def test_bad_mix_file(tmp_path: Path) -> None:
    with pytest.raises(MixError, match="cannot read"):
        load_mix(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[[group]\n")
    with pytest.raises(MixError, match="not valid TOML"):
        load_mix(tmp_path / "bad.toml")


def test_flags_build_groups_with_unique_names() -> None:
    groups = build_groups(
        args_of(
            "--agents", "3", "--class", "interactive", "--caller", "me",
            "--group", "5:batch:crowd", "--group", "5:batch:crowd", "--context-chars", "2000",
        )
    )  # fmt: skip
    assert [g.name for g in groups] == ["crowd", "crowd-2", "me"]
    assert groups[2].caller == "me" and groups[2].count == 3
    assert all(g.context_chars == 2000 for g in groups)


def test_priority_flag() -> None:
    assert parse_priority("interactive=10,batch=0") == {"interactive": 10, "batch": 0}
    for bad in ("gold=1", "interactive", "interactive=x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_priority(bad)


def test_prompts_have_the_asked_size_and_share_only_the_preamble() -> None:
    a = content.messages(8000, "run-a")
    b = content.messages(8000, "run-b")
    assert sum(len(m["content"]) for m in a) == 8000
    assert a[0] == b[0]  # the shared preamble
    assert a[1]["content"] != b[1]["content"]
    assert content.messages(8000, "run-a") == a  # deterministic
    small = content.messages(2000, "x")
    assert sum(len(m["content"]) for m in small) == 2000


def test_a_plan_key_is_written_into_the_task_at_the_same_size() -> None:
    """B10: a run's plan key goes into its task as the fake engine reads it back (own-loop
    agents' first user message, and a sub-agent's spawn task); the prompt keeps its size."""
    keyed = content.messages(8000, "run-a", "rep0-crowd-3-7")
    assert sum(len(m["content"]) for m in keyed) == 8000
    assert plan_key_in(keyed) == "rep0-crowd-3-7"
    assert plan_key_in(content.messages(8000, "run-a")) is None
    group = Group("crowd", 2, "batch", "crowd", kind="subagents")
    args = spawn_args(group, "run-a", SpawnOptions(), "rep0-crowd-3-7")
    assert plan_key_in([{"role": "user", "content": args["task"]}]) == "rep0-crowd-3-7"
    assert len(args["task"]) == len(spawn_args(group, "run-a", SpawnOptions())["task"])
    # any plan seed and group name make a key the marker carries, the same every time
    for seed, name in (("my seed", "night shift"), ("x]y", "g"), ("s" * 300, "g")):
        key = plan_key(seed, name, 2, 5)
        assert key == plan_key(seed, name, 2, 5) and len(key) <= 256
        assert plan_key_in([{"role": "user", "content": content.task(8000, "r", key)}]) == key
    assert plan_key("s" * 300, "g", 2, 5) != plan_key("s" * 300, "g", 2, 6)
    assert plan_key("rep0", "crowd", 3, 7) == "rep0-crowd-3-7"


def test_filler_draws_the_words_random_choice_draws() -> None:
    """H3: the filler's inlined draw gives the words ``random.Random(seed).choice`` gives,
    so every run's text (and every seeded simulation) is what it was before."""

    def by_choice(chars: int, seed: str) -> str:
        rng = random.Random(seed)
        parts: list[str] = []
        while len(" ".join(parts)) < chars:
            parts.append(rng.choice(content._WORDS))
        return " ".join(parts)[:chars]

    for chars in (0, 1, 5, 37, 400, 6000):
        for seed in ("preamble", "run-a", "7"):
            assert content.filler(chars, seed) == by_choice(chars, seed)
            assert len(content.filler(chars, seed)) == max(chars, 0)


async def test_ramp_spreads_a_groups_first_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """H3: --ramp-s starts slot i of N after i/N of the ramp; without it, all at once."""
    import asyncio

    from luftpause.loadgen import main as loadgen_main
    from luftpause.measure.stats import RunRecord

    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(delay: float) -> None:
        delays.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(loadgen_main.asyncio, "sleep", fake_sleep)
    group = parse_group("4:batch", 0)
    started: list[str] = []

    async def once(key: str, number: int) -> RunRecord:
        started.append(key)
        raise asyncio.CancelledError  # one run per slot is enough

    for ramp in (2.0, 0.0):
        delays.clear()
        started.clear()
        rec = loadgen_main.Recorder()
        tasks = [
            asyncio.create_task(loadgen_main._closed_loop(rec, group, i, once, "n", ramp))
            for i in range(4)
        ]
        await asyncio.gather(*tasks, return_exceptions=True)
        assert sorted(delays) == ([0.0, 0.5, 1.0, 1.5] if ramp else [])
        assert sorted(started) == [f"n-{group.name}-{i}-0" for i in range(4)]
    assert args_of("--agents", "1").ramp_s == 0.0
    with pytest.raises(SystemExit):
        args_of("--agents", "1", "--ramp-s", "-1")


def test_defaults_are_the_local_stack() -> None:
    """H3: without --target and --runtime the load goes to the stack `luftpause up` starts."""
    args = args_of("--agents", "1")
    assert args.target == "http://127.0.0.1:8080/v1"
    assert args.runtime == "http://127.0.0.1:7000/mcp"


def test_a_group_carries_its_callers_key_from_the_environment() -> None:
    """B13: ``key_env`` names the variable with a caller's key; the group's turns carry it
    as their bearer (instead of --token), it never shows in the group's repr, and an
    unset variable is refused naming it."""
    from luftpause.loadgen.agents import AgentOptions, run_headers

    data = {
        "group": [
            {"count": 2, "class": "batch", "caller": "mallory", "key_env": "K_M"},
            {"count": 1, "class": "interactive", "caller": "alice"},
        ]
    }
    keyed, plain = parse_mix(data, environ={"K_M": "lp_mallory-0123456789abcdef"})
    assert keyed.key == "lp_mallory-0123456789abcdef" and plain.key is None
    assert "lp_mallory" not in repr(keyed)
    options = AgentOptions(model="m", token="service-token")
    headers = run_headers(keyed, "run-1", 2, options)
    assert headers["Authorization"] == "Bearer lp_mallory-0123456789abcdef"
    assert "Authorization" not in run_headers(plain, "run-2", 2, options)
    with pytest.raises(MixError, match="key_env names K_M, which is not set"):
        parse_mix(data, environ={})
