"""Groups of agents: from ``--agents/--class/--caller``, ``--group N:class[:caller[:kind]]``
or a TOML file (``--mix FILE``). A group is reported under the name the user gave it:
its ``name``, else its caller, else ``<class>-<index>``.

A mix file lists groups; every key but ``count`` and ``class`` is optional and
falls back to the command line's value::

    [[group]]
    count = 48
    class = "batch"
    caller = "crowd"          # default: the group's name
    name = "crowd"            # default: its caller, else "<class>-<index>"
    kind = "agents"           # "agents" (own loop) or "subagents" (over MCP)
    context_chars = 8000
    tool_calls = 3            # or "1-3": uniform per run
    max_tokens = 256
    profile = "coding-agent"  # runs shaped like real traces (B10); see docs/guides/workloads.md
    start_s = 0               # seconds after the start before its agents begin (a load step)
    key_env = "ALICE_KEY"     # a caller's key (B13) in this environment variable: the
                              # group's requests carry it instead of --token

    [[group]]
    count = 4
    class = "interactive"
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from luftpause.measure.workload import PROFILES

CLASSES = ("interactive", "batch")
KINDS = ("agents", "subagents")


class MixError(ValueError):
    """A group description that cannot be used; the message says why."""


@dataclass(frozen=True)
class ToolCalls:
    """Tool calls per run: fixed, or uniform in ``lo..hi`` (chosen per run)."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str | int) -> ToolCalls:
        if isinstance(text, bool):
            raise MixError(f"tool calls must be N or A-B, got {text!r}")
        if isinstance(text, int):
            lo = hi = text
        else:
            parts = str(text).strip().split("-")
            try:
                if len(parts) == 1:
                    lo = hi = int(parts[0])
                elif len(parts) == 2:
                    lo, hi = int(parts[0]), int(parts[1])
                else:
                    raise ValueError
            except ValueError:
                raise MixError(f"tool calls must be N or A-B, got {text!r}") from None
        if lo < 0 or hi < lo:
            raise MixError(f"tool calls must be N or A-B with 0 <= A <= B, got {text!r}")
        return cls(lo, hi)

    def pick(self, key: int) -> int:
        """Deterministic choice for run number ``key``."""
        if self.lo == self.hi:
            return self.lo
        return self.lo + (key * 2654435761 % (1 << 32)) % (self.hi - self.lo + 1)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}"


@dataclass(frozen=True)
class Group:
    name: str
    count: int
    cls: str
    caller: str
    kind: str = "agents"
    context_chars: int = 8000
    tool_calls: ToolCalls = ToolCalls(3, 3)
    max_tokens: int = 256
    profile: str | None = None  # a name in workload.PROFILES: the run shape replaces the above
    start_s: float = 0.0  # seconds after the start before its first agent begins
    # B13: the caller key its requests carry instead of --token (never shown or reported)
    key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise MixError(f"group {self.name}: count must be at least 1, got {self.count}")
        if self.cls not in CLASSES:
            raise MixError(
                f"group {self.name}: class must be interactive or batch, got {self.cls!r}"
            )
        if self.kind not in KINDS:
            raise MixError(
                f"group {self.name}: kind must be agents or subagents, got {self.kind!r}"
            )
        if not self.caller:
            raise MixError(f"group {self.name}: caller must not be empty")
        if self.context_chars < 0:
            raise MixError(f"group {self.name}: context_chars must not be negative")
        if self.max_tokens < 1:
            raise MixError(f"group {self.name}: max_tokens must be at least 1")
        if not 0 <= self.start_s < float("inf"):
            raise MixError(f"group {self.name}: start_s must be a number of seconds, at least 0")
        if self.profile is not None:
            if self.profile not in PROFILES:
                raise MixError(
                    f"group {self.name}: unknown profile {self.profile!r} "
                    f"(profiles: {', '.join(PROFILES)})"
                )
            if self.kind != "agents":
                raise MixError(
                    f"group {self.name}: profile {self.profile!r} shapes own-loop agents only "
                    '(kind = "agents")'
                )


@dataclass(frozen=True)
class Defaults:
    kind: str = "agents"
    context_chars: int = 8000
    tool_calls: ToolCalls = ToolCalls(3, 3)
    max_tokens: int = 256
    caller: str | None = None
    profile: str | None = None


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            return int(str(value))
        except ValueError:
            raise MixError(f"{what} must be an integer, got {value!r}") from None
    return value


def parse_group(text: str, index: int, defaults: Defaults = Defaults()) -> Group:
    """``N:class[:caller[:kind]]``, e.g. ``48:batch:crowd`` or ``4:interactive:me:subagents``."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 4:
        raise MixError(f"--group must be N:class[:caller[:kind]], got {text!r}")
    count = _int(parts[0], f"--group {text!r}: N")
    cls = parts[1].strip()
    caller = parts[2].strip() if len(parts) > 2 and parts[2].strip() else None
    name = caller or f"{cls}-{index}"  # the group is reported under the name it was given
    kind = parts[3].strip() if len(parts) > 3 else defaults.kind
    return Group(
        name=name,
        count=count,
        cls=cls,
        caller=caller or defaults.caller or name,
        kind=kind,
        context_chars=defaults.context_chars,
        tool_calls=defaults.tool_calls,
        max_tokens=defaults.max_tokens,
        profile=defaults.profile if kind == "agents" else None,
    )


_KEYS = {
    "count", "class", "caller", "name", "kind", "context_chars", "tool_calls", "max_tokens",
    "profile", "start_s", "key_env",
}  # fmt: skip


def parse_mix(
    data: dict[str, Any],
    defaults: Defaults = Defaults(),
    environ: Mapping[str, str] | None = None,
) -> list[Group]:
    extra = set(data) - {"group"}
    if extra:
        raise MixError(f"mix: unknown top-level key(s): {', '.join(sorted(extra))}")
    raw = data.get("group")
    if not isinstance(raw, list) or not raw:
        raise MixError("mix: expected one or more [[group]] tables")
    groups = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise MixError(f"mix: group {i} is not a table")
        unknown = set(entry) - _KEYS
        if unknown:
            raise MixError(f"mix: group {i}: unknown key(s): {', '.join(sorted(unknown))}")
        for key in ("count", "class"):
            if key not in entry:
                raise MixError(f"mix: group {i}: {key} is required")
        cls = str(entry["class"])
        name = str(entry.get("name") or entry.get("caller") or f"{cls}-{i}")
        groups.append(
            Group(
                name=name,
                count=_int(entry["count"], f"mix: group {name}: count"),
                cls=cls,
                caller=str(entry.get("caller") or defaults.caller or name),
                kind=str(entry.get("kind", defaults.kind)),
                context_chars=_int(
                    entry.get("context_chars", defaults.context_chars),
                    f"mix: group {name}: context_chars",
                ),
                tool_calls=(
                    ToolCalls.parse(entry["tool_calls"])
                    if "tool_calls" in entry
                    else defaults.tool_calls
                ),
                max_tokens=_int(
                    entry.get("max_tokens", defaults.max_tokens), f"mix: group {name}: max_tokens"
                ),
                profile=_profile(
                    entry.get(
                        "profile",
                        defaults.profile if entry.get("kind", defaults.kind) == "agents" else None,
                    ),
                    name,
                ),
                start_s=_seconds(entry.get("start_s", 0.0), f"mix: group {name}: start_s"),
                key=_key(entry.get("key_env"), name, os.environ if environ is None else environ),
            )
        )
    return unique_names(groups)


def _key(variable: Any, name: str, environ: Mapping[str, str]) -> str | None:
    """The key in a group's ``key_env`` variable (None without one)."""
    if variable is None:
        return None
    if not isinstance(variable, str) or not variable:
        raise MixError(f"mix: group {name}: key_env must name an environment variable")
    key = environ.get(variable, "").strip()
    if not key:
        raise MixError(f"mix: group {name}: key_env names {variable}, which is not set")
    return key


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MixError(f"{what} must be a number of seconds, got {value!r}")
    return float(value)


def _profile(value: Any, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise MixError(f"mix: group {name}: profile must be a string, got {value!r}")


def load_mix(path: Path, defaults: Defaults = Defaults()) -> list[Group]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise MixError(f"mix: cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise MixError(f"mix: {path} is not valid TOML: {exc}") from None
    return parse_mix(data, defaults)


def unique_names(groups: list[Group]) -> list[Group]:
    """Rename duplicates (``name``, ``name-2``, ...) so every group is reported on its own."""
    seen: dict[str, int] = {}
    out = []
    for g in groups:
        n = seen.get(g.name, 0) + 1
        seen[g.name] = n
        out.append(g if n == 1 else replace(g, name=f"{g.name}-{n}"))
    return out
