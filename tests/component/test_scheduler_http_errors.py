"""S12, X2 (the scheduler's status HTTP): every error answer is JSON,
``{"error": {"message": ...}}``.

The real ``status_app`` behind the services' uvicorn on 127.0.0.1:0: an unknown
route (Starlette's plain-text 404) lists the routes, a wrong method (its plain-text
405) keeps ``Allow`` and names it, a bug (its plain-text 500) says it is logged, and
a request uvicorn's parser refuses (its plain-text 400) names the header at fault.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from _raw_http import exchange

from luftpause.scheduler.core import EndpointKind, Params, ReplicaSpec, initial_state
from luftpause.scheduler.service.host import Host
from luftpause.scheduler.service.status_http import status_app
from luftpause.serving import bind_socket, bound_port, uvicorn_server, wait_started

SPECS = (ReplicaSpec("engine-a", EndpointKind.GENERATIVE, frozenset({"m"})),)


class Extra:
    """What ``/status`` adds to the core's view; ``broken`` makes it a bug."""

    broken = False

    def __call__(self) -> dict[str, Any]:
        if self.broken:
            raise RuntimeError("a bug in the status route")
        return {"grpc_port": 1}


@dataclass
class Served:
    port: int
    extra: Extra

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=10)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    host = Host(initial_state(SPECS, Params(), time.monotonic()), time.monotonic)
    extra = Extra()
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn_server(status_app(host, time.monotonic, extra))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_started(server, task)
    yield Served(bound_port(sock), extra)
    server.should_exit = True
    async with asyncio.timeout(10):
        await task
    sock.close()


def message(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/json", response.content
    text = response.json()["error"]["message"]
    assert isinstance(text, str)
    return text


async def test_unknown_route_and_wrong_method_are_json(served: Served) -> None:
    async with served.client() as http:
        assert (await http.get("/status")).status_code == 200
        unknown = await http.get("/nowhere")
        assert unknown.status_code == 404
        assert message(unknown).startswith(
            "no route GET /nowhere; the scheduler serves GET /status"
        )
        wrong = await http.post("/status")
        assert wrong.status_code == 405 and "GET" in wrong.headers["allow"]
        assert message(wrong) == f"POST /status: method not allowed; use {wrong.headers['allow']}"
        # JSON answers of the app's own pass unchanged.
        missing = await http.get("/status/runs/nope")
        assert missing.status_code == 404 and "no run 'nope'" in message(missing)


async def test_a_bug_is_a_json_500(served: Served) -> None:
    served.extra.broken = True
    async with served.client() as http:
        response = await http.get("/status")
    assert response.status_code == 500
    assert message(response) == "internal error in the scheduler (logged)"


async def test_a_control_character_in_a_header_is_a_json_400(served: Served) -> None:
    request = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer a\x01b\r\n\r\n"
    answer, closed = await exchange(served.port, request)
    assert (answer.status, answer.headers["content-type"], closed) == (
        400,
        "application/json",
        True,
    )
    text = json.loads(answer.body)["error"]["message"]
    assert "'Authorization' holds a control character (0x01)" in text
