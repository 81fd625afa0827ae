"""``SpawnArgs``: the arguments of ``spawn`` (R2), written once.

``spawn``, ``run`` and ``run`` as an MCP task all take these arguments. The MCP
SDK builds a tool's input schema from its function's signature, so
:func:`spawn_parameters` turns the model's fields into signature parameters
(camelCase names, constraints, descriptions, defaults from the runtime's
settings): adding a spawn option is one field here.

``idempotencyKey`` is not an option of the run but of the call: a client that
retries a spawn whose answer it lost sends the same key and gets the same run
(see ``Runtime.spawn``). :func:`request_digest` fingerprints the rest of the
arguments, so the same key with other arguments is told apart.

The SDK reads a string argument as JSON first when its field is not annotated
``str`` exactly (``func_metadata.pre_parse_json``, for clients that send lists as
JSON text): an optional text field would lose ``"null"`` to ``None`` and refuse
``"[1]"`` as a list. So the signature annotates each optional text field ``str``
and lets an explicit ``null`` through with a validator (:data:`_NULL_PASSES`): a
string arrives as it was sent.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidatorFunctionWrapHandler, WrapValidator
from pydantic.alias_generators import to_camel


class SpawnArgs(BaseModel):
    """What a client asks ``spawn`` for; ``None`` means "the default"."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    task: Annotated[str, Field(min_length=1, description="What the sub-agent should do.")]
    model: Annotated[
        str | None, Field(description="Model to run it on; default: the runtime's default model.")
    ] = None
    service_class: Annotated[
        Literal["interactive", "batch"] | None,
        Field(
            description="Scheduling class of its turns: 'interactive' (someone is waiting) or "
            "'batch'. Default: the parent's class, else 'interactive'."
        ),
    ] = None
    system: Annotated[str | None, Field(description="System prompt for the sub-agent.")] = None
    max_tool_calls: Annotated[
        int | None,
        Field(
            ge=0,
            le=64,
            description="Tool calls it may make (default {max_tool_calls}); after that it must "
            "answer.",
        ),
    ] = None
    tools: Annotated[
        list[str] | None,
        Field(description="Names of the tools it may use (see `tools`); default: all."),
    ] = None
    max_tokens: Annotated[
        int | None,
        Field(
            ge=0,
            le=131072,
            description="Reply length limit per turn in tokens (default {max_tokens}; 0 = the "
            "engine decides).",
        ),
    ] = None
    parallel_tool_calls: Annotated[
        bool,
        Field(description="Run several tool calls from one reply at once (default false)."),
    ] = False
    parent: Annotated[
        str | None,
        Field(description="Handle of the parent run: the new run joins its tree and budgets."),
    ] = None
    budget_tokens: Annotated[
        int | None,
        Field(ge=1, description="Token budget (prompt + completion) for this run's whole subtree."),
    ] = None
    budget_tool_calls: Annotated[
        int | None, Field(ge=0, description="Tool-call budget for this run's whole subtree.")
    ] = None
    budget_seconds: Annotated[
        float | None,
        Field(
            gt=0,
            allow_inf_nan=False,  # an infinite limit is no limit, and not JSON (GET /status)
            description="Wall-clock budget in seconds for this run's whole subtree.",
        ),
    ] = None
    approve_tools: Annotated[
        list[str] | None,
        Field(
            description="Tools whose every call needs the user's approval (besides destructive "
            "ones, which always do)."
        ),
    ] = None
    idempotency_key: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=256,
            description="A key of your choosing (1-256 characters) that makes a retry safe: "
            "a spawn with a key already used returns that run's handle (also after a runtime "
            "restart, or while the first spawn is still under way) instead of starting another "
            "run; the same key with other arguments is an error.",
        ),
    ] = None


def _null_passes(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    return None if value is None else handler(value)


# An optional text field's signature annotation: ``str`` (never pre-parsed as JSON by
# the SDK), ``null`` still meaning "the default".
_NULL_PASSES = WrapValidator(_null_passes)

# Fields whose default is a setting: the signature shows the configured value.
_SETTING_DEFAULTS = ("max_tool_calls", "max_tokens")


def spawn_parameters(*, max_tool_calls: int, max_tokens: int) -> list[inspect.Parameter]:
    """SpawnArgs as keyword-only signature parameters, for the MCP SDK's schema."""
    defaults = {"max_tool_calls": max_tool_calls, "max_tokens": max_tokens}
    params = []
    for name, info in SpawnArgs.model_fields.items():
        annotation: Any = info.annotation
        default: Any = inspect.Parameter.empty if info.is_required() else info.default
        description = (info.description or "").format(**defaults)
        if name in _SETTING_DEFAULTS:
            annotation = int  # the setting fills it: the schema shows a number, not null
            default = defaults[name]
        metadata = list(info.metadata)
        if annotation == (str | None):
            annotation = str
            metadata.append(_NULL_PASSES)
        field = Field(description=description)
        params.append(
            inspect.Parameter(
                info.alias or name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=Annotated[(annotation, *metadata, field)],
            )
        )
    return params


def spawn_args_from(arguments: dict[str, Any]) -> SpawnArgs:
    """The SpawnArgs of a tool call's (already validated) keyword arguments."""
    return SpawnArgs.model_validate(
        {k: v for k, v in arguments.items() if k in _ALIASES}, by_alias=True
    )


def request_digest(args: SpawnArgs, *, max_tool_calls: int, max_tokens: int) -> str:
    """A fingerprint of what a spawn asks for (every argument but its idempotency key),
    with the settings' defaults filled in where the client left them out, so the
    ``spawn`` tool (whose schema fills them) and ``run`` as a task (which does not)
    agree."""
    data = args.model_dump(by_alias=True, mode="json", exclude={"idempotency_key"})
    if data["maxToolCalls"] is None:
        data["maxToolCalls"] = max_tool_calls
    if data["maxTokens"] is None:
        data["maxTokens"] = max_tokens
    data["approveTools"] = data["approveTools"] or []
    text = json.dumps(data, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


_ALIASES = frozenset(info.alias or name for name, info in SpawnArgs.model_fields.items())
