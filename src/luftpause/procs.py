"""Launch luftpause services as child processes and wait for their ready files.

Used by ``luftpause up``, the integration tests and the benchmarks: one way to
start ``python -m luftpause <service> ... --ready-file PATH``, wait (bounded)
until it accepts connections, and stop it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx


class ServiceFailed(Exception):
    """A child exited or did not become ready; the message says which and why."""


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


log = logging.getLogger("luftpause.procs")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """In the child: leave the terminal's process group (Ctrl-C reaches only the parent,
    which then stops its children in order) and ask Linux to SIGTERM this child when
    its parent dies (prctl PR_SET_PDEATHSIG)."""
    os.setpgrp()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


@dataclass
class ServiceProcess:
    name: str
    proc: subprocess.Popen[bytes]
    ready_file: Path
    stderr_path: Path | None = None
    ready: dict[str, Any] = field(default_factory=dict)

    @property
    def urls(self) -> dict[str, str]:
        return dict(self.ready.get("urls", {}))

    @property
    def ports(self) -> dict[str, int]:
        return dict(self.ready.get("ports", {}))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        if self.stderr_path is None:
            return ""
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 60.0, stopping: Callable[[], bool] = bool) -> None:
        """Block until the ready file exists; raise ServiceFailed if the child dies first."""
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            code = self.proc.poll()
            if code is not None:
                tail = self.stderr()[-4000:]
                raise ServiceFailed(
                    f"{self.name} {exit_text(code)} during start-up"
                    + (f":\n{tail}" if tail else "")
                )
            if stopping():
                raise ServiceFailed(f"stopped while waiting for {self.name}")
            if time.monotonic() > deadline:
                raise ServiceFailed(f"{self.name} not ready after {timeout:.0f} s")
            time.sleep(0.02)
        self.ready = json.loads(self.ready_file.read_text())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Signal the child and wait; escalate to SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        return int(self.proc.returncode)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def launch(
    args: Sequence[str],
    *,
    name: str,
    ready_file: Path,
    stderr: Path | None = None,
    env: dict[str, str] | None = None,
    die_with_parent: bool = True,
) -> ServiceProcess:
    """Start ``python -m luftpause <args> --ready-file <ready_file>``.

    ``stderr``: a file for the child's stdout and stderr (None: inherit ours).
    """
    argv = [sys.executable, "-m", "luftpause", *args, "--ready-file", str(ready_file)]
    # A ready file left by an earlier process must not pass for this one's.
    ready_file.unlink(missing_ok=True)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    out: IO[bytes] | None = None
    try:
        if stderr is not None:
            out = stderr.open("wb")
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env=full_env,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
    finally:
        if out is not None:
            out.close()
    return ServiceProcess(name, proc, ready_file, stderr)


def stop_all(services: Sequence[ServiceProcess], grace: float = 5.0) -> list[str]:
    """Stop children one by one, last started first (a service stops before what it
    uses): SIGTERM, then SIGKILL after ``grace`` seconds.

    Returns a line for each child that had to be killed.
    """
    killed = []
    for s in reversed(services):
        if s.proc.poll() is not None:
            continue
        s.proc.send_signal(signal.SIGTERM)
        try:
            s.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            killed.append(f"{s.name} did not stop in {grace:.0f} s; killed")
            s.proc.kill()
            s.proc.wait()
    return killed


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for programs that cannot take port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class RouterProcess:
    """A real router (PyPI ``sglang-router`` or SMG) in front of some engines (S7)."""

    proc: subprocess.Popen[bytes]
    url: str
    stderr_path: Path
    name: str = "sglang router"
    metrics_url: str = ""  # its Prometheus listener (--prometheus-port)

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def launch_sglang_router(
    worker_urls: Sequence[str], policy: str, stderr: Path, model: str, timeout: float = 60.0
) -> RouterProcess:
    """Start the SGLang router (``sglang-router``) on loopback and wait (bounded) until it
    lists every worker as healthy and a completion passes through it.

    A router killed by a signal while starting (seen rarely: an abort in its event
    engine's poller before it served anything) is started once more, on new ports;
    a second such death, or any other failure, is an error."""

    def argv(port: int, metrics_port: int) -> list[str]:
        return [
            sys.executable, "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *worker_urls,
            "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        ]  # fmt: skip

    return _launch_router("sglang router", argv, worker_urls, stderr, model, timeout)


def launch_smg(
    worker_urls: Sequence[str],
    policy: str,
    stderr: Path,
    model: str,
    timeout: float = 60.0,
    extra_args: Sequence[str] = (),
    worker_labels: Sequence[Mapping[str, str]] | None = None,
) -> RouterProcess:
    """Start the SGLang Model Gateway (PyPI ``smg``, ``smg launch``) on loopback and wait
    (bounded) until it lists every worker as ready and a completion passes through it.

    ``extra_args`` are added to the command line (e.g. ``--sticky-sessions``). SMG
    registers workers in the background after it starts listening, hence the wait
    for its ``/workers`` list. Both hosts are always 127.0.0.1 (SMG's default is
    0.0.0.0). A start-up death by a signal is retried once, as for the SGLang router.

    ``worker_labels`` (one mapping per worker URL): register the workers with SMG's
    ``POST /workers`` and these labels instead of ``--worker-urls``. A label overrides
    what the engine's ``/server_info`` reports: ``{"max_running_requests": "8"}`` is how
    SMG 1.13.0's priority scheduler is given a capacity (the sum over the workers), which
    no command-line flag sets (``--max-concurrent-requests`` bounds only the legacy
    admission path)."""
    if worker_labels is not None and len(worker_labels) != len(worker_urls):
        raise ValueError("worker_labels needs one mapping per worker URL")

    def argv(port: int, metrics_port: int) -> list[str]:
        workers = [] if worker_labels is not None else ["--worker-urls", *worker_urls]
        return [
            sys.executable, "-m", "smg", "launch",
            "--host", "127.0.0.1", "--port", str(port),
            *workers,
            "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            # In-flight requests get this long on SIGTERM (default 180 s).
            "--shutdown-grace-period-secs", "5",
            *extra_args,
        ]  # fmt: skip

    registered: set[tuple[str, str]] = set()  # (router, worker): a restarted router has none

    def register(router_url: str) -> None:
        for url, labels in zip(worker_urls, worker_labels or (), strict=True):
            if (router_url, url) in registered:
                continue
            r = httpx.post(
                f"{router_url}/workers", json={"url": url, "labels": dict(labels)}, timeout=5
            )
            if r.status_code >= 300:
                raise ValueError(f"POST /workers {url} answered {r.status_code} {r.text[:200]}")
            registered.add((router_url, url))

    return _launch_router(
        "smg",
        argv,
        worker_urls,
        stderr,
        model,
        timeout,
        register if worker_labels is not None else None,
    )


class _RouterDiedBySignal(Exception):
    pass


def _launch_router(
    name: str,
    argv: Callable[[int, int], list[str]],
    worker_urls: Sequence[str],
    stderr: Path,
    model: str,
    timeout: float,
    register: Callable[[str], None] | None = None,
) -> RouterProcess:
    for attempt in (1, 2):
        try:
            return _launch_router_once(name, argv, worker_urls, stderr, model, timeout, register)
        except _RouterDiedBySignal as exc:
            if attempt == 2:
                raise ServiceFailed(str(exc)) from None
            log.warning("%s\nstarting it once more", exc)
    raise AssertionError("unreachable")


def _launch_router_once(
    name: str,
    argv: Callable[[int, int], list[str]],
    worker_urls: Sequence[str],
    stderr: Path,
    model: str,
    timeout: float,
    register: Callable[[str], None] | None = None,
) -> RouterProcess:
    """``register``: called with the router's URL until it returns (the router may not
    listen yet), before the wait for its worker list."""
    port, metrics_port = free_port(), free_port()
    with stderr.open("wb") as out:
        proc = subprocess.Popen(
            argv(port, metrics_port),
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
    router = RouterProcess(
        proc, f"http://127.0.0.1:{port}", stderr, name, f"http://127.0.0.1:{metrics_port}"
    )
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    deadline = time.monotonic() + timeout
    last = ""
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                text = f"{name} {exit_text(proc.returncode)}:\n{router.stderr()}"
                if proc.returncode < 0:
                    raise _RouterDiedBySignal(text)
                raise ServiceFailed(text)
            try:
                if register is not None:
                    register(router.url)
                    register = None  # once: SMG keeps the workers it accepted
                missing = missing_workers(router.url, worker_urls)
                if missing:
                    last = f"workers not registered yet: {', '.join(missing)}"
                else:
                    r = httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=5)
                    if r.status_code == 200:
                        return router
                    last = f"{r.status_code} {r.text[:300]}"
            except (httpx.HTTPError, ValueError) as exc:
                last = repr(exc)
            time.sleep(0.25)
    except BaseException:
        router.stop()  # whatever stops the wait, the router does not outlive it
        raise
    router.stop()
    raise ServiceFailed(
        f"{name} not ready in {timeout:.0f} s (last: {last})\n{router.stderr()[-3000:]}"
    )


def missing_workers(router_url: str, worker_urls: Sequence[str]) -> list[str]:
    """The worker URLs that the router's ``GET /workers`` does not list as healthy (and,
    where it says, ready). Both the SGLang router and SMG answer
    ``{"workers": [{"url": ..., "is_healthy": ..., ...}]}``. Raises ``httpx.HTTPError``
    or ``ValueError`` when the router cannot say yet."""
    r = httpx.get(f"{router_url}/workers", timeout=5)
    if r.status_code == 404:
        return []  # a router without a worker list: the completion check has to do
    r.raise_for_status()
    answer = r.json()
    listed = answer.get("workers") if isinstance(answer, dict) else None
    if not isinstance(listed, list):
        raise ValueError(f"GET /workers answered {str(answer)[:200]}")
    ready = {
        str(w.get("url", "")).rstrip("/")
        for w in listed
        if isinstance(w, dict) and w.get("is_healthy") and w.get("status", "ready") == "ready"
    }
    return [u for u in worker_urls if u.rstrip("/") not in ready]
