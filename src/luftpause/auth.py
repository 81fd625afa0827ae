"""Bearer-token checks shared by every service (D9, X2).

With ``LUFTPAUSE_TOKEN`` set, a request must carry ``Authorization: Bearer <token>``:
the scheme in any case (as every HTTP auth scheme), the token compared in constant
time. ``BearerAuth`` guards chosen paths of an ASGI app; the scheduler's gRPC server
and the dataplane's channel to it use :func:`bearer_ok` and :func:`bearer` directly.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp

REFUSED = "missing or wrong bearer token (set Authorization: Bearer <LUFTPAUSE_TOKEN>)"


def bearer(token: str) -> str:
    """The ``Authorization`` value that carries ``token``."""
    return f"Bearer {token}"


def bearer_value(authorization: str | bytes | None) -> str | None:
    """What an ``Authorization`` value carries after its ``Bearer`` scheme (in any
    case), or None when it is not a bearer credential."""
    if authorization is None:
        return None
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    scheme, _, value = authorization.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def bearer_ok(authorization: str | bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` value carries ``token`` (scheme case-insensitive)."""
    given = bearer_value(authorization)
    return given is not None and hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), token.encode()
    )


def api_key_ok(api_key: str | bytes | None, token: str) -> bool:
    """Whether an ``x-api-key`` value (Anthropic's way, which Claude Code uses) is
    ``token``, compared in constant time."""
    if api_key is None:
        return False
    if isinstance(api_key, bytes):
        api_key = api_key.decode("latin-1")
    return hmac.compare_digest(api_key.strip().encode("utf-8", "surrogateescape"), token.encode())


def refusal(message: str = REFUSED) -> JSONResponse:
    """The 401 every service answers: a JSON error and ``WWW-Authenticate: Bearer``."""
    return JSONResponse(
        {"error": {"message": message}},
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


class BearerAuth:
    """ASGI middleware: requests whose path ``guarded(path)`` says need the token; the
    rest pass. Without a token everything passes (the service warns at start)."""

    def __init__(self, app: ASGIApp, token: str | None, guarded: Callable[[str], bool]) -> None:
        self.app = app
        self.token = token
        self.guarded = guarded

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if self.token is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.guarded(str(scope.get("path", ""))):
            given = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
            if not bearer_ok(given, self.token):
                await refusal()(scope, receive, send)
                return
        await self.app(scope, receive, send)
