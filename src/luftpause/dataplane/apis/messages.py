"""The Anthropic Messages API (``/v1/messages``, Claude Code) over Chat Completions (B9).

``parse`` checks a Messages body and translates it into a Chat Completions body;
``MessagesRequest.reply`` and ``MessagesStream`` turn the engine's answer back into a
``Message`` or its server-sent events. What goes out is built from the official
``anthropic`` SDK's types. ``observe``/``observe_reply`` read a native Messages reply
(an engine that serves ``/v1/messages`` itself) for the dataplane's reports.

What Claude Code 2.1.332 sends was recorded with a probe server
(``tests/data/harness/claude_code_*.json``): ``POST /v1/messages?beta=true``, streamed,
with a ``system`` of text blocks (the first an attribution line,
``x-anthropic-billing-header: cc_version=…``), custom tools only (some with
``defer_loading``), ``role: "system"`` messages between the turns, ``tool_result``
blocks whose content is a string, text blocks or ``tool_reference`` blocks,
``thinking: {"type": "adaptive"}``, ``context_management``, ``output_config.effort``,
``metadata`` and ``cache_control`` everywhere. Its ordinary turns carry no server
tools; only its WebSearch tool sends a request of its own with the server tool
``web_search_20250305``, which an engine cannot run.

Translated:

* ``system`` (a string or text blocks, joined with a blank line) → the first
  ``system`` message; messages of role ``system`` → ``system`` messages in place.
* ``text`` → text; ``tool_use`` → ``tool_calls`` (arguments: the input as JSON);
  ``tool_result`` → a ``tool`` message (before the rest of its user message), its
  text blocks joined; ``is_error: true`` → the text prefixed with ``Error: ``.
* ``image`` blocks (in user messages and tool results; ``images.py``) → ``image_url``
  parts: a ``base64`` source as a ``data:`` URL of its media type (JPEG, PNG, GIF or
  WebP), a ``url`` source as its URL (http, https or data). A user message with an
  image becomes a list of parts in the blocks' order (texts next to each other joined
  as without images). The dataplane forwards them only where every endpoint serving
  the model sets ``vision = true`` (``MessagesRequest.image_at`` says where the first
  image is), else it answers 400 naming that setting.
* custom tools → functions (``strict`` kept; ``input_examples`` appended to the
  description as JSON lines); ``tool_choice`` auto/any/tool/none →
  "auto"/"required"/the function/"none"; ``disable_parallel_tool_use`` →
  ``parallel_tool_calls: false``.
* Deferred tools (``defer_loading: true``) are what Anthropic's tool search does with
  them: left out until a ``tool_reference`` in a tool result loads them, then given to
  the engine as functions; the ``tool_reference`` itself becomes the line
  ``Tool <name> is now available.`` in the tool message.
* ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` (→ ``stop``),
  ``stream``; ``output_config.format`` (and the older ``output_format``) →
  ``response_format`` with that JSON schema.
* A last ``assistant`` message (prefill) is continued
  (``continue_final_message``, which SGLang and vLLM accept), not answered.

Degraded (accepted; the reply differs from what Anthropic's API would give):

* ``thinking`` is ignored: the reply has no thinking blocks; ``thinking`` and
  ``redacted_thinking`` blocks in the history are dropped (an engine behind Chat
  Completions cannot take them back).
* ``cache_control`` is ignored (engines cache prefixes by themselves); usage reports
  the engine's cached tokens as ``cache_read_input_tokens`` and no cache writes.
* The attribution system block (``x-anthropic-billing-header: …``; Anthropic's API
  consumes it) is dropped: it differs between sessions and would otherwise stand
  before everything else in the prompt, so no two sessions would share a cached prefix.
* ``context_management`` is not applied: the engine gets the whole history as sent
  (Anthropic's servers would clear old thinking or tool results by its edits).
* ``metadata``, ``service_tier``, ``output_config.effort``,
  ``speed``, ``inference_geo``, ``diagnostics``, ``citations`` of text blocks, and any
  top-level field this module does not know, are ignored (an unknown field is logged
  once per name): harness releases add such hints often, and a new one must not stop
  a running deployment.
* The text of an assistant message is one string, before its tool calls (the order of
  text and tool_use blocks within one message is not kept).
* Images in a ``tool_result`` travel at the start of the user message that follows the
  tool messages, in order, not inside the tool message (Chat Completions tool messages
  carry text only: OpenAI's schema and SGLang's take no image parts there). An
  image's ``cache_control`` and ``transformations`` are ignored.

Refused with a 400 naming the field or the block's position (never a silently
different request):

* server tools (any ``tools[i].type`` but ``custom``: web search and fetch, bash, text
  editor, computer use, code execution, tool search, memory, …): the engine cannot
  run them, and a model answering in their place would make results up (Claude
  Code's WebSearch tool then tells the model the search failed);
* ``document`` and ``search_result`` blocks (also inside tool results), server
  tool blocks (``server_tool_use``, ``*_tool_result``), ``container_upload``, MCP
  blocks, and any block type not known here; ``image`` blocks in system text or
  assistant messages, with a ``file`` source (Files API IDs) or a media type, data or
  URL scheme named above as not taken;
* ``mcp_servers`` and ``container`` (features Anthropic's servers run);
* ``max_tokens`` below 1 (Anthropic's cache pre-warming with 0 has no equivalent),
  a ``tool_reference`` to a tool not in ``tools``, a ``tool_choice`` without tools or
  naming a tool that is not offered, duplicate tool names, and wrong types of the
  fields read.

From the engine back: the text, then one ``tool_use`` block per tool call, its ``id``
the engine's tool call id unchanged (the dataplane recognises runs by echoed ids).
Arguments that are not a JSON object reach the client as the input
``{"_unparsed_arguments": "<the engine's text>"}`` (empty arguments as ``{}``), so the
harness's input validation tells the model what went wrong instead of running the
tool with input nobody wrote; a stream passes argument fragments on as they come
(Claude Code then reports the unparsable input to the model itself). Reasoning text
(``reasoning_content``) is not passed on. The stop reason is ``tool_use`` whenever the
reply has tool calls, ``stop_sequence`` when the engine names the stop string that
matched (vLLM's ``stop_reason``, SGLang's ``matched_stop``). An ``error`` chunk in a
stream becomes Messages' ``error`` event and ends it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

import orjson
from anthropic.types import (
    ContentBlock,
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

from luftpause.dataplane.apis.images import checked_url, content_parts, data_url, image_part
from luftpause.dataplane.errors import BadRequest, shown
from luftpause.dataplane.request import kind_of as _kind
from luftpause.dataplane.request import parse_object

if TYPE_CHECKING:
    from luftpause.dataplane.apis import StreamTranslator, Translated
    from luftpause.dataplane.outcome import TurnOutcome

log = logging.getLogger("luftpause.dataplane.apis.messages")

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]

#: the input a tool call gets when the engine's arguments are not a JSON object
UNPARSED_ARGUMENTS = "_unparsed_arguments"
#: the attribution line Claude Code sends as its first system block
ATTRIBUTION_PREFIX = "x-anthropic-billing-header:"

# Top-level fields read or translated, and those knowingly ignored.
_READ = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "stream",
    "output_config",
    "output_format",
}
_IGNORED = {
    "metadata",
    "service_tier",
    "cache_control",
    "context_management",
    "thinking",
    "speed",
    "inference_geo",
    "diagnostics",
    "user_profile_id",
    "workspace_id",
    "betas",
}
_REFUSED = {
    "mcp_servers": "MCP connectors run on Anthropic's servers",
    "container": "containers are a server-side code execution feature",
}
_unknown_logged: set[str] = set()
_UNKNOWN_LOGGED_MAX = 64

# Content block types that exist in the Messages API but cannot be translated.
_UNSUPPORTED_BLOCKS = {
    "document",
    "search_result",
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "container_upload",
    "mcp_tool_use",
    "mcp_tool_result",
    "browser_state",
    "compaction",
}
_THINKING_BLOCKS = {"thinking", "redacted_thinking"}


# --------------------------------------------------------------------------- request


@dataclass(frozen=True)
class MessagesRequest:
    """A Messages request translated to Chat Completions (``Translated``)."""

    model: str
    stream: bool
    chat: dict[str, Any]
    stop_sequences: tuple[str, ...] = ()
    image_at: str | None = None  # where the first image block is, if there is one

    def reply(self, completion: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed ``chat.completion`` as a Messages ``Message``."""
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
        stop_reason, stop_sequence = stop_of(choice, has_calls, self.stop_sequences)
        prompt, cached, output = _chat_usage(completion.get("usage"))
        body = Message(
            id=_message_id(completion.get("id")),
            type="message",
            role="assistant",
            model=self.model,
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

    def stream_translator(self) -> MessagesStream:
        return MessagesStream(self.model, self.stop_sequences)


def parse(raw: bytes) -> MessagesRequest:
    """A Messages body checked and translated; ``BadRequest`` names what cannot be."""
    body = parse_object(raw)
    for name, why in _REFUSED.items():
        if body.get(name) not in (None, [], {}):
            raise BadRequest(f"'{name}' is not supported through this proxy: {why}")
    for name in sorted(body.keys() - _READ - _IGNORED - _unknown_logged):
        if len(_unknown_logged) >= _UNKNOWN_LOGGED_MAX:  # clients choose the names
            break
        _unknown_logged.add(name)
        log.warning("Messages API: ignoring the unknown request field %s", shown(name))

    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest(f"'model' is required and must be a non-empty string, got {_kind(model)}")
    max_tokens = body.get("max_tokens")
    if not _is_int(max_tokens):
        raise BadRequest(
            f"'max_tokens' is required and must be an integer, got {_kind(max_tokens)}"
        )
    if max_tokens < 1:
        raise BadRequest(f"'max_tokens' must be at least 1 through this proxy, got {max_tokens}")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, got {_kind(stream)}")

    translator = _Translator()
    messages = translator.system(body.get("system"))
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise BadRequest(
            f"'messages' is required and must be a non-empty array, got {_kind(raw_messages)}"
        )
    for i, message in enumerate(raw_messages):
        messages.extend(translator.message(i, message))
    tools = translator.tools(body.get("tools"))
    translator.check_references()

    chat: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), tools, chat)
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if not _is_number(value):
                raise BadRequest(f"'{name}' must be a number, got {_kind(value)}")
            chat[name] = value
    top_k = body.get("top_k")
    if top_k is not None:
        if not _is_int(top_k):
            raise BadRequest(f"'top_k' must be an integer, got {_kind(top_k)}")
        chat["top_k"] = top_k
    stops = _stop_sequences(body.get("stop_sequences"))
    if stops:
        chat["stop"] = list(stops)
    response_format = _response_format(body)
    if response_format is not None:
        chat["response_format"] = response_format
    chat["stream"] = bool(stream)
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" not in last:
        # a prefill: the model continues this message instead of starting its next one
        chat["continue_final_message"] = True
        chat["add_generation_prompt"] = False
    try:  # what the dataplane sends on must serialise: no lone surrogates, no huge integers
        orjson.dumps(chat)
    except (orjson.JSONEncodeError, RecursionError) as exc:
        raise BadRequest(f"request body cannot be passed on: {exc}") from None
    return MessagesRequest(
        model=model,
        stream=bool(stream),
        chat=chat,
        stop_sequences=stops,
        image_at=translator.image_at,
    )


@dataclass
class _Translator:
    """The parts of one request, translated; remembers the tools that tool results load."""

    loaded: dict[str, str] = field(default_factory=dict)  # tool name -> where it was loaded
    offered: set[str] = field(default_factory=set)  # the names in ``tools``, deferred or not
    image_at: str | None = None  # the position of the first image block

    def system(self, system: Any) -> list[dict[str, Any]]:
        if system is None:
            return []
        if isinstance(system, str):
            return [{"role": "system", "content": system}] if system else []
        if not isinstance(system, list):
            raise BadRequest(
                f"'system' must be a string or an array of text blocks, got {_kind(system)}"
            )
        texts = [self.text_block(block, f"system[{j}]") for j, block in enumerate(system)]
        texts = [text for text in texts if not text.startswith(ATTRIBUTION_PREFIX)]
        return [{"role": "system", "content": "\n\n".join(texts)}] if texts else []

    def message(self, i: int, message: Any) -> list[dict[str, Any]]:
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequest(f"'{where}' must be an object, got {_kind(message)}")
        role = message.get("role")
        content = message.get("content")
        if not isinstance(content, str | list):
            raise BadRequest(
                f"'{where}.content' must be a string or an array of blocks, got {_kind(content)}"
            )
        if role == "user":
            return self.user(where, content)
        if role == "assistant":
            return [self.assistant(where, content)]
        if role == "system":
            if isinstance(content, str):
                return [{"role": "system", "content": content}]
            texts = [self.text_block(b, f"{where}.content[{j}]") for j, b in enumerate(content)]
            return [{"role": "system", "content": "\n\n".join(texts)}]
        raise BadRequest(
            f"'{where}.role' must be 'user', 'assistant' or 'system', got {_kind(role)}"
        )

    def user(self, where: str, content: str | list[Any]) -> list[dict[str, Any]]:
        if isinstance(content, str):
            return [{"role": "user", "content": content}]
        results: list[dict[str, Any]] = []
        # The user message's parts, in order: the tool results' images first (a tool
        # message carries text only), then the message's own text and images.
        images: list[dict[str, Any]] = []
        parts: list[str | dict[str, Any]] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = _block_type(block, at)
            if kind == "text":
                parts.append(self.text_block(block, at))
            elif kind == "image":
                parts.append(self.image(block, at))
            elif kind == "tool_result":
                results.append(self.tool_result(block, at, images))
            elif kind in ("tool_use", *_THINKING_BLOCKS):
                raise BadRequest(f"{at}: {kind} blocks belong in assistant messages")
            else:
                raise _unsupported(kind, at)
        texts = [part for part in parts if isinstance(part, str)]
        if images or len(texts) < len(parts):
            results.append({"role": "user", "content": content_parts([*images, *parts], "\n\n")})
        elif texts or not results:
            # tool messages first: they answer the assistant message right before this one
            results.append({"role": "user", "content": "\n\n".join(texts)})
        return results

    def image(self, block: dict[str, Any], at: str) -> dict[str, Any]:
        """An ``image`` block as a Chat Completions ``image_url`` part."""
        source = block.get("source")
        if not isinstance(source, dict):
            raise BadRequest(f"'{at}.source' must be an object, got {_kind(source)}")
        kind = source.get("type")
        if kind == "base64":
            url = data_url(source.get("media_type"), source.get("data"), f"{at}.source")
        elif kind == "url":
            url = checked_url(source.get("url"), f"{at}.source.url")
        elif kind == "file":
            raise BadRequest(
                f"'{at}.source' is a file source: file IDs (Anthropic's Files API) are not "
                "supported through this proxy; send the image as base64 data or a URL"
            )
        else:
            raise BadRequest(f"'{at}.source.type' must be 'base64' or 'url', got {_kind(kind)}")
        if self.image_at is None:
            self.image_at = at
        return dict(image_part(url))

    def assistant(self, where: str, content: str | list[Any]) -> dict[str, Any]:
        if isinstance(content, str):
            return {"role": "assistant", "content": content}
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = _block_type(block, at)
            if kind == "text":
                texts.append(self.text_block(block, at))
            elif kind == "tool_use":
                calls.append(_tool_call(block, at))
            elif kind in _THINKING_BLOCKS:
                continue  # the engine cannot take thinking back (documented)
            elif kind in ("tool_result", "image"):
                raise BadRequest(f"{at}: {kind} blocks belong in user messages")
            else:
                raise _unsupported(kind, at)
        out: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts)}
        if calls:
            out["tool_calls"] = calls
        return out

    def tool_result(
        self, block: dict[str, Any], at: str, images: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The ``tool`` message of a ``tool_result``; its images are added to ``images``."""
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str) or not call_id:
            raise BadRequest(f"'{at}.tool_use_id' must be a non-empty string, got {_kind(call_id)}")
        is_error = block.get("is_error")
        if is_error is not None and not isinstance(is_error, bool):
            raise BadRequest(f"'{at}.is_error' must be true or false, got {_kind(is_error)}")
        content = block.get("content")
        parts: list[str] = []
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for k, part in enumerate(content):
                inner = f"{at}.content[{k}]"
                kind = _block_type(part, inner)
                if kind == "text":
                    parts.append(self.text_block(part, inner))
                elif kind == "image":
                    images.append(self.image(part, inner))
                elif kind == "tool_reference":
                    name = part.get("tool_name")
                    if not isinstance(name, str) or not name:
                        raise BadRequest(
                            f"'{inner}.tool_name' must be a non-empty string, got {_kind(name)}"
                        )
                    self.loaded.setdefault(name, inner)
                    parts.append(f"Tool {name} is now available.")
                else:
                    raise _unsupported(kind, inner)
        elif content is not None:
            raise BadRequest(
                f"'{at}.content' must be a string or an array of blocks, got {_kind(content)}"
            )
        text = "\n\n".join(parts)
        if is_error:
            text = f"Error: {text}" if text else "Error"
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def text_block(self, block: Any, at: str) -> str:
        kind = _block_type(block, at)
        if kind != "text":
            if kind in _UNSUPPORTED_BLOCKS:
                raise _unsupported(kind, at)
            raise BadRequest(f"{at}: only text blocks are allowed here, got {shown(kind)}")
        text = block.get("text")
        if not isinstance(text, str):
            raise BadRequest(f"'{at}.text' must be a string, got {_kind(text)}")
        return text

    def tools(self, tools: Any) -> list[dict[str, Any]]:
        if tools is None:
            return []
        if not isinstance(tools, list):
            raise BadRequest(f"'tools' must be an array, got {_kind(tools)}")
        out: list[dict[str, Any]] = []
        names: set[str] = set()
        for i, tool in enumerate(tools):
            at = f"tools[{i}]"
            if not isinstance(tool, dict):
                raise BadRequest(f"'{at}' must be an object, got {_kind(tool)}")
            kind = tool.get("type")
            if kind not in (None, "custom"):
                raise BadRequest(
                    f"{at}: server tool {shown(kind)} is not supported through this proxy "
                    "(the engine cannot run it); only custom tools are"
                )
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                raise BadRequest(f"'{at}.name' must be a non-empty string, got {_kind(name)}")
            if name in names:
                raise BadRequest(f"{at}: tool name {shown(name)} is used twice")
            names.add(name)
            schema = tool.get("input_schema")
            if not isinstance(schema, dict):
                raise BadRequest(f"'{at}.input_schema' must be an object, got {_kind(schema)}")
            description = tool.get("description")
            if description is not None and not isinstance(description, str):
                raise BadRequest(f"'{at}.description' must be a string, got {_kind(description)}")
            defer = tool.get("defer_loading")
            if defer is not None and not isinstance(defer, bool):
                raise BadRequest(f"'{at}.defer_loading' must be true or false, got {_kind(defer)}")
            strict = tool.get("strict")
            if strict is not None and not isinstance(strict, bool):
                raise BadRequest(f"'{at}.strict' must be true or false, got {_kind(strict)}")
            examples = tool.get("input_examples")
            if examples is not None and not isinstance(examples, list):
                raise BadRequest(f"'{at}.input_examples' must be an array, got {_kind(examples)}")
            if defer and name not in self.loaded:
                continue  # not loaded by a tool_reference yet: the model does not see it
            if examples:
                lines = "\n".join(_json(example, f"{at}.input_examples") for example in examples)
                description = f"{description or ''}\n\nInput examples:\n{lines}".lstrip()
            function: dict[str, Any] = {"name": name}
            if description is not None:
                function["description"] = description
            function["parameters"] = schema
            if strict is not None:
                function["strict"] = strict
            out.append({"type": "function", "function": function})
        self.offered = names
        return out

    def check_references(self) -> None:
        for name, at in self.loaded.items():
            if name not in self.offered:
                raise BadRequest(
                    f"{at}: tool_reference names {shown(name)}, which is not in 'tools'"
                )


def _tool_call(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = block.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise BadRequest(f"'{at}.id' must be a non-empty string, got {_kind(call_id)}")
    name = block.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"'{at}.name' must be a non-empty string, got {_kind(name)}")
    arguments = block.get("input")
    if not isinstance(arguments, dict):
        raise BadRequest(f"'{at}.input' must be an object, got {_kind(arguments)}")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": _json(arguments, f"{at}.input")},
    }


def _tool_choice(choice: Any, tools: list[dict[str, Any]], chat: dict[str, Any]) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict):
        raise BadRequest(f"'tool_choice' must be an object, got {_kind(choice)}")
    kind = choice.get("type")
    names = [tool["function"]["name"] for tool in tools]
    value: Any
    if kind == "auto":
        value = "auto"
    elif kind == "any":
        value = "required"
    elif kind == "none":
        value = "none"
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"'tool_choice.name' must be a non-empty string, got {_kind(name)}")
        if name not in names:
            raise BadRequest(f"'tool_choice.name' {shown(name)} is not one of the tools offered")
        value = {"type": "function", "function": {"name": name}}
    else:
        raise BadRequest(
            f"'tool_choice.type' must be 'auto', 'any', 'tool' or 'none', got {_kind(kind)}"
        )
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequest(
            f"'tool_choice.disable_parallel_tool_use' must be true or false, got {_kind(parallel)}"
        )
    if not tools:
        if kind in ("any", "tool"):
            raise BadRequest(f"'tool_choice' of type {shown(kind)} needs 'tools'")
        return  # auto or none without tools: nothing to choose from (engines refuse it)
    chat["tool_choice"] = value
    if parallel:
        chat["parallel_tool_calls"] = False


def _stop_sequences(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise BadRequest(f"'stop_sequences' must be an array of strings, got {_kind(value)}")
    return tuple(value)


def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise BadRequest(f"'output_config' must be an object, got {_kind(config)}")
    where, fmt = "output_config.format", (config or {}).get("format")
    if fmt is None:
        where, fmt = "output_format", body.get("output_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise BadRequest(f"'{where}' must be an object of type 'json_schema', got {_kind(fmt)}")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise BadRequest(f"'{where}.schema' must be an object, got {_kind(schema)}")
    return {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }


def _block_type(block: Any, at: str) -> str:
    if not isinstance(block, dict):
        raise BadRequest(f"'{at}' must be a content block object, got {_kind(block)}")
    kind = block.get("type")
    if not isinstance(kind, str) or not kind:
        raise BadRequest(f"'{at}.type' must be a non-empty string, got {_kind(kind)}")
    return kind


def _unsupported(kind: str, at: str) -> BadRequest:
    if kind in _UNSUPPORTED_BLOCKS:
        return BadRequest(f"{at}: {kind} blocks are not supported through this proxy")
    if kind in ("tool_reference",):
        return BadRequest(f"{at}: tool_reference blocks belong in tool_result content")
    return BadRequest(f"{at}: unknown content block type {shown(kind)}")


def _json(value: Any, at: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except RecursionError:
        raise BadRequest(f"'{at}' nests too deeply") from None
    except ValueError as exc:  # e.g. a NaN the standard parser let through
        raise BadRequest(f"'{at}' cannot be written as JSON: {exc}") from None


# --------------------------------------------------------------------------- replies


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


# --------------------------------------------------------------------------- errors

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


# --------------------------------------------------------------------------- observing


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
            call_id = block.get("id")
            if isinstance(call_id, str) and call_id and call_id not in outcome.tool_call_ids:
                outcome.tool_call_ids.append(call_id)
            outcome.saw_tool(block.get("name"))


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


# --------------------------------------------------------------------------- helpers


def _event(model: BaseModel) -> bytes:
    data = _dump(model)
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


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


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int:
    """A token count, or 0 for anything that is not one."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
    return value if ok else 0


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


if TYPE_CHECKING:  # mypy checks that the classes give what the dataplane expects

    def _conforms(request: MessagesRequest) -> tuple[Translated, StreamTranslator]:
        return request, request.stream_translator()
