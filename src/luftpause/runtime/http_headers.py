"""Request header values without surrounding whitespace, as HTTP defines them.

RFC 9110 §5.5: a field value does not include leading or trailing whitespace
(OWS, i.e. SP and HTAB); a parser excludes it before the value is evaluated.
uvicorn's httptools (llhttp) parser drops the leading OWS but keeps the
trailing OWS, so ``Mcp-Name: lookup \\t`` reaches the app as ``b"lookup \\t"``.
The MCP SDK then compares that value with the request body's ``params.name``
(2026-07-28 header validation), finds a mismatch and refuses a valid request
with -32020; the conformance suite's ``http-header-validation`` scenario checks
exactly this. ``StripHeaderWhitespace`` sits outermost and hands every later
layer (auth, DNS-rebinding checks, the SDK) the values RFC 9110 describes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OWS = b" \t"  # RFC 9110 §5.6.3: optional whitespace is SP / HTAB, nothing else


def strip_header_values(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The same headers, in the same order, each value without leading/trailing SP/HTAB."""
    return [(name, value.strip(OWS)) for name, value in headers]


class StripHeaderWhitespace:
    """Pure ASGI middleware: strips OWS around every request header value (http and
    websocket scopes) before ``app`` sees the scope; other scopes pass unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = list(scope.get("headers") or ())
            stripped = strip_header_values(headers)
            if stripped != headers:  # a new scope: the caller's stays as it was
                scope = {**scope, "headers": stripped}
        await self.app(scope, receive, send)
