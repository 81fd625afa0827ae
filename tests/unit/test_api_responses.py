"""The OpenAI Responses API over Chat Completions (B9): requests translated, replies
and streams translated back, native replies read for the report, errors in OpenAI's
shape (D6). The recorded Codex CLI requests are in ``tests/data/harness/codex_*.json``
(long prompt texts redacted)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses import ResponseInputContentParam, ResponseInputItemParam

from luftpause.dataplane.apis import responses
from luftpause.dataplane.apis.responses import ResponsesRequest, error_body, parse
from luftpause.dataplane.apis.responses.reply import _custom_input
from luftpause.dataplane.apis.responses.stream import _CustomInput
from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.outcome import TurnOutcome

HARNESS = Path(__file__).parent.parent / "data" / "harness"


def recorded(name: str) -> bytes:
    return (HARNESS / f"{name}.json").read_bytes()


def req(**body: Any) -> ResponsesRequest:
    return parse(json.dumps({"model": "m", "input": "hi", **body}).encode())


def events(raw: bytes) -> list[dict[str, Any]]:
    """The SSE bytes as (checked) event payloads."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        kind_line, data_line = block.split("\n")
        assert kind_line.startswith("event: ") and data_line.startswith("data: ")
        payload = json.loads(data_line[6:])
        assert payload["type"] == kind_line[7:]
        out.append(payload)
    return out


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices, "usage": None, **extra}  # fmt: skip


USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 9,
    "total_tokens": 129,
    "prompt_tokens_details": {"cached_tokens": 64},
}

# What a vLLM-like engine streams for "text, then a tool call" (role-only and empty deltas,
# "usage": null members, the call's arguments split, a usage-only last chunk).
CHUNKS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Running"}),
    chunk({"content": " it."}),
    chunk({"content": ""}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "chatcmpl-tool-abc",
                    "type": "function",
                    "function": {"name": "exec_command", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd": '}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"echo hi"}'}}]}),
    chunk({}, "tool_calls"),
    chunk(None, usage=USAGE),
]


def stream_all(request: ResponsesRequest, chunks: list[dict[str, Any]]) -> bytes:
    translator = request.stream_translator()
    return b"".join(translator.chunk(c) for c in chunks) + translator.done()


def completion(message: dict[str, Any], finish: str = "stop", usage: Any = USAGE) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": finish}], "usage": usage}  # fmt: skip


# ---------------------------------------------------------------------------------------
# Requests


def test_codex_turn1_translates() -> None:
    """B9: Codex's first turn (no instructions; developer messages; function, namespace and
    hosted web_search tools; store false) becomes a Chat Completions body."""
    request = parse(recorded("codex_turn1"))
    chat = request.chat
    assert request.model == "probe-model" and request.stream is True
    assert chat["model"] == "probe-model" and chat["stream"] is True
    assert "stream_options" not in chat
    assert [m["role"] for m in chat["messages"]] == ["system", "system", "user", "user"]
    # two input_text parts in one developer message: one system message
    assert chat["messages"][1]["content"].count("\n") == 1
    assert chat["messages"][3]["content"].startswith("Run `echo hi`")
    names = [t["function"]["name"] for t in chat["tools"]]
    assert "exec_command" in names and "spawn_agent" in names  # namespace flattened
    assert "web_search" not in names  # hosted: dropped
    assert all(t["type"] == "function" for t in chat["tools"])
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is True
    # store, include, prompt_cache_key, client_metadata, reasoning.summary: not for the engine
    for key in ("store", "include", "prompt_cache_key", "client_metadata", "reasoning"):
        assert key not in chat
    assert "reasoning_effort" not in chat


def test_codex_turn2_echoes_call_id() -> None:
    """B9, D2: Codex's second turn: the reasoning item is dropped, the assistant text and the
    function call share one assistant message, and the tool message echoes the call_id."""
    chat = parse(recorded("codex_turn2")).chat
    assistant, tool = chat["messages"][-2:]
    assert assistant["role"] == "assistant" and assistant["content"] == "Running it."
    assert assistant["tool_calls"] == [
        {
            "id": "call_probe1",
            "type": "function",
            "function": {"name": "exec_command", "arguments": '{"cmd": "echo hi"}'},
        }
    ]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_probe1"
    assert tool["content"].endswith("Output:\nhi\n")
    assert not any("reasoning" in m for m in chat["messages"])


def test_codex_known_model_turns_translate() -> None:
    """B9: with model metadata it knows, Codex sends its tools in an additional_tools item
    (namespaces, a custom tool with a Lark grammar) and custom tool outputs as part lists."""
    first = parse(recorded("codex_known_model_turn1"))
    tools = {t["function"]["name"]: t["function"] for t in first.chat["tools"]}
    exec_tool = tools["exec"]
    assert exec_tool["parameters"]["required"] == ["input"]
    about = exec_tool["parameters"]["properties"]["input"]["description"]
    assert "lark grammar" in about and "PRAGMA_LINE" in about
    assert first.chat["reasoning_effort"] == "low"
    assert first.chat["parallel_tool_calls"] is False
    assert "text" not in first.chat and "response_format" not in first.chat  # verbosity only

    chat = parse(recorded("codex_known_model_turn2")).chat
    assistant, tool = chat["messages"][-2:]
    call = assistant["tool_calls"][0]
    assert call["id"] == "call_probe2" and call["function"]["name"] == "exec"
    assert json.loads(call["function"]["arguments"]) == {"input": "text('hi from exec')\n"}
    assert tool == {
        "role": "tool",
        "tool_call_id": "call_probe2",
        "content": "Script completed\nWall time 0.0 seconds\nOutput:\n\nhi from exec",
    }


def test_instructions_string_input_and_roles() -> None:
    """B9: instructions become the first system message, a string input one user message;
    message roles and text parts translate (developer is system, refusal is text)."""
    chat = req(instructions="Be brief.").chat
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    items = [
        {"type": "message", "role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "b", "annotations": []},
                {"type": "refusal", "refusal": "no"},
            ],
        },
        {"type": "message", "role": "system", "content": "sys"},
    ]
    assert req(input=items).chat["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b\nno"},
        {"role": "system", "content": "sys"},
    ]


def test_calls_merge_and_outputs_follow() -> None:
    """B9: consecutive calls share one assistant message; a call after a tool message starts
    a new one; custom tool calls travel as {"input": ...} arguments."""
    items = [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"a":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
        {"type": "custom_tool_call", "call_id": "c3", "name": "patch", "input": 'a "b"\n'},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": "ok"},
    ]
    tools = [
        {"type": "function", "name": "f", "parameters": {"type": "object"}},
        {"type": "custom", "name": "patch"},
    ]
    messages = req(input=items, tools=tools).chat["messages"]
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
    ]
    assert messages[1]["content"] is None
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert [m["tool_call_id"] for m in messages[2:4]] == ["c1", "c2"]
    custom = messages[4]["tool_calls"][0]["function"]
    assert custom["name"] == "patch"
    assert json.loads(custom["arguments"]) == {"input": 'a "b"\n'}


PNG_URL = "data:image/png;base64,iVBORw0KGgo="


def test_input_images_become_image_url_parts_in_order() -> None:
    """B9: input_image parts of a user message become image_url parts in their order
    among the texts (texts next to each other joined with a newline, as without images),
    with their detail (OpenAI's ``original`` as ``high``); ``image_at`` names the first."""
    content: list[ResponseInputContentParam] = [
        {"type": "input_text", "text": "compare"},
        {"type": "input_text", "text": "these:"},
        {"type": "input_image", "image_url": PNG_URL, "detail": "low"},
        {"type": "input_text", "text": "and"},
        {"type": "input_image", "image_url": "https://img.test/b.jpg", "detail": "original"},
        {"type": "input_image", "image_url": "http://img.test/c.gif"},  # type: ignore[list-item]  # no detail: none sent
    ]
    items: list[ResponseInputItemParam] = [
        {"type": "message", "role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": content},
    ]
    request = req(input=items)
    assert request.image_at == "input[1].content[2]"
    assert request.chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "compare\nthese:"},
                {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}},
                {"type": "text", "text": "and"},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://img.test/b.jpg", "detail": "high"},
                },
                {"type": "image_url", "image_url": {"url": "http://img.test/c.gif"}},
            ],
        },
    ]
    assert req().image_at is None


def test_tool_output_images_follow_the_tool_messages() -> None:
    """B9: images in function call outputs go, in order, into a user message right after
    the run of tool messages (a Chat Completions tool message carries text only), before
    whatever comes next."""
    items: list[ResponseInputItemParam] = [
        {"type": "message", "role": "user", "content": "screenshots please"},
        {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "shot", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [
                {"type": "input_text", "text": "first"},
                {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
            ],
        },
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_image", "image_url": "https://img.test/2.png"}],
        },
        {"type": "function_call", "call_id": "c3", "name": "shot", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c3",
            "output": [{"type": "input_image", "image_url": "https://img.test/3.png"}],
        },
    ]
    tools = [{"type": "function", "name": "shot", "parameters": {"type": "object"}}]
    request = req(input=items, tools=tools)
    assert request.image_at == "input[3].output[1]"
    messages = request.chat["messages"]
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "user",
        "assistant",
        "tool",
        "user",
    ]
    assert messages[2]["content"] == "first" and messages[3]["content"] == ""
    assert messages[4]["content"] == [
        {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "auto"}},
        {"type": "image_url", "image_url": {"url": "https://img.test/2.png"}},
    ]
    assert messages[7]["content"] == [
        {"type": "image_url", "image_url": {"url": "https://img.test/3.png"}}
    ]


def test_sdk_image_request_translates() -> None:
    """B9: what the openai SDK sends for an image input translates to an image_url part."""
    seen: list[ResponsesRequest] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(parse(request.content))
        return httpx.Response(200, json=seen[-1].reply(completion({"content": "a cat"})))

    sdk_client(handler).responses.create(
        model="m",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is it?"},
                    {"type": "input_image", "image_url": PNG_URL, "detail": "high"},
                ],
            }
        ],
    )
    assert seen[0].chat["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is it?"},
                {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "high"}},
            ],
        }
    ]


def test_tools_and_tool_choice_translate() -> None:
    """B9: function tools (strict kept), custom tools (text and grammar formats) as functions
    with one string parameter, namespaces flattened (qualified only on a name clash), and
    named tool choices point at the chat function."""
    tools = [
        {"type": "function", "name": "f", "description": "F", "strict": True,
         "parameters": {"type": "object", "properties": {}}},
        {"type": "custom", "name": "free", "description": "Free text"},
        {"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": "regex",
                                                   "definition": "[a-z]+"}},
        {"type": "namespace", "name": "ns", "description": "N",
         "tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "only"}]},
        {"type": "web_search_preview"},
    ]  # fmt: skip
    request = req(tools=tools, tool_choice={"type": "custom", "name": "free"})
    chat = request.chat
    functions = {t["function"]["name"]: t["function"] for t in chat["tools"]}
    assert list(functions) == ["f", "free", "g", "ns__f", "only"]
    assert functions["f"] == {
        "name": "f",
        "description": "F",
        "parameters": {"type": "object", "properties": {}},
        "strict": True,
    }
    assert functions["free"]["description"] == "Free text"
    assert functions["free"]["parameters"]["properties"]["input"]["type"] == "string"
    assert "[a-z]+" in functions["g"]["parameters"]["properties"]["input"]["description"]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "free"}}
    assert request.tools["ns__f"].namespace == "ns" and request.tools["ns__f"].name == "f"
    assert req(tools=tools, tool_choice="required").chat["tool_choice"] == "required"
    named = req(tools=tools, tool_choice={"type": "function", "name": "only"})
    assert named.chat["tool_choice"] == {"type": "function", "function": {"name": "only"}}
    # only a hosted tool: no tools, and no tool_choice the engine would refuse
    bare = req(tools=[{"type": "web_search"}], tool_choice="auto", parallel_tool_calls=True)
    assert "tools" not in bare.chat and "tool_choice" not in bare.chat
    assert "parallel_tool_calls" not in bare.chat


def test_sampling_and_format_fields_map() -> None:
    """B9: max_output_tokens, temperature, top_p, text.format and reasoning.effort map to
    their chat fields; bookkeeping fields are not sent to the engine."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    chat = req(
        stream=False,
        max_output_tokens=50,
        temperature=0.2,
        top_p=1,
        text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True},
              "verbosity": "low"},
        reasoning={"effort": "high", "summary": "auto"},
        store=True,
        include=["reasoning.encrypted_content"],
        metadata={"k": "v"},
        prompt_cache_key="k",
        service_tier="auto",
        truncation="auto",
        user="u",
    ).chat  # fmt: skip
    assert chat == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 1,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": schema, "strict": True},
        },
        "reasoning_effort": "high",
    }
    assert req(text={"format": {"type": "json_object"}}).chat["response_format"] == {
        "type": "json_object"
    }
    assert "reasoning_effort" not in req(reasoning={"effort": "minimal"}).chat


BAD_REQUESTS = [
    ({"previous_response_id": "resp_1"}, "'previous_response_id' is not supported"),
    ({"conversation": "conv_1"}, "send the whole conversation"),
    ({"background": True}, "'background'"),
    ({"prompt": {"id": "pmpt_1"}}, "'prompt'"),
    ({"top_logprobs": 2}, "'top_logprobs'"),
    ({"model": None}, "'model'"),
    ({"model": 3}, "'model'"),
    ({"stream": "yes"}, "'stream' must be true or false"),
    ({"input": 5}, "'input' is required"),
    ({"input": None}, "'input' is required"),
    ({"input": ["x"]}, "'input[0]' must be an object"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "'input[0]' is an item_reference"),
    ({"input": [{"type": "web_search_call", "id": "ws"}]}, "'input[0]' is a 'web_search_call'"),
    ({"input": [{"type": "local_shell_call"}]}, "'input[0]' is a 'local_shell_call' item"),
    ({"input": [{"role": "robot", "content": "x"}]}, "'input[0].role'"),
    ({"input": [{"role": "user", "content": 3}]}, "'input[0].content'"),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look"},
                        {"type": "input_image", "file_id": "file-abc", "detail": "auto"},
                    ],
                }
            ]
        },
        "'input[0].content[1].file_id': file IDs are not supported through this proxy",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "detail": "auto"}]}]},
        "'input[0].content[0].image_url' must be a non-empty string, got null",
    ),
    (
        {
            "input": [
                {"role": "user", "content": [{"type": "input_image", "image_url": "ftp://x/a"}]}
            ]
        },
        "'input[0].content[0].image_url' must be an http, https or data URL, got 'ftp://x/a'",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "a.png"}]}]},
        "'input[0].content[0].image_url' must be an http, https or data URL, got 'a.png'",
    ),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "data:image/png,rawbytes"}],
                }
            ]
        },
        "'input[0].content[0].image_url' is a data URL that is not base64",
    ),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": "data:image/tiff;base64,AA=="}
                    ],
                }
            ]
        },
        "'input[0].content[0].image_url' is a data URL of type 'image/tiff'",
    ),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "data:image/png;base64,A"}],
                }
            ]
        },
        "'input[0].content[0].image_url' is not valid base64 data",
    ),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": "https://x.test/a", "detail": "max"}
                    ],
                }
            ]
        },
        "'input[0].content[0].detail' must be one of auto, low, high, original, got a string 'max'",
    ),
    (
        {
            "input": [
                {
                    "role": "developer",
                    "content": [{"type": "input_image", "image_url": "https://x.test/a"}],
                }
            ]
        },
        "'input[0].content[0]' is an input_image part: images are translated in user messages "
        "and tool outputs only",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "'input[0].content[0]' is an input_file part",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
        "'input[0].content[0]' is an input_audio part",
    ),
    (
        {
            "input": [
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [{"type": "input_image", "image_url": "x"}],
                }
            ]
        },
        "'input[0].output[0].image_url' must be an http, https or data URL, got 'x'",
    ),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "'input[0].call_id'"),
    (
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
        "'input[0].arguments' must be a string",
    ),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "'input[0].call_id'"),
    ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "p"}]}, "'input[0].input'"),
    ({"input": [{"type": 7}]}, "'input[0].type' must be a string"),
    ({"instructions": 5}, "'instructions' must be a string"),
    ({"tools": {}}, "'tools' must be a list"),
    ({"tools": ["f"]}, "'tools[0]' must be an object"),
    ({"tools": [{"type": "local_shell"}]}, "'tools[0]' is a 'local_shell' tool"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "'tools[0]' is a 'file_search'"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "'tools[0]' is a 'mcp' tool"),
    ({"tools": [{"type": "function"}]}, "'tools[0].name'"),
    ({"tools": [{"type": "function", "name": "f", "parameters": []}]}, "'tools[0].parameters'"),
    ({"tools": [{"type": "function", "name": "f", "strict": 1}]}, "'tools[0].strict'"),
    (
        {"tools": [{"type": "custom", "name": "c", "format": {"type": "x"}}]},
        "'tools[0].format.type'",
    ),
    (
        {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]},
        "'tools[0].tools[0]' is a 'web_search' tool",
    ),
    (
        {
            "tools": [
                {"type": "function", "name": "f"},
                {"type": "function", "name": "f", "description": "other"},
            ]
        },
        "tool 'f' is defined twice",
    ),
    ({"input": [{"type": "additional_tools", "role": "developer"}]}, "'input[0].tools'"),
    ({"tool_choice": {"type": "web_search_preview"}}, "'tool_choice' of type"),
    ({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "'tool_choice'"),
    ({"tool_choice": 3}, "'tool_choice' must be"),
    ({"tool_choice": {"type": "function"}}, "'tool_choice.name'"),
    ({"parallel_tool_calls": "yes"}, "'parallel_tool_calls'"),
    ({"max_output_tokens": 0}, "'max_output_tokens' must be a positive integer"),
    ({"max_output_tokens": "5"}, "'max_output_tokens' must be an integer"),
    ({"max_output_tokens": True}, "'max_output_tokens' must be an integer"),
    ({"temperature": "hot"}, "'temperature' must be a number"),
    ({"top_p": False}, "'top_p' must be a number"),
    ({"text": "json"}, "'text' must be an object"),
    ({"text": {"format": {"type": "xml"}}}, "'text.format.type'"),
    ({"text": {"format": {"type": "json_schema", "name": "n"}}}, "'text.format.schema'"),
    ({"reasoning": "high"}, "'reasoning' must be an object"),
    ({"reasoning": {"effort": 3}}, "'reasoning.effort'"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_REQUESTS)
def test_bad_requests_name_the_field(fields: dict[str, Any], message: str) -> None:
    """B9, D6: whatever the proxy cannot translate faithfully, and every wrongly typed field
    it reads, is a 400 naming the field, item or part."""
    with pytest.raises(BadRequest) as caught:
        parse(json.dumps({"model": "m", "input": "hi", **fields}).encode())
    assert message in caught.value.message
    assert caught.value.status == 400


@pytest.mark.parametrize("raw", [b"[]", b"{", b"\xff"])
def test_bodies_that_are_not_objects_are_refused(raw: bytes) -> None:
    """B9, D6: a body that is not a JSON object is a 400."""
    with pytest.raises(BadRequest):
        parse(raw)


def test_hosted_tools_are_not_echoed_to_the_engine_but_to_the_client() -> None:
    """B9: the Response echoes the client's tools (web_search included) and tool_choice."""
    request = parse(recorded("codex_turn1"))
    body = request.reply(completion({"content": "ok"}))
    assert {t["type"] for t in body["tools"]} == {"function", "namespace", "web_search"}
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True


# ---------------------------------------------------------------------------------------
# Replies


def test_reply_text_call_and_usage() -> None:
    """B9, D2, D5: a chat.completion with text and a tool call becomes a completed Response:
    a message item, then a function_call item with the engine's call ID unchanged, and usage
    with cached tokens."""
    request = req(tools=[{"type": "function", "name": "f"}], temperature=0.5)
    body = request.reply(
        completion(
            {
                "content": "Let me check.",
                "tool_calls": [
                    {"id": "chatcmpl-tool-9", "type": "function",
                     "function": {"name": "f", "arguments": '{"x": 1}'}}
                ],
            },
            "tool_calls",
        )
    )  # fmt: skip
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "completed" and body["model"] == "m"
    assert body["created_at"] == 1700000000 and isinstance(body["created_at"], int)
    assert body["temperature"] == 0.5
    message, call = body["output"]
    assert message["type"] == "message" and message["id"].startswith("msg_")
    assert message["role"] == "assistant" and message["status"] == "completed"
    assert message["content"] == [
        {"type": "output_text", "text": "Let me check.", "annotations": []}
    ]
    assert call == {
        "type": "function_call",
        "id": call["id"],
        "call_id": "chatcmpl-tool-9",
        "name": "f",
        "arguments": '{"x": 1}',
        "status": "completed",
    }
    assert call["id"].startswith("fc_")
    assert body["usage"] == {
        "input_tokens": 120,
        "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 0},
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 129,
    }
    assert body["error"] is None and body["incomplete_details"] is None


def test_reply_custom_namespaced_and_reasoning() -> None:
    """B9: a call to a custom tool comes back as a custom_tool_call with the decoded input,
    a namespaced tool's call carries its namespace, the engine's reasoning a reasoning item."""
    tools = [
        {"type": "namespace", "name": "functions", "description": "",
         "tools": [{"type": "custom", "name": "exec"}, {"type": "function", "name": "wait"}]},
    ]  # fmt: skip
    body = req(tools=tools).reply(
        completion(
            {
                "content": None,
                "reasoning_content": "Think.",
                "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "exec", "arguments": '{"input": "text(1)\\n"}'}},
                    {"id": "c2", "type": "function",
                     "function": {"name": "wait", "arguments": "{}"}},
                ],
            },
            "tool_calls",
        )
    )  # fmt: skip
    reasoning, custom, function = body["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Think."}]
    assert custom["type"] == "custom_tool_call" and custom["call_id"] == "c1"
    assert custom["input"] == "text(1)\n" and custom["namespace"] == "functions"
    assert function["name"] == "wait" and function["namespace"] == "functions"


def test_reply_length_is_incomplete() -> None:
    """B9: finish_reason length makes the Response incomplete (max_output_tokens)."""
    body = req(max_output_tokens=3).reply(completion({"content": "abc"}, "length", usage=None))
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    assert body["max_output_tokens"] == 3 and body["usage"] is None


# ---------------------------------------------------------------------------------------
# Streams


def test_stream_text_then_call() -> None:
    """B9: chunks become Responses events as they come: lifecycle, the message item with its
    text deltas, closed when the tool call starts, the call's argument deltas, and
    response.completed with the output items and usage."""
    request = parse(recorded("codex_turn1"))
    translator = request.stream_translator()
    first = events(translator.chunk(CHUNKS[0]))
    assert [e["type"] for e in first] == ["response.created", "response.in_progress"]
    assert first[0]["response"]["status"] == "in_progress"
    assert first[0]["response"]["output"] == []
    rest = b"".join(translator.chunk(c) for c in CHUNKS[1:]) + translator.done()
    got = first + events(rest)
    assert [e["type"] for e in got] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert len({e["response"]["id"] for e in got if "response" in e}) == 1
    by_type: dict[str, list[dict[str, Any]]] = {}
    for e in got:
        by_type.setdefault(e["type"], []).append(e)
    message_id = by_type["response.output_item.added"][0]["item"]["id"]
    assert [e["delta"] for e in by_type["response.output_text.delta"]] == ["Running", " it."]
    assert all(e["item_id"] == message_id for e in by_type["response.output_text.delta"])
    assert by_type["response.output_text.done"][0]["text"] == "Running it."
    added_call = by_type["response.output_item.added"][1]
    assert added_call["output_index"] == 1
    call_id = added_call["item"]["id"]
    assert call_id.startswith("fc_")
    for e in by_type["response.function_call_arguments.delta"]:
        assert e["item_id"] == call_id and e["output_index"] == 1
    assert by_type["response.output_item.done"][1]["item"]["id"] == call_id
    assert added_call["item"]["call_id"] == "chatcmpl-tool-abc"
    assert added_call["item"]["arguments"] == ""
    assert by_type["response.function_call_arguments.done"][0]["arguments"] == '{"cmd": "echo hi"}'
    final = by_type["response.completed"][0]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["call_id"] == "chatcmpl-tool-abc"
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 64
    assert final["usage"]["output_tokens"] == 9
    assert translator.chunk(CHUNKS[1]) == b"" and translator.done() == b""


def test_stream_several_calls_in_one_chunk_and_length() -> None:
    """B9: several deltas in one chunk, two calls, and finish length: the stream ends with
    response.incomplete whose last item is incomplete."""
    request = req(tools=[{"type": "function", "name": "f"}])
    calls = [
        {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}},
        {"index": 1, "id": "b", "function": {"name": "f", "arguments": '{"x"'}},
    ]
    got = events(stream_all(request, [chunk({"tool_calls": calls}, "length")]))
    kinds = [e["type"] for e in got]
    assert kinds.count("response.output_item.added") == 2
    assert kinds[-1] == "response.incomplete"
    final = got[-1]["response"]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [(i["call_id"], i["status"]) for i in final["output"]] == [
        ("a", "completed"),
        ("b", "incomplete"),
    ]


def test_stream_reasoning_and_custom_input() -> None:
    """B9: the engine's reasoning streams as a reasoning item; a custom tool's input is decoded
    from its JSON arguments as they arrive (escapes split across chunks included)."""
    tools = [{"type": "namespace", "name": "functions", "description": "",
              "tools": [{"type": "custom", "name": "exec"}]}]  # fmt: skip
    arguments = json.dumps({"input": 'say("h\u00e9\U0001f600")\n'})  # \\u escapes, a pair
    pieces = [arguments[i : i + 3] for i in range(0, len(arguments), 3)]
    chunks = [chunk({"reasoning_content": "Hm"}), chunk({"reasoning_content": "m."})]
    chunks.append(chunk({"tool_calls": [{"index": 0, "id": "c9", "function": {"name": "exec"}}]}))
    chunks += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces]
    got = events(stream_all(req(tools=tools), [*chunks, chunk({}, "tool_calls")]))
    kinds = [e["type"] for e in got]
    assert kinds[2:6] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
    ]
    assert "response.reasoning_text.done" in kinds
    deltas = [e["delta"] for e in got if e["type"] == "response.custom_tool_call_input.delta"]
    assert len(deltas) > 3
    assert "".join(deltas) == 'say("h\u00e9\U0001f600")\n'
    done = next(e for e in got if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == 'say("h\u00e9\U0001f600")\n'
    final = got[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "custom_tool_call"]
    custom_id = final["output"][1]["id"]
    assert custom_id.startswith("ctc_")
    for e in got:
        if e["type"].startswith("response.custom_tool_call_input"):
            assert e["item_id"] == custom_id and e["output_index"] == 1
        if e["type"].startswith("response.output_item") and e["output_index"] == 1:
            assert e["item"]["id"] == custom_id
    assert final["output"][1]["namespace"] == "functions"
    assert final["output"][1]["call_id"] == "c9"


def test_stream_failed_and_empty() -> None:
    """B9, D6: an engine that breaks off gives response.failed (server_error, the message);
    a stream with no chunks still opens and completes."""
    translator = req().stream_translator()
    got = events(translator.chunk(CHUNKS[1]) + translator.failed("engine r1: broke"))
    assert got[-1]["type"] == "response.failed"
    failed = got[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "engine r1: broke"}
    assert failed["output"][0]["status"] == "incomplete"
    assert translator.done() == b""
    early = events(req().stream_translator().failed("no"))
    assert [e["type"] for e in early] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    empty = events(req().stream_translator().done())
    assert empty[-1]["type"] == "response.completed" and empty[-1]["response"]["output"] == []


@given(text=st.text(max_size=60), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_custom_input_decodes_any_split(text: str, cuts: list[int]) -> None:
    """B9: however the engine splits a custom tool's JSON arguments, the streamed input
    deltas add up to the input."""
    for ascii_only in (True, False):
        arguments = json.dumps({"input": text}, ensure_ascii=ascii_only)
        points = sorted({min(c, len(arguments)) for c in cuts} | {0, len(arguments)})
        decoder = _CustomInput()
        sent = "".join(decoder.feed(arguments[a:b]) for a, b in itertools.pairwise(points))
        sent += decoder.rest(_custom_input(arguments))
        assert sent == text


# ---------------------------------------------------------------------------------------
# The official SDK reads what the translator writes


def sdk_client(handler: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://proxy.test/v1",
        api_key="x",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


def translating_handler(chunks: list[dict[str, Any]], reply: dict[str, Any]) -> Any:
    """A proxy in one function: the SDK's request parsed, the engine's answer translated."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/responses"
        parsed = parse(request.content)
        assert parsed.chat["messages"][-1] == {"role": "user", "content": "hi"}
        if parsed.stream:
            return httpx.Response(
                200,
                headers={"content-type": "text/event-stream"},
                content=stream_all(parsed, chunks),
            )
        return httpx.Response(200, json=parsed.reply(reply))

    return handler


TOOLS: list[Any] = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}, "strict": False}
]


def test_sdk_reads_the_stream() -> None:
    """B9: the openai SDK reads the translated stream as typed events ending in
    response.completed, and its stream helper assembles the final response."""
    client = sdk_client(translating_handler(CHUNKS, {}))
    seen = list(client.responses.create(model="m", input="hi", tools=TOOLS, stream=True))
    assert isinstance(seen[0], openai.types.responses.ResponseCreatedEvent)
    assert isinstance(seen[-1], openai.types.responses.ResponseCompletedEvent)
    final = seen[-1].response
    assert final.output_text == "Running it."
    call = final.output[1]
    assert isinstance(call, openai.types.responses.ResponseFunctionToolCall)
    assert call.call_id == "chatcmpl-tool-abc" and call.arguments == '{"cmd": "echo hi"}'
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == 64

    with client.responses.stream(model="m", input="hi", tools=TOOLS) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        assembled = stream.get_final_response()
    assert "".join(texts) == "Running it."
    assert assembled.output_text == "Running it."
    assert assembled.output[1].type == "function_call"
    assert assembled.usage is not None and assembled.usage.total_tokens == 129


def test_sdk_reads_the_reply_and_errors() -> None:
    """B9, D6: the SDK parses a translated non-streamed reply, and error bodies raise its
    typed errors with the message."""
    reply = completion({"content": "hello"})
    client = sdk_client(translating_handler([], reply))
    response = client.responses.create(model="m", input="hi")
    assert response.status == "completed" and response.output_text == "hello"
    assert response.usage is not None and response.usage.input_tokens == 120

    def refuse(status: int, message: str, code: str) -> Any:
        body = error_body(status, message, code)
        return lambda request: httpx.Response(status, json=body)

    with pytest.raises(openai.BadRequestError) as bad:
        sdk_client(refuse(400, "'previous_response_id' is not supported", "x")).responses.create(
            model="m", input="hi"
        )
    assert "'previous_response_id' is not supported" in str(bad.value)
    assert bad.value.code == "x"
    with pytest.raises(openai.NotFoundError) as missing:
        sdk_client(
            refuse(404, "no Generative replica serves model 'm'", "model_not_found")
        ).responses.create(model="m", input="hi")
    assert "no Generative replica serves model 'm'" in str(missing.value)


def test_error_body_shape() -> None:
    """D6: errors in OpenAI's shape: invalid_request_error for a 4xx, server_error for a 5xx."""
    assert error_body(400, "bad") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert error_body(502, "engine r: down", "x")["error"]["type"] == "server_error"
    assert error_body(502, "engine r: down", "x")["error"]["code"] == "x"


# ---------------------------------------------------------------------------------------
# Native Responses replies, read for the report


def test_observe_native_stream() -> None:
    """B9, D5: a native Responses stream fills the turn outcome: first token, call IDs once,
    finish tool_calls, usage with cached tokens."""
    request = req(tools=[{"type": "function", "name": "exec_command"}])
    outcome = TurnOutcome()
    for event in events(stream_all(request, CHUNKS)):
        responses.observe(event, outcome)
    assert outcome.first_token
    assert outcome.tool_call_ids == ["chatcmpl-tool-abc"]
    assert outcome.finish_reason == "tool_calls" and outcome.paused_on_tool
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens) == (120, 9, 64)

    text_only = TurnOutcome()
    responses.observe({"type": "response.output_text.delta", "delta": ""}, text_only)
    assert not text_only.first_token
    responses.observe({"type": "response.output_text.delta", "delta": "a"}, text_only)
    assert text_only.first_token


def test_observe_native_reply() -> None:
    """B9, D5: a native Response body fills the outcome; incomplete is finish length."""
    body = req().reply(completion({"content": "hi"}))
    outcome = TurnOutcome()
    responses.observe_reply(body, outcome)
    assert outcome.first_token and outcome.finish_reason == "stop"
    assert not outcome.paused_on_tool
    assert outcome.cached_tokens == 64
    cut = TurnOutcome()
    responses.observe_reply(req().reply(completion({"content": "h"}, "length")), cut)
    assert cut.finish_reason == "length"
    odd = TurnOutcome()
    responses.observe_reply({"output": "x", "usage": {"input_tokens": -1}, "status": 3}, odd)
    assert odd == TurnOutcome()


def test_own_output_items_come_back() -> None:
    """B9, D2: the items a translated reply holds (reasoning, message, function and custom
    calls), sent back as the next turn's input the way Codex and the SDK echo them, translate
    again: the call IDs reach the engine unchanged."""
    tools = [
        {"type": "function", "name": "f"},
        {"type": "namespace", "name": "ns", "description": "", "tools": [
            {"type": "custom", "name": "patch"}]},
    ]  # fmt: skip
    request = req(tools=tools)
    calls = [
        {"index": 0, "id": "call-a", "function": {"name": "f", "arguments": "{}"}},
        {"index": 1, "id": "call-b", "function": {"name": "patch", "arguments": '{"input":"x"}'}},
    ]
    chunks = [
        chunk({"reasoning": "Plan."}),
        chunk({"content": "Doing it."}),
        chunk({"tool_calls": calls}, "tool_calls"),
    ]
    final = events(stream_all(request, chunks))[-1]["response"]
    parsed = openai.types.responses.Response.model_validate(final)
    items: list[Any] = [{"role": "user", "content": "hi"}]
    items += [o.model_dump(exclude_none=True) for o in parsed.output]
    items += [
        {"type": "function_call_output", "call_id": "call-a", "output": "1"},
        {"type": "custom_tool_call_output", "call_id": "call-b", "output": "2"},
    ]
    messages = req(input=items, tools=tools).chat["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assistant = messages[1]
    assert assistant["content"] == "Doing it."
    assert [(c["id"], c["function"]["name"]) for c in assistant["tool_calls"]] == [
        ("call-a", "f"),
        ("call-b", "patch"),
    ]
    assert json.loads(assistant["tool_calls"][1]["function"]["arguments"]) == {"input": "x"}
    assert [m["tool_call_id"] for m in messages[2:]] == ["call-a", "call-b"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "instructions": "\\ud800", "input": "x"}',
        b'{"model": "m", "input": "x", "metadata": {"k": "\\udfff"}}',
        b'{"model": "m", "input": [{"type": "custom_tool_call", "call_id": "c", '
        b'"name": "t", "input": "\\ud800"}]}',
    ],
)
def test_text_that_cannot_be_passed_on_is_refused_before_admission(raw: bytes) -> None:
    """B9, D6: a lone surrogate (JSON allows the escape; no engine or client can take it)
    is a 400 at parse time, before the turn takes a slot, not a failure mid-stream."""
    with pytest.raises(BadRequest, match="cannot be passed on"):
        parse(raw)
