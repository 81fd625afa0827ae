"""B13, R4, R8: the runtime's pure rules for callers bound to keys - whose a new run is,
the caller its turns carry, the class it is served in, who sees it - and the spawn
record that keeps them across a restart (replay), idempotency keys per caller."""

from __future__ import annotations

import json
from typing import Any

import pytest

from luftpause.callers import TRUSTED, ClassDenied, KeyedCaller
from luftpause.runtime.core import Run, RunSpec, RuntimeState, encode, parse, replay
from luftpause.runtime.loop import caller_for, class_for, owner_for, visible_to

ALICE = KeyedCaller("alice", ("interactive", "batch"), "downgrade")
BOB = KeyedCaller("bob", ("batch",), "downgrade")
CAROL = KeyedCaller("carol", ("batch",), "refuse")
SPEC = {"task": "t", "model": "m", "serviceClass": "batch", "maxToolCalls": 8}


def run(owner: str | None, caller: str = "c") -> Run:
    return Run(id="r", spec=RunSpec(task="t", model="m"), parent=None, caller=caller,
               created=0.0, owner=owner)  # fmt: skip


def test_a_keyed_caller_owns_its_runs_and_the_token_its_parents_owner() -> None:
    """B13: a key's run is its caller's; the token's run is its parent's owner's (a
    sub-agent stays in its tree's hands), else nobody's."""
    assert owner_for(ALICE, None) == "alice"
    assert owner_for(ALICE, run("alice")) == "alice"
    assert owner_for(TRUSTED, None) is None
    assert owner_for(TRUSTED, run("bob")) == "bob"
    assert owner_for(TRUSTED, run(None)) is None


def test_the_caller_a_run_carries() -> None:
    """B13, R4: a key's run carries its caller's name, whatever the client calls itself;
    the token's keeps the request's own caller (its MCP session or client name, R4),
    except under a keyed caller's run, whose caller it inherits."""
    assert caller_for(ALICE, None, "client:claude") == "alice"
    assert caller_for(TRUSTED, None, "client:claude") == "client:claude"
    assert caller_for(TRUSTED, run(None, "session-1"), "session-2") == "session-2"
    assert caller_for(TRUSTED, run("bob", "bob"), "session-2") == "bob"


def test_a_keyed_caller_sees_only_its_own_runs() -> None:
    """B13: a key sees its caller's runs only (not the token's, not another caller's);
    the token sees every run."""
    assert visible_to(ALICE, run("alice"))
    assert not visible_to(ALICE, run("bob"))
    assert not visible_to(ALICE, run(None))
    assert all(visible_to(TRUSTED, run(owner)) for owner in ("alice", "bob", None))


@pytest.mark.parametrize(
    ("principal", "asked", "default", "served"),
    [
        (TRUSTED, "interactive", "batch", ("interactive", None)),
        (TRUSTED, None, "interactive", ("interactive", None)),
        (ALICE, "interactive", "batch", ("interactive", None)),
        (ALICE, None, "interactive", ("interactive", None)),
        (BOB, "interactive", "interactive", ("batch", "interactive")),
        (BOB, "batch", "interactive", ("batch", None)),
        (BOB, None, "interactive", ("batch", None)),
        (CAROL, None, "interactive", ("batch", None)),
        (CAROL, "batch", "interactive", ("batch", None)),
    ],
)
def test_the_class_a_run_is_served_in(
    principal: Any, asked: str | None, default: str, served: tuple[str, str | None]
) -> None:
    """B13: a class asked for is granted, or downgraded with the denied class named; the
    default (not asked for) falls back to a class the caller may use, denying nothing."""
    assert class_for(principal, asked, default) == served


def test_a_class_a_refusing_caller_may_not_use_is_refused() -> None:
    """B13: ``on_denied_class = "refuse"``: asking for a class the key may not use is
    refused, naming the caller, the class and the classes it may use."""
    with pytest.raises(ClassDenied, match="'carol' may not use the interactive class"):
        class_for(CAROL, "interactive", "batch")


def spawn(run_id: str, owner: str | None, key: str | None = "job-1", **extra: Any) -> bytes:
    record: dict[str, Any] = {"t": "spawn", "run": run_id, "spec": SPEC, "created": 1.0,
                              "caller": owner or "session", "idempotencyKey": key,
                              "requestDigest": "d", **extra}  # fmt: skip
    if owner is not None:
        record["owner"] = owner
    return json.dumps(record).encode()


def test_owner_and_denied_class_survive_the_journal_and_keys_are_per_owner() -> None:
    """B13, R8: a spawn record's owner and denied class survive encode, parse and replay;
    the same idempotency key binds one run per owner (each caller's, and the token's);
    a record without them (an older journal) is the token's, with nothing denied."""
    record = parse(spawn("a1", "alice", classDenied="interactive"))
    assert parse(encode(record)) == record
    state = RuntimeState()
    lines = [spawn("a1", "alice", classDenied="interactive"), spawn("b1", "bob"),
             spawn("t1", None), spawn("a2", "alice"), spawn("old", None, key=None)]  # fmt: skip
    report = replay(state, list(enumerate(lines, 1)))
    assert not report.problems
    a1 = state.runs["a1"]
    assert (a1.owner, a1.caller, a1.class_denied) == ("alice", "alice", "interactive")
    assert (state.runs["old"].owner, state.runs["old"].class_denied) == (None, None)
    found = {owner: state.run_for_key("job-1", owner) for owner in ("alice", "bob", None)}
    assert {owner: r.id if r else None for owner, r in found.items()} == {
        "alice": "a1",
        "bob": "b1",
        None: "t1",
    }
    assert state.run_for_key("job-1", "carol") is None
