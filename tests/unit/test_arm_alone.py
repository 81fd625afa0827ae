"""The scheduler's /status read over a load's window (``window_figures``, used by
``tools/bench/flood.py``'s luftpause arms and ``tools/bench/arm_alone.py``)."""

from __future__ import annotations

from typing import Any

from tools.bench.arms.luftpause import window_figures


def status(cap: int | None, pace: int | None, held: int) -> dict[str, Any]:
    replica = {"capacity": cap, "batch_limit_from_pace": pace, "in_flight": 3, "engine_running": 3}
    return {"replicas": [{"name": "engine-a", **replica}], "held_total": held}


def test_window_medians_skip_the_warm_up_and_failed_samples() -> None:
    """H4: only samples from the window's start count; a failed scrape and a replica
    still without a cap or pace limit are left out of the medians, not read as zero."""
    samples = [
        (0.0, status(99, 99, 99)),  # warm-up: not counted
        (10.0, status(None, None, 1)),
        (11.0, {"error": "connection refused"}),
        (12.0, status(20, 14, 3)),
        (13.0, status(24, None, 5)),
    ]
    figures = window_figures(samples, since=10.0)
    assert figures["samples"] == 3
    assert figures["replicas"]["engine-a"] == {
        "capacity": 22.0,
        "batch_limit_from_pace": 14,
        "in_flight": 3,
        "engine_running": 3,
    }
    assert figures["held"] == 3
    assert window_figures(samples, since=20.0) == {}
