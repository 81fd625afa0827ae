"""tools/bench/overhead.py's reading of the dataplane's own-time histogram (D10): the
buckets parsed from the dataplane's real exposition, deltas between scrapes, p50/p99
interpolated within a bucket and the exact shares at the 1, 2 and 5 ms edges."""

from __future__ import annotations

import pytest

from luftpause.dataplane.metrics import Metrics
from tools.bench import overhead


def _scrape(metrics: Metrics) -> dict[float, float]:
    return dict(overhead.parse_own(metrics.render()[0].decode()))


def test_the_dataplanes_exposition_is_read_edge_by_edge() -> None:
    """Every bucket edge of the dataplane's histogram, +Inf included, with its count; the
    1, 2 and 5 ms edges parse to the floats the shares look up."""
    metrics = Metrics()
    for seconds in (0.0004, 0.0015, 0.0015, 0.003, 2.0):
        metrics.own.observe(seconds)
    buckets = _scrape(metrics)
    assert buckets[0.0005] == 1 and buckets[0.001] == 1 and buckets[0.002] == 3
    assert buckets[0.005] == 4 and buckets[0.5] == 4 and buckets[float("inf")] == 5
    assert {0.001, 0.002, 0.005} <= set(buckets)
    assert overhead.parse_own('# nothing of ours\nother_bucket{le="1"} 3\n') == {}


def test_shares_are_exact_and_percentiles_interpolate_within_a_bucket() -> None:
    """Only what happened between two scrapes counts; p50 falls inside its bucket as
    Prometheus' histogram_quantile puts it; shares at the edges are exact."""
    metrics = Metrics()
    metrics.own.observe(0.010)  # before the first scrape: not counted
    before = _scrape(metrics)
    for _ in range(4):
        metrics.own.observe(0.0011)  # the (1, 1.25] ms bucket
    for _ in range(4):
        metrics.own.observe(0.0030)  # the (2.5, 3] ms bucket
    after = _scrape(metrics)
    total: dict[float, float] = {}
    overhead.add_delta(total, before, after)
    assert total == {edge: count - before[edge] for edge, count in after.items()}
    summary = overhead.own_summary(total)
    assert summary["n"] == 8
    assert summary["share_le_1ms"] == 0.0
    assert summary["share_le_2ms"] == 0.5
    assert summary["share_le_5ms"] == 1.0
    # rank 4 of 8 is the top of the (1, 1.25] ms bucket; rank 7.92 lies in (2.5, 3] ms
    assert summary["p50_ms"] == pytest.approx(1.25)
    assert 2.5 < summary["p99_ms"] <= 3.0


def test_no_turns_or_no_histogram_reads_as_unknown() -> None:
    """A run with no turns, or a dataplane whose buckets lack an edge, gives None (shown
    as a dash), never a made-up 0 %."""
    empty = overhead.own_summary({})
    assert empty["n"] == 0 and empty["p50_ms"] is None and empty["share_le_2ms"] is None
    other_edges = overhead.own_summary({0.003: 2.0, float("inf"): 2.0})
    assert other_edges["share_le_2ms"] is None and other_edges["p50_ms"] is not None
    beyond = overhead.own_summary({0.001: 0.0, 0.5: 0.0, float("inf"): 1.0})
    assert beyond["p50_ms"] == pytest.approx(500.0)  # in +Inf: the last finite edge


def test_turns_per_cpu_second_adds_the_scheduler_to_a_dataplane_arm() -> None:
    """A proxy arm's capacity on a core of its own (D10 benchmark): 1000 / its CPU ms per
    turn, with the scheduler's added for a dataplane arm (its admissions are part of the
    hop) and nothing for the router; an arm with no CPU figures is left out."""
    result = {
        "proxy_cpu_ms_per_turn": {
            "dataplane": [0.3, 0.34],
            overhead.ROUTER: [0.2, 0.2],
            "2 dataplanes, one port": [],
        },
        "scheduler_cpu_ms_per_turn": {"dataplane": [0.08, 0.12], "2 dataplanes, one port": []},
    }
    per_cpu_s = overhead.turns_per_cpu_second(result)
    assert per_cpu_s["dataplane"] == pytest.approx(1000 / 0.42)
    assert per_cpu_s[overhead.ROUTER] == pytest.approx(5000)
    assert "2 dataplanes, one port" not in per_cpu_s
