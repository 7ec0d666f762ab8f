"""The renderer's KubeConfig takes its defaults from the settings (kiln.settings.KubernetesSettings): a KubeConfig
built with none is the one the server builds from default settings."""

from __future__ import annotations

from dataclasses import asdict

from kiln.backends.kubernetes.inputs import KubeConfig
from kiln.backends.kubernetes.settings import kube_config
from kiln.settings import KubernetesSettings, Settings


def test_a_default_kubeconfig_is_the_default_settings() -> None:
    defaults = KubernetesSettings.model_construct()  # the declared defaults, no KILN_KUBERNETES_* read
    sync = Settings.model_fields["checkpoint_sync_seconds"].default
    assert asdict(KubeConfig()) == asdict(kube_config(defaults, checkpoint_sync_seconds=sync))
    assert KubeConfig().server_pod_labels == defaults.server_pod_labels
    assert KubeConfig().gpu_types is not KubeConfig().gpu_types  # a fresh map each (a factory, not a shared one)
