"""The engine model's blocks: its prefix cache (``BlockCache``) and prompts held as block
chains (``block_chain``, ``PromptChain``, ``BlockPrompt``).

A block is ``block_chars`` characters of a prompt; its key is a hash of the key before
it and its text, so it stands for the whole prefix up to it. The fake engine hashes a
request's text (``block_chain``); the simulator sends a prompt's length and keys instead,
extended turn by turn (``PromptChain``), with the same keys. ``model.py`` says how the
engine uses them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from luftpause.fakes.engine.tokens import CHARS_PER_TOKEN


class BlockCache:
    """Prefix-cache blocks keyed by hash chain; unreferenced blocks are LRU-evictable.

    A block some retention hint keeps (``retain``) is evicted only when no other
    unreferenced block is left: kept blocks have an LRU of their own, used last."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        # Each cached block's reference count (admitted requests using it); a plain int
        # per key, as every turn locks, inserts and unlocks its whole prompt's blocks.
        self._blocks: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        # Retention: how many live hints keep each block, and the unreferenced kept
        # blocks (oldest first), evicted only once ``_evictable`` is empty.
        self._kept: dict[int, int] = {}
        self._kept_lru: OrderedDict[int, None] = OrderedDict()
        self.kept_evicted = 0  # kept blocks evicted while a hint still kept them (cumulative)

    @property
    def tokens(self) -> int:
        return len(self._blocks) * self.block_tokens

    @property
    def evictable_tokens(self) -> int:
        return (len(self._evictable) + len(self._kept_lru)) * self.block_tokens

    @property
    def kept_tokens(self) -> int:
        return len(self._kept) * self.block_tokens

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    def match(self, chain: Sequence[int]) -> int:
        """How many leading blocks of ``chain`` are cached."""
        blocks = self._blocks
        for n, key in enumerate(chain):
            if key not in blocks:
                return n
        return len(chain)

    def evictable_among(self, chain: Sequence[int]) -> int:
        # (a chain's keys are distinct: each stands for its whole prefix)
        among = len(self._evictable.keys() & chain)
        if self._kept_lru:
            among += len(self._kept_lru.keys() & chain)
        return among * self.block_tokens

    def uncached(self, chain: Sequence[int]) -> int:
        """How many blocks of ``chain`` are not cached."""
        return len(chain) - len(self._blocks.keys() & chain)

    def lock(self, chain: Sequence[int], insert: bool = False) -> None:
        """Reference each block of ``chain``, all cached; with ``insert``, a block that is
        not is inserted, referenced once."""
        # (Every turn locks its whole prompt: the loops below are the engine model's
        # hottest. An unreferenced block is in exactly one of the two LRUs, so while no
        # block is kept one lookup finds it.)
        blocks = self._blocks
        evictable = self._evictable
        kept = self._kept_lru
        if insert:
            for key in chain:
                refs = blocks.get(key, -1)
                if refs < 0:
                    blocks[key] = 1
                    continue
                blocks[key] = refs + 1
                if not refs:
                    if key in evictable:
                        del evictable[key]
                    else:
                        kept.pop(key, None)
        elif not kept:
            for key in chain:
                refs = blocks[key]  # (KeyError: not cached)
                blocks[key] = refs + 1
                if not refs:
                    del evictable[key]
        else:
            for key in chain:
                refs = blocks[key]
                blocks[key] = refs + 1
                if not refs:
                    if key in evictable:
                        del evictable[key]
                    else:
                        kept.pop(key, None)

    def unlock(self, chain: Sequence[int]) -> None:
        # Release leaf first so the leaf ends up older than its parent: LRU then
        # evicts leaves before the prefixes other chains may still share.
        blocks = self._blocks
        evictable = self._evictable
        kept = self._kept
        if not kept:
            for key in reversed(chain):
                refs = blocks[key] - 1
                blocks[key] = refs
                if not refs:
                    evictable[key] = None  # a new key: it goes to the end, the newest
            return
        for key in reversed(chain):
            refs = blocks[key] - 1
            blocks[key] = refs
            if not refs:
                if key in kept:
                    self._kept_lru[key] = None
                else:
                    evictable[key] = None

    def retain(self, chain: Sequence[int]) -> tuple[int, ...]:
        """Keep the cached blocks of ``chain``; returns the keys kept (for ``release``)."""
        blocks, kept = self._blocks, self._kept
        held: list[int] = []
        for key in chain:
            if key not in blocks:
                break  # (evicted already: the rest of the prefix is no use)
            held.append(key)
            n = kept.get(key, 0)
            kept[key] = n + 1
            if not n and key in self._evictable:  # unreferenced: to the kept LRU
                del self._evictable[key]
                self._kept_lru[key] = None
        return tuple(held)

    def release(self, keys: Sequence[int], first: bool = False) -> None:
        """Drop one hint's hold on ``keys`` (``retain``'s answer). A block no hint keeps
        any more rejoins the LRU as if just freed, or, ``first``, at its old end (its run
        ended: the first to go, leaf before root)."""
        kept, kept_lru, evictable = self._kept, self._kept_lru, self._evictable
        if not first:
            keys = keys[::-1]  # leaf first: the leaf ends up older than its parent
        for key in keys:
            n = kept.get(key)
            if n is None:
                continue  # evicted meanwhile
            if n > 1:
                kept[key] = n - 1
                continue
            del kept[key]
            if key in kept_lru:  # unreferenced (else its last unlock makes it evictable)
                del kept_lru[key]
                evictable[key] = None
                if first:
                    evictable.move_to_end(key, last=False)

    def evict(self, n_blocks: int) -> list[int]:
        """Evict up to ``n_blocks`` least recently used unreferenced blocks, those no hint
        keeps first."""
        evicted: list[int] = []
        while len(evicted) < n_blocks and self._evictable:
            key, _ = self._evictable.popitem(last=False)
            del self._blocks[key]
            evicted.append(key)
        while len(evicted) < n_blocks and self._kept_lru:
            key, _ = self._kept_lru.popitem(last=False)
            del self._blocks[key]
            del self._kept[key]
            self.kept_evicted += 1
            evicted.append(key)
        return evicted

    def lru_order(self) -> list[int]:
        """Evictable block keys, next to be evicted first (for tests and debugging)."""
        return [*self._evictable, *self._kept_lru]


def block_chain(text: str, block_chars: int) -> tuple[int, ...]:
    """Keys of the full ``block_chars`` blocks of ``text``: key *i* is a hash of key
    *i − 1* and block *i*, so it stands for the whole prefix up to that block.

    Python's own string hash (salted per process) does it: an engine's cache lives in
    one process, where equal prefixes always get equal keys, and two different prefixes
    share one with a chance of 2⁻⁶⁴ per pair. It is about five times cheaper than a
    cryptographic hash, and every turn's whole prompt goes through here."""
    return PromptChain(block_chars).append(text).prompt().blocks


@dataclass(frozen=True, slots=True, init=False)
class BlockPrompt:
    """A prompt as the engine model reads it: its tokens and its full blocks' keys."""

    tokens: int
    blocks: tuple[int, ...]
    block_chars: int  # the blocks' size (the engine's ``block_chars``)

    def __init__(self, tokens: int, blocks: tuple[int, ...], block_chars: int) -> None:
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "blocks", blocks)
        object.__setattr__(self, "block_chars", block_chars)


class PromptChain:
    """A prompt that grows at its end (a conversation's next turn extends its last), held
    as its length and its blocks' keys rather than its text: each ``append`` keys only
    the blocks it completes, as ``block_chain`` keys the whole text's (the same keys).

    ``append_opaque(chars, identity)`` adds ``chars`` characters without their text (a
    run's long task, never written out). From there on the text is not needed: block *i*
    is keyed *base + i*, where *base* is a hash of the key before the opaque part and
    ``identity`` (distinct runs' keys meet with a chance of about blocks / 2⁶³ per
    pair), and ``append`` adds length only. That shares the same blocks between prompts
    as their text would if ``identity`` names one conversation (prompts under one
    identity extend each other) and the text before the opaque part already tells it
    from every other (two runs' task heads name the run): then no block from the opaque
    part on is shared with another conversation, by text or by these keys, and the
    conversation's own turns share all of their common blocks either way."""

    __slots__ = ("_base", "_blocks", "_identity", "_key", "_tail", "block_chars", "chars")

    def __init__(self, block_chars: int) -> None:
        if block_chars < CHARS_PER_TOKEN or block_chars % CHARS_PER_TOKEN:
            raise ValueError(f"block_chars must be a positive multiple of {CHARS_PER_TOKEN}")
        self.block_chars = block_chars
        self.chars = 0
        self._blocks: list[int] = []
        self._key = 0
        self._tail = ""  # the text of the last, unfilled block (while the text is known)
        self._identity: str | None = None  # set by the first opaque part
        self._base = 0  # from the first opaque part on, block i's key is _base + i

    @property
    def tokens(self) -> int:
        return -(-self.chars // CHARS_PER_TOKEN)  # count_tokens of the text

    def copy(self) -> PromptChain:
        other = PromptChain(self.block_chars)
        other.chars = self.chars
        other._blocks = self._blocks.copy()
        other._key = self._key
        other._tail = self._tail
        other._identity = self._identity
        other._base = self._base
        return other

    def append(self, text: str) -> PromptChain:
        if self._identity is not None:
            return self._grow(len(text))
        bc = self.block_chars
        tail = self._tail + text
        full = len(tail) - len(tail) % bc
        key = self._key
        blocks = self._blocks
        for start in range(0, full, bc):
            key = hash((key, tail[start : start + bc]))
            blocks.append(key)
        self._key = key
        self._tail = tail[full:]
        self.chars += len(text)
        return self

    def append_opaque(self, chars: int, identity: str) -> PromptChain:
        """``chars`` characters of text unique to the conversation ``identity`` names."""
        if self._identity is None:
            self._identity = identity
            self._tail = ""
            self._base = hash((self._key, identity))
        return self._grow(chars)

    def _grow(self, chars: int) -> PromptChain:
        self.chars += chars
        blocks = self._blocks
        base = self._base
        blocks.extend(range(base + len(blocks), base + self.chars // self.block_chars))
        return self

    def prompt(self) -> BlockPrompt:
        return BlockPrompt(self.tokens, tuple(self._blocks), self.block_chars)
