"""What the Kubernetes backend makes of its settings (``settings.kubernetes``,
:class:`kiln.settings.KubernetesSettings`, ``KILN_KUBERNETES_*``): the renderer's :class:`KubeConfig` and a client
of the cluster's API server."""

from __future__ import annotations

from typing import Any

from kiln.backends.kubernetes.render import KubeConfig
from kiln.settings import KubernetesSettings, Settings

__all__ = ["KubernetesSettings", "api_client", "job_network", "kube_config"]

CONNECTION = frozenset({"api_url", "token", "verify_ssl", "kubeconfig", "image_pull_grace"})


def kube_config(settings: KubernetesSettings, **overrides: Any) -> KubeConfig:
    """How jobs are rendered for the cluster (the settings less how the server reaches it)."""
    return KubeConfig(**{**settings.model_dump(exclude=set(CONNECTION)), **overrides})


def job_network(settings: Settings) -> dict[str, Any]:
    """The server-wide job network settings a :class:`KubeConfig` takes (``KILN_JOB_EGRESS``,
    ``KILN_NETWORK_HOST_ORGS``), as :func:`kube_config` overrides."""
    return {
        "job_egress": [str(rule) for rule in settings.egress_rules],
        "network_host_orgs": list(settings.network_host_org_list),
    }


def api_client(settings: KubernetesSettings) -> Any:
    """An ApiClient of the official client for this server's cluster."""
    from kubernetes import client, config

    if settings.api_url:
        configuration = client.Configuration()
        configuration.host = settings.api_url
        configuration.verify_ssl = settings.verify_ssl
        if settings.token is not None:
            configuration.api_key = {"authorization": "Bearer " + settings.token.get_secret_value()}
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=settings.kubeconfig)
    return client.ApiClient()
