"""Tool-call hygiene (R6): make a model's tool call fit the tool, or refuse it clearly.

Small models get tool calls wrong in a few typical ways, and each has a fix here:

* **Scalars as strings** (``{"limit": "3"}``): :func:`coerce_arguments` converts a
  value to the scalar type the tool's input schema names, when the conversion
  is exact ("3" -> 3, "2.5" -> 2.5, "true" -> True, 7 -> "7"). Nothing else is
  changed: a value that does not convert exactly is left alone for the
  validator to refuse.
* **Calls that do not fit** (missing fields, wrong types, the schema itself
  passed as arguments): :func:`check_call` validates with a real JSON Schema
  validator (``jsonschema``) and, on failure, returns a refusal that tells the
  model what went wrong *and* the expected shape, so its next turn can fix it.
  A call that does not fit is never executed.
* **Tools whose input schema is itself invalid**: :func:`compile_schema` checks
  the schema against its dialect's meta-schema once, when the tool list is
  loaded (a jsonschema validator does not check its own schema: an invalid one
  either raises something unexpected at the first call or quietly lets
  everything through). Such a tool is listed as unusable with the reason, and
  every call to it is refused with that reason.
* **Calls written as text** (Llama 3: ``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``, several separated by ``;``):
  :func:`recover_text_tool_calls` turns such a reply into structured calls, but
  only when every call names an offered tool, so a JSON answer is never mistaken
  for a call.

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_SPECIAL_TOKENS = ("<|python_tag|>", "<|eom_id|>", "<|eot_id|>", "<|end_of_text|>")
_FENCE_RE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```$", re.DOTALL)


@dataclass(frozen=True)
class TextToolCall:
    """A tool call recovered from a text reply."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CallCheck:
    """Outcome of :func:`check_call`: fitted arguments, or a refusal for the model."""

    arguments: dict[str, Any] | None  # None when refused
    refusal: str | None  # the tool message the model sees instead of a result

    @property
    def ok(self) -> bool:
        return self.refusal is None


# --------------------------------------------------------------------------- coercion


def _types_of(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    return []


def _coerce_scalar(value: Any, kinds: Sequence[str]) -> Any:
    """``value`` converted exactly to the first of ``kinds`` it fits; else unchanged."""
    if not kinds:
        return value
    # Already of an allowed type: leave it (bool is not an integer here, as in JSON).
    if isinstance(value, bool):
        if "boolean" in kinds:
            return value
    elif isinstance(value, int):
        if "integer" in kinds or "number" in kinds:
            return value
    elif isinstance(value, float):
        if "number" in kinds:
            return value
        if "integer" in kinds and math.isfinite(value) and value.is_integer():
            return int(value)
    elif isinstance(value, str):
        if "string" in kinds:
            return value
    elif value is None and "null" in kinds:
        return value
    for kind in kinds:
        converted = _convert(value, kind)
        if converted is not _NO:
            return converted
    return value


class _NoConversion:
    pass


_NO: Any = _NoConversion()


def _convert(value: Any, kind: str) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if kind == "integer":
            if _INT_RE.match(text):
                return int(text)
            if _FLOAT_RE.match(text):
                number = float(text)
                if math.isfinite(number) and number.is_integer():
                    return int(number)
            return _NO
        if kind == "number":
            if _INT_RE.match(text):
                return int(text)
            if _FLOAT_RE.match(text):
                number = float(text)
                return number if math.isfinite(number) else _NO
            return _NO
        if kind == "boolean":
            lowered = text.lower()
            if lowered == "true":
                return True
            if lowered == "false":
                return False
            return _NO
        if kind == "null":
            return None if text.lower() in ("null", "none") else _NO
        return _NO
    if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return _NO
        return str(value)
    if kind == "string" and isinstance(value, bool):
        return "true" if value else "false"
    if kind == "number" and isinstance(value, bool):
        return _NO
    return _NO


def coerce_value(value: Any, schema: Any) -> Any:
    """``value`` with every scalar converted to the type ``schema`` names (recursively)."""
    if not isinstance(schema, Mapping):
        return value
    kinds = _types_of(schema)
    if isinstance(value, dict) and (not kinds or "object" in kinds):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(props, Mapping) and key in props:
                out[key] = coerce_value(item, props[key])
            elif isinstance(extra, Mapping):
                out[key] = coerce_value(item, extra)
            else:
                out[key] = item
        return out
    if isinstance(value, list) and (not kinds or "array" in kinds):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [coerce_value(item, items) for item in value]
        return value
    if not kinds:
        # anyOf/oneOf of simple types: try each alternative's scalar types in order.
        alternatives = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(alternatives, list):
            flat = [k for alt in alternatives if isinstance(alt, Mapping) for k in _types_of(alt)]
            if flat and not isinstance(value, (dict, list)):
                return _coerce_scalar(value, flat)
        return value
    if isinstance(value, (dict, list)):
        return value
    return _coerce_scalar(value, kinds)


def coerce_arguments(arguments: Mapping[str, Any], schema: Any) -> dict[str, Any]:
    """Top-level entry: the arguments object coerced per the tool's input schema."""
    result = coerce_value(dict(arguments), schema)
    return result if isinstance(result, dict) else dict(arguments)


# --------------------------------------------------------------------------- validation


def _describe(schema: Any, depth: int = 0) -> str:
    """A compact, model-readable description of a schema's shape."""
    if not isinstance(schema, Mapping):
        return "any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    kinds = _types_of(schema)
    if not kinds:
        alternatives = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(alternatives, list) and alternatives:
            return " or ".join(_describe(a, depth) for a in alternatives)
        if "properties" in schema:
            kinds = ["object"]
        else:
            return "any"
    if "object" in kinds and depth < 3:
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required = schema.get("required")
        required_set = set(required) if isinstance(required, list) else set()
        parts = []
        for name, sub in props.items():
            need = "required" if name in required_set else "optional"
            parts.append(f"{json.dumps(name)}: {_describe(sub, depth + 1)} ({need})")
        return "{" + ", ".join(parts) + "}"
    if "array" in kinds and depth < 3:
        return f"array of {_describe(schema.get('items'), depth + 1)}"
    text = "/".join(kinds)
    bounds = []
    for key, label in (("minimum", ">="), ("maximum", "<="), ("minLength", "length >=")):
        if key in schema:
            bounds.append(f"{label} {schema[key]}")
    if "maxLength" in schema:
        bounds.append(f"length <= {schema['maxLength']}")
    return text + (f" {', '.join(bounds)}" if bounds else "")


def expected_shape(schema: Any) -> str:
    return _describe(schema if isinstance(schema, Mapping) else {"type": "object"})


@dataclass(frozen=True)
class CompiledSchema:
    """A tool's input schema, checked and ready to validate calls (build it once per tool)."""

    schema: Mapping[str, Any]
    validator: Any  # a jsonschema validator; None when the schema is unusable
    problem: str | None  # why the schema cannot be used, or None
    shape: str  # the expected arguments, as refusals describe them

    @property
    def usable(self) -> bool:
        return self.problem is None


def _schema_error_text(exc: SchemaError) -> str:
    where = "/".join(str(p) for p in exc.absolute_path)
    return f"{where}: {exc.message}" if where else exc.message


def compile_schema(schema: Any) -> CompiledSchema:
    """Check ``schema`` against its dialect's meta-schema and build its validator.

    Not a mapping (absent) means "any object". A schema that is not valid JSON Schema, or
    that does not describe an object (MCP tools take an object of arguments), is unusable.
    """
    schema_map: Mapping[str, Any] = schema if isinstance(schema, Mapping) else {"type": "object"}
    shape = expected_shape(schema_map)
    try:
        cls: Any = jsonschema.validators.validator_for(
            schema_map, default=jsonschema.Draft202012Validator
        )
        cls.check_schema(schema_map)
        validator = cls(schema_map)
    except SchemaError as exc:
        return CompiledSchema(schema_map, None, _schema_error_text(exc), shape)
    except Exception as exc:  # e.g. a $schema the library cannot load
        return CompiledSchema(schema_map, None, f"{type(exc).__name__}: {exc}", shape)
    kinds = _types_of(schema_map)
    if "type" in schema_map and "object" not in kinds:
        problem = f"it describes {'/'.join(kinds) or 'no type'}, not an object of arguments"
        return CompiledSchema(schema_map, None, problem, shape)
    return CompiledSchema(schema_map, validator, None, shape)


@functools.lru_cache(maxsize=256)
def _compiled_from_json(text: str) -> CompiledSchema:
    return compile_schema(json.loads(text))


def _compiled(schema: Any) -> CompiledSchema:
    """For callers that pass a bare schema: compiled once per distinct schema (a meta-schema
    check costs milliseconds, validating a call microseconds)."""
    try:
        text = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return compile_schema(schema)
    return _compiled_from_json(text)


def unusable_refusal(name: str, problem: str) -> str:
    """What the model sees when it calls a tool whose input schema is unusable."""
    return (
        f"Error: tool {name!r} cannot be used: its input schema is invalid ({problem}), so "
        "the call was not made. Do not call this tool again; tell the user if you need it."
    )


def check_call(
    name: str, raw_arguments: Any, schema: Any, compiled: CompiledSchema | None = None
) -> CallCheck:
    """Parse, coerce and validate one call's arguments against the tool's input schema.

    ``raw_arguments`` is what the model sent: a JSON string (OpenAI wire form),
    a dict (text-recovered calls) or anything else (refused). ``compiled`` is the
    tool's :func:`compile_schema` of ``schema`` (built from ``schema`` if not given).
    A tool whose schema is unusable refuses every call, with the reason.
    """
    checked = compiled if compiled is not None else _compiled(schema)
    if checked.problem is not None:
        return CallCheck(None, unusable_refusal(name, checked.problem))
    shape = checked.shape
    if isinstance(raw_arguments, str):
        text = raw_arguments.strip() or "{}"
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            return CallCheck(
                None,
                f"Error: the arguments for tool {name!r} are not valid JSON ({exc.msg} at "
                f"position {exc.pos}), so the call was not made. Expected arguments: {shape}",
            )
    else:
        parsed = raw_arguments
    if parsed is None:
        parsed = {}
    if not isinstance(parsed, dict):
        return CallCheck(
            None,
            f"Error: the arguments for tool {name!r} must be a JSON object, got "
            f"{type(parsed).__name__}, so the call was not made. Expected arguments: {shape}",
        )
    arguments = coerce_arguments(parsed, checked.schema)
    try:
        errors = sorted(
            checked.validator.iter_errors(arguments), key=lambda e: list(e.absolute_path)
        )
    except Exception as exc:  # what the meta-schema cannot see, e.g. a $ref to nowhere
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        return CallCheck(
            None,
            f"Error: tool {name!r} has an input schema that cannot be checked ({reason}), so "
            "the call was not made.",
        )
    if errors:
        problems = []
        for err in errors[:5]:
            where = "/".join(str(p) for p in err.absolute_path)
            problems.append(f"{where}: {err.message}" if where else err.message)
        return CallCheck(
            None,
            f"Error: the arguments for tool {name!r} do not fit its input schema, so the "
            f"call was not made: {'; '.join(problems)}. Expected arguments: {shape}",
        )
    return CallCheck(arguments, None)


# --------------------------------------------------------------------------- text calls


def _strip_wrapping(text: str) -> str:
    out = text.strip()
    fence = _FENCE_RE.match(out)
    if fence:
        out = fence.group(1).strip()
    for token in _SPECIAL_TOKENS:
        out = out.replace(token, "")
    return out.strip()


def _as_call(obj: Any, offered: Sequence[str]) -> TextToolCall | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or name not in offered:
        fn = obj.get("function")
        if isinstance(fn, dict):  # {"type": "function", "function": {"name", "arguments"}}
            return _as_call(fn, offered)
        return None
    args = obj.get("parameters", obj.get("arguments", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None
    if set(obj) - {"name", "parameters", "arguments", "type"}:
        return None  # some other JSON object that happens to have a "name"
    return TextToolCall(name, args)


def recover_text_tool_calls(content: str | None, offered: Sequence[str]) -> list[TextToolCall]:
    """Tool calls written as text, or ``[]`` when ``content`` is not (only) tool calls."""
    if not content or not offered:
        return []
    text = _strip_wrapping(content)
    if not text or text[0] not in "{[":
        return []
    decoder = json.JSONDecoder()
    calls: list[TextToolCall] = []
    pos = 0
    while pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n;,":
            pos += 1
        if pos >= len(text):
            break
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return []
        items = obj if isinstance(obj, list) else [obj]
        for item in items:
            call = _as_call(item, offered)
            if call is None:
                return []
            calls.append(call)
        pos = end
    return calls
