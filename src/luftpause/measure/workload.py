"""Agent runs shaped like real traces (B10): a run as a plan of turns, and profiles that sample one.

A :class:`RunPlan` says, turn by turn, how long the prompt is, how long the reply is
and how long the tool after it takes (or which sub-agents it starts in parallel). It
comes from a *profile* (:data:`PROFILES`, sampled per run from a seeded generator) or
from a user's trace (``measure.trace``). The load generator (``loadgen.shaped``) and
the simulator (``sim.shaped``) both play plans; neither samples anything else.

A plan's prompts grow the way an agent's conversation grows: each turn's prompt is
the previous prompt, the previous reply and the tool's result, so everything but the
new tail is a prefix the engine may still hold. A profile run whose next prompt would
outgrow the profile's context cap *compacts*: its next prompt is its first prompt plus
a summary (everything after the shared system prompt is new to the engine).

Every parameter of :data:`CODING_AGENT` and its source is in docs/guides/workloads.md.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field
from statistics import NormalDist

from luftpause.fakes.engine.script import NOT_IN_A_PLAN_KEY, PLAN_KEY_MAX_CHARS

_NORMAL = NormalDist()


@dataclass(frozen=True)
class LogNormal:
    """A log-normal with this median and spread (σ of the log), truncated to ``lo..hi``.

    Truncation rescales the quantile into the kept range (no mass piles up at a bound).
    """

    median: float
    sigma: float
    lo: float
    hi: float

    def __post_init__(self) -> None:
        if not (self.median > 0 and self.sigma >= 0 and 0 < self.lo <= self.hi):
            raise ValueError(f"bad log-normal {self}")

    def _z(self, x: float) -> float:
        return math.log(x / self.median) / self.sigma if self.sigma > 0 else 0.0

    def quantile(self, p: float) -> float:
        """The value below which a share ``p`` of (truncated) samples fall."""
        if self.sigma == 0:
            return min(self.hi, max(self.lo, self.median))
        a, b = _NORMAL.cdf(self._z(self.lo)), _NORMAL.cdf(self._z(self.hi))
        u = min(max(a + p * (b - a), 1e-12), 1 - 1e-12)
        return min(self.hi, max(self.lo, self.median * math.exp(self.sigma * _NORMAL.inv_cdf(u))))

    def sample(self, rng: random.Random) -> float:
        return self.quantile(rng.random())


@dataclass(frozen=True)
class Mixture:
    """``weight`` of samples from ``first``, the rest from ``second``."""

    weight: float
    first: LogNormal
    second: LogNormal

    def sample(self, rng: random.Random) -> float:
        part = self.first if rng.random() < self.weight else self.second
        return part.sample(rng)


@dataclass(frozen=True)
class TurnPlan:
    """One model turn: the prompt it sends, the reply it gets, what follows it."""

    prompt_tokens: int
    completion_tokens: int
    tool_s: float = 0.0  # the tool after this turn (ignored on a run's last turn)
    subagents: tuple[RunPlan, ...] = ()  # started in parallel instead of a tool; all awaited


@dataclass(frozen=True)
class RunPlan:
    """A run: its turns, and the shared system prompt its first prompt starts with.

    Runs whose ``prefix`` names match share their first ``min(shared_tokens)`` tokens
    (the same system prompt and tool definitions); the rest of every prompt is the
    run's own.
    """

    turns: tuple[TurnPlan, ...]
    shared_tokens: int = 0
    prefix: str = "run"

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError("a run needs at least one turn")

    @property
    def subagent_count(self) -> int:
        return sum(len(t.subagents) for t in self.turns)

    def max_context(self) -> int:
        """The most tokens one of its turns (or a sub-agent's) needs: prompt + reply."""
        own = max(t.prompt_tokens + t.completion_tokens for t in self.turns)
        subs = [s.max_context() for t in self.turns for s in t.subagents]
        return max([own, *subs])


@dataclass(frozen=True)
class Profile:
    """The shape of a run, sampled per run. See docs/guides/workloads.md for every value."""

    name: str
    turns: LogNormal  # model turns per run (rounded)
    shared_tokens: int  # system prompt + tool definitions, the same in every run
    task_tokens: LogNormal  # the run's own first message
    completion_tokens: LogNormal  # reply per turn
    result_tokens: LogNormal  # each tool result appended to the conversation
    tool_s: Mixture  # the tool's time between a turn and the next
    context_cap: int  # a run whose next prompt would be longer compacts
    summary_tokens: LogNormal  # what a compaction keeps, after the first prompt
    fanout_p: float = 0.0  # chance that a tool step starts sub-agents instead
    fanout_n: tuple[int, int] = (2, 4)  # how many, uniform
    subagent: Profile | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.fanout_p <= 1.0:
            raise ValueError("fanout_p must be within 0..1")
        if self.fanout_p and self.subagent is None:
            raise ValueError("fan-out needs a sub-agent profile")
        lo, hi = self.fanout_n
        if not 1 <= lo <= hi:
            raise ValueError("fanout_n must be 1 <= lo <= hi")

    def max_context(self) -> int:
        """An upper bound on prompt + reply of any turn (the engine's context must hold it)."""
        first = self.shared_tokens + math.ceil(self.task_tokens.hi)
        own = max(self.context_cap, first) + math.ceil(self.completion_tokens.hi)
        return max(own, self.subagent.max_context()) if self.subagent is not None else own

    def sample(self, rng: random.Random) -> RunPlan:
        """One run. Draws only from ``rng``, so a seeded generator gives the same run."""
        n = max(1, round(self.turns.sample(rng)))
        first = self.shared_tokens + max(1, round(self.task_tokens.sample(rng)))
        prompt = first
        turns: list[TurnPlan] = []
        for k in range(n):
            completion = max(1, round(self.completion_tokens.sample(rng)))
            if k == n - 1:
                turns.append(TurnPlan(prompt, completion))
                break
            subagents: tuple[RunPlan, ...] = ()
            tool_s = 0.0
            if self.subagent is not None and rng.random() < self.fanout_p:
                count = rng.randint(*self.fanout_n)
                subagents = tuple(self.subagent.sample(rng) for _ in range(count))
            else:
                tool_s = self.tool_s.sample(rng)
            turns.append(TurnPlan(prompt, completion, round(tool_s, 3), subagents))
            result = max(1, round(self.result_tokens.sample(rng)))
            prompt = prompt + completion + result
            if prompt > self.context_cap:  # compaction: first prompt + a summary (≤ the cap)
                summary = max(1, round(self.summary_tokens.sample(rng)))
                prompt = max(first, min(self.context_cap, first + summary))
        return RunPlan(tuple(turns), self.shared_tokens, self.name)


# --------------------------------------------------------------- the profiles

# Tool time (seconds): most calls are quick file operations, a minority run commands
# (builds, tests) with a long tail. Fitted to TraceLab's per-call tool latency
# (p50 0.3 s, p90 13.6 s, p99 216 s), cut at 10 minutes.
TOOL_S = Mixture(
    weight=0.65,
    first=LogNormal(median=0.15, sigma=1.2, lo=0.01, hi=600.0),
    second=LogNormal(median=5.0, sigma=2.0, lo=0.01, hi=600.0),
)
COMPLETION_TOKENS = LogNormal(median=200, sigma=1.1, lo=4, hi=8192)
RESULT_TOKENS = LogNormal(median=500, sigma=1.4, lo=4, hi=32_768)
CONTEXT_CAP = 120_000
SUMMARY_TOKENS = LogNormal(median=2000, sigma=0.5, lo=200, hi=16_000)

CODING_SUBAGENT = Profile(
    name="coding-agent/sub",
    turns=LogNormal(median=8, sigma=0.6, lo=2, hi=60),
    shared_tokens=12_000,
    task_tokens=LogNormal(median=1000, sigma=0.6, lo=100, hi=8000),
    completion_tokens=COMPLETION_TOKENS,
    result_tokens=RESULT_TOKENS,
    tool_s=TOOL_S,
    context_cap=CONTEXT_CAP,
    summary_tokens=SUMMARY_TOKENS,
)

CODING_AGENT = Profile(
    name="coding-agent",
    turns=LogNormal(median=30, sigma=0.7, lo=2, hi=250),
    shared_tokens=21_000,
    task_tokens=LogNormal(median=4000, sigma=0.8, lo=200, hi=40_000),
    completion_tokens=COMPLETION_TOKENS,
    result_tokens=RESULT_TOKENS,
    tool_s=TOOL_S,
    context_cap=CONTEXT_CAP,
    summary_tokens=SUMMARY_TOKENS,
    fanout_p=0.02,
    fanout_n=(2, 4),
    subagent=CODING_SUBAGENT,
)

PROFILES: dict[str, Profile] = {CODING_AGENT.name: CODING_AGENT}


def run_rng(seed: object, *parts: object) -> random.Random:
    """The generator of one run: a function of the seed and the run's place in the load."""
    return random.Random(":".join(str(p) for p in (seed, *parts)))


def plan_key(plan_seed: str, group: str, slot: int, number: int) -> str:
    """The fake engine's plan key of run ``number`` (from 0) of slot ``slot`` of group
    ``group`` (written into the run's task: ``fakes.engine.script.plan_marker``): what the
    engine draws that run's replies from,
    so that loads with one plan seed get the same replies, run for run, whatever their
    prompt text, and ``luftpause sim --plan-seed`` plays them too. Spaces and ``]`` (which
    the marker cannot carry) become ``_``; a key longer than the marker holds keeps its
    first 200 characters and a hash of the whole."""
    key = NOT_IN_A_PLAN_KEY.sub("_", f"{plan_seed}-{group}-{slot}-{number}")
    if len(key) > PLAN_KEY_MAX_CHARS:
        key = f"{key[:200]}~{hashlib.blake2b(key.encode(), digest_size=8).hexdigest()}"
    return key
