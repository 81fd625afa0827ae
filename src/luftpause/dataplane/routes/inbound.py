"""What every turn route does with a request before it asks for admission.

Who the caller is (``authorize``, D9, B13), the class its key may use
(``served_class``, B13), and the request body, read within the size limit and only
if it is JSON (``read_body``).
"""

from __future__ import annotations

from collections.abc import Mapping

from luftpause import callers
from luftpause.callers import KeyedCaller, Principal
from luftpause.dataplane.asgi import Incoming
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.errors import (
    BodyTooLarge,
    ClientLeft,
    Forbidden,
    NotJson,
    Unauthorized,
    shown,
)


def authorize(dp: Dataplane, headers: Mapping[str, str]) -> Principal:
    """Who the request is (D9, B13): with a token set, every /v1 route needs
    ``Authorization: Bearer <token>`` (the scheme is case-insensitive, as every HTTP auth
    scheme is) or, as Anthropic's clients send it, ``x-api-key: <token>``; with
    ``[[callers]]``, a caller's key in either header instead makes it that caller's."""
    principal = dp.gate.principal(headers.get("authorization"), headers.get("x-api-key"))
    if principal is not None:
        return principal
    if dp.gate.keyring is not None:
        raise Unauthorized(
            "missing or unknown key (set Authorization: Bearer <your key>, or x-api-key: "
            "<your key>)"
        )
    raise Unauthorized(
        "missing or wrong bearer token (set Authorization: Bearer <token>, or x-api-key: <token>)"
    )


def served_class(dp: Dataplane, incoming: Incoming, principal: Principal, asked: str) -> str:
    """The class a turn is served in (B13). A class its key may not use is counted, and
    either refused or downgraded; a downgraded answer says so
    (``x-luftpause-class-denied``, among the request's extra headers)."""
    try:
        served, denied = callers.served_class(principal, asked)
    except callers.ClassDenied as exc:
        assert isinstance(principal, KeyedCaller)
        dp.metrics.class_denied(principal.name, "refused").inc()
        raise Forbidden(str(exc)) from None
    if denied is not None:
        assert isinstance(principal, KeyedCaller)
        dp.metrics.class_denied(principal.name, "downgraded").inc()
        incoming.extra_headers.append((_DENIED, denied.encode()))
    return served


_DENIED = callers.DENIED_HEADER.encode()


async def read_body(incoming: Incoming, limit: int) -> bytes:
    """The request body, if it is JSON (or says nothing of its type) and at most
    ``limit`` bytes: a larger one is refused before the rest of it is read, so it
    never reaches an engine."""
    headers = incoming.headers
    content_type = headers.get("content-type", "")
    media = content_type.partition(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise NotJson(f"Content-Type must be application/json, got {shown(content_type)}")
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(_too_large(int(declared), limit))
    parts: list[bytes] = []
    size = 0
    while True:
        message = await incoming.receive()
        if message["type"] == "http.disconnect":
            raise ClientLeft("client left while sending its request")
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise BodyTooLarge(_too_large(None, limit))
        parts.append(part)
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _too_large(size: int | None, limit: int) -> str:
    what = f"{size} bytes" if size is not None else "more"
    return (
        f"request body is {what}; this proxy takes at most {limit} bytes (dataplane.max_body_bytes)"
    )
