"""The core's fast record builders (``state.new_*``) build exactly what the frozen
dataclass constructors build (STYLE "Tests by tier": unit).

``decide`` builds its records through these functions for speed (see the end of
``state.py``); a field added to a record and not to its builder, or a builder that
swapped two fields, fails here.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from luftpause.scheduler.core.state import (
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

BUILDERS: list[tuple[Callable[..., Any], type]] = [
    (new_state, State),
    (new_replica, ReplicaState),
    (new_run, RunState),
    (new_turn, TurnState),
    (new_held, HeldTurn),
]


@pytest.mark.parametrize(("build", "cls"), BUILDERS, ids=lambda x: getattr(x, "__name__", ""))
def test_a_builder_takes_every_field_in_order_and_builds_the_same_frozen_record(
    build: Callable[..., Any], cls: type
) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(inspect.signature(build).parameters) == names
    # a distinct value per field, so that two swapped fields cannot go unnoticed
    values = [object() for _ in names]
    built = build(*values)
    assert type(built) is cls
    assert all(getattr(built, n) is v for n, v in zip(names, values, strict=True))
    assert built == cls(*values)
    assert repr(built) == repr(cls(*values))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, names[0], None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(built, names[-1])
    assert not hasattr(built, "__dict__")
