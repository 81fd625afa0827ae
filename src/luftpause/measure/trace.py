"""A user's own trace to replay (B10): JSONL, one run per line.

::

    {"id": "r1", "class": "interactive", "start_s": 0.0,
     "turns": [{"prompt_tokens": 1800, "completion_tokens": 120, "tool_s": 1.5},
               {"prompt_tokens": 2450, "completion_tokens": 60}]}

Per run: ``id`` (a string or an integer, unique in the file; required); ``class``
(``interactive`` or ``batch``; default ``batch``); ``caller`` (default: ``trace``);
``start_s`` (seconds after the replay starts, ≥ 0; default 0); ``shared_tokens``
(leading tokens of the first prompt every run of the trace shares, e.g. a system
prompt and tool definitions; less than the first prompt; default 0); ``turns`` (one
object per model turn, at least one). Per turn: ``prompt_tokens`` (integer ≥ 1),
``completion_tokens`` (integer ≥ 1), ``tool_s`` (seconds the tool after the turn took,
≥ 0; default 0; ignored on the last turn). Blank lines are skipped. Any other field is
refused, so a typo never silently changes a replay.

Each turn's prompt is meant to extend the previous one (previous prompt + reply +
tool result): a prompt that is *shorter* than the previous one is replayed as a
compacted conversation that starts afresh (see docs/guides/workloads.md).

:func:`load_trace` raises :class:`TraceError` naming the file, the line and the field;
:func:`trace_groups` names the groups a trace's runs are reported under.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from luftpause.measure.mix import CLASSES, Group, MixError
from luftpause.measure.workload import RunPlan, TurnPlan

RUN_KEYS = frozenset({"id", "class", "caller", "start_s", "shared_tokens", "turns"})
TURN_KEYS = frozenset({"prompt_tokens", "completion_tokens", "tool_s"})
PREFIX = "trace"  # runs of a trace share their system prompt under this name


class TraceError(MixError):
    """A trace that cannot be replayed; the message names the line and the field."""


@dataclass(frozen=True)
class TraceRun:
    id: str
    cls: str
    caller: str
    start_s: float
    plan: RunPlan
    line: int  # where it is in the file (1-based)

    @property
    def group(self) -> str:
        """The group it is reported under: its caller, else ``trace-<class>``."""
        return self.caller if self.caller != "trace" else f"trace-{self.cls}"


def _int(value: Any, where: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise TraceError(f"{where} must be an integer ≥ {lo}, got {json.dumps(value)}")
    return value


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(f"{where} must be a number of seconds ≥ 0, got {json.dumps(value)}")
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where} must be a number of seconds ≥ 0, got {json.dumps(value)}")
    return float(value)


def parse_run(data: Any, line: int = 1) -> TraceRun:
    """One line's object as a run; raises :class:`TraceError` (without the file's name)."""
    at = f"line {line}"
    if not isinstance(data, dict):
        raise TraceError(f"{at}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - RUN_KEYS)
    if unknown:
        raise TraceError(
            f"{at}: unknown field(s) {', '.join(unknown)} (a run has {', '.join(sorted(RUN_KEYS))})"
        )
    if "id" not in data:
        raise TraceError(f"{at}: field 'id' is required")
    raw_id = data["id"]
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or raw_id == "":
        raise TraceError(f"{at}: field 'id' must be a non-empty string or an integer")
    run_id = str(raw_id)
    cls = data.get("class", "batch")
    if cls not in CLASSES:
        raise TraceError(f"{at}: field 'class' must be interactive or batch, got {json.dumps(cls)}")
    caller = data.get("caller", "trace")
    if not isinstance(caller, str) or not caller:
        raise TraceError(f"{at}: field 'caller' must be a non-empty string")
    start_s = _seconds(data.get("start_s", 0.0), f"{at}: field 'start_s'")
    shared = _int(data.get("shared_tokens", 0), f"{at}: field 'shared_tokens'", 0)
    raw_turns = data.get("turns")
    if not isinstance(raw_turns, list) or not raw_turns:
        raise TraceError(f"{at}: field 'turns' must be a non-empty list of turns")
    turns: list[TurnPlan] = []
    for i, turn in enumerate(raw_turns):
        where = f"{at}: turns[{i}]"
        if not isinstance(turn, dict):
            raise TraceError(f"{where} must be an object")
        unknown = sorted(set(turn) - TURN_KEYS)
        if unknown:
            raise TraceError(
                f"{where}: unknown field(s) {', '.join(unknown)} "
                f"(a turn has {', '.join(sorted(TURN_KEYS))})"
            )
        for key in ("prompt_tokens", "completion_tokens"):
            if key not in turn:
                raise TraceError(f"{where}.{key} is required")
        turns.append(
            TurnPlan(
                prompt_tokens=_int(turn["prompt_tokens"], f"{where}.prompt_tokens", 1),
                completion_tokens=_int(turn["completion_tokens"], f"{where}.completion_tokens", 1),
                tool_s=_seconds(turn.get("tool_s", 0.0), f"{where}.tool_s"),
            )
        )
    if shared >= turns[0].prompt_tokens:
        raise TraceError(
            f"{at}: field 'shared_tokens' ({shared}) must be less than the first prompt "
            f"({turns[0].prompt_tokens} tokens)"
        )
    return TraceRun(run_id, cls, caller, start_s, RunPlan(tuple(turns), shared, PREFIX), line)


def parse_trace(text: str) -> list[TraceRun]:
    """Every run of a JSONL text, in file order; raises :class:`TraceError`."""
    runs: list[TraceRun] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise TraceError(f"line {number}: not valid JSON: {exc}") from None
        run = parse_run(data, number)
        if run.id in seen:
            raise TraceError(
                f"line {number}: field 'id' {json.dumps(run.id)} repeats line {seen[run.id]}"
            )
        seen[run.id] = number
        runs.append(run)
    if not runs:
        raise TraceError("no runs in it (one JSON object per line)")
    return runs


def load_trace(path: Path) -> list[TraceRun]:
    """The runs of a trace file; raises :class:`TraceError` starting with ``trace FILE``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"trace {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"trace {path}: not UTF-8 text: {exc}") from None
    try:
        return parse_trace(text)
    except TraceError as exc:
        raise TraceError(f"trace {path}: {exc}") from None


def trace_groups(runs: list[TraceRun]) -> list[Group]:
    """The groups a trace's runs are reported under (one per caller and class)."""
    counts: dict[tuple[str, str, str], int] = {}
    for run in runs:
        key = (run.group, run.cls, run.caller)
        counts[key] = counts.get(key, 0) + 1
    return [
        Group(name=name, count=n, cls=cls, caller=caller)
        for (name, cls, caller), n in counts.items()
    ]
