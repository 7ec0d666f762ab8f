"""Settings of the Kubernetes backend: ``KILN_KUBERNETES_*`` environment variables (maps and lists as JSON).

Kept beside the backend (not in :mod:`kiln.settings`) while the backend is only a renderer; the controller will
move them into the one settings tree.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from kiln.backends.kubernetes.render import KubeConfig


class KubernetesSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KILN_KUBERNETES_", extra="ignore")

    namespace: str = Field("kiln", description="Namespace of the jobs' objects.")
    init_image: str = Field("python:3.11-slim", description="Image of the init container that fetches code/data.")
    gpu_type_label: str = Field("nvidia.com/gpu.product", description="Node label that resources.gpu_type selects.")
    gpu_types: dict[str, str] = Field(
        default_factory=dict, description='gpu_type → label value, e.g. {"H200": "NVIDIA-H200"}; else as given.'
    )
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Tolerations of every job pod.")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets for pulling job images.")
    ttl_seconds_after_finished: int | None = Field(3600, description="Finished Jobs are deleted after this.")
    gang_scheduler: Literal["kueue", "volcano"] | None = Field(None, description="Queue jobs with Kueue/Volcano.")
    queue: str | None = Field(None, description="Kueue LocalQueue or Volcano Queue (with gang_scheduler).")
    priority_classes: dict[str, str] = Field(
        default_factory=dict, description='Spec priority → PriorityClass, e.g. {"high": "kiln-high"}.'
    )
    rendezvous_port: int = Field(29500, description="Port of every gang member (MASTER_PORT, TF, JAX).")
    cluster_domain: str | None = Field(None, description="e.g. cluster.local; None: names end in .svc.")
    kubernetes_version: str = Field("1.29", description="The cluster's version (successPolicy from 1.31).")
    termination_grace_seconds: int = Field(30, description="SIGTERM → SIGKILL grace of job pods.")
    service_account: str | None = Field(None, description="Service account of job pods; None: no API token.")
    upload_timeout: int = Field(
        600, ge=1, description="Seconds a pod waits, once its command ended, for its outputs to reach the store."
    )

    # How the server reaches the API server: in-cluster (its service account) by default, else a kubeconfig, or
    # an explicit URL (and bearer token).
    api_url: str | None = Field(None, description="API server URL, e.g. https://10.0.0.1:6443 (default: in-cluster).")
    token: SecretStr | None = Field(None, description="Bearer token for api_url (never logged).")
    verify_ssl: bool = Field(True, description="Verify the API server's certificate (with api_url).")
    kubeconfig: str | None = Field(None, description="A kubeconfig file, when not running in the cluster.")
    image_pull_grace: float = Field(60.0, ge=0, description="Seconds an image pull may fail before the job does.")

    def to_config(self, **overrides: Any) -> KubeConfig:
        connection = {"api_url", "token", "verify_ssl", "kubeconfig", "image_pull_grace"}
        return KubeConfig(**{**self.model_dump(exclude=connection), **overrides})

    def api_client(self) -> Any:
        """An ApiClient of the official client for this server's cluster."""
        from kubernetes import client, config

        if self.api_url:
            configuration = client.Configuration()
            configuration.host = self.api_url
            configuration.verify_ssl = self.verify_ssl
            if self.token is not None:
                configuration.api_key = {"authorization": "Bearer " + self.token.get_secret_value()}
            return client.ApiClient(configuration)
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config(config_file=self.kubeconfig)
        return client.ApiClient()
