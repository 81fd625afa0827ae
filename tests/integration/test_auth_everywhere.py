"""X2, D9: with ``LUFTPAUSE_TOKEN`` set, every port of every service refuses a request
without it — the scheduler's gRPC (UNAUTHENTICATED), its Link over TCP (refused in the
welcome) and HTTP ``/status``, the
dataplane's ``/v1`` routes, the runtime's ``/mcp`` and ``/status`` — and the stack
works end to end with it: the dataplane sends the token to the scheduler, the runtime
sends it to the dataplane."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fullstack import MODEL, start_scheduler_and_dataplane, write_config, write_runtime_config

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from luftpause.linkwire import FrameReader, frame

pytestmark = pytest.mark.integration

TOKEN = "every-port-token"
ENV = {"LUFTPAUSE_TOKEN": TOKEN}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_every_port_needs_the_token(services: Any, tmp_path: Path) -> None:
    engine = services.start(
        "fake-engine", "--port", "0", "--name", "engine-a", "--time-scale", "50",
        "--log-level", "WARNING", name="engine-a",
    )  # fmt: skip
    tools = services.start("fake-mcp", "--port", "0", "--lookup-delay-s", "0.01")
    config = write_config(tmp_path / "stack.toml", {"engine-a": engine.urls["http"]})
    sched, dp = start_scheduler_and_dataplane(services, config, ENV, ENV)
    runtime_config = write_runtime_config(tmp_path, dp.urls["http"], tools.urls["http"])
    runtime = services.start(
        "runtime", "--config", str(runtime_config), "--port", "0", env=ENV, name="runtime"
    )

    # The scheduler's gRPC: refused without the token, served with it.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sched.ports['grpc']}") as channel:
        stub = pb_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.RunEnded(pb.RunEndedRequest(run_id="x"))
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        await stub.RunEnded(
            pb.RunEndedRequest(run_id="x"), metadata=(("authorization", AUTH["Authorization"]),)
        )

    # The scheduler's Link over TCP: a hello without the token is refused and closed.
    reader, writer = await asyncio.open_connection("127.0.0.1", sched.ports["link"])
    writer.write(frame(pb.LinkHello(dataplane_id="intruder").SerializeToString()))
    frames = FrameReader()
    got: list[bytes] = []
    async with asyncio.timeout(10):
        while data := await reader.read(65536):
            got += frames.feed(data)
    writer.close()
    assert len(got) == 1 and pb.LinkWelcome.FromString(got[0]).refused

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    guarded = [
        ("GET", f"{sched.urls['http']}/status", None),
        ("GET", f"{sched.urls['http']}/ui/runtime-status?url={runtime.urls['http']}", None),
        ("GET", f"{sched.urls['http']}/status/runs/r1", None),
        ("POST", f"{dp.urls['http']}/v1/chat/completions", chat),
        ("POST", f"{dp.urls['http']}/v1/messages", {"model": MODEL, "max_tokens": 4}),
        ("POST", f"{dp.urls['http']}/v1/responses", {"model": MODEL, "input": "hi"}),
        ("GET", f"{dp.urls['http']}/v1/models", None),
        ("POST", f"{dp.urls['http']}/v1/decide", {"input": "x"}),
        ("DELETE", f"{dp.urls['http']}/v1/runs/r1", None),
        ("GET", f"{runtime.urls['http']}/status", None),
        ("POST", f"{runtime.urls['http']}/mcp", {"jsonrpc": "2.0", "id": 1, "method": "ping"}),
    ]
    async with httpx.AsyncClient(timeout=30) as c:
        for method, url, body in guarded:
            resp = await c.request(method, url, json=body)
            assert resp.status_code == 401, (method, url, resp.text)
            assert resp.headers["www-authenticate"].lower().startswith("bearer"), url
        for svc in (sched, dp, runtime):
            assert (await c.get(f"{svc.urls['http']}/health")).status_code == 200

        # With the token: a turn goes through the dataplane (which must have linked up to
        # the scheduler with the token), and the scheduler and the runtime answer.
        turn = await c.post(f"{dp.urls['http']}/v1/chat/completions", json=chat, headers=AUTH)
        assert turn.status_code == 200, turn.text
        status = await c.get(f"{sched.urls['http']}/status", headers=AUTH)
        assert status.status_code == 200 and status.json()["replicas"]
        tree = await c.get(
            f"{sched.urls['http']}/ui/runtime-status?url={runtime.urls['http']}", headers=AUTH
        )
        assert tree.status_code == 200 and tree.json()["service"] == "runtime"
