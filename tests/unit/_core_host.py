"""A pool of replicas fed to ``decide`` by a test, the invariants checked after each event."""

from __future__ import annotations

from luftpause.scheduler.core import (
    Action,
    Admit,
    EndpointKind,
    Event,
    Params,
    ReplicaProbed,
    ReplicaSpec,
    State,
    decide,
    initial_state,
)
from luftpause.scheduler.core.invariants import violations

GEN = EndpointKind.GENERATIVE


class CoreHost:
    """Feeds ``decide`` a pool's events (replicas ``g0``, ``g1``, … serving model ``m``,
    each probed healthy with ``cap`` and a queue, so S2 caps it there), checking the
    invariants after each; remembers where each turn was admitted."""

    def __init__(self, params: Params, cap: int, replicas: int) -> None:
        self.names = [f"g{i}" for i in range(replicas)]
        specs = tuple(ReplicaSpec(n, GEN, frozenset({"m"})) for n in self.names)
        self.state: State = initial_state(specs, params)
        self.t = 0.0
        self.admitted: dict[str, str] = {}  # turn -> replica, while in flight
        self.ever: set[str] = set()  # every turn admitted
        for name in self.names:
            self(ReplicaProbed(self.t, name, True, cap, 1))  # S2: a queue caps it at ``cap``

    def __call__(self, ev: Event) -> tuple[Action, ...]:
        self.state, actions = decide(self.state, ev)
        assert violations(self.state) == []
        for a in actions:
            if isinstance(a, Admit):
                self.admitted[a.turn_id] = a.replica
                self.ever.add(a.turn_id)
        return actions
