"""What :func:`kiln.backends.kubernetes.render.render` takes: the cluster's settings (:class:`KubeConfig`) and
one attempt of one job (:class:`RenderInput`), and the image a spec runs in (:func:`resolve_image`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from kiln.backends.kubernetes.names import _DNS_LABEL, check_selector
from kiln.domain.egress import EgressRule, parse_rules
from kiln.domain.spec import JobSpec
from kiln.errors import InvalidInput

GangScheduler = Literal["kueue", "volcano"]
# The labels of Kiln's server pods (deploy/kubernetes/base/deployment.yaml) and of the cluster's DNS pods.
SERVER_POD_LABELS = {"app.kubernetes.io/name": "kiln", "app.kubernetes.io/component": "server"}
DNS_POD_LABELS = {"k8s-app": "kube-dns"}


@dataclass
class KubeConfig:
    """How Kiln renders jobs for one cluster (settings; see :class:`kiln.backends.kubernetes.settings`)."""

    namespace: str = "kiln"
    init_image: str = "python:3.11-slim"  # runs podfetch.py and podsync.py: any image with python3
    gpu_type_label: str = "nvidia.com/gpu.product"
    gpu_types: dict[str, str] = field(default_factory=dict)  # spec gpu_type → node label value; else as given
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    ttl_seconds_after_finished: int | None = 3600
    gang_scheduler: GangScheduler | None = None
    queue: str | None = None  # Kueue LocalQueue or Volcano Queue; required with gang_scheduler
    priority_classes: dict[str, str] = field(default_factory=dict)  # low/normal/high → PriorityClass
    rendezvous_port: int = 29500  # every member's port (MASTER_PORT, TF server, JAX coordinator)
    cluster_domain: str | None = None  # None: "<ns>.svc" (resolved through the pod's search path)
    kubernetes_version: str = "1.29"  # the cluster's; from 1.31 on, gangs use Job successPolicy
    termination_grace_seconds: int = 30
    checkpoint_sync_seconds: float = 300.0  # the server's setting: how often pods upload changed checkpoints
    upload_timeout: int = 600  # how long a pod's entrypoint waits for the outputs' upload when the command ends
    service_account: str | None = None  # for the job's pods; None: no API token is mounted
    # What MPI members other than 0 run: an sshd that the launcher's mpirun reaches (the image must have one).
    mpi_daemon: str = "ssh-keygen -A >/dev/null; mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e"
    # The jobs' network (netpol.py): who may reach their pods, and where they may connect.
    server_pod_labels: dict[str, str] = field(default_factory=lambda: dict(SERVER_POD_LABELS))  # Kiln's server
    server_namespace: str | None = None  # the server pods' namespace; None: the jobs' (deploy/kubernetes)
    dns_pod_labels: dict[str, str] = field(default_factory=lambda: dict(DNS_POD_LABELS))  # in any namespace
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
