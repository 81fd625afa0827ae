"""Images from Claude Code and Codex through the dataplane to a fake engine (B9, D6).

A real dataplane (ASGI transport), a real in-process scheduler on loopback and a real
fake engine on 127.0.0.1:0, recorded on its way in. Three models: ``vlm`` is served
by an endpoint with ``vision = true``, ``llm`` by one without, ``both`` by the two.
Requests are made with the official ``anthropic`` and ``openai`` SDKs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from _engine_helpers import RecordingEngine

from luftpause.callers import Gate
from luftpause.config import DataplaneSettings, Endpoint, MetricsFlavour, Secrets
from luftpause.dataplane.app import create_app
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.engine_http import EngineClient
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.scheduler_link import SchedulerLink
from luftpause.fakes.engine.model import EngineParams
from luftpause.fakes.engine.server import ServerConfig
from luftpause.fakes.engine.server import create_app as engine_app
from luftpause.fakes.engine.tokens import IMAGE_TOKENS
from luftpause.scheduler.core import EndpointKind as CoreKind
from luftpause.scheduler.core import Params, ReplicaProbed, ReplicaSpec, initial_state
from luftpause.scheduler.service.grpc_server import start_grpc
from luftpause.scheduler.service.host import Host
from luftpause.serving import bind_socket, bound_port, uvicorn_server, wait_started
from luftpause.tool_calls import TOOL_CALL_ORIGINS_MAX, ToolCallOrigins

PNG = "iVBORw0KGgo="  # base64 of the PNG signature
SERVED = {"eyes": ("vlm", "both"), "blind": ("llm", "both")}


@dataclass
class VisionStack:
    host: Host
    engine: RecordingEngine
    anthropic: anthropic.AsyncAnthropic
    openai: openai.AsyncOpenAI


@pytest.fixture(name="stack")
async def stack_fixture() -> AsyncIterator[VisionStack]:
    engine = RecordingEngine(engine_app(ServerConfig(params=EngineParams(time_scale=200.0))))
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn_server(engine)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    await asyncio.wait_for(wait_started(server, serving), 10)
    url = f"http://127.0.0.1:{bound_port(sock)}"
    endpoints = {
        "eyes": Endpoint(
            name="eyes", url=url, models=SERVED["eyes"], metrics=MetricsFlavour.NONE, vision=True
        ),
        "blind": Endpoint(
            name="blind", url=url, models=SERVED["blind"], metrics=MetricsFlavour.NONE
        ),
    }
    specs = tuple(
        ReplicaSpec(name, CoreKind.GENERATIVE, frozenset(models)) for name, models in SERVED.items()
    )
    host = Host(initial_state(specs, Params(), time.monotonic()), time.monotonic)
    writer = asyncio.create_task(host.run())
    grpc = await start_grpc(host, {name: url for name in SERVED}, "127.0.0.1:0")
    for name in SERVED:
        await host.apply(lambda at, n=name: ReplicaProbed(at=at, replica=n, healthy=True))
    runs = RunTable(time.monotonic, 1800)
    settings = DataplaneSettings(report_reconnect_s=0.1)
    dp = Dataplane(
        settings=settings,
        endpoints=endpoints,
        secrets=Secrets(),
        link=SchedulerLink(f"127.0.0.1:{grpc.port}", "dp-vision", runs, reconnect_s=0.1),
        runs=runs,
        memory=ToolCallOrigins(time.monotonic, 1800, TOOL_CALL_ORIGINS_MAX),
        http=EngineClient(settings.engine_connect_timeout_s),
        metrics=Metrics(),
        gate=Gate(None, None),
    )
    maintain = asyncio.create_task(dp.link.maintain())
    async with asyncio.timeout(5):
        await dp.link.ready.wait()
    app = create_app(dp)
    claude = anthropic.AsyncAnthropic(
        base_url="http://dp",
        api_key="unused",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app)),
    )
    codex = openai.AsyncOpenAI(
        base_url="http://dp/v1",
        api_key="unused",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app)),
    )
    yield VisionStack(host, engine, claude, codex)
    await claude.close()
    await codex.close()
    maintain.cancel()
    await dp.http.close()
    await dp.link.close()
    await grpc.stop(grace=0)
    writer.cancel()
    server.should_exit = True
    await asyncio.wait_for(serving, 10)
    sock.close()


def image_message(text: str) -> list[anthropic.types.MessageParam]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                },
                {"type": "image", "source": {"type": "url", "url": "https://img.test/b.jpg"}},
            ],
        }
    ]


IMAGE_PARTS = [
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
    {"type": "image_url", "image_url": {"url": "https://img.test/b.jpg"}},
]


async def test_claude_code_images_reach_a_vision_endpoint(stack: VisionStack) -> None:
    """B9: Anthropic image blocks for a model served by a vision endpoint reach the
    engine as image_url parts in order; the engine counts them as image tokens."""
    message = await stack.anthropic.messages.create(
        model="vlm", max_tokens=4, messages=image_message("what is this?")
    )
    assert message.content and message.stop_reason in ("end_turn", "max_tokens")
    sent = stack.engine.bodies[-1]
    assert sent["model"] == "vlm"
    assert sent["messages"][-1]["content"] == [
        {"type": "text", "text": "what is this?"},
        *IMAGE_PARTS,
    ]
    plain = await stack.anthropic.messages.create(
        model="vlm", max_tokens=4, messages=[{"role": "user", "content": "what is this?"}]
    )
    assert stack.engine.bodies[-1]["messages"][-1]["content"] == "what is this?"
    prompt = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    plain_prompt = plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0)
    assert prompt >= plain_prompt + 2 * IMAGE_TOKENS


async def test_codex_images_reach_a_vision_endpoint(stack: VisionStack) -> None:
    """B9: Responses input_image parts (a data URL with its detail, a URL) for a model
    served by a vision endpoint reach the engine as image_url parts, streamed too."""
    content: list[openai.types.responses.ResponseInputContentParam] = [
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "low"},
        {"type": "input_text", "text": "and this?"},
    ]
    response = await stack.openai.responses.create(
        model="vlm", input=[{"role": "user", "content": content}], max_output_tokens=4
    )
    assert response.status in ("completed", "incomplete")
    expected = [
        {
            "type": "image_url",
            "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "low"},
        },
        {"type": "text", "text": "and this?"},
    ]
    assert stack.engine.bodies[-1]["messages"][-1]["content"] == expected
    stream = await stack.openai.responses.create(
        model="vlm", input=[{"role": "user", "content": content}], max_output_tokens=4, stream=True
    )
    kinds = [event.type async for event in stream]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert stack.engine.bodies[-1]["messages"][-1]["content"] == expected


async def test_images_for_a_model_without_vision_are_refused_naming_the_setting(
    stack: VisionStack,
) -> None:
    """B9, D6: images for a model no vision endpoint serves are a 400 in the API's shape
    naming the image's position and ``vision = true``; one served by endpoints with and
    without vision is refused too, naming those without; nothing reaches the engine and
    no turn is left in the scheduler. Text-only turns to the same models go on."""
    with pytest.raises(anthropic.BadRequestError) as refused:
        await stack.anthropic.messages.create(
            model="llm", max_tokens=4, messages=image_message("see")
        )
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == (
        "messages[0].content[1]: model 'llm' is not served by a vision endpoint; "
        "set vision = true on its endpoint (blind) to forward images"
    )
    with pytest.raises(anthropic.BadRequestError) as mixed:
        await stack.anthropic.messages.create(
            model="both", max_tokens=4, messages=image_message("see")
        )
    assert "served by endpoints with and without vision = true (without: blind)" in str(mixed.value)
    with pytest.raises(openai.BadRequestError) as codex:
        await stack.openai.responses.create(
            model="llm",
            input=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "input_image",
                            "image_url": "https://img.test/a.png",
                            "detail": "auto",
                        }
                    ],
                }
            ],
        )
    assert codex.value.status_code == 400
    assert "input[0].content[0]: model 'llm' is not served by a vision endpoint" in str(codex.value)
    assert stack.engine.bodies == []
    assert not stack.host.state.turns and not stack.host.state.held
    text = await stack.anthropic.messages.create(
        model="both", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    assert text.content and len(stack.engine.bodies) == 1


async def test_file_ids_and_bad_images_are_refused_before_the_engine(stack: VisionStack) -> None:
    """B9, D6: a Responses image by file ID, and an Anthropic image whose media type
    Anthropic does not take, are 400s naming the field, even for a vision endpoint."""
    with pytest.raises(openai.BadRequestError) as by_id:
        await stack.openai.responses.create(
            model="vlm",
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_image", "file_id": "file-abc", "detail": "auto"}],
                }
            ],
        )
    assert "'input[0].content[0].file_id': file IDs are not supported" in str(by_id.value)
    bad: list[anthropic.types.MessageParam] = [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/bmp", "data": PNG},  # type: ignore[typeddict-item]
                }
            ],
        }
    ]
    with pytest.raises(anthropic.BadRequestError) as media:
        await stack.anthropic.messages.create(model="vlm", max_tokens=4, messages=bad)
    assert "'messages[0].content[0].source.media_type' must be one of image/jpeg" in str(
        media.value
    )
    assert stack.engine.bodies == []


def test_which_fleets_take_images() -> None:
    """B9: images go on when every endpoint serving the model sets vision = true or
    serves the API itself (its turns pass through as sent); the refusal names the model
    as asked and as served, and at most five endpoints."""

    def endpoint(name: str, **extra: Any) -> Endpoint:
        return Endpoint(name=name, url="http://x", models=("m",), **extra)

    def refusal(*fleet: Endpoint, api: str = "messages", asked: str = "m") -> str | None:
        dp = Dataplane(
            settings=DataplaneSettings(),
            endpoints={e.name: e for e in fleet},
            secrets=Secrets(),
            link=None,  # type: ignore[arg-type]  # not used: only endpoints are read
            runs=None,  # type: ignore[arg-type]
            memory=None,  # type: ignore[arg-type]
            http=None,  # type: ignore[arg-type]
            metrics=None,  # type: ignore[arg-type]
            gate=Gate(None, None),
        )
        return dp.vision_refusal(api, "m", asked)

    native = endpoint("native", native_apis=("messages",))
    assert refusal(endpoint("a", vision=True), endpoint("b", vision=True)) is None
    assert refusal(endpoint("a", vision=True), native) is None
    assert refusal(native) is None
    assert refusal(endpoint("a", vision=True), native, api="responses") == (
        "model 'm' is served by endpoints with and without vision = true (without: native); "
        "a turn may be placed on any of them, so images are forwarded only when every "
        "endpoint serving the model sets vision = true"
    )
    many = [endpoint(f"e{i}") for i in range(7)]
    assert refusal(*many, asked="claude-x") == (
        "model 'm' (asked as 'claude-x') is not served by a vision endpoint; set vision = true "
        "on its endpoint (e0, e1, e2, e3, e4 and 2 more) to forward images"
    )
