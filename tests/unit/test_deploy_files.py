"""X3: the container files agree with the code (no Docker engine runs here, so the
files are checked for validity and consistency rather than built)."""

from __future__ import annotations

from pathlib import Path

import yaml

from luftpause.cli import COMMANDS
from luftpause.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_compose_services_run_real_commands_with_the_container_config() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert {"scheduler", "dataplane", "runtime", "fake-mcp", "engine-a", "engine-b"} <= set(
        services
    )
    known = {c.name for c in COMMANDS}
    for name, svc in services.items():
        assert svc["command"][0] in known, f"{name} runs an unknown command"
        assert svc["build"]["dockerfile"] == "docker/Dockerfile"
        assert (ROOT / svc["build"]["dockerfile"]).is_file()
    config, _ = load_config(ROOT / "docker" / "stack.toml")
    for endpoint in config.endpoints:
        host = endpoint.url.split("//")[1].split(":")[0]
        assert host in services, f"endpoint {endpoint.name} points at no compose service"
    assert config.dataplane.scheduler.split(":")[0] in services
    assert config.runtime.state_dir == "/var/lib/luftpause"


def test_dockerfile_installs_with_the_pinned_constraints() -> None:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "pip install -c constraints.txt" in text
    assert "COPY docker/stack.toml /etc/luftpause/stack.toml" in text
    assert 'ENTRYPOINT ["luftpause"]' in text


def test_the_otel_override_points_every_service_at_jaeger() -> None:
    """X1, X3: compose.otel.yaml adds Jaeger and gives each luftpause service of
    compose.yaml the OTLP endpoint (a service it names must exist in compose.yaml)."""
    base = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    otel = yaml.safe_load((ROOT / "compose.otel.yaml").read_text())["services"]
    assert otel["jaeger"]["image"].startswith("jaegertracing/all-in-one:")
    assert otel["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert set(otel) - {"jaeger"} == set(base)
    for name in base:
        env = otel[name]["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
        assert "jaeger" in otel[name]["depends_on"]
