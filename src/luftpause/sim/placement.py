"""Where a gateway without admission of its own sends a turn: the placement policies of
the SGLang Model Gateway (``smg`` 1.13) and the SGLang router (0.3.2), as the simulator's
``smg`` and ``router`` arms use them.

Both gateways' ``cache_aware`` match every request's *routing text* against a radix tree
of the texts sent so far (the approximate string tree of ``policies/cache_aware.rs``);
each node remembers the replica whose text first created it and every replica whose text
passed through it. A chat request's routing text is its messages' text joined by spaces
(the system prompt, the task, the replies and the tool results; not tool calls'
arguments), so a run's next turn extends its last and matches it. The router places every
turn; SMG with sticky sessions only a run's first (system prompt and task), the rest
following the pin. Either way the text is then inserted for the chosen replica.

**The router (0.3.2)**, ``CacheAware``, judges by requests in flight, read live:

* If the replicas' loads are imbalanced, both more than ``balance_abs`` apart and the
  largest more than ``balance_rel`` times the smallest, the request goes to the least
  loaded replica.
* Otherwise, if more than ``cache_threshold`` of the text matches, it goes to the replica
  that created the node where the match ends.
* Otherwise it goes to the least loaded replica.

Runs that share a long system prompt (coding agents) match each other by more than the
threshold, and with loads never far enough apart they all follow the replica of the first.
Not modelled: the router's hash-map order where this model takes a node's creator.

**SMG 1.13**, ``SmgCacheAware``, is modelled on its source (its PyPI sdist:
``model_gateway/src/policies/cache_aware.rs``, ``least_load.rs``,
``worker/expected_wait.rs``) for HTTP workers and default flags:

* A match of more than ``cache_threshold`` of the text makes every replica that holds the
  node where the match ends a candidate. A candidate is skipped (the *spill gate*) when
  its requests in flight exceed both ``balance_rel`` times the fleet's mean and the mean
  plus ``min(balance_abs, max(4, ceil(2 * sqrt(mean))))``. The request goes to the
  candidate left with the least *expected wait*; where the gate skipped them all, to the
  replica of least expected wait among those under the gate (all, if none is).
* A miss goes to the replica of least expected wait.
* The expected wait (``ExpectedWait``) is priced from each engine's running and waiting
  requests *as last read* (SMG polls ``/metrics`` every ``--load-monitor-interval``,
  10 s by default) at 1,024 tokens each, plus 1,024 for every request the policy sent
  there since that read, plus the gateway's own requests in flight beyond both, over
  2,000 tokens/s (the fake engines report no generation rate), plus ``0.15 * k / (1 - k)``
  s for the KV usage ``k`` read then; waits within a microsecond are a tie, drawn at
  random. Before the first read, the fewest requests in flight wins. The placement's
  ``poll`` hears each read; ``SmgArm`` calls it every ``poll_s`` model seconds.
* SMG's ``least_load`` is this expected wait over every replica.

The stale read matters where SMG's cap sits near the load. At 48 batch agents with
36 slots, reading every 50 model seconds instead of every 10 cost SMG a tenth of its
batch runs in the flood and costs it a seventh in this model (``docs/benchmarks/fidelity.md``):
engines are sent runs in bursts between reads and queue them, though each still gets
half.

Not modelled in SMG: the warm-up diversion (it needs token IDs and KV events, so it never
runs for HTTP text), the KV-imbalance switch (off by default), overload vetoes (the flood
turns them off), the tree's size-bounded eviction (these runs stay far below its 64 M
characters), and the probabilistic touch of a node's timestamps (it only orders eviction).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# Both gateways' defaults (``--cache-threshold``, ``--balance-abs-threshold``,
# ``--balance-rel-threshold``), as the flood runs them.
CACHE_THRESHOLD = 0.3
BALANCE_ABS = 64
BALANCE_REL = 1.5

# SMG 1.13's expected wait (``worker/expected_wait.rs``, ``least_load.rs``): tokens a
# request is priced at when its own count is unknown (HTTP), the drain rate of an engine
# that reports none, the KV-pressure weight in seconds, and the width of a tie.
MEAN_PREFILL_TOKENS = 1024
DEFAULT_THROUGHPUT = 2000.0
KV_PRESSURE_WEIGHT = 0.15
TIE_S = 1e-6
# SMG 1.13's spill gate never takes less than this many requests above the mean as its
# absolute margin (``MIN_ABSOLUTE_MARGIN``).
MIN_ABSOLUTE_MARGIN = 4
# SMG's ``--load-monitor-interval`` default, in seconds.
SMG_LOAD_POLL_S = 10.0

# ``--smg-policy`` choices: SMG's own names for the policies modelled here (the flood
# offers the first three).
SMG_POLICIES = ("cache_aware", "round_robin", "random", "least_load")


class Loaded(Protocol):
    """A replica as a gateway sees it: its name and its requests in flight."""

    @property
    def name(self) -> str: ...

    @property
    def in_flight(self) -> int: ...


def _shared(text: str, at: int, edge: str) -> int:
    """How many characters ``text[at:]`` and ``edge`` have in common at their start."""
    n = min(len(edge), len(text) - at)
    if text.startswith(edge if n == len(edge) else edge[:n], at):
        return n
    lo, hi = 0, n  # the first lo characters match, the first hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if text.startswith(edge[:mid], at):
            lo = mid
        else:
            hi = mid
    return lo


class _Node:
    __slots__ = ("children", "owner", "tenants", "text")

    def __init__(self, text: str, owner: str | None, tenants: set[str]) -> None:
        self.text = text
        self.children: dict[str, _Node] = {}
        self.owner = owner  # the replica whose text created this node (kept across splits)
        self.tenants = tenants  # every replica whose text passed through it


class PrefixTree:
    """The gateways' approximate tree: characters of routing texts, per replica."""

    def __init__(self) -> None:
        self._root = _Node("", None, set())
        self.chars: dict[str, int] = {}  # characters in the tree per replica

    def match(self, text: str) -> tuple[int, str | None]:
        """(characters of ``text`` matched, the owner of the node where the match ends;
        None where nothing matched)."""
        at, last = self._descend(text)
        return at, last.owner

    def holders(self, text: str) -> tuple[int, frozenset[str]]:
        """(characters of ``text`` matched, every replica holding the node where the match
        ends; none where nothing matched)."""
        at, last = self._descend(text)
        return at, frozenset(last.tenants)

    def _descend(self, text: str) -> tuple[int, _Node]:
        """How far ``text`` matches and the node the match ends in (partway into it, or at
        its end; the root where nothing matched)."""
        node, at, last = self._root, 0, self._root
        while at < len(text):
            child = node.children.get(text[at])
            if child is None:
                break
            n = _shared(text, at, child.text)
            at += n
            last = child
            if n < len(child.text):
                break
            node = child
        return at, last

    def insert(self, text: str, replica: str) -> None:
        """Record ``text`` as sent to ``replica``."""
        self.chars.setdefault(replica, 0)
        node, at = self._root, 0
        while at < len(text):
            child = node.children.get(text[at])
            if child is None:
                node.children[text[at]] = _Node(text[at:], replica, {replica})
                self.chars[replica] += len(text) - at
                return
            n = _shared(text, at, child.text)
            if n < len(child.text):  # split: the upper part keeps the owner and tenants
                upper = _Node(child.text[:n], child.owner, set(child.tenants))
                child.text = child.text[n:]
                upper.children[child.text[0]] = child
                node.children[text[at]] = upper
                child = upper
            if replica not in child.tenants:
                child.tenants.add(replica)
                self.chars[replica] += len(child.text)
            at += n
            node = child


def _least_loaded(replicas: Sequence[Loaded]) -> str:
    """The replica with the fewest requests in flight, the first of equals."""
    return min(replicas, key=lambda r: r.in_flight).name


@dataclass(frozen=True)
class LoadReport:
    """What SMG reads of an engine at a poll (SGLang's ``/metrics`` gauges)."""

    running: int
    waiting: int
    kv_usage: float  # ``token_usage``: 0 (empty) to 1 (full)


class ExpectedWait:
    """SMG 1.13's expected-wait scorer (the module docstring): engines priced by their
    last report and what was sent since, the least wait chosen and credited."""

    def __init__(self, seed: int = 0) -> None:
        self.reports: dict[str, LoadReport] = {}
        self.since_poll: dict[str, int] = {}  # requests chosen here since the last report
        self._rng = random.Random(f"expected-wait:{seed}")

    def poll(self, reports: dict[str, LoadReport]) -> None:
        """A read of the engines: it replaces their reports and releases the credit of
        every request chosen before it."""
        self.reports.update(reports)
        for name in reports:
            self.since_poll[name] = 0

    def seconds(self, replica: Loaded, baseline: float) -> float:
        """``replica``'s expected wait; one without a report while others have one is
        priced at ``baseline`` (the best reporting candidate's) plus its requests in
        flight."""
        report = self.reports.get(replica.name)
        if report is None:
            return baseline + replica.in_flight * MEAN_PREFILL_TOKENS / DEFAULT_THROUGHPUT
        since = self.since_poll.get(replica.name, 0)
        # the gateway's own requests there that neither the report nor the credit count
        unaccounted = max(0, replica.in_flight - (report.running + report.waiting + since))
        tokens = (report.running + report.waiting + unaccounted + since) * MEAN_PREFILL_TOKENS
        k = min(max(report.kv_usage, 0.0), 0.999)
        return tokens / DEFAULT_THROUGHPUT + KV_PRESSURE_WEIGHT * k / (1.0 - k)

    def choose(self, candidates: Sequence[Loaded]) -> str:
        """The candidate of least expected wait (a tie drawn at random), credited with
        this request until the next report; before any report, the fewest in flight."""
        known = [c for c in candidates if c.name in self.reports]
        if known:
            baseline = min(self.seconds(c, 0.0) for c in known)
            scores = [self.seconds(c, baseline) for c in candidates]
        else:
            scores = [float(c.in_flight) for c in candidates]
        best = min(scores)
        tied = [c for c, score in zip(candidates, scores, strict=True) if score - best <= TIE_S]
        choice = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        self.since_poll[choice.name] = self.since_poll.get(choice.name, 0) + 1
        return choice.name


@dataclass
class LeastLoad:
    """SMG 1.13's ``least_load``: the replica of least expected wait."""

    seed: int = 0
    name: str = "least_load"
    scorer: ExpectedWait = field(init=False)

    def __post_init__(self) -> None:
        self.scorer = ExpectedWait(self.seed)

    def poll(self, reports: dict[str, LoadReport]) -> None:
        self.scorer.poll(reports)

    def place(self, text: str, replicas: Sequence[Loaded]) -> str:
        return self.scorer.choose(replicas)


@dataclass
class RoundRobin:
    """``round_robin``: the replicas in turn, whatever their load."""

    name: str = "round_robin"
    _next: int = 0

    def place(self, text: str, replicas: Sequence[Loaded]) -> str:
        choice = replicas[self._next % len(replicas)].name
        self._next += 1
        return choice


@dataclass
class Random:
    """``random``: any replica, each equally likely (seeded, so a run repeats)."""

    seed: int = 0
    name: str = "random"
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"placement:{self.seed}")

    def place(self, text: str, replicas: Sequence[Loaded]) -> str:
        return self._rng.choice(list(replicas)).name


@dataclass
class CacheAware:
    """The router's ``cache_aware`` (the module docstring)."""

    cache_threshold: float = CACHE_THRESHOLD
    balance_abs: int = BALANCE_ABS
    balance_rel: float = BALANCE_REL
    name: str = "cache_aware"
    tree: PrefixTree = field(default_factory=PrefixTree)

    def place(self, text: str, replicas: Sequence[Loaded]) -> str:
        loads = [r.in_flight for r in replicas]
        high, low = max(loads), min(loads)
        if high - low > self.balance_abs and high > low * self.balance_rel:
            choice = _least_loaded(replicas)
        else:
            matched, owner = self.tree.match(text)
            names = [r.name for r in replicas]
            if text and matched / len(text) > self.cache_threshold and owner in names:
                choice = owner
            else:
                choice = _least_loaded(replicas)
        self.tree.insert(text, choice)
        return choice


@dataclass
class SmgCacheAware:
    """SMG 1.13's ``cache_aware`` (the module docstring)."""

    seed: int = 0
    cache_threshold: float = CACHE_THRESHOLD
    balance_abs: int = BALANCE_ABS
    balance_rel: float = BALANCE_REL
    name: str = "cache_aware"
    tree: PrefixTree = field(default_factory=PrefixTree)
    scorer: ExpectedWait = field(init=False)

    def __post_init__(self) -> None:
        self.scorer = ExpectedWait(self.seed)

    def poll(self, reports: dict[str, LoadReport]) -> None:
        self.scorer.poll(reports)

    def over_gate(self, load: int, mean: float) -> bool:
        """The spill gate: ``load`` too far above the fleet's ``mean`` to add to."""
        swing = math.ceil(2 * math.sqrt(mean))
        margin = min(self.balance_abs, max(swing, MIN_ABSOLUTE_MARGIN))
        return load > mean * self.balance_rel and load > mean + margin

    def place(self, text: str, replicas: Sequence[Loaded]) -> str:
        mean = sum(r.in_flight for r in replicas) / len(replicas)
        matched, holders = self.tree.holders(text)
        hit = [r for r in replicas if r.name in holders]
        if not text or matched / len(text) <= self.cache_threshold or not hit:
            choice = self.scorer.choose(replicas)  # a miss
        elif safe := [r for r in hit if not self.over_gate(r.in_flight, mean)]:
            choice = self.scorer.choose(safe)
        else:  # every holder is over the gate: spill to those under it
            under = [r for r in replicas if not self.over_gate(r.in_flight, mean)]
            choice = self.scorer.choose(under or replicas)
        self.tree.insert(text, choice)
        return choice


Placement = LeastLoad | RoundRobin | Random | CacheAware | SmgCacheAware


def smg_placement(policy: str, seed: int = 0) -> Placement:
    """SMG's ``--policy`` as modelled here (``seed``: its random draws')."""
    if policy == "cache_aware":
        return SmgCacheAware(seed)
    if policy == "round_robin":
        return RoundRobin()
    if policy == "random":
        return Random(seed)
    if policy == "least_load":
        return LeastLoad(seed)
    raise ValueError(f"unknown SMG policy {policy!r}; choose from {', '.join(SMG_POLICIES)}")


def router_placement() -> Placement:
    """The SGLang router 0.3.2's default ``cache_aware``, as the flood runs it: its binary
    is of SMG's lineage (``smg::policies::cache_aware`` with ``select_worker_min_load``),
    and a fallback to the smallest tree instead (older source) would pile runs onto the
    slower replica, whose runs add text more slowly, which the flood did not show."""
    return CacheAware()


def _text(content: Any) -> str:
    """A message content's text: the string, or a parts list's text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        return " ".join(t for t in texts if isinstance(t, str) and t)
    return ""


def routing_text(messages: Sequence[dict[str, Any]]) -> str:
    """What the gateways route a chat request on: every message's text (a reply's content
    and reasoning, not its tool calls' arguments), non-empty ones joined by spaces."""
    parts: list[str] = []
    for message in messages:
        text = _text(message.get("content"))
        if message.get("role") == "assistant":
            reasoning = message.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                text = f"{text} {reasoning}".strip()
        if text:
            parts.append(text)
    return " ".join(parts)
