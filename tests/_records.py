"""Checks of a record class with a hand-written ``__init__`` against its dataclass
declaration, shared by the core's records (tests/unit/test_core_records.py) and the engine
model's (tests/unit/test_engine_records.py): each of those modules says how to make a
value for each field, these say what a record must do with them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

# One value per field of a class, in order; field number ``vary`` gets its variant (-1: none).
Values = Callable[[type, int], list[Any]]


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    assert f.default_factory is not dataclasses.MISSING, f.name
    return f.default_factory()


def check_fields_in_order(cls: type, values: Values) -> Any:
    """``cls(...)`` takes its fields in order, by position or by name, stores each where it
    belongs, and fills the declared defaults; returns a record built from the required
    fields alone."""
    names = field_names(cls)
    for vary in range(-1, len(names)):
        vals = values(cls, vary)
        by_position = cls(*vals)
        by_name = cls(**dict(zip(names, vals, strict=True)))
        for name, v in zip(names, vals, strict=True):
            assert getattr(by_position, name) == v, (vary, name)
            assert getattr(by_name, name) == v, (vary, name)
    required = {
        f.name: v
        for f, v in zip(dataclasses.fields(cls), values(cls, -1), strict=True)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    built = cls(**required)
    for f in dataclasses.fields(cls):
        expected = required[f.name] if f.name in required else field_default(f)
        assert getattr(built, f.name) == expected, f.name
    return built


def check_frozen_value(cls: type, values: Values) -> Any:
    """A record of ``cls`` is an immutable value: no field can be assigned or deleted (nor
    a new attribute added), two built alike are equal with equal hashes, one differing in
    any field is not equal, and the repr is the dataclass's; returns the record."""
    a, b = cls(*values(cls, -1)), cls(*values(cls, -1))
    assert a is not b and a == b and hash(a) == hash(b)
    names = field_names(cls)
    for name in names:
        before = getattr(a, name)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(a, name, before)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(a, name)
        assert getattr(a, name) == before
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        a.not_a_field = 1
    for vary in range(len(names)):
        assert a != cls(*values(cls, vary)), names[vary]
    shown = ", ".join(f"{f.name}={getattr(a, f.name)!r}" for f in dataclasses.fields(cls) if f.repr)
    assert repr(a) == f"{cls.__qualname__}({shown})"
    return a
