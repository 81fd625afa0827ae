"""Every way a turn can go wrong, as one small exception tree, and how it ends.

::

    TurnError                  status            outcome (metric label)
    ├── BadRequest             400               rejected            never admitted
    │   ├── BodyTooLarge       413
    │   └── NotJson            415
    ├── Unauthorized           401               rejected            never admitted
    ├── UnknownModel           404               rejected            never admitted
    ├── ClientLeft             499 (nobody sees) client_left / abandoned
    ├── EngineUnreachable      502               engine_unreachable  connect failed: the
    │                                                                replica leaves placement
    │                                                                (placed_again when the
    │                                                                turn was placed again)
    ├── EngineFailed           502 or a cut      engine_broke        failed after connecting
    │                          stream
    ├── EngineRejected         the engine's      engine_rejected     429/5xx passed on as is
    └── InternalError          500               internal_error      a bug of ours, logged
                                                                     with its traceback

Each member carries its ``outcome``; nothing recovers an outcome by reading a
message. An engine failure also says whether any byte of the request reached the
engine (``not_sent``): a turn that failed before then may be placed again.
``response(run_id, shape)`` is the one place a turn failure becomes an HTTP answer:
``{"error": {"message": ..., "type": ..., "param": null, "code": ...}}``
(D6, OpenAI's shape) or, on a route of another API, that API's error shape (B9),
with ``x-luftpause-run-id``. Values a client sent are echoed
through ``shown`` (``luftpause/shown.py``, shared with the runtime) so a megabyte
of model name is not sent back whole.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar

from starlette.responses import JSONResponse, Response

from luftpause.shown import shown as shown  # re-exported: the dataplane quotes values with it

RUN_HEADER = "x-luftpause-run-id"
REPLICA_HEADER = "x-luftpause-replica"


class Outcome(Enum):
    """How a turn ended; the ``outcome`` label of ``luftpause_dataplane_turns``."""

    FINISHED = "finished"
    PAUSED_ON_TOOL = "paused_on_tool"
    REJECTED = "rejected"  # bad request, bad token or unknown model: never queued
    ABANDONED = "abandoned"  # client left while held
    CLIENT_LEFT = "client_left"  # client left after admission
    ENGINE_UNREACHABLE = "engine_unreachable"  # no connection to the engine
    # no connection to the engine, and the request was admitted again as a new turn
    PLACED_AGAIN = "placed_again"
    ENGINE_REJECTED = "engine_rejected"  # 429 / 5xx
    ENGINE_BROKE = "engine_broke"  # failed after connecting, e.g. mid-stream
    INTERNAL_ERROR = "internal_error"  # a bug of ours


# An error body in a client API's own shape: (status, message, code) -> body (B9).
ErrorShape = Callable[[int, str, str | None], dict[str, Any]]


def openai_error(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``;
    ``type`` is ``invalid_request_error`` for a 4xx, ``server_error`` else."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_response(
    status: int,
    message: str,
    run_id: str | None = None,
    headers: dict[str, str] | None = None,
    code: str | None = None,
    shape: ErrorShape = openai_error,
) -> JSONResponse:
    """An error as the client's API words it (D6): OpenAI's shape unless the route
    speaks another API (``shape``)."""
    hdrs = dict(headers or {})
    if run_id:
        hdrs[RUN_HEADER] = run_id
    return JSONResponse(shape(status, message, code), status_code=status, headers=hdrs)


class TurnError(Exception):
    """A turn cannot go on; ``outcome`` says how it ended, ``status`` what the client sees."""

    status: ClassVar[int] = 500
    outcome: ClassVar[Outcome] = Outcome.INTERNAL_ERROR
    code: ClassVar[str | None] = None  # the ``code`` of the error body
    #: set on a failure that says the replica cannot be reached (fail fast, D6)
    replica_unreachable: ClassVar[bool] = False

    def __init__(self, message: str, replica: str | None = None, *, not_sent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.replica = replica
        # No byte of the request was written to the engine (its connection failed): the
        # engine never saw the turn, so it may be placed again.
        self.not_sent = not_sent

    def response(self, run_id: str | None, shape: ErrorShape = openai_error) -> Response:
        headers = {REPLICA_HEADER: self.replica} if self.replica else None
        return error_response(self.status, self.message, run_id, headers, self.code, shape)


class BadRequest(TurnError):
    status = 400
    outcome = Outcome.REJECTED


class BodyTooLarge(BadRequest):
    status = 413
    code = "request_too_large"


class NotJson(BadRequest):
    status = 415
    code = "unsupported_media_type"


class Unauthorized(TurnError):
    status = 401
    outcome = Outcome.REJECTED
    code = "invalid_api_key"

    def response(self, run_id: str | None, shape: ErrorShape = openai_error) -> Response:
        resp = super().response(run_id, shape)
        resp.headers["www-authenticate"] = 'Bearer realm="luftpause"'
        return resp


class Forbidden(TurnError):
    """The key's caller may not do this (B13: a class it may not use, where its key
    refuses rather than downgrades)."""

    status = 403
    outcome = Outcome.REJECTED
    code = "class_not_allowed"


class OverQuota(TurnError):
    """The caller spent its tokens per minute or its daily tokens (B13): a 429 with
    ``Retry-After`` (whole seconds), in the client API's error shape. ``code``:
    ``rate_limit_exceeded`` for the per-minute bucket, ``insufficient_quota`` for the
    daily budget (OpenAI's codes for the two)."""

    status = 429
    outcome = Outcome.REJECTED

    def __init__(self, message: str, retry_after_s: float, limit: str) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after_s))
        self.limit = limit

    def response(self, run_id: str | None, shape: ErrorShape = openai_error) -> Response:
        code = "insufficient_quota" if self.limit == "daily_tokens" else "rate_limit_exceeded"
        headers = {"retry-after": str(self.retry_after)}
        return error_response(self.status, self.message, run_id, headers, code, shape)


class UnknownModel(TurnError):
    status = 404
    outcome = Outcome.REJECTED
    code = "model_not_found"


class ClientLeft(TurnError):
    """The client went away: nobody reads the answer (499 in the access log only)."""

    status = 499
    outcome = Outcome.CLIENT_LEFT

    def response(self, run_id: str | None, shape: ErrorShape = openai_error) -> Response:
        return Response(status_code=499)


class Abandoned(ClientLeft):
    """The client left while its turn was held: no engine request was made (D4)."""

    outcome = Outcome.ABANDONED


class EngineUnreachable(TurnError):
    """No connection to the engine (refused, connect timeout): reported with
    ``replica_unreachable`` so the scheduler takes the replica out of placement
    until a probe finds it healthy again."""

    status = 502
    outcome = Outcome.ENGINE_UNREACHABLE
    replica_unreachable = True


class EngineFailed(TurnError):
    """The engine was reached but its reply broke off (before or during the stream)."""

    status = 502
    outcome = Outcome.ENGINE_BROKE


class EngineRejected(TurnError):
    """The engine answered with an error status: passed on unchanged (D6)."""

    outcome = Outcome.ENGINE_REJECTED

    def __init__(
        self,
        message: str,
        replica: str,
        engine_status: int,
        content: bytes,
        headers: dict[str, str],
        *,
        in_client_shape: bool = True,
    ) -> None:
        super().__init__(message, replica)
        self.engine_status = engine_status
        self.content = content
        self.headers = headers
        self.in_client_shape = in_client_shape  # the engine spoke the client's API

    def response(self, run_id: str | None, shape: ErrorShape = openai_error) -> Response:
        """The engine's answer unchanged; when the engine answered in another API than
        the client's (a translated turn, B9), its status and message in the client's
        API's ``shape``, so the client can read it."""
        headers = dict(self.headers)
        if run_id:
            headers[RUN_HEADER] = run_id
        if self.in_client_shape:
            return Response(self.content, status_code=self.engine_status, headers=headers)
        headers.pop("content-type", None)
        message = _engine_message(self.content) or self.message
        return error_response(self.engine_status, message, None, headers, shape=shape)


def _engine_message(content: bytes) -> str:
    """The message of an engine's error body (OpenAI's shape, or FastAPI's ``detail``)."""
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        return content.decode("utf-8", "replace").strip()[:2000]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
    return ""


class InternalError(TurnError):
    status = 500
    outcome = Outcome.INTERNAL_ERROR

    @classmethod
    def of(cls, exc: BaseException) -> InternalError:
        """The failure a turn is reported with when ``exc``, a bug of ours, ended it."""
        return cls(f"internal error: {type(exc).__name__}")
