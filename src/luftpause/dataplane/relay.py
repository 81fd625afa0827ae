"""Passing an engine's reply through unchanged while reading what happened.

``SseTap`` watches a server-sent event stream as it passes: complete events are
released byte for byte as they arrive, and each ``data:`` payload is read for
the first token, tool call IDs, the finish reason and usage. The one change it
may make: when the dataplane itself asked the engine for usage
(``stream_options.include_usage``) and the client did not, it takes out what that
request added — the usage-only last chunk, and the ``"usage": null`` member of
every other chunk — so the client gets exactly the stream it asked for.

``RelayStream`` is the ASGI response that streams those bytes, stops the engine
request when the client leaves (the request's ``ClientWatch`` cancels it), and
closes the client connection without ``[DONE]`` when the engine fails mid-stream
(D6). It owns the turn it is handed: whatever happens while streaming, its
``finally`` ends the turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from luftpause.dataplane.engine_http import ENGINE_ERRORS, EngineResponse
from luftpause.dataplane.errors import ClientLeft, EngineFailed, InternalError, TurnError
from luftpause.dataplane.outcome import TurnOutcome, loads
from luftpause.dataplane.watch import ClientWatch

if TYPE_CHECKING:
    from luftpause.dataplane.apis import ClientApi, StreamTranslator
    from luftpause.dataplane.turn import Turn

log = logging.getLogger("luftpause.dataplane.relay")


class SseTap:
    """Reads an event stream as it passes and releases it byte for byte, except for
    what the dataplane itself added by asking for usage (``hide_usage``): the
    usage-only last chunk is withheld, and the ``"usage": null`` member that engines
    following OpenAI's behaviour put in every other chunk when asked
    (``null_usage_when_asked``) is cut out of it, so the client gets the bytes it
    would have got from the engine for its own request."""

    passes_events = True  # what ``_read_event`` returns is the engine's event (+ separator)

    def __init__(
        self, outcome: TurnOutcome, hide_usage: bool, null_usage_when_asked: bool = True
    ) -> None:
        self.outcome = outcome
        self.hide_usage = hide_usage
        self.cut_null_usage = hide_usage and null_usage_when_asked
        self._buffer = b""

    def feed(self, data: bytes) -> bytes:
        """Take raw bytes from the engine; return the complete events to pass on."""
        self._buffer += data
        out = []
        while True:
            end, sep = _event_end(self._buffer)
            if end < 0:
                break
            event = self._buffer[:end]
            separator = self._buffer[end : end + sep]
            self._buffer = self._buffer[end + sep :]
            passed = self._read_event(event)
            if passed is not None:
                out.append(passed + separator if self.passes_events else passed)
        return b"".join(out)

    def rest(self) -> bytes:
        """Bytes after the last complete event (passed on when the stream ends)."""
        rest, self._buffer = self._buffer, b""
        return rest

    def failing(self, message: str) -> bytes:
        """What the client gets when the engine's stream breaks off: nothing more (Chat
        Completions has no error event: the connection closes without ``[DONE]``)."""
        return b""

    def incomplete(self) -> str:
        """Why a stream that ended is not complete (the turn's failure reason)."""
        return "ended the stream without [DONE]"

    skim = True  # skip parsing chunks that cannot say anything new (``_skimmed``)

    def _read_event(self, event: bytes) -> bytes | None:
        """Account for one event; return what the client gets of it (None: nothing)."""
        lines = event.splitlines(keepends=True)
        for i, line in enumerate(lines):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.outcome.done = True
                continue
            if self.skim and self.outcome.first_token:
                skimmed = _skimmed(payload)
                if skimmed is not None:
                    if skimmed and self.cut_null_usage:
                        end = line.rfind(skimmed)
                        lines[i] = line[:end] + line[end + len(skimmed) :]
                        event = b"".join(lines)
                    continue
            chunk = loads(payload)
            if not isinstance(chunk, dict):
                continue
            self.outcome.read_chunk(chunk)
            if not self.hide_usage or "usage" not in chunk:
                continue
            if chunk["usage"] and not chunk.get("choices"):
                return None  # the usage-only chunk the client did not ask for
            if chunk["usage"] is None and self.cut_null_usage:
                lines[i] = without_null_usage(line, chunk)
                event = b"".join(lines)
        return event


class TranslatingTap(SseTap):
    """Reads an engine's Chat Completions stream and passes on, event by event, what
    ``translator`` makes of it in the client's API (B9); the engine's bytes never
    reach the client. The usage chunk is read like any other and left to the
    translator (its API reports usage in its closing events). An error the engine
    reports inside the stream (``data: {"error": ...}``, as SGLang and vLLM do) ends
    the client's stream with its API's error event, and the turn fails."""

    passes_events = False  # ``_read_event`` returns whole events of the client's API

    def __init__(self, outcome: TurnOutcome, translator: StreamTranslator) -> None:
        super().__init__(outcome, hide_usage=False)
        self.translator = translator
        self.engine_error: str | None = None
        self._failed = False

    def rest(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        if not rest.strip():
            return b""
        return self._read_event(rest) or b""  # a last event without its blank line

    def failing(self, message: str) -> bytes:
        if self._failed:
            return b""
        self._failed = True
        return self.translator.failed(message)

    def incomplete(self) -> str:
        if self.engine_error is not None:
            return f"reported an error mid-stream: {self.engine_error}"
        return super().incomplete()

    def _read_event(self, event: bytes) -> bytes | None:
        out = []
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                if not self.outcome.done and not self._failed:
                    self.outcome.done = True
                    out.append(self.translator.done())
                continue
            chunk = loads(payload)
            if not isinstance(chunk, dict) or self.outcome.done or self._failed:
                continue
            error = chunk.get("error")
            if error is not None and not chunk.get("choices"):
                self.engine_error = _error_text(error)
                out.append(self.failing(f"the engine reported an error: {self.engine_error}"))
                continue
            self.outcome.read_chunk(chunk)
            out.append(self.translator.chunk(chunk))
        return b"".join(out)


class NativeTap(SseTap):
    """Passes an engine's stream in another API (one it serves natively, B9) through
    byte for byte, reading each event with ``api.observe`` for the turn's report. The
    stream is complete when its API's last event has passed (``FINAL_EVENTS``); an
    error event (``FAILED_EVENTS``) fails the turn. A stream that breaks off gets the
    API's error event (``api.stream_error``) unless the engine sent one itself."""

    FINAL_EVENTS = frozenset({"message_stop", "response.completed", "response.incomplete"})
    FAILED_EVENTS = frozenset({"error", "response.failed"})

    def __init__(self, outcome: TurnOutcome, api: ClientApi) -> None:
        super().__init__(outcome, hide_usage=False)
        self.api = api
        self.engine_error: str | None = None
        self._sequence = 0  # the last sequence number seen (Responses events carry one)

    def failing(self, message: str) -> bytes:
        if self.engine_error is not None:
            return b""  # the engine's own error event has passed already
        self.engine_error = message
        return self.api.stream_error(message, self._sequence + 1)

    def incomplete(self) -> str:
        if self.engine_error is not None:
            return f"reported an error mid-stream: {self.engine_error}"
        return "ended the stream before its last event"

    def _read_event(self, event: bytes) -> bytes | None:
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            data = loads(line[5:].strip())
            if not isinstance(data, dict):
                continue
            self.api.observe(data, self.outcome)
            sequence = data.get("sequence_number")
            if isinstance(sequence, int) and not isinstance(sequence, bool):
                self._sequence = max(self._sequence, sequence)
            kind = data.get("type")
            if kind in self.FINAL_EVENTS and self.engine_error is None:
                self.outcome.done = True
            elif kind in self.FAILED_EVENTS:
                self.outcome.done = False
                response = data.get("response")
                nested = response.get("error") if isinstance(response, dict) else None
                self.engine_error = _error_text(data.get("error") or nested or data)
        return event


def _error_text(error: Any) -> str:
    """The message of an error an engine reports in a stream, cut to a report's size."""
    message = error.get("message") if isinstance(error, dict) else error
    text = message if isinstance(message, str) else json.dumps(message, default=str)
    return text[:1000]


# A top-level ``"usage": null`` member as engines write it (compact or spaced), with
# the comma that joins it to its neighbour.
_NULL_USAGE = re.compile(rb',\s*"usage"\s*:\s*null(?=\s*[,}])|"usage"\s*:\s*null\s*,\s*')


def without_null_usage(line: bytes, chunk: dict[str, Any]) -> bytes:
    """``line`` (a ``data:`` line whose JSON is ``chunk``) without its top-level
    ``"usage": null`` member, every other byte kept. Written last (the line ends with
    it and the object's closing brace, as engines write it), it is the top level's
    member: the brace that ends the line closes the top-level object, and a string
    cannot end there (the only ``"usage"`` in the line: no earlier duplicate stays).
    Elsewhere, a match that turns out to be
    inside a nested object is skipped: the cut is kept only if what is left parses
    to ``chunk`` without ``usage``. If no cut does (an engine writing JSON in a way
    not seen yet), the chunk is written anew, compact."""
    body = line.rstrip(b"\r\n")
    for last in _NULL_USAGE_LAST:  # written last, as engines do: the top level's for sure
        if body.endswith(last) and body.count(b'"usage"') == 1:
            return body[: -len(last)] + b"}" + line[len(body) :]
    wanted = {k: v for k, v in chunk.items() if k != "usage"}
    for match in _NULL_USAGE.finditer(line):
        candidate = line[: match.start()] + line[match.end() :]
        if loads(candidate[5:]) == wanted:
            return candidate
    log.debug("usage member not found by its bytes; chunk re-serialised")
    ending = line[len(line.rstrip(b"\r\n")) :]
    return b"data: " + json.dumps(wanted, separators=(",", ":")).encode() + ending


_NULL_USAGE_LAST = (b',"usage":null}', b', "usage": null}')


def _skimmed(payload: bytes) -> bytes | None:
    """For a chunk after the first token: None if it must be parsed, else what reading
    it would find: nothing at all (``b""``), or that its one ``usage`` member is a
    top-level ``null`` written last (those bytes, without the closing brace's).

    Most chunks of a long reply carry a few tokens of text and nothing the turn's
    report needs; judging that from the bytes spares parsing each one. It is exact for
    JSON as engines write it, compact or spaced: with no ``\\u`` escape in the
    payload every key is spelled out, and a quote inside a string is escaped, so a
    ``"tool_calls"`` or ``"finish_reason"`` in the bytes is a key (or a value naming
    it, which only sends the chunk to the parser). Anything else is parsed."""
    if b"\\u" in payload or b'"tool_calls"' in payload:
        return None
    reasons = payload.count(b'"finish_reason"')
    if reasons and reasons != payload.count(b'"finish_reason":null') + payload.count(
        b'"finish_reason": null'
    ):
        return None  # a choice finished: its reason is read
    usages = payload.count(b'"usage"')
    if usages == 0:
        return b""
    if usages == 1:
        for last in _NULL_USAGE_LAST:
            if payload.endswith(last):
                return last[:-1]
    return None


def _event_end(buffer: bytes) -> tuple[int, int]:
    """Index where the first complete SSE event ends, and the separator's length."""
    lf = buffer.find(b"\n\n")
    crlf = buffer.find(b"\r\n\r\n")
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, 4
    return lf, (2 if lf >= 0 else 0)


class RelayStream(Response):
    """An ASGI response relaying an engine's event stream (see the module docstring)."""

    def __init__(
        self,
        engine: EngineResponse,
        tap: SseTap,
        headers: list[tuple[bytes, bytes]],
        turn: Turn,
        watch: ClientWatch,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.engine = engine
        self.tap = tap
        self.raw_headers = headers
        self.turn = turn
        self.watch = watch  # cancels this task when the client leaves
        self.replica = turn.record.replica

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # Until the relay says otherwise, the turn ended in a bug of ours.
        failure: TurnError | None = InternalError("the stream relay failed", self.replica)
        try:
            failure = await self._relay(send)
        except asyncio.CancelledError:
            failure = ClientLeft("client left mid-stream")
            raise
        except Exception:
            log.exception("relaying the stream of engine %s failed", self.replica)
            raise
        finally:
            if failure is None and self.engine.at_eof():
                self.engine.release()  # complete: the connection goes back to the pool
            else:
                self.engine.close()  # drop the connection: the engine stops generating
            if failure is None:
                self.turn.finished(self.tap.outcome)
            else:
                self.turn.failed(failure)

    async def _relay(self, send: Any) -> TurnError | None:
        """Stream until the engine ends. Returns how the turn failed, or None."""
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        outcome = self.tap.outcome
        # Once the stream's last event has passed, what follows it is held and goes out
        # with the end of the response when the engine's reply ends: one write less. An
        # engine that goes on writing past its last event is passed on as it writes.
        held = b""
        try:
            async for data in self.engine.chunks():
                had_first = outcome.first_token
                out = self.tap.feed(data)
                if outcome.first_token and not had_first:
                    self.turn.first_token()
                if outcome.done and len(held) + len(out) <= _HOLD_AT_MOST:
                    held += out
                elif held or out:
                    body, held = held + out, b""
                    await send({"type": "http.response.body", "body": body, "more_body": True})
        except ENGINE_ERRORS as exc:
            # Leave the response incomplete: the connection closes without [DONE] (an API
            # with an error event gets that first).
            reason = f"engine {self.replica} failed mid-stream: {_describe(exc)}"
            log.warning("%s", reason)
            failing = held + self.tap.failing(reason)
            if failing:
                await send({"type": "http.response.body", "body": failing, "more_body": True})
            return EngineFailed(reason, self.replica)
        rest = held + self.tap.rest()
        failure: EngineFailed | None = None
        if not outcome.done:
            failure = EngineFailed(f"engine {self.replica} {self.tap.incomplete()}", self.replica)
            rest += self.tap.failing(failure.message)
        # From here on ``receive`` says "disconnect" because the answer is complete.
        self.watch.stop()
        await send({"type": "http.response.body", "body": rest, "more_body": False})
        return failure


_HOLD_AT_MOST = 65536  # bytes after a stream's last event held for the response's end


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
