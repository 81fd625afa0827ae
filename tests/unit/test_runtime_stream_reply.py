"""R4: a streamed chat completion put back together as the non-streamed reply - the
event stream split into events however its bytes arrive, and the chunks folded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from luftpause.runtime.stream_reply import ReplyAssembler, SseLines, StreamError


def events_of(stream: bytes, cut: int) -> list[bytes]:
    """The events of ``stream`` fed in pieces of ``cut`` bytes, then closed."""
    lines = SseLines()
    out: list[bytes] = []
    for i in range(0, len(stream), cut):
        out.extend(lines.feed(stream[i : i + cut]))
    return out + lines.close()


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_events_are_the_same_however_the_bytes_are_cut(newline: bytes) -> None:
    """R4: LF, CRLF or CR line ends; an event split anywhere, even inside a CRLF; its
    data lines joined by a newline; comments and other fields skipped."""
    n = newline
    stream = (
        b": keep-alive" + n + n
        + b"event: message" + n + b"id: 7" + n + b'data: {"a": 1}' + n + n
        + b"data:first" + n + b"data: second" + n + n
        + b"data: [DONE]" + n + n
    )  # fmt: skip
    for cut in range(1, len(stream) + 1):
        assert events_of(stream, cut) == [b'{"a": 1}', b"first\nsecond", b"[DONE]"], cut


def test_the_last_event_counts_without_its_blank_line() -> None:
    """R4: a stream that ends right after its last data line still gives that event."""
    assert events_of(b'data: {"x": 2}\n\ndata: [DONE]', 5) == [b'{"x": 2}', b"[DONE]"]
    assert events_of(b"", 1) == []


def chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-9",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "m",
        "system_fingerprint": "fp",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
        "usage": None,
    }


def assemble(*chunks: dict[str, Any]) -> ReplyAssembler:
    reply = ReplyAssembler()
    for c in chunks:
        reply.feed_event(json.dumps(c).encode())
    reply.feed_event(b"[DONE]")
    return reply


def test_content_and_what_engines_stream_beside_it_are_concatenated() -> None:
    """R4: content, reasoning_content (SGLang, vLLM), the last finish reason, the usage
    chunk's usage, the first chunk's id/created/model; ``object`` as a reply's."""
    reply = assemble(
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "think"}),
        chunk({"reasoning_content": "ing", "content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
        {"id": "chatcmpl-9", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
    )
    assert reply.done and reply.error is None
    assert reply.result() == {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "created": 5,
        "model": "m",
        "system_fingerprint": "fp",
        "usage": {"prompt_tokens": 4, "completion_tokens": 2},
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "content": "Hello",
                    "reasoning_content": "thinking",
                },
            }
        ],
    }


def test_parallel_tool_calls_are_merged_by_index() -> None:
    """R4, R5 (parallelToolCalls): two calls whose pieces interleave come back whole, in
    index order, each with the id and name it was first given; content "" with tool
    calls is null, as in a non-streamed reply."""
    reply = assemble(
        chunk({"role": "assistant", "content": ""}),
        chunk({"tool_calls": [{"index": 1, "id": "c-b", "type": "function",
                               "function": {"name": "deep_search", "arguments": "{\"q\":"}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "c-a", "type": "function",
                               "function": {"name": "lookup", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"k\": 1}"}},
                              {"index": 1, "function": {"arguments": " \"x\"}"}}]}),
        chunk({}, "tool_calls"),
    )  # fmt: skip
    message = reply.result()["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c-a", "type": "function",
             "function": {"name": "lookup", "arguments": "{\"k\": 1}"}},
            {"id": "c-b", "type": "function",
             "function": {"name": "deep_search", "arguments": "{\"q\": \"x\"}"}},
        ],
    }  # fmt: skip


def test_several_choices_and_logprobs() -> None:
    """R4: choices by index (n > 1); logprobs' content entries appended in order."""
    lp = [{"token": "a", "logprob": -0.1}]
    reply = assemble(
        chunk({"content": "y"}, index=1),
        {**chunk({"content": "x"}), "choices": [
            {"index": 0, "delta": {"content": "x"}, "logprobs": {"content": lp}}]},
        {**chunk({}), "choices": [
            {"index": 0, "delta": {"content": "z"}, "logprobs": {"content": lp}}]},
    )  # fmt: skip
    choices = reply.result()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert choices[0]["message"]["content"] == "xz" and choices[1]["message"]["content"] == "y"
    assert choices[0]["logprobs"] == {"content": lp + lp}
    assert "logprobs" not in choices[1] and choices[1]["finish_reason"] is None


def test_an_error_event_and_the_end_are_told_apart() -> None:
    """R14: an error event is kept as the failure's message; no [DONE], not done."""
    reply = ReplyAssembler()
    reply.feed_event(json.dumps(chunk({"content": "a"})).encode())
    assert not reply.done
    reply.feed_event(b'{"error": {"message": "engine died", "code": 500}}')
    assert reply.error == "engine died" and not reply.done
    plain = ReplyAssembler()
    plain.feed_event(b'{"error": "overloaded"}')
    assert plain.error == "overloaded"


@pytest.mark.parametrize(
    ("data", "why"),
    [(b"<html>", "not JSON"), (b"[1]", "not a JSON object"), (b'"x"', "not a JSON object")],
)
def test_an_event_that_is_not_a_chunk_is_an_error(data: bytes, why: str) -> None:
    """R4: the stream is not a chat completion stream: say so, do not guess."""
    with pytest.raises(StreamError, match=why):
        ReplyAssembler().feed_event(data)


def test_tool_calls_without_an_index_are_told_apart_by_their_ids() -> None:
    """R4 (servers that send no ``index``): a new id starts a new call, a piece without
    an id continues the last one; nothing is glued onto another call."""
    reply = assemble(
        chunk({"tool_calls": [{"id": "c-a", "type": "function",
                               "function": {"name": "lookup", "arguments": "{\"k\":"}}]}),
        chunk({"tool_calls": [{"function": {"arguments": " 1}"}}]}),
        chunk({"tool_calls": [{"id": "c-b", "type": "function",
                               "function": {"name": "lookup", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"id": "c-a", "function": {"arguments": ""}}]}),
    )  # fmt: skip
    calls = reply.result()["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["arguments"]) for c in calls] == [
        ("c-a", '{"k": 1}'),
        ("c-b", "{}"),
    ]
    assert [c["function"]["name"] for c in calls] == ["lookup", "lookup"]


def test_the_result_can_be_read_twice_and_a_long_reply_is_whole() -> None:
    """R4: reading the reply changes nothing; 20,000 pieces join into one string."""
    reply = assemble(chunk({"role": "assistant"}), *(chunk({"content": "ab"}),) * 20_000)
    first = reply.result()
    assert reply.result() == first
    assert first["choices"][0]["message"]["content"] == "ab" * 20_000


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (b'{"error": {"message": "bad", "code": 400}}', 400),
        (b'{"error": {"message": "bad", "code": "503"}}', 503),
        (b'{"error": {"message": "bad", "code": "invalid_request"}}', None),
    ],
)
def test_an_error_events_code_is_kept_where_it_is_a_number(event: bytes, code: int | None) -> None:
    """R14: the code an error event gives decides whether the turn is retried."""
    reply = ReplyAssembler()
    reply.feed_event(event)
    assert (reply.error, reply.error_code) == ("bad", code)


def test_other_choice_fields_are_kept_as_last_given() -> None:
    """R4: a choice field the assembler does not read itself (vLLM's ``stop_reason``,
    SGLang's ``matched_stop``) reaches the reply as the last non-null value streamed,
    null where only null was, a list field's pieces joined, as a non-streamed reply
    carries them; a chunk cannot overwrite the message."""
    reply = assemble(
        chunk({"content": "x"}),
        {**chunk({}), "choices": [
            {"index": 0, "delta": {"content": "y"}, "stop_reason": None, "matched_stop": 7,
             "token_ids": [1, 2], "hidden": None, "message": {"content": "not this"}}]},
        {**chunk({}), "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": 128009,
             "matched_stop": None, "token_ids": [3], "hidden": None}]},
    )  # fmt: skip
    choice = reply.result()["choices"][0]
    assert choice["message"]["content"] == "xy"
    assert (choice["finish_reason"], choice["stop_reason"], choice["matched_stop"]) == (
        "stop", 128009, 7)  # fmt: skip
    assert choice["token_ids"] == [1, 2, 3] and choice["hidden"] is None
