"""Responses requests: checked and translated to Chat Completions (``parse``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import pydantic
from openai.types.responses import (
    Response,
)

from luftpause.dataplane.apis import StreamTranslator, Translated
from luftpause.dataplane.apis.images import checked_detail, checked_url, content_parts, image_part
from luftpause.dataplane.apis.responses.reply import (
    Replies,
    _dump,
    _Tool,
)
from luftpause.dataplane.apis.responses.stream import ResponsesStream
from luftpause.dataplane.errors import BadRequest, shown
from luftpause.dataplane.request import kind_of as _kind
from luftpause.dataplane.request import parse_object

# Hosted tools Codex offers in every request: dropped (the model is not offered them).
DROPPED_TOOLS = frozenset(
    {"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11"}
)


# Request members that need state the proxy does not keep.
STATEFUL = ("previous_response_id", "conversation", "prompt")


# A custom tool's grammar is shown to the model in the ``input`` description up to this size.
GRAMMAR_SHOWN_CHARS = 4000


_QUALIFIER = "__"  # <namespace>__<name>, for a tool whose name another tool also has


@dataclass(frozen=True)
class ResponsesRequest(Replies):
    """A checked Responses request: ``chat`` is its Chat Completions body."""

    model: str
    stream: bool
    chat: dict[str, Any]
    tools: dict[str, _Tool]  # chat function name -> the client's tool
    template: Response  # the request's echo fields (tools, tool_choice, ...), no output
    image_at: str | None = None  # where the first input_image part is, if there is one

    def stream_translator(self) -> ResponsesStream:
        return ResponsesStream(self)


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


if TYPE_CHECKING:  # the module gives what the dataplane expects (apis/__init__.py)
    _request_check: type[Translated] = ResponsesRequest
    _stream_check: type[StreamTranslator] = ResponsesStream
