"""Process plumbing shared by every service: sockets, ready files, signals, logging.

Every service binds its own listening sockets (so ``--port 0`` works and the
real port is known before anyone connects), then writes a *ready file*: a small
JSON object ``{"pid": ..., "service": ..., "ports": {name: port}, "urls": {...}}``
written atomically (temp file + rename) once the service accepts connections.
Tests and ``luftpause up`` wait for that file instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn

log = logging.getLogger("luftpause")


def setup_logging(service: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Per-request client logs drown the service's own; keep them for debugging only.
    for noisy in ("httpx", "httpx2", "httpcore", "mcp", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket; port 0 picks a free port. Errors name the address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def bound_port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def write_ready_file(
    path: str | Path | None, service: str, ports: dict[str, int], host: str
) -> None:
    """Atomically write the ready file (no-op when ``path`` is None)."""
    if path is None:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    urls = {name: f"http://{host}:{port}" for name, port in ports.items()}
    payload: dict[str, Any] = {"pid": os.getpid(), "service": service, "ports": ports, "urls": urls}
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, target)


def uvicorn_server(app: Any, *, log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server that serves on sockets we bound; it does not install signal handlers."""
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
        loop="none",
        http="httptools",
    )
    return _Server(config)


class _Server(uvicorn.Server):
    """Leaves signals to ``run_async``: one process may host several servers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def wait_started(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    """Wait until uvicorn has run its lifespan startup and is accepting."""
    while not server.started:
        if task.done():
            task.result()  # raises the startup failure
            raise SystemExit("server stopped during start-up")
        await asyncio.sleep(0.01)


def run_async(main: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run ``main(stop)`` on uvloop; SIGTERM and SIGINT set ``stop``."""
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but keep a fallback
        loop_factory = None

    async def wrapper() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await main(stop)

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(wrapper())


def add_service_arguments(parser: Any, *, port_help: str, config: bool = True) -> None:
    """Flags every service shares: where it listens, its ready file, its log level."""
    if config:
        parser.add_argument(
            "--config",
            metavar="FILE",
            help="stack configuration (TOML); default: the packaged fake stack",
        )
    default_host = "from the config" if config else "127.0.0.1"
    parser.add_argument("--host", help=f"address to listen on (default: {default_host})")
    parser.add_argument("--port", type=int, help=f"{port_help}; 0 picks a free port")
    parser.add_argument(
        "--ready-file",
        metavar="PATH",
        help="write {pid, ports, urls} as JSON here once accepting connections",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log verbosity on stderr (default: INFO)",
    )


def load_config_or_exit(path: str | None) -> Any:
    """Load the stack config; on error print the message and exit with status 2."""
    from luftpause.config import ConfigError, load_config

    try:
        config, _ = load_config(path)
    except ConfigError as exc:
        print(f"luftpause: configuration error:\n{exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return config
