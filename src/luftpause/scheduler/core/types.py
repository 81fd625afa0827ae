"""Small value types shared by the core's events, actions and state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from immutables import Map

# The records below are frozen dataclasses with a hand-written ``__init__`` (``init=False``)
# that stores each field with ``object.__setattr__``, as the generated one does. mypyc
# (the compiled core, docs/development) turns those calls into direct stores in the native
# class; the generated ``__init__`` would stay interpreted there and make the compiled core
# slower than the pure one. A field's default is the ``__init__`` parameter's default;
# ``EMPTY_MAP`` stands for ``field(default_factory=Map)`` (a Map is immutable: one empty
# Map serves every record). tests/unit/test_core_records.py checks that every record's
# ``__init__`` takes its fields in order with their defaults, and stays frozen.
EMPTY_MAP: Map[Any, Any] = Map()


class ServiceClass(Enum):
    """S4. Held turns of interactive runs go before batch."""

    BATCH = "batch"
    INTERACTIVE = "interactive"


class EndpointKind(Enum):
    """S13. Single-pass replicas never take or wait for a generative slot."""

    GENERATIVE = "generative"
    SINGLE_PASS = "single_pass"


class RunPhase(Enum):
    """Where a run is between turns (S3): only idle runs may move replica."""

    IDLE = "idle"
    GENERATING = "generating"
    PAUSED_ON_TOOL = "paused_on_tool"


class WorkingSet(Enum):
    """Working-set admission (``working_set.py``): how a new batch run's start on a
    replica is gated. ``OFF``: by prefix keeping's run limit alone; ``REPLACE``: by the
    working set instead of the run limit; ``BOTH``: by both."""

    OFF = "off"
    REPLACE = "replace"
    BOTH = "both"


class RejectCode(Enum):
    UNKNOWN_MODEL = "unknown_model"
    INVALID_REQUEST = "invalid_request"


class DropReason(Enum):
    """Why an admitted turn was dropped without a report (doubles as a metric label)."""

    EXPIRED = "expired"  # S10: never reported finished within the turn timeout
    RELEASED = "released"  # its dataplane resynced without it


@dataclass(frozen=True, slots=True, init=False)
class ReplicaSpec:
    """A configured endpoint as the core sees it: a name, a kind, the models it serves.

    ``orders_classes``: the engine orders its own waiting queue by class (the
    dataplane sends each turn a ``priority`` from the endpoint's
    ``class_priority``), so an interactive turn there waits only behind other
    interactive turns and is never held for the cap (S4).
    """

    name: str
    kind: EndpointKind
    models: frozenset[str]
    orders_classes: bool = False

    def __init__(
        self, name: str, kind: EndpointKind, models: frozenset[str], orders_classes: bool = False
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "orders_classes", orders_classes)


@dataclass(frozen=True, slots=True, init=False)
class CallerPolicy:
    """A configured caller's place in the held-turn order (B13, ``order.py``): its
    ``weight`` (its share under contention; its sub-callers share it) and the most of its
    turns in flight at once (``max_in_flight``; None: no limit). More are held, not
    refused."""

    weight: float = 1.0
    max_in_flight: int | None = None

    def __init__(self, weight: float = 1.0, max_in_flight: int | None = None) -> None:
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "max_in_flight", max_in_flight)


@dataclass(frozen=True, slots=True, init=False)
class Params:
    """Policy constants (SPEC constants table); all times in seconds."""

    turn_timeout_s: float = 600.0  # S10
    # S11: how long the admitted turns of a dataplane whose report stream ended stay
    # counted while it does not reconnect; then they are released (it died, or came back
    # under another ID). A dataplane that reconnects later re-adopts them by resync.
    dataplane_grace_s: float = 15.0
    run_idle_expiry_s: float = 1800.0  # S10
    cap_raise_step: int = 1  # S2: slots added per quiet probe while running at the cap
    # S2, a flood from idle: before a replica's engine has first queued, it takes at most
    # this many turns (batch only, where the engine orders its queue by class), and the
    # limit doubles on each quiet probe that finds the engine running all of them. The
    # first queue sets the cap as S2 says and ends the ramp. None: no limit until then.
    initial_cap: int | None = 16
    queue_probes: int = 2  # S2: consecutive probes with a queue before the cap is set
    # Prefix keeping (docs/concepts/affinity.md): on a capped replica, turns of runs pinned there
    # go first (after S5's caller order), new batch runs start only while fewer runs than
    # the cap are pinned there, and a turn back from a tool that finds less than this share
    # of its run's previous prompt cached lowers the cap by one.
    keep_prefixes: bool = True
    prefix_miss_share: float = 0.5
    # Decode pace (docs/concepts/decode-pace.md): while an interactive run lives on a replica
    # (a turn in flight or paused on a tool there), its batch turns are limited so that
    # replies there stream at no more than this many seconds per token; the limit is
    # learned from the turns that end there. A replica that reports no load is not
    # limited (S2). None: off.
    interactive_pace_s: float | None = 0.1
    pace_min_tokens: int = 16  # replies shorter than this say too little about the pace
    # Tool leases (docs/concepts/admission.md "Tool leases"): a run paused on a
    # tool for longer than its lease stops counting as living on its replica and its S4
    # reservation lapses; both come back when the run returns. A lease is
    # ``tool_lease_factor`` x (smoothed duration + 4 x smoothed deviation) of the slowest
    # tool of the pause, learned from the runs that came back from it, and at least
    # ``tool_lease_min_s``; a tool never seen back gets ``tool_lease_default_s``. At most
    # ``tool_estimates_max`` tool names are learned (the rest get the default).
    tool_lease_min_s: float = 10.0
    tool_lease_factor: float = 2.0
    tool_lease_default_s: float = 120.0
    tool_estimates_max: int = 1024
    # The interactive target relative to the floor (B7, ``target.py``): replies on a
    # replica where an interactive run lives stay under this many times the fastest pace
    # seen there; it replaces ``interactive_pace_s`` as the target. None: absolute target.
    interactive_slowdown: float | None = None
    # B8: compute ``Admit.retain_s`` (``leases.retain_time``) for the dataplane to ask
    # engines that declare a retention mechanism to keep a run's prefix over its pause.
    # Off: every Admit carries 0 and ``_admit`` does no more than before.
    kv_retention: bool = False
    # Working-set admission (docs/concepts/admission.md "Working-set admission"): a new
    # batch run starts on a replica whose KV pool is known only while the known contexts
    # of the runs living there plus an estimate of its own fit in ``working_set_share`` of
    # the pool and (if set) the engine's last KV usage is below ``working_set_kv_usage``.
    working_set: WorkingSet = WorkingSet.OFF
    working_set_share: float = 0.9
    working_set_kv_usage: float | None = None
    # Held-turn order (``order.py``; docs/concepts/runs-and-classes.md "Token fairness" and
    # "Batch order"). ``fairness``: which caller's held turn goes first within a
    # class: "in_flight" (S5: fewest turns in flight) or "tokens" (virtual token counters,
    # VTC: least weighted service, ``prompt_weight`` x prompt + ``completion_weight`` x
    # completion tokens per finished turn). ``batch_order``: within the batch class, after
    # the caller, "arrival" or "attained" (the run with the least attained service first,
    # measured by ``attained_measure``: "tokens", uncached prompt plus completion tokens of
    # its finished turns, or "time", its finished turns' seconds from admission to end).
    fairness: str = "in_flight"
    prompt_weight: float = 1.0
    completion_weight: float = 2.0
    batch_order: str = "arrival"
    attained_measure: str = "tokens"
    # Packing under a relative target (``target.py``, "Packing"): with
    # ``interactive_slowdown`` set, new interactive runs go where interactive runs already
    # live and meet the target, a replica's batch limit may reach 0 while another replica
    # takes batch work, and batch runs pinned to a replica at 0 may move. Off (the
    # default: the simulator's gains did not hold in the real-time flood): the target
    # alone; no effect without a relative target.
    target_packing: bool = False
    # Configured callers (B13, ``order.py`` "Callers and sub-callers"): name -> its weight
    # and in-flight limit. A caller not named here has weight 1 and no limit.
    callers: Mapping[str, CallerPolicy] = field(default_factory=Map)

    def __init__(
        self,
        turn_timeout_s: float = 600.0,
        dataplane_grace_s: float = 15.0,
        run_idle_expiry_s: float = 1800.0,
        cap_raise_step: int = 1,
        initial_cap: int | None = 16,
        queue_probes: int = 2,
        keep_prefixes: bool = True,
        prefix_miss_share: float = 0.5,
        interactive_pace_s: float | None = 0.1,
        pace_min_tokens: int = 16,
        tool_lease_min_s: float = 10.0,
        tool_lease_factor: float = 2.0,
        tool_lease_default_s: float = 120.0,
        tool_estimates_max: int = 1024,
        interactive_slowdown: float | None = None,
        kv_retention: bool = False,
        working_set: WorkingSet = WorkingSet.OFF,
        working_set_share: float = 0.9,
        working_set_kv_usage: float | None = None,
        fairness: str = "in_flight",
        prompt_weight: float = 1.0,
        completion_weight: float = 2.0,
        batch_order: str = "arrival",
        attained_measure: str = "tokens",
        target_packing: bool = False,
        callers: Mapping[str, CallerPolicy] = EMPTY_MAP,
    ) -> None:
        object.__setattr__(self, "turn_timeout_s", turn_timeout_s)
        object.__setattr__(self, "dataplane_grace_s", dataplane_grace_s)
        object.__setattr__(self, "run_idle_expiry_s", run_idle_expiry_s)
        object.__setattr__(self, "cap_raise_step", cap_raise_step)
        object.__setattr__(self, "initial_cap", initial_cap)
        object.__setattr__(self, "queue_probes", queue_probes)
        object.__setattr__(self, "keep_prefixes", keep_prefixes)
        object.__setattr__(self, "prefix_miss_share", prefix_miss_share)
        object.__setattr__(self, "interactive_pace_s", interactive_pace_s)
        object.__setattr__(self, "pace_min_tokens", pace_min_tokens)
        object.__setattr__(self, "tool_lease_min_s", tool_lease_min_s)
        object.__setattr__(self, "tool_lease_factor", tool_lease_factor)
        object.__setattr__(self, "tool_lease_default_s", tool_lease_default_s)
        object.__setattr__(self, "tool_estimates_max", tool_estimates_max)
        object.__setattr__(self, "interactive_slowdown", interactive_slowdown)
        object.__setattr__(self, "kv_retention", kv_retention)
        object.__setattr__(self, "working_set", working_set)
        object.__setattr__(self, "working_set_share", working_set_share)
        object.__setattr__(self, "working_set_kv_usage", working_set_kv_usage)
        object.__setattr__(self, "fairness", fairness)
        object.__setattr__(self, "prompt_weight", prompt_weight)
        object.__setattr__(self, "completion_weight", completion_weight)
        object.__setattr__(self, "batch_order", batch_order)
        object.__setattr__(self, "attained_measure", attained_measure)
        object.__setattr__(self, "target_packing", target_packing)
        object.__setattr__(self, "callers", callers)
