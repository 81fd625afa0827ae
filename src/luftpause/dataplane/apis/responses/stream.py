"""Responses streams: Chat Completions chunks in, Responses' server-sent events out.

``ResponsesStream`` opens and closes output items (text, reasoning, function and
custom tool calls) as the chunks come, and ends with ``response.completed``,
``response.incomplete`` or, when the engine's stream breaks off, ``response.failed``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import pydantic
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseError,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseUsage,
)

from luftpause.dataplane.apis._shared import count as _count
from luftpause.dataplane.apis._shared import listed as _list
from luftpause.dataplane.apis._shared import text as _str
from luftpause.dataplane.apis.responses.reply import (
    Replies,
    _custom_input,
    _dump,
    _first_choice,
    _message_item,
    _new_id,
    _reasoning_item,
    _reasoning_text,
    _status,
    _usage,
)


@dataclass
class _Open:
    """The output item being streamed."""

    kind: Literal["message", "reasoning", "call"]
    index: int  # output_index
    item_id: str
    text: list[str] = field(default_factory=list)  # message/reasoning text, or arguments
    # calls:
    chat_index: int = -1
    call_id: str = ""
    name: str = ""
    custom: _CustomInput | None = None


class ResponsesStream:
    """Chat Completions chunks in, Responses events out (``StreamTranslator``).

    Items are streamed one after another: text opens a ``message`` item, the engine's
    reasoning a ``reasoning`` item, each tool call (a ``tool_calls`` delta with a new
    ``id``) a call item; an item is closed when another starts or the stream ends. A
    custom tool's ``input`` is decoded from the JSON arguments as they arrive."""

    def __init__(self, request: Replies) -> None:
        self.request = request
        self.response_id = _new_id("resp")
        self.created_at = int(time.time())
        self._seq = 0
        self._started = False
        self._ended = False
        self._output: list[ResponseOutputItem] = []
        self._open: _Open | None = None
        self._finish = ""
        self._usage: ResponseUsage | None = None
        self._calls_seen: set[int] = set()  # chat tool call indexes started

    # -- StreamTranslator

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        if self._ended:
            return b""
        out = self._start()
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = _usage(usage)
        choice = _first_choice(chunk)
        if not isinstance(choice, dict):
            return out
        delta = choice.get("delta")
        if isinstance(delta, dict):
            reasoning = _reasoning_text(delta)
            if reasoning:
                out += self._reasoning(reasoning)
            content = delta.get("content")
            if isinstance(content, str) and content:
                out += self._text(content)
            for call in _list(delta.get("tool_calls")):
                if isinstance(call, dict):
                    out += self._call(call)
        finish = _str(choice.get("finish_reason"))
        if finish:
            self._finish = finish
        return out

    def done(self) -> bytes:
        if self._ended:
            return b""
        out = self._start()
        cut = self._finish == "length"
        out += self._close("incomplete" if cut else "completed")
        self._ended = True
        status = _status(self._finish)
        response = self._response(status)
        if status == "incomplete":
            return out + self._event(
                ResponseIncompleteEvent(
                    type="response.incomplete", response=response, sequence_number=self._next()
                )
            )
        return out + self._event(
            ResponseCompletedEvent(
                type="response.completed", response=response, sequence_number=self._next()
            )
        )

    def failed(self, message: str) -> bytes:
        if self._ended:
            return b""
        out = self._start()
        self._ended = True
        output = list(self._output)
        if self._open is not None:
            output.append(self._item(self._open, "incomplete"))
        error = ResponseError(code="server_error", message=message)
        response = self.request.response(
            self.response_id, self.created_at, "failed", output, self._usage, error=error
        )
        return out + self._event(
            ResponseFailedEvent(
                type="response.failed", response=response, sequence_number=self._next()
            )
        )

    # -- items

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        created = ResponseCreatedEvent(
            type="response.created",
            response=self._response("in_progress"),
            sequence_number=self._next(),
        )
        progress = ResponseInProgressEvent(
            type="response.in_progress",
            response=self._response("in_progress"),
            sequence_number=self._next(),
        )
        return self._event(created) + self._event(progress)

    def _text(self, text: str) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != "message":
            out += self._close("completed")
            item = self._open = _Open("message", len(self._output), _new_id("msg"))
            added = ResponseOutputMessage(
                type="message", id=item.item_id, role="assistant", status="in_progress", content=[]
            )
            out += self._added(item, added)
            out += self._event(
                ResponseContentPartAddedEvent(
                    type="response.content_part.added",
                    item_id=item.item_id,
                    output_index=item.index,
                    content_index=0,
                    part=ResponseOutputText(type="output_text", text="", annotations=[]),
                    sequence_number=self._next(),
                )
            )
        item.text.append(text)
        return out + self._event(
            ResponseTextDeltaEvent(
                type="response.output_text.delta",
                item_id=item.item_id,
                output_index=item.index,
                content_index=0,
                delta=text,
                logprobs=[],
                sequence_number=self._next(),
            )
        )

    def _reasoning(self, text: str) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != "reasoning":
            out += self._close("completed")
            item = self._open = _Open("reasoning", len(self._output), _new_id("rs"))
            added = ResponseReasoningItem(
                type="reasoning", id=item.item_id, summary=[], content=[], status="in_progress"
            )
            out += self._added(item, added)
            out += self._event(
                ResponseContentPartAddedEvent.model_validate(
                    {
                        "type": "response.content_part.added",
                        "item_id": item.item_id,
                        "output_index": item.index,
                        "content_index": 0,
                        "part": {"type": "reasoning_text", "text": ""},
                        "sequence_number": self._next(),
                    }
                )
            )
        item.text.append(text)
        return out + self._event(
            ResponseReasoningTextDeltaEvent(
                type="response.reasoning_text.delta",
                item_id=item.item_id,
                output_index=item.index,
                content_index=0,
                delta=text,
                sequence_number=self._next(),
            )
        )

    def _call(self, call: dict[str, Any]) -> bytes:
        out = b""
        chat_index = _count(call.get("index"))
        call_id = _str(call.get("id"))
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        item = self._open
        same = (
            item is not None
            and item.kind == "call"
            and item.chat_index == chat_index
            and (not call_id or call_id == item.call_id)
        )
        if not same:
            if not call_id and chat_index in self._calls_seen:
                return b""  # a fragment of a call already closed: engines do not interleave
            out += self._close("completed")
            name = _str(function.get("name"))
            item = self._open = _Open(
                "call",
                len(self._output),
                self.request.call_item_id(name),
                chat_index=chat_index,
                call_id=call_id or _new_id("call"),
                name=name,
            )
            tool = self.request.tools.get(name)
            if tool is not None and tool.kind == "custom":
                item.custom = _CustomInput()
            out += self._added(item, self._item(item, "in_progress"))
            self._calls_seen.add(chat_index)
        else:
            assert item is not None
            name = _str(function.get("name"))
            if name and not item.name:
                item.name = name
        arguments = _str(function.get("arguments"))
        if not arguments:
            return out
        item.text.append(arguments)
        if item.custom is not None:
            delta = item.custom.feed(arguments)
            if not delta:
                return out
            return out + self._event(
                ResponseCustomToolCallInputDeltaEvent(
                    type="response.custom_tool_call_input.delta",
                    item_id=item.item_id,
                    output_index=item.index,
                    delta=delta,
                    sequence_number=self._next(),
                )
            )
        return out + self._event(
            ResponseFunctionCallArgumentsDeltaEvent(
                type="response.function_call_arguments.delta",
                item_id=item.item_id,
                output_index=item.index,
                delta=arguments,
                sequence_number=self._next(),
            )
        )

    def _close(self, status: Literal["completed", "incomplete"]) -> bytes:
        """The events that finish the open item, if any."""
        item = self._open
        if item is None:
            return b""
        self._open = None
        out = b""
        text = "".join(item.text)
        if item.kind == "message":
            out += self._event(
                ResponseTextDoneEvent(
                    type="response.output_text.done",
                    item_id=item.item_id,
                    output_index=item.index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                    sequence_number=self._next(),
                )
            )
            out += self._event(
                ResponseContentPartDoneEvent(
                    type="response.content_part.done",
                    item_id=item.item_id,
                    output_index=item.index,
                    content_index=0,
                    part=ResponseOutputText(type="output_text", text=text, annotations=[]),
                    sequence_number=self._next(),
                )
            )
        elif item.kind == "reasoning":
            out += self._event(
                ResponseReasoningTextDoneEvent(
                    type="response.reasoning_text.done",
                    item_id=item.item_id,
                    output_index=item.index,
                    content_index=0,
                    text=text,
                    sequence_number=self._next(),
                )
            )
            out += self._event(
                ResponseContentPartDoneEvent.model_validate(
                    {
                        "type": "response.content_part.done",
                        "item_id": item.item_id,
                        "output_index": item.index,
                        "content_index": 0,
                        "part": {"type": "reasoning_text", "text": text},
                        "sequence_number": self._next(),
                    }
                )
            )
        elif item.custom is not None:
            final = _custom_input(text)
            rest = item.custom.rest(final)
            if rest:
                out += self._event(
                    ResponseCustomToolCallInputDeltaEvent(
                        type="response.custom_tool_call_input.delta",
                        item_id=item.item_id,
                        output_index=item.index,
                        delta=rest,
                        sequence_number=self._next(),
                    )
                )
            out += self._event(
                ResponseCustomToolCallInputDoneEvent(
                    type="response.custom_tool_call_input.done",
                    item_id=item.item_id,
                    output_index=item.index,
                    input=final,
                    sequence_number=self._next(),
                )
            )
        else:
            out += self._event(
                ResponseFunctionCallArgumentsDoneEvent.model_validate(
                    {
                        "type": "response.function_call_arguments.done",
                        "item_id": item.item_id,
                        "output_index": item.index,
                        "arguments": text,
                        "name": self._client_name(item.name),
                        "sequence_number": self._next(),
                    }
                )
            )
        done = self._item(item, status)
        self._output.append(done)
        return out + self._event(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                item=done,
                output_index=item.index,
                sequence_number=self._next(),
            )
        )

    def _item(
        self, item: _Open, status: Literal["in_progress", "completed", "incomplete"]
    ) -> ResponseOutputItem:
        text = "".join(item.text)
        if item.kind == "message":
            return _message_item(item.item_id, text, status)
        if item.kind == "reasoning":
            return _reasoning_item(item.item_id, text, status)
        arguments = "" if status == "in_progress" else text
        return self.request._call_item(item.item_id, item.call_id, item.name, arguments, status)

    def _client_name(self, chat_name: str) -> str:
        tool = self.request.tools.get(chat_name)
        return tool.name if tool is not None else chat_name

    def _added(self, item: _Open, added: ResponseOutputItem) -> bytes:
        return self._event(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                item=added,
                output_index=item.index,
                sequence_number=self._next(),
            )
        )

    def _response(
        self, status: Literal["completed", "incomplete", "in_progress", "failed"]
    ) -> Response:
        return self.request.response(
            self.response_id,
            self.created_at,
            status,
            list(self._output),
            self._usage if status != "in_progress" else None,
            self._finish,
        )

    def _next(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    @staticmethod
    def _event(event: pydantic.BaseModel) -> bytes:
        data = orjson.dumps(_dump(event))
        kind = getattr(event, "type", "")
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


class _CustomInput:
    """The ``input`` string of a custom tool call's arguments (``{"input": "..."}``),
    decoded while the JSON arrives, so its text can be streamed as
    ``custom_tool_call_input.delta``. Arguments of another shape are not streamed:
    their input is sent whole when the call ends."""

    _START = re.compile(r'\s*\{\s*"input"\s*:\s*"')
    _PREFIX = '{"input":"'

    def __init__(self) -> None:
        self.raw = ""
        self.pos = -1  # where the undecoded rest of the string starts; -1 not found, -2 gave up
        self.ended = False
        self.sent: list[str] = []

    def feed(self, fragment: str) -> str:
        self.raw += fragment
        if self.pos == -1:
            match = self._START.match(self.raw)
            if match is not None:
                self.pos = match.end()
            elif len(self.raw) > 64 or not self._PREFIX.startswith(re.sub(r"\s", "", self.raw)):
                self.pos = -2
        if self.pos < 0 or self.ended:
            return ""
        cut = self._safe_end()
        if cut <= self.pos:
            return ""
        try:
            text = json.loads('"' + self.raw[self.pos : cut] + '"', strict=False)
        except ValueError:
            self.pos = -2
            return ""
        self.pos = cut
        if self.ended:
            self.pos += 1
        self.sent.append(text)
        return str(text)

    def _safe_end(self) -> int:
        """Where the decodable part of the string ends: before an unfinished escape or an
        unpaired high surrogate, or at the closing quote (``ended``)."""
        raw, i, n = self.raw, self.pos, len(self.raw)
        while i < n:
            c = raw[i]
            if c == '"':
                self.ended = True
                return i
            if c != "\\":
                i += 1
                continue
            if i + 1 >= n:
                return i
            if raw[i + 1] != "u":
                i += 2
                continue
            if i + 6 > n:
                return i
            try:
                code = int(raw[i + 2 : i + 6], 16)
            except ValueError:
                return i  # json.loads of what follows fails and streaming stops
            if 0xD800 <= code < 0xDC00:
                if i + 12 > n:
                    return i
                i += 12
            else:
                i += 6
        return i

    def rest(self, final: str) -> str:
        """What is still to send when the call ends, given its whole ``final`` input."""
        sent = "".join(self.sent)
        return final[len(sent) :] if final.startswith(sent) else ""
