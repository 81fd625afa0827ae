"""``luftpause runtime``: the MCP sub-agent runtime on :7000 (``/mcp``, ``GET /status``).

Start-up order: bind the socket, open and replay the journal (``runs.jsonl``
under the state dir), connect the upstream tool servers, resume unfinished runs,
then accept connections and write the ready file. SIGTERM/SIGINT stop the
server; running sub-agents are not ended but resume at the next start.

Default service class of ``spawn`` (R2, S4). The dataplane treats a turn with
no class as ``batch``; a sub-agent spawned over MCP is different: the MCP
client (Claude Code, Cursor, ...) spawns it on behalf of a person who is
waiting on ``await`` or ``run``, which is what the ``interactive`` class is for.
The reference product's MCP measurements also treat the MCP client's
sub-agents as the interactive work that batch floods must not delay, and its
batch load comes from generators that name their class explicitly. So:
``serviceClass`` defaults to the parent run's class when ``parent`` is given
(a subtree is one piece of work), else ``interactive``. Pipelines that fan out
bulk work pass ``serviceClass: "batch"``.

Callers bound to keys (B13): with ``[[callers]]``, ``/mcp`` takes each caller's key
(read at start from its ``key_env``/``key_file``; a relative ``key_file`` is relative
to the working directory, as ``state_dir`` is; the files are read again when they
change and on SIGHUP) besides ``LUFTPAUSE_TOKEN``. A key that cannot be used stops
the start with a configuration error naming the caller (status 2).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
from pathlib import Path

from pydantic import ValidationError

from luftpause.callers import Gate, gate_for, install_reload_signal
from luftpause.config import ConfigError, RuntimeSettings, StackConfig, load_secrets
from luftpause.runtime.journal import Journal, JournalError
from luftpause.runtime.llm import DataplaneClient
from luftpause.runtime.loop import Runtime
from luftpause.runtime.server import MCP_PATH, build_app, malformed_answer
from luftpause.runtime.upstream import ToolHub
from luftpause.serving import Bootstrap, Service, add_service_arguments, load_config_or_exit
from luftpause.telemetry import Instrumentation

SERVICE = "runtime"
log = logging.getLogger("luftpause.runtime")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(
        parser, port_help="HTTP port for /mcp and /status (default: runtime.port, 7000)"
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where runs.jsonl lives (default: runtime.state_dir, ./state)",
    )
    parser.add_argument(
        "--dataplane-url",
        metavar="URL",
        help="base URL of the dataplane, without /v1 (default: runtime.dataplane_url)",
    )
    parser.add_argument(
        "--default-model",
        metavar="NAME",
        help="model for spawn when none is given (default: runtime.default_model, else the "
        "first model the dataplane lists)",
    )


def settings_from(config: StackConfig, args: argparse.Namespace) -> RuntimeSettings:
    """``config.runtime`` with the command-line overrides, validated like the file."""
    data = config.runtime.model_dump()
    for flag, key in (
        ("state_dir", "state_dir"),
        ("dataplane_url", "dataplane_url"),
        ("default_model", "default_model"),
        ("host", "host"),
        ("port", "port"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            data[key] = value
    try:
        return RuntimeSettings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise SystemExit(f"luftpause runtime: bad option: {problems}") from None


KEY_NAME = "request-state.key"


def request_state_key(state_dir: Path) -> bytes:
    """The secret that seals input-required state, kept in the state dir (mode 0600) so
    a client's pending approval round stays valid across a restart."""
    path = state_dir / KEY_NAME
    try:
        key = path.read_bytes()
        if len(key) >= 32:
            return key
        log.warning("%s is shorter than 32 bytes: writing a new key", path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise SystemExit(f"luftpause runtime: cannot read {path}: {exc.strerror}") from None
    key = secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise SystemExit(f"luftpause runtime: cannot write {path}: {exc.strerror}") from None
    return key


async def start(
    svc: Service, settings: RuntimeSettings, token: str | None, gate: Gate | None = None
) -> None:
    sock = svc.bind(settings.port)
    if gate is not None:
        install_reload_signal(gate)
    journal = Journal(Path(settings.state_dir))
    try:
        lines = journal.open()
    except JournalError as exc:
        raise SystemExit(f"luftpause runtime: {exc}") from None
    llm = DataplaneClient(
        settings.dataplane_url,
        token=token,
        turn_timeout_s=settings.turn_timeout_s,
        retry_after_default_s=settings.retry_after_default_s,
        class_headers=settings.class_headers,
        run_id_headers=settings.run_id_headers,
        class_priority=settings.class_priority,
        stream_turns=settings.stream_turns,
    )
    hub = ToolHub(settings.tool_servers)
    rt = Runtime(settings, journal, llm, hub)

    async def on_start() -> None:
        await hub.start()
        rt.recover(lines)

    async def on_stop() -> None:
        await rt.shutdown()
        await hub.close()
        await llm.aclose()

    app = build_app(
        rt,
        host=settings.host,
        token=token,
        on_start=on_start,
        on_stop=on_stop,
        request_state_key=request_state_key(Path(settings.state_dir)),
        gate=gate,
    )
    await svc.serve_asgi("http", sock, app, malformed=malformed_answer)
    svc.on_ready(
        lambda: log.info(
            "runtime listening on http://%s:%d%s (dataplane %s, state %s)",
            settings.host,
            svc.ports["http"],
            MCP_PATH,
            settings.dataplane_url,
            settings.state_dir,
        )
    )


def main(args: argparse.Namespace) -> int:
    boot = Bootstrap(SERVICE, args, os.environ)
    config: StackConfig = load_config_or_exit(args.config)
    settings = settings_from(config, args)
    try:
        # Only the token matters here; engine API keys are the dataplane's business.
        secrets = load_secrets(config.model_copy(update={"endpoints": ()}))
        gate = gate_for(config.callers, os.environ, secrets.token)
    except ConfigError as exc:
        print(f"luftpause runtime: configuration error:\n{exc}", file=sys.stderr)
        return 2
    if not secrets.token:
        log.warning("LUFTPAUSE_TOKEN is not set: /mcp and /status accept every request (X2)")
    if gate.keyring is not None:
        log.info(
            "callers: %s (%d keys); /mcp takes their keys or LUFTPAUSE_TOKEN",
            ", ".join(gate.keyring.callers),
            len(gate.keyring),
        )
    return boot.run(
        settings.host,
        lambda svc: start(svc, settings, secrets.token, gate),
        # The openai client reaches the dataplane over httpx, the MCP client the HTTP
        # tool servers over httpx2 (it also puts the trace context in each request's _meta).
        instrumentations=(Instrumentation.ASGI, Instrumentation.HTTPX, Instrumentation.HTTPX2),
    )
