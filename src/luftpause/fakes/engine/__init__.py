"""The fake inference engine (H1): a pure SGLang-like engine model and its HTTP server.

* ``model`` - the pure, deterministic continuous-batching model (``EngineModel``).
* ``tokens`` - token counting (``ceil(chars / 4)``) and prompt rendering.
* ``script`` - what the engine says: filler, reply lengths, tool calls, logprobs, labels.
* ``server`` - ``luftpause fake-engine``: the model in real time behind HTTP (a package:
  driver, settings, metrics, faults, wire, chat, app, cli).
"""
