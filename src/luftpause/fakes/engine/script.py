"""What the fake engine says: deterministic replies, tool calls, logprobs and labels.

Everything here is a pure function of the conversation (and a seed), so the same
request always gets the same reply, token for token, in every process.

Rules
-----
* **Tool calls.** With ``tools`` offered (and ``tool_choice`` not ``"none"``),
  the reply calls a tool until the conversation holds ``tool_results`` messages
  with role ``tool``; then it answers in text. The tool is the n-th offered tool
  (round robin by the number of results so far) unless ``tool_choice`` names
  one. A ``tool_choice`` that demands a call (``"required"``, or a named
  function, as OpenAI's API defines them) gets one whatever the count, as a
  real engine's constrained decoding gives it. Arguments fill the schema's
  *required* properties by type with
  deterministic filler (enums take one of their values, numbers are whole and
  respect ``minimum``/``maximum``). The call id is ``call_`` plus a hash of the
  conversation and the call's index, so ids are unique per call and stable.
  Options: ``text_tool_calls`` writes the call as Llama-3 plain text
  (``{"name": ..., "parameters": {...}}``, with or without a leading
  ``<|python_tag|>``) instead of a structured call; ``wrong_types`` writes
  numbers and booleans as strings.
* **Directed tool calls** (a test bench's script). A last user message holding
  ``[tool:NAME]`` or ``[tools:NAME,NAME,...]`` makes the reply call exactly those
  tools, one per turn in that order, counting the tool results after that
  message, and then answer in text; ``tool_results`` and the round robin do not
  apply to it. A name matches an offered tool of that name, or one that ends in
  it after ``__``, ``.``, ``/`` or ``_`` (harnesses prefix MCP tools:
  ``mcp__luftpause__spawn``); a name no offered tool matches is skipped. A required
  argument whose name is a key of a JSON object in an earlier tool result takes the
  latest such value; an array argument gathers every value of that key or of its
  singular, so ``await``'s ``handles`` are the ``handle`` each ``spawn`` returned.
  The rest are filled as above.
  Without the marker nothing changes.
* **Text answers** are filler of a deterministic *natural* length drawn from a
  log-normal distribution of chat reply lengths (``answer_length``; the fit and
  its sources are in docs/guides/calibration.md, "Reply lengths"): its median grows with
  the length of the last user message up to LMSYS-Chat-1M's mean prompt (a
  greeting gets a short answer), it is
  truncated at ``ANSWER_MAX_TOKENS``, and the quantile comes from a hash of the
  conversation, so the same prompt always gets the same length. The engine stops
  earlier at ``max_tokens``. With ``runaway_per_mille`` > 0 that many answers in
  a thousand *after tool results* (an agent loop) never end on their own (a small
  model that loses the thread in tool output) and run until ``max_tokens`` or the
  context limit; a plain chat answer never runs away. A request with
  ``ignore_eos`` (SGLang's and vLLM's sampling parameter) gets a text answer
  that runs until ``max_tokens`` too.
* **Tokens** are four characters (see ``tokens.py``). A structured tool call is
  one header token (the function name) plus the arguments JSON in four-character
  pieces.
* **Logprobs / label scoring.** If the last user message lists candidate labels
  (a line ``labels: a, b, c`` - also ``categories``, ``options``, ``choices``,
  ``classes`` - or bullet lines), the first token of the reply is drawn from a
  deterministic distribution over the labels' first tokens (a label's first token
  is its first four characters) plus a few non-label tokens; the top
  ``top_logprobs`` entries therefore include several labels' first tokens, and
  the generated token is the most likely one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from luftpause.fakes.engine.tokens import (
    CHARS_PER_TOKEN,
    PromptHash,
    TextHash,
    count_tokens,
    filler_text,
    filler_tokens,
    split_tokens,
    stable_hash,
)

RUNAWAY_TOKENS = 1 << 30  # natural length of an answer that never ends on its own

# Natural length of a text answer (docs/guides/calibration.md, "Reply lengths"). The mean reply
# is LMSYS-Chat-1M's (214.5 tokens at its mean prompt of 69.5 tokens), scaled down for a
# shorter prompt (the last user message) as (prompt / 69.5) ** 0.8, the exponent that
# links the published dataset means; a longer prompt is not extrapolated (held at 69.5).
# The spread of the log-normal is an assumption; ANSWER_MAX_TOKENS truncates it.
ANSWER_ANCHOR_MEAN = 214.5
ANSWER_ANCHOR_PROMPT = 69.5
ANSWER_PROMPT_EXPONENT = 0.8
ANSWER_SIGMA = 1.0
ANSWER_MAX_TOKENS = 2048
_DISTRACTORS = ("The", "I", "\n", "Sure", "It")


class ReplyKind(StrEnum):
    TEXT = "text"
    TOOL_CALL = "tool_call"
    TEXT_TOOL_CALL = "text_tool_call"


@dataclass(frozen=True, slots=True, init=False)
class ScriptOptions:
    tool_results: int = 3
    text_tool_calls: bool = False
    wrong_types: bool = False
    runaway_per_mille: int = 250  # calibrated: see docs/guides/calibration.md
    seed: int = 0

    def __init__(
        self,
        tool_results: int = 3,
        text_tool_calls: bool = False,
        wrong_types: bool = False,
        runaway_per_mille: int = 250,
        seed: int = 0,
    ) -> None:
        object.__setattr__(self, "tool_results", tool_results)
        object.__setattr__(self, "text_tool_calls", text_tool_calls)
        object.__setattr__(self, "wrong_types", wrong_types)
        object.__setattr__(self, "runaway_per_mille", runaway_per_mille)
        object.__setattr__(self, "seed", seed)


@dataclass(frozen=True, slots=True, init=False)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text

    def __init__(self, id: str, name: str, arguments: str) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "arguments", arguments)


@dataclass(frozen=True, slots=True, init=False)
class ReplyPlan:
    """The reply the engine will produce, token by token."""

    kind: ReplyKind
    reply_tokens: int  # natural length; RUNAWAY_TOKENS for an answer that never stops
    seed: str  # deterministic seed for the filler and logprobs
    tool_call: ToolCall | None = None
    first_token: str | None = None  # label-scoring token replacing the first filler token
    first_token_top: tuple[tuple[str, float], ...] = ()
    more_calls: tuple[ToolCall, ...] = ()  # parallel calls after ``tool_call`` (a directive)
    text: str | None = None  # the answer's text, where it is not filler (a directive's report)

    def __init__(
        self,
        kind: ReplyKind,
        reply_tokens: int,
        seed: str,
        tool_call: ToolCall | None = None,
        first_token: str | None = None,
        first_token_top: tuple[tuple[str, float], ...] = (),
        more_calls: tuple[ToolCall, ...] = (),
        text: str | None = None,
    ) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "reply_tokens", reply_tokens)
        object.__setattr__(self, "seed", seed)
        object.__setattr__(self, "tool_call", tool_call)
        object.__setattr__(self, "first_token", first_token)
        object.__setattr__(self, "first_token_top", first_token_top)
        object.__setattr__(self, "more_calls", more_calls)
        object.__setattr__(self, "text", text)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return () if self.tool_call is None else (self.tool_call, *self.more_calls)

    def call_spans(self) -> list[tuple[ToolCall, int, int]]:
        """Each tool call with its tokens ``[start, end)``: its name, then its arguments."""
        spans, at = [], 0
        for call in self.tool_calls:
            end = at + 1 + len(split_tokens(call.arguments))
            spans.append((call, at, end))
            at = end
        return spans

    def pieces(self, n: int) -> list[str]:
        """The first ``n`` tokens of the reply (fewer if it is shorter)."""
        n = min(n, self.reply_tokens)
        if self.kind is ReplyKind.TOOL_CALL:
            assert self.tool_call is not None
            out: list[str] = []
            for call in self.tool_calls:
                out += [call.name, *split_tokens(call.arguments)]
            return out[:n]
        if self.kind is ReplyKind.TEXT_TOOL_CALL:
            assert self.tool_call is not None
            return split_tokens(_text_call(self.tool_call, self.seed))[:n]
        if self.text is not None:
            return split_tokens(self.text)[:n]
        out = filler_tokens(n, self.seed)
        if out and self.first_token is not None:
            out[0] = self.first_token
        return out


def _text_call(call: ToolCall, seed: str) -> str:
    body = json.dumps({"name": call.name, "parameters": json.loads(call.arguments)})
    return ("<|python_tag|>" + body) if stable_hash("python_tag", seed) % 2 else body


def count_tool_results(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "tool")


def _tool_functions(tools: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for tool in tools:
        fn = tool.get("function")
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            out.append(fn)
    return out


def _demands_a_call(tool_choice: Any) -> bool:
    """``"required"`` or a named function: OpenAI's two ways to force a tool call."""
    if tool_choice == "required":
        return True
    return isinstance(tool_choice, Mapping) and isinstance(tool_choice.get("function"), Mapping)


def _chosen_function(
    functions: list[Mapping[str, Any]], tool_choice: Any, index: int
) -> Mapping[str, Any] | None:
    if tool_choice == "none" or not functions:
        return None
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        if isinstance(fn, Mapping):
            for candidate in functions:
                if candidate.get("name") == fn.get("name"):
                    return candidate
    return functions[index % len(functions)]


def fill_schema(schema: Any, seed: str, *, wrong_types: bool = False) -> Any:
    """A deterministic value that fits a JSON schema (required properties only)."""
    if not isinstance(schema, Mapping):
        return _words(seed)
    # (the hash of ``seed`` is drawn only by the kinds that use it: enum, number, boolean)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[stable_hash("value", seed) % len(enum)]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            non_null = [
                o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")
            ]
            return fill_schema((non_null or options)[0], seed, wrong_types=wrong_types)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required = schema.get("required")
        names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        return {
            name: fill_schema(props.get(name, {}), f"{seed}/{name}", wrong_types=wrong_types)
            for name in names
        }
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1) or 1))
        return [
            fill_schema(schema.get("items", {}), f"{seed}[{i}]", wrong_types=wrong_types)
            for i in range(count)
        ]
    if kind in ("integer", "number"):
        lo = schema.get("minimum", 1)
        hi = schema.get("maximum", lo + 99)
        lo_i, hi_i = math.ceil(float(lo)), math.floor(float(hi))
        # Whole numbers for "number" too: clients declare ids and counts as "number" and
        # parse them as integers (Codex's write_stdin session_id), as a model writes them.
        value = lo_i + stable_hash("value", seed) % max(1, hi_i - lo_i + 1)
        return str(value) if wrong_types else value
    if kind == "boolean":
        flag = stable_hash("value", seed) % 2 == 0
        return ("true" if flag else "false") if wrong_types else flag
    if kind == "null":
        return None
    text = _words(seed)
    min_len = int(schema.get("minLength", 0) or 0)
    return text.ljust(min_len, "x")


def _words(seed: str) -> str:
    return filler_text(4 * CHARS_PER_TOKEN, seed).strip() or "value"  # (filler_tokens(4))


PLAN_KEY_MAX_CHARS = 256
# What a plan key written into a message cannot hold (the marker ends at either)
NOT_IN_A_PLAN_KEY = re.compile(r"[\s\]]")
# A plan key written into a conversation's first user message: proxies pass the
# messages on, where some drop a request's custom headers (sglang-router, SMG).
_PLAN_MARKER = re.compile(rf"\[plan:([^\]\s]{{1,{PLAN_KEY_MAX_CHARS}}})\]")


def plan_marker(key: str) -> str:
    """``key`` as the fake engine finds it in a conversation's first user message."""
    if not key or len(key) > PLAN_KEY_MAX_CHARS or NOT_IN_A_PLAN_KEY.search(key):
        raise ValueError(f"a plan key is 1-{PLAN_KEY_MAX_CHARS} characters, no spaces or ']'")
    return f"[plan:{key}]"


def plan_key_in(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The plan key written in the first user message (:func:`plan_marker`), if any."""
    for message in messages:
        if message.get("role") == "user":
            content = _message_text(message)
            if "[plan:" in content:
                found = _PLAN_MARKER.search(content)
                return found.group(1) if found else None
            return None
    return None


_NAME = r"[A-Za-z0-9_.\-/]{1,64}"
_GROUP = rf"{_NAME}(?:\s*\+\s*{_NAME}){{0,7}}"
_DIRECTIVE = re.compile(rf"\[tools?:\s*({_GROUP}(?:\s*,\s*{_GROUP}){{0,15}})\s*\]")
_NAME_SEPARATORS = ("__", ".", "/", "_")
# Tools that load other tools' schemas on demand (Claude Code offers MCP tools "deferred":
# by name in a system message, callable once ``ToolSearch`` has fetched them).
_TOOL_SEARCH = ("ToolSearch", "tool_search")


def directed_tools(messages: Sequence[Mapping[str, Any]]) -> tuple[list[list[str]], int] | None:
    """The tool names a ``[tool:NAME]`` / ``[tools:A,B+C]`` marker in the last user message
    asks for, as groups called in one reply each (``+`` joins a group: parallel calls),
    and the index of that message; None without a marker."""
    last = None
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            last = i
            break
    if last is None:
        return None
    found = _DIRECTIVE.search(_message_text(messages[last]))
    if found is None:
        return None
    groups = [
        [n.strip() for n in item.split("+") if n.strip()] for item in found.group(1).split(",")
    ]
    return [g for g in groups if g], last


def _directed_step(
    groups: list[list[str]],
    messages: Sequence[Mapping[str, Any]],
    since: int,
    functions: list[Mapping[str, Any]],
    may_search: bool = True,
) -> tuple[list[Mapping[str, Any]], str | None]:
    """What a directive asks of the next reply, the directive being in ``messages[since]``:
    the functions to call now (one group), or none; and, when a directed name is not
    offered but a tool search is, the query that loads it (asked once per directive;
    never with ``may_search`` off: calls written as text are not counted as searches)."""
    after = messages[since + 1 :]
    made = [
        str((call.get("function") or {}).get("name", ""))
        for m in after
        if m.get("role") == "assistant"
        for call in (m.get("tool_calls") or [])
        if isinstance(call, Mapping)
    ]
    searches = sum(1 for name in made if _is_tool_search(name))
    # calls made so far; a client that runs tool calls sent as text answers in tool messages
    done = max(len(made), count_tool_results(after)) - searches
    resolved = [[(n, _matching_function(functions, n)) for n in g] for g in groups]
    missing = [n for g in resolved for n, fn in g if fn is None]
    search = next((fn for fn in functions if _is_tool_search(str(fn.get("name")))), None)
    if search is not None and "query" not in (search.get("parameters") or {}).get("properties", {}):
        search = None  # (a search this script cannot ask)
    if missing and search is not None and searches == 0 and may_search:
        names = dict.fromkeys(_deferred_name(messages, n) for n in missing)  # (once each)
        return [search], "select:" + ",".join(names)
    at = 0
    for group in resolved:
        fns = [fn for _, fn in group if fn is not None]
        if done < at + len(fns):
            return fns[max(0, done - at) :], None
        at += len(fns)
    return [], None


def _listed(fn: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return [] if fn is None else [fn]


def _is_tool_search(name: str) -> bool:
    return name in _TOOL_SEARCH  # (a harness's own, never an MCP server's tool of that name)


def _deferred_name(messages: Sequence[Mapping[str, Any]], name: str) -> str:
    """The full name of a deferred tool that ends in ``name`` (``mcp__luftpause__spawn``),
    as the conversation lists it, else ``name`` itself."""
    pattern = re.compile(
        r"(?<![A-Za-z0-9_.\-/])([A-Za-z0-9_.\-/]*(?:__|[./_]))?" + re.escape(name) + r"(?![\w.\-/])"
    )
    for message in messages:
        for found in pattern.finditer(_message_text(message)):
            if found.group(1):
                return found.group(0)
    return name


def _directed_report(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """A directive's answer: the text of the latest tool result, as it came back."""
    for message in reversed(messages):
        if message.get("role") == "tool":
            text = _message_text(message).strip()
            return f"The tools returned:\n{text}" if text else None
    return None


def _matching_function(functions: list[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """The offered function called ``name``, or one whose name ends in it after a
    separator (``mcp__luftpause__spawn`` for ``spawn``)."""
    for fn in functions:
        if fn.get("name") == name:
            return fn
    for fn in functions:
        full = str(fn.get("name", ""))
        if any(full.endswith(sep + name) for sep in _NAME_SEPARATORS):
            return fn
    return None


def _earlier_results(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """JSON objects in tool results (and nested one level in lists or ``content``
    parts), the latest first."""
    found: list[Mapping[str, Any]] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            continue
        value = _json_in(_message_text(message))
        if value is None:
            continue
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, Mapping):
                found.append(item)
                stack.extend(v for v in item.values() if isinstance(v, (Mapping, list)))
            elif isinstance(item, list):
                stack.extend(item)
    return found


def _json_in(text: str) -> Any:
    """The JSON a tool result holds: all of it, or the first object or array in it
    (harnesses wrap results: Codex writes ``Wall time: …\nOutput:\n{…}``); None if none."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for n, found in enumerate(re.finditer(r"[\[{]", text)):
        if n == 16:  # (bounded: text with many brackets and no JSON is not parsed on and on)
            break
        try:
            return decoder.raw_decode(text, found.start())[0]
        except ValueError:
            continue
    return None


def _directed_arguments(
    fn: Mapping[str, Any], seed: str, results: list[Mapping[str, Any]], wrong_types: bool
) -> dict[str, Any]:
    """``fill_schema``'s arguments, where earlier tool results name them: a required
    property that is a key of a result's JSON takes the latest value there; an array
    property takes every value of that key, or of its singular (``handles`` gathers
    each ``handle``), oldest first."""
    schema = fn.get("parameters", {})
    args = fill_schema(schema, seed, wrong_types=wrong_types)
    if not isinstance(args, dict):
        return {}
    props = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
    for name in list(args):
        spec = props.get(name, {}) if isinstance(props, Mapping) else {}
        if isinstance(spec, Mapping) and spec.get("type") == "array":
            keys = (name, name[:-1]) if name.endswith("s") and len(name) > 1 else (name,)
            gathered: list[Any] = []
            # (results come latest first; a reversed slice: mypyc fails on reversed() here)
            for result in results[::-1]:
                for key in keys:
                    if key in result:
                        value = result[key]
                        for item in value if isinstance(value, list) else [value]:
                            if item not in gathered:
                                gathered.append(item)
            if gathered:
                args[name] = gathered
            continue
        for result in results:
            if name in result:
                args[name] = result[name]
                break
    return args


def _message_text(message: Mapping[str, Any]) -> str:
    """A message's text: its content, or the text of its content parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def plan_reply(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    options: ScriptOptions,
    *,
    prompt_text: str,
    tool_choice: Any = None,
    parallel_tool_calls: bool = True,
    tool_results: int | None = None,
    text_tool_calls: bool | None = None,
    wrong_types: bool | None = None,
    call_nonce: str = "",
    ignore_eos: bool = False,
    plan_key: str | None = None,
    prompt_hash: PromptHash | None = None,
) -> ReplyPlan:
    """Decide the reply to a conversation. Keyword overrides come from request headers.

    ``call_nonce`` makes tool call IDs unique per request, as real engines' are: two
    runs with the same conversation must not share IDs (clients identify runs by them).
    ``ignore_eos`` (the SGLang/vLLM sampling parameter) makes a text answer run until
    ``max_tokens`` or the context limit; tool calls are unchanged.

    Every draw (answer length, runaway, first token, tool arguments) comes from a hash
    of the whole conversation, or, given ``plan_key``, of that key and the number of
    tool results so far: two runs with one plan key get the same replies, turn for
    turn, whatever their prompt text (common random numbers, for loads compared arm
    against arm or against the simulator).

    The prompt text is read only through its hashes: ``prompt_hash``, given, stands for
    ``prompt_text`` (a prompt held as a running hash, ``tokens.RunningHash``).
    """
    done = count_tool_results(messages)
    hashes = TextHash(prompt_text) if prompt_hash is None else prompt_hash
    if plan_key is None:
        seed = f"{options.seed}:{hashes.hash('conversation'):016x}"
    else:
        seed = f"{options.seed}:{stable_hash('plan', plan_key, str(done)):016x}"
    want_results = options.tool_results if tool_results is None else tool_results
    as_text = options.text_tool_calls if text_tool_calls is None else text_tool_calls
    wrong = options.wrong_types if wrong_types is None else wrong_types
    functions = _tool_functions(tools or [])
    directed = directed_tools(messages) if functions and tool_choice != "none" else None
    fns: list[Mapping[str, Any]] = []
    query = None
    if directed is not None:  # the test bench's script: exactly these tools, in order
        groups, since = directed
        fns, query = _directed_step(groups, messages, since, functions, may_search=not as_text)
        if not fns and _demands_a_call(tool_choice):  # (constrained decoding still calls)
            fns = _listed(_chosen_function(functions, tool_choice, done))
        if as_text or not parallel_tool_calls:
            fns = fns[:1]  # (calls written as text, or no parallel calls: one per reply)
    elif done < want_results or _demands_a_call(tool_choice):
        fns = _listed(_chosen_function(functions, tool_choice, done))
    if fns:
        calls = []
        results = _earlier_results(messages) if directed is not None else []
        for i, fn in enumerate(fns):
            name = str(fn["name"])
            if query is not None:
                args: Any = {"query": query}
            elif directed is not None:
                at = f"{seed}/{name}" if i == 0 else f"{seed}/{name}/{i}"
                args = _directed_arguments(fn, at, results, wrong)
            else:
                args = fill_schema(fn.get("parameters", {}), f"{seed}/{name}", wrong_types=wrong)
            if not isinstance(args, dict):
                args = {}
            nonce = call_nonce if i == 0 else f"{call_nonce}/{i}"
            calls.append(
                ToolCall(
                    id=f"call_{hashes.hash('call', str(done), nonce):016x}",
                    name=name,
                    arguments=json.dumps(args),
                )
            )
        call = calls[0]
        if as_text:
            text = _text_call(call, seed)
            return ReplyPlan(ReplyKind.TEXT_TOOL_CALL, -(-len(text) // CHARS_PER_TOKEN), seed, call)
        tokens = sum(1 + -(-len(c.arguments) // CHARS_PER_TOKEN) for c in calls)
        return ReplyPlan(ReplyKind.TOOL_CALL, tokens, seed, call, more_calls=tuple(calls[1:]))
    if directed is not None and not ignore_eos:
        report = _directed_report(messages[directed[1] + 1 :])
        if report is not None:
            return ReplyPlan(ReplyKind.TEXT, len(split_tokens(report)), seed, text=report)
    h = stable_hash("length", seed)
    # Runaways are modelled where the calibration measured them: uncapped agent answers
    # that follow tool output. A plain chat answer ("hello") always ends on its own.
    runaway = ignore_eos or (done > 0 and (h >> 20) % 1000 < options.runaway_per_mille)
    user_text = _last_user_text(messages)
    length = RUNAWAY_TOKENS if runaway else answer_length(count_tokens(user_text), seed)
    top = label_distribution(user_text, seed)
    first = top[0][0] if top else None
    return ReplyPlan(ReplyKind.TEXT, length, seed, first_token=first, first_token_top=top)


def answer_median(prompt_tokens: int) -> float:
    """Median natural length (tokens) of an answer to a user message of ``prompt_tokens``."""
    scale = min(1.0, max(1, prompt_tokens) / ANSWER_ANCHOR_PROMPT)
    mean = ANSWER_ANCHOR_MEAN * math.pow(scale, ANSWER_PROMPT_EXPONENT)
    return mean / math.exp(ANSWER_SIGMA * ANSWER_SIGMA / 2)  # log-normal: median = mean/e^(σ²/2)


def answer_length(prompt_tokens: int, seed: str) -> int:
    """The natural length of a text answer: the quantile ``u`` (a hash of ``seed``) of a
    log-normal with median ``answer_median(prompt_tokens)`` and spread ``ANSWER_SIGMA``,
    truncated at ``ANSWER_MAX_TOKENS`` (rescaling ``u``, so no length piles up at the cap)."""
    u = ((stable_hash("answer-length", seed) >> 11) + 0.5) / 2.0**53  # exact: 0 < u < 1
    median = answer_median(prompt_tokens)
    z_cap = math.log(ANSWER_MAX_TOKENS / median) / ANSWER_SIGMA
    z = normal_quantile(u * normal_cdf(z_cap))
    return max(1, min(ANSWER_MAX_TOKENS, round(median * math.exp(ANSWER_SIGMA * z))))


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


# Acklam's rational approximation of the standard normal quantile (relative error
# < 1.2e-9): deterministic arithmetic, no randomness module.
_A = (-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.3577518672690,
      -30.66479806614716, 2.506628277459239)  # fmt: skip
_B = (-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972,
      -13.28068155288572)  # fmt: skip
_C = (-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734,
      4.374664141464968, 2.938163982698783)  # fmt: skip
_D = (0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416)
_P_LOW = 0.02425


def normal_quantile(p: float) -> float:
    """``z`` with ``normal_cdf(z) == p`` for 0 < p < 1."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < _P_LOW:
        q = math.sqrt(-2.0 * math.log(p))
        return _tail(q)
    if p > 1.0 - _P_LOW:
        q = math.sqrt(-2.0 * math.log(1.0 - p))
        return -_tail(q)
    q = p - 0.5
    r = q * q
    a, b = _A, _B
    num = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q
    den = ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0
    return num / den


def _tail(q: float) -> float:
    c, d = _C, _D
    num = ((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]
    den = (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0
    return num / den


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last user message that has any (text, or text parts)."""
    for message in reversed(messages):
        if message.get("role") == "user" and isinstance(message.get("content"), (str, list)):
            return _message_text(message)
    return ""


_LABEL_LINE = re.compile(
    r"(?:labels?|categories|category|options|choices|classes)\s*(?:are|is)?\s*[:=]\s*(.+)",
    re.IGNORECASE,
)
# What a label line must hold (casefolded), and the two letters that case-insensitive
# patterns match to "i" but casefold does not fold to it.
_LABEL_WORDS = ("label", "categor", "option", "choice", "class")
_DOTTED_I = ("\u0130", "\u0131")
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.+?)\s*$")


def extract_labels(text: str) -> list[str]:
    """Candidate labels listed in ``text`` (at most 20, in order, deduplicated)."""
    # The label-line pattern is slow on long lines (case-insensitive, tried at every
    # position), and an agent's last user message is long at every turn: a text with
    # none of its words, folded as the pattern folds them, cannot match it.
    folded = text.casefold()
    maybe = any(word in folded for word in _LABEL_WORDS) or any(c in text for c in _DOTTED_I)
    return _scan_labels(text, label_lines=maybe)


def _scan_labels(text: str, *, label_lines: bool) -> list[str]:
    """The labels of ``text``'s label lines (tried only if ``label_lines``) and bullets."""
    found: list[str] = []
    for line in text.splitlines():
        match = _LABEL_LINE.search(line) if label_lines else None
        if match:
            for part in re.split(r",|\||/|;|\bor\b", match.group(1)):
                found.append(part)
            continue
        bullet = _BULLET.match(line)
        if bullet:
            found.append(bullet.group(1))
    labels: list[str] = []
    for raw in found:
        label = raw.strip().strip("\"'`[](){}.").strip()
        if label and len(label) <= 40 and label not in labels:
            labels.append(label)
    return labels[:20]


def first_token_of(label: str) -> str:
    return label[:CHARS_PER_TOKEN]


def label_distribution(text: str, seed: str) -> tuple[tuple[str, float], ...]:
    """Logprobs of the first reply token when ``text`` lists labels, most likely first.

    Empty when no labels are listed. The listed probabilities sum to 0.95; the
    rest is the unlisted vocabulary.
    """
    labels = extract_labels(text)
    if len(labels) < 2:
        return ()
    tokens: list[str] = []
    for label in labels:
        token = first_token_of(label)
        if token not in tokens:
            tokens.append(token)
    scores = {t: (stable_hash("label", seed, t) % 1000) / 250.0 for t in tokens}
    for d in _DISTRACTORS:
        if d not in scores:
            scores[d] = -1.0 - (stable_hash("distractor", seed, d) % 1000) / 1000.0
    top = max(scores.values())
    total = sum(math.exp(s - top) for s in scores.values())
    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    return tuple((t, (s - top) - math.log(total) + math.log(0.95)) for t, s in ranked)


def token_logprobs(
    token: str, position: int, plan: ReplyPlan, k: int
) -> tuple[float, list[tuple[str, float]]]:
    """The sampled token's logprob and the top ``k`` alternatives (sampled token first)."""
    if position == 0 and plan.first_token_top and plan.first_token_top[0][0] == token:
        top = list(plan.first_token_top)
        return top[0][1], top[:k]
    h = stable_hash("logprob", plan.seed, str(position))
    own = -((h % 1000) / 2000.0) - 0.001
    alternatives = [token]
    candidates = filler_tokens(k + 3, f"{plan.seed}/alt{position}")
    for alt in candidates:
        if alt not in alternatives:
            alternatives.append(alt)
    top = [(token, own)]
    for i, alt in enumerate(alternatives[1:], start=1):
        top.append((alt, own - 1.0 - i * 0.75))
    return own, top[:k]


def classify(text: str, labels: Sequence[str], seed: int = 0) -> tuple[str, list[float]]:
    """Deterministic label and class probabilities for a /classify input."""
    scores = [(stable_hash("classify", str(seed), text, label) % 1000) / 200.0 for label in labels]
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    probs = [e / total for e in exps]
    best = max(range(len(labels)), key=lambda i: (probs[i], -i))
    return labels[best], probs
