"""Test-bench instruments: a simulated engine and fake MCP tools.

Only tests, benchmarks and the CLI import this package.
"""
