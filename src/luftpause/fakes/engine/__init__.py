"""The fake inference engine (H1): a pure SGLang-like engine model and its HTTP server.

* ``model`` - the pure, deterministic continuous-batching model (``EngineModel``).
* ``tokens`` - token counting (``ceil(chars / 4)``) and prompt rendering.
* ``script`` - what the engine says: filler, tool calls, logprobs, labels.
* ``server`` - ``luftpause fake-engine``: the model in real time behind HTTP.
"""
