"""Which run issued a tool call (D2): ``tool_call_id`` -> run, remembered for a while.

An agent that names no run still echoes the IDs of the tool calls it answers; the
run those calls were issued to is the run of its next turn. Each dataplane keeps a
:class:`ToolCallOrigins` for its own turns (the whole turn behind each call: run,
class, caller, trace context, which ``GET /v1/tool_calls/{id}`` also serves, #38);
the scheduler keeps a :class:`ToolCallMemory` for every dataplane's, so the identity
holds across dataplanes and across a dataplane's restart.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

TOOL_CALL_ORIGINS_MAX = 10_000  # tool calls whose turn the dataplane keeps for lookups
MAX_CALL_ID_CHARS = 256  # longer tool call IDs are neither reported nor remembered
MAX_CALLS_PER_TURN = 64  # tool call IDs of one turn reported and remembered
# ``GET /v1/tool_calls/{id}``'s 404 says how many dataplane processes share the port
# (``dataplane.workers``, B6): a lookup may have reached one that did not relay the reply.
WORKERS_HEADER = "x-luftpause-dataplane-workers"


class RunsOfToolCalls(Protocol):
    """What names a run by the tool calls it made (D2)."""

    def lookup(self, tool_call_ids: Iterable[str]) -> str | None: ...


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
    """The dataplane's record of the turn behind each tool call: ``tool_call_id`` ->
    :class:`ToolCallOrigin`. It names the run of an agent's next turn (D2, ``lookup``,
    as :class:`ToolCallMemory` does for the scheduler) and answers
    ``GET /v1/tool_calls/{id}`` (``origin``): the runtime asks there which harness run
    made the tool call that spawned a sub-agent (#38).

    Bounded twice: at most ``max_entries`` (the oldest dropped first) and none older
    than ``ttl_s``. Entries are kept in the order they were remembered, so both drops
    take from the front. An ID longer than ``MAX_CALL_ID_CHARS`` is not remembered, nor
    more than ``MAX_CALLS_PER_TURN`` of one turn. An ID that two runs made (engines
    whose IDs are not unique: ``functions.spawn:0``, ``call_0``) names neither: it is
    *ambiguous* until it expires, so no run is taken for another.
    """

    def __init__(self, clock: Callable[[], float], ttl_s: float, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.clock = clock
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        # (origin, remembered at); origin None: ambiguous
        self._origins: OrderedDict[str, tuple[ToolCallOrigin | None, float]] = OrderedDict()

    def remember(self, tool_call_ids: Iterable[str], origin: ToolCallOrigin) -> None:
        """Remember ``origin`` under each ID (its ``tool_call_id`` is set per ID)."""
        at = self.clock()
        for call_id in reportable(tool_call_ids):
            old = self._origins.pop(call_id, None)  # a repeated ID: it moves to the back
            mine: ToolCallOrigin | None = replace(origin, tool_call_id=call_id)
            if old is not None and old[1] + self.ttl_s > at:
                other = old[0] is None or old[0].run_id != origin.run_id
                mine = None if other else mine  # made by two runs: it names neither
            self._origins[call_id] = (mine, at)
            if len(self._origins) > self.max_entries:
                self._origins.popitem(last=False)

    def _live(self, call_id: str) -> tuple[ToolCallOrigin | None, float] | None:
        hit = self._origins.get(call_id)
        return None if hit is None or hit[1] + self.ttl_s <= self.clock() else hit

    def origin(self, tool_call_id: str) -> ToolCallOrigin | None:
        """The turn that made ``tool_call_id``; None if unknown, expired or ambiguous."""
        hit = self._live(tool_call_id)
        return None if hit is None else hit[0]

    def ambiguous(self, tool_call_id: str) -> bool:
        """Whether more than one run made ``tool_call_id`` (within ``ttl_s``)."""
        hit = self._live(tool_call_id)
        return hit is not None and hit[0] is None

    def lookup(self, tool_call_ids: Iterable[str]) -> str | None:
        """The run of the first of ``tool_call_ids`` that names one (D2)."""
        for call_id in tool_call_ids:
            found = self.origin(call_id)
            if found is not None:
                return found.run_id
        return None

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


def reportable(tool_call_ids: Iterable[str]) -> list[str]:
    """The IDs of a turn's tool calls that are reported and remembered: none empty or
    longer than ``MAX_CALL_ID_CHARS`` (no agent framework makes such IDs), at most
    ``MAX_CALLS_PER_TURN``."""
    kept = [i for i in tool_call_ids if i and len(i) <= MAX_CALL_ID_CHARS]
    return kept[:MAX_CALLS_PER_TURN]
