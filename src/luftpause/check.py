"""``luftpause scheduler|dataplane|runtime ... --check``: is this configuration usable?

The check does what the service would do before it listens, and nothing after:
read the stack file (with the environment variables its strings name), validate
it, look for the secrets the service needs (each endpoint's ``api_key_env`` for
the scheduler and the dataplane), parse the tracing variables and the service's
own command-line overrides. It opens no socket and writes no file, so it runs
anywhere the command line would, e.g. to verify a compose file's commands.

Usable: a one-screen summary on stdout (where it listens, its peers, the
replicas with their models, auth and tracing; never a secret's value), exit 0.
Not usable: every problem found on stderr, exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from luftpause import callers
from luftpause.config import (
    ConfigError,
    EndpointKind,
    MetricsFlavour,
    StackConfig,
    default_config_path,
    load_config,
    load_secrets,
)
from luftpause.telemetry import TracingConfigError, TracingSettings


def add_check_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help=(
            "validate the configuration (the file, the environment variables it names, "
            "the secrets this service needs, these flags), print a summary and exit: "
            "0 usable, 2 not; starts nothing"
        ),
    )


def port_problem(flag: str, value: int | None) -> str | None:
    if value is not None and not 0 <= value <= 65535:
        return f"{flag} {value} is not a port number (0..65535; 0 picks a free port)"
    return None


def _address_problem(flag: str, value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"{flag} {value!r} is not HOST:PORT with a port from 1 to 65535"
    return None


def _found(*problems: str | None) -> list[str]:
    return [p for p in problems if p is not None]


def _endpoint_lines(config: StackConfig, environ: Mapping[str, str]) -> list[str]:
    if not config.endpoints:
        return ["  replicas     none: every turn is rejected as an unknown model"]
    generative = sum(e.kind is EndpointKind.GENERATIVE for e in config.endpoints)
    single = len(config.endpoints) - generative
    lines = [
        f"  replicas     {len(config.endpoints)} ({generative} generative, {single} single-pass)"
    ]
    width = max(len(e.name) for e in config.endpoints)
    for e in config.endpoints:
        if e.metrics is MetricsFlavour.NONE:
            load = "none (never capped)"
        else:
            load = f"{e.metrics.value} {e.metrics_path}"
        health = e.health_path or "(not probed)"
        extra = ""
        if e.api_key_env:
            state = "set" if environ.get(e.api_key_env) else "NOT SET"
            extra += f", key ${e.api_key_env} ({state})"
        if e.class_priority is not None:
            extra += (
                f", priority interactive={e.class_priority.interactive} "
                f"batch={e.class_priority.batch}"
            )
        if e.load_from:
            extra += f", load from {', '.join(e.load_from)}"
        if e.native_apis:
            extra += f", serves {', '.join(a.value for a in e.native_apis)} natively"
        if e.vision:
            extra += ", vision (takes images)"
        lines.append(f"    {e.name:<{width}}  {e.kind.value:<11}  {e.url}")
        lines.append(
            f"    {'':<{width}}  models {', '.join(e.models)}; load {load}; health {health}{extra}"
        )
    return lines


def _service_lines(
    service: str, config: StackConfig, args: argparse.Namespace
) -> tuple[list[str], list[str]]:
    """The service's own lines of the summary and the problems with its flags."""
    lines: list[str] = []
    problems: list[str] = []
    if service == "scheduler":
        s = config.scheduler
        grpc = s.grpc_port if args.port is None else args.port
        http = s.http_port if args.http_port is None else args.http_port
        from luftpause.scheduler.service.main import link_port_of

        problems += _found(
            port_problem("--port", args.port),
            port_problem("--http-port", args.http_port),
            port_problem("--link-port", args.link_port),
        )
        link = link_port_of(s, args)
        link_text = "off" if link is None else "a free port" if link == 0 else str(link)
        lines.append(
            f"  listens on   {args.host or s.host}: gRPC {grpc}, status HTTP {http}, "
            f"Link over TCP {link_text}"
        )
        lines.append(
            f"  probes       every {s.probe_period_s:g} s; turn timeout {s.turn_timeout_s:g} s"
        )
        if s.status_runtimes:
            lines.append(f"  status page  may show runtimes {', '.join(s.status_runtimes)}")
    elif service == "dataplane":
        d = config.dataplane
        port = d.port if args.port is None else args.port
        scheduler = args.scheduler or d.scheduler
        from luftpause.dataplane.main import dataplane_id_problem

        problems += _found(
            port_problem("--port", args.port),
            _address_problem("--scheduler" if args.scheduler else "dataplane.scheduler", scheduler),
            dataplane_id_problem(args.dataplane_id) if args.dataplane_id is not None else None,
        )
        lines.append(f"  listens on   {args.host or d.host}:{port} (/v1, /metrics, /health)")
        lines.append(f"  scheduler    {scheduler} (gRPC)")
        aliases = [f"{alias} -> {target}" for alias, target in d.model_aliases.items()]
        lines.append(f"  aliases      {', '.join(aliases) if aliases else 'none'}")
        lines.append(
            "  sessions     Claude Code, Codex"
            + (f", then {', '.join(d.session_headers)}" if d.session_headers else "")
        )
    else:
        from luftpause.runtime.main import settings_from

        try:
            r = settings_from(config, args)
        except SystemExit as exc:  # a bad override: the message names it
            problems.append(str(exc.code))
            return lines, problems
        state = Path(r.state_dir)
        where = "exists here" if state.is_dir() else "absent here: created at start"
        lines.append(f"  listens on   {r.host}:{r.port} (/mcp, /status, /health)")
        lines.append(f"  dataplane    {r.dataplane_url}")
        lines.append(f"  state dir    {r.state_dir} ({where})")
        lines.append(f"  model        {r.default_model or '(the first model the dataplane lists)'}")
        servers = [f"{t.name} ({t.url or ' '.join(t.command)})" for t in r.tool_servers]
        lines.append(f"  tool servers {', '.join(servers) if servers else 'none'}")
    return lines, problems


def run_check(
    service: str,
    args: argparse.Namespace,
    environ: Mapping[str, str],
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Check ``service``'s configuration as its ``main(args)`` would load it; 0 or 2."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    prefix = f"luftpause {service} --check"
    path = Path(args.config) if args.config else default_config_path()
    try:
        config, _ = load_config(path, environ)
    except ConfigError as exc:
        print(f"{prefix}: configuration error:\n{exc}", file=err)
        return 2

    lines, problems = _service_lines(service, config, args)
    if service in ("scheduler", "dataplane"):
        # The keys are read to prove they are there; the summary never shows a value.
        # (The runtime needs the token only: engine keys are the dataplane's business.)
        try:
            load_secrets(config, environ)
        except ConfigError as exc:
            problems.append(str(exc))
    keys = 0
    if config.callers and service in ("dataplane", "runtime"):
        # B13: the callers' keys are read as the service reads them (never shown)
        try:
            gate = callers.gate_for(config.callers, environ, environ.get("LUFTPAUSE_TOKEN") or None)
            keys = len(gate.keyring) if gate.keyring is not None else 0
        except ConfigError as exc:
            problems.append(str(exc))
    if config.callers and service == "runtime":
        try:
            load_secrets(config.model_copy(update={"endpoints": ()}), environ)
        except ConfigError as exc:  # (callers need the token)
            problems.append(str(exc))
    try:
        tracing = TracingSettings.from_env(environ)
    except TracingConfigError as exc:
        problems.append(f"tracing: {exc}")
        tracing = None
    if problems:
        print(f"{prefix}: {path} is not usable:", file=err)
        for problem in problems:
            print(f"  {problem}", file=err)
        return 2

    token = environ.get("LUFTPAUSE_TOKEN") or None
    summary = [f"{prefix}: {path} is usable", *lines]
    if service in ("scheduler", "dataplane"):
        summary += _endpoint_lines(config, environ)
    auth = "required (LUFTPAUSE_TOKEN is set)" if token else "OFF (LUFTPAUSE_TOKEN is not set)"
    summary.append(f"  auth         {auth}")
    if config.callers:
        names = ", ".join(c.name for c in config.callers)
        loaded = f"; {keys} keys" if service in ("dataplane", "runtime") else ""
        summary.append(f"  callers      {len(config.callers)} ({names}){loaded}")
    summary.append(
        f"  tracing      {tracing.protocol} to {tracing.endpoint}"
        if tracing is not None
        else "  tracing      off (no OTEL_EXPORTER_OTLP_ENDPOINT)"
    )
    print("\n".join(summary), file=out)
    return 0
