"""Posting an admitted turn to its engine and reading what comes back.

The headers an engine gets (the client's, less hop-by-hop and credentials, plus the
replica's own key) and the ones the client gets back; the POST under the turn's
engine span (X1), its non-200 answers as ``EngineRejected`` (D6); a whole reply read
to the end; what an engine error means for placement (``engine_error``); the
``priority`` and retention hint (B8) an endpoint may take.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from luftpause.config import (
    Endpoint,
    KvRetention,
)
from luftpause.dataplane import identity, tracing
from luftpause.dataplane.asgi import Incoming
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.engine_http import (
    ENGINE_ERRORS,
    NOT_SENT,
    ConnectFailed,
    ConnectTimeout,
    EngineResponse,
)
from luftpause.dataplane.errors import (
    ClientLeft,
    EngineFailed,
    EngineRejected,
    EngineUnreachable,
    TurnError,
)
from luftpause.dataplane.link_codec import Admitted
from luftpause.dataplane.runs import TurnRecord
from luftpause.dataplane.turn import Turn
from luftpause.members import entry_of

# Client headers never forwarded to an engine: hop-by-hop, our own, the client's credentials.
_DROP = {
    "host",
    "content-length",
    "authorization",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-authorization",
    "accept-encoding",
    "cookie",
    "x-api-key",
}


def engine_headers_of(dp: Dataplane, incoming: Incoming, replica: str) -> dict[str, str]:
    headers = {
        k: v
        for k, v in incoming.headers.items()
        if k not in _DROP and not k.startswith("x-luftpause-")
    }
    key = dp.secrets.api_keys.get(entry_of(replica))  # (a discovered replica: its entry's)
    if key:
        headers["authorization"] = f"Bearer {key}"
    headers["accept-encoding"] = "identity"
    headers.setdefault("content-type", "application/json")
    return headers


def reply_headers_of(record: TurnRecord, admitted: Admitted) -> dict[str, str]:
    return {
        identity.RUN_HEADER: record.run_id,
        identity.REPLICA_HEADER: record.replica,
        identity.HELD_HEADER: str(round(admitted.held_s * 1000)),
    }


async def post_to_engine(
    dp: Dataplane,
    incoming: Incoming,
    turn: Turn,
    url: str,
    body: bytes,
    reply_headers: dict[str, str],
    *,
    in_client_shape: bool,
    extra_headers: dict[str, str] | None = None,
) -> EngineResponse:
    """Send the turn to its replica: the engine's 200 response, its body still to come;
    any other status is an ``EngineRejected`` carrying the engine's answer (D6), which is
    already in the client's API (``in_client_shape``) or is re-worded into it."""
    replica = turn.record.replica
    headers = engine_headers_of(dp, incoming, replica)
    if extra_headers:
        headers.update(extra_headers)
    response = await engine_post(dp, incoming, turn, url, body, headers)
    if response.status == 200:
        return response
    try:  # D6: engine rejects: status, body, Retry-After unchanged
        content = await response.read()
    except ENGINE_ERRORS:
        content = b""
    finally:
        response.release()
    headers = dict(reply_headers)
    for name in ("retry-after", "content-type"):
        if name in response.headers:
            headers[name] = response.headers[name]
    raise EngineRejected(
        f"engine {replica} answered {response.status}",
        replica,
        response.status,
        content,
        headers,
        in_client_shape=in_client_shape,
    )


async def engine_post(
    dp: Dataplane, incoming: Incoming, turn: Turn, url: str, body: bytes, headers: dict[str, str]
) -> EngineResponse:
    """POST to the turn's replica, under a client span of the turn's (X1) that the
    engine's ``traceparent`` names: the response once its headers are in."""
    span = tracing.start_engine_request(turn.span, url)
    tracing.inject(span or turn.span, headers)
    try:
        response = incoming.engine = await dp.http.post(url, body, headers)
    except ENGINE_ERRORS as exc:
        tracing.end_engine_request(span, error=type(exc).__name__)
        raise engine_error(turn.record.replica, exc) from None
    except asyncio.CancelledError:
        tracing.end_engine_request(span, error="cancelled")
        if incoming.watch.left_now():
            raise ClientLeft("client left before the engine answered") from None
        raise
    except BaseException as exc:
        tracing.end_engine_request(span, error=type(exc).__name__)
        raise
    tracing.end_engine_request(span, status=response.status)
    return response


@contextlib.contextmanager
def closed_on_error(response: EngineResponse) -> Iterator[None]:
    """Whatever fails before the relay takes the response over closes it: its
    connection would otherwise stay open, the engine's reply stalled, for good."""
    try:
        yield
    except BaseException:
        response.close()
        raise


async def read_whole(incoming: Incoming, response: EngineResponse, replica: str) -> bytes:
    """A non-streamed reply's body; the connection is dropped if it is not read to the end."""
    try:
        return await response.read()
    except ENGINE_ERRORS as exc:
        raise EngineFailed(f"engine {replica} failed: {describe(exc)}", replica) from None
    except asyncio.CancelledError:
        if incoming.watch.left_now():
            raise ClientLeft("client left while the engine was answering") from None
        raise
    finally:
        response.release()  # unfinished: the connection is dropped, so the engine stops


STREAM_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


def class_priority(endpoint: Endpoint | None, record: TurnRecord, has_own: bool) -> int | None:
    """The ``priority`` to send an engine that orders its own queue by class; None when
    it does not, or when the client set its own (which is kept)."""
    if endpoint is None or endpoint.class_priority is None or has_own:
        return None
    return endpoint.class_priority.for_class(record.service_class)


def retention_hint(
    endpoint: Endpoint | None, record: TurnRecord, admitted: Admitted, has_own: bool
) -> dict[str, Any] | None:
    """B8: the ``vllm_xargs`` member asking the engine to keep the run's prefix for
    ``admitted.retain_s`` after this turn, for an endpoint that declares the mechanism;
    None without a hint, or when the client sent its own ``vllm_xargs`` (kept as sent).
    The context is a JSON string: vLLM's ``vllm_xargs`` takes only strings and numbers,
    and vllm-router (like the fake engine) decodes a string context."""
    if (
        endpoint is None
        or endpoint.kv_retention is KvRetention.NONE
        or not admitted.retain_s > 0
        or has_own
    ):
        return None
    context = {"program_id": record.run_id, "kv_retention_ttl_seconds": round(admitted.retain_s, 3)}
    return {"agentic_context": json.dumps(context, separators=(",", ":"))}


def engine_error(replica: str, exc: BaseException) -> TurnError:
    """An engine request that raised: the engine cannot be reached (the replica leaves
    placement until its probe passes), or something else broke before the reply."""
    message = f"engine {replica}: {describe(exc)}"
    not_sent = isinstance(exc, NOT_SENT)  # the engine never saw it: it may be placed again
    # A connect that failed for want of something here (open files, local ports,
    # buffer space) is this machine's trouble, not the engine's: it must not take a
    # healthy replica out of placement.
    if isinstance(exc, ConnectTimeout) or (isinstance(exc, ConnectFailed) and exc.unreachable):
        return EngineUnreachable(message, replica, not_sent=not_sent)
    return EngineFailed(message, replica, not_sent=not_sent)


def describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectTimeout):
        return "connect timeout"
    if isinstance(exc, ConnectFailed):
        return f"connection failed: {exc.os_error.strerror or exc.os_error}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
