"""Run identity (D2, B4) and class/caller headers (D3).

A turn's run, first match wins:

1. ``x-luftpause-run-id``: the run the client names.
2. The harness's own session (B4):

   - Claude Code's ``X-Claude-Code-Session-Id``: run ``claude-code-<id>@<model>``.
     Its sub-agents add ``x-claude-code-agent-id``; each has a conversation of its
     own, so each is its own run, ``claude-code-<id>/<agent>@<model>``.
   - Codex's thread: ``thread_id`` (else ``session_id``) of
     ``x-codex-turn-metadata``, else its ``thread-id`` or ``session-id`` header:
     run ``codex-<id>@<model>``.
   - Each header of ``dataplane.session_headers``, in order: run
     ``session-<id>@<model>`` (by default OpenCode's ``x-session-affinity`` and the
     generic ``x-session-id``).

   ``<model>`` is the model the turn asks for: a harness's side requests on another
   model are conversations of their own. One harness conversation is then one run
   across its turns, and keeps its replica and its reservation while the harness
   runs a tool.
3. The ``tool_call_id`` s the turn echoes back in tool messages: every tool call
   the proxy sees going out is remembered (30 min, swept every 60 s) with its run.
4. Otherwise the turn starts a new run.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from luftpause.callers import TRUSTED, Principal, Trusted, caller_of
from luftpause.dataplane.errors import shown
from luftpause.tool_calls import RunsOfToolCalls

RUN_HEADER = "x-luftpause-run-id"
CLASS_HEADER = "x-luftpause-class"
CALLER_HEADER = "x-luftpause-caller"
# Response headers: where the turn went and how long luftpause held it.
REPLICA_HEADER = "x-luftpause-replica"
HELD_HEADER = "x-luftpause-held-ms"
CLASSES = ("interactive", "batch")
# Harnesses' own session headers (B4).
CLAUDE_CODE_SESSION_HEADER = "x-claude-code-session-id"
CLAUDE_CODE_AGENT_HEADER = "x-claude-code-agent-id"  # sent by its sub-agents
CODEX_METADATA_HEADER = "x-codex-turn-metadata"
_MAX_METADATA = 16384
MAX_RUN_ID = 256  # the scheduler's bound on IDs


# Tool call IDs sent with one Admit: the newest are the ones that name the run.
_MAX_ECHOED = 16


class BadHeader(ValueError):
    """A luftpause header has a value we cannot use; the message says which."""


def echoed_tool_call_ids(body: Mapping[str, Any]) -> list[str]:
    """tool_call_ids of the request's tool messages, newest first."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    ids = []
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "tool":
            call_id = msg.get("tool_call_id")
            if isinstance(call_id, str) and call_id:
                ids.append(call_id)
    return ids


def harness_run(
    headers: Mapping[str, str], session_headers: Sequence[str] = (), model: str = ""
) -> str | None:
    """The run a harness's own session headers name (B4), or None. The model the turn
    asks for is part of it: a harness's side requests on another model (Claude Code's
    small, fast model writing a title while a tool runs) are conversations of their
    own, and must not take the session's run off its replica or out of its pause."""
    session = headers.get(CLAUDE_CODE_SESSION_HEADER, "").strip()
    if session:
        agent = headers.get(CLAUDE_CODE_AGENT_HEADER, "").strip()
        return _run_named("claude-code", f"{session}/{agent}" if agent else session, model)
    thread = _codex_thread(headers.get(CODEX_METADATA_HEADER, ""))
    thread = thread or headers.get("thread-id", "").strip() or headers.get("session-id", "").strip()
    if thread:
        return _run_named("codex", thread, model)
    for name in session_headers:
        value = headers.get(name, "").strip()
        if value:
            return _run_named("session", value, model)
    return None


def _codex_thread(metadata: str) -> str:
    """``thread_id`` (else ``session_id``) of Codex's turn metadata JSON; "" if none
    (or if it is not JSON, or too long or deep to be Codex's)."""
    if not metadata or len(metadata) > _MAX_METADATA:
        return ""
    try:
        data = json.loads(metadata)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(data, dict):
        return ""
    for key in ("thread_id", "session_id"):
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def _run_named(harness: str, session: str, model: str) -> str:
    """``<harness>-<session>@<model>``, hashed after the harness name when too long for
    a run ID."""
    run_id = f"{harness}-{session}@{model}" if model else f"{harness}-{session}"
    if len(run_id) > MAX_RUN_ID:
        run_id = f"{harness}-{hashlib.sha256(run_id.encode()).hexdigest()}"
    return run_id


def resolve_run_id(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    memory: RunsOfToolCalls,
    session_headers: Sequence[str] = (),
    model: str = "",
) -> tuple[str, list[str]]:
    """The turn's run (D2, B4), and the echoed tool call IDs to ask the scheduler about.

    A named run is the run; so is a harness's session. Else echoed tool call IDs this
    dataplane remembers name it. Else the turn gets a new run ID, and its echoed IDs
    (if any) go with its Admit: the scheduler, which hears every dataplane's tool
    calls, puts it in the run they were issued to, wherever that run's earlier turns
    went through."""
    explicit = headers.get(RUN_HEADER, "").strip()
    if explicit:
        if len(explicit) > MAX_RUN_ID:
            raise BadHeader(f"{RUN_HEADER} is longer than {MAX_RUN_ID} characters")
        return explicit, []
    harness = harness_run(headers, session_headers, model)
    if harness is not None:
        return harness, []
    echoed = echoed_tool_call_ids(body)
    known = memory.lookup(echoed)
    if known is not None:
        return known, []
    return f"run-{uuid.uuid4().hex}", echoed[:_MAX_ECHOED]


def service_class(headers: Mapping[str, str]) -> str:
    value = headers.get(CLASS_HEADER, "").strip().lower()
    if not value:
        return "batch"
    if value not in CLASSES:
        raise BadHeader(f"{CLASS_HEADER} must be 'interactive' or 'batch', got {shown(value)}")
    return value


def caller(headers: Mapping[str, str], max_bytes: int, principal: Principal = TRUSTED) -> str:
    """The caller a turn runs as (D3, B13), at most ``max_bytes`` bytes, never cut inside
    a UTF-8 character.

    ASGI servers hand header values over as latin-1 text; the bytes on the wire
    are recovered, cut, and read as UTF-8 (what clients send in practice). A trusted
    request (the token, or a stack without auth) is the caller its header names; a
    caller's key makes it that caller, or the sub-caller its header names under it
    (``callers.caller_of``).
    """
    wire = headers.get(CALLER_HEADER, "").strip().encode("latin-1", errors="replace")
    if isinstance(principal, Trusted):
        return wire[:max_bytes].decode("utf-8", errors="ignore")
    return caller_of(principal, wire.decode("utf-8", errors="replace"), max_bytes)
