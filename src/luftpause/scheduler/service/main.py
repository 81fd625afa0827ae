"""``luftpause scheduler``: the gRPC host (:5000) and the status HTTP server (:5001)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import dns.asyncresolver
import dns.nameserver
from immutables import Map

from luftpause.config import (
    CallerConfig,
    Endpoint,
    KvRetention,
    SchedulerSettings,
    StackConfig,
    dns_server,
    load_secrets,
)
from luftpause.scheduler.core import (
    CallerPolicy,
    Params,
    ReplicaSpec,
    WorkingSet,
    initial_state,
)
from luftpause.scheduler.service.discovery import DnsSource, MembersFile
from luftpause.scheduler.service.grpc_server import start_grpc
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.membership import Membership, replica_spec
from luftpause.scheduler.service.probe import Prober
from luftpause.scheduler.service.quotas import Quotas, UsageFile
from luftpause.scheduler.service.status_http import status_app
from luftpause.scheduler.service.tcp_link import LinkLimits
from luftpause.serving import Bootstrap, Service, add_service_arguments, load_config_or_exit
from luftpause.telemetry import Instrumentation

log = logging.getLogger("luftpause.scheduler")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(parser, port_help="gRPC port (default: scheduler.grpc_port, 5000)")
    parser.add_argument(
        "--http-port",
        type=int,
        help="status HTTP port (default: scheduler.http_port, 5001); 0 picks a free port",
    )
    parser.add_argument(
        "--link-port",
        type=int,
        help="port of the Link over TCP, which dataplanes learn on resync (default: "
        "scheduler.link_port, 5002; with --port 0, a free port); 0 picks a free port",
    )


def static_endpoints(config: StackConfig) -> tuple[Endpoint, ...]:
    """The configured endpoints that are replicas from the start (a DNS pool's entry is
    not one: its members are, as they are discovered)."""
    return tuple(e for e in config.endpoints if e.discover == "static")


def replica_specs(config: StackConfig) -> tuple[ReplicaSpec, ...]:
    return tuple(replica_spec(e) for e in static_endpoints(config))


def link_port_of(settings: SchedulerSettings, args: argparse.Namespace) -> int | None:
    """The Link-over-TCP port (None: off). A free gRPC port (``--port 0`` or
    ``grpc_port = 0``, as tests and side-by-side stacks start it) means a free one for
    the Link too, unless ``--link-port`` or ``link_port`` names one."""
    if not settings.tcp_link:
        return None
    if args.link_port is not None:
        return int(args.link_port)
    grpc_port = settings.grpc_port if args.port is None else args.port
    if grpc_port == 0 and "link_port" not in settings.model_fields_set:
        return 0
    return settings.link_port


def core_params(
    settings: SchedulerSettings,
    endpoints: Sequence[Endpoint] = (),
    callers: Sequence[CallerConfig] = (),
) -> Params:
    """The core's policy constants from the ``[scheduler]`` table (0 turns a limit off);
    retention times (B8) are computed when an endpoint asks for retention hints; each
    configured caller's weight and in-flight limit (``[[callers]]``, B13)."""
    pace_s, slowdown = settings.pace_targets()
    return Params(
        turn_timeout_s=settings.turn_timeout_s,
        run_idle_expiry_s=settings.run_idle_expiry_s,
        dataplane_grace_s=settings.dataplane_grace_s,
        cap_raise_step=settings.cap_raise_step,
        keep_prefixes=settings.keep_prefixes,
        prefix_miss_share=settings.prefix_miss_share,
        queue_probes=settings.queue_probes,
        initial_cap=settings.initial_cap or None,
        interactive_pace_s=pace_s,
        interactive_slowdown=slowdown,
        target_packing=settings.target_packing,
        pace_min_tokens=settings.pace_min_tokens,
        tool_lease_min_s=settings.tool_lease_min_s,
        tool_lease_default_s=settings.tool_lease_default_s,
        tool_lease_factor=settings.tool_lease_factor,
        kv_retention=any(e.kv_retention is not KvRetention.NONE for e in endpoints),
        working_set=WorkingSet(settings.working_set),
        working_set_share=settings.working_set_share,
        working_set_kv_usage=settings.working_set_kv_usage or None,
        fairness=settings.fairness,
        prompt_weight=settings.prompt_weight,
        completion_weight=settings.completion_weight,
        batch_order=settings.batch_order,
        attained_measure=settings.attained_measure,
        callers=Map({c.name: CallerPolicy(c.weight, c.max_in_flight) for c in callers}),
    )


def dns_resolver(settings: SchedulerSettings) -> dns.asyncresolver.Resolver:
    """The resolver of DNS pools: ``[scheduler] dns_servers``, else the system's."""
    if not settings.dns_servers:
        return dns.asyncresolver.Resolver()
    resolver = dns.asyncresolver.Resolver(configure=False)
    resolver.nameservers = [
        dns.nameserver.Do53Nameserver(*dns_server(server)) for server in settings.dns_servers
    ]
    return resolver


@dataclass(frozen=True)
class Source:
    """A discovery source as the scheduler runs it: once at start, then for good."""

    name: str
    refresh: Callable[[], Awaitable[object]]
    run_forever: Callable[[], Coroutine[Any, Any, None]]


def discovery_sources(config: StackConfig, membership: Membership) -> list[Source]:
    """B11: a DNS source per ``discover = "dns"`` entry, and the members file's."""
    pools = [e for e in config.endpoints if e.discover == "dns"]
    sources: list[Source] = []
    if pools:
        resolver = dns_resolver(config.scheduler)
        for entry in pools:
            pool = DnsSource(entry, membership, resolver)
            sources.append(Source(f"dns {entry.name}", pool.refresh, pool.run_forever))
    path = config.scheduler.members_file
    if path:
        watched = MembersFile(
            path, membership.entries, membership, config.scheduler.members_file_every_s
        )
        sources.append(Source("members file", _async(watched.poll), watched.run_forever))
    return sources


async def discover_first(sources: Sequence[Source], timeout_s: float = 10.0) -> None:
    """Each source once, together, bounded: a DNS server that does not answer leaves its
    pool empty until the source's next round, it does not hold the scheduler's start."""
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(s.refresh() for s in sources))
    except TimeoutError:
        log.warning("discovery: no answer within %g s at start; pools fill as it comes", timeout_s)


def _async(call: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    async def run() -> object:
        return call()

    return run


def link_limits(settings: SchedulerSettings) -> LinkLimits:
    """What a Link connection not yet welcomed may hold, from the ``[scheduler]`` table."""
    return LinkLimits(
        hello_timeout_s=settings.link_hello_timeout_s,
        max_unauthenticated=settings.link_max_unauthenticated,
    )


def start_usage(settings: SchedulerSettings, quotas: Quotas, svc: Service) -> UsageFile | None:
    """B13: today's token usage from ``[scheduler] usage_file`` (written every few
    seconds while it changes and at shutdown); without one, a warning if any caller has
    a daily budget, which a restart then starts afresh."""
    if not settings.usage_file:
        if quotas.has_daily:
            log.warning(
                "callers have daily_tokens but [scheduler] usage_file is not set: the day's "
                "usage is kept in memory only, and a restarted scheduler starts every "
                "budget afresh"
            )
        return None
    usage = UsageFile(settings.usage_file, quotas)
    usage.load(time.time())
    svc.on_stop(lambda: usage.close(time.time()))
    return usage


def main(args: argparse.Namespace) -> int:
    boot = Bootstrap("scheduler", args, os.environ)
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
    link_port = link_port_of(settings, args)
    if not config.endpoints:
        log.warning("no endpoints configured: every turn will be rejected as an unknown model")
    if secrets.token is None:
        log.warning(
            "LUFTPAUSE_TOKEN is not set: gRPC and /status accept every request (anyone who "
            "reaches these ports can end any run)"
        )

    async def start(svc: Service) -> None:
        clock = time.monotonic
        params = core_params(settings, config.endpoints, config.callers)
        quotas = Quotas.of(config.callers)  # B13: tokens_per_minute, daily_tokens
        usage = start_usage(settings, quotas, svc)
        host = Host(initial_state(replica_specs(config), params, clock()), clock, quotas)
        svc.task(host.run(), name="writer")
        if usage is not None:
            svc.task(usage.save_forever(time.time), name="usage file")
        static = static_endpoints(config)
        prober = Prober(static, secrets.api_keys, settings.probe_period_s, host.post)
        svc.on_stop(prober.client.aclose)
        urls = {e.name: e.url for e in static}  # (members join it: B11)
        membership = Membership(config.endpoints, host, prober, urls)
        sources = discovery_sources(config, membership)
        if sources:  # B11: the pools' members too (the prober probes those that joined)
            await discover_first(sources)
        await prober.probe_all()  # know the pool before admitting anything
        listeners = await start_grpc(
            host,
            urls,
            f"{host_addr}:{grpc_port}",
            secrets.token,
            config.dataplane.tool_call_id_memory_s,
            link_port,
            link_limits(settings),
        )
        bound_grpc = listeners.port
        svc.add_listener("grpc", bound_grpc, lambda: listeners.stop(grace=1.0))
        if listeners.link is not None:
            svc.add_listener("link", listeners.link_port, _nothing)
        sock = svc.bind(http_port)
        started = time.time()
        app = status_app(
            host,
            clock,
            lambda: {"grpc_port": bound_grpc, "uptime_s": round(time.time() - started, 1)},
            runtimes=settings.status_runtimes,
            token=secrets.token,
            membership=membership,
        )
        await svc.serve_asgi("http", sock, app)
        svc.task(prober.run_forever(), name="prober")
        for source in sources:
            svc.task(source.run_forever(), name=f"discovery {source.name}")
        svc.task(host.tick_forever(settings.clock_tick_s), name="clock")
        svc.on_ready(
            lambda: log.info(
                "scheduler listening: gRPC %s:%d, Link over TCP %s, status http://%s:%d/status, "
                "%d replicas",
                host_addr,
                bound_grpc,
                f"{host_addr}:{listeners.link_port}" if listeners.link else "off",
                host_addr,
                svc.ports["http"],
                len(config.endpoints),
            )
        )

    # The admit span continues AdmitRequest.traceparent; no gRPC server spans (see
    # luftpause.telemetry).
    return boot.run(host_addr, start, instrumentations=(Instrumentation.ASGI,))


async def _nothing() -> None:
    """The Link's listener stops with the gRPC server's (``SchedulerServer.stop``)."""
