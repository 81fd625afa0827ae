"""MCP Tasks for any of our ``MCPServer``\\ s: extension ``io.modelcontextprotocol/tasks`` (R12).

The MCP SDK (2.3) has no Tasks support; this module builds the 2026-07-28 Tasks
extension (SEP-2663) on the SDK's own ``Extension`` API, so it mounts on any
``MCPServer``: pass the extension at construction (``MCPServer(...,
extensions=[tasks])``) and run it inside the app's lifespan
(``async with tasks.running(): ...``).

What a client sees
------------------
* ``server/discover`` advertises ``capabilities.extensions["io.modelcontextprotocol/tasks"]``.
* ``tools/call`` of a *task tool* from a client that declared the extension in
  this request's ``_meta`` client capabilities (2026-07-28 only) returns at once
  the flat ``CreateTaskResult`` ``{"resultType": "task", "taskId", "status",
  "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"}``, after the task is
  journaled (a ``tasks/get`` right after it resolves). Any other caller (no
  extension, or a 2025-11-25 session, where a task can never be returned) gets
  the tool's ordinary synchronous call; a tool registered with
  ``support="required"`` answers those callers -32021 with
  ``data.requiredCapabilities``.
* ``tasks/get {taskId}``: the task, with ``result`` inlined when ``completed``
  (a tool error is ``completed`` with ``isError``), ``error`` when ``failed``
  (protocol errors only) and ``inputRequests`` when ``input_required``.
* ``tasks/update {taskId, inputResponses}`` answers input requests (a partial
  answer leaves the unanswered keys pending; keys that are not pending are
  ignored) and ``tasks/cancel {taskId}`` cancels (idempotent, also on finished
  tasks); both answer the empty ack ``{"resultType": "complete"}``.
* Errors: a client that did not declare the extension gets -32021 on
  ``tasks/*``; an ``Mcp-Name`` header that is missing or differs from
  ``taskId`` on an HTTP request gets -32020; an unknown (or expired) task
  -32602; ``tasks/result`` and ``tasks/list`` do not exist (-32601), and on a
  2025-11-25 session no ``tasks/*`` method does.

The state machine
-----------------
::

    working --> input_required --> working          (inputs answered)
    working | input_required --> completed | failed | cancelled   (terminal, final)

``TaskStore`` is the one place that changes a task: every transition
(``create``, ``request_input``, ``answer_input``, ``withdraw_input``,
``finish``, ``attach``, ``set_status_message``) checks that the move is allowed
(a terminal task never changes again), stamps ``lastUpdatedAt``, and appends
the task's new snapshot to ``tasks.jsonl`` in the state dir (one JSON record
per line, written, flushed and fsynced before the caller goes on; replay keeps
the last snapshot of each task). On start the store replays the file: a torn
last line is cut off with a warning, an unreadable line elsewhere is skipped
with a warning and kept in ``TaskStore.problems`` (``GET /status`` lists them
beside the run journal's), expired tasks are dropped, and a task that was still open
(``working``/``input_required``) is marked ``failed`` with the error "the
server restarted while the task was open" - journaled like any transition.
The file is compacted (rewritten with one line per live task) on start when it
has grown well past that.

Retention: ``ttlMs`` counts from ``createdAt`` as the spec says, but it grows
with the task: every change sets it to at least the task's age plus the
configured TTL, so an open task never expires and a finished one is kept at
least the configured TTL after it finished. ``ttl_ms=None`` keeps tasks forever
(``"ttlMs": null``).

The work of a task
------------------
A task tool's work is ``async def work(handle: TaskHandle, arguments) ->
CallToolResult``, run in the background:

* return a ``CallToolResult`` -> ``completed`` (``isError`` results too);
  raising ``ToolError`` is the same as returning an ``isError`` result;
* raise ``MCPError`` -> ``failed`` with that JSON-RPC error; any other
  exception -> ``failed`` with -32603 (and a logged traceback);
* ``await handle.require_input({key: request})`` sets ``input_required`` with
  those ``inputRequests`` (``elicitation/create``, ``sampling/createMessage``
  or ``roots/list`` requests, see ``elicitation_request``) and returns
  ``{key: response}`` once ``tasks/update`` answered every key. Keys must be
  unique over the task's life. Cancelling the ``require_input`` call (e.g. the
  question was answered some other way) withdraws its unanswered keys;
* client cancel (``tasks/cancel``): the task is journaled ``cancelled`` first,
  then the callbacks given to ``handle.on_cancel`` run, then the work is
  cancelled (``asyncio.CancelledError``) with ``handle.cancel_requested`` set.
  On server shutdown the work is cancelled too, but with
  ``handle.shutting_down`` set and the task left open in the journal (so it
  fails on the next start): test those two flags to tell the cases apart;
* ``await handle.attach("run-handle")`` stores an opaque string on the task
  record (journaled, readable as ``store.get(task_id).attachment``, also after
  a restart).

``prepare`` (optional) runs on the creating ``tools/call`` before the task
exists: it may return an ``InputRequiredResult`` to gather input over the
ordinary multi-round-trip flow first; the answers of the final round are in
``handle.input_responses``.

The synchronous path is the tool the owner registers with ``@mcp.tool`` as
usual (the task tool needs one anyway, for ``tools/list``); it may run the same
work through ``tasks.run_inline(name, arguments, ctx)``, whose handle asks for
input by mid-call elicitation on a legacy session that supports it and
otherwise fails the call with a tool error that says to use Tasks.

Example (the shape the runtime's ``run`` tool takes)::

    store = TaskStore(state_dir, ttl_ms=3_600_000)
    tasks = TasksExtension(store)

    async def run_work(handle: TaskHandle, arguments: dict[str, Any]) -> CallToolResult:
        run = await runtime.spawn(SpawnRequest.model_validate(arguments))
        await handle.attach(run.handle)
        handle.on_cancel(lambda: runtime.cancel(run.handle))   # client cancelled the task
        while True:
            event = await run.next_event()                      # approval asked / run ended
            if event.approval is None:
                return result_of(run)
            key = f"approve/{run.handle}/{event.approval.call_id}"
            answers = await handle.require_input({key: elicitation_request(
                approval_text(event.approval), ALLOW_SCHEMA)})
            await runtime.approve(run.handle, allowed(answers[key]))

    tasks.task_tool("run", run_work)          # optional: taskSupport "optional"
    mcp = MCPServer("luftpause-runtime", extensions=[tasks])

    @mcp.tool(structured_output=False)
    async def run(task: str, ctx: Context) -> CallToolResult:   # blocking path
        ...

    async with tasks.running():                # in the app lifespan
        ...

On restart the store marks the open ``run`` tasks ``failed`` while the runtime
resumes their runs from its own journal; the attachment says which run a
failed task was following.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import inspect
import json
import logging
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, cast, get_args

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, require_client_extension
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    Implementation,
    InputRequest,
    InputRequiredResult,
    ListRootsResult,
    RequestParams,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from luftpause.runtime.journal import Journal, JournalError
from luftpause.shown import SHOWN_CHARS, shown

log = logging.getLogger("luftpause.runtime.mcp_tasks")

TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
"""The extension's identifier, as advertised and as declared by clients."""

RELATED_TASK_META: Final = "io.modelcontextprotocol/related-task"
"""The 2025-11-25 ``_meta`` key that must not appear on an inlined result."""

JOURNAL_NAME: Final = "tasks.jsonl"
DEFAULT_TTL_MS: Final = 3_600_000
DEFAULT_POLL_INTERVAL_MS: Final = 500
RESTART_ERROR: Final = "the server restarted while the task was open"
SHUTDOWN_GRACE_S: Final = 5.0
JOURNAL_VERSION: Final = 1
# Compact on start when the file holds more than this many lines per live task (plus slack).
_COMPACT_FACTOR: Final = 4
_COMPACT_SLACK: Final = 256

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
TaskSupport = Literal["optional", "required"]

TERMINAL: Final[frozenset[str]] = frozenset({"completed", "failed", "cancelled"})
_STATUSES: Final[frozenset[str]] = frozenset(get_args(TaskStatus))
_ALLOWED: Final[Mapping[str, frozenset[str]]] = {
    "working": frozenset({"working", "input_required", "completed", "failed", "cancelled"}),
    "input_required": frozenset({"input_required", "working", "completed", "failed", "cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

_MODERN: Final[frozenset[str]] = frozenset(MODERN_PROTOCOL_VERSIONS)
_INPUT_REQUEST: Final[TypeAdapter[Any]] = TypeAdapter(InputRequest)
# Which result answers which input request (``tasks/update`` validates against it).
_RESPONSE_TYPES: Final[Mapping[str, TypeAdapter[Any]]] = {
    "elicitation/create": TypeAdapter(ElicitResult),
    "sampling/createMessage": TypeAdapter(CreateMessageResult | CreateMessageResultWithTools),
    "roots/list": TypeAdapter(ListRootsResult),
}


class TaskTransitionError(Exception):
    """A transition the state machine does not allow (a bug in the caller)."""


def iso(ts: float) -> str:
    """An epoch time as ISO-8601 UTC with milliseconds (``2026-07-28T10:30:00.000Z``)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def elicitation_request(message: str, requested_schema: Mapping[str, Any]) -> dict[str, Any]:
    """A form ``elicitation/create`` request, ready for ``TaskHandle.require_input``."""
    request = ElicitRequest(
        params=ElicitRequestFormParams(message=message, requested_schema=dict(requested_schema))
    )
    return request.model_dump(by_alias=True, exclude_none=True, mode="json")


def _error_dict(code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return error


def _strip_related_task(result: dict[str, Any]) -> dict[str, Any]:
    meta = result.get("_meta")
    if isinstance(meta, dict) and RELATED_TASK_META in meta:
        rest = {k: v for k, v in cast("dict[str, Any]", meta).items() if k != RELATED_TASK_META}
        if rest:
            result["_meta"] = rest
        else:
            del result["_meta"]
    return result


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class TaskRecord:
    """One task as the store holds it. Immutable: every transition makes a new one."""

    task_id: str
    tool: str
    status: TaskStatus
    created: float
    """Epoch seconds."""
    updated: float
    ttl_ms: int | None
    poll_interval_ms: int
    status_message: str | None = None
    input_requests: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Pending requests by key (only while ``input_required``)."""
    result: Mapping[str, Any] | None = None
    """The ``CallToolResult`` (wire form) of a ``completed`` task."""
    error: Mapping[str, Any] | None = None
    """The JSON-RPC error (``code``, ``message``, ``data``?) of a ``failed`` task."""
    attachment: str | None = None
    """An opaque string the owner attached (e.g. a run handle)."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def expired(self, now: float) -> bool:
        """A finished task past its TTL (open tasks never expire)."""
        if not self.terminal or self.ttl_ms is None:
            return False
        return now >= self.created + self.ttl_ms / 1000

    def task_fields(self) -> dict[str, Any]:
        """The ``Task`` shape shared by ``CreateTaskResult`` and ``tasks/get``."""
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": iso(self.created),
            "lastUpdatedAt": iso(self.updated),
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": self.poll_interval_ms,
        }
        if self.status_message is not None:
            out["statusMessage"] = self.status_message
        return out

    def create_result(self) -> dict[str, Any]:
        """The flat ``CreateTaskResult`` a task tool returns."""
        return {"resultType": "task", **self.task_fields()}

    def detailed(self) -> dict[str, Any]:
        """The ``tasks/get`` result: the task plus what its status carries."""
        out = {"resultType": "complete", **self.task_fields()}
        if self.status == "input_required":
            out["inputRequests"] = {k: dict(v) for k, v in self.input_requests.items()}
        elif self.status == "completed" and self.result is not None:
            out["result"] = dict(self.result)
        elif self.status == "failed" and self.error is not None:
            out["error"] = dict(self.error)
        return out

    def to_journal(self) -> dict[str, Any]:
        task: dict[str, Any] = {
            "taskId": self.task_id,
            "tool": self.tool,
            "status": self.status,
            "created": self.created,
            "updated": self.updated,
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": self.poll_interval_ms,
        }
        if self.status_message is not None:
            task["statusMessage"] = self.status_message
        if self.input_requests:
            task["inputRequests"] = {k: dict(v) for k, v in self.input_requests.items()}
        if self.result is not None:
            task["result"] = dict(self.result)
        if self.error is not None:
            task["error"] = dict(self.error)
        if self.attachment is not None:
            task["attachment"] = self.attachment
        return {"v": JOURNAL_VERSION, "task": task}

    @classmethod
    def from_journal(cls, record: Any) -> TaskRecord:
        """Parse one journal record; ``ValueError`` names what is wrong with it."""
        if not isinstance(record, dict) or record.get("v") != JOURNAL_VERSION:
            raise ValueError("not a version-1 task record")
        task = record.get("task")
        if not isinstance(task, dict):
            raise ValueError("no task object")
        try:
            status = task["status"]
            if status not in _STATUSES:
                raise ValueError(f"unknown status {status!r}")
            ttl = task["ttlMs"]
            requests = task.get("inputRequests") or {}
            result = task.get("result")
            error = task.get("error")
            message = task.get("statusMessage")
            attachment = task.get("attachment")
            checks = (
                isinstance(task["taskId"], str)
                and isinstance(task["tool"], str)
                and isinstance(task["created"], int | float)
                and isinstance(task["updated"], int | float)
                and (ttl is None or isinstance(ttl, int))
                and isinstance(task["pollIntervalMs"], int)
                and isinstance(requests, dict)
                and (result is None or isinstance(result, dict))
                and (error is None or isinstance(error, dict))
                and (message is None or isinstance(message, str))
                and (attachment is None or isinstance(attachment, str))
            )
            if not checks:
                raise ValueError("a field has the wrong type")
            return cls(
                task_id=task["taskId"],
                tool=task["tool"],
                status=status,
                created=float(task["created"]),
                updated=float(task["updated"]),
                ttl_ms=ttl,
                poll_interval_ms=task["pollIntervalMs"],
                status_message=message,
                input_requests=requests,
                result=result,
                error=error,
                attachment=attachment,
            )
        except KeyError as exc:
            raise ValueError(f"missing field {exc.args[0]!r}") from None


# --------------------------------------------------------------------------- store


@dataclass(frozen=True)
class TaskProblem:
    """One line of ``tasks.jsonl`` that replay skipped."""

    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason} (skipped; no task restored from it)"


class TaskStore:
    """The tasks and their journal; the only code that changes a task.

    Not thread-safe: use it from one event loop. Transitions change the
    in-memory record first (so concurrent requests see them at once) and
    return once the new snapshot is durable; ``create`` journals before the
    task becomes visible at all.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        ttl_ms: int | None = DEFAULT_TTL_MS,
        poll_interval_ms: int = DEFAULT_POLL_INTERVAL_MS,
        clock: Callable[[], float] = time.time,
        journal_name: str = JOURNAL_NAME,
    ) -> None:
        if ttl_ms is not None and ttl_ms <= 0:
            raise ValueError("ttl_ms must be positive (or None for no expiry)")
        if poll_interval_ms <= 0:
            raise ValueError("poll_interval_ms must be positive")
        self.state_dir = state_dir
        self.ttl_ms = ttl_ms
        self.poll_interval_ms = poll_interval_ms
        self._clock = clock
        self._journal_name = journal_name
        self._journal: Journal | None = None
        self._tasks: dict[str, TaskRecord] = {}
        self.problems: list[TaskProblem] = []
        """The lines the last ``open`` skipped (``GET /status`` lists them)."""

    @property
    def path(self) -> Path:
        return self.state_dir / self._journal_name

    @property
    def is_open(self) -> bool:
        return self._journal is not None

    # ---------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        """Replay ``tasks.jsonl``; fail the tasks that were open; start appending."""
        if self._journal is not None:
            raise RuntimeError("the task store is already open")
        journal = Journal(self.state_dir, self._journal_name)
        lines = journal.open()
        tasks: dict[str, TaskRecord] = {}
        self.problems = []
        for number, raw in lines:
            try:
                data = json.loads(raw)
            except ValueError as exc:
                self._skip(TaskProblem(number, f"not JSON ({exc})"))
                continue
            try:
                record = TaskRecord.from_journal(data)
            except ValueError as exc:
                self._skip(TaskProblem(number, str(exc)))
                continue
            tasks[record.task_id] = record
        now = self._clock()
        self._tasks = {tid: rec for tid, rec in tasks.items() if not rec.expired(now)}
        self._journal = journal
        reopened = [rec for rec in self._tasks.values() if not rec.terminal]
        if len(lines) > _COMPACT_FACTOR * len(self._tasks) + _COMPACT_SLACK:
            for rec in reopened:
                self._tasks[rec.task_id] = self._failed_on_restart(rec, now)
            await self._compact()
        else:
            for rec in reopened:
                await self._commit(self._failed_on_restart(rec, now))
        if reopened:
            log.warning(
                "%s: %d task(s) were open when the server stopped; marked failed",
                self.path,
                len(reopened),
            )

    def _skip(self, problem: TaskProblem) -> None:
        log.warning(
            "%s:%d: skipping an unreadable task record: %s", self.path, problem.line, problem.reason
        )
        self.problems.append(problem)

    def _failed_on_restart(self, rec: TaskRecord, now: float) -> TaskRecord:
        return self._next(
            rec,
            now,
            status="failed",
            error=_error_dict(INTERNAL_ERROR, RESTART_ERROR),
            status_message=RESTART_ERROR,
            input_requests={},
        )

    async def _compact(self) -> None:
        """Rewrite the journal with one line per live task (temp file, fsync, rename)."""
        assert self._journal is not None
        await self._journal.close()
        data = b"".join(
            json.dumps(rec.to_journal(), separators=(",", ":")).encode() + b"\n"
            for rec in self._tasks.values()
        )
        tmp = self.path.with_name(self.path.name + ".compact")
        await asyncio.to_thread(_write_durably, tmp, self.path, data)
        journal = Journal(self.state_dir, self._journal_name)
        journal.open()
        self._journal = journal
        log.info("%s: compacted to %d task(s)", self.path, len(self._tasks))

    async def close(self) -> None:
        if self._journal is not None:
            journal, self._journal = self._journal, None
            await journal.close()

    # ---------------------------------------------------------------- reading

    def get(self, task_id: str) -> TaskRecord | None:
        """The task, or None when unknown or expired (expired tasks are dropped here)."""
        rec = self._tasks.get(task_id)
        if rec is not None and rec.expired(self._clock()):
            del self._tasks[task_id]
            return None
        return rec

    def records(self) -> list[TaskRecord]:
        """Every live task (expired ones are dropped), oldest first."""
        self._sweep()
        return sorted(self._tasks.values(), key=lambda rec: rec.created)

    def _sweep(self) -> None:
        now = self._clock()
        for tid in [tid for tid, rec in self._tasks.items() if rec.expired(now)]:
            del self._tasks[tid]

    # ---------------------------------------------------------------- transitions

    async def create(self, tool: str, *, attachment: str | None = None) -> TaskRecord:
        """A new ``working`` task; visible only once it is journaled."""
        self._require_open()
        now = self._clock()
        rec = TaskRecord(
            task_id=str(uuid.uuid4()),
            tool=tool,
            status="working",
            created=now,
            updated=now,
            ttl_ms=self.ttl_ms,
            poll_interval_ms=self.poll_interval_ms,
            attachment=attachment,
        )
        await self._append(rec)
        self._tasks[rec.task_id] = rec
        self._sweep()  # expired tasks leave memory as new ones come
        return rec

    async def request_input(
        self, task_id: str, requests: Mapping[str, Mapping[str, Any]]
    ) -> TaskRecord | None:
        """Add pending input requests; the task becomes ``input_required``.

        None (and no change) when the task is already finished.
        """
        rec = self._existing(task_id)
        if rec.terminal:
            return None
        clash = set(requests) & set(rec.input_requests)
        if clash:
            raise TaskTransitionError(
                f"task {task_id}: input keys already pending: {sorted(clash)}"
            )
        pending = {**rec.input_requests, **{k: dict(v) for k, v in requests.items()}}
        return await self._commit(
            self._next(rec, self._clock(), status="input_required", input_requests=pending)
        )

    async def answer_input(self, task_id: str, keys: Iterable[str]) -> list[str]:
        """Remove answered keys from the pending ones; the task is ``working`` again
        once none is left. Returns the keys that were pending (the others are ignored)."""
        return await self._remove_pending(task_id, keys)

    async def withdraw_input(self, task_id: str, keys: Iterable[str]) -> list[str]:
        """Drop pending requests the work no longer waits for (same effect as answering)."""
        return await self._remove_pending(task_id, keys)

    async def _remove_pending(self, task_id: str, keys: Iterable[str]) -> list[str]:
        rec = self._existing(task_id)
        if rec.terminal:
            return []
        removed = [k for k in dict.fromkeys(keys) if k in rec.input_requests]
        if not removed:
            return []
        pending = {k: v for k, v in rec.input_requests.items() if k not in removed}
        status: TaskStatus = "input_required" if pending else "working"
        await self._commit(self._next(rec, self._clock(), status=status, input_requests=pending))
        return removed

    async def finish(
        self,
        task_id: str,
        status: Literal["completed", "failed", "cancelled"],
        *,
        result: Mapping[str, Any] | None = None,
        error: Mapping[str, Any] | None = None,
        status_message: str | None = None,
    ) -> bool:
        """Move an open task to a terminal status; False (no change) if it already was."""
        if status == "completed" and (result is None or error is not None):
            raise TaskTransitionError("a completed task carries a result and no error")
        if status == "failed" and (error is None or result is not None):
            raise TaskTransitionError("a failed task carries an error and no result")
        if status == "cancelled" and (result is not None or error is not None):
            raise TaskTransitionError("a cancelled task carries neither result nor error")
        rec = self._existing(task_id)
        if rec.terminal:
            return False
        await self._commit(
            self._next(
                rec,
                self._clock(),
                status=status,
                result=result,
                error=error,
                status_message=status_message,
                input_requests={},
            )
        )
        return True

    async def attach(self, task_id: str, attachment: str) -> TaskRecord:
        """Store an opaque string on the task (allowed in any status)."""
        rec = self._existing(task_id)
        return await self._commit(replace(rec, attachment=attachment))

    async def set_status_message(self, task_id: str, message: str | None) -> TaskRecord | None:
        """Change an open task's ``statusMessage``; None when the task is finished."""
        rec = self._existing(task_id)
        if rec.terminal:
            return None
        return await self._commit(self._next(rec, self._clock(), status_message=message))

    # ---------------------------------------------------------------- internals

    def _require_open(self) -> None:
        if self._journal is None:
            raise JournalError(f"{self.path}: the task store is not open")

    def _existing(self, task_id: str) -> TaskRecord:
        self._require_open()
        rec = self._tasks.get(task_id)
        if rec is None:
            raise KeyError(task_id)
        return rec

    def _next(self, rec: TaskRecord, now: float, **changes: Any) -> TaskRecord:
        """``rec`` changed as given, its status move checked, its clock and TTL advanced."""
        status = changes.get("status", rec.status)
        if status not in _ALLOWED[rec.status]:
            raise TaskTransitionError(
                f"task {rec.task_id}: {rec.status} -> {status} is not allowed"
            )
        updated = max(now, rec.updated)
        ttl = rec.ttl_ms
        if ttl is not None and self.ttl_ms is not None:
            # Keep the task at least the configured TTL past this change (ttlMs counts
            # from creation).
            ttl = max(ttl, math.ceil((updated - rec.created) * 1000) + self.ttl_ms)
        return replace(rec, updated=updated, ttl_ms=ttl, **changes)

    async def _commit(self, rec: TaskRecord) -> TaskRecord:
        self._tasks[rec.task_id] = rec
        await self._append(rec)
        return rec

    async def _append(self, rec: TaskRecord) -> None:
        self._require_open()
        assert self._journal is not None
        line = json.dumps(rec.to_journal(), separators=(",", ":")).encode() + b"\n"
        await self._journal.append(line)


def _write_durably(tmp: Path, target: Path, data: bytes) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# --------------------------------------------------------------------------- handles

CancelCallback = Callable[[], Awaitable[None] | None]


class TaskHandle(abc.ABC):
    """What the work of a task tool gets: its arguments, input, cancellation, attachment."""

    def __init__(
        self,
        *,
        tool: str,
        arguments: Mapping[str, Any],
        input_responses: Mapping[str, Any] | None = None,
        client_info: Implementation | None = None,
        request: Any = None,
    ) -> None:
        self.tool = tool
        self.arguments: Mapping[str, Any] = dict(arguments)
        self.input_responses: Mapping[str, Any] = dict(input_responses or {})
        """Answers carried by the creating ``tools/call`` (after a ``prepare`` round)."""
        self.client_info = client_info
        """The ``clientInfo`` of the client that created the task, when it sent one."""
        self.request = request
        """The transport's request that created the task (a Starlette ``Request`` over
        HTTP; None elsewhere): what the owner reads the request's credential from."""
        self.cancel_requested = False
        """True once the client cancelled the task (``tasks/cancel``)."""
        self.shutting_down = False
        """True when the work is being cancelled because the server is stopping."""
        self._cancel_callbacks: list[CancelCallback] = []

    @property
    @abc.abstractmethod
    def task_id(self) -> str | None:
        """The task's id; None when the work runs inline (a blocking tool call)."""

    @abc.abstractmethod
    async def require_input(
        self, requests: Mapping[str, Mapping[str, Any] | BaseModel]
    ) -> dict[str, dict[str, Any]]:
        """Ask the client; returns ``{key: response}`` once every key is answered."""

    @abc.abstractmethod
    async def attach(self, attachment: str) -> None:
        """Store an opaque string on the task record."""

    @abc.abstractmethod
    async def set_status_message(self, message: str | None) -> None:
        """Set the task's ``statusMessage`` (shown by ``tasks/get``)."""

    def on_cancel(self, callback: CancelCallback) -> None:
        """Run ``callback`` (sync or async) when the client cancels the task, before the
        work itself is cancelled. Callbacks run inside the ``tasks/cancel`` request, one
        after the other (keep them short; failures are logged). Registered after the
        cancel, it runs at once (if async, as a background task)."""
        if self.cancel_requested:
            outcome = callback()
            if inspect.isawaitable(outcome):
                _spawn_logged(outcome, f"on_cancel callback of {self.tool}")
            return
        self._cancel_callbacks.append(callback)

    async def _run_cancel_callbacks(self) -> None:
        callbacks, self._cancel_callbacks = self._cancel_callbacks, []
        for callback in callbacks:
            try:
                outcome = callback()
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:
                log.exception("task %s: an on_cancel callback failed", self.task_id)


def _spawn_logged(awaitable: Awaitable[Any], what: str) -> None:
    async def run() -> None:
        try:
            await awaitable
        except Exception:
            log.exception("%s failed", what)

    task = asyncio.create_task(run())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


_BACKGROUND: set[asyncio.Task[None]] = set()


def _validated_requests(
    requests: Mapping[str, Mapping[str, Any] | BaseModel],
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, request in requests.items():
        if not isinstance(key, str) or not key:
            raise ValueError("input request keys must be non-empty strings")
        raw = (
            request.model_dump(by_alias=True, exclude_none=True)
            if isinstance(request, BaseModel)
            else request
        )
        try:
            parsed = _INPUT_REQUEST.validate_python(raw)
        except ValidationError as exc:
            raise ValueError(
                f"input request {key!r} is not an elicitation/create, sampling/createMessage "
                f"or roots/list request: {exc}"
            ) from None
        out[key] = _INPUT_REQUEST.dump_python(parsed, by_alias=True, exclude_none=True, mode="json")
    return out


class _StoredHandle(TaskHandle):
    """The handle of a real (journaled) task."""

    def __init__(self, store: TaskStore, record: TaskRecord, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._store = store
        self._task_id = record.task_id
        self._used_keys: set[str] = set()
        self._waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.runner: asyncio.Task[None] | None = None

    @property
    def task_id(self) -> str:
        return self._task_id

    async def require_input(
        self, requests: Mapping[str, Mapping[str, Any] | BaseModel]
    ) -> dict[str, dict[str, Any]]:
        validated = _validated_requests(requests)
        if not validated:
            return {}
        reused = set(validated) & self._used_keys
        if reused:
            raise ValueError(f"input request keys must be unique over the task: {sorted(reused)}")
        self._used_keys.update(validated)
        loop = asyncio.get_running_loop()
        futures = {key: loop.create_future() for key in validated}
        self._waiters.update(futures)
        try:
            if await self._store.request_input(self._task_id, validated) is None:
                raise asyncio.CancelledError("the task is already finished")
            return {key: await future for key, future in futures.items()}
        finally:
            for key in futures:
                self._waiters.pop(key, None)
            # Cancelling the waiting call cancels the future it awaited: no result = unanswered.
            unanswered = [key for key, f in futures.items() if not f.done() or f.cancelled()]
            for future in futures.values():
                future.cancel()
            if unanswered and not self.shutting_down and self._store.is_open:
                try:
                    await self._store.withdraw_input(self._task_id, unanswered)
                except (JournalError, KeyError):
                    log.exception("task %s: cannot withdraw input requests", self._task_id)

    def deliver(self, answers: Mapping[str, dict[str, Any]]) -> None:
        """Hand answered keys to the waiting ``require_input`` calls."""
        for key, answer in answers.items():
            future = self._waiters.get(key)
            if future is not None and not future.done():
                future.set_result(answer)

    async def attach(self, attachment: str) -> None:
        await self._store.attach(self._task_id, attachment)

    async def set_status_message(self, message: str | None) -> None:
        await self._store.set_status_message(self._task_id, message)


class _InlineHandle(TaskHandle):
    """The handle of work run inside a blocking ``tools/call`` (no task, no journal)."""

    def __init__(self, ctx: ServerRequestContext[Any, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ctx = ctx
        self.attachment: str | None = None
        self.status_message: str | None = None

    @property
    def task_id(self) -> None:
        return None

    async def require_input(
        self, requests: Mapping[str, Mapping[str, Any] | BaseModel]
    ) -> dict[str, dict[str, Any]]:
        validated = _validated_requests(requests)
        session = self._ctx.session
        caps = session.client_capabilities
        can_elicit = (
            self._ctx.protocol_version not in _MODERN
            and session.can_send_request
            and caps is not None
            and caps.elicitation is not None
        )
        answers: dict[str, dict[str, Any]] = {}
        for key, request in validated.items():
            params = request.get("params") or {}
            if not can_elicit or request["method"] != "elicitation/create" or "url" in params:
                raise ToolError(
                    f"{self.tool} needs input from the user ({request['method']}), which this "
                    f"client cannot give during a blocking call; call it from a client that "
                    f"declares the {TASKS_EXTENSION} extension (it then runs as a task)"
                )
            answer = await session.elicit_form(
                params.get("message", ""),
                params.get("requestedSchema", {}),
                related_request_id=self._ctx.request_id,
            )
            answers[key] = answer.model_dump(by_alias=True, exclude_none=True, mode="json")
        return answers

    async def attach(self, attachment: str) -> None:
        self.attachment = attachment

    async def set_status_message(self, message: str | None) -> None:
        self.status_message = message


# --------------------------------------------------------------------------- extension

WorkFn = Callable[[TaskHandle, dict[str, Any]], Awaitable[CallToolResult]]
PrepareFn = Callable[
    [CallToolRequestParams, ServerRequestContext[Any, Any]], Awaitable[InputRequiredResult | None]
]


@dataclass(frozen=True)
class TaskTool:
    """A tool that runs as a task for clients that use Tasks."""

    name: str
    work: WorkFn
    support: TaskSupport = "optional"
    """``optional``: other clients get the ordinary synchronous call. ``required``:
    they get -32021 (the tool cannot be served without a task)."""
    prepare: PrepareFn | None = None
    """Runs on the creating call first; an ``InputRequiredResult`` it returns goes
    back to the client (multi-round-trip), None goes on to create the task."""


class TaskIdParams(RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses", default_factory=dict)


def _missing_extension() -> MCPError:
    return MCPError(
        code=-32021,
        message=f"this tool only runs as a task: declare the {TASKS_EXTENSION} extension "
        "in the request's client capabilities",
        data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
    )


class TasksExtension(Extension):
    """The Tasks extension: ``tasks/get``, ``tasks/update``, ``tasks/cancel`` and a
    ``tools/call`` interceptor that turns calls of registered task tools into tasks."""

    identifier = TASKS_EXTENSION

    def __init__(self, store: TaskStore, *, require_name_header: bool = True) -> None:
        self.store = store
        self.require_name_header = require_name_header
        """Reject HTTP ``tasks/*`` requests without an ``Mcp-Name`` header (the spec's MUST)."""
        self._tools: dict[str, TaskTool] = {}
        self._live: dict[str, _StoredHandle] = {}
        self._closing = False

    # ---------------------------------------------------------------- registration

    def task_tool(
        self,
        name: str,
        work: WorkFn | None = None,
        *,
        support: TaskSupport = "optional",
        prepare: PrepareFn | None = None,
    ) -> Callable[[WorkFn], WorkFn]:
        """Register ``work`` as the task form of tool ``name``; usable as a decorator.

        The tool itself (name, schema, synchronous behaviour) is registered on the
        ``MCPServer`` as usual.
        """
        if name in self._tools:
            raise ValueError(f"task tool {name!r} is already registered")

        def register(fn: WorkFn) -> WorkFn:
            self._tools[name] = TaskTool(name=name, work=fn, support=support, prepare=prepare)
            return fn

        if work is not None:
            register(work)
        return register

    def task_tools(self) -> dict[str, TaskTool]:
        return dict(self._tools)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open the store (replaying the journal). Call before serving requests."""
        self._closing = False
        await self.store.open()

    async def aclose(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop: cancel every running work (``shutting_down`` set; the tasks stay open in
        the journal and fail on the next start), then close the store."""
        self._closing = True
        handles = list(self._live.values())
        for handle in handles:
            handle.shutting_down = True
            if handle.runner is not None:
                handle.runner.cancel("the server is shutting down")
        runners = [h.runner for h in handles if h.runner is not None]
        if runners:
            _, pending = await asyncio.wait(runners, timeout=grace_s)
            for runner in pending:
                log.warning("task work %s did not stop within %.1f s", runner.get_name(), grace_s)
        await self.store.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[TasksExtension]:
        """``start()`` on enter, ``aclose()`` on exit (put it in the app lifespan)."""
        await self.start()
        try:
            yield self
        finally:
            await self.aclose()

    # ---------------------------------------------------------------- owner API

    def get(self, task_id: str) -> TaskRecord | None:
        return self.store.get(task_id)

    async def run_inline(
        self, name: str, arguments: Mapping[str, Any], ctx: Context[Any, Any]
    ) -> CallToolResult:
        """Run a task tool's work inside a blocking call (the synchronous path).

        Input is asked by mid-call elicitation where the session allows it; otherwise
        ``require_input`` raises ``ToolError``. Exceptions propagate to the SDK as from
        any tool (``MCPError`` -> JSON-RPC error, others -> ``isError`` result).
        """
        tool = self._tools[name]
        request_context = ctx.request_context
        handle = _InlineHandle(
            request_context,
            tool=name,
            arguments=arguments,
            client_info=_client_info(request_context),
            request=request_context.request,
        )
        return await tool.work(handle, dict(arguments))

    # ---------------------------------------------------------------- Extension API

    def methods(self) -> list[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", TaskIdParams, self._handle_get, protocol_versions=modern),
            MethodBinding(
                "tasks/update", UpdateTaskParams, self._handle_update, protocol_versions=modern
            ),
            MethodBinding(
                "tasks/cancel", TaskIdParams, self._handle_cancel, protocol_versions=modern
            ),
        ]

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        tool = self._tools.get(params.name)
        if tool is None:
            return await call_next(ctx)
        if not client_uses_tasks(ctx):
            if tool.support == "required":
                raise _missing_extension()
            return await call_next(ctx)
        if tool.prepare is not None:
            early = await tool.prepare(params, ctx)
            if early is not None:
                return early
        record = await self._create(tool, params, ctx)
        return record.create_result()

    # ---------------------------------------------------------------- tasks/*

    async def _handle_get(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> dict[str, Any]:
        return self._checked(ctx, params.task_id).detailed()

    async def _handle_update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams
    ) -> dict[str, Any]:
        record = self._checked(ctx, params.task_id)
        if record.status != "input_required":
            return {}
        answers: dict[str, dict[str, Any]] = {}
        for key, response in params.input_responses.items():
            request = record.input_requests.get(key)
            if request is None:
                continue  # never asked, already answered or withdrawn: ignored
            adapter = _RESPONSE_TYPES.get(str(request.get("method")))
            if not isinstance(response, dict) or adapter is None:
                raise MCPError(INVALID_PARAMS, f"inputResponses[{key!r}] must be an object")
            try:
                adapter.validate_python(response)
            except ValidationError:
                raise MCPError(
                    INVALID_PARAMS,
                    f"inputResponses[{key!r}] is not a valid answer to {request.get('method')}",
                ) from None
            answers[key] = cast("dict[str, Any]", response)
        if not answers:
            return {}
        try:
            accepted = await self.store.answer_input(record.task_id, answers)
        except JournalError as exc:
            raise MCPError(INTERNAL_ERROR, f"cannot record the answers: {exc}") from None
        handle = self._live.get(record.task_id)
        if handle is not None:
            handle.deliver({key: answers[key] for key in accepted})
        return {}

    async def _handle_cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> dict[str, Any]:
        record = self._checked(ctx, params.task_id)
        if record.terminal:
            return {}
        try:
            await self.store.finish(
                record.task_id, "cancelled", status_message="cancelled by the client"
            )
        except JournalError as exc:
            raise MCPError(INTERNAL_ERROR, f"cannot record the cancellation: {exc}") from None
        handle = self._live.get(record.task_id)
        if handle is not None and not handle.cancel_requested:
            handle.cancel_requested = True
            await handle._run_cancel_callbacks()
            if handle.runner is not None:
                handle.runner.cancel("the client cancelled the task")
        return {}

    def _checked(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> TaskRecord:
        """The routing header, the client's capability, then the task itself."""
        headers = getattr(ctx.request, "headers", None)
        if headers is not None:  # an HTTP request (stdio and in-memory carry no headers)
            raw = headers.get(MCP_NAME_HEADER)
            if raw is not None or self.require_name_header:
                name = decode_header_value(raw.strip()) if isinstance(raw, str) else None
                if name != task_id:
                    raise MCPError(
                        HEADER_MISMATCH,
                        f"the {MCP_NAME_HEADER} header must equal params.taskId on {ctx.method}",
                    )
        require_client_extension(ctx, TASKS_EXTENSION)
        if not self.store.is_open:
            raise MCPError(INTERNAL_ERROR, "the task store is not open")
        record = self.store.get(task_id)
        if record is None:
            # The id is the client's: quoted cut (``luftpause.shown``), and carried in
            # ``data`` only when it is short enough to be one of ours.
            raise MCPError(
                INVALID_PARAMS,
                f"unknown task {shown(task_id)} (never created here, or expired)",
                data={"taskId": task_id} if len(task_id) <= SHOWN_CHARS else None,
            )
        return record

    # ---------------------------------------------------------------- running work

    async def _create(
        self, tool: TaskTool, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any]
    ) -> TaskRecord:
        if self._closing or not self.store.is_open:
            raise MCPError(
                INTERNAL_ERROR, "the server is not accepting tasks (not started or stopping)"
            )
        try:
            record = await self.store.create(tool.name)
        except JournalError as exc:
            raise MCPError(INTERNAL_ERROR, f"cannot create the task: {exc}") from None
        responses = {
            key: value.model_dump(by_alias=True, exclude_none=True, mode="json")
            for key, value in (params.input_responses or {}).items()
        }
        handle = _StoredHandle(
            self.store,
            record,
            tool=tool.name,
            arguments=params.arguments or {},
            input_responses=responses,
            client_info=_client_info(ctx),
            request=ctx.request,
        )
        self._live[record.task_id] = handle
        runner = asyncio.create_task(
            self._run(tool, handle), name=f"task:{tool.name}:{record.task_id}"
        )
        handle.runner = runner
        runner.add_done_callback(lambda _: self._live.pop(record.task_id, None))
        return record

    async def _run(self, tool: TaskTool, handle: _StoredHandle) -> None:
        task_id = handle.task_id
        status: Literal["completed", "failed"]
        result: dict[str, Any] | None = None
        error: dict[str, Any] | None = None
        try:
            outcome = await tool.work(handle, dict(handle.arguments))
            if not isinstance(outcome, CallToolResult):
                raise TypeError(f"the work returned {type(outcome).__name__}, not CallToolResult")
            status = "completed"
            result = outcome.model_dump(by_alias=True, exclude_none=True, mode="json")
        except asyncio.CancelledError:
            if not (handle.cancel_requested or handle.shutting_down):
                with contextlib.suppress(JournalError, KeyError):
                    await self.store.finish(
                        task_id, "cancelled", status_message="the work was cancelled"
                    )
            raise
        except ToolError as exc:
            status = "completed"
            result = CallToolResult(
                content=[TextContent(type="text", text=str(exc))], is_error=True
            ).model_dump(by_alias=True, exclude_none=True, mode="json")
        except MCPError as exc:
            status = "failed"
            error = _error_dict(exc.code, exc.message, exc.data)
        except Exception as exc:
            log.exception("task %s (%s): the work raised", task_id, tool.name)
            status = "failed"
            error = _error_dict(INTERNAL_ERROR, f"the task failed: {type(exc).__name__}: {exc}")
        if handle.shutting_down:
            return
        try:
            if status == "completed":
                assert result is not None
                await self.store.finish(task_id, "completed", result=_strip_related_task(result))
            else:
                assert error is not None
                await self.store.finish(
                    task_id, "failed", error=error, status_message=str(error["message"])
                )
        except (JournalError, KeyError):
            log.exception("task %s: cannot record its end", task_id)


def client_uses_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """True when this request may get a task: 2026-07-28 and the extension declared
    in its client capabilities (never on a 2025-11-25 session)."""
    if ctx.protocol_version not in _MODERN:
        return False
    caps = ctx.session.client_capabilities
    return caps is not None and bool(caps.extensions) and TASKS_EXTENSION in (caps.extensions or {})


def _client_info(ctx: ServerRequestContext[Any, Any]) -> Implementation | None:
    params = ctx.session.client_params
    return params.client_info if params is not None else None
