"""D6, R1, S12: every HTTP port of every service, started as ``luftpause`` starts it,
answers a request uvicorn's HTTP parser refuses (a control character in a header
value) with a JSON 400 in that service's error shape and closes the connection;
before, uvicorn answered ``400 text/plain "Invalid HTTP request received."``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _raw_http import exchange
from fullstack import start_scheduler_and_dataplane, write_config, write_runtime_config

pytestmark = pytest.mark.integration

BAD_LINES = (b"x-luftpause-run-id: r\x01", b"x-luftpause-class: inter\x7factive")


def request(path: bytes, line: bytes) -> bytes:
    return (
        b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\n" + line + b"\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )


async def test_every_http_port_answers_a_malformed_request_in_json(
    services: Any, tmp_path: Path
) -> None:
    engine = services.start(
        "fake-engine", "--port", "0", "--name", "engine-a", "--log-level", "WARNING",
        name="engine-a",
    )  # fmt: skip
    tools = services.start("fake-mcp", "--port", "0")
    config = write_config(tmp_path / "stack.toml", {"engine-a": engine.urls["http"]})
    sched, dp = start_scheduler_and_dataplane(services, config)
    runtime_config = write_runtime_config(tmp_path, dp.urls["http"], tools.urls["http"])
    runtime = services.start("runtime", "--config", str(runtime_config), "--port", "0")

    def port(service: Any) -> int:
        return int(service.ports["http"])

    for line in BAD_LINES:
        header = line.partition(b":")[0].decode()
        # The dataplane: OpenAI's shape on its turn routes, Anthropic's on /v1/messages,
        # with a run either way.
        answer, closed = await exchange(port(dp), request(b"/v1/chat/completions", line))
        assert (answer.status, answer.headers["content-type"], closed) == (
            400, "application/json", True,
        )  # fmt: skip
        error = json.loads(answer.body)["error"]
        assert error["type"] == "invalid_request_error" and repr(header) in error["message"]
        assert answer.headers["x-luftpause-run-id"].startswith("run-")
        answer, _ = await exchange(port(dp), request(b"/v1/messages", line))
        assert json.loads(answer.body)["type"] == "error"

        # The runtime: JSON-RPC on /mcp, its own shape elsewhere.
        answer, closed = await exchange(port(runtime), request(b"/mcp", line))
        assert (answer.status, answer.headers["content-type"], closed) == (
            400, "application/json", True,
        )  # fmt: skip
        body = json.loads(answer.body)
        assert (body["jsonrpc"], body["id"], body["error"]["code"]) == ("2.0", None, -32600)
        assert repr(header) in body["error"]["message"]
        answer, _ = await exchange(port(runtime), request(b"/status", line))
        assert repr(header) in json.loads(answer.body)["error"]["message"]

        # The scheduler's status HTTP, and the fakes behind the same server code.
        for service, path in (
            (sched, b"/status"),
            (engine, b"/v1/chat/completions"),
            (tools, b"/mcp"),
        ):
            answer, closed = await exchange(port(service), request(path, line))
            assert (answer.status, answer.headers["content-type"], closed) == (
                400, "application/json", True,
            ), service  # fmt: skip
            assert repr(header) in json.loads(answer.body)["error"]["message"]
