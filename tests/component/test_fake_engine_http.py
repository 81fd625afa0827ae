"""Component tests of the fake engine's HTTP server (H1), in process.

Plain endpoints go through ``httpx.ASGITransport``; streaming, disconnects and
faults use a real uvicorn server on 127.0.0.1:0 in the test's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from luftpause.config import MetricsFlavour
from luftpause.fakes.engine import server as engine_server
from luftpause.fakes.engine.model import EngineParams
from luftpause.fakes.engine.script import (
    ScriptOptions,
    answer_length,
    plan_key_in,
    plan_marker,
    plan_reply,
)
from luftpause.fakes.engine.server import ServerConfig, create_app
from luftpause.fakes.engine.tokens import IMAGE_TOKENS, count_tokens, render_messages
from luftpause.scheduler.service.probe import parse_load

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _engine_helpers import running_engine, wait_until

MODEL = "llama-3.2-1b"
FAST = ServerConfig(params=EngineParams(time_scale=200.0))
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look something up",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query", "limit"],
            },
        },
    }
]


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _plan_seed(messages: list[dict[str, Any]]) -> str:
    """The script's seed for a conversation (no tools, default seed 0)."""
    return plan_reply(messages, None, ScriptOptions(), prompt_text=render_messages(messages)).seed


def asgi_client(config: ServerConfig = FAST) -> httpx.AsyncClient:
    app = create_app(config)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine")


async def sse_events(response: httpx.Response) -> list[Any]:
    events: list[Any] = []
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


# ------------------------------------------------------------ plain routes


async def test_health_models_and_router_registration_endpoints() -> None:
    """H1: /health, /v1/models, /server_info, /model_info, /get_load answer what the
    SGLang router needs; model_path is an existing local directory."""
    async with asgi_client() as client:
        assert (await client.get("/health")).status_code == 200
        models = (await client.get("/v1/models")).json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == [MODEL]
        info = (await client.get("/server_info")).json()
        for key in ("model_path", "tokenizer_path", "served_model_name", "dp_size", "tp_size"):
            assert key in info
        assert info["max_total_num_tokens"] == EngineParams().kv_tokens
        assert await asyncio.to_thread(Path(info["model_path"]).is_dir)
        model_info = (await client.get("/model_info")).json()
        assert model_info["is_generation"] is True
        assert await asyncio.to_thread(Path(model_info["model_path"]).is_dir)
        load = (await client.get("/get_load")).json()
        assert load == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]


async def test_plain_completion_usage_timing_and_cached_tokens() -> None:
    """H1: a non-streamed completion honours max_tokens, reports usage with cached
    tokens and the timing extension; the second identical prompt hits the cache."""
    async with asgi_client() as client:
        body = {
            "model": MODEL,
            "messages": user("tell me about rivers " * 20),
            "max_tokens": 7,
            "ignore_eos": True,
        }
        first = (await client.post("/v1/chat/completions", json=body)).json()
        assert first["object"] == "chat.completion"
        choice = first["choices"][0]
        assert choice["finish_reason"] == "length"
        assert len(choice["message"]["content"]) == 28  # 7 tokens of 4 characters
        usage = first["usage"]
        assert usage["completion_tokens"] == 7
        assert usage["total_tokens"] == usage["prompt_tokens"] + 7
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        assert set(usage["luftpause_timing"]) == {"queued_s", "prefill_s", "decode_s"}
        second = (await client.post("/v1/chat/completions", json=body)).json()
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert second["choices"][0]["message"]["content"] == choice["message"]["content"]
        # max_completion_tokens is honoured too (the SGLang router rewrites max_tokens to it).
        body2 = {
            "model": MODEL,
            "messages": user("x"),
            "max_completion_tokens": 2,
            "ignore_eos": True,
        }
        again = (await client.post("/v1/chat/completions", json=body2)).json()
        assert again["usage"]["completion_tokens"] == 2


async def test_image_parts_are_accepted_and_counted_as_image_tokens() -> None:
    """H1: a chat message with image_url parts (a data URL, an https URL) is answered,
    streamed or not, and each image counts IMAGE_TOKENS prompt tokens, not its size."""
    image = "data:image/png;base64," + "iVBORw0KGgo=" * 10_000
    with_images: list[ChatCompletionMessageParam] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is in"},
                {"type": "image_url", "image_url": {"url": image, "detail": "high"}},
                {"type": "image_url", "image_url": {"url": "https://img.test/b.webp"}},
            ],
        }
    ]
    without: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": [{"type": "text", "text": "what is in"}]}
    ]
    async with asgi_client() as client:
        sdk = openai.AsyncOpenAI(base_url="http://engine/v1", api_key="x", http_client=client)
        plain = await sdk.chat.completions.create(model=MODEL, messages=without, max_tokens=3)
        seen = await sdk.chat.completions.create(model=MODEL, messages=with_images, max_tokens=3)
        assert seen.choices[0].message.content
        assert plain.usage is not None and seen.usage is not None
        assert seen.usage.prompt_tokens - plain.usage.prompt_tokens == 2 * IMAGE_TOKENS
        stream = await sdk.chat.completions.create(
            model=MODEL, messages=with_images, max_tokens=3, stream=True
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_natural_end_gives_stop() -> None:
    """H1: a plain chat answer has its natural length (the documented reply-length model,
    the same for the same prompt) and ends with finish_reason stop, with or without
    max_tokens; even the calibrated runaway rate never makes a plain chat answer run."""
    async with asgi_client() as client:
        for extra in ({"max_tokens": 1000}, {}, {}):
            body = {"model": MODEL, "messages": user("hello"), **extra}
            data = (await client.post("/v1/chat/completions", json=body)).json()
            assert data["choices"][0]["finish_reason"] == "stop"
            natural = answer_length(count_tokens("hello"), _plan_seed(user("hello")))
            assert data["usage"]["completion_tokens"] == natural


async def test_validation_errors() -> None:
    """H1: bad input gives 400 with an OpenAI-like error."""
    async with asgi_client() as client:
        cases = [
            {"model": MODEL},
            {"model": MODEL, "messages": []},
            {"model": MODEL, "messages": user("x"), "max_tokens": 0},
            {"model": MODEL, "messages": user("x"), "top_logprobs": 50},
            {"model": MODEL, "messages": [{"content": "no role"}]},
            {"model": MODEL, "messages": user("x"), "max_tokens": 100_000},
        ]
        for body in cases:
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 400, body
            assert response.json()["error"]["message"]
        response = await client.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 400
        response = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": user("x")},
            headers={"x-fake-tool-results": "many"},
        )
        assert response.status_code == 400


async def test_any_model_name_is_answered_and_echoed_like_sglang() -> None:
    """H1, S6: by default the engine answers any model name and echoes it in ``model``
    (streamed and not), as SGLang does; /v1/models still lists the configured model."""
    async with asgi_client() as client:
        body = {"model": "someone/Else-7B", "messages": user("x"), "max_tokens": 2}
        plain = await client.post("/v1/chat/completions", json=body)
        assert plain.status_code == 200
        assert plain.json()["model"] == "someone/Else-7B"
        async with client.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}
        ) as response:
            events = await sse_events(response)
        assert {e["model"] for e in events if e != "[DONE]"} == {"someone/Else-7B"}
        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == [MODEL]
        one = await client.post("/classify", json={"model": "other", "input": "x"})
        assert one.status_code == 200 and one.json()["model"] == "other"


async def test_strict_models_answers_404_in_vllms_shape() -> None:
    """H1, S6: with --strict-models a model the engine does not list is a 404 with vLLM's
    exact error body (``OpenAIServing._check_model``); a listed model is answered."""
    strict = replace(FAST, models=(MODEL, "other"), strict_models=True)
    async with asgi_client(strict) as client:
        response = await client.post(
            "/v1/chat/completions", json={"model": "nope", "messages": user("x")}
        )
        assert response.status_code == 404
        assert response.json() == {
            "error": {
                "message": "The model `nope` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        }
        ok = await client.post(
            "/v1/chat/completions",
            json={"model": "other", "messages": user("x"), "max_tokens": 1},
        )
        assert ok.status_code == 200 and ok.json()["model"] == "other"
        missing = await client.post("/v1/classify", json={"model": "nope", "input": "x"})
        assert missing.status_code == 404
        assert missing.json()["error"]["message"] == "The model `nope` does not exist."


async def test_tool_calls_until_results_then_answer_and_header_overrides() -> None:
    """H1: with tools offered the engine calls a tool until N tool results (header
    x-fake-tool-results overrides N), with schema-fitting arguments and unique ids;
    x-fake-wrong-types and x-fake-text-tool-calls change the call's form."""
    async with asgi_client() as client:
        messages = user("find the river")
        ids = []
        for _ in range(2):
            body = {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 256}
            data = (
                await client.post(
                    "/v1/chat/completions", json=body, headers={"x-fake-tool-results": "2"}
                )
            ).json()
            choice = data["choices"][0]
            assert choice["finish_reason"] == "tool_calls"
            call = choice["message"]["tool_calls"][0]
            assert call["type"] == "function" and call["function"]["name"] == "lookup"
            args = json.loads(call["function"]["arguments"])
            assert isinstance(args["query"], str) and isinstance(args["limit"], int)
            ids.append(call["id"])
            messages = [
                *messages,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "the Rhine"},
            ]
        assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
        body = {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 256}
        final = (
            await client.post(
                "/v1/chat/completions", json=body, headers={"x-fake-tool-results": "2"}
            )
        ).json()
        assert final["choices"][0]["message"]["content"]
        assert "tool_calls" not in final["choices"][0]["message"]

        first = {"model": MODEL, "messages": user("go"), "tools": TOOLS, "max_tokens": 256}
        wrong = (
            await client.post(
                "/v1/chat/completions", json=first, headers={"x-fake-wrong-types": "1"}
            )
        ).json()
        args = json.loads(wrong["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
        assert isinstance(args["limit"], str) and args["limit"].isdigit()
        text = (
            await client.post(
                "/v1/chat/completions", json=first, headers={"x-fake-text-tool-calls": "1"}
            )
        ).json()
        content = text["choices"][0]["message"]["content"]
        parsed = json.loads(content.removeprefix("<|python_tag|>"))
        assert parsed["name"] == "lookup" and "query" in parsed["parameters"]
        assert text["choices"][0]["finish_reason"] == "stop"


async def test_a_plan_key_draws_the_reply_whatever_the_prompt() -> None:
    """H1, B10: with x-fake-plan-key the reply (its length, a tool call's arguments) is
    drawn from the key and the tool results so far, not from the prompt text: two
    conversations with one key get the same replies turn for turn, other keys other
    replies, and /debug/state counts the requests that came with a key; an empty or
    overlong key is a 400 naming the header."""

    async def reply(client: httpx.AsyncClient, text: str, key: str | None, results: int) -> Any:
        messages = user(text)
        if results:
            call = {"id": "call_1", "type": "function",
                    "function": {"name": "lookup", "arguments": "{}"}}  # fmt: skip
            messages = [
                *messages,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": f"facts {text}"},
            ]
        headers = {"x-fake-tool-results": "1"}
        if key is not None:
            headers["x-fake-plan-key"] = key
        body = {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 512}
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        data = response.json()
        message = data["choices"][0]["message"]
        calls = [c["function"]["arguments"] for c in message.get("tool_calls") or []]
        return calls, data["usage"]["completion_tokens"]

    async with asgi_client() as client:
        assert (await client.get("/debug/state")).json()["plan_keyed"] == 0
        for results in (0, 1):  # the tool-call turn, then the answer
            a = await reply(client, "find the river Rhine", "plan-7", results)
            b = await reply(client, "what feeds lake Constance", "plan-7", results)
            assert a == b
        answers = {(await reply(client, "find the river", f"plan-{i}", 1))[1] for i in range(8)}
        assert len(answers) > 1
        prompts = {(await reply(client, f"river {i}", None, 1))[1] for i in range(8)}
        assert len(prompts) > 1  # without a key, each conversation draws its own
        state = (await client.get("/debug/state")).json()
        assert (state["plan_keyed"], state["submitted"]) == (12, 20)
        for bad, why in (("", "must not be empty"), ("k" * 257, "at most 256 characters")):
            response = await client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": user("x")},
                headers={"x-fake-plan-key": bad},
            )
            assert response.status_code == 400
            assert "x-fake-plan-key" in response.json()["error"]["message"]
            assert why in response.json()["error"]["message"]


async def test_a_plan_key_written_in_the_task_draws_as_the_header_does() -> None:
    """H1, B10: a first user message holding ``[plan:KEY]`` (what the load generator
    writes into each run's task, since proxies such as the router and SMG drop custom
    headers) draws the reply the header ``x-fake-plan-key: KEY`` draws, whatever the rest
    of the text; the header wins where both are given; a key the marker cannot carry is
    refused where it is written."""
    tools_body = {"model": MODEL, "tools": TOOLS, "max_tokens": 512}

    async def drawn(client: httpx.AsyncClient, text: str, headers: dict[str, str]) -> Any:
        body = {**tools_body, "messages": user(text)}
        data = (await client.post("/v1/chat/completions", json=body, headers=headers)).json()
        return data["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]

    async with asgi_client() as client:
        by_header = await drawn(client, "find the river", {"x-fake-plan-key": "run-7"})
        marked = f"Task abc {plan_marker('run-7')}: find the river Rhine"
        assert await drawn(client, marked, {}) == by_header
        assert await drawn(client, marked, {"x-fake-plan-key": "run-8"}) == await drawn(
            client, "other text", {"x-fake-plan-key": "run-8"}
        )
        assert (await client.get("/debug/state")).json()["plan_keyed"] == 4
    system_only = [{"role": "system", "content": "[plan:k]"}, {"role": "user", "content": "x"}]
    assert plan_key_in(system_only) is None  # only the first user message carries it
    parts = [{"role": "user", "content": [{"type": "text", "text": "go [plan:k-1]"}]}]
    assert plan_key_in(parts) == "k-1"
    for bad in ("", "two words", "a]b", "k" * 257):
        with pytest.raises(ValueError, match="plan key"):
            plan_marker(bad)


async def test_logprobs_score_labels_with_one_token() -> None:
    """H1 (R13): max_tokens 1 with logprobs returns deterministic top-k first tokens that
    include several of the labels listed in the prompt."""
    async with asgi_client() as client:
        prompt = (
            "Pick a label for the message.\nlabels: lookup, urgent, chitchat\nMessage: servers down"
        )
        body = {
            "model": MODEL,
            "messages": user(prompt),
            "max_tokens": 1,
            "logprobs": True,
            "top_logprobs": 5,
        }
        data = (await client.post("/v1/chat/completions", json=body)).json()
        again = (await client.post("/v1/chat/completions", json=body)).json()
        content = data["choices"][0]["logprobs"]["content"]
        assert content == again["choices"][0]["logprobs"]["content"]
        assert len(content) == 1
        top = content[0]["top_logprobs"]
        assert len(top) == 5
        assert {"look", "urge", "chit"} <= {t["token"] for t in top}
        assert content[0]["token"] == top[0]["token"] == data["choices"][0]["message"]["content"]
        assert all(t["logprob"] <= 0 for t in top)


async def test_classify_endpoints() -> None:
    """H1: /classify and /v1/classify answer in vLLM's format with deterministic labels."""
    config = replace(FAST, models=("roberta-base-classifier",), labels=("a", "b", "c"))
    async with asgi_client(config) as client:
        one = (await client.post("/classify", json={"input": "hello"})).json()
        assert one["object"] == "list" and one["id"].startswith("classify-")
        assert one["model"] == "roberta-base-classifier"
        item = one["data"][0]
        assert item["index"] == 0 and item["num_classes"] == 3 and item["label"] in "abc"
        assert sum(item["probs"]) == pytest.approx(1.0)
        assert one["usage"]["prompt_tokens"] == 2
        many = (
            await client.post(
                "/v1/classify", json={"model": "roberta-base-classifier", "input": ["hello", "x"]}
            )
        ).json()
        assert [d["index"] for d in many["data"]] == [0, 1]
        assert many["data"][0]["label"] == item["label"]
        assert (await client.post("/classify", json={"input": []})).status_code == 400


async def test_metrics_sglang_and_vllm_names() -> None:
    """H1: /metrics carries SGLang names with a model_name label, or vLLM names."""
    async with asgi_client() as client:
        await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": user("x"), "max_tokens": 2}
        )
        text = (await client.get("/metrics")).text
        for name in (
            "sglang:num_running_reqs",
            "sglang:num_queue_reqs",
            "sglang:token_usage",
            "sglang:num_used_tokens",
            "sglang:max_total_num_tokens",
            "sglang:cache_hit_rate",
        ):
            assert f'{name}{{engine_type="unified",model_name="{MODEL}"' in text
    async with asgi_client(replace(FAST, metrics="vllm")) as client:
        await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": user("x"), "max_tokens": 2}
        )
        text = (await client.get("/metrics")).text
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
        ):
            assert name + "{" in text
        assert "sglang:" not in text
        # B5: the KV pool as vLLM reports it, read as the scheduler's prober reads it
        assert parse_load(text, MetricsFlavour.VLLM).kv_tokens == FAST.params.kv_tokens // 16 * 16


async def test_debug_state_lists_recent_timing() -> None:
    """H1: /debug/state shows running/waiting requests, recent per-request timing and the
    step counters the benchmarks read (busy, late and prefill seconds, decode batches)."""
    async with asgi_client() as client:
        await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": user("x"), "max_tokens": 3, "ignore_eos": True},
        )
        state = (await client.get("/debug/state")).json()
        assert state["metrics"]["running"] == 0
        assert state["requests"] == []
        recent = state["recent"][-1]
        assert recent["completion_tokens"] == 3
        assert set(recent["timing"]) == {"queued_s", "prefill_s", "decode_s"}
        # step counters: one prefill, then decode steps of a batch of one
        assert state["decode_steps"] >= 1
        assert state["decode_seqs"] == state["decode_steps"]
        assert state["steps"] >= state["decode_steps"] + 1
        assert 0 < state["prefill_s"] < state["busy_s"]
        assert state["late_s"] >= 0


# --------------------------------------------------------------- streaming


async def test_openai_package_streamed_and_plain() -> None:
    """H1: the official openai client works for streamed (with usage) and plain calls."""
    async with running_engine(FAST) as (url, _):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=20)
        hi: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
        go: list[ChatCompletionMessageParam] = [{"role": "user", "content": "go"}]
        run_on = {"ignore_eos": True}  # SGLang/vLLM: generate until max_tokens
        plain = await client.chat.completions.create(
            model=MODEL, messages=hi, max_tokens=5, extra_body=run_on
        )
        assert plain.choices[0].finish_reason == "length"
        assert plain.usage is not None and plain.usage.completion_tokens == 5
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=hi,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=run_on,
        )
        text = ""
        finish = None
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        assert text == plain.choices[0].message.content
        assert finish == "length"
        assert usage is not None and usage.completion_tokens == 5
        assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens
        tools = await client.chat.completions.create(
            model=MODEL,
            messages=go,
            tools=cast(list[ChatCompletionToolParam], TOOLS),
            max_tokens=256,
            stream=True,
        )
        name = ""
        args = ""
        call_id = None
        async for chunk in tools:
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    assert delta.index == 0
                    call_id = delta.id or call_id
                    if delta.function is not None:
                        name += delta.function.name or ""
                        args += delta.function.arguments or ""
                finish = choice.finish_reason or finish
        assert name == "lookup" and call_id is not None and call_id.startswith("call_")
        assert set(json.loads(args)) == {"query", "limit"}
        assert finish == "tool_calls"
        await client.close()


async def test_sse_format_and_chunking() -> None:
    """H1: SSE chunks: role first, the first token alone (as SGLang streams it), then
    content deltas every --chunk-tokens tokens, a final chunk with finish_reason, a
    usage chunk with empty choices, then [DONE]."""
    async with running_engine(replace(FAST, chunk_tokens=4)) as (url, _):
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            body = {
                "model": MODEL,
                "messages": user("hi"),
                "max_tokens": 10,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
                "logprobs": True,
                "top_logprobs": 2,
            }
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                events = await sse_events(response)
        assert events[-1] == "[DONE]"
        first, *middle, finish, usage, _ = events
        assert first["object"] == "chat.completion.chunk"
        assert first["choices"][0]["delta"]["role"] == "assistant"
        contents = [e["choices"][0]["delta"]["content"] for e in middle]
        assert [len(c) for c in contents] == [4, 16, 16, 4]
        assert [len(e["choices"][0]["logprobs"]["content"]) for e in middle] == [1, 4, 4, 1]
        assert finish["choices"][0]["finish_reason"] == "length"
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10


async def test_priority_scheduling_orders_the_queue() -> None:
    """H1: with priority scheduling, a waiting request with higher priority runs first."""
    params = EngineParams(time_scale=2.0, max_running=1, priority_scheduling=True)
    async with running_engine(ServerConfig(params=params)) as (url, _):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def post(text: str, priority: int, max_tokens: int) -> Any:
                body = {
                    "model": MODEL,
                    "messages": user(text),
                    "max_tokens": max_tokens,
                    "priority": priority,
                    "ignore_eos": True,
                }
                return (await client.post("/v1/chat/completions", json=body)).json()

            async def state() -> Any:
                return (await client.get("/debug/state")).json()

            first = asyncio.create_task(post("first", 0, 3000))
            await wait_until(lambda: _phase_count(state, "decode", 1), what="first running")
            low = asyncio.create_task(post("low", 1, 2))
            await wait_until(lambda: _phase_count(state, "waiting", 1), what="low queued")
            high = asyncio.create_task(post("high", 9, 2))
            await wait_until(lambda: _phase_count(state, "waiting", 2), what="high queued")
            first.cancel()  # the client leaves: its slot frees up
            low_result, high_result = await asyncio.gather(low, high)
            order = [r["request_id"] for r in (await state())["recent"]]
        assert order == [high_result["id"], low_result["id"]]


async def _phase_count(state: Any, phase: str, n: int) -> bool:
    data = await state()
    return sum(1 for r in data["requests"] if r["phase"] == phase) >= n


async def test_client_disconnect_cancels_generation_and_frees_kv() -> None:
    """H1: a client that leaves mid-stream (or while waiting for a plain reply) cancels
    the request in the engine model: it stops and its KV is freed."""
    async with running_engine(ServerConfig(params=EngineParams(time_scale=5.0))) as (url, app):
        driver = app.state.driver
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            body = {
                "model": MODEL,
                "messages": user("long"),
                "max_tokens": 4000,
                "stream": True,
                "ignore_eos": True,
            }
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                lines = response.aiter_lines()
                while not (await anext(lines)).startswith("data: {"):
                    pass
                assert driver.model.metrics().running == 1
            await wait_until(
                _async(lambda: driver.model.metrics().running == 0), what="request cancelled"
            )
            assert driver.model.metrics().used_tokens == 0

            plain = asyncio.create_task(
                client.post("/v1/chat/completions", json={**body, "stream": False})
            )
            await wait_until(
                _async(lambda: driver.model.metrics().running == 1), what="plain request running"
            )
            plain.cancel()
            await asyncio.gather(plain, return_exceptions=True)
            await wait_until(
                _async(lambda: driver.model.metrics().running == 0), what="plain cancelled"
            )
            assert driver.model.metrics().used_tokens == 0


def _async(fn: Any) -> Any:
    async def wrapped() -> Any:
        return fn()

    return wrapped


# ------------------------------------------------------------------ faults


async def test_fault_status_codes() -> None:
    """H1 (for D6): x-fake-fault 429 (with Retry-After), 500 and 503 answer at once."""
    async with asgi_client() as client:
        body = {"model": MODEL, "messages": user("x"), "max_tokens": 2}
        r = await client.post("/v1/chat/completions", json=body, headers={"x-fake-fault": "429"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        r = await client.post(
            "/v1/chat/completions",
            json=body,
            headers={"x-fake-fault": "429", "x-fake-retry-after": "7"},
        )
        assert r.headers["retry-after"] == "7"
        for code in (500, 503):
            r = await client.post(
                "/v1/chat/completions", json=body, headers={"x-fake-fault": str(code)}
            )
            assert r.status_code == code and r.json()["error"]["message"]
        r = await client.post(
            "/v1/chat/completions", json=body, headers={"x-fake-fault": "explode"}
        )
        assert r.status_code == 400


async def test_fault_refuse_midstream_and_stall() -> None:
    """H1 (for D6): refuse drops the connection without an answer; midstream sends some
    chunks and drops the connection without [DONE]; stall never answers."""
    async with running_engine(FAST) as (url, app):
        driver = app.state.driver
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            body = {"model": MODEL, "messages": user("x"), "max_tokens": 50, "ignore_eos": True}
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post(
                    "/v1/chat/completions", json=body, headers={"x-fake-fault": "refuse"}
                )

            received: list[str] = []
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                async with client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={**body, "stream": True},
                    headers={"x-fake-fault": "midstream"},
                ) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        received.append(line)
            data = [line for line in received if line.startswith("data: ")]
            assert len(data) >= 2 and "data: [DONE]" not in data
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                await client.post(
                    "/v1/chat/completions", json=body, headers={"x-fake-fault": "midstream"}
                )
            await wait_until(
                _async(lambda: driver.model.metrics().running == 0), what="midstream cancelled"
            )

            with pytest.raises(httpx.ReadTimeout):
                await client.post(
                    "/v1/chat/completions",
                    json=body,
                    headers={"x-fake-fault": "stall"},
                    timeout=httpx.Timeout(20, read=0.3),
                )
            assert (await client.get("/health")).status_code == 200


async def test_server_wide_fault_flags() -> None:
    """H1: --fault refuse makes every path drop the connection; --fault 503 fails completions."""
    async with (
        running_engine(replace(FAST, fault="refuse")) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=5) as client,
    ):
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("/health")
    async with (
        running_engine(replace(FAST, fault="503")) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=5) as client,
    ):
        assert (await client.get("/health")).status_code == 200
        r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": user("x")})
        assert r.status_code == 503


# --------------------------------------------------------------------- CLI


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fake-engine")
    engine_server.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_flags_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """H1: every flag parses into the server config; bad values are argparse errors."""
    args = parse(
        [
            "--model",
            "a",
            "--model",
            "b",
            "--time-scale",
            "10",
            "--chunk-tokens",
            "3",
            "--metrics",
            "vllm",
            "--priority-scheduling",
            "--tool-results",
            "1",
            "--text-tool-calls",
            "--wrong-types",
            "--fault",
            "429",
            "--seed",
            "5",
            "--max-running",
            "7",
            "--kv-tokens",
            "9000",
            "--default-max-tokens",
            "64",
            "--labels",
            "x,y",
            "--strict-models",
        ]
    )
    config = engine_server.config_from_args(args)
    assert config.models == ("a", "b")
    assert config.params.time_scale == 10 and config.params.max_running == 7
    assert config.params.kv_tokens == 9000 and config.params.priority_scheduling
    assert config.script == ScriptOptions(
        tool_results=1, text_tool_calls=True, wrong_types=True, seed=5
    )
    assert (config.chunk_tokens, config.metrics, config.fault) == (3, "vllm", "429")
    assert config.default_max_tokens == 64 and config.labels == ("x", "y")
    assert config.strict_models
    defaults = engine_server.config_from_args(parse([]))
    assert defaults.models == (MODEL,) and defaults.fault is None
    assert not defaults.strict_models
    for bad in (
        ["--time-scale", "0"],
        ["--chunk-tokens", "-1"],
        ["--fault", "boom"],
        ["--metrics", "tgi"],
        ["--labels", "one"],
        ["--kv-tokens", "x"],
    ):
        with pytest.raises(SystemExit):
            parse(bad)
        assert "error" in capsys.readouterr().err


async def test_parallel_tool_calls_streamed_and_plain() -> None:
    """H1, X-bench (#38): a directive's group (``[tools:lookup+lookup]``) comes back as
    two tool calls in one reply: indices 0 and 1, their own ids and arguments, in a
    plain reply and in a stream as the openai package assembles it;
    ``parallel_tool_calls: false`` gets one."""
    async with running_engine(FAST) as (url, _):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=20)
        go: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "[tools:lookup+lookup]"}
        ]
        tools = cast(list[ChatCompletionToolParam], TOOLS)
        plain = await client.chat.completions.create(
            model=MODEL, messages=go, tools=tools, max_tokens=256
        )
        message = plain.choices[0].message
        assert plain.choices[0].finish_reason == "tool_calls" and message.tool_calls
        got = [(c.id, c.function.name, json.loads(c.function.arguments))  # type: ignore[union-attr]
               for c in message.tool_calls]  # fmt: skip
        assert [name for _, name, _ in got] == ["lookup", "lookup"]
        assert got[0][0] != got[1][0] and got[0][2] != got[1][2]
        stream = await client.chat.completions.create(
            model=MODEL, messages=go, tools=tools, max_tokens=256, stream=True
        )
        calls: dict[int, dict[str, str]] = {}
        async for chunk in stream:
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    call = calls.setdefault(delta.index, {"id": "", "name": "", "args": ""})
                    call["id"] += delta.id or ""
                    if delta.function is not None:
                        call["name"] += delta.function.name or ""
                        call["args"] += delta.function.arguments or ""
        assert sorted(calls) == [0, 1]
        streamed = [(c["name"], json.loads(c["args"])) for c in calls.values()]
        assert streamed == [(name, args) for _, name, args in got]  # (ids are per request)
        assert calls[0]["id"] != calls[1]["id"]
        one = await client.chat.completions.create(
            model=MODEL, messages=go, tools=tools, max_tokens=256, parallel_tool_calls=False
        )
        assert len(one.choices[0].message.tool_calls or []) == 1
        await client.close()
