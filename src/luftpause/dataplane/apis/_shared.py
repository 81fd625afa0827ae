"""Helpers the client API packages (``messages/``, ``responses/``) share.

What an engine's reply or a client's request holds is read defensively: a value of
the wrong type reads as empty (``text``, ``listed``), a token count that is not one
as 0 (``count``); ``saw_call`` records a tool call a native reply made.
"""

from __future__ import annotations

from typing import Any

from luftpause.dataplane.outcome import TurnOutcome, count, is_count, is_int, listed

__all__ = ["count", "is_count", "is_int", "listed", "saw_call", "text"]


def text(value: Any) -> str:
    """``value`` if it is a string, else ""."""
    return value if isinstance(value, str) else ""


def saw_call(outcome: TurnOutcome, call_id: Any, name: Any) -> None:
    """A native reply made a tool call: its ID (once, if it has one) and its tool's name
    go into the turn's report."""
    if isinstance(call_id, str) and call_id and call_id not in outcome.tool_call_ids:
        outcome.tool_call_ids.append(call_id)
    outcome.saw_tool(name)
