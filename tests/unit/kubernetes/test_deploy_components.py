"""deploy/kubernetes/components: the optional gang-scheduler components compose with the base, validate strictly,
grant exactly what their objects need, and configure the server the way the backend reads its settings."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln.backends.kubernetes.settings import KubernetesSettings
from tests.components import require
from tests.unit.kubernetes.conftest import VERSIONS, validate_strict

ROOT = Path(__file__).resolve().parents[3]
COMPONENTS = sorted(p.name for p in (ROOT / "deploy/kubernetes/components").iterdir() if p.is_dir())
KUBECTL = shutil.which("kubectl")
_cache: dict[str, list[dict[str, Any]]] = {}


def with_component(name: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The base plus one component, as an overlay that uses it would render."""
    require("kubectl")
    if name not in _cache:
        tree = tmp_path_factory.mktemp(f"deploy-{name}") / "kubernetes"
        shutil.copytree(ROOT / "deploy/kubernetes", tree)
        root = tree / "overlays" / f"with-{name}"
        root.mkdir()
        (root / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "namespace": "kiln",
                    "resources": ["../../base"],
                    "components": [f"../../components/{name}"],
                }
            )
        )
        done = subprocess.run([KUBECTL, "kustomize", str(root)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        _cache[name] = [d for d in yaml.safe_load_all(done.stdout) if d]
    return _cache[name]


def test_there_are_components() -> None:
    assert {"kueue", "volcano"} <= set(COMPONENTS)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("component", COMPONENTS)
@pytest.mark.needs("kubernetes-validate")
def test_component_validates_strictly(component: str, version: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    validate_strict(with_component(component, tmp_path_factory), version)


@pytest.mark.parametrize("component", COMPONENTS)
def test_component_configures_the_backend(component: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    docs = with_component(component, tmp_path_factory)
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("kiln-settings")]
    env = {k: v for k, v in config["data"].items() if k.startswith("KILN_KUBERNETES_")}
    settings = KubernetesSettings(**{k.removeprefix("KILN_KUBERNETES_").lower(): v for k, v in env.items()})
    assert settings.gang_scheduler == component and settings.queue


def test_volcano_may_manage_podgroups_and_kueue_needs_nothing_more(tmp_path_factory: pytest.TempPathFactory) -> None:
    def rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        (role,) = [d for d in docs if d["kind"] == "Role"]
        return role["rules"]

    base = rules(with_component("kueue", tmp_path_factory))
    volcano = rules(with_component("volcano", tmp_path_factory))
    assert volcano[: len(base)] == base
    (extra,) = volcano[len(base) :]
    assert extra == {
        "apiGroups": ["scheduling.volcano.sh"],
        "resources": ["podgroups"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    }
    assert not any("podgroups" in r["resources"] for r in base)
