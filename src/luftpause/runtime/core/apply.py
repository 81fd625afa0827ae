"""``apply(state, record)``: the one way a run changes, live and on replay (R8).

Theory of operation
-------------------
The live loop builds a record, applies it, then makes it durable; recovery
feeds the journal's records to the same :func:`apply`. A record is applied once
per key (``record.key``): a repeated key is ignored, so replaying twice, or a
journal that holds a record twice, gives the same state. Recovery is
idempotent.

Rules, per record type:

* ``spawn`` creates the run and links it under its parent (a parent the journal
  lost leaves the run a root), and binds its idempotency key, if it has one, to
  it among its owner's keys (a key already bound keeps its first run);
* ``budget`` marks the owner's budget exceeded, even on a finished run (its
  subtree may still be running);
* every other record changes an unfinished run only: a finished run is final,
  whatever the journal says after its end;
* ``tools`` for a turn that was never recorded is not applied (and its key not
  spent), so the round is executed again;
* ``end`` adds the last turn's usage and fixes the run's outcome.

A run without ``end`` resumes after its last ``tools`` record; a last ``turn``
without one is not asked again, its calls are executed again (none of its
results was recorded). A complete round is never executed again. Approvals
already answered are reused; open ones are asked again.

:func:`replay` applies a journal's lines. A line that is not a record
(:class:`~luftpause.runtime.core.records.RecordError`) fails the run it belongs
to, with the line number and the reason as the run's error; every other run
recovers. The problems are returned for start-up to report.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from luftpause.runtime.core.records import (
    Approval,
    Budget,
    End,
    RecordError,
    Spawn,
    Tools,
    Turn,
    parse,
)
from luftpause.runtime.core.state import Run, RunSpec, RunState, RuntimeState

AnyRecord = Spawn | Turn | Tools | Approval | Budget | End


def apply(state: RuntimeState, record: AnyRecord) -> Run | None:
    """Apply one record; the run it changed, or None when it changed nothing."""
    key = record.key
    if key in state.seen:
        return None
    if isinstance(record, Spawn):
        if record.run in state.runs:
            return None  # a second spawn for a handle (e.g. one failed unreadable): keep the first
        state.seen.add(key)
        return _spawn(state, record)
    run = state.runs.get(record.run)
    if run is None:
        return None  # a record for a run whose spawn was lost: nothing to attach it to
    if isinstance(record, Budget):
        state.seen.add(key)
        run.budget_exceeded = record.message
        return run
    if run.done:
        return None
    if isinstance(record, Turn):
        run.turns[record.seq] = record.message.model_dump(mode="json")
        state.add_usage(run, record.usage)
    elif isinstance(record, Tools):
        if record.seq not in run.turns:
            return None
        run.results[record.seq] = [m.model_dump(mode="json") for m in record.results]
        state.add_usage(run, record.usage)
    elif isinstance(record, Approval):
        run.approvals[record.key_] = record.allow
    else:
        state.add_usage(run, record.usage)
        run.state = record.state
        run.result = record.result
        run.error = record.error
        run.ended = record.time or None
        if record.budget_exceeded:
            run.budget_exceeded = record.budget_exceeded
        run.pending = None
    state.seen.add(key)
    return run


def _spawn(state: RuntimeState, record: Spawn) -> Run:
    parent = record.parent or None
    run = Run(
        id=record.run,
        spec=record.spec,
        parent=parent,
        caller=record.caller,
        created=record.created,
        traceparent=record.traceparent,
        idempotency_key=record.idempotency_key,
        request_digest=record.request_digest,
        session=record.session,
        owner=record.owner,
        class_denied=record.class_denied,
    )
    state.runs[run.id] = run
    if record.idempotency_key is not None:
        state.idempotency_keys.setdefault((record.owner, record.idempotency_key), run.id)
    if parent is not None and parent in state.runs:
        state.runs[parent].children.append(run.id)
    return run


def fail_run(state: RuntimeState, run_id: str, error: str) -> Run:
    """Mark a run failed for a reason outside its records (an unreadable journal line).

    The run is created as a failed placeholder when the unreadable line was its spawn;
    nothing later in the journal changes it. Not journaled: replay derives it again.
    """
    run = state.runs.get(run_id)
    if run is None:
        run = Run(
            id=run_id,
            spec=RunSpec(task="", model=""),
            parent=None,
            caller="",
            created=0.0,
        )
        state.runs[run_id] = run
    if not run.done:
        run.state = RunState.FAILED
        run.error = error
        run.pending = None
    return run


@dataclass(frozen=True)
class Problem:
    """One journal line that could not be applied."""

    line: int
    reason: str
    run: str | None  # the run failed because of it, when the line names one

    def __str__(self) -> str:
        whose = f"run {self.run} marked Failed" if self.run else "no run named; skipped"
        return f"line {self.line}: {self.reason} ({whose})"


@dataclass
class ReplayReport:
    records: int = 0  # lines applied or ignored as repeats
    problems: list[Problem] = field(default_factory=list)


def replay(state: RuntimeState, lines: Iterable[tuple[int, bytes]]) -> ReplayReport:
    """Apply ``(line number, line)`` pairs in order; unreadable lines fail their run."""
    report = ReplayReport()
    for number, raw in lines:
        try:
            record = parse(raw)
        except RecordError as exc:
            report.problems.append(Problem(number, exc.reason, exc.run))
            if exc.run is not None:
                fail_run(
                    state,
                    exc.run,
                    f"journal line {number} is unreadable ({exc.reason}); the run cannot "
                    "be resumed",
                )
            continue
        report.records += 1
        apply(state, record)
    return report
