"""The runtime's client of the dataplane (R4, R13-R15).

Every turn is one non-streamed ``POST {dataplane}/v1/chat/completions`` carrying
the run's identity: ``x-luftpause-run-id``, ``x-luftpause-class`` and
``x-luftpause-caller`` (plus ``Authorization: Bearer`` when a token is set, X2;
without a token no ``Authorization`` header is sent, whatever ``OPENAI_API_KEY``
says).

Turns and the model list go through the ``openai`` package's async client, so
replies arrive as :class:`~openai.types.chat.ChatCompletion` and failures as its
typed errors (``RateLimitError``, ``APIStatusError``, ``APIConnectionError``).
Its own retries are off (``max_retries=0``): the ones below are the only ones.
A turn is sent with the client's generic ``post(..., cast_to=ChatCompletion)``
rather than ``chat.completions.create``: measured (a fake dataplane in-process,
one turn at a time), ``create`` walks the whole request as TypedDicts before
sending it - a no-op for the plain dicts sent here that costs about 1.9 ms of
event-loop time per turn for a two-message conversation and 8 ms after eight
tool rounds, growing with every message - while ``post`` sends the body as it
is for about 1.1 ms flat (plain httpx: 0.3 ms). The body on the wire is the
same. :meth:`DataplaneClient.chat` returns the reply as the JSON object the
dataplane sent (``ChatCompletion.to_dict``: only the fields it sent, extra
ones such as engine timings kept).

Failures (R14):

* 429: wait ``Retry-After`` (seconds or an HTTP date; else the configured
  default, 1 s) and send the same turn again, for as long as the run lives;
  cancelling the run cancels the wait. 429s never use up the retries below.
* 5xx and connection errors: a few retries (3) with exponential backoff and
  jitter (0.5 s, 1 s, 2 s, each times a random factor in [0.5, 1.5)), then
  :class:`TurnFailed`.
* any other status (404 unknown model, 400 ...): :class:`TurnFailed` at once,
  with the dataplane's ``{"error": {"message"}}`` text.
* one request to the dataplane that takes longer than the turn timeout
  (``turn_timeout_s``, 10 min) fails the turn. The timeout bounds each request,
  not the 429 waits between requests (those last as long as the run).

``end_run`` (R15) and ``classify`` (R13, not OpenAI routes) use the same
connection pool through plain httpx.
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

import httpx
import openai
from openai.types.chat import ChatCompletion

from luftpause.config import ServiceClass

log = logging.getLogger("luftpause.runtime.llm")

TRANSIENT_RETRIES = 3
TRANSIENT_BACKOFF_S = 0.5
CONNECT_TIMEOUT_S = 5.0
SIDE_CALL_TIMEOUT_S = 10.0  # the model list and a run's end
# Placeholder for the openai client's required key; never sent (see _openai_headers).
_NO_KEY = "luftpause-no-token"
_HeaderMap = Mapping[str, str | openai.Omit]


class TurnFailed(Exception):
    """A turn could not be completed; the message says why (shown to the MCP client)."""


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

    async def aclose(self) -> None:
        await self._openai.close()
        await self._http.aclose()

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

    async def chat(self, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        """One turn; retries per the module docstring. Raises :class:`TurnFailed`.

        Returns the reply as the dataplane sent it: ``choices[0].message``, ``usage``, ...
        """
        headers: _HeaderMap = self._openai_headers(identity)
        priority = self._class_priority.get(identity.service_class)
        if priority is not None and "priority" not in body:
            body = {**body, "priority": priority}
        failures = 0  # 5xx and connection errors so far
        while True:
            try:
                async with asyncio.timeout(self.turn_timeout_s):
                    reply = await self._openai.post(
                        "/chat/completions",
                        body=body,
                        cast_to=ChatCompletion,
                        options={"headers": headers},
                    )
            except TimeoutError:
                raise TurnFailed(f"turn timed out after {self.turn_timeout_s:g} s") from None
            except openai.RateLimitError as exc:
                wait = retry_after_s(
                    exc.response.headers.get("retry-after"), self.retry_after_default_s
                )
                log.info(
                    "run %s: 429 from the dataplane; retrying in %.1f s", identity.run_id, wait
                )
                await asyncio.sleep(wait)
                continue
            except openai.APIStatusError as exc:
                text = f"turn failed: {exc.status_code} {_error_text(exc.response)}"
                if exc.status_code < 500:
                    raise TurnFailed(text) from None
                failures += 1
                if failures > self.transient_retries:
                    raise TurnFailed(text) from None
                log.warning("run %s: %s; retrying", identity.run_id, text)
                await asyncio.sleep(self.backoff_s(failures))
                continue
            except openai.APIConnectionError as exc:
                cause = exc.__cause__ or exc
                failures += 1
                if failures > self.transient_retries:
                    raise TurnFailed(
                        f"dataplane unreachable at {self.base_url}: {cause!r}"
                    ) from None
                log.warning("run %s: dataplane error %r; retrying", identity.run_id, cause)
                await asyncio.sleep(self.backoff_s(failures))
                continue
            except openai.APIError as exc:  # a reply the client could not read
                raise TurnFailed(f"turn failed: {exc}") from None
            return _reply_json(reply)

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
    data = reply.to_dict(mode="json", warnings=False)  # its shape is checked here
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
