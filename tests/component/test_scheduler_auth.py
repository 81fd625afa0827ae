"""X2: with a token, the scheduler's own ports need it — every gRPC Scheduler call and
the HTTP ``/status`` and page data — and the dataplane sends it. The health checks,
``/metrics`` and the page's static files stay open."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.scheduler_link import SchedulerLink
from luftpause.scheduler.core import EndpointKind, Params, ReplicaProbed, ReplicaSpec, initial_state
from luftpause.scheduler.service.grpc_server import SchedulerServer, start_grpc
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.status_http import status_app

TOKEN = "s3cret"
SPECS = (ReplicaSpec("a", EndpointKind.GENERATIVE, frozenset({"m"})),)


async def _scheduler() -> tuple[Host, SchedulerServer, int, asyncio.Task[None]]:
    host = Host(initial_state(SPECS, Params(), time.monotonic()), time.monotonic)
    writer = asyncio.create_task(host.run())
    listeners = await start_grpc(host, {"a": "http://a.invalid"}, "127.0.0.1:0", TOKEN)
    server, port = listeners, listeners.port
    await host.apply(lambda at: ReplicaProbed(at=at, replica="a", healthy=True))
    return host, server, port, writer


def _admit(turn: str) -> pb.AdmitRequest:
    return pb.AdmitRequest(
        turn_id=turn,
        run_id="r",
        model="m",
        service_class=pb.SERVICE_CLASS_BATCH,
        kind=pb.ENDPOINT_KIND_GENERATIVE,
    )


async def test_grpc_calls_need_the_token_and_health_does_not() -> None:
    """X2: without the token (or with a wrong one) every Scheduler call ends
    UNAUTHENTICATED; with it (any case of the scheme) it is served; health is open."""
    host, server, port, writer = await _scheduler()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]
    try:
        for metadata in ((), (("authorization", "Bearer nope"),), (("authorization", TOKEN),)):
            for call in (
                stub.Admit(_admit("t0"), metadata=metadata),
                stub.Resync(pb.ResyncRequest(dataplane_id="x"), metadata=metadata),
                stub.RunEnded(pb.RunEndedRequest(run_id="r"), metadata=metadata),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
                assert "bearer token" in (refused.value.details() or "")
            # The streams are opened without writing: a message written while the
            # server's refusal is on its way fails in grpc's client with INTERNAL
            # ("Failed execute_batch"), a race of the client library, not a refusal
            # of ours. The dataplane itself always meets the refusal on Resync first.
            report = stub.Report(metadata=metadata, timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await report
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
            link = stub.Link(metadata=metadata, timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await link.read()
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert not host.state.turns  # nothing got through
        for scheme in ("Bearer", "bearer", "BEARER"):
            ok = await stub.Admit(
                _admit(f"t-{scheme}"), metadata=(("authorization", f"{scheme} {TOKEN}"),)
            )
            assert ok.admitted.replica == "a"
        health = health_pb2_grpc.HealthStub(channel)
        served = await health.Check(health_pb2.HealthCheckRequest())
        assert served.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await channel.close()
        await server.stop(grace=0)
        writer.cancel()


async def test_the_dataplane_sends_the_token_and_says_when_it_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """X2: a dataplane with the stack's token links up (resync, reports, admission); one
    with another token never does, and logs an error saying why, while turns wait."""
    _, server, port, writer = await _scheduler()
    good = SchedulerLink(f"127.0.0.1:{port}", "dp-good", RunTable(time.monotonic, 60), 0.05, TOKEN)
    bad = SchedulerLink(f"127.0.0.1:{port}", "dp-bad", RunTable(time.monotonic, 60), 0.05, "other")
    tasks = [asyncio.create_task(good.maintain()), asyncio.create_task(bad.maintain())]
    try:
        with caplog.at_level(logging.ERROR, logger="luftpause.dataplane"):
            async with asyncio.timeout(10):
                await good.ready.wait()
                while "refused this dataplane's token" not in caplog.text:
                    await asyncio.sleep(0.05)
        assert not bad.ready.is_set()
        admitted = await good.admit(_admit("t1"))
        assert getattr(admitted, "replica", None) == "a"
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await good.close()
        await bad.close()
        await server.stop(grace=0)
        writer.cancel()


async def test_status_and_page_data_need_the_token_the_page_does_not() -> None:
    """X2, S12: ``/status`` and ``/ui/runtime-status`` answer 401 with ``WWW-Authenticate``
    without the token; the page, its assets, ``/health`` and ``/metrics`` are served."""
    host = Host(initial_state(SPECS, Params(), time.monotonic()), time.monotonic)
    app = status_app(host, time.monotonic, dict, token=TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://s") as c:
        for path in ("/status", "/status/runs/r1", "/ui/runtime-status?url=http://127.0.0.1:1"):
            for headers in ({}, {"authorization": "Bearer nope"}):
                refused = await c.get(path, headers=headers)
                assert refused.status_code == 401, path
                assert refused.headers["www-authenticate"] == "Bearer"
                assert "bearer token" in refused.json()["error"]["message"]
        ok = await c.get("/status", headers={"authorization": f"bearer {TOKEN}"})
        assert ok.status_code == 200 and "replicas" in ok.json()
        for path in ("/", "/ui/status.js", "/ui/status.css", "/health", "/metrics"):
            assert (await c.get(path)).status_code == 200, path
