"""Actions: what the host must do after an event. Imperative, plain data."""

from __future__ import annotations

from dataclasses import dataclass, field

from luftpause.scheduler.core.types import DropReason, RejectCode


@dataclass(frozen=True, slots=True, init=False)
class Admit:
    """Answer the turn's Admit call: send it to ``replica`` now."""

    turn_id: str
    replica: str
    held_s: float  # time between request and admission
    # B8 (``Params.kv_retention``): seconds the engine is asked to keep the turn's prefix
    # after it finishes (``leases.retain_time``); 0: no hint. Left out of the repr, so
    # recorded histories (tests/unit/test_core_longrun.py's digests) read as before.
    retain_s: float = field(default=0.0, repr=False)

    def __init__(self, turn_id: str, replica: str, held_s: float, retain_s: float = 0.0) -> None:
        object.__setattr__(self, "turn_id", turn_id)
        object.__setattr__(self, "replica", replica)
        object.__setattr__(self, "held_s", held_s)
        object.__setattr__(self, "retain_s", retain_s)


@dataclass(frozen=True, slots=True, init=False)
class Reject:
    """Answer the turn's Admit call with an error; the turn never queued."""

    turn_id: str
    code: RejectCode
    message: str

    def __init__(self, turn_id: str, code: RejectCode, message: str) -> None:
        object.__setattr__(self, "turn_id", turn_id)
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "message", message)


@dataclass(frozen=True, slots=True, init=False)
class DropTurn:
    """An admitted turn was dropped without a report (log and count it)."""

    turn_id: str
    replica: str
    reason: DropReason
    trace_id: str = ""  # the turn's trace (X1): the log line leads to it

    def __init__(self, turn_id: str, replica: str, reason: DropReason, trace_id: str = "") -> None:
        object.__setattr__(self, "turn_id", turn_id)
        object.__setattr__(self, "replica", replica)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "trace_id", trace_id)


@dataclass(frozen=True, slots=True, init=False)
class ForgetRun:
    """A run was forgotten after its idle expiry (log and count it)."""

    run_id: str

    def __init__(self, run_id: str) -> None:
        object.__setattr__(self, "run_id", run_id)


Action = Admit | Reject | DropTurn | ForgetRun
