"""The OpenAI Responses API (``POST /v1/responses``, Codex CLI) over Chat Completions (B9).

``parse`` checks a Responses request and translates it to a Chat Completions body;
``ResponsesRequest.reply`` turns a ``chat.completion`` into a ``Response``, and
``ResponsesRequest.stream_translator`` turns ``chat.completion.chunk``\\ s into the
Responses event stream as they arrive. ``observe``/``observe_reply`` read a native
Responses reply (an engine that serves ``/v1/responses`` itself) for the turn's report.
What goes out is built from the ``openai`` SDK's own types and dumped from them.

What Codex CLI 0.171 sends (probed; ``tests/data/harness/codex_*.json``): the whole
conversation every time, ``store: false``, never ``previous_response_id`` and no
``instructions`` (its prompt is the first ``developer`` message); ``input`` holds
``message`` items (``input_text`` / ``output_text`` parts), the ``reasoning``,
``function_call`` and ``custom_tool_call`` items of earlier replies echoed back, and
their ``function_call_output`` / ``custom_tool_call_output`` (whose ``output`` may be a
list of ``input_text`` parts). ``tools`` holds ``function`` tools, ``namespace`` tools
(groups of function/custom tools; a call must come back with its ``namespace`` or Codex
answers "unsupported call") and a hosted ``web_search`` tool in every request. With
model metadata it knows (OpenAI model names), it sends its tools in an
``additional_tools`` input item instead, including a ``custom`` tool with a Lark grammar.

Translation, request side:

* ``instructions`` becomes a first ``system`` message, an ``input`` string one user
  message; ``message`` items keep their role (``developer`` becomes ``system``) and
  their text parts, joined with a newline when there are several (what engines do
  with a list of text parts).
* ``function_call`` / ``custom_tool_call`` items become the ``tool_calls`` of an
  assistant message (consecutive calls, and calls right after an assistant message,
  share one); a custom call's ``input`` travels as the arguments ``{"input": ...}``.
  Their outputs become ``tool`` messages with the ``call_id`` as ``tool_call_id``.
* ``reasoning`` items are dropped: an engine behind Chat Completions cannot take its
  reasoning back (their ``encrypted_content`` is OpenAI's, and chat templates drop
  earlier reasoning anyway).
* ``function`` tools become chat function tools. ``custom`` (freeform) tools become a
  function tool with one string parameter ``input`` whose description gives the
  grammar; the engine does not enforce the grammar (degraded), and calls come back as
  ``custom_tool_call`` items with that string as ``input``. ``namespace`` tools and
  ``additional_tools`` items are flattened into the chat tools (an additional_tools
  item's tools are offered from the start of the conversation, not from its place in
  it); a tool keeps its own name unless another tool has the same name, then it is
  ``<namespace>__<name>``; calls come back with their ``namespace``.
* Hosted ``web_search`` tools (Codex sends one in every request) are dropped: the
  model is not offered them. Every other hosted or OpenAI-run tool (file search,
  code interpreter, image generation, computer use, MCP, local/hosted shell,
  apply_patch, tool search) is refused.
* ``tool_choice`` (``auto``/``none``/``required``, a named function or custom tool),
  ``parallel_tool_calls``, ``temperature``, ``top_p``, ``max_output_tokens``
  (``max_tokens``), ``text.format`` (``response_format``) and ``reasoning.effort``
  low/medium/high (``reasoning_effort``) are mapped; ``store``, ``include``,
  ``prompt_cache_key``, ``metadata``, ``client_metadata``, ``service_tier``,
  ``truncation``, ``user``, ``safety_identifier``, ``text.verbosity``, the rest of
  ``reasoning`` and members this module does not know are ignored.
* Refused with a 400: ``previous_response_id``, ``conversation``, ``prompt`` and
  ``background`` (the proxy stores no responses: send the whole conversation, with
  ``store: false``), ``item_reference`` items, image/file/audio parts, other item
  types, ``top_logprobs``.

Reply side: the text becomes a ``message`` item, the engine's reasoning
(``reasoning_content``/``reasoning`` of vLLM and SGLang) a ``reasoning`` item with
``reasoning_text`` content, each tool call a ``function_call`` (or
``custom_tool_call``) item whose ``call_id`` is the engine's tool call ID unchanged
(the dataplane recognises runs by it); finish ``length`` makes the response
``incomplete`` (``max_output_tokens``).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import orjson
import pydantic
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCustomToolCall,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseError,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
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
from openai.types.responses.response import IncompleteDetails
from openai.types.responses.response_reasoning_item import Content as ReasoningContent
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from luftpause.dataplane.apis import StreamTranslator, Translated
from luftpause.dataplane.apis.images import checked_detail, checked_url, content_parts, image_part
from luftpause.dataplane.errors import BadRequest, openai_error, shown
from luftpause.dataplane.outcome import TurnOutcome
from luftpause.dataplane.request import kind_of as _kind
from luftpause.dataplane.request import parse_object

__all__ = [
    "ResponsesRequest",
    "ResponsesStream",
    "error_body",
    "observe",
    "observe_reply",
    "parse",
]

# Hosted tools Codex offers in every request: dropped (the model is not offered them).
DROPPED_TOOLS = frozenset(
    {"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11"}
)
# Request members that need state the proxy does not keep.
STATEFUL = ("previous_response_id", "conversation", "prompt")
# A custom tool's grammar is shown to the model in the ``input`` description up to this size.
GRAMMAR_SHOWN_CHARS = 4000
_QUALIFIER = "__"  # <namespace>__<name>, for a tool whose name another tool also has


# ---------------------------------------------------------------------------------------
# Request


@dataclass(frozen=True)
class _Tool:
    """A client tool behind a chat function name."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked Responses request: ``chat`` is its Chat Completions body."""

    model: str
    stream: bool
    chat: dict[str, Any]
    tools: dict[str, _Tool]  # chat function name -> the client's tool
    template: Response  # the request's echo fields (tools, tool_choice, ...), no output
    image_at: str | None = None  # where the first input_image part is, if there is one

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

    def stream_translator(self) -> ResponsesStream:
        return ResponsesStream(self)

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


def parse(raw: bytes) -> ResponsesRequest:
    """A ``/v1/responses`` body checked and translated, or ``BadRequest`` naming what
    the proxy cannot translate."""
    body = parse_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest(f"'model' is required and must be a non-empty string, got {_kind(model)}")
    stream = _optional(body, "stream", bool)
    for name in STATEFUL:
        if body.get(name) is not None:
            raise BadRequest(
                f"'{name}' is not supported: the proxy keeps no stored responses or "
                "conversations; send the whole conversation in 'input' (with store: false)"
            )
    if body.get("background"):
        raise BadRequest(
            "'background' is not supported: the proxy keeps no stored responses; "
            "send the request without it"
        )
    if body.get("top_logprobs") is not None:
        raise BadRequest("'top_logprobs' is not supported by this proxy")

    builder = _Builder()
    instructions = _optional(body, "instructions", str)
    if instructions:
        builder.messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        builder.messages.append({"role": "user", "content": items})
        items = []
    elif not isinstance(items, list):
        raise BadRequest(f"'input' is required: a string or a list of items, got {_kind(items)}")

    # Tools first: history items name them.
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest(f"'tools' must be a list, got {_kind(tools)}")
    for i, tool in enumerate(tools or []):
        builder.add_tool(tool, f"tools[{i}]")
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            extra = item.get("tools")
            if not isinstance(extra, list):
                raise BadRequest(f"'input[{i}].tools' must be a list, got {_kind(extra)}")
            for j, tool in enumerate(extra):
                builder.add_tool(tool, f"input[{i}].tools[{j}]")
    builder.name_tools()
    for i, item in enumerate(items):
        builder.add_item(item, f"input[{i}]")
    builder.flush_images()

    chat: dict[str, Any] = {"model": model, "messages": builder.messages}
    if stream is not None:
        chat["stream"] = stream
    if builder.chat_tools:
        chat["tools"] = builder.chat_tools
        choice = body.get("tool_choice")
        if choice is not None:
            chat["tool_choice"] = builder.tool_choice(choice)
        parallel = _optional(body, "parallel_tool_calls", bool)
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    else:
        builder.tool_choice(body.get("tool_choice"))  # checked all the same
        _optional(body, "parallel_tool_calls", bool)
    limit = _optional(body, "max_output_tokens", int)
    if limit is not None:
        if isinstance(limit, bool) or limit < 1:
            raise BadRequest(f"'max_output_tokens' must be a positive integer, got {_kind(limit)}")
        chat["max_tokens"] = limit
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRequest(f"'{name}' must be a number, got {_kind(value)}")
        chat[name] = value
    response_format = _text_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    effort = _reasoning_effort(body.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort

    template = _template(body, model)
    try:  # what goes on (to the engine, and back in every event) must serialise
        orjson.dumps(chat)
        orjson.dumps(_dump(template))
    except (orjson.JSONEncodeError, RecursionError) as exc:
        raise BadRequest(f"request body cannot be passed on: {exc}") from None
    return ResponsesRequest(
        model=model,
        stream=bool(stream),
        chat=chat,
        tools=builder.by_chat_name,
        template=template,
        image_at=builder.image_at,
    )


@dataclass
class _Builder:
    """The chat messages and tools of one request, built item by item."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    chat_tools: list[dict[str, Any]] = field(default_factory=list)
    by_chat_name: dict[str, _Tool] = field(default_factory=dict)
    # (namespace, name) -> (tool, its chat function definition without the name)
    _defined: dict[tuple[str | None, str], tuple[_Tool, dict[str, Any]]] = field(
        default_factory=dict
    )
    _chat_names: dict[tuple[str | None, str], str] = field(default_factory=dict)
    image_at: str | None = None  # the position of the first input_image part
    # images of tool outputs, for a user message after the tool messages (a tool
    # message carries text only)
    _tool_images: list[dict[str, Any]] = field(default_factory=list)

    # -- tools

    def add_tool(self, tool: Any, where: str, namespace: str | None = None) -> None:
        if not isinstance(tool, dict):
            raise BadRequest(f"'{where}' must be an object, got {_kind(tool)}")
        kind = tool.get("type")
        if kind in DROPPED_TOOLS and namespace is None:
            return
        if kind == "namespace" and namespace is None:
            name = _name(tool, where)
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise BadRequest(f"'{where}.tools' must be a list, got {_kind(inner)}")
            for j, member in enumerate(inner):
                self.add_tool(member, f"{where}.tools[{j}]", name)
            return
        if kind == "function":
            self._define(_Tool("function", _name(tool, where), namespace), _function(tool, where))
            return
        if kind == "custom":
            self._define(_Tool("custom", _name(tool, where), namespace), _custom(tool, where))
            return
        if not isinstance(kind, str):
            raise BadRequest(f"'{where}.type' must be a string, got {_kind(kind)}")
        raise BadRequest(
            f"'{where}' is a {shown(kind)} tool, which the proxy cannot offer: only "
            "function, custom and namespace tools are translated to Chat Completions "
            "(hosted web_search tools are dropped)"
        )

    def _define(self, tool: _Tool, definition: dict[str, Any]) -> None:
        key = (tool.namespace, tool.name)
        known = self._defined.get(key)
        if known is not None:
            if known[1] != definition:
                what = f"{tool.namespace}.{tool.name}" if tool.namespace else tool.name
                raise BadRequest(f"tool {shown(what)} is defined twice, differently")
            return
        self._defined[key] = (tool, definition)

    def name_tools(self) -> None:
        """Give every tool its chat function name: its own, unless another tool has it."""
        count: dict[str, int] = {}
        for _, name in self._defined:
            count[name] = count.get(name, 0) + 1
        for (namespace, name), (tool, definition) in self._defined.items():
            chat_name = name
            if count[name] > 1 and namespace is not None:
                chat_name = f"{namespace}{_QUALIFIER}{name}"
            if chat_name in self.by_chat_name:
                raise BadRequest(f"tool name {shown(chat_name)} is used by two tools")
            self._chat_names[(namespace, name)] = chat_name
            self.by_chat_name[chat_name] = tool
            self.chat_tools.append(
                {"type": "function", "function": {"name": chat_name, **definition}}
            )

    def chat_name(self, namespace: str | None, name: str) -> str:
        known = self._chat_names.get((namespace, name))
        if known is not None:
            return known
        return f"{namespace}{_QUALIFIER}{name}" if namespace else name

    def tool_choice(self, choice: Any) -> Any:
        if choice is None or choice in ("auto", "none", "required"):
            return choice
        if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
            name = choice.get("name")
            if not isinstance(name, str) or not name:
                raise BadRequest(
                    f"'tool_choice.name' must be a non-empty string, got {_kind(name)}"
                )
            namespace = choice.get("namespace")
            namespace = namespace if isinstance(namespace, str) else None
            return {"type": "function", "function": {"name": self.chat_name(namespace, name)}}
        if isinstance(choice, dict):
            raise BadRequest(
                f"'tool_choice' of type {shown(choice.get('type'))} is not supported: "
                "use auto, none, required or a function or custom tool"
            )
        raise BadRequest(
            "'tool_choice' must be auto, none, required or an object naming a tool, "
            f"got {_kind(choice)}"
        )

    # -- items

    def add_item(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise BadRequest(f"'{where}' must be an object, got {_kind(item)}")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(item, where)
        elif kind in ("function_call", "custom_tool_call"):
            self._call(item, where, kind)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = _required_str(item, "call_id", where)
            parts = self._parts(item.get("output"), f"{where}.output", images=True)
            content = "\n".join(part for part in parts if isinstance(part, str))
            self._tool_images.extend(part for part in parts if not isinstance(part, str))
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif kind in ("reasoning", "additional_tools"):
            pass  # reasoning: cannot go back to the engine; additional_tools: read above
        elif kind == "item_reference":
            raise BadRequest(
                f"'{where}' is an item_reference: the proxy keeps no stored items; "
                "send the item itself"
            )
        elif isinstance(kind, str):
            raise BadRequest(
                f"'{where}' is a {shown(kind)} item, which the proxy cannot translate to "
                "Chat Completions"
            )
        else:
            raise BadRequest(f"'{where}.type' must be a string, got {_kind(kind)}")

    def _message(self, item: dict[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequest(
                f"'{where}.role' must be user, assistant, system or developer, got {_kind(role)}"
            )
        self.flush_images()
        parts = self._parts(item.get("content"), f"{where}.content", images=role == "user")
        texts = [part for part in parts if isinstance(part, str)]
        content: str | list[dict[str, Any]] = "\n".join(texts)
        if len(texts) < len(parts):
            content = content_parts(parts, "\n")
        self.messages.append(
            {"role": "system" if role == "developer" else role, "content": content}
        )

    def flush_images(self) -> None:
        """The tool outputs' images, as a user message after their tool messages."""
        if self._tool_images:
            self.messages.append({"role": "user", "content": self._tool_images})
            self._tool_images = []

    def _parts(self, content: Any, where: str, *, images: bool) -> list[str | dict[str, Any]]:
        """A message's content or a tool output: a string, or its text parts (as
        strings) and image parts (as Chat Completions parts), in order."""
        if isinstance(content, str):
            return [content]
        if not isinstance(content, list):
            raise BadRequest(f"'{where}' must be a string or a list of parts, got {_kind(content)}")
        out: list[str | dict[str, Any]] = []
        for i, part in enumerate(content):
            at = f"{where}[{i}]"
            if isinstance(part, dict) and part.get("type") == "input_image":
                if not images:
                    raise BadRequest(
                        f"'{at}' is an input_image part: images are translated in user "
                        "messages and tool outputs only"
                    )
                out.append(_input_image(part, at))
                if self.image_at is None:
                    self.image_at = at
            else:
                out.append(_part_text(part, at))
        return out

    def _call(self, item: dict[str, Any], where: str, kind: str) -> None:
        call_id = _required_str(item, "call_id", where)
        name = _required_str(item, "name", where)
        namespace = item.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise BadRequest(f"'{where}.namespace' must be a string, got {_kind(namespace)}")
        if kind == "function_call":
            arguments = _required_str(item, "arguments", where, empty=True)
        else:
            text = _required_str(item, "input", where, empty=True)
            try:
                arguments = orjson.dumps({"input": text}).decode()
            except orjson.JSONEncodeError as exc:
                raise BadRequest(f"'{where}.input' cannot be passed on: {exc}") from None
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": self.chat_name(namespace, name), "arguments": arguments},
        }
        self.flush_images()
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            self.messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    description = _optional(tool, "description", str, where)
    if description is not None:
        out["description"] = description
    parameters = _optional(tool, "parameters", dict, where)
    if parameters is not None:
        out["parameters"] = parameters
    strict = _optional(tool, "strict", bool, where)
    if strict:
        out["strict"] = True
    return out


def _custom(tool: dict[str, Any], where: str) -> dict[str, Any]:
    description = _optional(tool, "description", str, where)
    fmt = _optional(tool, "format", dict, where) or {"type": "text"}
    if fmt.get("type") == "text":
        about = "The tool's input, as free-form text."
    elif fmt.get("type") == "grammar":
        syntax = fmt.get("syntax")
        definition = fmt.get("definition")
        if not isinstance(syntax, str) or not isinstance(definition, str):
            raise BadRequest(f"'{where}.format' must have string 'syntax' and 'definition'")
        about = f"The tool's input, as free-form text following this {syntax} grammar"
        if len(definition) <= GRAMMAR_SHOWN_CHARS:
            about += f":\n{definition}"
        else:
            about += f" (its {len(definition)}-character definition is not shown)."
    else:
        raise BadRequest(
            f"'{where}.format.type' must be text or grammar, got {_kind(fmt.get('type'))}"
        )
    parameters = {
        "type": "object",
        "properties": {"input": {"type": "string", "description": about}},
        "required": ["input"],
    }
    out: dict[str, Any] = {"parameters": parameters}
    if description is not None:
        out = {"description": description, **out}
    return out


def _input_image(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``input_image`` part as a Chat Completions ``image_url`` part."""
    if part.get("file_id") is not None:
        raise BadRequest(
            f"'{where}.file_id': file IDs are not supported through this proxy (it keeps "
            "no files); send the image as 'image_url', a URL or a data URL"
        )
    url = checked_url(part.get("image_url"), f"{where}.image_url")
    return dict(image_part(url, checked_detail(part.get("detail"), f"{where}.detail")))


def _part_text(part: Any, where: str) -> str:
    if not isinstance(part, dict):
        raise BadRequest(f"'{where}' must be an object, got {_kind(part)}")
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return _required_str(part, "text", where, empty=True)
    if kind == "refusal":
        return _required_str(part, "refusal", where, empty=True)
    if kind in ("input_file", "input_audio"):
        raise BadRequest(
            f"'{where}' is an {kind} part: only text and images are translated to Chat "
            "Completions by this proxy"
        )
    raise BadRequest(f"'{where}' is a part of type {_kind(kind)}, which the proxy cannot translate")


def _text_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise BadRequest(f"'text' must be an object, got {_kind(text)}")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest(f"'text.format' must be an object, got {_kind(fmt)}")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        name = fmt.get("name")
        schema = fmt.get("schema")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"'text.format.name' must be a non-empty string, got {_kind(name)}")
        if not isinstance(schema, dict):
            raise BadRequest(f"'text.format.schema' must be an object, got {_kind(schema)}")
        spec: dict[str, Any] = {"name": name, "schema": schema}
        for key, kinds in (("description", str), ("strict", bool)):
            value = _optional(fmt, key, kinds, "text.format")
            if value is not None:
                spec[key] = value
        return {"type": "json_schema", "json_schema": spec}
    raise BadRequest(
        f"'text.format.type' must be text, json_object or json_schema, got {_kind(kind)}"
    )


def _reasoning_effort(reasoning: Any) -> str | None:
    """``reasoning.effort`` as chat's ``reasoning_effort``: only the values engines know
    (low, medium, high); the others (none, minimal, xhigh) and summaries are ignored."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise BadRequest(f"'reasoning' must be an object, got {_kind(reasoning)}")
    effort = reasoning.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise BadRequest(f"'reasoning.effort' must be a string, got {_kind(effort)}")
    return effort if effort in ("low", "medium", "high") else None


# The request members a Response echoes, checked one by one against the SDK's types:
# one the SDK cannot carry is left out of the echo (it was already checked above as far
# as the translation reads it).
_ECHOED = (
    "instructions",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "prompt_cache_key",
    "reasoning",
    "safety_identifier",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "truncation",
    "user",
)
_ECHO_DEFAULTS: dict[str, Any] = {
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "text": {"format": {"type": "text"}},
    "truncation": "disabled",
}


def _template(body: dict[str, Any], model: str) -> Response:
    base: dict[str, Any] = {
        "id": "resp_template",
        "object": "response",
        "created_at": 0,
        "model": model,
        "output": [],
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "previous_response_id": None,
        "background": False,
        "usage": None,
        "instructions": None,
        "metadata": {},
        "temperature": None,
        "top_p": None,
        "max_output_tokens": None,
        "reasoning": None,
        **_ECHO_DEFAULTS,
    }
    echoed = {}
    for name in _ECHOED:
        value = body.get(name)
        if value is None:
            continue
        try:
            Response.model_validate({**base, name: value})
        except pydantic.ValidationError:
            continue
        echoed[name] = value
    return Response.model_validate({**base, **echoed})


# ---------------------------------------------------------------------------------------
# Stream


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

    def __init__(self, request: ResponsesRequest) -> None:
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


if TYPE_CHECKING:  # the module gives what the dataplane expects (apis/__init__.py)
    _request_check: type[Translated] = ResponsesRequest
    _stream_check: type[StreamTranslator] = ResponsesStream


# ---------------------------------------------------------------------------------------
# Native replies read for the report, and errors


# The Responses API words errors as Chat Completions does: OpenAI's shape (D6).
error_body = openai_error


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
    call_id = item.get("call_id")
    if isinstance(call_id, str) and call_id and call_id not in outcome.tool_call_ids:
        outcome.tool_call_ids.append(call_id)
    outcome.saw_tool(item.get("name"))
    return True


# ---------------------------------------------------------------------------------------
# Helpers


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


_MAX_COUNT = 2**63


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_COUNT


def _count(value: Any) -> int:
    """A token count, or 0 for anything that is not one (a bool is not)."""
    return value if _is_count(value) else 0


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _name(obj: dict[str, Any], where: str) -> str:
    return _required_str(obj, "name", where)


def _required_str(obj: dict[str, Any], key: str, where: str, empty: bool = False) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or (not value and not empty):
        what = "a string" if empty else "a non-empty string"
        raise BadRequest(f"'{where}.{key}' must be {what}, got {_kind(value)}")
    return value


def _optional(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    """``obj[key]`` if it is a ``kind`` (a bool is no int), None if absent or null."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, kind) and not (isinstance(value, bool) and kind is int):
        return value
    names = {bool: "true or false", str: "a string", int: "an integer", dict: "an object"}
    wanted = names.get(kind, "something else") if isinstance(kind, type) else "something else"
    path = f"{where}.{key}" if where else key
    raise BadRequest(f"'{path}' must be {wanted}, got {_kind(value)}")
