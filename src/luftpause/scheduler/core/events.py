"""Events: past-tense facts the host feeds to ``decide``. Each carries its time ``at``.

Times are seconds on the host's monotonic clock; the core never reads a clock.
Events about unknown turns or runs are legal (a peer may be confused or late):
``decide`` ignores or rejects them, it never raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.scheduler.core.types import EndpointKind, ReplicaSpec, RunPhase, ServiceClass


@dataclass(frozen=True, slots=True, init=False)
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

    def __init__(
        self,
        at: float,
        turn_id: str,
        run_id: str,
        model: str,
        service_class: ServiceClass = ServiceClass.BATCH,
        caller: str = "",
        kind: EndpointKind = EndpointKind.GENERATIVE,
        dataplane_id: str = "",
        trace_id: str = "",
    ) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "turn_id", turn_id)
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "service_class", service_class)
        object.__setattr__(self, "caller", caller)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "dataplane_id", dataplane_id)
        object.__setattr__(self, "trace_id", trace_id)


@dataclass(frozen=True, slots=True, init=False)
class TurnAbandoned:
    """The Admit call was cancelled: the client left. Held: it leaves the queue.
    Admitted but never started: its slot is freed."""

    at: float
    turn_id: str

    def __init__(self, at: float, turn_id: str) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "turn_id", turn_id)


@dataclass(frozen=True, slots=True, init=False)
class TurnStarted:
    at: float
    turn_id: str

    def __init__(self, at: float, turn_id: str) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "turn_id", turn_id)


@dataclass(frozen=True, slots=True, init=False)
class FirstTokenReceived:
    at: float
    turn_id: str

    def __init__(self, at: float, turn_id: str) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "turn_id", turn_id)


@dataclass(frozen=True, slots=True, init=False)
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

    def __init__(
        self,
        at: float,
        turn_id: str,
        paused_on_tool: bool = False,
        finish_reason: str = "",
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        cached_tokens: int = 0,
        tool_names: tuple[str, ...] = (),
    ) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "turn_id", turn_id)
        object.__setattr__(self, "paused_on_tool", paused_on_tool)
        object.__setattr__(self, "finish_reason", finish_reason)
        object.__setattr__(self, "prompt_tokens", prompt_tokens)
        object.__setattr__(self, "completion_tokens", completion_tokens)
        object.__setattr__(self, "cached_tokens", cached_tokens)
        object.__setattr__(self, "tool_names", tool_names)


@dataclass(frozen=True, slots=True, init=False)
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

    def __init__(
        self, at: float, turn_id: str, reason: str = "", replica_unreachable: bool = False
    ) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "turn_id", turn_id)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "replica_unreachable", replica_unreachable)


@dataclass(frozen=True, slots=True, init=False)
class RunEnded:
    """D8/R15: the run is over; forget its affinity and reservation."""

    at: float
    run_id: str

    def __init__(self, at: float, run_id: str) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "run_id", run_id)


@dataclass(frozen=True, slots=True, init=False)
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

    def __init__(
        self,
        at: float,
        replica: str,
        healthy: bool,
        running: int | None = None,
        waiting: int | None = None,
        kv_usage: float | None = None,
        kv_tokens: int | None = None,
    ) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "replica", replica)
        object.__setattr__(self, "healthy", healthy)
        object.__setattr__(self, "running", running)
        object.__setattr__(self, "waiting", waiting)
        object.__setattr__(self, "kv_usage", kv_usage)
        object.__setattr__(self, "kv_tokens", kv_tokens)


@dataclass(frozen=True, slots=True, init=False)
class ClockTicked:
    """S10: the host's 1 s tick drives expiry."""

    at: float

    def __init__(self, at: float) -> None:
        object.__setattr__(self, "at", at)


@dataclass(frozen=True, slots=True, init=False)
class RunSnapshot:
    run_id: str
    phase: RunPhase
    replica: str | None
    service_class: ServiceClass
    caller: str

    def __init__(
        self,
        run_id: str,
        phase: RunPhase,
        replica: str | None,
        service_class: ServiceClass,
        caller: str,
    ) -> None:
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "phase", phase)
        object.__setattr__(self, "replica", replica)
        object.__setattr__(self, "service_class", service_class)
        object.__setattr__(self, "caller", caller)


@dataclass(frozen=True, slots=True, init=False)
class TurnSnapshot:
    turn_id: str
    run_id: str
    replica: str
    model: str
    service_class: ServiceClass
    caller: str
    started: bool = False

    def __init__(
        self,
        turn_id: str,
        run_id: str,
        replica: str,
        model: str,
        service_class: ServiceClass,
        caller: str,
        started: bool = False,
    ) -> None:
        object.__setattr__(self, "turn_id", turn_id)
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "replica", replica)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "service_class", service_class)
        object.__setattr__(self, "caller", caller)
        object.__setattr__(self, "started", started)


@dataclass(frozen=True, slots=True, init=False)
class DataplaneResynced:
    """S11: everything one dataplane knows, sent on each connect. The dataplane is
    the source of truth for its runs and admitted turns; admitted turns of this
    dataplane missing from the list are released."""

    at: float
    dataplane_id: str
    runs: tuple[RunSnapshot, ...] = ()
    in_flight: tuple[TurnSnapshot, ...] = ()

    def __init__(
        self,
        at: float,
        dataplane_id: str,
        runs: tuple[RunSnapshot, ...] = (),
        in_flight: tuple[TurnSnapshot, ...] = (),
    ) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "dataplane_id", dataplane_id)
        object.__setattr__(self, "runs", runs)
        object.__setattr__(self, "in_flight", in_flight)


@dataclass(frozen=True, slots=True, init=False)
class DataplaneConnected:
    """S11: a dataplane's report stream opened (it is alive and reporting)."""

    at: float
    dataplane_id: str

    def __init__(self, at: float, dataplane_id: str) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "dataplane_id", dataplane_id)


@dataclass(frozen=True, slots=True, init=False)
class DataplaneDisconnected:
    """S11: a dataplane's last report stream ended. Its admitted turns stay counted for
    ``Params.dataplane_grace_s``; if it neither reconnects nor resyncs by then, they are
    released (the process died, or came back under another ID)."""

    at: float
    dataplane_id: str

    def __init__(self, at: float, dataplane_id: str) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "dataplane_id", dataplane_id)


@dataclass(frozen=True, slots=True, init=False)
class ReplicaJoined:
    """A replica joins the pool while the scheduler runs (discovery, the admin route). It
    starts as a restarted replica does: unhealthy until its first probe, then on the ramp
    from idle (S2). A replica of that name already present and draining or leaving is
    taken back (its drain ends) with this spec."""

    at: float
    spec: ReplicaSpec

    def __init__(self, at: float, spec: ReplicaSpec) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "spec", spec)


@dataclass(frozen=True, slots=True, init=False)
class ReplicaDraining:
    """A replica is drained: it takes no new runs from now. The runs living there keep
    their turns there until ``until`` (None: now); from then it takes no turn at all and
    their next turns move to other replicas, which lose their cached prefix."""

    at: float
    replica: str
    until: float | None = None

    def __init__(self, at: float, replica: str, until: float | None = None) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "replica", replica)
        object.__setattr__(self, "until", until)


@dataclass(frozen=True, slots=True, init=False)
class ReplicaLeft:
    """A replica is gone: no turn is admitted to it again. Its runs' next turns move; held
    turns of a model no replica serves any longer are rejected. Its record is kept while
    turns admitted there are in flight or runs are pinned or reserved there, then
    dropped."""

    at: float
    replica: str

    def __init__(self, at: float, replica: str) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "replica", replica)


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
