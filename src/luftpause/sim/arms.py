"""Who decides where and when a turn enters an engine (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from luftpause.scheduler.core import (
    Admit,
    ClockTicked,
    DropTurn,
    EndpointKind,
    Event,
    FirstTokenReceived,
    Params,
    Reject,
    ReplicaProbed,
    ReplicaSpec,
    ServiceClass,
    State,
    TurnFinished,
    TurnRequested,
    TurnStarted,
    decide,
    initial_state,
)
from luftpause.sim.fleet import Replica
from luftpause.sim.world import World

ARMS = ("luftpause", "router", "engine-prio")
# Body priorities of the engine-prio arm (as tools/bench/flood.py sends them).
ENGINE_PRIORITY = {"interactive": 10, "batch": 0}


@dataclass(frozen=True)
class Ask:
    """A turn asking to run."""

    turn_id: str
    run_id: str
    model: str
    cls: str
    caller: str
    agent: int  # the agent's index (engine-prio pins agents to replicas by it)


Admitted = Callable[[str, float], None]  # replica, seconds held
Refused = Callable[[str], None]  # why


@dataclass
class TurnEnd:
    paused_on_tool: bool
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class Arm(Protocol):
    name: str
    holds: bool  # True when turns may wait in the arm (a held time is reported)

    def start(self) -> None: ...

    def request(self, ask: Ask, admitted: Admitted, refused: Refused) -> None: ...

    def priority(self, cls: str) -> int: ...

    def started(self, turn_id: str) -> None: ...

    def first_token(self, turn_id: str) -> None: ...

    def finished(self, ask: Ask, end: TurnEnd) -> None: ...


class LuftpauseArm:
    """The scheduler's pure core, fed what the real service feeds it."""

    name = "luftpause"
    holds = True

    def __init__(
        self,
        world: World,
        replicas: Sequence[Replica],
        models: frozenset[str],
        params: Params,
        probe_s: float = 2.0,
        tick_s: float = 1.0,
        log: list[Event] | None = None,
        admits: list[Admit] | None = None,
        class_priority: bool = True,
    ) -> None:
        self.world = world
        # As the flood's endpoints declare ``class_priority``: the dataplane sends each
        # turn to its engine with its class's priority (interactive 10, batch 0).
        self.class_priority = class_priority
        self.replicas = list(replicas)
        self.probe_s = probe_s
        self.tick_s = tick_s
        specs = tuple(ReplicaSpec(r.name, EndpointKind.GENERATIVE, models) for r in replicas)
        self.state: State = initial_state(specs, params, world.now)
        self._waiting: dict[str, tuple[Admitted, Refused]] = {}
        self.log = log  # every event decided, in order (the core's input, for replay)
        self.admits = admits  # every admission made, in order
        self.dropped = 0

    def start(self) -> None:
        self._probe()  # the service probes every replica before it admits anything
        self.world.after(self.tick_s, self._tick)

    def _apply(self, event: Event) -> None:
        if self.log is not None:
            self.log.append(event)
        self.state, actions = decide(self.state, event)
        for action in actions:
            if isinstance(action, Admit):
                if self.admits is not None:
                    self.admits.append(action)
                answer = self._waiting.pop(action.turn_id, None)
                if answer is not None:
                    answer[0](action.replica, action.held_s)
            elif isinstance(action, Reject):
                answer = self._waiting.pop(action.turn_id, None)
                if answer is not None:
                    answer[1](action.message)
            elif isinstance(action, DropTurn):
                self.dropped += 1

    def _probe(self) -> None:
        now = self.world.now
        for replica in self.replicas:
            m = replica.metrics()
            self._apply(
                ReplicaProbed(
                    at=now,
                    replica=replica.name,
                    healthy=True,
                    running=m.running_gauge,
                    waiting=m.queue_gauge,
                    kv_usage=m.token_usage,
                )
            )
        self.world.after(self.probe_s, self._probe)

    def _tick(self) -> None:
        self._apply(ClockTicked(at=self.world.now))
        self.world.after(self.tick_s, self._tick)

    def request(self, ask: Ask, admitted: Admitted, refused: Refused) -> None:
        self._waiting[ask.turn_id] = (admitted, refused)
        self._apply(
            TurnRequested(
                at=self.world.now,
                turn_id=ask.turn_id,
                run_id=ask.run_id,
                model=ask.model,
                service_class=ServiceClass(ask.cls),
                caller=ask.caller,
                dataplane_id="sim",
            )
        )

    def priority(self, cls: str) -> int:
        return ENGINE_PRIORITY[cls] if self.class_priority else 0

    def started(self, turn_id: str) -> None:
        self._apply(TurnStarted(at=self.world.now, turn_id=turn_id))

    def first_token(self, turn_id: str) -> None:
        self._apply(FirstTokenReceived(at=self.world.now, turn_id=turn_id))

    def finished(self, ask: Ask, end: TurnEnd) -> None:
        self._apply(
            TurnFinished(
                at=self.world.now,
                turn_id=ask.turn_id,
                paused_on_tool=end.paused_on_tool,
                finish_reason=end.finish_reason,
                prompt_tokens=end.prompt_tokens,
                completion_tokens=end.completion_tokens,
                cached_tokens=end.cached_tokens,
            )
        )


@dataclass
class RouterArm:
    """No admission: back to the run's last replica, else the one with the fewest requests."""

    replicas: Sequence[Replica]
    name: str = "router"
    holds: bool = False
    _last: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        return None

    def request(self, ask: Ask, admitted: Admitted, refused: Refused) -> None:
        last = self._last.get(ask.run_id)
        if last is None:
            last = min(self.replicas, key=lambda r: (r.in_flight, r.name)).name
            self._last[ask.run_id] = last
        admitted(last, 0.0)

    def priority(self, cls: str) -> int:
        return 0

    def started(self, turn_id: str) -> None:
        return None

    def first_token(self, turn_id: str) -> None:
        return None

    def finished(self, ask: Ask, end: TurnEnd) -> None:
        if not end.paused_on_tool:
            self._last.pop(ask.run_id, None)  # the run is over; its next run starts afresh


@dataclass
class EnginePriorityArm:
    """Straight to the engines: agent i on replica i mod N, the class as body priority."""

    replicas: Sequence[Replica]
    name: str = "engine-prio"
    holds: bool = False

    def start(self) -> None:
        return None

    def request(self, ask: Ask, admitted: Admitted, refused: Refused) -> None:
        admitted(self.replicas[ask.agent % len(self.replicas)].name, 0.0)

    def priority(self, cls: str) -> int:
        return ENGINE_PRIORITY[cls]

    def started(self, turn_id: str) -> None:
        return None

    def first_token(self, turn_id: str) -> None:
        return None

    def finished(self, ask: Ask, end: TurnEnd) -> None:
        return None
