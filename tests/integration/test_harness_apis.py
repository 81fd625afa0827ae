"""Anthropic Messages and OpenAI Responses through the dataplane (B9, B4), driven by the
official ``anthropic`` and ``openai`` packages against real processes: two fake engines
that speak only Chat Completions to the proxy (turns are translated), a third that
serves both APIs itself (turns pass through unchanged), the scheduler and a dataplane
whose alias map sends ``claude-*`` and ``gpt-*`` to the engines' model."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fullstack import Stack, eventually, start_engines, start_stack

pytestmark = pytest.mark.integration

NATIVE_MODEL = "native-model"
# A long question gets a long answer from the fake engines (long enough to break off).
LONG = "Tell me everything about the rivers of Europe, in detail. " * 20
ALIASES = '[dataplane.model_aliases]\n"claude-*" = "llama-3.2-1b"\n"gpt-*" = "llama-3.2-1b"\n'
TOOL_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query"],
}
MESSAGES_TOOLS: Any = [
    {"name": "lookup", "description": "look something up", "input_schema": TOOL_SCHEMA}
]
RESPONSES_TOOLS: Any = [
    {
        "type": "function",
        "name": "lookup",
        "description": "look something up",
        "parameters": TOOL_SCHEMA,
        "strict": False,
    }
]


@pytest.fixture(scope="module")
def stack(module_services: Any, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    tmp = tmp_path_factory.mktemp("harness")
    native = start_engines(module_services, ["engine-native"], "--time-scale", "20")
    url = native["engine-native"].urls["http"]
    extra = (
        f'[[endpoints]]\nname = "engine-native"\nurl = "{url}"\nmodels = ["{NATIVE_MODEL}"]\n'
        'metrics = "sglang"\nnative_apis = ["messages", "responses"]\n' + ALIASES
    )
    s = start_stack(module_services, tmp, extra_config=extra)
    s.engines.update(native)
    return s


class Clients:
    """The official clients a test makes, closed after it."""

    def __init__(self) -> None:
        self.made: list[anthropic.AsyncAnthropic | openai.AsyncOpenAI] = []

    def claude(self, base_url: str, api_key: str) -> anthropic.AsyncAnthropic:
        client = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key)
        self.made.append(client)
        return client

    def gpt(self, base_url: str, api_key: str) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
        self.made.append(client)
        return client


@pytest.fixture
async def clients() -> AsyncIterator[Clients]:
    made = Clients()
    yield made
    for client in made.made:
        await client.close()


def dataplane_url(stack: Stack) -> str:
    return str(stack.dataplane.urls["http"])


async def run_status(stack: Stack, run_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as c:
        resp = await c.get(f"{stack.status_url}/runs/{run_id}", timeout=5)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def claude_like_run(
    client: anthropic.AsyncAnthropic, model: str, session: str
) -> tuple[int, anthropic.types.Message, list[anthropic.types.Message]]:
    """An agent loop as Claude Code runs one: streamed turns, tool results sent back,
    until the model answers. Returns the turn count, the answer and every reply."""
    messages: list[Any] = [{"role": "user", "content": "find facts about rivers"}]
    replies = []
    for turn in range(1, 10):
        async with client.messages.stream(
            model=model,
            max_tokens=64,
            system="You are a careful researcher.",
            messages=messages,
            tools=MESSAGES_TOOLS,
            extra_headers={"x-claude-code-session-id": session},
        ) as stream:
            final = await stream.get_final_message()
        replies.append(final)
        if final.stop_reason != "tool_use":
            return turn, final, replies
        messages.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in final.content],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": b.id, "content": "42 facts"}
                    for b in final.content
                    if b.type == "tool_use"
                ],
            }
        )
    raise AssertionError("the agent never answered")


async def test_messages_agent_loop_is_one_run_on_one_replica(
    stack: Stack, clients: Clients
) -> None:
    """B9, B4, S3, D2: an Anthropic client's streamed tool loop through the proxy, model
    asked by a Claude name (alias), its session header naming the run: every turn is
    translated both ways (tool calls, tool results, usage with cached tokens), and the
    scheduler sees one run that never left its replica."""
    client = clients.claude(base_url=dataplane_url(stack), api_key="unused")
    session = str(uuid.uuid4())
    turns, answer, replies = await claude_like_run(client, "claude-sonnet-4-5", session)
    assert turns == 4  # the fake engine calls tools three times, then answers
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.model == "claude-sonnet-4-5"
    assert answer.content[0].type == "text" and answer.content[0].text
    calls = [b for r in replies for b in r.content if b.type == "tool_use"]
    assert len(calls) == 3 and all(c.name == "lookup" and "query" in c.input for c in calls)
    assert all(r.usage.output_tokens > 0 and r.usage.input_tokens > 0 for r in replies)
    # Back from a tool, the run's prefix is still cached on its replica.
    assert any((r.usage.cache_read_input_tokens or 0) > 0 for r in replies[1:])
    run = await run_status(stack, f"claude-code-{session}@claude-sonnet-4-5")
    assert run["turns"] == 4 and run["moves"] == 0, run
    assert run["replica"] in ("engine-a", "engine-b")


async def test_messages_not_streamed_and_tool_ids_kept(stack: Stack, clients: Clients) -> None:
    """B9, D2: a non-streamed Messages turn gets a Message with the engine's tool call
    ID unchanged (the proxy knows the run by it when it comes back), and the turn that
    echoes it continues the same run without any header."""
    client = clients.claude(base_url=dataplane_url(stack), api_key="unused")
    raw = await client.messages.with_raw_response.create(
        model="claude-haiku-4-5",
        max_tokens=32,
        messages=[{"role": "user", "content": "look up lakes"}],
        tools=MESSAGES_TOOLS,
    )
    first = await raw.parse()
    run_id = raw.headers["x-luftpause-run-id"]
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and call.id.startswith("call_")
    again = await client.messages.with_raw_response.create(
        model="claude-haiku-4-5",
        max_tokens=32,
        messages=[
            {"role": "user", "content": "look up lakes"},
            {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "9"}],
            },
        ],
        tools=MESSAGES_TOOLS,
    )
    assert again.headers["x-luftpause-run-id"] == run_id
    assert again.headers["x-luftpause-replica"] == raw.headers["x-luftpause-replica"]


async def codex_like_run(
    client: openai.AsyncOpenAI, model: str, session: str
) -> tuple[int, Any, list[Any]]:
    """An agent loop as Codex runs one over the Responses API: streamed turns, the whole
    conversation sent each time (no stored responses), function call outputs sent back."""
    items: list[Any] = [{"role": "user", "content": "find facts about rivers"}]
    finals = []
    for turn in range(1, 10):
        stream = await client.responses.create(
            model=model,
            instructions="You are a careful researcher.",
            input=items,
            tools=RESPONSES_TOOLS,
            max_output_tokens=64,
            store=False,
            stream=True,
            extra_headers={"session-id": session, "thread-id": session},
        )
        kinds: list[str] = []
        final = None
        async for event in stream:
            kinds.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
        assert final is not None, kinds
        assert kinds[0] == "response.created" and kinds[-1] == f"response.{final.status}"
        finals.append(final)
        calls = [o for o in final.output if o.type == "function_call"]
        if not calls:
            return turn, final, finals
        items += [o.model_dump(exclude_none=True) for o in final.output]
        items += [
            {"type": "function_call_output", "call_id": c.call_id, "output": "42 facts"}
            for c in calls
        ]
    raise AssertionError("the agent never answered")


async def test_responses_agent_loop_is_one_run_on_one_replica(
    stack: Stack, clients: Clients
) -> None:
    """B9, B4, S3: an OpenAI Responses client's streamed tool loop, as Codex sends it
    (model by a GPT name, session and thread headers): translated both ways, usage with
    cached tokens, one run that kept its replica."""
    client = clients.gpt(base_url=f"{dataplane_url(stack)}/v1", api_key="unused")
    session = str(uuid.uuid4())
    turns, final, finals = await codex_like_run(client, "gpt-5-codex", session)
    assert turns == 4
    assert final.model == "gpt-5-codex"
    assert final.output_text
    assert all(f.usage.output_tokens > 0 and f.usage.input_tokens > 0 for f in finals)
    assert any(f.usage.input_tokens_details.cached_tokens > 0 for f in finals[1:])
    run = await run_status(stack, f"codex-{session}@gpt-5-codex")
    assert run["turns"] == 4 and run["moves"] == 0, run


async def test_responses_not_streamed(stack: Stack, clients: Clients) -> None:
    """B9: a non-streamed Responses turn, parsed by the official package."""
    client = clients.gpt(base_url=f"{dataplane_url(stack)}/v1", api_key="unused")
    reply = await client.responses.create(
        model="gpt-5", input="say something", max_output_tokens=16, store=False
    )
    assert reply.status in ("completed", "incomplete") and reply.output_text
    assert reply.usage is not None and reply.usage.output_tokens > 0


async def test_errors_come_in_each_api_s_own_shape(stack: Stack, clients: Clients) -> None:
    """B9, D6, S6: what the proxy refuses reaches each client as its own API's error:
    an unknown model (no alias matches) is a 404 naming it, a feature the translation
    cannot carry (an image) a 400 naming it; neither took a slot."""
    claude = clients.claude(base_url=dataplane_url(stack), api_key="unused")
    with pytest.raises(anthropic.NotFoundError) as missing:
        await claude.messages.create(
            model="mistral-7b", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert "mistral-7b" in str(missing.value)
    image = {"type": "image", "source": {"type": "url", "url": "https://example.invalid/x.png"}}
    with pytest.raises(anthropic.BadRequestError) as bad:
        await claude.messages.create(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": [image]}]
        )
    assert "image" in str(bad.value)
    async with httpx.AsyncClient() as c:
        raw = await c.post(
            f"{dataplane_url(stack)}/v1/messages",
            json={"model": "nope", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
        )
    assert raw.status_code == 404 and raw.json()["type"] == "error"
    assert raw.json()["error"]["type"] == "not_found_error"
    assert raw.headers["x-luftpause-run-id"]
    async with httpx.AsyncClient() as c:
        wrong_method = await c.get(f"{dataplane_url(stack)}/v1/messages")
        no_route = await c.post(f"{dataplane_url(stack)}/v1/messages/count_tokens", json={})
    assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error"
    assert no_route.status_code == 404 and no_route.json()["type"] == "error"

    gpt = clients.gpt(base_url=f"{dataplane_url(stack)}/v1", api_key="unused")
    with pytest.raises(openai.NotFoundError):
        await gpt.responses.create(model="mistral-7b", input="hi")
    with pytest.raises(openai.BadRequestError) as stored:
        await gpt.responses.create(model="gpt-5", input="hi", previous_response_id="resp_1")
    assert "previous_response_id" in str(stored.value)


@pytest.mark.parametrize(
    ("path", "body", "error_event"),
    [
        (
            "/v1/messages",
            {
                "model": "claude-x",
                "max_tokens": 400,
                "messages": [{"role": "user", "content": LONG}],
            },
            b"event: error\n",
        ),
        (
            "/v1/responses",
            {"model": "gpt-x", "input": LONG, "max_output_tokens": 400},
            b"event: response.failed\n",
        ),
    ],
)
async def test_engine_failing_mid_stream_ends_with_the_api_s_error_event(
    stack: Stack, path: str, body: dict[str, Any], error_event: bytes
) -> None:
    """D6, B9: when the engine breaks off mid-stream, a translated stream gets the events
    so far, then its API's error event as its last, then it ends; the turn is reported
    failed."""
    before = await stack.dataplane_metric(
        'luftpause_dataplane_turns_total{outcome="engine_broke",service_class="batch"}'
    )
    received = b""
    async with (
        httpx.AsyncClient(timeout=30) as c,
        c.stream(
            "POST",
            f"{dataplane_url(stack)}{path}",
            json={**body, "stream": True},
            headers={"x-fake-fault": "midstream"},
        ) as resp,
    ):
        assert resp.status_code == 200
        with contextlib.suppress(httpx.HTTPError):  # the connection may close uncleanly
            async for data in resp.aiter_raw():
                received += data
    assert error_event in received, received[-500:]
    assert received.rstrip().rsplit(b"\n\n", 1)[-1].startswith(error_event)  # the last event
    assert b"message_stop" not in received and b"response.completed" not in received

    async def reported() -> bool:
        broke = await stack.dataplane_metric(
            'luftpause_dataplane_turns_total{outcome="engine_broke",service_class="batch"}'
        )
        return broke > before

    await eventually(reported, what="the failure to be reported")


async def test_native_endpoint_gets_the_turn_unchanged(stack: Stack, clients: Clients) -> None:
    """B9: on a replica that serves an API itself (``native_apis``), the turn passes
    through untranslated: the client gets the engine's own events, and the proxy still
    reads them for its report (the turn ends, its tool call pauses the run)."""
    body = {
        "model": NATIVE_MODEL,
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": "look up seas"}],
        "tools": MESSAGES_TOOLS,
    }
    session = str(uuid.uuid4())
    async with httpx.AsyncClient(timeout=30) as c:
        via = await c.post(
            f"{dataplane_url(stack)}/v1/messages?beta=true",
            json=body,
            headers={"x-claude-code-session-id": session},
        )
        direct = await c.post(f"{stack.engine_url('engine-native')}/v1/messages", json=body)
    assert via.status_code == 200, (via.text, stack.dataplane.stderr()[-3000:])
    assert via.headers["x-luftpause-replica"] == "engine-native"

    def events(raw: bytes) -> list[str]:
        return [line for line in raw.decode().split("\n") if line.startswith("event: ")]

    assert events(via.content) == events(direct.content)
    assert "event: message_stop" in events(via.content)
    tool_use = [
        json.loads(line[6:])["content_block"]
        for line in via.content.decode().split("\n")
        if line.startswith("data: ") and '"content_block_start"' in line
    ]
    assert tool_use and tool_use[0]["type"] == "tool_use"
    run = await run_status(stack, f"claude-code-{session}@{NATIVE_MODEL}")
    assert run["phase"] == "paused_on_tool" and run["replica"] == "engine-native", run

    client = clients.gpt(base_url=f"{dataplane_url(stack)}/v1", api_key="unused")
    reply = await client.responses.create(model=NATIVE_MODEL, input="hello", max_output_tokens=8)
    assert reply.output_text

    # An image for a model no endpoint serves with vision = true is passed through to an
    # engine serving the API itself, which decides: this fake one translates it as vLLM
    # does (into an image_url part) and answers. A bad image is the engine's to refuse,
    # in Anthropic's shape.
    image = {"type": "image", "source": {"type": "url", "url": "https://example.invalid/x.png"}}
    async with httpx.AsyncClient(timeout=30) as c:
        passed = await c.post(
            f"{dataplane_url(stack)}/v1/messages",
            json={
                "model": NATIVE_MODEL,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [image]}],
            },
        )
    assert passed.status_code == 200 and passed.headers["x-luftpause-replica"] == "engine-native"
    assert passed.json()["type"] == "message", passed.text
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AA=="}}
    async with httpx.AsyncClient(timeout=30) as c:
        refused = await c.post(
            f"{dataplane_url(stack)}/v1/messages",
            json={
                "model": NATIVE_MODEL,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [bad]}],
            },
        )
    assert refused.status_code == 400 and refused.headers["x-luftpause-replica"] == "engine-native"
    assert refused.json()["type"] == "error" and "media_type" in refused.json()["error"]["message"]

    async def idle() -> bool:
        status = await stack.status()
        return bool(status["in_flight_total"] == 0)

    await eventually(idle, what="no turn left in flight")


async def test_token_in_either_header(
    module_services: Any, tmp_path: Path, clients: Clients
) -> None:
    """D9, B9: with a token set, the Anthropic client's ``x-api-key`` and the OpenAI
    client's bearer token are both accepted; a wrong one is an authentication error in
    each API's shape."""
    stack = start_stack(
        module_services,
        tmp_path,
        engines=("engine-a",),
        extra_config=ALIASES,
        dataplane_env={"LUFTPAUSE_TOKEN": "tok-9"},
    )
    url = dataplane_url(stack)
    good = clients.claude(base_url=url, api_key="tok-9")
    reply = await good.messages.create(
        model="claude-x", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.content
    with pytest.raises(anthropic.AuthenticationError):
        await clients.claude(base_url=url, api_key="wrong").messages.create(
            model="claude-x", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    gpt = clients.gpt(base_url=f"{url}/v1", api_key="tok-9")
    assert (await gpt.responses.create(model="gpt-5", input="hi", max_output_tokens=4)).output
    with pytest.raises(openai.AuthenticationError):
        await clients.gpt(base_url=f"{url}/v1", api_key="no").responses.create(
            model="gpt-5", input="hi"
        )
