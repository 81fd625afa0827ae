"""``POST /v1/chat/completions/render`` (H1): the prompt a chat request would prefill, as ids.

vLLM serves this route (``vllm/entrypoints/serve/render/api_router.py``,
``serving.py``: ``ServingRender.render_chat_request``) and answers a
``GenerateRequest`` (``vllm/entrypoints/serve/disagg/protocol.py``)::

    {"request_id": "chatcmpl-…", "token_ids": [...], "features": null,
     "sampling_params": {...}, "model": "…", "stream": false, "stream_options": null,
     "cache_salt": null, "priority": 0, "kv_transfer_params": null}

Routers that match prefixes on token ids (vllm-router's program scheduling and its
``cache_aware`` policy) call it once per request. The ids here are the fake engine's own
(``tokens.token_ids`` of ``tokens.render_messages``): the same prompt gives the same ids,
and ``len(token_ids)`` is the ``prompt_tokens`` the chat route reports for it.

The body is checked as the chat route checks it (``chat.read_body``: the same 400s, and
404 for a model not served under ``--strict-models``), and a prompt that could never run
is the chat route's 400 too. Nothing is queued, no fault applies and no time passes.
``sampling_params`` holds the fields of vLLM's ``SamplingParams`` that a chat body sets
(vLLM's defaults where it sets none); ``max_tokens`` is resolved as the chat route
resolves it. A multimodal request has ``features: null`` here (an image is a run of
marker tokens, see ``tokens.py``), where vLLM would describe its placeholders.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from luftpause.fakes.engine.model import SubmitError, resolve_max_new
from luftpause.fakes.engine.server.chat import read_body
from luftpause.fakes.engine.server.settings import ServerConfig
from luftpause.fakes.engine.server.wire import error
from luftpause.fakes.engine.tokens import render_messages, token_ids

# vLLM's SamplingParams defaults, for the fields a chat body can set by the same name
_SAMPLING_DEFAULTS: dict[str, Any] = {
    "n": 1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "seed": None,
    "stop": [],
    "stop_token_ids": [],
    "ignore_eos": False,
    "min_tokens": 0,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False,
}


def sampling_params(raw: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """vLLM's ``sampling_params`` for a chat body: its own values where it sets them."""
    params = {k: v if raw.get(k) is None else raw[k] for k, v in _SAMPLING_DEFAULTS.items()}
    if isinstance(params["stop"], str):
        params["stop"] = [params["stop"]]
    params["max_tokens"] = max_tokens
    # chat's logprobs is a flag, the number being top_logprobs (vLLM's to_sampling_params)
    params["logprobs"] = (raw.get("top_logprobs") or 0) if raw.get("logprobs") else None
    return params


def _finite(value: Any) -> bool:
    """Whether ``value`` (parsed JSON) holds no NaN or infinite number."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


async def render_chat(request: Request, config: ServerConfig) -> Response:
    checked = await read_body(request, config)
    if isinstance(checked, Response):
        return checked
    body, raw = checked
    messages = [m.model_dump(exclude_none=False) for m in body.messages]
    ids = token_ids(render_messages(messages, body.tools))
    requested = body.max_completion_tokens or body.max_tokens or config.default_max_tokens
    try:
        max_tokens = resolve_max_new(config.params, len(ids), requested)
    except SubmitError as exc:
        return error(400, str(exc))
    stream = bool(body.stream)
    cache_salt = raw.get("cache_salt")
    params = sampling_params(raw, max_tokens)
    echoed = {**params, "stream_options": raw.get("stream_options") if stream else None}
    for name, value in echoed.items():
        if not _finite(value):  # (JSON allows no NaN or Infinity in an answer)
            return error(400, f"'{name}' must hold finite numbers only")
    return JSONResponse(
        {
            "request_id": f"chatcmpl-{uuid.uuid4().hex}",
            "token_ids": ids,
            "features": None,
            "sampling_params": params,
            "model": body.model,
            "stream": stream,
            "stream_options": raw.get("stream_options") if stream else None,
            "cache_salt": cache_salt if isinstance(cache_salt, str) else None,
            "priority": body.priority or 0,
            "kv_transfer_params": None,
        }
    )
