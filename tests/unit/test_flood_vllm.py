"""tools/bench/flood.py's vLLM router arms (H4): their configurations, command lines, the
engines' KV pool they are given, the arms the own-loop floods build, ``--arms`` and the
report's record of them."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tools.bench.arms.plan import Arm, Plan, Stack
from tools.bench.arms.schedule import own_arms, select_arms
from tools.bench.arms.vllm import (
    kv_pool_tokens,
    vllm_arms_config,
    vllm_router_command,
    vllm_router_flags,
)
from tools.bench.flood_report import NO_VERDICT, report, vllm_router_lines, vs_vllm_text

PLAN = Plan(
    time_scale=5.0, reps=1, loads=(24,), mcp_loads=(24,), warmup_s=1, window_s=1,
    light_window_s=1, routing_window_s=1, floor_runs=1, vllm_router=True,
)  # fmt: skip


def test_kv_pool_is_the_smallest_engines() -> None:
    assert kv_pool_tokens([{"max_total_num_tokens": 55_000}]) == 55_000
    infos = [{"max_total_num_tokens": 60_000}, {"max_total_num_tokens": 55_000}]
    assert kv_pool_tokens(infos) == 55_000
    for bad in ([], [{}], [{"max_total_num_tokens": 0}], [{"max_total_num_tokens": "55000"}],
                [{"max_total_num_tokens": True}]):  # fmt: skip
        with pytest.raises(ValueError):
            kv_pool_tokens(bad)


def test_vllm_arms_config_and_flags() -> None:
    """Plain, program scheduling with its defaults (the load generator names programs in
    the body, its default key) and the same given the KV pool as each engine's token
    capacity."""
    arms = vllm_arms_config(55_000)
    assert list(arms) == ["vllm-router", "vllm-prog", "vllm-prog-kv"]
    assert arms["vllm-router"] is None and vllm_router_flags(None) == []
    assert arms["vllm-prog"] == {}
    assert vllm_router_flags({}) == [
        "--enable-program-scheduling",
        "--program-scheduling-config-json",
        "{}",
    ]
    assert arms["vllm-prog-kv"] == {"token_capacity_per_target": 55_000}
    flags = vllm_router_flags(arms["vllm-prog-kv"])
    assert flags[0] == "--enable-program-scheduling"
    assert flags[1] == "--program-scheduling-config-json"
    assert json.loads(flags[2]) == arms["vllm-prog-kv"]


def test_vllm_router_command_is_a_shell_line_with_the_config() -> None:
    flags = vllm_router_flags({"token_capacity_per_target": 7})
    argv = shlex.split(vllm_router_command(flags))
    assert argv[0] == "vllm-router"
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert "--prometheus-port" in argv and "--enable-program-scheduling" in argv
    config = argv[argv.index("--program-scheduling-config-json") + 1]
    assert json.loads(config) == {"token_capacity_per_target": 7}
    plain = shlex.split(vllm_router_command([]))
    assert "--enable-program-scheduling" not in plain and "--worker-urls" in plain


def fake_stack(tmp: Path, vllm: bool) -> Any:
    """A stack with routers as URLs only: enough for ``own_arms``."""
    s = Stack(tmp, PLAN)
    s.engines = ["http://e1", "http://e2"]
    s.tools_url = "http://tools/mcp"
    s.dataplane = "http://dp"
    s.routers = {"cache_aware": SimpleNamespace(url="http://router", metrics_url="")}
    s.routers["smg"] = SimpleNamespace(url="http://smg", metrics_url="http://smg-metrics")
    if vllm:
        s.vllm_engines = ["http://v1", "http://v2"]
        for name, config in vllm_arms_config(55_000).items():
            s.routers[name] = SimpleNamespace(url=f"http://{name}", metrics_url="")
            s.router_info[name] = {"router": "vllm-router", "program_scheduling": config}
    return s


def test_own_loop_arms_gain_the_vllm_router_arms(tmp_path: Path) -> None:
    """With the vLLM routers started, the own-loop point gains one arm per router, on the
    routers' own engines, naming each run's program by the run ID header and reading the
    diagnostics of those with program scheduling (the plain one has none: 404); every
    other arm is as it was."""
    before = own_arms(fake_stack(tmp_path, vllm=False), "own", 24, 8000)
    after = own_arms(fake_stack(tmp_path, vllm=True), "own", 24, 8000)
    assert [a.name for a in after] == [
        *(a.name for a in before), "vllm-router", "vllm-prog", "vllm-prog-kv",
    ]  # fmt: skip
    assert [vars(a) for a in after[: len(before)]] == [vars(a) for a in before]
    assert all(not a.engines and not a.diagnostics for a in before)
    for arm in after[len(before) :]:
        assert arm.engines == ["http://v1", "http://v2"]
        programs = arm.name != "vllm-router"
        assert arm.diagnostics == (f"http://{arm.name}/scheduling/diagnostics" if programs else "")
        argv = arm.argv
        assert argv[argv.index("--target") + 1] == f"http://{arm.name}"
        assert argv[argv.index("--program-context") + 1] == "xargs"
        assert "--no-class-headers" in argv and "--priority" not in argv


def test_select_arms(tmp_path: Path) -> None:
    stack = fake_stack(tmp_path, vllm=True)
    schedule = [
        ("own", 24, own_arms(stack, "own", 24, 8000)),
        ("light", 24, [Arm("light", "router", 24, [])]),
    ]
    assert select_arms(schedule, ()) is schedule
    kept = select_arms(schedule, ("luftpause", "vllm-prog"))
    assert [(b, n, [a.name for a in arms]) for b, n, arms in kept] == [
        ("own", 24, ["luftpause", "vllm-prog"])
    ]  # the light point has neither: dropped, not left empty
    with pytest.raises(ValueError, match="no arm named vllm-nope"):
        select_arms(schedule, ("luftpause", "vllm-nope"))


def test_report_records_the_vllm_router_arms() -> None:
    """The report names vLLM's router's version, its engines and every arm's command
    line; SMG's paragraph stays SMG's."""
    record = {
        "router": "vllm-router",
        "version": "0.1.17",
        "command": vllm_router_command(vllm_router_flags({"a": 1})),
        "kv_pool_tokens": 55_000,
        "loadgen_program_flags": ["--program-context", "xargs"],
    }
    lines = vllm_router_lines({"vllm-prog": record})
    assert "`vllm-router` 0.1.17" in lines[0] and "--metrics vllm" in lines[0]
    assert "`token_capacity_per_target` 55000 (" in lines[0]
    assert "`--program-context xargs`" in lines[0]
    assert lines[1] == f"  - `vllm-prog`: `{record['command']}`"
    assert vllm_router_lines({}) == []

    def result(**extra: Any) -> dict[str, Any]:
        return {"classes": {}, "load_avg": [1.0], "rep": 0, **extra}

    results = {"own": {24: {
        "vllm-prog": [result(setup=record["command"], router=record)],
        "smg": [result(setup="smg launch ...")],
    }}}  # fmt: skip
    text = report(PLAN, "flood.py", results, {}, "now", 1.0, (0.0, 0.0, 0.0))
    # Without the luftpause and router arms (--arms), the point has no verdict.
    assert f"- own 24: {NO_VERDICT}" in text
    assert "  - `vllm-prog`: `vllm-router --host" in text
    assert "  - `smg`: `smg launch ...`" in text
    assert "  - `vllm-prog`: `vllm-router --host" in text.split("- vLLM router arms")[1]
    assert "vllm-prog" not in text.split("- vLLM router arms")[0]


def test_luftpause_against_each_vllm_router_arm() -> None:
    """The summary compares luftpause with each vLLM router arm per repetition (outside
    the verdict), and with no other arm."""

    def result(rep: int, inter: float, batch: float, router: str = "") -> dict[str, Any]:
        classes = {
            "interactive": {"runs_per_min": inter, "runs_per_min_closed": inter},
            "batch": {"runs_per_min": batch, "runs_per_min_closed": batch},
        }
        return {
            "rep": rep,
            "classes": classes,
            **({"router": {"router": router}} if router else {}),
        }

    by_arm = {
        "luftpause": [result(0, 20.0, 100.0), result(1, 22.0, 110.0)],
        "router": [result(0, 10.0, 100.0), result(1, 11.0, 110.0)],
        "vllm-prog": [result(0, 10.0, 200.0, "vllm-router"), result(1, 11.0, 220.0, "vllm-router")],
    }
    text = vs_vllm_text(by_arm)
    assert text == (
        "; against vllm-prog (not part of the verdict): interactive 2.00× ± 0.00, batch -50 % ± 0"
    )
    assert vs_vllm_text({"vllm-prog": by_arm["vllm-prog"]}) == ""
