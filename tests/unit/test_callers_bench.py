"""tools/bench/callers.py's pure parts (B13, H3): each arm's mix, what the services'
metrics say the turns ran as, an arm's figures from the load generator's result, and the
table. No timing is asserted: the bench measures, these check its arithmetic."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from luftpause.dataplane.metrics import Metrics
from luftpause.measure.mix import parse_mix
from luftpause.measure.stats import EndedTurn, ErrorRecord, RunRecord, TurnRecord, summarise
from tools.bench import callers

ENV = {callers.ALICE_ENV: "lp_alice-test-key", callers.MALLORY_ENV: "lp_mallory-test-key"}


def groups(arm: str) -> dict[str, Any]:
    parsed = parse_mix(tomllib.loads(callers.mix_toml(arm, 4, 24)), environ=ENV)
    return {g.name: g for g in parsed}


def test_each_arm_mixes_alice_with_the_impostor_it_names() -> None:
    """B13: alone is alice's 4 interactive agents on her key; the impostor arms add 24
    of mallory's claiming interactive and alice's name, on mallory's key or (shared
    token) on no key, alice's agents too; the honest arm's are batch under their own name."""
    alone = groups("alone")
    assert list(alone) == ["alice"]
    assert (alone["alice"].count, alone["alice"].cls, alone["alice"].caller) == (
        4, "interactive", "alice",
    )  # fmt: skip
    assert alone["alice"].key == "lp_alice-test-key"

    keys = groups("impostor-keys")
    m = keys["mallory"]
    assert (m.count, m.cls, m.caller, m.key) == (24, "interactive", "alice", "lp_mallory-test-key")
    assert keys["alice"].key == "lp_alice-test-key"

    token = groups("impostor-token")
    assert token["mallory"].key is None and token["alice"].key is None  # --token for all
    assert (token["mallory"].cls, token["mallory"].caller) == ("interactive", "alice")

    honest = groups("honest-batch-keys")
    m = honest["mallory"]
    assert (m.cls, m.caller, m.key) == ("batch", "mallory", "lp_mallory-test-key")

    with pytest.raises(ValueError, match="unknown arm"):
        callers.mix_toml("nobody", 4, 24)


SCHEDULER_METRICS = """\
# HELP luftpause_scheduler_caller_tokens_total Prompt + completion tokens
# TYPE luftpause_scheduler_caller_tokens_total counter
luftpause_scheduler_caller_tokens_total{caller="alice"} 1500.0
luftpause_scheduler_caller_tokens_total{caller="mallory"} 0.0
luftpause_scheduler_caller_tokens_total{caller="mallory/alice"} 2.5e+06
# HELP luftpause_scheduler_admissions_total Turns admitted
# TYPE luftpause_scheduler_admissions_total counter
luftpause_scheduler_admissions_total{replica="engine-a",service_class="interactive"} 7.0
luftpause_scheduler_admissions_total{replica="engine-b",service_class="interactive"} 3.0
luftpause_scheduler_admissions_total{replica="engine-a",service_class="batch"} 40.0
"""


def dataplane_metrics() -> str:
    """A page rendered by the dataplane's own metrics: alice's 10 interactive turns (one
    left mid-turn), mallory's 40 downgraded to batch and served."""
    m = Metrics()
    for _ in range(7):
        m.turns_of("interactive", "paused_on_tool").inc()
    for _ in range(2):
        m.turns_of("interactive", "finished").inc()
    m.turns_of("interactive", "client_left").inc()
    for _ in range(40):
        m.turns_of("batch", "finished").inc()
        m.class_denied("mallory", "downgraded").inc()
    return m.render()[0].decode()


def test_ran_as_reads_served_classes_denials_and_tokens_by_caller() -> None:
    """B13: from the dataplane's and the scheduler's pages, the turns by the class they
    ran as (served: finished or paused on a tool call), the denials by caller and action,
    the admissions by class over every replica, the tokens by caller label."""
    out = callers.ran_as(dataplane_metrics(), SCHEDULER_METRICS)
    assert out["served"] == {"interactive": 9.0, "batch": 40.0}
    assert out["dataplane_turns"]["interactive"]["client_left"] == 1.0
    assert out["class_denied"] == {"mallory": {"downgraded": 40.0}}
    assert out["admissions"] == {"interactive": 10.0, "batch": 40.0}
    assert out["caller_tokens"] == {"alice": 1500.0, "mallory": 0.0, "mallory/alice": 2.5e6}
    assert callers.ran_as_text(out) == (
        "9 / 40", "mallory downgraded 40", "alice 1.5k, mallory/alice 2.5M",
    )  # fmt: skip
    # Pages without the series (no [[callers]], nothing ran): empty, not an error.
    empty = callers.ran_as("", "")
    assert empty["served"] == {} and empty["caller_tokens"] == {}
    assert callers.ran_as_text(empty) == ("0 / 0", "0", "-")
    assert callers.ran_as_text({"error": "ConnectError()"}) == ("unread",) * 3


def loadgen_result(alice_walls: list[float], mallory: bool = True) -> dict[str, Any]:
    """The load generator's summary of a 60 s window: alice's turns with these wall
    times and one run of hers; mallory's turns, 2 s each, and one failed run."""
    turns = [
        EndedTurn("alice", "interactive", 10.0 + i, TurnRecord(w))
        for i, w in enumerate(alice_walls)
    ]
    groups = [("alice", "interactive")]
    if mallory:
        turns += [EndedTurn("mallory", "interactive", 20.0, TurnRecord(2.0))] * 5
        groups.append(("mallory", "interactive"))
    run = RunRecord(
        "alice", "interactive", "agent", 5.0, 15.0, 3, 2,
        turn_records=[TurnRecord(1.0, held_s=0.25), TurnRecord(1.0, held_s=0.75)],
    )  # fmt: skip
    errors = [ErrorRecord("mallory", "interactive", "http_500", 30.0, "boom")] if mallory else []
    out = summarise([run], errors, (0.0, 60.0), groups, turns=turns)
    out["load_avg"] = [1.5, 1.2, 1.0]
    return out


def test_figures_and_the_table_in_model_time() -> None:
    """H3: alice's p50/p90 turn time, held time and run time are scaled to model time;
    mallory's turns are counted apart from hers although both claim interactive; the
    table has a row per arm and the ratio to alone is per repetition."""
    scale = 5.0
    alone = callers.figures("alone", 0, loadgen_result([0.1, 0.2, 0.3], mallory=False), scale)
    assert alone["alice_turns"] == 3
    assert alone["alice_turn_p50_s"] == pytest.approx(1.0)
    assert alone["alice_turn_p90_s"] == pytest.approx(1.4)
    assert alone["alice_held_s"] == pytest.approx(2.5)  # 0.5 s × 5
    assert alone["alice_runs"] == 1 and alone["alice_run_p50_s"] == pytest.approx(50.0)
    assert alone["mallory_turns"] is None and alone["errors"] == {"alice": 0}
    token = callers.figures("impostor-token", 0, loadgen_result([0.3, 0.4, 0.5]), scale)
    assert token["alice_turn_p50_s"] == pytest.approx(2.0)
    assert token["mallory_turns"] == 5
    assert token["errors"] == {"alice": 0, "mallory": 1}
    alone["metrics"] = {"error": "x"}
    token["metrics"] = callers.ran_as(dataplane_metrics(), SCHEDULER_METRICS)
    text = callers.table([alone, token])
    lines = text.splitlines()
    assert lines[0] == callers.TABLE_HEAD
    assert lines[1] == "|" + "---|" * 12
    assert (
        lines[2]
        == "| alone | 3 | 1.00 | 1.40 | 2.50 | 1 | - | unread | unread | unread | 0 | 1.50 |"
    )
    assert lines[3] == (
        "| impostor-token | 3 | 2.00 | 2.40 | 2.50 | 1 | 5 | 9 / 40 | mallory downgraded 40 "
        "| alice 1.5k, mallory/alice 2.5M | mallory 1 | 1.50 |"
    )
    assert callers.against_alone([alone, token]) == ["impostor-token: 2.00× alone"]
    with_reps = callers.table([alone, {**token, "rep": 1}], reps=2)
    assert with_reps.splitlines()[0].startswith("| arm | rep | alice turns |")
    assert with_reps.splitlines()[3].startswith("| impostor-token | 1 | 3 |")
    # no alone arm in that repetition: no ratio for it
    assert callers.against_alone([alone, {**token, "rep": 1}]) == []


def test_arms_alternate_their_order_by_repetition() -> None:
    """Drift over a run does not favour one arm: every other repetition runs them backwards."""
    order = callers.arm_order(2)
    assert [a for r, a in order if r == 0] == list(callers.ARMS)
    assert [a for r, a in order if r == 1] == list(reversed(callers.ARMS))
    assert len(callers.arm_order(1)) == len(callers.ARMS)
