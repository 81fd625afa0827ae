"""The ``luftpause fake-engine`` entry point (H1): parse once, bind, serve until stopped."""

from __future__ import annotations

import argparse
import logging
import os

from luftpause.fakes.engine.server.app import create_app
from luftpause.fakes.engine.server.settings import config_from_args
from luftpause.serving import Bootstrap, Service, bind_socket

log = logging.getLogger("luftpause.fake_engine")


def main(args: argparse.Namespace) -> int:
    boot = Bootstrap("fake-engine", args, os.environ, label=f"fake-engine[{args.name}]")
    config = config_from_args(args)
    host = args.host or "127.0.0.1"
    port = 8001 if args.port is None else args.port
    sock = bind_socket(host, port)
    app = create_app(config)

    async def start(svc: Service) -> None:
        await svc.serve_asgi("http", sock, app)
        svc.on_ready(
            lambda: log.info(
                "fake engine %s serving %s on http://%s:%d (time scale %g)",
                config.name,
                ", ".join(config.models),
                host,
                svc.ports["http"],
                config.params.time_scale,
            )
        )

    # No ASGI wrapper: its send would hide uvicorn's transport from the faults that drop
    # connections. FastAPI's own telemetry makes the server spans.
    return boot.run(host, start, instance=config.name)
