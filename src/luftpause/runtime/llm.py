"""The runtime's client of the dataplane (R4, R13-R15).

Every turn is one non-streamed ``POST {dataplane}/v1/chat/completions`` carrying
the run's identity: ``x-luftpause-run-id``, ``x-luftpause-class`` and
``x-luftpause-caller`` (plus ``Authorization: Bearer`` when a token is set, X2).

Failures (R14):

* 429: wait ``Retry-After`` (seconds or an HTTP date; else the configured
  default, 1 s) and send the same turn again, for as long as the run lives;
  cancelling the run cancels the wait.
* 5xx and connection errors: a few retries with backoff, then :class:`TurnFailed`.
* any other status (404 unknown model, 400 ...): :class:`TurnFailed` at once,
  with the dataplane's ``{"error": {"message"}}`` text.
* a turn that takes longer than the turn timeout (10 min) fails.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger("luftpause.runtime.llm")

TRANSIENT_RETRIES = 3
TRANSIENT_BACKOFF_S = 0.5
CONNECT_TIMEOUT_S = 5.0


class TurnFailed(Exception):
    """A turn could not be completed; the message says why (shown to the MCP client)."""


@dataclass(frozen=True)
class Identity:
    run_id: str
    service_class: str
    caller: str


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
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
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
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
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.turn_timeout_s = turn_timeout_s
        self.retry_after_default_s = retry_after_default_s
        # One pool for every run: no connection cap (a thousand runs may each have a
        # turn in flight; the dataplane, not this pool, decides who goes first).
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(turn_timeout_s, connect=CONNECT_TIMEOUT_S, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            transport=transport,
        )
        self._models: list[str] | None = None

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(self, identity: Identity | None) -> dict[str, str]:
        headers: dict[str, str] = {}
        if identity is not None:
            headers["x-luftpause-run-id"] = identity.run_id
            headers["x-luftpause-class"] = identity.service_class
            headers["x-luftpause-caller"] = identity.caller
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    async def chat(self, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        """One turn; retries per the module docstring. Raises :class:`TurnFailed`."""
        url = f"{self.base_url}/v1/chat/completions"
        headers = self._headers(identity)
        transient = 0
        try:
            async with asyncio.timeout(self.turn_timeout_s):
                while True:
                    try:
                        response = await self._http.post(url, json=body, headers=headers)
                    except httpx.TransportError as exc:
                        transient += 1
                        if transient > TRANSIENT_RETRIES:
                            raise TurnFailed(
                                f"dataplane unreachable at {self.base_url}: {exc!r}"
                            ) from None
                        log.warning("run %s: dataplane error %r; retrying", identity.run_id, exc)
                        await asyncio.sleep(TRANSIENT_BACKOFF_S * 2 ** (transient - 1))
                        continue
                    if response.status_code == 429:
                        wait = retry_after_s(
                            response.headers.get("retry-after"), self.retry_after_default_s
                        )
                        log.info(
                            "run %s: 429 from the dataplane; retrying in %.1f s",
                            identity.run_id,
                            wait,
                        )
                        await asyncio.sleep(wait)
                        continue
                    if response.status_code >= 500:
                        transient += 1
                        if transient > TRANSIENT_RETRIES:
                            raise TurnFailed(
                                f"turn failed: {response.status_code} {_error_text(response)}"
                            )
                        await asyncio.sleep(TRANSIENT_BACKOFF_S * 2 ** (transient - 1))
                        continue
                    if response.status_code != 200:
                        raise TurnFailed(
                            f"turn failed: {response.status_code} {_error_text(response)}"
                        )
                    try:
                        data = response.json()
                    except ValueError:
                        raise TurnFailed(
                            "turn failed: the dataplane sent a non-JSON body"
                        ) from None
                    if not isinstance(data, dict) or not data.get("choices"):
                        raise TurnFailed("turn failed: the reply has no choices")
                    return data
        except TimeoutError:
            raise TurnFailed(f"turn timed out after {self.turn_timeout_s:g} s") from None

    async def end_run(self, run_id: str) -> None:
        """R15: tell the dataplane the run is over; a 404 or an outage is only logged."""
        url = f"{self.base_url}/v1/runs/{run_id}"
        try:
            response = await self._http.delete(url, headers=self._headers(None), timeout=10.0)
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
            response = await self._http.get(
                f"{self.base_url}/v1/models", headers=self._headers(None), timeout=10.0
            )
        except httpx.HTTPError as exc:
            raise TurnFailed(f"cannot list models at {self.base_url}: {exc!r}") from None
        if response.status_code != 200:
            raise TurnFailed(f"cannot list models: {response.status_code} {_error_text(response)}")
        data = response.json().get("data") if isinstance(response.json(), dict) else None
        models = [str(m["id"]) for m in data or [] if isinstance(m, dict) and m.get("id")]
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
        data = response.json()
        if not isinstance(data, dict):
            raise TurnFailed("decide failed: the classifier sent no JSON object")
        return data


def _is_luftpause_error(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)
