"""The runtime's spans (X1), after the OpenTelemetry GenAI semantic conventions.

One ``invoke_agent`` span per run, a ``chat`` span per model turn and an
``execute_tool`` span per tool call below it. A run's span is the child of the
span that spawned it: its parent run's ``invoke_agent`` span, or the MCP
request's trace context, or, for a request with none that an agent harness's
tool call made, the dataplane's span of the harness turn that made the call
(attribute ``luftpause.session``: that turn's run, #38). That context is journaled with the spawn
(``traceparent``), so a run resumed after a restart joins the same trace.

Only the OpenTelemetry API is used here: with no tracer provider configured
(``OTEL_EXPORTER_OTLP_ENDPOINT`` unset) every span is a non-recording no-op.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from luftpause.runtime.core import Run, Usage
from luftpause.telemetry import context_of, traceparent_of

_tracer = trace.get_tracer("luftpause.runtime")

AGENT_NAME = "luftpause sub-agent"
PROVIDER = "luftpause"  # the dataplane in front of the engines


def request_traceparent(
    meta: Mapping[str, Any] | None, headers: Mapping[str, str] | None
) -> str | None:
    """The trace context of an MCP request: ``_meta.traceparent`` (the MCP SDK's span
    for the request continues it and is current), else an HTTP ``traceparent`` header,
    else whatever span is current."""
    header = _valid_header(headers)
    if not _meta_trace(meta) and header is not None:
        return traceparent_of(context_of(header))  # re-serialised: never the raw header
    return traceparent_of()


def brings_trace(meta: Mapping[str, Any] | None, headers: Mapping[str, str] | None) -> bool:
    """Whether an MCP request carried a trace context of its own (``_meta.traceparent``
    or a valid ``traceparent`` header): without one, a run it spawns for an agent
    harness joins the harness turn's trace (#38)."""
    return _meta_trace(meta) or _valid_header(headers) is not None


def _meta_trace(meta: Mapping[str, Any] | None) -> bool:
    return meta is not None and isinstance(meta.get("traceparent"), str)


def _valid_header(headers: Mapping[str, str] | None) -> str | None:
    """The request's ``traceparent`` header, if it names a valid span context."""
    header = headers.get("traceparent") if headers is not None else None
    if header and trace.get_current_span(context_of(header)).get_span_context().is_valid:
        return header
    return None


@contextmanager
def agent_span(run: Run) -> Iterator[Span]:
    """The run's ``invoke_agent`` span, current while the run's loop runs."""
    with _tracer.start_as_current_span(
        f"{gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value} {AGENT_NAME}",
        context=context_of(run.traceparent),
        kind=SpanKind.INTERNAL,
        record_exception=False,  # cancellation ends a run; its outcome is set below
        set_status_on_exception=False,
        attributes={
            gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value,
            gen_ai.GEN_AI_AGENT_ID: run.id,
            gen_ai.GEN_AI_AGENT_NAME: AGENT_NAME,
            gen_ai.GEN_AI_REQUEST_MODEL: run.spec.model,
            "luftpause.service_class": run.spec.service_class,
            **({"luftpause.parent_run": run.parent} if run.parent else {}),
            **({"luftpause.session": run.session} if run.session else {}),
        },
    ) as span:
        yield span


def end_agent_span(span: Span, run: Run) -> None:
    """Outcome of the run on its span, as its loop stops: a run still unfinished then was
    interrupted by a shutdown (it resumes, with a new span in the same trace)."""
    span.set_attribute("luftpause.run.state", run.state.value)
    if not run.done:
        span.set_attribute("luftpause.run.interrupted", True)
    span.set_attribute(gen_ai.GEN_AI_USAGE_INPUT_TOKENS, run.own.prompt_tokens)
    span.set_attribute(gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS, run.own.completion_tokens)
    if run.error and run.state.value == "Failed":
        span.set_status(Status(StatusCode.ERROR, run.error))


@contextmanager
def chat_span(run: Run) -> Iterator[Span]:
    with _tracer.start_as_current_span(
        f"{gen_ai.GenAiOperationNameValues.CHAT.value} {run.spec.model}",
        kind=SpanKind.CLIENT,
        attributes={
            gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.CHAT.value,
            gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER,
            gen_ai.GEN_AI_REQUEST_MODEL: run.spec.model,
            gen_ai.GEN_AI_AGENT_ID: run.id,
        },
    ) as span:
        yield span


def record_reply(span: Span, reply: Mapping[str, Any], usage: Usage) -> None:
    """What a turn's reply says about itself: tokens, cached tokens, finish reasons."""
    span.set_attribute(gen_ai.GEN_AI_USAGE_INPUT_TOKENS, usage.prompt_tokens)
    span.set_attribute(gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS, usage.completion_tokens)
    raw_usage = reply.get("usage")
    details = raw_usage.get("prompt_tokens_details") if isinstance(raw_usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int) and not isinstance(cached, bool):
        span.set_attribute(gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cached)
    choices = reply.get("choices")
    reasons = [
        str(c.get("finish_reason"))
        for c in (choices if isinstance(choices, list) else [])
        if isinstance(c, dict) and c.get("finish_reason")
    ]
    if reasons:
        span.set_attribute(gen_ai.GEN_AI_RESPONSE_FINISH_REASONS, reasons)
    model = reply.get("model")
    if isinstance(model, str):
        span.set_attribute(gen_ai.GEN_AI_RESPONSE_MODEL, model)


@contextmanager
def tool_span(tool: str, call_id: str) -> Iterator[Span]:
    with _tracer.start_as_current_span(
        f"{gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value} {tool}",
        kind=SpanKind.INTERNAL,
        attributes={
            gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value,
            gen_ai.GEN_AI_TOOL_NAME: tool,
            gen_ai.GEN_AI_TOOL_CALL_ID: call_id,
        },
    ) as span:
        yield span
