"""``luftpause loadgen``: closed-loop agent load and sub-agent fan-out (spec H3).

Modules: ``mix`` (groups from flags or a TOML file), ``content`` (prompts and
tool schemas), ``agents`` (own-loop agents with the ``openai`` package),
``spawn`` (sub-agents over MCP through the runtime), ``stats`` (records and the
summary table/JSON) and ``main`` (the command line).
"""
