"""The luftpause runtime: an MCP server that runs journaled sub-agent loops (spec R1-R15).

Modules: ``server`` (MCP tools, HTTP app, auth), ``loop`` (run lifecycle, agent
loop, approvals, budgets), ``runs`` (run state, trees, replay), ``journal``
(``runs.jsonl``), ``hygiene`` (tool-call repair and refusal), ``upstream``
(tool-server clients), ``llm`` (dataplane client), ``decide`` and ``status``;
``main`` is the ``luftpause runtime`` entry point.
"""
