"""The dataplane with real processes (two fake engines, scheduler, dataplane), driven by
the official ``openai`` package and raw HTTP where the bytes themselves matter."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fullstack import MODEL, Stack, eventually, start_stack

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look something up",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    }
]
GHOST = (
    '[[endpoints]]\nname = "ghost"\nurl = "http://127.0.0.1:9"\nmodels = ["ghost-model"]\n'
    'health_path = ""\nmetrics = "none"\n'
)


@pytest.fixture(scope="module")
def stack(module_services: Any, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    return start_stack(module_services, tmp_path_factory.mktemp("stack"), extra_config=GHOST)


async def agent_run(
    client: openai.AsyncOpenAI,
    run_id: str | None,
    cls: str = "batch",
    caller: str = "tests",
    topic: str = "rivers",
) -> tuple[str, set[str], int]:
    """A small own-loop agent: call the model, answer its tool calls, until it answers.
    Returns the run ID the proxy used, the replicas its turns went to, and its turn count."""
    headers = {"x-luftpause-class": cls, "x-luftpause-caller": caller}
    if run_id:
        headers["x-luftpause-run-id"] = run_id
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"find facts about {topic}"}]
    replicas: set[str] = set()
    seen_run: str | None = None
    for turn in range(1, 10):
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,
            max_tokens=32,  # type: ignore[arg-type]
            extra_headers=headers,
        )
        reply = raw.parse()
        replicas.add(raw.headers["x-luftpause-replica"])
        run = raw.headers["x-luftpause-run-id"]
        assert seen_run in (None, run), "the proxy must keep one run ID for the whole loop"
        seen_run = run
        msg = reply.choices[0].message
        if not msg.tool_calls:
            return run, replicas, turn
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "42 facts"})
    raise AssertionError("the agent never answered")


async def test_plain_and_streamed_turns(stack: Stack) -> None:
    """D1: plain and streamed completions through the proxy with the openai package."""
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused")
    run_on = {"ignore_eos": True}  # the fake engine (like SGLang) then runs to max_tokens
    plain = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, extra_body=run_on
    )
    assert plain.choices[0].message.content and plain.usage is not None
    assert plain.usage.completion_tokens == 8
    pieces = []
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        stream=True,
        extra_body=run_on,
    )
    async for chunk in stream:
        assert chunk.usage is None  # the client did not ask for usage
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == plain.choices[0].message.content  # deterministic filler


async def test_streamed_bytes_equal_the_engine_s(stack: Stack) -> None:
    """D1: with usage requested, the client receives exactly the engine's event stream."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "same"}],
        "max_tokens": 6,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient(timeout=30) as c:
        via = await c.post(f"{stack.base_url}/chat/completions", json=body)
        name = via.headers["x-luftpause-replica"]
        direct = await c.post(f"{stack.engine_url(name)}/v1/chat/completions", json=body)
    assert via.headers["content-type"].startswith("text/event-stream")
    assert via.content.endswith(b"data: [DONE]\n\n")

    def events(raw: bytes) -> list[Any]:
        out = []
        for line in raw.split(b"\n\n"):
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                chunk.pop("id", None)
                chunk.pop("created", None)
                out.append(chunk)
        return out

    # IDs, timestamps and the cache/timing part of usage differ between two calls (the
    # second one hits the prefix cache); every content chunk is the same.
    a, b = events(via.content), events(direct.content)
    usage_a, usage_b = a.pop()["usage"], b.pop()["usage"]
    assert a == b
    assert usage_a["completion_tokens"] == usage_b["completion_tokens"] == 6


async def test_tool_loop_keeps_run_and_replica(stack: Stack) -> None:
    """D2, S3: with and without the run header, echoed tool results keep one run, and
    every turn of a paused run goes back to the replica holding its prefix."""
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused")
    results = await asyncio.gather(
        *(
            agent_run(client, f"affinity-{i}" if i % 2 else None, topic=f"river {i}")
            for i in range(8)
        )
    )
    for i, (run_id, replicas, turns) in enumerate(results):
        if i % 2:
            assert run_id == f"affinity-{i}"
        else:
            assert run_id.startswith("run-")
        assert turns == 4  # three tool rounds, then the answer
        assert len(replicas) == 1, f"run {run_id} moved between replicas: {replicas}"
    assert {r for _, reps, _ in results for r in reps} == {"engine-a", "engine-b"}


async def test_engine_rejections_pass_through(stack: Stack) -> None:
    """D6: engine 429 and 5xx: status and body unchanged, with Retry-After."""
    async with httpx.AsyncClient(timeout=30) as c:
        for fault, status in (("429", 429), ("500", 500)):
            headers = {
                "x-fake-fault": fault,
                "x-fake-retry-after": "7",
                "x-luftpause-run-id": "rejected",
            }
            body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
            via = await c.post(f"{stack.base_url}/chat/completions", json=body, headers=headers)
            direct = await c.post(
                f"{stack.engine_url('engine-a')}/v1/chat/completions", json=body, headers=headers
            )
            assert via.status_code == status == direct.status_code
            assert via.content == direct.content
            assert via.headers.get("retry-after") == direct.headers.get("retry-after")
            assert via.headers["x-luftpause-run-id"] == "rejected"
    assert (
        await stack.dataplane_metric(
            'luftpause_dataplane_turns_total{outcome="engine_rejected",service_class="batch"}'
        )
        >= 2
    )


async def test_engine_failing_mid_stream_closes_without_done(stack: Stack) -> None:
    """D6: 200, the chunks so far, then the connection closes without [DONE]."""
    received = b""
    async with (
        httpx.AsyncClient(timeout=30) as c,
        c.stream(
            "POST",
            f"{stack.base_url}/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 40,
                "ignore_eos": True,
                "stream": True,
            },
            headers={"x-fake-fault": "midstream"},
        ) as resp,
    ):
        assert resp.status_code == 200
        with pytest.raises(httpx.HTTPError):
            async for data in resp.aiter_raw():
                received += data
    assert b"data: " in received and b"[DONE]" not in received
    await eventually(
        lambda: stack.dataplane_metric(
            'luftpause_dataplane_turns_total{outcome="engine_broke",service_class="batch"}'
        ),
        what="the failure to be reported",
    )


async def test_engine_unreachable_is_502(stack: Stack) -> None:
    """D6: an engine that refuses connections → 502 `engine <replica>: <error>`."""
    async with httpx.AsyncClient(timeout=30) as c:
        resp = await c.post(
            f"{stack.base_url}/chat/completions",
            json={"model": "ghost-model", "messages": [{"role": "user", "content": "x"}]},
        )
    assert resp.status_code == 502
    assert resp.json()["error"]["message"].startswith("engine ghost: connection failed")
    assert resp.headers["x-luftpause-run-id"]


async def test_unknown_model_is_404(stack: Stack) -> None:
    """S6, D6: unknown model, with the openai package's view of it."""
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused")
    with pytest.raises(openai.NotFoundError) as exc:
        await client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    assert "no Generative replica serves model 'no-such-model'" in str(exc.value)


async def test_client_leaving_mid_stream_stops_the_engine(stack: Stack) -> None:
    """D6: the client leaves mid-stream → the engine request is closed (generation stops)."""
    async with (
        httpx.AsyncClient(timeout=30) as c,
        c.stream(
            "POST",
            f"{stack.base_url}/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "a long story"}],
                "max_tokens": 4000,
                "ignore_eos": True,
                "stream": True,
            },
        ) as resp,
    ):
        name = resp.headers["x-luftpause-replica"]
        async for _ in resp.aiter_raw():
            break

    async def engine_idle() -> bool:
        state = await stack.engine_state(name)
        return not any(r["max_new_tokens"] == 4000 for r in state["requests"])

    await eventually(engine_idle, what="the engine to drop the abandoned request")
    await eventually(
        lambda: stack.dataplane_metric(
            'luftpause_dataplane_turns_total{outcome="client_left",service_class="batch"}'
        ),
        what="the failure report",
    )


async def test_auth(module_services: Any, tmp_path: Path) -> None:
    """D9: with LUFTPAUSE_TOKEN every /v1 route needs the bearer token (401 JSON otherwise)."""
    stack = start_stack(
        module_services,
        tmp_path,
        engines=("engine-a",),
        dataplane_env={"LUFTPAUSE_TOKEN": "tok-123"},
    )
    assert "LUFTPAUSE_TOKEN" not in stack.dataplane.stderr()  # set: no warning
    denied = openai.AsyncOpenAI(base_url=stack.base_url, api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        await denied.models.list()
    allowed = openai.AsyncOpenAI(base_url=stack.base_url, api_key="tok-123")
    assert [m.id for m in (await allowed.models.list()).data] == [MODEL]
    reply = await allowed.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4
    )
    assert reply.choices[0].message.content
    async with httpx.AsyncClient() as c:
        resp = await c.delete(f"{stack.base_url}/runs/x")
    assert resp.status_code == 401 and "error" in resp.json()


async def test_interactive_goes_before_held_batch(services: Any, tmp_path: Path) -> None:
    """S2, S4, D4: on a saturated replica, an interactive turn is admitted before batch
    turns that were held earlier, and so finishes before all of them."""
    stack = start_stack(
        services,
        tmp_path,
        engines=("engine-a",),
        engine_args=("--time-scale", "4", "--max-running", "2"),
    )
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused", timeout=120)
    done: dict[str, float] = {}

    # The first wave's long replies keep both engine slots busy while the second wave
    # arrives (so all of it is held); the interactive reply is short, the second wave's
    # long, so "admitted first" shows as "finished first" whatever the machine's speed.
    async def turn(name: str, cls: str, tokens: int) -> None:
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": name}],
            max_tokens=tokens,
            extra_body={"ignore_eos": True},  # every reply runs to its max_tokens
            extra_headers={"x-luftpause-class": cls, "x-luftpause-caller": name},
        )
        done[name] = time.monotonic()

    first = [asyncio.create_task(turn(f"a{i}", "batch", 400)) for i in range(6)]

    async def capped() -> bool:
        return (await stack.status())["replicas"][0]["capacity"] == 2  # type: ignore[no-any-return]

    await eventually(capped, what="the scheduler to cap the queueing engine")
    later = [asyncio.create_task(turn(f"b{i}", "batch", 200)) for i in range(6)]

    async def held() -> bool:
        return (await stack.status())["held_total"] >= 6  # type: ignore[no-any-return]

    await eventually(held, what="the second batch wave to be held")
    interactive = asyncio.create_task(turn("interactive", "interactive", 20))
    await asyncio.wait_for(asyncio.gather(*first, *later, interactive), 120)
    assert all(done["interactive"] < done[f"b{i}"] for i in range(6)), done


async def test_client_leaving_while_held_abandons(services: Any, tmp_path: Path) -> None:
    """D4, D6: a client that leaves while held leaves the queue; no engine request is made."""
    stack = start_stack(
        services,
        tmp_path,
        engines=("engine-a",),
        engine_args=("--time-scale", "4", "--max-running", "1"),
    )
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused", timeout=120)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 150}
    run_on = {"ignore_eos": True}  # every reply runs to its max_tokens
    flood = [
        asyncio.create_task(client.chat.completions.create(**body, extra_body=run_on))
        for _ in range(3)
    ]

    async def capped() -> bool:
        return (await stack.status())["replicas"][0]["capacity"] == 1  # type: ignore[no-any-return]

    await eventually(capped, what="a cap")
    async with httpx.AsyncClient(timeout=60) as c:
        leaving = asyncio.create_task(
            c.post(f"{stack.base_url}/chat/completions", json={**body, **run_on})
        )

        async def held() -> bool:
            return (await stack.status())["held_total"] == 1  # type: ignore[no-any-return]

        await eventually(held, what="the turn to be held")
        leaving.cancel()  # the client gives up and closes its connection
        with pytest.raises(asyncio.CancelledError):
            await leaving
    await asyncio.wait_for(asyncio.gather(*flood), 120)

    async def settled() -> bool:
        s = await stack.status()
        return s["held_total"] == 0 and s["in_flight_total"] == 0  # type: ignore[no-any-return]

    await eventually(settled, what="the abandoned turn to leave the queue")
    assert (await stack.engine_state("engine-a"))["submitted"] == 3
    assert (
        await stack.dataplane_metric(
            'luftpause_dataplane_turns_total{outcome="abandoned",service_class="batch"}'
        )
        == 1
    )
