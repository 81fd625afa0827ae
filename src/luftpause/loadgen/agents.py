"""Own-loop agents: the official ``openai`` package against a base URL, tools over MCP.

One run: system preamble + per-run task (see ``content``), the tool server's
schemas offered, streamed turns with ``stream_options.include_usage`` (so usage,
with the engine's ``luftpause_timing``, arrives through any proxy or router);
each tool call is answered by calling the tool server with the official MCP
client and its result echoed back; the run ends when the model answers.

The fake engine calls tools until the conversation holds N tool results; N is
sent per run in ``x-fake-tool-results``. (The SGLang router does not forward
that header: behind it the engine's own ``--tool-results`` applies.)

The client never retries (``max_retries=0``): a failed turn fails its run, and
the failure is counted by kind - errors are shown, never hidden.

``program_context`` names each run to a router that schedules programs (vllm-router's
``--enable-program-scheduling``): ``xargs`` sends ``vllm_xargs.agentic_context`` in
every turn's body (``agentic_context``), ``headers`` Claude Code's session headers
(the router needs ``"program_scheduling_enable_key": "auto"`` for those, and they
cannot say a turn is the last). A run's last turn is the one after its N-th tool
result (or its ``max_turns``-th turn): that is the turn the fake engine answers in
text, so it says ``expected_resume: false``. A real model may answer sooner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import httpx2
import openai

from luftpause.loadgen.pool import ClientPool
from luftpause.measure import content
from luftpause.measure.mix import Group
from luftpause.measure.stats import EndedTurn, RunRecord, TurnRecord

HELD_HEADER = "x-luftpause-held-ms"
REPLICA_HEADER = "x-luftpause-replica"
RUN_HEADER = "x-luftpause-run-id"
CLAUDE_SESSION_HEADER = "x-claude-code-session-id"
CLAUDE_AGENT_HEADER = "x-claude-code-agent-id"
CLAUDE_PARENT_AGENT_HEADER = "x-claude-code-parent-agent-id"
PROGRAM_CONTEXTS = ("none", "xargs", "headers")
#: ``agentic_context.priority`` by class. vllm-router resumes larger values first
#: (``ProgramRequestHints.priority``, default 0), so batch keeps the default.
PROGRAM_PRIORITY = {"interactive": 1, "batch": 0}


class RunFailed(Exception):
    """A run that did not finish; ``kind`` names the failure for the error table."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class AgentOptions:
    model: str
    tool_names: list[str] | None = None  # None: every tool the server offers
    class_headers: bool = True
    priority: dict[str, int] = field(default_factory=dict)  # class -> body "priority"
    # For the SGLang Model Gateway (SMG): class -> x-smg-priority value, and a header that
    # carries the run ID as SMG's sticky-session routing key ("": none).
    smg_priority: dict[str, str] = field(default_factory=dict)
    routing_key_header: str = ""
    # how a run names itself to a program-scheduling router: "none", "xargs", "headers"
    program_context: str = "none"
    turn_timeout_s: float = 600.0
    max_turns: int = 10
    nonce: str = "0"
    # what a --profile group's runs and the fake engine's replies to an own-loop agent
    # are drawn from (the nonce unless --plan-seed says)
    plan_seed: str = "0"
    token: str | None = None  # sent as Authorization: Bearer to every target (X2, D9)
    # Runs in flight (run ID -> base URL), so a load that stops can end them (D8).
    live: dict[str, str] = field(default_factory=dict)
    # Every own-loop turn as it ends, in or out of a finished run (stats.EndedTurn).
    ended: list[EndedTurn] = field(default_factory=list)


def auth_headers(token: str | None) -> dict[str, str]:
    """``Authorization: Bearer <token>`` for luftpause (D9, X2), or nothing."""
    return {"Authorization": f"Bearer {token}"} if token else {}


async def end_runs(options: AgentOptions, timeout_s: float = 5.0) -> int:
    """``DELETE /v1/runs/{id}`` for runs cut off mid-way (they may be paused on a tool, and
    a paused interactive run keeps a slot reserved until it expires). Errors and 404s (a
    router or an engine) are ignored. Returns how many the target acknowledged."""
    if not options.live or not options.class_headers:
        options.live.clear()
        return 0
    ended = 0
    async with httpx.AsyncClient(timeout=timeout_s, headers=auth_headers(options.token)) as http:
        for run_id, base in list(options.live.items()):
            with contextlib.suppress(httpx.HTTPError):
                r = await http.delete(f"{base}/runs/{run_id}")
                ended += r.status_code < 300
    options.live.clear()
    return ended


class ToolPool(ClientPool):
    """A few MCP sessions to the tool server, shared round robin by the agents."""

    service = "tool server"

    def __init__(self, url: str, size: int, timeout_s: float = 120.0) -> None:
        super().__init__(url, size, timeout_s)
        self.tools: list[Any] = []

    async def _opened(self) -> None:
        self.tools = list((await self.clients[0].list_tools()).tools)

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """The tool's text result and whether the server marked it an error."""
        result = await self.pick().call_tool(name, arguments)
        text = "\n".join(
            str(getattr(block, "text", "")) for block in result.content if hasattr(block, "text")
        )
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content)
        return text, bool(result.is_error)


def classify_error(exc: BaseException) -> RunFailed:
    """Map a client exception to an error kind (``http_502``, ``connect``, ``timeout``, ...)."""
    if isinstance(exc, RunFailed):
        return exc
    if isinstance(exc, openai.APIStatusError):
        return RunFailed(f"http_{exc.status_code}", f"{exc.status_code}: {exc.message}"[:300])
    if isinstance(exc, openai.APITimeoutError):
        return RunFailed("timeout", "turn timed out")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        # openai may bundle its own HTTP client: match the exception by name.
        if type(cause).__name__ in ("ConnectError", "ConnectionRefusedError"):
            return RunFailed("connect", f"cannot connect: {cause!r}"[:300])
        if type(cause).__name__ in ("RemoteProtocolError", "ReadError"):
            return RunFailed("stream_broken", f"connection broken: {cause!r}"[:300])
        return RunFailed("connection", f"connection failed: {cause!r}"[:300])
    if isinstance(exc, (httpx.TimeoutException, httpx2.TimeoutException)):
        return RunFailed("timeout", repr(exc)[:300])
    if isinstance(exc, (httpx.HTTPError, httpx2.HTTPError)):
        return RunFailed("stream_broken", repr(exc)[:300])
    if isinstance(exc, openai.OpenAIError):
        return RunFailed("openai_error", repr(exc)[:300])
    return RunFailed(type(exc).__name__, repr(exc)[:300])


def _usage_fields(usage: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if usage is None:
        return out
    out["prompt_tokens"] = getattr(usage, "prompt_tokens", None)
    out["completion_tokens"] = getattr(usage, "completion_tokens", None)
    details = getattr(usage, "prompt_tokens_details", None)
    out["cached_tokens"] = getattr(details, "cached_tokens", None) if details is not None else None
    if out["cached_tokens"] is None and out["prompt_tokens"] is not None:
        out["cached_tokens"] = 0
    extra = getattr(usage, "model_extra", None) or {}
    timing = extra.get("luftpause_timing")
    if isinstance(timing, dict):
        for key in ("queued_s", "prefill_s", "decode_s"):
            value = timing.get(key)
            if isinstance(value, (int, float)):
                out[key] = float(value)
    return out


@dataclass
class Reply:
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    turn: TurnRecord


def assistant_message(reply: Reply) -> dict[str, Any]:
    """The assistant message that records ``reply`` in the conversation (with its calls)."""
    return {
        "role": "assistant",
        "content": reply.content or None,
        "tool_calls": [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in reply.tool_calls
        ],
    }


async def stream_turn(
    client: openai.AsyncOpenAI,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    headers: dict[str, str],
    extra_body: dict[str, Any] | None,
    max_tokens: int,
    options: AgentOptions,
) -> Reply:
    t0 = time.perf_counter()
    create: Any = client.chat.completions.with_raw_response.create  # plain dicts, not TypedDicts
    raw = await create(
        model=options.model,
        messages=messages,
        tools=tools,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers,
        extra_body=extra_body,
    )
    held = raw.headers.get(HELD_HEADER)
    replica = raw.headers.get(REPLICA_HEADER)
    stream = raw.parse()
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    usage: Any = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.finish_reason:
                finish = choice.finish_reason
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
            for tc in delta.tool_calls or ():
                entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                if tc.id:
                    entry["id"] = tc.id
                if tc.function is not None:
                    if tc.function.name:
                        entry["name"] += tc.function.name
                    if tc.function.arguments:
                        entry["arguments"] += tc.function.arguments
    if finish is None:
        raise RunFailed("stream_incomplete", "the stream ended without a finish reason")
    fields = _usage_fields(usage)
    turn = TurnRecord(
        wall_s=time.perf_counter() - t0,
        held_s=int(held) / 1000.0 if held is not None and held.isdigit() else None,
        queued_s=fields.get("queued_s"),
        prefill_s=fields.get("prefill_s"),
        decode_s=fields.get("decode_s"),
        prompt_tokens=fields.get("prompt_tokens"),
        cached_tokens=fields.get("cached_tokens"),
        completion_tokens=fields.get("completion_tokens"),
        replica=replica,
        tool_calls=len(calls),
    )
    return Reply("".join(text), [calls[i] for i in sorted(calls)], finish, turn)


SMG_PRIORITY_HEADER = "x-smg-priority"


@dataclass(frozen=True)
class Lineage:
    """Where a sub-agent the load generator plays sits: its top-level run and its parent."""

    root: str
    parent: str


def run_headers(
    group: Group,
    run_key: str,
    n_tools: int,
    options: AgentOptions,
    lineage: Lineage | None = None,
) -> dict[str, str]:
    """The headers every turn of one run sends: the fake engine's tool count, luftpause's
    class headers (unless off), SMG's priority class and routing key where asked, and
    with ``program_context = "headers"`` Claude Code's session headers (the top-level
    run is the session; a sub-agent is an agent of it, below its parent)."""
    headers = {"x-fake-tool-results": str(n_tools)}
    if group.key:  # B13: the group's caller key instead of --token
        headers["Authorization"] = f"Bearer {group.key}"
    if options.class_headers:
        headers.update(
            {
                RUN_HEADER: run_key,
                "x-luftpause-class": group.cls,
                "x-luftpause-caller": group.caller,
            }
        )
    if group.cls in options.smg_priority:
        headers[SMG_PRIORITY_HEADER] = options.smg_priority[group.cls]
    if options.routing_key_header:
        headers[options.routing_key_header] = run_key
    if options.program_context == "headers":
        if lineage is None:
            headers[CLAUDE_SESSION_HEADER] = run_key
        else:
            headers[CLAUDE_SESSION_HEADER] = lineage.root
            headers[CLAUDE_AGENT_HEADER] = run_key
            if lineage.parent != lineage.root:  # the root is the session's lead agent
                headers[CLAUDE_PARENT_AGENT_HEADER] = lineage.parent
    return headers


def agentic_context(
    group: Group, run_key: str, last: bool, parent: str | None = None
) -> dict[str, Any]:
    """``vllm_xargs.agentic_context`` for one turn of a run: the run is the program; a
    sub-agent names its parent, which waits for it."""
    context: dict[str, Any] = {
        "program_id": run_key,
        "priority": PROGRAM_PRIORITY.get(group.cls, 0),
        "expected_resume": not last,
    }
    if parent is not None:
        context.update({"parent_program_id": parent, "blocks_parent": True})
    return context


def turn_body(
    group: Group, run_key: str, last: bool, options: AgentOptions, parent: str | None = None
) -> dict[str, Any]:
    """The members one turn adds to its body: the class ``priority`` where asked, and
    with ``program_context = "xargs"`` the run's ``vllm_xargs``. The context is a JSON
    string: vLLM's ``vllm_xargs`` takes only strings and numbers as values, and
    vllm-router decodes a string context, so an engine behind it accepts the body."""
    extra: dict[str, Any] = {}
    if group.cls in options.priority:
        extra["priority"] = options.priority[group.cls]
    if options.program_context == "xargs":
        context = agentic_context(group, run_key, last, parent)
        extra["vllm_xargs"] = {"agentic_context": json.dumps(context, separators=(",", ":"))}
    return extra


async def run_once(
    client: openai.AsyncOpenAI,
    pool: ToolPool,
    tools: list[dict[str, Any]],
    group: Group,
    run_key: str,
    run_number: int,
    options: AgentOptions,
    clock: Callable[[], float],
    plan: str | None = None,
) -> RunRecord:
    """One agent run, start to answer; ``plan`` is its plan key
    (:func:`~luftpause.measure.workload.plan_key`), written into its task, which the fake
    engine draws its replies from. Raises :class:`RunFailed`."""
    start = clock()
    n_tools = group.tool_calls.pick(run_number)
    headers = run_headers(group, run_key, n_tools, options)
    messages = content.messages(group.context_chars, run_key, plan)
    options.live[run_key] = str(client.base_url).rstrip("/")
    turns: list[TurnRecord] = []
    tool_s = 0.0
    tool_calls = 0
    try:
        for turn in range(options.max_turns):
            # the fake engine answers in text once the run holds n_tools tool results
            last = tool_calls >= n_tools or turn == options.max_turns - 1
            extra_body = turn_body(group, run_key, last, options) or None
            reply = await stream_turn(
                client, messages, tools, headers, extra_body, group.max_tokens, options
            )
            turns.append(reply.turn)
            options.ended.append(EndedTurn(group.name, group.cls, clock(), reply.turn))
            if not reply.tool_calls:
                if reply.finish_reason == "tool_calls":
                    raise RunFailed("bad_reply", "finish reason tool_calls without a tool call")
                options.live.pop(run_key, None)
                return RunRecord(
                    group=group.name,
                    cls=group.cls,
                    kind="agent",
                    start_s=start,
                    end_s=clock(),
                    turns=len(turns),
                    tool_calls=tool_calls,
                    tool_s=tool_s,
                    turn_records=turns,
                    prompt_tokens=sum(t.prompt_tokens or 0 for t in turns)
                    if any(t.prompt_tokens is not None for t in turns)
                    else None,
                    cached_tokens=sum(t.cached_tokens or 0 for t in turns),
                )
            messages.append(assistant_message(reply))
            for call in reply.tool_calls:
                t0 = time.perf_counter()
                try:
                    arguments = json.loads(call["arguments"] or "{}")
                except ValueError:
                    result = f"Error: arguments are not JSON: {call['arguments'][:200]}"
                else:
                    try:
                        result, _ = await pool.call(call["name"], arguments)
                    except Exception as exc:
                        raise RunFailed("tool_failed", f"{call['name']}: {exc!r}"[:300]) from exc
                tool_s += time.perf_counter() - t0
                tool_calls += 1
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        raise RunFailed("too_many_turns", f"no answer after {options.max_turns} turns")
    except asyncio.CancelledError:
        raise  # stays in options.live: the load ends it
    except Exception as exc:
        options.live.pop(run_key, None)  # a failed turn leaves its run idle (D5)
        raise classify_error(exc) from exc


def make_client(base_url: str, options: AgentOptions, connections: int) -> openai.AsyncOpenAI:
    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
    timeout = openai.Timeout(options.turn_timeout_s, connect=5.0)
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=options.token or "luftpause-loadgen",  # the key a target without auth ignores
        max_retries=0,
        timeout=timeout,
        http_client=openai.DefaultAsyncHttpxClient(limits=limits, timeout=timeout),
    )


@contextlib.asynccontextmanager
async def clients(
    targets: list[str], options: AgentOptions, connections: int
) -> AsyncIterator[list[openai.AsyncOpenAI]]:
    made = [make_client(t, options, connections) for t in targets]
    try:
        yield made
    finally:
        for c in made:
            await c.close()
