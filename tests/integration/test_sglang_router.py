"""Two fake engines as real processes behind the real SGLang router (H1, S7).

The router must register the fake engines as workers (``/health``,
``/server_info``, ``/model_info``) and relay streamed and plain completions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from luftpause.procs import launch_sglang_router

pytestmark = pytest.mark.integration

MODEL = "llama-3.2-1b"


def submitted(url: str) -> int:
    state: dict[str, Any] = httpx.get(f"{url}/debug/state", timeout=5).json()
    return int(state["submitted"])


def test_router_relays_streamed_and_plain_completions(services: Any, tmp_path: Path) -> None:
    """H1: the SGLang router registers two fake engines and relays streamed and plain
    completions to them (the engines see the requests)."""
    urls = [
        services.start(
            "fake-engine",
            "--port",
            "0",
            "--name",
            name,
            "--time-scale",
            "50",
            "--log-level",
            "WARNING",
            name=name,
        ).urls["http"]
        for name in ("engine-a", "engine-b")
    ]
    router = launch_sglang_router(urls, "cache_aware", tmp_path / "router.stderr", MODEL)
    try:
        before = sum(submitted(u) for u in urls)
        client = openai.OpenAI(
            base_url=f"{router.url}/v1", api_key="none", max_retries=0, timeout=30
        )
        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "tell me about rivers " * 30}
        ]
        plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
        assert plain.choices[0].finish_reason == "length"
        assert plain.usage is not None and plain.usage.completion_tokens == 8
        text, finish = "", None
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, stream=True
        )
        for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        assert text == plain.choices[0].message.content
        assert finish == "length"
        # Several distinct prompts: all answered, and the engines counted them.
        for i in range(4):
            other: list[ChatCompletionMessageParam] = [
                {"role": "user", "content": f"question {i} " * 40}
            ]
            r = client.chat.completions.create(model=MODEL, messages=other, max_tokens=3)
            assert r.usage is not None and r.usage.completion_tokens == 3
        assert sum(submitted(u) for u in urls) - before == 6
        client.close()
    except BaseException:
        print(f"--- router stderr ---\n{router.stderr()}")
        raise
    finally:
        router.stop()
