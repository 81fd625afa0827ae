"""``luftpause up``: the whole stack as child processes on loopback, in the foreground.

Starts, in order, the fake engines and fake tools the config lists under
``[fakes]``, then the scheduler, the dataplane and the runtime (each only if
this installation has it). Each child gets ``--ready-file``; ``up`` waits for
every file before saying where everything listens. Ctrl-C (or SIGTERM) stops
all children: SIGTERM, then SIGKILL after a grace period. If one child dies,
``up`` says which and how, stops the rest and exits non-zero. Children get
SIGTERM from the kernel if ``up`` itself is killed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from luftpause.cli import COMMANDS, available
from luftpause.config import StackConfig, load_config

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0


@dataclass
class Child:
    name: str
    argv: list[str]
    ready_file: Path
    describe: str = ""
    proc: subprocess.Popen[bytes] | None = None
    ready: dict[str, Any] = field(default_factory=dict)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="stack configuration (TOML); default: the packaged fake stack",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level passed to every service (default: WARNING)",
    )


def _has(name: str) -> bool:
    return any(c.name == name and available(c) for c in COMMANDS)


def plan(config: StackConfig, config_path: Path, run_dir: Path, log_level: str) -> list[Child]:
    """The children to start, in start order."""
    base = [sys.executable, "-m", "luftpause"]
    children: list[Child] = []

    def child(name: str, argv: list[str]) -> Child:
        ready = run_dir / f"{name}.json"
        c = Child(name, [*argv, "--ready-file", str(ready), "--log-level", log_level], ready)
        children.append(c)
        return c

    if _has("fake-engine"):
        for eng in config.fakes.engines:
            argv = [*base, "fake-engine", "--name", eng.name, "--model", eng.model]
            child(f"fake-engine {eng.name}", [*argv, "--port", str(eng.port), *eng.args])
    if config.fakes.mcp is not None and _has("fake-mcp"):
        mcp = config.fakes.mcp
        child("fake-mcp", [*base, "fake-mcp", "--port", str(mcp.port), *mcp.args])
    cfg = ["--config", str(config_path)]
    child("scheduler", [*base, "scheduler", *cfg])
    if _has("dataplane"):
        child("dataplane", [*base, "dataplane", *cfg])
    if _has("runtime"):
        child("runtime", [*base, "runtime", *cfg])
    return children


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Ask Linux to SIGTERM this child when ``up`` dies (prctl PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)
    except OSError:
        pass


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _describe(c: Child) -> str:
    urls: dict[str, str] = c.ready.get("urls", {})
    if c.name == "scheduler":
        grpc = urls.get("grpc", "").removeprefix("http://")
        return f"gRPC {grpc}   status {urls.get('http', '')}/status"
    if c.name == "dataplane":
        return f"{urls.get('http', '')}/v1   (OpenAI base_url)"
    if c.name in ("runtime", "fake-mcp"):
        return f"{urls.get('http', '')}/mcp"
    return urls.get("http", "")


def stop_all(children: list[Child]) -> None:
    running = [c for c in reversed(children) if c.proc is not None and c.proc.poll() is None]
    for c in running:
        assert c.proc is not None
        c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for c in running:
        assert c.proc is not None
        try:
            c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"luftpause up: {c.name} did not stop in {STOP_GRACE_S:.0f} s; killing it")
            c.proc.kill()
            c.proc.wait()


def main(args: argparse.Namespace) -> int:
    from luftpause.config import ConfigError

    try:
        config, config_path = load_config(args.config)
    except ConfigError as exc:
        print(f"luftpause up: configuration error:\n{exc}", file=sys.stderr)
        return 2
    stop_requested = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with tempfile.TemporaryDirectory(prefix="luftpause-up-") as tmp:
        children = plan(config, config_path.resolve(), Path(tmp), args.log_level)
        try:
            return _run(children, config_path, lambda: stop_requested)
        finally:
            stop_all(children)


def _run(children: list[Child], config_path: Path, stopping: Any) -> int:
    print(f"luftpause up: starting {len(children)} services from {config_path}", flush=True)
    for c in children:
        c.proc = subprocess.Popen(c.argv, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not c.ready_file.exists():
            code = c.proc.poll()
            if code is not None:
                print(f"luftpause up: {c.name} {_exit_text(code)} during start-up", flush=True)
                return 1
            if stopping():
                return 130
            if time.monotonic() > deadline:
                print(f"luftpause up: {c.name} not ready after {READY_TIMEOUT_S:.0f} s", flush=True)
                return 1
            time.sleep(0.05)
        c.ready = json.loads(c.ready_file.read_text())
    width = max(len(c.name) for c in children)
    print("\nluftpause is up:", flush=True)
    for c in children:
        print(f"  {c.name:<{width}}  {_describe(c)}")
    runtime = next((c for c in children if c.name == "runtime"), None)
    if runtime is not None:
        url = runtime.ready.get("urls", {}).get("http", "")
        print(f"\nAdd it to Claude Code:\n  claude mcp add --transport http luftpause {url}/mcp")
    print("\nPress Ctrl-C to stop everything.", flush=True)
    while not stopping():
        for c in children:
            assert c.proc is not None
            code = c.proc.poll()
            if code is not None:
                print(f"\nluftpause up: {c.name} {_exit_text(code)}; stopping the rest", flush=True)
                return 1
        time.sleep(0.2)
    print("\nluftpause up: stopping", flush=True)
    return 0
