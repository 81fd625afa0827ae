"""Tracing setup (X1): off without an endpoint, and what it builds when one is set.

These tests never install the global provider (it can be set once per process):
they pass ``install=False``; the global path runs in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import grpc
import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

from luftpause.telemetry import (
    DISABLED,
    Instrumentation,
    TracingConfigError,
    TracingSettings,
    otlp_exporter,
    setup_tracing,
)

ENDPOINT = "http://collector.invalid:4318"


def test_unset_configures_nothing() -> None:
    provider_before = trace.get_tracer_provider()
    channel_before = grpc.aio.insecure_channel
    transport_before = httpx.AsyncHTTPTransport.handle_async_request
    tracing = setup_tracing("dataplane", {}, list(Instrumentation))
    assert tracing is DISABLED and not tracing.enabled and tracing.provider is None
    app = object()
    assert tracing.wrap_asgi(app) is app
    assert trace.get_tracer_provider() is provider_before
    assert grpc.aio.insecure_channel is channel_before
    assert httpx.AsyncHTTPTransport.handle_async_request is transport_before
    tracing.shutdown()  # a no-op, and safe to call


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_EXPORTER_OTLP_ENDPOINT": ""},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "none"},
    ],
)
def test_switched_off(env: dict[str, str]) -> None:
    assert TracingSettings.from_env(env) is None
    assert setup_tracing("runtime", env) is DISABLED


def test_endpoints_per_protocol() -> None:
    assert TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT + "/"}) == (
        TracingSettings(endpoint=ENDPOINT + "/v1/traces")
    )
    only_traces = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom"}
    settings = TracingSettings.from_env(only_traces)
    assert settings is not None and settings.endpoint == "http://c:4318/custom"
    grpc_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    settings = TracingSettings.from_env(grpc_env)
    assert settings is not None
    assert (settings.protocol, settings.endpoint) == ("grpc", "http://c:4317")
    # The traces-only variables win over the general ones.
    both = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/v1/traces",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_HEADERS": "a=1",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20x, team = core ",
    }
    settings = TracingSettings.from_env(both)
    assert settings is not None
    assert settings.protocol == "http/protobuf" and settings.endpoint == "http://t:4318/v1/traces"
    assert settings.headers == {"Authorization": "Bearer x", "team": "core"}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "http/json"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "novalue", "key=value"),
        ("OTEL_TRACES_SAMPLER", "sometimes", "sometimes"),
        ("OTEL_TRACES_SAMPLER_ARG", "half", "not a number"),
    ],
)
def test_bad_settings_are_named(name: str, value: str, message: str) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, name: value}
    if name == "OTEL_TRACES_SAMPLER_ARG":
        env["OTEL_TRACES_SAMPLER"] = "traceidratio"
    with pytest.raises(TracingConfigError, match=message) as info:
        TracingSettings.from_env(env)
    assert name in str(info.value)


def test_exporter_points_at_the_endpoint() -> None:
    http = otlp_exporter(TracingSettings(endpoint=ENDPOINT + "/v1/traces"))
    assert isinstance(http, HttpSpanExporter)
    assert http._endpoint == ENDPOINT + "/v1/traces"
    over_grpc = otlp_exporter(TracingSettings(endpoint="http://c:4317", protocol="grpc"))
    assert isinstance(over_grpc, GrpcSpanExporter)
    assert over_grpc._endpoint == "c:4317"
    http.shutdown()
    over_grpc.shutdown()


def test_set_builds_a_provider_for_the_service() -> None:
    exporter = InMemorySpanExporter()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test,service.name=overridden",
    }
    tracing = setup_tracing("fake-engine", env, instance="e1", exporter=exporter, install=False)
    assert tracing.enabled and tracing.provider is not None
    assert tracing.settings is not None and tracing.settings.endpoint == ENDPOINT + "/v1/traces"
    attributes = tracing.provider.resource.attributes
    assert attributes["service.name"] == "luftpause-fake-engine"
    assert attributes["service.instance.id"] == "e1"
    assert attributes["deployment.environment"] == "test"
    assert isinstance(tracing.provider.sampler, ParentBased)
    with tracing.provider.get_tracer("test").start_as_current_span("work"):
        pass
    tracing.shutdown()  # flushes the batch
    [span] = exporter.get_finished_spans()
    assert (
        span.name == "work" and span.resource.attributes["service.name"] == "luftpause-fake-engine"
    )


def test_sampler_from_env() -> None:
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}
    off = setup_tracing("x", {**base, "OTEL_TRACES_SAMPLER": "always_off"}, install=False)
    ratio = setup_tracing(
        "x",
        {**base, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
        install=False,
    )
    assert off.provider is not None and off.provider.sampler is ALWAYS_OFF
    assert ratio.provider is not None and isinstance(ratio.provider.sampler, TraceIdRatioBased)
    assert ratio.provider.sampler.rate == 0.25
    off.shutdown()
    ratio.shutdown()


def test_instrumentations_are_undone_at_shutdown() -> None:
    channel_before = grpc.aio.insecure_channel
    server_before = grpc.aio.server
    transport_before = httpx.AsyncHTTPTransport.handle_async_request
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}
    tracing = setup_tracing(
        "dataplane",
        env,
        [
            Instrumentation.GRPC_AIO_CLIENT,
            Instrumentation.GRPC_AIO_SERVER,
            Instrumentation.HTTPX,
        ],
        exporter=InMemorySpanExporter(),
        install=False,
    )
    assert grpc.aio.insecure_channel is not channel_before
    assert grpc.aio.server is not server_before
    assert httpx.AsyncHTTPTransport.handle_async_request is not transport_before
    tracing.shutdown()
    assert grpc.aio.insecure_channel is channel_before
    assert grpc.aio.server is server_before
    assert httpx.AsyncHTTPTransport.handle_async_request is transport_before


class _Stuck(SpanExporter):
    """An exporter whose collector never answers."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(30)
        return SpanExportResult.SUCCESS


def test_shutdown_is_bounded_when_the_collector_hangs() -> None:
    stuck = _Stuck()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}
    tracing = setup_tracing("scheduler", env, exporter=stuck, install=False)
    assert tracing.provider is not None
    with tracing.provider.get_tracer("test").start_as_current_span("work"):
        pass
    started = time.monotonic()
    tracing.shutdown(timeout_s=0.3)
    assert time.monotonic() - started < 2.0
    stuck.release.set()


def test_install_sets_the_global_provider_and_propagator() -> None:
    """In a fresh process: the global provider, W3C trace context + baggage, and the
    httpx instrumentation (it patches the transport class)."""
    code = """
import json, httpx
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from luftpause.telemetry import Instrumentation, setup_tracing
before = httpx.AsyncHTTPTransport.handle_async_request
tracing = setup_tracing(
    "runtime", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, [Instrumentation.HTTPX]
)
provider = trace.get_tracer_provider()
patched = httpx.AsyncHTTPTransport.handle_async_request is not before
tracing.shutdown(timeout_s=0.5)
print(json.dumps({
    "sdk": isinstance(provider, TracerProvider),
    "service": provider.resource.attributes["service.name"],
    "fields": sorted(propagate.get_global_textmap().fields),
    "patched": patched,
    "restored": httpx.AsyncHTTPTransport.handle_async_request is before,
}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={}
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {
        "sdk": True,
        "service": "luftpause-runtime",
        "fields": ["baggage", "traceparent", "tracestate"],
        "patched": True,
        "restored": True,
    }
