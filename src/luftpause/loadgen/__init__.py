"""``luftpause loadgen``: closed-loop agent load and sub-agent fan-out (spec H3).

Modules: ``agents`` (own-loop agents with the ``openai`` package), ``shaped``
(own-loop agents that play a run plan), ``spawn`` (sub-agents over MCP through the
runtime), ``pool`` (the MCP sessions it hands out) and ``main`` (the command line). The
groups, workloads, prompts and records it plays and reports are ``luftpause.measure``'s,
which the simulator shares.
"""
