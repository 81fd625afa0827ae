"""The shared service bootstrap (serving.Bootstrap) and the instrumentations it enables.

The bootstrap runs in this process on its own event loop (as a service's
``main`` does): listeners on loopback port 0, the ready file, hooks in order,
exit statuses. Tracing is checked with the SDK's in-memory exporter and
``install=False``, so no global provider is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from luftpause.serving import Bootstrap, Service
from luftpause.telemetry import Instrumentation, Tracing, fastapi_telemetry, setup_tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
OTLP = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.invalid:4318"}


def app(events: list[str]) -> Starlette:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        events.append("lifespan start")
        yield
        events.append("lifespan stop")

    return Starlette(routes=[Route("/", hello), Route("/health", hello)], lifespan=lifespan)


def args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(ready_file=str(tmp_path / "ready.json"), log_level="INFO")


def test_serves_writes_the_ready_file_and_stops_in_order(tmp_path: Path) -> None:
    events: list[str] = []
    replies: list[str] = []

    async def start(svc: Service) -> None:
        await svc.serve_asgi("http", svc.bind(0), app(events))
        svc.on_stop(lambda: events.append("stop first registered"))

        async def close() -> None:
            events.append("stop last registered")

        svc.on_stop(close)
        svc.on_ready(lambda: events.append("ready"))

        async def client() -> None:  # the service ends when this returns
            while not (tmp_path / "ready.json").exists():
                await asyncio.sleep(0.01)
            async with httpx.AsyncClient() as http:
                reply = await http.get(f"http://127.0.0.1:{svc.ports['http']}/")
            replies.append(reply.text)

        svc.task(client(), name="client")

    rc = Bootstrap("demo", args(tmp_path), {}).run("127.0.0.1", start)
    assert rc == 0 and replies == ["hello"]
    assert events == [
        "lifespan start",
        "ready",
        "lifespan stop",
        "stop last registered",
        "stop first registered",
    ]
    ready = json.loads((tmp_path / "ready.json").read_text())
    port = ready["ports"]["http"]
    assert ready == {
        "pid": os.getpid(),
        "service": "demo",
        "ports": {"http": port},
        "urls": {"http": f"http://127.0.0.1:{port}"},
    }


def test_sigterm_stops_gracefully(tmp_path: Path) -> None:
    events: list[str] = []
    stopped: list[str] = []

    async def start(svc: Service) -> None:
        await svc.serve_asgi("http", svc.bind(0), app(events))
        svc.add_listener("other", 1234, lambda: asyncio.sleep(0, stopped.append("other")))
        svc.on_ready(lambda: os.kill(os.getpid(), signal.SIGTERM))

    assert Bootstrap("demo", args(tmp_path), {}).run("127.0.0.1", start) == 0
    assert events == ["lifespan start", "lifespan stop"] and stopped == ["other"]
    assert json.loads((tmp_path / "ready.json").read_text())["ports"]["other"] == 1234


def test_a_stop_asked_while_starting_never_writes_the_ready_file(tmp_path: Path) -> None:
    """A SIGTERM that arrives during start stops the service before it says it is ready."""
    events: list[str] = []

    async def start(svc: Service) -> None:
        await svc.serve_asgi("http", svc.bind(0), app(events))
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.05)  # let the handler run while still starting

    assert Bootstrap("demo", args(tmp_path), {}).run("127.0.0.1", start) == 0
    assert not (tmp_path / "ready.json").exists()
    assert events == ["lifespan start", "lifespan stop"]


def test_a_failed_task_stops_the_service_with_status_1(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stopped: list[str] = []

    async def start(svc: Service) -> None:
        await svc.serve_asgi("http", svc.bind(0), app([]))
        svc.on_stop(lambda: stopped.append("hook"))

        async def broken() -> None:
            raise RuntimeError("boom")

        svc.task(broken(), name="writer")

    assert Bootstrap("demo", args(tmp_path), {}).run("127.0.0.1", start) == 1
    assert stopped == ["hook"]
    assert "writer failed: RuntimeError('boom')" in caplog.text


def test_a_start_status_stops_before_ready(tmp_path: Path) -> None:
    stopped: list[str] = []

    async def start(svc: Service) -> int:
        svc.on_stop(lambda: stopped.append("hook"))
        return 2

    assert Bootstrap("demo", args(tmp_path), {}).run("127.0.0.1", start) == 2
    assert stopped == ["hook"] and not (tmp_path / "ready.json").exists()


def test_bad_tracing_settings_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def start(svc: Service) -> None:
        raise AssertionError("not reached")

    env = {**OTLP, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
    assert Bootstrap("demo", args(tmp_path), env).run("127.0.0.1", start) == 2
    assert "luftpause demo: OTEL_EXPORTER_OTLP_PROTOCOL='http/json'" in capsys.readouterr().err


# ----------------------------------------------------------------- instrumentations


def traced(*kinds: Instrumentation) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return setup_tracing("test", OTLP, kinds, exporter=exporter, install=False), exporter


def finished(tracing: Tracing, exporter: InMemorySpanExporter) -> tuple[ReadableSpan, ...]:
    assert tracing.provider is not None
    tracing.provider.force_flush()
    return exporter.get_finished_spans()


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


async def test_asgi_server_span_continues_the_callers_trace() -> None:
    tracing, exporter = traced(Instrumentation.ASGI)
    try:
        wrapped: Any = tracing.wrap_asgi(app([]))
        transport = httpx.ASGITransport(app=wrapped)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
            assert (await http.get("/", headers={"traceparent": TRACEPARENT})).text == "hello"
            await http.get("/health", headers={"traceparent": TRACEPARENT})  # polled: untraced
        [span] = finished(tracing, exporter)
        assert span.kind is SpanKind.SERVER and hex_trace(span) == TRACE_ID
        assert span.parent is not None and f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    finally:
        tracing.shutdown()


async def test_fastapi_apps_trace_themselves_without_the_polled_endpoints() -> None:
    """FastAPI's own server spans (the dataplane and fake engine rely on them) with
    fastapi_telemetry(): the caller's trace continues, polls and per-call spans are left out."""
    tracing, exporter = traced()
    try:
        api = FastAPI(telemetry={"tracer_provider": tracing.provider, **fastapi_telemetry()})

        @api.get("/v1/models")
        @api.get("/metrics")
        async def hello() -> dict[str, str]:
            return {"hello": "world"}

        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
            assert (await http.get("/v1/models", headers={"traceparent": TRACEPARENT})).is_success
            assert (await http.get("/metrics", headers={"traceparent": TRACEPARENT})).is_success
        [span] = finished(tracing, exporter)
        assert span.name == "GET /v1/models" and span.kind is SpanKind.SERVER
        assert hex_trace(span) == TRACE_ID
    finally:
        tracing.shutdown()


async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def test_grpc_calls_carry_the_trace_but_not_the_report_stream() -> None:
    tracing, exporter = traced(Instrumentation.GRPC_AIO_SERVER, Instrumentation.GRPC_AIO_CLIENT)
    try:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(_echo)
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "luftpause.test.Echo", {"Admit": handler, "Report": handler}
                )
            ]
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        assert tracing.provider is not None
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                tracer = tracing.provider.get_tracer("test")
                with tracer.start_as_current_span("turn") as turn:
                    assert await channel.unary_unary("/luftpause.test.Echo/Admit")(b"x") == b"x"
                    assert await channel.unary_unary("/luftpause.test.Echo/Report")(b"y") == b"y"
        finally:
            await server.stop(None)
        spans = finished(tracing, exporter)
        by_kind = {s.kind: s for s in spans}
        assert sorted(s.name for s in spans) == [
            "/luftpause.test.Echo/Admit",
            "/luftpause.test.Echo/Admit",
            "turn",
        ]
        client, served = by_kind[SpanKind.CLIENT], by_kind[SpanKind.SERVER]
        trace_id = turn.get_span_context().trace_id
        assert {s.context.trace_id for s in spans if s.context} == {trace_id}
        assert (
            client.parent is not None and client.parent.span_id == turn.get_span_context().span_id
        )
        assert served.parent is not None and client.context is not None
        assert served.parent.span_id == client.context.span_id
    finally:
        tracing.shutdown()


def test_start_up_objects_are_out_of_the_collectors_sight(tmp_path: Path) -> None:
    """Once started, a service freezes what start-up made (``gc.freeze``): a full
    collection then scans only what serving makes, instead of stalling every request
    in flight for the ~150 ms it takes over a dataplane's start-up objects."""
    import gc

    before = gc.get_freeze_count()
    frozen: list[int] = []

    async def start(svc: Service) -> None:
        await svc.serve_asgi("http", svc.bind(0), app([]))
        svc.on_ready(lambda: frozen.append(gc.get_freeze_count()))

        async def served() -> None:  # the service ends when this returns
            await asyncio.sleep(0)

        svc.task(served(), name="served")

    try:
        Bootstrap("test", args(tmp_path), {}).run("127.0.0.1", start)
    finally:
        gc.unfreeze()
    assert frozen and frozen[0] > before + 1000
