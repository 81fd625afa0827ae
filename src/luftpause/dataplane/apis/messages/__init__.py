"""The Anthropic Messages API (``/v1/messages``, Claude Code) over Chat Completions (B9).

``parse`` checks a Messages body and translates it into a Chat Completions body;
``MessagesRequest.reply`` and ``MessagesStream`` turn the engine's answer back into a
``Message`` or its server-sent events. What goes out is built from the official
``anthropic`` SDK's types. ``observe``/``observe_reply`` read a native Messages reply
(an engine that serves ``/v1/messages`` itself) for the dataplane's reports.

The package by role: ``request.py`` (``parse``, ``MessagesRequest``), ``reply.py``
(the non-streamed reply, errors in Messages' shape), ``stream.py``
(``MessagesStream``), ``native.py`` (``observe``, ``observe_reply``,
``stream_error``); helpers shared with ``responses/`` are in ``apis/_shared.py``.

What Claude Code 2.1.332 sends was recorded with a probe server
(``tests/data/harness/claude_code_*.json``): ``POST /v1/messages?beta=true``, streamed,
with a ``system`` of text blocks (the first an attribution line,
``x-anthropic-billing-header: cc_version=…``), custom tools only (some with
``defer_loading``), ``role: "system"`` messages between the turns, ``tool_result``
blocks whose content is a string, text blocks or ``tool_reference`` blocks,
``thinking: {"type": "adaptive"}``, ``context_management``, ``output_config.effort``,
``metadata`` and ``cache_control`` everywhere. Its ordinary turns carry no server
tools; only its WebSearch tool sends a request of its own with the server tool
``web_search_20250305``, which an engine cannot run.

Translated:

* ``system`` (a string or text blocks, joined with a blank line) → the first
  ``system`` message; messages of role ``system`` → ``system`` messages in place.
* ``text`` → text; ``tool_use`` → ``tool_calls`` (arguments: the input as JSON);
  ``tool_result`` → a ``tool`` message (before the rest of its user message), its
  text blocks joined; ``is_error: true`` → the text prefixed with ``Error: ``.
* ``image`` blocks (in user messages and tool results; ``images.py``) → ``image_url``
  parts: a ``base64`` source as a ``data:`` URL of its media type (JPEG, PNG, GIF or
  WebP), a ``url`` source as its URL (http, https or data). A user message with an
  image becomes a list of parts in the blocks' order (texts next to each other joined
  as without images). The dataplane forwards them only where every endpoint serving
  the model sets ``vision = true`` (``MessagesRequest.image_at`` says where the first
  image is), else it answers 400 naming that setting.
* custom tools → functions (``strict`` kept; ``input_examples`` appended to the
  description as JSON lines); ``tool_choice`` auto/any/tool/none →
  "auto"/"required"/the function/"none"; ``disable_parallel_tool_use`` →
  ``parallel_tool_calls: false``.
* Deferred tools (``defer_loading: true``) are what Anthropic's tool search does with
  them: left out until a ``tool_reference`` in a tool result loads them, then given to
  the engine as functions; the ``tool_reference`` itself becomes the line
  ``Tool <name> is now available.`` in the tool message.
* ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` (→ ``stop``),
  ``stream``; ``output_config.format`` (and the older ``output_format``) →
  ``response_format`` with that JSON schema.
* A last ``assistant`` message (prefill) is continued
  (``continue_final_message``, which SGLang and vLLM accept), not answered.

Degraded (accepted; the reply differs from what Anthropic's API would give):

* ``thinking`` is ignored: the reply has no thinking blocks; ``thinking`` and
  ``redacted_thinking`` blocks in the history are dropped (an engine behind Chat
  Completions cannot take them back).
* ``cache_control`` is ignored (engines cache prefixes by themselves); usage reports
  the engine's cached tokens as ``cache_read_input_tokens`` and no cache writes.
* The attribution system block (``x-anthropic-billing-header: …``; Anthropic's API
  consumes it) is dropped: it differs between sessions and would otherwise stand
  before everything else in the prompt, so no two sessions would share a cached prefix.
* ``context_management`` is not applied: the engine gets the whole history as sent
  (Anthropic's servers would clear old thinking or tool results by its edits).
* ``metadata``, ``service_tier``, ``output_config.effort``,
  ``speed``, ``inference_geo``, ``diagnostics``, ``citations`` of text blocks, and any
  top-level field this module does not know, are ignored (an unknown field is logged
  once per name): harness releases add such hints often, and a new one must not stop
  a running deployment.
* The text of an assistant message is one string, before its tool calls (the order of
  text and tool_use blocks within one message is not kept).
* Images in a ``tool_result`` travel at the start of the user message that follows the
  tool messages, in order, not inside the tool message (Chat Completions tool messages
  carry text only: OpenAI's schema and SGLang's take no image parts there). An
  image's ``cache_control`` and ``transformations`` are ignored.

Refused with a 400 naming the field or the block's position (never a silently
different request):

* server tools (any ``tools[i].type`` but ``custom``: web search and fetch, bash, text
  editor, computer use, code execution, tool search, memory, …): the engine cannot
  run them, and a model answering in their place would make results up (Claude
  Code's WebSearch tool then tells the model the search failed);
* ``document`` and ``search_result`` blocks (also inside tool results), server
  tool blocks (``server_tool_use``, ``*_tool_result``), ``container_upload``, MCP
  blocks, and any block type not known here; ``image`` blocks in system text or
  assistant messages, with a ``file`` source (Files API IDs) or a media type, data or
  URL scheme named above as not taken;
* ``mcp_servers`` and ``container`` (features Anthropic's servers run);
* ``max_tokens`` below 1 (Anthropic's cache pre-warming with 0 has no equivalent),
  a ``tool_reference`` to a tool not in ``tools``, a ``tool_choice`` without tools or
  naming a tool that is not offered, duplicate tool names, and wrong types of the
  fields read.

From the engine back: the text, then one ``tool_use`` block per tool call, its ``id``
the engine's tool call id unchanged (the dataplane recognises runs by echoed ids).
Arguments that are not a JSON object reach the client as the input
``{"_unparsed_arguments": "<the engine's text>"}`` (empty arguments as ``{}``), so the
harness's input validation tells the model what went wrong instead of running the
tool with input nobody wrote; a stream passes argument fragments on as they come
(Claude Code then reports the unparsable input to the model itself). Reasoning text
(``reasoning_content``) is not passed on. The stop reason is ``tool_use`` whenever the
reply has tool calls, ``stop_sequence`` when the engine names the stop string that
matched (vLLM's ``stop_reason``, SGLang's ``matched_stop``). An ``error`` chunk in a
stream becomes Messages' ``error`` event and ends it.
"""

from luftpause.dataplane.apis.messages.native import observe, observe_reply, stream_error
from luftpause.dataplane.apis.messages.reply import (
    UNPARSED_ARGUMENTS,
    StopReason,
    error_body,
    stop_of,
    tool_input,
)
from luftpause.dataplane.apis.messages.request import ATTRIBUTION_PREFIX, MessagesRequest, parse
from luftpause.dataplane.apis.messages.stream import MessagesStream

__all__ = [
    "ATTRIBUTION_PREFIX",
    "UNPARSED_ARGUMENTS",
    "MessagesRequest",
    "MessagesStream",
    "StopReason",
    "error_body",
    "observe",
    "observe_reply",
    "parse",
    "stop_of",
    "stream_error",
    "tool_input",
]
