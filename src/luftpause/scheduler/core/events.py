"""Events: past-tense facts the host feeds to ``decide``. Each carries its time ``at``.

Times are seconds on the host's monotonic clock; the core never reads a clock.
Events about unknown turns or runs are legal (a peer may be confused or late):
``decide`` ignores or rejects them, it never raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.scheduler.core.types import EndpointKind, ReplicaSpec, RunPhase, ServiceClass


@dataclass(frozen=True, slots=True)
class TurnRequested:
    """A dataplane asks to admit a turn (the Admit call). Re-sent after a reconnect
    with the same ``turn_id``: an admitted turn is admitted again to the same
    replica, a held one stays where it is."""

    at: float
    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass = ServiceClass.BATCH
    caller: str = ""
    kind: EndpointKind = EndpointKind.GENERATIVE
    dataplane_id: str = ""
    trace_id: str = ""  # the turn's trace (X1), shown for held turns in the status


@dataclass(frozen=True, slots=True)
class TurnAbandoned:
    """The Admit call was cancelled: the client left. Held: it leaves the queue.
    Admitted but never started: its slot is freed."""

    at: float
    turn_id: str


@dataclass(frozen=True, slots=True)
class TurnStarted:
    at: float
    turn_id: str


@dataclass(frozen=True, slots=True)
class FirstTokenReceived:
    at: float
    turn_id: str


@dataclass(frozen=True, slots=True)
class TurnFinished:
    """The engine's reply ended. ``paused_on_tool``: it ended in tool calls (D5);
    ``tool_names``: the names of the tools it called (for the tool leases), as given."""

    at: float
    turn_id: str
    paused_on_tool: bool = False
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    tool_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TurnFailed:
    """The turn failed after admission; its slot is freed and its run left idle (D5).

    ``replica_unreachable``: the dataplane could not even connect to the turn's
    replica (refused, connect timeout). The replica leaves placement at once and
    stays out until a probe finds it healthy (D6: fail fast, as passive health
    checking does), instead of drawing every new turn until its probe fails.
    """

    at: float
    turn_id: str
    reason: str = ""
    replica_unreachable: bool = False


@dataclass(frozen=True, slots=True)
class RunEnded:
    """D8/R15: the run is over; forget its affinity and reservation."""

    at: float
    run_id: str


@dataclass(frozen=True, slots=True)
class ReplicaProbed:
    """S9: a probe of a replica's health path and metrics.

    ``running``/``waiting`` are None when the replica reports no load (then it is
    not limited, S2). ``kv_tokens``: the engine's KV pool in tokens, from its metrics
    or the endpoint's configured ``kv_tokens`` (None: unknown; working-set admission
    then does not limit the replica).
    """

    at: float
    replica: str
    healthy: bool
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    kv_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ClockTicked:
    """S10: the host's 1 s tick drives expiry."""

    at: float


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    run_id: str
    phase: RunPhase
    replica: str | None
    service_class: ServiceClass
    caller: str


@dataclass(frozen=True, slots=True)
class TurnSnapshot:
    turn_id: str
    run_id: str
    replica: str
    model: str
    service_class: ServiceClass
    caller: str
    started: bool = False


@dataclass(frozen=True, slots=True)
class DataplaneResynced:
    """S11: everything one dataplane knows, sent on each connect. The dataplane is
    the source of truth for its runs and admitted turns; admitted turns of this
    dataplane missing from the list are released."""

    at: float
    dataplane_id: str
    runs: tuple[RunSnapshot, ...] = ()
    in_flight: tuple[TurnSnapshot, ...] = ()


@dataclass(frozen=True, slots=True)
class DataplaneConnected:
    """S11: a dataplane's report stream opened (it is alive and reporting)."""

    at: float
    dataplane_id: str


@dataclass(frozen=True, slots=True)
class DataplaneDisconnected:
    """S11: a dataplane's last report stream ended. Its admitted turns stay counted for
    ``Params.dataplane_grace_s``; if it neither reconnects nor resyncs by then, they are
    released (the process died, or came back under another ID)."""

    at: float
    dataplane_id: str


@dataclass(frozen=True, slots=True)
class ReplicaJoined:
    """A replica joins the pool while the scheduler runs (discovery, the admin route). It
    starts as a restarted replica does: unhealthy until its first probe, then on the ramp
    from idle (S2). A replica of that name already present and draining or leaving is
    taken back (its drain ends) with this spec."""

    at: float
    spec: ReplicaSpec


@dataclass(frozen=True, slots=True)
class ReplicaDraining:
    """A replica is drained: it takes no new runs from now. The runs living there keep
    their turns there until ``until`` (None: now); from then it takes no turn at all and
    their next turns move to other replicas, which lose their cached prefix."""

    at: float
    replica: str
    until: float | None = None


@dataclass(frozen=True, slots=True)
class ReplicaLeft:
    """A replica is gone: no turn is admitted to it again. Its runs' next turns move; held
    turns of a model no replica serves any longer are rejected. Its record is kept while
    turns admitted there are in flight or runs are pinned or reserved there, then
    dropped."""

    at: float
    replica: str


Event = (
    TurnRequested
    | TurnAbandoned
    | TurnStarted
    | FirstTokenReceived
    | TurnFinished
    | TurnFailed
    | RunEnded
    | ReplicaProbed
    | ClockTicked
    | DataplaneResynced
    | DataplaneConnected
    | DataplaneDisconnected
    | ReplicaJoined
    | ReplicaDraining
    | ReplicaLeft
)
