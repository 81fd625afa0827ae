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

import ipaddress
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
    # A field's docstring is its description: docs/reference/configuration.md is generated
    # from them (tools/gen_docs.py), so the page and the code cannot disagree.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


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
    """The ``priority`` of interactive turns."""
    batch: int
    """The ``priority`` of batch turns (must differ from ``interactive``)."""

    @model_validator(mode="after")
    def _differ(self) -> Self:
        if self.interactive == self.batch:
            raise ValueError("interactive and batch must differ, or the engine cannot order them")
        return self

    def for_class(self, service_class: str) -> int:
        return self.interactive if service_class == "interactive" else self.batch


class KvRetention(StrEnum):
    """How the dataplane asks an endpoint to keep a paused run's prefix (B8;
    docs/benchmarks/policies.md "What engines accept" says which engines accept what)."""

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
    """A unique name for the replica (letters, digits, ``_ . -``)."""
    url: str
    """Its base URL, ``http://`` or ``https://``."""
    kind: EndpointKind = EndpointKind.GENERATIVE
    """``"generative"`` (chat turns) or ``"single_pass"`` (classifiers, ``/v1/decide``)."""
    models: Annotated[tuple[str, ...], Field(min_length=1)]
    """The model names it serves."""
    api_key_env: str | None = None
    """The environment variable holding its API key (sent as ``Authorization: Bearer``); a
    named but unset variable is an error at start."""
    health_path: str = "/health"
    """The path probed for health; ``""``: always healthy."""
    metrics: MetricsFlavour = MetricsFlavour.AUTO
    """How to read its load: ``"sglang"``, ``"vllm"``, ``"auto"`` (either family of names) or
    ``"none"`` (it reports no load, so it is never capped)."""
    metrics_path: str = "/metrics"
    """Where its Prometheus text is."""
    load_from: tuple[str, ...] = ()
    """Base URLs whose metrics describe this replica's load (a router in front of engines)."""
    class_priority: ClassPriority | None = None
    """``{ interactive = 10, batch = 0 }``: the engine orders its own queue by request
    ``priority`` (SGLang ``--enable-priority-scheduling``, higher first; vLLM
    ``--scheduling-policy priority``, lower first: pick the values in your engine's
    direction). The dataplane sends each turn its class's value (a client's own ``priority``
    is kept), and the scheduler admits interactive turns there without holding them for the
    cap (S4); batch is still capped. Generative endpoints only."""
    null_usage_when_asked: bool = True
    """The engine writes ``"usage": null`` into each chunk only when a stream asks for usage
    (OpenAI's documented behaviour): the dataplane cuts the ones its own usage request
    caused. ``false`` for an engine that writes them whether asked or not (passed on as
    sent)."""
    native_apis: tuple[NativeApi, ...] = ()
    """Client APIs the endpoint serves itself besides Chat Completions: ``"messages"``
    (``/v1/messages``), ``"responses"`` (``/v1/responses``). Turns on those routes placed
    here pass through unchanged (only an alias's target model written in, no
    ``class_priority`` added) instead of being translated (B9). When every endpoint serving
    a model lists the API, requests the proxy cannot translate (stored responses, server
    tools, images by file ID) are passed on too, and images go on as sent whatever
    ``vision`` says. The endpoint's key also goes as ``x-api-key`` on ``/v1/messages``."""
    vision: bool = False
    """The models it serves take images: on ``/v1/messages`` and ``/v1/responses``, Anthropic
    ``image`` blocks and Responses ``input_image`` parts become Chat Completions
    ``image_url`` parts, in their order among the texts (B9). Images are forwarded only when
    every endpoint serving the model sets it (or serves the API natively); otherwise they are
    a ``400`` naming this setting. Generative endpoints only."""
    kv_retention: KvRetention = KvRetention.NONE
    """B8: ask the engine to keep a run's prefix after each turn for about the run's usual
    tool time. ``"vllm-router"``: the body gets ``vllm_xargs.agentic_context`` with the run as
    ``program_id`` and ``kv_retention_ttl_seconds`` (read by vllm-router 0.1.17's program
    scheduling); ``"fake"``: the same, and ending a run also sends the engine ``POST
    /kv_retention/release`` (the fake engine honours both); ``"none"``: no hint. A client's
    own ``vllm_xargs`` is passed on unchanged."""
    kv_tokens: Annotated[int, Field(ge=1)] | None = None
    """The engine's KV pool in tokens, for working-set admission; set, it overrides what its
    metrics report (SGLang ``sglang:max_total_num_tokens``, vLLM ``vllm:cache_config_info``)."""
    discover: Literal["static", "dns"] = "static"
    """``"static"``: ``url`` is one replica. ``"dns"``: ``url`` names a pool whose host is
    re-resolved every ``discover_every_s``: each address of its A/AAAA records (with the
    URL's port), or each target and port of its SRV records (a host starting with ``_``,
    e.g. ``_http._tcp.sglang.ns.svc.cluster.local``), is a replica named
    ``NAME@ADDRESS:PORT`` with every other setting of this entry (a Kubernetes headless
    Service lists its ready pods so). A replica whose address disappears leaves: its runs
    move at their next turn (B11)."""
    discover_every_s: Seconds = 10.0
    """How often a ``discover = "dns"`` pool is resolved again."""

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
    """The address the scheduler listens on."""
    grpc_port: Port = 5000
    """Its gRPC port (0: a free one)."""
    http_port: Port = 5001
    """Its status port: ``/status``, the page, ``/metrics`` (0: a free one)."""
    tcp_link: bool = True
    """Serve the Link over plain TCP on ``link_port`` (the admission round trip without
    HTTP/2); dataplanes learn the port when they resync. ``false``: they use the Link rpc on
    ``grpc_port``."""
    link_port: Port = 5002
    """The port of the Link over TCP (0: a free one, as it is whenever ``grpc_port`` is 0 and
    this is not set)."""
    link_hello_timeout_s: Annotated[float, Field(ge=0.01, le=3600)] = 5.0
    """A Link connection whose whole ``LinkHello`` has not arrived within this is closed
    (logged, naming the peer); also the time a connection to the gRPC port has to finish its
    HTTP/2 handshake."""
    link_max_unauthenticated: Annotated[int, Field(ge=1)] = 64
    """Link connections that may wait for their welcome at once; past it a new connection is
    closed at once (logged at most every 10 s). Welcomed dataplanes are not counted."""
    probe_period_s: Seconds = 2.0
    """How often each replica's health and load are probed; also the probe's timeout (S9)."""
    clock_tick_s: Seconds = 1.0
    """The expiry clock's period (S10)."""
    turn_timeout_s: Seconds = 600.0
    """A turn never reported finished is dropped after this and its slot freed (S10)."""
    run_idle_expiry_s: Seconds = 1800.0
    """A run with no turn, admitted or held, for this long is forgotten (S10)."""
    dataplane_grace_s: Seconds = 15.0
    """When a dataplane stops reporting (its process died, or it restarted under another
    ``--dataplane-id``), its admitted turns stay counted this long, then are released; one
    that reconnects in time keeps them (S11)."""
    cap_raise_step: Annotated[int, Field(ge=1)] = 1
    """Slots added to a capped replica per quiet probe at the cap (S2)."""
    queue_probes: Annotated[int, Field(ge=1)] = 2
    """Probes in a row that must see a queue before a replica is capped (S2)."""
    initial_cap: Annotated[int, Field(ge=0)] = 16
    """Turns a replica takes before its engine has first queued (batch turns only where the
    engine orders its queue by class), doubled on every probe that finds the engine running
    them all with an empty queue, until the first queue sets the cap. 0: no limit before the
    first queue."""
    keep_prefixes: bool = True
    """Prefix keeping: on a capped replica, continuing turns first (after S5), new batch runs
    gated by the runs pinned there, and evicted prefixes lower the cap."""
    prefix_miss_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    """A turn back from a tool that finds less than this share of its run's previous prompt
    cached counts as an evicted prefix."""
    interactive_pace_ms: Annotated[float, Field(ge=0)] = 100.0
    """The decode pace: while an interactive run lives on a replica, its batch turns are
    limited so that replies there stream at no more than this many milliseconds per token.
    0: off. With time-scaled fake engines, divide it by the time scale."""
    pace_min_tokens: Annotated[int, Field(ge=2)] = 16
    """Replies shorter than this many tokens are not timed by the decode pace."""
    interactive_target: str | None = None
    """The interactive target (B7) in one word: ``"1.3x"`` keeps interactive replies within
    1.3 times the replica's floor (the fastest pace of a reply there with at most one other
    batch turn beside it; above 1); ``"80ms"`` is ``interactive_pace_ms = 80``; ``"off"``
    turns the decode pace off. Unset: ``interactive_pace_ms`` governs; setting both is an
    error."""
    target_packing: bool = False
    """With a relative ``interactive_target`` only: new interactive runs go to the replicas
    where interactive runs live and meet the target, where the batch limit may reach 0 while
    another replica takes batch work (batch runs pinned there move at their next turn). An
    option: its gains in the simulator did not hold in the real-time flood."""
    tool_lease_min_s: Annotated[float, Field(gt=0)] = 10.0
    """The shortest lease a run's pause on a tool gets. A pause that outlives its lease stops
    counting as living on its replica and its interactive reservation lapses, until the run
    comes back."""
    tool_lease_default_s: Annotated[float, Field(gt=0)] = 120.0
    """The lease of a pause on a tool no run has come back from yet."""
    tool_lease_factor: Annotated[float, Field(ge=1)] = 2.0
    """A lease is this many times (smoothed time + 4 × its deviation) of the pause's slowest
    tool, learned from the runs that came back from it."""
    working_set: Literal["off", "replace", "both"] = "off"
    """Working-set admission (B5): ``"off"``; ``"replace"``: a new batch run starts on a
    replica only while the known contexts of the runs living there plus an estimate of its
    own fit in ``working_set_share`` of the engine's KV pool, instead of prefix keeping's run
    limit; ``"both"``: beside it."""
    working_set_share: Annotated[float, Field(gt=0, le=1)] = 0.9
    """The share of the engine's KV pool the working set plus a new run's estimate may fill."""
    working_set_kv_usage: Annotated[float, Field(ge=0, le=1)] = 0.0
    """With working-set admission on, no new batch run starts while the engine's last KV
    usage is at or above this (0: not checked)."""
    fairness: Literal["in_flight", "tokens"] = "in_flight"
    """Which caller's held turn goes first within a class: ``"in_flight"`` (fewest turns in
    flight, S5) or ``"tokens"`` (least weighted tokens served: virtual token counters, B3)."""
    prompt_weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    """With ``fairness = "tokens"``: what a prompt token adds to its caller's counter."""
    completion_weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 2.0
    """With ``fairness = "tokens"``: what a completion token adds (not both weights 0)."""
    batch_order: Literal["arrival", "attained"] = "arrival"
    """Which batch run's held turn goes first after the caller: ``"arrival"``, or
    ``"attained"`` (least attained service first, B2)."""
    attained_measure: Literal["tokens", "time"] = "tokens"
    """With ``batch_order = "attained"``: a run's service as its finished turns' uncached
    prompt + completion tokens (``"tokens"``) or seconds from admission to end (``"time"``)."""
    status_runtimes: tuple[
        Annotated[str, Field(pattern=r"^https?://[^/?#@\s]+(:[0-9]+)?/?$")], ...
    ] = ()
    """Runtime base URLs (``http://host:port``) the status page may show besides loopback
    ones; the scheduler fetches their ``/status`` for the page (S12)."""
    members_file: str | None = None
    """A TOML or JSON file of replicas to add to configured endpoints, as a config-management
    tool or a sidecar writes it: ``{ ENDPOINT = ["http://10.0.0.5:30000", ...] }``. Each URL
    is a replica named ``ENDPOINT@HOST:PORT`` with that endpoint's other settings. Read
    again whenever it changes, without a restart; a file that cannot be used is logged and
    the last good one kept (B11)."""
    usage_file: str | None = None
    """Where the callers' token usage today (``daily_tokens``) is kept across restarts: a
    JSON file rewritten, atomically, every few seconds while it changes and at shutdown.
    None: kept in memory only, so a restarted scheduler starts every budget afresh."""
    members_file_every_s: Seconds = 2.0
    """How often ``members_file`` is checked for a change."""
    dns_servers: tuple[str, ...] = ()
    """Name servers (``HOST`` or ``HOST:PORT``, an IP address) asked for ``discover = "dns"``
    pools instead of the system's, e.g. ``["127.0.0.1:8600"]`` for Consul's DNS; empty: the
    system resolver (``/etc/resolv.conf``)."""

    @field_validator("dns_servers")
    @classmethod
    def _dns_servers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for server in value:
            dns_server(server)
        return value

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


def dns_server(text: str) -> tuple[str, int]:
    """``"10.0.0.2"`` -> ("10.0.0.2", 53); ``"127.0.0.1:8600"``, ``"[::1]:53"``: with the
    port. Raises ``ValueError`` naming what is wrong."""
    host, port = text, 53
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port_text = rest.removeprefix(":")
            port = int(port_text) if port_text.isdigit() else -1
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        port = int(port_text) if port_text.isdigit() else -1
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{text!r}: a name server is an IP address, with :PORT or not") from None
    if not 0 < port < 65536:
        raise ValueError(f"{text!r}: the port must be from 1 to 65535")
    return host, port


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
    """The address the dataplane listens on."""
    port: Port = 8080
    """Its port (0: a free one)."""
    scheduler: str = "127.0.0.1:5000"
    """``host:port`` of the scheduler's gRPC server."""
    engine_connect_timeout_s: Seconds = 2.0
    """Connect timeout towards engines (there is no read timeout: replies may be long)."""
    report_reconnect_s: Seconds = 1.0
    """The pause before reconnecting to the scheduler."""
    report_flush_ms: Annotated[float, Field(ge=0, le=1000)] = 5.0
    """Turn reports wait up to this long to share one write to the scheduler with later ones
    (0: every report at once). Admission requests never wait; a finished turn's slot is freed
    at the scheduler up to this much later."""
    tcp_link: bool = True
    """Use the scheduler's Link over plain TCP where it offers one (``false``: the gRPC
    stream)."""
    tool_call_id_memory_s: Seconds = 1800.0
    """How long echoed tool call IDs identify a run (D2); the scheduler uses the same value."""
    tool_call_id_sweep_s: Seconds = 60.0
    """How often expired tool call IDs are swept."""
    run_idle_prune_s: Seconds = 1800.0
    """Idle runs are forgotten by the dataplane after this."""
    caller_max_bytes: Annotated[int, Field(ge=1)] = 128
    """The caller header is cut to this many bytes."""
    max_body_bytes: Annotated[int, Field(ge=1024)] = 32 * 1024 * 1024
    """A larger request body is refused with 413 before it reaches an engine."""
    workers: Annotated[int, Field(ge=1, le=64)] = 1
    """``luftpause up`` starts this many dataplane processes on the one ``port``
    (SO_REUSEPORT: the kernel spreads connections over them; each links to the scheduler on
    its own). Needs a fixed ``port``."""
    model_aliases: Mapping[str, str] = Field(default_factory=dict)
    """Model names clients ask for that no endpoint serves → a model a generative endpoint
    serves: exact names or shell-style patterns, tried in file order (``"claude-haiku-*" =
    "small"`` before ``"claude-*" = "big"``); a target no endpoint serves is an error at
    start (B9)."""
    session_headers: tuple[str, ...] = ("x-session-affinity", "x-session-id")
    """Request headers that name a harness's session (run ``session-<value>``), tried in order
    when a turn has no ``x-luftpause-run-id`` and no Claude Code or Codex session header
    (B4)."""

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
    """Its name; sub-agents see its tools under it."""
    url: str | None = None
    """Its Streamable HTTP URL (set this or ``command``)."""
    command: tuple[str, ...] = ()
    """The argv of a stdio server (set this or ``url``)."""
    env: Mapping[str, str] = Field(default_factory=dict)
    """Environment variables for a stdio server."""

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if (self.url is None) == (not self.command):
            raise ValueError("set exactly one of 'url' (HTTP) or 'command' (stdio)")
        if self.url is not None:
            object.__setattr__(self, "url", _check_url(self.url))
        return self


class RuntimeSettings(_Frozen):
    host: str = "127.0.0.1"
    """The address the runtime listens on."""
    port: Port = 7000
    """Its port (0: a free one); MCP is served at ``/mcp``."""
    state_dir: str = "./state"
    """Where ``runs.jsonl``, ``tasks.jsonl`` and ``request-state.key`` live."""
    dataplane_url: str = "http://127.0.0.1:8080"
    """Where sub-agent turns go."""
    turn_timeout_s: Seconds = 600.0
    """Runtime → dataplane timeout per request of a turn."""
    default_max_tokens: Annotated[int, Field(ge=0)] = 256
    """Reply length per turn (0: the engine decides)."""
    default_max_tool_calls: Annotated[int, Field(ge=0)] = 8
    """Tool-call budget per run."""
    await_timeout_s: Seconds = 60.0
    """``await``'s default timeout."""
    await_max_s: Seconds = 600.0
    """``await``'s longest timeout."""
    retry_after_default_s: Seconds = 1.0
    """The wait after an engine's 429 without ``Retry-After``."""
    stream_turns: bool = True
    """Stream each turn (asking for usage) and put the reply back together, so the dataplane
    times its decode and the decode pace covers sub-agents; ``false``: one non-streamed
    request per turn. A stream that breaks off before ``[DONE]`` is retried as a 5xx is. An
    upstream that streams no usage although asked leaves runs' token counts (and budgets) at
    0, and the runtime logs a warning saying to set this to ``false``."""
    default_model: str | None = None
    """The model of a ``spawn`` that names none (unset: the first model listed)."""
    tool_servers: tuple[ToolServer, ...] = ()
    """Upstream MCP servers (``[[runtime.tool_servers]]``): ``name``, and either ``url``
    (Streamable HTTP) or ``command`` (stdio argv) with optional ``env``."""
    class_headers: Mapping[ServiceClass, Mapping[str, str]] = Field(default_factory=dict)
    """For a ``dataplane_url`` that is not a luftpause dataplane (a gateway or router that
    orders turns by class): headers added to every turn of a class, e.g. ``interactive =
    {"x-smg-priority" = "interactive"}``; not ``authorization``, ``x-luftpause-*`` or the
    request's own framing headers."""
    run_id_headers: tuple[str, ...] = ()
    """Headers that carry the run's ID on every turn, e.g. ``["x-smg-routing-key"]`` for a
    gateway's sticky sessions."""
    class_priority: Mapping[ServiceClass, int] = Field(default_factory=dict)
    """A body ``priority`` per class, e.g. ``{interactive = 10, batch = 0}``, for engines that
    order their queue by it (a turn's own ``priority`` is kept)."""

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
    """Its name (unique among the fake engines)."""
    port: Port
    """Its port."""
    model: str = "llama-3.2-1b"
    """The model it serves."""
    args: tuple[str, ...] = ()
    """Extra command-line flags for ``luftpause fake-engine``."""


class FakeMcp(_Frozen):
    """The fake MCP tool server `luftpause up` starts."""

    port: Port = 9000
    """Its port."""
    args: tuple[str, ...] = ()
    """Extra command-line flags for ``luftpause fake-mcp``."""


class Fakes(_Frozen):
    """What ``luftpause up`` starts besides the services."""

    engines: tuple[FakeEngine, ...] = ()
    """Fake engines (``[[fakes.engines]]``)."""
    mcp: FakeMcp | None = None
    """The fake MCP tool server (``[fakes.mcp]``)."""


CALLER_NAME = r"^[A-Za-z0-9_.:-]+$"


class CallerConfig(_Frozen):
    """A caller bound to a key (``[[callers]]``, B13): who a request is, which classes it
    may use, its share under contention and its limits come from the key it presents,
    not from the headers it sends. The key itself never goes in this file."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=CALLER_NAME)]
    """The caller's name: in the scheduler's order, ``/status``, metrics and the journal.
    A request with this key may name a sub-caller under it (``x-luftpause-caller: ci`` is
    ``NAME/ci``)."""
    key_env: str | None = None
    """An environment variable holding the key (several keys, for a rotation, separated by
    commas or spaces). Read at start."""
    key_file: str | None = None
    """A file holding the key (a relative path is from the service's working directory, as
    every path here): one per line (several during a rotation), ``#`` comments,
    or ``sha256:HEX`` lines holding a key's hash instead of the key. Read again when it
    changes (checked every 2 seconds) and on SIGHUP, without a restart:
    this is how keys rotate (a Kubernetes Secret mounted as a file updates in place)."""
    classes: Annotated[tuple[ServiceClass, ...], Field(min_length=1)] = ("batch",)
    """The classes this caller may use. Batch only unless the operator grants
    ``"interactive"``."""
    on_denied_class: Literal["downgrade", "refuse"] = "downgrade"
    """A request asking for a class this caller may not use: ``"downgrade"`` serves it in a
    class it may use and says so in the ``x-luftpause-class-denied`` response header;
    ``"refuse"`` answers 403."""
    weight: Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False)] = 1.0
    """Its share under contention: a caller of weight 2 gets twice the turns in flight
    (``fairness = "in_flight"``) or twice the weighted tokens (``"tokens"``) of a caller of
    weight 1 while both wait. Its sub-callers share it."""
    max_in_flight: Annotated[int, Field(ge=1)] | None = None
    """The most of its turns (its sub-callers' included) in engines at once; more are held
    by the scheduler, not refused. None: no limit."""
    tokens_per_minute: Annotated[int, Field(ge=1)] | None = None
    """Prompt + completion tokens per minute (a bucket of this size that refills at this
    rate, charged with each finished turn's usage). A turn asked for while the bucket is
    empty is a 429 with ``Retry-After``. None: no limit."""
    daily_tokens: Annotated[int, Field(ge=1)] | None = None
    """Prompt + completion tokens per UTC day. Once spent, turns are 429s with
    ``Retry-After`` until midnight UTC. None: no budget."""

    @model_validator(mode="before")
    @classmethod
    def _no_inline_key(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and ("key" in data or "api_key" in data):
            raise ValueError(
                "a caller's key never goes in the stack file: name an environment variable "
                "(key_env) or a file (key_file); `luftpause keys new NAME` makes a key"
            )
        return data

    @model_validator(mode="after")
    def _has_key(self) -> Self:
        if not self.key_env and not self.key_file:
            raise ValueError(f"caller {self.name!r} needs key_env or key_file (or both)")
        if len(set(self.classes)) != len(self.classes):
            raise ValueError(f"caller {self.name!r}: classes lists a class twice")
        return self


class StackConfig(_Frozen):
    endpoints: tuple[Endpoint, ...] = ()
    scheduler: SchedulerSettings = SchedulerSettings()
    dataplane: DataplaneSettings = DataplaneSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    fakes: Fakes = Fakes()
    callers: tuple[CallerConfig, ...] = ()
    """Callers bound to keys (``[[callers]]``; B13). Empty: the one shared
    ``LUFTPAUSE_TOKEN`` (or nothing) guards the stack and callers name themselves."""

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
        callers: set[str] = set()
        for i, c in enumerate(self.callers):
            if c.name in callers:
                raise ValueError(f"callers[{i}].name: duplicate caller name {c.name!r}")
            callers.add(c.name)
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
    if config.callers and not env.get("LUFTPAUSE_TOKEN"):
        raise ConfigError(
            "[[callers]] needs LUFTPAUSE_TOKEN set: the services use it among themselves, "
            "and without it anyone could reach the scheduler and the runtime unchecked "
            "(export a long random LUFTPAUSE_TOKEN and keep it from the callers)"
        )
    return Secrets(
        token=env.get("LUFTPAUSE_TOKEN") or None,
        api_keys=keys,
        otel_endpoint=env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
    )
