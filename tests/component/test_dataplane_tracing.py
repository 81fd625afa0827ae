"""X1: a proxy turn's span and the scheduler's admit span, in process (SDK in-memory
exporter): the client's traceparent → the dataplane's turn span → the scheduler's
admit span, the engine request's client span, and the engine request carries the
same trace."""

from __future__ import annotations

import asyncio

import httpx
from _dataplane_stack import (
    COMPLETION,
    Stack,
    chat,
    nothing_in_flight,
    stack_fixture,  # noqa: F401  (provides the stack fixture)
)
from _otel import memory_spans, named
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import SpanKind

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


async def test_a_turn_is_one_trace_from_client_to_engine(stack: Stack) -> None:
    """X1: the turn span continues the client's traceparent and carries held time,
    replica, outcome and cached tokens; admit is its child; the engine gets the trace."""
    spans = memory_spans()
    stack.engine.reply = lambda r: httpx.Response(200, json=COMPLETION)
    response = await stack.client.post(
        "/v1/chat/completions",
        json=chat(),
        headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "x-luftpause-run-id": "r1"},
    )
    assert response.status_code == 200
    await nothing_in_flight(stack)
    async with asyncio.timeout(5):
        while not named(spans.get_finished_spans(), "turn"):
            await asyncio.sleep(0.01)
    finished = spans.get_finished_spans()
    [turn] = named(finished, "turn")
    [admit] = named(finished, "admit")
    assert turn.context is not None and admit.context is not None
    assert f"{turn.context.trace_id:032x}" == TRACE_ID
    # Its parent is the client's span, or a server span (FastAPI's own) continuing it.
    by_id = {s.context.span_id: s for s in finished if s.context is not None}
    chain, parent = [], turn.parent
    while parent is not None and parent.span_id in by_id:
        chain.append(by_id[parent.span_id].name)
        parent = by_id[parent.span_id].parent
    assert parent is not None and f"{parent.span_id:016x}" == CLIENT_SPAN, chain
    assert admit.parent is not None and admit.parent.span_id == turn.context.span_id
    attrs = turn.attributes
    assert attrs is not None
    assert attrs["luftpause.replica"] == "engine-a" and attrs["luftpause.outcome"] == "finished"
    assert attrs["luftpause.run_id"] == "r1" and attrs["luftpause.held_ms"] >= 0
    assert gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS in attrs
    assert admit.attributes is not None and admit.attributes["luftpause.replica"] == "engine-a"
    # The engine request: a client span under the turn, named in its traceparent.
    [engine] = named(finished, "POST")
    assert engine.kind is SpanKind.CLIENT and engine.context is not None
    assert engine.parent is not None and engine.parent.span_id == turn.context.span_id
    assert engine.attributes is not None
    assert engine.attributes["http.response.status_code"] == 200
    assert str(engine.attributes["url.full"]).endswith("/v1/chat/completions")
    [seen] = stack.engine.seen
    assert seen.headers["traceparent"].split("-")[1] == TRACE_ID
    assert seen.headers["traceparent"].split("-")[2] == f"{engine.context.span_id:016x}"


async def test_a_refused_turn_ends_its_span_with_the_outcome(stack: Stack) -> None:
    """X1: a turn the scheduler never admits still ends its span, with its outcome."""
    spans = memory_spans()
    response = await stack.client.post("/v1/chat/completions", json={**chat(), "model": "nope"})
    assert response.status_code == 404
    assert named(spans.get_finished_spans(), "turn") == []  # refused before any span
    stack.engine.reply = lambda r: httpx.Response(503, json={"error": {"message": "down"}})
    response = await stack.client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 503
    await nothing_in_flight(stack)
    [turn] = named(spans.get_finished_spans(), "turn")
    assert turn.attributes is not None and turn.attributes["luftpause.outcome"] == "engine_rejected"


def test_trace_id_of_a_traceparent() -> None:
    """X1: the scheduler keeps a held turn's trace ID from its AdmitRequest.traceparent;
    anything that is not a valid traceparent gives none."""
    from luftpause.telemetry import trace_id_of

    assert trace_id_of(f"00-{TRACE_ID.upper()}-{CLIENT_SPAN}-01") == TRACE_ID
    for bad in (
        "",
        "garbage",
        f"00-{'0' * 32}-{CLIENT_SPAN}-01",
        f"00-{'z' * 32}-{CLIENT_SPAN}-01",
    ):
        assert trace_id_of(bad) == ""


def test_admit_span_takes_an_unknown_service_class() -> None:
    """X1: the admit span never fails an Admit: an enum value this scheduler does not
    know (a newer dataplane) is read as the core reads it (batch)."""
    from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
    from luftpause.scheduler.service.tracing import admit_span

    spans = memory_spans()
    with admit_span(pb.AdmitRequest(turn_id="t", run_id="r", service_class=99)):
        pass
    [span] = named(spans.get_finished_spans(), "admit")
    assert span.attributes is not None and span.attributes["luftpause.service_class"] == "batch"
