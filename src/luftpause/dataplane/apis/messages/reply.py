"""Messages replies: a non-streamed ``chat.completion`` as a ``Message``; errors in
Messages' shape; what a tool call's input and a reply's stop reason become (shared
with ``stream.py``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from anthropic.types import (
    ContentBlock,
    Message,
    TextBlock,
    ToolUseBlock,
    Usage,
)
from anthropic.types.shared import (
    APIErrorObject,
    AuthenticationErrorObject,
    BillingErrorObject,
    ErrorObject,
    ErrorResponse,
    GatewayTimeoutErrorObject,
    InvalidRequestErrorObject,
    NotFoundErrorObject,
    OverloadedErrorObject,
    PermissionErrorObject,
    RateLimitErrorObject,
)
from pydantic import BaseModel

if TYPE_CHECKING:
    pass
from luftpause.dataplane.apis._shared import count as _count
from luftpause.dataplane.apis._shared import text as _str

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]


#: the input a tool call gets when the engine's arguments are not a JSON object
UNPARSED_ARGUMENTS = "_unparsed_arguments"


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as ``tool_use`` input: the JSON object they hold;
    ``{}`` for none; anything else kept whole under ``_unparsed_arguments``."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            return value
        return {UNPARSED_ARGUMENTS: arguments}
    return {UNPARSED_ARGUMENTS: _str(arguments) or repr(arguments)}


def stop_of(
    choice: dict[str, Any], has_calls: bool, stop_sequences: tuple[str, ...]
) -> tuple[StopReason, str | None]:
    """Messages' ``stop_reason`` and ``stop_sequence`` for a chat choice's finish."""
    finish = choice.get("finish_reason")
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter":
        return "refusal", None
    if finish == "tool_calls" or has_calls:
        return "tool_use", None
    # which stop string matched: vLLM says it in ``stop_reason``, SGLang in ``matched_stop``
    for key in ("stop_reason", "matched_stop"):
        matched = choice.get(key)
        if isinstance(matched, str) and matched in stop_sequences:
            return "stop_sequence", matched
    return "end_turn", None


def message_of(
    completion: dict[str, Any], model: str, stop_sequences: tuple[str, ...]
) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` as a Messages ``Message`` of ``model``."""
    choice = _first_choice(completion.get("choices"))
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    content: list[ContentBlock] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append(TextBlock(type="text", text=text))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        content.append(
            ToolUseBlock(
                type="tool_use",
                id=_call_id(call.get("id")),
                name=_str(function.get("name")),
                input=tool_input(function.get("arguments")),
            )
        )
    has_calls = any(isinstance(block, ToolUseBlock) for block in content)
    stop_reason, stop_sequence = stop_of(choice, has_calls, stop_sequences)
    prompt, cached, output = _chat_usage(completion.get("usage"))
    body = Message(
        id=_message_id(completion.get("id")),
        type="message",
        role="assistant",
        model=model,
        content=content,
        stop_reason=stop_reason,
        stop_sequence=stop_sequence,
        usage=Usage(
            input_tokens=prompt - cached,
            output_tokens=output,
            cache_read_input_tokens=cached,
            cache_creation_input_tokens=0,
        ),
    )
    return _dump(body)


_ERRORS: dict[int, Callable[[str], ErrorObject]] = {
    400: lambda m: InvalidRequestErrorObject(type="invalid_request_error", message=m),
    401: lambda m: AuthenticationErrorObject(type="authentication_error", message=m),
    402: lambda m: BillingErrorObject(type="billing_error", message=m),
    403: lambda m: PermissionErrorObject(type="permission_error", message=m),
    404: lambda m: NotFoundErrorObject(type="not_found_error", message=m),
    429: lambda m: RateLimitErrorObject(type="rate_limit_error", message=m),
    504: lambda m: GatewayTimeoutErrorObject(type="timeout_error", message=m),
    529: lambda m: OverloadedErrorObject(type="overloaded_error", message=m),
}


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """An error in Messages' shape: ``{"type": "error", "error": {"type", "message"}}``,
    the type from the status (Anthropic's names). ``code`` has no place in that shape:
    the message says it all."""
    if status == 413:  # Anthropic's type for it, which the SDK's models do not list
        return {"type": "error", "error": {"type": "request_too_large", "message": message}}
    make = _ERRORS.get(status)
    if make is None:
        make = _ERRORS[400] if status < 500 else _api_error
    return _dump(ErrorResponse(type="error", error=make(message)))


def _api_error(message: str) -> ErrorObject:
    return APIErrorObject(type="api_error", message=message)


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_unset=True)


def _first_choice(choices: Any) -> dict[str, Any]:
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict):
                return choice
    return {}


def _chat_usage(usage: Any) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens of a chat ``usage``; zeros when absent."""
    if not isinstance(usage, dict):
        return 0, 0, 0
    prompt = _count(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return prompt, min(cached, prompt), _count(usage.get("completion_tokens"))


def _message_id(value: Any) -> str:
    if isinstance(value, str) and value:
        rest = value.removeprefix("chatcmpl-").removeprefix("msg_")
        if rest and rest.isascii():
            return f"msg_{rest}"
    return f"msg_{uuid.uuid4().hex}"


def _call_id(value: Any) -> str:
    return value if isinstance(value, str) and value else f"toolu_{uuid.uuid4().hex}"
