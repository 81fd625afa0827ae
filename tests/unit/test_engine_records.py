"""The engine model's records (H1, B1), in whichever build is installed: the pure source,
or the engine model compiled by mypyc with the scheduling core (``make test-compiled``,
docs/development "The compiled core").

The engine model's records are dataclasses with a hand-written ``__init__``, as the
core's are (``scheduler/core/types.py`` says why): it must take the record's fields in
order with their defaults, a frozen record must stay frozen, hashed and compared by
value, and a mutable one compared by value (``StepTally``) or by identity (the model's
own ``_Req``), in both builds. A field added to a record and not to its ``__init__``,
or two swapped fields, fails here. (The pattern of tests/unit/test_core_records.py.)
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from _records import check_fields_in_order, check_frozen_value, field_names

from luftpause.fakes.engine import blocks, model, results, script, tokens

MODULES = [blocks, model, results, script, tokens]
RECORDS: list[type] = [
    obj
    for mod in MODULES
    for obj in vars(mod).values()
    if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == mod.__name__
]
ENUMS = {
    cls.__name__: cls
    for mod in MODULES
    for cls in vars(mod).values()
    if isinstance(cls, type) and issubclass(cls, Enum) and cls is not Enum
}

# Fields as written in the source (compiled, ``dataclasses.fields`` gives bare runtime
# types), and which records the source declares frozen.
SOURCE = Path(__file__).resolve().parents[2] / "src" / "luftpause" / "fakes" / "engine"
CLASSES = {
    (path.stem, node.name): node
    for path in SOURCE.glob("*.py")
    for node in ast.parse(path.read_text()).body
    if isinstance(node, ast.ClassDef)
}
ANNOTATIONS = {
    key: [
        (ast.unparse(s.target), ast.unparse(s.annotation))
        for s in node.body
        if isinstance(s, ast.AnnAssign)
    ]
    for key, node in CLASSES.items()
}
FROZEN = {key for key, node in CLASSES.items() if "frozen=True" in ast.unparse(node.decorator_list)}


def _key(cls: type) -> tuple[str, str]:
    return cls.__module__.rsplit(".", 1)[1], cls.__qualname__


def _value(ann: str, i: int, variant: bool) -> Any:
    """A value of the annotated type, distinct per field index ``i``; ``variant`` another.
    (Whole numbers are multiples of 4 from 100 up: valid ``EngineParams`` throughout.)"""
    v = int(variant)
    if ann.endswith(" | None"):
        return _value(ann.removesuffix(" | None"), i, variant) if variant else None
    if ann == "str":
        return f"f{i}" + "!" * v
    if ann == "int":
        return 100 + 8 * i + 4 * v
    if ann == "float":
        return i + 0.5 + v
    if ann == "bool":
        return variant
    if ann in ENUMS:
        return list(ENUMS[ann])[v]
    if ann in ("tuple[str, ...]", "tuple[int, ...]"):
        item = f"f{i}" if ann == "tuple[str, ...]" else i
        return (item,) * (1 + v)
    if ann == "tuple[tuple[str, float], ...]":
        return ((f"f{i}", 0.5),) * (1 + v)
    if ann in ("RequestTiming", "BlockPrompt", "ToolCall", "EngineRequest"):
        return sample(RECORD[ann], 0 if variant else -1)
    if ann in ("tuple[FinishedRequest, ...]", "tuple[ToolCall, ...]"):
        return (sample(RECORD[ann[6:-6]]),) * (1 + v)
    raise AssertionError(f"no test value for a field of type {ann!r}: add one here")


RECORD = {cls.__name__: cls for cls in RECORDS}


def values(cls: type, vary: int = -1) -> list[Any]:
    """One value per field of ``cls``, in order; field number ``vary`` gets its variant."""
    fields = ANNOTATIONS[_key(cls)]
    assert [name for name, _ in fields] == field_names(cls)
    return [_value(ann, i, i == vary) for i, (_, ann) in enumerate(fields)]


def sample(cls: type, vary: int = -1) -> Any:
    return cls(*values(cls, vary))


def test_every_record_of_the_engine_model_is_found() -> None:
    """H1: the records below are all the engine model's dataclasses."""
    names = {cls.__name__ for cls in RECORDS}
    assert {"EngineParams", "EngineRequest", "StepResult", "StepTally", "_Req"} <= names
    assert {"BlockPrompt", "ReplyPlan", "ToolCall", "ScriptOptions", "TextHash"} <= names
    assert len(RECORDS) >= 14
    assert {_key(cls) for cls in RECORDS} >= FROZEN and len(FROZEN) >= 11


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_a_record_takes_its_fields_in_order_with_their_defaults(cls: type) -> None:
    """H1: a record's ``__init__`` is its dataclass ``__init__``: fields in order, by
    position or by name, each one stored where it belongs, defaults as declared."""
    built = check_fields_in_order(cls, values)
    assert not hasattr(built, "__dict__")


@pytest.mark.parametrize("cls", [c for c in RECORDS if _key(c) in FROZEN], ids=lambda c: c.__name__)
def test_a_frozen_record_is_frozen_hashed_and_compared_by_value(cls: type) -> None:
    """H1: results and parameters are immutable values: no field can be assigned or
    deleted (nor a new attribute added), two records built alike are equal with equal
    hashes, one differing in any field is not equal, and the repr is the dataclass's;
    ``dataclasses.replace`` builds a changed copy."""
    a = check_frozen_value(cls, values)
    for vary, name in enumerate(field_names(cls)):
        changed = sample(cls, vary)
        assert dataclasses.replace(a, **{name: getattr(changed, name)}) == changed


def test_engine_params_are_checked_however_they_are_built() -> None:
    """H1: ``EngineParams`` refuses a bad value built directly, by name, or by
    ``replace`` (its hand-written ``__init__`` runs the checks)."""
    params = model.EngineParams()
    with pytest.raises(ValueError, match="kv_tokens"):
        model.EngineParams(63)
    with pytest.raises(ValueError, match="block_chars"):
        model.EngineParams(block_chars=30)
    with pytest.raises(ValueError, match="time_scale"):
        params.scaled(0.0)
    with pytest.raises(ValueError, match="decode_seq_s"):
        dataclasses.replace(params, decode_seq_s=-1.0)
    assert params.scaled(2.0).time_scale == 2.0


def test_mutable_records_compare_as_before() -> None:
    """H1: ``StepTally`` is compared by value (the simulator copies it with
    ``replace``); the model's ``_Req`` by identity (two are never the same request)."""
    a = results.StepTally(1, 2.0, 1.0, 3, 4)
    b = dataclasses.replace(a)
    assert a == b and a is not b
    b.steps += 1
    assert a != b
    x, y = sample(model._Req), sample(model._Req)
    assert x != y and x == x


def test_the_engine_model_is_all_compiled_or_all_pure_and_the_build_asked_for() -> None:
    """H1, B1: either every module of the engine model is a mypyc extension or none is,
    as for the scheduling core (whose build it follows). ``make test-compiled`` sets
    ``LUFTPAUSE_EXPECT_CORE=compiled`` so that its run fails if the pure source was
    loaded instead."""
    compiled = {m.__name__: not str(m.__file__).endswith(".py") for m in MODULES}
    assert len(set(compiled.values())) == 1, compiled
    core = importlib.import_module("luftpause.scheduler.core.state")
    assert set(compiled.values()) == {core.COMPILED}, compiled
    expected = os.environ.get("LUFTPAUSE_EXPECT_CORE", "")
    if expected:
        assert expected in ("compiled", "pure"), expected
        assert ("compiled" if core.COMPILED else "pure") == expected, compiled
