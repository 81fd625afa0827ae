"""Own-loop agents that play a :class:`~luftpause.measure.workload.RunPlan` (B10).

A plan fixes, per turn, the prompt's length, the reply's length and the tool time
after it. An engine decides what it replies, so the load generator steers it with
what an OpenAI-compatible request can say, and pads the conversation to the plan:

* **Prompt length** is padded, not asked for: the first prompt is the replay's tool
  definitions and a system prompt of deterministic text, together ``shared_tokens``
  long and the same for every run of the profile or trace, then the run's task
  padded to the first prompt; after each
  tool turn the tool's result is padded so that the next prompt (previous prompt +
  the reply as the engine wrote it + the result) reaches the plan's next prompt.
  Tokens are counted as the fake engine counts them (4 characters, its chat
  rendering), corrected after every turn by the ``usage.prompt_tokens`` the engine
  reported (``drift``), so a real tokenizer converges too. A prompt can only grow
  by at least the reply: when the plan grows by less, the prompt comes out longer.
  A plan whose prompt *shrinks* (a compacted conversation) starts the conversation
  afresh: the system prompt and a new task of the planned length.
* **The last turn's reply** (the answer) is asked with ``max_tokens`` = the planned
  length and ``ignore_eos: true`` (SGLang's and vLLM's sampling parameter, which the
  fake engine honours): exactly that many tokens.
* **A tool turn's reply** must be a tool call (it is what pauses the run in
  luftpause). The replay offers nine tools whose one argument has a minimum length
  (``emit_16`` ... ``emit_4096``) and names the one nearest the planned length with
  ``tool_choice``: the fake engine writes the call's arguments to that length, so a
  tool turn's reply is within a factor √2 of the plan (16-4096 tokens). A real
  model writes what it writes (``max_tokens`` only caps it).
* **The tool** is not called: the agent waits the planned time (divided by
  ``time_scale``), or starts the planned sub-agents in parallel (own-loop runs of
  their own, with their own run IDs, class and caller the parent's) and waits for all.

A tool turn names its tool in ``tool_choice``, which the fake engine (as a real
one) always answers with a call; the last turn sends ``tool_choice: "none"``. The
``x-fake-tool-results`` header says the same for an engine that reads it (routers
such as the SGLang router and SMG drop it, and need not forward it).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import openai

from luftpause.fakes.engine.tokens import count_tokens, render_messages
from luftpause.loadgen.agents import (
    AgentOptions,
    Lineage,
    Reply,
    RunFailed,
    assistant_message,
    classify_error,
    run_headers,
    stream_turn,
    turn_body,
)
from luftpause.measure.mix import Group
from luftpause.measure.shaped import pad, shared_text
from luftpause.measure.stats import EndedTurn, RunRecord
from luftpause.measure.workload import RunPlan

BUCKETS = tuple(1 << i for i in range(4, 13))  # tool-call reply sizes: 16 ... 4096 tokens
_JSON_OVERHEAD = len('{"text": ""}')


def _emit_tool(tokens: int) -> dict[str, Any]:
    # The fake engine writes {"text": "<value>"} with the value padded to minLength;
    # a structured call is 1 token (the name) + its arguments in 4-character tokens.
    length = max(1, 4 * (tokens - 1) - _JSON_OVERHEAD)
    return {
        "type": "function",
        "function": {
            "name": f"emit_{tokens}",
            "description": f"Replay tool: write about {tokens} tokens of arguments "
            "(nothing is executed).",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string", "minLength": length}},
                "required": ["text"],
            },
        },
    }


TOOLS = [_emit_tool(b) for b in BUCKETS]


def bucket(tokens: int) -> int:
    """The tool-call size nearest ``tokens`` (in ratio), 16 ... 4096."""
    exponent = round(math.log2(max(1, tokens)))
    return min(BUCKETS[-1], max(BUCKETS[0], 1 << exponent))


class Conversation:
    """A plan's conversation as chat messages, padded to the planned prompt lengths."""

    def __init__(self, plan: RunPlan, run_key: str, tools: list[dict[str, Any]]) -> None:
        self.plan = plan
        self.run_key = run_key
        self.tools = tools
        self.messages: list[dict[str, Any]] = []
        self.results = 0  # tool results in the conversation
        self.drift = 0  # the engine's count minus ours, as of the last turn
        self._sent = 0  # our count of the prompt last sent
        self._fresh(plan.turns[0].prompt_tokens, 0)

    def count(self, messages: list[dict[str, Any]]) -> int:
        return count_tokens(render_messages(messages, self.tools))

    def _fresh(self, target: int, turn: int) -> None:
        """Start (or, after a compaction, restart) at ``target`` tokens."""
        system: list[dict[str, Any]] = []
        if self.plan.shared_tokens:
            # The shared part is the tool definitions and the system prompt together.
            empty = [{"role": "system", "content": ""}]
            own = self.plan.shared_tokens - self.count(empty)
            system = [{"role": "system", "content": shared_text(self.plan.prefix, max(0, own))}]
        head = f"Task {self.run_key}" + (f" (continued at turn {turn})" if turn else "") + ": "
        messages = [*system, {"role": "user", "content": head}]
        need = target - self.count(messages) - self.drift
        messages[-1]["content"] = head + pad(4 * need)
        self.messages = messages
        self.results = 0

    def request(self, k: int) -> tuple[int, dict[str, Any], int]:
        """Turn ``k``: (max_tokens, body fields, x-fake-tool-results)."""
        turn = self.plan.turns[k]
        self._sent = self.count(self.messages)
        if k == len(self.plan.turns) - 1:
            return turn.completion_tokens, {"tool_choice": "none", "ignore_eos": True}, self.results
        size = bucket(turn.completion_tokens)
        choice = {"type": "function", "function": {"name": f"emit_{size}"}}
        return max(turn.completion_tokens, size) + 16, {"tool_choice": choice}, self.results + 1

    def replied(self, k: int, reply: Reply) -> None:
        """Record tool turn ``k``'s reply and pad its results to turn ``k + 1``'s prompt."""
        if reply.turn.prompt_tokens is not None:
            self.drift = reply.turn.prompt_tokens - self._sent
        if not reply.tool_calls:
            raise RunFailed(
                "no_tool_call", f"turn {k + 1} of the plan was to call a tool; the reply did not"
            )
        target = self.plan.turns[k + 1].prompt_tokens
        if target < self.plan.turns[k].prompt_tokens:  # compacted: start afresh
            self._fresh(target, k + 1)
            return
        self.messages.append(assistant_message(reply))
        results = [
            {"role": "tool", "tool_call_id": c["id"], "content": ""} for c in reply.tool_calls
        ]
        need = target - self.count([*self.messages, *results]) - self.drift
        results[-1]["content"] = pad(4 * need)
        self.messages.extend(results)
        self.results += len(results)


async def play(
    client: openai.AsyncOpenAI,
    plan: RunPlan,
    group: Group,
    run_key: str,
    options: AgentOptions,
    clock: Callable[[], float],
    time_scale: float = 1.0,
    lineage: Lineage | None = None,
) -> RunRecord:
    """Play one plan, start to answer; raises :class:`RunFailed`. ``lineage``: where a
    sub-agent sits (its parent names it to a program-scheduling router).

    The record is the run's and its sub-agents' together (as the runtime's run tree
    counts a subtree): ``turns`` and ``tool_calls`` are the run's own, ``turn_records``,
    tokens and ``subagents`` include its sub-agents'.
    """
    start = clock()
    # x-fake-tool-results: set per turn
    headers = run_headers(group, run_key, 0, options, lineage)
    parent = lineage.parent if lineage is not None else None
    conv = Conversation(plan, run_key, TOOLS)
    record = RunRecord(group.name, group.cls, "agent", start, start, turns=0, tool_calls=0)
    options.live[run_key] = str(client.base_url).rstrip("/")
    last = len(plan.turns) - 1
    try:
        for k, turn in enumerate(plan.turns):
            max_tokens, fields, results = conv.request(k)
            reply = await stream_turn(
                client,
                conv.messages,
                TOOLS,
                {**headers, "x-fake-tool-results": str(results)},
                {**turn_body(group, run_key, k == last, options, parent), **fields},
                max_tokens,
                options,
            )
            reply.turn.planned_prompt_tokens = turn.prompt_tokens
            reply.turn.planned_completion_tokens = turn.completion_tokens
            record.turns += 1
            record.turn_records.append(reply.turn)
            options.ended.append(EndedTurn(group.name, group.cls, clock(), reply.turn))
            if k == last:
                break
            conv.replied(k, reply)
            record.tool_calls += len(reply.tool_calls)
            t0 = time.perf_counter()
            if turn.subagents:
                below = Lineage(lineage.root if lineage else run_key, run_key)
                subs = await _subagents(
                    client,
                    turn.subagents,
                    group,
                    f"{run_key}.{k + 1}",
                    options,
                    clock,
                    time_scale,
                    below,
                )
                for sub in subs:
                    record.turn_records.extend(sub.turn_records)
                    record.subagents += 1 + sub.subagents
            else:
                await asyncio.sleep(turn.tool_s / time_scale)
            record.tool_s += time.perf_counter() - t0
    except asyncio.CancelledError:
        raise  # stays in options.live: the load ends it
    except Exception as exc:
        options.live.pop(run_key, None)
        raise classify_error(exc) from exc
    options.live.pop(run_key, None)
    record.end_s = clock()
    record.prompt_tokens = sum(t.prompt_tokens or 0 for t in record.turn_records)
    record.cached_tokens = sum(t.cached_tokens or 0 for t in record.turn_records)
    return record


async def _subagents(
    client: openai.AsyncOpenAI,
    plans: tuple[RunPlan, ...],
    group: Group,
    key: str,
    options: AgentOptions,
    clock: Callable[[], float],
    time_scale: float,
    lineage: Lineage,
) -> list[RunRecord]:
    """Sub-agents in parallel; the first that fails cancels the others and fails the parent."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(
                    play(client, p, group, f"{key}.{i}", options, clock, time_scale, lineage)
                )
                for i, p in enumerate(plans)
            ]
    except* RunFailed as failed:
        first = _first(failed)
        raise RunFailed(first.kind, f"sub-agent: {first}") from None
    return [t.result() for t in tasks]


def _first(group: BaseExceptionGroup[RunFailed]) -> RunFailed:
    inner = group.exceptions[0]
    return inner if isinstance(inner, RunFailed) else _first(inner)
