"""Runs that follow a plan (B10) in virtual time: profile agents and trace replay.

A plan (``measure.workload.RunPlan``, sampled from a profile or read from a trace)
fixes every turn's prompt length, reply length and the tool time after it. Here the
engine model gets exactly that: the prompt is text of ``4 × prompt_tokens`` characters
(the engine's four characters a token) and the reply is ``completion_tokens`` long
(``reply_tokens`` and ``max_new_tokens``), so unlike the load generator against an
engine nothing is approximated.

The prompt text is the shared system prompt of the plan's ``prefix`` (the load
generator's text, the same for every run of a profile or trace), then the run's own
text, which starts with its run key; each turn's prompt extends the previous one by
the planned number of tokens, so the engine's prefix cache sees a conversation grow
as it would. A plan whose prompt shrinks (a compaction) starts a new text after the
system prompt. The engine is sent each prompt as its block chain (``PromptChain``),
extended turn by turn: the system prompt and the run's key are keyed as text, the rest
(the run's own) by its length, as the text keys it (``text_prompts``: as text, hashed
at every turn). Sub-agents are runs of their own (their own run IDs, the parent's
class, caller and agent index), started together when the parent's tool turn ends;
the parent's next turn waits for the last of them. A run's record holds its
sub-agents' turns and tokens too (as the load generator's does).

A profile agent runs plan after plan (closed loop, no think time), each plan sampled
from the seed, the group, the agent's index and the run's number, or, given a plan
seed, exactly as ``luftpause loadgen --plan-seed`` samples it (the same runs, slot for
slot); a trace run is played once, from its ``start_s``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from luftpause.fakes.engine.blocks import PromptChain
from luftpause.fakes.engine.results import FinishedRequest
from luftpause.measure.mix import Group
from luftpause.measure.shaped import pad, shared_text
from luftpause.measure.stats import ErrorRecord, RunRecord
from luftpause.measure.workload import Profile, RunPlan, run_rng
from luftpause.sim.agents import RETRY_S, Records, turn_record, when_admitted
from luftpause.sim.arms import Arm, Ask, TurnEnd
from luftpause.sim.fleet import Replica
from luftpause.sim.world import World

Ended = Callable[["_Play", "str | None", str], None]  # the play, failure kind (None: ok), why


def first_text(plan: RunPlan, key: str, tokens: int) -> str:
    """A fresh prompt of exactly ``tokens`` tokens: the shared system prompt, then the run's."""
    text, padding = first_parts(plan, key, tokens)
    return text + pad(padding or 0)


def first_parts(plan: RunPlan, key: str, tokens: int) -> tuple[str, int | None]:
    """``first_text`` as its text up to the end of the run's key, and the characters of
    padding after it; the text cut short and None where the prompt ends before the key."""
    shared = shared_text(plan.prefix, plan.shared_tokens) if plan.shared_tokens else ""
    head = f"Run {key}: "
    chars = 4 * tokens
    text = shared + head
    return (text[:chars], None) if len(text) > chars else (text, chars - len(text))


def first_chain(plan: RunPlan, key: str, tokens: int, block_chars: int) -> PromptChain:
    """``first_text``'s block chain: once the run's key is in, the rest is the run's own."""
    text, padding = first_parts(plan, key, tokens)
    chain = PromptChain(block_chars).append(text)
    return chain if padding is None else chain.append_opaque(padding, key)


def more_text(tokens: int, tag: str) -> str:
    """``tokens`` tokens to append (the reply and the tool result, as text)."""
    head = f" [{tag}] "
    chars = 4 * tokens
    return head[:chars] if len(head) >= chars else head + pad(chars - len(head))


@dataclass
class _Play:
    plan: RunPlan
    key: str
    record: RunRecord
    text: str
    ended: Ended
    chain: PromptChain | None = None  # the prompt's chain (None: the engine hashes ``text``)
    k: int = 0  # the turn in flight or next
    children_left: int = 0
    child_failure: tuple[str, str] | None = None
    children: list[RunRecord] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return f"sim-{self.key}"


class ShapedAgent:
    """Plays plans: a profile agent's runs one after another, or one trace run."""

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
        profile: Profile | None = None,
        plan_seed: str | None = None,
        slot: int = 0,
        text_prompts: bool = False,
    ) -> None:
        self.index = index
        self.text_prompts = text_prompts  # prompts sent as text (else as block chains)
        self.group = group
        self.model = model
        self.world = world
        self.arm = arm
        self.replicas = replicas
        self.records = records
        self.seed = seed
        self.profile = profile
        # Runs drawn as `luftpause loadgen --plan-seed` draws them: from the plan seed, the
        # group, the agent's slot in its group and the run's number from 0. Without one,
        # from the seed, the group, the agent's index and the run's number from 1.
        self.plan_seed = plan_seed
        self.slot = slot
        self.runs = 0
        self.stopped = False
        self.unfinished = 0  # runs started and not yet ended

    # ------------------------------------------------------------------ entry points

    def start(self, at: float) -> None:
        """A profile agent: its first run at ``at``, the next whenever one ends."""
        self.world.at(at, self._next_profile_run)

    def replay(self, plan: RunPlan, run_id: str, at: float) -> None:
        """A trace run: played once, from ``at``."""
        self.unfinished += 1
        self.world.at(at, lambda: self._begin(plan, f"trace-{run_id}", self._replayed))

    def stop(self) -> None:
        self.stopped = True

    def _next_profile_run(self) -> None:
        if self.stopped or self.profile is None:
            return
        self.runs += 1
        if self.plan_seed is not None:
            rng = run_rng(self.plan_seed, self.group.name, self.slot, self.runs - 1)
        else:
            rng = run_rng(self.seed, self.group.name, self.index, self.runs)
        plan = self.profile.sample(rng)
        self.unfinished += 1
        self._begin(plan, f"{self.group.name}-{self.index}-{self.runs}", self._profile_run_ended)

    def _profile_run_ended(self, play: _Play, kind: str | None, why: str) -> None:
        self._top_level_ended(play, kind, why)
        if kind is None:
            self._next_profile_run()
        else:  # as a client retries: a run that fails at once must not spin
            self.world.after(RETRY_S, self._next_profile_run)

    def _replayed(self, play: _Play, kind: str | None, why: str) -> None:
        self._top_level_ended(play, kind, why)

    def _top_level_ended(self, play: _Play, kind: str | None, why: str) -> None:
        self.unfinished -= 1
        if kind is None:
            self.records.runs.append(play.record)
            return
        self.records.errors.append(
            ErrorRecord(self.group.name, self.group.cls, kind, self.world.now, why[:300])
        )

    # ------------------------------------------------------------------ a run

    def _begin(self, plan: RunPlan, key: str, ended: Ended) -> None:
        record = RunRecord(
            group=self.group.name,
            cls=self.group.cls,
            kind="agent",
            start_s=self.world.now,
            end_s=self.world.now,
            turns=0,
            tool_calls=0,
        )
        tokens = plan.turns[0].prompt_tokens
        play = _Play(plan, key, record, first_text(plan, key, tokens), ended)
        play.chain = self._chain(plan, key, tokens)
        self._turn(play)

    def _chain(self, plan: RunPlan, key: str, tokens: int) -> PromptChain | None:
        if self.text_prompts:
            return None
        block_chars = next(iter(self.replicas.values())).params.block_chars
        return first_chain(plan, key, tokens, block_chars)

    def _turn(self, play: _Play) -> None:
        turn = play.plan.turns[play.k]
        self.records.turns += 1
        ask = Ask(
            turn_id=f"turn-{play.key}:{play.k + 1}",
            run_id=play.run_id,
            model=self.model,
            cls=self.group.cls,
            caller=self.group.caller,
            agent=self.index,
            routing_text=play.text,  # the conversation's text, as a gateway routes on it
            expected_resume=play.k + 1 < len(play.plan.turns),
            context_tokens=turn.prompt_tokens,
        )
        asked_at = self.world.now

        admitted = when_admitted(
            self.arm,
            self.replicas,
            ask,
            play.text if play.chain is None else play.chain.prompt(),
            reply_tokens=turn.completion_tokens,
            max_new_tokens=turn.completion_tokens,
            replied=lambda replica, held_s, done: self._replied(
                play, ask, asked_at, held_s, replica, done
            ),
            failed=lambda reason, why: play.ended(play, reason, why),
        )
        self.arm.request(ask, admitted, lambda why: play.ended(play, "http_404", why))

    def _replied(
        self,
        play: _Play,
        ask: Ask,
        asked_at: float,
        held_s: float,
        replica: str,
        done: FinishedRequest,
    ) -> None:
        turn = play.plan.turns[play.k]
        last = play.k == len(play.plan.turns) - 1
        self.arm.finished(
            ask,
            TurnEnd(
                paused_on_tool=not last,
                finish_reason=done.reason.value if last else "tool_calls",
                prompt_tokens=done.prompt_tokens,
                completion_tokens=done.completion_tokens,
                cached_tokens=done.cached_tokens,
            ),
        )
        record = play.record
        record.turns += 1
        ended = turn_record(
            self.world.now - asked_at,
            held_s if self.arm.holds else None,
            replica,
            done,
            tool_calls=0 if last else 1,
            planned=(turn.prompt_tokens, turn.completion_tokens),
        )
        record.turn_records.append(
            self.records.turn_ended(self.group.name, self.group.cls, self.world.now, ended)
        )
        if last:
            record.end_s = self.world.now
            record.prompt_tokens = sum(r.prompt_tokens or 0 for r in record.turn_records)
            record.cached_tokens = sum(r.cached_tokens or 0 for r in record.turn_records)
            play.ended(play, None, "")
            return
        record.tool_calls += 1
        following = play.plan.turns[play.k + 1].prompt_tokens
        if following >= turn.prompt_tokens:
            more = more_text(following - turn.prompt_tokens, f"{play.key}:{play.k + 1}")
            play.text += more
            if play.chain is not None:
                play.chain.append(more)
        else:  # compacted: a fresh conversation after the system prompt
            key = f"{play.key}@{play.k + 1}"
            play.text = first_text(play.plan, key, following)
            play.chain = None if play.chain is None else self._chain(play.plan, key, following)
        play.k += 1
        if turn.subagents:
            self._start_children(play, turn.subagents)
        else:
            record.tool_s += turn.tool_s
            self.world.after(turn.tool_s, lambda: self._turn(play))

    # ------------------------------------------------------------------ sub-agents

    def _start_children(self, play: _Play, plans: tuple[RunPlan, ...]) -> None:
        play.children_left = len(plans)
        play.child_failure = None
        play.children = []
        started = self.world.now
        for i, plan in enumerate(plans):
            key = f"{play.key}.{play.k}.{i}"

            def child_ended(child: _Play, kind: str | None, why: str) -> None:
                play.children_left -= 1
                if kind is None:
                    play.children.append(child.record)
                elif play.child_failure is None:
                    play.child_failure = (kind, f"sub-agent: {why}")
                if play.children_left:
                    return
                # The last one: the parent goes on (or fails with its first failed child).
                play.record.tool_s += self.world.now - started
                for sub in play.children:
                    play.record.turn_records.extend(sub.turn_records)
                    play.record.subagents += 1 + sub.subagents
                if play.child_failure is not None:
                    play.ended(play, *play.child_failure)
                else:
                    self._turn(play)

            self._begin(plan, key, child_ended)
