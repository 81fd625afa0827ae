"""``luftpause fake-engine``: the engine model behind an OpenAI-compatible HTTP server.

The shell around the pure model (``model.py``) and script (``script.py``):

* ``EngineDriver`` runs the model in real time: one asyncio task calls
  ``model.step(now)``, sleeps until the step's modelled end, then hands the
  produced tokens to per-request queues. It sleeps on an event while the model
  is idle (no busy loop). When the host's CPU makes a step start late, the delay
  is counted (``late_s`` in ``/debug/state``), never hidden. A request whose
  client leaves is cancelled in the model, which frees its KV.
* ``create_app`` builds the FastAPI app: chat completions (streamed and not),
  ``/classify``, ``/health``, ``/metrics`` (SGLang or vLLM names), ``/v1/models``,
  what the SGLang router needs to register a worker (``/server_info``,
  ``/model_info``, ``/get_load``), ``/debug/state``, and fault injection.

Fault knobs (per request with header ``x-fake-fault``, per server with
``--fault``): ``refuse`` closes the connection without answering; ``midstream``
streams a few chunks and then drops the connection without ``[DONE]``; ``429``
answers with ``Retry-After`` (header ``x-fake-retry-after``, default 1);
``500``/``503`` answer that status; ``stall`` never answers until the client
leaves. A per-server ``refuse`` applies to every path (the engine looks down);
the other per-server faults apply to chat completions.

Per-request script overrides: ``x-fake-tool-results: N``,
``x-fake-text-tool-calls: 1``, ``x-fake-wrong-types: 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from luftpause.cliargs import non_negative_int as _non_negative_int
from luftpause.cliargs import positive_float as _positive_float
from luftpause.cliargs import positive_int as _positive_int
from luftpause.fakes.engine.model import (
    EngineModel,
    EngineParams,
    EngineRequest,
    FinishedRequest,
    StepKind,
    SubmitError,
)
from luftpause.fakes.engine.script import (
    ReplyKind,
    ReplyPlan,
    ScriptOptions,
    classify,
    plan_reply,
    token_logprobs,
)
from luftpause.fakes.engine.tokens import count_tokens, render_messages
from luftpause.serving import Bootstrap, Service, add_service_arguments, bind_socket
from luftpause.telemetry import RecentTraces, fastapi_telemetry

log = logging.getLogger("luftpause.fake_engine")

FAULTS = ("refuse", "midstream", "429", "500", "503", "stall")
MIDSTREAM_CHUNKS = 3  # content chunks sent before a midstream fault drops the connection
DEFAULT_MODEL = "llama-3.2-1b"
DEFAULT_LABELS = ("lookup", "urgent", "chitchat")
_TRANSPORT_KEY = "luftpause.fake_engine.transport"


# ------------------------------------------------------------------ driver


@dataclass(frozen=True)
class _Tokens:
    count: int


_Event = _Tokens | FinishedRequest


class EngineDriver:
    """Runs an ``EngineModel`` in real time on the event loop."""

    def __init__(
        self,
        model: EngineModel,
        clock: Callable[[], float] = time.monotonic,
        keep_finished: int = 200,
    ) -> None:
        self.model = model
        self._clock = clock
        self._queues: dict[str, asyncio.Queue[_Event]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep_finished)
        self.submitted = 0
        # Steps run back to back in model time; the host's own work (HTTP, streaming,
        # other processes on the same cores) can still make one start late. ``late_s``
        # sums how far each step started behind the previous one's end, against
        # ``busy_s`` of model time: the share of wall time the model fell behind.
        self.busy_s = 0.0
        self.late_s = 0.0
        self.steps = 0
        self.prefill_s = 0.0  # model time spent in prefill steps (the rest of busy_s decodes)
        self.decode_steps = 0
        self.decode_seqs = 0  # summed batch size over decode steps

    def now(self) -> float:
        return self._clock()

    def ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-steps")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, request: EngineRequest) -> asyncio.Queue[_Event]:
        """Queue a request in the model; raises ``SubmitError``."""
        self.ensure_started()
        self.model.submit(request, self.now())
        queue: asyncio.Queue[_Event] = asyncio.Queue()
        self._queues[request.request_id] = queue
        self.submitted += 1
        self._wake.set()
        return queue

    def cancel(self, request_id: str) -> None:
        if self._queues.pop(request_id, None) is not None:
            self.model.cancel(request_id, self.now())

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception:  # a model bug must not hang every client silently
            log.exception("engine step loop failed; failing in-flight requests")
            for rid in list(self._queues):
                self.cancel(rid)
            raise

    async def _loop(self) -> None:
        prev_end: float | None = None
        while True:
            if not self.model.has_work():
                self.model.step(self.now())  # an idle step: refreshes the metric gauges
                self._wake.clear()
                await self._wake.wait()
                prev_end = None
                continue
            now = self.now()
            if prev_end is not None and now > prev_end:
                self.late_s += now - prev_end
            step = self.model.step(now)
            self.busy_s += step.duration
            self.steps += 1
            if step.kind is StepKind.PREFILL:
                self.prefill_s += step.duration
            elif step.kind is StepKind.DECODE:
                self.decode_steps += 1
                self.decode_seqs += len(step.tokens)
            prev_end = step.end
            # Sleep until the step's modelled end, not for its duration after the
            # bookkeeping: the time ``step`` itself took is part of the step.
            await asyncio.sleep(max(0.0, step.end - self.now()))
            counts: dict[str, int] = {}
            for rid in step.tokens:
                counts[rid] = counts.get(rid, 0) + 1
            for rid, n in counts.items():
                queue = self._queues.get(rid)
                if queue is not None:
                    queue.put_nowait(_Tokens(n))
            for done in step.finished:
                self.recent.append({"request_id": done.request_id, **_finished_json(done)})
                queue = self._queues.pop(done.request_id, None)
                if queue is not None:
                    queue.put_nowait(done)


def _finished_json(done: FinishedRequest) -> dict[str, Any]:
    return {
        "finish_reason": done.reason.value,
        "prompt_tokens": done.prompt_tokens,
        "cached_tokens": done.cached_tokens,
        "completion_tokens": done.completion_tokens,
        "timing": _timing_json(done),
    }


def _timing_json(done: FinishedRequest) -> dict[str, float]:
    t = done.timing
    return {
        "queued_s": round(t.queued_s, 6),
        "prefill_s": round(t.prefill_s, 6),
        "decode_s": round(t.decode_s, 6),
    }


# ------------------------------------------------------------------ config


@dataclass(frozen=True)
class ServerConfig:
    name: str = "fake-engine"
    models: tuple[str, ...] = (DEFAULT_MODEL,)
    params: EngineParams = field(default_factory=EngineParams)
    script: ScriptOptions = field(default_factory=ScriptOptions)
    chunk_tokens: int = 1
    metrics: Literal["sglang", "vllm"] = "sglang"
    fault: str | None = None
    labels: tuple[str, ...] = DEFAULT_LABELS
    default_max_tokens: int | None = None  # None: context length - prompt (SGLang)


# -------------------------------------------------------------- validation


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = Field(min_length=1)
    content: Any = None


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False


class ChatCompletionBody(BaseModel):
    """The fields the fake engine reads; anything else is accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    messages: list[_Message] = Field(min_length=1)
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    priority: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    n: int | None = Field(default=None, ge=1, le=1)


class ClassifyBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]

    @field_validator("input")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be empty")
        return value


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _header_int(request: Request, name: str) -> int | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise _BadHeader(f"header {name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise _BadHeader(f"header {name} must not be negative")
    return value


def _header_flag(request: Request, name: str) -> bool | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    return raw.strip().lower() in ("1", "true", "yes", "on")


class _BadHeader(ValueError):
    pass


# ----------------------------------------------------------------- metrics


class _EngineCollector(Collector):
    def __init__(self, driver: EngineDriver, config: ServerConfig) -> None:
        self._driver = driver
        self._config = config

    def collect(self) -> Iterable[Metric]:
        m = self._driver.model.metrics()
        model_name = self._config.models[0]
        if self._config.metrics == "vllm":
            labels = ["model_name", "engine"]
            values = [model_name, "0"]
            gauges = (
                ("vllm:num_requests_running", "Requests in the running batch", m.running_gauge),
                ("vllm:num_requests_waiting", "Requests waiting to be scheduled", m.queue_gauge),
                ("vllm:kv_cache_usage_perc", "KV cache usage (1 = full)", m.token_usage),
            )
            for name, doc, value in gauges:
                g = GaugeMetricFamily(name, doc, labels=labels)
                g.add_metric(values, value)
                yield g
            counters = (
                (
                    "vllm:prefix_cache_queries",
                    "Prefix cache queries (tokens)",
                    m.cache_queries_tokens,
                ),
                ("vllm:prefix_cache_hits", "Prefix cache hits (tokens)", m.cache_hit_tokens),
            )
            for name, doc, value in counters:
                c = CounterMetricFamily(name, doc, labels=labels)
                c.add_metric(values, value)
                yield c
            return
        labels = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        values = [model_name, "unified", "0", "0"]
        sglang_gauges: tuple[tuple[str, str, float], ...] = (
            ("sglang:num_running_reqs", "The number of running requests.", m.running_gauge),
            (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                m.queue_gauge,
            ),
            ("sglang:token_usage", "The token usage.", m.token_usage),
            ("sglang:num_used_tokens", "The number of used tokens.", m.used_tokens),
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV pool.",
                m.max_tokens,
            ),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.", m.cache_hit_rate),
        )
        for name, doc, value in sglang_gauges:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            yield g


# --------------------------------------------------------------------- app


class _TransportMiddleware:
    """Stashes uvicorn's transport in the scope so faults can drop the connection."""

    def __init__(self, app: FastAPI, config: ServerConfig) -> None:
        self.app = app
        self.config = config
        self.state = app.state  # driver, config, model_dir

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            scope[_TRANSPORT_KEY] = transport
            if self.config.fault == "refuse":
                _drop(transport)
                await asyncio.sleep(0)
                return
        await self.app(scope, receive, send)


def _drop(transport: Any) -> None:
    """Close the client connection without (further) answer."""
    if transport is not None:
        transport.close()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _until_done_or_disconnect(request: Request, work: Awaitable[Any]) -> tuple[bool, Any]:
    """Await ``work``; returns (False, None) if the client disconnects first."""
    work_task = asyncio.ensure_future(work)
    leave_task = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({work_task, leave_task}, return_when=asyncio.FIRST_COMPLETED)
        if work_task in done:
            return True, work_task.result()
        return False, None
    finally:
        for task in (work_task, leave_task):
            if not task.done():
                task.cancel()
        for task in (work_task, leave_task):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def create_app(config: ServerConfig, driver: EngineDriver | None = None) -> Any:
    """The ASGI app (FastAPI wrapped in the fault middleware). ``app.state`` holds the driver."""
    model_dir = tempfile.mkdtemp(prefix="luftpause-fake-model-")
    # The router loads a tokenizer from model_path; an empty local directory keeps it offline.
    engine_driver = driver or EngineDriver(EngineModel(config.params))
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_EngineCollector(engine_driver, config))
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
            "steps": engine_driver.steps,
            "busy_s": round(engine_driver.busy_s, 6),
            "late_s": round(engine_driver.late_s, 6),
            "prefill_s": round(engine_driver.prefill_s, 6),
            "decode_steps": engine_driver.decode_steps,
            "decode_seqs": engine_driver.decode_seqs,
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
            return _error(400, "request body is not valid JSON")
        try:
            body = ClassifyBody.model_validate(raw)
        except ValidationError as exc:
            return _error(400, _validation_message(exc))
        model_name = body.model or config.models[0]
        if model_name not in config.models:
            return _error(404, f"The model `{model_name}` does not exist.", "NotFoundError")
        inputs = _classify_inputs(body.input)
        data = []
        total = 0
        for i, text in enumerate(inputs):
            label, probs = classify(text, config.labels, config.script.seed)
            total += max(1, count_tokens(text))
            data.append(
                {"index": i, "label": label, "probs": probs, "num_classes": len(config.labels)}
            )
        return JSONResponse(
            {
                "id": f"classify-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": model_name,
                "data": data,
                "usage": {"prompt_tokens": total, "total_tokens": total, "completion_tokens": 0},
            }
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        traces.saw(request.headers.get("traceparent"))
        return await _chat(request, config, engine_driver)

    return _TransportMiddleware(app, config)


def _classify_inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [" ".join(str(t) for t in value)]
    if value and isinstance(value[0], list):
        return [" ".join(str(t) for t in item) for item in value]
    return [str(v) for v in value]


# -------------------------------------------------------- chat completions


async def _chat(request: Request, config: ServerConfig, driver: EngineDriver) -> Response:
    try:
        raw = await request.json()
    except ValueError:
        return _error(400, "request body is not valid JSON")
    if not isinstance(raw, dict):
        return _error(400, "request body must be a JSON object")
    try:
        body = ChatCompletionBody.model_validate(raw)
    except ValidationError as exc:
        return _error(400, _validation_message(exc))
    if body.model not in config.models:
        return _error(404, f"The model `{body.model}` does not exist.", "NotFoundError")
    try:
        tool_results = _header_int(request, "x-fake-tool-results")
        retry_after = _header_int(request, "x-fake-retry-after")
    except _BadHeader as exc:
        return _error(400, str(exc))
    fault = request.headers.get("x-fake-fault") or config.fault
    if fault is not None and fault not in FAULTS:
        return _error(400, f"x-fake-fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    transport = request.scope.get(_TRANSPORT_KEY)
    if fault == "refuse":
        _drop(transport)
        await asyncio.sleep(0)
        return Response(status_code=500)  # never reaches the client
    if fault == "429":
        return JSONResponse(
            {
                "error": {
                    "message": "rate limited by fake engine",
                    "type": "rate_limit_error",
                    "code": 429,
                }
            },
            429,
            headers={"Retry-After": str(1 if retry_after is None else retry_after)},
        )
    if fault in ("500", "503"):
        status = int(fault)
        return _error(status, f"fake engine fault {status}", "InternalServerError")
    if fault == "stall":
        await _wait_disconnect(request)
        return Response(status_code=499)

    messages = [m.model_dump(exclude_none=False) for m in body.messages]
    prompt_text = render_messages(messages, body.tools)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    plan = plan_reply(
        messages,
        body.tools,
        config.script,
        prompt_text=prompt_text,
        tool_choice=body.tool_choice,
        tool_results=tool_results,
        text_tool_calls=_header_flag(request, "x-fake-text-tool-calls"),
        wrong_types=_header_flag(request, "x-fake-wrong-types"),
        call_nonce=rid,
    )
    max_new = body.max_completion_tokens or body.max_tokens or config.default_max_tokens
    priority = (
        body.priority if (body.priority is not None and config.params.priority_scheduling) else 0
    )
    try:
        queue = driver.submit(
            EngineRequest(
                rid,
                prompt_text,
                reply_tokens=plan.reply_tokens,
                max_new_tokens=max_new,
                priority=priority,
            )
        )
    except SubmitError as exc:
        return _error(400, str(exc))
    prompt_tokens = driver.model.prompt_tokens(rid) or count_tokens(prompt_text)
    limit = max_new if max_new is not None else config.params.context_length - prompt_tokens
    pieces = plan.pieces(limit)
    top_k = (body.top_logprobs or 1) if body.logprobs else 0
    reply = _Reply(rid, body.model, plan, pieces, top_k)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        midstream = fault == "midstream"
        return StreamingResponse(
            _stream(reply, queue, driver, config.chunk_tokens, include_usage, midstream, transport),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    if fault == "midstream":
        # Not streamed: drop the connection once the reply is half done.
        await _until_done_or_disconnect(request, _collect_half(queue, len(pieces)))
        driver.cancel(rid)
        _drop(transport)
        await asyncio.sleep(0)
        return Response(status_code=500)
    ok, done = await _until_done_or_disconnect(request, _collect(queue))
    if not ok:
        driver.cancel(rid)
        return Response(status_code=499)
    assert isinstance(done, FinishedRequest)
    return JSONResponse(reply.completion(done), headers=_timing_headers(done))


def _timing_headers(done: FinishedRequest) -> dict[str, str]:
    t = _timing_json(done)
    return {f"x-fake-{k.replace('_', '-')}": str(v) for k, v in t.items()}


async def _collect(queue: asyncio.Queue[_Event]) -> FinishedRequest:
    while True:
        event = await queue.get()
        if isinstance(event, FinishedRequest):
            return event


async def _collect_half(queue: asyncio.Queue[_Event], total: int) -> None:
    seen = 0
    while seen < max(1, total // 2):
        event = await queue.get()
        if isinstance(event, FinishedRequest):
            return
        seen += event.count


@dataclass
class _Reply:
    """Turns produced tokens into OpenAI response objects."""

    rid: str
    model: str
    plan: ReplyPlan
    pieces: list[str]
    top_k: int
    created: int = field(default_factory=lambda: int(time.time()))

    def logprobs(self, start: int, end: int) -> dict[str, Any] | None:
        if not self.top_k:
            return None
        content = []
        for pos in range(start, end):
            token = self.pieces[pos]
            own, top = token_logprobs(token, pos, self.plan, self.top_k)
            content.append(
                {
                    "token": token,
                    "logprob": own,
                    "bytes": list(token.encode()),
                    "top_logprobs": [
                        {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in top
                    ],
                }
            )
        return {"content": content}

    def finish_reason(self, done: FinishedRequest) -> str:
        if done.reason.value == "length":
            return "length"
        if self.plan.kind is ReplyKind.TOOL_CALL:
            return "tool_calls"
        return "stop"

    def usage(self, done: FinishedRequest) -> dict[str, Any]:
        return {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
            "luftpause_timing": _timing_json(done),
        }

    def completion(self, done: FinishedRequest) -> dict[str, Any]:
        produced = self.pieces[: done.completion_tokens]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if self.plan.kind is ReplyKind.TOOL_CALL:
            call = self.plan.tool_call
            assert call is not None
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": "".join(produced[1:])},
                }
            ]
        else:
            message["content"] = "".join(produced)
        return {
            "id": self.rid,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": self.logprobs(0, len(produced)),
                    "finish_reason": self.finish_reason(done),
                }
            ],
            "usage": self.usage(done),
        }

    def chunk(
        self,
        delta: dict[str, Any],
        finish: str | None = None,
        logprobs: dict[str, Any] | None = None,
        include_usage: bool = False,
    ) -> str:
        payload: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            ],
        }
        if include_usage:
            payload["usage"] = None
        return f"data: {json.dumps(payload)}\n\n"

    def delta(self, start: int, end: int) -> dict[str, Any]:
        if self.plan.kind is not ReplyKind.TOOL_CALL:
            return {"content": "".join(self.pieces[start:end])}
        call = self.plan.tool_call
        assert call is not None
        entry: dict[str, Any] = {"index": 0}
        args = "".join(self.pieces[max(start, 1) : end])
        if start == 0:
            entry.update(
                id=call.id, type="function", function={"name": call.name, "arguments": args}
            )
        else:
            entry["function"] = {"arguments": args}
        return {"tool_calls": [entry]}


async def _stream(
    reply: _Reply,
    queue: asyncio.Queue[_Event],
    driver: EngineDriver,
    chunk_tokens: int,
    include_usage: bool,
    midstream: bool,
    transport: Any,
) -> AsyncIterator[str]:
    sent = 0  # tokens sent
    ready = 0  # tokens produced
    chunks = 0
    finished = False
    try:
        yield reply.chunk({"role": "assistant", "content": ""}, include_usage=include_usage)
        while True:
            event = await queue.get()
            if isinstance(event, FinishedRequest):
                done = event
                if ready > sent:
                    yield reply.chunk(
                        reply.delta(sent, ready),
                        logprobs=reply.logprobs(sent, ready),
                        include_usage=include_usage,
                    )
                yield reply.chunk({}, finish=reply.finish_reason(done), include_usage=include_usage)
                if include_usage:
                    usage = {
                        "id": reply.rid,
                        "object": "chat.completion.chunk",
                        "created": reply.created,
                        "model": reply.model,
                        "choices": [],
                        "usage": reply.usage(done),
                    }
                    yield f"data: {json.dumps(usage)}\n\n"
                yield "data: [DONE]\n\n"
                finished = True
                return
            ready = min(len(reply.pieces), ready + event.count)
            if ready - sent >= chunk_tokens:
                yield reply.chunk(
                    reply.delta(sent, ready),
                    logprobs=reply.logprobs(sent, ready),
                    include_usage=include_usage,
                )
                sent = ready
                chunks += 1
                if midstream and chunks >= MIDSTREAM_CHUNKS:
                    _drop(transport)
                    return
    finally:
        if not finished:
            driver.cancel(reply.rid)


# --------------------------------------------------------------------- CLI


def _per_mille(text: str) -> int:
    value = _non_negative_int(text)
    if value > 1000:
        raise argparse.ArgumentTypeError(f"expected 0..1000, got {text!r}")
    return value


def _labels(text: str) -> tuple[str, ...]:
    labels = tuple(part.strip() for part in text.split(",") if part.strip())
    if len(labels) < 2:
        raise argparse.ArgumentTypeError("expected at least two comma-separated labels")
    return labels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(parser, port_help="HTTP port (default: 8001)", config=False)
    defaults = EngineParams()
    parser.add_argument("--name", default="fake-engine", help="name shown in logs and /debug/state")
    parser.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="NAME",
        help=f"model name to serve (repeatable; default: {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="run the engine model this many times faster than real time (default: 1)",
    )
    parser.add_argument(
        "--chunk-tokens",
        type=_positive_int,
        default=1,
        help="send one SSE chunk every N generated tokens (default: 1)",
    )
    parser.add_argument(
        "--metrics",
        choices=["sglang", "vllm"],
        default="sglang",
        help="Prometheus metric names on /metrics (default: sglang)",
    )
    parser.add_argument(
        "--priority-scheduling",
        action="store_true",
        help="honour the request body's priority (higher first, like SGLang)",
    )
    parser.add_argument(
        "--low-priority-first",
        action="store_true",
        help="with --priority-scheduling, schedule lower priority values first",
    )
    parser.add_argument(
        "--tool-results",
        type=_non_negative_int,
        default=3,
        help="with tools offered, call tools until the conversation holds N tool results "
        "(default: 3)",
    )
    parser.add_argument(
        "--text-tool-calls",
        action="store_true",
        help='write tool calls as Llama-3 plain text ({"name": ..., "parameters": ...})',
    )
    parser.add_argument(
        "--wrong-types",
        action="store_true",
        help="write numbers and booleans in tool arguments as strings",
    )
    parser.add_argument(
        "--runaway-per-mille",
        type=_per_mille,
        default=250,
        help="answers per thousand that never stop on their own and run to max_tokens; "
        "only matters when a request sets no max_tokens (default: 250, calibrated)",
    )
    parser.add_argument(
        "--fault",
        choices=FAULTS,
        help="fail every request this way: refuse (close without answer), midstream, 429, "
        "500, 503, stall",
    )
    parser.add_argument(
        "--labels",
        type=_labels,
        default=DEFAULT_LABELS,
        help="comma-separated labels for /classify (default: lookup,urgent,chitchat)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed mixed into every generated reply (default: 0)"
    )
    parser.add_argument(
        "--max-running",
        type=_positive_int,
        help="cap on running requests (default: SGLang's memory-derived cap)",
    )
    parser.add_argument(
        "--kv-tokens",
        type=_positive_int,
        default=defaults.kv_tokens,
        help=f"KV pool size in tokens (default: {defaults.kv_tokens})",
    )
    parser.add_argument(
        "--context-length",
        type=_positive_int,
        default=defaults.context_length,
        help=f"model context length; also the default reply limit "
        f"(default: {defaults.context_length})",
    )
    parser.add_argument(
        "--default-max-tokens",
        type=_positive_int,
        help="reply limit when a request sends no max_tokens "
        "(default: context length - prompt, like SGLang)",
    )
    parser.add_argument(
        "--gpu-sharers",
        type=_positive_int,
        default=defaults.gpu_sharers,
        help=f"replicas sharing one GPU; every step takes this many times longer "
        f"(default: {defaults.gpu_sharers})",
    )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    try:
        params = EngineParams(
            kv_tokens=args.kv_tokens,
            context_length=args.context_length,
            max_running=args.max_running,
            gpu_sharers=args.gpu_sharers,
            priority_scheduling=args.priority_scheduling,
            low_priority_first=args.low_priority_first,
            time_scale=args.time_scale,
        )
    except ValueError as exc:
        raise SystemExit(f"luftpause fake-engine: {exc}") from None
    return ServerConfig(
        name=args.name,
        models=tuple(args.models or [DEFAULT_MODEL]),
        params=params,
        script=ScriptOptions(
            tool_results=args.tool_results,
            text_tool_calls=args.text_tool_calls,
            wrong_types=args.wrong_types,
            runaway_per_mille=args.runaway_per_mille,
            seed=args.seed,
        ),
        chunk_tokens=args.chunk_tokens,
        metrics=args.metrics,
        fault=args.fault,
        labels=args.labels,
        default_max_tokens=args.default_max_tokens,
    )


def main(args: argparse.Namespace) -> int:
    boot = Bootstrap("fake-engine", args, os.environ, label=f"fake-engine[{args.name}]")
    config = config_from_args(args)
    host = args.host or "127.0.0.1"
    port = 8001 if args.port is None else args.port
    sock = bind_socket(host, port)
    app = create_app(config)

    async def start(svc: Service) -> None:
        await svc.serve_asgi("http", sock, app)
        svc.on_ready(
            lambda: log.info(
                "fake engine %s serving %s on http://%s:%d (time scale %g)",
                config.name,
                ", ".join(config.models),
                host,
                svc.ports["http"],
                config.params.time_scale,
            )
        )

    # No ASGI wrapper: its send would hide uvicorn's transport from the faults that drop
    # connections. FastAPI's own telemetry makes the server spans.
    return boot.run(host, start, instance=config.name)
