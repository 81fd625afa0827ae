"""Process plumbing shared by every service: sockets, ready files, signals, logging.

Every service binds its own listening sockets (so ``--port 0`` works and the
real port is known before anyone connects), then writes a *ready file*: a small
JSON object ``{"pid": ..., "service": ..., "ports": {name: port}, "urls": {...}}``
written atomically (temp file + rename) once the service accepts connections.
Tests and ``luftpause up`` wait for that file instead of sleeping.

:class:`Bootstrap` is the one life every service process shares: logging,
tracing (:mod:`luftpause.telemetry`), listeners started by the service's start
function, the ready file, SIGTERM/SIGINT, and a graceful stop in a fixed order::

    def main(args):
        boot = Bootstrap("dataplane", args, os.environ)     # logging from here on
        config = load_config_or_exit(args.config)

        async def start(svc: Service) -> int | None:
            sock = svc.bind(port)
            await svc.serve_asgi("http", sock, app)         # ready-file port "http"
            svc.on_ready(lambda: log.info("listening ..."))
            svc.on_stop(client.aclose)
            return None                                     # or a status: stop, not ready

        return boot.run(host, start, instrumentations=(...))

Stop order: listeners stop accepting (uvicorn drains for up to 3 s; gRPC
servers get their own grace), then background tasks are cancelled, then the
``on_stop`` hooks run (last registered first), then spans are flushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import uvicorn

from luftpause.http_errors import MalformedAnswer, json_errors_protocol, plain_error
from luftpause.telemetry import Instrumentation, Tracing, TracingConfigError, setup_tracing

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


def bind_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """Bind a listening TCP socket; port 0 picks a free port. Errors name the address.
    ``reuse_port``: other processes may listen on the same port (``SO_REUSEPORT``; the
    kernel spreads new connections over them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
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


def uvicorn_server(
    app: Any, *, log_level: str = "warning", malformed: MalformedAnswer = plain_error
) -> uvicorn.Server:
    """A uvicorn server that serves on sockets we bound; it does not install signal handlers.
    A request its HTTP parser refuses is answered with ``malformed``'s JSON (see
    :mod:`luftpause.http_errors`), not uvicorn's plain-text 400."""
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
        loop="none",
        http=json_errors_protocol(malformed),  # uvicorn's httptools protocol, JSON 400s
        # No service speaks WebSocket: an Upgrade request is served as plain HTTP, so the
        # app answers it (a WebSocket handshake would be refused by the websockets
        # library in plain text, or with an empty 403, outside the app).
        ws="none",
        # No X-Forwarded-* rewriting: nothing here reads the client's address or scheme.
        proxy_headers=False,
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


# --------------------------------------------------------------------------- bootstrap

StopHook = Callable[[], Awaitable[object] | object]


class Service:
    """Handed to a service's start function: it binds, serves and registers hooks through this.

    ``ports`` fills in as listeners start and becomes the ready file's ``ports``.
    """

    def __init__(self, name: str, host: str, tracing: Tracing, uvicorn_log_level: str) -> None:
        self.name = name
        self.host = host
        self.tracing = tracing
        self.ports: dict[str, int] = {}
        self._uvicorn_log_level = uvicorn_log_level
        self._servers: list[uvicorn.Server] = []
        self._listener_tasks: list[asyncio.Task[None]] = []
        self._listener_stops: list[Callable[[], Awaitable[object]]] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._ready_hooks: list[Callable[[], None]] = []
        self._stop_hooks: list[StopHook] = []
        self._reported: set[asyncio.Task[Any]] = set()

    def bind(self, port: int, host: str | None = None, reuse_port: bool = False) -> socket.socket:
        """A listening socket on ``host`` (default: the service's) and ``port`` (0: any free)."""
        return bind_socket(self.host if host is None else host, port, reuse_port)

    async def serve_asgi(
        self,
        listener: str,
        sock: socket.socket,
        app: Any,
        *,
        log_level: str | None = None,
        malformed: MalformedAnswer = plain_error,
    ) -> uvicorn.Server:
        """Serve ``app`` on ``sock`` (traced when ASGI tracing is on) and wait until it accepts,
        its lifespan start-up included; its port goes into the ready file as ``listener``.
        ``malformed`` builds the JSON 400 for a request the HTTP parser refuses."""
        server = uvicorn_server(
            self.tracing.wrap_asgi(app),
            log_level=log_level or self._uvicorn_log_level,
            malformed=malformed,
        )
        task = asyncio.create_task(server.serve(sockets=[sock]), name=f"{listener} server")
        self._servers.append(server)
        self._listener_tasks.append(task)
        await wait_started(server, task)
        self.ports[listener] = bound_port(sock)
        return server

    def add_listener(self, listener: str, port: int, stop: Callable[[], Awaitable[object]]) -> None:
        """A listener the service started itself (the scheduler's gRPC server): its port goes
        into the ready file; ``stop()`` runs when the HTTP listeners stop accepting."""
        self.ports[listener] = port
        self._listener_stops.append(stop)

    def task(self, work: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Background work for the life of the service: cancelled at stop; if it ends first,
        the service stops (with status 1 when it raised)."""
        task = asyncio.create_task(work, name=name)
        self._tasks.append(task)
        return task

    def on_ready(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` once the ready file is written (the "listening on" log line)."""
        self._ready_hooks.append(hook)

    def on_stop(self, hook: StopHook) -> None:
        """Run ``hook`` (sync or async) after listeners and tasks have stopped; hooks run
        last registered first, and one that fails is logged without stopping the others."""
        self._stop_hooks.append(hook)

    def _failed(self, task: asyncio.Task[Any]) -> bool:
        """Log a task's failure once; True when it raised."""
        if task in self._reported or not task.done() or task.cancelled():
            return False
        exc = task.exception()
        if exc is None:
            return False
        self._reported.add(task)
        log.error("%s failed: %r", task.get_name(), exc)
        return True

    async def _wait(self, stop: asyncio.Event) -> int:
        """Until a signal, or a listener or task ends; 1 when one of them raised."""
        stopper = asyncio.create_task(stop.wait(), name="stop signal")
        try:
            done, _ = await asyncio.wait(
                [stopper, *self._listener_tasks, *self._tasks],
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            stopper.cancel()
        return 1 if any([self._failed(t) for t in done if t is not stopper]) else 0

    async def _stop(self) -> int:
        rc = 0
        for server in self._servers:
            server.should_exit = True
        for result in await asyncio.gather(
            *(stop() for stop in self._listener_stops), return_exceptions=True
        ):
            if isinstance(result, Exception):
                log.error("stopping a listener failed: %r", result)
                rc = 1
        await asyncio.gather(*self._listener_tasks, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if any([self._failed(t) for t in self._listener_tasks]):
            rc = 1
        for hook in reversed(self._stop_hooks):
            try:
                result = hook()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("stop hook %r failed", hook)
                rc = 1
        return rc


class Bootstrap:
    """The life of one service process; see the module docstring.

    Creating it configures logging (so configuration errors that follow are
    logged alike); :meth:`run` does the rest and returns the exit status.
    ``args`` carries ``ready_file`` and ``log_level`` (:func:`add_service_arguments`).
    ``env`` is the process environment, read for the ``OTEL_*`` tracing settings.
    """

    def __init__(
        self, service: str, args: Any, env: Mapping[str, str], *, label: str | None = None
    ) -> None:
        self.service = service
        self.env = env
        self.ready_file: str | None = getattr(args, "ready_file", None)
        self.log_level: str = getattr(args, "log_level", "INFO")
        setup_logging(label or service, self.log_level)

    def run(
        self,
        host: str,
        start: Callable[[Service], Awaitable[int | None]],
        *,
        instrumentations: Iterable[Instrumentation] = (),
        instance: str | None = None,
    ) -> int:
        """Set up tracing, run ``start`` on the event loop, write the ready file, serve until
        SIGTERM/SIGINT (or a listener or task ends), stop, flush spans.

        ``start`` returns None once everything it serves is started, or an exit status to
        stop without becoming ready (after printing why).
        """
        try:
            tracing = setup_tracing(self.service, self.env, instrumentations, instance=instance)
        except TracingConfigError as exc:
            print(f"luftpause {self.service}: {exc}", file=sys.stderr)
            return 2
        try:
            return run_async(lambda stop: self._serve(host, start, tracing, stop))
        finally:
            tracing.shutdown()

    async def _serve(
        self,
        host: str,
        start: Callable[[Service], Awaitable[int | None]],
        tracing: Tracing,
        stop: asyncio.Event,
    ) -> int:
        svc = Service(
            self.service, host, tracing, "debug" if self.log_level == "DEBUG" else "warning"
        )
        try:
            code = await start(svc)
        except BaseException:
            with contextlib.suppress(Exception):
                await svc._stop()
            raise
        if code is not None:
            await svc._stop()
            return code
        if stop.is_set():  # asked to stop while starting: never announce readiness
            return await svc._stop()
        # What start-up made (modules, wire types, the app) lives as long as the process:
        # out of the collector's sight, a full collection scans only what serving makes.
        # Otherwise one takes ~150 ms in the dataplane (its ~240,000 start-up objects), a
        # stall every turn in flight waits through.
        gc.collect()
        gc.freeze()
        write_ready_file(self.ready_file, self.service, svc.ports, host)
        for hook in svc._ready_hooks:
            hook()
        rc = await svc._wait(stop)
        return max(rc, await svc._stop())
