"""What the fake engine reads and writes on the wire (H1).

* Request bodies: ``ChatCompletionBody`` and ``ClassifyBody`` (the fields the
  engine reads; anything else is accepted and ignored), request headers that
  override the script (``x-fake-tool-results``, ``x-fake-text-tool-calls``,
  ``x-fake-wrong-types``, ``x-fake-plan-key``; ``script.plan_key_in`` finds a key written in
  the messages instead), and the OpenAI-style error body.
* Responses: ``Reply`` renders produced tokens as a ``chat.completion`` or as
  ``chat.completion.chunk`` SSE events; ``classify_response`` renders vLLM's
  ``/classify`` answer.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from luftpause.fakes.engine.results import FinishedRequest
from luftpause.fakes.engine.script import PLAN_KEY_MAX_CHARS, ReplyKind, ReplyPlan, token_logprobs
from luftpause.fakes.engine.server.driver import timing_json

SSE_DONE = "data: [DONE]\n\n"

# -------------------------------------------------------------- requests


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = Field(min_length=1)
    content: Any = None


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False


MAX_RETENTION_S = 3600.0  # the longest retention hint the fake engine takes
MAX_AGENTIC_CONTEXT = 16 * 1024  # vllm-router's bound on a context (characters)


class AgenticContext(BaseModel):
    """``vllm_xargs.agentic_context`` as vllm-router 0.1.17 reads it; the fake engine
    honours ``kv_retention_ttl_seconds`` (keeps the finished request's prompt blocks that
    long, under ``program_id``: docs/benchmarks/policies.md, "What engines accept").
    Other members are ignored."""

    model_config = ConfigDict(extra="allow")
    program_id: str | None = Field(default=None, min_length=1, max_length=256)
    kv_retention_ttl_seconds: float | None = Field(
        default=None, ge=0, le=MAX_RETENTION_S, allow_inf_nan=False, strict=True
    )

    @field_validator("kv_retention_ttl_seconds", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value

    @model_validator(mode="after")
    def _keyed(self) -> AgenticContext:
        if self.kv_retention_ttl_seconds and self.program_id is None:
            raise ValueError("kv_retention_ttl_seconds needs a program_id to keep the KV under")
        return self


class VllmXargs(BaseModel):
    model_config = ConfigDict(extra="allow")
    agentic_context: AgenticContext | None = None

    @field_validator("agentic_context", mode="before")
    @classmethod
    def _decode(cls, value: Any) -> Any:
        # vLLM's vllm_xargs values are strings or numbers: clients send the context as
        # a JSON string, which vllm-router decodes; so does the fake engine.
        if isinstance(value, str):
            if len(value) > MAX_AGENTIC_CONTEXT:
                raise ValueError(f"must be at most {MAX_AGENTIC_CONTEXT} characters")
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("is a string but not a JSON object") from None
        return value


class ReleaseBody(BaseModel):
    """``POST /kv_retention/release``: end the KV kept under ``program_id`` early."""

    program_id: str = Field(min_length=1, max_length=256)


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
    parallel_tool_calls: bool | None = None  # false: at most one tool call per reply
    n: int | None = Field(default=None, ge=1, le=1)
    ignore_eos: bool | None = False  # SGLang/vLLM: a text answer runs until max_tokens
    vllm_xargs: VllmXargs | None = None  # read: agentic_context's retention hint

    def retention(self) -> tuple[str, float]:
        """The retention hint: (key, seconds), ("", 0.0) when there is none."""
        context = self.vllm_xargs.agentic_context if self.vllm_xargs else None
        if context is None or not context.kv_retention_ttl_seconds or not context.program_id:
            return "", 0.0
        return context.program_id, context.kv_retention_ttl_seconds


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


def error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


def model_not_found(model: str) -> JSONResponse:
    """vLLM's answer to a model it does not serve (``OpenAIServing._check_model``)."""
    return JSONResponse(
        {
            "error": {
                "message": f"The model `{model}` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        },
        404,
    )


def validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


class BadHeader(ValueError):
    pass


def header_int(request: Request, name: str) -> int | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadHeader(f"header {name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise BadHeader(f"header {name} must not be negative")
    return value


def header_key(request: Request, name: str) -> str | None:
    """A header naming something (a plan key): absent, or 1-256 characters."""
    raw = request.headers.get(name)
    if raw is None:
        return None
    if not raw.strip():
        raise BadHeader(f"header {name} must not be empty")
    if len(raw) > PLAN_KEY_MAX_CHARS:
        raise BadHeader(f"header {name} must be at most {PLAN_KEY_MAX_CHARS} characters")
    return raw


def header_flag(request: Request, name: str) -> bool | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    return raw.strip().lower() in ("1", "true", "yes", "on")


# ------------------------------------------------------------- responses


def timing_headers(done: FinishedRequest) -> dict[str, str]:
    t = timing_json(done)
    return {f"x-fake-{k.replace('_', '-')}": str(v) for k, v in t.items()}


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


@dataclass
class Reply:
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
            "luftpause_timing": timing_json(done),
        }

    def completion(self, done: FinishedRequest) -> dict[str, Any]:
        produced = self.pieces[: done.completion_tokens]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if self.plan.kind is ReplyKind.TOOL_CALL:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": "".join(produced[at + 1 : end])},
                }
                for call, at, end in self.plan.call_spans()
                if at < len(produced)
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
        """One ``chat.completion.chunk`` SSE event."""
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
        return sse(payload)

    def usage_chunk(self, done: FinishedRequest) -> str:
        """The last event before ``[DONE]`` when the client asked for usage: no choices."""
        return sse(
            {
                "id": self.rid,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": self.usage(done),
            }
        )

    def delta(self, start: int, end: int) -> dict[str, Any]:
        if self.plan.kind is not ReplyKind.TOOL_CALL:
            return {"content": "".join(self.pieces[start:end])}
        entries: list[dict[str, Any]] = []
        for index, (call, at, stop) in enumerate(self.plan.call_spans()):
            lo, hi = max(start, at), min(end, stop)
            if lo >= hi:
                continue
            entry: dict[str, Any] = {"index": index}
            args = "".join(self.pieces[max(lo, at + 1) : hi])
            if lo == at:  # the call's first token: its id and name
                entry.update(
                    id=call.id, type="function", function={"name": call.name, "arguments": args}
                )
            else:
                entry["function"] = {"arguments": args}
            entries.append(entry)
        return {"tool_calls": entries}


def classify_inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [" ".join(str(t) for t in value)]
    if value and isinstance(value[0], list):
        return [" ".join(str(t) for t in item) for item in value]
    return [str(v) for v in value]


def classify_response(
    model: str, results: Sequence[tuple[str, list[float]]], num_classes: int, tokens: int
) -> dict[str, Any]:
    """vLLM's ``/classify`` answer for ``results`` (label and probabilities per input)."""
    return {
        "id": f"classify-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [
            {"index": i, "label": label, "probs": probs, "num_classes": num_classes}
            for i, (label, probs) in enumerate(results)
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }
