"""Actions: what the host must do after an event. Imperative, plain data."""

from __future__ import annotations

from dataclasses import dataclass, field

from luftpause.scheduler.core.types import DropReason, RejectCode


@dataclass(frozen=True, slots=True)
class Admit:
    """Answer the turn's Admit call: send it to ``replica`` now."""

    turn_id: str
    replica: str
    held_s: float  # time between request and admission
    # B8 (``Params.kv_retention``): seconds the engine is asked to keep the turn's prefix
    # after it finishes (``leases.retain_time``); 0: no hint. Left out of the repr, so
    # recorded histories (tests/unit/test_core_longrun.py's digests) read as before.
    retain_s: float = field(default=0.0, repr=False)


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer the turn's Admit call with an error; the turn never queued."""

    turn_id: str
    code: RejectCode
    message: str


@dataclass(frozen=True, slots=True)
class DropTurn:
    """An admitted turn was dropped without a report (log and count it)."""

    turn_id: str
    replica: str
    reason: DropReason
    trace_id: str = ""  # the turn's trace (X1): the log line leads to it


@dataclass(frozen=True, slots=True)
class ForgetRun:
    """A run was forgotten after its idle expiry (log and count it)."""

    run_id: str


Action = Admit | Reject | DropTurn | ForgetRun
