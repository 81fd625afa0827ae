"""Error answers that come from below a service's own code, shaped as JSON.

Every luftpause service answers its errors as JSON in its documented shape. Two
layers under the services' apps answer some errors themselves, in plain text or
with an empty body; this module gives each of those answers the service's shape.

**uvicorn's parser.** uvicorn's httptools protocol parses a request with llhttp
before any ASGI code runs. A request llhttp refuses (a control character in a
header value, a space in a header name, a bad method, request line, URL,
``Content-Length`` or chunk size) is answered by
``HttpToolsProtocol.send_400_response``: ``400 text/plain "Invalid HTTP request
received."``, then the connection is closed. :func:`json_errors_protocol` is that
protocol with only this answer replaced: still 400 with uvicorn's default headers
and ``Connection: close``, but a JSON body the service builds from a
:class:`Malformed` (what llhttp objected to, in words, and what of the request was
read before it: the target and the complete headers). Keep-alive, pipelining, flow
control and every other behaviour are uvicorn's, unchanged. The parser's exception
is the one ``data_received`` is handling when it calls ``send_400_response``
(``sys.exc_info()``); the chunk it was fed is kept for that call only, so the
message can name the header at fault.

**Frameworks and libraries under the app.** Starlette's router answers an unknown
path with ``404 "Not Found"`` and a wrong method with ``405 "Method Not Allowed"``
in plain text, its error middleware a bug with ``500 "Internal Server Error"``;
the MCP SDK answers some refusals in plain text or empty. :class:`JsonErrorAnswers`
is ASGI middleware that lets every answer through unchanged except an error
status (4xx, 5xx) whose body is not JSON: that one is replaced by the JSON body the
service builds from a :class:`Refusal` (the status, the request, the text the
lower layer gave), with the same status and the lower layer's other headers
(``Allow``, ``WWW-Authenticate``).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

import httptools
from starlette.datastructures import Headers
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from luftpause.shown import shown

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# --------------------------------------------------------------------------- parser


@dataclass(frozen=True)
class Malformed:
    """A request uvicorn's parser refused, as far as it was read."""

    problem: str  # what is wrong with it, for a person: "malformed HTTP request: ..."
    target: str  # the request target read before the fault (latin-1), "" if none
    headers: tuple[
        tuple[bytes, bytes], ...
    ]  # complete headers read before the fault (names lowercased)

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    def header(self, name: bytes) -> str | None:
        """A header read before the fault (latin-1, surrounding whitespace kept), or None."""
        return next((v.decode("latin-1") for k, v in self.headers if k == name), None)


# Body and extra response headers for a malformed request.
MalformedAnswer = Callable[[Malformed], tuple[dict[str, Any], dict[str, str]]]


def plain_error(malformed: Malformed) -> tuple[dict[str, Any], dict[str, str]]:
    """The shape of the services' own HTTP errors: ``{"error": {"message": ...}}``."""
    return {"error": {"message": malformed.problem}}, {}


_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 §5.6.2
_NOT_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # what llhttp refuses in a value
_NOT_TOKEN = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")
_VALUE_RULE = "a header value may hold visible characters, spaces and tabs only"


def _header_lines(chunk: bytes) -> list[bytes]:
    """The lines of the request head in ``chunk`` (the request line included)."""
    return chunk.partition(b"\r\n\r\n")[0].split(b"\r\n")


def _bad_value(chunk: bytes) -> str | None:
    for line in _header_lines(chunk):
        name, colon, value = line.partition(b":")
        found = _NOT_VALUE.search(value) if colon and _TOKEN.fullmatch(name) else None
        if found:
            quoted = shown(name.decode("ascii"))
            return (
                f"the value of header {quoted} holds a control character "
                f"(0x{value[found.start()]:02x}); {_VALUE_RULE}"
            )
    return None


def _bad_name(chunk: bytes) -> str | None:
    for line in _header_lines(chunk)[1:]:
        name = line.partition(b":")[0]
        found = _NOT_TOKEN.search(name)
        if found:
            quoted = shown(name.decode("latin-1"))
            return (
                f"header name {quoted} holds a character a header name may not hold "
                f"(0x{name[found.start()]:02x}); names are letters, digits and !#$%&'*+-.^_`|~"
            )
    return None


def describe_parser_error(exc: BaseException | None, chunk: bytes) -> str:
    """What llhttp refused, for a person (``exc`` is the parser's exception, ``chunk``
    the bytes it was fed when it raised)."""
    reason = str(exc) if isinstance(exc, httptools.HttpParserError) else ""
    detail: str | None = None
    if reason == "Invalid header value char":
        detail = _bad_value(chunk) or f"a header value holds a control character; {_VALUE_RULE}"
    elif reason in ("Invalid header token", "Invalid header field char"):
        detail = (
            _bad_name(chunk) or "a header name holds a space, a control character or a separator"
        )
    elif reason.startswith("Missing expected CR") or reason.startswith("Missing expected LF"):
        detail = f"a header line holds a bare CR or LF; lines end with CRLF and {_VALUE_RULE}"
    elif isinstance(exc, httptools.HttpParserInvalidMethodError):
        detail = (
            "this is not HTTP/1.1 (TLS sent to a plain-HTTP port?)"
            if chunk[:1] == b"\x16"
            else "the method is not an HTTP method"
        )
    elif isinstance(exc, httptools.HttpParserInvalidURLError):
        detail = (
            "the request target holds a character a URL may not hold (a control character, "
            "a space or a byte over 0x7f); percent-encode it"
        )
    elif reason.startswith("Expected HTTP/"):
        detail = (
            "the request line is not 'METHOD target HTTP/1.1' (a space in the target? "
            "percent-encode it)"
        )
    elif isinstance(exc, httptools.HttpParserCallbackError):
        # In practice uvicorn's on_headers_complete failing to split the target (parse_url).
        detail = "the request target is not a URL this server can read (its host or port)"
    elif reason:
        detail = f"the HTTP parser refused it: {reason}"
    return f"malformed HTTP request: {detail or 'the HTTP parser refused it'}"


class JsonErrorsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; a request its parser refuses gets a JSON 400 (see
    the module docstring). Build one per answer with :func:`json_errors_protocol`."""

    answer: ClassVar[MalformedAnswer] = staticmethod(plain_error)
    _chunk: bytes = b""

    def data_received(self, data: bytes) -> None:
        self._chunk = data
        try:
            super().data_received(data)
        finally:
            self._chunk = b""

    def _unsupported_upgrade_warning(self) -> None:
        # Services run with ``ws="none"``: an Upgrade request is answered as plain HTTP
        # by the app; uvicorn's warning would tell the operator to install a WebSocket
        # library nobody needs.
        self.logger.debug("Upgrade request answered as plain HTTP.")

    def send_400_response(self, msg: str) -> None:
        # Called from the ``except httptools.HttpParserError`` in ``data_received``.
        exc = sys.exc_info()[1]
        headers = tuple(getattr(self, "headers", None) or ())
        target = bytes(getattr(self, "url", b"") or b"").decode("latin-1")
        malformed = Malformed(describe_parser_error(exc, self._chunk), target, headers)
        try:
            body, extra = type(self).answer(malformed)
            content = json.dumps(body).encode()
            lines = [_header_line(name, value) for name, value in extra.items()]
        except Exception:  # a fault in an answer must not cost the client its 400
            self.logger.exception("building the answer to a malformed request failed")
            content, lines = json.dumps(plain_error(malformed)[0]).encode(), []
        out = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            out.extend([name, b": ", value, b"\r\n"])
        out.extend(lines)
        out.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(content)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                content,
            ]
        )
        self.transport.write(b"".join(out))
        self.transport.close()


def _header_line(name: str, value: str) -> bytes:
    line = f"{name}: {value}\r\n".encode("latin-1")
    if _NOT_VALUE.search(line[:-2]):  # never a header split by a value the client sent
        raise ValueError(f"header {name!r} holds a control character")
    return line


def json_errors_protocol(answer: MalformedAnswer = plain_error) -> type[JsonErrorsProtocol]:
    """uvicorn's httptools protocol answering a malformed request with ``answer``'s JSON
    (pass it to ``uvicorn.Config(http=...)``)."""
    return type("JsonErrorsProtocol", (JsonErrorsProtocol,), {"answer": staticmethod(answer)})


# --------------------------------------------------------------------------- app layer


@dataclass(frozen=True)
class Refusal:
    """An error answer without a JSON body, from a layer under the service's app."""

    status: int
    method: str
    path: str
    headers: Headers  # the request's
    text: str  # the body that layer gave (often empty)
    response_headers: Headers

    @property
    def phrase(self) -> str:
        try:
            return HTTPStatus(self.status).phrase
        except ValueError:
            return f"status {self.status}"


# The JSON body a service answers a refusal with.
RefusalBody = Callable[[Refusal], dict[str, Any]]

_MAX_TEXT = 4096  # of a lower layer's own body, kept for the message
_DROPPED = (b"content-type", b"content-length", b"transfer-encoding")


def _is_json(content_type: bytes) -> bool:
    media = content_type.partition(b";")[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


class JsonErrorAnswers:
    """ASGI middleware: an error answer (status >= 400) whose body is not JSON is
    answered instead with ``body(refusal)`` as JSON, same status; every other answer
    passes unchanged (see the module docstring)."""

    def __init__(self, app: ASGIApp, body: RefusalBody) -> None:
        self.app = app
        self.body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] | None = None  # a refusal's start, held until its body ends
        text = bytearray()

        async def reshape(message: dict[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = message.get("headers") or []
                ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if message["status"] >= 400 and not _is_json(ctype):
                    start = message
                    return
            elif start is not None and message["type"] == "http.response.body":
                if len(text) < _MAX_TEXT:
                    text.extend(message.get("body", b"")[: _MAX_TEXT - len(text)])
                if not message.get("more_body", False):
                    await self._answer(scope, start, bytes(text), send)
                return
            await send(message)

        await self.app(scope, receive, reshape)

    async def _answer(self, scope: Scope, start: dict[str, Any], text: bytes, send: Send) -> None:
        kept = [(k, v) for k, v in start.get("headers") or [] if k.lower() not in _DROPPED]
        refusal = Refusal(
            status=int(start["status"]),
            method=str(scope.get("method", "")),
            path=str(scope.get("path", "")),
            headers=Headers(scope=scope),
            text=text.decode("utf-8", "replace").strip(),
            response_headers=Headers(raw=kept),
        )
        content = json.dumps(self.body(refusal)).encode()
        headers = [
            *kept,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(content)).encode()),
        ]
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": content})


def refusal_message(refusal: Refusal, service: str, routes: str) -> str:
    """The message of a refusal on a service's plain HTTP routes: an unknown route
    lists ``routes``, a wrong method names the allowed ones, a 5xx says it is logged."""
    path = refusal.path if len(refusal.path) <= 200 else refusal.path[:200] + "…"
    where = f"{refusal.method} {path}"
    if refusal.status == 404:
        return f"no route {where}; the {service} serves {routes}"
    if refusal.status == 405:
        allowed = refusal.response_headers.get("allow", "")
        return f"{where}: method not allowed; use {allowed or 'another method'}"
    if refusal.status >= 500:
        return f"internal error in the {service} (logged)"
    return refusal.text or refusal.phrase
