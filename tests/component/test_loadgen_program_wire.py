"""The load generator's ``--program-context`` on the wire, against the fake engine: each
turn of a run carries its program context, the last turn (the one the engine answers in
text) says ``expected_resume: false``, a played sub-agent names its parent, and the
engine serves the bodies as it serves any other."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
from _engine_helpers import RecordingEngine

from luftpause.fakes.engine.model import EngineParams
from luftpause.fakes.engine.server import ServerConfig, create_app
from luftpause.loadgen import shaped
from luftpause.loadgen.agents import AgentOptions, run_once
from luftpause.measure.mix import Group, ToolCalls
from luftpause.measure.workload import RunPlan, TurnPlan

MODEL = "llama-3.2-1b"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def recording_engine() -> RecordingEngine:
    """The fake engine, recording each chat request's headers and body."""
    return RecordingEngine(create_app(ServerConfig(params=EngineParams(time_scale=500.0))))


class NoTools:
    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        return f"{name} done", False


def client_for(recorder: RecordingEngine) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://engine/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=recorder)),
    )


def contexts(recorder: RecordingEngine) -> list[dict[str, Any]]:
    out = []
    for _, body in recorder.seen:
        out.append(json.loads(body["vllm_xargs"]["agentic_context"]))
    return out


async def test_own_loop_run_sends_its_context_and_ends_with_expected_resume_false() -> None:
    """H3, H4: an own-loop run of 2 tool calls is 3 turns; every turn names the run as
    its program with the class priority, and only the answer turn says it will not
    resume. The engine answers every turn (the field does not trouble it)."""
    recorder = recording_engine()
    group = Group("people", 1, "interactive", "people", tool_calls=ToolCalls(2, 2))
    options = AgentOptions(model=MODEL, program_context="xargs", class_headers=False)
    async with client_for(recorder) as client:
        record = await run_once(client, NoTools(), TOOLS, group, "run-7", 0, options, lambda: 0.0)  # type: ignore[arg-type]
    assert record.turns == 3 and record.tool_calls == 2
    assert [c["expected_resume"] for c in contexts(recorder)] == [True, True, False]
    assert {c["program_id"] for c in contexts(recorder)} == {"run-7"}
    assert {c["priority"] for c in contexts(recorder)} == {1}
    assert all("x-claude-code-session-id" not in h for h, _ in recorder.seen)


async def test_headers_mode_sends_the_session_header_and_no_body_field() -> None:
    """H3, H4: with headers, every turn carries the run ID as Claude Code's session
    and the body has no vllm_xargs."""
    recorder = recording_engine()
    group = Group("crowd", 1, "batch", "crowd", tool_calls=ToolCalls(1, 1))
    options = AgentOptions(model=MODEL, program_context="headers", class_headers=False)
    async with client_for(recorder) as client:
        record = await run_once(client, NoTools(), TOOLS, group, "run-8", 0, options, lambda: 0.0)  # type: ignore[arg-type]
    assert record.turns == 2
    assert [h["x-claude-code-session-id"] for h, _ in recorder.seen] == ["run-8", "run-8"]
    assert all("vllm_xargs" not in body for _, body in recorder.seen)


async def test_played_subagents_name_their_parent_and_last_turns() -> None:
    """H3, H4: a played run whose tool turn starts two sub-agents: each sub-agent's
    turns name it as a program blocking its parent, and each program's last turn (the
    parent's and every sub-agent's) says it will not resume."""
    recorder = recording_engine()
    group = Group("crowd", 1, "batch", "crowd")
    child = RunPlan((TurnPlan(40, 16, tool_s=0.0), TurnPlan(80, 8)))
    plan = RunPlan((TurnPlan(60, 16, subagents=(child, child)), TurnPlan(200, 8)))
    options = AgentOptions(model=MODEL, program_context="xargs", class_headers=False)
    async with client_for(recorder) as client:
        record = await shaped.play(client, plan, group, "run-9", options, lambda: 0.0)
    assert record.subagents == 2
    by_program: dict[str, list[dict[str, Any]]] = {}
    for context in contexts(recorder):
        by_program.setdefault(context["program_id"], []).append(context)
    assert set(by_program) == {"run-9", "run-9.1.0", "run-9.1.1"}
    for program, turns in by_program.items():
        assert [t["expected_resume"] for t in turns] == [True, False], program
        if program == "run-9":
            assert all("parent_program_id" not in t for t in turns)
        else:
            assert all(t["parent_program_id"] == "run-9" and t["blocks_parent"] for t in turns)
        assert {t["priority"] for t in turns} == {0}
