"""B13, D9, X2: callers bound to keys - key files and variables, the keyring that reloads
them, the gate that turns a credential into a principal, and the class and caller a
keyed request is served as. No key ever reaches a log line or an error message."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from _clock import Clock
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.callers import (
    CHECK_EVERY_S,
    DENIED_HEADER,
    MAX_KEY_CHARS,
    TRUSTED,
    ClassDenied,
    Gate,
    KeyedCaller,
    Keyring,
    caller_of,
    cut_utf8,
    gate_for,
    install_reload_signal,
    key_hash,
    new_key,
    parse_keys,
    served_class,
)
from luftpause.config import CallerConfig, ConfigError

TOKEN = "services-own-token-0123456789"
KEY_A = "lp_alice-key-0123456789abcdefghij"
KEY_A2 = "lp_alice-key-2-0123456789abcdefgh"
KEY_B = "lp_bob-key-0123456789abcdefghijkl"
KEY_C = "lp_carol-key-0123456789abcdefghij"
ALL_KEYS = (KEY_A, KEY_A2, KEY_B, KEY_C)


def caller(name: str, **kw: Any) -> CallerConfig:
    return CallerConfig(name=name, **kw)


def raw(key: str) -> bytes:
    """A key's digest as ``parse_keys`` returns it."""
    return bytes.fromhex(key_hash(key).removeprefix("sha256:"))


_mtime = [1_700_000_000_000_000_000]


def write(path: Path, text: str | bytes) -> None:
    """Write a key file and give it a new modification time, as an edit seconds later
    would: the keyring notices a change by the file's identity (mtime, size, inode), and
    two writes within one filesystem timestamp tick would otherwise look alike."""
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    _mtime[0] += 1_000_000_000
    os.utime(path, ns=(_mtime[0], _mtime[0]))


def no_key_in(text: str) -> None:
    for key in ALL_KEYS:
        assert key not in text
        assert key[3:19] not in text  # nor a part of one


# ---- parse_keys -----------------------------------------------------------------------------


def test_parse_keys_reads_keys_separators_comments_and_hashes() -> None:
    """B13: one key a line, or several separated by commas or spaces; ``#`` comments;
    ``sha256:HEX`` lines (any case) stand for a key without holding it."""
    text = (
        "# alice's keys\n"
        f"{KEY_A}\n"
        f"  {KEY_A2}, {KEY_B}   # rotation in progress\n"
        "\n"
        f"{key_hash(KEY_C).upper()}\n"
        f"{key_hash(KEY_C)} {KEY_A}\n"
    )
    digests, problems = parse_keys(text, "src")
    assert problems == []
    assert digests == [raw(KEY_A), raw(KEY_A2), raw(KEY_B), raw(KEY_C), raw(KEY_C), raw(KEY_A)]
    assert parse_keys("", "src") == ([], [])
    assert parse_keys("# nothing\n  \n", "src") == ([], [])


def test_parse_keys_reports_bad_lines_by_number_without_quoting_them() -> None:
    """B13: a short key, an overlong one, a bad hash: each by line number; the good lines
    still count; the message never holds the word it complains about."""
    short = "lp_short_secret"  # 15 characters
    long = "lp_" + "x" * MAX_KEY_CHARS
    wide = "lp_schl\u00fcssel-0123456789abcdef"  # no HTTP client sends it as we read it
    text = f"{KEY_A}\n{short}\n# fine\n{long}\nsha256:abc\nsha256:{'zz' * 32}\n{KEY_B}\n{wide}\n"
    digests, problems = parse_keys(text, "caller 'alice': keys.txt")
    assert digests == [raw(KEY_A), raw(KEY_B)]
    assert len(problems) == 5
    for number, problem in zip((2, 4, 5, 6, 8), problems, strict=True):
        assert problem.startswith(f"caller 'alice': keys.txt, line {number}: ")
        for word in (short, long[:20], "zz", wide[:10]):
            assert word not in problem
    assert "16 to 512 characters (this one has 15)" in problems[0]
    assert "64 hex digits" in problems[2]
    assert "printable ASCII" in problems[4]


@given(st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=40), max_size=8))
def test_parse_keys_never_quotes_its_input(words: list[str]) -> None:
    """B13: whatever a key file holds, no problem message holds a word of it long enough
    to be a key."""
    text = "\n".join(words)
    _, problems = parse_keys(text, "src")
    secret_words = [w for w in text.replace(",", " ").split() if len(w) >= 16]
    for problem in problems:
        for word in secret_words:
            assert word not in problem


def test_new_key_and_key_hash() -> None:
    """B13: new keys are 256 random bits behind ``lp_``, usable as they are; a key's hash
    line stands for it (surrounding whitespace aside)."""
    keys = {new_key() for _ in range(50)}
    assert len(keys) == 50
    for key in keys:
        assert key.startswith("lp_") and len(key) == 46
        assert parse_keys(key, "k") == ([raw(key)], [])
        assert key_hash(f"  {key}\n") == key_hash(key)


# ---- Keyring: loading -----------------------------------------------------------------------


def test_keyring_loads_keys_from_a_variable_and_from_files(tmp_path: Path) -> None:
    """B13: keys from an environment variable (several, comma-separated) and from files
    (relative paths against ``base_dir``; hash lines); each key is its caller's."""
    (tmp_path / "keys").mkdir()
    write(tmp_path / "keys" / "bob", f"{KEY_B}\n")
    write(tmp_path / "carol.keys", f"# carol\n{key_hash(KEY_C)}\n")
    ring = Keyring(
        [
            caller("alice", key_env="ALICE_KEYS"),
            caller("bob", key_file="keys/bob"),
            caller("carol", key_file=str(tmp_path / "carol.keys"), classes=["interactive"]),
        ],
        {"ALICE_KEYS": f"{KEY_A},{KEY_A2}"},
        TOKEN,
        base_dir=tmp_path,
    )
    assert len(ring) == 4
    assert ring.lookup(KEY_A) == KeyedCaller("alice", ("batch",), "downgrade")
    assert ring.lookup(f"  {KEY_A2}\t") == ring.lookup(KEY_A)
    assert ring.lookup(KEY_B) == KeyedCaller("bob", ("batch",), "downgrade")
    assert ring.lookup(KEY_C.encode()) == KeyedCaller("carol", ("interactive",), "downgrade")
    for other in (TOKEN, KEY_A + "x", KEY_A[:-1], KEY_A.upper(), "", None, "x" * 10_000):
        assert ring.lookup(other) is None


def test_keyring_relative_key_file_without_base_dir_is_the_working_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B13: without ``base_dir`` a relative ``key_file`` is read where the service runs."""
    write(tmp_path / "bob.keys", KEY_B)
    monkeypatch.chdir(tmp_path)
    assert Keyring([caller("bob", key_file="bob.keys")], {}).lookup(KEY_B) is not None


def _bad_configs(tmp_path: Path) -> list[tuple[list[CallerConfig], dict[str, str], list[str]]]:
    """(callers, environment, what the message must name) for each start-up problem."""
    (tmp_path / "empty").write_text("# no key yet\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe" + KEY_A.encode())
    (tmp_path / "short").write_text(f"{KEY_A}\nlp_tooshort\n")
    (tmp_path / "adir").mkdir()
    (tmp_path / "bob").write_text(f"{KEY_B}\n{KEY_A}\n")
    (tmp_path / "carol").write_text(f"{KEY_C}\n{TOKEN}\n")
    return [
        ([caller("alice", key_env="ALICE_KEY")], {}, ["alice", "ALICE_KEY", "not set"]),
        ([caller("alice", key_env="ALICE_KEY")], {"ALICE_KEY": ""}, ["alice", "ALICE_KEY"]),
        ([caller("alice", key_env="ALICE_KEY")], {"ALICE_KEY": " # "}, ["alice", "no key"]),
        ([caller("alice", key_file="missing")], {}, ["alice", "missing", "cannot read"]),
        ([caller("alice", key_file="adir")], {}, ["alice", "adir", "cannot read"]),
        ([caller("alice", key_file="binary")], {}, ["alice", "binary", "not UTF-8"]),
        ([caller("alice", key_file="empty")], {}, ["alice", "empty", "no key"]),
        ([caller("alice", key_file="short")], {}, ["alice", "short", "line 2"]),
        (
            [caller("alice", key_env="ALICE_KEY"), caller("bob", key_file="bob")],
            {"ALICE_KEY": KEY_A},
            ["'alice'", "$ALICE_KEY", "'bob'", str(tmp_path / "bob"), "same key"],
        ),
        (
            [caller("alice", key_env="ALICE_KEY"), caller("carol", key_file="carol")],
            {"ALICE_KEY": KEY_A},
            ["'carol'", str(tmp_path / "carol"), "LUFTPAUSE_TOKEN"],
        ),
        (
            [caller("alice", key_env="ALICE_KEY")],
            {"ALICE_KEY": f"{KEY_A} {TOKEN}"},
            ["'alice'", "$ALICE_KEY", "LUFTPAUSE_TOKEN"],
        ),
    ]


def test_keyring_start_problems_name_the_caller_and_source_never_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """B13: an unset variable, an unreadable file, no key, a bad line, one key given to two
    callers or a key equal to the token: ConfigError naming the caller and where its keys
    come from, and no key."""
    caplog.set_level(logging.DEBUG)
    for callers, environ, named in _bad_configs(tmp_path):
        with pytest.raises(ConfigError) as info:
            Keyring(callers, environ, TOKEN, base_dir=tmp_path)
        message = str(info.value)
        for part in named:
            assert part in message, (message, part)
        no_key_in(message)
        no_key_in(TOKEN)  # the token is no key, but must not be quoted either
        assert TOKEN not in message
    no_key_in(caplog.text)
    assert TOKEN not in caplog.text


def test_a_key_may_be_given_to_one_caller_twice(tmp_path: Path) -> None:
    """B13: the same key in a caller's variable and its file (mid-rotation) is no conflict."""
    write(tmp_path / "alice", KEY_A)
    ring = Keyring(
        [caller("alice", key_env="K", key_file="alice")], {"K": KEY_A}, TOKEN, base_dir=tmp_path
    )
    assert len(ring) == 1 and ring.lookup(KEY_A) is not None


def test_gate_for_builds_a_keyring_only_for_callers() -> None:
    """D9, X2, B13: no callers, no keyring (the token alone, or nothing, guards)."""
    assert gate_for([], {}, None).open
    plain = gate_for([], {}, TOKEN)
    assert plain.keyring is None and not plain.open
    keyed = gate_for([caller("alice", key_env="K")], {"K": KEY_A}, TOKEN)
    assert keyed.keyring is not None and keyed.principal(f"Bearer {KEY_A}", None) is not None
    with pytest.raises(ConfigError):
        gate_for([caller("alice", key_env="K")], {"K": TOKEN}, TOKEN)


# ---- Keyring: reloading ---------------------------------------------------------------------


def _ring(tmp_path: Path, clock: Clock, **files: str) -> Keyring:
    for name, text in files.items():
        write(tmp_path / name, text)
    return Keyring(
        [caller(name, key_file=name) for name in files],
        {},
        TOKEN,
        clock=clock,
        base_dir=tmp_path,
    )


def test_a_changed_key_file_is_read_again_at_most_every_check_period(tmp_path: Path) -> None:
    """B13: a rotation - add the new key, hand it out, remove the old - takes effect
    without a restart, seen on a lookup once ``CHECK_EVERY_S`` has passed."""
    clock = Clock()
    ring = _ring(tmp_path, clock, alice=KEY_A)
    write(tmp_path / "alice", f"{KEY_A}\n{KEY_A2}\n")
    clock.now += CHECK_EVERY_S / 2
    assert ring.lookup(KEY_A2) is None  # not checked yet
    clock.now += CHECK_EVERY_S / 2
    assert ring.lookup(KEY_A2) is not None and ring.lookup(KEY_A) is not None
    write(tmp_path / "alice", f"{KEY_A2}\n")
    clock.now += CHECK_EVERY_S
    assert ring.lookup(KEY_A) is None and ring.lookup(KEY_A2) is not None


def test_reload_reads_the_files_now(tmp_path: Path) -> None:
    """B13: ``reload`` (SIGHUP) does not wait for the check period."""
    clock = Clock()
    ring = _ring(tmp_path, clock, alice=KEY_A)
    write(tmp_path / "alice", KEY_A2)
    assert ring.reload() == []
    assert ring.lookup(KEY_A2) is not None and ring.lookup(KEY_A) is None


def test_a_broken_key_file_keeps_the_previous_keys_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """B13: a half-written file, a bad line or a vanished file must not lock a caller out:
    its previous keys stay, and the log names the caller and the file, never a key."""
    caplog.set_level(logging.DEBUG, logger="luftpause.callers")
    clock = Clock()
    ring = _ring(tmp_path, clock, alice=KEY_A)
    path = tmp_path / "alice"
    for broken in (f"{KEY_A2}\n{KEY_A2[:10]}", b"\xff" + KEY_A2.encode(), None):
        caplog.clear()
        if broken is None:
            path.unlink()
        else:
            write(path, broken)
        clock.now += CHECK_EVERY_S
        assert ring.lookup(KEY_A) is not None and ring.lookup(KEY_A2) is None
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert errors, broken
        assert "'alice'" in errors[0].getMessage() and str(path) in errors[0].getMessage()
        assert "previous keys stay" in errors[0].getMessage()
        no_key_in(caplog.text)
    write(path, KEY_A2)  # fixed: the new keys apply
    clock.now += CHECK_EVERY_S
    assert ring.lookup(KEY_A) is None and ring.lookup(KEY_A2) is not None


def test_a_broken_file_is_logged_once_not_at_every_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """B13: an unchanged broken file is not read (nor logged) again at each check."""
    clock = Clock()
    ring = _ring(tmp_path, clock, alice=KEY_A)
    write(tmp_path / "alice", "lp_short")
    caplog.set_level(logging.ERROR, logger="luftpause.callers")
    for _ in range(3):
        clock.now += CHECK_EVERY_S
        ring.lookup(KEY_A)
    assert len(caplog.records) == 1


def test_a_readable_file_without_keys_revokes_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """B13: emptying a key file revokes its keys (a leaked key is cut off without a
    restart); a key the caller also has in its variable stays."""
    caplog.set_level(logging.WARNING, logger="luftpause.callers")
    clock = Clock()
    write(tmp_path / "alice", f"{KEY_A}\n{KEY_A2}\n")
    ring = Keyring(
        [caller("alice", key_env="ALICE_KEY", key_file="alice")],
        {"ALICE_KEY": KEY_A2},
        TOKEN,
        clock=clock,
        base_dir=tmp_path,
    )
    write(tmp_path / "alice", "# revoked\n")
    clock.now += CHECK_EVERY_S
    assert ring.lookup(KEY_A) is None and ring.lookup(KEY_A2) is not None
    assert "'alice'" in caplog.text and "revoked" in caplog.text
    no_key_in(caplog.text)


def test_a_reload_conflict_keeps_that_file_out_and_applies_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """B13: a file that would give another caller's key (or the token) is not applied and
    is logged; other files changed at the same moment still are - a revocation is never
    held back by someone else's mistake."""
    caplog.set_level(logging.ERROR, logger="luftpause.callers")
    clock = Clock()
    ring = _ring(tmp_path, clock, alice=KEY_A, bob=KEY_B, carol=KEY_C)
    write(tmp_path / "bob", f"{KEY_B}\n{KEY_A}\n")  # bob would get alice's key
    write(tmp_path / "carol", "")  # carol's key revoked
    clock.now += CHECK_EVERY_S
    assert ring.lookup(KEY_C) is None
    assert ring.lookup(KEY_A) == KeyedCaller("alice", ("batch",), "downgrade")
    assert ring.lookup(KEY_B) is not None
    assert "'alice'" in caplog.text and "'bob'" in caplog.text and "same key" in caplog.text
    write(tmp_path / "alice", TOKEN)
    assert any("LUFTPAUSE_TOKEN" in p for p in ring.reload())
    assert ring.lookup(KEY_A) is not None
    no_key_in(caplog.text)
    assert TOKEN not in caplog.text


def test_a_key_may_move_between_callers_in_one_reload(tmp_path: Path) -> None:
    """B13: moving a key from one caller's file to another's in one change applies both
    files, whichever is read first."""
    clock = Clock()
    ring = _ring(tmp_path, clock, alice=f"{KEY_A}\n{KEY_C}\n", bob=KEY_B)
    write(tmp_path / "bob", f"{KEY_B}\n{KEY_C}\n")  # bob is read after alice...
    write(tmp_path / "alice", KEY_A)
    assert ring.reload() == []
    assert ring.lookup(KEY_C) == KeyedCaller("bob", ("batch",), "downgrade")
    write(tmp_path / "alice", f"{KEY_A}\n{KEY_B}\n")  # ...and the other way round
    write(tmp_path / "bob", KEY_C)
    assert ring.reload() == []
    assert ring.lookup(KEY_B) == KeyedCaller("alice", ("batch",), "downgrade")


def test_variables_are_read_once(tmp_path: Path) -> None:
    """B13: keys from a variable are read at start; a keyring without files never checks."""
    environ = {"K": KEY_A}
    clock = Clock()
    ring = Keyring([caller("alice", key_env="K")], environ, TOKEN, clock=clock)
    environ["K"] = KEY_A2
    clock.now += 10 * CHECK_EVERY_S
    assert ring.reload() == []
    assert ring.lookup(KEY_A) is not None and ring.lookup(KEY_A2) is None


# ---- SIGHUP ---------------------------------------------------------------------------------


def test_sighup_reloads_the_key_files(tmp_path: Path) -> None:
    """B13: ``install_reload_signal`` makes SIGHUP re-read the key files at once (the
    keyring's clock stands still here, so only the signal can reload them)."""
    clock = Clock()
    ring = _ring(tmp_path, clock, alice=KEY_A)
    gate = Gate(TOKEN, ring)
    caught: list[int] = []
    # A fallback, so that a broken install fails this test instead of killing pytest.
    previous = signal.signal(signal.SIGHUP, lambda sig, _frame: caught.append(sig))

    async def scenario() -> None:
        install_reload_signal(gate)
        write(tmp_path / "alice", KEY_A2)
        os.kill(os.getpid(), signal.SIGHUP)
        async with asyncio.timeout(10):
            while ring.lookup(KEY_A2) is None:
                await asyncio.sleep(0.01)

    try:
        asyncio.run(scenario())
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert caught == []
    assert ring.lookup(KEY_A) is None


def test_install_reload_signal_off_the_main_thread_or_without_callers_does_nothing(
    tmp_path: Path,
) -> None:
    """B13: where a signal handler cannot be installed, files are still checked by time;
    a gate without callers installs nothing."""
    ring = _ring(tmp_path, Clock(), alice=KEY_A)
    failures: list[BaseException] = []

    def elsewhere() -> None:
        try:
            asyncio.run(_install(Gate(TOKEN, ring)))
        except BaseException as exc:  # reported below
            failures.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and failures == []

    async def plain() -> bool:
        install_reload_signal(Gate(TOKEN, None))
        return asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    assert asyncio.run(plain()) is False


async def _install(gate: Gate) -> None:
    install_reload_signal(gate)


# ---- Gate -----------------------------------------------------------------------------------


def _gate(tmp_path: Path) -> Gate:
    write(tmp_path / "bob", KEY_B)
    return gate_for(
        [caller("alice", key_env="ALICE_KEY"), caller("bob", key_file="bob")],
        {"ALICE_KEY": f"{KEY_A} {KEY_A2}"},
        TOKEN,
        base_dir=tmp_path,
    )


def test_an_open_gate_trusts_everything() -> None:
    """D9: neither a token nor callers: every request is trusted, as before."""
    gate = Gate(None, None)
    assert gate.open
    for auth in (None, "", "Bearer anything", b"junk"):
        assert gate.principal(auth, None) is TRUSTED
        assert gate.principal(None, auth) is TRUSTED


def test_a_token_gate_takes_the_token_only() -> None:
    """D9, X2: with the token alone, the token (as a bearer in any case of the scheme, or
    as ``x-api-key``) is trusted and anything else refused."""
    gate = Gate(TOKEN, None)
    assert not gate.open
    for auth in (
        f"Bearer {TOKEN}",
        f"bearer {TOKEN}",
        f"BEARER  {TOKEN} ",
        f"Bearer {TOKEN}".encode(),
    ):
        assert gate.principal(auth, None) is TRUSTED
    assert gate.principal(None, f" {TOKEN} ") is TRUSTED
    assert gate.principal(None, TOKEN.encode()) is TRUSTED
    for auth in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer {KEY_A}"):
        assert gate.principal(auth, None) is None
    for api_key in (None, "", f"{TOKEN}x", f"Bearer {TOKEN}", KEY_A):
        assert gate.principal(None, api_key) is None


def test_a_keyed_gate_tells_each_caller_from_its_key(tmp_path: Path) -> None:
    """B13: a caller's key (bearer, any case of the scheme, or ``x-api-key``) is that
    caller, never another; the token is trusted; anything else is refused."""
    gate = _gate(tmp_path)
    alice = KeyedCaller("alice", ("batch",), "downgrade")
    bob = KeyedCaller("bob", ("batch",), "downgrade")
    for key, who in ((KEY_A, alice), (KEY_A2, alice), (KEY_B, bob)):
        for auth in (
            f"Bearer {key}",
            f"bEaReR {key}",
            f" Bearer   {key}  ",
            f"Bearer {key}".encode(),
        ):
            assert gate.principal(auth, None) == who
        assert gate.principal(None, key) == who
        assert gate.principal(None, f"\t{key} ".encode()) == who
        # a refused bearer falls back to x-api-key; a good bearer wins over it
        assert gate.principal("Bearer nobody-at-all-here", key) == who
        assert gate.principal(f"Bearer {key}", KEY_B if who is alice else KEY_A) == who
    assert gate.principal(f"Bearer {TOKEN}", None) is TRUSTED
    assert gate.principal(None, TOKEN) is TRUSTED
    assert gate.principal(f"Bearer {TOKEN}", KEY_A) is TRUSTED
    for auth in (None, "", KEY_A, f"Basic {KEY_A}", f"Bearer {KEY_C}", f"Bearer{KEY_A}"):
        assert gate.principal(auth, None) is None
    assert gate.principal(None, KEY_C) is None
    assert gate.principal(None, "") is None


_SCHEMES = st.sampled_from(["Bearer", "bearer", "BEARER", "bEaReR", "Basic", "Token", ""])
_SPACE = st.sampled_from(["", " ", "  ", "\t", "\n", "\x0b", "\u00a0"])
_NEAR = st.sampled_from([*ALL_KEYS[:3], TOKEN, KEY_C, KEY_A + "x", KEY_A[:-1], KEY_B.upper()])


def _credential(draw: st.DrawFn, header: bool) -> str | bytes | None:
    kind = draw(st.sampled_from(["none", "text", "bytes", "near"]))
    if kind == "none":
        return None
    if kind == "text":
        return draw(st.text(max_size=80))
    if kind == "bytes":
        return draw(st.binary(max_size=80))
    value = draw(_SPACE) + draw(_NEAR) + draw(_SPACE)
    if header:
        value = draw(_SCHEMES) + draw(st.sampled_from([" ", "  ", ""])) + value
    return value.encode("utf-8") if draw(st.booleans()) else value


@st.composite
def _credentials(draw: st.DrawFn) -> tuple[str | bytes | None, str | bytes | None]:
    return _credential(draw, True), _credential(draw, False)


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _expected(auth: str | bytes | None, api_key: str | bytes | None) -> object:
    """What the gate must say, from first principles: the presented values, stripped."""
    presented = []
    if auth is not None:
        scheme, _, value = _text(auth).strip().partition(" ")
        if scheme.lower() == "bearer":
            presented.append(value.strip())
    if api_key is not None:
        presented.append(_text(api_key).strip())
    if TOKEN in presented:
        return TRUSTED
    owners = {KEY_A: "alice", KEY_A2: "alice", KEY_B: "bob"}
    for value in presented:
        if value in owners:
            return owners[value]
    return None


@settings(max_examples=400, deadline=None)
@given(_credentials())
def test_fuzz_a_credential_resolves_only_if_it_is_a_key_or_the_token(
    credentials: tuple[str | bytes | None, str | bytes | None],
) -> None:
    """B13, D9, X2: arbitrary text or bytes as ``Authorization`` or ``x-api-key`` never
    raise, and resolve to a caller only when one of them is exactly that caller's key
    (surrounding whitespace aside), to trusted only when it is the token."""
    auth, api_key = credentials
    got = GATE.principal(auth, api_key)
    expected = _expected(auth, api_key)
    if isinstance(got, KeyedCaller):
        assert got.name == expected
    else:
        assert got is expected


# Built once: hypothesis forbids function-scoped fixtures in @given tests.
GATE = gate_for(
    [caller("alice", key_env="ALICE_KEY"), caller("bob", key_env="BOB_KEY")],
    {"ALICE_KEY": f"{KEY_A},{KEY_A2}", "BOB_KEY": KEY_B},
    TOKEN,
)


# Any text, lone surrogates (category Cs) drawn often enough to be tried.
ANY_TEXT = st.text(
    st.one_of(st.characters(exclude_categories=()), st.characters(categories=["Cs"])), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(ANY_TEXT, ANY_TEXT, st.sampled_from(["", "Bearer ", "bearer  "]))
def test_fuzz_any_text_is_looked_up_without_an_error(text: str, other: str, scheme: str) -> None:
    """B13, D9: any text, lone surrogates included (no HTTP header holds one, but a
    caller of the gate may pass anything), is refused or resolved, never an error."""
    assert GATE.keyring is not None
    assert GATE.keyring.lookup(text) is None
    assert GATE.principal(scheme + text, other) is None
    assert GATE.principal(scheme + text, KEY_B) == KeyedCaller("bob", ("batch",), "downgrade")
    assert GATE.principal(scheme + text, TOKEN) is TRUSTED


# ---- served_class ---------------------------------------------------------------------------


def test_served_class_downgrades_or_refuses_per_caller() -> None:
    """B13: a keyed caller gets a class it may use as asked; another class is downgraded
    (to batch when it may use batch, else its first class) and reported as denied, or
    refused with a message naming the caller and what it may use. Trusted gets what it
    asks for."""
    batch_only = KeyedCaller("alice", ("batch",), "downgrade")
    both = KeyedCaller("bob", ("interactive", "batch"), "downgrade")
    interactive_only = KeyedCaller("carol", ("interactive",), "downgrade")
    assert served_class(batch_only, "batch") == ("batch", None)
    assert served_class(batch_only, "interactive") == ("batch", "interactive")
    assert served_class(both, "interactive") == ("interactive", None)
    assert served_class(both, "batch") == ("batch", None)
    assert served_class(both, "realtime") == ("batch", "realtime")  # batch first, if allowed
    assert served_class(interactive_only, "batch") == ("interactive", "batch")
    assert served_class(KeyedCaller("dan", ("interactive", "batch"), "refuse"), "batch") == (
        "batch",
        None,
    )
    for cls in ("interactive", "batch"):
        assert served_class(TRUSTED, cls) == (cls, None)
    refusing = KeyedCaller("erin", ("batch",), "refuse")
    with pytest.raises(ClassDenied) as info:
        served_class(refusing, "interactive")
    assert "'erin'" in str(info.value) and "interactive" in str(info.value)
    assert "may use: batch" in str(info.value)
    assert DENIED_HEADER == "x-luftpause-class-denied"


# ---- caller_of ------------------------------------------------------------------------------


def test_trusted_caller_is_the_header_cut_to_max_bytes() -> None:
    """B13: a trusted request is whoever its header says (``""``: the anonymous caller),
    cut to ``max_bytes`` of UTF-8, never inside a character."""
    assert caller_of(TRUSTED, "  anyone/at-all ", 128) == "anyone/at-all"
    assert caller_of(TRUSTED, "", 128) == ""
    assert caller_of(TRUSTED, "x" * 200, 128) == "x" * 128
    assert caller_of(TRUSTED, "ab" + "é" * 10, 5) == "abé"  # 4 bytes, not 5
    assert caller_of(TRUSTED, "€€", 5) == "€"
    assert cut_utf8("ab€", 4) == "ab" and cut_utf8("ab€", 5) == "ab€"
    assert cut_utf8("anything", 0) == ""


def test_keyed_caller_may_only_name_a_sub_caller_under_it() -> None:
    """B13: a keyed request is its caller, or a sub-caller under it: ``ci`` and
    ``NAME/ci`` are ``NAME/ci``; another caller's name is a sub-caller of this one too."""
    alice = KeyedCaller("alice", ("batch",), "downgrade")
    assert caller_of(alice, "", 128) == "alice"
    assert caller_of(alice, "  alice ", 128) == "alice"
    assert caller_of(alice, "ci", 128) == "alice/ci"
    assert caller_of(alice, "alice/ci", 128) == "alice/ci"
    assert caller_of(alice, "bob", 128) == "alice/bob"
    assert caller_of(alice, "bob/ci", 128) == "alice/bob/ci"
    assert caller_of(alice, "alicebob", 128) == "alice/alicebob"
    assert caller_of(alice, "alice/", 128) == "alice"
    assert caller_of(alice, "/", 128) == "alice"
    assert caller_of(alice, "ci\x00\x1b[31m\n", 128) == "alice/ci??[31m"
    assert caller_of(alice, "alice/\u200b", 128) == "alice/?"


def test_a_keyed_caller_is_never_cut_into_another_name_or_an_empty_sub_caller() -> None:
    """B13: cutting to ``max_bytes`` keeps the caller's own name whole, and never leaves
    ``NAME/`` with nothing after it (a multi-byte first character that does not fit)."""
    alice = KeyedCaller("alice", ("batch",), "downgrade")
    assert caller_of(alice, "é", 7) == "alice"  # "alice/" + 2 bytes > 7
    assert caller_of(alice, "é", 8) == "alice/é"
    assert caller_of(alice, "ci/x", 9) == "alice/ci"  # never "alice/ci/"
    assert caller_of(alice, "c i", 8) == "alice/c"  # never "alice/c "
    assert caller_of(alice, "ci", 3) == "alice"  # the name is never cut


@settings(max_examples=400, deadline=None)
@given(
    st.from_regex(r"[A-Za-z0-9_.:-]{1,64}", fullmatch=True),
    st.text(st.characters(exclude_categories=()), max_size=200),
    st.integers(min_value=0, max_value=300),
)
def test_fuzz_keyed_caller_of(name: str, claimed: str, max_bytes: int) -> None:
    """B13: whatever a keyed request claims, it runs as its caller or a sub-caller of it:
    printable, never an empty sub-caller, within ``max_bytes`` whenever the name fits."""
    got = caller_of(KeyedCaller(name, ("batch",), "downgrade"), claimed, max_bytes)
    assert got == name or (got.startswith(name + "/") and got[len(name) + 1 :].strip("/ "))
    assert got.isprintable()
    assert len(got.encode()) <= max(max_bytes, len(name))
    if got != name:
        assert got == got.rstrip("/ ")


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(exclude_categories=()), max_size=200), st.integers(0, 300))
def test_fuzz_trusted_caller_of(claimed: str, max_bytes: int) -> None:
    """B13: a trusted claim is its header, stripped and cut to ``max_bytes`` of UTF-8 at a
    character boundary (at most 3 bytes short), whatever it holds; a lone surrogate, which
    UTF-8 cannot hold, is a ``?``."""
    got = caller_of(TRUSTED, claimed, max_bytes)
    whole = "".join("?" if 0xD800 <= ord(c) <= 0xDFFF else c for c in claimed.strip())
    size = len(got.encode("utf-8"))
    assert whole.startswith(got)
    assert size <= max_bytes
    assert got == whole or size > max_bytes - 4
