"""X3: the Kubernetes manifests (deploy/kubernetes) render, validate against the
Kubernetes schema, and hold what the deployment guide promises.

No cluster runs here: every overlay is rendered with ``kubectl kustomize``
(tests/_kubectl.py: skipped without kubectl, failed where CI requires it), each object
is validated against the Kubernetes OpenAPI schema with ``kubernetes-validate``
(strict: an unknown field fails), the stack.toml of each overlay passes every
service's ``--check``, and the structure is checked: probes, resources and non-root
security contexts on every workload, one scheduler with ``Recreate``, the dataplanes'
HPA and pod-named IDs, the runtime's claim at its state dir, Services and
NetworkPolicy, PDBs, labels, the image tag, and every URL in the config naming a
Service (or an engine pod) of the same render. ``test_each_check_catches_its_breakage``
breaks one thing at a time and expects the matching check to say so.
"""

from __future__ import annotations

import copy
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from _kubectl import kustomize

from luftpause import cli
from luftpause.config import StackConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("engines", "fake-engines")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = "ghcr.io/luftpause/luftpause"
# The oldest Kubernetes the manifests are meant for (kubectl 1.27 brings kustomize v5)
# and the newest schema kubernetes-validate has.
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
CONFIG_KEY = "stack.toml"
SERVICES = ("scheduler", "dataplane", "runtime")
TOKEN_ENV = {"LUFTPAUSE_TOKEN": "test-token"}

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {name: kustomize(K8S / "overlays" / name) for name in OVERLAYS}


# ------------------------------------------------------------------------- helpers


def find(objs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = find(objs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def workloads(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]


def component(objs: list[Obj], name: str) -> Obj:
    """The workload of luftpause's ``name`` service."""
    kind = "StatefulSet" if name == "runtime" else "Deployment"
    return one(objs, kind, f"luftpause-{name}")


def pod_labels(workload: Obj) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"].get("labels", {}))


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    match = selector.get("matchLabels", selector)
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def ours(container: Obj) -> bool:
    return str(container["image"]).split(":")[0] == IMAGE


def config_of(objs: list[Obj], overlay: str) -> StackConfig:
    config, _ = load_config(K8S / "overlays" / overlay / CONFIG_KEY, TOKEN_ENV)
    return config


def namespace(objs: list[Obj]) -> str:
    (ns,) = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
    assert ns, "the overlay sets no namespace"
    return str(ns)


# -------------------------------------------------------------------------- checks
# Each returns the problems it finds (empty: none), so a test can break a manifest and
# see the check that should notice it say so.


def check_workloads(objs: list[Obj]) -> list[str]:
    """Probes, requests and limits, non-root security contexts on every container."""
    problems = []
    for w in workloads(objs):
        where = f"{w['kind']}/{w['metadata']['name']}"
        pod = w["spec"]["template"]["spec"]
        psc = pod.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True:
            problems.append(f"{where}: pod runAsNonRoot is not true")
        if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: pod seccompProfile is not RuntimeDefault")
        for c in pod["containers"]:
            at = f"{where}/{c['name']}"
            for probe in ("readinessProbe", "livenessProbe"):
                if not c.get(probe, {}).get("httpGet", {}).get("path"):
                    problems.append(f"{at}: no HTTP {probe}")
            res = c.get("resources", {})
            for key in ("cpu", "memory"):
                if key not in res.get("requests", {}):
                    problems.append(f"{at}: no {key} request")
            if "memory" not in res.get("limits", {}):
                problems.append(f"{at}: no memory limit")
            csc = c.get("securityContext", {})
            if csc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{at}: allowPrivilegeEscalation is not false")
            if csc.get("capabilities", {}).get("drop") != ["ALL"]:
                problems.append(f"{at}: capabilities do not drop ALL")
            if ours(c):
                if csc.get("readOnlyRootFilesystem") is not True:
                    problems.append(f"{at}: root filesystem is writable")
                mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
                volumes = {v["name"]: v for v in pod.get("volumes", [])}
                if "emptyDir" not in volumes.get(mounts.get("/tmp", ""), {}):
                    problems.append(f"{at}: no emptyDir at /tmp")
                if not str(c["image"]).endswith(f":{VERSION}"):
                    problems.append(f"{at}: image {c['image']} is not tagged {VERSION}")
    return problems


def check_scheduler(objs: list[Obj]) -> list[str]:
    """One replica, Recreate, probed on the status port, no volume of its own state."""
    problems = []
    sched = component(objs, "scheduler")
    if sched["spec"].get("replicas") != 1:
        problems.append("scheduler: replicas is not 1")
    if sched["spec"].get("strategy", {}).get("type") != "Recreate":
        problems.append("scheduler: strategy is not Recreate")
    (c,) = sched["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        get = c.get(probe, {}).get("httpGet", {})
        port = ports.get(get.get("port"), get.get("port"))
        if (get.get("path"), port) != ("/health", 5001):
            problems.append(f"scheduler: {probe} is not /health on 5001")
    for v in sched["spec"]["template"]["spec"].get("volumes", []):
        if "persistentVolumeClaim" in v:
            problems.append("scheduler: mounts a claim (its state is rebuilt by resync)")
    return problems


def check_dataplane(objs: list[Obj]) -> list[str]:
    """Two replicas, an HPA on CPU targeting it, the pod name as --dataplane-id."""
    problems = []
    dp = component(objs, "dataplane")
    if dp["spec"].get("replicas", 1) < 2:
        problems.append("dataplane: fewer than 2 replicas")
    hpas = [
        h
        for h in find(objs, "HorizontalPodAutoscaler")
        if h["spec"]["scaleTargetRef"]
        == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": dp["metadata"]["name"],
        }
    ]
    if len(hpas) != 1:
        problems.append("dataplane: no HorizontalPodAutoscaler targets it")
    else:
        spec = hpas[0]["spec"]
        metrics = [m.get("resource", {}).get("name") for m in spec.get("metrics", [])]
        if "cpu" not in metrics:
            problems.append("dataplane: the HPA does not scale on CPU")
        if spec.get("minReplicas", 1) < 2 or spec["maxReplicas"] <= spec["minReplicas"]:
            problems.append("dataplane: the HPA's range is not from 2 upwards")
    (c,) = dp["spec"]["template"]["spec"]["containers"]
    args = c.get("args", [])
    ident = args[args.index("--dataplane-id") + 1] if "--dataplane-id" in args else None
    env = {e["name"]: e for e in c.get("env", [])}
    var = ident[2:-1] if ident and ident.startswith("$(") and ident.endswith(")") else None
    field = env.get(var or "", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if field != "metadata.name":
        problems.append("dataplane: --dataplane-id is not its pod's name")
    return problems


def check_runtime(objs: list[Obj], config: StackConfig) -> list[str]:
    """One replica, a claim template mounted at the config's state_dir."""
    problems = []
    rt = component(objs, "runtime")
    if rt["spec"].get("replicas") != 1:
        problems.append("runtime: replicas is not 1")
    claims = {t["metadata"]["name"] for t in rt["spec"].get("volumeClaimTemplates", [])}
    (c,) = rt["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    if mounts.get(config.runtime.state_dir) not in claims:
        problems.append(f"runtime: no claim mounted at state_dir {config.runtime.state_dir}")
    if rt["spec"]["template"]["spec"].get("securityContext", {}).get("fsGroup") is None:
        problems.append("runtime: no fsGroup: uid 10001 may not write its claim")
    return problems


def check_services_and_policy(objs: list[Obj]) -> list[str]:
    """A ClusterIP Service per service (the scheduler's with 5000-5002), a NetworkPolicy
    letting only the dataplanes and the runtime reach the scheduler (and Prometheus its
    5001), a PDB per service (the dataplanes' minAvailable 1)."""
    problems = []
    labels = {name: pod_labels(component(objs, name)) for name in SERVICES}
    for name in SERVICES:
        svcs = [s for s in find(objs, "Service") if selects(s["spec"]["selector"], labels[name])]
        if len(svcs) != 1 or svcs[0]["spec"].get("type", "ClusterIP") != "ClusterIP":
            problems.append(f"{name}: not exactly one ClusterIP Service")
            continue
        if name == "scheduler":
            ports = {p["port"] for p in svcs[0]["spec"]["ports"]}
            if ports != {5000, 5001, 5002}:
                problems.append(f"scheduler: its Service exposes {sorted(ports)}")
        pdbs = [
            p
            for p in find(objs, "PodDisruptionBudget")
            if selects(p["spec"]["selector"], labels[name])
        ]
        if len(pdbs) != 1:
            problems.append(f"{name}: not exactly one PodDisruptionBudget")
        elif name == "dataplane" and pdbs[0]["spec"].get("minAvailable") != 1:
            problems.append("dataplane: the PDB's minAvailable is not 1")
    policies = [
        p
        for p in find(objs, "NetworkPolicy")
        if selects(p["spec"]["podSelector"], labels["scheduler"])
    ]
    if len(policies) != 1:
        return [*problems, "scheduler: not exactly one NetworkPolicy selects it"]
    spec = policies[0]["spec"]
    if "Ingress" not in spec.get("policyTypes", []):
        problems.append("scheduler: the NetworkPolicy does not restrict ingress")
    allowed = {"dataplane": set(), "runtime": set()}
    for rule in spec.get("ingress", []):
        ports = {p["port"] for p in rule.get("ports", [])}
        for peer in rule.get("from", []):
            if not ports:
                problems.append("scheduler: a NetworkPolicy rule opens every port")
            if "namespaceSelector" in peer or "ipBlock" in peer:
                if ports != {5001}:
                    problems.append(f"scheduler: pods elsewhere may reach {sorted(ports)}")
                continue
            sel = peer.get("podSelector", {})
            who = [n for n in ("dataplane", "runtime") if selects(sel, labels[n])]
            if not who:
                problems.append(f"scheduler: the NetworkPolicy lets {sel} in")
            for n in who:
                allowed[n] |= ports
    for n, ports in allowed.items():
        if not {5000, 5001, 5002} <= ports:
            problems.append(
                f"scheduler: the {n} may not reach {sorted({5000, 5001, 5002} - ports)}"
            )
    return problems


def check_labels(objs: list[Obj]) -> list[str]:
    problems = []
    for o in objs:
        where = f"{o['kind']}/{o['metadata']['name']}"
        labels = o["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/part-of") != "luftpause":
            problems.append(f"{where}: no app.kubernetes.io/part-of=luftpause")
        if o["kind"] not in ("Namespace", "ConfigMap"):
            for key in ("app.kubernetes.io/name", "app.kubernetes.io/component"):
                if key not in labels:
                    problems.append(f"{where}: no {key}")
    for w in workloads(objs):
        if not selects(w["spec"]["selector"], pod_labels(w)):
            problems.append(f"{w['metadata']['name']}: its selector misses its pods")
    return problems


def check_config_and_token(objs: list[Obj]) -> list[str]:
    """Every luftpause service reads stack.toml from the generated ConfigMap and its
    token from the Secret luftpause-token."""
    problems = []
    (cm,) = [c for c in find(objs, "ConfigMap") if CONFIG_KEY in c.get("data", {})]
    for name in SERVICES:
        w = component(objs, name)
        pod = w["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        args = c.get("args", [])
        if args[:1] != [name] or "--config" not in args:
            problems.append(f"{name}: does not run `luftpause {name} --config ...`")
            continue
        path = Path(args[args.index("--config") + 1])
        mount = next((m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)), {})
        source = volumes.get(mount.get("name", ""), {}).get("configMap", {}).get("name")
        if source != cm["metadata"]["name"] or path.name != CONFIG_KEY:
            problems.append(f"{name}: --config {path} is not the ConfigMap's {CONFIG_KEY}")
        env = {e["name"]: e for e in c.get("env", [])}
        ref = env.get("LUFTPAUSE_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
        if ref.get("name") != "luftpause-token" or ref.get("optional"):
            problems.append(f"{name}: LUFTPAUSE_TOKEN is not the Secret luftpause-token")
    return problems


def check_peers(objs: list[Obj], config: StackConfig) -> list[str]:
    """Every URL in the config names a Service of this render on a port it exposes; an
    engine by pod DNS name names a pod of a StatefulSet behind a headless Service, and
    every such pod is listed; a DNS pool (``discover = "dns"``) names a headless Service."""
    problems = []
    ns = namespace(objs)
    services = {s["metadata"]["name"]: s for s in find(objs, "Service")}
    sets = {s["metadata"]["name"]: s for s in find(objs, "StatefulSet")}

    def service_port(host: str, port: int | None, what: str) -> None:
        name = host.removesuffix(f".{ns}.svc.cluster.local").removesuffix(f".{ns}")
        svc = services.get(name)
        if svc is None or "." in name:
            problems.append(f"{what}: {host} is no Service of namespace {ns}")
        elif port not in {p["port"] for p in svc["spec"]["ports"]}:
            problems.append(f"{what}: Service {name} does not expose {port}")

    host, _, port = config.dataplane.scheduler.rpartition(":")
    service_port(host, int(port), "dataplane.scheduler")
    for what, url in [
        ("runtime.dataplane_url", config.runtime.dataplane_url),
        *[
            (f"scheduler.status_runtimes[{i}]", u)
            for i, u in enumerate(config.scheduler.status_runtimes)
        ],
        *[(f"tool server {t.name}", t.url or "") for t in config.runtime.tool_servers],
    ]:
        parts = urlsplit(url)
        service_port(parts.hostname or "", parts.port, what)
    listed: dict[str, set[int]] = {}
    for e in config.endpoints:
        parts = urlsplit(e.url)
        labels = (parts.hostname or "").split(".")
        if e.discover == "dns":  # B11: a pool, found through a headless Service's records
            svc = services.get(labels[0])
            if labels[1:] != [ns, "svc", "cluster", "local"] or svc is None:
                problems.append(f"endpoint {e.name}: {parts.hostname} is no Service of {ns}")
            elif svc["spec"].get("clusterIP") != "None":
                problems.append(f"endpoint {e.name}: Service {labels[0]} is not headless")
            elif parts.port not in {p["port"] for p in svc["spec"]["ports"]}:
                problems.append(
                    f"endpoint {e.name}: Service {labels[0]} does not expose {parts.port}"
                )
            continue
        if labels[2:] != [ns, "svc", "cluster", "local"]:
            problems.append(
                f"endpoint {e.name}: {parts.hostname} is not <pod>.<service>.{ns}.svc.cluster.local"
            )
            continue
        pod, svc_name = labels[0], labels[1]
        owner = next(
            (
                s
                for s in sets.values()
                if s["spec"].get("serviceName") == svc_name
                and pod.startswith(s["metadata"]["name"] + "-")
            ),
            None,
        )
        svc = services.get(svc_name)
        if owner is None or svc is None or svc["spec"].get("clusterIP") != "None":
            problems.append(
                f"endpoint {e.name}: {svc_name} is no headless Service of a StatefulSet"
            )
            continue
        ordinal = pod.removeprefix(owner["metadata"]["name"] + "-")
        if not ordinal.isdigit() or int(ordinal) >= owner["spec"].get("replicas", 1):
            problems.append(f"endpoint {e.name}: {pod} is no pod of {owner['metadata']['name']}")
            continue
        if parts.port not in {p["port"] for p in svc["spec"]["ports"]}:
            problems.append(f"endpoint {e.name}: Service {svc_name} does not expose {parts.port}")
        listed.setdefault(owner["metadata"]["name"], set()).add(int(ordinal))
    for name, s in sets.items():
        replicas = s["spec"].get("replicas", 1)
        if name in listed and listed[name] != set(range(replicas)):
            problems.append(f"{name}: pods {sorted(listed[name])} listed, replicas {replicas}")
    return problems


def all_problems(objs: list[Obj], config: StackConfig) -> list[str]:
    return [
        *check_workloads(objs),
        *check_scheduler(objs),
        *check_dataplane(objs),
        *check_runtime(objs, config),
        *check_services_and_policy(objs),
        *check_labels(objs),
        *check_config_and_token(objs),
        *check_peers(objs, config),
    ]


# --------------------------------------------------------------------------- tests


def test_every_overlay_is_covered() -> None:
    """X3: the tests render every overlay there is."""
    found = {p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml")}
    assert found == set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_object_validates_against_the_kubernetes_schema(
    overlay: str, rendered: dict[str, list[Obj]]
) -> None:
    """X3: every rendered object is valid Kubernetes (strict: no unknown field)."""
    objs = rendered[overlay]
    assert objs
    for version in KUBERNETES_VERSIONS:
        for obj in objs:
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_schema_validation_is_not_vacuous(rendered: dict[str, list[Obj]]) -> None:
    """A misspelt field and a wrong type are rejected."""
    sched = copy.deepcopy(component(rendered["fake-engines"], "scheduler"))
    container = sched["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sched, KUBERNETES_VERSIONS[-1], strict=True)
    sched = copy.deepcopy(component(rendered["fake-engines"], "scheduler"))
    sched["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sched, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_holds_what_the_guide_promises(
    overlay: str, rendered: dict[str, list[Obj]]
) -> None:
    """X3: probes, resources and non-root contexts everywhere, the scheduler alone with
    Recreate, the dataplanes' HPA and IDs, the runtime's claim, Services, NetworkPolicy,
    PDBs, labels, config and token, and every peer URL a Service of the render."""
    objs = rendered[overlay]
    assert all_problems(objs, config_of(objs, overlay)) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("service", SERVICES)
def test_each_overlay_config_passes_the_services_check(
    overlay: str, service: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """X3: `luftpause <service> --config stack.toml --check` accepts each overlay's file."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # cli.main rewrites it
    path = K8S / "overlays" / overlay / CONFIG_KEY
    rc = cli.main([service, "--config", str(path), "--check"], environ=TOKEN_ENV)
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "is usable" in out.out


def test_images_are_pinned_to_the_package_version() -> None:
    """X3: every kustomization pins ghcr.io/luftpause/luftpause to pyproject's version,
    so `kustomize edit set image` in an overlay is the one place to change it."""
    for path in K8S.rglob("kustomization.yaml"):
        doc = yaml.safe_load(path.read_text())
        (image,) = [i for i in doc["images"] if i["name"] == IMAGE]
        assert image["newTag"] == VERSION, path


def test_the_engines_overlay_runs_sglang_on_a_gpu_each(rendered: dict[str, list[Obj]]) -> None:
    """X3, S8, B11: the example engines: a StatefulSet of SGLang pods, one GPU each, behind a
    headless Service that one DNS pool endpoint resolves, with SGLang metrics."""
    objs = rendered["engines"]
    sglang = one(objs, "StatefulSet", "sglang")
    (c,) = sglang["spec"]["template"]["spec"]["containers"]
    assert str(c["image"]).startswith("lmsysorg/sglang:")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    command = [str(x) for x in c["command"]]
    for flag in ("--enable-metrics", "--enable-cache-report", "--enable-priority-scheduling"):
        assert flag in command
    model = command[command.index("--model-path") + 1]
    assert "startupProbe" in c
    assert one(objs, "Service", "sglang")["spec"]["clusterIP"] == "None"
    config = config_of(objs, "engines")
    (pool,) = config.endpoints
    assert (
        pool.discover == "dns"
        and urlsplit(pool.url).hostname == "sglang.luftpause.svc.cluster.local"
    )
    assert pool.models == (model,) and pool.metrics == "sglang"
    assert config.runtime.default_model == model


def test_the_fake_overlay_runs_the_fakes_like_compose(rendered: dict[str, list[Obj]]) -> None:
    """X3: two fake engines and the fake MCP tools, no GPU anywhere."""
    objs = rendered["fake-engines"]
    engines = one(objs, "StatefulSet", "fake-engine")
    assert engines["spec"]["replicas"] == 2
    (c,) = engines["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "fake-engine"
    mcp = one(objs, "Deployment", "fake-mcp")
    assert mcp["spec"]["template"]["spec"]["containers"][0]["args"][0] == "fake-mcp"
    for w in workloads(objs):
        for c in w["spec"]["template"]["spec"]["containers"]:
            assert "nvidia.com/gpu" not in str(c.get("resources")), w["metadata"]["name"]
    config = config_of(objs, "fake-engines")
    assert [t.name for t in config.runtime.tool_servers] == ["fake"]


# ------------------------------------------------------- the checks, broken on purpose


def _containers(objs: list[Obj], name: str) -> list[Obj]:
    return list(component(objs, name)["spec"]["template"]["spec"]["containers"])


def _pop(d: dict[str, Any], *path: str) -> None:
    for key in path[:-1]:
        d = d[key]
    d.pop(path[-1])


def _set(d: dict[str, Any], value: Any, *path: str) -> None:
    for key in path[:-1]:
        d = d[key]
    d[path[-1]] = value


def _break_policy_source(objs: list[Obj]) -> None:
    (policy,) = find(objs, "NetworkPolicy")
    policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"][
        "app.kubernetes.io/component"
    ] = "fake-mcp"


BREAKAGES: dict[str, tuple[Callable[[list[Obj]], None], str]] = {
    "no readiness probe": (
        lambda o: _containers(o, "dataplane")[0].pop("readinessProbe"),
        "no HTTP readinessProbe",
    ),
    "no liveness probe on fake-mcp": (
        lambda o: one(o, "Deployment", "fake-mcp")["spec"]["template"]["spec"]["containers"][0].pop(
            "livenessProbe"
        ),
        "fake-mcp/fake-mcp: no HTTP livenessProbe",
    ),
    "no cpu request": (
        lambda o: _pop(_containers(o, "runtime")[0], "resources", "requests", "cpu"),
        "no cpu request",
    ),
    "root allowed": (
        lambda o: _set(
            component(o, "scheduler"),
            False,
            "spec",
            "template",
            "spec",
            "securityContext",
            "runAsNonRoot",
        ),
        "runAsNonRoot is not true",
    ),
    "no seccomp": (
        lambda o: _pop(
            component(o, "scheduler"),
            "spec",
            "template",
            "spec",
            "securityContext",
            "seccompProfile",
        ),
        "seccompProfile",
    ),
    "escalation": (
        lambda o: _set(
            _containers(o, "dataplane")[0], True, "securityContext", "allowPrivilegeEscalation"
        ),
        "allowPrivilegeEscalation",
    ),
    "capabilities kept": (
        lambda o: _set(_containers(o, "runtime")[0], [], "securityContext", "capabilities", "drop"),
        "drop ALL",
    ),
    "writable root": (
        lambda o: _set(
            _containers(o, "runtime")[0], False, "securityContext", "readOnlyRootFilesystem"
        ),
        "root filesystem is writable",
    ),
    "no /tmp": (
        lambda o: _containers(o, "scheduler")[0].update(
            volumeMounts=[
                m
                for m in _containers(o, "scheduler")[0]["volumeMounts"]
                if m["mountPath"] != "/tmp"
            ]
        ),
        "no emptyDir at /tmp",
    ),
    "image untagged": (
        lambda o: _set(_containers(o, "scheduler")[0], IMAGE + ":latest", "image"),
        "is not tagged",
    ),
    "two schedulers": (
        lambda o: _set(component(o, "scheduler"), 2, "spec", "replicas"),
        "replicas is not 1",
    ),
    "rolling scheduler": (
        lambda o: _set(component(o, "scheduler"), {"type": "RollingUpdate"}, "spec", "strategy"),
        "strategy is not Recreate",
    ),
    "scheduler probed on gRPC": (
        lambda o: _set(_containers(o, "scheduler")[0], "grpc", "livenessProbe", "httpGet", "port"),
        "livenessProbe is not /health on 5001",
    ),
    "one dataplane": (
        lambda o: _set(component(o, "dataplane"), 1, "spec", "replicas"),
        "fewer than 2",
    ),
    "no HPA": (
        lambda o: o.remove(find(o, "HorizontalPodAutoscaler")[0]),
        "no HorizontalPodAutoscaler",
    ),
    "HPA on memory": (
        lambda o: _set(
            find(o, "HorizontalPodAutoscaler")[0]["spec"]["metrics"][0],
            {"name": "memory", "target": {"type": "Utilization", "averageUtilization": 70}},
            "resource",
        ),
        "does not scale on CPU",
    ),
    "fixed dataplane id": (
        lambda o: _containers(o, "dataplane")[0]["args"].__setitem__(-1, "dp"),
        "--dataplane-id is not its pod's name",
    ),
    "runtime without claim": (
        lambda o: _pop(component(o, "runtime"), "spec", "volumeClaimTemplates"),
        "no claim mounted at state_dir",
    ),
    "runtime claim elsewhere": (
        lambda o: _set(_containers(o, "runtime")[0]["volumeMounts"][0], "/data", "mountPath"),
        "no claim mounted at state_dir",
    ),
    "scheduler Service without link port": (
        lambda o: one(o, "Service", "luftpause-scheduler")["spec"]["ports"].pop(),
        "its Service exposes [5000, 5001]",
    ),
    "no scheduler PDB": (
        lambda o: o.remove(one(o, "PodDisruptionBudget", "luftpause-scheduler")),
        "scheduler: not exactly one PodDisruptionBudget",
    ),
    "dataplane PDB allows none": (
        lambda o: _set(
            one(o, "PodDisruptionBudget", "luftpause-dataplane"),
            {
                "maxUnavailable": 1,
                "selector": one(o, "PodDisruptionBudget", "luftpause-dataplane")["spec"][
                    "selector"
                ],
            },
            "spec",
        ),
        "minAvailable is not 1",
    ),
    "no NetworkPolicy": (
        lambda o: o.remove(find(o, "NetworkPolicy")[0]),
        "not exactly one NetworkPolicy",
    ),
    "NetworkPolicy lets another pod in": (_break_policy_source, "the dataplane may not reach"),
    "Prometheus reaches gRPC": (
        lambda o: find(o, "NetworkPolicy")[0]["spec"]["ingress"][1]["ports"].append({"port": 5000}),
        "pods elsewhere may reach",
    ),
    "no part-of label": (
        lambda o: one(o, "Service", "fake-mcp")["metadata"]["labels"].pop(
            "app.kubernetes.io/part-of"
        ),
        "Service/fake-mcp: no app.kubernetes.io/part-of",
    ),
    "token not from the Secret": (
        lambda o: _containers(o, "runtime")[0]["env"].__setitem__(
            0, {"name": "LUFTPAUSE_TOKEN", "value": "x"}
        ),
        "runtime: LUFTPAUSE_TOKEN is not the Secret",
    ),
    "config from elsewhere": (
        lambda o: _containers(o, "dataplane")[0]["args"].__setitem__(
            2, "/etc/luftpause/stack.toml"
        ),
        "is not the ConfigMap's",
    ),
    "dataplane Service renamed": (
        lambda o: _set(one(o, "Service", "luftpause-dataplane"), "dp", "metadata", "name"),
        "luftpause-dataplane is no Service",
    ),
    "engine scaled but not listed": (
        lambda o: _set(one(o, "StatefulSet", "fake-engine"), 3, "spec", "replicas"),
        "pods [0, 1] listed, replicas 3",
    ),
    "engine Service not headless": (
        lambda o: one(o, "Service", "fake-engine")["spec"].pop("clusterIP"),
        "is no headless Service",
    ),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_check_catches_its_breakage(breakage: str, rendered: dict[str, list[Obj]]) -> None:
    """The checks above are not vacuous: each breakage of the fake overlay is reported."""
    objs = copy.deepcopy(rendered["fake-engines"])
    config = config_of(objs, "fake-engines")
    assert all_problems(objs, config) == []
    mutate, expected = BREAKAGES[breakage]
    mutate(objs)
    problems = all_problems(objs, config)
    assert any(expected in p for p in problems), problems


def test_the_scaling_rule_is_checked_against_the_config(rendered: dict[str, list[Obj]]) -> None:
    """An endpoint naming a pod past the StatefulSet's replicas, or in another namespace,
    is reported."""
    objs = rendered["fake-engines"]
    config = config_of(objs, "fake-engines")
    extra = config.endpoints[0].model_copy(
        update={
            "name": "fake-engine-2",
            "url": "http://fake-engine-2.fake-engine.luftpause.svc.cluster.local:8001",
        }
    )
    other_ns = config.endpoints[0].model_copy(
        update={"url": "http://fake-engine-0.fake-engine.default.svc.cluster.local:8001"}
    )
    for endpoints, expected in [
        ((*config.endpoints, extra), "fake-engine-2 is no pod of fake-engine"),
        ((other_ns, *config.endpoints[1:]), "is not <pod>.<service>.luftpause"),
    ]:
        broken = config.model_copy(update={"endpoints": endpoints})
        assert any(expected in p for p in check_peers(objs, broken))
