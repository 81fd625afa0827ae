"""The runtime: spawning runs, the agent loop (R4-R7), approvals (R11), budgets (R10).

Run lifecycle
-------------
``spawn`` journals a ``spawn`` record (durable before the handle is returned)
and starts one asyncio task running :meth:`Runtime.drive`. A spawn with an
idempotency key that an earlier spawn used (journaled, or still under way: then
it waits for that one's outcome) gets that spawn's run, and never starts
another; with other arguments it is refused. The loop:

1. checks the subtree budgets (a turn begins);
2. sends a turn through the dataplane, offering the run's tools while it has
   tool calls left (R7: after ``maxToolCalls`` none are offered, so the model
   must answer; turns per run <= budget + 1);
3. a reply without tool calls (structured, or written as text and recovered,
   R6) ends the run ``Completed`` with the reply as its result;
4. otherwise journals the turn (``turn`` record), checks the budgets (a tool
   round begins), asks for approval where needed (state ``AwaitingApproval``),
   executes the calls (hygiene first; concurrently with ``parallelToolCalls``)
   without holding any turn slot, and journals the round (``tools`` record);
5. and goes back to 1.

A run ends ``Completed``, ``Failed`` (a turn failed for good) or ``Cancelled``
(``cancel`` or a budget). Every end is journaled and reported to the dataplane
(``DELETE /v1/runs/{id}``, R15). On shutdown the tasks are cancelled without an
end record: the journal resumes them at the next start (see ``core/apply.py``).

Cancellation of a subtree changes the state of every victim synchronously
(apply the ``end`` records) before any task is cancelled or any write awaited,
so a caller that reads the state next sees the whole subtree ended.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, StatusCode

from luftpause import telemetry
from luftpause.callers import TRUSTED, ClassDenied, KeyedCaller, Principal, served_class
from luftpause.config import RuntimeSettings
from luftpause.runtime import tracing
from luftpause.runtime.core import (
    Approval,
    AssistantMessage,
    Budget,
    End,
    PendingApproval,
    ReplayReport,
    Run,
    RunSpec,
    RunState,
    RuntimeState,
    Spawn,
    ToolMessage,
    Tools,
    Turn,
    Usage,
    apply,
    encode,
    replay,
)
from luftpause.runtime.core.apply import AnyRecord
from luftpause.runtime.core.state import owner_breach
from luftpause.runtime.hygiene import recover_text_tool_calls
from luftpause.runtime.journal import Journal
from luftpause.runtime.llm import DataplaneClient, Identity, TurnFailed
from luftpause.runtime.metrics import RuntimeMetrics
from luftpause.runtime.spawn_args import SpawnArgs, request_digest
from luftpause.runtime.upstream import ToolHub, ToolOutcome, UpstreamTool
from luftpause.runtime.watchers import Watchers
from luftpause.shown import shown, shown_list

log = logging.getLogger("luftpause.runtime")

DECLINED = "Error: the user declined this tool call"
SERVICE_CLASSES = ("interactive", "batch")


class RuntimeError_(Exception):
    """A request the runtime refuses; the message is shown to the MCP client as is."""


def check_text(label: str, values: str | list[str] | None) -> None:
    """Refuse text UTF-8 cannot encode (a lone surrogate, which ``\\ud800`` escapes in
    JSON carry): it could be neither journaled nor sent to the dataplane."""
    for value in [values] if isinstance(values, str) else values or ():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RuntimeError_(
                f"{label}: not valid Unicode (lone surrogate {value[exc.start]!r} at index "
                f"{exc.start})"
            ) from None


def _key_reused(key: str, first: str) -> str:
    return (
        f"idempotencyKey {shown(key)} was already used by {first} with other arguments: "
        "retry with the same arguments, or use a new key for a new run"
    )


def visible_to(principal: Principal, run: Run) -> bool:
    """B13: a configured caller's key sees only the runs it owns (its own spawns and
    their sub-agents); the token, and a stack without callers, see every run."""
    return not isinstance(principal, KeyedCaller) or run.owner == principal.name


def owner_for(principal: Principal, parent: Run | None) -> str | None:
    """B13: whose a new run is: the key's caller; under the token, its parent's owner (a
    sub-agent stays in its tree's hands), else nobody's (the token's)."""
    if isinstance(principal, KeyedCaller):
        return principal.name
    return parent.owner if parent is not None else None


def caller_for(principal: Principal, parent: Run | None, claimed: str) -> str:
    """The caller a new run's turns carry (R4, B13): a keyed request's is its key's
    caller; under the token, a sub-agent of a keyed caller's run inherits that run's
    caller, and any other run is the request's own (its MCP session or client name)."""
    if isinstance(principal, KeyedCaller):
        return principal.name
    if parent is not None and parent.owner is not None:
        return parent.caller
    return claimed


def class_for(principal: Principal, asked: str | None, default: str) -> tuple[str, str | None]:
    """The class a new run is served in and the class it asked for and was denied (B13).

    A class asked for (``serviceClass``) goes through :func:`luftpause.callers.served_class`:
    granted, downgraded (the denied class is returned) or ``ClassDenied``. The default
    (the parent's class, else ``interactive``) was not asked for: a caller that may not
    use it gets the class it may use, and nothing is denied."""
    if asked is not None:
        return served_class(principal, asked)
    if isinstance(principal, KeyedCaller) and default not in principal.classes:
        downgrading = dataclasses.replace(principal, on_denied_class="downgrade")
        return served_class(downgrading, default)[0], None
    return default, None


class BudgetTripped(Exception):
    """Raised in the run whose check tripped a budget; the subtree is already ended."""


@dataclass
class Runtime:
    settings: RuntimeSettings
    journal: Journal
    llm: DataplaneClient
    hub: ToolHub
    state: RuntimeState = field(default_factory=RuntimeState)
    watchers: Watchers = field(default_factory=Watchers)
    clock: Callable[[], float] = time.time
    # The live side of runs, kept out of the state (which is data only): each unfinished
    # run's task, and the answer an open approval waits for.
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _decisions: dict[str, asyncio.Future[bool]] = field(default_factory=dict)
    _spans: dict[str, Span] = field(default_factory=dict)  # each running run's invoke_agent
    replay_report: ReplayReport = field(default_factory=ReplayReport)
    metrics: RuntimeMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = RuntimeMetrics(self.state)
        self.journal.on_sync = self.metrics.fsync

    _timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    _background: set[asyncio.Task[Any]] = field(default_factory=set)
    _stopping: bool = False
    # Spawns with an idempotency key that are still under way: (owner, key) -> (the digest
    # of their arguments, the task that spawns). A second spawn with the key waits on it.
    _keyed: dict[tuple[str | None, str], tuple[str, asyncio.Task[Run]]] = field(
        default_factory=dict
    )

    # ------------------------------------------------------------------ lifecycle

    def recover(self, lines: list[tuple[int, bytes]]) -> list[Run]:
        """Replay the journal's lines (idempotent) and start every unfinished run again.

        An unreadable line fails the run it belongs to (see ``core.apply.replay``);
        each such problem is logged and kept in ``replay_report`` for ``GET /status``.
        """
        report = replay(self.state, lines)
        self.replay_report = report
        for problem in report.problems:
            log.error("journal %s: %s", self.journal.path, problem)
        resumed = [r for r in self.state.runs.values() if not r.done]
        for run in resumed:
            task = self._tasks.get(run.id)
            if task is None or task.done():
                self._start(run)
        for run in self.state.runs.values():
            self._arm_timer(run)
        done = len(self.state.runs) - len(resumed)
        log.info(
            "journal: %d finished runs, %d resumed%s",
            done,
            len(resumed),
            f", {len(report.problems)} unreadable line(s): see the errors above"
            if report.problems
            else "",
        )
        return resumed

    async def shutdown(self) -> None:
        """Stop every run without ending it (the journal resumes them) and close."""
        self._stopping = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        if self._background:
            await asyncio.wait(self._background, timeout=3.0)
        await self.journal.close()

    def _spawn_task(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        # A fresh context: a run must not inherit the MCP request's cancel scope or vars.
        task = asyncio.get_running_loop().create_task(
            coro, name=name, context=contextvars.Context()
        )
        return task

    def _background_task(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = self._spawn_task(coro, name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _start(self, run: Run) -> None:
        task = self._spawn_task(self.drive(run), f"run-{run.id}")
        self._tasks[run.id] = task
        task.add_done_callback(functools.partial(self._forget_task, run.id))

    def _forget_task(self, run_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(run_id) is task:
            del self._tasks[run_id]

    def _apply(self, record: AnyRecord) -> Run | None:
        """Apply a record to the state and wake whoever watches the run it changed."""
        run = apply(self.state, record)
        if run is not None:
            self.watchers.notify(self.state.ancestors(run))
        return run

    async def _record(self, record: AnyRecord) -> None:
        """Apply a record to the state, then make it durable."""
        self._apply(record)
        await self.journal.append(encode(record))

    # ------------------------------------------------------------------ spawn

    def offered_tools(self, spec: RunSpec) -> list[UpstreamTool]:
        """The tools a run may call: those it names, else every tool that is not
        destructive (a destructive tool is offered only to runs that name it, in
        ``tools`` or ``approveTools``; either way each call waits for approval)."""
        tools = list(self.hub.tools.values())
        named = set(spec.approve_tools)
        if spec.tools is not None:
            wanted = set(spec.tools)
            return [t for t in tools if t.name in wanted or t.remote_name in wanted]
        return [
            t
            for t in tools
            if not t.destructive_needs_approval or t.name in named or t.remote_name in named
        ]

    async def default_model(self) -> str:
        if self.settings.default_model:
            return self.settings.default_model
        try:
            models = await self.llm.models()
        except TurnFailed as exc:
            raise RuntimeError_(f"no model given and none configured; {exc}") from None
        if not models:
            raise RuntimeError_("no model given, none configured, and the dataplane lists none")
        return models[0]

    async def spawn(
        self,
        req: SpawnArgs,
        caller: str,
        traceparent: str | None = None,
        *,
        principal: Principal = TRUSTED,
    ) -> Run:
        """Start a run (or, for a known idempotency key, find it); see :meth:`spawn_or_reuse`."""
        run, _ = await self.spawn_or_reuse(req, caller, traceparent, principal=principal)
        return run

    async def spawn_or_reuse(
        self,
        req: SpawnArgs,
        caller: str,
        traceparent: str | None = None,
        *,
        harness_call: str | None = None,
        traced: bool = True,
        principal: Principal = TRUSTED,
    ) -> tuple[Run, bool]:
        """Start a run; True with the run when its idempotency key named an existing one.

        ``traceparent``: the trace context of the request that asked for it; a child
        run's span is the child of its parent's instead.

        ``harness_call``: the ID of the agent harness's tool call that asked for it (the
        request's ``_meta``, #38). A run without a parent asks the dataplane which run
        made that call and records it as its ``session``; when the request brought no
        trace context of its own (``traced`` false) the run's span joins that turn's
        trace instead. A lookup that fails records nothing and fails nothing.

        A key is the runtime's, not a caller's: every client holding the runtime's token
        is the same principal, and a caller's identity (its MCP session) does not
        survive the crash or reconnect a retry follows. The same key returns the run it
        started, journaled or replayed; while that spawn is still under way, the retry
        waits for its outcome (its run, or its error) instead of starting another.
        With other arguments (:func:`request_digest`) the key is refused.

        ``principal`` (B13): who asks. A configured caller's key spawns runs of its own
        (:func:`owner_for`, :func:`caller_for`), in a class it may use
        (:func:`class_for`), under a parent it owns; and its idempotency keys are its
        own: the same key from another caller, or from the token, is another key.
        """
        key = req.idempotency_key
        origin = (harness_call, traced)
        if key is None:
            return await self._spawn(
                req, caller, traceparent, origin=origin, principal=principal
            ), False
        parent = self.state.runs.get(req.parent) if req.parent is not None else None
        scoped = (owner_for(principal, parent), key)
        digest = request_digest(
            req,
            max_tool_calls=self.settings.default_max_tool_calls,
            max_tokens=self.settings.default_max_tokens,
        )
        # No await between these checks and registering the spawn: two calls with one
        # key cannot both get past them.
        under_way = self._keyed.get(scoped)
        if under_way is not None:
            first_digest, spawning = under_way
            if first_digest != digest:
                raise RuntimeError_(_key_reused(key, "a spawn still under way"))
            return await asyncio.shield(spawning), True
        existing = self.state.run_for_key(key, scoped[0])
        if existing is not None:
            if existing.request_digest not in (None, digest):
                raise RuntimeError_(_key_reused(key, f"run {existing.id}"))
            return existing, True
        # The whole spawn runs on its own: a caller that goes away does not take it
        # down with it while a retry may be waiting on it.
        spawning = self._background_task(
            self._spawn(
                req,
                caller,
                traceparent,
                key=key,
                digest=digest,
                origin=origin,
                principal=principal,
            ),
            "spawn-keyed",
        )
        self._keyed[scoped] = (digest, spawning)
        spawning.add_done_callback(functools.partial(self._spawned, scoped))
        return await asyncio.shield(spawning), False

    def _spawned(self, scoped: tuple[str | None, str], spawning: asyncio.Task[Run]) -> None:
        key = scoped[1]
        if self._keyed.get(scoped, (None, None))[1] is spawning:
            del self._keyed[scoped]
        if spawning.cancelled():
            return
        exc = spawning.exception()  # retrieved here: its callers, if any are left, got it too
        if exc is not None and not isinstance(exc, RuntimeError_):
            log.error("spawn with idempotencyKey %s failed: %r", shown(key), exc)

    async def _spawn(
        self,
        req: SpawnArgs,
        caller: str,
        traceparent: str | None,
        *,
        key: str | None = None,
        digest: str | None = None,
        origin: tuple[str | None, bool] = (None, True),
        principal: Principal = TRUSTED,
    ) -> Run:
        for label, text in (("task", req.task), ("model", req.model), ("system", req.system)):
            check_text(label, text)
        parent: Run | None = None
        if req.parent is not None:
            parent = self.state.runs.get(req.parent)
            if parent is None or not visible_to(principal, parent):
                raise RuntimeError_(f"unknown parent handle {shown(req.parent)}")
        if req.service_class is not None and req.service_class not in SERVICE_CLASSES:
            raise RuntimeError_(
                f"serviceClass must be 'interactive' or 'batch', got {shown(req.service_class)}"
            )
        try:
            service_class, class_denied = class_for(
                principal,
                req.service_class,
                parent.spec.service_class if parent is not None else "interactive",
            )
        except ClassDenied as exc:
            raise RuntimeError_(str(exc)) from None
        for label, names in (("tools", req.tools), ("approveTools", req.approve_tools)):
            if not names:
                continue
            if not self.hub.tools:
                await self.hub.refresh()
            known = set(self.hub.tools) | {t.remote_name for t in self.hub.tools.values()}
            unknown = [n for n in names if n not in known]
            if unknown:
                raise RuntimeError_(
                    f"{label}: unknown tool(s) {shown_list(unknown)}; available: "
                    f"{', '.join(sorted(self.hub.tools)) or '(none: no tool server is connected)'}"
                )
        model = req.model or await self.default_model()
        spec = RunSpec(
            task=req.task,
            model=model,
            service_class=service_class,
            system=req.system,
            max_tool_calls=(
                req.max_tool_calls
                if req.max_tool_calls is not None
                else self.settings.default_max_tool_calls
            ),
            tools=tuple(req.tools) if req.tools is not None else None,
            max_tokens=(
                req.max_tokens if req.max_tokens is not None else self.settings.default_max_tokens
            ),
            parallel_tool_calls=req.parallel_tool_calls,
            budget_tokens=req.budget_tokens,
            budget_tool_calls=req.budget_tool_calls,
            budget_seconds=req.budget_seconds,
            approve_tools=tuple(req.approve_tools or ()),
        )
        session: str | None = None
        harness_call, traced = origin
        if parent is None and harness_call is not None:
            found = await self.llm.tool_call_origin(harness_call)
            if found is not None:
                session = found.run_id
                if not traced and found.traceparent:
                    traceparent = found.traceparent  # one trace: the harness turn's
        run_id = f"run-{uuid.uuid4().hex[:16]}"
        record = Spawn(
            run=run_id,
            spec=spec,
            parent=parent.id if parent is not None else None,
            created=self.clock(),
            caller=caller_for(principal, parent, caller),
            traceparent=self._parent_trace(parent, traceparent),
            idempotency_key=key,
            request_digest=digest,
            session=session,
            owner=owner_for(principal, parent),
            class_denied=class_denied,
        )

        async def commit() -> Run:
            await self._record(record)
            self.metrics.runs_started.inc()
            run = self.state.runs[run_id]
            self._start(run)
            for owner in self.state.ancestors(run):  # later spawns count against older budgets
                self._arm_timer(owner)
            return run

        # Recorded means started, even if the caller goes away mid-write (a client that
        # disconnects): else the run would sit "Running" for ever with no task to drive it.
        run: Run = await asyncio.shield(self._background_task(commit(), f"spawn-{run_id}"))
        return run

    def _parent_trace(self, parent: Run | None, traceparent: str | None) -> str | None:
        span = self._spans.get(parent.id) if parent is not None else None
        if span is not None:
            return telemetry.traceparent_of(trace.set_span_in_context(span))
        return traceparent

    # ------------------------------------------------------------------ the loop

    async def drive(self, run: Run) -> None:
        with tracing.agent_span(run) as span:
            self._spans[run.id] = span
            try:
                await self._loop(run)
            except asyncio.CancelledError:
                if run.done:
                    return  # ended by cancel or a budget: already journaled
                raise  # shutdown: the journal resumes the run at the next start
            except BudgetTripped:
                return
            except TurnFailed as exc:
                await self.finish(run, RunState.FAILED, error=str(exc))
            except Exception as exc:
                log.exception("run %s crashed", run.id)
                await self.finish(run, RunState.FAILED, error=f"internal error: {exc!r}")
            finally:
                self._spans.pop(run.id, None)
                tracing.end_agent_span(span, run)

    def identity(self, run: Run) -> Identity:
        return Identity(run.id, run.spec.service_class, run.caller or "anonymous")

    async def _loop(self, run: Run) -> None:
        spec = run.spec
        while not run.done:
            seq = run.open_seq
            if seq is None:
                await self._check_budgets(run)
                offered = self.offered_tools(spec) if run.calls_made < spec.max_tool_calls else []
                body: dict[str, Any] = {"model": spec.model, "messages": run.conversation()}
                if spec.max_tokens > 0:
                    body["max_tokens"] = spec.max_tokens
                if offered:
                    body["tools"] = [t.openai_tool() for t in offered]
                    body["parallel_tool_calls"] = spec.parallel_tool_calls
                started = time.monotonic()
                with tracing.chat_span(run) as span:
                    try:
                        data = await self.llm.chat(body, self.identity(run))
                    except TurnFailed:
                        self.metrics.turn("failed")
                        raise
                    self.metrics.turn("ok")
                    elapsed = time.monotonic() - started
                    found = data.get("usage")
                    raw_usage: dict[str, Any] = found if isinstance(found, dict) else {}
                    usage = Usage(
                        turns=1,
                        prompt_tokens=int(raw_usage.get("prompt_tokens") or 0),
                        completion_tokens=int(raw_usage.get("completion_tokens") or 0),
                        turn_seconds=elapsed,
                    )
                    tracing.record_reply(span, data, usage)
                message = data["choices"][0].get("message") or {}
                seq = run.next_seq
                calls = self._tool_calls(run, seq, message, offered)
                if not calls:
                    content = message.get("content")
                    await self.finish(
                        run,
                        RunState.COMPLETED,
                        result=content if isinstance(content, str) else "",
                        usage=usage,
                    )
                    return
                left = spec.max_tool_calls - run.calls_made
                if len(calls) > left:
                    log.info(
                        "run %s: reply asked for %d calls, %d left in its budget; extra "
                        "calls dropped",
                        run.id,
                        len(calls),
                        left,
                    )
                    calls = calls[:left]
                assistant: dict[str, Any] = {
                    "role": "assistant",
                    "content": message.get("content") if message.get("tool_calls") else None,
                    "tool_calls": calls,
                }
                await self._record(
                    Turn(
                        run=run.id,
                        seq=seq,
                        message=AssistantMessage.model_validate(assistant),
                        usage=usage,
                    )
                )
            calls = list(run.turns[seq].get("tool_calls") or [])
            await self._check_budgets(run, new_tool_calls=len(calls))
            results, usage = await self._round(run, seq, calls)
            if run.done:
                return
            await self._record(
                Tools(
                    run=run.id,
                    seq=seq,
                    results=tuple(ToolMessage.model_validate(m) for m in results),
                    usage=usage,
                )
            )

    def _tool_calls(
        self, run: Run, seq: int, message: dict[str, Any], offered: list[UpstreamTool]
    ) -> list[dict[str, Any]]:
        """The reply's tool calls in structured form (recovered from text if need be)."""
        if not offered:
            return []  # R7: no tools offered, so whatever the model wrote is its answer
        calls: list[dict[str, Any]] = []
        for i, call in enumerate(message.get("tool_calls") or []):
            if not isinstance(call, dict):
                continue
            found = call.get("function")
            fn: dict[str, Any] = found if isinstance(found, dict) else {}
            args = fn.get("arguments")
            calls.append(
                {
                    "id": str(call.get("id") or f"call_{run.id}_{seq}_{i}"),
                    "type": "function",
                    "function": {
                        "name": str(fn.get("name") or ""),
                        "arguments": args if isinstance(args, str) else json.dumps(args or {}),
                    },
                }
            )
        if calls:
            return calls
        recovered = recover_text_tool_calls(message.get("content"), [t.name for t in offered])
        if recovered:
            log.info("run %s: recovered %d tool call(s) written as text", run.id, len(recovered))
        return [
            {
                "id": f"call_{run.id}_{seq}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for i, c in enumerate(recovered)
        ]

    def _needs_approval(self, run: Run, tool: UpstreamTool) -> bool:
        named = set(run.spec.approve_tools)
        return tool.destructive_needs_approval or tool.name in named or tool.remote_name in named

    async def _round(
        self, run: Run, seq: int, calls: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], Usage]:
        offered = {t.name: t for t in self.offered_tools(run.spec)}
        outcomes: list[ToolOutcome | None] = [None] * len(calls)
        planned: list[tuple[int, UpstreamTool, dict[str, Any]]] = []
        for i, call in enumerate(calls):
            name = call["function"]["name"]
            tool = offered.get(name)
            if tool is None:
                self.metrics.tool_call("refused")
                outcomes[i] = ToolOutcome(
                    f"Error: there is no tool named {name!r}; available tools: "
                    f"{', '.join(offered) or 'none'}",
                    True,
                )
                continue
            check = tool.check(call["function"]["arguments"])
            if check.refusal is not None or check.arguments is None:
                self.metrics.tool_call("refused")
                outcomes[i] = ToolOutcome(check.refusal or "Error: invalid arguments", True)
                continue
            planned.append((i, tool, check.arguments))
        # Approvals one at a time, in call order, before anything runs.
        runnable: list[tuple[int, UpstreamTool, dict[str, Any]]] = []
        for i, tool, args in planned:
            if self._needs_approval(run, tool):
                allow = await self.request_approval(run, f"{seq}:{i}", tool.name, args)
                if not allow:
                    self.metrics.tool_call("declined")
                    outcomes[i] = ToolOutcome(DECLINED, True)
                    continue
            runnable.append((i, tool, args))
        durations: list[float] = []

        async def execute(i: int, tool: UpstreamTool, args: dict[str, Any]) -> None:
            started = time.monotonic()
            with tracing.tool_span(tool.name, str(calls[i]["id"])) as span:
                outcome = await self.hub.call(tool, args)
                if outcome.is_error:
                    span.set_status(StatusCode.ERROR, outcome.text[:200])
            self.metrics.tool_call("error" if outcome.is_error else "ok")
            outcomes[i] = outcome
            durations.append(time.monotonic() - started)

        if run.spec.parallel_tool_calls and len(runnable) > 1:
            await asyncio.gather(*(execute(i, t, a) for i, t, a in runnable))
        else:
            for i, tool, args in runnable:
                await execute(i, tool, args)
        results = []
        failed = 0
        for call, outcome in zip(calls, outcomes, strict=True):
            assert outcome is not None
            failed += outcome.is_error
            results.append({"role": "tool", "tool_call_id": call["id"], "content": outcome.text})
        usage = Usage(tool_calls=len(calls), failed_tool_calls=failed, tool_seconds=sum(durations))
        return results, usage

    # ------------------------------------------------------------------ approvals

    async def request_approval(
        self, run: Run, key: str, tool: str, arguments: dict[str, Any]
    ) -> bool:
        """Wait for the user's decision on one call (reused when already journaled)."""
        if key in run.approvals:
            return run.approvals[key]
        decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        pending = PendingApproval(key, tool, arguments)
        self._decisions[run.id] = decided
        self.state.ask(run, pending)
        self.watchers.notify(self.state.ancestors(run))
        try:
            return await decided
        finally:
            if self._decisions.get(run.id) is decided:
                del self._decisions[run.id]
            if run.pending is pending:
                self.state.stop_asking(run, pending)
                self.watchers.notify(self.state.ancestors(run))

    def decision(self, run: Run) -> asyncio.Future[bool] | None:
        """The answer the run's open approval waits for (None when none is open)."""
        return self._decisions.get(run.id)

    async def decide_approval(self, run: Run, allow: bool, key: str | None = None) -> None:
        pending = run.pending
        if run.done:
            raise RuntimeError_(f"run {run.id} has already ended ({run.state.value})")
        if pending is None or (key is not None and pending.key != key):
            raise RuntimeError_(f"run {run.id} is not waiting for an approval")
        decided = self._decisions.get(run.id)
        if pending.key in run.approvals or decided is None or decided.done():
            raise RuntimeError_(f"run {run.id}: this tool call was already answered")
        record = Approval(
            run=run.id, key=pending.key, tool=pending.tool, arguments=pending.arguments, allow=allow
        )

        async def commit() -> None:
            await self._record(record)
            if not decided.done():
                decided.set_result(allow)

        # Once recorded, the answer must reach the run even if the caller goes away (a
        # client that disconnects mid-call): else the run waits for ever on a call
        # that every later answer is told was "already answered".
        await asyncio.shield(self._background_task(commit(), f"approval-{run.id}"))

    # ------------------------------------------------------------------ ending

    def _end_now(
        self,
        run: Run,
        state: RunState,
        *,
        result: str | None = None,
        error: str | None = None,
        usage: Usage | None = None,
    ) -> End | None:
        """End the run in memory at once; the returned record still has to be written."""
        if run.done:
            return None
        record = End(
            run=run.id,
            state=state,
            result=result,
            error=error,
            usage=usage or Usage(),
            time=self.clock(),
        )
        self._apply(record)
        decided = self._decisions.pop(run.id, None)
        if decided is not None and not decided.done():
            decided.cancel()
        task = self._tasks.get(run.id)
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()
        for owner in self.state.ancestors(run):  # the last run of a subtree frees its timer
            self._disarm_timer(owner)
        self._background_task(self.llm.end_run(run.id), f"end-{run.id}")
        return record

    async def finish(
        self,
        run: Run,
        state: RunState,
        *,
        result: str | None = None,
        error: str | None = None,
        usage: Usage | None = None,
    ) -> None:
        record = self._end_now(run, state, result=result, error=error, usage=usage)
        if record is not None:
            await self.journal.append(encode(record))

    async def cancel_tree(self, run: Run, reason: str) -> list[str]:
        """End every unfinished run in the subtree as ``Cancelled`` with ``reason``."""
        records = []
        ended = []
        for victim in list(self.state.descendants(run)):
            record = self._end_now(victim, RunState.CANCELLED, error=reason)
            if record is not None:
                records.append(record)
                ended.append(victim.id)
        await asyncio.gather(*(self.journal.append(encode(r)) for r in records))
        return ended

    # ------------------------------------------------------------------ budgets

    async def _check_budgets(self, run: Run, *, new_tool_calls: int = 0) -> None:
        breach = self.state.budget_breach(run, self.clock(), new_tool_calls=new_tool_calls)
        if breach is None:
            return
        owner, message = breach
        await self.trip(owner, message)
        raise BudgetTripped(message)

    async def trip(self, owner: Run, message: str) -> None:
        """The budget ``owner`` holds is exceeded: record it and cancel the subtree."""
        if owner.budget_exceeded is None:
            log.info("run %s: %s", owner.id, message)
            record = Budget(run=owner.id, message=message)
            self._apply(record)
            writes = [self.journal.append(encode(record))]
        else:
            writes = []
        await asyncio.gather(*writes, self.cancel_tree(owner, message))

    def _arm_timer(self, run: Run) -> None:
        """R10: a seconds budget trips even when nothing in the subtree is doing work."""
        seconds = run.spec.budget_seconds
        if seconds is None or run.budget_exceeded is not None or self._stopping:
            return
        if run.id in self._timers:
            return
        if all(r.done for r in self.state.descendants(run)):
            return
        delay = max(0.0, run.created + seconds - self.clock())
        loop = asyncio.get_running_loop()
        self._timers[run.id] = loop.call_later(delay, self._on_timer, run.id)

    def _disarm_timer(self, run: Run) -> None:
        # The owner's timer stays armed while any of its descendants still runs.
        if run.spec.budget_seconds is None:
            return
        if all(r.done for r in self.state.descendants(run)):
            handle = self._timers.pop(run.id, None)
            if handle is not None:
                handle.cancel()

    def _on_timer(self, run_id: str) -> None:
        self._timers.pop(run_id, None)
        owner = self.state.runs.get(run_id)
        if owner is None or owner.budget_exceeded is not None:
            return
        if all(r.done for r in self.state.descendants(owner)):
            return
        message = owner_breach(owner, self.clock())
        if message is None:  # clock skew: not yet; look again shortly
            self._timers[run_id] = asyncio.get_running_loop().call_later(
                0.05, self._on_timer, run_id
            )
            return
        self._background_task(self.trip(owner, message), f"budget-{run_id}")

    # ------------------------------------------------------------------ views

    def run_json(self, run: Run) -> dict[str, Any]:
        now = self.clock()
        out: dict[str, Any] = {
            "handle": run.id,
            "state": run.state.value,
            "parent": run.parent,
            "session": run.session,
            "children": list(run.children),
            "model": run.spec.model,
            "serviceClass": run.spec.service_class,
            **({"classDenied": run.class_denied} if run.class_denied is not None else {}),
            "result": run.result,
            "error": run.error,
            "turns": run.own.turns,
            "toolCalls": run.own.tool_calls,
            "failedToolCalls": run.own.failed_tool_calls,
            "usage": run.own.to_json(),
            "elapsedSeconds": round((run.ended or now) - run.created, 3),
        }
        if run.children:
            out["subtree"] = run.subtree.to_json()
        if run.pending is not None:
            out["pendingApproval"] = run.pending.to_json()
        budget = self.state.budget_json(run, now)
        if budget is not None:
            out["budget"] = budget
        return out
