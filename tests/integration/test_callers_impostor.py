"""B13 end to end: callers bound to keys, against real processes (a fake engine, the
scheduler, a dataplane) and the load generator.

Two callers share the stack: alice, whose key may use the interactive class, and
mallory, whose key may use batch only. A flood where mallory's agents claim the
interactive class and alice's name: every one of mallory's turns runs as mallory's batch
sub-caller ``mallory/alice`` (downgraded, and told so), none of them counts as alice's or
as interactive, and alice's interactive runs all finish. (How alice's latency compares
with and without the impostor is measured, not asserted: ``tools/bench/callers.py``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fullstack import (
    MODEL,
    eventually,
    loadgen_here,
    start_scheduler_and_dataplane,
    write_config,
)

pytestmark = pytest.mark.integration

TOKEN = "impostor-test-service-token"
ALICE = "lp_alice-integration-key-0123456789"
MALLORY = "lp_mallory-integration-key-01234567"
CALLERS = """
[[callers]]
name = "alice"
key_env = "IT_KEY_ALICE"
classes = ["interactive", "batch"]

[[callers]]
name = "mallory"
key_env = "IT_KEY_MALLORY"
"""
MIX = """
[[group]]
count = 2
class = "interactive"
caller = "alice"
name = "alice"
key_env = "IT_KEY_ALICE"

[[group]]
count = 4
class = "interactive"
caller = "alice"
name = "impostor"
key_env = "IT_KEY_MALLORY"
"""


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one series in a Prometheus text page (0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    head = f"{name}{{{want}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(head + " "):
            return float(line.split()[-1])
    return 0.0


async def test_an_impostor_runs_as_its_own_batch_caller(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"LUFTPAUSE_TOKEN": TOKEN, "IT_KEY_ALICE": ALICE, "IT_KEY_MALLORY": MALLORY}
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # (the load generator runs in this process)
    engine = services.start(
        "fake-engine", "--port", "0", "--name", "engine-a", "--time-scale", "20",
        "--log-level", "WARNING", name="engine-a",
    )  # fmt: skip
    tools = services.start("fake-mcp", "--port", "0", "--lookup-delay-s", "0.05", name="mcp")
    config = write_config(tmp_path / "stack.toml", {"engine-a": engine.urls["http"]}, CALLERS)
    sched, dp = start_scheduler_and_dataplane(services, config, env, env)
    mix = tmp_path / "mix.toml"
    mix.write_text(MIX)
    rc, stdout, result = await loadgen_here(
        tmp_path,
        "--target", f"{dp.urls['http']}/v1", "--tools-url", f"{tools.urls['http']}/mcp",
        "--mix", str(mix), "--model", MODEL, "--duration-s", "6", "--context-chars", "1000",
        "--tool-calls", "1-2", "--max-tokens", "16", "--quiet", "--token", TOKEN,
    )  # fmt: skip
    assert rc == 0, stdout
    assert result["error_count"] == 0

    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(timeout=10, headers=auth) as c:

        async def settled() -> bool:
            """Every turn the load left behind has ended (a client that left mid-turn is
            noticed by the dataplane a moment after the load generator returns)."""
            text = (await c.get(f"{dp.urls['http']}/metrics")).text
            busy = [
                line
                for line in text.splitlines()
                if line.startswith(
                    ("luftpause_dataplane_turns_in_flight{", "luftpause_dataplane_turns_held{")
                )
                and float(line.split()[-1]) > 0
            ]
            return not busy

        await eventually(settled, what="the dataplane's turns to end")
        dp_metrics = (await c.get(f"{dp.urls['http']}/metrics")).text
        sched_metrics = (await c.get(f"{sched.urls['http']}/metrics")).text
        status = (await c.get(f"{sched.urls['http']}/status")).json()
    # Every impostor turn asked for interactive and was downgraded at the dataplane ...
    downgraded = metric(
        dp_metrics, "luftpause_dataplane_class_denied_total", caller="mallory", action="downgraded"
    )
    assert downgraded > 0
    assert (
        metric(
            dp_metrics,
            "luftpause_dataplane_class_denied_total",
            caller="alice",
            action="downgraded",
        )
        == 0
    )
    # ... and ran, and was charged, as mallory's sub-caller "mallory/alice"; alice's tokens
    # are her own turns' only.
    mallory_tokens = metric(
        sched_metrics, "luftpause_scheduler_caller_tokens_total", caller="mallory/alice"
    )
    assert mallory_tokens > 0
    alice_tokens = metric(sched_metrics, "luftpause_scheduler_caller_tokens_total", caller="alice")
    assert alice_tokens > 0
    assert not any(
        line.startswith('luftpause_scheduler_caller_tokens_total{caller="alice/')
        for line in sched_metrics.splitlines()
    )
    names = {c["name"] for c in status["callers"]}
    assert names == {"alice", "mallory"}

    # The turns the dataplane served as batch were mallory's (no other caller sends batch):
    # at most the turns it downgraded (a downgraded turn may still end abandoned as the
    # load stops; a turn refused before its class is read counts as batch, so only
    # served outcomes are counted); and it served alice's as interactive.
    def served(cls: str) -> float:
        return sum(
            float(line.split()[-1])
            for line in dp_metrics.splitlines()
            if line.startswith("luftpause_dataplane_turns_total{")
            and f'service_class="{cls}"' in line
            and ('outcome="finished"' in line or 'outcome="paused_on_tool"' in line)
        )

    assert 0 < served("batch") <= downgraded
    assert served("interactive") > 0
