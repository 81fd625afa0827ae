"""B13: ``luftpause keys`` makes keys whose ``[[callers]]`` entries load as they print,
hashes keys for key files, and checks a stack's callers as a service would - printing a
key once, from ``keys new``, and never anywhere else."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from luftpause import cli, keys_cli
from luftpause.callers import Keyring, key_hash
from luftpause.config import CallerConfig, parse_config

TOKEN = "services-own-token-0123456789"
BOB_KEY = "lp_bob-key-0123456789abcdefghijkl"


def keys(
    *argv: str, environ: dict[str, str] | None = None, stdin: bytes = b""
) -> tuple[int, str, str]:
    """Run ``luftpause keys ARGV`` in process: (exit status, stdout, stderr)."""
    parser, _ = cli.build_parser("keys")
    args = parser.parse_args(["keys", *argv])
    out, err = io.StringIO(), io.StringIO()
    rc = keys_cli.run(args, environ or {}, io.BytesIO(stdin), out, err)
    return rc, out.getvalue(), err.getvalue()


def run(
    *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "luftpause", "keys", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def entry(stderr: str) -> CallerConfig:
    """The ``[[callers]]`` entry ``keys new`` printed, loaded as the stack file would be."""
    (caller,) = parse_config(tomllib.loads(stderr), "pasted").callers
    return caller


def the_key(stdout: str) -> str:
    assert stdout.endswith("\n") and stdout.count("\n") == 1, stdout
    key = stdout.strip()
    assert key.startswith("lp_") and len(key) == 46
    return key


# ---- keys new -------------------------------------------------------------------------------


def test_new_prints_the_key_once_and_an_entry_that_loads() -> None:
    """B13: the key alone on stdout; on stderr an entry (batch only) naming the variable to
    put it in, which loads, and whose keyring knows the key; the key nowhere else."""
    rc, out, err = keys("new", "alice.ci-1")
    assert rc == 0
    key = the_key(out)
    assert key not in err
    caller = entry(err)
    assert caller.name == "alice.ci-1" and caller.classes == ("batch",)
    assert caller.key_env == "LUFTPAUSE_KEY_ALICE_CI_1" and caller.key_file is None
    assert 'grant interactive with ["interactive", "batch"]' in err
    ring = Keyring([caller], {"LUFTPAUSE_KEY_ALICE_CI_1": key}, TOKEN)
    found = ring.lookup(key)
    assert found is not None and found.name == "alice.ci-1"
    rc, out2, err2 = keys("new", "alice", "--env", "ALICE_KEY")
    assert entry(err2).key_env == "ALICE_KEY" and the_key(out2) != key


def test_new_file_appends_to_a_private_file_and_rotates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B13: ``--file`` creates the key file with mode 0600 and appends the key (after a
    newline if the file lacks one); the entry names the file by its absolute path; a
    second key into the same file is a rotation: both keys are the caller's."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = keys("new", "alice", "--file", "alice.keys")
    assert rc == 0
    first = the_key(out)
    path = tmp_path / "alice.keys"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == first + "\n"
    caller = entry(err)
    assert caller.key_file == str(path) and caller.key_env is None
    with path.open("a") as f:
        f.write("# rotating")  # no newline at the end
    rc, out, _ = keys("new", "alice", "--file", "alice.keys")
    second = the_key(out)
    assert path.read_text() == f"{first}\n# rotating\n{second}\n"
    ring = Keyring([caller], {}, TOKEN)
    assert len(ring) == 2 and ring.lookup(first) == ring.lookup(second) is not None


def test_new_file_hash_appends_the_hash_only(tmp_path: Path) -> None:
    """B13: ``--hash`` appends the key's ``sha256:`` line, never the key, which is still
    printed once and opens the caller's keyring; a file others may read takes hashes."""
    path = tmp_path / "alice.keys"
    path.write_text("# alice\n")
    path.chmod(0o644)
    rc, out, err = keys("new", "alice", "--file", str(path), "--hash")
    assert rc == 0
    key = the_key(out)
    assert key not in path.read_text() and key not in err
    assert path.read_text() == f"# alice\n{key_hash(key)}\n"
    assert Keyring([entry(err)], {}, TOKEN).lookup(key) is not None


def test_new_refuses_a_key_file_others_may_read(tmp_path: Path) -> None:
    """B13: a key is never added to a file others can read, nor written at all when the
    file cannot be used: one line says why, nothing is printed on stdout."""
    path = tmp_path / "alice.keys"
    path.write_text(BOB_KEY + "\n")
    path.chmod(0o640)
    rc, out, err = keys("new", "alice", "--file", str(path))
    assert (rc, out) == (2, "")
    assert err == (
        f"luftpause keys new: {path} is readable by others (mode 0640): `chmod 600 {path}` "
        "first, or pass --hash to append the key's sha256: line\n"
    )
    assert path.read_text() == BOB_KEY + "\n"
    for bad, why in (
        (tmp_path / "missing" / "k", "No such file or directory"),
        (tmp_path, "Is a directory"),
    ):
        rc, out, err = keys("new", "alice", "--file", str(bad))
        assert (rc, out) == (2, "") and err.count("\n") == 1
        assert str(bad) in err and why in err


def test_new_for_a_caller_the_stack_has_explains_the_rotation(tmp_path: Path) -> None:
    """B13: with ``--config``, a caller the stack already has gets no second entry but how
    to rotate: into its own key file, or beside its current keys."""
    (tmp_path / "alice.keys").write_text(BOB_KEY.replace("bob", "ali") + "\n")
    (tmp_path / "alice.keys").chmod(0o600)
    stack = tmp_path / "stack.toml"
    stack.write_text('[[callers]]\nname = "alice"\nkey_file = "alice.keys"\n')
    rc, out, err = keys(
        "new", "alice", "--config", str(stack), "--file", str(tmp_path / "alice.keys")
    )
    assert rc == 0 and "[[callers]]" not in err
    assert "reads this file" in err and "delete the old key's line" in err
    assert the_key(out) in (tmp_path / "alice.keys").read_text()
    rc, out, err = keys("new", "alice", "--config", str(stack))
    assert rc == 0 and "[[callers]]" not in err
    assert "is already in" in err and str(tmp_path / "alice.keys") in err
    rc, out, err = keys("new", "bob", "--config", str(stack))
    assert rc == 0 and entry(err).name == "bob"
    rc, out, err = keys("new", "bob", "--config", str(tmp_path / "nope.toml"))
    assert (rc, out) == (2, "") and "no such configuration file" in err


def test_new_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    """B13: a name a caller cannot have, a bad variable name, ``--hash`` without a file:
    exit status 2 and one line naming the problem, never a traceback or a key."""
    for args, says in (
        (["new", "alice/ci"], "'alice/ci' is not a caller name"),
        (["new", "x" * 65], "is not a caller name"),
        (["new", ""], "'' is not a caller name"),
        (["new", "alice", "--env", "1X"], "'1X' is not an environment variable name"),
        (["new", "alice", "--hash"], "--hash needs --file"),
        (["new"], "required: NAME"),
        ([], "required: ACTION"),
    ):
        out = run(*args)
        assert out.returncode == 2, args
        assert out.stdout == ""
        assert says in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip().splitlines()[-1].startswith("luftpause keys"), out.stderr


def test_new_in_a_shell_substitution() -> None:
    """B13: ``KEY=$(luftpause keys new alice)`` gets the key alone; the entry is on stderr."""
    out = run("new", "alice")
    assert out.returncode == 0
    key = the_key(out.stdout)
    assert key not in out.stderr and entry(out.stderr).name == "alice"


# ---- keys hash ------------------------------------------------------------------------------


def test_hash_prints_each_keys_hash_line() -> None:
    """B13: keys on stdin (lines, commas, comments) become ``sha256:`` lines, which a key
    file holds in their place."""
    other = "lp_other-0123456789abcdefghijklmn"
    rc, out, err = keys("hash", stdin=f"# keys\n{BOB_KEY}, {other}\n".encode())
    assert (rc, err) == (0, "")
    assert out == f"{key_hash(BOB_KEY)}\n{key_hash(other)}\n"
    rc, again, _ = keys("hash", stdin=out.encode())
    assert (rc, again) == (0, out)


def test_hash_refuses_bad_input_without_quoting_it() -> None:
    """B13: a line that is no key, text that is not UTF-8, nothing: exit status 2, one line
    naming the problem, nothing on stdout, no key quoted."""
    for stdin, says in (
        (f"{BOB_KEY}\nlp_short\n".encode(), "stdin, line 2: a key must be 16 to 512"),
        (b"\xff\xfe" + BOB_KEY.encode(), "stdin is not UTF-8 text"),
        (b"# none\n", "no key on stdin"),
        (b"", "no key on stdin"),
    ):
        rc, out, err = keys("hash", stdin=stdin)
        assert (rc, out) == (2, ""), stdin
        assert says in err and err.count("\n") == 1
        assert BOB_KEY not in err and "lp_short" not in err


# ---- keys check -----------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative key_file is from the working directory, for the services as for
    ``keys check``: the tests' stacks sit in it."""
    monkeypatch.chdir(tmp_path)


def _stack(tmp_path: Path, key_file_text: str) -> tuple[Path, str]:
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    (keys_dir / "alice").write_text(key_file_text)
    (keys_dir / "alice").chmod(0o600)
    stack = tmp_path / "stack.toml"
    stack.write_text(
        "[[callers]]\n"
        'name = "alice"\n'
        'key_file = "keys/alice"\n'
        'classes = ["interactive", "batch"]\n'
        "max_in_flight = 4\n"
        "tokens_per_minute = 10000\n"
        "daily_tokens = 2000000\n"
        "\n"
        "[[callers]]\n"
        'name = "bob"\n'
        'key_env = "BOB_KEY"\n'
        "weight = 2.5\n"
        'on_denied_class = "refuse"\n'
    )
    return stack, "keys/alice"


ALICE_1 = "lp_alice-1-0123456789abcdefghijk"
ALICE_2 = "lp_alice-2-0123456789abcdefghijk"


def test_check_shows_each_caller_as_a_service_loads_it(tmp_path: Path) -> None:
    """B13: each caller's key sources (a relative key file from the working directory),
    its number of keys, classes, weight and limits; no key shown."""
    stack, alice_file = _stack(tmp_path, f"{ALICE_1}\n{key_hash(ALICE_2)}\n{ALICE_1}\n")
    env = {"LUFTPAUSE_TOKEN": TOKEN, "BOB_KEY": BOB_KEY}
    rc, out, err = keys("check", "--config", str(stack), environ=env)
    assert (rc, err) == (0, "")
    assert out == (
        f"luftpause keys check: {stack}: 2 callers, 3 keys\n"
        "  alice\n"
        f"    keys     2: file {alice_file} (2)\n"
        "    classes  interactive, batch (a request for another is downgraded)\n"
        "    weight   1\n"
        "    limits   4 in flight, 10000 tokens/minute, 2000000 tokens/day (UTC)\n"
        "  bob\n"
        "    keys     1: $BOB_KEY (1)\n"
        "    classes  batch (a request for another is refused with a 403)\n"
        "    weight   2.5\n"
        "    limits   none\n"
    )
    for key in (ALICE_1, ALICE_2, BOB_KEY, TOKEN):
        assert key not in out


def test_check_warns_of_a_key_file_others_may_read(tmp_path: Path) -> None:
    """B13: keys in a file others may read are a warning (hash lines are not)."""
    stack, alice_file = _stack(tmp_path, f"{ALICE_1}\n")
    env = {"LUFTPAUSE_TOKEN": TOKEN, "BOB_KEY": BOB_KEY}
    Path(alice_file).chmod(0o644)
    rc, out, _ = keys("check", "--config", str(stack), environ=env)
    assert rc == 0 and f"WARNING  {alice_file} holds keys and is readable by others" in out
    Path(alice_file).write_text(key_hash(ALICE_1) + "\n")
    rc, out, _ = keys("check", "--config", str(stack), environ=env)
    assert rc == 0 and "WARNING" not in out


def test_check_reports_every_problem_a_service_would_refuse_to_start_with(
    tmp_path: Path,
) -> None:
    """B13: no token, an unset key variable, a key equal to the token, a bad key file:
    exit status 2 with each problem naming the caller and source, never a key."""
    stack, alice_file = _stack(tmp_path, f"{ALICE_1}\nlp_short\n")
    rc, out, err = keys("check", "--config", str(stack), environ={})
    assert (rc, out) == (2, "")
    assert err.startswith(f"luftpause keys check: {stack} is not usable:\n")
    assert "[[callers]] needs LUFTPAUSE_TOKEN set" in err
    assert f"caller 'alice': {alice_file}, line 2: a key must be 16 to 512" in err
    assert "caller 'bob': environment variable BOB_KEY is not set" in err
    Path(alice_file).write_text(ALICE_1)
    env = {"LUFTPAUSE_TOKEN": TOKEN, "BOB_KEY": f"{BOB_KEY},{TOKEN}"}
    rc, out, err = keys("check", "--config", str(stack), environ=env)
    assert rc == 2 and "caller 'bob': a key in $BOB_KEY equals LUFTPAUSE_TOKEN" in err
    env = {"LUFTPAUSE_TOKEN": TOKEN, "BOB_KEY": ALICE_1}
    rc, out, err = keys("check", "--config", str(stack), environ=env)
    assert rc == 2
    assert f"callers 'alice' ({alice_file}) and 'bob' ($BOB_KEY) are given the same key" in err
    for text in (out, err):
        for key in (ALICE_1, BOB_KEY, TOKEN, "lp_short"):
            assert key not in text
    rc, out, err = keys("check", "--config", str(tmp_path / "bad.toml"))
    assert rc == 2 and "no such configuration file" in err


def test_check_stdin_says_whose_key_it_is(tmp_path: Path) -> None:
    """B13: with ``--stdin``, the caller the key belongs to (exit 0), the token (0), or no
    caller (1); an empty stdin is an error (2). The key is never printed."""
    stack, _ = _stack(tmp_path, f"{ALICE_1}\n{key_hash(ALICE_2)}\n")
    env = {"LUFTPAUSE_TOKEN": TOKEN, "BOB_KEY": BOB_KEY}
    for key, rc_wanted, says in (
        (ALICE_1, 0, "belongs to caller 'alice'"),
        (f"  {ALICE_2}\n", 0, "belongs to caller 'alice'"),
        (BOB_KEY, 0, "belongs to caller 'bob'"),
        (TOKEN, 0, "is LUFTPAUSE_TOKEN, the services' own (trusted)"),
        (ALICE_1 + "x", 1, "belongs to no caller"),
        (f"{ALICE_1} {BOB_KEY}", 1, "belongs to no caller"),
    ):
        rc, out, err = keys(
            "check", "--config", str(stack), "--stdin", environ=env, stdin=key.encode()
        )
        assert (rc, err) == (rc_wanted, ""), key
        assert out.splitlines()[-1] == f"the key on stdin {says}"
        for secret in (ALICE_1, ALICE_2, BOB_KEY, TOKEN):
            assert secret not in out
    rc, out, err = keys("check", "--config", str(stack), "--stdin", environ=env, stdin=b"\n")
    assert (rc, out) == (2, "") and err == "luftpause keys check: no key on stdin\n"


def test_check_a_stack_without_callers(tmp_path: Path) -> None:
    """D9, B13: without ``[[callers]]`` the token alone (or nothing) guards the stack."""
    stack = tmp_path / "stack.toml"
    stack.write_text("")
    rc, out, _ = keys("check", "--config", str(stack), environ={"LUFTPAUSE_TOKEN": TOKEN})
    assert rc == 0 and "has no [[callers]]: LUFTPAUSE_TOKEN guards the stack" in out
    rc, out, _ = keys("check", "--config", str(stack))
    assert rc == 0 and "nothing (LUFTPAUSE_TOKEN is not set) guards" in out
    env = {"LUFTPAUSE_TOKEN": TOKEN}
    rc, out, _ = keys("check", "--config", str(stack), "--stdin", environ=env, stdin=b"x" * 20)
    assert rc == 1 and out.endswith("belongs to no caller\n")
    rc, out, _ = keys("check", "--config", str(stack), "--stdin", environ={}, stdin=b"x" * 20)
    assert rc == 1 and out.endswith("belongs to no caller\n")


def test_check_reads_the_real_environment(tmp_path: Path) -> None:
    """B13: ``luftpause keys check`` (the command, not this module's seam) loads the keys
    from the process's environment and says so by exit status."""
    stack, _ = _stack(tmp_path, f"{ALICE_1}\n")
    good = run("check", "--config", str(stack), env={"LUFTPAUSE_TOKEN": TOKEN, "BOB_KEY": BOB_KEY})
    assert good.returncode == 0 and "2 callers, 2 keys" in good.stdout, good.stderr
    whose = run(
        "check",
        "--config",
        str(stack),
        "--stdin",
        stdin=BOB_KEY,
        env={"LUFTPAUSE_TOKEN": TOKEN, "BOB_KEY": BOB_KEY},
    )
    assert whose.returncode == 0 and "belongs to caller 'bob'" in whose.stdout
    bad = run("check", "--config", str(stack), env={"LUFTPAUSE_TOKEN": TOKEN, "BOB_KEY": ""})
    assert bad.returncode == 2 and "BOB_KEY is not set" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_every_action_explains_itself_with_an_example() -> None:
    """B13: ``--help`` of each action says what it does and shows an example."""
    for action in ("new", "hash", "check"):
        out = run(action, "--help")
        assert out.returncode == 0 and "Example" in out.stdout, action
    out = run("--help")
    assert out.returncode == 0
    assert all(action in out.stdout for action in ("new", "hash", "check"))
