"""``luftpause scheduler``: the gRPC host (:5000) and the status HTTP server (:5001)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from luftpause.config import EndpointKind as ConfigKind
from luftpause.config import StackConfig, load_secrets
from luftpause.scheduler.core import EndpointKind, Params, ReplicaSpec, initial_state
from luftpause.scheduler.service.grpc_server import start_grpc
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.probe import Prober
from luftpause.scheduler.service.status_http import status_app
from luftpause.serving import (
    add_service_arguments,
    bind_socket,
    bound_port,
    load_config_or_exit,
    run_async,
    setup_logging,
    uvicorn_server,
    wait_started,
    write_ready_file,
)

log = logging.getLogger("luftpause.scheduler")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(parser, port_help="gRPC port (default: scheduler.grpc_port, 5000)")
    parser.add_argument(
        "--http-port",
        type=int,
        help="status HTTP port (default: scheduler.http_port, 5001); 0 picks a free port",
    )


def replica_specs(config: StackConfig) -> tuple[ReplicaSpec, ...]:
    return tuple(
        ReplicaSpec(
            name=e.name,
            kind=EndpointKind.SINGLE_PASS
            if e.kind is ConfigKind.SINGLE_PASS
            else EndpointKind.GENERATIVE,
            models=frozenset(e.models),
            orders_classes=e.class_priority is not None,
        )
        for e in config.endpoints
    )


def main(args: argparse.Namespace) -> int:
    setup_logging("scheduler", args.log_level)
    config: StackConfig = load_config_or_exit(args.config)
    try:
        secrets = load_secrets(config)
    except Exception as exc:  # ConfigError: a named key is missing
        print(f"luftpause scheduler: {exc}")
        return 2
    settings = config.scheduler
    host_addr = args.host or settings.host
    grpc_port = settings.grpc_port if args.port is None else args.port
    http_port = settings.http_port if args.http_port is None else args.http_port
    if not config.endpoints:
        log.warning("no endpoints configured: every turn will be rejected as an unknown model")

    async def serve(stop: asyncio.Event) -> int:
        clock = time.monotonic
        params = Params(
            turn_timeout_s=settings.turn_timeout_s,
            run_idle_expiry_s=settings.run_idle_expiry_s,
            dataplane_grace_s=settings.dataplane_grace_s,
            cap_raise_step=settings.cap_raise_step,
            keep_prefixes=settings.keep_prefixes,
            prefix_miss_share=settings.prefix_miss_share,
            queue_probes=settings.queue_probes,
        )
        host = Host(initial_state(replica_specs(config), params, clock()), clock)
        writer = asyncio.create_task(host.run(), name="writer")
        prober = Prober(config.endpoints, secrets.api_keys, settings.probe_period_s, host.post)
        await prober.probe_all()  # know the pool before admitting anything
        urls = {e.name: e.url for e in config.endpoints}
        grpc_server, bound_grpc = await start_grpc(host, urls, f"{host_addr}:{grpc_port}")
        sock = bind_socket(host_addr, http_port)
        started = time.time()
        http = uvicorn_server(
            status_app(
                host,
                clock,
                lambda: {"grpc_port": bound_grpc, "uptime_s": round(time.time() - started, 1)},
            )
        )
        http_task = asyncio.create_task(http.serve(sockets=[sock]), name="status-http")
        await wait_started(http, http_task)
        tasks = [
            writer,
            http_task,
            asyncio.create_task(prober.run_forever(), name="prober"),
            asyncio.create_task(host.tick_forever(settings.clock_tick_s), name="clock"),
        ]
        ports = {"grpc": bound_grpc, "http": bound_port(sock)}
        write_ready_file(args.ready_file, "scheduler", ports, host_addr)
        log.info(
            "scheduler listening: gRPC %s:%d, status http://%s:%d/status, %d replicas",
            host_addr,
            bound_grpc,
            host_addr,
            ports["http"],
            len(config.endpoints),
        )
        stop_task = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stop_task, *tasks], return_when=asyncio.FIRST_COMPLETED)
        rc = 0
        for task in done:
            if task is not stop_task and task.exception() is not None:
                log.error("%s failed: %r", task.get_name(), task.exception())
                rc = 1
        http.should_exit = True
        await grpc_server.stop(grace=1.0)
        for task in tasks:
            if task is not http_task:
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await prober.client.aclose()
        return rc

    return run_async(serve)
