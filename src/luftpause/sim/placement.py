"""Where a gateway without admission of its own sends a turn: the placement policies of
the SGLang Model Gateway (``smg`` 1.13) and the SGLang router (0.3.2), as the simulator's
``smg`` and ``router`` arms use them.

``cache_aware`` is modelled on both gateways' source (``policies/cache_aware.rs`` and the
approximate string tree it keeps): every request's *routing text* is matched against a
radix tree of the texts sent so far, each node remembering the replica whose text first
created it.

* If the replicas' loads (requests in flight) are imbalanced, both more than
  ``balance_abs`` apart and the largest more than ``balance_rel`` times the smallest, the
  request goes to the least loaded replica.
* Otherwise, if more than ``cache_threshold`` of the text matches, it goes to the replica
  that owns the node where the match ends.
* Otherwise it goes to the least loaded replica.

Either way the text is then inserted for the chosen replica. A chat request's routing
text is its messages' text joined by spaces (the system prompt, the task, the replies and
the tool results; not tool calls' arguments), so a run's next turn extends its last and
matches it. The router places every turn this way; SMG with sticky sessions only a run's
first (system prompt and task), the rest following the pin. Runs that share a long system
prompt (coding agents) match each other by more than the threshold, and with loads never
far enough apart they all follow the replica of the first: the flood measured SMG capped
at 12 sending every request to one engine.

This is ``cache_aware`` as SMG's 1.9 source has it, and as the router 0.3.2 behaves.
SMG 1.13's source (its PyPI sdist: ``model_gateway/src/policies/cache_aware.rs``,
``least_load.rs``) differs, and none of this is modelled:

* the candidates of a hit are every replica that holds the node where the match ends,
  not only its creator;
* a candidate is skipped (a "spill gate") when its requests in flight exceed both 1.5
  times the fleet's mean and the mean plus ``min(64, max(4, ceil(2 * sqrt(mean))))``;
* a miss, and a choice among candidates, goes to the least *expected wait*: the
  engine's running and waiting requests as last read (every ``--load-monitor-interval``,
  10 s by default) at 1,024 tokens each, plus 1,024 for every request the policy sent
  there since that read, plus the gateway's own in-flight requests beyond both, over
  2,000 tokens/s, plus ``0.15 * k / (1 - k)`` s for the engine's KV usage ``k``; ties
  drawn at random;
* its warm-up diversion needs token IDs and KV events, so it never runs for HTTP text.

The stale read matters: ``tools/bench/flood.py`` measured SMG capped at 36 slots at 48
batch agents 22–27 % below this model with a read every 20–50 model seconds, and within 8 %
with one every 5 (``docs/simulator.md``). This model reads live request counts, as a
gateway polling without delay would. Nor are the tree's size-bounded eviction (these
runs stay far below its 64 M characters), or the router's hash-map order where this
model takes the creator of a node, modelled.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# Both gateways' defaults (``--cache-threshold``, ``--balance-abs-threshold``,
# ``--balance-rel-threshold``), as the flood runs them.
CACHE_THRESHOLD = 0.3
BALANCE_ABS = 64
BALANCE_REL = 1.5

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
        return at, last.owner

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


@dataclass
class LeastLoad:
    """SMG's ``least_load``: the replica with the fewest requests in flight."""

    name: str = "least_load"

    def place(self, text: str, replicas: Sequence[Loaded]) -> str:
        return _least_loaded(replicas)


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
    """``cache_aware`` (the module docstring)."""

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


Placement = LeastLoad | RoundRobin | Random | CacheAware


def smg_placement(policy: str, seed: int = 0) -> Placement:
    """SMG's ``--policy`` as modelled here (``seed``: the ``random`` policy's)."""
    if policy == "cache_aware":
        return CacheAware()
    if policy == "round_robin":
        return RoundRobin()
    if policy == "random":
        return Random(seed)
    if policy == "least_load":
        return LeastLoad()
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
