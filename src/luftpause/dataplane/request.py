"""A turn's request, checked before it asks for admission.

Every field the proxy reads or rewrites is validated here, so nothing after
admission can fail on the client's input: a malformed field is a 400 naming it
and the turn never takes a slot. Fields the proxy neither reads nor rewrites
are the engine's business and pass through untouched.

The body the engine gets is the client's bytes. When the proxy must add a
top-level field (usage for its reports, a per-class ``priority``) it splices the
member in before the closing brace instead of re-serialising the body; only a
client ``stream_options`` object that lacks ``include_usage`` forces a
re-serialisation, and that happens here, before admission, where a body nested
too deeply for it is still a plain 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import orjson

from luftpause.dataplane.errors import BadRequest, shown


@dataclass(frozen=True)
class ChatRequest:
    """What the proxy needs of a ``/v1/chat/completions`` body."""

    body: dict[str, Any]  # parsed: identity reads echoed tool_call_ids from it
    model: str
    stream: bool
    hide_usage: bool  # the proxy asked for usage the client did not: withhold that chunk
    has_priority: bool  # the client set its own priority: the engine keeps it
    engine_body: bytes  # what the engine gets, before a class priority is added

    def for_model(self, model: str) -> ChatRequest:
        """The request for the model that serves it (an alias's target, B9); the engine
        body is rewritten here, before admission, where a failure is still a 400."""
        if model == self.model:
            return self
        return replace(self, engine_body=with_members(self.engine_body, {"model": model}))

    def engine_body_for(
        self, priority: int | None, vllm_xargs: dict[str, Any] | None = None
    ) -> bytes:
        """The engine body, with a ``priority`` member added (only when the client set
        none) and a ``vllm_xargs`` one (B8's retention hint, only when the client sent
        none); splicing cannot fail."""
        members: dict[str, Any] = {}
        if priority is not None:
            members["priority"] = priority
        if vllm_xargs is not None:
            members["vllm_xargs"] = vllm_xargs
        if not members:
            return self.engine_body
        return splice(self.engine_body, members)


@dataclass(frozen=True)
class DecideRequest:
    """What the proxy needs of a ``/v1/decide`` body."""

    body: dict[str, Any]
    model: str | None  # None: the first single-pass model

    def engine_body(self, model: str) -> bytes:
        """The body the classifier gets: the client's, with the model it was routed by."""
        try:
            return json.dumps({**self.body, "model": model}).encode()
        except RecursionError:
            raise BadRequest("request body nests too deeply") from None


def parse_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or ``BadRequest`` saying why not.

    ``orjson`` reads it; what it refuses (deep nesting, integers past 64 bits, lone
    surrogates, invalid JSON) goes to the standard library's parser, which decides
    and words the error, so the bodies accepted are the ones ``json`` accepts."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _parse_object_slowly(raw)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _parse_object_slowly(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not UTF-8: byte {exc.start} is invalid") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise BadRequest("request body nests too deeply") from None
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def chat_request(raw: bytes) -> ChatRequest:
    body = parse_object(raw)
    model = _model(body.get("model"), required=True)
    assert model is not None
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("'messages' is required and must be a list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"'messages[{i}]' must be an object, got {kind_of(message)}")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, got {kind_of(stream)}")
    priority = body.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise BadRequest(f"'priority' must be an integer, got {kind_of(priority)}")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest(f"'stream_options' must be an object, got {kind_of(options)}")
        include = options.get("include_usage")
        if include is not None and not isinstance(include, bool):
            raise BadRequest(
                f"'stream_options.include_usage' must be true or false, got {kind_of(include)}"
            )

    engine_body = raw
    hide_usage = False
    if stream and not (options and options.get("include_usage")):
        # Ask the engine for usage for our reports; the client will not see the extra chunk.
        hide_usage = True
        if "stream_options" not in body:
            engine_body = splice(raw, {"stream_options": {"include_usage": True}})
        else:  # replace the client's member (null, or without include_usage): no duplicate key
            rewritten = {**body, "stream_options": {**(options or {}), "include_usage": True}}
            try:
                engine_body = json.dumps(rewritten).encode()
            except RecursionError:
                raise BadRequest("request body nests too deeply") from None
    return ChatRequest(
        body=body,
        model=model,
        stream=bool(stream),
        hide_usage=hide_usage,
        has_priority="priority" in body,
        engine_body=engine_body,
    )


def decide_request(raw: bytes) -> DecideRequest:
    body = parse_object(raw)
    if "input" not in body:
        raise BadRequest("'input' is required (a string or a list of strings)")
    return DecideRequest(body=body, model=_model(body.get("model"), required=False))


def _model(value: Any, *, required: bool) -> str | None:
    if value is None or (value == "" and not required):
        if required:
            raise BadRequest("'model' is required and must be a string")
        return None
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'model' must be a non-empty string, got {kind_of(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"'model' is not valid Unicode: {shown(value)}") from None
    return value


def dumps(body: dict[str, Any]) -> bytes:
    """A body the proxy built, as JSON (``orjson``; the standard library for what it
    refuses, such as integers past 64 bits)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        pass
    try:
        return json.dumps(body).encode()
    except RecursionError:
        raise BadRequest("request body nests too deeply") from None


def with_members(raw: bytes, members: dict[str, Any]) -> bytes:
    """``raw`` (a JSON object already parsed once) with ``members`` set, whether or not
    it had them: re-serialised."""
    return dumps({**parse_object(raw), **members})


def splice(raw: bytes, members: dict[str, Any]) -> bytes:
    """``raw`` (a JSON object that has none of ``members``' keys) with ``members``
    added before its closing brace; the client's bytes are otherwise kept."""
    body = raw.rstrip()
    assert body.endswith(b"}"), "splice needs a JSON object"
    added = json.dumps(members)[1:-1].encode()
    inner = body[:-1].rstrip()
    sep = b"" if inner.endswith(b"{") else b", "
    return inner + sep + added + b"}"


def kind_of(value: Any) -> str:
    """A value's JSON type, and the value itself when short (error messages)."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    for t, name in names.items():
        if isinstance(value, t):
            return f"{name} {shown(value, 32)}" if t in (str, bool) else name
    return f"a number {shown(value, 32)}"
