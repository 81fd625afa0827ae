"""``luftpause fake-engine``: the engine model behind an OpenAI-compatible HTTP server (H1).

The shell around the pure modules (``model``, ``script``, ``tokens``), one module
per concern:

* ``driver`` - ``EngineDriver`` runs the model in real time on the event loop.
* ``settings`` - ``ServerConfig`` and the command-line flags that fill it.
* ``metrics`` - ``/metrics`` in SGLang's or vLLM's Prometheus names.
* ``faults`` - fault injection (``x-fake-fault``, ``--fault``) and connection drops.
* ``wire`` - request bodies and errors; ``chat.completion``, SSE chunk and
  ``/classify`` rendering.
* ``chat`` - the chat completions handler.
* ``app`` - ``create_app``: every route.
* ``cli`` - ``main``, the process entry point.

Model names (S6): like SGLang, the engine answers a chat completion (or
``/classify``) for any model name and echoes it; with ``--strict-models`` it
answers vLLM's 404 for a name it does not list. ``/v1/models`` lists the
configured names either way.

Per-request script overrides: ``x-fake-tool-results: N``,
``x-fake-text-tool-calls: 1``, ``x-fake-wrong-types: 1``, ``x-fake-plan-key: KEY``
(every draw from the key and the tool results so far, not from the prompt; a first user
message holding ``[plan:KEY]`` does the same where a proxy drops the header); the body's
``ignore_eos: true`` (SGLang/vLLM) makes a text answer run until ``max_tokens``.
Real routers in front of the engines: docs/guides/routers.md.
"""

from __future__ import annotations

from luftpause.fakes.engine.server.app import create_app
from luftpause.fakes.engine.server.cli import main
from luftpause.fakes.engine.server.driver import EngineDriver
from luftpause.fakes.engine.server.faults import FAULTS, MIDSTREAM_CHUNKS
from luftpause.fakes.engine.server.settings import (
    DEFAULT_LABELS,
    DEFAULT_MODEL,
    ServerConfig,
    add_arguments,
    config_from_args,
)

__all__ = [
    "DEFAULT_LABELS",
    "DEFAULT_MODEL",
    "FAULTS",
    "MIDSTREAM_CHUNKS",
    "EngineDriver",
    "ServerConfig",
    "add_arguments",
    "config_from_args",
    "create_app",
    "main",
]
