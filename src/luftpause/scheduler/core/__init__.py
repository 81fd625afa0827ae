"""The pure scheduling core (S1): ``decide(state, event) -> (state, actions)``.

No I/O, no clock, no randomness: the host feeds events stamped with its clock
and carries out the actions. Every policy of S2–S6, S10, S11 and S13 lives in
``decide.py``; ``state.py`` explains the data layout; ``view.py`` renders the
status snapshot; ``invariants.py`` recomputes derived counters for tests.
"""

from luftpause.scheduler.core.actions import Action, Admit, DropTurn, ForgetRun, Reject
from luftpause.scheduler.core.decide import decide
from luftpause.scheduler.core.events import (
    ClockTicked,
    DataplaneConnected,
    DataplaneDisconnected,
    DataplaneResynced,
    Event,
    FirstTokenReceived,
    ReplicaProbed,
    RunEnded,
    RunSnapshot,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
    TurnRequested,
    TurnSnapshot,
    TurnStarted,
)
from luftpause.scheduler.core.state import State, initial_state
from luftpause.scheduler.core.types import (
    DropReason,
    EndpointKind,
    Params,
    RejectCode,
    ReplicaSpec,
    RunPhase,
    ServiceClass,
    WorkingSet,
)

__all__ = [
    "Action",
    "Admit",
    "ClockTicked",
    "DataplaneConnected",
    "DataplaneDisconnected",
    "DataplaneResynced",
    "DropReason",
    "DropTurn",
    "EndpointKind",
    "Event",
    "FirstTokenReceived",
    "ForgetRun",
    "Params",
    "Reject",
    "RejectCode",
    "ReplicaProbed",
    "ReplicaSpec",
    "RunEnded",
    "RunPhase",
    "RunSnapshot",
    "ServiceClass",
    "State",
    "TurnAbandoned",
    "TurnFailed",
    "TurnFinished",
    "TurnRequested",
    "TurnSnapshot",
    "TurnStarted",
    "WorkingSet",
    "decide",
    "initial_state",
]
