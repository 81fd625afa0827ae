"""Child processes as ``luftpause up``, the tests and the benchmarks start them
(``luftpause.procs``): they die with the parent that started them, sit in a process
group of their own, and no fork handler of the parent runs in them (a parent holding
gRPC channels once saw its children aborted by gRPC's fork handler before exec)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from luftpause.procs import popen_child

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _gone(pid: int) -> bool:
    """True when ``pid`` has exited (reaped, or a zombie nobody reaps in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_child_dies_with_the_parent_that_started_it(tmp_path: Path) -> None:
    """X3: a parent killed without a chance to stop its children (SIGKILL) still takes them
    with it: Linux sends them SIGTERM."""
    parent_code = textwrap.dedent(f"""
        import sys, time
        from luftpause.procs import popen_child
        child = popen_child({SLEEPER!r}, None)
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE)
    child_pid = 0
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        time.sleep(0.5)  # the child has set its death signal and become the sleeper
        assert not _gone(child_pid)
        parent.kill()
        parent.wait()
        assert _wait_gone(child_pid), "the child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child_pid and not _gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def test_child_leads_a_process_group_of_its_own() -> None:
    """X3: Ctrl-C at `luftpause up` reaches only it; it stops its children in order."""
    child = popen_child(SLEEPER, None)
    try:
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    finally:
        child.kill()
        child.wait()


def test_unguarded_child_runs_the_program_with_the_environment_given(tmp_path: Path) -> None:
    """X3: ``die_with_parent=False`` runs the program itself, with the environment given."""
    out = tmp_path / "out"
    with out.open("wb") as f:
        child = popen_child(
            [sys.executable, "-c", "import os; print(os.environ['PROBE'])"],
            f,
            env={**os.environ, "PROBE": "given"},
            die_with_parent=False,
        )
    assert child.wait(timeout=30) == 0
    assert out.read_text().strip() == "given"


def test_no_fork_handler_of_the_parent_runs_in_the_child(tmp_path: Path) -> None:
    """X3: the parent's ``after_in_child`` fork handlers (gRPC registers such handlers)
    must not run in a child we start: it is started without forking the parent."""
    marker = tmp_path / "handler-ran"
    code = textwrap.dedent(f"""
        import os, sys
        from luftpause.procs import popen_child
        def note():
            open({str(marker)!r}, "w").close()
        os.register_at_fork(after_in_child=note)
        child = popen_child([sys.executable, "-c", "print('started')"], None)
        sys.exit(child.wait(timeout=30))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "started"
    assert not marker.exists(), "a fork handler of the parent ran in the child"
