"""Helpers the client API packages (``messages/``, ``responses/``) share.

What an engine's reply or a client's request holds is read defensively: a value of
the wrong type reads as empty (``text``, ``listed``), a token count that is not one
as 0 (``count``); ``saw_call`` records a tool call a native reply made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from luftpause.dataplane.outcome import TurnOutcome

_MAX_COUNT = 2**63


def text(value: Any) -> str:
    """``value`` if it is a string, else ""."""
    return value if isinstance(value, str) else ""


def listed(value: Any) -> list[Any]:
    """``value`` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def is_int(value: Any) -> TypeGuard[int]:
    """An integer (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    """A token count: an integer (not a bool) that a report's uint64 can carry."""
    return is_int(value) and 0 <= value < _MAX_COUNT


def count(value: Any) -> int:
    """A token count, or 0 for anything that is not one (a bool is not)."""
    return value if is_count(value) else 0


def saw_call(outcome: TurnOutcome, call_id: Any, name: Any) -> None:
    """A native reply made a tool call: its ID (once, if it has one) and its tool's name
    go into the turn's report."""
    if isinstance(call_id, str) and call_id and call_id not in outcome.tool_call_ids:
        outcome.tool_call_ids.append(call_id)
    outcome.saw_tool(name)
