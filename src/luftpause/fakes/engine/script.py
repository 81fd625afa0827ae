"""What the fake engine says: deterministic replies, tool calls, logprobs and labels.

Everything here is a pure function of the conversation (and a seed), so the same
request always gets the same reply, token for token, in every process.

Rules
-----
* **Tool calls.** With ``tools`` offered (and ``tool_choice`` not ``"none"``),
  the reply calls a tool until the conversation holds ``tool_results`` messages
  with role ``tool``; then it answers in text. The tool is the n-th offered tool
  (round robin by the number of results so far) unless ``tool_choice`` names
  one. Arguments fill the schema's *required* properties by type with
  deterministic filler (enums take one of their values, numbers respect
  ``minimum``/``maximum``). The call id is ``call_`` plus a hash of the
  conversation and the call's index, so ids are unique per call and stable.
  Options: ``text_tool_calls`` writes the call as Llama-3 plain text
  (``{"name": ..., "parameters": {...}}``, with or without a leading
  ``<|python_tag|>``) instead of a structured call; ``wrong_types`` writes
  numbers and booleans as strings.
* **Text answers** are filler of a deterministic *natural* length (96-415
  tokens, from the conversation hash). The engine stops earlier at
  ``max_tokens``. With ``runaway_per_mille`` > 0 that many answers in a
  thousand never end on their own (a small model that loses the thread) and run
  until ``max_tokens`` or the context limit.
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
    filler_tokens,
    split_tokens,
    stable_hash,
)

RUNAWAY_TOKENS = 1 << 30  # natural length of an answer that never ends on its own
_DISTRACTORS = ("The", "I", "\n", "Sure", "It")


class ReplyKind(StrEnum):
    TEXT = "text"
    TOOL_CALL = "tool_call"
    TEXT_TOOL_CALL = "text_tool_call"


@dataclass(frozen=True)
class ScriptOptions:
    tool_results: int = 3
    text_tool_calls: bool = False
    wrong_types: bool = False
    runaway_per_mille: int = 250  # calibrated: see docs/calibration.md
    seed: int = 0


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class ReplyPlan:
    """The reply the engine will produce, token by token."""

    kind: ReplyKind
    reply_tokens: int  # natural length; RUNAWAY_TOKENS for an answer that never stops
    seed: str  # deterministic seed for the filler and logprobs
    tool_call: ToolCall | None = None
    first_token: str | None = None  # label-scoring token replacing the first filler token
    first_token_top: tuple[tuple[str, float], ...] = ()

    def pieces(self, n: int) -> list[str]:
        """The first ``n`` tokens of the reply (fewer if it is shorter)."""
        n = min(n, self.reply_tokens)
        if self.kind is ReplyKind.TOOL_CALL:
            assert self.tool_call is not None
            return [self.tool_call.name, *split_tokens(self.tool_call.arguments)][:n]
        if self.kind is ReplyKind.TEXT_TOOL_CALL:
            assert self.tool_call is not None
            return split_tokens(_text_call(self.tool_call, self.seed))[:n]
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
    h = stable_hash("value", seed)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[h % len(enum)]
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
        value: int | float = lo_i + h % max(1, hi_i - lo_i + 1)
        if kind == "number" and value + 0.5 <= float(hi):
            value = value + 0.5
        return str(value) if wrong_types else value
    if kind == "boolean":
        flag = h % 2 == 0
        return ("true" if flag else "false") if wrong_types else flag
    if kind == "null":
        return None
    text = _words(seed)
    min_len = int(schema.get("minLength", 0) or 0)
    return text.ljust(min_len, "x")


def _words(seed: str) -> str:
    tokens = filler_tokens(4, seed)
    return "".join(tokens).strip() or "value"


def plan_reply(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    options: ScriptOptions,
    *,
    prompt_text: str,
    tool_choice: Any = None,
    tool_results: int | None = None,
    text_tool_calls: bool | None = None,
    wrong_types: bool | None = None,
    call_nonce: str = "",
) -> ReplyPlan:
    """Decide the reply to a conversation. Keyword overrides come from request headers.

    ``call_nonce`` makes tool call IDs unique per request, as real engines' are: two
    runs with the same conversation must not share IDs (clients identify runs by them).
    """
    seed = f"{options.seed}:{stable_hash('conversation', prompt_text):016x}"
    want_results = options.tool_results if tool_results is None else tool_results
    as_text = options.text_tool_calls if text_tool_calls is None else text_tool_calls
    wrong = options.wrong_types if wrong_types is None else wrong_types
    done = count_tool_results(messages)
    functions = _tool_functions(tools or [])
    fn = _chosen_function(functions, tool_choice, done) if done < want_results else None
    if fn is not None:
        name = str(fn["name"])
        args = fill_schema(fn.get("parameters", {}), f"{seed}/{name}", wrong_types=wrong)
        if not isinstance(args, dict):
            args = {}
        call = ToolCall(
            id=f"call_{stable_hash('call', prompt_text, str(done), call_nonce):016x}",
            name=name,
            arguments=json.dumps(args),
        )
        if as_text:
            text = _text_call(call, seed)
            return ReplyPlan(ReplyKind.TEXT_TOOL_CALL, -(-len(text) // CHARS_PER_TOKEN), seed, call)
        return ReplyPlan(
            ReplyKind.TOOL_CALL, 1 + -(-len(call.arguments) // CHARS_PER_TOKEN), seed, call
        )
    h = stable_hash("length", seed)
    runaway = (h >> 20) % 1000 < options.runaway_per_mille
    length = RUNAWAY_TOKENS if runaway else 96 + h % 320
    top = label_distribution(_last_user_text(messages), seed)
    first = top[0][0] if top else None
    return ReplyPlan(ReplyKind.TEXT, length, seed, first_token=first, first_token_top=top)


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


_LABEL_LINE = re.compile(
    r"(?:labels?|categories|category|options|choices|classes)\s*(?:are|is)?\s*[:=]\s*(.+)",
    re.IGNORECASE,
)
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.+?)\s*$")


def extract_labels(text: str) -> list[str]:
    """Candidate labels listed in ``text`` (at most 20, in order, deduplicated)."""
    found: list[str] = []
    for line in text.splitlines():
        match = _LABEL_LINE.search(line)
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
