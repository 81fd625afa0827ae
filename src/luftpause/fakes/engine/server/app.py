"""The fake engine's routes (H1): ``create_app(config)`` builds the ASGI app.

* ``POST /v1/chat/completions`` (``chat.py``), ``POST /classify`` and ``/v1/classify``,
  for any model name unless ``strict_models`` (S6: then vLLM's 404);
* ``POST /v1/chat/completions/render``: the prompt's token ids, in vLLM's shape
  (``render.py``), for routers that match prefixes on ids;
* ``POST /v1/messages`` and ``/v1/responses``, served through the chat route as vLLM
  serves them itself (``native.py``);
* ``GET /health`` (and ``/health_generate``), ``/metrics`` (``metrics.py``), ``/v1/models``;
* what real routers read to register a worker (S7; docs/guides/routers.md): ``/server_info``
  (``/get_server_info``), ``/model_info`` (``/get_model_info``) and ``/get_load``;
* ``GET /debug/state``: live counts, per-request timing and the driver's step counters;
* ``POST /kv_retention/release`` ``{"program_id"}``: the fake engine's own early end of
  the KV a request's ``vllm_xargs.agentic_context.kv_retention_ttl_seconds`` kept (B8;
  ``{"released": bool}``).

The app is wrapped in the fault middleware (``faults.py``); ``app.state`` holds
the driver, the config and the model directory.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import ValidationError

from luftpause.dataplane.apis import ClientApi, client_apis
from luftpause.fakes.engine.model import EngineModel
from luftpause.fakes.engine.script import classify
from luftpause.fakes.engine.server.chat import chat
from luftpause.fakes.engine.server.driver import EngineDriver
from luftpause.fakes.engine.server.faults import TransportMiddleware
from luftpause.fakes.engine.server.metrics import EngineCollector
from luftpause.fakes.engine.server.native import native
from luftpause.fakes.engine.server.render import render_chat
from luftpause.fakes.engine.server.settings import ServerConfig
from luftpause.fakes.engine.server.wire import (
    ClassifyBody,
    ReleaseBody,
    classify_inputs,
    classify_response,
    error,
    model_not_found,
    validation_message,
)
from luftpause.fakes.engine.tokens import count_tokens
from luftpause.telemetry import RecentTraces, fastapi_telemetry


def create_app(config: ServerConfig, driver: EngineDriver | None = None) -> Any:
    """The ASGI app (FastAPI wrapped in the fault middleware). ``app.state`` holds the driver."""
    model_dir = tempfile.mkdtemp(prefix="luftpause-fake-model-")
    # The router loads a tokenizer from model_path; an empty local directory keeps it offline.
    engine_driver = driver or EngineDriver(EngineModel(config.params))
    registry = CollectorRegistry(auto_describe=True)
    registry.register(EngineCollector(engine_driver, config.metrics, config.models[0]))
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine_driver.ensure_started()
        try:
            yield
        finally:
            await engine_driver.close()
            shutil.rmtree(model_dir, ignore_errors=True)

    app = FastAPI(
        title=f"luftpause fake engine {config.name}",
        lifespan=lifespan,
        telemetry=fastapi_telemetry(),
    )
    # Also removed when the app is garbage collected or the process exits (an app
    # served without lifespan events, e.g. through httpx.ASGITransport).
    weakref.finalize(app, shutil.rmtree, model_dir, True)
    app.state.driver = engine_driver
    app.state.config = config
    app.state.model_dir = model_dir

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(
            generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [
            {
                "id": m,
                "object": "model",
                "created": created,
                "owned_by": "luftpause-fake-engine",
                "root": m,
                "max_model_len": config.params.context_length,
            }
            for m in config.models
        ]
        return {"object": "list", "data": data}

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        p = config.params
        m = engine_driver.model.metrics()
        return {
            "model_path": model_dir,
            "tokenizer_path": model_dir,
            "served_model_name": config.models[0],
            "dp_size": 1,
            "tp_size": 1,
            "max_total_num_tokens": p.kv_tokens,
            "max_running_requests": p.running_cap,
            "context_length": p.context_length,
            "chunked_prefill_size": p.chunk_tokens,
            "enable_priority_scheduling": p.priority_scheduling,
            "version": "0.0.0-luftpause-fake",
            "internal_states": [{"new_token_ratio": m.new_token_ratio, "last_gen_throughput": 0.0}],
        }

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {
            "model_path": model_dir,
            "tokenizer_path": model_dir,
            "is_generation": True,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "served_model_name": config.models[0],
        }

    @app.get("/get_load")
    async def get_load() -> list[dict[str, int]]:
        m = engine_driver.model.metrics()
        return [
            {
                "dp_rank": 0,
                "num_reqs": m.running + m.waiting,
                "num_waiting_reqs": m.waiting,
                "num_tokens": m.used_tokens,
            }
        ]

    traces = RecentTraces()

    @app.get("/debug/state")
    async def debug_state() -> dict[str, Any]:
        now = engine_driver.now()
        m = engine_driver.model.metrics()
        return {
            "name": config.name,
            "models": list(config.models),
            "metrics": asdict(m),
            "submitted": engine_driver.submitted,
            "plan_keyed": engine_driver.plan_keyed,
            "steps": engine_driver.tally.steps,
            "busy_s": round(engine_driver.tally.busy_s, 6),
            "late_s": round(engine_driver.late_s, 6),
            "prefill_s": round(engine_driver.tally.prefill_s, 6),
            "decode_steps": engine_driver.tally.decode_steps,
            "decode_seqs": engine_driver.tally.decode_seqs,
            "requests": [
                {
                    "request_id": r.request_id,
                    "phase": r.phase.value,
                    "priority": r.priority,
                    "prompt_tokens": r.prompt_tokens,
                    "cached_tokens": r.cached_tokens,
                    "completion_tokens": r.completion_tokens,
                    "max_new_tokens": r.max_new_tokens,
                    "queued_s": round(r.timing.queued_s, 6),
                    "prefill_s": round(r.timing.prefill_s, 6),
                    "decode_s": round(r.timing.decode_s, 6),
                }
                for r in engine_driver.model.requests(now)
            ],
            "recent": list(engine_driver.recent),
            "trace_ids": traces.ids(),  # X1: traces of recent chat requests, oldest first
        }

    @app.post("/classify")
    @app.post("/v1/classify")
    async def classify_endpoint(request: Request) -> Response:
        try:
            raw = await request.json()
        except ValueError:
            return error(400, "request body is not valid JSON")
        try:
            body = ClassifyBody.model_validate(raw)
        except ValidationError as exc:
            return error(400, validation_message(exc))
        model_name = body.model or config.models[0]
        if config.strict_models and model_name not in config.models:
            return model_not_found(model_name)
        inputs = classify_inputs(body.input)
        results = [classify(text, config.labels, config.script.seed) for text in inputs]
        tokens = sum(max(1, count_tokens(text)) for text in inputs)
        return JSONResponse(classify_response(model_name, results, len(config.labels), tokens))

    @app.post("/kv_retention/release")
    async def release_retention(request: Request) -> Response:
        try:
            raw = await request.json()
        except ValueError:
            return error(400, "request body is not valid JSON")
        if not isinstance(raw, dict):
            return error(400, 'the body must be a JSON object: {"program_id": "..."}')
        try:
            body = ReleaseBody.model_validate(raw)
        except ValidationError as exc:
            return error(400, validation_message(exc))
        return JSONResponse({"released": engine_driver.release(body.program_id)})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        traces.saw(request.headers.get("traceparent"))
        return await chat(request, config, engine_driver)

    @app.post("/v1/chat/completions/render")
    async def chat_completions_render(request: Request) -> Response:
        return await render_chat(request, config)

    async def as_chat(request: Request) -> Response:
        return await chat(request, config, engine_driver)

    def route_of(api: ClientApi) -> Callable[[Request], Awaitable[Response]]:
        async def serve_api(request: Request) -> Response:
            traces.saw(request.headers.get("traceparent"))
            return await native(request, api, as_chat)

        return serve_api

    for api in client_apis():  # Anthropic Messages and OpenAI Responses, as vLLM serves them
        app.add_api_route(api.route, route_of(api), methods=["POST"])

    return TransportMiddleware(app, config.fault)
