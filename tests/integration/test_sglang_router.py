"""Two fake engines as real processes behind a real router (H1, S7): the SGLang router
(PyPI ``sglang-router`` 0.3.2) and the SGLang Model Gateway (PyPI ``smg`` 1.13.0).

Each router must register both fake engines as workers (``/health``,
``/server_info``, ``/model_info``; docs/guides/routers.md) and relay streamed and plain
completions to them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fullstack import start_engines
from openai.types.chat import ChatCompletionMessageParam

from luftpause.procs import RouterProcess, launch_sglang_router, launch_smg, missing_workers

pytestmark = pytest.mark.integration

MODEL = "llama-3.2-1b"
RUN_ON = {"ignore_eos": True}  # SGLang's sampling parameter: generate until max_tokens

Launcher = Callable[[list[str], str, Path, str], RouterProcess]
ROUTERS: dict[str, Launcher] = {"sglang-router": launch_sglang_router, "smg": launch_smg}


def submitted(url: str) -> int:
    state: dict[str, Any] = httpx.get(f"{url}/debug/state", timeout=5).json()
    return int(state["submitted"])


@pytest.mark.parametrize("router_name", list(ROUTERS))
def test_router_relays_streamed_and_plain_completions(
    router_name: str, services: Any, tmp_path: Path
) -> None:
    """H1, S7: the router registers both fake engines as workers and relays streamed and
    plain completions to them; every engine sees requests (round robin) and the engines
    together count exactly the turns sent."""
    engines = start_engines(services, ("engine-a", "engine-b"), "--time-scale", "50")
    urls = [e.urls["http"] for e in engines.values()]
    router = ROUTERS[router_name](urls, "round_robin", tmp_path / "router.stderr", MODEL)
    try:
        workers = httpx.get(f"{router.url}/workers", timeout=5).json()["workers"]
        assert sorted(w["url"] for w in workers) == sorted(urls)
        assert missing_workers(router.url, urls) == []
        before = [submitted(u) for u in urls]
        client = openai.OpenAI(
            base_url=f"{router.url}/v1", api_key="none", max_retries=0, timeout=30
        )
        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "tell me about rivers " * 30}
        ]
        plain = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, extra_body=RUN_ON
        )
        assert plain.choices[0].finish_reason == "length"
        assert plain.usage is not None and plain.usage.completion_tokens == 8
        text, finish = "", None
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, stream=True, extra_body=RUN_ON
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
            r = client.chat.completions.create(
                model=MODEL, messages=other, max_tokens=3, extra_body=RUN_ON
            )
            assert r.usage is not None and r.usage.completion_tokens == 3
        after = [submitted(u) for u in urls]
        assert sum(after) - sum(before) == 6
        assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
        client.close()
    except BaseException:
        print(f"--- {router.name} stderr ---\n{router.stderr()}")
        raise
    finally:
        router.stop()
