"""Messages streams: Chat Completions chunks in, Messages' server-sent events out."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import orjson
from anthropic.types import (
    InputJSONDelta,
    Message,
    MessageDeltaUsage,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    TextBlock,
    TextDelta,
    ToolUseBlock,
    Usage,
)
from anthropic.types.raw_message_delta_event import Delta
from anthropic.types.shared import (
    APIErrorObject,
    ErrorResponse,
)
from pydantic import BaseModel

if TYPE_CHECKING:
    pass
from luftpause.dataplane.apis._shared import is_int as _is_int
from luftpause.dataplane.apis._shared import text as _str
from luftpause.dataplane.apis.messages.reply import (
    _call_id,
    _chat_usage,
    _dump,
    _message_id,
    stop_of,
)

log = logging.getLogger("luftpause.dataplane.apis.messages")


class MessagesStream:
    """Chat Completions chunks in, Messages server-sent events out (``StreamTranslator``).

    Each chunk's deltas become events at once: text opens a text block, a tool call
    (a ``tool_calls`` delta with a new index or id) closes the open block and opens a
    ``tool_use`` block whose argument fragments follow as ``input_json_delta``. The
    finish reason and the usage chunk are remembered for ``message_delta``."""

    def __init__(self, model: str, stop_sequences: tuple[str, ...] = ()) -> None:
        self.model = model
        self.stop_sequences = stop_sequences
        self._started = False
        self._ended = False
        self._blocks = 0  # content blocks opened so far
        self._open: int | None = None  # the index of the open block
        self._open_text = False
        self._calls: dict[int, tuple[int, str]] = {}  # engine call index -> (block, id)
        self._choice: dict[str, Any] = {}  # what the last finishing choice said
        self._usage: Any = None

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        if self._ended:
            return b""
        error = chunk.get("error")
        if error is not None and not chunk.get("choices"):
            # an engine that reports a failure in the stream instead of breaking it off
            message = error.get("message") if isinstance(error, dict) else error
            return self.failed(message if isinstance(message, str) and message else str(error))
        out: list[bytes] = []
        if not self._started:
            out.append(self._start(chunk.get("id")))
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # one reply: the proxy never asks for n > 1
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta, out)
            if choice.get("finish_reason") is not None:
                self._choice = choice
        return b"".join(out)

    def done(self) -> bytes:
        if self._ended:
            return b""
        out: list[bytes] = []
        if not self._started:
            out.append(self._start(None))
        self._close(out)
        stop_reason, stop_sequence = stop_of(self._choice, bool(self._calls), self.stop_sequences)
        prompt, cached, output = _chat_usage(self._usage)
        out.append(
            _event(
                RawMessageDeltaEvent(
                    type="message_delta",
                    delta=Delta(stop_reason=stop_reason, stop_sequence=stop_sequence),
                    usage=MessageDeltaUsage(
                        input_tokens=prompt - cached,
                        output_tokens=output,
                        cache_read_input_tokens=cached,
                        cache_creation_input_tokens=0,
                    ),
                )
            )
        )
        out.append(_event(RawMessageStopEvent(type="message_stop")))
        self._ended = True
        return b"".join(out)

    def failed(self, message: str) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        error = ErrorResponse(type="error", error=APIErrorObject(type="api_error", message=message))
        return _event(error)

    def _start(self, chunk_id: Any) -> bytes:
        self._started = True
        message = Message(
            id=_message_id(chunk_id),
            type="message",
            role="assistant",
            model=self.model,
            content=[],
            stop_reason=None,
            stop_sequence=None,
            usage=Usage(
                input_tokens=0,
                output_tokens=0,
                cache_read_input_tokens=0,
                cache_creation_input_tokens=0,
            ),
        )
        return _event(RawMessageStartEvent(type="message_start", message=message))

    def _delta(self, delta: dict[str, Any], out: list[bytes]) -> None:
        text = delta.get("content")
        if isinstance(text, str) and text:
            if not self._open_text:
                self._close(out)
                self._open_block(TextBlock(type="text", text=""), out)
                self._open_text = True
            out.append(self._content_delta(TextDelta(type="text_delta", text=text)))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                self._tool_call(call, out)

    def _tool_call(self, call: dict[str, Any], out: list[bytes]) -> None:
        index = call.get("index", 0)
        index = index if _is_int(index) else 0
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        call_id = call.get("id")
        known = self._calls.get(index)
        if known is None or (isinstance(call_id, str) and call_id and call_id != known[1]):
            self._close(out)
            block_id = _call_id(call_id)
            block = self._open_block(
                ToolUseBlock(
                    type="tool_use", id=block_id, name=_str(function.get("name")), input={}
                ),
                out,
            )
            known = self._calls[index] = (block, block_id)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            if known[0] != self._open:
                # Engines stream one call after another; a late fragment still goes to
                # its own block (SDKs accumulate by index), but clients may have run it.
                log.warning("tool call %d continued after a later block opened", index)
            out.append(
                _event(
                    RawContentBlockDeltaEvent(
                        type="content_block_delta",
                        index=known[0],
                        delta=InputJSONDelta(type="input_json_delta", partial_json=arguments),
                    )
                )
            )

    def _open_block(self, block: TextBlock | ToolUseBlock, out: list[bytes]) -> int:
        index = self._blocks
        self._blocks += 1
        self._open = index
        out.append(
            _event(
                RawContentBlockStartEvent(
                    type="content_block_start", index=index, content_block=block
                )
            )
        )
        return index

    def _content_delta(self, delta: TextDelta) -> bytes:
        assert self._open is not None
        return _event(
            RawContentBlockDeltaEvent(type="content_block_delta", index=self._open, delta=delta)
        )

    def _close(self, out: list[bytes]) -> None:
        if self._open is not None:
            out.append(
                _event(RawContentBlockStopEvent(type="content_block_stop", index=self._open))
            )
        self._open = None
        self._open_text = False


def _event(model: BaseModel) -> bytes:
    data = _dump(model)
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
