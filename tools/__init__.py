"""The project's tools: code generators, the chaos run and the benchmarks (tools.bench)."""
