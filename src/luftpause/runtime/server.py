"""The runtime's HTTP app: ``/mcp`` (the MCP server), ``GET /status``, ``GET /health``.

``build_mcp`` puts the tool layer (``tools.py``) on the SDK's MCP server; how
calls talk to their clients is the protocol layer (``protocol.py``). This
module adds what HTTP needs around them: DNS-rebinding protection, the body
limit as a JSON-RPC error, and bearer-token auth (X2).
"""

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.request_state import RequestStateSecurity
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from mcp_types import CallToolResult, InputRequiredResult
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from luftpause.auth import BearerAuth
from luftpause.runtime.http_headers import StripHeaderWhitespace
from luftpause.runtime.loop import Runtime
from luftpause.runtime.mcp_tasks import TasksExtension, TaskStore
from luftpause.runtime.protocol import describe_argument_errors
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


def _needs_token(path: str) -> bool:
    """X2: ``/mcp`` and ``/status`` need the token; ``/health`` and ``/metrics`` do not."""
    return path.startswith((MCP_PATH, "/status"))


def build_app(
    rt: Runtime,
    *,
    host: str,
    token: str | None,
    on_start: Callable[[], Awaitable[None]],
    on_stop: Callable[[], Awaitable[None]],
    request_state_key: bytes | None = None,
) -> ASGIApp:
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
            Mount("/", app=JsonRpcBodyLimit(mcp_app)),
        ],
        lifespan=lifespan,
    )
    return StripHeaderWhitespace(BearerAuth(app, token, _needs_token))
