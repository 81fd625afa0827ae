"""The pure scheduling core (S1): ``decide(state, event) -> (state, actions)``.

No I/O, no clock, no randomness: the host feeds events stamped with its clock
and carries out the actions. ``decide.py`` handles every event (S2–S6, S10, S11,
S13) and its theory-of-operation docstring says how the policy units compose:
``placement.py`` (where a new turn may go: filter, score, pick), ``order.py``
(which held turn goes first), ``target.py`` (the decode pace and the interactive
target, packing included), ``working_set.py`` (admission by the KV pool) and
``leases.py`` (tool leases). ``state.py`` explains the data layout; ``view.py``
renders the status snapshot; ``invariants.py`` recomputes derived counters for tests.
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
    ReplicaDraining,
    ReplicaJoined,
    ReplicaLeft,
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
    CallerPolicy,
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
    "CallerPolicy",
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
    "ReplicaDraining",
    "ReplicaJoined",
    "ReplicaLeft",
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
