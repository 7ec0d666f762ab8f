"""What :func:`kiln.backends.kubernetes.render.render` takes: the cluster's settings (:class:`KubeConfig`) and
one attempt of one job (:class:`RenderInput`), and the image a spec runs in (:func:`resolve_image`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic_settings import BaseSettings

from kiln.backends.kubernetes.names import _DNS_LABEL, check_selector
from kiln.domain.egress import EgressRule, parse_rules
from kiln.domain.spec import JobSpec
from kiln.errors import InvalidInput
from kiln.settings import KubernetesSettings, Settings

GangScheduler = Literal["kueue", "volcano"]


def _setting(name: str, of: type[BaseSettings] = KubernetesSettings) -> Callable[[], Any]:
    """A factory of the default of the setting ``name`` (``KILN_KUBERNETES_<NAME>``, or the server's ``KILN_<NAME>``),
    for a dataclass field: the settings are the one place a default is written."""
    info = of.model_fields[name]
    if info.default_factory is not None:
        return info.default_factory  # type: ignore[return-value]
    default = info.default
    return lambda: default


@dataclass
class KubeConfig:
    """How Kiln renders jobs for one cluster: the settings (:class:`kiln.settings.KubernetesSettings`, built by
    :func:`kiln.backends.kubernetes.settings.kube_config`) less how the server reaches the cluster, with their
    defaults, and what the renderer alone decides (``mpi_daemon``)."""

    # What each means: the settings' descriptions (kiln.settings.KubernetesSettings).
    namespace: str = field(default_factory=_setting("namespace"))
    init_image: str = field(default_factory=_setting("init_image"))
    gpu_type_label: str = field(default_factory=_setting("gpu_type_label"))
    gpu_types: dict[str, str] = field(default_factory=_setting("gpu_types"))
    tolerations: list[dict[str, Any]] = field(default_factory=_setting("tolerations"))
    image_pull_secrets: list[str] = field(default_factory=_setting("image_pull_secrets"))
    ttl_seconds_after_finished: int | None = field(default_factory=_setting("ttl_seconds_after_finished"))
    gang_scheduler: GangScheduler | None = field(default_factory=_setting("gang_scheduler"))
    queue: str | None = field(default_factory=_setting("queue"))
    priority_classes: dict[str, str] = field(default_factory=_setting("priority_classes"))
    rendezvous_port: int = field(default_factory=_setting("rendezvous_port"))
    cluster_domain: str | None = field(default_factory=_setting("cluster_domain"))
    kubernetes_version: str = field(default_factory=_setting("kubernetes_version"))
    termination_grace_seconds: int = field(default_factory=_setting("termination_grace_seconds"))
    checkpoint_sync_seconds: float = field(default_factory=_setting("checkpoint_sync_seconds", Settings))
    upload_timeout: int = field(default_factory=_setting("upload_timeout"))
    service_account: str | None = field(default_factory=_setting("service_account"))
    # What MPI members other than 0 run: an sshd that the launcher's mpirun reaches (the image must have one).
    mpi_daemon: str = "ssh-keygen -A >/dev/null; mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e"
    # The jobs' network (netpol.py): who may reach their pods, and where they may connect.
    server_pod_labels: dict[str, str] = field(default_factory=_setting("server_pod_labels"))
    server_namespace: str | None = field(default_factory=_setting("server_namespace"))
    dns_pod_labels: dict[str, str] = field(default_factory=_setting("dns_pod_labels"))
    job_egress: list[str] = field(default_factory=list)  # KILN_JOB_EGRESS (kiln.domain.egress), for isolated
    network_host_orgs: list[str] = field(default_factory=list)  # KILN_NETWORK_HOST_ORGS: who may use host

    def __post_init__(self) -> None:
        if not _DNS_LABEL.match(self.namespace) or len(self.namespace) > 63:
            raise ValueError(f"namespace {self.namespace!r} is not a valid Kubernetes namespace name")
        if self.gang_scheduler is not None and not self.queue:
            raise ValueError(f"gang_scheduler {self.gang_scheduler!r} needs a queue")
        if not 1 <= self.rendezvous_port <= 65535:
            raise ValueError("rendezvous_port must be 1..65535")
        if self.upload_timeout < 1 or self.checkpoint_sync_seconds < 0:
            raise ValueError("upload_timeout must be >= 1 and checkpoint_sync_seconds >= 0")
        if not re.match(r"^\d+\.\d+", self.kubernetes_version):
            raise ValueError(f"kubernetes_version {self.kubernetes_version!r} is not MAJOR.MINOR")
        if self.server_namespace is not None and (
            not _DNS_LABEL.match(self.server_namespace) or len(self.server_namespace) > 63
        ):
            raise ValueError(f"server_namespace {self.server_namespace!r} is not a valid Kubernetes namespace name")
        for what, labels in (("server_pod_labels", self.server_pod_labels), ("dns_pod_labels", self.dns_pod_labels)):
            if not labels:
                raise ValueError(f"{what} must name at least one label (an empty selector selects every pod)")
            for key, value in labels.items():
                try:
                    check_selector(key, value, what)
                except InvalidInput as exc:
                    raise ValueError(exc.message) from None
        parse_rules(self.job_egress)  # ValueError naming a bad rule

    @property
    def egress_rules(self) -> list[EgressRule]:
        """:attr:`job_egress`, parsed."""
        return parse_rules(self.job_egress)

    @property
    def version(self) -> tuple[int, int]:
        major, minor = self.kubernetes_version.split(".")[:2]
        return int(major), int(re.sub(r"\D.*", "", minor) or 0)


@dataclass
class RenderInput:
    """One attempt of one job, as the controller (or the CLI) knows it."""

    job_id: str
    org_id: str
    attempt: int
    spec: JobSpec
    image: str | None = None  # resolved from the runtime catalog; None: spec.runtime.image
    code_sha256: str | None = None  # None: the job has no code bundle
    endpoint: str = "http://kiln:8080"  # the Kiln API as pods reach it
    token: str | None = None  # the job token; None: a placeholder
    ssh_private_key: str | None = None  # MPI only: the gang's key pair (OpenSSH format)
    ssh_public_key: str | None = None
    owner_uid: str | None = None  # the main Job's uid, once created: ownerReferences on everything else


def resolve_image(spec: JobSpec, catalog: Any) -> str:
    """The container image of a spec: its own ``runtime.image``, or the catalog entry's image.
    ``runtime.python`` (an interpreter on the host) can never run on Kubernetes."""
    runtime = spec.runtime
    if runtime.python:
        raise InvalidInput(
            f"runtime.python ({runtime.python}) names an interpreter on the host, which does not exist on "
            "Kubernetes: give runtime.image (your own image) or runtime.framework (a catalog image)"
        )
    if runtime.image:
        return runtime.image
    entry = catalog.resolve(runtime.framework or "python", runtime.version)
    if not entry.image:
        raise InvalidInput(f"runtime {runtime.label}: the catalog entry has no image for container backends")
    return str(entry.image)
