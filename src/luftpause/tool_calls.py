"""Which run issued a tool call (D2): ``tool_call_id`` -> run, remembered for a while.

An agent that names no run still echoes the IDs of the tool calls it answers; the
run those calls were issued to is the run of its next turn. The dataplane keeps one
of these for its own turns; the scheduler keeps one for every dataplane's, so the
identity holds across dataplanes and across a dataplane's restart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


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
