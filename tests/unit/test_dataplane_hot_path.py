"""What the dataplane does on every turn without the libraries' general paths (#17):
turn IDs without a ``uuid4`` per turn, a turn's span without the no-op tracer's detour
when no tracer provider is set, and metric children looked up once. Each must behave
as the general path did (D10, X1)."""

from __future__ import annotations

import os
import re

import pytest
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, NoOpTracer
from prometheus_client import CollectorRegistry, Counter

from luftpause.dataplane import tracing
from luftpause.dataplane.admission import _TurnIds
from luftpause.dataplane.metrics import Children

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_turn_ids_are_unique_shaped_as_before_and_new_in_a_forked_child() -> None:
    """Turn IDs keep the shape ``turn-`` + 32 hex digits; one process never repeats
    one; two processes (or two makers) draw different prefixes; a forked child does not
    go on with its parent's prefix and counter (it would repeat the parent's IDs)."""
    ids = _TurnIds()
    made = [ids() for _ in range(5000)]
    assert len(set(made)) == len(made)
    assert all(re.fullmatch(r"turn-[0-9a-f]{32}", t) for t in made)
    assert _TurnIds()().rpartition("-")[2][:16] != made[0].rpartition("-")[2][:16]

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one ID to the parent, then out without cleanup
        try:
            os.write(write, ids().encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert re.fullmatch(r"turn-[0-9a-f]{32}", child)
    assert child[:21] != made[0][:21]  # "turn-" and a prefix of its own


@pytest.mark.parametrize("headers", [{}, {"traceparent": CALLER}, {"traceparent": "garbage"}])
def test_a_turn_span_without_a_provider_is_the_no_op_tracers(
    monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]
) -> None:
    """X1 with tracing off: the turn's span is what the no-op tracer gives for the same
    parent (the caller's context, still passed on to the scheduler and the engine, or
    the invalid span), and it records nothing."""
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    span = tracing.start_turn(headers, route="chat", model="m", service_class="batch", run_id="r")
    general = NoOpTracer().start_span("turn m", context=tracing._parent(headers))
    assert span.get_span_context() == general.get_span_context()
    assert not span.is_recording()
    expected = CALLER if headers.get("traceparent") == CALLER else ""
    assert tracing.traceparent_of(span) == expected
    if not expected:
        assert span is INVALID_SPAN
    tracing.admitted(span, replica="a", held_s=0.1)  # no-ops, no errors
    tracing.end(span, "ok", prompt_tokens=1, completion_tokens=2, cached_tokens=0)


def test_metric_children_are_looked_up_once_and_count_as_labels_would() -> None:
    """D10: a child found through ``Children`` is the metric's own child for those
    values, so the exposition is what ``labels()`` would give."""
    registry = CollectorRegistry()
    turns = Counter("t", "turns", ["service_class", "outcome"], registry=registry)
    of = Children(turns)
    assert of("batch", "ok") is of("batch", "ok") is turns.labels("batch", "ok")
    of("batch", "ok").inc()
    of("interactive", "ok").inc(2)
    assert registry.get_sample_value("t_total", {"service_class": "batch", "outcome": "ok"}) == 1
    assert (
        registry.get_sample_value("t_total", {"service_class": "interactive", "outcome": "ok"}) == 2
    )
