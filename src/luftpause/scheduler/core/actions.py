"""Actions: what the host must do after an event. Imperative, plain data."""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.scheduler.core.types import DropReason, RejectCode


@dataclass(frozen=True, slots=True)
class Admit:
    """Answer the turn's Admit call: send it to ``replica`` now."""

    turn_id: str
    replica: str
    held_s: float  # time between request and admission


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
