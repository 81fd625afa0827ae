"""The Anthropic Messages API over Chat Completions: requests, replies, streams, errors (B9, D6).

Recorded Claude Code requests (``tests/data/harness/claude_code_*.json``, long texts
redacted) must translate; what the translator sends back must be what the official
``anthropic`` SDK parses.
"""

from __future__ import annotations

import copy
import json
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from luftpause.dataplane.apis import StreamTranslator, Translated, images
from luftpause.dataplane.apis import messages as msgs
from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.outcome import TurnOutcome

HARNESS = Path(__file__).resolve().parents[1] / "data" / "harness"


def recorded(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((HARNESS / f"claude_code_{name}.json").read_text())
    return body


def parse(body: dict[str, Any]) -> msgs.MessagesRequest:
    return msgs.parse(json.dumps(body).encode())


def request(**fields: Any) -> dict[str, Any]:
    return {
        "model": "claude-x",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """SSE bytes as (event name, data) pairs; each event's name must match its data type."""
    out = []
    assert raw.endswith(b"\n\n") or raw == b""
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        name = name_line.removeprefix("event: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        out.append((name, data))
    return out


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "logprobs": None}
    choice["finish_reason"] = finish
    choice.update(extra)
    return {
        "id": "chatcmpl-abc123",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "served-model",
        "choices": [choice],
        "usage": None,
    }


# A stream shaped like vLLM's with --enable-auto-tool-choice and include_usage: a role-only
# delta with empty content, text, a tool call (id and name first, arguments in pieces),
# the finish, then the usage-only chunk.
STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Let me "}),
    chunk({"content": ""}),
    chunk({"content": "look."}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "chatcmpl-tool-7f3a",
                    "type": "function",
                    "function": {"name": "Read", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"file_path": '}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"/tmp/a.txt"}'}}]}),
    chunk({"content": None}, finish="tool_calls", stop_reason=None),
    {
        "id": "chatcmpl-abc123",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "served-model",
        "choices": [],
        "usage": {
            "prompt_tokens": 1200,
            "completion_tokens": 31,
            "total_tokens": 1231,
            "prompt_tokens_details": {"cached_tokens": 1024},
        },
    },
]

COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-xyz",
    "object": "chat.completion",
    "created": 1,
    "model": "served-model",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Reading it.",
                "reasoning_content": None,
                "tool_calls": [
                    {
                        "id": "chatcmpl-tool-1",
                        "type": "function",
                        "function": {"name": "Read", "arguments": '{"file_path": "/tmp/a"}'},
                    },
                    {
                        "id": "chatcmpl-tool-2",
                        "type": "function",
                        "function": {"name": "Glob", "arguments": ""},
                    },
                ],
            },
            "finish_reason": "tool_calls",
            "stop_reason": None,
        }
    ],
    "usage": {
        "prompt_tokens": 500,
        "completion_tokens": 20,
        "total_tokens": 520,
        "prompt_tokens_details": {"cached_tokens": 384},
    },
}


def translate(stream: list[dict[str, Any]], req: msgs.MessagesRequest | None = None) -> bytes:
    translator: StreamTranslator = (req or parse(request(stream=True))).stream_translator()
    return b"".join(translator.chunk(c) for c in stream) + translator.done()


# ----------------------------------------------------------------------- Claude Code


def test_recorded_claude_code_turns_translate() -> None:
    """B9: both recorded Claude Code turns translate; the tool message of turn 2 echoes
    the tool_use id; the attribution block, deferred placeholder and hints are left out."""
    first: Translated = parse(recorded("turn1"))
    second: Translated = parse(recorded("turn2"))
    for req, body in ((first, recorded("turn1")), (second, recorded("turn2"))):
        chat = req.chat
        assert req.model == chat["model"] == body["model"]
        assert req.stream is True and chat["stream"] is True
        assert "stream_options" not in chat
        assert chat["max_tokens"] == body["max_tokens"]
        for ignored in ("thinking", "metadata", "context_management", "output_config"):
            assert ignored not in chat
        system = chat["messages"][0]
        assert system["role"] == "system"
        assert "x-anthropic-billing-header" not in system["content"]
        assert system["content"].startswith("You are a Claude agent")
        # the mid-conversation system message stays where Claude Code put it
        assert [m["role"] for m in chat["messages"][:3]] == ["system", "user", "system"]
        names = [t["function"]["name"] for t in chat["tools"]]
        assert "Read" in names and "Bash" in names
        assert "DeferredToolPlaceholder" not in names  # deferred, never loaded
        read = next(t for t in chat["tools"] if t["function"]["name"] == "Read")
        source = next(t for t in body["tools"] if t["name"] == "Read")
        assert read["function"]["parameters"] == source["input_schema"]
        assert read["function"]["description"] == source["description"]
        assert not any(m.get("continue_final_message") for m in [chat])

    use = recorded("turn2")["messages"][2]["content"][1]
    assistant, tool = second.chat["messages"][-2:]
    assert assistant["role"] == "assistant" and assistant["content"] == "Let me look."
    assert assistant["tool_calls"] == [
        {
            "id": use["id"],
            "type": "function",
            "function": {"name": "Read", "arguments": json.dumps(use["input"])},
        }
    ]
    assert tool == {"role": "tool", "tool_call_id": use["id"], "content": "1\thello\n2\t"}


def test_recorded_tool_search_loads_the_deferred_tool() -> None:
    """B9: a tool_reference in a tool result loads its deferred tool, as Anthropic's tool
    search does; the reference reads as a line in the tool message."""
    body = recorded("tool_search")
    chat = parse(body).chat
    names = [t["function"]["name"] for t in chat["tools"]]
    assert "CronList" in names and "DeferredToolPlaceholder" not in names
    tool = chat["messages"][-1]
    assert tool["role"] == "tool" and tool["content"] == "Tool CronList is now available."
    # a reference to a tool the request does not carry is refused, as Anthropic does
    body["tools"] = [t for t in body["tools"] if t["name"] != "CronList"]
    with pytest.raises(BadRequest, match=r"messages\[3\]\.content\[0\]\.content\[0\].*'CronList'"):
        parse(body)


def test_recorded_web_search_request_is_refused() -> None:
    """B9: Claude Code's WebSearch side request carries a server tool: a 400 naming it."""
    with pytest.raises(BadRequest, match=r"tools\[0\]: server tool 'web_search_20250305'"):
        parse(recorded("web_search"))


# ----------------------------------------------------------------------- requests


def test_system_messages_and_tool_results() -> None:
    """B9: system blocks joined, cache_control ignored; tool results become tool messages
    before the rest of their user message; errors marked; thinking dropped."""
    chat = parse(
        request(
            system=[
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Use tools."},
            ],
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                        {"type": "redacted_thinking", "data": "xx"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
                        {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "and then?"},
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "one"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "is_error": True,
                            "content": [
                                {"type": "text", "text": "no"},
                                {"type": "text", "text": "such"},
                            ],
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t3", "name": "f", "input": {}}],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t3"}]},
            ],
        )
    ).chat
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": "a\n\nb"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1}'},
                },
                {"id": "toolu_2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "one"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no\n\nsuch"},
        {"role": "user", "content": "and then?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "t3", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "t3", "content": ""},
    ]
    assert parse(request(system="Plain.")).chat["messages"][0] == {
        "role": "system",
        "content": "Plain.",
    }
    assert parse(request(system=[])).chat["messages"][0]["role"] == "user"


PNG = "iVBORw0KGgo="  # base64 of the PNG signature


def png(data: str = PNG) -> anthropic.types.ImageBlockParam:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def test_images_become_image_url_parts_in_order() -> None:
    """B9: image blocks become image_url parts, a base64 source as a data URL, a URL
    source as its URL, in their order among the texts (texts next to each other joined
    as without images); messages without images stay strings; ``image_at`` names the
    first image."""
    messages: list[anthropic.types.MessageParam] = [
        {"role": "user", "content": [{"type": "text", "text": "no image here"}]},
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "compare"},
                {"type": "text", "text": "these:"},
                png(),
                {"type": "text", "text": "and"},
                {
                    "type": "image",
                    "source": {"type": "url", "url": "https://img.test/b.webp"},
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        },
    ]
    translated = parse(request(messages=messages))
    assert translated.image_at == "messages[2].content[2]"
    assert translated.chat["messages"] == [
        {"role": "user", "content": "no image here"},
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "compare\n\nthese:"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                {"type": "text", "text": "and"},
                {"type": "image_url", "image_url": {"url": "https://img.test/b.webp"}},
            ],
        },
    ]
    only = parse(request(messages=[{"role": "user", "content": [png()]}]))
    assert only.chat["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
            ],
        }
    ]
    assert parse(request()).image_at is None


def test_tool_result_images_follow_the_tool_messages() -> None:
    """B9: a tool result's images go, in order, at the start of the user message after
    the tool messages (a Chat Completions tool message carries text only); the tool
    message keeps the result's text."""
    messages: list[anthropic.types.MessageParam] = [
        {"role": "user", "content": "look at the screenshots"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}},
                {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "a.png:"}, png("AAAA")],
                },
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": [png("BBBB")]},
            ],
        },
    ]
    translated = parse(request(messages=messages))
    assert translated.image_at == "messages[2].content[0].content[1]"
    assert translated.chat["messages"][2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.png:"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": ""},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}},
            ],
        },
    ]
    # the user's own blocks come after the results' images
    messages[2]["content"] = [*messages[2]["content"], {"type": "text", "text": "which?"}]
    last = parse(request(messages=messages)).chat["messages"][-1]
    assert [part["type"] for part in last["content"]] == ["image_url", "image_url", "text"]


def test_image_media_types_are_anthropics() -> None:
    """B9: the media types taken are those of the SDK's base64 image source, each one
    kept in the data URL; data URLs of them are taken as URL sources."""
    hints = typing.get_type_hints(anthropic.types.Base64ImageSourceParam)
    assert set(typing.get_args(hints["media_type"])) == set(images.MEDIA_TYPES)
    for media_type in images.MEDIA_TYPES:
        block = {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": PNG},
        }
        content = parse(request(messages=[{"role": "user", "content": [block]}])).chat["messages"]
        assert content[0]["content"][0]["image_url"]["url"] == f"data:{media_type};base64,{PNG}"
        url = {"type": "image", "source": {"type": "url", "url": f"data:{media_type};base64,{PNG}"}}
        assert parse(request(messages=[{"role": "user", "content": [url]}])).image_at is not None


def test_tools_and_tool_choice() -> None:
    """B9: custom tools become functions; each tool_choice maps to its chat value."""
    tools = [
        {"name": "f", "description": "Does f.", "input_schema": {"type": "object"}, "strict": True},
        {
            "type": "custom",
            "name": "g",
            "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}},
            "input_examples": [{"a": "x"}],
            "cache_control": {"type": "ephemeral"},
        },
        {"name": "later", "input_schema": {"type": "object"}, "defer_loading": True},
    ]
    chat = parse(request(tools=tools)).chat
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": "Does f.",
                "parameters": {"type": "object"},
                "strict": True,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "g",
                "description": 'Input examples:\n{"a": "x"}',
                "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
            },
        },
    ]
    assert "tool_choice" not in chat and "parallel_tool_calls" not in chat
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "g"}, {"type": "function", "function": {"name": "g"}}),
    ]
    for choice, expected in cases:
        chat = parse(request(tools=tools, tool_choice=choice)).chat
        assert chat["tool_choice"] == expected and "parallel_tool_calls" not in chat
    chat = parse(
        request(tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    ).chat
    assert chat["parallel_tool_calls"] is False
    # auto without tools: nothing to choose from, and engines refuse a tool_choice without tools
    assert "tool_choice" not in parse(request(tool_choice={"type": "auto"})).chat


def test_sampling_fields_prefill_and_structured_output() -> None:
    """B9: sampling fields pass, stop_sequences → stop, output_config.format →
    response_format; ignored hints leave no trace; a last assistant message is continued."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    chat = parse(
        request(
            temperature=0.2,
            top_p=0.9,
            top_k=40,
            stop_sequences=["END"],
            metadata={"user_id": "u"},
            service_tier="auto",
            thinking={"type": "enabled", "budget_tokens": 2000},
            context_management={"edits": []},
            output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema}},
            some_future_hint={"x": 1},
        )
    ).chat
    assert chat == {
        "model": "claude-x",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END"],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema, "strict": True},
        },
        "stream": False,
    }
    prefill = parse(
        request(
            messages=[
                {"role": "user", "content": "Sun?"},
                {"role": "assistant", "content": "The answer is ("},
            ]
        )
    ).chat
    assert prefill["continue_final_message"] is True and prefill["add_generation_prompt"] is False


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"model": None}, r"'model'"),
    ({"max_tokens": None}, r"'max_tokens' is required"),
    ({"max_tokens": "10"}, r"'max_tokens'.*a string '10'"),
    ({"max_tokens": 0}, r"'max_tokens' must be at least 1"),
    ({"messages": []}, r"'messages'"),
    ({"messages": ["hi"]}, r"'messages\[0\]' must be an object"),
    ({"messages": [{"role": "tool", "content": "x"}]}, r"'messages\[0\]\.role'"),
    ({"messages": [{"role": "user", "content": 5}]}, r"'messages\[0\]\.content'"),
    ({"stream": "yes"}, r"'stream'"),
    ({"temperature": "hot"}, r"'temperature'"),
    ({"top_p": True}, r"'top_p'"),
    ({"top_k": 1.5}, r"'top_k'"),
    ({"stop_sequences": "END"}, r"'stop_sequences'"),
    ({"system": 3}, r"'system'"),
    ({"system": [{"type": "image"}]}, r"system\[0\]: only text blocks are allowed here"),
    ({"tools": {}}, r"'tools' must be an array"),
    ({"tools": [{"name": "f"}]}, r"'tools\[0\]\.input_schema'"),
    ({"tools": [{"input_schema": {}}]}, r"'tools\[0\]\.name'"),
    (
        {"tools": [{"name": "f", "input_schema": {}}, {"name": "f", "input_schema": {}}]},
        r"tools\[1\]: tool name 'f' is used twice",
    ),
    (
        {"tools": [{"type": "bash_20250124", "name": "bash"}]},
        r"tools\[0\]: server tool 'bash_20250124'",
    ),
    (
        {"tools": [{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]},
        r"tools\[0\]: server tool 'text_editor_20250728'",
    ),
    (
        {"tools": [{"type": "computer_20250124", "name": "computer"}]},
        r"server tool 'computer_20250124'",
    ),
    (
        {"tools": [{"type": "code_execution_20250825", "name": "c"}]},
        r"server tool 'code_execution_",
    ),
    ({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}, r"server tool 'web_fetch_"),
    ({"tool_choice": "auto"}, r"'tool_choice' must be an object"),
    ({"tool_choice": {"type": "maybe"}}, r"'tool_choice\.type'"),
    ({"tool_choice": {"type": "any"}}, r"'tool_choice' of type 'any' needs 'tools'"),
    (
        {
            "tools": [{"name": "f", "input_schema": {}}],
            "tool_choice": {"type": "tool", "name": "g"},
        },
        r"'tool_choice\.name' 'g' is not one of the tools offered",
    ),
    (
        {"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]},
        r"'mcp_servers' is not supported",
    ),
    ({"container": "cntr_1"}, r"'container' is not supported"),
    ({"output_config": {"format": {"type": "regex"}}}, r"'output_config\.format'"),
]

BLOCKS: list[tuple[str, dict[str, Any], str]] = [
    (
        "user",
        {"type": "image", "source": {}},
        r"'messages\[0\]\.content\[1\]\.source\.type' must be 'base64' or 'url'",
    ),
    (
        "user",
        {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AA=="}},
        r"'messages\[0\]\.content\[1\]\.source\.media_type' must be one of image/jpeg, "
        r"image/png, image/gif, image/webp, got a string 'image/bmp'",
    ),
    (
        "user",
        {"type": "image", "source": {"type": "base64", "media_type": "image/png"}},
        r"'messages\[0\]\.content\[1\]\.source\.data' must be non-empty base64 data, got null",
    ),
    (
        "user",
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "a b!"}},
        r"'messages\[0\]\.content\[1\]\.source\.data' is not valid base64",
    ),
    (
        "user",
        {"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}},
        r"'messages\[0\]\.content\[1\]\.source\.url' must be an http, https or data URL, "
        r"got 'file:///etc/passwd' \(scheme 'file'\)",
    ),
    (
        "user",
        {"type": "image", "source": {"type": "url", "url": "https:///no-host.png"}},
        r"'messages\[0\]\.content\[1\]\.source\.url' must be an http or https URL with a host",
    ),
    (
        "user",
        {"type": "image", "source": {"type": "url", "url": "data:text/plain;base64,AA=="}},
        r"\.source\.url' is a data URL of type 'text/plain'",
    ),
    (
        "user",
        {"type": "image", "source": {"type": "file", "file_id": "file_011"}},
        r"'messages\[0\]\.content\[1\]\.source' is a file source: file IDs .* not supported",
    ),
    (
        "assistant",
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
        r"messages\[0\]\.content\[1\]: image blocks belong in user messages",
    ),
    ("user", {"type": "document", "source": {}}, r"messages\[0\]\.content\[1\]: document blocks"),
    (
        "user",
        {"type": "search_result", "source": "s"},
        r"messages\[0\]\.content\[1\]: search_result blocks",
    ),
    (
        "user",
        {"type": "container_upload", "file_id": "f"},
        r"messages\[0\]\.content\[1\]: container_upload",
    ),
    (
        "user",
        {"type": "hologram"},
        r"messages\[0\]\.content\[1\]: unknown content block type 'hologram'",
    ),
    (
        "user",
        {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        r"belong in assistant messages",
    ),
    ("user", {"text": "no type"}, r"'messages\[0\]\.content\[1\]\.type'"),
    ("user", {"type": "text", "text": 7}, r"'messages\[0\]\.content\[1\]\.text' must be a string"),
    (
        "user",
        {"type": "tool_result", "tool_use_id": 5},
        r"'messages\[0\]\.content\[1\]\.tool_use_id'",
    ),
    ("user", {"type": "tool_result", "tool_use_id": "t", "is_error": "y"}, r"\.is_error'"),
    (
        "user",
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]},
        r"'messages\[0\]\.content\[1\]\.content\[0\]\.source\.type' must be",
    ),
    (
        "user",
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]},
        r"messages\[0\]\.content\[1\]\.content\[0\]: document blocks are not supported",
    ),
    (
        "assistant",
        {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
        r"messages\[0\]\.content\[1\]: server_tool_use blocks are not supported",
    ),
    (
        "assistant",
        {"type": "web_search_tool_result", "tool_use_id": "s", "content": []},
        r"messages\[0\]\.content\[1\]: web_search_tool_result blocks are not supported",
    ),
    (
        "assistant",
        {"type": "tool_use", "id": "t", "name": "f", "input": "x"},
        r"\.content\[1\]\.input'",
    ),
    ("assistant", {"type": "tool_use", "id": "", "name": "f", "input": {}}, r"\.content\[1\]\.id'"),
    ("assistant", {"type": "tool_result", "tool_use_id": "t"}, r"belong in user messages"),
]


@pytest.mark.parametrize(("fields", "pattern"), REFUSED)
def test_bad_fields_are_refused_by_name(fields: dict[str, Any], pattern: str) -> None:
    """B9: what cannot be translated, or is of the wrong type, is a 400 naming the field."""
    body = request(**fields)
    for name, value in fields.items():
        if value is None:
            del body[name]
    with pytest.raises(BadRequest, match=pattern) as info:
        parse(body)
    assert info.value.status == 400


@pytest.mark.parametrize(("role", "block", "pattern"), BLOCKS)
def test_untranslatable_blocks_are_refused_by_position(
    role: str, block: dict[str, Any], pattern: str
) -> None:
    """B9: a content block that cannot be translated is a 400 naming its type and position."""
    body = request(messages=[{"role": role, "content": [{"type": "text", "text": "x"}, block]}])
    with pytest.raises(BadRequest, match=pattern):
        parse(body)


def test_body_that_is_not_json_is_refused() -> None:
    """B9: the body is read like a chat body (a JSON object or a 400), and what it holds
    must be passable on (no lone surrogates): refused before admission, not after."""
    with pytest.raises(BadRequest, match="JSON"):
        msgs.parse(b"{nope")
    with pytest.raises(BadRequest, match="JSON object"):
        msgs.parse(b"[1]")
    lone = b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "\\ud800"}]}'
    with pytest.raises(BadRequest, match="cannot be passed on"):
        msgs.parse(lone)


# ----------------------------------------------------------------------- replies


def test_reply_has_text_tool_uses_and_cached_usage() -> None:
    """B9: a completion becomes a Message: text, then tool_use blocks with the engine's
    ids unchanged and parsed input; usage splits cached tokens out of the prompt."""
    message = parse(request()).reply(copy.deepcopy(COMPLETION))
    assert message["id"] == "msg_xyz" and message["type"] == "message"
    assert message["role"] == "assistant" and message["model"] == "claude-x"
    assert message["content"] == [
        {"type": "text", "text": "Reading it."},
        {
            "type": "tool_use",
            "id": "chatcmpl-tool-1",
            "name": "Read",
            "input": {"file_path": "/tmp/a"},
        },
        {"type": "tool_use", "id": "chatcmpl-tool-2", "name": "Glob", "input": {}},
    ]
    assert message["stop_reason"] == "tool_use" and message["stop_sequence"] is None
    assert message["usage"] == {
        "input_tokens": 116,
        "cache_read_input_tokens": 384,
        "cache_creation_input_tokens": 0,
        "output_tokens": 20,
    }


@pytest.mark.parametrize(
    ("choice", "stop_reason", "stop_sequence"),
    [
        ({"finish_reason": "stop"}, "end_turn", None),
        ({"finish_reason": "stop", "stop_reason": None}, "end_turn", None),
        ({"finish_reason": "stop", "stop_reason": 128001}, "end_turn", None),  # a stop token id
        ({"finish_reason": "stop", "stop_reason": "END"}, "stop_sequence", "END"),  # vLLM
        ({"finish_reason": "stop", "matched_stop": "END"}, "stop_sequence", "END"),  # SGLang
        ({"finish_reason": "stop", "stop_reason": "OTHER"}, "end_turn", None),
        ({"finish_reason": "length"}, "max_tokens", None),
        ({"finish_reason": "tool_calls"}, "tool_use", None),
        ({"finish_reason": "content_filter"}, "refusal", None),
        ({"finish_reason": None}, "end_turn", None),
    ],
)
def test_reply_stop_reasons(
    choice: dict[str, Any], stop_reason: str, stop_sequence: str | None
) -> None:
    """B9: finish_reason → stop_reason; the matched stop string when the engine says it."""
    completion = {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, **choice}],
    }
    message = parse(request(stop_sequences=["END"])).reply(completion)
    assert (message["stop_reason"], message["stop_sequence"]) == (stop_reason, stop_sequence)


def test_reply_keeps_arguments_that_are_not_an_object() -> None:
    """B9: arguments that are not a JSON object reach the client under
    ``_unparsed_arguments`` (its input validation tells the model), never as ``{}``."""
    completion = copy.deepcopy(COMPLETION)
    calls = completion["choices"][0]["message"]["tool_calls"]
    calls[0]["function"]["arguments"] = '{"file_path": "/tmp/a"'
    calls[1]["function"]["arguments"] = "[1, 2]"
    content = parse(request()).reply(completion)["content"]
    assert content[1]["input"] == {"_unparsed_arguments": '{"file_path": "/tmp/a"'}
    assert content[2]["input"] == {"_unparsed_arguments": "[1, 2]"}


def test_reply_of_an_odd_completion_is_still_a_message() -> None:
    """B9: no choices, no usage, null content: an empty end_turn Message with zero usage."""
    message = parse(request()).reply({"choices": []})
    assert message["content"] == [] and message["stop_reason"] == "end_turn"
    assert message["id"].startswith("msg_") and message["usage"]["input_tokens"] == 0
    anthropic.types.Message.model_validate(message)


# ----------------------------------------------------------------------- streams


def test_stream_translates_event_by_event() -> None:
    """B9: text, then a tool call with split arguments, then usage and [DONE] become
    message_start, a text block, a tool_use block with input_json_delta pieces, and
    message_delta (stop_reason, full usage) then message_stop; nothing is held back."""
    translator = parse(request(stream=True)).stream_translator()
    per_chunk = [events(translator.chunk(c)) for c in STREAM]
    tail = events(translator.done())
    # each chunk's events come out with that chunk
    assert [name for name, _ in per_chunk[0]] == ["message_start"]
    assert [name for name, _ in per_chunk[1]] == ["content_block_start", "content_block_delta"]
    assert per_chunk[2] == []  # empty content delta
    assert [name for name, _ in per_chunk[4]] == ["content_block_stop", "content_block_start"]
    assert [name for name, _ in per_chunk[5]] == ["content_block_delta"]
    assert per_chunk[7] == per_chunk[8] == []  # finish and usage are remembered
    seq = [e for chunk_events in per_chunk for e in chunk_events] + tail
    assert [name for name, _ in seq] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = seq[0][1]["message"]
    assert start["id"] == "msg_abc123" and start["model"] == "claude-x" and start["content"] == []
    assert start["stop_reason"] is None and start["usage"]["input_tokens"] == 0
    assert seq[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert [d["delta"] for _, d in seq[2:4]] == [
        {"type": "text_delta", "text": "Let me "},
        {"type": "text_delta", "text": "look."},
    ]
    assert seq[5][1] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {
            "type": "tool_use",
            "id": "chatcmpl-tool-7f3a",
            "name": "Read",
            "input": {},
        },
    }
    assert [d["delta"]["partial_json"] for _, d in seq[6:8]] == ['{"file_path": ', '"/tmp/a.txt"}']
    assert seq[8][1]["index"] == 1
    assert seq[9][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {
            "input_tokens": 176,
            "cache_read_input_tokens": 1024,
            "cache_creation_input_tokens": 0,
            "output_tokens": 31,
        },
    }
    assert translator.done() == b"" and translator.chunk(STREAM[1]) == b""


def test_stream_several_tool_calls_in_one_chunk_and_text_after() -> None:
    """B9: several tool call deltas in one chunk each get a block (arguments sent with the
    id included); text after a tool call opens a new text block; repeated ids continue."""
    raw = translate(
        [
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "c1",
                            "function": {"name": "f", "arguments": '{"a": 1}'},
                        },
                        {"index": 1, "id": "c2", "function": {"name": "g", "arguments": "{"}},
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 1, "id": "c2", "function": {"arguments": "}"}}]}),
            chunk({"content": "Done."}, finish="stop"),
        ]
    )
    seq = events(raw)
    starts = [d["content_block"] for n, d in seq if n == "content_block_start"]
    assert [(b["type"], b.get("id")) for b in starts] == [
        ("tool_use", "c1"),
        ("tool_use", "c2"),
        ("text", None),
    ]
    pieces = [(d["index"], d["delta"]) for n, d in seq if n == "content_block_delta"]
    assert pieces == [
        (0, {"type": "input_json_delta", "partial_json": '{"a": 1}'}),
        (1, {"type": "input_json_delta", "partial_json": "{"}),
        (1, {"type": "input_json_delta", "partial_json": "}"}),
        (2, {"type": "text_delta", "text": "Done."}),
    ]
    stops = [d["index"] for n, d in seq if n == "content_block_stop"]
    assert stops == [0, 1, 2]
    # tool calls were made, so the turn paused on them whatever finish_reason said
    assert seq[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_stream_edge_cases() -> None:
    """B9: an empty stream still opens and closes a Message; a matched stop sequence is
    named; a broken stream ends with an error event and nothing after it."""
    seq = events(parse(request(stream=True)).stream_translator().done())
    assert [n for n, _ in seq] == ["message_start", "message_delta", "message_stop"]
    assert seq[1][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert seq[1][1]["usage"]["output_tokens"] == 0

    req = parse(request(stream=True, stop_sequences=["STOP"]))
    raw = translate([chunk({"content": "a"}), chunk({}, finish="stop", stop_reason="STOP")], req)
    assert events(raw)[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}

    translator = parse(request(stream=True)).stream_translator()
    translator.chunk(chunk({"content": "partial"}))
    failed = events(translator.failed("engine r1: connection reset"))
    assert failed == [
        (
            "error",
            {
                "type": "error",
                "error": {"type": "api_error", "message": "engine r1: connection reset"},
            },
        )
    ]
    assert translator.done() == b"" and translator.failed("again") == b""

    # an engine that reports a failure inside the stream (an ``error`` chunk)
    translator = parse(request(stream=True)).stream_translator()
    translator.chunk(chunk({"content": "partial"}))
    failed = events(translator.chunk({"error": {"object": "error", "message": "KV cache full"}}))
    assert failed == [
        ("error", {"type": "error", "error": {"type": "api_error", "message": "KV cache full"}})
    ]
    assert translator.done() == b""


# ----------------------------------------------------------------------- the official SDK


def sdk_client(handler: Callable[[httpx2.Request], httpx2.Response]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url="http://proxy.test",
        api_key="x",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


def serving(
    reply: Callable[[msgs.MessagesRequest], httpx2.Response], seen: list[msgs.MessagesRequest]
) -> Callable[[httpx2.Request], httpx2.Response]:
    """A handler that parses what the SDK sends with ``parse`` and answers with ``reply``."""

    def handler(req: httpx2.Request) -> httpx2.Response:
        assert req.url.path == "/v1/messages"
        translated = msgs.parse(req.content)
        seen.append(translated)
        return reply(translated)

    return handler


SDK_MESSAGES: list[Any] = [
    {"role": "user", "content": "Read /tmp/a.txt"},
]
SDK_TOOLS: list[Any] = [
    {"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object"}},
]


def test_sdk_stream_accumulates_the_translated_stream() -> None:
    """B9: the official SDK's ``messages.stream`` accumulates the translator's events into
    the final Message: text, tool_use input, usage, stop_reason."""
    seen: list[msgs.MessagesRequest] = []

    def reply(req: msgs.MessagesRequest) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=translate(STREAM, req)
        )

    client = sdk_client(serving(reply, seen))
    with client.messages.stream(
        model="claude-x", max_tokens=64, messages=SDK_MESSAGES, tools=SDK_TOOLS
    ) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert seen[0].stream and seen[0].chat["tools"][0]["function"]["name"] == "Read"
    assert "".join(texts) == "Let me look."
    assert final.model == "claude-x" and final.stop_reason == "tool_use"
    assert final.content[0].type == "text" and final.content[0].text == "Let me look."
    use = final.content[1]
    assert use.type == "tool_use" and use.id == "chatcmpl-tool-7f3a" and use.name == "Read"
    assert use.input == {"file_path": "/tmp/a.txt"}
    assert final.usage.input_tokens == 176
    assert final.usage.cache_read_input_tokens == 1024
    assert final.usage.output_tokens == 31


def test_sdk_create_parses_the_translated_reply() -> None:
    """B9: the official SDK's ``messages.create`` parses the translated non-stream reply."""
    seen: list[msgs.MessagesRequest] = []

    def reply(req: msgs.MessagesRequest) -> httpx2.Response:
        return httpx2.Response(200, json=req.reply(copy.deepcopy(COMPLETION)))

    client = sdk_client(serving(reply, seen))
    message = client.messages.create(
        model="claude-x",
        max_tokens=64,
        system="Be brief.",
        messages=SDK_MESSAGES,
        tools=SDK_TOOLS,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    assert not seen[0].stream and seen[0].chat["parallel_tool_calls"] is False
    assert seen[0].chat["messages"][0] == {"role": "system", "content": "Be brief."}
    assert isinstance(message, anthropic.types.Message)
    assert [block.type for block in message.content] == ["text", "tool_use", "tool_use"]
    assert message.content[1].input == {"file_path": "/tmp/a"}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    assert message.usage.cache_read_input_tokens == 384 and message.usage.input_tokens == 116


def test_sdk_image_request_translates() -> None:
    """B9: what the official SDK sends for an image (``ImageBlockParam``) translates to
    an image_url part."""
    seen: list[msgs.MessagesRequest] = []

    def reply(req: msgs.MessagesRequest) -> httpx2.Response:
        return httpx2.Response(200, json=req.reply(copy.deepcopy(COMPLETION)))

    client = sdk_client(serving(reply, seen))
    client.messages.create(
        model="claude-x",
        max_tokens=64,
        messages=[
            {
                "role": "user",
                "content": [png(), {"type": "text", "text": "What is this?"}],
            }
        ],
    )
    assert seen[0].chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "text", "text": "What is this?"},
    ]


@pytest.mark.parametrize(
    ("status", "kind", "error_class"),
    [
        (400, "invalid_request_error", anthropic.BadRequestError),
        (401, "authentication_error", anthropic.AuthenticationError),
        (403, "permission_error", anthropic.PermissionDeniedError),
        (404, "not_found_error", anthropic.NotFoundError),
        (413, "request_too_large", anthropic.ContentTooLargeError),
        (415, "invalid_request_error", anthropic.APIStatusError),
        (429, "rate_limit_error", anthropic.RateLimitError),
        (500, "api_error", anthropic.InternalServerError),
        (502, "api_error", anthropic.InternalServerError),
        (503, "api_error", anthropic.ServiceUnavailableError),
        (504, "timeout_error", anthropic.GatewayTimeoutError),
        (529, "overloaded_error", anthropic.OverloadedError),
    ],
)
def test_error_bodies_parse_as_the_sdks_errors(
    status: int, kind: str, error_class: type[Exception]
) -> None:
    """D6, B9: errors the dataplane answers itself come in Anthropic's shape, which the SDK
    raises as its error for that status, with the message."""
    body = msgs.error_body(status, f"no luck ({status})", "some_code")
    assert body == {"type": "error", "error": {"type": kind, "message": f"no luck ({status})"}}
    client = sdk_client(lambda _req: httpx2.Response(status, json=body))
    with pytest.raises(error_class) as info:
        client.messages.create(model="claude-x", max_tokens=8, messages=SDK_MESSAGES)
    assert f"no luck ({status})" in str(info.value)
    assert getattr(info.value, "status_code", status) == status


def test_sdk_raises_the_stream_error_event() -> None:
    """D6, B9: an engine that breaks off mid-stream ends the stream with an error event
    the SDK raises, after the text that came before it."""

    def reply(req: msgs.MessagesRequest) -> httpx2.Response:
        translator = req.stream_translator()
        raw = (
            translator.chunk(STREAM[0])
            + translator.chunk(STREAM[1])
            + translator.failed("engine broke")
        )
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=raw)

    client = sdk_client(serving(reply, []))
    texts: list[str] = []
    with pytest.raises(anthropic.APIStatusError, match="engine broke"):  # noqa: SIM117
        with client.messages.stream(
            model="claude-x", max_tokens=8, messages=SDK_MESSAGES
        ) as stream:
            texts.extend(stream.text_stream)
    assert texts == ["Let me "]


# ----------------------------------------------------------------------- observing


def native_stream() -> Iterator[dict[str, Any]]:
    """A native Messages stream (as an engine serving /v1/messages sends it)."""
    yield {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 90},
        },
    }
    yield {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    yield {"type": "ping"}
    yield {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}
    yield {"type": "content_block_stop", "index": 0}
    yield {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {}},
    }
    yield {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": "{}"},
    }
    yield {"type": "content_block_stop", "index": 1}
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 12, "input_tokens": 10, "cache_read_input_tokens": 90},
    }
    yield {"type": "message_stop"}


def test_observe_reads_a_native_stream() -> None:
    """B9, D5: first token, tool_use ids, stop_reason (as chat's finish) and usage
    (prompt = input + cache read + cache creation) from native stream events."""
    outcome = TurnOutcome()
    first = True
    for event in native_stream():
        msgs.observe(event, outcome)
        if event["type"] == "content_block_start" and first:
            assert not outcome.first_token  # an empty text block is no token yet
            first = False
    assert outcome.first_token and outcome.tool_call_ids == ["toolu_9"]
    assert outcome.finish_reason == "tool_calls" and outcome.paused_on_tool
    assert (outcome.prompt_tokens, outcome.cached_tokens, outcome.completion_tokens) == (
        100,
        90,
        12,
    )
    assert outcome.done

    # a message_delta with only output tokens keeps the input counts of message_start
    outcome = TurnOutcome()
    events_ = list(native_stream())
    events_[-2]["usage"] = {"output_tokens": 5}
    for event in events_:
        msgs.observe(event, outcome)
    assert (outcome.prompt_tokens, outcome.cached_tokens, outcome.completion_tokens) == (100, 90, 5)


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("refusal", "content_filter"),
    ],
)
def test_observe_reply_reads_a_native_message(stop_reason: str, finish: str) -> None:
    """B9, D5: a native Message body: content, stop_reason, usage."""
    outcome = TurnOutcome()
    msgs.observe_reply(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": stop_reason,
            "usage": {
                "input_tokens": 7,
                "cache_creation_input_tokens": 3,
                "cache_read_input_tokens": 20,
                "output_tokens": 4,
            },
        },
        outcome,
    )
    assert outcome.first_token and outcome.finish_reason == finish and not outcome.paused_on_tool
    assert (outcome.prompt_tokens, outcome.cached_tokens, outcome.completion_tokens) == (30, 20, 4)
    # and a translated reply reads back the same way as the completion it came from
    outcome = TurnOutcome()
    msgs.observe_reply(parse(request()).reply(copy.deepcopy(COMPLETION)), outcome)
    assert outcome.tool_call_ids == ["chatcmpl-tool-1", "chatcmpl-tool-2"]
    assert (outcome.prompt_tokens, outcome.cached_tokens, outcome.completion_tokens) == (
        500,
        384,
        20,
    )
    assert outcome.finish_reason == "tool_calls"
