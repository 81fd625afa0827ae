"""The runtime's client of the dataplane (R4, R13-R15).

Every turn is one ``POST {dataplane}/v1/chat/completions`` carrying the run's
identity: ``x-luftpause-run-id``, ``x-luftpause-class`` and ``x-luftpause-caller``
(plus ``Authorization: Bearer`` when a token is set, X2; without a token no
``Authorization`` header is sent, whatever ``OPENAI_API_KEY`` says).

Turns are streamed (``runtime.stream_turns``, on by default) with
``stream_options.include_usage``: the dataplane times a streamed reply from its
first token to its end, which is what the decode pace (S2) reads, and a
non-streamed reply shows it neither. The events are put back together
(:mod:`luftpause.runtime.stream_reply`) into the reply a non-streamed request
returns, so the loop sees no difference; a server that answers a streamed request
with JSON is read as such. Streamed turns go through httpx and ``orjson`` directly,
each event read once as a plain dict: the ``openai`` package's stream would build a
typed chunk per token.

Non-streamed turns (``decide``'s one-token turn, and every turn with
``stream_turns = false``) and the model list go through the ``openai`` package's
async client, so replies arrive as :class:`~openai.types.chat.ChatCompletion` and
failures as its typed errors (``RateLimitError``, ``APIStatusError``,
``APIConnectionError``). Its own retries are off (``max_retries=0``): the ones
below are the only ones. Such a turn is sent with the client's generic
``post(..., cast_to=ChatCompletion)`` rather than ``chat.completions.create``:
measured (a fake dataplane in-process, one turn at a time), ``create`` walks the
whole request as TypedDicts before sending it - a no-op for the plain dicts sent
here that costs about 1.9 ms of event-loop time per turn for a two-message
conversation and 8 ms after eight tool rounds, growing with every message - while
``post`` sends the body as it is for about 1.1 ms flat (plain httpx: 0.3 ms). The
body on the wire is the same. :meth:`DataplaneClient.chat` returns the reply as
the JSON object the dataplane sent (``ChatCompletion.to_dict``: only the fields it
sent, extra ones such as engine timings kept).

Failures (R14):

* 429: wait ``Retry-After`` (seconds or an HTTP date; else the configured
  default, 1 s) and send the same turn again, for as long as the run lives;
  cancelling the run cancels the wait. 429s never use up the retries below.
* 5xx, connection errors and a stream that breaks off (it ends before
  ``[DONE]``, or with an error event whose code is not a 4xx: an error event is
  read as its code would be read as a status, so a 4xx one fails the turn at once
  and a 429 waits): a few retries (3) of the whole turn with
  exponential backoff and jitter (0.5 s, 1 s, 2 s, each times a random factor in
  [0.5, 1.5)), then :class:`TurnFailed`.
* any other status (404 unknown model, 400 ...): :class:`TurnFailed` at once,
  with the dataplane's ``{"error": {"message"}}`` text; so does a 200 that is not
  a chat completion (a non-JSON body or event, no choices).
* one request to the dataplane that takes longer than the turn timeout
  (``turn_timeout_s``, 10 min) fails the turn. The timeout bounds each request,
  not the 429 waits between requests (those last as long as the run).

``end_run`` (R15) and ``classify`` (R13, not OpenAI routes) use the same
connection pool through plain httpx.

``tool_call_origin`` (#38) asks ``GET /v1/tool_calls/{id}`` which run made a
harness's tool call. It is bounded (``ORIGIN_LOOKUP_TIMEOUT_S`` in all) and never
raises: any failure is logged once and answered None. Each try opens a connection
of its own: when the 404 says several dataplane processes share the port
(``x-luftpause-dataplane-workers: N``, B6), the kernel picks a process per
connection and the one that relayed the reply may be another, so a 404 is tried
again, up to ``8 × N`` times (16 tries miss both of two processes with probability
2^-16); with one process a 404 is final.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import openai
import orjson
from openai.types.chat import ChatCompletion

from luftpause.config import ServiceClass
from luftpause.runtime.stream_reply import ReplyAssembler, SseLines, StreamError
from luftpause.tool_calls import WORKERS_HEADER, ToolCallOrigin

log = logging.getLogger("luftpause.runtime.llm")

TRANSIENT_RETRIES = 3
TRANSIENT_BACKOFF_S = 0.5
CONNECT_TIMEOUT_S = 5.0
SIDE_CALL_TIMEOUT_S = 10.0  # the model list and a run's end
ORIGIN_LOOKUP_TIMEOUT_S = 2.0  # all tries of one tool call lookup together (#38)
ORIGIN_TRIES_PER_WORKER = 8
ORIGIN_MAX_TRIES = 64
_MAX_RUN_ID = 256
# Placeholder for the openai client's required key; never sent (see _openai_headers).
_NO_KEY = "luftpause-no-token"
_HeaderMap = Mapping[str, str | openai.Omit]


class TurnFailed(Exception):
    """A turn could not be completed; the message says why (shown to the MCP client)."""


class _RateLimited(Exception):
    """A 429: send the same turn again after ``wait_s``."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s


class _Transient(Exception):
    """A failure worth retrying (5xx, connection, a broken stream): ``text`` is logged,
    ``final`` fails the turn once the retries are used up."""

    def __init__(self, text: str, final: str) -> None:
        self.text = text
        self.final = final


@dataclass(frozen=True)
class Identity:
    run_id: str
    service_class: str
    caller: str


def _error_text(response: httpx.Response | Any) -> str:
    """The dataplane's ``{"error": {"message"}}`` text (or the body, cut short)."""
    try:
        body = response.json()
    except ValueError:
        return str(response.text)[:300] or str(response.reason_phrase)
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
    return str(body)[:300]


def _origin(call_id: str, response: httpx.Response) -> ToolCallOrigin | None:
    """A ``GET /v1/tool_calls/{id}`` answer as an origin; None (logged) when it is not one."""
    try:
        body = response.json()
    except ValueError:
        body = None
    run_id = body.get("runId") if isinstance(body, dict) else None
    if not isinstance(run_id, str) or not 0 < len(run_id) <= _MAX_RUN_ID:
        log.info("tool call %s: the dataplane's answer names no run: %.200r", call_id, body)
        return None
    assert isinstance(body, dict)
    traceparent = body.get("traceparent")

    def text(key: str) -> str:
        value = body.get(key)
        return value if isinstance(value, str) else ""

    return ToolCallOrigin(
        call_id,
        run_id,
        text("serviceClass"),
        text("caller"),
        traceparent if isinstance(traceparent, str) and traceparent else None,
    )


def retry_after_s(value: str | None, default: float) -> float:
    """Seconds to wait per a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else default
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return default
    return max(0.0, when.timestamp() - time.time())


class DataplaneClient:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        turn_timeout_s: float,
        retry_after_default_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
        transient_retries: int = TRANSIENT_RETRIES,
        transient_backoff_s: float = TRANSIENT_BACKOFF_S,
        class_headers: Mapping[ServiceClass, Mapping[str, str]] | None = None,
        run_id_headers: tuple[str, ...] = (),
        class_priority: Mapping[ServiceClass, int] | None = None,
        stream_turns: bool = True,
    ) -> None:
        """``class_headers``, ``run_id_headers``, ``class_priority``: for an upstream that
        is not a luftpause dataplane (``runtime.class_headers`` and the next two)."""
        self.base_url = base_url.rstrip("/")
        self._class_headers: dict[str, Mapping[str, str]] = {
            str(k): v for k, v in (class_headers or {}).items()
        }
        self._run_id_headers = run_id_headers
        self._class_priority: dict[str, int] = {
            str(k): v for k, v in (class_priority or {}).items()
        }
        self._token = token
        self._transport = transport
        self._lookups: httpx.AsyncClient | None = None  # (see _lookup_client)
        self._warned_lookup_auth = False
        self.stream_turns = stream_turns
        self.turn_timeout_s = turn_timeout_s
        self.retry_after_default_s = retry_after_default_s
        self.transient_retries = transient_retries
        self.transient_backoff_s = transient_backoff_s
        self._random = random.Random()
        # One pool for every run: no connection cap (a thousand runs may each have a
        # turn in flight; the dataplane, not this pool, decides who goes first). No read
        # timeout: each turn's request is bounded by the turn timeout instead.
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        self._http = httpx.AsyncClient(
            timeout=timeout,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            transport=transport,
        )
        self._openai = openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1",
            api_key=token or _NO_KEY,
            max_retries=0,
            timeout=timeout,  # type: ignore[arg-type]  # openai accepts httpx's Timeout too
            http_client=self._http,  # type: ignore[arg-type]  # ... and httpx's client
        )
        self._models: list[str] | None = None
        self._warned_no_usage = False

    async def aclose(self) -> None:
        await self._openai.close()
        await self._http.aclose()
        if self._lookups is not None:
            await self._lookups.aclose()

    def _lookup_client(self) -> httpx.AsyncClient:
        """The client for tool call lookups, made at the first (building one costs tens
        of milliseconds): no kept-alive connections, so each try is a new connection
        that the kernel may hand to another dataplane worker. With a transport given
        (tests), that transport, which the turns' client closes."""
        if self._transport is not None:
            return self._http
        if self._lookups is None:
            self._lookups = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
        return self._lookups

    def _headers(self, identity: Identity | None) -> dict[str, str]:
        headers: dict[str, str] = {}
        if identity is not None:
            headers.update(self._class_headers.get(identity.service_class, {}))
            for name in self._run_id_headers:
                headers[name] = identity.run_id
            headers["x-luftpause-run-id"] = identity.run_id
            headers["x-luftpause-class"] = identity.service_class
            headers["x-luftpause-caller"] = identity.caller
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _openai_headers(self, identity: Identity | None) -> dict[str, str | openai.Omit]:
        """:meth:`_headers` for the openai client: no ``Authorization`` without a token, and
        none of the organisation/project headers it would take from ``OPENAI_*``."""
        headers: dict[str, str | openai.Omit] = {
            "Authorization": openai.omit,
            "OpenAI-Organization": openai.omit,
            "OpenAI-Project": openai.omit,
        }
        headers.update(self._headers(identity))
        return headers

    def backoff_s(self, failures: int) -> float:
        """The wait after the ``failures``-th 5xx or connection error of a turn: exponential,
        times a random factor in [0.5, 1.5) so runs that failed together retry apart."""
        delay = self.transient_backoff_s * 2.0 ** (failures - 1)
        return delay * (0.5 + self._random.random())

    async def chat(
        self, body: dict[str, Any], identity: Identity, *, stream: bool | None = None
    ) -> dict[str, Any]:
        """One turn; retries per the module docstring. Raises :class:`TurnFailed`.

        ``stream``: ask for the reply streamed (default: ``stream_turns``); either way
        it returns the reply as a non-streamed request would: ``choices[0].message``,
        ``usage``, ...
        """
        stream = self.stream_turns if stream is None else stream
        priority = self._class_priority.get(identity.service_class)
        if priority is not None and "priority" not in body:
            body = {**body, "priority": priority}
        if stream:
            options = body.get("stream_options")
            body = {
                **body,
                "stream": True,
                "stream_options": {
                    **(options if isinstance(options, dict) else {}),
                    "include_usage": True,
                },
            }
        failures = 0  # 5xx, connection errors and broken streams so far
        while True:
            try:
                async with asyncio.timeout(self.turn_timeout_s):
                    if stream:
                        return await self._streamed(body, identity)
                    return await self._unary(body, identity)
            except TimeoutError:
                raise TurnFailed(f"turn timed out after {self.turn_timeout_s:g} s") from None
            except _RateLimited as exc:
                log.info(
                    "run %s: 429 from the dataplane; retrying in %.1f s",
                    identity.run_id,
                    exc.wait_s,
                )
                await asyncio.sleep(exc.wait_s)
            except _Transient as exc:
                failures += 1
                if failures > self.transient_retries:
                    raise TurnFailed(exc.final) from None
                log.warning("run %s: %s; retrying", identity.run_id, exc.text)
                await asyncio.sleep(self.backoff_s(failures))

    async def _unary(self, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        """One non-streamed try, through the openai client."""
        headers: _HeaderMap = self._openai_headers(identity)
        try:
            reply = await self._openai.post(
                "/chat/completions",
                body=body,
                cast_to=ChatCompletion,
                options={"headers": headers},
            )
        except openai.APIStatusError as exc:  # 429 included
            raise self._status_failure(exc.response) from None
        except openai.APIConnectionError as exc:
            raise self._unreachable(exc.__cause__ or exc) from None
        except openai.APIError as exc:  # a reply the client could not read
            raise TurnFailed(f"turn failed: {exc}") from None
        return _reply_json(reply)

    async def _streamed(self, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        """One streamed try: the events put back together (:mod:`stream_reply`). A
        server that answers with JSON instead is read as a non-streamed reply (and one
        that sends events under another content type, as events)."""
        headers = self._headers(identity)
        headers["Content-Type"] = "application/json"
        headers["Accept"] = "text/event-stream, application/json"
        url = f"{self.base_url}/v1/chat/completions"
        answered = False  # a 200 came: a transport error now breaks the stream off
        lines = SseLines()
        reply = ReplyAssembler()
        try:
            async with self._http.stream(
                "POST", url, content=orjson.dumps(body), headers=headers
            ) as response:
                answered = response.status_code == 200
                if not answered:
                    await response.aread()
                    raise self._status_failure(response)
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if kind != "text/event-stream":
                    whole = await response.aread()
                    if not whole.lstrip().startswith((b"data:", b":")):
                        return _reply_dict(response)
                    for event in [*lines.feed(whole), *lines.close()]:
                        reply.feed_event(event)
                else:
                    async for piece in response.aiter_bytes():
                        for event in lines.feed(piece):
                            reply.feed_event(event)
                        if reply.error is not None:
                            break
                    else:
                        for event in lines.close():
                            reply.feed_event(event)
        except httpx.RequestError as exc:  # connect, read, a broken stream
            if reply.done:  # the reply is whole: only the connection's end failed
                log.debug("run %s: the stream's end failed after [DONE]: %r", identity.run_id, exc)
            elif answered:
                text = f"turn failed: the stream broke off: {exc!r}"
                raise _Transient(text, text) from None
            else:
                raise self._unreachable(exc) from None
        except StreamError as exc:
            raise TurnFailed(f"turn failed: {exc}") from None
        if reply.error is not None:
            raise self._error_event(reply.error, reply.error_code)
        if not reply.done:
            text = "turn failed: the stream ended before [DONE]"
            raise _Transient(text, text)
        data = _with_a_choice(reply.result())
        if "usage" not in data and not self._warned_no_usage:
            self._warned_no_usage = True
            log.warning(
                "%s streams replies without usage although asked (stream_options."
                "include_usage): runs' token counts and token budgets will read 0; set "
                "runtime.stream_turns = false for this upstream",
                self.base_url,
            )
        return data

    def _error_event(self, message: str, code: int | None) -> Exception:
        """An error event mid-stream: its code read as an HTTP status would be (a 4xx
        fails the turn at once, 429 waits; else it is retried)."""
        shown = f"{code} {message}" if code is not None else message
        text = f"turn failed: the stream ended with an error: {shown}"
        if code == 429:
            return _RateLimited(self.retry_after_default_s)
        if code is not None and 400 <= code < 500:
            return TurnFailed(text)
        return _Transient(text, text)

    def _status_failure(self, response: httpx.Response | Any) -> Exception:
        """What a non-200 answer means: wait (429), retry (5xx) or fail the turn. Either
        client's response (the openai package's may be its own httpx's)."""
        if response.status_code == 429:
            return _RateLimited(
                retry_after_s(response.headers.get("retry-after"), self.retry_after_default_s)
            )
        text = f"turn failed: {response.status_code} {_error_text(response)}"
        if response.status_code < 500:
            return TurnFailed(text)
        return _Transient(text, text)

    def _unreachable(self, cause: BaseException) -> _Transient:
        return _Transient(
            f"dataplane error {cause!r}", f"dataplane unreachable at {self.base_url}: {cause!r}"
        )

    async def end_run(self, run_id: str) -> None:
        """R15: tell the dataplane the run is over; a 404 or an outage is only logged."""
        url = f"{self.base_url}/v1/runs/{run_id}"
        try:
            response = await self._http.delete(
                url, headers=self._headers(None), timeout=SIDE_CALL_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            log.warning("run %s: could not report its end to the dataplane: %r", run_id, exc)
            return
        if response.status_code == 404:
            log.info("run %s: dataplane does not know the run (404) - nothing to forget", run_id)
        elif response.status_code >= 400:
            log.warning(
                "run %s: dataplane answered %d to the run's end: %s",
                run_id,
                response.status_code,
                _error_text(response),
            )

    async def tool_call_origin(self, call_id: str) -> ToolCallOrigin | None:
        """The turn whose reply made tool call ``call_id`` (its run, and its span's
        ``traceparent``), per the dataplane; None when it does not know it or cannot be
        asked (see the module docstring)."""
        url = f"{self.base_url}/v1/tool_calls/{quote(call_id, safe='')}"
        deadline = time.monotonic() + ORIGIN_LOOKUP_TIMEOUT_S
        tries, most = 0, 1
        client = self._lookup_client()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                log.info("tool call %s: no answer from the dataplane in time", call_id)
                return None
            tries += 1
            try:
                response = await client.get(url, headers=self._headers(None), timeout=left)
            except httpx.HTTPError as exc:
                log.info("tool call %s: cannot ask the dataplane: %r", call_id, exc)
                return None
            if response.status_code == 404:
                workers = _count(response.headers.get(WORKERS_HEADER))
                if workers > 1:
                    most = min(ORIGIN_TRIES_PER_WORKER * workers, ORIGIN_MAX_TRIES)
                if tries < most:
                    continue
                log.info("tool call %s: the dataplane does not know it", call_id)
                return None
            if response.status_code in (401, 403):
                if not self._warned_lookup_auth:
                    self._warned_lookup_auth = True
                    log.warning(
                        "the dataplane refused a tool call lookup (%d: %s): sub-agents of "
                        "agent harnesses get no session until the runtime's token is the "
                        "dataplane's",
                        response.status_code,
                        _error_text(response),
                    )
                return None
            if response.status_code != 200:
                log.info(
                    "tool call %s: dataplane answered %d: %s",
                    call_id,
                    response.status_code,
                    _error_text(response),
                )
                return None
            return _origin(call_id, response)

    async def models(self) -> list[str]:
        """The models ``GET /v1/models`` lists (cached after the first success)."""
        if self._models:
            return self._models
        try:
            page = await self._openai.models.list(
                extra_headers=self._openai_headers(None), timeout=SIDE_CALL_TIMEOUT_S
            )
        except openai.APIStatusError as exc:
            raise TurnFailed(
                f"cannot list models: {exc.status_code} {_error_text(exc.response)}"
            ) from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise TurnFailed(f"cannot list models at {self.base_url}: {cause!r}") from None
        except openai.APIError as exc:
            raise TurnFailed(f"cannot list models at {self.base_url}: {exc}") from None
        listed = getattr(page, "data", None)
        entries: list[Any] = listed if isinstance(listed, list) else []
        models = [m.id for m in entries if isinstance(getattr(m, "id", None), str) and m.id]
        if models:
            self._models = models
        return models

    async def classify(self, text: str, model: str | None, caller: str) -> dict[str, Any]:
        """R13 without labels: ``POST /v1/decide`` (vLLM ``/classify`` format).

        Pointed straight at an engine (no dataplane, e.g. the baseline arm), the
        route does not exist there (a 404 that is not a luftpause error body); then
        the engine's own ``/classify`` is used.
        """
        body: dict[str, Any] = {"input": text}
        if model:
            body["model"] = model
        headers = self._headers(None)
        headers["x-luftpause-caller"] = caller
        try:
            response = await self._http.post(
                f"{self.base_url}/v1/decide", json=body, headers=headers, timeout=60.0
            )
            if response.status_code == 404 and not _is_luftpause_error(response):
                response = await self._http.post(
                    f"{self.base_url}/classify", json=body, headers=headers, timeout=60.0
                )
        except httpx.HTTPError as exc:
            raise TurnFailed(f"classifier unreachable at {self.base_url}: {exc!r}") from None
        if response.status_code != 200:
            raise TurnFailed(f"decide failed: {response.status_code} {_error_text(response)}")
        try:
            data = response.json()
        except ValueError:
            raise TurnFailed("decide failed: the classifier sent a non-JSON body") from None
        if not isinstance(data, dict):
            raise TurnFailed("decide failed: the classifier sent no JSON object")
        return data


def _reply_json(reply: object) -> dict[str, Any]:
    """The reply as a JSON object with at least one choice, or :class:`TurnFailed`."""
    if isinstance(reply, str):  # the client hands back what is not JSON as text
        raise TurnFailed("turn failed: the dataplane sent a non-JSON body")
    if not isinstance(reply, ChatCompletion):
        raise TurnFailed("turn failed: the reply is not a JSON object")
    return _with_a_choice(reply.to_dict(mode="json", warnings=False))


def _reply_dict(response: httpx.Response) -> dict[str, Any]:
    """A 200 answered with JSON: the reply, checked as :func:`_reply_json` checks it."""
    try:
        data = response.json()
    except ValueError:
        raise TurnFailed("turn failed: the dataplane sent a non-JSON body") from None
    if not isinstance(data, dict):
        raise TurnFailed("turn failed: the reply is not a JSON object")
    return _with_a_choice(data)


def _with_a_choice(data: dict[str, Any]) -> dict[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise TurnFailed("turn failed: the reply has no choices")
    return data


def _is_luftpause_error(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


def _count(value: str | None) -> int:
    """A header's whole number, else 1 (the dataplane's workers)."""
    try:
        return max(1, int(value or "1"))
    except ValueError:
        return 1
