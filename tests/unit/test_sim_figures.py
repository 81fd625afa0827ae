"""The simulator's figures for a few small seeded runs (B1, H1), pinned.

``DIGESTS`` are of each run's whole report (``simulate``'s, as ``luftpause sim --json``
writes it) less its wall-time fields, recorded before the engine model was made cheaper
per turn (issue #42): the faster engine model, pure or compiled (``make
test-compiled``), is shown to give exactly the figures the straightforward one gave.
A change of rule (in the engine model, the scheduling core or the simulator) changes
them; then check the change is intended and record the printed digests.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from luftpause.fakes.engine.model import EngineParams
from luftpause.measure.mix import Group
from luftpause.measure.workload import PROFILES
from luftpause.sim.run import SimConfig, simulate

MIXED = (Group("chat", 2, "interactive", "chat"), Group("crowd", 40, "batch", "crowd"))
CODING = (
    Group("people", 2, "interactive", "people", profile="coding-agent"),
    Group("crowd", 6, "batch", "crowd", profile="coding-agent"),
)
AGENT = PROFILES["coding-agent"]
CASES = [
    # (a pool small enough to evict, retract and crowd kept prefixes out)
    pytest.param(
        "luftpause",
        MIXED,
        EngineParams(priority_scheduling=True, kv_tokens=12_000),
        120.0,
        "4f74c5bb36cf58408de0030d9565c72c77945127f354dba8145d45d9a2332d67",
        id="luftpause",
    ),
    pytest.param(
        "luftpause-retain",
        MIXED,
        EngineParams(priority_scheduling=True, kv_tokens=12_000),
        120.0,
        "0cddf51e8785693bc1040b8e1383aac0fb8c49c90dd116fc9fdaea294efa0e89",
        id="retain",
    ),
    pytest.param(
        "smg-cap8",
        MIXED,
        EngineParams(kv_tokens=9_000),
        120.0,
        "eba701f29003863369d992c7c76d855eb76b8520c44e582ee46855a885857016",
        id="smg",
    ),
    pytest.param(
        "luftpause",
        CODING,
        EngineParams(
            priority_scheduling=True, context_length=131_072, kv_tokens=400_000, chunk_tokens=8192
        ),
        600.0,
        "5667f95bf56177a33cb9c1a054863d39d244a88157a14b908f92352a1fad5090",
        id="coding",
    ),
]


def figures(arm: str, groups: tuple[Group, ...], engine: EngineParams, duration: float) -> str:
    config = SimConfig(
        profiles={AGENT.name: replace(AGENT, context_cap=50_000)},
        groups=groups,
        replicas=2,
        duration_s=duration,
        warmup_s=10.0,
        seed=3,
        engine=engine,
    )
    report = simulate(config, arm)
    del report["wall_s"], report["speedup"]
    return json.dumps(report, sort_keys=True)


@pytest.mark.parametrize(("arm", "groups", "engine", "duration", "expected"), CASES)
def test_small_seeded_runs_give_the_recorded_figures(
    arm: str, groups: tuple[Group, ...], engine: EngineParams, duration: float, expected: str
) -> None:
    """B1, H1: a seeded run's report, less its wall time, is the recorded one."""
    text = figures(arm, groups, engine, duration)
    report = json.loads(text)
    assert report["turns"] > 100 and report["error_count"] == 0
    got = hashlib.sha256(text.encode()).hexdigest()
    print(got)
    assert got == expected
