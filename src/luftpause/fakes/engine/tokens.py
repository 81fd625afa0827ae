"""Deterministic token counting and prompt rendering for the fake engine.

The fake engine has no tokenizer. It counts **one token per four characters,
rounded up** (``ceil(len(text) / 4)``; an empty string is zero tokens), which is
the usual rule of thumb for English text with Llama-3's 128k vocabulary. A
token is therefore a four-character slice of the text, and the filler the engine
"generates" is produced four characters per token, so counting a reply gives
back exactly the number of tokens generated.

Chat messages are rendered with a Llama-3-style template (header markers, one
block per message, tools as JSON in the system block) so the prefix cache sees
a conversation grow the way a real engine does: each turn's prompt extends the
previous turn's prompt.

An image (an ``image_url`` content part) is not looked at: it stands in the
prompt as a marker of ``IMAGE_TOKENS`` tokens that names a hash of its URL, so
it costs what a vision model's image tokens cost and two different images never
share a cached prefix. (Counted as its JSON, a base64 image would weigh its
size in bytes / 4: tens of thousands of tokens for a screenshot.)

A token's **id** (``token_ids``, what ``POST /v1/chat/completions/render`` answers) is
a stable hash of its four characters into a Llama-3-sized vocabulary: the same in
every process, so equal prompts get equal ids on every engine, and prompts that share
a prefix share the ids of that prefix's whole tokens - the ids a router matches
prefixes on agree with the engine's own prefix cache (which keys blocks of
``block_chars`` characters, a whole number of tokens). Different pieces may share an
id (one chance in ``VOCAB_SIZE`` per pair), as they never do in a real tokenizer; a
router that matches on ids then overrates a shared prefix by a token at most, where
the prompts part.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

CHARS_PER_TOKEN = 4
#: tokens an image part counts for: a 336x336 image in LLaVA-1.5 (24 x 24 patches);
#: vision models spend from about 64 to a few thousand, by model and image size
IMAGE_TOKENS = 576
#: token ids run from 0 to VOCAB_SIZE - 1 (Llama-3's vocabulary size)
VOCAB_SIZE = 128256

# Filler words. Harnesses run a tool call's arguments (Codex and Claude Code run a shell
# command), so no word may be a program that runs until stopped: a filler command must
# end at once, usually as "command not found" ("watch" was one, and hung a Codex run).

_WORDS = [
    "the",
    "quick",
    "lantern",
    "drifts",
    "over",
    "amber",
    "fields",
    "while",
    "patient",
    "rivers",
    "gather",
    "quiet",
    "stones",
    "beneath",
    "silver",
    "bridges",
    "and",
    "careful",
    "engines",
    "hum",
    "along",
    "narrow",
    "valleys",
    "where",
    "distant",
    "towers",
    "keep",
    "steady",
    "vigil",
    "over",
    "green",
    "terraces",
]


def count_tokens(text: str) -> int:
    """Tokens in ``text``: ``ceil(len(text) / 4)``."""
    return -(-len(text) // CHARS_PER_TOKEN)


def split_tokens(text: str) -> list[str]:
    """The four-character pieces ``count_tokens`` counts (the last may be shorter)."""
    return [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]


def token_ids(text: str) -> list[int]:
    """The ids of the tokens ``count_tokens`` counts, one per ``split_tokens`` piece."""
    return [_token_id(piece) for piece in split_tokens(text)]


@functools.lru_cache(maxsize=1 << 16)
def _token_id(piece: str) -> int:
    return stable_hash("token", piece) % VOCAB_SIZE


def stable_hash(*parts: str) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process (unlike ``hash``)."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(_encode(part))
        h.update(_PART_END)
    return int.from_bytes(h.digest(), "big")


_PART_END = b"\x1f"


def _encode(part: str) -> bytes:
    return part.encode("utf-8", "surrogatepass")


class PromptHash(Protocol):
    """``stable_hash(tag, prompt_text, *after)`` of one prompt, however the prompt is held."""

    def hash(self, tag: str, *after: str) -> int: ...


@dataclass(frozen=True, slots=True, init=False)
class TextHash:
    """A ``PromptHash`` of a prompt's text."""

    text: str

    def __init__(self, text: str) -> None:
        object.__setattr__(self, "text", text)

    def hash(self, tag: str, *after: str) -> int:
        return stable_hash(tag, self.text, *after)


class RunningHash:
    """A ``PromptHash`` of a prompt that grows at its end (``feed``), without its text held:
    for each of ``tags``, the hash state after ``tag`` and the text fed so far."""

    __slots__ = ("_states",)

    def __init__(self, tags: Iterable[str] = ()) -> None:
        self._states: dict[str, Any] = {}
        for tag in tags:
            h = hashlib.blake2b(digest_size=8)
            h.update(_encode(tag))
            h.update(_PART_END)
            self._states[tag] = h

    def feed(self, text: str) -> RunningHash:
        data = _encode(text)
        for h in self._states.values():
            h.update(data)
        return self

    def copy(self) -> RunningHash:
        other = RunningHash()
        other._states = {tag: h.copy() for tag, h in self._states.items()}
        return other

    def hash(self, tag: str, *after: str) -> int:
        h = self._states[tag].copy()
        h.update(_PART_END)
        for part in after:
            h.update(_encode(part))
            h.update(_PART_END)
        return int.from_bytes(h.digest(), "big")


def filler_tokens(n: int, seed: str) -> list[str]:
    """``n`` deterministic four-character tokens of readable filler text."""
    if n <= 0:
        return []
    return split_tokens(filler_text(n * CHARS_PER_TOKEN, seed))


def filler_text(chars_needed: int, seed: str) -> str:
    """The text of ``filler_tokens(chars_needed // 4, seed)``, ``chars_needed`` > 0."""
    start = stable_hash("filler", seed) % len(_WORDS)
    pieces: list[str] = []
    length = 0
    i = start
    while length < chars_needed:
        word = _WORDS[i % len(_WORDS)]
        piece = word if not pieces else " " + word
        pieces.append(piece)
        length += len(piece)
        i += 1
    return "".join(pieces)[:chars_needed]


def _content_text(content: Any) -> str:
    """Message content as text: strings as-is, OpenAI content parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(str(part["text"]))
            elif isinstance(part, Mapping) and part.get("type") == "image_url":
                parts.append(_image_text(part.get("image_url")))
            else:
                parts.append(json.dumps(part, sort_keys=True))
        return "".join(parts)
    return json.dumps(content, sort_keys=True)


def _image_text(image_url: Any) -> str:
    """The prompt text an image part stands as: ``IMAGE_TOKENS`` tokens long, naming
    a hash of its URL (or of the whole part, when it has none)."""
    url = image_url.get("url") if isinstance(image_url, Mapping) else None
    if not isinstance(url, str):
        url = json.dumps(image_url, sort_keys=True)
    marker = f"<|image {stable_hash('image', url):016x}|>"
    return marker.ljust(IMAGE_TOKENS * CHARS_PER_TOKEN, "_")


#: what ends every rendered prompt: the header of the reply the engine is to write (a
#: conversation's next turn renders that reply's message from the same header, so each
#: turn's prompt extends the last's)
ASSISTANT_PROMPT = "<|start_header_id|>assistant<|end_header_id|>\n\n"


def render_head(tools: Iterable[Mapping[str, Any]] | None = None) -> str:
    """The start of every prompt: the begin marker and, with tools offered, their block."""
    tool_list = list(tools or [])
    if not tool_list:
        return "<|begin_of_text|>"
    return (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        + "Tools: "
        + json.dumps(tool_list, sort_keys=True, separators=(",", ":"))
        + "<|eot_id|>"
    )


def render_message(message: Mapping[str, Any]) -> str:
    """One message as the prompt holds it (``render_messages`` joins them)."""
    role = str(message.get("role", "user"))
    out = f"<|start_header_id|>{role}<|end_header_id|>\n\n" + _content_text(message.get("content"))
    calls = message.get("tool_calls")
    if calls:
        out += json.dumps(calls, sort_keys=True, separators=(",", ":"))
    return out + "<|eot_id|>"


def render_messages(
    messages: Sequence[Mapping[str, Any]], tools: Iterable[Mapping[str, Any]] | None = None
) -> str:
    """Render a chat conversation into the prompt text the engine prefills."""
    return render_head(tools) + "".join(map(render_message, messages)) + ASSISTANT_PROMPT
