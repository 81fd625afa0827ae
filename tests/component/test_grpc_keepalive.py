"""S11: the scheduler's gRPC server lets its dataplanes ping as often as they do.

A dataplane pings every 10 s to notice a vanished scheduler; the server allows one
ping per ``grpc.http2.min_ping_interval_without_data_ms``. Were that option's name
wrong, gRPC would silently keep its default (5 min), count each ping as a strike
and end the dataplane's connection with GOAWAY ``too_many_pings`` after a few.
Here the same options are used with the intervals scaled down (the server allows a
ping every 0.2 s, the client pings every 0.5 s), so the check takes seconds.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from luftpause.scheduler.service.grpc_server import KEEPALIVE_SERVER

PING_OPTION = "grpc.http2.min_ping_interval_without_data_ms"


async def test_idle_stream_survives_the_dataplanes_pings() -> None:
    """S11: an idle stream with keepalive pings is not ended as ``too_many_pings``."""
    assert PING_OPTION in dict(KEEPALIVE_SERVER)
    options = [(k, 200 if k == PING_OPTION else v) for k, v in KEEPALIVE_SERVER]
    server = grpc.aio.server(options=options)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}",
        options=[
            ("grpc.keepalive_time_ms", 500),
            ("grpc.keepalive_timeout_ms", 2_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ],
    )
    try:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        read = asyncio.ensure_future(watch.read())
        done, _ = await asyncio.wait({read}, timeout=4.0)  # ~8 pings
        assert not done, f"the idle stream ended: {read.exception() or read.result()}"
        read.cancel()
        watch.cancel()
    finally:
        await channel.close()
        await server.stop(grace=0)
