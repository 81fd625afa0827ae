"""Responses replies: a ``chat.completion`` as a ``Response``, and its parts.

``Replies`` (what ``ResponsesRequest`` is on the reply side) builds the ``Response``
and its output items from the request's echo fields and tools, for the whole reply
and for each event of a streamed one (``stream.py``). Errors take OpenAI's shape.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import pydantic
from openai.types.responses import (
    Response,
    ResponseCustomToolCall,
    ResponseError,
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseUsage,
)
from openai.types.responses.response import IncompleteDetails
from openai.types.responses.response_reasoning_item import Content as ReasoningContent
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from luftpause.dataplane.apis._shared import count as _count
from luftpause.dataplane.apis._shared import listed as _list
from luftpause.dataplane.apis._shared import text as _str
from luftpause.dataplane.errors import openai_error


@dataclass(frozen=True)
class _Tool:
    """A client tool behind a chat function name."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None


class Replies:
    """The reply side of a Responses request (``ResponsesRequest`` is one): the client's
    tools by chat function name and the request's echo fields, from which its reply is
    built, whole (``reply``) or streamed (``stream.ResponsesStream``)."""

    tools: dict[str, _Tool]  # chat function name -> the client's tool
    template: Response  # the request's echo fields (tools, tool_choice, ...), no output

    def reply(self, completion: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed ``chat.completion`` as a ``Response``."""
        choice = _first_choice(completion)
        message = choice.get("message") if isinstance(choice, dict) else None
        message = message if isinstance(message, dict) else {}
        finish = _str(choice.get("finish_reason")) if isinstance(choice, dict) else ""
        cut = finish == "length"
        item_status: Literal["completed", "incomplete"] = "incomplete" if cut else "completed"
        output: list[ResponseOutputItem] = []
        reasoning = _reasoning_text(message)
        if reasoning:
            output.append(_reasoning_item(_new_id("rs"), reasoning, item_status))
        text = _text_content(message.get("content"))
        if text:
            output.append(_message_item(_new_id("msg"), text, item_status))
        for call in _list(message.get("tool_calls")):
            if not isinstance(call, dict):
                continue
            function = call.get("function")
            function = function if isinstance(function, dict) else {}
            call_id = _str(call.get("id")) or _new_id("call")
            name = _str(function.get("name"))
            arguments = _str(function.get("arguments"))
            item_id = self.call_item_id(name)
            output.append(self._call_item(item_id, call_id, name, arguments, item_status))
        created = completion.get("created")
        created_at = _count(created) or int(time.time())
        response = self.response(
            _new_id("resp"),
            created_at,
            _status(finish),
            output,
            _usage(completion.get("usage")),
            finish,
        )
        return _dump(response)

    def response(
        self,
        response_id: str,
        created_at: float,
        status: Literal["completed", "incomplete", "in_progress", "failed"],
        output: list[ResponseOutputItem],
        usage: ResponseUsage | None,
        finish: str = "",
        error: ResponseError | None = None,
    ) -> Response:
        """The request's ``Response`` with this state."""
        incomplete = None
        if status == "incomplete":
            reason: Literal["max_output_tokens", "content_filter"] = (
                "content_filter" if finish == "content_filter" else "max_output_tokens"
            )
            incomplete = IncompleteDetails(reason=reason)
        update: dict[str, Any] = {
            "id": response_id,
            "created_at": created_at,
            "status": status,
            "output": output,
            "usage": usage,
            "incomplete_details": incomplete,
            "error": error,
        }
        if status in ("completed", "incomplete"):
            update["completed_at"] = int(time.time())
        return self.template.model_copy(update=update)

    def call_item_id(self, name: str) -> str:
        """A new output item ID for a call of the chat function ``name``."""
        tool = self.tools.get(name)
        return _new_id("ctc" if tool is not None and tool.kind == "custom" else "fc")

    def _call_item(
        self,
        item_id: str,
        call_id: str,
        name: str,
        arguments: str,
        status: Literal["in_progress", "completed", "incomplete"],
    ) -> ResponseFunctionToolCall | ResponseCustomToolCall:
        """The output item for a chat tool call (``name`` is the chat function name)."""
        tool = self.tools.get(name)
        if tool is not None and tool.kind == "custom":
            custom = ResponseCustomToolCall(
                type="custom_tool_call",
                id=item_id,
                call_id=call_id,
                name=tool.name,
                input=_custom_input(arguments),
            )
            if tool.namespace is not None:
                custom.namespace = tool.namespace
            return custom
        function = ResponseFunctionToolCall(
            type="function_call",
            id=item_id,
            call_id=call_id,
            name=tool.name if tool is not None else name,
            arguments=arguments,
            status=status,
        )
        if tool is not None and tool.namespace is not None:
            function.namespace = tool.namespace
        return function


def _message_item(
    item_id: str, text: str, status: Literal["in_progress", "completed", "incomplete"]
) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        type="message",
        id=item_id,
        role="assistant",
        status=status,
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def _reasoning_item(
    item_id: str, text: str, status: Literal["in_progress", "completed", "incomplete"]
) -> ResponseReasoningItem:
    return ResponseReasoningItem(
        type="reasoning",
        id=item_id,
        summary=[],
        content=[ReasoningContent(type="reasoning_text", text=text)],
        status=status,
    )


def _custom_input(arguments: str) -> str:
    """A custom tool's input from the chat arguments ``{"input": "..."}``; the arguments
    themselves when the model wrote something else."""
    try:
        value = json.loads(arguments, strict=False)
    except ValueError:
        return arguments
    if isinstance(value, dict):
        text = value.get("input")
        if isinstance(text, str):
            return text
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(value) == 1 and strings:
            return strings[0]
    return arguments


def _status(finish: str) -> Literal["completed", "incomplete"]:
    return "incomplete" if finish in ("length", "content_filter") else "completed"


def _usage(usage: Any) -> ResponseUsage | None:
    if not isinstance(usage, dict):
        return None
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    total = _count(usage.get("total_tokens")) or prompt + completion
    prompt_details = usage.get("prompt_tokens_details")
    cached = _count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else 0
    completion_details = usage.get("completion_tokens_details")
    reasoning = (
        _count(completion_details.get("reasoning_tokens"))
        if isinstance(completion_details, dict)
        else 0
    )
    return ResponseUsage(
        input_tokens=prompt,
        input_tokens_details=InputTokensDetails(cached_tokens=cached, cache_write_tokens=0),
        output_tokens=completion,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning),
        total_tokens=total,
    )


def _reasoning_text(message: dict[str, Any]) -> str:
    """The engine's reasoning in a chat message or delta (vLLM: ``reasoning`` or
    ``reasoning_content``; SGLang: ``reasoning_content``)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _text_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # a list of text parts, as some engines answer
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _first_choice(body: dict[str, Any]) -> Any:
    choices = body.get("choices")
    return choices[0] if isinstance(choices, list) and choices else None


def _dump(model: pydantic.BaseModel) -> dict[str, Any]:
    """The model as JSON data, with the Response's times in whole seconds as OpenAI sends
    them (the SDK types them as floats)."""
    data = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
    for body in (data, data.get("response")):
        if isinstance(body, dict):
            for key in ("created_at", "completed_at"):
                value = body.get(key)
                if isinstance(value, float) and value.is_integer():
                    body[key] = int(value)
    return data


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# The Responses API words errors as Chat Completions does: OpenAI's shape (D6).
error_body = openai_error
