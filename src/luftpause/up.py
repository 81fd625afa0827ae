"""``luftpause up``: the whole stack as child processes on loopback, in the foreground.

Starts, in order, the fake engines and fake tools the config lists under
``[fakes]``, then the scheduler, the dataplane and the runtime (each only if
this installation has it). Each child gets ``--ready-file``; ``up`` waits for
every file before saying where everything listens. Ctrl-C (or SIGTERM) stops
all children: SIGTERM, then SIGKILL after a grace period. If one child dies,
``up`` says which and how, stops the rest and exits non-zero. Children get
SIGTERM from the kernel if ``up`` itself is killed.

The children inherit the environment, ``LUFTPAUSE_TOKEN`` included (X2); with a
token set, the ``claude mcp add`` line ``up`` prints sends it as
``Authorization: Bearer`` (``--header``, after the URL: Claude Code's
``-H/--header`` takes several values, so it must not come before the name).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from luftpause.cli import COMMANDS, available
from luftpause.config import ConfigError, StackConfig, load_config
from luftpause.procs import ServiceFailed, ServiceProcess, exit_text, launch, stop_all

READY_TIMEOUT_S = 60.0
_SAFE_IN_DOUBLE_QUOTES = re.compile(r'[^"$`\\!\n]*')


@dataclass(frozen=True)
class Planned:
    name: str
    args: list[str]


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


def plan(config: StackConfig, config_path: Path, log_level: str) -> list[Planned]:
    """The children to start, in start order."""
    log = ["--log-level", log_level]
    children = []
    if _has("fake-engine"):
        for eng in config.fakes.engines:
            args = ["fake-engine", "--name", eng.name, "--model", eng.model]
            children.append(
                Planned(
                    f"fake-engine {eng.name}", [*args, "--port", str(eng.port), *eng.args, *log]
                )
            )
    if config.fakes.mcp is not None and _has("fake-mcp"):
        mcp = config.fakes.mcp
        children.append(Planned("fake-mcp", ["fake-mcp", "--port", str(mcp.port), *mcp.args, *log]))
    cfg = ["--config", str(config_path), *log]
    children.append(Planned("scheduler", ["scheduler", *cfg]))
    if _has("dataplane"):
        workers = config.dataplane.workers
        if workers == 1:
            children.append(Planned("dataplane", ["dataplane", *cfg]))
        else:  # one port for all (B6): the kernel spreads connections; each has its own name
            for k in range(1, workers + 1):
                name = "dataplane" if k == 1 else f"dataplane-{k}"
                ident = f"{socket.gethostname()}:{config.dataplane.port}/{k}"
                args = ["dataplane", *cfg, "--reuse-port", "--dataplane-id", ident]
                children.append(Planned(name, args))
    if _has("runtime"):
        children.append(Planned("runtime", ["runtime", *cfg]))
    return children


def _reachable(url: str) -> str:
    """A URL a browser on this machine can open: a wildcard bind becomes loopback."""
    for wildcard in ("//0.0.0.0:", "//[::]:"):
        url = url.replace(wildcard, "//127.0.0.1:")
    return url


def _describe(s: ServiceProcess) -> str:
    urls = s.urls
    if s.name == "scheduler":
        grpc = urls.get("grpc", "").removeprefix("http://")
        link = s.ports.get("link")
        link_text = f"   Link over TCP :{link}" if link else ""
        return f"gRPC {grpc}   status {urls.get('http', '')}/status{link_text}"
    if s.name == "dataplane":
        return f"{urls.get('http', '')}/v1   (OpenAI base_url)"
    if s.name.startswith("dataplane-"):
        return f"{urls.get('http', '')}/v1   (the same port: one more worker)"
    if s.name in ("runtime", "fake-mcp"):
        return f"{urls.get('http', '')}/mcp"
    return urls.get("http", "")


def claude_mcp_add(mcp_url: str, token: str | None) -> str:
    """The shell command that adds the runtime to Claude Code (with the token, if any)."""
    command = f"claude mcp add --transport http luftpause {shlex.quote(mcp_url)}"
    if not token:
        return command
    header = f"Authorization: Bearer {token}"
    quoted = f'"{header}"' if _SAFE_IN_DOUBLE_QUOTES.fullmatch(header) else shlex.quote(header)
    return f"{command} --header {quoted}"


def claude_via(base_url: str, token: str | None) -> str:
    """The shell command that runs Claude Code with its model turns through the dataplane
    at ``base_url`` (Anthropic Messages, B9), sending the token as its API key."""
    key = shlex.quote(token) if token else "unused"
    return f"ANTHROPIC_BASE_URL={shlex.quote(base_url)} ANTHROPIC_API_KEY={key} claude"


def main(args: argparse.Namespace) -> int:
    token = os.environ.get("LUFTPAUSE_TOKEN") or None
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
    started: list[ServiceProcess] = []
    with tempfile.TemporaryDirectory(prefix="luftpause-up-") as tmp:
        try:
            return _run(
                plan(config, config_path.resolve(), args.log_level),
                Path(tmp),
                started,
                lambda: stop_requested,
                config_path,
                token,
            )
        finally:
            for line in stop_all(started):
                print(f"luftpause up: {line}", flush=True)


def _run(
    planned: list[Planned],
    tmp: Path,
    started: list[ServiceProcess],
    stopping: Callable[[], bool],
    config_path: Path,
    token: str | None = None,
) -> int:
    print(f"luftpause up: starting {len(planned)} services from {config_path}", flush=True)
    for i, p in enumerate(planned):
        svc = launch(p.args, name=p.name, ready_file=tmp / f"{i}.json")
        started.append(svc)
        try:
            svc.wait_ready(READY_TIMEOUT_S, stopping)
        except ServiceFailed as exc:
            print(f"luftpause up: {exc}", flush=True)
            return 130 if stopping() else 1
    width = max(len(s.name) for s in started)
    print("\nluftpause is up:", flush=True)
    for s in started:
        print(f"  {s.name:<{width}}  {_describe(s)}")
    runtime = next((s for s in started if s.name == "runtime"), None)
    scheduler = next((s for s in started if s.name == "scheduler"), None)
    if scheduler is not None:
        page = _reachable(f"{scheduler.urls.get('http', '')}/")
        if runtime is not None:
            page += f"?runtime={_reachable(runtime.urls.get('http', ''))}"
        if token:  # the page reads it from the fragment, which no server ever sees
            page += f"#token={quote(token, safe='')}"
        print(f"\nLive status page:\n  {page}   (or: luftpause status --watch)")
    if runtime is not None:
        url = runtime.urls.get("http", "")
        print(f"\nAdd it to Claude Code:\n  {claude_mcp_add(f'{url}/mcp', token)}")
    dataplane = next((s for s in started if s.name == "dataplane"), None)
    if dataplane is not None:
        base = _reachable(dataplane.urls.get("http", ""))
        print(
            f"\nRun Claude Code's own model turns through the proxy:\n  {claude_via(base, token)}"
        )
        print(
            '  (Codex CLI: a provider entry with wire_api = "responses";'
            " see docs/getting-started/clients.md)"
        )
    print("\nPress Ctrl-C to stop everything.", flush=True)
    while not stopping():
        for s in started:
            code = s.proc.poll()
            if code is not None:
                print(f"\nluftpause up: {s.name} {exit_text(code)}; stopping the rest", flush=True)
                return 1
        time.sleep(0.2)
    print("\nluftpause up: stopping", flush=True)
    return 0
