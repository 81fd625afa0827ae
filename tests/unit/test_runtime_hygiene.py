"""R6: tool-call hygiene - coercion, validation with refusals, text tool calls."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from luftpause.runtime.hygiene import (
    check_call,
    coerce_arguments,
    compile_schema,
    recover_text_tool_calls,
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1},
        "limit": {"type": "integer", "minimum": 1, "maximum": 20},
        "ratio": {"type": "number"},
        "exact": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "integer"}},
        "maybe": {"type": ["integer", "null"]},
    },
    "required": ["query"],
}

names = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
json_scalars = st.one_of(
    st.integers(-1000, 1000),
    st.text(max_size=10),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
params = st.dictionaries(names, json_scalars, max_size=4)


@given(st.integers(1, 20), st.floats(-1e6, 1e6, allow_nan=False), st.booleans())
def test_scalars_written_as_strings_are_coerced(limit: int, ratio: float, exact: bool) -> None:
    """R6: "3" -> 3, "2.5" -> 2.5, "true" -> True, per the property's type; then it fits."""
    raw = {"query": "q", "limit": str(limit), "ratio": repr(ratio), "exact": str(exact).lower()}
    check = check_call("lookup", json.dumps(raw), SCHEMA)
    assert check.ok, check.refusal
    assert check.arguments == {"query": "q", "limit": limit, "ratio": ratio, "exact": exact}


@given(
    st.fixed_dictionaries(
        {"query": st.text(min_size=1, max_size=20)},
        optional={
            "limit": st.integers(1, 20),
            "exact": st.booleans(),
            "tags": st.lists(st.integers(), max_size=3),
        },
    )
)
def test_fitting_arguments_pass_unchanged(args: dict[str, Any]) -> None:
    """R6: a call that fits is executed exactly as the model sent it."""
    check = check_call("lookup", json.dumps(args), SCHEMA)
    assert check.ok and check.arguments == args


def test_nested_and_nullable_coercion() -> None:
    """R6: array items and type lists are coerced too; numbers become strings for strings."""
    out = coerce_arguments({"query": 42, "tags": ["1", "2"], "maybe": "7"}, SCHEMA)
    assert out == {"query": "42", "tags": [1, 2], "maybe": 7}
    assert coerce_arguments({"limit": "3.0", "maybe": "null"}, SCHEMA) == {
        "limit": 3,
        "maybe": None,
    }


@given(st.sampled_from(["many", "3.5", "", "1e400", "[1]"]))
def test_inexact_values_are_refused_with_the_expected_shape(limit: str) -> None:
    """R6: a value that does not convert exactly is refused, naming the field and the shape."""
    check = check_call("lookup", json.dumps({"query": "q", "limit": limit}), SCHEMA)
    assert not check.ok and check.arguments is None
    assert check.refusal is not None
    assert "limit" in check.refusal and "Expected arguments" in check.refusal
    assert '"query": string' in check.refusal and "(required)" in check.refusal


def test_other_refusals() -> None:
    """R6: bad JSON, a non-object, a missing field and the schema itself are all refused."""
    for raw in ("{not json", "[1, 2]", "{}", json.dumps(SCHEMA)):
        check = check_call("lookup", raw, SCHEMA)
        assert not check.ok and "lookup" in (check.refusal or ""), raw
        assert "Expected" in (check.refusal or "") or "expected" in (check.refusal or "")
    assert check_call("noargs", "", {"type": "object", "properties": {}}).arguments == {}


@given(
    st.lists(st.tuples(st.sampled_from(["lookup", "deep_search"]), params), min_size=1, max_size=3),
    st.booleans(),
    st.sampled_from(["; ", "\n", " "]),
)
def test_text_tool_calls_are_recovered(
    calls: list[tuple[str, dict[str, Any]]], tag: bool, sep: str
) -> None:
    """R6: Llama-3 text calls ({"name", "parameters"}, optional <|python_tag|>) are recovered."""
    text = sep.join(json.dumps({"name": n, "parameters": p}) for n, p in calls)
    if tag:
        text = "<|python_tag|>" + text + "<|eom_id|>"
    got = recover_text_tool_calls(text, ["lookup", "deep_search"])
    assert [(c.name, c.arguments) for c in got] == calls


def test_text_that_is_not_a_call_is_left_alone() -> None:
    """R6: prose, JSON answers and calls to tools not offered are not turned into calls."""
    offered = ["lookup"]
    assert recover_text_tool_calls("The answer is 42.", offered) == []
    assert recover_text_tool_calls('{"name": "Oslo", "population": 700000}', offered) == []
    assert recover_text_tool_calls('{"name": "rm", "parameters": {}}', offered) == []
    assert recover_text_tool_calls('{"name": "lookup", "parameters": {}} and more', offered) == []
    fenced = '```json\n{"name": "lookup", "arguments": "{\\"query\\": \\"x\\"}"}\n```'
    assert [c.arguments for c in recover_text_tool_calls(fenced, offered)] == [{"query": "x"}]


INVALID_SCHEMAS = [
    ({"type": "object", "properties": {"a": {"type": "strnig"}}}, "properties/a/type"),
    ({"type": "object", "properties": {"a": {"minimum": "x"}}}, "properties/a/minimum"),
    ({"type": 5}, "type"),
    ({"type": "object", "required": "a"}, "required"),
    ({"type": "object", "properties": {"a": {"pattern": "("}}}, "'regex'"),
    ({"type": "string"}, "not an object of arguments"),
]


@pytest.mark.parametrize(("schema", "where"), INVALID_SCHEMAS)
def test_a_tool_with_an_invalid_schema_is_unusable_and_refused(
    schema: dict[str, Any], where: str
) -> None:
    """R6: an input schema that is not valid JSON Schema (a jsonschema validator never checks
    its own schema: these used to crash the call or let anything through) makes the tool
    unusable; every call is refused with the reason, never executed."""
    compiled = compile_schema(schema)
    assert not compiled.usable and compiled.validator is None
    assert compiled.problem is not None and where in compiled.problem
    for raw in ('{"a": 3}', "{}", '{"a": "x"}'):
        check = check_call("broken", raw, schema)
        assert not check.ok and check.arguments is None
        assert check.refusal is not None
        assert "'broken' cannot be used: its input schema is invalid" in check.refusal
        assert compiled.problem in check.refusal
        assert check_call("broken", raw, schema, compiled).refusal == check.refusal


def test_a_schema_that_cannot_be_resolved_refuses_the_call() -> None:
    """R6: what the meta-schema cannot see (a $ref to nowhere) refuses the call, no crash."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}
    assert compile_schema(schema).usable
    check = check_call("lookup", '{"a": 1}', schema)
    assert not check.ok and "cannot be checked" in (check.refusal or "")
    assert "nope" in (check.refusal or "")


@pytest.mark.parametrize(
    "schema", [SCHEMA, {}, {"properties": {"q": {"type": "string"}}}, {"type": ["object", "null"]}]
)
def test_valid_schemas_are_usable(schema: dict[str, Any]) -> None:
    """R6: valid schemas (also without a type, as some servers send) stay usable."""
    compiled = compile_schema(schema)
    assert compiled.usable and compiled.problem is None and compiled.validator is not None
    assert check_call("lookup", '{"query": "q"}', schema, compiled).ok
