"""Measurement as a layer: the workloads, records and plots ``luftpause loadgen``,
``luftpause sim`` and the benchmarks share.

Modules: ``mix`` (groups from flags or a TOML file), ``workload`` (run plans and
the profiles they are sampled from), ``trace`` (a trace of runs read as plans),
``content`` (prompts and tool schemas), ``shaped`` (the text a plan's prompts are
made of), ``stats`` (records and the summary table/JSON), ``progress`` (the live
progress line), ``cli`` (the options both commands take) and ``plot`` (one SVG
writer for every chart). Nothing here opens a connection: the load generator plays
these workloads against engines, the simulator against the engine model in virtual
time.
"""
