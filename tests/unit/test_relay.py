"""The SSE tap: bytes pass unchanged, the reply is read on the way (D1, D5)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from luftpause.dataplane.apis import ClientApi, client_apis
from luftpause.dataplane.outcome import TurnOutcome
from luftpause.dataplane.relay import NativeTap, SseTap, TranslatingTap


def sse(*chunks: object, done: bool = True, sep: str = "\n\n") -> bytes:
    out = "".join(f"data: {json.dumps(c)}{sep}" for c in chunks)
    return (out + (f"data: [DONE]{sep}" if done else "")).encode()


CHUNKS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
    {
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f"}}]},
            }
        ]
    },
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 9,
            "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 6},
        },
    },
]


def test_reads_first_token_tool_calls_finish_and_usage() -> None:
    """D5: first token, tool call IDs, finish reason, usage with cached tokens."""
    tap = SseTap(TurnOutcome(), hide_usage=False)
    body = sse(*CHUNKS)
    assert tap.feed(body) == body
    o = tap.outcome
    assert o.first_token and o.tool_call_ids == ["call_1"] and o.finish_reason == "tool_calls"
    assert (o.prompt_tokens, o.completion_tokens, o.cached_tokens) == (9, 4, 6)
    assert o.paused_on_tool and o.done


def test_usage_chunk_withheld_only_when_we_asked_for_it() -> None:
    """D1: the client gets the stream it asked for; our extra usage chunk is withheld."""
    tap = SseTap(TurnOutcome(), hide_usage=True)
    out = tap.feed(sse(*CHUNKS))
    assert out == sse(*CHUNKS[:4])
    assert tap.outcome.prompt_tokens == 9


@given(
    st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30),
    st.sampled_from(["\n\n", "\r\n\r\n"]),
)
def test_any_split_passes_the_same_bytes(cuts: list[int], sep: str) -> None:
    """D1: however the engine's bytes are split, the client receives them unchanged."""
    body = sse(*CHUNKS, sep=sep)
    tap = SseTap(TurnOutcome(), hide_usage=False)
    out, pos = b"", 0
    for cut in cuts:
        out += tap.feed(body[pos : pos + cut])
        pos += cut
    out += tap.feed(body[pos:]) + tap.rest()
    assert out == body
    assert tap.outcome.tool_call_ids == ["call_1"]


def test_stream_without_done_is_noticed() -> None:
    tap = SseTap(TurnOutcome(), hide_usage=False)
    tap.feed(sse(*CHUNKS[:2], done=False))
    assert not tap.outcome.done and tap.outcome.first_token


def test_tool_names_are_read_distinct_cut_and_bounded() -> None:
    """D5, tool leases: the names of the tools a reply called are reported with the
    finished turn (from the first delta of each streamed call, or the message's calls):
    distinct, in order, cut to 64 characters, at most 8; a name that is not a string is
    not one."""
    tap = SseTap(TurnOutcome(), hide_usage=False)
    tap.feed(sse(*CHUNKS))
    assert tap.outcome.tool_names == ["f"]
    o = TurnOutcome()
    calls = [{"id": f"c{i}", "function": {"name": f"tool{i % 10}" + "x" * 80}} for i in range(12)]
    calls += [{"id": "d", "function": {"name": 7}}, {"id": "e", "function": None}]
    calls += [{"id": "f", "function": {"name": "bad\udc80"}}]  # (past the 8: not kept)
    o.read_completion(
        {"choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": calls}}]}
    )
    assert o.tool_names == [f"tool{i}" + "x" * 59 for i in range(8)]
    assert len(o.tool_call_ids) == 15
    lone = TurnOutcome()
    lone.saw_tool("x\udc80")  # a lone surrogate cannot go into a report: replaced
    assert lone.tool_names == ["x?"]


def test_non_streamed_completion_is_read() -> None:
    o = TurnOutcome()
    o.read_completion(
        {
            "choices": [{"finish_reason": "stop", "message": {"content": "x"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }
    )
    assert o.finish_reason == "stop" and not o.paused_on_tool and o.prompt_tokens == 3


def test_reply_values_a_report_cannot_carry_are_read_as_nothing() -> None:
    """D5: a boolean or out-of-range token count and a finish reason that is not a short
    string are ignored, so the finished report can always be built."""
    o = TurnOutcome()
    o.read_chunk({"choices": 5, "usage": {"prompt_tokens": True, "completion_tokens": 2**64}})
    o.read_chunk({"choices": [{"finish_reason": {"why": 1}}]})
    o.read_chunk({"choices": [{"finish_reason": "x" * 65}]})
    assert (o.prompt_tokens, o.completion_tokens, o.finish_reason) == (0, 0, "")
    o.read_chunk({"choices": [{"finish_reason": "stop"}], "usage": {"prompt_tokens": 7}})
    assert (o.prompt_tokens, o.finish_reason) == (7, "stop")


def _engine_chunk(content: str, usage_first: bool = False) -> dict[str, object]:
    chunk: dict[str, object] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    return {"usage": None, **chunk} if usage_first else {**chunk, "usage": None}


def _stream(chunks: list[dict[str, object]], compact: bool, sep: str = "\n\n") -> bytes:
    separators = (",", ":") if compact else (", ", ": ")
    return "".join(f"data: {json.dumps(c, separators=separators)}{sep}" for c in chunks).encode()


@given(
    st.lists(st.text(max_size=40), min_size=1, max_size=5),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["\n\n", "\r\n\r\n"]),
)
def test_null_usage_members_we_caused_are_cut_byte_exactly(
    texts: list[str], compact: bool, usage_first: bool, sep: str
) -> None:
    """D1: when the dataplane asked for usage and the client did not, the client gets the
    bytes the engine would have sent it: each chunk without the ``"usage": null`` member
    (written compact as pydantic engines do, or spaced), whatever the content says —
    even content that spells ``"usage": null`` itself."""
    texts = [*texts, '"usage": null, "usage":null']
    asked = [_engine_chunk(t, usage_first) for t in texts]
    plain = [{k: v for k, v in c.items() if k != "usage"} for c in asked]
    usage_only = {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}}
    tap = SseTap(TurnOutcome(), hide_usage=True)
    out = tap.feed(_stream([*asked, usage_only], compact, sep) + f"data: [DONE]{sep}".encode())
    assert out == _stream(plain, compact, sep) + f"data: [DONE]{sep}".encode()
    assert tap.outcome.prompt_tokens == 3 and tap.outcome.done


def test_null_usage_kept_when_the_client_asked_for_usage_or_it_is_nested() -> None:
    """D1: a client that asked for usage gets the ``"usage": null`` members unchanged; a
    nested ``usage`` member is never the one cut."""
    asked = [_engine_chunk("hi")]
    body = _stream(asked, compact=True)
    tap = SseTap(TurnOutcome(), hide_usage=False)
    assert tap.feed(body) == body
    nested = {"id": "x", "meta": {"usage": None}, "choices": [], "usage": None}
    tap = SseTap(TurnOutcome(), hide_usage=True)
    out = tap.feed(_stream([nested], compact=False))
    assert out == _stream([{"id": "x", "meta": {"usage": None}, "choices": []}], compact=False)


def test_a_nested_null_usage_with_neighbours_is_never_the_one_cut() -> None:
    """D1: where a nested ``"usage": null`` comes first in the bytes, the top-level member
    is the one cut (the nested one is kept, byte for byte)."""
    chunk = {"meta": {"a": 1, "usage": None, "b": 2}, "id": "x", "choices": [], "usage": None}
    tap = SseTap(TurnOutcome(), hide_usage=True)
    out = tap.feed(_stream([chunk], compact=True))
    expected = {"meta": {"a": 1, "usage": None, "b": 2}, "id": "x", "choices": []}
    assert out == _stream([expected], compact=True)


def test_null_usage_in_an_unseen_layout_is_rewritten_without_it() -> None:
    """D1: JSON whose ``usage`` member no byte pattern finds (an escaped key) still loses
    it: the chunk is written anew, compact, and means the same."""
    line = b'data: {"id":"x","\\u0075sage":null,"choices":[]}\n\n'
    tap = SseTap(TurnOutcome(), hide_usage=True)
    out = tap.feed(line)
    assert out == b'data: {"id":"x","choices":[]}\n\n'


def test_engines_that_always_write_null_usage_keep_it() -> None:
    """D1: for an endpoint whose engine writes ``"usage": null`` whether asked or not
    (``null_usage_when_asked = false``), the members are passed on as sent; only the
    usage-only chunk the dataplane asked for is withheld."""
    asked = [_engine_chunk("hi")]
    usage_only = {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}}
    tap = SseTap(TurnOutcome(), hide_usage=True, null_usage_when_asked=False)
    out = tap.feed(_stream([*asked, usage_only], compact=True))
    assert out == _stream(asked, compact=True)
    assert tap.outcome.prompt_tokens == 3


_texts = st.lists(
    st.sampled_from(
        ["a", " ", '"', "\\", "{", "}", ",", ":", "é", "\n", '"usage": null', '"tool_calls"']
    ),
    max_size=8,
).map("".join)


@st.composite
def _chunks(draw: st.DrawFn) -> dict[str, object]:
    """A chunk as engines write them: text, sometimes a tool call or a finish reason,
    ``usage`` null, a count, absent or nested, in any member order."""
    delta: dict[str, object] = {"content": draw(_texts)}
    if draw(st.integers(0, 5)) == 0:
        delta["tool_calls"] = [{"index": 0, "id": draw(st.sampled_from(["c1", "c2"]))}]
    choice = {
        "index": 0,
        "delta": delta,
        "finish_reason": draw(st.sampled_from([None, None, "stop"])),
    }
    chunk: dict[str, object] = {"id": "c", "choices": draw(st.sampled_from([[choice], []]))}
    usage = draw(st.sampled_from(["null", "null", "absent", "count", "nested"]))
    if usage == "count":
        chunk["usage"] = {"prompt_tokens": 5, "completion_tokens": 2}
    elif usage == "nested":
        chunk["meta"] = {"usage": None}
    if usage != "absent" and usage != "nested" and draw(st.booleans()):
        chunk = {"usage": chunk.pop("usage", None), **chunk}  # usage written first
    elif usage == "null":
        chunk["usage"] = None
    return chunk


@given(
    st.lists(_chunks(), min_size=1, max_size=8),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_skimming_chunks_reads_and_passes_exactly_what_parsing_does(
    chunks: list[dict[str, object]], compact: bool, ascii_only: bool, hide: bool, nulls: bool
) -> None:
    """D1, D5: chunks judged from their bytes (not parsed) give the client the same bytes
    and the turn the same outcome as parsing every chunk would."""
    separators = (",", ":") if compact else (", ", ": ")
    body = (
        "".join(
            f"data: {json.dumps(c, separators=separators, ensure_ascii=ascii_only)}\n\n"
            for c in chunks
        ).encode()
        + b"data: [DONE]\n\n"
    )
    taps = []
    for skim in (True, False):
        tap = SseTap(TurnOutcome(), hide_usage=hide, null_usage_when_asked=nulls)
        tap.skim = skim
        taps.append((tap.feed(body) + tap.rest(), tap.outcome))
    assert taps[0] == taps[1]


# ---- taps of the other client APIs (B9) -----------------------------------------------------


class Recorder:
    """A stream translator that writes down what it was given."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def chunk(self, chunk: dict[str, object]) -> bytes:
        self.calls.append("chunk")
        return b"event: x\n\n"

    def done(self) -> bytes:
        self.calls.append("done")
        return b"event: end\n\n"

    def failed(self, message: str) -> bytes:
        self.calls.append(f"failed: {message}")
        return b"event: error\n\n"


def test_translating_tap_turns_an_engine_error_event_into_the_api_s() -> None:
    """B9, D6: an error the engine reports inside its stream (``data: {"error": ...}``
    then ``[DONE]``, as SGLang and vLLM do) ends the client's stream with its API's
    error event, never with a normal end, and the turn is not complete."""
    recorder = Recorder()
    tap = TranslatingTap(TurnOutcome(), recorder)
    out = tap.feed(sse(CHUNKS[1], {"error": {"message": "KV cache full", "code": 500}}))
    out += tap.rest()
    assert recorder.calls == ["chunk", "failed: the engine reported an error: KV cache full"]
    assert out.endswith(b"event: error\n\n")
    assert not tap.outcome.done
    assert tap.incomplete() == "reported an error mid-stream: KV cache full"
    assert tap.failing("again") == b""  # one error event, whatever ends the relay


def test_translating_tap_reads_a_last_event_without_its_blank_line() -> None:
    """B9: ``[DONE]`` as the very last bytes, with no blank line after it, still ends
    the reply well."""
    recorder = Recorder()
    tap = TranslatingTap(TurnOutcome(), recorder)
    out = tap.feed(sse(CHUNKS[1], done=False) + b"data: [DONE]")
    out += tap.rest()
    assert recorder.calls == ["chunk", "done"] and tap.outcome.done
    assert out.endswith(b"event: end\n\n")


def native_api(name: str) -> ClientApi:
    return next(a for a in client_apis() if a.name == name)


def test_native_tap_passes_bytes_and_knows_a_complete_or_failed_stream() -> None:
    """B9, D5: a native Messages stream passes byte for byte and is complete at
    ``message_stop``; a native Responses stream that reports ``response.failed`` fails
    the turn, and no second error event is added."""
    events = (
        b'event: message_start\ndata: {"type": "message_start", "message": {"usage": '
        b'{"input_tokens": 5, "output_tokens": 0}}}\n\n'
        b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
        b'"delta": {"type": "text_delta", "text": "hi"}}\n\n'
        b'event: message_stop\ndata: {"type": "message_stop"}\n\n'
    )
    tap = NativeTap(TurnOutcome(), native_api("messages"))
    assert tap.feed(events) == events
    assert tap.outcome.done and tap.outcome.first_token and tap.outcome.prompt_tokens == 5

    failed = (
        b'event: response.failed\ndata: {"type": "response.failed", "sequence_number": 7, '
        b'"response": {"status": "failed", "error": {"code": "server_error", '
        b'"message": "out of memory"}}}\n\n'
    )
    tap = NativeTap(TurnOutcome(), native_api("responses"))
    assert tap.feed(failed) == failed
    assert not tap.outcome.done
    assert tap.incomplete() == "reported an error mid-stream: out of memory"
    assert tap.failing("cut") == b""


def test_native_tap_adds_the_api_s_error_event_when_the_stream_breaks() -> None:
    """B9, D6: a native stream that breaks off gets its API's error event (Responses:
    numbered after the last event seen)."""
    tap = NativeTap(TurnOutcome(), native_api("responses"))
    tap.feed(
        b'event: response.created\ndata: {"type": "response.created", "sequence_number": 3}\n\n'
    )
    event = tap.failing("engine e failed mid-stream")
    assert event.startswith(b"event: error\ndata: ")
    data = json.loads(event.split(b"data: ", 1)[1])
    assert data["sequence_number"] == 4 and data["message"] == "engine e failed mid-stream"
    assert tap.incomplete() == "reported an error mid-stream: engine e failed mid-stream"
    messages = NativeTap(TurnOutcome(), native_api("messages")).failing("cut")
    assert json.loads(messages.split(b"data: ", 1)[1])["error"]["type"] == "api_error"


def test_a_null_usage_written_last_after_a_duplicate_usage_member_leaves_neither() -> None:
    """D1: the ``"usage": null`` an engine writes last is cut by its bytes only when it is
    the line's one ``usage`` member: a line that also holds an earlier (duplicate)
    ``usage`` member, which JSON parsers let the last one override, is written anew
    without any."""
    line = b'data: {"id":"x","usage":{"prompt_tokens":1},"choices":[],"usage":null}\n\n'
    tap = SseTap(TurnOutcome(), hide_usage=True)
    out = tap.feed(line)
    assert out == b'data: {"id":"x","choices":[]}\n\n'
