"""Client APIs the dataplane speaks besides Chat Completions (B9).

Engines (every SGLang and vLLM) speak Chat Completions; Claude Code speaks only
Anthropic Messages (``messages.py``) and Codex CLI only OpenAI Responses
(``responses.py``). Each module translates its API to Chat Completions and the
engine's reply back, and the dataplane schedules the turn exactly like a Chat
Completions turn (``routes/``).

A module gives the dataplane:

* ``parse(raw: bytes) -> Translated`` — the client's body checked and translated;
  anything the proxy cannot translate faithfully raises ``BadRequest`` naming it
  (a 400 before the turn takes a slot), never a silently different request;
* ``error_body(status: int, message: str, code: str | None) -> dict`` — an error in
  the API's own shape, for every error the dataplane itself answers;
* ``observe(event: dict, outcome: TurnOutcome) -> None`` and
  ``observe_reply(body: dict, outcome: TurnOutcome) -> None`` — what a reply in the
  API's own shape says (first token, tool call IDs, finish, usage), for an
  endpoint that serves the API natively: its reply passes through unchanged and is
  only read, as Chat Completions replies are;
* ``stream_error(message: str, sequence_number: int) -> bytes`` — the API's error
  event, sent when such a native stream breaks off.

``parse`` guarantees that ``chat`` serialises (no lone surrogates, no integers
JSON cannot carry), so nothing after admission can fail on the client's input.

A ``Translated`` request gives:

* ``model`` and ``stream``, as the client asked;
* ``chat`` — the Chat Completions body for the engine (its ``model`` is the
  client's; the dataplane puts the served model in, and asks a stream for usage);
* ``image_at`` — where the request's first image is (``messages[0].content[1]``), or
  None: images (``image_url`` parts in ``chat``) go only to endpoints with
  ``vision = true``, which the dataplane checks before admission (``images.py``);
* ``reply(completion: dict) -> dict`` — a non-streamed ``chat.completion`` as the
  API's reply;
* ``stream_translator() -> StreamTranslator`` — a translator for one streamed reply.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from luftpause.dataplane.outcome import TurnOutcome


class StreamTranslator(Protocol):
    """Chat Completions chunks in, the API's server-sent events out, event by event
    (nothing is held back beyond what one event needs)."""

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        """One ``chat.completion.chunk`` (usage-only chunks included); the SSE bytes
        the client gets for it (possibly none)."""
        ...

    def done(self) -> bytes:
        """The engine's ``[DONE]``: the events that close the reply."""
        ...

    def failed(self, message: str) -> bytes:
        """The engine's stream broke off: the API's error event, if it has one."""
        ...


class Translated(Protocol):
    @property
    def model(self) -> str: ...

    @property
    def stream(self) -> bool: ...

    @property
    def chat(self) -> dict[str, Any]: ...

    @property
    def image_at(self) -> str | None: ...

    def reply(self, completion: dict[str, Any]) -> dict[str, Any]: ...

    def stream_translator(self) -> StreamTranslator: ...


@dataclass(frozen=True)
class Untranslated:
    """A request the proxy cannot translate, for endpoints that serve its API natively
    (all that serve its model do): passed through as it is. ``reason``: why it could
    not be translated."""

    model: str
    stream: bool
    chat: dict[str, Any]  # only what identity reads: no conversation
    reason: str
    image_at: str | None = None  # passed through: the endpoint reads any images itself

    def reply(self, completion: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError(f"no translation: {self.reason}")

    def stream_translator(self) -> StreamTranslator:
        raise RuntimeError(f"no translation: {self.reason}")


@dataclass(frozen=True)
class ClientApi:
    """One client API a turn route speaks, as the dataplane uses it.

    Its translating module is imported on first use (or by :meth:`load`): the wire
    types it builds on (the ``anthropic`` and ``openai`` packages' models) take seconds
    to import, which a process that may never see the route (a fake engine) should not
    pay at start. The dataplane loads both up front, so no client's first turn waits.
    """

    name: str  # its ``NativeApi`` value: what an endpoint lists in ``native_apis``
    route: str  # the route, the same on the dataplane and on a native endpoint
    module: str  # the module that translates it (``messages``, ``responses``)

    @functools.cached_property
    def _impl(self) -> ModuleType:
        return importlib.import_module(f"{__name__}.{self.module}")

    def load(self) -> None:
        """Import the translating module now."""
        self._impl  # noqa: B018 - the property imports it

    def parse(self, raw: bytes) -> Translated:
        return self._impl.parse(raw)  # type: ignore[no-any-return]

    def error_body(self, status: int, message: str, code: str | None) -> dict[str, Any]:
        return self._impl.error_body(status, message, code)  # type: ignore[no-any-return]

    def observe(self, event: dict[str, Any], outcome: TurnOutcome) -> None:
        self._impl.observe(event, outcome)

    def observe_reply(self, body: dict[str, Any], outcome: TurnOutcome) -> None:
        self._impl.observe_reply(body, outcome)

    def stream_error(self, message: str, sequence_number: int) -> bytes:
        """(message, sequence number) -> the API's error event."""
        return self._impl.stream_error(message, sequence_number)  # type: ignore[no-any-return]


def client_apis() -> tuple[ClientApi, ...]:
    """Anthropic Messages and OpenAI Responses (their modules not imported yet)."""
    return (
        ClientApi("messages", "/v1/messages", "messages"),
        ClientApi("responses", "/v1/responses", "responses"),
    )
