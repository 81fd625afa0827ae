"""The runtime's MCP tools (R1-R3, R9, R11, R13) and its HTTP app (``/mcp``, ``/status``).

The endpoint is stateful Streamable HTTP, so it serves both protocol eras:
2025-11-25 clients get a session (``initialize``), 2026-07-28 clients send
self-contained requests that the SDK routes by their ``MCP-Protocol-Version``.

Caller identity (R4): the ``Mcp-Session-Id`` of a legacy session; a modern
request has no session, so its caller is its ``clientInfo`` name (or
``anonymous``).

Approval flow per era (R11). A run waiting for approval is *covered* by an
``await``/``run`` call that names it or one of its ancestors.

* Legacy session whose client declared ``elicitation``: the covering call
  sends ``elicitation/create`` (a form with one boolean ``allow``) in the middle
  of the call and goes on waiting once it is answered (``accept`` with
  ``allow``, or ``decline`` = deny; ``cancel`` leaves the call open to
  ``approve``).
* Modern request whose client declared ``elicitation``: the covering call
  returns an ``InputRequiredResult`` whose ``input_requests`` hold the same form
  (key ``approve/<handle>/<call>``); the client retries the call with its
  ``input_responses``, which are applied before the call goes on waiting. The
  ``request_state`` carries the call's deadline, what was asked already and, for
  ``run``, the handle of the run it started, so a retry never spawns twice.
* Anyone, any era: ``approve(handle, allow)``. A covering call whose client
  cannot be asked returns at once with the run's ``pendingApproval``, instead of
  sitting out its timeout.

Every answer is journaled before the run goes on.
"""

import asyncio
import contextlib
import hmac
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    TextContent,
    ToolAnnotations,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from luftpause.runtime.core import Run
from luftpause.runtime.decide import decide as run_decide
from luftpause.runtime.loop import Runtime, RuntimeError_, SpawnRequest
from luftpause.runtime.status import status_tree

log = logging.getLogger("luftpause.runtime.server")

MCP_PATH = "/mcp"
MAX_HANDLES = 1000
STATUS_LIST_LIMIT = 200
APPROVE_KEY_PREFIX = "approve/"

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class ApprovalForm(BaseModel):
    allow: bool = Field(description="Allow the sub-agent to make this tool call?")


APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "allow": {
            "type": "boolean",
            "title": "Allow",
            "description": "Allow the sub-agent to make this tool call?",
        }
    },
    "required": ["allow"],
}


def _result(payload: dict[str, Any]) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(payload, ensure_ascii=False))],
        structured_content=payload,
    )


def caller_of(ctx: Context[Any, Any]) -> str:
    headers = ctx.headers
    if headers is not None:
        session = headers.get("mcp-session-id")
        if session:
            return session
    params = ctx.session.client_params
    info = getattr(params, "client_info", None) if params is not None else None
    name = getattr(info, "name", None)
    # The caller travels in the x-luftpause-caller header: printable ASCII only.
    safe = "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in str(name or "")).strip()
    return f"client:{safe}" if safe else "anonymous"


def _is_modern(ctx: Context[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _declares_elicitation(ctx: Context[Any, Any]) -> bool:
    caps = ctx.client_capabilities
    return caps is not None and caps.elicitation is not None


def _approval_message(run: Run) -> str:
    pending = run.pending
    assert pending is not None
    args = json.dumps(pending.arguments, ensure_ascii=False)
    return (
        f"Sub-agent {run.id} wants to call the tool {pending.tool!r} with arguments {args}. "
        "Allow this call?"
    )


class Waiter:
    """One ``await``/``run`` call: waits for its runs and asks for approvals it covers."""

    def __init__(
        self,
        rt: Runtime,
        ctx: Context[Any, Any],
        runs: list[Run],
        mode: str,
        deadline: float,
        asked: set[str],
    ) -> None:
        self.rt = rt
        self.ctx = ctx
        self.runs = runs
        self.mode = mode
        self.deadline = deadline  # wall clock, so it survives an input-required round trip
        self.asked = asked
        self.legacy_can_ask = (
            not _is_modern(ctx) and _declares_elicitation(ctx) and ctx.session.can_send_request
        )
        self.modern_can_ask = _is_modern(ctx) and _declares_elicitation(ctx)

    def finished(self) -> bool:
        states = [r.done for r in self.runs]
        return all(states) if self.mode == "all" else any(states)

    def covered_pending(self) -> list[Run]:
        seen: set[str] = set()
        out: list[Run] = []
        for root in self.runs:
            for run in self.rt.state.descendants(root):
                if run.id in seen:
                    continue
                seen.add(run.id)
                if run.pending is not None and not run.done:
                    out.append(run)
        return out

    async def apply_responses(self, responses: dict[str, Any] | None) -> None:
        """Modern era: answers to a previous ``InputRequiredResult``."""
        for key, response in (responses or {}).items():
            if not key.startswith(APPROVE_KEY_PREFIX):
                continue
            handle, _, call_key = key[len(APPROVE_KEY_PREFIX) :].partition("/")
            run = self.rt.state.runs.get(handle)
            if run is None or run.pending is None or run.pending.key != call_key:
                continue  # answered meanwhile by someone else, or the run ended
            self.asked.add(f"{handle}/{call_key}")
            allow = _allow_from(response)
            if allow is None:
                continue  # cancelled: leave it to approve()
            with contextlib.suppress(RuntimeError_):
                await self.rt.decide_approval(run, allow, call_key)

    async def wait(self) -> InputRequiredResult | bool:
        """Wait; True when finished, False at the deadline or when approvals need ``approve``."""
        event = asyncio.Event()
        ids = [r.id for r in self.runs]
        self.rt.watchers.watch(ids, event)
        try:
            while True:
                event.clear()
                if self.finished():
                    return True
                pending = [
                    r
                    for r in self.covered_pending()
                    if r.pending is not None and f"{r.id}/{r.pending.key}" not in self.asked
                ]
                if pending:
                    if self.modern_can_ask:
                        return self.input_required(pending)
                    if self.legacy_can_ask:
                        await self._elicit(pending[0])
                        continue
                    return False  # nobody here can be asked: hand back for approve()
                remaining = self.deadline - time.time()
                if remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
        finally:
            self.rt.watchers.unwatch(ids, event)

    async def _elicit(self, run: Run) -> None:
        pending = run.pending
        assert pending is not None
        self.asked.add(f"{run.id}/{pending.key}")
        remaining = max(1.0, self.deadline - time.time())
        decided = self.rt.decision(run)
        if decided is None:
            return
        ask: asyncio.Future[Any] = asyncio.ensure_future(
            self.ctx.elicit(_approval_message(run), ApprovalForm)
        )
        try:
            done, _ = await asyncio.wait(
                {ask, decided}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not ask.done():
                ask.cancel()
        if ask not in done or ask.cancelled():
            return
        try:
            answer = ask.result()
        except Exception as exc:
            log.info("run %s: elicitation failed: %r", run.id, exc)
            return
        if answer.action == "accept":
            allow: bool | None = bool(answer.data.allow)
        elif answer.action == "decline":
            allow = False
        else:
            allow = None
        if allow is not None and run.pending is pending:
            with contextlib.suppress(RuntimeError_):
                await self.rt.decide_approval(run, allow, pending.key)

    def input_required(
        self, pending: list[Run], extra: dict[str, Any] | None = None
    ) -> InputRequiredResult:
        requests: dict[str, Any] = {}
        for run in pending:
            assert run.pending is not None
            requests[f"{APPROVE_KEY_PREFIX}{run.id}/{run.pending.key}"] = ElicitRequest(
                params=ElicitRequestFormParams(
                    message=_approval_message(run), requested_schema=APPROVAL_SCHEMA
                )
            )
        state = {"deadline": self.deadline, "asked": sorted(self.asked), **(extra or {})}
        return InputRequiredResult(input_requests=requests, request_state=json.dumps(state))


def _allow_from(response: Any) -> bool | None:
    """``allow`` from an elicitation answer: accept -> its value, decline -> False."""
    action: Any
    content: Any
    if isinstance(response, ElicitResult):
        action, content = response.action, response.content
    elif isinstance(response, dict):
        action, content = response.get("action"), response.get("content")
    else:
        action, content = getattr(response, "action", None), getattr(response, "content", None)
    if action == "accept" and isinstance(content, dict) and isinstance(content.get("allow"), bool):
        return bool(content["allow"])
    if action == "decline":
        return False
    return None


def _state_of(ctx: Context[Any, Any]) -> dict[str, Any]:
    raw = ctx.request_state
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# ----------------------------------------------------------------------------- tools

Task = Annotated[str, Field(min_length=1, description="What the sub-agent should do.")]
Model = Annotated[
    str | None,
    Field(description="Model to run it on; default: the runtime's default model."),
]
ServiceClass = Annotated[
    Literal["interactive", "batch"] | None,
    Field(
        description="Scheduling class of its turns: 'interactive' (someone is waiting) or "
        "'batch'. Default: the parent's class, else 'interactive'."
    ),
]
System = Annotated[str | None, Field(description="System prompt for the sub-agent.")]
Tools = Annotated[
    list[str] | None,
    Field(description="Names of the tools it may use (see `tools`); default: all."),
]
Parent = Annotated[
    str | None,
    Field(description="Handle of the parent run: the new run joins its tree and budgets."),
]
BudgetTokens = Annotated[
    int | None,
    Field(ge=1, description="Token budget (prompt + completion) for this run's whole subtree."),
]
BudgetToolCalls = Annotated[
    int | None, Field(ge=0, description="Tool-call budget for this run's whole subtree.")
]
BudgetSeconds = Annotated[
    float | None,
    Field(
        gt=0,
        allow_inf_nan=False,  # an infinite limit is no limit, and not JSON (GET /status)
        description="Wall-clock budget in seconds for this run's whole subtree.",
    ),
]
ApproveTools = Annotated[
    list[str] | None,
    Field(
        description="Tools whose every call needs the user's approval (besides destructive "
        "ones, which always do)."
    ),
]


def build_mcp(rt: Runtime) -> MCPServer[Any]:
    settings = rt.settings
    mcp: MCPServer[Any] = MCPServer(
        "luftpause-runtime",
        version="0.1.0",
        instructions=(
            "Run sub-agents on local models. `spawn` starts one and returns a handle at once; "
            "spawn several, then `await` them together (fan-out is much faster than one after "
            "another). `run` does spawn+await in one blocking call. `tools` lists what "
            "sub-agents can use; `status`, `cancel` and `approve` manage runs; `decide` "
            "classifies a text in one cheap step."
        ),
        log_level="WARNING",
    )
    max_calls_default = settings.default_max_tool_calls
    max_tokens_default = settings.default_max_tokens
    await_default = settings.await_timeout_s
    await_max = settings.await_max_s

    MaxToolCalls = Annotated[
        int,
        Field(
            ge=0,
            le=64,
            description=f"Tool calls it may make (default {max_calls_default}); "
            "after that it must answer.",
        ),
    ]
    MaxTokens = Annotated[
        int,
        Field(
            ge=0,
            le=131072,
            description=f"Reply length limit per turn in tokens (default "
            f"{max_tokens_default}; 0 = the engine decides).",
        ),
    ]
    Parallel = Annotated[
        bool,
        Field(description="Run several tool calls from one reply at once (default false)."),
    ]

    def request(
        task: str,
        model: str | None,
        serviceClass: str | None,
        system: str | None,
        maxToolCalls: int,
        tools: list[str] | None,
        maxTokens: int,
        parallelToolCalls: bool,
        parent: str | None,
        budgetTokens: int | None,
        budgetToolCalls: int | None,
        budgetSeconds: float | None,
        approveTools: list[str] | None,
    ) -> SpawnRequest:
        return SpawnRequest(
            task=task,
            model=model,
            service_class=serviceClass,
            system=system,
            max_tool_calls=maxToolCalls,
            tools=tools,
            max_tokens=maxTokens,
            parallel_tool_calls=parallelToolCalls,
            parent=parent,
            budget_tokens=budgetTokens,
            budget_tool_calls=budgetToolCalls,
            budget_seconds=budgetSeconds,
            approve_tools=approveTools,
        )

    async def do_spawn(req: SpawnRequest, ctx: Context[Any, Any]) -> Run:
        try:
            return await rt.spawn(req, caller_of(ctx))
        except RuntimeError_ as exc:
            raise ToolError(str(exc)) from None

    def lookup(handles: list[str]) -> list[Run]:
        missing = [h for h in handles if h not in rt.state.runs]
        if missing:
            raise ToolError(f"unknown handle(s): {', '.join(map(repr, missing))}")
        return [rt.state.runs[h] for h in dict.fromkeys(handles)]

    @mcp.tool(
        description=(
            "Start a sub-agent on a local model and return its handle immediately (it runs in "
            "the background; collect it with `await`). The sub-agent loops: model turn, tool "
            "calls to the tools `tools` lists, until it answers or its tool budget is spent. "
            "Spawn several before awaiting to run them in parallel. Use `parent` to build a "
            "tree, budget* to cap a whole subtree."
        ),
        annotations=ToolAnnotations(
            title="Spawn sub-agent",
            read_only_hint=False,
            destructive_hint=False,
            open_world_hint=True,
        ),
        structured_output=False,
    )
    async def spawn(
        task: Task,
        ctx: Context[Any, Any],
        model: Model = None,
        serviceClass: ServiceClass = None,
        system: System = None,
        maxToolCalls: MaxToolCalls = max_calls_default,
        tools: Tools = None,
        maxTokens: MaxTokens = max_tokens_default,
        parallelToolCalls: Parallel = False,
        parent: Parent = None,
        budgetTokens: BudgetTokens = None,
        budgetToolCalls: BudgetToolCalls = None,
        budgetSeconds: BudgetSeconds = None,
        approveTools: ApproveTools = None,
    ) -> CallToolResult:
        req = request(
            task,
            model,
            serviceClass,
            system,
            maxToolCalls,
            tools,
            maxTokens,
            parallelToolCalls,
            parent,
            budgetTokens,
            budgetToolCalls,
            budgetSeconds,
            approveTools,
        )
        run = await do_spawn(req, ctx)
        return _result(
            {
                "handle": run.id,
                "state": run.state.value,
                "model": run.spec.model,
                "serviceClass": run.spec.service_class,
                "parent": run.parent,
            }
        )

    @mcp.tool(
        name="await",
        description=(
            "Wait for sub-agents started with `spawn`. mode 'all' (default) returns when every "
            "handle has finished, 'any' when one has. Returns each run's state, result, "
            "toolCalls and failedToolCalls; at the timeout (default 60 s, max 600 s) it returns "
            "the current state, so call it again to keep waiting. Tool calls that need the "
            "user's approval are asked here when the client supports it."
        ),
        annotations=ToolAnnotations(
            title="Await sub-agents", read_only_hint=True, open_world_hint=False
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
                f"{await_max:g}; larger values are clamped).",
            ),
        ] = await_default,
    ) -> CallToolResult | InputRequiredResult:
        runs = lookup(handles)
        note = None
        if timeout > await_max:
            note = f"timeout {timeout:g} s clamped to the maximum of {await_max:g} s"
            timeout = await_max
        state = _state_of(ctx)
        deadline = float(state.get("deadline") or (time.time() + timeout))
        waiter = Waiter(rt, ctx, runs, mode, deadline, set(state.get("asked") or ()))
        await waiter.apply_responses(ctx.input_responses)
        outcome = await waiter.wait()
        if isinstance(outcome, InputRequiredResult):
            return outcome
        payload: dict[str, Any] = {
            "mode": mode,
            "finished": waiter.finished(),
            "timedOut": not waiter.finished() and time.time() >= deadline,
            "results": [rt.run_json(r) for r in runs],
        }
        if note:
            payload["note"] = note
        return _result(payload)

    @mcp.tool(
        description=(
            "Start a sub-agent and wait until it finishes (spawn + await in one blocking call). "
            "Takes the same arguments as `spawn`; returns the run's result, toolCalls and "
            "failedToolCalls. Prefer spawn + await for several sub-agents at once."
        ),
        annotations=ToolAnnotations(
            title="Run sub-agent",
            read_only_hint=False,
            destructive_hint=False,
            open_world_hint=True,
        ),
        structured_output=False,
    )
    async def run(
        task: Task,
        ctx: Context[Any, Any],
        model: Model = None,
        serviceClass: ServiceClass = None,
        system: System = None,
        maxToolCalls: MaxToolCalls = max_calls_default,
        tools: Tools = None,
        maxTokens: MaxTokens = max_tokens_default,
        parallelToolCalls: Parallel = False,
        parent: Parent = None,
        budgetTokens: BudgetTokens = None,
        budgetToolCalls: BudgetToolCalls = None,
        budgetSeconds: BudgetSeconds = None,
        approveTools: ApproveTools = None,
    ) -> CallToolResult | InputRequiredResult:
        state = _state_of(ctx)
        handle = state.get("handle")
        started = handle if isinstance(handle, str) else None
        if started is not None and started in rt.state.runs:
            the_run = rt.state.runs[started]  # a retry after an input-required round
        else:
            req = request(
                task,
                model,
                serviceClass,
                system,
                maxToolCalls,
                tools,
                maxTokens,
                parallelToolCalls,
                parent,
                budgetTokens,
                budgetToolCalls,
                budgetSeconds,
                approveTools,
            )
            the_run = await do_spawn(req, ctx)
        waiter = Waiter(rt, ctx, [the_run], "all", math.inf, set(state.get("asked") or ()))
        await waiter.apply_responses(ctx.input_responses)
        while True:
            outcome = await waiter.wait()
            if isinstance(outcome, InputRequiredResult):
                pending = waiter.covered_pending()
                return waiter.input_required(pending, {"handle": the_run.id})
            if outcome or the_run.done:
                break
            # Nobody here can be asked: wait for approve() from another call.
            event = asyncio.Event()
            rt.watchers.watch([the_run.id], event)
            try:
                while the_run.pending is not None and not the_run.done:
                    event.clear()
                    await event.wait()
            finally:
                rt.watchers.unwatch([the_run.id], event)
            waiter.asked.clear()
        return _result(rt.run_json(the_run))

    @mcp.tool(
        description=(
            "Show runs. With a handle: that run's state, parent and children, its own usage and "
            "its subtree's, budget limits/used/exceeded, and any pending approval. Without: a "
            "summary of all runs (most recent first)."
        ),
        annotations=ToolAnnotations(title="Run status", read_only_hint=True),
        structured_output=False,
    )
    async def status(
        handle: Annotated[str | None, Field(description="A run handle; omit for all runs.")] = None,
    ) -> CallToolResult:
        if handle is not None:
            return _result(rt.run_json(lookup([handle])[0]))
        runs = sorted(rt.state.runs.values(), key=lambda r: r.created, reverse=True)
        counts: dict[str, int] = {}
        for r in runs:
            counts[r.state.value] = counts.get(r.state.value, 0) + 1
        listed = [
            {
                "handle": r.id,
                "state": r.state.value,
                "parent": r.parent,
                "children": len(r.children),
                "task": r.spec.task[:80],
            }
            for r in runs[:STATUS_LIST_LIMIT]
        ]
        return _result({"total": len(runs), "byState": counts, "runs": listed})

    @mcp.tool(
        description=(
            "Cancel a run and all its running descendants. Returns the handles that were "
            "cancelled (runs that had already finished are left as they are)."
        ),
        annotations=ToolAnnotations(
            title="Cancel run", destructive_hint=True, read_only_hint=False, idempotent_hint=True
        ),
        structured_output=False,
    )
    async def cancel(
        handle: Annotated[str, Field(min_length=1, description="The run to cancel.")],
    ) -> CallToolResult:
        target = lookup([handle])[0]
        cancelled = await rt.cancel_tree(target, "cancelled by the client")
        return _result({"handle": target.id, "cancelled": cancelled, "state": target.state.value})

    @mcp.tool(
        description=(
            "Answer a sub-agent's pending tool-call approval (state AwaitingApproval; see its "
            "pendingApproval in `status`/`await`). allow=false makes the sub-agent see that "
            "the user declined the call."
        ),
        annotations=ToolAnnotations(
            title="Approve tool call", read_only_hint=False, destructive_hint=False
        ),
        structured_output=False,
    )
    async def approve(
        handle: Annotated[str, Field(min_length=1, description="The waiting run.")],
        allow: Annotated[bool, Field(description="true to allow the call, false to decline")],
    ) -> CallToolResult:
        target = lookup([handle])[0]
        pending = target.pending
        if pending is None:
            raise ToolError(
                f"run {target.id} is not waiting for an approval (state {target.state.value})"
            )
        try:
            await rt.decide_approval(target, allow, pending.key)
        except RuntimeError_ as exc:
            raise ToolError(str(exc)) from None
        return _result({"handle": target.id, "tool": pending.tool, "allowed": allow})

    @mcp.tool(
        description=(
            "List the tools sub-agents can call (from the configured MCP tool servers), with "
            "their input schemas and whether calls need the user's approval."
        ),
        annotations=ToolAnnotations(title="Sub-agent tools", read_only_hint=True),
        structured_output=False,
    )
    async def tools() -> CallToolResult:
        await rt.hub.refresh()
        return _result(
            {"tools": [t.to_json() for t in rt.hub.tools.values()], "servers": rt.hub.status()}
        )

    @mcp.tool(
        description=(
            "Classify a text in one cheap step. Without labels: the classifier model's label. "
            "With 2-20 labels: one 1-token turn on a generative model scores each label by "
            "the probability of its first token. Returns label, probabilities and unscored "
            "(labels the model gave no probability)."
        ),
        annotations=ToolAnnotations(title="Decide", read_only_hint=True),
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
        try:
            payload = await run_decide(rt, input, labels, model, caller_of(ctx))
        except RuntimeError_ as exc:
            raise ToolError(str(exc)) from None
        return _result(payload)

    return mcp


# ----------------------------------------------------------------------------- HTTP

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def transport_security_for(host: str) -> TransportSecuritySettings:
    """DNS-rebinding protection for loopback; off when listening on all interfaces."""
    if host in ("0.0.0.0", "::", ""):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names = list(_LOOPBACK)
    own = f"[{host}]" if ":" in host else host
    if own not in names:
        names.append(own)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[h for n in names for h in (n, f"{n}:*")],
        allowed_origins=[o for n in names for o in (f"http://{n}", f"http://{n}:*")],
    )


MAX_BODY_BYTES = DEFAULT_MAX_REQUEST_BODY_SIZE  # the MCP SDK's own default, 4 MiB


class JsonRpcBodyLimit:
    """The MCP SDK refuses a request body over its limit (4 MiB) with a plain-text 413;
    an MCP client reads JSON-RPC. This answers that same refusal as a JSON-RPC error
    (``-32600``, id null: the request was never read), still with status 413."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        replaced = False

        async def send_json(message: Any) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and message["status"] == 413:
                replaced = True
                body = json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": None,
                        "error": {
                            "code": -32600,
                            "message": "request body too large: the limit is "
                            f"{MAX_BODY_BYTES} bytes",
                        },
                    }
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 413,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
            elif not replaced:  # the SDK's own text body is dropped
                await send(message)

        await self.app(scope, receive, send_json)


class BearerAuth:
    """X2: ``Authorization: Bearer <token>`` on ``/mcp`` and ``/status`` (constant time)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if self.token is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if not (path.startswith(MCP_PATH) or path.startswith("/status")):
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = bytes(value)
                break
        expected = b"Bearer " + self.token
        if not hmac.compare_digest(given, expected):
            response = JSONResponse(
                {
                    "error": {
                        "message": "missing or wrong bearer token (set Authorization: "
                        "Bearer <LUFTPAUSE_TOKEN>)"
                    }
                },
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_app(
    rt: Runtime,
    *,
    host: str,
    token: str | None,
    on_start: Callable[[], Awaitable[None]],
    on_stop: Callable[[], Awaitable[None]],
) -> ASGIApp:
    mcp = build_mcp(rt)
    mcp_app = mcp.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=False,
        transport_security=transport_security_for(host),
        host=host,
        max_request_body_size=MAX_BODY_BYTES,
    )

    async def status_route(_: Request) -> JSONResponse:
        return JSONResponse(status_tree(rt))

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "service": "runtime"})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await on_start()
        try:
            # A mounted app's own lifespan never runs: enter the session manager here.
            async with mcp.session_manager.run():
                yield
        finally:
            await on_stop()

    app = Starlette(
        routes=[
            Route("/status", status_route, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Mount("/", app=JsonRpcBodyLimit(mcp_app)),
        ],
        lifespan=lifespan,
    )
    return BearerAuth(app, token)
