"""B1: the simulator and the real stack, at one saturated load point, order the arms alike.

One replica, 2 interactive and 40 batch own-loop agents, the flood's run shape
(8,000-character contexts, 3 tool calls). Two arms:

* ``luftpause``: through the scheduler and the dataplane (class headers, the
  engine told each class's priority, as ``tools/bench/flood.py`` configures it);
* ``router``: straight to an engine with no admission and no classes (with one
  replica, what the simulator's router arm is).

The simulator runs the point in virtual time; the real stack runs it on fake
engines 20× faster than real time, with the load generator. What is compared is
only which arm comes out ahead on each figure, never a time: on this point the
simulator puts them far apart (interactive run p50 about 29 s against 76 s of
model time, an interactive turn's engine queue 0.03 s against 5 s), so noise on
a shared machine cannot reverse them, while a simulator that drifted from the
stack would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fullstack import MODEL, loadgen_here, start_scheduler_and_dataplane

from luftpause.measure.mix import Group
from luftpause.scheduler.core import Params
from luftpause.sim.run import SimConfig, simulate

pytestmark = pytest.mark.integration

SCALE = 20.0
INTERACTIVE, BATCH = 2, 40
WARMUP_S, WINDOW_S = 30.0, 120.0  # model seconds, as in the simulator
ARMS = ("luftpause", "router")

# (figure, class, key path into the class summary); lower is better for each.
FIGURES = (
    ("run p50", "interactive", ("run_s", "p50")),
    ("engine queue per turn", "interactive", ("turn", "queued_s")),
)


def figure(result: dict[str, Any], cls: str, path: tuple[str, ...]) -> float:
    value: Any = result["classes"][cls]
    for key in path:
        value = value[key]
    assert value is not None, f"{cls} {'.'.join(path)} missing from {result['classes'][cls]}"
    return float(value)


def orderings(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    """For each figure, the arm with the lower (better) value."""
    return {
        name: min(ARMS, key=lambda arm: figure(results[arm], cls, path))
        for name, cls, path in FIGURES
    }


def simulated() -> dict[str, dict[str, Any]]:
    config = SimConfig(
        groups=(
            Group("people", INTERACTIVE, "interactive", "people"),
            Group("crowd", BATCH, "batch", "crowd"),
        ),
        replicas=1,
        duration_s=WINDOW_S,
        warmup_s=WARMUP_S,
        probe_s=2.0,
    )
    return {arm: simulate(config, arm) for arm in ARMS}


async def test_the_simulator_and_the_stack_order_the_arms_alike(
    module_services: Any, tmp_path: Path
) -> None:
    """B1 (fidelity), S2, S4: at a saturated point the simulator and the real-time stack
    on the same engine model agree on which arm gives interactive runs the shorter run
    time and the shorter engine queue (orderings only, no timings asserted)."""
    sim = simulated()
    engine_args = (
        "--port", "0", "--log-level", "WARNING", "--time-scale", f"{SCALE:g}",
        "--priority-scheduling", "--chunk-tokens", "8", "--tool-results", "3",
    )  # fmt: skip
    ours = module_services.start("fake-engine", "--name", "engine-a", *engine_args, name="fe-a")
    direct = module_services.start("fake-engine", "--name", "engine-d", *engine_args, name="fe-d")
    tools = module_services.start(
        "fake-mcp", "--port", "0", "--time-scale", f"{SCALE:g}", "--log-level", "WARNING",
        name="fidelity-tools",
    )  # fmt: skip
    config = tmp_path / "stack.toml"
    config.write_text(
        f"[scheduler]\nprobe_period_s = {2.0 / SCALE:g}\n"
        # the decode pace's target, like the probe period, in the engines' faster time
        f"interactive_pace_ms = {(Params().interactive_pace_s or 0) * 1000 / SCALE:g}\n"
        "[dataplane]\nreport_reconnect_s = 0.2\n"
        f'[[endpoints]]\nname = "engine-a"\nurl = "{ours.urls["http"]}"\n'
        f'models = ["{MODEL}"]\nmetrics = "sglang"\n'
        "class_priority = { interactive = 10, batch = 0 }\n"
    )
    _, dataplane = start_scheduler_and_dataplane(module_services, config)
    common = (
        "--tools-url", f"{tools.urls['http']}/mcp", "--context-chars", "8000",
        "--tool-calls", "3", "--max-tokens", "256",
        "--group", f"{INTERACTIVE}:interactive:people", "--group", f"{BATCH}:batch:crowd",
        "--warmup-s", f"{WARMUP_S / SCALE:g}", "--duration-s", f"{WINDOW_S / SCALE:g}",
        "--quiet",
    )  # fmt: skip
    targets = {
        "luftpause": ("--target", f"{dataplane.urls['http']}/v1"),
        "router": ("--target", f"{direct.urls['http']}/v1", "--no-class-headers"),
    }
    real: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        out = tmp_path / arm
        out.mkdir()
        rc, stdout, result = await loadgen_here(out, *targets[arm], *common)
        assert rc == 0, stdout
        assert result["error_count"] == 0, result["errors"]
        real[arm] = result

    expected = {name: "luftpause" for name, _, _ in FIGURES}
    assert orderings(sim) == expected, "the simulator no longer shows luftpause ahead"
    assert orderings(real) == orderings(sim), {
        arm: {name: figure(real[arm], cls, path) for name, cls, path in FIGURES} for arm in ARMS
    }
