"""One frozen settings tree for the whole stack, read once at start.

The stack is described by one TOML file (the default, for the fake stack, ships
as ``luftpause/data/stack.toml``). Secrets and tracing come from the environment
only: ``LUFTPAUSE_TOKEN``, each endpoint's ``api_key_env`` and the standard
``OTEL_*`` variables. Every service parses the file in its entry point and passes
the parts it needs down; library code never reads ``os.environ``.

A bad file is reported as ``ConfigError`` whose message names the file, the
field (as a dotted path, e.g. ``endpoints[1].kind``) and the problem.

String values in the file may name environment variables, so that one file
serves several deployments (a model name, a hosted pod's address); the
expansion happens once, where the file is loaded (:func:`load_config`), with
the environment the entry point passes in:

- ``${NAME}``: the variable's value; unset is an error naming the variable and
  the field.
- ``${NAME:-default}``: the value, or ``default`` when the variable is unset or
  empty. The default is literal text (no ``}`` and no ``$`` inside).
- ``$$``: a literal ``$``. Any other ``$`` is an error, so a typo such as
  ``$NAME`` does not pass silently.

Keys, numbers and booleans are never expanded. A numeric field may still take a
variable written as a string (``port = "${PORT:-8080}"``): validation converts a
string of digits.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

DEFAULT_CONFIG_NAME = "stack.toml"


class ConfigError(Exception):
    """The configuration cannot be used; the message says where and why."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


Port = Annotated[int, Field(ge=0, le=65535)]
Seconds = Annotated[float, Field(gt=0)]


class EndpointKind(StrEnum):
    GENERATIVE = "generative"
    SINGLE_PASS = "single_pass"


class MetricsFlavour(StrEnum):
    SGLANG = "sglang"
    VLLM = "vllm"
    AUTO = "auto"  # accept either family of names
    NONE = "none"  # the endpoint reports no load: it is never capped


def _check_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"must be an http:// or https:// URL with a host, got {value!r}")
    return value.rstrip("/")


class ClassPriority(_Frozen):
    """The ``priority`` the dataplane sends an engine for each class's turns.

    For engines that order their own waiting queue by request priority: SGLang
    started with ``--enable-priority-scheduling`` (higher first, unless
    ``--schedule-low-priority-values-first``) or vLLM with ``--scheduling-policy
    priority`` (lower first). Pick the values in the engine's direction.
    """

    interactive: int
    batch: int

    @model_validator(mode="after")
    def _differ(self) -> Self:
        if self.interactive == self.batch:
            raise ValueError("interactive and batch must differ, or the engine cannot order them")
        return self

    def for_class(self, service_class: str) -> int:
        return self.interactive if service_class == "interactive" else self.batch


class KvRetention(StrEnum):
    """How the dataplane asks an endpoint to keep a paused run's prefix (B8;
    docs/benchmarks/policies.md, "What engines accept", says which engines accept what)."""

    NONE = "none"  # no hint
    # ``vllm_xargs.agentic_context`` {program_id: run, kv_retention_ttl_seconds}: read by
    # vllm-router 0.1.17's program scheduling (it keeps the program's reservation that
    # long) and honoured by the fake engine, which also takes the release at run end
    # (``POST /kv_retention/release``); "fake" sends both, "vllm-router" the hint only.
    FAKE = "fake"
    VLLM_ROUTER = "vllm-router"


class NativeApi(StrEnum):
    MESSAGES = "messages"  # Anthropic Messages, POST /v1/messages
    RESPONSES = "responses"  # OpenAI Responses, POST /v1/responses


class Endpoint(_Frozen):
    """A replica: an engine, a router in front of engines, or a hosted API."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    url: str
    kind: EndpointKind = EndpointKind.GENERATIVE
    models: Annotated[tuple[str, ...], Field(min_length=1)]
    api_key_env: str | None = None
    health_path: str = "/health"  # "" disables the health probe (always healthy)
    metrics: MetricsFlavour = MetricsFlavour.AUTO
    metrics_path: str = "/metrics"
    load_from: tuple[str, ...] = ()  # base URLs whose /metrics describe this replica's load
    # The engine orders its queue by request priority: send each turn its class's value
    # (unless the client set one) and never hold interactive turns for the cap (S4).
    class_priority: ClassPriority | None = None
    # The engine writes `"usage": null` into each chunk only when a stream asks for usage
    # (OpenAI's documented behaviour): the dataplane then cuts those it caused. False for
    # an engine that writes them whether asked or not (they are passed on as sent).
    null_usage_when_asked: bool = True
    # Client APIs besides Chat Completions this endpoint serves itself (B9): a turn on
    # /v1/messages or /v1/responses placed here is passed through unchanged instead of
    # being translated to Chat Completions.
    native_apis: tuple[NativeApi, ...] = ()
    # The engine serves a model that takes images: images of /v1/messages and
    # /v1/responses turns are translated into Chat Completions image_url parts (B9).
    vision: bool = False
    # B8: ask the engine to keep a run's prefix for about its usual tool time after each
    # turn, through the mechanism named (``KvRetention``); released when the run ends.
    kv_retention: KvRetention = KvRetention.NONE
    # Working-set admission: the engine's KV pool in tokens, for an engine whose metrics
    # do not report it (SGLang's sglang:max_total_num_tokens, vLLM's cache_config_info);
    # set, it overrides them. None: as the metrics say.
    kv_tokens: Annotated[int, Field(ge=1)] | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value)

    @field_validator("load_from")
    @classmethod
    def _load_from(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_check_url(v) for v in value)

    @field_validator("health_path", "metrics_path")
    @classmethod
    def _path(cls, value: str) -> str:
        if value and not value.startswith("/"):
            raise ValueError(f"must start with '/', got {value!r}")
        return value

    @field_validator("models")
    @classmethod
    def _models(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not m for m in value):
            raise ValueError("model names must not be empty")
        return value

    @model_validator(mode="after")
    def _priority_kind(self) -> Self:
        if self.class_priority is not None and self.kind is not EndpointKind.GENERATIVE:
            raise ValueError("class_priority applies to generative endpoints only")
        if self.vision and self.kind is not EndpointKind.GENERATIVE:
            raise ValueError("vision applies to generative endpoints only")
        return self


class SchedulerSettings(_Frozen):
    host: str = "127.0.0.1"
    grpc_port: Port = 5000
    http_port: Port = 5001
    # The Link over plain TCP (the admission round trip without HTTP/2), advertised to
    # dataplanes on resync; off: dataplanes use the Link rpc on grpc_port.
    tcp_link: bool = True
    link_port: Port = 5002
    # A Link connection whose hello has not arrived within this is closed; while this many
    # connections wait for theirs, a new one is closed at once (welcomed ones not counted).
    # (bounded: it is also grpc's handshake timeout in whole milliseconds, an int32)
    link_hello_timeout_s: Annotated[float, Field(ge=0.01, le=3600)] = 5.0
    link_max_unauthenticated: Annotated[int, Field(ge=1)] = 64
    probe_period_s: Seconds = 2.0  # also the probe timeout (S9)
    clock_tick_s: Seconds = 1.0  # S10
    turn_timeout_s: Seconds = 600.0  # a turn never reported finished is dropped (S10)
    run_idle_expiry_s: Seconds = 1800.0  # a run with no turn is forgotten (S10)
    # S11: a dataplane whose report stream ended and that does not come back within this
    # has its admitted turns released (it died, or restarted under another ID)
    dataplane_grace_s: Seconds = 15.0
    cap_raise_step: Annotated[int, Field(ge=1)] = 1  # S2: slots added per quiet probe at the cap
    queue_probes: Annotated[int, Field(ge=1)] = 2  # S2: probes in a row with a queue to cap
    # S2, a flood from idle: turns a replica takes before its engine first queues, doubled
    # per quiet probe that finds the engine running them all; 0 = unlimited until then
    initial_cap: Annotated[int, Field(ge=0)] = 16
    # Prefix keeping (docs/concepts/affinity.md): continuing turns first (after S5), new batch
    # runs gated by the runs pinned to a capped replica, and a turn back from a tool that
    # finds less than this share of its run's previous prompt cached lowers the cap.
    keep_prefixes: bool = True
    prefix_miss_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    # Decode pace (docs/concepts/decode-pace.md): while an interactive run lives on a replica, its
    # batch turns are limited so that replies there stream at no more than this many
    # milliseconds per token; 0 = off. Replies shorter than pace_min_tokens are not judged.
    interactive_pace_ms: Annotated[float, Field(ge=0)] = 100.0
    pace_min_tokens: Annotated[int, Field(ge=2)] = 16
    # The interactive target (B7, docs/concepts/interactive-target.md): "1.3x" keeps
    # interactive replies within 1.3 times the fastest pace the replica has shown (its
    # floor); "80ms" is interactive_pace_ms = 80; "off" turns the decode pace off. Unset:
    # interactive_pace_ms.
    interactive_target: str | None = None
    # With a relative interactive target: new interactive runs gather on the replicas where
    # interactive runs live and meet it, where the batch limit may then reach 0 while
    # another replica takes batch work (docs/concepts/interactive-target.md "Packing"; an
    # option: its gains in the simulator did not hold in the real-time flood). false:
    # interactive runs are placed as every run is (fewest runs living first), the batch
    # limit never below 1.
    target_packing: bool = False
    # Tool leases (docs/concepts/admission.md): a run paused on a tool for longer than its lease
    # stops counting as living on its replica (new batch runs stop waiting behind it) and
    # its interactive reservation lapses; both come back when it returns. The lease is
    # tool_lease_factor x (smoothed time + 4 x deviation) of its slowest tool, learned from
    # runs that came back, at least tool_lease_min_s; tool_lease_default_s for a tool never
    # seen back.
    tool_lease_min_s: Annotated[float, Field(gt=0)] = 10.0
    tool_lease_default_s: Annotated[float, Field(gt=0)] = 120.0
    tool_lease_factor: Annotated[float, Field(ge=1)] = 2.0
    # Working-set admission (docs/concepts/admission.md, "Working-set admission"): a new batch
    # run starts on a replica only while the known contexts of the runs living there and
    # an estimate of its own fit in working_set_share of the engine's KV pool (endpoint
    # kv_tokens, or its metrics) and, if set above 0, the engine's KV usage is below
    # working_set_kv_usage. "off": prefix keeping's run limit alone gates new runs;
    # "replace": the working set instead of it; "both": both.
    working_set: Literal["off", "replace", "both"] = "off"
    working_set_share: Annotated[float, Field(gt=0, le=1)] = 0.9
    working_set_kv_usage: Annotated[float, Field(ge=0, le=1)] = 0.0
    # Held-turn order (docs/concepts/runs-and-classes.md "Token fairness", "Batch order"):
    # which caller's held turn goes first within a class ("in_flight": fewest turns in
    # flight; "tokens": least weighted tokens served, prompt_weight x prompt +
    # completion_weight x completion), and within the batch class which run's
    # ("arrival", or "attained": least service so far, in attained_measure units).
    fairness: Literal["in_flight", "tokens"] = "in_flight"
    prompt_weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    completion_weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 2.0
    batch_order: Literal["arrival", "attained"] = "arrival"
    attained_measure: Literal["tokens", "time"] = "tokens"
    # S12: runtimes (base URLs, http(s)://host:port) the status page may show besides
    # loopback ones; the scheduler fetches their /status for the page.
    status_runtimes: tuple[
        Annotated[str, Field(pattern=r"^https?://[^/?#@\s]+(:[0-9]+)?/?$")], ...
    ] = ()

    @field_validator("interactive_target")
    @classmethod
    def _target(cls, text: str | None) -> str | None:
        if text is not None:
            parse_interactive_target(text)
        return text

    @model_validator(mode="after")
    def _one_target(self) -> SchedulerSettings:
        if self.interactive_target is not None and "interactive_pace_ms" in self.model_fields_set:
            raise ValueError(
                "set interactive_target or interactive_pace_ms, not both "
                f"(interactive_pace_ms = {self.interactive_pace_ms:g} is interactive_target = "
                f'"{self.interactive_pace_ms:g}ms")'
            )
        return self

    def pace_targets(self) -> tuple[float | None, float | None]:
        """The core's ``(interactive_pace_s, interactive_slowdown)``."""
        if self.interactive_target is None:
            return (self.interactive_pace_ms / 1000 or None), None
        return parse_interactive_target(self.interactive_target)

    @model_validator(mode="after")
    def _token_weights(self) -> Self:
        if self.prompt_weight == 0 and self.completion_weight == 0:
            raise ValueError(
                "prompt_weight and completion_weight are both 0: token fairness would count nothing"
            )
        return self

    @field_validator("status_runtimes")
    @classmethod
    def _runtime_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        for url in urls:
            try:
                parts = urlsplit(url)
                port = parts.port
            except ValueError as exc:
                raise ValueError(f"{url!r} is not a usable URL ({exc})") from None
            if not parts.hostname or (port is not None and not 0 < port < 65536):
                raise ValueError(f"{url!r} needs a host and a port from 1 to 65535")
        return urls


ServiceClass = Literal["interactive", "batch"]


def parse_interactive_target(text: str) -> tuple[float | None, float | None]:
    """``[scheduler] interactive_target``: ``"1.3x"`` -> (None, 1.3), a slowdown over the
    replica's floor; ``"80ms"`` -> (0.08, None), seconds per reply token; ``"off"`` ->
    (None, None). Raises ``ValueError`` naming what is wrong."""
    value = text.strip().lower()
    if value == "off":
        return None, None
    for unit, scale in (("ms", 0.001), ("x", 1.0)):
        if value.endswith(unit):
            try:
                number = float(value[: -len(unit)])
            except ValueError:
                break
            if not math.isfinite(number):
                break
            if unit == "x":
                if number <= 1:
                    raise ValueError(
                        f"interactive_target {text!r}: a slowdown must be above 1 (1x is "
                        "the floor itself, which no shared engine can promise)"
                    )
                return None, number
            if number <= 0:
                raise ValueError(f"interactive_target {text!r}: a pace must be above 0 ms")
            return number * scale, None
    raise ValueError(
        f'interactive_target {text!r}: expected a slowdown over the floor such as "1.3x", '
        'a pace per reply token such as "80ms", or "off"'
    )


_CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "cookie", "set-cookie"}
)


class DataplaneSettings(_Frozen):
    host: str = "127.0.0.1"
    port: Port = 8080
    scheduler: str = "127.0.0.1:5000"  # host:port of the scheduler's gRPC server
    engine_connect_timeout_s: Seconds = 2.0
    report_reconnect_s: Seconds = 1.0
    # Reports wait up to this long to share a write to the scheduler (0 = each at once).
    report_flush_ms: Annotated[float, Field(ge=0, le=1000)] = 5.0
    # Use the scheduler's Link over plain TCP where it offers one (false: the Link rpc).
    tcp_link: bool = True
    tool_call_id_memory_s: Seconds = 1800.0
    tool_call_id_sweep_s: Seconds = 60.0
    run_idle_prune_s: Seconds = 1800.0
    caller_max_bytes: Annotated[int, Field(ge=1)] = 128
    # A request body larger than this is refused with 413 before it reaches an engine.
    max_body_bytes: Annotated[int, Field(ge=1024)] = 32 * 1024 * 1024
    # `luftpause up` starts this many dataplane processes on the one port (SO_REUSEPORT):
    # the kernel spreads connections over them; each links to the scheduler on its own.
    workers: Annotated[int, Field(ge=1, le=64)] = 1
    # Model names clients ask for that no endpoint serves, mapped to one an endpoint does
    # serve: exact names or shell-style patterns ("claude-*"), tried in file order (B9).
    model_aliases: Mapping[str, str] = Field(default_factory=dict)
    # Headers that name a harness's session, tried in order when a turn has no
    # x-luftpause-run-id and no Claude Code or Codex session header (B4).
    session_headers: tuple[str, ...] = ("x-session-affinity", "x-session-id")

    @field_validator("model_aliases")
    @classmethod
    def _aliases(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        for name, target in value.items():
            if not name or not target:
                raise ValueError(
                    f"{name!r} = {target!r}: an alias and the model it names must both be non-empty"
                )
        return value

    @field_validator("session_headers")
    @classmethod
    def _session_headers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
                raise ValueError(f"{name!r} is not an HTTP header name")
            if name.lower() in _CREDENTIAL_HEADERS:
                # A run ID is shown in /status, in logs and in every answer's headers.
                raise ValueError(f"{name!r} carries credentials: it cannot name a run")
        return tuple(name.lower() for name in value)

    @model_validator(mode="after")
    def _workers_share_a_known_port(self) -> Self:
        if self.workers > 1 and self.port == 0:
            raise ValueError("workers > 1 share one port: give dataplane.port a fixed value, not 0")
        return self


def _added_header(name: str) -> str:
    """A header name the runtime may add to a turn, in lower case."""
    if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
        raise ValueError(f"{name!r} is not an HTTP header name")
    lower = name.lower()
    if lower in _CREDENTIAL_HEADERS or lower.startswith("x-luftpause-"):
        raise ValueError(
            f"{name!r} is set by the runtime itself (its token, the run's identity headers)"
        )
    if lower in ("host", "content-length", "content-type", "transfer-encoding", "connection"):
        raise ValueError(f"{name!r} belongs to the HTTP request itself")
    return lower


def _header_value(name: str, value: str) -> str:
    if not value.isprintable() or not value.isascii():
        raise ValueError(f"the value of {name!r} must be printable ASCII, got {value!r}")
    return value


class ToolServer(_Frozen):
    """An upstream MCP server the runtime's sub-agents may call."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    url: str | None = None  # Streamable HTTP
    command: tuple[str, ...] = ()  # stdio: argv
    env: Mapping[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if (self.url is None) == (not self.command):
            raise ValueError("set exactly one of 'url' (HTTP) or 'command' (stdio)")
        if self.url is not None:
            object.__setattr__(self, "url", _check_url(self.url))
        return self


class RuntimeSettings(_Frozen):
    host: str = "127.0.0.1"
    port: Port = 7000
    state_dir: str = "./state"
    dataplane_url: str = "http://127.0.0.1:8080"
    turn_timeout_s: Seconds = 600.0
    default_max_tokens: Annotated[int, Field(ge=0)] = 256
    default_max_tool_calls: Annotated[int, Field(ge=0)] = 8
    await_timeout_s: Seconds = 60.0
    await_max_s: Seconds = 600.0
    retry_after_default_s: Seconds = 1.0
    # Stream each turn (and put the reply back together) so the dataplane times its
    # decode; false: one non-streamed request per turn.
    stream_turns: bool = True
    default_model: str | None = None
    tool_servers: tuple[ToolServer, ...] = ()
    # For a dataplane_url that is not a luftpause dataplane (a gateway, a router, an
    # engine that orders its queue by class): headers added to every turn of a class,
    # headers that carry the run's ID (a sticky-session key), and a body "priority" per
    # class (kept where a turn sets its own).
    class_headers: Mapping[ServiceClass, Mapping[str, str]] = Field(default_factory=dict)
    run_id_headers: tuple[str, ...] = ()
    class_priority: Mapping[ServiceClass, int] = Field(default_factory=dict)

    @field_validator("dataplane_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value)

    @field_validator("class_headers")
    @classmethod
    def _class_headers(
        cls, value: Mapping[str, Mapping[str, str]]
    ) -> Mapping[str, Mapping[str, str]]:
        out = {}
        for service_class, headers in value.items():
            out[service_class] = {
                _added_header(name): _header_value(name, text) for name, text in headers.items()
            }
        return out

    @field_validator("run_id_headers")
    @classmethod
    def _run_id_headers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_added_header(name) for name in value)


class FakeEngine(_Frozen):
    """A fake engine `luftpause up` starts (see luftpause.fakes)."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    port: Port
    model: str = "llama-3.2-1b"
    args: tuple[str, ...] = ()  # extra command-line flags for `luftpause fake-engine`


class FakeMcp(_Frozen):
    port: Port = 9000
    args: tuple[str, ...] = ()


class Fakes(_Frozen):
    engines: tuple[FakeEngine, ...] = ()
    mcp: FakeMcp | None = None


class StackConfig(_Frozen):
    endpoints: tuple[Endpoint, ...] = ()
    scheduler: SchedulerSettings = SchedulerSettings()
    dataplane: DataplaneSettings = DataplaneSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    fakes: Fakes = Fakes()

    @model_validator(mode="after")
    def _unique_names(self) -> Self:
        seen: set[str] = set()
        for i, e in enumerate(self.endpoints):
            if e.name in seen:
                raise ValueError(f"endpoints[{i}].name: duplicate endpoint name {e.name!r}")
            seen.add(e.name)
        served = {m for e in self.endpoints if e.kind is EndpointKind.GENERATIVE for m in e.models}
        for alias, target in self.dataplane.model_aliases.items():
            if self.endpoints and target not in served:
                raise ValueError(
                    f"dataplane.model_aliases[{alias!r}]: no generative endpoint serves "
                    f"{target!r} (served: {', '.join(sorted(served)) or 'none'})"
                )
        names = [e.name for e in self.fakes.engines]
        if len(set(names)) != len(names):
            raise ValueError("fakes.engines: fake engine names must be unique")
        return self

    def endpoint(self, name: str) -> Endpoint | None:
        return next((e for e in self.endpoints if e.name == name), None)


class Secrets(_Frozen):
    """What the environment supplies; never read from the TOML file."""

    token: str | None = None  # LUFTPAUSE_TOKEN
    api_keys: Mapping[str, str] = Field(default_factory=dict)  # endpoint name -> key
    otel_endpoint: str | None = None  # OTEL_EXPORTER_OTLP_ENDPOINT


def default_config_path() -> Path:
    return Path(str(resources.files("luftpause") / "data" / DEFAULT_CONFIG_NAME))


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def parse_config(data: Mapping[str, Any], source: str) -> StackConfig:
    """Validate parsed TOML; errors name ``source``, the field and the problem."""
    try:
        return StackConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            lines.append(f"{source}: {_format_loc(tuple(err['loc']))}: {msg}")
        raise ConfigError("\n".join(lines)) from None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _UnsetVariable(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _expand_string(value: str, environ: Mapping[str, str]) -> str:
    """``${NAME}``, ``${NAME:-default}`` and ``$$`` in one string value.

    Raises ``_UnsetVariable`` for ``${NAME}`` with NAME unset, ``ValueError`` for
    anything else after a ``$`` (the message says what is allowed).
    """
    out: list[str] = []
    i = 0
    while (j := value.find("$", i)) >= 0:
        out.append(value[i:j])
        following = value[j + 1 : j + 2]
        if following == "$":
            out.append("$")
            i = j + 2
            continue
        if following != "{":
            raise ValueError(
                f"'$' at position {j} of {value!r} must start ${{NAME}} or ${{NAME:-default}}, "
                "or be doubled ($$) for a literal '$'"
            )
        end = value.find("}", j + 2)
        if end < 0:
            raise ValueError(f"'${{' at position {j} of {value!r} is not closed with '}}'")
        body = value[j + 2 : end]
        name, has_default, default = body.partition(":-")
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(
                f"'${{{body}}}' in {value!r} is not ${{NAME}} or ${{NAME:-default}} "
                "(NAME: letters, digits and '_', not starting with a digit)"
            )
        if "$" in default:
            raise ValueError(
                f"the default in '${{{body}}}' is literal text and must not contain '$'"
            )
        got = environ.get(name)
        if has_default:
            out.append(got or default)
        elif got is None:
            raise _UnsetVariable(name)
        else:
            out.append(got)
        i = end + 1
    out.append(value[i:])
    return "".join(out)


def expand_environment(data: Any, environ: Mapping[str, str], source: str) -> Any:
    """A copy of parsed TOML with ``${NAME}`` references in string values replaced.

    Every problem in the file is reported at once, as ``ConfigError`` with one line
    per field: ``<source>: <field>: environment variable NAME is not set ...``.
    """
    problems: list[str] = []

    def walk(node: Any, loc: tuple[int | str, ...]) -> Any:
        if isinstance(node, str):
            try:
                return _expand_string(node, environ)
            except _UnsetVariable as unset:
                problems.append(
                    f"{source}: {_format_loc(loc)}: environment variable {unset.name} is not set "
                    f"(export it, or write ${{{unset.name}:-default}} in the file)"
                )
            except ValueError as exc:
                problems.append(f"{source}: {_format_loc(loc)}: {exc}")
            return node
        if isinstance(node, Mapping):
            return {key: walk(value, (*loc, key)) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value, (*loc, i)) for i, value in enumerate(node)]
        return node

    expanded = walk(data, ())
    if problems:
        raise ConfigError("\n".join(problems))
    return expanded


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> tuple[StackConfig, Path]:
    """Read the stack file (the packaged default when ``path`` is None), expand the
    environment variables its strings name and validate it.

    ``environ`` is the environment to expand from; None means the process's own, for
    entry points (library code passes what its entry point gave it).
    """
    env = os.environ if environ is None else environ
    file = Path(path) if path is not None else default_config_path()
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such configuration file") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    return parse_config(expand_environment(data, env, str(file)), str(file)), file


def load_secrets(config: StackConfig, environ: Mapping[str, str] | None = None) -> Secrets:
    """Read secrets from the environment; a named but missing key is an error."""
    env = os.environ if environ is None else environ
    keys: dict[str, str] = {}
    missing = []
    for e in config.endpoints:
        if e.api_key_env:
            value = env.get(e.api_key_env)
            if value:
                keys[e.name] = value
            else:
                missing.append(f"endpoint {e.name!r} names api_key_env={e.api_key_env!r}")
    if missing:
        raise ConfigError(
            "environment variables not set: " + "; ".join(missing) + " (export them or remove "
            "api_key_env from the endpoint)"
        )
    return Secrets(
        token=env.get("LUFTPAUSE_TOKEN") or None,
        api_keys=keys,
        otel_endpoint=env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
    )
