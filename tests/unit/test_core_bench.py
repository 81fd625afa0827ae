"""tools/bench/core.py's workload (S1): the state it times holds every populated run and
no turn left held, however many runs, so its cells differ only in the size of the run
map, as the benchmark says, and its steady state keeps the outstanding load it aims at."""

from __future__ import annotations

import pytest

from tools.bench import core


@pytest.mark.parametrize("n_runs", [200, 5_000])
def test_populating_leaves_every_run_and_no_held_turn(n_runs: int) -> None:
    """S1: at 8 replicas prefix keeping holds some new runs' first turns; populating
    abandons those turns, so the core holds nothing, and every run is still in the state."""
    w = core.Workload(n_runs, 8, seed=1)
    w.populate(n_runs)
    assert w.held == 0 and not w.in_flight
    assert len(w.state.held) == 0
    assert len(w.state.runs) == n_runs
    assert not w.busy


def test_the_steady_mix_keeps_its_outstanding_load() -> None:
    """S1: in the steady mix the turns held plus in flight stay about the target, in
    the workload's count and in the core's."""
    n_runs = 5_000
    w = core.Workload(n_runs, 8, seed=1)
    w.populate(n_runs)
    for _ in range(3_000):
        w.step()
    outstanding = len(w.in_flight) + w.held
    assert w.target - 10 <= outstanding <= w.target + 1
    assert len(w.state.held) == w.held
    assert len(w.in_flight) > w.held
