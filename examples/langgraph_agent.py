"""An agent as a LangGraph graph, with `langchain-openai`'s ``ChatOpenAI``, through the
luftpause proxy.

The graph is the usual two-node loop: ``model`` (the chat model with one tool bound)
and ``tools`` (LangGraph's ``ToolNode``), going back to ``model`` after every tool
call until the model answers without one. ``ChatOpenAI`` points at luftpause and
sends the three luftpause headers as default headers, so every turn of the run names
the same run, class and caller.

    make run     # in another terminal: the stack on fake engines
    .venv/bin/python examples/langgraph_agent.py "What is the weather in Oslo?"

Flags: --base-url, --model, --class interactive|batch, --caller, --run-id (see --help).
With LUFTPAUSE_TOKEN set, it is sent as the API key (``Authorization: Bearer``).
"""

from __future__ import annotations

import json
import sys
import zlib
from typing import Any

import openai
from _common import MAX_TOKENS, Options, fail, parse_args
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import SecretStr

MAX_TURNS = 10  # a model that never stops calling tools gets cut off here


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    # A local stand-in for a real tool: made-up but stable weather.
    h = zlib.crc32(city.strip().lower().encode())
    sky = ("sunny", "cloudy", "light rain", "snow", "fog")[h % 5]
    return f"{city}: {h % 30 - 5} °C, {sky}"


def build_graph(
    opts: Options,
) -> CompiledStateGraph[MessagesState, None, MessagesState, MessagesState]:
    # One model per run: its default headers name this run on every turn.
    llm = ChatOpenAI(
        model=opts.model,
        base_url=opts.base_url,
        api_key=SecretStr(opts.api_key),
        default_headers=opts.headers(),
        max_completion_tokens=MAX_TOKENS,
    ).bind_tools([get_weather])

    def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)  # tool calls -> "tools", else end
    graph.add_edge("tools", "model")
    return graph.compile()


def run_agent(opts: Options) -> str:
    graph = build_graph(opts)
    calls: dict[str, str] = {}  # tool_call_id -> "name(arguments)", until its result arrives
    answer = ""
    tool_calls = 0
    updates = graph.stream(
        {"messages": [HumanMessage(opts.question)]},
        # Each model turn and each tool call is one step of the graph.
        {"recursion_limit": 2 * MAX_TURNS},
        stream_mode="updates",
    )
    for update in updates:
        for node, change in update.items():
            for message in change["messages"]:
                if node == "model" and isinstance(message, AIMessage):
                    for call in message.tool_calls:
                        calls[str(call["id"])] = f"{call['name']}({json.dumps(call['args'])})"
                    if not message.tool_calls:
                        answer = message.text
                elif node == "tools" and isinstance(message, ToolMessage):
                    tool_calls += 1
                    print(f"tool {calls.pop(message.tool_call_id, '?')} -> {message.content}")
    print(f"answer: {answer}")
    print(f"run {opts.run_id}: answered after {tool_calls} tool calls")
    return answer


def main() -> int:
    opts = parse_args("An agent as a LangGraph graph, through luftpause.", "langgraph-agent")
    print(opts.banner())
    try:
        run_agent(opts)
    except (openai.OpenAIError, GraphRecursionError) as exc:
        fail(exc, opts.base_url)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
