"""Runs, run trees and subtree budgets (R8-R11): the runtime's state, and replay.

Theory of operation
-------------------
A :class:`Run` is one sub-agent: its spec, its conversation, its own usage and
the usage of its whole subtree, its children, and its approvals. The
:class:`Registry` owns every run and changes them only through
:meth:`Registry.apply`, which takes a journal record (see ``journal.py``). The
live path builds a record, applies it, then makes it durable; recovery feeds
the journal's records to the same ``apply``. So the state after a restart is
the state before it, by construction, and a record applied twice (same key)
is ignored: recovery is idempotent.

Usage is kept twice: ``own`` (this run's work) and ``subtree`` (its own plus
every descendant's). Adding usage to a run adds it to the ``subtree`` of the run
and every ancestor, so a budget check costs the depth of the tree, not its size.

Budgets (R10) belong to the run that was spawned with them and cover its whole
subtree, including runs spawned under it later. :meth:`Registry.budget_breach`
is checked when a turn or a tool round begins anywhere below a budgeted run
(and by a timer for seconds, so an idle subtree trips too):

* tokens (prompt + completion): breached when ``used >= limit`` as a turn begins;
* tool calls: breached when a round would take ``used`` past ``limit``; the
  message reports the count including the refused round;
* seconds (wall time since the budgeted run was spawned): ``used >= limit``.

States: ``Running`` -> (``AwaitingApproval`` <-> ``Running``)* -> one of
``Completed``, ``Failed``, ``Cancelled``. A terminal run never changes again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from luftpause.runtime.journal import iter_keys


class RunState(StrEnum):
    RUNNING = "Running"
    AWAITING_APPROVAL = "AwaitingApproval"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED})


@dataclass
class Usage:
    """Work done; ``add`` and the JSON form use the names ``status`` shows."""

    turns: int = 0
    tool_calls: int = 0
    failed_tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    turn_seconds: float = 0.0
    tool_seconds: float = 0.0

    _JSON = {
        "turns": "turns",
        "tool_calls": "toolCalls",
        "failed_tool_calls": "failedToolCalls",
        "prompt_tokens": "promptTokens",
        "completion_tokens": "completionTokens",
        "turn_seconds": "turnSeconds",
        "tool_seconds": "toolSeconds",
    }

    def add(self, other: Usage) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, key in self._JSON.items():
            value = getattr(self, name)
            out[key] = round(value, 3) if isinstance(value, float) else value
        return out

    @classmethod
    def from_json(cls, data: Any) -> Usage:
        usage = cls()
        if isinstance(data, dict):
            for name, key in cls._JSON.items():
                value = data.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    setattr(usage, name, type(getattr(usage, name))(value))
        return usage


@dataclass(frozen=True)
class RunSpec:
    """What ``spawn`` was asked for, with every default filled in (R2)."""

    task: str
    model: str
    service_class: str
    system: str | None = None
    max_tool_calls: int = 8
    tools: tuple[str, ...] | None = None
    max_tokens: int = 256
    parallel_tool_calls: bool = False
    budget_tokens: int | None = None
    budget_tool_calls: int | None = None
    budget_seconds: float | None = None
    approve_tools: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "model": self.model,
            "serviceClass": self.service_class,
            "system": self.system,
            "maxToolCalls": self.max_tool_calls,
            "tools": list(self.tools) if self.tools is not None else None,
            "maxTokens": self.max_tokens,
            "parallelToolCalls": self.parallel_tool_calls,
            "budgetTokens": self.budget_tokens,
            "budgetToolCalls": self.budget_tool_calls,
            "budgetSeconds": self.budget_seconds,
            "approveTools": list(self.approve_tools),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSpec:
        tools = data.get("tools")
        return cls(
            task=str(data["task"]),
            model=str(data["model"]),
            service_class=str(data.get("serviceClass", "interactive")),
            system=data.get("system"),
            max_tool_calls=int(data.get("maxToolCalls", 8)),
            tools=tuple(tools) if isinstance(tools, list) else None,
            max_tokens=int(data.get("maxTokens", 256)),
            parallel_tool_calls=bool(data.get("parallelToolCalls", False)),
            budget_tokens=data.get("budgetTokens"),
            budget_tool_calls=data.get("budgetToolCalls"),
            budget_seconds=data.get("budgetSeconds"),
            approve_tools=tuple(data.get("approveTools") or ()),
        )

    @property
    def has_budget(self) -> bool:
        return (
            self.budget_tokens is not None
            or self.budget_tool_calls is not None
            or self.budget_seconds is not None
        )


@dataclass
class PendingApproval:
    """A tool call waiting for the user (R11)."""

    key: str  # "<seq>:<index>" within the run: stable across restarts
    tool: str
    arguments: dict[str, Any]
    decided: asyncio.Future[bool]

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments}


@dataclass
class Run:
    id: str
    spec: RunSpec
    parent: str | None
    caller: str
    created: float  # wall-clock seconds (journaled, so budgets survive restarts)
    state: RunState = RunState.RUNNING
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: dict[int, dict[str, Any]] = field(default_factory=dict)  # seq -> assistant message
    results: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # seq -> tool msgs
    own: Usage = field(default_factory=Usage)
    subtree: Usage = field(default_factory=Usage)
    children: list[str] = field(default_factory=list)
    approvals: dict[str, bool] = field(default_factory=dict)
    pending: PendingApproval | None = None
    result: str | None = None
    error: str | None = None
    ended: float | None = None
    budget_exceeded: str | None = None  # set on the run that owns the breached budget
    task: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @property
    def next_seq(self) -> int:
        return max(self.turns, default=-1) + 1

    @property
    def open_seq(self) -> int | None:
        """The seq of a recorded turn whose tool round has no result yet."""
        for seq in sorted(self.turns):
            if seq not in self.results:
                return seq
        return None

    @property
    def calls_made(self) -> int:
        """Tool calls asked for by recorded turns (R7 counts these against the budget)."""
        return sum(len(m.get("tool_calls") or ()) for m in self.turns.values())

    def conversation(self) -> list[dict[str, Any]]:
        """The messages to send for the next turn: prompt, then every complete round."""
        out = list(self.messages)
        for seq in sorted(self.turns):
            if seq not in self.results:
                break
            out.append(self.turns[seq])
            out.extend(self.results[seq])
        return out


def initial_messages(spec: RunSpec) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if spec.system:
        messages.append({"role": "system", "content": spec.system})
    messages.append({"role": "user", "content": spec.task})
    return messages


class Registry:
    """Every run, changed only by :meth:`apply` (live records and replayed ones alike)."""

    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        self._seen: set[tuple[str, ...]] = set()
        self._watchers: dict[str, set[asyncio.Event]] = {}

    # ------------------------------------------------------------------ records

    def apply(self, record: dict[str, Any]) -> bool:
        """Apply one journal record; False when its key was applied before (ignored)."""
        key = next(iter_keys(record), None)
        if key is None or key in self._seen:
            return False
        kind = record["t"]
        run_id = str(record.get("run"))
        if kind == "spawn":
            self._seen.add(key)
            self._apply_spawn(record)
            return True
        run = self.runs.get(run_id)
        if run is None:
            return False  # a record for a run whose spawn was lost: nothing to attach it to
        if kind == "budget":
            self._seen.add(key)
            run.budget_exceeded = str(record["message"])
            self.notify(run)
            return True
        if run.done:
            return False  # nothing changes a finished run
        self._seen.add(key)
        if kind == "turn":
            seq = int(record["seq"])
            run.turns[seq] = record["message"]
            self.add_usage(run, Usage.from_json(record.get("usage")))
        elif kind == "tools":
            seq = int(record["seq"])
            if seq not in run.turns:
                self._seen.discard(key)
                return False
            run.results[seq] = list(record["results"])
            self.add_usage(run, Usage.from_json(record.get("usage")))
        elif kind == "approval":
            run.approvals[str(record["key"])] = bool(record["allow"])
        elif kind == "end":
            self.add_usage(run, Usage.from_json(record.get("usage")))
            run.state = RunState(record["state"])
            run.result = record.get("result")
            run.error = record.get("error")
            run.ended = float(record.get("time") or 0.0) or None
            if record.get("budgetExceeded"):
                run.budget_exceeded = str(record["budgetExceeded"])
            run.pending = None
        self.notify(run)
        return True

    def _apply_spawn(self, record: dict[str, Any]) -> None:
        spec = RunSpec.from_json(record["spec"])
        parent = record.get("parent")
        run = Run(
            id=str(record["run"]),
            spec=spec,
            parent=str(parent) if parent else None,
            caller=str(record.get("caller") or ""),
            created=float(record["created"]),
            messages=initial_messages(spec),
        )
        self.runs[run.id] = run
        if run.parent is not None:
            parent_run = self.runs.get(run.parent)
            if parent_run is not None:
                parent_run.children.append(run.id)

    # ------------------------------------------------------------------ tree

    def ancestors(self, run: Run) -> Iterator[Run]:
        """The run itself, then its parent, grandparent, ..."""
        current: Run | None = run
        seen: set[str] = set()
        while current is not None and current.id not in seen:
            seen.add(current.id)
            yield current
            current = self.runs.get(current.parent) if current.parent else None

    def descendants(self, run: Run) -> Iterator[Run]:
        """The run itself and every run below it (depth first)."""
        stack = [run]
        seen: set[str] = set()
        while stack:
            current = stack.pop()
            if current.id in seen:
                continue
            seen.add(current.id)
            yield current
            stack.extend(self.runs[c] for c in reversed(current.children) if c in self.runs)

    def add_usage(self, run: Run, delta: Usage) -> None:
        run.own.add(delta)
        for ancestor in self.ancestors(run):
            ancestor.subtree.add(delta)

    # ------------------------------------------------------------------ budgets

    def budget_breach(
        self, run: Run, now: float, *, new_tool_calls: int = 0
    ) -> tuple[Run, str] | None:
        """The first budgeted ancestor (or the run) whose budget is breached, and the message."""
        for owner in self.ancestors(run):
            message = self.owner_breach(owner, now, new_tool_calls=new_tool_calls)
            if message is not None:
                return owner, message
        return None

    @staticmethod
    def owner_breach(owner: Run, now: float, *, new_tool_calls: int = 0) -> str | None:
        spec = owner.spec
        if owner.budget_exceeded is not None:
            return owner.budget_exceeded
        if spec.budget_tokens is not None and owner.subtree.tokens >= spec.budget_tokens:
            return f"budget exceeded: tokens {owner.subtree.tokens}/{spec.budget_tokens}"
        if spec.budget_tool_calls is not None and new_tool_calls > 0:
            would = owner.subtree.tool_calls + new_tool_calls
            if would > spec.budget_tool_calls:
                return f"budget exceeded: toolCalls {would}/{spec.budget_tool_calls}"
        if spec.budget_seconds is not None:
            used = now - owner.created
            if used >= spec.budget_seconds:
                return f"budget exceeded: seconds {used:.1f}/{spec.budget_seconds:g}"
        return None

    def budget_json(self, run: Run, now: float) -> dict[str, Any] | None:
        spec = run.spec
        if not spec.has_budget:
            return None
        limits: dict[str, Any] = {}
        used: dict[str, Any] = {}
        if spec.budget_tokens is not None:
            limits["tokens"] = spec.budget_tokens
            used["tokens"] = run.subtree.tokens
        if spec.budget_tool_calls is not None:
            limits["toolCalls"] = spec.budget_tool_calls
            used["toolCalls"] = run.subtree.tool_calls
        if spec.budget_seconds is not None:
            limits["seconds"] = spec.budget_seconds
            active = any(not r.done for r in self.descendants(run))
            end = now if active or run.ended is None else run.ended
            used["seconds"] = round(max(0.0, end - run.created), 3)
        return {"limits": limits, "used": used, "exceeded": run.budget_exceeded}

    # ------------------------------------------------------------------ watchers

    def watch(self, run_ids: list[str], event: asyncio.Event) -> None:
        for run_id in run_ids:
            self._watchers.setdefault(run_id, set()).add(event)

    def unwatch(self, run_ids: list[str], event: asyncio.Event) -> None:
        for run_id in run_ids:
            watchers = self._watchers.get(run_id)
            if watchers is not None:
                watchers.discard(event)
                if not watchers:
                    del self._watchers[run_id]

    def notify(self, run: Run) -> None:
        """Wake everyone watching the run or one of its ancestors."""
        for ancestor in self.ancestors(run):
            for event in self._watchers.get(ancestor.id, ()):
                event.set()
