"""Tracing setup (X1): the OTLP exporter, the global tracer provider and the instrumentations.

Every service calls :func:`setup_tracing` once at start (the shared bootstrap in
:mod:`luftpause.serving` does) with its name, the process environment and the
instrumentations that fit what it serves and calls:

==================  =========================================================
service             instrumentations
==================  =========================================================
scheduler           ASGI (status HTTP and page)
dataplane           none; server spans from FastAPI's own telemetry, the
                    engine request's client span from the dataplane itself
runtime             ASGI (``/mcp``), httpx (openai client to the dataplane),
                    httpx2 (MCP client to HTTP tool servers)
fake engine         none; server spans from FastAPI's own telemetry
fake MCP tools      ASGI
==================  =========================================================

FastAPI (the version pinned here) makes server spans by itself whenever a global tracer
provider is set, so its apps are not wrapped again: a second middleware would
double every server span, and its ``send`` would hide uvicorn's transport from the
fake engine's connection-dropping faults. :func:`fastapi_telemetry` gives those
apps the same exclusions as the ASGI middleware.

The gRPC interceptors are here but no service turns them on: the aio client
interceptor awaits the call's status inside its own task, so cancelling a caller
(a client leaving while its turn is held) no longer cancels the ``Admit`` RPC and
the scheduler keeps the abandoned turn; and server spans without the client's are
orphan roots. The trace context of a turn reaches the scheduler in
``AdmitRequest.traceparent`` instead.

With neither ``OTEL_EXPORTER_OTLP_ENDPOINT`` nor ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
set, nothing happens at all: no SDK import, no provider, no patched client, no
wrapped app; spans made through the OpenTelemetry API are non-recording no-ops,
so the hot path pays nothing measurable. When set: a ``TracerProvider`` with
``service.name=luftpause-<service>``, a batching OTLP exporter (HTTP/protobuf, or
gRPC when ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL=grpc``), the W3C
``traceparent`` + ``baggage`` propagator, and the instrumentations.

The standard variables read here, all from the mapping passed in (library code
never reads ``os.environ``): ``OTEL_SDK_DISABLED``, ``OTEL_TRACES_EXPORTER``
(``none`` turns tracing off), ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``,
``..._PROTOCOL``, ``..._HEADERS``, ``OTEL_TRACES_SAMPLER[_ARG]``,
``OTEL_RESOURCE_ATTRIBUTES``. The SDK and exporters may read further ``OTEL_*``
variables (timeouts, certificates, compression) from the process environment
themselves.

The gRPC instrumentations leave out the health service and the long-lived
``Report`` and ``Link`` streams (a span for either would last as long as the connection). The
ASGI one leaves out ``/health``, ``/metrics`` and ``/status``, which are polled.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fastapi.telemetry import TelemetryConfig
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

log = logging.getLogger("luftpause.telemetry")

Protocol = Literal["http/protobuf", "grpc"]

# Polled endpoints: a span every two seconds per poller tells nobody anything.
POLLED_PATHS = frozenset({"/health", "/metrics", "/status"})
# RPCs that are not traced: the report stream lives as long as the connection.
UNTRACED_RPCS = ("Report", "Link")
SHUTDOWN_TIMEOUT_S = 3.0  # processes get SIGKILL 10 s after SIGTERM; uvicorn drains 3 s


class TracingConfigError(ValueError):
    """An ``OTEL_*`` variable has a value this service cannot use."""


class Instrumentation(enum.StrEnum):
    """What a service asks to have traced; see the module docstring for who uses which."""

    ASGI = "asgi"  # the service's HTTP apps, wrapped by Tracing.wrap_asgi
    GRPC_AIO_SERVER = "grpc-aio-server"  # every grpc.aio.server() made after setup
    GRPC_AIO_CLIENT = "grpc-aio-client"  # every grpc.aio.*_channel() made after setup
    HTTPX = "httpx"  # every httpx transport (also clients made before setup)
    HTTPX2 = "httpx2"  # the same for httpx2, the MCP SDK's HTTP client


@dataclass(frozen=True)
class TracingSettings:
    """Where and how spans are exported, parsed from the ``OTEL_*`` variables."""

    endpoint: str  # HTTP: the full traces URL (…/v1/traces); gRPC: the collector's address
    protocol: Protocol = "http/protobuf"
    headers: Mapping[str, str] = field(default_factory=dict)
    sampler: str = "parentbased_always_on"
    sampler_arg: float = 1.0
    resource_attributes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TracingSettings | None:
        """The settings, or None when tracing is off (no endpoint, or switched off)."""

        def get(name: str) -> str:
            return env.get(name, "").strip()

        if get("OTEL_SDK_DISABLED").lower() == "true":
            return None
        if get("OTEL_TRACES_EXPORTER").lower() == "none":
            return None
        traces_endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        base_endpoint = get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if not traces_endpoint and not base_endpoint:
            return None
        protocol = (
            get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or get("OTEL_EXPORTER_OTLP_PROTOCOL")
        ).lower() or "http/protobuf"
        if protocol not in ("http/protobuf", "grpc"):
            raise TracingConfigError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported "
                "(use http/protobuf or grpc)"
            )
        if traces_endpoint:
            endpoint = traces_endpoint  # the spec: used as it is, for both protocols
        elif protocol == "grpc":
            endpoint = base_endpoint
        else:
            endpoint = base_endpoint.rstrip("/") + "/v1/traces"
        headers = _parse_pairs(
            get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or get("OTEL_EXPORTER_OTLP_HEADERS"),
            "OTEL_EXPORTER_OTLP_HEADERS",
        )
        sampler = get("OTEL_TRACES_SAMPLER").lower() or "parentbased_always_on"
        if sampler not in _SAMPLERS:
            raise TracingConfigError(
                f"OTEL_TRACES_SAMPLER={sampler!r} is not supported "
                f"(use one of {', '.join(sorted(_SAMPLERS))})"
            )
        arg = get("OTEL_TRACES_SAMPLER_ARG")
        try:
            ratio = float(arg) if arg else 1.0
        except ValueError:
            raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a number") from None
        if sampler.endswith("traceidratio") and not 0.0 <= ratio <= 1.0:
            raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not within 0..1")
        return cls(
            endpoint=endpoint,
            protocol="grpc" if protocol == "grpc" else "http/protobuf",
            headers=headers,
            sampler=sampler,
            sampler_arg=ratio,
            resource_attributes=_parse_pairs(
                get("OTEL_RESOURCE_ATTRIBUTES"), "OTEL_RESOURCE_ATTRIBUTES"
            ),
        )


def _parse_pairs(text: str, name: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` with percent-encoded values (W3C baggage style), as OTel specifies."""
    from urllib.parse import unquote

    pairs: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TracingConfigError(f"{name}: {item.strip()!r} is not key=value")
        pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


_SAMPLERS = frozenset(
    {
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    }
)


def _sampler(settings: TracingSettings) -> Sampler:
    from opentelemetry.sdk.trace import sampling

    root_name = settings.sampler.removeprefix("parentbased_")
    root: Sampler
    if root_name == "always_on":
        root = sampling.ALWAYS_ON
    elif root_name == "always_off":
        root = sampling.ALWAYS_OFF
    else:
        root = sampling.TraceIdRatioBased(settings.sampler_arg)
    if settings.sampler.startswith("parentbased_"):
        return sampling.ParentBased(root)
    return root


def otlp_exporter(settings: TracingSettings) -> SpanExporter:
    """The OTLP span exporter the settings name (nothing is sent until spans are)."""
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=settings.endpoint, headers=dict(settings.headers) or None)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=settings.endpoint, headers=dict(settings.headers) or None)


class Tracing:
    """What :func:`setup_tracing` set up, and how to undo it. Disabled: every method is a no-op."""

    def __init__(
        self,
        settings: TracingSettings | None = None,
        provider: TracerProvider | None = None,
        instrumentations: Iterable[Instrumentation] = (),
    ) -> None:
        self.settings = settings
        self.provider = provider
        self.instrumentations = frozenset(instrumentations)
        self._undo: list[Callable[[], None]] = []
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def wrap_asgi(self, app: Any) -> Any:
        """``app`` in OpenTelemetry's ASGI middleware (a server span per request, the caller's
        ``traceparent`` as its parent), or ``app`` itself when ASGI tracing is off."""
        if self.provider is None or Instrumentation.ASGI not in self.instrumentations:
            return app
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
        from opentelemetry.util.http import ExcludeList

        return OpenTelemetryMiddleware(
            app,
            excluded_urls=ExcludeList([f"{path}$" for path in sorted(POLLED_PATHS)]),
            tracer_provider=self.provider,
            # Per-message spans would be one per SSE chunk on the proxy.
            exclude_spans=["receive", "send"],
        )

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Undo the instrumentations and export what is left, waiting at most ``timeout_s``
        (a collector that is down must not hold up the stop). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:  # an instrumentation that fails to undo must not block the stop
                log.exception("tracing: could not remove an instrumentation")
        provider = self.provider
        if provider is None:
            return

        def flush() -> None:
            provider.force_flush(int(timeout_s * 1000))
            provider.shutdown()

        worker = threading.Thread(target=flush, name="otel-shutdown", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            log.warning("tracing: spans not exported within %.0f s at stop; dropped", timeout_s)


DISABLED = Tracing()


# ----------------------------------------------------------------------------- trace context
# W3C trace context as the services pass it along by hand: in the journal (a run's
# spawn), in AdmitRequest.traceparent, and as the trace IDs status and logs show.

_TRACECONTEXT = TraceContextTextMapPropagator()


def context_of(traceparent: str | None) -> Context:
    """A context holding only the remote parent ``traceparent`` names (empty if none)."""
    if not traceparent:
        return Context()
    return _TRACECONTEXT.extract({"traceparent": traceparent}, context=Context())


def traceparent_of(context: Context | None = None) -> str | None:
    """The W3C ``traceparent`` of ``context`` (default: the current one), if it has a span."""
    carrier: dict[str, str] = {}
    _TRACECONTEXT.inject(carrier, context=context)
    return carrier.get("traceparent")


def trace_id_of(traceparent: str | None) -> str:
    """The trace ID of a W3C ``traceparent`` (``00-<trace>-<span>-<flags>``), else ""."""
    parts = (traceparent or "").strip().split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
        try:
            int(parts[1], 16)
        except ValueError:
            return ""
        return parts[1].lower()
    return ""


class RecentTraces:
    """The trace IDs of the last ``keep`` requests seen, oldest first (test fakes show them)."""

    def __init__(self, keep: int = 1000) -> None:
        self.keep = keep
        self._seen: dict[str, None] = {}  # insertion-ordered set

    def saw(self, traceparent: str | None) -> None:
        trace_id = trace_id_of(traceparent)
        if not trace_id:
            return
        self._seen.pop(trace_id, None)
        self._seen[trace_id] = None
        while len(self._seen) > self.keep:
            del self._seen[next(iter(self._seen))]

    def ids(self) -> list[str]:
        return list(self._seen)


def polled(scope: Mapping[str, Any]) -> bool:
    """True for a request to an endpoint that pollers hit every few seconds."""
    return scope.get("path") in POLLED_PATHS


def fastapi_telemetry() -> TelemetryConfig:
    """Settings for ``FastAPI(telemetry=...)``: FastAPI's own server spans (made whenever a
    global tracer provider is set) without the polled endpoints and without a span per
    dependency and endpoint call. With no provider set, FastAPI makes no spans at all."""
    return TelemetryConfig(exclude=polled, operation_spans=False)


def setup_tracing(
    service: str,
    env: Mapping[str, str],
    instrumentations: Iterable[Instrumentation] = (),
    *,
    instance: str | None = None,
    exporter: SpanExporter | None = None,
    install: bool = True,
) -> Tracing:
    """Configure tracing for ``luftpause-<service>`` when ``env`` names an OTLP endpoint.

    ``instance`` becomes ``service.instance.id`` (e.g. a fake engine's name).
    ``exporter`` replaces the OTLP exporter (tests pass an in-memory one).
    ``install=False`` leaves the global tracer provider and propagator alone (the
    global provider can be set only once per process); the instrumentations use
    this provider either way. Raises :class:`TracingConfigError` for bad settings.
    """
    settings = TracingSettings.from_env(env)
    if settings is None:
        return DISABLED
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from luftpause import __version__

    attributes: dict[str, str] = {
        **settings.resource_attributes,
        "service.name": f"luftpause-{service}",
        "service.version": __version__,
    }
    if instance is not None:
        attributes["service.instance.id"] = instance
    provider = TracerProvider(
        resource=Resource.create(attributes),
        sampler=_sampler(settings),
        shutdown_on_exit=False,  # Tracing.shutdown flushes, bounded in time
    )
    provider.add_span_processor(BatchSpanProcessor(exporter or otlp_exporter(settings)))
    if install:
        from opentelemetry import propagate, trace
        from opentelemetry.baggage.propagation import W3CBaggagePropagator
        from opentelemetry.propagators.composite import CompositePropagator
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        trace.set_tracer_provider(provider)
        propagate.set_global_textmap(
            CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
        )
    tracing = Tracing(settings, provider, instrumentations)
    for kind in tracing.instrumentations:
        undo = _instrument(kind, provider)
        if undo is not None:
            tracing._undo.append(undo)
    log.info(
        "tracing to %s (%s) as luftpause-%s%s",
        settings.endpoint,
        settings.protocol,
        service,
        "".join(f", {k}" for k in sorted(tracing.instrumentations)),
    )
    return tracing


def _grpc_filter() -> Any:
    from opentelemetry.instrumentation.grpc import filters

    return filters.negate(
        filters.any_of(
            filters.health_check(),
            *(filters.method_name(name) for name in UNTRACED_RPCS),
        )
    )


def _instrument(kind: Instrumentation, provider: TracerProvider) -> Callable[[], None] | None:
    """Switch one global instrumentation on; return how to switch it off again."""
    instrumentor: Any
    if kind is Instrumentation.ASGI:
        return None  # per app: Tracing.wrap_asgi
    if kind is Instrumentation.GRPC_AIO_SERVER:
        from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorServer

        instrumentor = GrpcAioInstrumentorServer(filter_=_grpc_filter())  # type: ignore[no-untyped-call]
    elif kind is Instrumentation.GRPC_AIO_CLIENT:
        from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient

        instrumentor = GrpcAioInstrumentorClient(filter_=_grpc_filter())  # type: ignore[no-untyped-call]
    elif kind is Instrumentation.HTTPX:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        instrumentor = HTTPXClientInstrumentor()
    elif kind is Instrumentation.HTTPX2:
        from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor

        instrumentor = HTTPX2ClientInstrumentor()
    else:  # pragma: no cover - the enum is exhaustive
        raise AssertionError(kind)
    instrumentor.instrument(tracer_provider=provider)
    return lambda: instrumentor.uninstrument()
