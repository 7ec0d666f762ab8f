"""deploy/kubernetes: every overlay renders offline with ``kubectl kustomize`` and every document validates
strictly against the official schemas of the oldest and newest supported Kubernetes versions; the server's
RBAC is namespaced and names every verb and resource."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.components import require
from tests.unit.kubernetes.conftest import VERSIONS, validate_strict

ROOT = Path(__file__).resolve().parents[3]
OVERLAYS = sorted(p.name for p in (ROOT / "deploy/kubernetes/overlays").iterdir() if p.is_dir())
KUBECTL = shutil.which("kubectl")
_cache: dict[str, list[dict[str, Any]]] = {}


def kustomize(overlay: str) -> list[dict[str, Any]]:
    require("kubectl")
    if overlay not in _cache:
        done = subprocess.run(
            [KUBECTL, "kustomize", str(ROOT / "deploy/kubernetes/overlays" / overlay)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        _cache[overlay] = [d for d in yaml.safe_load_all(done.stdout) if d]
    return _cache[overlay]


def test_there_are_overlays() -> None:
    assert {"dev", "production"} <= set(OVERLAYS)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.needs("kubernetes-validate")
def test_overlay_validates_strictly(overlay: str, version: str) -> None:
    validate_strict(kustomize(overlay), version)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_shape(overlay: str) -> None:
    docs = kustomize(overlay)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Secret"} <= kinds
    # Cluster-wide: only reading nodes (the scheduler's inventory); see test_cluster_role_only_reads_nodes.
    cluster_wide = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    (namespace,) = {d["metadata"]["namespace"] for d in docs if d["kind"] not in cluster_wide}
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/var/lib/kiln"}
    assert pod["serviceAccountName"] == "kiln-server"
    if overlay == "production":
        assert deployment["spec"]["replicas"] >= 3
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config["data"]["KILN_BACKEND"] == "kubernetes"
    assert config["data"]["KILN_STORAGE_URL"].startswith("s3://")
    assert config["data"]["KILN_KUBERNETES_NAMESPACE"] == namespace  # jobs run beside the server: the Role covers them
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert {"KILN_DATABASE_URL", "KILN_SERVER_KEY", "KILN_STORAGE_SECRET_ACCESS_KEY"} <= set(secret["stringData"])
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_role_is_least_privilege(overlay: str) -> None:
    docs = kustomize(overlay)
    (role,) = [d for d in docs if d["kind"] == "Role"]
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kiln-server"}
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kiln-server", "namespace": role["metadata"]["namespace"]}
    ]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    allowed = {
        ("batch", "jobs"),
        ("", "pods"),
        ("", "pods/log"),
        ("", "services"),
        ("", "events"),
        ("events.k8s.io", "events"),
        ("", "secrets"),
        ("", "configmaps"),
        ("apps", "deployments"),
        ("autoscaling", "horizontalpodautoscalers"),
        ("networking.k8s.io", "networkpolicies"),
    }
    assert set(granted) <= allowed
    # What the renderers create (jobs, and model services' Deployments and autoscalers), the server may create and
    # delete.
    for key in (
        ("batch", "jobs"),
        ("", "services"),
        ("", "secrets"),
        ("", "configmaps"),
        ("apps", "deployments"),
        ("autoscaling", "horizontalpodautoscalers"),
    ):
        assert {"create", "delete", "get", "list", "watch"} <= granted[key]
    # The jobs' and services' NetworkPolicies: created, owned (patch), replaced (update), deleted; never watched.
    assert granted[("networking.k8s.io", "networkpolicies")] == {"get", "list", "create", "update", "patch", "delete"}
    assert granted[("", "pods/log")] == {"get"}
    assert "create" not in granted[("", "pods")] and "create" not in granted[("", "events")]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cluster_role_only_reads_nodes(overlay: str) -> None:
    docs = kustomize(overlay)
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kiln-server", "namespace": role["metadata"]["namespace"]}
    ]
