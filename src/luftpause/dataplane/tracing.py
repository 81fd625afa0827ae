"""The dataplane's span per turn (X1).

A turn's span starts when its request arrives and ends with the turn: it covers
the time held by the scheduler and the engine's reply. Its parent is the
caller's trace context (the ``traceparent`` header, or the ASGI server span when
that instrumentation is on); the scheduler's ``admit`` span (through
``AdmitRequest.traceparent``) and the engine request's client span (named in
the request's ``traceparent`` header) are its children, so one trace runs client →
dataplane → scheduler → engine.

Attributes: ``luftpause.run_id``, ``luftpause.service_class``,
``gen_ai.request.model``, then ``luftpause.held_ms`` and ``luftpause.replica``
once admitted, and at the end ``luftpause.outcome`` (the same label as the
``outcome`` of ``luftpause_dataplane_turns_total``) and the reply's token counts
including ``gen_ai.usage.cache_read.input_tokens``.

With no tracer provider configured, spans are non-recording no-ops.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from luftpause import telemetry
from luftpause.telemetry import context_of

_tracer = trace.get_tracer("luftpause.dataplane")

FAILED_OUTCOMES = frozenset(
    {"engine_unreachable", "engine_rejected", "engine_broke", "internal_error"}
)


def _parent(headers: Mapping[str, str]) -> Context:
    current = trace.get_current_span()
    if current.get_span_context().is_valid:
        return trace.set_span_in_context(current, Context())
    return context_of(headers.get("traceparent"))


def start_turn(
    headers: Mapping[str, str], *, route: str, model: str, service_class: str, run_id: str
) -> Span:
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        # No tracer provider: what the no-op tracer would give, without its detour (a
        # non-recording span carrying the caller's context, so the scheduler and the
        # engine still see the caller's trace; else the invalid span). Every turn
        # passes here.
        return trace.get_current_span(_parent(headers))
    return _tracer.start_span(
        f"turn {model}" if model else f"turn {route}",
        context=_parent(headers),
        kind=SpanKind.SERVER,
        attributes={
            "luftpause.run_id": run_id,
            "luftpause.service_class": service_class,
            "luftpause.route": route,
            gen_ai.GEN_AI_REQUEST_MODEL: model,
        },
    )


def traceparent_of(span: Span) -> str:
    if not span.get_span_context().is_valid:
        return ""  # (no trace: most turns when tracing is off)
    return telemetry.traceparent_of(trace.set_span_in_context(span, Context())) or ""


def inject(span: Span, headers: MutableMapping[str, str]) -> None:
    """Point the engine request's ``traceparent`` at ``span`` (its client span, else
    the turn's)."""
    headers.pop("tracestate", None)
    traceparent = traceparent_of(span)
    if traceparent:  # no span (tracing off, no caller trace): the caller's header stays
        headers["traceparent"] = traceparent


def start_engine_request(turn: Span, url: str) -> Span | None:
    """The engine request's client span, a child of the turn's; None when the turn is
    not recorded (tracing off), which costs nothing then."""
    if not turn.is_recording():
        return None
    parts = urlsplit(url)
    if "@" in parts.netloc:  # no credentials in a span
        url = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    attributes: dict[str, str | int] = {"http.request.method": "POST", "url.full": url}
    if parts.hostname:
        attributes["server.address"] = parts.hostname
        attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
    return _tracer.start_span(
        "POST",
        context=trace.set_span_in_context(turn, Context()),
        kind=SpanKind.CLIENT,
        attributes=attributes,
    )


def end_engine_request(span: Span | None, *, status: int = 0, error: str = "") -> None:
    """Ends the span of ``start_engine_request`` when the reply's headers are in
    (``status``) or the request failed (``error``: what failed)."""
    if span is None:
        return
    if status:
        span.set_attribute("http.response.status_code", status)
    if error or status >= 400:
        span.set_attribute("error.type", error or str(status))
        span.set_status(Status(StatusCode.ERROR))
    span.end()


def renamed_run(span: Span, run_id: str) -> None:
    """The scheduler put the turn in another run (found by its echoed tool calls)."""
    span.set_attribute("luftpause.run_id", run_id)


def admitted(span: Span, *, replica: str, held_s: float) -> None:
    if not span.is_recording():
        return
    span.set_attribute("luftpause.replica", replica)
    span.set_attribute("luftpause.held_ms", round(held_s * 1000.0, 3))


def end(
    span: Span,
    outcome: str,
    *,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    cached_tokens: int | None = None,
) -> None:
    if not span.is_recording():
        return  # (ending a span that records nothing does nothing)
    span.set_attribute("luftpause.outcome", outcome)
    if prompt_tokens is not None:
        span.set_attribute(gen_ai.GEN_AI_USAGE_INPUT_TOKENS, prompt_tokens)
    if completion_tokens is not None:
        span.set_attribute(gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS, completion_tokens)
    if cached_tokens is not None:
        span.set_attribute(gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cached_tokens)
    if outcome in FAILED_OUTCOMES:
        span.set_status(Status(StatusCode.ERROR, outcome))
    span.end()
