"""An in-process dataplane stack for component tests: the real dataplane app (ASGI
transport), a real in-process scheduler over gRPC on loopback, and a recording
engine server on 127.0.0.1:0. Shared by the dataplane's example and fuzz tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from luftpause.callers import Gate
from luftpause.config import (
    DataplaneSettings,
    Endpoint,
    EndpointKind,
    MetricsFlavour,
    Secrets,
)
from luftpause.dataplane.app import create_app
from luftpause.dataplane.asgi import DataplaneApp
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.engine_http import EngineClient
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.scheduler_link import SchedulerLink
from luftpause.scheduler.core import EndpointKind as CoreKind
from luftpause.scheduler.core import Params, ReplicaProbed, ReplicaSpec, RunPhase, initial_state
from luftpause.scheduler.service.grpc_server import SchedulerServer, start_grpc
from luftpause.scheduler.service.host import Host
from luftpause.serving import bind_socket, bound_port, uvicorn_server, wait_started
from luftpause.tool_calls import TOOL_CALL_ORIGINS_MAX, ToolCallOrigins

MODEL = "m"


def endpoints(url: str) -> tuple[Endpoint, ...]:
    """Both replicas are served by one test engine server; paths tell them apart."""
    return (
        ENDPOINTS[0].model_copy(update={"url": url}),
        ENDPOINTS[1].model_copy(update={"url": url}),
    )


ENDPOINTS = (
    Endpoint(
        name="engine-a",
        url="http://engine-a",
        models=(MODEL,),
        metrics=MetricsFlavour.NONE,
        api_key_env="KEY_A",
    ),
    Endpoint(
        name="classifier",
        url="http://classifier",
        models=("clf",),
        kind=EndpointKind.SINGLE_PASS,
        metrics=MetricsFlavour.NONE,
    ),
)
COMPLETION = {
    "id": "cmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hello"}}
    ],
    "usage": {
        "prompt_tokens": 5,
        "completion_tokens": 1,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 2},
    },
}
TOOL_COMPLETION = {
    **COMPLETION,
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_abc",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": "{}"},
                    }
                ],
            },
        }
    ],
}


@dataclass
class Seen:
    """A request as it reached the engine."""

    path: str
    headers: dict[str, str]
    content: bytes


@dataclass
class Engine:
    """A real HTTP server on 127.0.0.1:0 that records requests and answers with
    ``reply`` (an ``httpx.Response`` used as a description: status, headers, body or
    an async byte iterator for a stream)."""

    seen: list[Seen] = field(default_factory=list)
    reply: Callable[[Seen], httpx.Response] = lambda r: httpx.Response(200, json=COMPLETION)
    url: str = ""
    _stop: Callable[[], Awaitable[None]] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        request = Request(scope, receive)
        seen = Seen(request.url.path, dict(request.headers), await request.body())
        self.seen.append(seen)
        desc = self.reply(seen)
        headers = {
            k: v
            for k, v in desc.headers.items()
            if k.lower() not in ("content-length", "transfer-encoding")
        }
        response: Response
        if isinstance(desc.stream, httpx.ByteStream):
            response = Response(desc.content, desc.status_code, headers=headers)
        else:
            response = StreamingResponse(desc.aiter_raw(), desc.status_code, headers=headers)
        await response(scope, receive, send)

    async def start(self) -> None:
        sock = bind_socket("127.0.0.1", 0)
        server = uvicorn_server(self)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        await wait_started(server, task)
        self.url = f"http://127.0.0.1:{bound_port(sock)}"

        async def stop() -> None:
            server.should_exit = True
            await task
            sock.close()

        self._stop = stop

    async def stop(self) -> None:
        if self._stop is not None:
            await self._stop()
            self._stop = None


@dataclass
class Stack:
    host: Host
    server: SchedulerServer
    writer: asyncio.Task[None]
    dp: Dataplane
    client: httpx.AsyncClient
    engine: Engine
    grpc_address: str
    app: DataplaneApp | None = None  # what ``client`` talks to

    async def stop_scheduler(self) -> None:
        await self.server.stop(grace=0)
        self.writer.cancel()

    async def start_scheduler(self) -> None:
        self.host, self.server, self.writer = await start_scheduler(self.grpc_address)


async def start_scheduler(
    address: str, url: str = "http://unused"
) -> tuple[Host, SchedulerServer, asyncio.Task[None]]:
    specs = (
        ReplicaSpec("engine-a", CoreKind.GENERATIVE, frozenset({MODEL})),
        ReplicaSpec("classifier", CoreKind.SINGLE_PASS, frozenset({"clf"})),
    )
    host = Host(initial_state(specs, Params(queue_probes=1), time.monotonic()), time.monotonic)
    writer = asyncio.create_task(host.run())
    server = await start_grpc(host, {e.name: e.url for e in endpoints(url)}, address)
    for name in ("engine-a", "classifier"):
        await host.apply(lambda at, n=name: ReplicaProbed(at=at, replica=n, healthy=True))
    return host, server, writer


def make_dataplane(
    scheduler: str,
    engine_url: str,
    name: str,
    token: str | None = None,
    api_keys: dict[str, str] | None = None,
    gate: Gate | None = None,
) -> Dataplane:
    """A dataplane's state (its own run table and tool call memory) linked to the
    scheduler at ``scheduler``, with both test replicas served by ``engine_url``; ``gate``:
    who requests are (default: the token alone, or nothing)."""
    runs = RunTable(time.monotonic, 1800)
    settings = DataplaneSettings(report_reconnect_s=0.1)
    return Dataplane(
        settings=settings,
        endpoints={e.name: e for e in endpoints(engine_url)},
        secrets=Secrets(token=token, api_keys=api_keys or {}),
        link=SchedulerLink(scheduler, name, runs, reconnect_s=0.1),
        runs=runs,
        memory=ToolCallOrigins(time.monotonic, 1800, TOOL_CALL_ORIGINS_MAX),
        http=EngineClient(settings.engine_connect_timeout_s),
        metrics=Metrics(),
        gate=gate or Gate(token, None),
    )


@pytest.fixture(name="stack")
async def stack_fixture(request: pytest.FixtureRequest) -> AsyncIterator[Stack]:
    """The stack; import ``stack_fixture`` into a test module to use ``stack``."""
    token = getattr(request, "param", None)
    engine = Engine()
    await engine.start()
    # The scheduler binds a port of its own choosing (a port picked free beforehand can be
    # taken by the engine or another test's listener meanwhile); a restart reuses it.
    host, server, writer = await start_scheduler("127.0.0.1:0", engine.url)
    address = f"127.0.0.1:{server.port}"
    dp = make_dataplane(address, engine.url, "dp-test", token, {"engine-a": "engine-key"})
    maintain = asyncio.create_task(dp.link.maintain())
    async with asyncio.timeout(5):
        await dp.link.ready.wait()
    app = create_app(dp)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://dp")
    s = Stack(host, server, writer, dp, client, engine, address, app)
    yield s
    maintain.cancel()
    await client.aclose()
    await dp.http.close()
    await dp.link.close()
    await s.stop_scheduler()
    await engine.stop()


def chat(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


async def settle(host: Host, cond: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not cond():
            await asyncio.sleep(0.01)


async def paused_by_a_tool_call(stack: Stack) -> httpx.Response:
    """One turn whose reply is a tool call, through the stack's dataplane; returns its
    answer once the scheduler has its run paused on the tool (D2, D5)."""
    stack.engine.reply = lambda r: httpx.Response(200, json=TOOL_COMPLETION)
    first = await stack.client.post("/v1/chat/completions", json=chat())
    run_id = first.headers["x-luftpause-run-id"]
    await settle(
        stack.host,
        lambda: (
            run_id in stack.host.state.runs
            and stack.host.state.runs[run_id].phase is RunPhase.PAUSED_ON_TOOL
        ),
    )
    return first


async def nothing_in_flight(stack: Stack) -> None:
    """No admitted or held turn anywhere: scheduler, run table, gauges."""
    registry = stack.dp.metrics.registry

    def gauge(name: str, cls: str) -> float:
        return registry.get_sample_value(name, {"service_class": cls}) or 0.0

    await settle(
        stack.host,
        lambda: (
            not stack.host.state.turns
            and not stack.host.state.held
            and all(r.in_flight == 0 for r in stack.host.state.replicas.values())
        ),
    )
    assert not stack.dp.runs.turns
    assert all(not run.in_flight for run in stack.dp.runs.runs.values())
    assert not stack.dp.link.snapshot().in_flight  # a resync would re-adopt nothing
    for cls in ("interactive", "batch"):
        assert gauge("luftpause_dataplane_turns_in_flight", cls) == 0
        assert gauge("luftpause_dataplane_turns_held", cls) == 0
