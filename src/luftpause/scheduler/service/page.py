"""The live status page (S12): ``GET /``, its two assets, and the runtime tree it shows.

The page is plain HTML, CSS and JavaScript under ``luftpause/data/status-page/``
(no build step, no CDN: the machine that serves it may be offline). It polls
``GET /status`` every 2 s. With ``?runtime=URL`` it also shows the runtime's run
tree, which it gets from this server, never from the runtime itself:

``GET /ui/runtime-status?url=BASE`` fetches ``BASE/status`` and returns the
runtime's JSON unchanged. The page thus stays on one origin (no CORS on the
runtime, a strict Content-Security-Policy with ``connect-src 'self'``), and this
is not an open proxy:

* ``BASE`` is ``http(s)://host[:port]`` and nothing else (no path, query, user
  info); the request is always ``GET BASE/status``, redirects are not followed,
  the body is read up to :data:`MAX_BODY`;
* the host is a loopback address or ``localhost``, or ``BASE`` is one of the
  runtimes the scheduler was given (``status_app(..., runtimes=...)``);
* only a runtime's status comes back (a JSON object whose ``service`` is
  ``"runtime"``); anything else is a 502 with a one-line reason;
* the scheduler adds no credential of its own: it forwards the caller's
  ``Authorization`` header and nothing else, so reaching this port grants no
  access to a runtime that asks for a token (X2).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Iterable
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ASSETS = "status-page"
MAX_BODY = 16 * 1024 * 1024
FETCH_TIMEOUT_S = 5.0

# Only what the page itself needs: its own script and style, and fetches to this origin.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class BadRuntimeUrl(ValueError):
    """The ``url`` of a runtime-status request is malformed or not allowed."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _asset(name: str) -> bytes:
    return (resources.files("luftpause") / "data" / ASSETS / name).read_bytes()


def _origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of ``http(s)://host[:port]``; anything more is refused."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise BadRuntimeUrl(f"not a URL: {url!r}", 400) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRuntimeUrl(f"expected http(s)://host:port, got {url!r}", 400)
    if parts.username is not None or parts.password is not None:
        raise BadRuntimeUrl("a runtime URL with user info is not allowed", 400)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise BadRuntimeUrl(
            f"expected the runtime's base URL, http(s)://host:port, got {url!r}", 400
        )
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, parts.hostname.lower(), default if port is None else port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RuntimeFetcher:
    """Checks a runtime URL against the allowed ones and fetches its ``/status``."""

    def __init__(self, runtimes: Iterable[str] = ()) -> None:
        self.allowed = frozenset(_origin(u.rstrip("/")) for u in runtimes)

    def target(self, url: str) -> str:
        """The status URL to fetch for ``url``, or :class:`BadRuntimeUrl`."""
        scheme, host, port = _origin(url)
        if not _is_loopback(host) and (scheme, host, port) not in self.allowed:
            raise BadRuntimeUrl(
                f"{host}:{port} is not a runtime this scheduler may fetch from: only loopback "
                "addresses and the runtimes in its configuration",
                403,
            )
        netloc = f"[{host}]" if ":" in host else host
        return f"{scheme}://{netloc}:{port}/status"

    async def fetch(self, url: str, authorization: str | None) -> tuple[int, dict[str, Any]]:
        """``(status, body)``: the runtime's status JSON, or ``{"error": ...}``."""
        try:
            target = self.target(url)
        except BadRuntimeUrl as exc:
            return exc.status, {"error": str(exc)}
        # identity: the size cap counts the bytes as sent, never a decompressed bomb
        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        if authorization:
            headers["Authorization"] = authorization
        try:
            # One deadline for the whole fetch: a peer that drips bytes cannot hold it.
            async with (
                asyncio.timeout(FETCH_TIMEOUT_S),
                httpx.AsyncClient(
                    timeout=FETCH_TIMEOUT_S, follow_redirects=False, trust_env=False
                ) as client,
                client.stream("GET", target, headers=headers) as resp,
            ):
                body = bytearray()
                async for chunk in resp.aiter_raw():
                    body += chunk
                    if len(body) > MAX_BODY:
                        return 502, {"error": f"{target}: answer larger than {MAX_BODY} bytes"}
                code = resp.status_code
        except (httpx.TimeoutException, TimeoutError):
            return 504, {"error": f"{target}: no answer within {FETCH_TIMEOUT_S:g} s"}
        except httpx.HTTPError as exc:
            return 502, {"error": f"cannot reach the runtime at {target}: {_reason(exc)}"}
        if code == 401:
            return 401, {
                "error": "the runtime refused the token"
                if authorization
                else "the runtime needs a token (its LUFTPAUSE_TOKEN)"
            }
        if code != 200:
            return 502, {"error": f"{target} answered HTTP {code}"}
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.get("service") != "runtime":
            return 502, {"error": f"{target} is not a luftpause runtime's status"}
        return 200, data


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def page_routes(runtimes: Iterable[str] = ()) -> list[Route]:
    """``/`` (the page), ``/ui/status.js``, ``/ui/status.css`` and ``/ui/runtime-status``."""
    fetcher = RuntimeFetcher(runtimes)
    assets = {
        "/": (_asset("index.html"), "text/html; charset=utf-8"),
        "/ui/status.js": (_asset("status.js"), "text/javascript; charset=utf-8"),
        "/ui/status.css": (_asset("status.css"), "text/css; charset=utf-8"),
    }

    def serve(path: str) -> Route:
        body, media_type = assets[path]

        async def asset(_: Request) -> Response:
            headers = dict(_HEADERS)
            if path == "/":
                headers["Content-Security-Policy"] = CSP
            return Response(body, media_type=media_type, headers=headers)

        return Route(path, asset, methods=["GET"])

    async def runtime_status(request: Request) -> JSONResponse:
        url = request.query_params.get("url")
        if not url:
            return JSONResponse({"error": "missing ?url=<runtime base URL>"}, 400)
        code, body = await fetcher.fetch(url, request.headers.get("authorization"))
        return JSONResponse(body, code, headers={"Cache-Control": "no-store"})

    return [
        *(serve(p) for p in assets),
        Route("/ui/runtime-status", runtime_status, methods=["GET"]),
    ]
