"""Native Messages replies, read for the turn's report.

An engine that serves ``/v1/messages`` itself answers in Messages' shape: its reply
passes through unchanged and is only read (``observe``, ``observe_reply``); a stream
of it that breaks off ends with Messages' ``error`` event (``stream_error``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anthropic.types.shared import (
    APIErrorObject,
    ErrorResponse,
)

if TYPE_CHECKING:
    from luftpause.dataplane.outcome import TurnOutcome
from luftpause.dataplane.apis._shared import count as _count
from luftpause.dataplane.apis._shared import saw_call
from luftpause.dataplane.apis.messages.stream import _event


def observe(event: dict[str, Any], outcome: TurnOutcome) -> None:
    """Read one event of a native Messages stream into ``outcome``."""
    kind = event.get("type")
    if kind == "message_start":
        message = event.get("message")
        if isinstance(message, dict):
            _read_usage(message.get("usage"), outcome)
            _read_content(message.get("content"), outcome)
    elif kind == "content_block_start":
        _read_content([event.get("content_block")], outcome)
    elif kind == "content_block_delta":
        delta = event.get("delta")
        if isinstance(delta, dict) and (
            (delta.get("type") == "text_delta" and delta.get("text"))
            or (delta.get("type") == "input_json_delta" and delta.get("partial_json"))
        ):
            outcome.first_token = True
    elif kind == "message_delta":
        delta = event.get("delta")
        if isinstance(delta, dict):
            _read_stop(delta.get("stop_reason"), outcome)
        _read_usage(event.get("usage"), outcome)
    elif kind == "message_stop":
        outcome.done = True


def observe_reply(body: dict[str, Any], outcome: TurnOutcome) -> None:
    """Read a native, non-streamed ``Message`` into ``outcome``."""
    _read_content(body.get("content"), outcome)
    _read_stop(body.get("stop_reason"), outcome)
    _read_usage(body.get("usage"), outcome)


_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def _read_stop(stop_reason: Any, outcome: TurnOutcome) -> None:
    if isinstance(stop_reason, str) and stop_reason:
        outcome.finish_reason = _FINISH.get(stop_reason, stop_reason[:64])


def _read_content(content: Any, outcome: TurnOutcome) -> None:
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and block.get("text"):
            outcome.first_token = True
        elif block.get("type") == "tool_use":
            outcome.first_token = True
            saw_call(outcome, block.get("id"), block.get("name"))


def _read_usage(usage: Any, outcome: TurnOutcome) -> None:
    """Messages usage (cumulative; a field left out keeps its earlier value)."""
    if not isinstance(usage, dict):
        return
    fields = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    if any(usage.get(name) is not None for name in fields):
        known = {name: _count(usage.get(name)) for name in fields if usage.get(name) is not None}
        read = known.get("cache_read_input_tokens", outcome.cached_tokens)
        uncached = outcome.prompt_tokens - outcome.cached_tokens
        outcome.prompt_tokens = (
            known.get("input_tokens", uncached) + read + known.get("cache_creation_input_tokens", 0)
        )
        outcome.cached_tokens = read
    if usage.get("output_tokens") is not None:
        outcome.completion_tokens = _count(usage.get("output_tokens"))


def stream_error(message: str, sequence_number: int) -> bytes:
    """The ``error`` event that ends a Messages stream which broke off (on a native
    endpoint's stream: the translated ones end with ``MessagesStream.failed``)."""
    return _event(
        ErrorResponse(type="error", error=APIErrorObject(type="api_error", message=message))
    )
