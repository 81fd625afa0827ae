"""The scheduler as a real process, probing a tiny HTTP engine stand-in."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import httpx
import pytest

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration


class Engine:
    """Serves /health and SGLang-style /metrics with values a test can change."""

    def __init__(self) -> None:
        self.healthy = True
        self.running = 0
        self.waiting = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/health":
                    code, body = (200, "ok") if engine.healthy else (503, "down")
                elif self.path == "/metrics":
                    code, body = (
                        200,
                        (
                            "# TYPE sglang:num_running_reqs gauge\n"
                            f'sglang:num_running_reqs{{model_name="m"}} {engine.running}\n'
                            "# TYPE sglang:num_queue_reqs gauge\n"
                            f'sglang:num_queue_reqs{{model_name="m"}} {engine.waiting}\n'
                        ),
                    )
                else:
                    code, body = 404, "no"
                self.send_response(code)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.server.shutdown()


def config_for(tmp_path: Path, engine: Engine) -> str:
    path = tmp_path / "stack.toml"
    path.write_text(f"""
[scheduler]
probe_period_s = 0.2
[[endpoints]]
name = "eng"
url = "{engine.url}"
models = ["m"]
metrics = "sglang"
""")
    return str(path)


async def status(url: str) -> dict:  # type: ignore[type-arg]
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{url}/status", timeout=5)).json()  # type: ignore[no-any-return]


async def eventually(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


def req(turn: str, run: str) -> pb.AdmitRequest:
    return pb.AdmitRequest(turn_id=turn, run_id=run, model="m", caller="c", dataplane_id="dp")


async def test_scheduler_caps_a_queueing_engine_and_admits_on_finish(
    services,
    engine: Engine,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """S2, S9, S12: probes read the engine's queue, the cap follows, a finish admits the next."""
    engine.running, engine.waiting = 1, 4
    sched = services.start(
        "scheduler", "--config", config_for(tmp_path, engine), "--port", "0", "--http-port", "0"
    )
    http = sched.urls["http"]

    async def capped() -> bool:
        rep = (await status(http))["replicas"][0]
        return rep["healthy"] and rep["capacity"] == 1  # type: ignore[no-any-return]

    await eventually(capped)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sched.ports['grpc']}") as ch:
        stub = pb_grpc.SchedulerStub(ch)
        first = await stub.Admit(req("t1", "r1"), timeout=10)
        assert first.admitted.replica == "eng"
        second = asyncio.ensure_future(stub.Admit(req("t2", "r2"), timeout=10))

        async def one_held() -> bool:
            return (await status(http))["held_total"] == 1  # type: ignore[no-any-return]

        await eventually(one_held)

        async def events():  # type: ignore[no-untyped-def]
            yield pb.ReportBatch(
                events=[
                    pb.TurnEvent(turn_id="t1", run_id="r1", started=pb.TurnStarted()),
                    pb.TurnEvent(turn_id="t1", run_id="r1", finished=pb.TurnFinished()),
                ]
            )

        await stub.Report(events(), timeout=10)
        assert (await asyncio.wait_for(second, 10)).admitted.replica == "eng"


async def test_unhealthy_engine_gets_no_turns_until_it_recovers(
    services,
    engine: Engine,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """S9: an unhealthy replica gets no turns; the held turn goes in once it is healthy."""
    engine.healthy = False
    sched = services.start(
        "scheduler", "--config", config_for(tmp_path, engine), "--port", "0", "--http-port", "0"
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sched.ports['grpc']}") as ch:
        stub = pb_grpc.SchedulerStub(ch)
        call = asyncio.ensure_future(stub.Admit(req("t1", "r1"), timeout=20))
        await asyncio.sleep(0.5)  # several probe periods: it must still be held
        assert not call.done()
        engine.healthy = True
        assert (await asyncio.wait_for(call, 10)).admitted.replica == "eng"


async def test_restarted_scheduler_admits_held_turn_by_its_original_id(
    services,
    engine: Engine,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """S11: after SIGKILL and restart, a resync restores counts and the held turn is admitted."""
    engine.running, engine.waiting = 1, 1
    config = config_for(tmp_path, engine)
    sched = services.start("scheduler", "--config", config, "--port", "0", "--http-port", "0")
    grpc_port, http_port = sched.ports["grpc"], sched.ports["http"]

    async def capped(url: str) -> bool:
        rep = (await status(url))["replicas"][0]
        return rep["capacity"] == 1  # type: ignore[no-any-return]

    await eventually(lambda: capped(sched.urls["http"]))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
        stub = pb_grpc.SchedulerStub(ch)
        assert (await stub.Admit(req("t1", "r1"), timeout=10)).admitted.replica == "eng"
        lost = asyncio.ensure_future(stub.Admit(req("t2", "r2"), timeout=20))
        await asyncio.sleep(0.3)
        assert not lost.done()  # t2 is held behind t1
        sched.stop(signal.SIGKILL)
        with pytest.raises(grpc.aio.AioRpcError):
            await lost  # the outage: the held call breaks
    restarted = services.start(
        "scheduler",
        "--config",
        config,
        "--port",
        str(grpc_port),
        "--http-port",
        str(http_port),
        name="scheduler-2",
    )
    await eventually(lambda: capped(restarted.urls["http"]))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
        stub = pb_grpc.SchedulerStub(ch)
        await stub.Resync(
            pb.ResyncRequest(
                dataplane_id="dp",
                runs=[
                    pb.RunSnapshot(
                        run_id="r1", last_replica="eng", phase=pb.RUN_PHASE_GENERATING, caller="c"
                    )
                ],
                in_flight=[
                    pb.TurnSnapshot(
                        turn_id="t1",
                        run_id="r1",
                        replica="eng",
                        model="m",
                        caller="c",
                        started=True,
                    )
                ],
            ),
            timeout=10,
        )
        assert (await status(restarted.urls["http"]))["replicas"][0]["in_flight"] == 1
        held = asyncio.ensure_future(stub.Admit(req("t2", "r2"), timeout=20))  # same turn ID
        await asyncio.sleep(0.3)
        assert not held.done()  # the restored in-flight turn still fills the cap

        async def events():  # type: ignore[no-untyped-def]
            yield pb.ReportBatch(
                events=[pb.TurnEvent(turn_id="t1", run_id="r1", finished=pb.TurnFinished())]
            )

        await stub.Report(events(), timeout=10)
        assert (await asyncio.wait_for(held, 10)).admitted.replica == "eng"
