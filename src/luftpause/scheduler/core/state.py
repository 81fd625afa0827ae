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
* Each ``(lane, class, caller)`` has a FIFO of held turn IDs (``Fifo``). (With
  ``Params.batch_order = "attained"``, a batch turn whose run's attained service is above
  the first level waits in its caller's FIFO for that level: ``order.queue_caller``.)
* ``waiting_callers[(lane, class)]`` is the set of callers with a non-empty FIFO
  there, so the fairness pick (S5) scans callers, never turns or runs.

Derived counters (``ReplicaState.in_flight``/``reserved``, ``caller_in_flight``,
``RunState.in_flight``) are maintained incrementally; ``invariants.py`` recomputes
them from scratch for the property tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from immutables import Map

from luftpause.scheduler.core.types import (
    EMPTY_MAP,
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
    return ("free", kind._value_, model)  # _value_: .value is a slow property


@dataclass(frozen=True, slots=True, init=False)
class Fifo:
    """A persistent FIFO of turn IDs: slots ``head..tail-1`` of ``items``.

    Removal from the middle (abandon) deletes the slot; ``first`` skips holes.
    """

    head: int = 0
    tail: int = 0
    items: Map[int, str] = field(default_factory=Map)

    def __init__(self, head: int = 0, tail: int = 0, items: Map[int, str] = EMPTY_MAP) -> None:
        object.__setattr__(self, "head", head)
        object.__setattr__(self, "tail", tail)
        object.__setattr__(self, "items", items)

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


@dataclass(frozen=True, slots=True, init=False)
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
    ramping: bool = False  # S2: the cap is Params.initial_cap's ramp; no queue seen yet
    # Decode pace (Params.interactive_pace_s): batch turns in flight here, the limit on
    # them while an interactive run lives here (None: none), the smoothed seconds per
    # reply token of turns that ended here, when the limit last changed (a turn admitted
    # before that says nothing about it), and the fastest pace a reply here had with at
    # most one batch turn beside it.
    batch_in_flight: int = 0
    pace_cap: int | None = None
    pace_s: float | None = None
    pace_set_at: float | None = None
    pace_best_s: float | None = None
    # Prefix keeping: the most runs that may live here before new batch runs wait (None:
    # not limited). Never below the cap; it rises while new runs wait behind the runs
    # living here, which the cap (the engine's load) never does.
    run_limit: int | None = None
    # Working-set admission (working_set.py): the engine's KV pool in tokens (last probe;
    # None: unknown), the summed known contexts (``RunState.last_prompt``) of the runs
    # living here, and how many of those runs have one (the others have had no turn end).
    kv_tokens: int | None = None
    ws_tokens: int = 0
    ws_known: int = 0

    def __init__(
        self,
        spec: ReplicaSpec,
        healthy: bool = False,
        cap: int | None = None,
        in_flight: int = 0,
        reserved: int = 0,
        pinned_runs: int = 0,
        queued_probes: int = 0,
        running: int | None = None,
        waiting: int | None = None,
        kv_usage: float | None = None,
        probed_at: float | None = None,
        reports_cache: bool = False,
        prefix_misses: int = 0,
        missed_since_probe: bool = False,
        ramping: bool = False,
        batch_in_flight: int = 0,
        pace_cap: int | None = None,
        pace_s: float | None = None,
        pace_set_at: float | None = None,
        pace_best_s: float | None = None,
        run_limit: int | None = None,
        kv_tokens: int | None = None,
        ws_tokens: int = 0,
        ws_known: int = 0,
    ) -> None:
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "healthy", healthy)
        object.__setattr__(self, "cap", cap)
        object.__setattr__(self, "in_flight", in_flight)
        object.__setattr__(self, "reserved", reserved)
        object.__setattr__(self, "pinned_runs", pinned_runs)
        object.__setattr__(self, "queued_probes", queued_probes)
        object.__setattr__(self, "running", running)
        object.__setattr__(self, "waiting", waiting)
        object.__setattr__(self, "kv_usage", kv_usage)
        object.__setattr__(self, "probed_at", probed_at)
        object.__setattr__(self, "reports_cache", reports_cache)
        object.__setattr__(self, "prefix_misses", prefix_misses)
        object.__setattr__(self, "missed_since_probe", missed_since_probe)
        object.__setattr__(self, "ramping", ramping)
        object.__setattr__(self, "batch_in_flight", batch_in_flight)
        object.__setattr__(self, "pace_cap", pace_cap)
        object.__setattr__(self, "pace_s", pace_s)
        object.__setattr__(self, "pace_set_at", pace_set_at)
        object.__setattr__(self, "pace_best_s", pace_best_s)
        object.__setattr__(self, "run_limit", run_limit)
        object.__setattr__(self, "kv_tokens", kv_tokens)
        object.__setattr__(self, "ws_tokens", ws_tokens)
        object.__setattr__(self, "ws_known", ws_known)


@dataclass(frozen=True, slots=True, init=False)
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
    # Tool leases: the tools it is paused on ("" for a call without a name), and whether
    # the pause outlived its lease: then it no longer counts as living on its replica
    # (S3's pinned count) and holds no reservation (S4) until it comes back.
    paused_tools: tuple[str, ...] = ()
    lapsed: bool = False
    # Attained service (``Params.batch_order = "attained"``, order.py): what its finished
    # turns were served, in ``Params.attained_measure`` units; 0 while that order is off.
    attained: float = 0.0

    def __init__(
        self,
        run_id: str,
        phase: RunPhase,
        replica: str | None,
        service_class: ServiceClass,
        caller: str,
        last_active: float,
        in_flight: int = 0,
        reserved_on: str | None = None,
        ended: bool = False,
        last_prompt: int = 0,
        last_prompt_on: str | None = None,
        turns: int = 0,
        moves: int = 0,
        paused_tools: tuple[str, ...] = (),
        lapsed: bool = False,
        attained: float = 0.0,
    ) -> None:
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "phase", phase)
        object.__setattr__(self, "replica", replica)
        object.__setattr__(self, "service_class", service_class)
        object.__setattr__(self, "caller", caller)
        object.__setattr__(self, "last_active", last_active)
        object.__setattr__(self, "in_flight", in_flight)
        object.__setattr__(self, "reserved_on", reserved_on)
        object.__setattr__(self, "ended", ended)
        object.__setattr__(self, "last_prompt", last_prompt)
        object.__setattr__(self, "last_prompt_on", last_prompt_on)
        object.__setattr__(self, "turns", turns)
        object.__setattr__(self, "moves", moves)
        object.__setattr__(self, "paused_tools", paused_tools)
        object.__setattr__(self, "lapsed", lapsed)
        object.__setattr__(self, "attained", attained)


@dataclass(frozen=True, slots=True, init=False)
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
    batch_beside: int = 0  # decode pace: other batch turns in flight on its replica at admission

    def __init__(
        self,
        turn_id: str,
        run_id: str,
        replica: str,
        model: str,
        service_class: ServiceClass,
        caller: str,
        kind: EndpointKind,
        dataplane_id: str,
        admitted_at: float,
        deadline: float,
        started: bool = False,
        first_token_at: float | None = None,
        expect_cached: int = 0,
        trace_id: str = "",
        batch_beside: int = 0,
    ) -> None:
        object.__setattr__(self, "turn_id", turn_id)
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "replica", replica)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "service_class", service_class)
        object.__setattr__(self, "caller", caller)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "dataplane_id", dataplane_id)
        object.__setattr__(self, "admitted_at", admitted_at)
        object.__setattr__(self, "deadline", deadline)
        object.__setattr__(self, "started", started)
        object.__setattr__(self, "first_token_at", first_token_at)
        object.__setattr__(self, "expect_cached", expect_cached)
        object.__setattr__(self, "trace_id", trace_id)
        object.__setattr__(self, "batch_beside", batch_beside)


@dataclass(frozen=True, slots=True, init=False)
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
    # Attained service (order.py): its run's service level when it was held; a turn above
    # level 0 waits in a FIFO of its own per level (``order.queue_caller``). 0 while off.
    tier: int = 0

    def __init__(
        self,
        turn_id: str,
        run_id: str,
        model: str,
        service_class: ServiceClass,
        caller: str,
        kind: EndpointKind,
        dataplane_id: str,
        requested_at: float,
        seq: int,
        lane: Lane,
        slot: int,
        trace_id: str = "",
        tier: int = 0,
    ) -> None:
        object.__setattr__(self, "turn_id", turn_id)
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "service_class", service_class)
        object.__setattr__(self, "caller", caller)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "dataplane_id", dataplane_id)
        object.__setattr__(self, "requested_at", requested_at)
        object.__setattr__(self, "seq", seq)
        object.__setattr__(self, "lane", lane)
        object.__setattr__(self, "slot", slot)
        object.__setattr__(self, "trace_id", trace_id)
        object.__setattr__(self, "tier", tier)


@dataclass(frozen=True, slots=True, init=False)
class ToolTime:
    """How long a tool keeps its runs away: the smoothed duration of the pauses runs
    came back from and their smoothed deviation (as a TCP round-trip estimate)."""

    mean_s: float
    dev_s: float
    samples: int

    def __init__(self, mean_s: float, dev_s: float, samples: int) -> None:
        object.__setattr__(self, "mean_s", mean_s)
        object.__setattr__(self, "dev_s", dev_s)
        object.__setattr__(self, "samples", samples)


@dataclass(frozen=True, slots=True, init=False)
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
    tool_times: Map[str, ToolTime] = field(default_factory=Map)  # tool name -> estimate
    # Token fairness (``Params.fairness = "tokens"``, order.py): each caller's virtual
    # token counter and its held generative turns, kept only while the caller has a
    # generative turn held or in flight (both empty while that order is off).
    vtc: Map[str, float] = field(default_factory=Map)
    caller_held: Map[str, int] = field(default_factory=Map)
    # Membership (ReplicaJoined / ReplicaDraining / ReplicaLeft): replicas being drained ->
    # when the runs living there must move (from then the replica counts as unhealthy),
    # and replicas that left (no longer in ``serving``; their record goes once nothing
    # in flight, pinned or reserved refers to it).
    draining: Map[str, float] = field(default_factory=Map)
    left: Map[str, None] = field(default_factory=Map)
    # Sub-callers (order.py "Callers and sub-callers"): per account ``a``, the generative
    # turns in flight of its sub-callers ``a/x`` (its own are in ``caller_in_flight[a]``).
    sub_in_flight: Map[str, int] = field(default_factory=Map)

    def __init__(
        self,
        params: Params,
        now: float,
        seq: int,
        replicas: Map[str, ReplicaState],
        serving: Map[tuple[EndpointKind, str], tuple[str, ...]],
        runs: Map[str, RunState],
        turns: Map[str, TurnState],
        held: Map[str, HeldTurn],
        held_by_run: Map[str, Map[str, None]],
        unhealthy: Map[str, None],
        queues: Map[QueueKey, Fifo],
        waiting_callers: Map[tuple[Lane, ServiceClass], Map[str, None]],
        caller_in_flight: Map[str, int],
        turn_deadlines: Map[int, Map[str, None]],
        run_deadlines: Map[int, Map[str, None]],
        swept_until: int,
        lost_dataplanes: Map[str, float] = EMPTY_MAP,
        tool_times: Map[str, ToolTime] = EMPTY_MAP,
        vtc: Map[str, float] = EMPTY_MAP,
        caller_held: Map[str, int] = EMPTY_MAP,
        draining: Map[str, float] = EMPTY_MAP,
        left: Map[str, None] = EMPTY_MAP,
        sub_in_flight: Map[str, int] = EMPTY_MAP,
    ) -> None:
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "now", now)
        object.__setattr__(self, "seq", seq)
        object.__setattr__(self, "replicas", replicas)
        object.__setattr__(self, "serving", serving)
        object.__setattr__(self, "runs", runs)
        object.__setattr__(self, "turns", turns)
        object.__setattr__(self, "held", held)
        object.__setattr__(self, "held_by_run", held_by_run)
        object.__setattr__(self, "unhealthy", unhealthy)
        object.__setattr__(self, "queues", queues)
        object.__setattr__(self, "waiting_callers", waiting_callers)
        object.__setattr__(self, "caller_in_flight", caller_in_flight)
        object.__setattr__(self, "turn_deadlines", turn_deadlines)
        object.__setattr__(self, "run_deadlines", run_deadlines)
        object.__setattr__(self, "swept_until", swept_until)
        object.__setattr__(self, "lost_dataplanes", lost_dataplanes)
        object.__setattr__(self, "tool_times", tool_times)
        object.__setattr__(self, "vtc", vtc)
        object.__setattr__(self, "caller_held", caller_held)
        object.__setattr__(self, "draining", draining)
        object.__setattr__(self, "left", left)
        object.__setattr__(self, "sub_in_flight", sub_in_flight)


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
        replicas=Map(
            {
                s.name: ReplicaState(
                    spec=s,
                    cap=params.initial_cap,
                    ramping=params.initial_cap is not None,
                    run_limit=params.initial_cap,
                )
                for s in replicas
            }
        ),
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
        lost_dataplanes=Map(),
        tool_times=Map(),
        vtc=Map(),
        caller_held=Map(),
        draining=Map(),
        left=Map(),
        sub_in_flight=Map(),
    )


# ----------------------------------------------------------- fast construction
#
# ``decide`` builds a few of these records on every event (the new State, a turn, a
# run, a replica's counters). A frozen dataclass's generated ``__init__`` stores each
# field through ``object.__setattr__``, a slow call per field: a quarter or more of
# an event's cost went there. The ``new_*`` functions below build the same objects
# about 3x faster: they fill a *draft*, a plain class with exactly the record's slots
# (so the same memory layout), with ordinary attribute stores, then make it an
# instance of the frozen class by assigning ``__class__`` (allowed between classes of
# the same layout). The draft never leaves the function; what it returns is a normal,
# frozen instance, equal to the one the dataclass constructor would build from the
# same arguments (tests/unit/test_core_records.py checks each, field by field).
# Each takes every field, in the dataclass's field order.
#
# Compiled by mypyc (docs/development "The compiled core") the records are native
# classes: no ``__slots__``, no ``__class__`` assignment, and their ``__init__`` is
# already direct stores. There each ``new_*`` calls the constructor (``COMPILED``).


COMPILED: bool = "__slots__" not in vars(State)
"""True when this module runs compiled by mypyc (its records are native classes)."""


def _draft(cls: type) -> type:
    """A mutable class with the slots of the frozen dataclass ``cls`` (none compiled)."""
    return type(f"_{cls.__name__}Draft", (), {"__slots__": cls.__dict__.get("__slots__", ())})


_new = object.__new__
_StateDraft = _draft(State)
_ReplicaDraft = _draft(ReplicaState)
_RunDraft = _draft(RunState)
_TurnDraft = _draft(TurnState)
_HeldDraft = _draft(HeldTurn)


def new_state(
    params: Params,
    now: float,
    seq: int,
    replicas: Map[str, ReplicaState],
    serving: Map[tuple[EndpointKind, str], tuple[str, ...]],
    runs: Map[str, RunState],
    turns: Map[str, TurnState],
    held: Map[str, HeldTurn],
    held_by_run: Map[str, Map[str, None]],
    unhealthy: Map[str, None],
    queues: Map[QueueKey, Fifo],
    waiting_callers: Map[tuple[Lane, ServiceClass], Map[str, None]],
    caller_in_flight: Map[str, int],
    turn_deadlines: Map[int, Map[str, None]],
    run_deadlines: Map[int, Map[str, None]],
    swept_until: int,
    lost_dataplanes: Map[str, float],
    tool_times: Map[str, ToolTime],
    vtc: Map[str, float],
    caller_held: Map[str, int],
    draining: Map[str, float],
    left: Map[str, None],
    sub_in_flight: Map[str, int],
) -> State:
    if COMPILED:
        return State(
            params,
            now,
            seq,
            replicas,
            serving,
            runs,
            turns,
            held,
            held_by_run,
            unhealthy,
            queues,
            waiting_callers,
            caller_in_flight,
            turn_deadlines,
            run_deadlines,
            swept_until,
            lost_dataplanes,
            tool_times,
            vtc,
            caller_held,
            draining,
            left,
            sub_in_flight,
        )
    s: Any = _new(_StateDraft)
    s.params = params
    s.now = now
    s.seq = seq
    s.replicas = replicas
    s.serving = serving
    s.runs = runs
    s.turns = turns
    s.held = held
    s.held_by_run = held_by_run
    s.unhealthy = unhealthy
    s.queues = queues
    s.waiting_callers = waiting_callers
    s.caller_in_flight = caller_in_flight
    s.turn_deadlines = turn_deadlines
    s.run_deadlines = run_deadlines
    s.swept_until = swept_until
    s.lost_dataplanes = lost_dataplanes
    s.tool_times = tool_times
    s.vtc = vtc
    s.caller_held = caller_held
    s.draining = draining
    s.left = left
    s.sub_in_flight = sub_in_flight
    s.__class__ = State
    return s  # type: ignore[no-any-return]


def new_replica(
    spec: ReplicaSpec,
    healthy: bool,
    cap: int | None,
    in_flight: int,
    reserved: int,
    pinned_runs: int,
    queued_probes: int,
    running: int | None,
    waiting: int | None,
    kv_usage: float | None,
    probed_at: float | None,
    reports_cache: bool,
    prefix_misses: int,
    missed_since_probe: bool,
    ramping: bool,
    batch_in_flight: int,
    pace_cap: int | None,
    pace_s: float | None,
    pace_set_at: float | None,
    pace_best_s: float | None,
    run_limit: int | None,
    kv_tokens: int | None,
    ws_tokens: int,
    ws_known: int,
) -> ReplicaState:
    if COMPILED:
        return ReplicaState(
            spec,
            healthy,
            cap,
            in_flight,
            reserved,
            pinned_runs,
            queued_probes,
            running,
            waiting,
            kv_usage,
            probed_at,
            reports_cache,
            prefix_misses,
            missed_since_probe,
            ramping,
            batch_in_flight,
            pace_cap,
            pace_s,
            pace_set_at,
            pace_best_s,
            run_limit,
            kv_tokens,
            ws_tokens,
            ws_known,
        )
    r: Any = _new(_ReplicaDraft)
    r.spec = spec
    r.healthy = healthy
    r.cap = cap
    r.in_flight = in_flight
    r.reserved = reserved
    r.pinned_runs = pinned_runs
    r.queued_probes = queued_probes
    r.running = running
    r.waiting = waiting
    r.kv_usage = kv_usage
    r.probed_at = probed_at
    r.reports_cache = reports_cache
    r.prefix_misses = prefix_misses
    r.missed_since_probe = missed_since_probe
    r.ramping = ramping
    r.batch_in_flight = batch_in_flight
    r.pace_cap = pace_cap
    r.pace_s = pace_s
    r.pace_set_at = pace_set_at
    r.pace_best_s = pace_best_s
    r.run_limit = run_limit
    r.kv_tokens = kv_tokens
    r.ws_tokens = ws_tokens
    r.ws_known = ws_known
    r.__class__ = ReplicaState
    return r  # type: ignore[no-any-return]


def new_run(
    run_id: str,
    phase: RunPhase,
    replica: str | None,
    service_class: ServiceClass,
    caller: str,
    last_active: float,
    in_flight: int,
    reserved_on: str | None,
    ended: bool,
    last_prompt: int,
    last_prompt_on: str | None,
    turns: int,
    moves: int,
    paused_tools: tuple[str, ...],
    lapsed: bool,
    attained: float,
) -> RunState:
    if COMPILED:
        return RunState(
            run_id,
            phase,
            replica,
            service_class,
            caller,
            last_active,
            in_flight,
            reserved_on,
            ended,
            last_prompt,
            last_prompt_on,
            turns,
            moves,
            paused_tools,
            lapsed,
            attained,
        )
    r: Any = _new(_RunDraft)
    r.run_id = run_id
    r.phase = phase
    r.replica = replica
    r.service_class = service_class
    r.caller = caller
    r.last_active = last_active
    r.in_flight = in_flight
    r.reserved_on = reserved_on
    r.ended = ended
    r.last_prompt = last_prompt
    r.last_prompt_on = last_prompt_on
    r.turns = turns
    r.moves = moves
    r.paused_tools = paused_tools
    r.lapsed = lapsed
    r.attained = attained
    r.__class__ = RunState
    return r  # type: ignore[no-any-return]


def new_turn(
    turn_id: str,
    run_id: str,
    replica: str,
    model: str,
    service_class: ServiceClass,
    caller: str,
    kind: EndpointKind,
    dataplane_id: str,
    admitted_at: float,
    deadline: float,
    started: bool,
    first_token_at: float | None,
    expect_cached: int,
    trace_id: str,
    batch_beside: int,
) -> TurnState:
    if COMPILED:
        return TurnState(
            turn_id,
            run_id,
            replica,
            model,
            service_class,
            caller,
            kind,
            dataplane_id,
            admitted_at,
            deadline,
            started,
            first_token_at,
            expect_cached,
            trace_id,
            batch_beside,
        )
    t: Any = _new(_TurnDraft)
    t.turn_id = turn_id
    t.run_id = run_id
    t.replica = replica
    t.model = model
    t.service_class = service_class
    t.caller = caller
    t.kind = kind
    t.dataplane_id = dataplane_id
    t.admitted_at = admitted_at
    t.deadline = deadline
    t.started = started
    t.first_token_at = first_token_at
    t.expect_cached = expect_cached
    t.trace_id = trace_id
    t.batch_beside = batch_beside
    t.__class__ = TurnState
    return t  # type: ignore[no-any-return]


def new_held(
    turn_id: str,
    run_id: str,
    model: str,
    service_class: ServiceClass,
    caller: str,
    kind: EndpointKind,
    dataplane_id: str,
    requested_at: float,
    seq: int,
    lane: Lane,
    slot: int,
    trace_id: str,
    tier: int,
) -> HeldTurn:
    if COMPILED:
        return HeldTurn(
            turn_id,
            run_id,
            model,
            service_class,
            caller,
            kind,
            dataplane_id,
            requested_at,
            seq,
            lane,
            slot,
            trace_id,
            tier,
        )
    h: Any = _new(_HeldDraft)
    h.turn_id = turn_id
    h.run_id = run_id
    h.model = model
    h.service_class = service_class
    h.caller = caller
    h.kind = kind
    h.dataplane_id = dataplane_id
    h.requested_at = requested_at
    h.seq = seq
    h.lane = lane
    h.slot = slot
    h.trace_id = trace_id
    h.tier = tier
    h.__class__ = HeldTurn
    return h  # type: ignore[no-any-return]
