"""The dataplane's context: what every route shares, built once in the entry point.

``Dataplane`` holds the settings, the endpoints (which grow as the scheduler
discovers replicas, B11), the scheduler link, the run table, the tool-call memory,
the engine client, the metrics and the gate, and answers the questions routes ask
of the endpoints: which model serves a turn (aliases, B9), whether an API is served
natively, whether images may go on.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from luftpause.callers import Gate
from luftpause.config import DataplaneSettings, Endpoint, EndpointKind, Secrets
from luftpause.dataplane.engine_http import EngineClient
from luftpause.dataplane.errors import UnknownModel, shown
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.scheduler_link import SchedulerLink
from luftpause.members import SEPARATOR, entry_of
from luftpause.tool_calls import ToolCallOrigins


@dataclass
class Dataplane:
    """Everything the routes share; built once in the entry point."""

    settings: DataplaneSettings
    endpoints: dict[str, Endpoint]
    secrets: Secrets
    link: SchedulerLink
    runs: RunTable
    memory: ToolCallOrigins  # the turn behind each tool call (D2; GET /v1/tool_calls, #38)
    http: EngineClient  # towards engines: no read timeout, a connect timeout
    metrics: Metrics
    gate: Gate  # who a request is: the token, a caller's key, or refused (D9, B13)

    def learn_replica(self, replica: str, url: str) -> None:
        """B11: a replica the scheduler discovered (``ENTRY@HOST:PORT``) is served with its
        entry's settings (key, class priority, native APIs…) at the URL the scheduler
        gave. The map only grows as replicas appear; they are few beside the turns."""
        if replica in self.endpoints or SEPARATOR not in replica or not url:
            return
        entry = self.endpoints.get(entry_of(replica))
        if entry is not None:
            self.endpoints[replica] = entry.model_copy(
                update={"name": replica, "url": url.rstrip("/"), "discover": "static"}
            )

    @property
    def generative_models(self) -> set[str]:
        return {
            m
            for e in self.endpoints.values()
            if e.kind is EndpointKind.GENERATIVE
            for m in e.models
        }

    def native_for(self, api: str, model: str, *, everywhere: bool = False) -> bool:
        """Whether an endpoint serving ``model`` serves ``api`` natively (``everywhere``:
        whether every one does)."""
        serving = [
            e
            for e in self.endpoints.values()
            if e.kind is EndpointKind.GENERATIVE and model in e.models
        ]
        native = [e for e in serving if api in e.native_apis]
        return bool(native) and (len(native) == len(serving) or not everywhere)

    def vision_refusal(self, api: str, model: str, asked: str) -> str | None:
        """Why a translated turn with images for ``model`` cannot go on; None when it can.

        The scheduler places a turn on any healthy endpoint serving its model and knows
        nothing of images, so images go on only when every endpoint serving the model
        takes them: it sets ``vision = true``, or serves ``api`` itself (the client's
        request passes through untranslated). A fleet where only some do is refused
        too: a turn placed on one that does not would fail there, or worse, be answered
        by a model that never saw the image."""
        serving = [
            e
            for e in self.endpoints.values()
            if e.kind is EndpointKind.GENERATIVE and model in e.models
        ]
        blind = [e.name for e in serving if not e.vision and api not in e.native_apis]
        if not blind:
            return None
        named = f"model {shown(model)}" + (f" (asked as {shown(asked)})" if asked != model else "")
        listed = ", ".join(blind[:5]) + (f" and {len(blind) - 5} more" if len(blind) > 5 else "")
        if len(blind) == len(serving):
            return (
                f"{named} is not served by a vision endpoint; set vision = true on its "
                f"endpoint ({listed}) to forward images"
            )
        return (
            f"{named} is served by endpoints with and without vision = true (without: "
            f"{listed}); a turn may be placed on any of them, so images are forwarded only "
            "when every endpoint serving the model sets vision = true"
        )

    def served_model(self, asked: str) -> str:
        """The model that serves a turn asking for ``asked``: itself if a generative
        endpoint serves it, else the target of the first alias that matches it (B9)."""
        served = self.generative_models
        if asked in served:
            return asked
        for alias, target in self.settings.model_aliases.items():
            if fnmatch.fnmatchcase(asked, alias):
                return target
        if asked in self.single_pass_models:
            raise UnknownModel(
                f"model {shown(asked)} is a single-pass model: it classifies, it "
                "does not chat; send its input to POST /v1/decide"
            )
        message = f"no Generative replica serves model {shown(asked)}"
        if self.settings.model_aliases:
            aliases = ", ".join(self.settings.model_aliases)
            message += f", and no alias matches it (dataplane.model_aliases: {aliases})"
        raise UnknownModel(message)

    @property
    def single_pass_models(self) -> list[str]:
        seen: list[str] = []
        for e in self.endpoints.values():
            if e.kind is EndpointKind.SINGLE_PASS:
                seen.extend(m for m in e.models if m not in seen)
        return seen
