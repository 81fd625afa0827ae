"""The runtime's HTTP app: ``/mcp`` (the MCP server), ``GET /status``, ``GET /health``.

``build_mcp`` puts the tool layer (``tools.py``) on the SDK's MCP server; how
calls talk to their clients is the protocol layer (``protocol.py``). This
module adds what HTTP needs around them: DNS-rebinding protection, bearer-token
auth (X2; with ``[[callers]]``, callers' keys on ``/mcp``: :class:`CallerAuth`, B13),
and JSON for every error answer: the SDK's plain-text or empty refusals
on ``/mcp`` (a bad ``Content-Type`` or ``Accept``, a body over the limit, a wrong
method, a foreign ``Host`` or ``Origin``) become JSON-RPC errors with the same
status, naming what was wrong and what is expected; an unknown route or a bug
anywhere else is ``{"error": {"message": ...}}`` (``JsonErrorAnswers``).
"""

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.request_state import RequestStateSecurity
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from mcp_types import CallToolResult, InputRequiredResult
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from luftpause.auth import BearerAuth, bearer_ok, refusal
from luftpause.callers import Gate
from luftpause.http_errors import (
    JsonErrorAnswers,
    Malformed,
    Refusal,
    plain_error,
    refusal_message,
)
from luftpause.runtime.http_headers import StripHeaderWhitespace
from luftpause.runtime.loop import Runtime
from luftpause.runtime.mcp_tasks import TasksExtension, TaskStore
from luftpause.runtime.protocol import PRINCIPAL_SCOPE_KEY, describe_argument_errors
from luftpause.runtime.status import status_tree
from luftpause.runtime.tools import INSTRUCTIONS, RuntimeTools
from luftpause.shown import shown

log = logging.getLogger("luftpause.runtime.server")

MCP_PATH = "/mcp"

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


REQUEST_STATE_TTL_S = 3600.0  # how long a client may take to answer an approval it was shown


class RuntimeMCPServer(MCPServer[Any]):
    """The SDK's server, with argument errors a person can read (which argument, what
    was expected, what was given) instead of pydantic's dump, and an unknown tool's
    name cut as every value quoted back is (``luftpause.shown``)."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError) and not isinstance(exc, UnexpectedToolError):
                raise ToolError(describe_argument_errors(name, cause)) from cause
            if cause is None and str(exc) == f"Unknown tool: {name}":  # the SDK's, name whole
                raise ToolError(f"Unknown tool: {shown(name)}") from None
            raise


def build_mcp(
    rt: Runtime,
    *,
    request_state_key: bytes | None = None,
    tasks: TasksExtension | None = None,
) -> MCPServer[Any]:
    """The runtime's MCP server: the protocol layer of the SDK with our tools on it.

    The ``requestState`` of an input-required result (deadline, what was asked, the
    run ``run`` started) is sealed by the SDK (AES-GCM, bound to the tool, its
    arguments and the caller, with an expiry), so a client cannot edit it or replay
    it for another call. ``request_state_key`` (from the state dir) keeps a pending
    round valid across a restart; without it the key lives as long as the process.
    """
    security = (
        RequestStateSecurity(keys=[request_state_key], ttl=REQUEST_STATE_TTL_S)
        if request_state_key is not None
        else RequestStateSecurity.ephemeral(ttl=REQUEST_STATE_TTL_S)
    )
    mcp: MCPServer[Any] = RuntimeMCPServer(
        "luftpause-runtime",
        version="0.1.0",
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        request_state_security=security,
        extensions=[tasks] if tasks is not None else None,
    )
    RuntimeTools(rt).register(mcp, tasks)
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


ROUTES = "POST, GET and DELETE /mcp (MCP), GET /status, GET /health and GET /metrics"


def _jsonrpc_error(status: int, message: str) -> dict[str, Any]:
    """A JSON-RPC error for a request that was never read (id null), as the SDK words its
    own HTTP-level refusals: -32600 for a refused request, -32603 for a fault of ours."""
    code = -32603 if status >= 500 else -32600
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}


def _mcp_refusal(refusal: Refusal) -> str:
    """What the MCP SDK refused on ``/mcp`` in plain text or with an empty body, and
    what it expects. The SDK decides; this only words its answer (the request's own
    headers say which of its rules it failed)."""
    status, headers = refusal.status, refusal.headers
    if status == 413:
        return f"request body too large: the limit is {MAX_BODY_BYTES} bytes"
    if status == 400 and refusal.method == "POST":
        given = headers.get("content-type")
        if given is None or not given.lower().startswith("application/json"):
            got = shown(given) if given is not None else "none"
            return (
                "Invalid Content-Type header: a POST to /mcp must be sent as "
                f"application/json, got {got}"
            )
    if status == 406:
        # The SDK's own reading of Accept (wildcards included) says what it missed.
        has_json, has_sse = check_accept_headers(Request({"type": "http", "headers": headers.raw}))
        wanted = (("application/json", has_json), ("text/event-stream", has_sse))
        missing = [media for media, ok in wanted if not ok]
        accept = headers.get("accept")
        got = shown(accept) if accept is not None else "none"
        if missing:
            return (
                "Not Acceptable: Accept must include application/json and text/event-stream "
                f"(or */*), got {got}, which lacks {' and '.join(missing)}"
            )
        return (
            "Not Acceptable: this request is answered with an event stream: Accept must "
            f"include text/event-stream, got {got}"
        )
    if status == 405:
        allowed = refusal.response_headers.get("allow", "")
        version = headers.get("mcp-protocol-version")
        at = f" at MCP-Protocol-Version {shown(version)}" if version else ""
        return f"Method Not Allowed: {refusal.method} on /mcp{at}; use {allowed or 'POST'}"
    if status == 421:
        host = headers.get("host")
        return (
            f"Invalid Host header: {shown(host) if host else 'none'} is not a name this "
            "runtime answers to (DNS-rebinding protection: it answers to the address it "
            "listens on and to loopback names)"
        )
    if status == 403:
        return (
            f"Invalid Origin header: {shown(headers.get('origin', ''))} is not an origin "
            "this runtime answers to (DNS-rebinding protection: loopback origins and its own "
            "address only)"
        )
    return refusal_message(refusal, "runtime", ROUTES)


def refusal_body(refusal: Refusal) -> dict[str, Any]:
    """The JSON for an error a layer under the runtime answered in plain text or with an
    empty body: a JSON-RPC error on ``/mcp`` (an MCP client reads JSON-RPC), the
    runtime's ``{"error": {"message": ...}}`` on its other routes."""
    if refusal.path == MCP_PATH:
        return _jsonrpc_error(refusal.status, _mcp_refusal(refusal))
    return {"error": {"message": refusal_message(refusal, "runtime", ROUTES)}}


def malformed_answer(request: Malformed) -> tuple[dict[str, Any], dict[str, str]]:
    """The 400 for a request uvicorn's HTTP parser refused: JSON-RPC on ``/mcp``."""
    if request.path == MCP_PATH:
        return _jsonrpc_error(400, request.problem), {}
    return plain_error(request)


def _needs_token(path: str) -> bool:
    """X2: ``/mcp`` and ``/status`` need the token; ``/health`` and ``/metrics`` do not."""
    return path.startswith((MCP_PATH, "/status"))


KEY_REFUSED = (
    "missing or unknown key (set Authorization: Bearer <your caller key>, or x-api-key: "
    "<your caller key>)"
)


class CallerAuth:
    """ASGI middleware for a stack with ``[[callers]]`` (B13): ``/mcp`` takes a caller's
    key or the token (``Authorization: Bearer`` or ``x-api-key``), and leaves the
    request's principal in its scope (``PRINCIPAL_SCOPE_KEY``) for the tools; ``/status``
    takes the token only (``Authorization: Bearer``, as without callers); ``/health``
    and ``/metrics`` are open. A refusal is the services' 401 and never quotes what was
    presented."""

    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if path.startswith(MCP_PATH):
            authorization = api_key = None
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    authorization = value
                elif name == b"x-api-key":
                    api_key = value
            principal = self.gate.principal(authorization, api_key)
            if principal is None:
                await refusal(KEY_REFUSED)(scope, receive, send)
                return
            scope[PRINCIPAL_SCOPE_KEY] = principal
        elif path.startswith("/status"):
            token = self.gate.token
            given = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
            if token is not None and not bearer_ok(given, token):
                await refusal()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(
    rt: Runtime,
    *,
    host: str,
    token: str | None,
    on_start: Callable[[], Awaitable[None]],
    on_stop: Callable[[], Awaitable[None]],
    request_state_key: bytes | None = None,
    gate: Gate | None = None,
) -> ASGIApp:
    """The runtime's app. ``gate`` (built from ``[[callers]]``): callers' keys on
    ``/mcp`` (:class:`CallerAuth`); without callers (no gate, or one without a
    keyring) the token alone guards ``/mcp`` and ``/status``, as before."""
    tasks = TasksExtension(TaskStore(Path(rt.settings.state_dir)))
    mcp = build_mcp(rt, request_state_key=request_state_key, tasks=tasks)
    mcp_app = mcp.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=False,
        transport_security=transport_security_for(host),
        host=host,
        max_request_body_size=MAX_BODY_BYTES,
    )

    async def status_route(_: Request) -> JSONResponse:
        return JSONResponse(status_tree(rt, tasks.store))

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "service": "runtime"})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await on_start()
        try:
            # A mounted app's own lifespan never runs: enter the session manager here.
            async with tasks.running(), mcp.session_manager.run():
                yield
        finally:
            await on_stop()

    app = Starlette(
        routes=[
            Route("/status", status_route, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Mount("/", app=mcp_app),
        ],
        lifespan=lifespan,
    )
    inner = JsonErrorAnswers(app, refusal_body)
    if gate is not None and gate.keyring is not None:
        return StripHeaderWhitespace(CallerAuth(inner, gate))
    return StripHeaderWhitespace(BearerAuth(inner, token, _needs_token))
