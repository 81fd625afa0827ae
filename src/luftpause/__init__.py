"""luftpause: run-aware admission control between agent frameworks and LLM engines."""

__version__ = "0.1.0"
