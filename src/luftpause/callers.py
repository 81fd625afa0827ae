"""Callers bound to keys (B13): who a request is comes from the key it presents.

With ``[[callers]]`` configured, every request to the dataplane's ``/v1`` routes and to
the runtime's ``/mcp`` carries a credential, as ``Authorization: Bearer <credential>``
or (Anthropic's way) ``x-api-key: <credential>``. The credential is either

* a caller's key: the request is that caller's. Its ``x-luftpause-caller`` header may
  only name a sub-caller under it (``ci`` or ``alice/ci`` is ``alice/ci``; any other
  name, another caller's included, is a sub-caller of the key's caller too), and the
  class it asks for must be one the caller may use (else it is downgraded, or refused,
  per caller); or
* ``LUFTPAUSE_TOKEN``, the services' own credential: its requests are trusted, their
  headers believed. The runtime uses it to run a caller's sub-agents under that caller.

Without callers, the token alone guards the stack as before (D9, X2); without the token
too, nothing does.

Keys are never kept as text: each is hashed (SHA-256) as it is read, and a presented
key is looked up by its hash, so the time a lookup takes says nothing about any key.
They come from an environment variable (read at start) or a file (read again when it
changes, checked at most every ``CHECK_EVERY_S`` on the request path, and on
``reload``, which the services call on SIGHUP): a key rotates by adding the new key to
the file, handing it out, then removing the old one, without a restart. A key file may
hold ``sha256:HEX`` lines instead of keys, so a service need never see the key.
No key, and no part of one, is ever written to a log or an error body.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from luftpause.auth import api_key_ok, bearer_ok, bearer_value
from luftpause.config import CallerConfig, ConfigError

log = logging.getLogger("luftpause.callers")

KEY_PREFIX = "lp_"
HASH_PREFIX = "sha256:"
CHECK_EVERY_S = 2.0
CLASSES = ("interactive", "batch")
# A presented credential longer than this is no key of ours (and is not hashed).
MAX_KEY_CHARS = 512
DENIED_HEADER = "x-luftpause-class-denied"


@dataclass(frozen=True, slots=True)
class KeyedCaller:
    """A caller a key names: what the dataplane and the runtime need to serve it."""

    name: str
    classes: tuple[str, ...]
    on_denied_class: str  # "downgrade" | "refuse"

    @classmethod
    def of(cls, config: CallerConfig) -> KeyedCaller:
        return cls(config.name, tuple(config.classes), config.on_denied_class)


@dataclass(frozen=True, slots=True)
class Trusted:
    """The services' own token, or a stack without auth: headers are believed."""


TRUSTED = Trusted()
Principal = KeyedCaller | Trusted


class ClassDenied(Exception):
    """A keyed caller asked for a class it may not use, and its key refuses (403)."""


def new_key() -> str:
    """A new random key: ``lp_`` and 43 URL-safe characters (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    """The ``sha256:HEX`` line a key file may hold instead of the key."""
    return HASH_PREFIX + hashlib.sha256(key.strip().encode("utf-8")).hexdigest()


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def key_words(text: str) -> Iterator[tuple[int, str]]:
    """The words of a key file's text (or an environment variable's value) with their
    line numbers: keys or ``sha256:`` lines, separated by commas or spaces, ``#`` starting
    a comment."""
    for number, line in enumerate(text.splitlines(), 1):
        for word in line.split("#", 1)[0].replace(",", " ").split():
            yield number, word


def parse_keys(text: str, source: str) -> tuple[list[bytes], list[str]]:
    """The key digests in a key file's text (or an environment variable's value, where
    keys are separated by commas or spaces), and what is wrong with it, by line, never
    quoting a key."""
    digests: list[bytes] = []
    problems: list[str] = []
    for number, word in key_words(text):
        if word.lower().startswith(HASH_PREFIX):
            hex_part = word[len(HASH_PREFIX) :]
            try:
                raw = bytes.fromhex(hex_part)
            except ValueError:
                raw = b""
            if len(raw) != 32:
                problems.append(f"{source}, line {number}: a sha256: line needs 64 hex digits")
                continue
            digests.append(raw)
        elif len(word) < 16 or len(word) > MAX_KEY_CHARS:
            problems.append(
                f"{source}, line {number}: a key must be 16 to {MAX_KEY_CHARS} characters "
                f"(this one has {len(word)}); `luftpause keys new` makes one"
            )
        elif not (word.isascii() and word.isprintable()):
            # An HTTP header carries such a key as bytes no client and server agree on.
            problems.append(
                f"{source}, line {number}: a key must be printable ASCII; "
                "`luftpause keys new` makes one"
            )
        else:
            digests.append(_digest(word))
    return digests, problems


def _file_id(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Keyring:
    """Every configured caller's key hashes, by hash; key files re-read when they change.

    Built at a service's start, where every problem is a ``ConfigError`` naming the
    caller and the source: an unset variable, a file that cannot be read, no key, a bad
    line, one key given to two callers, or a key equal to ``LUFTPAUSE_TOKEN``. Later,
    a key file that cannot be read, holds a bad line, or would give another caller's key
    (or the token) is logged and that caller keeps its previous keys (a half-written file
    must not lock a caller out), while other files changed at the same time still apply;
    a readable file with no key revokes that caller's file keys. Keys are printable
    ASCII: anything else presented is no key.
    """

    def __init__(
        self,
        callers: Sequence[CallerConfig],
        environ: Mapping[str, str],
        token: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        base_dir: Path | None = None,
    ) -> None:
        self.callers = {c.name: KeyedCaller.of(c) for c in callers}
        self._token_digest = _digest(token) if token else None
        self._clock = clock
        self._env_keys: dict[str, list[bytes]] = {}
        self._env_sources: dict[str, str] = {}
        self._files: dict[str, Path] = {}
        self._file_keys: dict[str, list[bytes]] = {}
        self._file_ids: dict[str, tuple[int, int, int] | None] = {}
        self._by_digest: dict[bytes, KeyedCaller] = {}
        problems: list[str] = []
        for c in callers:
            mine: list[str] = []
            keys: list[bytes] = []
            if c.key_env:
                value = environ.get(c.key_env)
                if not value:
                    mine.append(f"caller {c.name!r}: environment variable {c.key_env} is not set")
                else:
                    digests, bad = parse_keys(value, f"caller {c.name!r}: ${c.key_env}")
                    keys += digests
                    mine += bad
                    self._env_keys[c.name] = digests
                    self._env_sources[c.name] = f"${c.key_env}"
            if c.key_file:
                path = Path(c.key_file)
                if base_dir is not None and not path.is_absolute():
                    path = base_dir / path
                self._files[c.name] = path
                read, bad = self._read(c.name, path)
                if read is not None:
                    self._file_keys[c.name] = read
                    keys += read
                mine += bad
            if not keys and not mine:
                where = " or ".join(x for x in (c.key_env and f"${c.key_env}", c.key_file) if x)
                mine.append(f"caller {c.name!r}: no key in {where}")
            problems += mine
        if not problems:
            problems = self._rebuild()
        if problems:
            raise ConfigError("\n".join(problems))
        self._checked = clock()

    def _read(self, name: str, path: Path) -> tuple[list[bytes] | None, list[str]]:
        """Read one caller's key file: (digests, problems); digests None if it cannot be
        used. Records the file's identity, so an unchanged file is not read again."""
        self._file_ids[name] = _file_id(path)
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
            return None, [f"caller {name!r}: cannot read key_file {path}: {why}"]
        digests, problems = parse_keys(text, f"caller {name!r}: {path}")
        return (digests if not problems else None), problems

    def _sources(self, name: str) -> list[tuple[str, list[bytes]]]:
        """A caller's keys by where they come from (``$VAR``, a file's path)."""
        out: list[tuple[str, list[bytes]]] = []
        if name in self._env_keys:
            out.append((self._env_sources[name], self._env_keys[name]))
        if name in self._files:
            out.append((str(self._files[name]), self._file_keys.get(name, [])))
        return out

    def _rebuild(self) -> list[str]:
        """Index the keys by hash; if one is two callers' or the token, change nothing and
        say so, naming the callers and sources."""
        by_digest: dict[bytes, KeyedCaller] = {}
        first: dict[bytes, tuple[str, str]] = {}
        problems: list[str] = []
        for name, caller in self.callers.items():
            for source, digests in self._sources(name):
                for digest in digests:
                    problem = None
                    owner, where = first.setdefault(digest, (name, source))
                    if owner != name:
                        problem = (
                            f"callers {owner!r} ({where}) and {name!r} ({source}) "
                            "are given the same key"
                        )
                    elif self._token_digest is not None and hmac.compare_digest(
                        digest, self._token_digest
                    ):
                        problem = f"caller {name!r}: a key in {source} equals LUFTPAUSE_TOKEN"
                    if problem is not None and problem not in problems:
                        problems.append(problem)
                    by_digest[digest] = caller
        if not problems:
            self._by_digest = by_digest
        return problems

    def reload(self) -> list[str]:
        """Read every key file again now (SIGHUP); returns the problems, also logged."""
        return self._reload(force=True)

    def _reload(self, force: bool) -> list[str]:
        self._checked = self._clock()
        problems: list[str] = []
        changed: dict[str, list[bytes]] = {}
        for name, path in self._files.items():
            if not force and _file_id(path) == self._file_ids.get(name):
                continue
            digests, bad = self._read(name, path)
            problems += bad
            if digests is not None and digests != self._file_keys.get(name):
                changed[name] = digests
        # Each changed file is applied on its own, so one whose key is another caller's (or
        # the token) holds back only itself, never someone else's revocation; rounds repeat
        # while one applies, so a key moved from one file to another moves whichever is
        # read first.
        applied: list[str] = []
        conflicts: list[str] = []
        progress = True
        while changed and progress:
            progress = False
            conflicts = []
            for name, digests in list(changed.items()):
                before = self._file_keys.get(name, [])
                self._file_keys[name] = digests
                found = self._rebuild()
                if found:
                    self._file_keys[name] = before
                    conflicts += [p for p in found if p not in conflicts]
                else:
                    del changed[name]
                    applied.append(name)
                    progress = True
        problems += conflicts
        for name in applied:
            if not self._file_keys[name]:
                log.warning(
                    "caller %r: %s holds no key: its file keys are revoked", name, self._files[name]
                )
        if applied:
            log.info("caller keys reloaded (%d keys)", len(self._by_digest))
        for problem in problems:
            log.error("%s (the previous keys stay in use)", problem)
        return problems

    def lookup(self, key: str | bytes | None) -> KeyedCaller | None:
        """The caller whose key this is, or None."""
        if self._files and self._clock() - self._checked >= CHECK_EVERY_S:
            self._reload(force=False)
        if key is None:
            return None
        if isinstance(key, bytes):
            key = key.decode("latin-1")
        key = key.strip()
        if not key or len(key) > MAX_KEY_CHARS or not key.isascii():
            return None  # keys are printable ASCII (parse_keys); this is none of them
        return self._by_digest.get(_digest(key))

    def __len__(self) -> int:
        return len(self._by_digest)


class Gate:
    """A request's credential -> its principal, for the routes callers may use.

    ``open``: neither a token nor callers: every request is trusted (the service warns
    at start). Else the token makes a request ``TRUSTED``, a caller's key makes it that
    caller's, anything else is refused (None)."""

    def __init__(self, token: str | None, keyring: Keyring | None) -> None:
        self.token = token
        self.keyring = keyring
        self.open = token is None and keyring is None

    def principal(
        self, authorization: str | bytes | None, api_key: str | bytes | None
    ) -> Principal | None:
        if self.open:
            return TRUSTED
        token = self.token
        if token is not None and (
            _is_token(bearer_ok, authorization, token) or _is_token(api_key_ok, api_key, token)
        ):
            return TRUSTED
        if self.keyring is None:
            return None
        presented = bearer_value(authorization)
        caller = self.keyring.lookup(presented) if presented is not None else None
        if caller is None and api_key is not None:
            caller = self.keyring.lookup(api_key)
        return caller

    def reload(self) -> None:
        if self.keyring is not None:
            self.keyring.reload()


def _is_token(
    check: Callable[[str | bytes | None, str], bool], value: str | bytes | None, token: str
) -> bool:
    try:
        return check(value, token)
    except UnicodeError:  # a lone surrogate: no header holds one, and no token is one
        return False


def gate_for(
    callers: Sequence[CallerConfig],
    environ: Mapping[str, str],
    token: str | None,
    base_dir: Path | None = None,
) -> Gate:
    """The gate a service builds at start (``ConfigError`` if a key cannot be used)."""
    keyring = Keyring(callers, environ, token, base_dir=base_dir) if callers else None
    return Gate(token, keyring)


def install_reload_signal(gate: Gate) -> None:
    """SIGHUP re-reads the key files now (call from within the service's event loop)."""
    if gate.keyring is None or not hasattr(signal, "SIGHUP"):
        return
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, gate.reload)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
        log.debug("no SIGHUP handler here; key files are still checked every %ss", CHECK_EVERY_S)


def served_class(principal: Principal, asked: str) -> tuple[str, str | None]:
    """The class a request is served in, and the class it was denied (None if none).

    A trusted request gets what it asks for. A keyed caller gets it if it may use it;
    else, per its ``on_denied_class``, the class it may use (batch first) or
    ``ClassDenied``."""
    if isinstance(principal, Trusted) or asked in principal.classes:
        return asked, None
    if principal.on_denied_class == "refuse":
        raise ClassDenied(
            f"this key's caller {principal.name!r} may not use the {asked} class "
            f"(it may use: {', '.join(principal.classes)})"
        )
    served = "batch" if "batch" in principal.classes else principal.classes[0]
    return served, asked


def cut_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to ``max_bytes`` bytes of UTF-8, never inside a character (a lone
    surrogate, which UTF-8 cannot hold, becomes ``?``)."""
    return text.encode("utf-8", "replace")[:max_bytes].decode("utf-8", "ignore")


def caller_of(principal: Principal, claimed: str, max_bytes: int) -> str:
    """The caller a request runs as. Trusted: what it claims (``""``: the anonymous
    caller). A keyed caller: its name, or the sub-caller its claim names under it
    (``ci`` and ``NAME/ci`` are both ``NAME/ci``; another caller's name is a sub-caller
    of this one too; characters that do not print are ``?``), cut to ``max_bytes``. The
    cut falls in the sub-caller only, never in the name (which would make it another
    account), and never leaves ``NAME/`` with nothing after it: what does not fit is
    the caller itself."""
    claimed = claimed.strip()
    if isinstance(principal, Trusted):
        return cut_utf8(claimed, max_bytes)
    name = principal.name
    if claimed == name or not claimed:
        return name
    sub = claimed[len(name) + 1 :] if claimed.startswith(name + "/") else claimed
    sub = "".join(c if c.isprintable() else "?" for c in sub).strip("/ ")
    room = max_bytes - len(name.encode("utf-8")) - 1
    sub = cut_utf8(sub, max(room, 0)).rstrip("/ ")
    return f"{name}/{sub}" if sub else name
