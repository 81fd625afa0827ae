"""Which run issued a tool call (D2): ``tool_call_id`` -> run, remembered for a while.

An agent that names no run still echoes the IDs of the tool calls it answers; the
run those calls were issued to is the run of its next turn. The dataplane keeps one
of these for its own turns; the scheduler keeps one for every dataplane's, so the
identity holds across dataplanes and across a dataplane's restart.

:class:`ToolCallOrigins` is the dataplane's bounded record of the turn behind each
tool call (run, class, caller, trace context), which ``GET /v1/tool_calls/{id}``
serves: the runtime reads there which harness session spawned a sub-agent (#38).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

TOOL_CALL_ORIGINS_MAX = 10_000  # tool calls whose turn the dataplane keeps for lookups


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


@dataclass(frozen=True)
class ToolCallOrigin:
    """The turn whose reply made a tool call: its run, class and caller, and the W3C
    ``traceparent`` of the dataplane's span for it (None when tracing is off)."""

    tool_call_id: str
    run_id: str
    service_class: str
    caller: str
    traceparent: str | None

    def to_json(self) -> dict[str, str | None]:
        return {
            "toolCallId": self.tool_call_id,
            "runId": self.run_id,
            "serviceClass": self.service_class,
            "caller": self.caller,
            "traceparent": self.traceparent,
        }


class ToolCallOrigins:
    """``tool_call_id`` -> :class:`ToolCallOrigin`, for ``GET /v1/tool_calls/{id}``: the
    runtime asks which harness run made the tool call that spawned a sub-agent (#38).

    Bounded twice: at most ``max_entries`` (the oldest dropped first) and none older
    than ``ttl_s`` (a run idle that long is forgotten anyway, S10). Entries are kept in
    the order they were remembered, so both drops take from the front.
    """

    def __init__(self, clock: Callable[[], float], ttl_s: float, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.clock = clock
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._origins: OrderedDict[str, tuple[ToolCallOrigin, float]] = OrderedDict()

    def remember(self, tool_call_ids: Iterable[str], origin: ToolCallOrigin) -> None:
        """Remember ``origin`` under each ID (its ``tool_call_id`` is set per ID)."""
        at = self.clock()
        for call_id in tool_call_ids:
            if not call_id:
                continue
            self._origins.pop(call_id, None)  # a repeated ID: it moves to the back
            self._origins[call_id] = (replace(origin, tool_call_id=call_id), at)
            if len(self._origins) > self.max_entries:
                self._origins.popitem(last=False)

    def lookup(self, tool_call_id: str) -> ToolCallOrigin | None:
        hit = self._origins.get(tool_call_id)
        if hit is None or hit[1] + self.ttl_s <= self.clock():
            return None
        return hit[0]

    def sweep(self) -> int:
        """Drop the entries older than ``ttl_s``; how many were dropped."""
        cutoff = self.clock() - self.ttl_s
        dropped = 0
        while self._origins:
            _, (_, at) = next(iter(self._origins.items()))
            if at > cutoff:
                break
            self._origins.popitem(last=False)
            dropped += 1
        return dropped

    def __len__(self) -> int:
        return len(self._origins)
