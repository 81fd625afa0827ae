"""An agent with the OpenAI Agents SDK (`openai-agents`), through the luftpause proxy.

The SDK runs the loop: an ``Agent`` with one function tool, on an
``OpenAIChatCompletionsModel`` whose ``AsyncOpenAI`` client points at luftpause and
carries the three luftpause headers as default headers, so every turn of the run
names the same run, class and caller. Tracing to OpenAI is switched off
(``set_tracing_disabled``): nothing leaves this machine.

    make run     # in another terminal: the stack on fake engines
    .venv/bin/python examples/agents_sdk_agent.py "What is the weather in Oslo?"

Flags: --base-url, --model, --class interactive|batch, --caller, --run-id (see --help).
With LUFTPAUSE_TOKEN set, it is sent as the API key (``Authorization: Bearer``).
"""

from __future__ import annotations

import asyncio
import sys
import zlib

import openai
from _common import MAX_TOKENS, Options, fail, parse_args
from agents import (
    Agent,
    AgentsException,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RawResponsesStreamEvent,
    RunItemStreamEvent,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from openai.types.responses import ResponseFunctionToolCall, ResponseTextDeltaEvent

MAX_TURNS = 10  # a model that never stops calling tools gets cut off here

# The SDK would otherwise send a trace of every run to OpenAI: nothing leaves this machine.
set_tracing_disabled(True)


@function_tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: the city's name.
    """
    # A local stand-in for a real tool: made-up but stable weather.
    h = zlib.crc32(city.strip().lower().encode())
    sky = ("sunny", "cloudy", "light rain", "snow", "fog")[h % 5]
    return f"{city}: {h % 30 - 5} °C, {sky}"


async def run_agent(opts: Options) -> str:
    # One client per run: its default headers name this run on every turn.
    client = openai.AsyncOpenAI(
        base_url=opts.base_url, api_key=opts.api_key, default_headers=opts.headers()
    )
    agent = Agent(
        name="weather",
        instructions="Answer with the help of your tools.",
        model=OpenAIChatCompletionsModel(model=opts.model, openai_client=client),
        model_settings=ModelSettings(max_tokens=MAX_TOKENS),
        tools=[get_weather],
    )
    result = Runner.run_streamed(agent, opts.question, max_turns=MAX_TURNS)
    calls: dict[str, str] = {}  # call_id -> "name(arguments)", until its output arrives
    tool_calls = 0
    answering = False
    async for event in result.stream_events():
        if isinstance(event, RawResponsesStreamEvent):
            if isinstance(event.data, ResponseTextDeltaEvent) and event.data.delta:
                if not answering:
                    print("answer: ", end="")
                    answering = True
                print(event.data.delta, end="", flush=True)
        elif isinstance(event, RunItemStreamEvent):
            item = event.item
            if isinstance(item, ToolCallItem) and isinstance(
                item.raw_item, ResponseFunctionToolCall
            ):
                calls[item.raw_item.call_id] = f"{item.raw_item.name}({item.raw_item.arguments})"
            elif isinstance(item, ToolCallOutputItem):
                call_id = item.raw_item.get("call_id") if isinstance(item.raw_item, dict) else None
                tool_calls += 1
                print(f"tool {calls.pop(str(call_id), '?')} -> {item.output}")
    if answering:
        print()
    else:  # no text streamed: print the answer the SDK put together
        print(f"answer: {result.final_output}")
    print(f"run {opts.run_id}: answered after {tool_calls} tool calls")
    return str(result.final_output)


def main() -> int:
    opts = parse_args("An agent with the OpenAI Agents SDK, through luftpause.", "agents-sdk")
    print(opts.banner())
    try:
        asyncio.run(run_agent(opts))
    except (openai.OpenAIError, AgentsException) as exc:
        fail(exc, opts.base_url)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
