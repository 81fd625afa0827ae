"""X1: the runtime's spans, read from the SDK's in-memory exporter.

One ``invoke_agent`` span per run (the child of the spawning request's trace
context, or of its parent run's span; across a restart from the journal), a
``chat`` span per model turn and an ``execute_tool`` span per tool call below it,
with the GenAI semantic-convention attributes.
"""

from __future__ import annotations

from pathlib import Path

from _otel import memory_spans, named
from _runtime_fakes import Hub, runtime, until
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

from luftpause.runtime.core import RunState
from luftpause.runtime.spawn_args import SpawnArgs

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01"


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def parent_of(span: ReadableSpan) -> str | None:
    return f"{span.parent.span_id:016x}" if span.parent is not None else None


def span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.span_id:016x}"


async def test_spawn_turns_and_tools_make_one_trace(tmp_path: Path) -> None:
    """X1: invoke_agent continues the request's traceparent; each turn is a chat span and
    each tool call an execute_tool span below it, with GenAI attributes."""
    spans = memory_spans()
    hub = Hub()
    rt, lines = runtime(tmp_path, hub)
    rt.recover(lines)
    run = await rt.spawn(SpawnArgs(task="trace me", tools=["rm"]), "test", TRACEPARENT)
    for _ in range(2):
        await until(lambda: run.pending is not None, "approval")
        await rt.decide_approval(run, True)
    await until(lambda: run.done, "run")
    await rt.shutdown()
    finished = spans.get_finished_spans()
    [agent] = named(finished, "invoke_agent")
    assert hex_trace(agent) == TRACE_ID and parent_of(agent) == PARENT_SPAN
    assert agent.attributes is not None
    assert agent.attributes[gen_ai.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert agent.attributes[gen_ai.GEN_AI_AGENT_ID] == run.id
    assert agent.attributes["luftpause.run.state"] == RunState.COMPLETED.value
    chats = named(finished, "chat")
    tools = named(finished, "execute_tool")
    assert len(chats) == 3 and len(tools) == 2
    for span in chats + tools:
        assert hex_trace(span) == TRACE_ID and parent_of(span) == span_id(agent)
    chat = chats[0].attributes
    assert chat is not None
    assert chat[gen_ai.GEN_AI_OPERATION_NAME] == "chat"
    assert chat[gen_ai.GEN_AI_REQUEST_MODEL] == "m"
    assert (chat[gen_ai.GEN_AI_USAGE_INPUT_TOKENS], chat[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS]) == (
        7,
        3,
    )
    tool = tools[0].attributes
    assert tool is not None
    assert tool[gen_ai.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert (tool[gen_ai.GEN_AI_TOOL_NAME], tool[gen_ai.GEN_AI_TOOL_CALL_ID]) == ("rm", "c0")


async def test_a_child_run_is_a_child_span_and_a_resumed_run_keeps_its_trace(
    tmp_path: Path,
) -> None:
    """X1, R8: a run spawned under a running parent is the child of the parent's span;
    after a restart the resumed run's new span joins the same trace, from the journal."""
    spans = memory_spans()
    rt, lines = runtime(tmp_path, Hub())
    rt.recover(lines)
    parent = await rt.spawn(SpawnArgs(task="parent", tools=["rm"]), "test", TRACEPARENT)
    await until(lambda: parent.pending is not None, "parent running")
    child = await rt.spawn(SpawnArgs(task="child", tools=["rm"], parent=parent.id), "test")
    await until(lambda: child.pending is not None, "child running")
    await rt.shutdown()  # both interrupted
    first = {
        s.attributes[gen_ai.GEN_AI_AGENT_ID]: s
        for s in named(spans.get_finished_spans(), "invoke_agent")
    }  # type: ignore[index]
    assert parent_of(first[child.id]) == span_id(first[parent.id])
    assert first[parent.id].attributes["luftpause.run.interrupted"] is True  # type: ignore[index]
    spans.clear()
    rt2, lines2 = runtime(tmp_path, Hub())
    rt2.recover(lines2)
    again = rt2.state.runs[parent.id]
    await until(lambda: again.pending is not None, "resumed")
    await rt2.shutdown()
    resumed = [
        s
        for s in named(spans.get_finished_spans(), "invoke_agent")
        if s.attributes is not None and s.attributes[gen_ai.GEN_AI_AGENT_ID] == parent.id
    ]
    assert len(resumed) == 1
    assert hex_trace(resumed[0]) == TRACE_ID and parent_of(resumed[0]) == PARENT_SPAN
