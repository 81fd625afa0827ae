"""Own-loop agents in virtual time, turn for turn what ``luftpause loadgen`` agents do.

A run starts from the load generator's conversation (``measure.content``: a shared
system preamble and a per-run task), offers the fake tool server's ``lookup`` tool,
and asks for a turn. The reply is what the fake engine would say to that
conversation (``fakes.engine.script.plan_reply`` on the rendered prompt): a tool
call until the conversation holds the run's number of tool results, then an
answer. A tool call is answered after the fake tool's delay (uniform 0.5-1.5 s,
seeded per agent) with the fake tool's result; the run ends with the answer and
the agent starts its next run at once (closed loop, no think time).

The engine is sent each prompt as its length and block chain (``PromptChain``), not
its text: a run's chain is extended by each turn's new messages, and its task's notes
(thousands of characters of filler) are never written out: the run's messages hold
a stand-in of the same length (the task's head, then spaces). The reply script reads
the same from it (labels and tool directives are read from the head alone: the head
ends in a sentence longer than a label, without a bracket or a separator, and the
notes hold no line break, bracket, separator or label word). Where the replies are
drawn from the conversation (no plan seed), the prompt's text is hashed as it grows
(``RunningHash``), the notes written once per run for it. The engine's cache, the
replies and every record are those of the text (``text_prompts``, as the fake engine
reads prompts; tests/unit/test_sim_prompts.py holds the two to the same events).

Given a plan seed, an agent's runs are those of ``luftpause loadgen --plan-seed``'s
slot of the same group and index: run n has the load generator's tool count for run n
and the fake engine's replies to its plan key (``measure.workload.plan_key``), so a
flood and the simulator can be compared on the same draws.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from luftpause.fakes.engine.blocks import BlockPrompt, PromptChain
from luftpause.fakes.engine.model import EngineRequest, SubmitError
from luftpause.fakes.engine.results import FinishedRequest
from luftpause.fakes.engine.script import (
    ReplyKind,
    ScriptOptions,
    ToolCall,
    plan_reply,
)
from luftpause.fakes.engine.tokens import (
    ASSISTANT_PROMPT,
    PromptHash,
    RunningHash,
    TextHash,
    count_tokens,
    render_head,
    render_message,
    render_messages,
)
from luftpause.fakes.mcp_tools import LOOKUP_DELAY_RANGE, FakeMcpSettings, filler_fact
from luftpause.measure import content
from luftpause.measure.mix import Group
from luftpause.measure.stats import EndedTurn, ErrorRecord, RunRecord, TurnRecord
from luftpause.measure.workload import plan_key
from luftpause.sim.arms import Arm, Ask, TurnEnd
from luftpause.sim.fleet import Replica
from luftpause.sim.placement import routing_text
from luftpause.sim.world import World

# The fake tool server's lookup tool, as its MCP listing offers it to the model.
LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up facts about a query (slow: about a second).",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "title": "Query"},
                "limit": {"type": "integer", "default": 3, "title": "Limit"},
            },
            "required": ["query"],
            "title": "lookupArguments",
        },
    },
}
TOOLS = [LOOKUP_TOOL]
MAX_TURNS = 10  # as the load generator's agents: a run needing more fails
RETRY_S = 1.0  # after a failed run, the agent starts its next this much later


def when_admitted(
    arm: Arm,
    replicas: dict[str, Replica],
    ask: Ask,
    prompt: str | BlockPrompt,
    *,
    reply_tokens: int,
    max_new_tokens: int | None,
    replied: Callable[[str, float, FinishedRequest], None],
    failed: Callable[[str, str], None],
) -> Callable[[str, float], None]:
    """What a turn does once the arm admits it: its request goes to the replica's engine,
    which reports the first token and the end to the arm and to ``replied(replica,
    held_s, done)``; a prompt longer than the engine's context is its 400, ``failed``."""

    def admitted(replica: str, held_s: float) -> None:
        request = EngineRequest(
            ask.turn_id,
            prompt if isinstance(prompt, str) else "",
            reply_tokens=reply_tokens,
            max_new_tokens=max_new_tokens,
            priority=arm.priority(ask.cls),
            retain_key=ask.run_id,
            retain_s=arm.retain_s(ask.turn_id),
            prompt=None if isinstance(prompt, str) else prompt,
        )
        arm.started(ask.turn_id)
        try:
            replicas[replica].submit(
                request,
                lambda: arm.first_token(ask.turn_id),
                lambda done: replied(replica, held_s, done),
            )
        except SubmitError as exc:  # the prompt outgrew the context: the engine's 400
            arm.finished(ask, TurnEnd(False, "error", 0, 0, 0))
            failed("http_400", str(exc))

    return admitted


def turn_record(
    wall_s: float,
    held_s: float | None,
    replica: str,
    done: FinishedRequest,
    tool_calls: int,
    planned: tuple[int, int] | None = None,
) -> TurnRecord:
    """A simulated turn as the load generator records one (``planned``: the prompt and
    reply lengths a replayed plan asked for)."""
    t = done.timing
    return TurnRecord(
        wall_s=wall_s,
        held_s=held_s,
        queued_s=t.queued_s,
        prefill_s=t.prefill_s,
        decode_s=t.decode_s,
        prompt_tokens=done.prompt_tokens,
        cached_tokens=done.cached_tokens,
        completion_tokens=done.completion_tokens,
        replica=replica,
        tool_calls=tool_calls,
        planned_prompt_tokens=planned[0] if planned else None,
        planned_completion_tokens=planned[1] if planned else None,
    )


@dataclass
class Records:
    """What the agents record, shared by all of them."""

    runs: list[RunRecord] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    turns: int = 0
    ended: list[EndedTurn] = field(default_factory=list)  # every turn, as it ended

    def turn_ended(self, group: str, cls: str, at: float, turn: TurnRecord) -> TurnRecord:
        self.ended.append(EndedTurn(group, cls, at, turn))
        return turn


class Agent:
    def __init__(
        self,
        index: int,
        group: Group,
        model: str,
        world: World,
        arm: Arm,
        replicas: dict[str, Replica],
        records: Records,
        seed: int,
        script: ScriptOptions,
        plan_seed: str | None = None,
        slot: int = 0,
        text_prompts: bool = False,
    ) -> None:
        self.index = index
        # Prompts as text, rendered and hashed at every turn as the fake engine does
        # (True), or as block chains extended turn by turn (see the module docstring).
        self.text_prompts = text_prompts
        # Given a plan seed, run n (from 0) of this slot is the load generator's run n of
        # slot ``slot`` with that plan seed: its tool count and the engine's replies.
        self.plan_seed = plan_seed
        self.slot = slot
        self.group = group
        self.model = model
        self.world = world
        self.arm = arm
        self.replicas = replicas
        self.records = records
        self.script = script
        self.rng = random.Random(f"{seed}:{group.name}:{index}")
        # The tool server's seed: the simulator's, or, where the runs are a load's, that
        # of the `luftpause fake-mcp` the load generator calls (its default)
        self.seed = seed if plan_seed is None else FakeMcpSettings.seed
        self.runs = 0
        self.stopped = False

    def start(self, at: float) -> None:
        self.world.at(at, self._new_run)

    def stop(self) -> None:
        """Start no further run (the one in flight goes on)."""
        self.stopped = True

    # ------------------------------------------------------------------ a run

    def _new_run(self) -> None:
        if self.stopped:
            return
        number = self.runs
        self.runs += 1
        key = f"{self.group.name}-{self.index}-{self.runs}"
        calls = self.group.tool_calls
        if self.plan_seed is None:
            plan, tool_results = None, self.rng.randint(calls.lo, calls.hi)
        else:
            plan = plan_key(self.plan_seed, self.group.name, self.slot, number)
            tool_results = calls.pick(number)
        run_id = f"sim-{key}"
        if self.text_prompts:
            messages, chain, hashes = (
                content.messages(self.group.context_chars, key, plan),
                None,
                None,
            )
        else:
            messages, chain, hashes = self._first_prompt(run_id, key, plan)
        run = _Run(
            run_id=run_id,
            key=key,
            messages=messages,
            chain=chain,
            hashes=hashes,
            tool_results=tool_results,
            plan=plan,
            record=RunRecord(
                group=self.group.name,
                cls=self.group.cls,
                kind="agent",
                start_s=self.world.now,
                end_s=self.world.now,
                turns=0,
                tool_calls=0,
            ),
        )
        self._turn(run)

    def _first_prompt(
        self, run_id: str, key: str, plan: str | None
    ) -> tuple[list[dict[str, Any]], PromptChain, RunningHash | None]:
        """A run's first messages, with a stand-in for the task's notes, its prompt's
        chain so far and, where the replies are drawn from the conversation, its hash."""
        chars = self.group.context_chars
        head, notes = content.task_parts(chars, key, plan)
        stand_in = head + " " * notes
        messages = content.conversation(chars, stand_in)
        block_chars = next(iter(self.replicas.values())).params.block_chars
        base, base_hash = _shared_prompt(chars, block_chars, hashed=plan is None)
        chain = base.copy()
        hashes = None if base_hash is None else base_hash.copy()
        rendered = render_message(messages[-1])
        cut = rendered.index(stand_in) + len(head)
        chain.append(rendered[:cut]).append_opaque(notes, run_id).append(rendered[cut + notes :])
        if hashes is not None:  # (the notes written once, for the hash only)
            hashes.feed(rendered[:cut]).feed(content.filler(notes, key))
            hashes.feed(rendered[cut + notes :])
        return messages, chain, hashes

    def _turn(self, run: _Run) -> None:
        if run.record.turns >= MAX_TURNS:
            self._failed(run, "too_many_turns", f"no answer after {MAX_TURNS} turns")
            return
        run.record.turns += 1
        self.records.turns += 1
        prompt: str | BlockPrompt
        if run.chain is None:
            prompt = render_messages(run.messages, TOOLS)
            prompt_hash: PromptHash = TextHash(prompt)
            context_tokens = count_tokens(prompt)
        else:
            prompt = run.chain.copy().append(ASSISTANT_PROMPT).prompt()
            context_tokens = prompt.tokens
            # Without a plan key the replies are drawn from the prompt's hash; with one,
            # only a tool call's id is, which nothing reads but its length.
            prompt_hash = (
                TextHash(run.run_id)
                if run.hashes is None
                else run.hashes.copy().feed(ASSISTANT_PROMPT)
            )
        nonce = f"{run.key}:{run.record.turns}"
        plan = plan_reply(
            run.messages,
            TOOLS,
            self.script,
            prompt_text=prompt if isinstance(prompt, str) else "",
            tool_results=run.tool_results,
            call_nonce=nonce,
            plan_key=run.plan,
            prompt_hash=prompt_hash,
        )
        ask = Ask(
            turn_id=f"turn-{nonce}",
            run_id=run.run_id,
            model=self.model,
            cls=self.group.cls,
            caller=self.group.caller,
            agent=self.index,
            routing_text=routing_text(run.messages),
            expected_resume=plan.kind is ReplyKind.TOOL_CALL,
            context_tokens=context_tokens,
        )
        asked_at = self.world.now

        admitted = when_admitted(
            self.arm,
            self.replicas,
            ask,
            prompt,
            reply_tokens=plan.reply_tokens,
            max_new_tokens=self.group.max_tokens,
            replied=lambda replica, held_s, done: self._replied(
                run, ask, asked_at, held_s, replica, done
            ),
            failed=lambda reason, why: self._failed(run, reason, why),
        )
        run.pending_call = plan.tool_call if plan.kind is ReplyKind.TOOL_CALL else None
        self.arm.request(ask, admitted, lambda why: self._failed(run, "http_404", why))

    def _replied(
        self,
        run: _Run,
        ask: Ask,
        asked_at: float,
        held_s: float,
        replica: str,
        done: FinishedRequest,
    ) -> None:
        call = run.pending_call
        self.arm.finished(
            ask,
            TurnEnd(
                paused_on_tool=call is not None,
                finish_reason="tool_calls" if call is not None else done.reason.value,
                prompt_tokens=done.prompt_tokens,
                completion_tokens=done.completion_tokens,
                cached_tokens=done.cached_tokens,
            ),
        )
        turn = turn_record(
            self.world.now - asked_at,
            held_s if self.arm.holds else None,
            replica,
            done,
            tool_calls=1 if call is not None else 0,
        )
        run.record.turn_records.append(
            self.records.turn_ended(self.group.name, self.group.cls, self.world.now, turn)
        )
        if call is None:
            run.record.end_s = self.world.now
            prompts = [r.prompt_tokens or 0 for r in run.record.turn_records]
            cached = [r.cached_tokens or 0 for r in run.record.turn_records]
            run.record.prompt_tokens = sum(prompts)
            run.record.cached_tokens = sum(cached)
            self.records.runs.append(run.record)
            self._new_run()
            return
        run.record.tool_calls += 1
        arguments = json.loads(call.arguments)
        query = str(arguments.get("query", ""))
        limit = arguments.get("limit", 3)
        result = {
            "query": query,
            "facts": [filler_fact(self.seed, "lookup", query, i) for i in range(int(limit))],
        }
        new: list[dict[str, Any]] = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
        ]
        run.messages = [*run.messages, *new]
        if run.chain is not None:
            for message in new:
                rendered = render_message(message)
                run.chain.append(rendered)
                if run.hashes is not None:
                    run.hashes.feed(rendered)
        delay = self.rng.uniform(*LOOKUP_DELAY_RANGE)
        run.record.tool_s += delay
        self.world.after(delay, lambda: self._turn(run))

    def _failed(self, run: _Run, kind: str, message: str) -> None:
        self.records.errors.append(
            ErrorRecord(
                group=self.group.name,
                cls=self.group.cls,
                kind=kind,
                at_s=self.world.now,
                message=message[:300],
            )
        )
        # The next run starts a second later, as a client would retry: a run that fails
        # at once (a prompt the engine refuses) must not start the next in the same instant.
        self.world.after(RETRY_S, self._new_run)


@dataclass
class _Run:
    run_id: str
    key: str
    messages: list[dict[str, Any]]
    tool_results: int
    record: RunRecord
    plan: str | None = None  # the fake engine's plan key (None: replies drawn from the prompt)
    pending_call: ToolCall | None = None  # the tool call the turn in flight will make
    # The prompt so far, less the reply's header: its chain, and its running hash where
    # the replies are drawn from it (None: the prompt is rendered as text at each turn).
    chain: PromptChain | None = None
    hashes: RunningHash | None = None


@functools.lru_cache(maxsize=64)
def _shared_prompt(
    context_chars: int, block_chars: int, *, hashed: bool
) -> tuple[PromptChain, RunningHash | None]:
    """What every run's prompt starts with (the tools, the preamble): its chain and its
    running hash (hashed), to be copied, never changed."""
    text = render_head(TOOLS) + render_message(content.conversation(context_chars, "")[0])
    chain = PromptChain(block_chars).append(text)
    return chain, RunningHash(("conversation", "call")).feed(text) if hashed else None
