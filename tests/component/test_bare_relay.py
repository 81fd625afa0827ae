"""tools/bench/bare_relay.py, the floor arm of ``overhead.py`` (D10 benchmark tooling): it
relays a turn to an engine and back unchanged, streamed or whole, and takes the engines
in turn, so what it costs is a relay's and its figures are a relay's."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
from _engine_helpers import running_engine

from luftpause.fakes.engine.model import EngineParams
from luftpause.fakes.engine.server import ServerConfig
from luftpause.serving import bind_socket, bound_port, uvicorn_server, wait_started
from tools.bench.bare_relay import BareRelay

FAST = ServerConfig(params=EngineParams(time_scale=200.0))
BODY = {
    "model": "llama-3.2-1b",
    "messages": [{"role": "user", "content": "say something short"}],
    "max_tokens": 16,
}


@contextlib.asynccontextmanager
async def relay(engines: list[str]) -> AsyncIterator[str]:
    app = BareRelay(engines)
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn_server(app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await asyncio.wait_for(wait_started(server, task), 10)
        yield f"http://127.0.0.1:{bound_port(sock)}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        await app.client.close()
        sock.close()


async def test_the_bare_relay_passes_streams_and_replies_through_to_each_engine_in_turn() -> None:
    async with (
        running_engine(replace(FAST, chunk_tokens=4)) as (first, first_app),
        running_engine(replace(FAST, chunk_tokens=4)) as (second, second_app),
        relay([first, second]) as url,
        httpx.AsyncClient(timeout=30) as client,
    ):
        streamed = {**BODY, "stream": True}
        seen = []
        for _ in range(2):
            async with client.stream("POST", f"{url}/v1/chat/completions", json=streamed) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                events = [line async for line in r.aiter_lines() if line.startswith("data:")]
            assert events[-1] == "data: [DONE]"
            chunks = [json.loads(e[5:]) for e in events[:-1]]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            assert text and chunks[-1]["choices"][0]["finish_reason"] == "length"
            seen.append(text)
        whole = await client.post(f"{url}/v1/chat/completions", json=BODY)
        assert whole.status_code == 200
        assert whole.json()["choices"][0]["finish_reason"] == "length"
        bad = await client.post(f"{url}/v1/chat/completions", json={"model": "llama-3.2-1b"})
        assert bad.status_code == 400  # the engine's refusal, passed on as it is
        # Four requests taken in turn: two turns to the first engine, one turn and the
        # refused request (which never reaches its model) to the second.
        submitted = [app.state.driver.submitted for app in (first_app, second_app)]
        assert sorted(submitted) == [1, 2], submitted
