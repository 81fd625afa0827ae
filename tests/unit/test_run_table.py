"""D8, S11: the dataplane's run table when a client ends a run (``end_run``)."""

from __future__ import annotations

from luftpause.dataplane.runs import RunTable, TurnRecord


def table() -> RunTable:
    return RunTable(lambda: 0.0, 1800)


def turn(turn_id: str, run_id: str = "r") -> TurnRecord:
    return TurnRecord(turn_id, run_id, "engine-a", "m", "batch", "c")


def test_an_idle_run_is_forgotten_at_once() -> None:
    """D8: a run with nothing in flight is gone when its client ends it."""
    runs = table()
    runs.admitted(turn("t1"))
    runs.ended("t1", paused_on_tool=False)
    runs.end_run("r")
    assert "r" not in runs.runs and not runs.over()
    runs.end_run("never-seen")  # nothing to do


def test_a_run_ended_with_turns_in_flight_keeps_them_until_the_last_ends() -> None:
    """D8, S11: the turns of an ended run stay listed (a resync re-sends them) until
    they end; the run is forgotten after the last of them."""
    runs = table()
    runs.admitted(turn("t1"))
    runs.admitted(turn("t2"))
    runs.end_run("r")
    assert runs.over() == ["r"] and set(runs.turns) == {"t1", "t2"}
    runs.ended("t1", paused_on_tool=False)
    assert runs.over() == ["r"] and set(runs.turns) == {"t2"}
    runs.ended("t2", paused_on_tool=True)
    assert "r" not in runs.runs and not runs.turns and not runs.over()


def test_a_new_turn_after_the_end_keeps_the_run() -> None:
    """D8: a turn of the run after its end (the scheduler lets it live on) clears the
    mark: the run is kept after its turns end, as any run is."""
    runs = table()
    runs.admitted(turn("t1"))
    runs.end_run("r")
    runs.admitted(turn("t2"))
    runs.ended("t1", paused_on_tool=False)
    runs.ended("t2", paused_on_tool=False)
    assert "r" in runs.runs and not runs.over()
