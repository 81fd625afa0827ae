"""X2, D9: one bearer check for every service: the scheme in any case, the token exact."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from luftpause.auth import BearerAuth, bearer, bearer_ok


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer t0k", True),
        ("bearer t0k", True),
        ("BEARER  t0k ", True),
        (b"Bearer t0k", True),
        ("Bearer t0kk", False),
        ("Bearer ", False),
        ("Basic t0k", False),
        ("t0k", False),
        ("", False),
        (None, False),
        ("Bearer t\u00f6k", False),
    ],
)
def test_bearer_ok(header: str | bytes | None, ok: bool) -> None:
    assert bearer_ok(header, "t0k") is ok
    assert bearer_ok(bearer("t0k"), "t0k")


async def test_middleware_guards_only_the_paths_it_is_given() -> None:
    """X2: guarded paths answer 401 with ``WWW-Authenticate: Bearer`` and a JSON error;
    other paths, and everything without a token, pass."""

    async def hello(_: object) -> PlainTextResponse:
        return PlainTextResponse("hi")

    inner = Starlette(routes=[Route("/status", hello), Route("/health", hello)])
    guarded = BearerAuth(inner, "t0k", lambda path: path == "/status")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(guarded), base_url="http://x") as c:
        refused = await c.get("/status")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in refused.json()["error"]["message"]
        assert (await c.get("/status", headers={"authorization": "bearer t0k"})).text == "hi"
        assert (await c.get("/health")).text == "hi"
    open_app = BearerAuth(inner, None, lambda path: True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(open_app), base_url="http://x") as c:
        assert (await c.get("/status")).text == "hi"
