"""An OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` with protobuf bodies
(``opentelemetry-proto``), kept in memory. Runs on 127.0.0.1:0 in a thread."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from typing import Any

from _serve import ThreadServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"])])
        self._server = ThreadServer(app)
        self.url = self._server.url

    async def _traces(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        got = []
        for resource_spans in message.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    got.append(
                        ReceivedSpan(
                            service=service,
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._lock:
            self.spans.extend(got)
        return Response(
            ExportTraceServiceResponse().SerializeToString(),
            media_type="application/x-protobuf",
        )

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()
