"""Run identity (D2) and class/caller headers (D3).

A run is named by ``x-luftpause-run-id``. Agents that cannot send it are
recognised by the ``tool_call_id`` s they echo back in tool messages: every
tool call the proxy sees going out is remembered (30 min, swept every 60 s)
with its run. Otherwise the turn starts a new run.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from luftpause.dataplane.errors import shown

RUN_HEADER = "x-luftpause-run-id"
CLASS_HEADER = "x-luftpause-class"
CALLER_HEADER = "x-luftpause-caller"
# Response headers: where the turn went and how long luftpause held it.
REPLICA_HEADER = "x-luftpause-replica"
HELD_HEADER = "x-luftpause-held-ms"
CLASSES = ("interactive", "batch")
MAX_RUN_ID = 256  # the scheduler's bound on IDs


class BadHeader(ValueError):
    """A luftpause header has a value we cannot use; the message says which."""


class ToolCallMemory:
    def __init__(self, clock: Callable[[], float], ttl_s: float) -> None:
        self.clock = clock
        self.ttl_s = ttl_s
        self._runs: dict[str, tuple[str, float]] = {}

    def remember(self, tool_call_ids: Iterable[str], run_id: str) -> None:
        expires = self.clock() + self.ttl_s
        for call_id in tool_call_ids:
            if call_id:
                self._runs[call_id] = (run_id, expires)

    def lookup(self, tool_call_ids: Iterable[str]) -> str | None:
        now = self.clock()
        for call_id in tool_call_ids:
            hit = self._runs.get(call_id)
            if hit is not None and hit[1] > now:
                return hit[0]
        return None

    def sweep(self) -> int:
        now = self.clock()
        stale = [k for k, (_, expires) in self._runs.items() if expires <= now]
        for k in stale:
            del self._runs[k]
        return len(stale)

    def __len__(self) -> int:
        return len(self._runs)


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
) -> str:
    explicit = headers.get(RUN_HEADER, "").strip()
    if explicit:
        if len(explicit) > MAX_RUN_ID:
            raise BadHeader(f"{RUN_HEADER} is longer than {MAX_RUN_ID} characters")
        return explicit
    return memory.lookup(echoed_tool_call_ids(body)) or f"run-{uuid.uuid4().hex}"


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
