"""X1 across processes: the whole stack exports spans over OTLP/HTTP to a real receiver
(``tests/_otlp_receiver.py``, decoding protobuf with ``opentelemetry-proto``).

One MCP ``spawn`` sent with a ``traceparent`` becomes one trace: the runtime's
``invoke_agent`` → ``chat`` → the dataplane's turn → the scheduler's ``admit``, and
the fake engine and the fake tool server received the same trace ID.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from _mcp_raw import RawMcp
from _otlp_receiver import OtlpReceiver, ReceivedSpan
from conftest import Services
from fullstack import write_config, write_runtime_config

pytestmark = pytest.mark.integration

TRACE_ID = "5b8efff798038103d269b633813fc60c"
CLIENT_SPAN = "eee19b7ec3c1b174"
WAIT_S = 30.0


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    r.start()
    yield r
    r.stop()


def ancestors(span: ReceivedSpan, by_id: dict[str, ReceivedSpan]) -> list[str]:
    """Span IDs above ``span``, nearest first (as far as the received spans go)."""
    out = []
    parent = span.parent_span_id
    while parent:
        out.append(parent)
        above = by_id.get(parent)
        parent = above.parent_span_id if above is not None else ""
    return out


async def test_one_spawn_is_one_trace_across_the_stack(
    services: Services, receiver: OtlpReceiver, tmp_path: Any
) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    engine = services.start(
        "fake-engine", "--name", "engine-a", "--port", "0", "--time-scale", "50",
        "--tool-results", "1", name="engine-a", env=env,
    )  # fmt: skip
    config = write_config(tmp_path / "stack.toml", {"engine-a": engine.urls["http"]})
    scheduler = services.start(
        "scheduler", "--config", str(config), "--port", "0", "--http-port", "0", env=env
    )
    dataplane = services.start(
        "dataplane", "--config", str(config), "--port", "0",
        "--scheduler", f"127.0.0.1:{scheduler.ports['grpc']}", env=env,
    )  # fmt: skip
    tools = services.start("fake-mcp", "--port", "0", "--lookup-delay-s", "0.05", env=env)
    runtime_config = write_runtime_config(tmp_path, dataplane.urls["http"], tools.urls["http"])
    runtime = services.start("runtime", "--config", str(runtime_config), "--port", "0", env=env)

    async with httpx.AsyncClient(base_url=runtime.urls["http"], timeout=60) as http:
        raw = RawMcp(http, client_name="trace-test")
        traceparent = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
        arguments = {"task": "traced", "tools": ["lookup"], "maxToolCalls": 1}
        spawned = (
            await raw.modern(
                "tools/call",
                {"name": "spawn", "arguments": arguments},
                caps={},
                headers=traceparent,
            )
        ).result
        handle = json.loads(spawned["content"][0]["text"])["handle"]
        done = (
            await raw.modern(
                "tools/call",
                {"name": "await", "arguments": {"handles": [handle], "timeout": 30}},
                caps={},
            )
        ).result
        result = json.loads(done["content"][0]["text"])["results"][0]
    assert result["state"] == "Completed" and result["toolCalls"] == 1, result

    # Each process exports on its own schedule, and a dataplane's turn span ends after
    # the runtime's chat span that read it has: wait for every span expected (one
    # agent, two chats, two turns, two admits, one tool call), not just one of each.
    def is_turn(span: ReceivedSpan) -> bool:
        return span.name.startswith("turn") and span.service == "luftpause-dataplane"

    wanted: dict[str, tuple[int, Callable[[ReceivedSpan], bool]]] = {
        "invoke_agent": (1, lambda s: s.name.startswith("invoke_agent")),
        "chat": (2, lambda s: s.name.startswith("chat")),
        "turn": (2, is_turn),
        "admit": (2, lambda s: s.name == "admit"),
        "execute_tool": (1, lambda s: s.name.startswith("execute_tool")),
    }

    def missing() -> dict[str, int]:
        seen = receiver.of_trace(TRACE_ID)
        counts = {w: sum(1 for s in seen if match(s)) for w, (_, match) in wanted.items()}
        return {w: n for w, n in counts.items() if n < wanted[w][0]}

    try:
        async with asyncio.timeout(WAIT_S):
            while missing():
                await asyncio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"spans still missing after {WAIT_S} s: {missing()}")
    spans = receiver.of_trace(TRACE_ID)
    by_id = {s.span_id: s for s in spans}
    [agent] = [s for s in spans if s.name.startswith("invoke_agent")]
    assert agent.parent_span_id == CLIENT_SPAN and agent.service == "luftpause-runtime"
    assert agent.attributes["gen_ai.agent.id"] == handle
    chats = [s for s in spans if s.name.startswith("chat")]
    assert len(chats) == 2 and all(c.parent_span_id == agent.span_id for c in chats)
    turns = [s for s in spans if is_turn(s)]
    assert len(turns) == 2
    for turn in turns:
        assert {c.span_id for c in chats} & set(ancestors(turn, by_id)), turn
        assert turn.attributes["luftpause.outcome"] in ("finished", "paused_on_tool")
        assert turn.attributes["luftpause.replica"] == "engine-a"
    admits = [s for s in spans if s.name == "admit"]
    assert {a.parent_span_id for a in admits} == {t.span_id for t in turns}
    assert all(a.service == "luftpause-scheduler" for a in admits)

    async with httpx.AsyncClient(timeout=10) as client:
        state = (await client.get(f"{engine.urls['http']}/debug/state")).json()
        seen_by_tools = (await client.get(f"{tools.urls['http']}/traces")).json()
    assert TRACE_ID in state["trace_ids"]
    assert TRACE_ID in seen_by_tools["trace_ids"]
