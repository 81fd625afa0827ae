"""``luftpause dataplane``: the OpenAI-compatible proxy on :8080."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import time

from luftpause import callers
from luftpause.config import ConfigError, StackConfig, load_secrets
from luftpause.dataplane.app import create_app
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.engine_http import EngineClient
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.scheduler_link import SchedulerLink
from luftpause.serving import (
    Bootstrap,
    Service,
    add_service_arguments,
    bound_port,
    load_config_or_exit,
)
from luftpause.tool_calls import TOOL_CALL_ORIGINS_MAX, ToolCallOrigins

log = logging.getLogger("luftpause.dataplane")


class _IntentionalAbort(logging.Filter):
    """uvicorn logs an error when a response is left incomplete; for a relay whose
    engine failed mid-stream that is the documented behaviour (D6), already logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "returned without completing response" not in record.getMessage()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(parser, port_help="HTTP port (default: dataplane.port, 8080)")
    parser.add_argument(
        "--scheduler",
        metavar="HOST:PORT",
        help="the scheduler's gRPC address (default: dataplane.scheduler)",
    )
    parser.add_argument(
        "--dataplane-id",
        help=(
            "stable name of this dataplane for resync: give a restarted dataplane the same "
            "name to keep its turns (printable ASCII, at most 128 characters; "
            "default: hostname:port)"
        ),
    )
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="share the port with other dataplanes started the same way (SO_REUSEPORT: "
        "the kernel spreads connections over them); give each its own --dataplane-id. "
        "`luftpause up` does this for dataplane.workers > 1",
    )


def dataplane_id_problem(dataplane_id: str) -> str | None:
    """What is wrong with a ``--dataplane-id`` (shared with ``--check``), or None."""
    if 0 < len(dataplane_id) <= 128 and dataplane_id.isascii() and dataplane_id.isprintable():
        return None
    return f"--dataplane-id must be 1..128 printable ASCII characters, got {dataplane_id[:64]!r}"


def build(config: StackConfig, args: argparse.Namespace, port: int) -> Dataplane:
    settings = config.dataplane
    secrets = load_secrets(config)
    clock = time.monotonic
    runs = RunTable(clock, settings.run_idle_prune_s)
    dataplane_id = args.dataplane_id or f"{socket.gethostname()}:{port}"
    problem = dataplane_id_problem(dataplane_id)
    if problem:
        raise ConfigError(problem)
    link = SchedulerLink(
        args.scheduler or settings.scheduler,
        dataplane_id,
        runs,
        settings.report_reconnect_s,
        token=secrets.token,
        report_flush_s=settings.report_flush_ms / 1000,
        tcp_link=settings.tcp_link,
    )
    http = EngineClient(settings.engine_connect_timeout_s)
    gate = callers.gate_for(config.callers, os.environ, secrets.token)
    return Dataplane(
        settings=settings,
        endpoints={e.name: e for e in config.endpoints},
        secrets=secrets,
        link=link,
        runs=runs,
        memory=ToolCallOrigins(clock, settings.tool_call_id_memory_s, TOOL_CALL_ORIGINS_MAX),
        http=http,
        metrics=Metrics(),
        gate=gate,
    )


def main(args: argparse.Namespace) -> int:
    boot = Bootstrap("dataplane", args, os.environ)
    logging.getLogger("uvicorn.error").addFilter(_IntentionalAbort())
    config: StackConfig = load_config_or_exit(args.config)
    host = args.host or config.dataplane.host
    port = config.dataplane.port if args.port is None else args.port

    async def start(svc: Service) -> int | None:
        sock = svc.bind(port, reuse_port=args.reuse_port)
        try:
            dp = build(config, args, bound_port(sock))
        except ConfigError as exc:
            print(f"luftpause dataplane: {exc}")
            return 2
        if dp.secrets.token is None:
            log.warning("LUFTPAUSE_TOKEN is not set: every request is accepted without auth")
        elif dp.gate.keyring is not None:
            callers.install_reload_signal(dp.gate)
            log.info(
                "%d callers with %d keys (key files checked every %g s; SIGHUP re-reads them)",
                len(config.callers),
                len(dp.gate.keyring),
                callers.CHECK_EVERY_S,
            )
        svc.on_stop(dp.http.close)
        svc.on_stop(dp.link.close)
        app = create_app(dp)
        await svc.serve_asgi("http", sock, app, malformed=app.malformed)
        svc.on_ready(
            lambda: log.info(
                "dataplane listening on http://%s:%d/v1 (scheduler %s)",
                host,
                svc.ports["http"],
                dp.link.address,
            )
        )
        return None

    # Server spans come from FastAPI's own telemetry, the engine request's client span
    # from the dataplane itself (tracing.start_engine_request); the Admit call carries
    # its trace context in AdmitRequest.traceparent (see luftpause.telemetry for why
    # not gRPC's).
    return boot.run(host, start, instrumentations=())
