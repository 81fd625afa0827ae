"""What Docker Compose does with our compose files, to the extent the tests need it.

No Docker engine runs where the tests run, so this module re-creates the steps of
the Compose Specification that turn files into an application model:

1. load each file as YAML, keeping the ``!reset`` and ``!override`` tags
   (13-merge.md, "Reset value", "Replace value");
2. interpolate ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?err}``,
   ``${VAR?err}``, ``$VAR`` and ``$$`` in values, per file, before merging
   (12-interpolation.md). Unlike Compose, a variable that is unset and has no
   default is an error here (Compose warns and substitutes ""): a test must
   say which variables a deployment needs;
3. merge the files in order (13-merge.md): mappings merge, sequences append,
   ``command``, ``entrypoint`` and ``healthcheck.test`` are replaced, ``volumes``
   entries with the same target and equal ``ports`` entries are not repeated,
   ``!override`` replaces, ``!reset`` removes. ``environment`` and ``depends_on``
   written as lists are turned into mappings first, as Compose does;
4. drop the services whose ``profiles`` are not active (15-profiles.md).

The schema (tests/data/compose-spec) validates the result; this module does not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = ROOT / "tests" / "data" / "compose-spec" / "compose-spec.json"


@dataclass(frozen=True)
class Reset:
    """A value tagged ``!reset``: the merge removes the key."""

    value: Any


@dataclass(frozen=True)
class Override:
    """A value tagged ``!override``: the merge replaces, never merges."""

    value: Any


class _Loader(yaml.SafeLoader):
    pass


def _tagged(cls: type[Reset] | type[Override]) -> Any:
    def construct(loader: _Loader, node: yaml.Node) -> Reset | Override:
        if isinstance(node, yaml.MappingNode):
            return cls(loader.construct_mapping(node, deep=True))
        if isinstance(node, yaml.SequenceNode):
            return cls(loader.construct_sequence(node, deep=True))
        return cls(loader.construct_scalar(node))  # type: ignore[arg-type]

    return construct


_Loader.add_constructor("!reset", _tagged(Reset))
_Loader.add_constructor("!override", _tagged(Override))


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.load(path.read_text(), Loader=_Loader)  # a SafeLoader subclass
    assert isinstance(data, dict), f"{path.name}: not a mapping"
    return data


# ----------------------------------------------------------------------- interpolation


class UnsetVariable(Exception):
    """A ``${VAR}`` without default (or a ``${VAR:?err}``) whose variable is not set."""


_DOLLAR = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[_A-Za-z]\w*))")
_BRACED = re.compile(r"(?P<name>[_A-Za-z]\w*)(?:(?P<op>:-|-|:\?|\?)(?P<arg>.*))?", re.S)


def _interpolate_string(text: str, env: Mapping[str, str], where: str) -> str:
    def replace(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        if m["named"]:
            name, op, arg = m["named"], None, ""
        else:
            b = _BRACED.fullmatch(m["braced"])
            if b is None:
                raise ValueError(f"{where}: invalid interpolation {m[0]!r}")
            name, op, arg = b["name"], b["op"], b["arg"] or ""
        value = env.get(name)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return arg if value is None else value
        if op == ":?" and not value:
            raise UnsetVariable(f"{where}: {name}: {arg}")
        if op == "?" and value is None:
            raise UnsetVariable(f"{where}: {name}: {arg}")
        if value is None:
            raise UnsetVariable(f"{where}: {name} is not set and has no default")
        return value

    return _DOLLAR.sub(replace, text)


def interpolate(node: Any, env: Mapping[str, str], where: str = "") -> Any:
    """``node`` with every string value interpolated (keys are not, as in Compose)."""
    if isinstance(node, str):
        return _interpolate_string(node, env, where)
    if isinstance(node, Reset | Override):
        return type(node)(interpolate(node.value, env, where))
    if isinstance(node, dict):
        return {
            k: interpolate(v, env, f"{where}.{k}" if where else str(k)) for k, v in node.items()
        }
    if isinstance(node, list):
        return [interpolate(v, env, f"{where}[{i}]") for i, v in enumerate(node)]
    return node


def plain(node: Any) -> Any:
    """``node`` without the merge tags: what the schema sees of one file."""
    if isinstance(node, Reset | Override):
        return plain(node.value)
    if isinstance(node, dict):
        return {k: plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return node


# ------------------------------------------------------------------------------ merge


def _as_mapping_env(value: Any) -> Any:
    if isinstance(value, list):
        out: dict[str, Any] = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            out[key] = val if sep else None
        return out
    return value


def _as_mapping_depends(value: Any) -> Any:
    if isinstance(value, list):
        return {name: {"condition": "service_started"} for name in value}
    return value


def normalize(doc: dict[str, Any]) -> dict[str, Any]:
    """List forms of ``environment`` and ``depends_on`` as mappings (tags kept)."""
    services = doc.get("services") or {}
    for svc in services.values():
        if not isinstance(svc, dict):
            continue
        for key, convert in (("environment", _as_mapping_env), ("depends_on", _as_mapping_depends)):
            if key in svc:
                value = svc[key]
                if isinstance(value, Reset | Override):
                    svc[key] = type(value)(convert(value.value))
                else:
                    svc[key] = convert(value)
    return doc


_REPLACED = {("command",), ("entrypoint",), ("healthcheck", "test")}


def _volume_target(entry: Any) -> str:
    if isinstance(entry, dict):
        return str(entry.get("target"))
    parts = str(entry).split(":")
    return parts[1] if len(parts) > 1 else parts[0]


def _merge_lists(base: list[Any], over: list[Any], key: str) -> list[Any]:
    if key == "volumes":
        targets = {_volume_target(v) for v in over}
        return [v for v in base if _volume_target(v) not in targets] + over
    if key == "ports":
        return base + [p for p in over if p not in base]
    return base + over


def _merge(base: Any, over: Any, path: tuple[str, ...]) -> Any:
    if isinstance(over, Override):
        return plain(over.value)
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            if isinstance(value, Reset):
                out.pop(key, None)
            elif key in out:
                out[key] = _merge(out[key], value, (*path, str(key)))
            else:
                out[key] = plain(value)
        return out
    in_service = path[2:] if len(path) > 2 and path[0] == "services" else None
    if isinstance(base, list) and isinstance(over, list) and in_service not in _REPLACED:
        return _merge_lists(base, plain(over), path[-1])
    return plain(over)


def merge(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Merge normalized, interpolated files in order; the first is the base."""
    result: dict[str, Any] = {}
    for doc in docs:
        result = _merge(result, doc, ()) if result else plain(doc)
    return result


# ------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class Deployment:
    """Compose files applied in order, with the host environment they are run with."""

    name: str
    files: tuple[str, ...]
    env: Mapping[str, str]

    def documents(self) -> list[dict[str, Any]]:
        return [
            normalize(interpolate(load_yaml(ROOT / f), self.env, f.removesuffix(".yaml")))
            for f in self.files
        ]

    def model(self) -> dict[str, Any]:
        return merge(self.documents())

    def enabled_services(self, profiles: frozenset[str] = frozenset()) -> dict[str, Any]:
        services: dict[str, Any] = self.model()["services"]
        return {
            name: svc
            for name, svc in services.items()
            if not svc.get("profiles") or set(svc["profiles"]) & profiles
        }


def service_env(svc: Mapping[str, Any]) -> dict[str, str]:
    """The environment Compose gives a container (values as strings; unset ones left out)."""
    env = svc.get("environment") or {}
    out: dict[str, str] = {}
    for key, value in env.items():
        if value is None:
            continue
        out[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return data
