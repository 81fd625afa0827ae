"""The runtime's MCP protocol layer: callers, protocol eras, elicitation, waiting (R3, R4, R11).

The tool layer (``tools.py``) says *what* each tool does; this module says how a
call talks to its client while it waits.

The endpoint is stateful Streamable HTTP, so it serves both protocol eras:
2025-11-25 clients get a session (``initialize``), 2026-07-28 clients send
self-contained requests that the SDK routes by their ``MCP-Protocol-Version``.

Caller identity (R4): the ``Mcp-Session-Id`` of a legacy session; a modern
request has no session, so its caller is its ``clientInfo`` name (or
``anonymous``). With ``[[callers]]`` (B13), a request made with a caller's key is
that caller's (:func:`principal_of`: the HTTP layer puts the principal in the
request's ASGI scope); one made with the token is trusted, and named as above.

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

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from mcp.server.mcpserver import Context
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, ValidationError

from luftpause.callers import TRUSTED, KeyedCaller, Principal
from luftpause.runtime.core import Run
from luftpause.runtime.loop import Runtime, RuntimeError_, visible_to
from luftpause.shown import SHOWN_CHARS, shown
from luftpause.tool_calls import MAX_CALL_ID_CHARS

log = logging.getLogger("luftpause.runtime.protocol")

APPROVE_KEY_PREFIX = "approve/"


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


def tool_result(payload: dict[str, Any]) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(payload, ensure_ascii=False))],
        structured_content=payload,
    )


PRINCIPAL_SCOPE_KEY = "luftpause.principal"
"""The ASGI scope key under which the HTTP layer leaves a request's principal (B13)."""


def principal_in(request: Any) -> Principal:
    """The principal of a transport request (a Starlette ``Request``): the configured
    caller whose key it carried, else ``TRUSTED`` (the token, no auth, or no HTTP)."""
    scope = getattr(request, "scope", None)
    found = scope.get(PRINCIPAL_SCOPE_KEY) if isinstance(scope, Mapping) else None
    return found if isinstance(found, KeyedCaller) else TRUSTED


def principal_of(ctx: Context[Any, Any]) -> Principal:
    """The principal of the request a tool call came in (:func:`principal_in`)."""
    return principal_in(ctx.request_context.request)


def caller_of(ctx: Context[Any, Any]) -> str:
    headers = ctx.headers
    if headers is not None:
        session = headers.get("mcp-session-id")
        if session:
            return session
    params = ctx.session.client_params
    return caller_named(getattr(params, "client_info", None) if params is not None else None)


# The ``_meta`` keys under which an agent harness names the tool call (in its model's
# reply) that made an MCP ``tools/call`` (#38): Claude Code's ``toolUseId``, Codex's
# ``callId``. The dataplane relayed that reply, so it knows the harness's run.
HARNESS_CALL_ID_KEYS = ("claudecode/toolUseId", "callId")


def harness_call_id(meta: Mapping[str, Any] | None) -> str | None:
    """The harness's tool call ID in a request's ``_meta`` (first known key), if any."""
    if not meta:
        return None
    for key in HARNESS_CALL_ID_KEYS:
        value = meta.get(key)
        if isinstance(value, str) and 0 < len(value) <= MAX_CALL_ID_CHARS and value.isprintable():
            return value
    return None


def caller_named(client_info: Any) -> str:
    """The caller of a request without a session: its ``clientInfo`` name."""
    name = getattr(client_info, "name", None)
    # The caller travels in the x-luftpause-caller header: printable ASCII only.
    safe = "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in str(name or "")).strip()
    return f"client:{safe}" if safe else "anonymous"


def _is_modern(ctx: Context[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _declares_elicitation(ctx: Context[Any, Any]) -> bool:
    caps = ctx.client_capabilities
    return caps is not None and caps.elicitation is not None


def approval_message(run: Run) -> str:
    pending = run.pending
    assert pending is not None
    args = json.dumps(pending.arguments, ensure_ascii=False)
    return (
        f"Sub-agent {run.id} wants to call the tool {pending.tool!r} with arguments {args}. "
        "Allow this call?"
    )


def awaiting_approval(rt: Runtime, roots: list[Run]) -> list[dict[str, Any]]:
    """Every tool call waiting for the user in the trees of ``roots``, with how to answer."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for root in roots:
        for run in rt.state.descendants(root):
            if run.id in seen or run.pending is None or run.done:
                continue
            seen.add(run.id)
            out.append(
                {
                    "handle": run.id,
                    "tool": run.pending.tool,
                    "arguments": run.pending.arguments,
                    "answerWith": {"tool": "approve", "arguments": {"handle": run.id}},
                }
            )
    return out


def approval_hint(pending: list[dict[str, Any]]) -> str:
    return (
        f"{len(pending)} sub-agent tool call(s) wait for the user's approval (see "
        "awaitingApproval). Show each to the user, answer with approve(handle, allow=true or "
        "false), then call await with the handles to keep waiting."
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
        principal: Principal = TRUSTED,
    ) -> None:
        self.rt = rt
        self.principal = principal
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
            if not visible_to(self.principal, run):
                continue  # B13: another caller's run, as if there were none
            self.asked.add(f"{handle}/{call_key}")
            allow = allow_from(response)
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
            self.ctx.elicit(approval_message(run), ApprovalForm)
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
                    message=approval_message(run), requested_schema=APPROVAL_SCHEMA
                )
            )
        state = {"deadline": self.deadline, "asked": sorted(self.asked), **(extra or {})}
        return InputRequiredResult(input_requests=requests, request_state=json.dumps(state))


def allow_from(response: Any) -> bool | None:
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


def request_state_of(ctx: Context[Any, Any]) -> dict[str, Any]:
    raw = ctx.request_state
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# ----------------------------------------------------------------------------- argument errors


def _shown(value: Any) -> str:
    """A rejected value as JSON, cut as ``luftpause.shown`` cuts (64 characters, then the
    full length)."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        cut = json.dumps(value[:SHOWN_CHARS], ensure_ascii=False)
        return f"{cut}… ({len(value)} characters)"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}…"


def _expected(error: Any) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    bounds = {
        "less_than_equal": "at most {le}",
        "less_than": "less than {lt}",
        "greater_than_equal": "at least {ge}",
        "greater_than": "greater than {gt}",
    }
    if kind in bounds:
        numbers = {k: f"{v:g}" if isinstance(v, float) else v for k, v in ctx.items()}
        return "must be " + bounds[kind].format(**numbers)
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return "must not be empty" if n == 1 else f"must be at least {n} characters long"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters long"
    if kind in ("too_short", "too_long"):
        n = ctx.get("min_length", ctx.get("max_length"))
        return f"must have {'at least' if kind == 'too_short' else 'at most'} {n} item(s)"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}"
    simple = {
        "list_type": "must be a list (a JSON array)",
        "bool_parsing": "must be true or false",
        "bool_type": "must be true or false",
        "int_parsing": "must be a whole number",
        "int_type": "must be a whole number",
        "int_from_float": "must be a whole number",
        "float_parsing": "must be a number",
        "float_type": "must be a number",
        "finite_number": "must be a finite number",
        "string_type": "must be a string",
        "string_unicode": "must be valid Unicode (it holds a lone surrogate)",
        "dict_type": "must be an object",
    }
    if kind in simple:
        return simple[kind]
    msg = str(error.get("msg") or "is not valid")
    return msg[:1].lower() + msg[1:]


def describe_argument_errors(tool: str, exc: ValidationError) -> str:
    """A tool's rejected arguments, one sentence per problem: which argument, what was
    expected, what was given (never pydantic's dump with its links); the first
    ``_MOST_PROBLEMS``, then how many more."""
    problems = []
    errors = exc.errors(include_url=False)
    for error in errors[:_MOST_PROBLEMS]:
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        if error["type"] == "missing":
            problems.append(f"argument {shown(where)} is required")
        else:
            problems.append(
                f"argument {shown(where)} {_expected(error)} (got {_shown(error.get('input'))})"
            )
    more = len(errors) - len(problems)
    return f"{tool}: " + "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


_MOST_PROBLEMS = 10  # a thousand bad handles are not a thousand sentences
