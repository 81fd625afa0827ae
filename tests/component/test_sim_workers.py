"""``luftpause sim --workers N`` (B1, B12): engine models stepped in worker processes give
the report one process gives; the workers stop on every way out, and a dead one is named."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from luftpause.cli import main
from luftpause.measure.mix import Group
from luftpause.sim.partition import WorkerError
from luftpause.sim.run import SimConfig, simulate

SMALL = SimConfig(
    groups=(Group("chat", 2, "interactive", "chat"), Group("crowd", 24, "batch", "crowd")),
    replicas=3,
    duration_s=40.0,
    warmup_s=10.0,
    workers=2,
)


def workers() -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("luftpause-sim")]


def without_wall_time(path: Path) -> str:
    payload = json.loads(path.read_text())
    del payload["machine"]
    for result in payload["results"]:
        del result["wall_s"], result["speedup"]
    return json.dumps(payload, indent=2)


def test_one_and_two_workers_write_the_same_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """B1, B12: the same seed on 1 and on 2 worker processes writes the same JSON report
    byte for byte (less the wall time), for the luftpause arm and a peer's."""
    reports = []
    for n in (1, 2):
        out = tmp_path / f"workers-{n}.json"
        argv = ["sim", "--group", "2:interactive", "--group", "24:batch", "--replicas", "3"]
        argv += ["--duration-s", "40", "--warmup-s", "10", "--arms", "luftpause,smg"]
        assert main([*argv, "--workers", str(n), "--json", str(out)]) == 0
        reports.append(without_wall_time(out))
    assert reports[0] == reports[1]
    results = json.loads(reports[0])["results"]
    assert [r["arm"] for r in results] == ["luftpause", "smg"]
    assert all(r["turns"] > 100 for r in results)
    assert not workers()
    capsys.readouterr()


class Stop(Exception):
    pass


def test_workers_stop_when_the_simulation_fails() -> None:
    """B12: an exception in the main process mid-run (here from the progress line)
    leaves no worker process behind."""
    seen: list[int] = []

    def progress(t: float, events: int) -> None:
        if t > 5.0:
            seen.extend(p.pid or 0 for p in workers())
            raise Stop

    with pytest.raises(Stop):
        simulate(SMALL, "luftpause", progress)
    assert len(seen) == 2  # they ran
    assert not workers()


def test_a_worker_that_dies_is_named_not_waited_for() -> None:
    """B12: a worker killed mid-run ends the simulation with an error naming it, and the
    other worker stops too."""

    def progress(t: float, events: int) -> None:
        if t > 5.0:
            victim = workers()[0]
            os.kill(victim.pid or 0, signal.SIGKILL)
            victim.join(10.0)

    with pytest.raises(WorkerError, match=r"engine worker \d \(pid \d+\) ended unexpectedly"):
        simulate(SMALL, "luftpause", progress)
    assert not workers()


def test_the_flag_says_what_one_worker_means(capsys: pytest.CaptureFixture[str]) -> None:
    """B12: ``--workers`` is documented in ``--help`` and refuses 0 with a clear error."""
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--workers" in text and "1 (default): no worker processes" in text
    with pytest.raises(SystemExit) as exit_:
        main(["sim", "--agents", "2", "--workers", "0"])
    assert exit_.value.code == 2
    assert "--workers" in capsys.readouterr().err
