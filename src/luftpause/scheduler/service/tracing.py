"""The scheduler's ``admit`` span (X1): one per admission request (on a Link or an
``Admit`` call), the child of the
dataplane's turn span (``AdmitRequest.traceparent``), from the call's arrival to
the decision. Attributes: ``luftpause.turn_id``, ``luftpause.run_id``,
``luftpause.service_class``, ``luftpause.caller``, then ``luftpause.replica`` and
``luftpause.held_ms`` (the core's held time) when admitted, or
``luftpause.rejected`` (the reason code; ``over_quota`` for a caller's token limit,
B13, with ``luftpause.limit``) when not.

With no tracer provider configured, the span is a non-recording no-op.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.scheduler.core.actions import Admit, Reject
from luftpause.scheduler.service import convert
from luftpause.scheduler.service.quotas import OverQuota
from luftpause.telemetry import context_of

_tracer = trace.get_tracer("luftpause.scheduler")


@contextmanager
def admit_span(request: pb.AdmitRequest) -> Iterator[Span]:
    """The span of one ``Admit`` call, current for its duration."""
    span = start_admit(request)
    with trace.use_span(span, end_on_exit=True):
        yield span


def start_admit(request: pb.AdmitRequest) -> Span:
    """The span of one admission request; the caller ends it once decided."""
    return _tracer.start_span(
        "admit",
        context=context_of(request.traceparent),
        kind=SpanKind.SERVER,
        attributes={
            "luftpause.turn_id": request.turn_id,
            "luftpause.run_id": request.run_id,
            "luftpause.service_class": convert.service_class(request.service_class).value,
            "luftpause.caller": request.caller,
        },
    )


def decided(span: Span, outcome: Admit | Reject | OverQuota) -> None:
    if isinstance(outcome, Admit):
        span.set_attribute("luftpause.replica", outcome.replica)
        span.set_attribute("luftpause.held_ms", round(outcome.held_s * 1000.0, 3))
    elif isinstance(outcome, OverQuota):
        span.set_attribute("luftpause.rejected", "over_quota")
        span.set_attribute("luftpause.limit", outcome.limit)
        span.set_status(Status(StatusCode.ERROR, outcome.message[:200]))
    else:
        span.set_attribute("luftpause.rejected", outcome.code.value)
        span.set_status(Status(StatusCode.ERROR, outcome.message[:200]))
