"""Shared test plumbing: real service processes started with ``--port 0 --ready-file``.

``services.start(...)`` launches ``python -m luftpause <args>``, waits (bounded) for
its ready file and returns what the file says. Every process is stopped at
teardown with SIGTERM, then SIGKILL; when the test failed, each process's
stderr is attached to the report.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

READY_TIMEOUT_S = 30.0


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    stderr_path: Path
    ready: dict[str, Any]

    @property
    def urls(self) -> dict[str, str]:
        return dict(self.ready["urls"])

    @property
    def ports(self) -> dict[str, int]:
        return dict(self.ready["ports"])

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


class Services:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[Service] = []

    def start(
        self,
        *args: str,
        name: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = READY_TIMEOUT_S,
    ) -> Service:
        name = name or args[0]
        n = len(self.started)
        ready = self.tmp / f"{n}-{name}.ready.json"
        err = self.tmp / f"{n}-{name}.stderr"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        argv = [sys.executable, "-m", "luftpause", *args, "--ready-file", str(ready)]
        with err.open("wb") as stderr:
            proc = subprocess.Popen(
                argv, stdout=stderr, stderr=stderr, stdin=subprocess.DEVNULL, env=full_env
            )
        svc = Service(name, proc, err, {})
        self.started.append(svc)
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if proc.poll() is not None:
                raise AssertionError(
                    f"{name} exited with {proc.returncode} before ready:\n{svc.stderr()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} not ready after {timeout} s:\n{svc.stderr()}")
            time.sleep(0.02)
        svc.ready = json.loads(ready.read_text())
        return svc

    def stop_all(self) -> None:
        for svc in reversed(self.started):
            svc.stop()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture
def services(request: pytest.FixtureRequest) -> Iterator[Services]:
    with tempfile.TemporaryDirectory(prefix="luftpause-test-") as tmp:
        svcs = Services(Path(tmp))
        try:
            yield svcs
        finally:
            svcs.stop_all()
            rep = getattr(request.node, "rep_call", None)
            if rep is not None and rep.failed:
                for svc in svcs.started:
                    request.node.add_report_section(
                        "call", f"stderr of {svc.name}", svc.stderr()[-20000:]
                    )


@pytest.fixture(scope="module")
def module_services() -> Iterator[Services]:
    """Like ``services``, shared by the tests of one module (stopped at its end)."""
    with tempfile.TemporaryDirectory(prefix="luftpause-test-") as tmp:
        svcs = Services(Path(tmp))
        try:
            yield svcs
        finally:
            svcs.stop_all()
