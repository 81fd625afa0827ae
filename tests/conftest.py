"""Shared test plumbing: real service processes started with ``--port 0 --ready-file``.

``services.start(...)`` launches ``python -m luftpause <args>``, waits (bounded) for
its ready file and returns what the file says. Every process is stopped at
teardown with SIGTERM, then SIGKILL; when the test failed, each process's
stderr is attached to the report.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from luftpause.procs import ServiceFailed, ServiceProcess, launch, stop_all

READY_TIMEOUT_S = 30.0


class Services:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[ServiceProcess] = []

    def start(
        self,
        *args: str,
        name: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = READY_TIMEOUT_S,
    ) -> ServiceProcess:
        name = name or args[0]
        n = len(self.started)
        svc = launch(
            args,
            name=name,
            ready_file=self.tmp / f"{n}-{name}.ready.json",
            stderr=self.tmp / f"{n}-{name}.stderr",
            env=env,
        )
        self.started.append(svc)
        try:
            svc.wait_ready(timeout)
        except ServiceFailed as exc:
            raise AssertionError(str(exc)) from None
        return svc

    def stop_all(self) -> None:
        stop_all(self.started)


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
