"""The scheduler's state: frozen records in persistent maps.

Why persistent maps (``immutables.Map``, a hash array mapped trie, the same
structure CPython uses for ``contextvars``): every event must yield a new state
while the old one stays valid (replay, property tests, the host's status view
reading a snapshot), and the per-event cost must not grow with the number of
runs. A HAMT update is O(log32 n) and shares all untouched nodes, so an event
touching three runs costs the same with 1k or 100k runs. ``pyrsistent``'s
``pmap`` offers the same semantics but is implemented in Python on top of a
vector and measured several times slower per update; ``immutables`` is a small C
extension with typed stubs, maintained by the asyncpg/uvloop authors.

Layout of the held-turn index (what makes picking the next turn cheap):

* A *lane* is where a held turn may go: ``("pin", replica)`` for a turn whose run
  is generating or paused on a tool on that replica (S3), or
  ``("free", kind, model)`` for any replica of that kind serving that model.
  Turns stay in their pin lane while the replica is unhealthy; other replicas then
  draw from that lane too (the run may move), and the moment it is healthy again
  the turns are its alone. A run's held turns follow it between lanes when it is
  admitted somewhere (pinned there) or goes idle (free): ``held_by_run`` finds them.
* Each ``(lane, class, caller)`` has a FIFO of held turn IDs (``Fifo``).
* ``waiting_callers[(lane, class)]`` is the set of callers with a non-empty FIFO
  there, so the fairness pick (S5) scans callers, never turns or runs.

Derived counters (``ReplicaState.in_flight``/``reserved``, ``caller_in_flight``,
``RunState.in_flight``) are maintained incrementally; ``invariants.py`` recomputes
them from scratch for the property tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from immutables import Map

from luftpause.scheduler.core.types import (
    EndpointKind,
    Params,
    ReplicaSpec,
    RunPhase,
    ServiceClass,
)

Lane = tuple[str, ...]  # ("pin", replica) | ("free", kind.value, model)
QueueKey = tuple[Lane, ServiceClass, str]  # lane, class, caller


def pin_lane(replica: str) -> Lane:
    return ("pin", replica)


def free_lane(kind: EndpointKind, model: str) -> Lane:
    return ("free", kind.value, model)


@dataclass(frozen=True, slots=True)
class Fifo:
    """A persistent FIFO of turn IDs: slots ``head..tail-1`` of ``items``.

    Removal from the middle (abandon) deletes the slot; ``first`` skips holes.
    """

    head: int = 0
    tail: int = 0
    items: Map[int, str] = field(default_factory=Map)

    def push(self, turn_id: str) -> tuple[Fifo, int]:
        return Fifo(self.head, self.tail + 1, self.items.set(self.tail, turn_id)), self.tail

    def first(self) -> tuple[Fifo, int, str] | None:
        """The oldest turn, with the FIFO advanced past any holes before it."""
        head, items = self.head, self.items
        while head < self.tail:
            turn_id = items.get(head)
            if turn_id is not None:
                fifo = self if head == self.head else Fifo(head, self.tail, items)
                return fifo, head, turn_id
            head += 1
        return None

    def remove(self, slot: int) -> Fifo:
        return Fifo(self.head, self.tail, self.items.delete(slot))

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True, slots=True)
class ReplicaState:
    spec: ReplicaSpec
    healthy: bool = False  # unknown until the first probe
    cap: int | None = None  # S2: None = not limited
    in_flight: int = 0  # admitted turns not yet ended
    reserved: int = 0  # S4: interactive runs paused on a tool here
    pinned_runs: int = 0  # S3: runs generating or paused on a tool here (placement load)
    queued_probes: int = 0  # S2: consecutive probes that saw a queue
    running: int | None = None  # last probe
    waiting: int | None = None
    kv_usage: float | None = None
    probed_at: float | None = None
    reports_cache: bool = False  # a turn here has reported cached prompt tokens
    prefix_misses: int = 0  # continuing turns that found their prefix evicted (cumulative)
    missed_since_probe: bool = False  # one did since the last probe: the cap may not rise


@dataclass(frozen=True, slots=True)
class RunState:
    run_id: str
    phase: RunPhase
    replica: str | None  # the replica of its last admitted turn (holds its prefix)
    service_class: ServiceClass
    caller: str
    last_active: float
    in_flight: int = 0  # admitted turns of this run not yet ended
    reserved_on: str | None = None  # replica holding a slot for it (S4)
    ended: bool = False  # RunEnded arrived while turns were in flight: forget it after them
    # Prefix keeping: the prompt tokens of its last finished turn and where it ran -
    # what its next turn there should find cached.
    last_prompt: int = 0
    last_prompt_on: str | None = None
    turns: int = 0  # turns admitted
    moves: int = 0  # of those, admitted to another replica than the run's previous turn


@dataclass(frozen=True, slots=True)
class TurnState:
    """An admitted turn."""

    turn_id: str
    run_id: str
    replica: str
    model: str
    service_class: ServiceClass
    caller: str
    kind: EndpointKind
    dataplane_id: str
    admitted_at: float
    deadline: float
    started: bool = False
    first_token_at: float | None = None
    # Prefix keeping: back from a tool, the prompt tokens it should find cached here
    # (its run's previous prompt on this replica when it was admitted); 0 = not judged.
    expect_cached: int = 0
    trace_id: str = ""  # the turn's trace (X1), from its request


@dataclass(frozen=True, slots=True)
class HeldTurn:
    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    kind: EndpointKind
    dataplane_id: str
    requested_at: float
    seq: int  # global arrival order: the fairness tie-break (S5)
    lane: Lane
    slot: int  # position in its FIFO
    trace_id: str = ""  # the turn's trace (X1): a long wait in the status leads to it


@dataclass(frozen=True, slots=True)
class State:
    params: Params
    now: float
    seq: int
    replicas: Map[str, ReplicaState]
    serving: Map[tuple[EndpointKind, str], tuple[str, ...]]  # (kind, model) -> replica names
    runs: Map[str, RunState]
    turns: Map[str, TurnState]
    held: Map[str, HeldTurn]
    held_by_run: Map[str, Map[str, None]]  # run -> its held turn IDs (lane moves, expiry)
    unhealthy: Map[str, None]  # generative replicas whose pin lanes others may draw from
    queues: Map[QueueKey, Fifo]
    waiting_callers: Map[tuple[Lane, ServiceClass], Map[str, None]]
    caller_in_flight: Map[str, int]
    turn_deadlines: Map[int, Map[str, None]]  # whole second -> admitted turn IDs due then
    run_deadlines: Map[int, Map[str, None]]  # whole second -> run IDs that may expire then
    swept_until: int  # deadline buckets up to this second have been processed
    # S11: dataplanes whose report stream ended -> when their admitted turns are released
    lost_dataplanes: Map[str, float] = field(default_factory=Map)


def initial_state(replicas: tuple[ReplicaSpec, ...], params: Params, now: float = 0.0) -> State:
    """The state before any event: every replica unhealthy until its first probe."""
    serving: dict[tuple[EndpointKind, str], list[str]] = {}
    for spec in sorted(replicas, key=lambda s: s.name):
        for model in sorted(spec.models):
            serving.setdefault((spec.kind, model), []).append(spec.name)
    return State(
        params=params,
        now=now,
        seq=0,
        replicas=Map({s.name: ReplicaState(spec=s) for s in replicas}),
        serving=Map({k: tuple(v) for k, v in serving.items()}),
        runs=Map(),
        turns=Map(),
        held=Map(),
        held_by_run=Map(),
        unhealthy=Map({s.name: None for s in replicas if s.kind is EndpointKind.GENERATIVE}),
        queues=Map(),
        waiting_callers=Map(),
        caller_in_flight=Map(),
        turn_deadlines=Map(),
        run_deadlines=Map(),
        swept_until=int(now) - 1,
    )
