"""What a turn's reply said: the value the relay, the API modules and ``Turn`` share.

``TurnOutcome`` accumulates, as a reply passes (streamed or whole), what the turn's
report to the scheduler needs: whether a first token came, the tool calls made (their
IDs and names), the finish reason and usage. Its values are read defensively: they
go into report messages (uint64, UTF-8 strings), and a value those cannot carry must
not stop the turn from being reported. ``loads`` parses an engine's JSON the way every
reader of a reply does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

# Tool names reported with a finished turn (tool leases): at most this many, this long.
MAX_TOOL_NAMES = 8
MAX_TOOL_NAME = 64


@dataclass
class TurnOutcome:
    """What the reply said, accumulated as it passes."""

    first_token: bool = False
    tool_call_ids: list[str] = field(default_factory=list)
    tool_names: list[str] = field(default_factory=list)  # distinct, for the tool leases
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    done: bool = False  # [DONE] seen

    @property
    def paused_on_tool(self) -> bool:
        return self.finish_reason == "tool_calls" or bool(self.tool_call_ids)

    def saw_tool(self, name: Any) -> None:
        """A tool call named ``name``: the scheduler learns how long each tool keeps runs
        away (tool leases). Names are cut and counted as the report's limits allow."""
        if isinstance(name, str) and name:
            # (a name that is not valid UTF-8, a lone surrogate, cannot travel in a report)
            name = name[:MAX_TOOL_NAME].encode("utf-8", "replace").decode("utf-8")
            if name not in self.tool_names and len(self.tool_names) < MAX_TOOL_NAMES:
                self.tool_names.append(name)

    def read_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.prompt_tokens = count(usage.get("prompt_tokens"))
        self.completion_tokens = count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            self.cached_tokens = count(details.get("cached_tokens"))

    def read_completion_bytes(self, raw: bytes) -> None:
        """Read a non-streamed reply as the engine sent it; a body that is not JSON
        says nothing (it is still passed on)."""
        body = loads(raw)
        if body is not _NOT_JSON:
            self.read_completion(body)

    def read_completion(self, body: Any) -> None:
        """Read a non-streamed ``chat.completion`` body."""
        if not isinstance(body, dict):
            return
        self.read_usage(body.get("usage"))
        for choice in listed(body.get("choices")):
            if not isinstance(choice, dict):
                continue
            self.finish_reason = _reason(choice.get("finish_reason")) or self.finish_reason
            message = choice.get("message")
            if isinstance(message, dict):
                if message.get("content") or message.get("tool_calls"):
                    self.first_token = True
                self._read_calls(message.get("tool_calls"))

    def read_chunk(self, chunk: Any) -> None:
        """Read one streamed ``chat.completion.chunk``."""
        if not isinstance(chunk, dict):
            return
        if chunk.get("usage"):
            self.read_usage(chunk["usage"])
        for choice in listed(chunk.get("choices")):
            if not isinstance(choice, dict):
                continue
            self.finish_reason = _reason(choice.get("finish_reason")) or self.finish_reason
            delta = choice.get("delta")
            if isinstance(delta, dict):
                if delta.get("content") or delta.get("tool_calls"):
                    self.first_token = True
                self._read_calls(delta.get("tool_calls"))

    def _read_calls(self, calls: Any) -> None:
        if not isinstance(calls, list):
            return
        for call in calls:
            if not isinstance(call, dict):
                continue
            if isinstance(call.get("id"), str) and call["id"]:
                self.tool_call_ids.append(call["id"])
            function = call.get("function")
            if isinstance(function, dict):  # (streamed: the name comes with the call's first delta)
                self.saw_tool(function.get("name"))


_NOT_JSON = object()


def loads(raw: bytes) -> Any:
    """``raw`` parsed (``orjson``, or the standard library for what it refuses, such as
    integers past 64 bits), or ``_NOT_JSON``."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return _NOT_JSON


# What an engine's reply may say is read defensively: the values go into report
# messages (uint64, UTF-8 strings), and a value they cannot carry must not stop the
# turn from being reported. (The client API packages read with the same helpers:
# ``apis/_shared.py``.)
_MAX_COUNT = 2**63


def is_int(value: Any) -> TypeGuard[int]:
    """An integer (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    """A token count: an integer (not a bool) that a report's uint64 can carry."""
    return is_int(value) and 0 <= value < _MAX_COUNT


def count(value: Any) -> int:
    """A token count, or 0 for anything that is not one (a bool is not)."""
    return value if is_count(value) else 0


def _reason(value: Any) -> str:
    """A finish reason, or "" for anything that cannot be one."""
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        return ""
    return value if value.isascii() else value.encode("utf-8", "replace").decode("utf-8")


def listed(value: Any) -> list[Any]:
    """``value`` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []
