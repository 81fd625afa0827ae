"""A streamed chat completion put back together (R4): the runtime's turns are streamed so
that the dataplane sees their first token and times their decode (the decode pace, S2),
and the loop still gets one reply as a non-streamed request would have returned it.

:class:`SseLines` splits an event stream into its events' data; :class:`ReplyAssembler`
folds each ``chat.completion.chunk`` into a ``chat.completion``:

* every string field of a choice's ``delta`` is concatenated in order (``content``, and
  what engines add beside it, such as ``reasoning_content``); a tool call is merged into
  the one with the same ``index`` (a server that sends none: a new ``id`` starts a new
  call, a piece without one continues the last), its ``function.arguments`` (and any
  other string) concatenated, its ``id`` and ``type`` kept as first given;
* ``finish_reason`` is the last one given; ``logprobs.content`` entries are appended;
  any other field of a choice (vLLM's ``stop_reason``, SGLang's ``matched_stop``) is
  the last non-null one given (null if only null was), a list field the pieces joined;
* the usage-only chunk (no choices) gives ``usage``; ``id``, ``created``, ``model`` and
  the like come from the first chunk that has them;
* an error event (``{"error": {...}}``, as SGLang and vLLM send one mid-stream) is kept
  with its message and its ``code``, if it has one.

Strings are gathered as lists of pieces and joined once, so a long reply costs linear
time. Nothing is validated beyond the shapes read here: the loop checks what it uses.
"""

from __future__ import annotations

from typing import Any

import orjson

# Keys of a delta or a tool call that identify it rather than add to it.
_KEPT = frozenset({"index", "type", "id"})
# Keys of a streamed choice read on their own; any other is kept as last given.
_CHOICE_READ = frozenset({"index", "delta", "message", "finish_reason", "logprobs"})


class StreamError(Exception):
    """The stream is not a chat completion stream (an event is not a JSON object)."""


class SseLines:
    """The ``data`` of each event in a ``text/event-stream``, fed in arbitrary pieces.

    Lines end with LF, CRLF or CR; an event ends at an empty line; its ``data:`` lines
    are joined by newlines; comments (``:``) and other fields are skipped."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, piece: bytes) -> list[bytes]:
        self._buffer += piece
        events: list[bytes] = []
        while True:
            end = _line_end(self._buffer)
            if end < 0:
                return events
            if self._buffer[end : end + 1] == b"\r" and end + 1 == len(self._buffer):
                return events  # a CR at the end may be half of a CRLF: wait for more
            line = self._buffer[:end]
            skip = 2 if self._buffer[end : end + 2] == b"\r\n" else 1
            self._buffer = self._buffer[end + skip :]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)

    def close(self) -> list[bytes]:
        """The last event when the stream ends without the empty line after it."""
        rest = self.feed(b"\n\n") if self._buffer or self._data else []
        self._buffer = b""
        return rest


def _line_end(buffer: bytes) -> int:
    lf = buffer.find(b"\n")
    cr = buffer.find(b"\r")
    if cr < 0:
        return lf
    if lf < 0:
        return cr
    return min(lf, cr)


class _Text(list[str]):
    """The pieces of a string being streamed, joined by :func:`_finished`."""


class ReplyAssembler:
    def __init__(self) -> None:
        self.reply: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self.done = False  # ``[DONE]`` was seen
        self.error: str | None = None  # an error event's message
        self.error_code: int | None = None  # ... and its code, where it gave a number

    def feed_event(self, data: bytes) -> None:
        """One event's data: ``[DONE]``, a chunk, or an error object."""
        if data.strip() == b"[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise StreamError("an event of the stream is not JSON") from None
        if not isinstance(chunk, dict):
            raise StreamError("an event of the stream is not a JSON object")
        error = chunk.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            self.error = str(message or error)
            code = error.get("code") if isinstance(error, dict) else None
            if isinstance(code, str) and code.isdigit():
                code = int(code)
            self.error_code = code if isinstance(code, int) else None
            return
        self.feed(chunk)

    def feed(self, chunk: dict[str, Any]) -> None:
        for key, value in chunk.items():
            if key == "choices" or value is None:
                continue
            if key == "usage" or key not in self.reply:
                self.reply[key] = value
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for entry in choices:
            if not isinstance(entry, dict):
                continue
            index = entry.get("index")
            index = index if isinstance(index, int) else 0
            choice = self._choices.get(index)
            if choice is None:
                choice = self._choices[index] = {"index": index, "message": {}}
            delta = entry.get("delta")
            if isinstance(delta, dict):
                _merge(choice["message"], delta)
            for key, value in entry.items():
                if key in _CHOICE_READ:
                    continue
                if isinstance(value, list) and isinstance(choice.get(key), list):
                    choice[key].extend(value)  # a per-chunk list, as logprobs' below
                elif value is not None or key not in choice:
                    choice[key] = value
            if entry.get("finish_reason") is not None:
                choice["finish_reason"] = entry["finish_reason"]
            logprobs = entry.get("logprobs")
            if isinstance(logprobs, dict):
                kept = choice.setdefault("logprobs", {})
                for key, value in logprobs.items():
                    if isinstance(value, list):
                        kept.setdefault(key, []).extend(value)
                    elif value is not None:
                        kept[key] = value

    def result(self) -> dict[str, Any]:
        """The reply as a non-streamed request returns it (choices in index order; each
        message with a ``role`` and a ``content``, null when none was streamed)."""
        reply = dict(self.reply)
        reply["object"] = "chat.completion"
        choices = []
        for index in sorted(self._choices):
            choice = _finished(self._choices[index])
            message = choice["message"]
            message.setdefault("role", "assistant")
            message.setdefault("content", None)
            if "tool_calls" in message:
                calls = message["tool_calls"]
                message["tool_calls"] = [
                    {k: v for k, v in calls[i].items() if k != "index"} for i in sorted(calls)
                ]
                if message["content"] == "":  # as a non-streamed reply with tool calls
                    message["content"] = None
            choice.setdefault("finish_reason", None)
            choices.append(choice)
        reply["choices"] = choices
        return reply


def _finished(value: Any) -> Any:
    """A copy with every gathered string joined."""
    if isinstance(value, _Text):
        return "".join(value)
    if isinstance(value, dict):
        return {k: _finished(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finished(v) for v in value]
    return value


def _merge(message: dict[str, Any], delta: dict[str, Any]) -> None:
    for key, value in delta.items():
        if value is None:
            continue
        if key == "tool_calls":
            calls = message.setdefault("tool_calls", {})
            for call in value if isinstance(value, list) else ():
                if isinstance(call, dict):
                    _merge_value(calls.setdefault(_call_index(calls, call), {}), call)
            continue
        if key == "role":
            message.setdefault("role", value)
            continue
        _merge_value(message, {key: value})


def _call_index(calls: dict[int, dict[str, Any]], call: dict[str, Any]) -> int:
    """Where a tool call's piece belongs: its ``index``; without one, the call with its
    ``id`` or a new call for a new ``id``, and a piece with neither continues the last."""
    index = call.get("index")
    if isinstance(index, int):
        return index
    last = max(calls, default=None)
    call_id = call.get("id")
    if call_id is None:
        return 0 if last is None else last
    for n, known in calls.items():
        if known.get("id") == call_id:
            return n
    return 0 if last is None else last + 1


def _merge_value(target: dict[str, Any], delta: dict[str, Any]) -> None:
    """Concatenate strings, merge objects, keep what identifies (index, type, id)."""
    for key, value in delta.items():
        if value is None:
            continue
        old = target.get(key)
        if old is None:
            if isinstance(value, dict):
                target[key] = {}
                _merge_value(target[key], value)
            elif isinstance(value, str) and key not in _KEPT:
                target[key] = _Text([value])
            else:
                target[key] = list(value) if isinstance(value, list) else value
        elif key in _KEPT:
            continue
        elif isinstance(old, _Text) and isinstance(value, str):
            old.append(value)
        elif isinstance(old, dict) and isinstance(value, dict):
            _merge_value(old, value)
        elif isinstance(old, list) and not isinstance(old, _Text) and isinstance(value, list):
            old.extend(value)
        else:
            target[key] = _Text([value]) if isinstance(value, str) else value
