"""Component tests of the fake engine's retention hint on the wire (B8, H1), in process:
``vllm_xargs.agentic_context.kv_retention_ttl_seconds`` keeps a finished request's
prompt under its ``program_id``; ``POST /kv_retention/release`` ends it; bad values are
a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from luftpause.fakes.engine.model import EngineParams
from luftpause.fakes.engine.server import ServerConfig, create_app

MODEL = "llama-3.2-1b"
FAST = ServerConfig(params=EngineParams(time_scale=200.0))


def client() -> httpx.AsyncClient:
    app = create_app(FAST)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine")


def body(context: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me about rivers " * 20}],
        "max_tokens": 3,
        "vllm_xargs": {"agentic_context": context},
    }


async def state(c: httpx.AsyncClient) -> dict[str, Any]:
    metrics: dict[str, Any] = (await c.get("/debug/state")).json()["metrics"]
    return metrics


async def test_a_hint_keeps_the_prompt_until_released() -> None:
    """B8: a finished request with a retention hint leaves its prompt kept under its
    program; the context may be an object or, as vLLM clients send it, a JSON string;
    the release ends it, once."""
    async with client() as c:
        context = {"program_id": "run-1", "kv_retention_ttl_seconds": 30, "priority": 1}
        response = await c.post("/v1/chat/completions", json=body(json.dumps(context)))
        assert response.status_code == 200, response.text
        m = await state(c)
        assert m["retentions"] == 1 and m["retained_tokens"] > 0
        response = await c.post("/v1/chat/completions", json=body({"program_id": "run-2"}))
        assert response.status_code == 200  # a context without a hint keeps nothing
        assert (await state(c))["retentions"] == 1
        first = await c.post("/kv_retention/release", json={"program_id": "run-1"})
        again = await c.post("/kv_retention/release", json={"program_id": "run-1"})
        assert (first.json(), again.json()) == ({"released": True}, {"released": False})
        m = await state(c)
        assert (m["retentions"], m["retained_tokens"]) == (0, 0)


@pytest.mark.parametrize(
    ("context", "named"),
    [
        ({"program_id": "r", "kv_retention_ttl_seconds": -1}, "kv_retention_ttl_seconds"),
        ({"program_id": "r", "kv_retention_ttl_seconds": 1e9}, "kv_retention_ttl_seconds"),
        ({"program_id": "r", "kv_retention_ttl_seconds": "10"}, "kv_retention_ttl_seconds"),
        ({"program_id": "r", "kv_retention_ttl_seconds": True}, "kv_retention_ttl_seconds"),
        ({"kv_retention_ttl_seconds": 5}, "needs a program_id"),
        ({"program_id": "", "kv_retention_ttl_seconds": 5}, "program_id"),
        ("{not json", "not a JSON object"),
        ("x" * 20_000, "at most"),
        ([1, 2], "agentic_context"),
    ],
)
async def test_bad_hints_are_a_400_naming_the_field(context: Any, named: str) -> None:
    """B8: a hint the engine cannot take is refused with a JSON error that says why."""
    async with client() as c:
        response = await c.post("/v1/chat/completions", json=body(context))
        assert response.status_code == 400
        message = response.json()["error"]["message"]
        assert named in message and "vllm_xargs.agentic_context" in message
        assert (await state(c))["retentions"] == 0


@pytest.mark.parametrize(
    "payload", [{}, {"program_id": ""}, {"program_id": 7}, [], "run-1", {"program_id": "x" * 300}]
)
async def test_bad_releases_are_a_400(payload: Any) -> None:
    """B8: the release names one program."""
    async with client() as c:
        response = await c.post("/kv_retention/release", json=payload)
        assert response.status_code == 400
        assert "program_id" in response.json()["error"]["message"]
        response = await c.post(
            "/kv_retention/release",
            content=b"{nope",
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 400
        assert "JSON" in response.json()["error"]["message"]
