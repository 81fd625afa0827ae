"""Native Responses replies, read for the turn's report.

An engine that serves ``/v1/responses`` itself answers in Responses' shape: its reply
passes through unchanged and is only read (``observe``, ``observe_reply``); a stream
of it that breaks off ends with Responses' ``error`` event (``stream_error``).
"""

from __future__ import annotations

from typing import Any

import orjson
from openai.types.responses import (
    ResponseErrorEvent,
)

from luftpause.dataplane.apis._shared import count as _count
from luftpause.dataplane.apis._shared import listed as _list
from luftpause.dataplane.apis._shared import saw_call
from luftpause.dataplane.apis.responses.reply import _dump
from luftpause.dataplane.outcome import TurnOutcome


def stream_error(message: str, sequence_number: int) -> bytes:
    """The ``error`` event that ends a Responses stream which broke off (on a native
    endpoint's stream: the translated ones end with ``ResponsesStream.failed``)."""
    event = ResponseErrorEvent(
        type="error",
        code="server_error",
        message=message,
        param=None,
        sequence_number=sequence_number,
    )
    return b"event: error\ndata: " + orjson.dumps(_dump(event)) + b"\n\n"


def observe(event: dict[str, Any], outcome: TurnOutcome) -> None:
    """Read one event of a native Responses stream into ``outcome``."""
    kind = event.get("type")
    if kind in (
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    ):
        if event.get("delta"):
            outcome.first_token = True
    elif kind in ("response.output_item.added", "response.output_item.done"):
        _observe_item(event.get("item"), outcome)
    elif kind in ("response.completed", "response.incomplete", "response.failed"):
        response = event.get("response")
        if isinstance(response, dict):
            observe_reply(response, outcome)


def observe_reply(body: dict[str, Any], outcome: TurnOutcome) -> None:
    """Read a native ``Response`` (a reply, or the one a stream ends with) into ``outcome``."""
    calls = False
    for item in _list(body.get("output")):
        calls = _observe_item(item, outcome) or calls
        if isinstance(item, dict) and item.get("type") == "message":
            for part in _list(item.get("content")):
                if isinstance(part, dict) and (part.get("text") or part.get("refusal")):
                    outcome.first_token = True
    status = body.get("status")
    if status == "completed":
        outcome.finish_reason = "tool_calls" if calls or outcome.tool_call_ids else "stop"
    elif status == "incomplete":
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        outcome.finish_reason = "content_filter" if reason == "content_filter" else "length"
    usage = body.get("usage")
    if isinstance(usage, dict):
        outcome.prompt_tokens = _count(usage.get("input_tokens"))
        outcome.completion_tokens = _count(usage.get("output_tokens"))
        details = usage.get("input_tokens_details")
        if isinstance(details, dict):
            outcome.cached_tokens = _count(details.get("cached_tokens"))


def _observe_item(item: Any, outcome: TurnOutcome) -> bool:
    """Record a call item's ID; whether ``item`` is a call."""
    if not isinstance(item, dict) or item.get("type") not in ("function_call", "custom_tool_call"):
        return False
    outcome.first_token = True
    saw_call(outcome, item.get("call_id"), item.get("name"))
    return True
