"""The core's records (STYLE "Tests by tier": unit), in whichever build is installed: the
pure source, or the core compiled by mypyc (``make test-compiled``, docs/development).

Every record is a frozen dataclass with a hand-written ``__init__`` (``types.py`` says
why): it must take the record's fields in order with their defaults, and the record must
stay frozen, hashed and compared by value, in both builds. ``decide`` builds its hottest
records through ``state.new_*`` (the end of ``state.py``); those must build exactly
what the constructors build. A field added to a record and not to its ``__init__`` or
its builder, or two swapped fields, fails here.

Values are typed (a compiled record refuses an ``object()`` where it expects a ``str``),
one distinct value per field, and each field is varied alone.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os
import pkgutil
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from _records import check_fields_in_order, check_frozen_value, field_names
from immutables import Map

import luftpause.scheduler.core as core
from luftpause.scheduler.core.events import RunSnapshot, TurnSnapshot
from luftpause.scheduler.core.state import (
    COMPILED,
    HeldTurn,
    ReplicaState,
    RunState,
    State,
    TurnState,
    new_held,
    new_replica,
    new_run,
    new_state,
    new_turn,
)
from luftpause.scheduler.core.types import EndpointKind, Params, ReplicaSpec

MODULES = [
    importlib.import_module(f"{core.__name__}.{name}")
    for name in sorted(m.name for m in pkgutil.iter_modules(core.__path__))
]
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

# Field annotations as written in the source (the reference for both builds: compiled,
# ``dataclasses.fields`` gives bare runtime types, ``int | None`` and ``Map[...]`` lost).
SOURCE = Path(__file__).resolve().parents[2] / "src" / "luftpause" / "scheduler" / "core"
ANNOTATIONS: dict[tuple[str, str], list[tuple[str, str]]] = {
    (path.stem, node.name): [
        (ast.unparse(s.target), ast.unparse(s.annotation))
        for s in node.body
        if isinstance(s, ast.AnnAssign)
    ]
    for path in SOURCE.glob("*.py")
    for node in ast.parse(path.read_text()).body
    if isinstance(node, ast.ClassDef)
}

BUILDERS: list[tuple[Callable[..., Any], type]] = [
    (new_state, State),
    (new_replica, ReplicaState),
    (new_run, RunState),
    (new_turn, TurnState),
    (new_held, HeldTurn),
]


def _value(ann: str, i: int, variant: bool) -> Any:
    """A value of the annotated type, distinct per field index ``i``; ``variant`` another."""
    v = int(variant)
    if ann.endswith(" | None"):
        return _value(ann.removesuffix(" | None"), i, variant) if variant else None
    if ann == "str":
        return f"f{i}" + "!" * v
    if ann == "int":
        return 10 * i + v
    if ann == "float":
        return i + 0.5 + v
    if ann == "bool":
        return variant
    if ann in ENUMS:
        return list(ENUMS[ann])[v]
    if ann == "frozenset[str]":
        return frozenset({f"f{i}"} | ({"x"} if variant else set()))
    if ann in ("tuple[str, ...]", "Lane"):
        return (f"f{i}",) + ("x",) * v
    if ann.startswith(("Map[", "Mapping[")):
        return Map({f"f{i}": i + v})
    if ann == "Params":
        return Params(turn_timeout_s=float(i + v))
    if ann == "ReplicaSpec":
        return ReplicaSpec(f"f{i}", EndpointKind.GENERATIVE, frozenset({"m"}), variant)
    if ann == "tuple[RunSnapshot, ...]":
        return (sample(RunSnapshot),) * (1 + v)
    if ann == "tuple[TurnSnapshot, ...]":
        return (sample(TurnSnapshot),) * (1 + v)
    raise AssertionError(f"no test value for a field of type {ann!r}: add one here")


def values(cls: type, vary: int = -1) -> list[Any]:
    """One value per field of ``cls``, in order; field number ``vary`` gets its variant."""
    fields = ANNOTATIONS[(cls.__module__.rsplit(".", 1)[1], cls.__qualname__)]
    assert [name for name, _ in fields] == field_names(cls)
    return [_value(ann, i, i == vary) for i, (_, ann) in enumerate(fields)]


def sample(cls: type, vary: int = -1) -> Any:
    return cls(*values(cls, vary))


def test_every_record_of_the_core_is_found() -> None:
    """S1: the records below are all the core's dataclasses (a module without any would
    leave its records untested)."""
    names = {cls.__name__ for cls in RECORDS}
    assert {"State", "Fifo", "Params", "TurnRequested", "Admit", "ReplicaSpec"} <= names
    assert len(RECORDS) >= 31


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_a_record_takes_its_fields_in_order_with_their_defaults(cls: type) -> None:
    """S1: a record's ``__init__`` is its dataclass ``__init__``: fields in order, by
    position or by name, each one stored where it belongs, defaults as declared."""
    check_fields_in_order(cls, values)


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_a_record_is_frozen_hashed_and_compared_by_value(cls: type) -> None:
    """S1: state and events are immutable values: no field can be assigned or deleted
    (nor a new attribute added), two records built alike are equal with equal hashes,
    one differing in any field is not equal, and the repr is the dataclass's."""
    a = check_frozen_value(cls, values)
    assert not hasattr(a, "__dict__")


@pytest.mark.parametrize(("build", "cls"), BUILDERS, ids=lambda x: getattr(x, "__name__", ""))
def test_a_builder_takes_every_field_in_order_and_builds_the_same_frozen_record(
    build: Callable[..., Any], cls: type
) -> None:
    """S1: ``new_*`` builds what the constructor builds, field by field."""
    names = field_names(cls)
    assert list(inspect.signature(build).parameters) == names
    for vary in range(-1, len(names)):
        vals = values(cls, vary)
        built = build(*vals)
        assert type(built) is cls
        assert all(getattr(built, n) == v for n, v in zip(names, vals, strict=True))
        assert built == cls(*vals)
        assert repr(built) == repr(cls(*vals))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, names[0], None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(built, names[-1])
    assert not hasattr(built, "__dict__")


def test_the_core_is_all_compiled_or_all_pure_and_the_build_asked_for() -> None:
    """S1: either every module of the core is a mypyc extension or none is, and
    ``state.COMPILED`` says which. ``make test-compiled`` sets
    ``LUFTPAUSE_EXPECT_CORE=compiled`` so that its run fails if the pure source was
    loaded instead (``make test``: ``pure``)."""
    compiled = {m.__name__: not str(m.__file__).endswith(".py") for m in MODULES}
    assert len(compiled) >= 12
    assert set(compiled.values()) == {COMPILED}, compiled
    expected = os.environ.get("LUFTPAUSE_EXPECT_CORE", "")
    if expected:
        assert expected in ("compiled", "pure"), expected
        assert ("compiled" if COMPILED else "pure") == expected, compiled
