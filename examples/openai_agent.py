"""An own-loop agent with the `openai` package, through the luftpause proxy.

The plainest agent loop there is: ask the model (streamed) with a tool offered; when
it calls the tool, run the tool here, append the result and ask again; stop at the
first answer without a tool call. Every turn of the run carries the same three
luftpause headers (set once, as the client's default headers), so luftpause sees one
run paused on a tool rather than unrelated requests. The proxy answers with where the
turn ran (``x-luftpause-replica``) and how long it was held (``x-luftpause-held-ms``),
printed for each turn.

    make run     # in another terminal: the stack on fake engines
    .venv/bin/python examples/openai_agent.py "What is the weather in Oslo?"

Flags: --base-url, --model, --class interactive|batch, --caller, --run-id (see --help).
With LUFTPAUSE_TOKEN set, it is sent as the API key (``Authorization: Bearer``).
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Iterable

import openai
from _common import MAX_TOKENS, Options, fail, parse_args
from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)

MAX_TURNS = 10  # a model that never stops calling tools gets cut off here


def get_weather(city: str) -> str:
    """A local stand-in for a real tool: made-up but stable weather for a city."""
    h = zlib.crc32(city.strip().lower().encode())
    sky = ("sunny", "cloudy", "light rain", "snow", "fog")[h % 5]
    return f"{city}: {h % 30 - 5} °C, {sky}"


TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "the city's name"}},
                "required": ["city"],
            },
        },
    }
]


def run_tool(name: str, arguments: str) -> str:
    """Run one tool call here; a call that does not fit goes back to the model as text."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return f"error: the arguments are not JSON: {arguments!r}"
    if name != "get_weather" or not isinstance(args, dict) or "city" not in args:
        return f'error: call get_weather with {{"city": "<name>"}}, got {name}({arguments})'
    return get_weather(str(args["city"]))


def read_stream(
    chunks: Iterable[ChatCompletionChunk],
) -> tuple[str, list[ChatCompletionMessageFunctionToolCallParam]]:
    """Print the reply's text as it streams; put its tool calls together from their pieces."""
    text: list[str] = []
    calls: dict[int, ChatCompletionMessageFunctionToolCallParam] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            if not text:
                print("answer: ", end="")
            print(delta.content, end="", flush=True)
            text.append(delta.content)
        for piece in delta.tool_calls or []:
            call = calls.setdefault(
                piece.index,
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if piece.id:
                call["id"] = piece.id
            if piece.function is not None:
                call["function"]["name"] += piece.function.name or ""
                call["function"]["arguments"] += piece.function.arguments or ""
    if text:
        print()
    return "".join(text), [calls[i] for i in sorted(calls)]


def run_agent(opts: Options) -> str:
    # One client per run: its default headers name this run on every turn.
    client = openai.OpenAI(
        base_url=opts.base_url, api_key=opts.api_key, default_headers=opts.headers()
    )
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": opts.question}]
    tool_calls = 0
    for turn in range(1, MAX_TURNS + 1):
        raw = client.chat.completions.with_raw_response.create(
            model=opts.model, messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS, stream=True
        )
        replica = raw.headers.get("x-luftpause-replica", "?")
        print(f"turn {turn} on {replica}, held {raw.headers.get('x-luftpause-held-ms', '?')} ms")
        text, calls = read_stream(raw.parse())
        if not calls:
            if not text:
                print("answer: (empty)")
            print(f"run {opts.run_id}: answered after {tool_calls} tool calls")
            return text
        messages.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        for call in calls:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            result = run_tool(name, arguments)
            tool_calls += 1
            print(f"tool {name}({arguments}) -> {result}")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise RuntimeError(f"no answer after {MAX_TURNS} turns")


def main() -> int:
    opts = parse_args("An agent with the openai package, through luftpause.", "openai-agent")
    print(opts.banner())
    try:
        run_agent(opts)
    except (openai.OpenAIError, RuntimeError) as exc:
        fail(exc, opts.base_url)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
