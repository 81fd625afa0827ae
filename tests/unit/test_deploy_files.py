"""X3: the container files agree with the code and with the Compose Specification.

No Docker engine runs here, so nothing is built or started: every compose file,
and every override merged onto compose.yaml the way Compose merges it
(tests/_compose.py), is validated against the Compose Specification's JSON
schema (tests/data/compose-spec), and every luftpause command in it runs here
with ``--check``, with the config file from docker/ and the environment Compose
would give the container.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
from _compose import (
    Deployment,
    Override,
    Reset,
    UnsetVariable,
    interpolate,
    load_yaml,
    merge,
    normalize,
    plain,
    schema,
    service_env,
)

from luftpause import cli
from luftpause.cli import COMMANDS
from luftpause.config import StackConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = sorted(p.name for p in ROOT.glob("compose*.yaml"))
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = "ghcr.io/luftpause/luftpause"
CONFIG_DIR = "/etc/luftpause/"
HF = {"HF_TOKEN": "hf_test_token"}
POD = {"RUNPOD_POD_ID": "abc123xyz", "RUNPOD_API_KEY": "test-key"}

DEPLOYMENTS = [
    Deployment("fake", ("compose.yaml",), {}),
    Deployment("otel", ("compose.yaml", "compose.otel.yaml"), {}),
    Deployment("testbed", ("compose.yaml", "compose.testbed.yaml"), HF),
    Deployment("testbed+otel", ("compose.yaml", "compose.testbed.yaml", "compose.otel.yaml"), HF),
    Deployment("ollama", ("compose.yaml", "compose.ollama.yaml"), {}),
    Deployment("ollama+otel", ("compose.yaml", "compose.ollama.yaml", "compose.otel.yaml"), {}),
    Deployment("runpod", ("compose.yaml", "compose.runpod.yaml"), POD),
    Deployment("runpod+otel", ("compose.yaml", "compose.runpod.yaml", "compose.otel.yaml"), POD),
]
BY_NAME = {d.name: d for d in DEPLOYMENTS}
CHECKED = ("scheduler", "dataplane", "runtime")


def deployments() -> Any:
    return pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: d.name)


def ours(svc: dict[str, Any]) -> bool:
    return str(svc.get("image", "")).startswith(IMAGE + ":")


def config_of(svc: dict[str, Any]) -> Path:
    """docker/X.toml for a command's ``--config /etc/luftpause/X.toml``."""
    command = svc["command"]
    target = command[command.index("--config") + 1]
    assert target.startswith(CONFIG_DIR), target
    return ROOT / "docker" / target.removeprefix(CONFIG_DIR)


def loaded_config(svc: dict[str, Any]) -> StackConfig:
    config, _ = load_config(config_of(svc), service_env(svc))
    return config


# ---------------------------------------------------------------------------- schema


def test_every_compose_file_is_covered() -> None:
    """X3: the five deployments of the spec exist, and the tests cover every compose file."""
    assert set(COMPOSE_FILES) == {
        "compose.yaml",
        "compose.otel.yaml",
        "compose.testbed.yaml",
        "compose.ollama.yaml",
        "compose.runpod.yaml",
    }
    covered = {f for d in DEPLOYMENTS for f in d.files}
    assert covered == set(COMPOSE_FILES)


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_each_file_is_valid_compose(name: str) -> None:
    """X3: each file on its own validates against the Compose Specification schema."""
    env = {**HF, **POD}
    doc = plain(interpolate(load_yaml(ROOT / name), env, name))
    jsonschema.Draft7Validator(schema()).validate(doc)


@deployments()
def test_each_merged_deployment_is_valid_compose(deployment: Deployment) -> None:
    """X3: every override merged onto compose.yaml still validates."""
    jsonschema.Draft7Validator(schema()).validate(deployment.model())


def test_the_schema_is_not_vacuous() -> None:
    """The vendored schema rejects what Compose rejects (a misspelt key, a bad condition)."""
    validator = jsonschema.Draft7Validator(schema())
    good = BY_NAME["fake"].model()
    assert validator.is_valid(good)
    misspelt = json.loads(json.dumps(good))
    misspelt["services"]["scheduler"]["healthchek"] = misspelt["services"]["scheduler"].pop(
        "healthcheck"
    )
    assert not validator.is_valid(misspelt)
    bad_condition = json.loads(json.dumps(good))
    bad_condition["services"]["dataplane"]["depends_on"]["scheduler"]["condition"] = "healthy"
    assert not validator.is_valid(bad_condition)


@deployments()
def test_no_dangling_dependencies(deployment: Deployment) -> None:
    """X3: every depends_on names a service that runs in that deployment (a dependency on a
    service a profile switched off would stop `docker compose up`)."""
    enabled = deployment.enabled_services()
    for name, svc in enabled.items():
        for dep in svc.get("depends_on", {}):
            assert dep in enabled, f"{deployment.name}: {name} depends on {dep}, not running"


# -------------------------------------------------------------------- health and order


@deployments()
def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies(
    deployment: Deployment,
) -> None:
    """X3: a healthcheck on every service; every depends_on waits for service_healthy."""
    for name, svc in deployment.enabled_services().items():
        check = svc.get("healthcheck")
        assert check and check.get("test") and not check.get("disable"), (deployment.name, name)
        for dep, how in svc.get("depends_on", {}).items():
            assert how == {"condition": "service_healthy"}, (deployment.name, name, dep)
        if ours(svc):
            env = service_env(svc)
            port = urlsplit(env["LUFTPAUSE_HEALTH_URL"]).port
            assert env["LUFTPAUSE_HEALTH_URL"] == f"http://127.0.0.1:{port}/health"
            assert str(port) in _listen_ports(svc), (name, "health URL is not its own port")


def _listen_ports(svc: dict[str, Any]) -> set[str]:
    """The ports a luftpause service listens on inside its container."""
    command = svc["command"]
    if "--port" in command:
        return {command[command.index("--port") + 1]}
    config = loaded_config(svc)
    service = command[0]
    if service == "scheduler":
        return {str(config.scheduler.grpc_port), str(config.scheduler.http_port)}
    if service == "dataplane":
        return {str(config.dataplane.port)}
    return {str(config.runtime.port)}


def test_the_stack_starts_in_dependency_order() -> None:
    """X3: engines and tools before the scheduler, then the dataplane, then the runtime."""
    services = BY_NAME["fake"].enabled_services()
    assert set(services["scheduler"]["depends_on"]) == {"engine-a", "engine-b", "classifier"}
    assert set(services["dataplane"]["depends_on"]) == {"scheduler"}
    assert set(services["runtime"]["depends_on"]) == {"dataplane", "fake-mcp"}


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    lines = [ln for ln in text.replace("\\\n", " ").splitlines() if ln.strip()]
    out = []
    for line in lines:
        if line.lstrip().startswith("#"):
            continue
        word, _, rest = line.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _dockerfile_probe() -> list[str]:
    (healthcheck,) = [rest for word, rest in _dockerfile() if word == "HEALTHCHECK"]
    cmd = healthcheck[healthcheck.index("CMD ") + 4 :]
    probe: list[str] = json.loads(cmd)
    return probe


def test_the_healthcheck_probe_passes_on_200_and_fails_otherwise(health_server: str) -> None:
    """X3: the image's probe (the same in compose.yaml) exits 0 only when its URL answers
    2xx; it needs no curl, and an unset LUFTPAUSE_HEALTH_URL fails with a reason."""
    probe = _dockerfile_probe()
    compose = load_yaml(ROOT / "compose.yaml")
    assert compose["x-luftpause"]["healthcheck"]["test"] == ["CMD", *probe]
    assert probe[:2] == ["python", "-c"]
    code = probe[2]
    assert "$" not in code  # Compose would interpolate it

    def run(url: str | None) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", "")}
        if url is not None:
            env["LUFTPAUSE_HEALTH_URL"] = url
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
        )

    assert run(f"{health_server}/health").returncode == 0
    assert run(f"{health_server}/broken").returncode != 0  # 503
    refused = run("http://127.0.0.1:9/health")  # discard port: nothing listens
    assert refused.returncode != 0
    unset = run(None)
    assert unset.returncode != 0 and "LUFTPAUSE_HEALTH_URL is not set" in unset.stderr


# ------------------------------------------------------------------ commands and config


def _check(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # cli.main rewrites it
    return cli.main(argv, environ=env)


@deployments()
def test_every_luftpause_command_passes_its_config_check(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """X3: each service's command, run here as `luftpause <command> --check` with the same
    config file (docker/) and the environment Compose would set, is usable; the fakes'
    commands parse with the real argument parser."""
    known = {c.name for c in COMMANDS}
    services = deployment.enabled_services()
    seen = set()
    for name, svc in services.items():
        if not ours(svc):
            continue
        command = [str(part) for part in svc["command"]]
        assert command[0] in known, f"{name} runs an unknown command"
        if command[0] in CHECKED:
            config = config_of(svc)
            assert config.is_file(), f"{name}: {config.name} is not in docker/"
            argv = [*command[: command.index("--config") + 1], str(config)]
            argv += command[command.index("--config") + 2 :]
            rc = _check([*argv, "--check"], service_env(svc), monkeypatch)
            out = capsys.readouterr()
            assert rc == 0, f"{deployment.name}: {name}: {out.err}"
            assert "is usable" in out.out
            seen.add(command[0])
        else:
            parser, _ = cli.build_parser(command[0])
            args = parser.parse_args(command)  # a bad flag exits 2
            assert args.command == command[0]
    assert seen == set(CHECKED)


@deployments()
def test_peers_and_replicas_are_services_of_the_deployment(deployment: Deployment) -> None:
    """X3, S8: every URL in a deployment's config names a running service, the host
    (with extra_hosts) or a hosted https endpoint; the runtime's state dir is a volume."""
    services = deployment.enabled_services()
    for name in CHECKED:
        svc = services[name]
        config = loaded_config(svc)
        extra_hosts = {h.split(":")[0] for h in svc.get("extra_hosts", [])}
        if name in ("scheduler", "dataplane"):
            assert config.endpoints, name
            for endpoint in config.endpoints:
                parts = urlsplit(endpoint.url)
                assert (
                    parts.hostname in services
                    or parts.hostname in extra_hosts
                    or (parts.scheme == "https" and endpoint.api_key_env)
                ), f"{deployment.name}: {name}: endpoint {endpoint.name} reaches nothing"
                for url in endpoint.load_from:
                    assert urlsplit(url).hostname in services
        if name == "dataplane":
            assert config.dataplane.scheduler.split(":")[0] in services
        if name == "runtime":
            assert urlsplit(config.runtime.dataplane_url).hostname in services
            for tool in config.runtime.tool_servers:
                assert tool.url is not None and urlsplit(tool.url).hostname in services
            volumes = [str(v).split(":") for v in svc["volumes"]]
            assert [config.runtime.state_dir] == [v[1] for v in volumes]
            assert config.runtime.state_dir == "/var/lib/luftpause"
    # The three services of one deployment read one file.
    assert len({config_of(services[n]) for n in CHECKED}) == 1


# ------------------------------------------------------------------------ the image


def test_images_are_pinned_by_version() -> None:
    """X3: luftpause images are pinned by LUFTPAUSE_VERSION, defaulting to the package
    version; every other image has a fixed tag (never `latest`)."""
    for deployment in DEPLOYMENTS:
        for name, svc in deployment.model()["services"].items():
            image = str(svc["image"])
            repo, _, tag = image.rpartition(":")
            assert repo and tag and tag != "latest", (deployment.name, name, image)
            if ours(svc):
                assert tag == VERSION
                assert svc["build"]["dockerfile"] == "docker/Dockerfile"
    raw = load_yaml(ROOT / "compose.yaml")["x-luftpause"]["image"]
    assert raw == f"{IMAGE}:${{LUFTPAUSE_VERSION:-{VERSION}}}"
    assert interpolate(raw, {"LUFTPAUSE_VERSION": "9.9.9"}) == f"{IMAGE}:9.9.9"


def test_dockerfile_runs_as_a_user_with_its_state_on_a_volume() -> None:
    """X3: pinned base image, constraints install, non-root user owning the state dir,
    VOLUME, HEALTHCHECK, and every docker/*.toml at /etc/luftpause/."""
    steps = _dockerfile()
    words = [w for w, _ in steps]
    args = dict(steps)
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+", args["FROM"]), args["FROM"]
    assert any(w == "RUN" and "pip install -c constraints.txt ." in a for w, a in steps)
    assert ("COPY", "docker/*.toml /etc/luftpause/") in steps
    user = args["USER"]
    assert user.split(":")[0] not in ("root", "0")
    uid = user.split(":")[0]
    assert any(
        w == "RUN" and f"--uid {uid}" in a and "chown luftpause:luftpause /var/lib/luftpause" in a
        for w, a in steps
    )
    assert args["VOLUME"] == '["/var/lib/luftpause"]'
    assert words.index("VOLUME") > max(i for i, (w, _) in enumerate(steps) if w == "RUN")
    assert args["ENTRYPOINT"] == '["luftpause"]'
    assert "HEALTHCHECK" in words
    assert (ROOT / ".dockerignore").is_file()


def test_dockerignore_keeps_what_the_image_needs() -> None:
    """X3: the build context keeps pyproject.toml, constraints.txt, README.md, LICENSE,
    src/ and docker/ (COPY would fail without them) and drops the venv and git."""
    ignored = {
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    copied = {"pyproject.toml", "constraints.txt", "README.md", "LICENSE", "src", "docker"}
    assert not copied & ignored
    assert {".git", ".venv"} <= ignored


# ------------------------------------------------------------------- each deployment


def test_testbed_runs_two_sglang_replicas_on_one_gpu() -> None:
    """X3, S7, S9: two SGLang replicas of Llama-3.2-1B share one GPU (memory split),
    report metrics, cached tokens and priority; the fake engines are off and the
    scheduler's config names the SGLang replicas with the model they serve."""
    deployment = BY_NAME["testbed"]
    services = deployment.enabled_services()
    assert "engine-a" not in services and "engine-b" not in services
    assert "engine-a" in deployment.enabled_services(frozenset({"fakes"}))
    sglang = {n: s for n, s in services.items() if str(s["image"]).startswith("lmsysorg/sglang:")}
    assert set(sglang) == {"sglang-a", "sglang-b"}
    config = loaded_config(services["scheduler"])
    fractions = []
    gpus = set()
    for name, svc in sglang.items():
        command = [str(c) for c in svc["command"]]
        for flag in ("--enable-metrics", "--enable-cache-report", "--enable-priority-scheduling"):
            assert flag in command, (name, flag)
        model = command[command.index("--model-path") + 1]
        assert model == "meta-llama/Llama-3.2-1B-Instruct"
        fractions.append(float(command[command.index("--mem-fraction-static") + 1]))
        (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        gpus.add(tuple(device["device_ids"]))
        assert svc["environment"]["HF_TOKEN"] == HF["HF_TOKEN"]
        endpoint = config.endpoint(name)
        assert endpoint is not None and endpoint.models == (model,)
        assert endpoint.metrics == "sglang" and endpoint.class_priority is not None
        port = command[command.index("--port") + 1]
        assert endpoint.url == f"http://{name}:{port}"
    assert len(gpus) == 1  # one GPU
    assert all(0 < f < 1 for f in fractions)
    # The second replica's share is of what the first left free: it starts after it.
    assert sglang["sglang-b"]["depends_on"] == {"sglang-a": {"condition": "service_healthy"}}
    assert {e.name for e in config.endpoints} == {"sglang-a", "sglang-b", "classifier"}
    with pytest.raises(UnsetVariable, match="HF_TOKEN"):
        Deployment("no token", deployment.files, {}).model()


def test_ollama_on_the_host_is_the_only_generative_replica() -> None:
    """X3, S8, S9: host Ollama through host.docker.internal, probed at `GET /` with no
    metrics, its model from OLLAMA_MODEL (default llama3.2:1b)."""
    services = BY_NAME["ollama"].enabled_services()
    assert "engine-a" not in services and "engine-b" not in services
    for name in ("scheduler", "dataplane"):
        assert "host.docker.internal:host-gateway" in services[name]["extra_hosts"]
    config = loaded_config(services["scheduler"])
    generative = [e for e in config.endpoints if e.kind == "generative"]
    assert [e.name for e in generative] == ["ollama"]
    (ollama,) = generative
    assert ollama.url == "http://host.docker.internal:11434"
    assert ollama.health_path == "/" and ollama.metrics == "none"
    assert ollama.models == ("llama3.2:1b",)
    assert loaded_config(services["runtime"]).runtime.default_model == "llama3.2:1b"
    chosen = Deployment("qwen", BY_NAME["ollama"].files, {"OLLAMA_MODEL": "qwen3:0.6b"})
    config = loaded_config(chosen.enabled_services()["dataplane"])
    assert config.endpoint("ollama").models == ("qwen3:0.6b",)  # type: ignore[union-attr]


def test_runpod_adds_a_hosted_vllm_replica() -> None:
    """X3, S8: the pod is an extra https replica with its key from RUNPOD_API_KEY, vLLM's
    /health and metrics; the fakes stay; without a pod ID Compose refuses to start."""
    deployment = BY_NAME["runpod"]
    services = deployment.enabled_services()
    assert {"engine-a", "engine-b"} <= set(services)
    config = loaded_config(services["scheduler"])
    pod = config.endpoint("runpod")
    assert pod is not None
    assert pod.url == "https://abc123xyz-8000.proxy.runpod.net"
    assert pod.api_key_env == "RUNPOD_API_KEY" and pod.health_path == "/health"
    assert pod.metrics == "vllm"
    assert {"engine-a", "engine-b", "classifier"} <= {e.name for e in config.endpoints}
    for name in ("scheduler", "dataplane"):
        assert services[name]["environment"]["RUNPOD_API_KEY"] == "test-key"
    assert "RUNPOD_API_KEY" not in services["runtime"]["environment"]
    with pytest.raises(UnsetVariable, match="RUNPOD_POD_ID"):
        Deployment("no pod", deployment.files, {"RUNPOD_API_KEY": "k"}).model()
    with pytest.raises(UnsetVariable, match="RUNPOD_API_KEY"):
        Deployment("no key", deployment.files, {"RUNPOD_POD_ID": "p"}).model()


def test_the_fake_stack_config_matches_the_fake_services() -> None:
    """X3: docker/stack.toml's replicas are compose.yaml's fake engines."""
    services = BY_NAME["fake"].enabled_services()
    config = loaded_config(services["scheduler"])
    assert {e.name for e in config.endpoints} == {"engine-a", "engine-b", "classifier"}
    runpod = load_config(
        ROOT / "docker" / "runpod.toml", {"RUNPOD_POD_ID": "p", "RUNPOD_MODEL": "m"}
    )
    # runpod.toml is the fake stack plus the pod: nothing else may drift.
    assert runpod[0].model_copy(update={"endpoints": runpod[0].endpoints[:-1]}) == config


def test_the_otel_override_points_every_service_at_jaeger() -> None:
    """X1, X3: compose.otel.yaml adds Jaeger and gives each luftpause service of
    compose.yaml the OTLP endpoint (a service it names must exist in compose.yaml)."""
    base = load_yaml(ROOT / "compose.yaml")["services"]
    otel = load_yaml(ROOT / "compose.otel.yaml")["services"]
    assert otel["jaeger"]["image"].startswith("jaegertracing/all-in-one:")
    assert otel["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert set(otel) - {"jaeger"} == set(base)
    for deployment in ("otel", "testbed+otel", "ollama+otel", "runpod+otel"):
        services = BY_NAME[deployment].enabled_services()
        for name, svc in services.items():
            if not ours(svc):
                continue
            env = service_env(svc)
            assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318", (deployment, name)
            assert "LUFTPAUSE_HEALTH_URL" in env  # merged, not replaced
            assert "jaeger" in svc["depends_on"]


# ---------------------------------------------------------------- the merge, itself


def test_merge_follows_the_compose_rules() -> None:
    """The merge the tests rely on: mappings merge, sequences append, command replaced,
    !override replaces, !reset removes, list forms become mappings, volume targets unique."""
    base = normalize(
        {
            "services": {
                "a": {
                    "command": ["x", "1"],
                    "environment": ["A=1", "B=2"],
                    "ports": ["1:1"],
                    "volumes": ["v:/data"],
                    "depends_on": ["b"],
                    "healthcheck": {"test": ["CMD", "old"], "interval": "5s"},
                }
            }
        }
    )
    over = normalize(
        {
            "services": {
                "a": {
                    "command": ["y"],
                    "environment": {"B": "3", "C": "4"},
                    "ports": ["2:2", "1:1"],
                    "volumes": ["w:/data"],
                    "depends_on": Override({"c": {"condition": "service_healthy"}}),
                    "healthcheck": {"test": ["CMD", "new"]},
                    "extra_hosts": Reset([]),
                }
            }
        }
    )
    (a,) = merge([base, over])["services"].values()
    assert a["command"] == ["y"]
    assert a["environment"] == {"A": "1", "B": "3", "C": "4"}
    assert a["ports"] == ["1:1", "2:2"]
    assert a["volumes"] == ["w:/data"]
    assert a["depends_on"] == {"c": {"condition": "service_healthy"}}
    assert a["healthcheck"] == {"test": ["CMD", "new"], "interval": "5s"}
    assert "extra_hosts" not in a
    assert (
        merge([base, {"services": {"a": {"ports": Reset([])}}}])["services"]["a"].get("ports")
        is None
    )


def test_interpolation_follows_the_compose_rules() -> None:
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("${SET}-${EMPTY:-d}-${EMPTY-d}-${UNSET-d}-$$SET-$SET", env) == (
        "v-d--d-$SET-v"
    )
    with pytest.raises(UnsetVariable, match="needed"):
        interpolate("${EMPTY:?needed}", env)
    with pytest.raises(UnsetVariable, match="UNSET"):
        interpolate("${UNSET}", env)
