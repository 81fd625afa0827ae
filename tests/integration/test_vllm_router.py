"""vLLM's router (PyPI ``vllm-router`` 0.1.17) with program scheduling, as real processes in
front of two fake engines serving vLLM's metric names (H1, S7): the flood's ``vllm-*``
arms (tools/bench/flood.py).

Program scheduling groups a run's turns into a program: from the body's
``vllm_xargs.agentic_context`` or, with ``"program_scheduling_enable_key": "auto"``, from
a harness session header such as ``x-session-id``. It binds each program to one engine
and lists it in ``GET /scheduling/diagnostics``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fullstack import start_engines
from openai.types.chat import ChatCompletionMessageParam

from luftpause.procs import launch_vllm_router, missing_workers

pytestmark = pytest.mark.integration

MODEL = "llama-3.2-1b"
TURNS = 3
PROGRAM_SCHEDULING = json.dumps({"program_scheduling_enable_key": "auto"})


def submitted(url: str) -> int:
    state: dict[str, Any] = httpx.get(f"{url}/debug/state", timeout=5).json()
    return int(state["submitted"])


def programs(router_url: str) -> list[dict[str, Any]]:
    """Every program the router's diagnostics list, over all its targets."""
    answer = httpx.get(f"{router_url}/scheduling/diagnostics", timeout=5).json()
    assert answer["enabled"] is True, answer
    return [p for rank in answer["ranks"] for p in rank["programs"]]


def test_program_scheduling_binds_each_run_to_one_engine(services: Any, tmp_path: Path) -> None:
    """H1, S7: vllm-router with program scheduling registers two fake engines (``--metrics
    vllm``) and answers every turn of two runs, one named by the ``x-session-id`` header,
    one by the body's ``vllm_xargs.agentic_context``; its diagnostics list both runs as
    programs, and every turn of a run reached its program's home engine."""
    engines = start_engines(
        services, ("engine-a", "engine-b"), "--time-scale", "50", "--metrics", "vllm"
    )
    urls = [e.urls["http"] for e in engines.values()]
    extra = ["--enable-program-scheduling", "--program-scheduling-config-json", PROGRAM_SCHEDULING]
    router = launch_vllm_router(
        urls, "cache_aware", tmp_path / "router.stderr", MODEL, extra_args=extra
    )
    try:
        assert missing_workers(router.url, urls) == []
        client = openai.OpenAI(
            base_url=f"{router.url}/v1", api_key="none", max_retries=0, timeout=30
        )
        runs: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
            "run-by-header": ({"x-session-id": "run-by-header"}, {}),
            "run-by-body": (
                {},
                {"vllm_xargs": {"agentic_context": {"program_id": "run-by-body",
                                                    "task_id": "run-by-body"}}},
            ),
        }  # fmt: skip
        served: dict[str, list[int]] = {}
        for run, (headers, body) in runs.items():
            before = [submitted(u) for u in urls]
            messages: list[ChatCompletionMessageParam] = [
                {"role": "user", "content": f"{run}: tell me about rivers " * 20}
            ]
            for turn in range(TURNS):
                r = client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=4,
                    extra_headers=headers,
                    extra_body={**body, "ignore_eos": True},
                )
                assert r.usage is not None and r.usage.completion_tokens == 4
                messages += [
                    {"role": "assistant", "content": r.choices[0].message.content or ""},
                    {"role": "user", "content": f"and then, step {turn + 1}?"},
                ]
            served[run] = [submitted(u) - b for u, b in zip(urls, before, strict=True)]
        client.close()

        listed = programs(router.url)
        by_header = [p for p in listed if p["session_id"] == "run-by-header"]
        by_body = [p for p in listed if p["task_id"] == "run-by-body"]
        assert len(by_header) == 1 and len(by_body) == 1, listed
        for run, program in (("run-by-header", by_header[0]), ("run-by-body", by_body[0])):
            home = urls.index(program["home_target"].rstrip("/"))
            # Every turn of the run went to its program's engine, none to the other.
            assert served[run][home] == TURNS and sum(served[run]) == TURNS, (run, served)
    except BaseException:
        print(f"--- {router.name} stderr ---\n{router.stderr()}")
        raise
    finally:
        router.stop()
