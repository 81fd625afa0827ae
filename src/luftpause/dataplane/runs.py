"""What the dataplane remembers so a restarted scheduler loses nothing (S11).

Per run: last replica, phase, class and caller; per admitted turn: its replica,
model and whether the engine request started. This is exactly what a Resync
carries. Idle runs are pruned after ``idle_prune_s``. A run ended by its client
(``end_run``) while turns of it are in flight stays, marked ``over``, until the last
of them ends: until then a resync must still list those turns (the engine runs them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

IDLE = "idle"
GENERATING = "generating"
PAUSED_ON_TOOL = "paused_on_tool"


@dataclass
class TurnRecord:
    turn_id: str
    run_id: str
    replica: str
    model: str
    service_class: str
    caller: str
    started: bool = False


@dataclass
class RunRecord:
    run_id: str
    service_class: str
    caller: str
    last_active: float
    replica: str | None = None
    phase: str = IDLE
    in_flight: dict[str, TurnRecord] = field(default_factory=dict)
    over: bool = False  # ended by its client; forgotten when its last turn ends


class RunTable:
    def __init__(self, clock: Callable[[], float], idle_prune_s: float) -> None:
        self.clock = clock
        self.idle_prune_s = idle_prune_s
        self.runs: dict[str, RunRecord] = {}
        self.turns: dict[str, TurnRecord] = {}

    def touch(self, run_id: str, service_class: str, caller: str) -> RunRecord:
        run = self.runs.get(run_id)
        now = self.clock()
        if run is None:
            run = self.runs[run_id] = RunRecord(run_id, service_class, caller, now)
        else:
            run.service_class, run.caller, run.last_active = service_class, caller, now
            run.over = False  # a new turn after the run was ended: it lives on
        return run

    def admitted(self, turn: TurnRecord) -> None:
        run = self.touch(turn.run_id, turn.service_class, turn.caller)
        run.replica, run.phase = turn.replica, GENERATING
        run.in_flight[turn.turn_id] = turn
        self.turns[turn.turn_id] = turn

    def started(self, turn_id: str) -> None:
        turn = self.turns.get(turn_id)
        if turn is not None:
            turn.started = True

    def ended(self, turn_id: str, *, paused_on_tool: bool) -> None:
        turn = self.turns.pop(turn_id, None)
        if turn is None:
            return
        run = self.runs.get(turn.run_id)
        if run is None:
            return
        run.in_flight.pop(turn_id, None)
        if run.over and not run.in_flight:
            del self.runs[turn.run_id]
            return
        run.last_active = self.clock()
        if run.in_flight:
            run.phase = GENERATING
        else:
            run.phase = PAUSED_ON_TOOL if paused_on_tool else IDLE

    def end_run(self, run_id: str) -> None:
        """The client ended the run: forgotten now, or, while turns of it are in flight,
        once the last of them ends."""
        run = self.runs.get(run_id)
        if run is None:
            return
        if run.in_flight:
            run.over = True
        else:
            del self.runs[run_id]

    def is_over(self, run_id: str) -> bool:
        """Whether the client ended the run while turns of it are in flight."""
        run = self.runs.get(run_id)
        return run is not None and run.over

    def over(self) -> list[str]:
        """Runs ended by their client whose turns are still in flight."""
        return [run_id for run_id, run in self.runs.items() if run.over]

    def forget(self, run_id: str) -> None:
        run = self.runs.pop(run_id, None)
        if run is not None:
            for turn_id in run.in_flight:
                self.turns.pop(turn_id, None)

    def prune(self) -> int:
        """Drop runs idle (no turn in flight) for longer than the prune age."""
        cutoff = self.clock() - self.idle_prune_s
        stale = [
            r for r, run in self.runs.items() if not run.in_flight and run.last_active < cutoff
        ]
        for run_id in stale:
            del self.runs[run_id]
        return len(stale)
