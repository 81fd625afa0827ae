"""Runs, run trees and subtree budgets (R8-R11) as plain data.

A :class:`Run` is one sub-agent: its spec, its conversation so far (the
recorded turns and tool rounds), its own usage and the usage of its whole
subtree, its children, its answered approvals and, while it waits for the user,
the call it waits on. :class:`RuntimeState` holds every run; only
``core.apply`` changes runs (plus :meth:`RuntimeState.ask` and
:meth:`RuntimeState.stop_asking`, the one piece of state that is not journaled:
an open approval is asked again after a restart, by the resumed loop).

The state is mutated in place rather than rebuilt per record: the live loop
reads the same objects it journals into, and adding usage walks only the run's
ancestors (a budget check costs the depth of the tree, not its size).

Usage is kept twice: ``own`` (this run's work) and ``subtree`` (its own plus
every descendant's). Budgets (R10) belong to the run that was spawned with them
and cover its whole subtree, including runs spawned under it later:

* tokens (prompt + completion): breached when ``used >= limit`` as a turn begins;
* tool calls: breached when a round would take ``used`` past ``limit``; the
  message reports the count including the refused round;
* seconds (wall time since the budgeted run was spawned): ``used >= limit``;
  ``now`` is always an argument, never read here.

States: ``Running`` -> (``AwaitingApproval`` <-> ``Running``)* -> one of
``Completed``, ``Failed``, ``Cancelled``. A terminal run never changes again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class RunState(StrEnum):
    RUNNING = "Running"
    AWAITING_APPROVAL = "AwaitingApproval"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED})

_CAMEL = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Usage(BaseModel):
    """Work done. The JSON form (journal, ``status``) uses camelCase names."""

    model_config = _CAMEL

    turns: int = Field(default=0, ge=0)
    tool_calls: int = Field(default=0, ge=0)
    failed_tool_calls: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    turn_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    tool_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    def add(self, other: Usage) -> None:
        self.turns += other.turns
        self.tool_calls += other.tool_calls
        self.failed_tool_calls += other.failed_tool_calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.turn_seconds += other.turn_seconds
        self.tool_seconds += other.tool_seconds

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, Any]:
        out = self.model_dump(by_alias=True)
        for key in ("turnSeconds", "toolSeconds"):
            out[key] = round(out[key], 3)
        return out


class RunSpec(BaseModel):
    """What ``spawn`` was asked for, with every default filled in (R2)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    task: str
    model: str
    service_class: str = "interactive"
    system: str | None = None
    max_tool_calls: int = Field(default=8, ge=0)
    tools: tuple[str, ...] | None = None
    max_tokens: int = Field(default=256, ge=0)
    parallel_tool_calls: bool = False
    budget_tokens: int | None = None
    budget_tool_calls: int | None = None
    budget_seconds: float | None = None
    approve_tools: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json")

    @property
    def has_budget(self) -> bool:
        return (
            self.budget_tokens is not None
            or self.budget_tool_calls is not None
            or self.budget_seconds is not None
        )

    def initial_messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        messages.append({"role": "user", "content": self.task})
        return messages


@dataclass(frozen=True)
class PendingApproval:
    """A tool call waiting for the user (R11)."""

    key: str  # "<seq>:<index>" within the run: stable across restarts
    tool: str
    arguments: dict[str, Any]

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
    traceparent: str | None = None  # the trace context its spans continue (X1)
    idempotency_key: str | None = None  # the client's key, when it gave one
    request_digest: str | None = None  # digest of the arguments the key came with
    session: str | None = None  # the harness's run whose tool call spawned it (#38)
    owner: str | None = None  # B13: the configured caller whose key owns it (None: the token)
    class_denied: str | None = None  # B13: the class its spawn asked for and was denied

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
        out = self.spec.initial_messages()
        for seq in sorted(self.turns):
            if seq not in self.results:
                break
            out.append(self.turns[seq])
            out.extend(self.results[seq])
        return out


@dataclass
class RuntimeState:
    """Every run, keyed by handle, the keys of the records applied so far, and the
    run each idempotency key started (the first spawn record with the key wins)."""

    runs: dict[str, Run] = field(default_factory=dict)
    seen: set[tuple[str, ...]] = field(default_factory=set)
    # (owner, key) -> run handle: each keyed caller's keys are its own (B13); the token's
    # (and a stack without callers) have owner None.
    idempotency_keys: dict[tuple[str | None, str], str] = field(default_factory=dict)

    def run_for_key(self, key: str, owner: str | None = None) -> Run | None:
        """The run a spawn with idempotency key ``key`` started among ``owner``'s runs."""
        run_id = self.idempotency_keys.get((owner, key))
        return self.runs.get(run_id) if run_id is not None else None

    # ------------------------------------------------------------------ approvals

    def ask(self, run: Run, pending: PendingApproval) -> None:
        """The run's loop waits for the user on ``pending`` (not journaled: see above)."""
        if run.done:
            return
        run.pending = pending
        run.state = RunState.AWAITING_APPROVAL

    def stop_asking(self, run: Run, pending: PendingApproval) -> None:
        if run.pending is pending:
            run.pending = None
            if not run.done:
                run.state = RunState.RUNNING

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
            message = owner_breach(owner, now, new_tool_calls=new_tool_calls)
            if message is not None:
                return owner, message
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


def owner_breach(owner: Run, now: float, *, new_tool_calls: int = 0) -> str | None:
    """The message of the budget ``owner`` holds if it is breached, else None."""
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
