"""``luftpause keys``: make, hash and check the keys that bind callers to ``[[callers]]`` (B13).

* ``keys new NAME``: a new key, printed once on stdout (``KEY=$(luftpause keys new alice)``),
  and on stderr the ``[[callers]]`` entry to paste into the stack file. ``--file`` appends
  the key (or with ``--hash`` its ``sha256:`` line) to a key file, created private.
* ``keys hash``: the ``sha256:`` line of each key on stdin, for a key file the services
  may read without ever seeing a key.
* ``keys check``: loads a stack's ``[[callers]]`` with this environment, as a service
  would at start (``luftpause.callers.Keyring``), and shows each caller's key sources,
  keys, classes, weight and limits; with ``--stdin``, whose key is on stdin.

A key appears on stdout once, from ``keys new``, and nowhere else: no message, entry or
summary holds one. Exit status: 0 done; 1 ``check --stdin`` with a key that is no
caller's; 2 bad arguments, a file that cannot be used or a configuration with a
problem, each said on stderr without a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, TextIO

from pydantic import ValidationError

from luftpause.callers import (
    HASH_PREFIX,
    TRUSTED,
    Gate,
    KeyedCaller,
    Keyring,
    key_hash,
    key_words,
    new_key,
    parse_keys,
)
from luftpause.config import (
    CallerConfig,
    ConfigError,
    StackConfig,
    default_config_path,
    load_config,
    load_secrets,
)

PROG = "luftpause keys"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_READABLE_BY_OTHERS = stat.S_IRGRP | stat.S_IROTH


class KeysError(Exception):
    """What stops a ``keys`` action; the message is one line for the user."""


# ---- arguments ------------------------------------------------------------------------------


def caller_name(text: str) -> str:
    """A ``[[callers]]`` name, validated as ``CallerConfig.name`` is."""
    try:
        CallerConfig(name=text, key_env="X")
    except ValidationError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a caller name: 1 to 64 letters, digits, '_', '.', ':' or '-'"
        ) from None
    return text


def env_name(text: str) -> str:
    if not _ENV_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an environment variable name "
            "(letters, digits and '_', not starting with a digit)"
        )
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Make, hash and check the keys of `[[callers]]`: a request's caller, the classes it "
        "may use, its weight and its limits come from the key it presents (as "
        "`Authorization: Bearer KEY` or `x-api-key: KEY`). A key is shown once, by `keys "
        "new`; no other output, message or log line holds one."
    )
    actions = parser.add_subparsers(
        dest="keys_command",
        metavar="ACTION",
        help="new, hash or check (each answers --help)",
    )
    actions.required = True

    new = actions.add_parser(
        "new",
        help="make a key for a caller: printed once on stdout, its [[callers]] entry on stderr",
        description=(
            "Make a key for caller NAME (`lp_` and 256 random bits), print it once on stdout "
            "and, on stderr, the `[[callers]]` entry to paste into the stack file (batch "
            "only: grant interactive by adding it to `classes`). The key goes in the "
            "environment variable the entry names, or with --file in a key file. Example: "
            "`KEY=$(luftpause keys new alice --file /etc/luftpause/alice.keys)`, then hand "
            "$KEY to alice (as her OPENAI_API_KEY or ANTHROPIC_API_KEY). To rotate, make a "
            "new key into the same file, hand it out, then delete the old line: the services "
            "read the file again without a restart."
        ),
    )
    new.add_argument(
        "name",
        metavar="NAME",
        type=caller_name,
        help="the caller's name: 1 to 64 letters, digits, '_', '.', ':' or '-'",
    )
    new.add_argument(
        "--file",
        metavar="PATH",
        help="append the key to this key file (created with mode 0600; a file others may "
        "read is refused) and name it as the entry's key_file",
    )
    new.add_argument(
        "--hash",
        action="store_true",
        help="with --file: append the key's sha256: line instead of the key, so the "
        "services never see it (such a file may be readable by others); the key is "
        "still printed once",
    )
    new.add_argument(
        "--env",
        metavar="VAR",
        type=env_name,
        help="name this environment variable as the entry's key_env (default without "
        "--file: `LUFTPAUSE_KEY_<NAME>`)",
    )
    new.add_argument(
        "--config",
        metavar="STACK",
        help="the stack file the entry is for: if it already has caller NAME, say how "
        "to add this key beside its current one instead of printing an entry",
    )

    actions.add_parser(
        "hash",
        help="print the sha256: line of each key read from stdin",
        description=(
            "Read keys from stdin (one a line, or separated by commas or spaces; `#` "
            "comments) and print the `sha256:` line of each, for a key file the services "
            "may read without seeing the keys. Example: "
            "`luftpause keys hash < alice.key >> /etc/luftpause/alice.keys`."
        ),
    )

    check = actions.add_parser(
        "check",
        help="load a stack's callers and their keys as a service would, and show them",
        description=(
            "Load the stack file's `[[callers]]` with this environment (their key "
            "variables, key files and LUFTPAUSE_TOKEN) as a service does at start, and "
            "show each caller: where its keys come from and how many there are, its "
            "classes, weight and limits. Exit status 2, with every problem, if a service "
            "would refuse to start. Relative key_file paths are taken from the stack "
            "file's directory. Example: `luftpause keys check --config stack.toml`; "
            '`echo "$KEY" | luftpause keys check --config stack.toml --stdin` says whose '
            "key it is (exit status 1: no caller's)."
        ),
    )
    check.add_argument(
        "--config",
        metavar="STACK",
        help="stack configuration (TOML); default: the packaged fake stack",
    )
    check.add_argument(
        "--stdin",
        action="store_true",
        help="read a key from stdin and say which caller it belongs to, if any "
        "(exit status 1 if none); the key is never printed",
    )


# ---- keys new -------------------------------------------------------------------------------


def _toml(text: str) -> str:
    return json.dumps(text)  # a JSON string is a TOML basic string


def default_env(name: str) -> str:
    return "LUFTPAUSE_KEY_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def append_line(path: Path, line: str, *, secret: bool) -> None:
    """Append ``line`` to the file at ``path``, created with mode 0600. A file that is not
    a regular file, or (for a ``secret``) one others may read, is refused untouched."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        raise KeysError(f"cannot write {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeysError(f"{path} is not a regular file")
        if secret and st.st_mode & _READABLE_BY_OTHERS:
            raise KeysError(
                f"{path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                f"`chmod 600 {path}` first, or pass --hash to append the key's sha256: line"
            )
        data = line.encode("ascii") + b"\n"
        if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
            data = b"\n" + data
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    except OSError as exc:
        raise KeysError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _existing(args: argparse.Namespace, environ: Mapping[str, str]) -> CallerConfig | None:
    if not args.config:
        return None
    try:
        config, _ = load_config(args.config, environ)
    except ConfigError as exc:
        raise KeysError(f"configuration error:\n{exc}") from None
    return next((c for c in config.callers if c.name == args.name), None)


def _rotation(args: argparse.Namespace, existing: CallerConfig, path: Path | None) -> str:
    """What to do with a new key for a caller the stack already has."""
    theirs = Path(existing.key_file) if existing.key_file else None
    if theirs is not None and not theirs.is_absolute():
        theirs = Path(args.config).absolute().parent / theirs
    if path is not None and theirs is not None and path.resolve() == theirs.resolve():
        return (
            f"# Caller {args.name!r} in {args.config} reads this file: hand the new key out, "
            "then delete the old key's line (the services read the file again on their own)."
        )
    sources = [f"${existing.key_env}" if existing.key_env else "", str(theirs or "")]
    return (
        f"# Caller {args.name!r} is already in {args.config} (keys from "
        f"{' and '.join(s for s in sources if s)}): add this key beside its current one, "
        "hand it out, then remove the old one."
    )


def keys_new(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    if args.hash and not args.file:
        raise KeysError("--hash needs --file: the key's sha256: line goes in a key file")
    existing = _existing(args, environ)
    key = new_key()
    path = Path(args.file).absolute() if args.file else None
    if path is not None:
        append_line(path, key_hash(key) if args.hash else key, secret=not args.hash)
    key_env = args.env or (None if path else default_env(args.name))
    print(key, file=out, flush=True)

    notes = ["# The key on stdout is shown once and kept nowhere else: hand it to the caller."]
    if path is not None:
        what = "its sha256: line" if args.hash else "the key"
        notes.append(f"# {what.capitalize()} was appended to {path}.")
    if key_env:
        notes.append(f"# Give the services the key in their environment: {key_env}=<the key>.")
    if existing is not None:
        print("\n".join([*notes, _rotation(args, existing, path)]), file=err)
        return 0
    entry = ["[[callers]]", f"name = {_toml(args.name)}"]
    if key_env:
        entry.append(f"key_env = {_toml(key_env)}")
    if path is not None:
        entry.append(f"key_file = {_toml(str(path))}")
    entry.append('classes = ["batch"]  # grant interactive with ["interactive", "batch"]')
    entry.append("# optional: weight, max_in_flight, tokens_per_minute, daily_tokens")
    notes.append("# Paste into the stack file:")
    print("\n".join([*notes, *entry]), file=err)
    return 0


# ---- keys hash ------------------------------------------------------------------------------


def _stdin_text(stdin: BinaryIO) -> str:
    try:
        return stdin.read().decode("utf-8")
    except UnicodeDecodeError:
        raise KeysError("stdin is not UTF-8 text") from None


def keys_hash(stdin: BinaryIO, out: TextIO) -> int:
    digests, problems = parse_keys(_stdin_text(stdin), "stdin")
    if problems:
        raise KeysError("; ".join(problems))
    if not digests:
        raise KeysError("no key on stdin (one a line; `luftpause keys new` makes one)")
    print("\n".join(HASH_PREFIX + d.hex() for d in digests), file=out)
    return 0


# ---- keys check -----------------------------------------------------------------------------


def _count(text: str) -> tuple[int, bool]:
    """How many keys a source holds, and whether any is a key rather than a hash."""
    digests, _ = parse_keys(text, "")
    words = (w for _, w in key_words(text))
    return len(set(digests)), any(not w.lower().startswith(HASH_PREFIX) for w in words)


def _sources(c: CallerConfig, environ: Mapping[str, str]) -> tuple[str, int, list[str]]:
    """A caller's key sources as shown, its number of distinct keys, and warnings."""
    shown: list[str] = []
    digests: set[bytes] = set()
    warnings: list[str] = []
    if c.key_env:
        value = environ.get(c.key_env, "")
        digests |= set(parse_keys(value, "")[0])
        shown.append(f"${c.key_env} ({_count(value)[0]})")
    if c.key_file:
        path = Path(c.key_file)  # (as the services read it: from the working directory)
        try:
            text = path.read_text("utf-8")
            mode = path.stat().st_mode
        except (OSError, UnicodeDecodeError):  # changed since the keyring read it
            text, mode = "", 0
        digests |= set(parse_keys(text, "")[0])
        count, plain = _count(text)
        shown.append(f"file {path} ({count})")
        if plain and mode & _READABLE_BY_OTHERS:
            warnings.append(
                f"{path} holds keys and is readable by others (mode {stat.S_IMODE(mode):04o}): "
                f"`chmod 600 {path}`, or keep sha256: lines there instead"
            )
    return ", ".join(shown), len(digests), warnings


def _limits(c: CallerConfig) -> str:
    limits = []
    if c.max_in_flight is not None:
        limits.append(f"{c.max_in_flight} in flight")
    if c.tokens_per_minute is not None:
        limits.append(f"{c.tokens_per_minute} tokens/minute")
    if c.daily_tokens is not None:
        limits.append(f"{c.daily_tokens} tokens/day (UTC)")
    return ", ".join(limits) or "none"


def summary(config: StackConfig, environ: Mapping[str, str]) -> list[str]:
    lines: list[str] = []
    for c in config.callers:
        sources, count, warnings = _sources(c, environ)
        denied = "downgraded" if c.on_denied_class == "downgrade" else "refused with a 403"
        lines += [
            f"  {c.name}",
            f"    keys     {count}: {sources}",
            f"    classes  {', '.join(c.classes)} (a request for another is {denied})",
            f"    weight   {c.weight:g}",
            f"    limits   {_limits(c)}",
            *(f"    WARNING  {w}" for w in warnings),
        ]
    return lines


def keys_check(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    stdin: BinaryIO,
    out: TextIO,
    err: TextIO,
) -> int:
    path = Path(args.config) if args.config else default_config_path()
    try:
        config, _ = load_config(path, environ)
    except ConfigError as exc:
        raise KeysError(f"configuration error:\n{exc}") from None
    token = environ.get("LUFTPAUSE_TOKEN") or None
    problems: list[str] = []
    if config.callers:
        try:  # only the token matters here, not the engines' keys
            load_secrets(config.model_copy(update={"endpoints": ()}), environ)
        except ConfigError as exc:
            problems.append(str(exc))
    keyring: Keyring | None = None
    try:
        if config.callers:
            keyring = Keyring(config.callers, environ, token)
    except ConfigError as exc:
        problems += str(exc).splitlines()
    if problems:
        print(f"{PROG} check: {path} is not usable:", file=err)
        for problem in problems:
            print(f"  {problem}", file=err)
        return 2
    presented = None
    if args.stdin:
        presented = _stdin_text(stdin).strip()
        if not presented:
            raise KeysError("no key on stdin")
    if keyring is None:
        auth = "LUFTPAUSE_TOKEN" if token else "nothing (LUFTPAUSE_TOKEN is not set)"
        print(f"{PROG} check: {path} has no [[callers]]: {auth} guards the stack", file=out)
    else:
        print(
            f"{PROG} check: {path}: {len(config.callers)} callers, {len(keyring)} keys",
            file=out,
        )
        print("\n".join(summary(config, environ)), file=out)
    if presented is None:
        return 0
    principal = Gate(token, keyring).principal(None, presented)
    if isinstance(principal, KeyedCaller):
        print(f"the key on stdin belongs to caller {principal.name!r}", file=out)
        return 0
    if principal is TRUSTED and token is not None:
        print("the key on stdin is LUFTPAUSE_TOKEN, the services' own (trusted)", file=out)
        return 0
    print("the key on stdin belongs to no caller", file=out)
    return 1


# ---- entry point ----------------------------------------------------------------------------


def run(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    stdin: BinaryIO,
    out: TextIO,
    err: TextIO,
) -> int:
    try:
        if args.keys_command == "new":
            return keys_new(args, environ, out, err)
        if args.keys_command == "hash":
            return keys_hash(stdin, out)
        return keys_check(args, environ, stdin, out, err)
    except KeysError as exc:
        print(f"{PROG} {args.keys_command}: {exc}", file=err)
        return 2


def main(args: argparse.Namespace) -> int:
    return run(args, os.environ, sys.stdin.buffer, sys.stdout, sys.stderr)
