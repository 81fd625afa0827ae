"""The OpenAI Responses API (``POST /v1/responses``, Codex CLI) over Chat Completions (B9).

``parse`` checks a Responses request and translates it to a Chat Completions body;
``ResponsesRequest.reply`` turns a ``chat.completion`` into a ``Response``, and
``ResponsesRequest.stream_translator`` turns ``chat.completion.chunk``\\ s into the
Responses event stream as they arrive. ``observe``/``observe_reply`` read a native
Responses reply (an engine that serves ``/v1/responses`` itself) for the turn's report.
What goes out is built from the ``openai`` SDK's own types and dumped from them.

What Codex CLI 0.171 sends (probed; ``tests/data/harness/codex_*.json``): the whole
conversation every time, ``store: false``, never ``previous_response_id`` and no
``instructions`` (its prompt is the first ``developer`` message); ``input`` holds
``message`` items (``input_text`` / ``output_text`` parts), the ``reasoning``,
``function_call`` and ``custom_tool_call`` items of earlier replies echoed back, and
their ``function_call_output`` / ``custom_tool_call_output`` (whose ``output`` may be a
list of ``input_text`` parts). ``tools`` holds ``function`` tools, ``namespace`` tools
(groups of function/custom tools; a call must come back with its ``namespace`` or Codex
answers "unsupported call") and a hosted ``web_search`` tool in every request. With
model metadata it knows (OpenAI model names), it sends its tools in an
``additional_tools`` input item instead, including a ``custom`` tool with a Lark grammar.

Translation, request side:

* ``instructions`` becomes a first ``system`` message, an ``input`` string one user
  message; ``message`` items keep their role (``developer`` becomes ``system``) and
  their text parts, joined with a newline when there are several (what engines do
  with a list of text parts).
* ``function_call`` / ``custom_tool_call`` items become the ``tool_calls`` of an
  assistant message (consecutive calls, and calls right after an assistant message,
  share one); a custom call's ``input`` travels as the arguments ``{"input": ...}``.
  Their outputs become ``tool`` messages with the ``call_id`` as ``tool_call_id``.
* ``reasoning`` items are dropped: an engine behind Chat Completions cannot take its
  reasoning back (their ``encrypted_content`` is OpenAI's, and chat templates drop
  earlier reasoning anyway).
* ``function`` tools become chat function tools. ``custom`` (freeform) tools become a
  function tool with one string parameter ``input`` whose description gives the
  grammar; the engine does not enforce the grammar (degraded), and calls come back as
  ``custom_tool_call`` items with that string as ``input``. ``namespace`` tools and
  ``additional_tools`` items are flattened into the chat tools (an additional_tools
  item's tools are offered from the start of the conversation, not from its place in
  it); a tool keeps its own name unless another tool has the same name, then it is
  ``<namespace>__<name>``; calls come back with their ``namespace``.
* Hosted ``web_search`` tools (Codex sends one in every request) are dropped: the
  model is not offered them. Every other hosted or OpenAI-run tool (file search,
  code interpreter, image generation, computer use, MCP, local/hosted shell,
  apply_patch, tool search) is refused.
* ``tool_choice`` (``auto``/``none``/``required``, a named function or custom tool),
  ``parallel_tool_calls``, ``temperature``, ``top_p``, ``max_output_tokens``
  (``max_tokens``), ``text.format`` (``response_format``) and ``reasoning.effort``
  low/medium/high (``reasoning_effort``) are mapped; ``store``, ``include``,
  ``prompt_cache_key``, ``metadata``, ``client_metadata``, ``service_tier``,
  ``truncation``, ``user``, ``safety_identifier``, ``text.verbosity``, the rest of
  ``reasoning`` and members this module does not know are ignored.
* Refused with a 400: ``previous_response_id``, ``conversation``, ``prompt`` and
  ``background`` (the proxy stores no responses: send the whole conversation, with
  ``store: false``), ``item_reference`` items, image/file/audio parts, other item
  types, ``top_logprobs``.

Reply side: the text becomes a ``message`` item, the engine's reasoning
(``reasoning_content``/``reasoning`` of vLLM and SGLang) a ``reasoning`` item with
``reasoning_text`` content, each tool call a ``function_call`` (or
``custom_tool_call``) item whose ``call_id`` is the engine's tool call ID unchanged
(the dataplane recognises runs by it); finish ``length`` makes the response
``incomplete`` (``max_output_tokens``).

The package by role: ``request.py`` (``parse``, ``ResponsesRequest``), ``reply.py``
(the ``Response`` and its items, errors in OpenAI's shape), ``stream.py``
(``ResponsesStream``), ``native.py`` (``observe``, ``observe_reply``,
``stream_error``); helpers shared with ``messages/`` are in ``apis/_shared.py``.
"""

from luftpause.dataplane.apis.responses.native import observe, observe_reply, stream_error
from luftpause.dataplane.apis.responses.reply import error_body
from luftpause.dataplane.apis.responses.request import (
    DROPPED_TOOLS,
    GRAMMAR_SHOWN_CHARS,
    STATEFUL,
    ResponsesRequest,
    parse,
)
from luftpause.dataplane.apis.responses.stream import ResponsesStream

__all__ = [
    "DROPPED_TOOLS",
    "GRAMMAR_SHOWN_CHARS",
    "STATEFUL",
    "ResponsesRequest",
    "ResponsesStream",
    "error_body",
    "observe",
    "observe_reply",
    "parse",
    "stream_error",
]
