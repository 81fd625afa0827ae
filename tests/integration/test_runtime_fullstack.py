"""The runtime on the whole stack: scheduler + dataplane + fake engines + fake tools (R4, R13, R15).

Sub-agents' turns go through the real dataplane (admitted by the scheduler),
decide goes to a single-pass replica through ``/v1/decide`` or to a generative
one with logprobs, and every run end is a ``DELETE /v1/runs/{id}`` the
dataplane knows.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from conftest import Services
from fullstack import Stack, start_stack, write_runtime_config
from mcp import Client
from mcp_types import CallToolResult
from prometheus_client.parser import text_string_to_metric_families

from luftpause.procs import ServiceProcess

pytestmark = pytest.mark.integration

CLASSIFIER = "roberta-clf"


@dataclass
class Full:
    runtime: ServiceProcess
    stack: Stack

    @property
    def dataplane(self) -> ServiceProcess:
        return self.stack.dataplane  # type: ignore[no-any-return]

    @property
    def mcp_url(self) -> str:
        return self.runtime.urls["http"] + "/mcp"


@pytest.fixture(scope="module")
def full(module_services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Full]:
    tmp = tmp_path_factory.mktemp("runtime-full")
    clf = module_services.start(
        "fake-engine", "--name", "clf", "--port", "0", "--model", CLASSIFIER, name="clf"
    )
    extra = (
        f'[[endpoints]]\nname = "clf"\nurl = "{clf.urls["http"]}"\nkind = "single_pass"\n'
        f'models = ["{CLASSIFIER}"]\nmetrics = "none"\n'
    )
    stack = start_stack(
        module_services,
        tmp,
        engine_args=("--time-scale", "50", "--tool-results", "2"),
        engines=("engine-a",),
        extra_config=extra,
    )
    tools = module_services.start("fake-mcp", "--port", "0", "--lookup-delay-s", "0.05")
    config = write_runtime_config(tmp, stack.dataplane.urls["http"], tools.urls["http"])
    runtime = module_services.start("runtime", "--config", str(config), "--port", "0")
    yield Full(runtime, stack)


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    return dict(json.loads(result.content[0].text))  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_subagents_through_the_dataplane(full: Full, mode: str) -> None:
    """R4, R15: turns go through the dataplane with the run's identity; run ends are known."""
    async with asyncio.timeout(90):
        async with Client(full.mcp_url, mode=mode, read_timeout_seconds=60) as c:
            handles = []
            for i in range(4):
                args = {"task": f"full stack {mode} {i}", "tools": ["lookup"]}
                if i % 2:
                    args["serviceClass"] = "batch"
                handles.append(data(await c.call_tool("spawn", args))["handle"])
            out = data(await c.call_tool("await", {"handles": handles, "timeout": 60}))
    assert out["finished"]
    for r in out["results"]:
        assert r["state"] == "Completed", r
        assert (r["toolCalls"], r["failedToolCalls"], r["turns"]) == (2, 0, 3)
    assert [r["serviceClass"] for r in out["results"]] == ["interactive", "batch"] * 2
    await asyncio.sleep(0)
    log = full.runtime.stderr()
    assert "does not know the run" not in log and "could not report" not in log


async def test_subagent_turns_stream_so_the_decode_pace_times_them(full: Full) -> None:
    """R4, S2 (decode pace): a sub-agent's turns are streamed, so the dataplane sees each
    one's first token (its time-to-first-token histogram counts every turn of the run)
    and the scheduler times their decode on the replica they ran on; the usage still
    comes back whole (the run's tokens are counted)."""
    cls = "interactive"
    before = await first_tokens_seen(full, cls)
    async with asyncio.timeout(90):
        async with Client(full.mcp_url, mode="auto", read_timeout_seconds=60) as c:
            args = {"task": "stream " + "and pace " * 40, "tools": ["lookup"], "maxTokens": 64}
            handle = data(await c.call_tool("spawn", {**args, "serviceClass": cls}))["handle"]
            out = data(await c.call_tool("await", {"handles": [handle], "timeout": 60}))
        (result,) = out["results"]
        assert result["state"] == "Completed", result
        assert result["turns"] == 3 and result["usage"]["completionTokens"] > 0, result
        assert await first_tokens_seen(full, cls) - before == 3
        status = await full.stack.status()
    (replica,) = [r for r in status["replicas"] if r["name"] == "engine-a"]
    assert replica["pace_s_per_token"] is not None, replica


async def first_tokens_seen(full: Full, cls: str) -> float:
    """The dataplane's count of turns of ``cls`` whose first token it saw."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(full.dataplane.urls["http"] + "/metrics")).text
    name = "luftpause_dataplane_time_to_first_token_seconds_count"
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("service_class") == cls:
                return float(sample.value)
    return 0.0
