"""The fake engine's ``POST /v1/chat/completions/render`` (H1): vLLM's answer shape, with
ids that agree with the engine's own prompt count and prefix cache (so a router matching
prefixes on them sees what the engine caches)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx

from luftpause.fakes.engine.model import EngineParams
from luftpause.fakes.engine.server import ServerConfig, create_app
from luftpause.fakes.engine.tokens import VOCAB_SIZE, render_messages, token_ids

MODEL = "llama-3.2-1b"
FAST = ServerConfig(params=EngineParams(time_scale=200.0))
RENDER = "/v1/chat/completions/render"
# vLLM's GenerateRequest (vllm/entrypoints/serve/disagg/protocol.py), as model_dump() writes it
GENERATE_REQUEST_KEYS = {
    "request_id",
    "token_ids",
    "features",
    "sampling_params",
    "model",
    "stream",
    "stream_options",
    "cache_salt",
    "priority",
    "kv_transfer_params",
}
SYSTEM = {"role": "system", "content": "You are a careful agent. " * 12}


def asgi_client(config: ServerConfig = FAST) -> httpx.AsyncClient:
    app = create_app(config)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine")


def shared_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def test_render_answers_a_generate_request_in_vllms_shape() -> None:
    """H1: the render answer has exactly vLLM's GenerateRequest fields; its ids are ints of
    the vocabulary, one per token the chat route counts for the same body; sampling fields
    the body sets come back, stream options only when streamed, and nothing is queued."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [SYSTEM, {"role": "user", "content": "render me"}],
        "temperature": 0.123,
        "top_p": 0.456,
        "frequency_penalty": 1.1,
        "max_tokens": 5,
        "priority": 3,
        "cache_salt": "salt-a",
        "vllm_xargs": {"agentic_context": {"program_id": "run-1"}},
    }
    async with asgi_client() as client:
        response = await client.post(RENDER, json=body)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json")
        data = response.json()
        assert set(data) == GENERATE_REQUEST_KEYS
        assert data["request_id"].startswith("chatcmpl-")
        assert data["model"] == MODEL
        assert data["features"] is None and data["kv_transfer_params"] is None
        assert data["stream"] is False and data["stream_options"] is None
        assert data["priority"] == 3 and data["cache_salt"] == "salt-a"
        ids = data["token_ids"]
        assert ids and all(isinstance(i, int) and 0 <= i < VOCAB_SIZE for i in ids)
        sampling = data["sampling_params"]
        assert sampling["temperature"] == 0.123 and sampling["top_p"] == 0.456
        assert sampling["frequency_penalty"] == 1.1 and sampling["max_tokens"] == 5
        assert sampling["n"] == 1 and sampling["logprobs"] is None
        state = (await client.get("/debug/state")).json()
        assert state["submitted"] == 0 and not state["requests"]
        # the chat route counts as many prompt tokens for the same body
        chat = await client.post("/v1/chat/completions", json=body)
        assert chat.json()["usage"]["prompt_tokens"] == len(ids)

        streamed = await client.post(
            RENDER,
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
        )
        data = streamed.json()
        assert data["stream"] is True
        assert data["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        assert data["priority"] == 0 and data["cache_salt"] is None
        # no max_tokens: the rest of the context, as the chat route resolves it
        assert data["sampling_params"]["max_tokens"] == (
            FAST.params.context_length - len(data["token_ids"])
        )


async def test_render_is_deterministic_across_apps() -> None:
    """H1: the same body renders to the same ids every time and on every engine (a router
    compares ids from several engines)."""
    body = {"model": MODEL, "messages": [SYSTEM, {"role": "user", "content": "same"}]}
    async with asgi_client() as one, asgi_client() as two:
        first = (await one.post(RENDER, json=body)).json()["token_ids"]
        again = (await one.post(RENDER, json=body)).json()["token_ids"]
        other = (await two.post(RENDER, json=body)).json()["token_ids"]
    assert first == again == other
    assert first == token_ids(render_messages(body["messages"]))  # type: ignore[arg-type]


def test_token_ids_are_the_same_in_another_process() -> None:
    """H1: ids do not depend on the process (its string-hash seed): engines started
    separately give a prompt the same ids."""
    messages = [SYSTEM, {"role": "user", "content": "same"}]
    code = (
        "import json,sys;from luftpause.fakes.engine.tokens import token_ids,render_messages;"
        "print(json.dumps(token_ids(render_messages(json.loads(sys.argv[1])))))"
    )
    elsewhere = subprocess.run(
        [sys.executable, "-c", code, json.dumps(messages)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        check=True,
    )
    assert json.loads(elsewhere.stdout) == token_ids(render_messages(messages))


async def test_shared_prefix_ids_agree_with_the_engines_prefix_cache() -> None:
    """H1: two prompts that share a prefix share the ids of its whole tokens and differ
    after it, and the engine then serves exactly the whole cache blocks of that shared run
    of ids from its cache; a conversation's next turn starts with this turn's ids."""
    block_tokens = FAST.params.block_tokens
    first = [SYSTEM, {"role": "user", "content": "first question about rivers"}]
    second = [SYSTEM, {"role": "user", "content": "a different question about towers"}]
    async with asgi_client() as client:

        async def ids(messages: list[dict[str, Any]]) -> list[int]:
            r = await client.post(RENDER, json={"model": MODEL, "messages": messages})
            return list(r.json()["token_ids"])

        async def cached(messages: list[dict[str, Any]]) -> int:
            r = await client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": messages, "max_tokens": 2, "ignore_eos": True},
            )
            return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        ids_first, ids_second = await ids(first), await ids(second)
        shared = shared_prefix(ids_first, ids_second)
        shared_chars = shared_prefix(render_messages(first), render_messages(second))
        assert shared == shared_chars // 4
        assert 0 < shared < min(len(ids_first), len(ids_second))
        assert await cached(first) == 0
        assert await cached(second) == shared // block_tokens * block_tokens > 0

        reply = {"role": "assistant", "content": "an answer"}
        grown = [*first, reply, {"role": "user", "content": "and then?"}]
        ids_grown = await ids(grown)
        whole = len(render_messages(first)) // 4  # this turn's whole tokens
        assert ids_grown[:whole] == ids_first[:whole]
        assert await cached(grown) == whole // block_tokens * block_tokens


async def test_bad_bodies_get_the_chat_routes_answers() -> None:
    """H1, S6: every body the chat route refuses, render refuses with the same status and
    message (a prompt too long for the context too), and a model not served under
    --strict-models is the same 404."""
    bad: list[Any] = [
        {"model": MODEL},
        {"model": MODEL, "messages": []},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 50},
        {"model": MODEL, "messages": [{"content": "no role"}]},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 100_000},
        {"model": MODEL, "messages": [{"role": "user", "content": "x" * 40_000}]},
        {"model": "", "messages": [{"role": "user", "content": "x"}]},
        ["not", "an", "object"],
    ]
    async with asgi_client() as client:
        for body in bad:
            chat = await client.post("/v1/chat/completions", json=body)
            render = await client.post(RENDER, json=body)
            assert render.status_code == chat.status_code == 400, body
            assert render.json() == chat.json(), body
            assert render.json()["error"]["message"]
        for raw in (b"{not json", b""):
            render = await client.post(
                RENDER, content=raw, headers={"content-type": "application/json"}
            )
            assert render.status_code == 400
            assert render.json()["error"]["message"] == "request body is not valid JSON"
    strict = replace(FAST, models=(MODEL,), strict_models=True)
    async with asgi_client(strict) as client:
        body = {"model": "nope", "messages": [{"role": "user", "content": "x"}]}
        render = await client.post(RENDER, json=body)
        chat = await client.post("/v1/chat/completions", json=body)
        assert render.status_code == chat.status_code == 404
        assert render.json() == chat.json()
        assert render.json()["error"]["message"] == "The model `nope` does not exist."


async def test_non_finite_sampling_values_are_a_400_not_a_500() -> None:
    """H1: a body whose echoed sampling values hold NaN or Infinity (JSON parsers accept
    them; an answer may not carry them) is refused with a 400 naming the field."""
    user = [{"role": "user", "content": "hi"}]
    async with asgi_client() as client:
        for field, text in (
            ("temperature", "NaN"),
            ("seed", "1e999"),
            ("stop", "[NaN]"),
        ):
            raw = f'{{"model": "{MODEL}", "messages": {json.dumps(user)}, "{field}": {text}}}'
            render = await client.post(
                RENDER, content=raw.encode(), headers={"content-type": "application/json"}
            )
            assert render.status_code == 400, (field, render.text)
            assert f"'{field}'" in render.json()["error"]["message"]
