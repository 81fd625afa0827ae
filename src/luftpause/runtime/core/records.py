"""Journal records (R8): one discriminated union, versioned, parsed in one place.

Each line of ``runs.jsonl`` is one record, a JSON object whose ``t`` names its
type and whose ``v`` its format version (absent = 1, the first format, which
carried no ``v``). Each record is the *fact* that a step of a run happened,
keyed by the run and, where the step repeats, a sequence number:

============  ======================================================  ===============
``t``         fields                                                  key
============  ======================================================  ===============
``spawn``     ``spec, parent, created, caller, traceparent,             run
              idempotencyKey, requestDigest, session, owner,
              classDenied``: the run exists
              (``traceparent``: the trace its spans join; the key and
              the digest of the arguments it came with, when the
              client gave a key: both absent in older journals;
              ``session``: the agent harness's run whose tool call
              spawned it, when the dataplane knew it, #38;
              ``owner``: the configured caller whose key spawned
              the run or its tree's root, B13, absent = the token's;
              ``classDenied``: the class it asked for and was
              denied, served in ``spec.serviceClass`` instead)
``turn``      ``seq, message, usage``: model turn ``seq`` ended in      run, seq
              tool calls; ``message`` is the assistant message, its
              calls in structured form even when recovered from text
``tools``     ``seq, results, usage``: every call of turn ``seq`` has   run, seq
              its result (the tool messages): a *complete tool round*
``approval``  ``key, tool, arguments, allow``: the user's decision on   run, key
              call ``key`` = ``"<seq>:<index>"``
``budget``    ``message``: the budget this run owns was exceeded        run
``end``       ``state, result, error, usage, time``: the run finished   run
============  ======================================================  ===============

:func:`parse` turns one line into a record or raises :class:`RecordError`
naming what is wrong (not JSON, not an object, an unknown type, a newer
version, a missing or mistyped field); :func:`encode` is its inverse. Nothing
else in the runtime reads or writes a record's keys.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from luftpause.runtime.core.state import TERMINAL, RunSpec, RunState, Usage

RECORD_VERSION = 1
RECORD_TYPES = ("spawn", "turn", "tools", "approval", "budget", "end")


class RecordError(ValueError):
    """A journal line that is not a record this runtime can apply; ``run`` names its
    run when the line says which run it belongs to."""

    def __init__(self, reason: str, run: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.run = run


# ----------------------------------------------------------------------------- messages
# The assistant and tool messages of a round, as sent to the engine again on the next
# turn (OpenAI chat field names, so no camelCase here).


class FunctionCall(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    name: str
    arguments: str  # JSON text, as the engine wrote it (hygiene parses it when executing)


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = Field(min_length=1)


class ToolMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    role: Literal["tool"] = "tool"
    tool_call_id: str
    content: str


# ----------------------------------------------------------------------------- records


class _Record(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )
    v: Literal[1] = 1  # RECORD_VERSION
    run: str = Field(min_length=1)

    @property
    def key(self) -> tuple[str, ...]:
        """The stable key of the step (replay applies each key once)."""
        return (self.t, self.run)  # type: ignore[attr-defined]


class Spawn(_Record):
    t: Literal["spawn"] = "spawn"
    spec: RunSpec
    parent: str | None = None
    created: float = Field(allow_inf_nan=False)
    caller: str = ""
    traceparent: str | None = None  # W3C trace context the run's span continues (X1)
    # The client's idempotency key and the digest of the arguments it came with: a
    # spawn with the same key gets this run again, after a restart too (absent = none).
    idempotency_key: str | None = Field(default=None, min_length=1)
    request_digest: str | None = None
    # The harness's run (the dataplane's run id) whose tool call spawned this run: the
    # session the run tree groups it under (#38; absent = none, and in older journals).
    session: str | None = Field(default=None, min_length=1)
    # B13: the configured caller (``[[callers]]``) whose key spawned this run, or the run
    # at the root of its tree: only that caller's key sees the run (absent = a run of the
    # token, or of a stack without callers). The class its spawn asked for and was denied
    # (served in ``spec.service_class`` instead; absent = none denied).
    owner: str | None = Field(default=None, min_length=1)
    class_denied: str | None = None


class Turn(_Record):
    t: Literal["turn"] = "turn"
    seq: int = Field(ge=0)
    message: AssistantMessage
    usage: Usage = Field(default_factory=Usage)

    @property
    def key(self) -> tuple[str, ...]:
        return (self.t, self.run, str(self.seq))


class Tools(_Record):
    t: Literal["tools"] = "tools"
    seq: int = Field(ge=0)
    results: tuple[ToolMessage, ...]
    usage: Usage = Field(default_factory=Usage)

    @property
    def key(self) -> tuple[str, ...]:
        return (self.t, self.run, str(self.seq))


class Approval(_Record):
    t: Literal["approval"] = "approval"
    key_: str = Field(alias="key", pattern=r"^\d+:\d+$")
    tool: str
    arguments: dict[str, Any]
    allow: bool

    @property
    def key(self) -> tuple[str, ...]:
        return (self.t, self.run, self.key_)


class Budget(_Record):
    t: Literal["budget"] = "budget"
    message: str


class End(_Record):
    t: Literal["end"] = "end"
    state: RunState

    @field_validator("state")
    @classmethod
    def _terminal(cls, state: RunState) -> RunState:
        if state not in TERMINAL:
            raise ValueError(f"an end record's state must be terminal, not {state.value!r}")
        return state

    result: str | None = None
    error: str | None = None
    usage: Usage = Field(default_factory=Usage)
    time: float | None = Field(default=None, allow_inf_nan=False)
    budget_exceeded: str | None = None


Record = Annotated[Spawn | Turn | Tools | Approval | Budget | End, Field(discriminator="t")]
_ADAPTER: TypeAdapter[Spawn | Turn | Tools | Approval | Budget | End] = TypeAdapter(Record)
_RUN_IN_TEXT = re.compile(rb'"run"\s*:\s*"([^"\\]{1,200})"')


def _run_of(raw: bytes, data: Any) -> str | None:
    if isinstance(data, dict):
        run = data.get("run")
        return run if isinstance(run, str) and run else None
    found = _RUN_IN_TEXT.search(raw)  # an unparsable line may still say whose it is
    return found.group(1).decode("utf-8", "replace") if found else None


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False)[:3]:
        where = ".".join(str(p) for p in error["loc"][1:] if p != "function-after")
        if error["type"] == "missing":
            problems.append(f"missing field {where!r}")
        else:
            problems.append(f"{where or 'record'}: {error['msg']}")
    more = len(exc.errors()) - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


def parse(raw: bytes) -> Spawn | Turn | Tools | Approval | Budget | End:
    """One journal line as a record; :class:`RecordError` says why it is not one."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise RecordError(f"not JSON ({exc})", _run_of(raw, None)) from None
    run = _run_of(raw, data)
    if not isinstance(data, dict):
        raise RecordError(f"not a JSON object but {type(data).__name__}", run)
    kind = data.get("t")
    if kind not in RECORD_TYPES:
        raise RecordError(f"unknown record type {kind!r}", run)
    version = data.get("v", RECORD_VERSION)
    if version != RECORD_VERSION:
        raise RecordError(
            f"{kind} record of format version {version!r}; this runtime reads version "
            f"{RECORD_VERSION}",
            run,
        )
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise RecordError(f"{kind} record: {_describe(exc)}", run) from None


def encode(record: Spawn | Turn | Tools | Approval | Budget | End) -> bytes:
    """The record as one journal line (UTF-8 JSON and a newline)."""
    return record.model_dump_json(by_alias=True).encode() + b"\n"
