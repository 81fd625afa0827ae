"""Run identity (D2) and class/caller headers (D3).

A run is named by ``x-luftpause-run-id``. Agents that cannot send it are
recognised by the ``tool_call_id`` s they echo back in tool messages: every
tool call the proxy sees going out is remembered (30 min, swept every 60 s)
with its run. Otherwise the turn starts a new run.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from luftpause.dataplane.errors import shown
from luftpause.tool_calls import ToolCallMemory

RUN_HEADER = "x-luftpause-run-id"
CLASS_HEADER = "x-luftpause-class"
CALLER_HEADER = "x-luftpause-caller"
# Response headers: where the turn went and how long luftpause held it.
REPLICA_HEADER = "x-luftpause-replica"
HELD_HEADER = "x-luftpause-held-ms"
CLASSES = ("interactive", "batch")
MAX_RUN_ID = 256  # the scheduler's bound on IDs


# Tool call IDs sent with one Admit: the newest are the ones that name the run.
_MAX_ECHOED = 16


class BadHeader(ValueError):
    """A luftpause header has a value we cannot use; the message says which."""


def echoed_tool_call_ids(body: Mapping[str, Any]) -> list[str]:
    """tool_call_ids of the request's tool messages, newest first."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    ids = []
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "tool":
            call_id = msg.get("tool_call_id")
            if isinstance(call_id, str) and call_id:
                ids.append(call_id)
    return ids


def resolve_run_id(
    headers: Mapping[str, str], body: Mapping[str, Any], memory: ToolCallMemory
) -> tuple[str, list[str]]:
    """The turn's run (D2), and the echoed tool call IDs to ask the scheduler about.

    A named run is the run. Else echoed tool call IDs this dataplane remembers name
    it. Else the turn gets a new run ID, and its echoed IDs (if any) go with its Admit:
    the scheduler, which hears every dataplane's tool calls, puts it in the run they
    were issued to, wherever that run's earlier turns went through."""
    explicit = headers.get(RUN_HEADER, "").strip()
    if explicit:
        if len(explicit) > MAX_RUN_ID:
            raise BadHeader(f"{RUN_HEADER} is longer than {MAX_RUN_ID} characters")
        return explicit, []
    echoed = echoed_tool_call_ids(body)
    known = memory.lookup(echoed)
    if known is not None:
        return known, []
    return f"run-{uuid.uuid4().hex}", echoed[:_MAX_ECHOED]


def service_class(headers: Mapping[str, str]) -> str:
    value = headers.get(CLASS_HEADER, "").strip().lower()
    if not value:
        return "batch"
    if value not in CLASSES:
        raise BadHeader(f"{CLASS_HEADER} must be 'interactive' or 'batch', got {shown(value)}")
    return value


def caller(headers: Mapping[str, str], max_bytes: int) -> str:
    """The caller header cut to ``max_bytes`` bytes, never inside a UTF-8 character.

    ASGI servers hand header values over as latin-1 text; the bytes on the wire
    are recovered, cut, and read as UTF-8 (what clients send in practice).
    """
    wire = headers.get(CALLER_HEADER, "").strip().encode("latin-1", errors="replace")
    return wire[:max_bytes].decode("utf-8", errors="ignore")
