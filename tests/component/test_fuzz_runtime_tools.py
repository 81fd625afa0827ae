"""R1-R4, R8-R13, R15: fuzzing the runtime's MCP tools in process (Hypothesis).

The runtime app (``build_app``) runs in this process behind ``httpx.ASGITransport``
on an event loop the module owns; the dataplane is an ``httpx.MockTransport``
(a scripted model that answers at once - after 0.15 s for a task marked
``[slow]`` -, calls the first offered tool once, 404s unknown models and 400s
header values a real HTTP/1.1 connection would refuse) and the tool hub holds a
read-only ``lookup`` and a destructive ``rm``. Requests are raw JSON-RPC, so what
goes over the wire is exactly what Hypothesis drew (``NaN``/``Infinity``
literals, lone surrogates, non-object ``arguments``), in both protocol eras: a
legacy 2025-11-25 session and self-contained 2026-07-28 requests (with drawn
client capabilities and ``clientInfo`` name, the modern caller identity, R4).

Tool names and input schemas come from ``tools/list`` (R1). For every tool,
arguments are drawn two ways: shaped by its schema (mostly valid values at
their edges - bounds, huge and tiny numbers, infinity, huge and odd Unicode
strings, handles of live runs - and invalid ones: one past the bounds, wrong
types, NaN, null, missing required and extra fields, wrong-case names) and as
arbitrary JSON (any type, nested, as ``arguments`` itself, extra ``params``
keys, unknown tool names). Before the call an example may start a live run for
the call to meet (plain, slow, waiting for approval, or a budgeted tree); an
input-required answer (R11, modern era) is retried once with a drawn answer,
and now and then the client gives up on its call after a drawn delay.

For every example:

* the HTTP status is below 500 and the answer is one JSON-RPC message for the
  request: a result, a tool error (``isError: true``) with a message (an
  argument refused by the schema is named), ``-32602`` invalid params with a
  message, ``-32700`` for what the legacy parser refuses, or ``-32600`` with
  status 413 for a body over the 4 MiB limit - never an
  internal error, never the SDK's bare ``Error executing tool <name>`` (the
  sign of an exception of ours), never traceback text, and nothing logged at
  ERROR;
* afterwards nothing is left in flight: every run ends (approval waits are
  declined through ``approve``; the scripted model finishes everything else,
  and no run fails but for an unknown model), every run that sent a turn is
  reported ended to the dataplane (R15), every run task and background task is
  done, no watcher or budget timer (R10) is left behind, no stray asyncio task
  lives on, and ``GET /status`` (R9) answers 200 with strict JSON.

Outcomes are counted per kind (accepted, tool error, invalid params, parse
error, input required then ..., client left); set ``LUFTPAUSE_FUZZ_COUNTS=1``
and run with ``-s`` to print them at the end. The regression tests at the end
pin the bugs the fuzzing found.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette

from luftpause.config import RuntimeSettings
from luftpause.runtime.core import RunState
from luftpause.runtime.journal import Journal
from luftpause.runtime.llm import DataplaneClient
from luftpause.runtime.loop import Runtime
from luftpause.runtime.server import MAX_BODY_BYTES, build_app
from luftpause.runtime.upstream import ToolHub, ToolOutcome, UpstreamTool

SPEC_TOOLS = {"spawn", "await", "run", "status", "cancel", "approve", "tools", "decide"}
LEGACY = "2025-11-25"
MODERN = "2026-07-28"
MODEL = "m"
CALL_TIMEOUT_S = 20.0
SETTLE_TIMEOUT_S = 10.0
EXAMPLE_TIMEOUT_S = 45.0
PLACEHOLDERS = ("@last", "@first", "@live")
SLOW = "[slow]"
SLOW_TURN_S = 0.15
APPROVAL_GRACE_S = 0.3  # how long an approval stays open before the janitor declines it
PRELUDES = (None, "plain", "slow", "approval", "tree")

LOOKUP = UpstreamTool(
    name="lookup",
    server="fake",
    remote_name="lookup",
    description="look something up",
    input_schema={
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"],
    },
    read_only=True,
    destructive=False,
)
RM = UpstreamTool(
    name="rm",
    server="fake",
    remote_name="rm",
    description="remove a file",
    input_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
    read_only=False,
    destructive=True,
)


class Hub(ToolHub):
    def __init__(self) -> None:
        super().__init__(())
        self.tools = {"lookup": LOOKUP, "rm": RM}

    async def call(self, tool: UpstreamTool, arguments: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome(f"{tool.name} ok: {json.dumps(arguments)[:100]}", False)

    async def refresh(self) -> None:
        return None


TURNED: set[str] = set()  # run ids that sent a turn to the dataplane
ENDED: set[str] = set()  # run ids the runtime reported ended (R15: DELETE /v1/runs/{id})


async def dataplane(request: httpx.Request) -> httpx.Response:
    """The scripted dataplane: quick replies (slower for a task marked ``[slow]``), one tool
    call per run, 404 for other models; it notes which runs turned and which were ended."""
    path = request.url.path
    for key, value in request.headers.raw:
        # What h11 refuses on a real connection (MockTransport would let it through).
        if not all(0x20 <= b < 0x7F or b == 0x09 for b in value) or value != value.strip():
            message = f"illegal value of header {key.decode()}: {value!r}"
            return httpx.Response(400, json={"error": {"message": message}})
    if request.method == "DELETE":
        ENDED.add(path.rsplit("/", 1)[-1])
        return httpx.Response(204)
    if path == "/v1/chat/completions":
        TURNED.add(request.headers["x-luftpause-run-id"])
    if path == "/v1/models":
        return httpx.Response(200, json={"data": [{"id": MODEL}]})
    body = json.loads(request.content)
    if path == "/v1/decide":
        return httpx.Response(
            200, json={"model": "clf", "data": [{"label": "yes", "probs": [0.8, 0.2]}]}
        )
    if body.get("model") != MODEL:
        message = f"no Generative replica serves model {body.get('model')!r}"
        return httpx.Response(404, json={"error": {"message": message}})
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    if body.get("logprobs"):
        top = [{"token": "yes", "logprob": -0.1}, {"token": "no", "logprob": -2.5}]
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "yes"},
            "logprobs": {"content": [{"token": "yes", "logprob": -0.1, "top_logprobs": top}]},
        }
        return httpx.Response(200, json={"choices": [choice], "usage": usage})
    if any(SLOW in str(m.get("content")) for m in body["messages"] if m.get("role") == "user"):
        await asyncio.sleep(SLOW_TURN_S)
    tools = body.get("tools") or []
    called = any(m.get("role") == "tool" for m in body["messages"])
    if tools and not called:
        name = tools[0]["function"]["name"]
        args = {"path": "/tmp/x"} if name == "rm" else {"query": "q", "limit": 2}
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            ],
        }
    else:
        message = {"role": "assistant", "content": "done"}
    return httpx.Response(200, json={"choices": [{"index": 0, "message": message}], "usage": usage})


class ErrorLog(logging.Handler):
    """Collects records at ERROR and above (an exception of ours shows up here)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"non-JSON constant {name} in {text[:200]!r}")

    return json.loads(text, parse_constant=refuse)


def _messages(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a JSON or SSE response body."""
    if not response.content:
        return []
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return [
            _strict_json(line[5:].strip())
            # SSE lines end in \n; str.splitlines would also split on U+0085 inside JSON
            for line in response.text.split("\n")
            if line.startswith("data:") and line[5:].strip()
        ]
    data = _strict_json(response.text)
    return data if isinstance(data, list) else [data]


def _header_value(value: str) -> str:
    """``Mcp-Name`` as the SDK's encoder writes it (base64 sentinel unless plain ASCII)."""
    if value.isascii() and value.isprintable() and value == value.strip() and value:
        return value
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


class Harness:
    """The runtime app in process, a raw JSON-RPC client for both eras, and the checks."""

    def __init__(self, state_dir: Path) -> None:
        self.runner = asyncio.Runner()
        self.loop = self.runner.get_loop()
        self.loop.set_exception_handler(self._loop_error)
        self.loop_errors: list[str] = []
        self.state_dir = state_dir
        self.counts: Counter[str] = Counter()
        self.handles: list[str] = []
        self.schemas: dict[str, dict[str, Any]] = {}
        self.errors = ErrorLog()
        self._ids = 0
        self.pending_since: dict[tuple[str, str], float] = {}
        self.last: dict[str, Any] = {}  # the last example's result or error
        self.runner.run(self._start())

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.loop_errors.append(str(context.get("message")) + " " + repr(context.get("exception")))

    async def _start(self) -> None:
        journal = Journal(self.state_dir)
        records = journal.open()
        self.llm = DataplaneClient(
            "http://dataplane.test",
            token=None,
            turn_timeout_s=30,
            retry_after_default_s=0.01,
            transport=httpx.MockTransport(dataplane),
        )
        self.rt = Runtime(RuntimeSettings(state_dir=str(self.state_dir)), journal, self.llm, Hub())

        async def on_start() -> None:
            self.rt.recover(records)

        async def on_stop() -> None:
            await self.rt.shutdown()
            await self.llm.aclose()

        app = build_app(self.rt, host="127.0.0.1", token=None, on_start=on_start, on_stop=on_stop)
        inner: Any = app
        while not isinstance(inner, Starlette):  # below the auth and header middleware
            inner = inner.app
        self.starlette = inner
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        )
        self._stop = asyncio.Event()
        ready = asyncio.Event()
        self._host = asyncio.create_task(self._serve(ready), name="fuzz-host")
        async with asyncio.timeout(10):
            await ready.wait()
        init = await self.request(
            LEGACY,
            "initialize",
            {
                "protocolVersion": LEGACY,
                "capabilities": {},
                "clientInfo": {"name": "fuzz", "version": "0"},
            },
        )
        assert init.status_code == 200, init.text
        self.session = init.headers["mcp-session-id"]
        note = await self.post(
            LEGACY, {"jsonrpc": "2.0", "method": "notifications/initialized"}, "x", None
        )
        assert note.status_code == 202, note.text
        for era in (LEGACY, MODERN):
            listed = await self.request(era, "tools/list", {})
            [message] = _messages(listed)
            tools = message["result"]["tools"]
            assert {t["name"] for t in tools} == SPEC_TOOLS, tools
            self.schemas = {t["name"]: t["inputSchema"] for t in tools}
        logging.getLogger().addHandler(self.errors)
        await self.settle()
        self.baseline = {t for t in asyncio.all_tasks() if not t.done()}

    async def _serve(self, ready: asyncio.Event) -> None:
        async with self.starlette.router.lifespan_context(self.starlette):
            ready.set()
            await self._stop.wait()

    def close(self) -> None:
        logging.getLogger().removeHandler(self.errors)

        async def stop() -> None:
            await self.http.aclose()
            self._stop.set()
            async with asyncio.timeout(15):
                await self._host

        try:
            self.runner.run(stop())
        finally:
            self.runner.close()

    # ------------------------------------------------------------------ wire

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def post(self, era: str, body: Any, method: Any, name: Any) -> httpx.Response:
        headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": era,
        }
        if era == LEGACY:
            if method != "initialize":
                headers["mcp-session-id"] = getattr(self, "session", "")
        else:
            headers["mcp-method"] = method if isinstance(method, str) else ""
            if isinstance(name, str):
                headers["mcp-name"] = _header_value(name)
        # allow_nan: NaN/Infinity literals go out as drawn; ensure_ascii keeps lone
        # surrogates as \\ud800 escapes (the server decides what to make of them).
        content = json.dumps(body, allow_nan=True, ensure_ascii=True).encode()
        async with asyncio.timeout(CALL_TIMEOUT_S):
            return await self.http.post("/mcp", headers=headers, content=content)

    async def request(
        self,
        era: str,
        method: str,
        params: Any,
        caps: dict[str, Any] | None = None,
        client: str = "fuzz",
    ) -> httpx.Response:
        if era == MODERN and isinstance(params, dict):
            params = {
                **params,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": caps or {},
                    "io.modelcontextprotocol/clientInfo": {"name": client, "version": "0"},
                },
            }
        body = {"jsonrpc": "2.0", "id": self._next_id(), "method": method, "params": params}
        name = params.get("name") if isinstance(params, dict) else None
        return await self.post(era, body, method, name)

    # ------------------------------------------------------------------ one example

    def substitute(self, value: Any) -> Any:
        """Replace handle placeholders with handles of real runs."""
        if isinstance(value, str) and value in PLACEHOLDERS:
            if not self.handles:
                return "run-none"
            if value == "@first":
                return self.handles[0]
            if value == "@live":
                waiting = [r.id for r in self.rt.state.runs.values() if not r.done]
                return waiting[-1] if waiting else self.handles[-1]
            return self.handles[-1]
        if isinstance(value, list):
            return [self.substitute(v) for v in value]
        if isinstance(value, dict):
            return {k: self.substitute(v) for k, v in value.items()}
        return value

    async def prelude(self, kind: str | None) -> None:
        """A live run (or tree) for the fuzzed call to meet: ``@live`` names it."""
        if kind is None:
            return
        args: dict[str, Any] = {"task": f"{SLOW} prelude" if kind != "plain" else "prelude"}
        if kind == "approval":
            args["tools"] = ["rm"]
        if kind == "tree":
            args["budgetSeconds"] = 30
        response = await self.request(LEGACY, "tools/call", {"name": "spawn", "arguments": args})
        [message] = _messages(response)
        handle = message["result"]["structuredContent"]["handle"]
        self.handles.append(handle)
        if kind == "tree":
            child = {"task": f"{SLOW} child", "parent": handle}
            response = await self.request(
                LEGACY, "tools/call", {"name": "spawn", "arguments": child}
            )
            [message] = _messages(response)
            self.handles.append(message["result"]["structuredContent"]["handle"])

    def example(
        self,
        era: str,
        params: Any,
        caps: dict[str, Any] | None = None,
        prelude: str | None = None,
        answer: Any = None,
        client: str = "fuzz",
        leave_after: float | None = None,
    ) -> str:
        """Run one tools/call, check it and what it leaves behind; returns its outcome kind.

        An input-required result (R11, modern era) is retried once with ``answer`` as the
        response to each of its input requests, and the signed ``requestState``. With
        ``leave_after`` the client gives up on the call after that many seconds.
        """

        async def go() -> str:
            async with asyncio.timeout(EXAMPLE_TIMEOUT_S):
                self.errors.records.clear()
                self.loop_errors.clear()
                await self.prelude(prelude)
                janitor = asyncio.create_task(self.janitor())
                try:
                    sent = self.substitute(params)
                    call = asyncio.create_task(self.request(era, "tools/call", sent, caps, client))
                    await asyncio.wait({call}, timeout=leave_after)  # None: till it ends
                    if not call.done():
                        call.cancel()
                        await asyncio.gather(call, return_exceptions=True)
                        kind, result = "client left", {}
                    else:
                        kind, result = self.check(params, await call)
                    self.last = result
                    if kind == "input required":
                        retry = {
                            **sent,
                            "inputResponses": {k: answer for k in result["inputRequests"]},
                            "requestState": result.get("requestState"),
                        }
                        again, _ = self.check(
                            params, await self.request(era, "tools/call", retry, caps, client)
                        )
                        kind = f"input required, then {again}"
                finally:
                    janitor.cancel()
                    await asyncio.gather(janitor, return_exceptions=True)
                await self.settle()
                problems = [r.getMessage() for r in self.errors.records] + self.loop_errors
                assert not problems, f"errors logged: {problems}"
                return kind

        kind = self.runner.run(go())
        self.counts[kind] += 1
        self.counts["examples"] += 1
        return kind

    def check(self, params: Any, response: httpx.Response) -> tuple[str, dict[str, Any]]:
        assert response.status_code < 500, (response.status_code, response.text[:2000])
        assert "Traceback" not in response.text, response.text[:4000]
        messages = [m for m in _messages(response) if "id" in m]
        assert len(messages) == 1, (response.status_code, response.text[:2000])
        [message] = messages
        name = params.get("name") if isinstance(params, dict) else None
        if "error" in message:
            error = message["error"]
            # Never -32603 / 0 (an exception of ours); -32700 for what the legacy era's
            # JSON parser refuses (lone surrogates), with the parser's reason; -32600
            # (status 413) for a body over the limit.
            assert error["code"] in (-32602, -32700, -32600), error
            assert (error["code"] == -32600) == (response.status_code == 413), error
            assert isinstance(error.get("message"), str) and error["message"].strip(), error
            kinds = {-32602: "invalid params", -32700: "parse error", -32600: "too large"}
            return kinds[error["code"]], error
        result = message["result"]
        texts = [c.get("text", "") for c in result.get("content") or []]
        if result.get("isError"):
            text = "\n".join(texts)
            assert text.strip(), result
            # The SDK's text for an unexpected exception in a tool is exactly this.
            assert text != f"Error executing tool {name}", f"tool {name} crashed: {params!r}"
            if "validation error" in text:  # pydantic's list names the refused fields
                fields = self.schemas.get(str(name), {}).get("properties") or {}
                assert any(f"\n{field}" in text for field in fields), text[:2000]
            return "tool error", result
        if result.get("resultType") == "input_required":
            assert result.get("inputRequests"), result
            return "input required", result
        payload = result.get("structuredContent")
        if payload is None:
            payload = _strict_json(texts[0])
        if name in ("spawn", "run") and isinstance(payload.get("handle"), str):
            self.handles.append(payload["handle"])
        return "accepted", result

    async def janitor(self) -> None:
        """Declines approvals (through ``approve``) so a blocking ``run`` can end (R11)."""
        while True:
            await asyncio.sleep(0.05)
            await self.decline_waiting(APPROVAL_GRACE_S)

    async def decline_waiting(self, grace: float = 0.0) -> None:
        now = time.monotonic()
        for run in list(self.rt.state.runs.values()):
            if run.state is RunState.AWAITING_APPROVAL and run.pending is not None:
                key = (run.id, run.pending.key)
                if now - self.pending_since.setdefault(key, now) < grace:
                    continue
                response = await self.request(
                    MODERN,
                    "tools/call",
                    {"name": "approve", "arguments": {"handle": run.id, "allow": False}},
                )
                assert response.status_code == 200, response.text

    def stray_tasks(self) -> set[asyncio.Task[Any]]:
        current = asyncio.current_task()
        return {t for t in asyncio.all_tasks() if not t.done() and t is not current} - self.baseline

    async def settle(self) -> None:
        """Everything the example started ends, within a bound; nothing is left behind."""
        rt = self.rt
        try:
            async with asyncio.timeout(SETTLE_TIMEOUT_S):
                while True:
                    await self.decline_waiting()
                    busy = [r for r in rt.state.runs.values() if not r.done]
                    tasks = [t for t in rt._tasks.values() if not t.done()]
                    if not busy and not tasks and not rt._background:
                        break
                    await asyncio.sleep(0.01)
        except TimeoutError:
            stuck = {
                r.id: (r.state.value, rt._tasks.get(r.id))
                for r in rt.state.runs.values()
                if not r.done or r.id in rt._tasks
            }
            raise AssertionError(f"left in flight: {stuck}, background {rt._background}") from None
        # R15: every run (and labelled decide) that turned is reported ended.
        assert TURNED <= ENDED, f"never reported ended: {sorted(TURNED - ENDED)}"
        # The only failure the scripted dataplane causes is the unknown model's 404.
        failed = {r.id: r.error for r in rt.state.runs.values() if r.state is RunState.FAILED}
        assert all("no Generative replica" in str(e) for e in failed.values()), failed
        assert not rt.watchers._events, rt.watchers._events
        assert not rt._timers, f"budget timers left armed: {sorted(rt._timers)}"
        if hasattr(self, "baseline"):
            stray: set[asyncio.Task[Any]] = set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    while stray := self.stray_tasks():
                        await asyncio.sleep(0.01)
            assert not stray, f"tasks left running: {stray}"
        status = await self.http.get("/status")
        assert status.status_code == 200, status.text[:2000]
        tree = _strict_json(status.text)
        assert tree["runs"] == len(rt.state.runs)


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with tempfile.TemporaryDirectory(prefix="luftpause-fuzz-") as tmp:
        h = Harness(Path(tmp))
        try:
            yield h
        finally:
            h.close()
            if os.environ.get("LUFTPAUSE_FUZZ_COUNTS"):
                print(f"\nfuzz outcomes: {dict(h.counts)}")


# ----------------------------------------------------------------------------- strategies

NASTY_STRINGS = [
    "",
    " ",
    "\x00",
    "\t\n\r",
    "\ud800",
    "a\udfffb",
    "\u202e\u200b\ufeff",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🎉",
    "null",
    "None",
    "true",
    "0",
    "-1",
    "NaN",
    "1e400",
    "[1]",
    '{"a": 1}',
    "'; DROP TABLE runs;",
    "../../etc/passwd",
    "%s%n{0}",
    "<script>",
    "x" * 300,
    "interactive ",
    "INTERACTIVE",
    "lookup",
    "rm",
    "LOOKUP",
    "fake__lookup",
    "run-0000000000000000",
    "approve/x/0:0",
]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**31, 2**53 + 1, 2**63, -(2**63) - 1, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(NASTY_STRINGS),
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)
huge_strings = st.builds(
    lambda n, ch: ch * n, st.integers(10_000, 200_000), st.sampled_from(["x", "é", "🎉", "\x00"])
)
strings = st.one_of(
    st.text(max_size=60),
    st.sampled_from(NASTY_STRINGS),
    st.sampled_from(PLACEHOLDERS),
    huge_strings,
)


def for_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Schema-shaped values with the edges a client gets wrong (bounds +/- 1, odd types)."""
    if "anyOf" in schema:
        return st.one_of([for_schema(s) for s in schema["anyOf"]])
    if "enum" in schema:
        options = list(schema["enum"])
        near = [str(o).upper() for o in options] + [f" {o}" for o in options] + [None]
        return st.sampled_from(options) | st.sampled_from(near)
    kind = schema.get("type")
    if kind == "string":
        small = schema.get("minLength")
        edge = ["", "a"] if small else []
        return strings | st.sampled_from(edge or [" "])
    if kind in ("integer", "number"):
        bounds: list[Any] = []
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if key in schema:
                b = schema[key]
                bounds += [b - 1, b, b + 1]
        bounds += [0, -1, 1, 2**63, -(2**63), 10**400]
        ints = st.integers() | st.sampled_from(bounds)
        if kind == "integer":
            return ints | st.sampled_from([1.0, 1.5, "3", True])
        floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
            [5e-324, 1e-9, 0.5, 600.0, 600.0001, 1e308, math.inf, -0.0]
        )
        return ints | floats | st.sampled_from(["60", "1e400"])
    if kind == "boolean":
        return st.booleans() | st.sampled_from(["true", 0, 1, "yes"])
    if kind == "array":
        items = for_schema(schema.get("items") or {})
        top = min(int(schema.get("maxItems", 6)) + 2, 8)
        return st.lists(items, max_size=top) | st.lists(st.sampled_from(PLACEHOLDERS), max_size=3)
    if kind == "null":
        return st.none()
    return json_values


def valid_for(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values the schema admits, biased to its edges (bounds, huge, odd Unicode)."""
    if "anyOf" in schema:
        return st.one_of([valid_for(s) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(list(schema["enum"]))
    kind = schema.get("type")
    if kind == "string":
        least = int(schema.get("minLength", 0))
        return st.one_of(
            st.text(min_size=max(least, 1), max_size=40),
            st.sampled_from([t for t in NASTY_STRINGS if len(t) >= least]),
            st.sampled_from(PLACEHOLDERS),
            st.sampled_from(["lookup", "rm"]),
            huge_strings,
        )
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        if kind == "integer":
            lo = int(low) if low is not None else -(2**70)
            hi = int(high) if high is not None else 10**400
            ints = st.integers(lo, min(hi, lo + 100)) | st.sampled_from([lo, hi])
            return ints.filter(lambda v: v > low if "exclusiveMinimum" in schema else True)
        edges = [5e-324, 0.01, 0.5, 1, 60, 600.0, 600.5, 1e308, math.inf, 10**400]
        return st.sampled_from(
            [v for v in edges if (low is None or v > low) and (high is None or v <= high)]
        ) | st.floats(
            min_value=low,
            max_value=high,
            exclude_min="exclusiveMinimum" in schema,
            allow_nan=False,
            allow_infinity=high is None,
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        least = int(schema.get("minItems", 0))
        items = valid_for(schema.get("items") or {})
        return st.lists(items, min_size=least, max_size=max(least, 4))
    if kind == "null":
        return st.none()
    return json_values


@st.composite
def shaped_arguments(draw: st.DrawFn, schema: dict[str, Any]) -> dict[str, Any]:
    """Each property present or not, schema-shaped or arbitrary; sometimes extra keys."""
    props: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    args: dict[str, Any] = {}
    for key, sub in props.items():
        if not draw(st.booleans()) and not (key in required and draw(st.integers(0, 7))):
            continue
        how = draw(st.integers(0, 9))
        if key in HANDLE_KEYS and how < 6:
            handle = st.sampled_from(PLACEHOLDERS)
            args[key] = draw(
                st.lists(handle, min_size=1, max_size=3) if key == "handles" else handle
            )
            continue
        args[key] = draw(valid_for(sub) if how < 7 else for_schema(sub) if how < 9 else json_values)
    if props and draw(st.integers(0, 5)) == 0:
        key = draw(st.sampled_from(sorted(props)))
        args[key.upper() if key != key.upper() else key.lower()] = draw(json_values)
    extras = draw(st.dictionaries(st.text(max_size=10), json_values, max_size=2))
    if draw(st.integers(0, 4)) == 0:
        args.update({k: v for k, v in extras.items() if k not in props})
    return args


HANDLE_KEYS = ("handle", "handles", "parent")

answers = st.one_of(
    st.builds(lambda allow: {"action": "accept", "content": {"allow": allow}}, st.booleans()),
    st.sampled_from(
        [
            {"action": "decline"},
            {"action": "cancel"},
            {"action": "accept"},
            {"action": "accept", "content": {"allow": "yes"}},
        ]
    ),
    json_values,
)


LEAVE_AFTER = st.sampled_from([None] * 6 + [0.0, 0.002, 0.02, 0.2])


def _eras() -> st.SearchStrategy[tuple[str, dict[str, Any] | None, str]]:
    """Legacy session, or modern requests with drawn capabilities and clientInfo name
    (the modern caller identity, R4)."""
    modern_caps = st.sampled_from([None, {}, {"elicitation": {"form": {}}}])
    client = st.just("fuzz") | st.text(max_size=20) | st.sampled_from(NASTY_STRINGS)
    legacy = st.tuples(st.just(LEGACY), st.none(), st.just("fuzz"))
    return legacy | st.tuples(st.just(MODERN), modern_caps, client)


FUZZ_SETTINGS = settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


def test_tools_list_names_every_spec_tool(harness: Harness) -> None:
    """R1: both eras list exactly the spec's tools, each with an object input schema."""
    assert set(harness.schemas) == SPEC_TOOLS
    for name, schema in harness.schemas.items():
        assert schema.get("type") == "object", (name, schema)


@settings(FUZZ_SETTINGS, max_examples=110)
@given(data=st.data())
def test_fuzz_schema_shaped_arguments(harness: Harness, data: st.DataObject) -> None:
    """R1-R3, R9, R11, R13: schema-shaped edge-case arguments for every listed tool are
    accepted or refused (tool error / -32602 naming the problem), never crash, and leave
    no run, task, watcher or timer behind."""
    era, caps, client = data.draw(_eras(), label="era")
    name = data.draw(st.sampled_from(sorted(harness.schemas)), label="tool")
    args = data.draw(shaped_arguments(harness.schemas[name]), label="arguments")
    prelude = data.draw(st.sampled_from(PRELUDES), label="prelude")
    answer = data.draw(answers, label="answer to input requests")
    leave = data.draw(LEAVE_AFTER, label="client leaves after (s)")
    harness.example(era, {"name": name, "arguments": args}, caps, prelude, answer, client, leave)


@settings(FUZZ_SETTINGS, max_examples=60)
@given(data=st.data())
def test_fuzz_arbitrary_json_arguments(harness: Harness, data: st.DataObject) -> None:
    """R1, R2, R3, R13: arbitrary JSON as ``arguments`` (any type), extra ``params`` keys,
    missing arguments and unknown tool names get a tool error or -32602, never an
    internal error, and leave nothing in flight."""
    era, caps, client = data.draw(_eras(), label="era")
    name = data.draw(
        st.sampled_from(sorted(harness.schemas)) | st.sampled_from(["", "Spawn", "nope", "🎉"]),
        label="tool",
    )
    params: dict[str, Any] = {"name": name}
    if data.draw(st.integers(0, 5), label="with arguments"):
        params["arguments"] = data.draw(json_values, label="arguments")
    if data.draw(st.integers(0, 4), label="extra params") == 0:
        params["extra"] = data.draw(json_values, label="extra")
    prelude = data.draw(st.sampled_from(PRELUDES), label="prelude")
    answer = data.draw(answers, label="answer to input requests")
    leave = data.draw(LEAVE_AFTER, label="client leaves after (s)")
    harness.example(era, params, caps, prelude, answer, client, leave)


@settings(FUZZ_SETTINGS, max_examples=20)
@given(data=st.data())
def test_fuzz_answers_to_approval_requests(harness: Harness, data: st.DataObject) -> None:
    """R11, R12 (modern era): ``await``/``run`` covering a run that waits for approval ask
    for it with an input-required result; a retry carrying any answer (allow, deny,
    decline, cancel, malformed) is applied or ignored, never crashes, and the run ends."""
    name = data.draw(st.sampled_from(["await", "run"]), label="tool")
    if name == "await":
        timeout = data.draw(st.sampled_from([0.5, 2, 1e308]), label="timeout")
        args: dict[str, Any] = {"handles": ["@live"], "timeout": timeout}
    else:
        args = {"task": f"{SLOW} fuzzed", "tools": ["rm"]}
    answer = data.draw(answers, label="answer to input requests")
    kind = harness.example(
        MODERN, {"name": name, "arguments": args}, {"elicitation": {"form": {}}}, "approval", answer
    )
    assert kind.startswith("input required"), kind


KEYS = ["job-1", "job-2", "é🎉", "k" * 256, "k" * 257]
KEYED: dict[str, str] = {}  # idempotency key -> the handle its first accepted spawn got


@settings(FUZZ_SETTINGS, max_examples=40)
@given(data=st.data())
def test_fuzz_idempotency_keys(harness: Harness, data: st.DataObject) -> None:
    """R2, R8: ``spawn``/``run`` with an ``idempotencyKey`` of any JSON type, huge, odd
    Unicode, a lone surrogate, or one of a few keys reused with the same or other
    arguments: each call is accepted or a tool error (never a non-JSON or internal error),
    and every accepted call with a key gets the handle its key got first (one run)."""
    era, caps, client = data.draw(_eras(), label="era")
    name = data.draw(st.sampled_from(["spawn", "run"]), label="tool")
    keys = st.sampled_from(KEYS) | strings | json_values | huge_strings
    key = data.draw(keys.filter(lambda k: k not in PLACEHOLDERS), label="idempotencyKey")
    task = data.draw(st.sampled_from(["a", "b", f"{SLOW} c"]), label="task")
    args: dict[str, Any] = {"task": task, "idempotencyKey": key}
    leave = data.draw(LEAVE_AFTER, label="client leaves after (s)")
    kind = harness.example(era, {"name": name, "arguments": args}, caps, None, None, client, leave)
    assert kind in ("accepted", "tool error", "client left", "parse error"), kind
    if kind == "accepted" and isinstance(key, str):
        handle = harness.handles[-1]
        assert KEYED.setdefault(key, handle) == handle, (key[:80], handle)
    if kind == "tool error":
        text = _text(harness.last)
        assert len(text) < 1000, text[:200]  # a huge key is quoted cut
        if "idempotencyKey" not in text:  # the only other refusal here: the unknown task
            assert "task" in text, text[:300]


def test_one_key_spawned_from_both_eras_at_once_starts_one_run(harness: Harness) -> None:
    """R2, R8: the same ``idempotencyKey`` sent by a legacy session and a modern client at
    the same moment (each journal write slowed, so the first spawn is still under way)
    gives both the same handle, and only one run starts."""
    rt = harness.rt

    async def go() -> list[str]:
        before = set(rt.state.runs)
        spawn = {"name": "spawn", "arguments": {"task": "once", "idempotencyKey": "both-eras"}}
        with slow_journal(rt, 0.3):
            replies = await asyncio.gather(
                harness.request(LEGACY, "tools/call", spawn),
                harness.request(MODERN, "tools/call", spawn),
            )
        await harness.settle()
        handles = []
        for reply in replies:
            [message] = _messages(reply)
            handles.append(message["result"]["structuredContent"]["handle"])
        assert len(set(rt.state.runs) - before) == 1
        return handles

    first, second = harness.runner.run(go())
    assert first == second


# ----------------------------------------------------------------------------- regressions


@pytest.mark.parametrize("text", ["null", "true", "[1]", '{"a": 1}', "1"])
def test_json_looking_text_arguments_arrive_as_sent(harness: Harness, text: str) -> None:
    """R2, R8: a text argument that reads as JSON (``"null"``, ``"[1]"``...) is that text:
    the MCP SDK json-loads a string for a field not annotated ``str`` exactly, which
    dropped an ``idempotencyKey`` of ``"null"`` (a retry started a second run) and
    refused ``"[1]"``; the key and the system prompt are kept as sent, in both eras."""
    rt = harness.rt
    for era in (LEGACY, MODERN):
        # JSON allows whitespace around a value: a random tail of blanks makes the key
        # this test's own (no other test's spawn used it) and still JSON-looking.
        key = text + "".join(" \t"[bit] for bit in random.Random().choices((0, 1), k=32))
        assert json.loads(key) == json.loads(text)
        args = {"task": "once", "idempotencyKey": key, "system": text}
        handles = []
        for _ in range(2):
            kind = harness.example(era, {"name": "spawn", "arguments": args})
            assert kind == "accepted", harness.last
            handles.append(harness.handles[-1])
        assert handles[0] == handles[1]  # the retry found the key
        run = rt.state.runs[handles[0]]
        assert run.idempotency_key == key
        assert run.spec.system == text


def _text(result: dict[str, Any]) -> str:
    return "\n".join(c.get("text", "") for c in result.get("content") or [])


def test_decide_with_labels_on_an_unknown_model_is_a_tool_error(harness: Harness) -> None:
    """R13: a labelled ``decide`` whose turn fails (the dataplane's 404 for an unknown
    model) is a tool error that says why - it used to escape as a crash with the bare
    ``Error executing tool decide``."""
    for era in (LEGACY, MODERN):
        args = {"input": "is it?", "labels": ["yes", "no"], "model": "nope"}
        kind = harness.example(era, {"name": "decide", "arguments": args})
        assert kind == "tool error", harness.last
        assert "no Generative replica serves model 'nope'" in _text(harness.last)


def test_a_body_over_the_limit_is_a_json_rpc_error(harness: Harness) -> None:
    """R1: a request body over the MCP SDK's limit (4 MiB) is refused with status 413
    and a JSON-RPC error naming the limit (the SDK alone answers plain text)."""
    for era in (LEGACY, MODERN):
        args = {"task": "x" * (MAX_BODY_BYTES + 1)}
        kind = harness.example(era, {"name": "spawn", "arguments": args})
        assert kind == "too large", harness.last
        assert str(MAX_BODY_BYTES) in harness.last["message"]


def test_budget_timer_is_released_when_the_last_run_of_its_tree_ends(harness: Harness) -> None:
    """R10: a seconds budget's timer stays armed while its subtree runs and is released
    when the last run ends, also when that run is a descendant that outlived the owner
    (it used to stay armed until the budget's deadline, for ever with a huge budget)."""
    rt = harness.rt

    async def go() -> tuple[str, str]:
        handles = []
        for args in ({"task": "owner", "budgetSeconds": 1e9}, {"task": f"{SLOW} child"}):
            if handles:
                args["parent"] = handles[0]
            response = await harness.request(
                LEGACY, "tools/call", {"name": "spawn", "arguments": args}
            )
            [message] = _messages(response)
            handles.append(message["result"]["structuredContent"]["handle"])
        owner, child = (rt.state.runs[h] for h in handles)
        async with asyncio.timeout(10):
            while not owner.done:
                await asyncio.sleep(0.01)
        assert not child.done and owner.id in rt._timers  # the child still counts
        await harness.settle()  # asserts that no timer is left armed
        return owner.id, child.id

    owner, child = harness.runner.run(go())
    assert rt.state.runs[child].state is RunState.COMPLETED
    assert owner not in rt._timers


def test_non_finite_budget_seconds_is_refused_and_status_stays_json(harness: Harness) -> None:
    """R10, R9: ``budgetSeconds: Infinity`` (a literal both eras' JSON parsers accept,
    as they do 1e400) is refused naming the field; it used to be accepted and then
    every ``GET /status`` failed with a 500 (the tree held a non-JSON number)."""
    for era in (LEGACY, MODERN):
        args = {"task": "x", "budgetSeconds": math.inf}
        kind = harness.example(era, {"name": "spawn", "arguments": args})
        assert kind == "tool error", harness.last
        assert "budgetSeconds" in _text(harness.last) and "finite" in _text(harness.last)


def test_lone_surrogates_in_spawn_and_decide_text_are_refused_without_a_stuck_run(
    harness: Harness,
) -> None:
    """R2, R8, R13: a modern request (whose JSON parser lets ``\\ud800`` escapes through)
    with a lone surrogate in ``system``/``model``/``labels`` gets a tool error naming the
    field; it used to crash after the spawn was applied but could not be journaled,
    leaving a run ``Running`` for ever with no task (``decide`` crashed sending it on)."""
    calls = [
        ("spawn", {"task": "x", "system": "a\ud800"}, "system"),
        ("run", {"task": "x", "model": "\udc00"}, "model"),
        ("decide", {"input": "x", "labels": ["yes", "n\ud800"]}, "labels"),
        ("decide", {"input": "x", "model": "\ud800"}, "model"),
    ]
    runs = len(harness.rt.state.runs)
    for name, args, field in calls:
        kind = harness.example(MODERN, {"name": name, "arguments": args})  # settles too
        assert kind == "tool error", harness.last
        assert f"{field}: not valid Unicode" in _text(harness.last)
    assert len(harness.rt.state.runs) == runs


def test_a_non_ascii_client_name_is_a_header_safe_caller(harness: Harness) -> None:
    """R4, D3: a modern client's caller identity is its clientInfo name, which travels in
    the ``x-luftpause-caller`` header; a name with non-ASCII or control characters is
    escaped, so its runs work - they used to fail with an internal UnicodeEncodeError."""
    args = {"task": "hello"}
    kind = harness.example(MODERN, {"name": "run", "arguments": args}, client="Café 🎉\n")
    assert kind == "accepted", harness.last
    run = harness.rt.state.runs[harness.handles[-1]]
    assert run.state is RunState.COMPLETED, run.error
    assert run.caller == "client:Caf\\xe9 \\U0001f389\\n"


@contextlib.contextmanager
def slow_journal(rt: Runtime, seconds: float = 0.5) -> Iterator[None]:
    """Each journal write takes ``seconds`` longer: a window to leave a call mid-write."""
    write = rt.journal._write_sync

    def slow_write(data: bytes) -> None:
        time.sleep(seconds)
        write(data)

    rt.journal._write_sync = slow_write  # type: ignore[method-assign]
    try:
        yield
    finally:
        rt.journal._write_sync = write  # type: ignore[method-assign]


async def _leave_when(call: asyncio.Task[Any], recorded: Any) -> None:
    """Cancel ``call`` (the client leaves) once ``recorded()``: its journal write is under way."""
    async with asyncio.timeout(10):
        while not recorded():
            await asyncio.sleep(0.005)
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)


def test_an_approval_whose_caller_leaves_mid_journal_write_still_reaches_the_run(
    harness: Harness,
) -> None:
    """R11: an ``approve`` call cancelled (the modern client disconnects) after its answer
    was recorded but before the journal write finished still lets the run go on - the
    run used to wait for ever, every later answer refused as "already answered"."""
    rt = harness.rt

    async def go() -> str:
        await harness.prelude("approval")
        run = rt.state.runs[harness.handles[-1]]
        async with asyncio.timeout(10):
            while run.pending is None:
                await asyncio.sleep(0.005)
        args = {"handle": run.id, "allow": True}
        with slow_journal(rt):
            call = asyncio.create_task(
                harness.request(MODERN, "tools/call", {"name": "approve", "arguments": args})
            )
            await _leave_when(call, lambda: "0:0" in run.approvals)
        await harness.settle()
        return run.id

    run = rt.state.runs[harness.runner.run(go())]
    assert run.state is RunState.COMPLETED and run.result == "done", (run.state, run.error)
    assert run.approvals == {"0:0": True} and run.own.failed_tool_calls == 0


def test_a_spawn_whose_caller_leaves_mid_journal_write_still_starts_its_run(
    harness: Harness,
) -> None:
    """R2, R8: a ``spawn`` cancelled (the modern client disconnects) after the run was
    recorded but before the journal write finished still starts the run, which ends as
    any other - it used to stay ``Running`` for ever with no task to drive it."""
    rt = harness.rt

    async def go() -> set[str]:
        before = set(rt.state.runs)
        with slow_journal(rt):
            spawn = {"name": "spawn", "arguments": {"task": "orphan"}}
            call = asyncio.create_task(harness.request(MODERN, "tools/call", spawn))
            await _leave_when(call, lambda: set(rt.state.runs) - before)
        await harness.settle()
        return set(rt.state.runs) - before

    [handle] = harness.runner.run(go())
    run = rt.state.runs[handle]
    assert run.state is RunState.COMPLETED and run.result == "done", (run.state, run.error)
