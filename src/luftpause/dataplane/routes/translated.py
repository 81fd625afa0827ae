"""Anthropic Messages and OpenAI Responses turns (B9): forwarding and replying.

``api_request`` parses the client's body with its API's module (``apis/``), or lets
it through untranslated when every endpoint serving its model speaks the API itself.
``forward_api`` passes the turn through to a replica that serves the API natively, or
translates it to Chat Completions (and the reply back, streamed through
``TranslatingTap`` or whole) for any other.
"""

from __future__ import annotations

from starlette.responses import Response

from luftpause.config import (
    NativeApi,
)
from luftpause.dataplane.apis import ClientApi, Translated, Untranslated
from luftpause.dataplane.asgi import Incoming
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.errors import (
    BadRequest,
    EngineFailed,
    InternalError,
    UnknownModel,
)
from luftpause.dataplane.link_codec import Admitted
from luftpause.dataplane.outcome import TurnOutcome, loads
from luftpause.dataplane.relay import NativeTap, RelayStream, SseTap, TranslatingTap
from luftpause.dataplane.request import (
    dumps,
    parse_object,
)
from luftpause.dataplane.routes.engine import (
    STREAM_HEADERS,
    class_priority,
    closed_on_error,
    post_to_engine,
    read_whole,
    reply_headers_of,
    retention_hint,
)
from luftpause.dataplane.turn import Turn
from luftpause.members import entry_of


def api_request(dp: Dataplane, api: ClientApi, raw: bytes) -> Translated:
    """The request translated; or, when the proxy cannot translate it but every endpoint
    serving its model serves the API natively, the request to pass through as it is
    (the proxy's refusals are about what it cannot translate)."""
    try:
        return api.parse(raw)
    except BadRequest as refused:
        body = parse_object(raw)
        asked = body.get("model")
        stream = body.get("stream", False)
        if not isinstance(asked, str) or not asked or not isinstance(stream, bool):
            raise
        try:
            served = dp.served_model(asked)
        except UnknownModel:
            raise refused from None
        if not dp.native_for(api.name, served, everywhere=True):
            raise
        return Untranslated(asked, stream, {"model": asked, "messages": []}, refused.message)


async def forward_api(
    dp: Dataplane,
    incoming: Incoming,
    api: ClientApi,
    translated: Translated,
    native_body: bytes,
    turn: Turn,
    admitted: Admitted,
) -> Response:
    """A turn of another client API (B9): passed through to a replica that serves the
    API itself (``native_body``: the client's bytes, an alias's target model written
    in), translated to Chat Completions (and its reply back) for any other. Ends
    ``turn`` itself, raises a ``TurnError`` (``serve`` ends it then), or hands it to
    the stream relay."""
    record = turn.record
    endpoint = dp.endpoints.get(record.replica)
    base = endpoint.url if endpoint is not None else admitted.url.rstrip("/")
    native = endpoint is not None and api.name in endpoint.native_apis
    extra_headers: dict[str, str] = {}
    if native:
        url = f"{base}{api.route}"
        if incoming.query:  # e.g. Claude Code's ?beta=true
            url += "?" + incoming.query.decode("latin-1")
        body = native_body
        key = dp.secrets.api_keys.get(entry_of(record.replica))
        if key and api.name == NativeApi.MESSAGES:
            extra_headers["x-api-key"] = key  # how Anthropic's API takes a key
    elif isinstance(translated, Untranslated):
        # Only endpoints serving the API natively serve this model (checked before
        # admission): a placement elsewhere is a configuration the checks missed.
        raise InternalError(
            f"replica {record.replica} does not serve {api.route} natively and the "
            f"request cannot be translated: {translated.reason}",
            record.replica,
        )
    else:
        url = f"{base}/v1/chat/completions"
        chat = {**translated.chat, "model": record.model}
        if translated.stream:
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}
        priority = class_priority(endpoint, record, "priority" in translated.chat)
        if priority is not None:
            chat["priority"] = priority
        retention = retention_hint(endpoint, record, admitted, "vllm_xargs" in translated.chat)
        if retention is not None:
            chat["vllm_xargs"] = retention
        body = dumps(chat)
    reply_headers = reply_headers_of(record, admitted)
    response = await post_to_engine(
        dp,
        incoming,
        turn,
        url,
        body,
        reply_headers,
        in_client_shape=native,
        extra_headers=extra_headers,
    )
    content_type = response.headers.get("content-type", "application/json")
    if translated.stream and content_type.startswith("text/event-stream"):
        with closed_on_error(response):
            outcome = TurnOutcome()
            tap: SseTap = (
                NativeTap(outcome, api)
                if native
                else TranslatingTap(outcome, translated.stream_translator())
            )
            headers = [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                *STREAM_HEADERS,
                *((k.encode(), v.encode()) for k, v in reply_headers.items()),
            ]
        # From here the relay owns the turn and the response: its ``finally`` ends both.
        return RelayStream(response, tap, headers, turn, incoming.watch)
    whole = await read_whole(incoming, response, record.replica)
    body_json = loads(whole)
    outcome = TurnOutcome()
    if not isinstance(body_json, dict) or (translated.stream and not native):
        what = "a stream" if translated.stream else "a JSON object"
        raise EngineFailed(
            f"engine {record.replica} answered 200 with {content_type}, not {what}",
            record.replica,
        )
    if native:
        api.observe_reply(body_json, outcome)
        reply = whole
    else:
        outcome.read_completion(body_json)
        reply = dumps(translated.reply(body_json))
    if outcome.first_token:
        turn.first_token(streamed=False)
    turn.finished(outcome)
    return Response(
        reply,
        status_code=200,
        headers={**reply_headers, "content-type": content_type if native else "application/json"},
    )
