"""kiln.settings: one tree; the Kubernetes backend's settings nested in it under the variable names users set."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from kiln.api.startup import EXIT_USAGE, explain
from kiln.backends.kubernetes.settings import kube_config
from kiln.settings import KubernetesSettings, Settings


def test_the_kubernetes_settings_are_a_branch_of_the_tree_read_from_their_own_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_KUBERNETES_NAMESPACE", "ml-jobs")
    monkeypatch.setenv("KILN_KUBERNETES_GPU_TYPES", '{"H200": "NVIDIA-H200"}')
    monkeypatch.setenv("KILN_KUBERNETES_IMAGE_PULL_GRACE", "5")
    settings = Settings(home=tmp_path)
    assert isinstance(settings.kubernetes, KubernetesSettings)
    assert settings.kubernetes.namespace == "ml-jobs"
    assert settings.kubernetes.gpu_types == {"H200": "NVIDIA-H200"}
    assert settings.kubernetes.image_pull_grace == 5.0
    config = kube_config(settings.kubernetes, checkpoint_sync_seconds=settings.checkpoint_sync_seconds)
    assert (config.namespace, config.gpu_types) == ("ml-jobs", {"H200": "NVIDIA-H200"})


def test_the_branch_may_be_given_explicitly(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, kubernetes={"namespace": "other", "rendezvous_port": 29600})
    assert (settings.kubernetes.namespace, settings.kubernetes.rendezvous_port) == ("other", 29600)


def test_an_invalid_kubernetes_variable_is_named_when_the_settings_are_read(monkeypatch, tmp_path):
    valid = Settings(home=tmp_path)
    monkeypatch.setenv("KILN_KUBERNETES_IMAGE_PULL_GRACE", "soon")
    with pytest.raises(ValidationError) as caught:
        Settings(home=tmp_path)
    error = explain(caught.value, valid)
    assert error.exit_code == EXIT_USAGE
    assert error.message.startswith("invalid settings: KILN_KUBERNETES_IMAGE_PULL_GRACE: ")


def test_every_variable_the_deploy_manifests_and_docs_name_is_a_setting() -> None:
    root = Path(__file__).resolve().parents[2]
    texts = [root / "docs" / "kubernetes.md", *sorted((root / "deploy" / "kubernetes").rglob("*.y*ml"))]
    named = {m.lower() for p in texts for m in re.findall(r"KILN_KUBERNETES_([A-Z_]+[A-Z])", p.read_text())}
    assert named, "no KILN_KUBERNETES_* variable found where they are documented"
    assert named <= set(KubernetesSettings.model_fields), named - set(KubernetesSettings.model_fields)


def test_trusted_proxies_are_addresses_or_networks_and_none_by_default(monkeypatch, tmp_path):
    from kiln.api.serve import proxy_options

    default = Settings(home=tmp_path)
    assert default.trusted_proxies == []
    assert proxy_options(default) == {"proxy_headers": False}  # uvicorn would trust any peer on loopback
    monkeypatch.setenv("KILN_TRUSTED_PROXIES", "127.0.0.1, 10.0.0.0/8,::1")
    settings = Settings(home=tmp_path)
    assert settings.trusted_proxies == ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]
    assert proxy_options(settings) == {"proxy_headers": True, "forwarded_allow_ips": settings.trusted_proxies}
    monkeypatch.setenv("KILN_TRUSTED_PROXIES", '["192.168.1.7"]')
    assert Settings(home=tmp_path).trusted_proxies == ["192.168.1.7/32"]
    monkeypatch.setenv("KILN_TRUSTED_PROXIES", "127.0.0.1,proxy.example.com")
    with pytest.raises(ValidationError, match=re.escape("'proxy.example.com' is not an IP address or a network")):
        Settings(home=tmp_path)


def test_the_currency_is_an_iso_code_or_nothing(monkeypatch, tmp_path):
    valid = Settings(home=tmp_path)
    assert valid.currency == ""  # costs are plain numbers
    monkeypatch.setenv("KILN_CURRENCY", "EUR")
    assert Settings(home=tmp_path).currency == "EUR"
    monkeypatch.setenv("KILN_CURRENCY", "euro")
    with pytest.raises(ValidationError) as caught:
        Settings(home=tmp_path)
    error = explain(caught.value, valid)
    assert error.message.startswith("invalid settings: KILN_CURRENCY: "), error.message
