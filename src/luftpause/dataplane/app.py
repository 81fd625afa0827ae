"""The dataplane's HTTP surface (D1–D10): the ASGI app, its routes wired in.

Routes: ``POST /v1/chat/completions``, ``POST /v1/messages``, ``POST /v1/responses``,
``POST /v1/decide``, ``GET /v1/models``, ``DELETE /v1/runs/{id}``,
``GET /v1/tool_calls/{id}`` (which turn made a tool call: its run, class, caller
and span, #38), ``GET /metrics``, ``GET /health``.

The turn routes are served as plain ASGI by ``DataplaneApp`` (``asgi.py``); the
other routes, the 404/405 answers and the lifespan are a FastAPI app behind it
(``routes/rest.py``). A turn's path through the routes is told in ``routes/``.
"""

from __future__ import annotations

import functools

from luftpause.dataplane.apis import client_apis
from luftpause.dataplane.asgi import DataplaneApp, Route
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.routes.decide import decide_route
from luftpause.dataplane.routes.generative import chat_route, generative
from luftpause.dataplane.routes.rest import rest_app


def create_app(dp: Dataplane) -> DataplaneApp:
    apis = client_apis()
    for api in apis:  # the translators' wire types, imported now rather than at a first turn
        api.load()
    rest = rest_app(dp, apis)
    routes: dict[str, Route] = {"/v1/chat/completions": chat_route, "/v1/decide": decide_route}
    for api in apis:
        routes[api.route] = functools.partial(generative, api=api)
    return DataplaneApp(dp, rest, routes, {api.route: api.error_body for api in apis})
