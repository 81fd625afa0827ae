"""Launch luftpause services as child processes and wait for their ready files.

Used by ``luftpause up``, the integration tests and the benchmarks: one way to
start ``python -m luftpause <service> ... --ready-file PATH``, wait (bounded)
until it accepts connections, and stop it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

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


# Runs in the child as ``python -S -I -c _GUARD <parent pid> <argv...>``, then becomes
# the program by exec: Linux SIGTERMs it when the parent that started it dies
# (prctl PR_SET_PDEATHSIG, which survives exec), and it exits at once if that parent is
# already gone. Done this way rather than in a ``preexec_fn`` because a ``preexec_fn``
# makes Python fork the whole parent and run its fork handlers in the child: a parent
# holding gRPC channels (the tests, the benchmarks) then saw children killed by SIGABRT
# in gRPC's poller before they reached exec. Without one, ``subprocess`` uses vfork and
# no handler runs.
_GUARD = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def guarded(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it dies with this process (see ``_GUARD``); ``argv[0]``
    must be a path, as ``os.execv`` does not search PATH."""
    return [sys.executable, "-S", "-I", "-c", _GUARD, str(os.getpid()), *argv]


def popen_child(
    argv: Sequence[str],
    out: IO[bytes] | None,
    *,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = True,
) -> subprocess.Popen[bytes]:
    """Start a child in a process group of its own (Ctrl-C reaches only us, and we stop
    our children in order), its stdout and stderr to ``out``, dying with us unless
    ``die_with_parent`` is False."""
    return subprocess.Popen(
        guarded(argv) if die_with_parent else list(argv),
        stdout=out,
        stderr=out,
        stdin=subprocess.DEVNULL,
        env=env,
        process_group=0,
    )


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
        proc = popen_child(argv, out, env=full_env, die_with_parent=die_with_parent)
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
    """A real router (PyPI ``sglang-router``, SMG or ``vllm-router``) in front of some
    engines (S7)."""

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
    lists every worker as healthy and a completion passes through it."""

    def argv(port: int, metrics_port: int) -> list[str]:
        return _router_argv("sglang_router", worker_urls, policy, port, metrics_port)

    return _launch_router("sglang router", argv, worker_urls, stderr, model, timeout)


def _router_argv(
    module: str,
    worker_urls: Sequence[str],
    policy: str,
    port: int,
    metrics_port: int,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line of the SGLang router or of vLLM's router (its fork: the same
    flags), served by ``module``'s ``launch_router``, on loopback."""
    return [
        sys.executable, "-m", f"{module}.launch_router",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        *extra_args,
    ]  # fmt: skip


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
    0.0.0.0).

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


def launch_vllm_router(
    worker_urls: Sequence[str],
    policy: str,
    stderr: Path,
    model: str,
    timeout: float = 60.0,
    extra_args: Sequence[str] = (),
) -> RouterProcess:
    """Start vLLM's router (PyPI ``vllm-router``, ``python -m vllm_router.launch_router``)
    on loopback and wait (bounded) until it lists every worker as healthy and a completion
    passes through it.

    ``extra_args`` are added to the command line (e.g. ``--enable-program-scheduling
    --program-scheduling-config-json '{...}'``). Its Prometheus listener gets a free port
    of its own (its default, 29000, would collide between routers)."""

    def argv(port: int, metrics_port: int) -> list[str]:
        return _router_argv("vllm_router", worker_urls, policy, port, metrics_port, extra_args)

    return _launch_router("vllm-router", argv, worker_urls, stderr, model, timeout)


def _launch_router(
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
        proc = popen_child(argv(port, metrics_port), out)
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
    where it says, ready). The SGLang router, SMG and vLLM's router all answer
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
