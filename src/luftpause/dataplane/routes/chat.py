"""Chat Completions: forwarding an admitted turn to its replica and passing the reply on.

The client's body goes to the engine as it came, with the served model, the class's
``priority`` and the run's retention hint written in (B8); a streamed reply goes to
the stream relay (``relay.py``, ``SseTap``), a whole one is read for the turn's report
here.
"""

from __future__ import annotations

from starlette.responses import Response

from luftpause.dataplane.asgi import Incoming
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.link_codec import Admitted
from luftpause.dataplane.outcome import TurnOutcome
from luftpause.dataplane.relay import RelayStream, SseTap
from luftpause.dataplane.request import (
    ChatRequest,
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


async def forward_chat(
    dp: Dataplane, incoming: Incoming, chat: ChatRequest, turn: Turn, admitted: Admitted
) -> Response:
    """Send the turn to its replica and pass the reply on. Ends ``turn`` itself, raises a
    ``TurnError`` (``serve`` ends it then), or hands it to the stream relay."""
    record = turn.record
    endpoint = dp.endpoints.get(record.replica)
    base = endpoint.url if endpoint is not None else admitted.url.rstrip("/")
    raw = chat.engine_body_for(
        class_priority(endpoint, record, chat.has_priority),
        retention_hint(endpoint, record, admitted, "vllm_xargs" in chat.body),
    )
    reply_headers = reply_headers_of(record, admitted)
    response = await post_to_engine(
        dp, incoming, turn, f"{base}/v1/chat/completions", raw, reply_headers, in_client_shape=True
    )
    content_type = response.headers.get("content-type", "application/json")
    if chat.stream and content_type.startswith("text/event-stream"):
        with closed_on_error(response):
            stream_headers = [
                (b"content-type", content_type.encode()),
                *STREAM_HEADERS,
                *((k.encode(), v.encode()) for k, v in reply_headers.items()),
            ]
            tap = SseTap(
                TurnOutcome(),
                chat.hide_usage,
                endpoint.null_usage_when_asked if endpoint is not None else True,
            )
        # From here the relay owns the turn and the response: its ``finally`` ends both.
        return RelayStream(response, tap, stream_headers, turn, incoming.watch)

    whole = await read_whole(incoming, response, record.replica)
    outcome = TurnOutcome()
    outcome.read_completion_bytes(whole)
    if outcome.first_token:
        turn.first_token(streamed=False)
    turn.finished(outcome)
    return Response(whole, status_code=200, headers={**reply_headers, "content-type": content_type})
