"""Messages requests: checked and translated to Chat Completions (``parse``)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from luftpause.dataplane.apis.images import checked_url, content_parts, data_url, image_part
from luftpause.dataplane.errors import BadRequest, shown
from luftpause.dataplane.request import kind_of as _kind
from luftpause.dataplane.request import parse_object

if TYPE_CHECKING:
    from luftpause.dataplane.apis import StreamTranslator, Translated
from luftpause.dataplane.apis._shared import is_int as _is_int
from luftpause.dataplane.apis.messages.reply import message_of
from luftpause.dataplane.apis.messages.stream import MessagesStream

log = logging.getLogger("luftpause.dataplane.apis.messages")


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
        return message_of(completion, self.model, self.stop_sequences)

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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


if TYPE_CHECKING:  # mypy checks that the classes give what the dataplane expects

    def _conforms(request: MessagesRequest) -> tuple[Translated, StreamTranslator]:
        return request, request.stream_translator()
