"""The runtime's MCP tools (R1-R3, R9, R11, R13): what each one does.

Callers bound to keys (B13): a call made with a configured caller's key
(:func:`~luftpause.runtime.protocol.principal_of`) spawns runs of that caller, in a
class it may use (a class it asked for and may not use is downgraded, and the answer
says ``classDenied``, or refused, per caller), and sees only its own runs: every tool
that names a run answers another caller's as it answers a handle that does not exist,
and ``status`` lists its own. The token sees every run.

Each tool is a method of :class:`RuntimeTools`; :meth:`RuntimeTools.register`
adds them to an ``MCPServer`` with their descriptions and annotations. How a
call waits and asks its client for approvals lives in ``protocol.py``; the
arguments of ``spawn`` and ``run`` are :class:`~luftpause.runtime.spawn_args.SpawnArgs`.
"""

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, InputRequiredResult, ToolAnnotations
from pydantic import Field, ValidationError

from luftpause import telemetry
from luftpause.callers import TRUSTED, KeyedCaller, Principal
from luftpause.runtime import tracing
from luftpause.runtime.core import Run
from luftpause.runtime.decide import decide as run_decide
from luftpause.runtime.loop import Runtime, RuntimeError_, class_for, visible_to
from luftpause.runtime.mcp_tasks import TaskHandle, TasksExtension, elicitation_request
from luftpause.runtime.protocol import (
    APPROVAL_SCHEMA,
    APPROVE_KEY_PREFIX,
    Waiter,
    allow_from,
    approval_hint,
    approval_message,
    awaiting_approval,
    caller_named,
    caller_of,
    describe_argument_errors,
    harness_call_id,
    principal_in,
    principal_of,
    request_state_of,
    tool_result,
)
from luftpause.runtime.spawn_args import SpawnArgs, spawn_args_from, spawn_parameters
from luftpause.shown import shown_list

log = logging.getLogger("luftpause.runtime.tools")

MAX_HANDLES = 1000
STATUS_LIST_LIMIT = 200

INSTRUCTIONS = (
    "Run sub-agents on local models. `spawn` starts one and returns a handle at once; "
    "spawn several, then `await` them together (fan-out is much faster than one after "
    "another). `run` does spawn+await in one blocking call. `tools` lists what "
    "sub-agents can use; `status`, `cancel` and `approve` manage runs; `decide` "
    "classifies a text in one cheap step."
)

SPAWN_DESCRIPTION = (
    "Start a sub-agent on a local model and return its handle immediately (it runs in "
    "the background; collect it with `await`). The sub-agent loops: model turn, tool "
    "calls to the tools `tools` lists, until it answers or its tool budget is spent. "
    "Spawn several before awaiting to run them in parallel. Use `parent` to build a "
    "tree, budget* to cap a whole subtree. Give an `idempotencyKey` to make a retry safe: "
    "the same key returns the same run (`reused: true`) instead of starting another."
)
APPROVALS = (
    " A tool call that needs the user's approval is asked here when the client supports "
    "elicitation; otherwise the call returns at once with `awaitingApproval` (handle, tool, "
    "arguments): show it to the user, answer with `approve(handle, allow)`, then `await` "
    "again."
)
AWAIT_DESCRIPTION = (
    "Wait for sub-agents started with `spawn`. mode 'all' (default) returns when every "
    "handle has finished, 'any' when one has. Returns each run's state, result, "
    "toolCalls and failedToolCalls; at the timeout (default 60 s, max 600 s) it returns "
    "the current state, so call it again to keep waiting." + APPROVALS
)
RUN_DESCRIPTION = (
    "Start a sub-agent and wait until it finishes (spawn + await in one call). "
    "Takes the same arguments as `spawn`, plus `timeout`; returns the run's result, "
    "toolCalls and failedToolCalls, or at the timeout its current state and handle, to "
    "`await` on. Prefer spawn + await for several sub-agents at once." + APPROVALS + " "
    "A client that declared the MCP Tasks extension gets a task instead: poll tasks/get; "
    "approvals show as input_required, answered with tasks/update."
)


class RuntimeTools:
    """The tools of one runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    # ------------------------------------------------------------------ helpers

    def lookup(self, handles: list[str], principal: Principal = TRUSTED) -> list[Run]:
        """The runs ``handles`` name; a run ``principal`` may not see is unknown (B13)."""
        runs = self.rt.state.runs
        missing = [
            h for h in dict.fromkeys(handles) if h not in runs or not visible_to(principal, runs[h])
        ]
        if missing:
            raise ToolError(f"unknown handle(s): {shown_list(missing)}")
        return [runs[h] for h in dict.fromkeys(handles)]

    def _clamped(self, timeout: float) -> tuple[float, str | None]:
        """R3: a wait longer than the maximum is cut to it, and the answer says so."""
        most = self.rt.settings.await_max_s
        if timeout <= most:
            return timeout, None
        return most, f"timeout {timeout:g} s clamped to the maximum of {most:g} s"

    async def do_spawn(self, args: SpawnArgs, ctx: Context[Any, Any]) -> tuple[Run, bool]:
        """The run (started, or found by its idempotency key: then True)."""
        meta: Mapping[str, Any] | None = ctx.request_context.meta
        traceparent = tracing.request_traceparent(meta, ctx.headers)
        try:
            return await self.rt.spawn_or_reuse(
                args,
                caller_of(ctx),
                traceparent,
                harness_call=harness_call_id(meta) if args.parent is None else None,
                traced=tracing.brings_trace(meta, ctx.headers),
                principal=principal_of(ctx),
            )
        except RuntimeError_ as exc:
            raise ToolError(str(exc)) from None

    # ------------------------------------------------------------------ tools

    async def spawn(self, ctx: Context[Any, Any], **arguments: Any) -> CallToolResult:
        run, reused = await self.do_spawn(spawn_args_from(arguments), ctx)
        payload: dict[str, Any] = {
            "handle": run.id,
            "state": run.state.value,
            "model": run.spec.model,
            "serviceClass": run.spec.service_class,
            "parent": run.parent,
            "session": run.session,
        }
        if run.class_denied is not None:  # B13: asked for a class its key may not use
            payload["classDenied"] = run.class_denied
        if reused:
            payload["reused"] = True  # an earlier spawn with this idempotencyKey started it
        return tool_result(payload)

    async def await_(
        self,
        handles: list[str],
        ctx: Context[Any, Any],
        mode: str,
        timeout: float,  # noqa: ASYNC109 - the spec's parameter name (R3)
    ) -> CallToolResult | InputRequiredResult:
        principal = principal_of(ctx)
        runs = self.lookup(handles, principal)
        timeout, note = self._clamped(timeout)
        state = request_state_of(ctx)
        deadline = float(state.get("deadline") or (time.time() + timeout))
        waiter = Waiter(
            self.rt, ctx, runs, mode, deadline, set(state.get("asked") or ()), principal
        )
        await waiter.apply_responses(ctx.input_responses)
        outcome = await waiter.wait()
        if isinstance(outcome, InputRequiredResult):
            return outcome
        payload: dict[str, Any] = {
            "mode": mode,
            "finished": waiter.finished(),
            "timedOut": not waiter.finished() and time.time() >= deadline,
            "results": [self.rt.run_json(r) for r in runs],
        }
        _add_approvals(self.rt, runs, payload)
        if note:
            payload["note"] = note
        return tool_result(payload)

    async def run(
        self,
        ctx: Context[Any, Any],
        timeout: float,  # noqa: ASYNC109 - as await's
        **arguments: Any,
    ) -> CallToolResult | InputRequiredResult:
        rt = self.rt
        timeout, note = self._clamped(timeout)
        state = request_state_of(ctx)
        handle = state.get("handle")
        started = handle if isinstance(handle, str) else None
        principal = principal_of(ctx)
        earlier = rt.state.runs.get(started) if started is not None else None
        if earlier is not None and visible_to(principal, earlier):
            the_run = earlier  # a retry after an input-required round
        else:
            the_run, _ = await self.do_spawn(spawn_args_from(arguments), ctx)
        deadline = float(state.get("deadline") or (time.time() + timeout))
        waiter = Waiter(
            rt, ctx, [the_run], "all", deadline, set(state.get("asked") or ()), principal
        )
        await waiter.apply_responses(ctx.input_responses)
        outcome = await waiter.wait()
        if isinstance(outcome, InputRequiredResult):
            return waiter.input_required(waiter.covered_pending(), {"handle": the_run.id})
        payload = rt.run_json(the_run)
        payload["finished"] = the_run.done
        payload["timedOut"] = not the_run.done and time.time() >= deadline
        _add_approvals(rt, [the_run], payload)
        if not the_run.done and "next" not in payload:
            payload["next"] = (
                f"the run is still going: call await with handles=[{the_run.id!r}] to keep waiting"
            )
        if note:
            payload["note"] = note
        return tool_result(payload)

    async def run_task(self, handle: TaskHandle, arguments: dict[str, Any]) -> CallToolResult:
        """``run`` as an MCP task (R12): spawn, then follow the run until it ends.

        Each tool call in the run's tree that waits for approval becomes one input
        request of the task (``input_required``); its answer (``tasks/update``) is
        journaled like any other. An approval answered some other way (``approve``)
        withdraws its request. ``tasks/cancel`` cancels the run's tree. When the
        runtime stops, the task is left open (it fails on restart) and the run is
        not touched: it resumes from the journal.
        """
        rt = self.rt
        try:
            args = SpawnArgs.model_validate(
                {k: v for k, v in arguments.items() if k != "timeout"}, by_alias=True
            )
        except ValidationError as exc:
            raise ToolError(describe_argument_errors("run", exc)) from None
        started: list[Run] = []

        async def cancel_tree() -> None:
            for run in started:
                await rt.cancel_tree(run, "cancelled by the client (tasks/cancel)")

        # Registered before the spawn: a cancel that arrives while the spawn is being
        # journaled must still end the run the spawn starts.
        handle.on_cancel(cancel_tree)
        spawning = asyncio.ensure_future(
            rt.spawn(
                args,
                caller_named(handle.client_info),
                telemetry.traceparent_of(),
                principal=principal_in(handle.request),
            )
        )
        try:
            the_run = await asyncio.shield(spawning)
        except RuntimeError_ as exc:
            raise ToolError(str(exc)) from None
        except asyncio.CancelledError:
            if handle.cancel_requested:  # the spawn still completes: end what it started
                with contextlib.suppress(Exception):
                    await rt.cancel_tree(await spawning, "cancelled by the client (tasks/cancel)")
            raise
        started.append(the_run)
        await handle.attach(the_run.id)
        askers: dict[tuple[str, str], asyncio.Task[None]] = {}
        asked: set[tuple[str, str]] = set()  # asked once: an answer of "cancel" leaves approve()
        event = asyncio.Event()
        rt.watchers.watch([the_run.id], event)
        try:
            while not the_run.done:
                event.clear()
                waiting = {
                    (r.id, r.pending.key): r
                    for r in rt.state.descendants(the_run)
                    if r.pending is not None and not r.done
                }
                for key, asker in list(askers.items()):
                    if key not in waiting or asker.done():
                        asker.cancel()
                        del askers[key]
                for key, run in waiting.items():
                    if key not in asked:
                        asked.add(key)
                        askers[key] = asyncio.create_task(
                            self._ask_in_task(handle, run, len(asked))
                        )
                await event.wait()
        finally:
            rt.watchers.unwatch([the_run.id], event)
            for asker in askers.values():
                asker.cancel()
            await asyncio.gather(*askers.values(), return_exceptions=True)
        payload = rt.run_json(the_run)
        payload["finished"] = True
        return tool_result(payload)

    async def _ask_in_task(self, handle: TaskHandle, run: Run, nonce: int) -> None:
        pending = run.pending
        if pending is None:
            return
        # Keys are unique over a task's life, so each carries the number of the asking.
        key = f"{APPROVE_KEY_PREFIX}{run.id}/{pending.key}/{nonce}"
        try:
            answers = await handle.require_input(
                {key: elicitation_request(approval_message(run), APPROVAL_SCHEMA)}
            )
        except Exception:  # e.g. the task journal cannot be written: approve() still works
            log.exception("run %s: cannot ask for approval through its task", run.id)
            return
        allow = allow_from(answers.get(key))
        if allow is not None and run.pending is pending:
            with contextlib.suppress(RuntimeError_):
                await self.rt.decide_approval(run, allow, pending.key)

    async def status(self, handle: str | None, principal: Principal = TRUSTED) -> CallToolResult:
        if handle is not None:
            return tool_result(self.rt.run_json(self.lookup([handle], principal)[0]))
        runs = sorted(
            (r for r in self.rt.state.runs.values() if visible_to(principal, r)),
            key=lambda r: r.created,
            reverse=True,
        )
        counts: dict[str, int] = {}
        for r in runs:
            counts[r.state.value] = counts.get(r.state.value, 0) + 1
        listed = [
            {
                "handle": r.id,
                "state": r.state.value,
                "parent": r.parent,
                "session": r.session,
                "children": len(r.children),
                "task": r.spec.task[:80],
            }
            for r in runs[:STATUS_LIST_LIMIT]
        ]
        return tool_result({"total": len(runs), "byState": counts, "runs": listed})

    async def cancel(self, handle: str, principal: Principal = TRUSTED) -> CallToolResult:
        target = self.lookup([handle], principal)[0]
        cancelled = await self.rt.cancel_tree(target, "cancelled by the client")
        return tool_result(
            {"handle": target.id, "cancelled": cancelled, "state": target.state.value}
        )

    async def approve(
        self, handle: str, allow: bool, principal: Principal = TRUSTED
    ) -> CallToolResult:
        target = self.lookup([handle], principal)[0]
        pending = target.pending
        if pending is None:
            raise ToolError(
                f"run {target.id} is not waiting for an approval (state {target.state.value})"
            )
        try:
            await self.rt.decide_approval(target, allow, pending.key)
        except RuntimeError_ as exc:
            raise ToolError(str(exc)) from None
        return tool_result({"handle": target.id, "tool": pending.tool, "allowed": allow})

    async def tools(self) -> CallToolResult:
        hub = self.rt.hub
        await hub.refresh()
        return tool_result(
            {"tools": [t.to_json() for t in hub.tools.values()], "servers": hub.status()}
        )

    async def decide(
        self, input: str, ctx: Context[Any, Any], labels: list[str] | None, model: str | None
    ) -> CallToolResult:
        principal = principal_of(ctx)
        # B13: decide's turn is interactive where the caller may use it (not asked for).
        service_class, _ = class_for(principal, None, "interactive")
        caller = principal.name if isinstance(principal, KeyedCaller) else caller_of(ctx)
        try:
            payload = await run_decide(self.rt, input, labels, model, caller, service_class)
        except RuntimeError_ as exc:
            raise ToolError(str(exc)) from None
        return tool_result(payload)

    # ------------------------------------------------------------------ registration

    def register(self, mcp: MCPServer[Any], tasks: TasksExtension | None = None) -> None:
        """Add every tool to ``mcp`` with its schema, description and annotations; with
        ``tasks`` (mounted on ``mcp``), ``run`` is also a task tool."""
        if tasks is not None:
            tasks.task_tool("run", self.run_task)
        settings = self.rt.settings
        await_default = settings.await_timeout_s
        spawn_params = spawn_parameters(
            max_tool_calls=settings.default_max_tool_calls,
            max_tokens=settings.default_max_tokens,
        )
        mcp.add_tool(
            _with_spawn_signature(self.spawn, spawn_params),
            name="spawn",
            description=SPAWN_DESCRIPTION,
            annotations=ToolAnnotations(
                title="Spawn sub-agent",
                read_only_hint=False,
                destructive_hint=False,
                open_world_hint=True,
            ),
            structured_output=False,
        )

        async def await_(
            handles: Annotated[
                list[str],
                Field(min_length=1, max_length=MAX_HANDLES, description="Handles from `spawn`."),
            ],
            ctx: Context[Any, Any],
            mode: Annotated[
                Literal["all", "any"],
                Field(description="'all': wait for every run; 'any': for the first to finish."),
            ] = "all",
            timeout: Annotated[  # noqa: ASYNC109 - the spec's parameter name (R3)
                float,
                Field(
                    gt=0,
                    description=f"Seconds to wait (default {await_default:g}, max "
                    f"{settings.await_max_s:g}; larger values are clamped).",
                ),
            ] = await_default,
        ) -> CallToolResult | InputRequiredResult:
            return await self.await_(handles, ctx, mode, timeout)

        mcp.add_tool(
            await_,
            name="await",
            description=AWAIT_DESCRIPTION,
            annotations=ToolAnnotations(
                title="Await sub-agents", read_only_hint=True, open_world_hint=False
            ),
            structured_output=False,
        )
        run_timeout = inspect.Parameter(
            "timeout",
            inspect.Parameter.KEYWORD_ONLY,
            default=await_default,
            annotation=Annotated[
                float,
                Field(
                    gt=0,
                    description=f"Seconds to wait for the run to finish (default "
                    f"{await_default:g}, max {settings.await_max_s:g}); then the call returns "
                    "the run's current state and its handle, to `await` on.",
                ),
            ],
        )
        mcp.add_tool(
            _with_spawn_signature(self.run, [*spawn_params, run_timeout]),
            name="run",
            description=RUN_DESCRIPTION,
            annotations=ToolAnnotations(
                title="Run sub-agent",
                read_only_hint=False,
                destructive_hint=False,
                open_world_hint=True,
            ),
            structured_output=False,
        )

        async def status(
            handle: Annotated[
                str | None, Field(description="A run handle; omit for all runs.")
            ] = None,
            *,
            ctx: Context[Any, Any],
        ) -> CallToolResult:
            return await self.status(handle, principal_of(ctx))

        mcp.add_tool(
            status,
            name="status",
            description=(
                "Show runs. With a handle: that run's state, parent and children, its own usage "
                "and its subtree's, budget limits/used/exceeded, and any pending approval. "
                "Without: a summary of all runs (most recent first)."
            ),
            annotations=ToolAnnotations(title="Run status", read_only_hint=True),
            structured_output=False,
        )

        async def cancel(
            handle: Annotated[str, Field(min_length=1, description="The run to cancel.")],
            ctx: Context[Any, Any],
        ) -> CallToolResult:
            return await self.cancel(handle, principal_of(ctx))

        mcp.add_tool(
            cancel,
            name="cancel",
            description=(
                "Cancel a run and all its running descendants. Returns the handles that were "
                "cancelled (runs that had already finished are left as they are)."
            ),
            annotations=ToolAnnotations(
                title="Cancel run",
                destructive_hint=True,
                read_only_hint=False,
                idempotent_hint=True,
            ),
            structured_output=False,
        )

        async def approve(
            handle: Annotated[str, Field(min_length=1, description="The waiting run.")],
            allow: Annotated[bool, Field(description="true to allow the call, false to decline")],
            ctx: Context[Any, Any],
        ) -> CallToolResult:
            return await self.approve(handle, allow, principal_of(ctx))

        mcp.add_tool(
            approve,
            name="approve",
            description=(
                "Answer a sub-agent's pending tool-call approval (state AwaitingApproval; see "
                "its pendingApproval in `status`/`await`). allow=false makes the sub-agent see "
                "that the user declined the call."
            ),
            annotations=ToolAnnotations(
                title="Approve tool call", read_only_hint=False, destructive_hint=False
            ),
            structured_output=False,
        )

        async def tools() -> CallToolResult:
            return await self.tools()

        mcp.add_tool(
            tools,
            name="tools",
            description=(
                "List the tools sub-agents can call (from the configured MCP tool servers), "
                "with their input schemas and whether calls need the user's approval."
            ),
            annotations=ToolAnnotations(title="Sub-agent tools", read_only_hint=True),
            structured_output=False,
        )

        async def decide(
            input: Annotated[str, Field(min_length=1, description="The text to classify.")],
            ctx: Context[Any, Any],
            labels: Annotated[
                list[str] | None,
                Field(description="2-20 candidate labels; omit to use the classifier model."),
            ] = None,
            model: Annotated[str | None, Field(description="Model to use.")] = None,
        ) -> CallToolResult:
            return await self.decide(input, ctx, labels, model)

        mcp.add_tool(
            decide,
            name="decide",
            description=(
                "Classify a text in one cheap step. Without labels: the classifier model's "
                "label. With 2-20 labels: one 1-token turn on a generative model scores each "
                "label by the probability of its first token. Returns label, probabilities "
                "and unscored (labels the model gave no probability)."
            ),
            annotations=ToolAnnotations(title="Decide", read_only_hint=True),
            structured_output=False,
        )


def _add_approvals(rt: Runtime, runs: list[Run], payload: dict[str, Any]) -> None:
    """R11: the calls waiting for the user, at top level, and what to do about them."""
    pending = awaiting_approval(rt, runs)
    if pending:
        payload["awaitingApproval"] = pending
        payload["next"] = approval_hint(pending)


def _with_spawn_signature(
    method: Callable[..., Awaitable[Any]], params: list[inspect.Parameter]
) -> Callable[..., Awaitable[Any]]:
    """A tool function taking ``ctx`` and SpawnArgs' parameters, calling ``method``."""

    async def tool(ctx: Context[Any, Any], **arguments: Any) -> Any:
        return await method(ctx, **arguments)

    ctx_param = inspect.Parameter(
        "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context[Any, Any]
    )
    tool.__signature__ = inspect.Signature([ctx_param, *params])  # type: ignore[attr-defined]
    tool.__name__ = method.__name__
    return tool
