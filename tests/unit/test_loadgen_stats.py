"""H3: the load generator's numbers - percentiles, runs/min, cached share, breakdowns."""

from __future__ import annotations

import pytest

from luftpause.measure.stats import (
    EndedTurn,
    ErrorRecord,
    RunRecord,
    TurnRecord,
    cached_share,
    closed_loop_rate,
    percentile,
    runs_per_min,
    summarise,
    table,
    turn_breakdown,
    turns_table,
)


def run(
    cls: str = "batch",
    start: float = 0.0,
    end: float = 10.0,
    turns: list[TurnRecord] | None = None,
    group: str = "g",
) -> RunRecord:
    turns = turns if turns is not None else [TurnRecord(1.0, prompt_tokens=100, cached_tokens=50)]
    return RunRecord(
        group=group,
        cls=cls,
        kind="agent",
        start_s=start,
        end_s=end,
        turns=len(turns),
        tool_calls=max(0, len(turns) - 1),
        turn_records=turns,
        prompt_tokens=sum(t.prompt_tokens or 0 for t in turns),
        cached_tokens=sum(t.cached_tokens or 0 for t in turns),
    )


def test_percentile_interpolates_between_order_statistics() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 95) == pytest.approx(95.05)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_runs_per_min_scales_by_window() -> None:
    assert runs_per_min(10, 60.0) == pytest.approx(10.0)
    assert runs_per_min(10, 30.0) == pytest.approx(20.0)
    assert runs_per_min(0, 5.0) == 0.0
    with pytest.raises(ValueError):
        runs_per_min(1, 0.0)


def test_cached_share_weights_by_tokens_and_skips_unknown_usage() -> None:
    a = run(turns=[TurnRecord(1.0, prompt_tokens=100, cached_tokens=0)])
    b = run(turns=[TurnRecord(1.0, prompt_tokens=300, cached_tokens=300)])
    unknown = RunRecord("g", "batch", "subagent", 0, 1, 1, 0)
    assert cached_share([a, b, unknown]) == pytest.approx(0.75)
    assert cached_share([unknown]) is None


def test_turn_breakdown_means_and_other_time() -> None:
    turns = [
        TurnRecord(2.0, held_s=0.5, queued_s=0.5, prefill_s=0.25, decode_s=0.5),
        TurnRecord(1.0, held_s=0.0, queued_s=0.0, prefill_s=0.25, decode_s=0.5),
    ]
    out = turn_breakdown([run(turns=turns)])
    assert out["turns"] == 2
    assert out["wall_s"] == pytest.approx(1.5)
    assert out["held_s"] == pytest.approx(0.25)
    assert out["queued_s"] == pytest.approx(0.25)
    assert out["other_s"] == pytest.approx((0.25 + 0.25) / 2)
    # Nothing in the path reported held time: stays unknown, not zero.
    direct = turn_breakdown([run(turns=[TurnRecord(1.0, queued_s=0.1)])])
    assert direct["held_s"] is None and direct["queued_s"] == pytest.approx(0.1)


def test_summarise_counts_only_runs_ending_in_the_window_and_every_error() -> None:
    runs = [
        run("interactive", 0, 4),  # ends in the warm-up: not counted
        run("interactive", 1, 12),
        run("interactive", 2, 20),
        run("batch", 5, 30),
        run("batch", 5, 61),  # ends after the window
    ]
    errors = [
        ErrorRecord("g", "batch", "connect", 1.0, "refused"),  # in the warm-up: still counted
        ErrorRecord("g", "batch", "http_502", 20.0, "bad gateway"),
        ErrorRecord("g", "interactive", "connect", 30.0, "refused"),
    ]
    s = summarise(runs, errors, (10.0, 40.0), [("g", "batch")])
    assert s["window_s"] == 30.0
    inter, batch = s["classes"]["interactive"], s["classes"]["batch"]
    assert inter["runs"] == 2 and inter["runs_per_min"] == pytest.approx(4.0)
    assert inter["run_s"]["p50"] == pytest.approx((11 + 18) / 2)
    assert batch["runs"] == 1 and batch["errors"] == {"connect": 1, "http_502": 1}
    assert s["errors"] == {"connect": 2, "http_502": 1} and s["error_count"] == 3
    assert s["runs_outside_window"] == 2
    assert list(s["classes"]) == ["interactive", "batch"]
    assert s["classes"]["batch"]["cached_share"] == pytest.approx(0.5)


def test_table_shows_classes_and_errors() -> None:
    s = summarise(
        [run("batch", 0, 5, group="a"), run("interactive", 0, 5, group="b")],
        [ErrorRecord("a", "batch", "connect", 1.0, "x")],
        (0.0, 10.0),
        [("a", "batch"), ("b", "interactive")],
    )
    text = table(s)
    assert "| interactive |" in text and "| batch |" in text
    assert "connect 1" in text
    assert "| group a |" in text and "| group b |" in text


def test_closed_loop_rate_is_agents_over_mean_run_time() -> None:
    """H3: runs/min of a closed loop from Little's law, per class summed over its groups."""
    assert closed_loop_rate(4, [30.0, 60.0]) == pytest.approx(4 * 60 / 45)
    assert closed_loop_rate(2, []) is None
    with pytest.raises(ValueError):
        closed_loop_rate(0, [1.0])
    runs = [
        run("batch", 0, 20, group="a"),
        run("batch", 10, 40, group="b"),
        run("interactive", 5, 15, group="c"),
    ]
    groups = [("a", "batch"), ("b", "batch"), ("c", "interactive")]
    s = summarise(runs, [], (0.0, 60.0), groups, {"a": 3, "b": 5, "c": 2})
    # batch: 8 agents, runs of 20 and 30 s -> 8 * 60 / 25
    assert s["classes"]["batch"]["runs_per_min_closed"] == pytest.approx(8 * 60 / 25)
    assert s["classes"]["interactive"]["runs_per_min_closed"] == pytest.approx(2 * 60 / 10)
    assert s["groups"]["b"]["runs_per_min_closed"] == pytest.approx(5 * 60 / 30)
    # A class with a group of unknown size (a one-shot fan-out) gets no estimate.
    partial = summarise(runs, [], (0.0, 60.0), groups, {"a": 3})
    assert partial["classes"]["batch"]["runs_per_min_closed"] is None
    unknown = summarise(runs, [], (0.0, 60.0), groups)
    assert unknown["classes"]["batch"]["runs_per_min_closed"] is None
    assert "agents×60/mean" in table(s)


def ended(cls: str, at: float, wall: float, tokens: int = 10, group: str = "g") -> EndedTurn:
    return EndedTurn(group, cls, at, TurnRecord(wall, completion_tokens=tokens))


def test_turns_ended_in_the_window_count_whether_or_not_their_run_finished() -> None:
    """H3, B10: with every turn logged as it ended, each class and group reports the turns
    that ended inside the window - runs still going at its end included, turns of the
    warm-up and after the window left out: how many, per minute, wall p50/p95 and reply
    tokens per minute."""
    turns = [
        ended("interactive", 5.0, 9.0),  # warm-up: out
        ended("interactive", 20.0, 1.0, 30, group="me"),
        ended("interactive", 40.0, 3.0, 30, group="me"),
        ended("interactive", 70.0, 2.0, 30, group="me"),
        ended("batch", 30.0, 4.0, 100),
        ended("batch", 95.0, 7.0, 100),  # after the window: out
    ]
    summary = summarise([], [], (10.0, 70.0), [("me", "interactive"), ("g", "batch")], turns=turns)
    inter = summary["classes"]["interactive"]
    assert inter["runs"] == 0  # no run finished, yet the turns are seen
    assert inter["turns_ended"] == {
        "turns": 3,
        "turns_per_min": 3.0,
        "wall_s": {"p50": 2.0, "p90": 2.8, "p95": 2.9},
        "completion_tokens_per_min": 90.0,
    }
    assert summary["classes"]["batch"]["turns_ended"]["turns"] == 1
    assert summary["groups"]["me"]["turns_ended"]["turns"] == 3
    text = turns_table(summary)
    assert text is not None
    assert "| interactive | 3 | 3.0 | 2.00 | 2.90 | 90 |" in text
    assert "| group me | 3 |" in text


def test_two_groups_claiming_one_class_get_their_own_turn_percentiles() -> None:
    """H3, B13: a caller's agents and another's posing as it may claim the same class;
    each group's turns (p50/p90/p95 of their wall time) are its own, the class's are
    both together - how tools/bench/callers.py tells the honest caller's latency from
    the impostor's."""
    honest = [ended("interactive", 10.0 + i, w, group="alice") for i, w in enumerate((1, 2, 3))]
    posing = [ended("interactive", 20.0 + i, 10.0 + i, group="mallory") for i in range(11)]
    groups = [("alice", "interactive"), ("mallory", "interactive")]
    summary = summarise([], [], (0.0, 60.0), groups, turns=honest + posing)
    alice = summary["groups"]["alice"]["turns_ended"]
    assert alice["turns"] == 3
    assert alice["wall_s"] == {"p50": 2.0, "p90": 2.8, "p95": 2.9}
    mallory = summary["groups"]["mallory"]["turns_ended"]
    assert mallory["wall_s"] == {"p50": 15.0, "p90": 19.0, "p95": 19.5}
    assert summary["classes"]["interactive"]["turns_ended"]["turns"] == 14
    assert summary["classes"]["interactive"]["turns_ended"]["wall_s"]["p50"] == 13.5


def test_groups_that_log_no_turns_get_no_turns_view() -> None:
    """H3: in a load of own-loop and sub-agent groups, only the groups that log their
    turns (and the classes with one of them) get ``turns_ended``; a sub-agent group's
    turns happen in the runtime and would read as zero here."""
    turns = [ended("interactive", 20.0, 1.0, group="me")]
    summary = summarise(
        [], [], (0.0, 60.0), [("me", "interactive"), ("subs", "batch")], turns=turns,
        turn_groups=["me"],
    )  # fmt: skip
    assert summary["classes"]["interactive"]["turns_ended"]["turns"] == 1
    assert "turns_ended" not in summary["classes"]["batch"]
    assert "turns_ended" in summary["groups"]["me"]
    assert "turns_ended" not in summary["groups"]["subs"]
    assert "| batch |" not in (turns_table(summary) or "")


def test_no_turn_log_no_turns_view() -> None:
    """H3: a load that logged no turns (sub-agents over MCP: their turns are the runtime's)
    gets no ``turns_ended`` and no second table, rather than a row of zeros that would read
    as 'nothing happened'."""
    summary = summarise([run()], [], (0.0, 60.0), [("g", "batch")])
    assert "turns_ended" not in summary["classes"]["batch"]
    assert turns_table(summary) is None
    empty = summarise([], [], (0.0, 60.0), [("g", "batch")], turns=[])
    assert empty["classes"]["batch"]["turns_ended"]["turns"] == 0
    assert empty["classes"]["batch"]["turns_ended"]["wall_s"]["p50"] is None
