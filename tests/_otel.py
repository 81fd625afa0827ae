"""Spans in memory for tests: the SDK's InMemorySpanExporter on the global provider.

The global tracer provider can be set once per process, so every test module that
looks at spans shares one exporter; :func:`memory_spans` clears it for each use.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: InMemorySpanExporter | None = None


def memory_spans() -> InMemorySpanExporter:
    """The shared exporter, emptied; spans finished from now on land in it."""
    global _exporter
    if _exporter is None:
        _exporter = InMemorySpanExporter()
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
    _exporter.clear()
    return _exporter


def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]
