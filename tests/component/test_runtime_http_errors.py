"""R1, X2 (the runtime's HTTP surface): every error answer is JSON.

The runtime app (``build_app``, as ``luftpause runtime`` builds it, with a scripted
dataplane and tool hub) runs behind the services' uvicorn on 127.0.0.1:0. On
``/mcp`` the MCP SDK answers a bad ``Content-Type`` in plain text and, on the
2026-07-28 path, a bad ``Accept`` or a wrong method with an empty body; here each is
a JSON-RPC error with the same status, naming what was wrong and what is expected.
A request uvicorn's parser refuses is a JSON-RPC 400 on ``/mcp`` and the runtime's
``{"error": {"message": ...}}`` elsewhere, as is an unknown route. Good requests
of both protocol eras, with every ``Accept`` and ``Content-Type`` the SDK takes, are
still served, and the SDK's own JSON errors pass unchanged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from _mcp_raw import LEGACY, MODERN, RawMcp
from _raw_http import exchange
from _runtime_fakes import Hub, runtime

from luftpause.runtime.server import MAX_BODY_BYTES, build_app, malformed_answer
from luftpause.serving import bind_socket, bound_port, uvicorn_server, wait_started

BOTH = "application/json, text/event-stream"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": LEGACY,
        "capabilities": {},
        "clientInfo": {"name": "http-errors", "version": "0"},
    },
}
LIST = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/list",
    "params": {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "http-errors", "version": "0"},
        }
    },
}


@dataclass
class Served:
    port: int
    http: httpx.AsyncClient


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    rt, records = runtime(tmp_path, Hub())

    async def on_start() -> None:
        rt.recover(records)

    async def on_stop() -> None:
        await rt.shutdown()

    app = build_app(rt, host="127.0.0.1", token=None, on_start=on_start, on_stop=on_stop)
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn_server(app, malformed=malformed_answer)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_started(server, task)
    port = bound_port(sock)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        yield Served(port, http)
    server.should_exit = True
    async with asyncio.timeout(10):
        await task
    sock.close()


def jsonrpc_error(response: httpx.Response) -> str:
    """The message of a JSON-RPC error answer (id null: the request was never read)."""
    assert response.headers["content-type"] == "application/json", response.content
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    assert body["error"]["code"] == -32600
    message = body["error"]["message"]
    assert isinstance(message, str)
    return message


def modern(method: str = "tools/list") -> dict[str, str]:
    return {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}


@pytest.mark.parametrize("era", [{}, modern()], ids=["2025-11-25", "2026-07-28"])
async def test_a_bad_content_type_is_a_jsonrpc_400_naming_what_is_expected(
    served: Served, era: dict[str, str]
) -> None:
    """Was ``400 "Invalid Content-Type header"`` in plain text, with no content type."""
    for given in ("text/plain", None):
        headers = {"Accept": BOTH, **era}
        if given:
            headers["Content-Type"] = given
        response = await served.http.post("/mcp", content=json.dumps(LIST), headers=headers)
        assert response.status_code == 400
        message = jsonrpc_error(response)
        assert "must be sent as application/json" in message
        assert ("'text/plain'" if given else "got none") in message


async def test_a_bad_accept_on_the_modern_path_is_a_jsonrpc_406_naming_what_is_missing(
    served: Served,
) -> None:
    """Was an empty 406. The SDK wants both media types (or wildcards) on this path."""
    for accept, missing in (
        ("text/html", "application/json and text/event-stream"),
        ("application/json", "text/event-stream"),
        ("text/*", "application/json"),
    ):
        response = await served.http.post(
            "/mcp",
            content=json.dumps(LIST),
            headers={"Content-Type": "application/json", "Accept": accept, **modern()},
        )
        assert response.status_code == 406
        message = jsonrpc_error(response)
        assert message.startswith("Not Acceptable: Accept must include application/json and ")
        assert f"got {accept!r}, which lacks {missing}" in message


async def test_a_wrong_method_on_the_modern_path_is_a_jsonrpc_405_with_allow(
    served: Served,
) -> None:
    """Was an empty 405."""
    response = await served.http.get("/mcp", headers={"Accept": BOTH, **modern()})
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert jsonrpc_error(response) == (
        f"Method Not Allowed: GET on /mcp at MCP-Protocol-Version '{MODERN}'; use POST"
    )


async def test_a_foreign_host_or_origin_is_a_jsonrpc_error(served: Served) -> None:
    """Were ``421 "Invalid Host header"`` and ``403 "Invalid Origin header"`` in plain text."""
    sent = {"Content-Type": "application/json", "Accept": BOTH}
    host = await served.http.post(
        "/mcp", content=json.dumps(INIT), headers={**sent, "Host": "evil.example"}
    )
    assert host.status_code == 421
    assert jsonrpc_error(host).startswith("Invalid Host header: 'evil.example' is not a name")
    origin = await served.http.post(
        "/mcp", content=json.dumps(INIT), headers={**sent, "Origin": "http://evil.example"}
    )
    assert origin.status_code == 403
    assert jsonrpc_error(origin).startswith("Invalid Origin header: 'http://evil.example'")


async def test_a_body_over_the_limit_is_still_a_jsonrpc_413(served: Served) -> None:
    response = await served.http.post(
        "/mcp",
        content=b"x" * (MAX_BODY_BYTES + 1),
        headers={"Content-Type": "application/json", "Accept": BOTH},
    )
    assert response.status_code == 413
    assert jsonrpc_error(response) == f"request body too large: the limit is {MAX_BODY_BYTES} bytes"


async def test_an_unknown_route_is_json_listing_the_routes(served: Served) -> None:
    """Was ``404 text/plain "Not Found"`` from the SDK's router."""
    for method, path in (("GET", "/nowhere"), ("POST", "/status"), ("GET", "/mcp/x")):
        response = await served.http.request(method, path)
        assert response.status_code == 404
        assert response.headers["content-type"] == "application/json"
        message = response.json()["error"]["message"]
        assert message.startswith(f"no route {method} {path}; the runtime serves ")
        assert "GET /status" in message and "/mcp" in message


async def test_the_sdks_own_json_errors_pass_unchanged(served: Served) -> None:
    """The 2025-11-25 path answers a bad Accept in JSON itself: its words are kept."""
    response = await served.http.post(
        "/mcp",
        content=json.dumps(INIT),
        headers={"Content-Type": "application/json", "Accept": "text/html"},
    )
    assert response.status_code == 406
    assert jsonrpc_error(response) == (
        "Not Acceptable: Client must accept both application/json and text/event-stream"
    )


@pytest.mark.parametrize(
    ("content_type", "accept", "legacy"),
    [
        ("application/json", BOTH, True),
        ("application/json; charset=utf-8", "*/*", True),
        ("application/json", "application/*, text/*", True),
        ("application/json", "application/json;q=0.9, text/event-stream;q=0.8", True),
        # The 2025-11-25 path compares the media type case-sensitively (a JSON 415); the
        # 2026-07-28 path takes any case.
        ("Application/JSON", BOTH, False),
    ],
)
async def test_good_requests_of_both_eras_are_still_served(
    served: Served, content_type: str, accept: str, legacy: bool
) -> None:
    """What the SDK takes is unchanged: ``initialize`` opens a session, and a 2026-07-28
    ``tools/list`` lists the tools, with each Accept / Content-Type spelling it takes."""
    sent = {"Content-Type": content_type, "Accept": accept}
    if legacy:
        opened = await served.http.post("/mcp", content=json.dumps(INIT), headers=sent)
        assert opened.status_code == 200, opened.content
        assert opened.headers["mcp-session-id"]
    listed = await served.http.post("/mcp", content=json.dumps(LIST), headers={**sent, **modern()})
    assert listed.status_code == 200, listed.content
    assert '"tools"' in listed.text and '"spawn"' in listed.text


async def test_the_raw_clients_of_the_conformance_style_tests_still_work(served: Served) -> None:
    raw = RawMcp(served.http)
    session = await raw.legacy_session({})
    assert (await raw.legacy(session, "tools/list", {})).result["tools"]
    assert (await raw.modern("tools/list", {})).result["tools"]


async def test_a_control_character_in_a_header_is_a_jsonrpc_400_on_mcp(served: Served) -> None:
    """Was uvicorn's ``400 text/plain "Invalid HTTP request received."``."""
    request = (
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\nMcp-Name: look\x01up\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )
    answer, closed = await exchange(served.port, request)
    assert (answer.status, answer.headers["content-type"], closed) == (
        400,
        "application/json",
        True,
    )
    body: dict[str, Any] = json.loads(answer.body)
    assert (body["jsonrpc"], body["id"], body["error"]["code"]) == ("2.0", None, -32600)
    assert "'Mcp-Name' holds a control character (0x01)" in body["error"]["message"]


async def test_a_control_character_in_a_header_elsewhere_is_the_runtimes_error(
    served: Served,
) -> None:
    request = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer t\x7f\r\n\r\n"
    answer, closed = await exchange(served.port, request)
    assert (answer.status, answer.headers["content-type"], closed) == (
        400,
        "application/json",
        True,
    )
    message = json.loads(answer.body)["error"]["message"]
    assert "'Authorization' holds a control character (0x7f)" in message
