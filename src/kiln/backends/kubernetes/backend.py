"""The Kubernetes backend: the controller that runs Kiln attempts as Kubernetes Jobs (official ``kubernetes`` client).

- ``start`` renders the attempt (:func:`kiln.backends.kubernetes.render.render`) and creates its objects in order:
  Secret, ConfigMap(s), Service (and Volcano PodGroup), NetworkPolicy, then the main Job; ``409 AlreadyExists``
  counts as created, so calling it again after a controller restart never makes a second Job (names are deterministic;
  the API calls are :class:`~kiln.backends.kubernetes.kubeapi.KubeObjects`).
  Once the main Job exists its uid goes onto every other object as an ownerReference (patched onto those
  created before it, set on the parameter servers' Job before it is created), so deleting that Job — or its
  TTL — removes everything.
- Status comes from two informers (pods and Jobs with ``app.kubernetes.io/managed-by=kiln`` in the namespace;
  :class:`~kiln.backends.kubernetes.informers.Informers`): list once, then watch from the list's resourceVersion,
  resume after each watch timeout from the last version seen, re-list on ``410 Gone``; the objects live in the
  backend's in-memory cache, which the informers keep, each a piece of the backend's ``background_work`` (one list
  or watch request a step) that the server's task runner runs.
  ``poll`` reads that cache (it never lists per poll) and maps it with :func:`status_from`.
- ``cancel``/``preempt`` delete the attempt's Jobs with ``propagationPolicy: Foreground``: the pods get SIGTERM
  and ``terminationGracePeriodSeconds`` (the ``termination_grace_seconds`` setting) before SIGKILL. There is
  no preemption notice file on Kubernetes (writing into a pod needs ``exec``); a job learns of preemption by the
  SIGTERM alone.
- Logs: each pod's ``pods/log`` is followed (with timestamps) into Kiln's :class:`LogStore`, as lines tagged
  with the member (``O@worker1``) for gangs, so logs outlive the pods; a restarted controller resumes where it
  was without duplicating lines (:class:`~kiln.backends.kubernetes.podlogs.PodLogs`, which the backend owns).
  The follow streams, one blocking read per running pod, are the backend's ``k8s-pod-logs`` work, keyed by pod
  uid: the server's task runner gives each pod's stream a thread of its own. The backend starts no thread.
- It has no ``collect_outputs``/``sync_checkpoints`` (it declares neither capability), and needs none: a pod's
  ``$KILN_OUTPUT_DIR`` and checkpoints live in emptyDirs the server cannot reach; the pod's ``kiln-sync`` sidecar
  (``podsync.py``) uploads them through the Kiln API with the job token — checkpoints every
  ``checkpoint_sync_seconds``, outputs and the last checkpoints before the job's container exits — and the init
  container restores the stored checkpoints into the next attempt's pods (``podfetch.py``). See
  docs/kubernetes.md.
- ``nodes``: the cluster's nodes (allocatable cpu, memory, ``nvidia.com/gpu``, labels), listed at most every
  ``node_refresh`` seconds.
- Notebooks (:class:`~kiln.backends.capabilities.NotebookHost`): a notebook's job (its ``kiln-notebook`` label,
  which only Kiln's notebook service sets) renders with
  :func:`~kiln.backends.kubernetes.notebooks.render_notebook`: JupyterLab on the pod's port 8888 with a token this
  start makes (kept in the attempt's Secret), behind a ClusterIP Service that only Kiln's server may reach;
  ``notebook_address`` is that Service's cluster IP and the Secret's token (``read_notebook_address``).
  TensorBoard sessions are refused: their server has no token of its own, and on the local executor only a 0600
  Unix socket guards it.
- Model services (:class:`~kiln.backends.capabilities.ServiceDeployer`): a service is a Deployment behind a
  ClusterIP Service (+ an HPA), not jobs; a canary or a shadow is a second (third) Deployment and Service of that
  model version (``kiln-<service id>-canary``, ``-shadow``) behind Kiln's router, which splits between them;
  :class:`~kiln.backends.kubernetes.service_objects.ServiceObjects` applies, reads and deletes them.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Self

# At import, not first use: a machine without a working client cannot load this backend, and the registry says so.
from kubernetes import client

from kiln.backends.base import AttemptStatus, Backend, BackendDeps, Inventory, Launch, Phase
from kiln.backends.capabilities import (
    BackgroundWork,
    DeployTrack,
    NotebookAddress,
    NotebookHost,
    Preemptible,
    ServiceAddress,
    ServiceDeployer,
    SpecValidator,
    Work,
    WorkSet,
)
from kiln.backends.kubernetes.gang import new_ssh_keypair
from kiln.backends.kubernetes.informers import INFORM_BACKOFF, KINDS, Informers
from kiln.backends.kubernetes.inputs import KubeConfig, RenderInput, resolve_image
from kiln.backends.kubernetes.kubeapi import KubeObjects
from kiln.backends.kubernetes.names import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_ROLE,
    cleanup_selector,
    label_value,
)
from kiln.backends.kubernetes.notebooks import notebook_of, read_notebook_address, render_notebook
from kiln.backends.kubernetes.podlogs import RETRY_SECONDS, TERMINAL, PodLogs
from kiln.backends.kubernetes.render import GPU_RESOURCE, render
from kiln.backends.kubernetes.service_objects import ServiceObjects
from kiln.backends.kubernetes.settings import api_client, job_network, kube_config
from kiln.backends.kubernetes.status import status_from
from kiln.domain.catalog import DEFAULT_CATALOG, Catalog
from kiln.domain.serving import ServiceSpec
from kiln.domain.spec import JobSpec
from kiln.errors import BackendError, InvalidInput
from kiln.storage.logs import LogStore

log = logging.getLogger(__name__)


Obj = dict[str, Any]
Key = tuple[str, str]  # (kiln.io/job label value, attempt)


def _key(job_id: str, attempt: int | str) -> Key:
    return label_value(job_id), str(attempt)


def _key_of(obj: Obj) -> Key | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if LABEL_JOB not in labels or LABEL_ATTEMPT not in labels:
        return None
    return labels[LABEL_JOB], labels[LABEL_ATTEMPT]


def _parse_quantity(value: Any) -> float:
    from kubernetes.utils import parse_quantity

    try:
        return float(parse_quantity(str(value)))
    except (ValueError, TypeError, ArithmeticError):
        return 0.0


@dataclass
class _Attempt:
    job_id: str
    attempt: int
    stopping: tuple[str, str] | None = None  # (reason, message) once we deleted its Jobs
    final: AttemptStatus | None = None
    ended: bool = False  # its Jobs were deleted because the attempt ended (the rest of a gang)
    notebook: NotebookAddress | None = None  # where its notebook answers, once read from the cluster


class KubernetesBackend(Backend, SpecValidator, Preemptible, ServiceDeployer, NotebookHost, BackgroundWork):
    """Not :class:`~kiln.backends.capabilities.ExtractsMetrics` (no shim in a pod: the server extracts metrics
    from the logs it streams in), nor an output or checkpoint collector (the pods' sidecars upload them)."""

    name = "kubernetes"

    @classmethod
    def from_settings(cls, deps: BackendDeps) -> Self:
        settings = deps.settings
        kube = settings.kubernetes
        return cls(
            api_client(kube),
            kube_config(kube, checkpoint_sync_seconds=settings.checkpoint_sync_seconds, **job_network(settings)),
            endpoint=settings.endpoint,
            logs=deps.logs,
            state_dir=settings.home / "kubernetes",
            image_pull_grace=kube.image_pull_grace,
            wake=deps.wake,
            catalog=deps.catalog,
        )

    def __init__(
        self,
        api_client: Any,
        config: KubeConfig,
        *,
        endpoint: str,
        logs: LogStore | None = None,
        state_dir: Path | None = None,
        image_pull_grace: float = 60.0,
        watch_timeout: int = 300,
        node_refresh: float = 30.0,
        wake: Callable[[str | None], None] | None = None,
        fallback_nodes: list[Inventory] | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.cfg = config
        self.namespace = config.namespace
        self._kube = KubeObjects(self.core, self.batch, self.custom, self.namespace, self.networking)
        self.catalog = catalog  # the server's (the built-in one and the operator's file): where images come from
        self._services = ServiceObjects(api_client, self._kube, config, catalog, endpoint or "http://kiln:8080")
        self.endpoint = endpoint
        self.logs = logs
        self.image_pull_grace = image_pull_grace
        self.watch_timeout = watch_timeout
        self.node_refresh = node_refresh
        self._wake = wake
        self.fallback_nodes = list(fallback_nodes or [])  # when nodes cannot be listed (no ClusterRole)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._objects: dict[str, dict[str, Obj]] = {"Pod": {}, "Job": {}}  # kind → name → object
        self._attempts: dict[Key, _Attempt] = {}
        self._deleted: dict[Key, dict[str, Obj]] = {}  # pods deleted while they ran (not by us), per attempt
        self._nodes: list[Inventory] = []
        self._nodes_at = 0.0
        self._responses: set[Any] = set()  # open streams, shut down by close()
        self._pod_logs = PodLogs(self.core, self.namespace, logs, state_dir, self._stop, self._responses, self._pod)
        self._informers = Informers(
            {"Pod": self.core.list_namespaced_pod, "Job": self.batch.list_namespaced_job},
            self.namespace,
            apply=self._apply,
            known=self._known,
            stop=self._stop,
            responses=self._responses,
            watch_timeout=watch_timeout,
        )

    def background_work(self) -> list[Work | WorkSet]:
        """The informers of pods and Jobs (``k8s-pods``, ``k8s-jobs``), each one list or watch request a step, and
        the pods' log streams (``k8s-pod-logs``), one key per pod whose log is followed, a step following it."""
        informers: list[Work | WorkSet] = [
            Work(
                f"k8s-{kind.lower()}s",
                partial(self._informers.inform_once, kind),
                INFORM_BACKOFF,
                interrupt=self._interrupt,
            )
            for kind in KINDS
        ]
        logs = self._pod_logs
        streams = WorkSet(
            "k8s-pod-logs", logs.following, logs.step, RETRY_SECONDS, wake=logs.wake, interrupt=self._interrupt
        )
        return [*informers, streams]

    # -- the informers' objects ---------------------------------------------------------------------------

    def _known(self, kind: str) -> list[Obj]:
        with self._lock:
            return list(self._objects[kind].values())

    def _apply(self, kind: str, event: str, obj: Obj) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        key = _key_of(obj)
        with self._lock:
            if event == "DELETED":
                self._objects[kind].pop(name, None)
                attempt = self._attempts.get(key) if key else None
                running = (obj.get("status") or {}).get("phase") not in TERMINAL
                ours = attempt is not None and (attempt.stopping or attempt.ended)
                if kind == "Pod" and key is not None and running and not ours:
                    # Kept for attempts not polled yet too (a restarted controller): their loss is seen later.
                    self._deleted.setdefault(key, {})[name] = obj
            else:
                self._objects[kind][name] = obj
            attempt = self._attempts.get(key) if key else None
        if attempt is not None:
            if kind == "Pod" and event != "DELETED":
                self._pod_logs.follow(attempt.job_id, obj)
            if self._wake is not None:
                self._wake(attempt.job_id)

    def _cached(self, key: Key) -> tuple[list[Obj], list[Obj]]:
        with self._lock:
            jobs = [o for o in self._objects["Job"].values() if _key_of(o) == key]
            pods = [o for o in self._objects["Pod"].values() if _key_of(o) == key]
        return jobs, pods

    def _pod(self, name: str) -> Obj | None:
        with self._lock:
            return self._objects["Pod"].get(name)

    def _track(self, job_id: str, attempt: int) -> _Attempt:
        key = _key(job_id, attempt)
        with self._lock:
            tracked = self._attempts.get(key)
            if tracked is None:
                tracked = self._attempts[key] = _Attempt(job_id, attempt)
        return tracked

    # -- contract -------------------------------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> None:
        if spec.runtime.python:
            raise InvalidInput(
                f"runtime.python ({spec.runtime.python}) names an interpreter on the host, which does not exist on "
                "Kubernetes: give runtime.image (your own image) or runtime.framework (a catalog image)",
                details={"field": "spec.runtime.python"},
            )
        for index, item in enumerate(spec.inputs):
            if item.job is not None:
                raise InvalidInput(
                    f"inputs[{index}].job: another job's outputs are inputs on the local executor only for now (a "
                    "pod's init container fetches datasets and models, not job outputs); register them as a dataset "
                    "or a model version and read that",
                    details={"field": f"spec.inputs[{index}].job"},
                )
            if item.mode == "mount":
                raise InvalidInput(
                    f"inputs[{index}].mode: mount is not available on the Kubernetes backend: an init container "
                    "copies each input into the pod (mounting would need a FUSE or CSI driver on every node); use "
                    "mode: stage",
                    details={"field": f"spec.inputs[{index}].mode"},
                )
        if spec.network == "host" and not self.cfg.network_host_orgs:
            raise InvalidInput(
                "network: host (the node's own network: hostNetwork pods, outside every NetworkPolicy) is not "
                "allowed on this server; the operator allows it per organisation with KILN_NETWORK_HOST_ORGS. Use "
                "network: isolated (the outside world under the operator's egress rules) or none",
                details={"field": "spec.network"},
            )
        notebook = notebook_of(spec)
        if notebook is not None:  # raises InvalidInput
            render_notebook(
                notebook, spec, "validate", "validate", 1, self.cfg, token="x", notebook_token="x", catalog=self.catalog
            )
        else:
            image = resolve_image(spec, self.catalog or DEFAULT_CATALOG)
            render(RenderInput("validate", "validate", 1, spec, image=image, token="x"), self.cfg)

    def handle_for(self, job_id: str, attempt: int) -> dict[str, Any]:
        return {"job_id": job_id, "attempt": attempt, "namespace": self.namespace}

    def start(self, launch: Launch) -> dict[str, Any]:
        handle = self.handle_for(launch.job_id, launch.attempt)
        self._track(launch.job_id, launch.attempt)
        spec = launch.spec
        private = public = None
        if spec.distributed is not None and spec.distributed.framework == "mpi":
            private, public = new_ssh_keypair()  # used only if the Secret does not exist yet
        code_sha = launch.code_key.rsplit("/", 1)[-1].split(".", 1)[0] if launch.code_key else None
        endpoint = self.endpoint or launch.api_endpoint or "http://kiln:8080"
        notebook = notebook_of(spec)
        if notebook is not None:  # its token is this start's (a Secret that exists already keeps its own)
            objects = render_notebook(
                notebook,
                spec,
                launch.job_id,
                launch.org_id,
                launch.attempt,
                self.cfg,
                endpoint=endpoint,
                token=launch.job_token,
                notebook_token=secrets.token_urlsafe(32),
                catalog=self.catalog,
            )
        else:
            objects = render(
                RenderInput(
                    job_id=launch.job_id,
                    org_id=launch.org_id,
                    attempt=launch.attempt,
                    spec=spec,
                    image=resolve_image(spec, self.catalog or DEFAULT_CATALOG),
                    code_sha256=code_sha,
                    endpoint=endpoint,
                    token=launch.job_token,
                    ssh_private_key=private,
                    ssh_public_key=public,
                ),
                self.cfg,
            )
        jobs = [o for o in objects if o["kind"] == "Job"]
        others = [o for o in objects if o["kind"] != "Job"]
        for obj in others:
            self._kube.create(obj)
        main = self._kube.create(jobs[0])
        meta = main["metadata"]
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"], "controller": True}
        for obj in others:
            self._kube.patch(obj, {"metadata": {"ownerReferences": [owner]}})
        for obj in jobs[1:]:
            obj["metadata"]["ownerReferences"] = [owner]
            self._kube.create(obj)
        with self._lock:  # seen at once, before the watch delivers it: a poll never finds it missing
            self._objects["Job"].setdefault(str(meta["name"]), main)
        return handle

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        attempt = self._track(handle["job_id"], int(handle["attempt"]))
        if attempt.final is not None:
            return attempt.final
        if not self._informers.wait_synced(10):
            return AttemptStatus(
                Phase.STARTING, message="the controller has not listed the cluster's pods and Jobs yet"
            )
        key = _key(attempt.job_id, attempt.attempt)
        jobs, pods = self._cached(key)
        for pod in pods:
            self._pod_logs.follow(attempt.job_id, pod)
        main = next((j for j in jobs if (j["metadata"].get("labels") or {}).get(LABEL_ROLE) == "worker"), None)
        others = [j for j in jobs if j is not main]
        with self._lock:
            deleted = list(self._deleted.get(key, {}).values())
        status = status_from(main, pods, others=others, deleted=deleted, image_pull_grace=self.image_pull_grace)
        if main is None and not pods and not deleted:
            if attempt.stopping:
                reason, message = attempt.stopping
                status = AttemptStatus(Phase.EXITED, None, reason, message, finished_at=datetime.now(UTC))
            else:  # a start a crash cut short, or a Job deleted behind Kiln's back: created again if still wanted
                message = f"the Kubernetes Job of attempt {attempt.attempt} does not exist (never created, or deleted)"
                return AttemptStatus(Phase.UNLAUNCHED, None, "JobMissing", message)
        if status.phase in (Phase.EXITED, Phase.LOST):
            if attempt.stopping and status.reason != "Completed":
                reason, message = attempt.stopping
                status = AttemptStatus(
                    status.phase, status.exit_code, reason, message, status.running_at, status.finished_at
                )
            if (
                not attempt.stopping
                and not attempt.ended
                and any((p.get("status") or {}).get("phase") not in TERMINAL for p in pods)
            ):
                attempt.ended = True  # the rest of the gang (other workers, parameter servers) stops now
                try:
                    self._delete_jobs(attempt)
                except BackendError as exc:
                    attempt.ended = False  # the next poll tries again
                    log.warning(
                        "job %s: stopping the rest of attempt %d failed: %s", attempt.job_id, attempt.attempt, exc
                    )
                    return status
            attempt.final = status
        return status

    def _delete_jobs(self, attempt: _Attempt) -> None:
        self._kube.delete_matching("Job", cleanup_selector(attempt.job_id, attempt.attempt), "Foreground")

    def cancel(self, handle: dict[str, Any], grace_seconds: float) -> None:
        """Delete the attempt's Jobs (Foreground: the pods go first, each with SIGTERM and its
        ``terminationGracePeriodSeconds``). Idempotent: deleting what is gone deletes nothing."""
        attempt = self._track(handle["job_id"], int(handle["attempt"]))
        if attempt.stopping is None:
            attempt.stopping = ("Cancelled", "cancelled: its Kubernetes Jobs were deleted")
        self._delete_jobs(attempt)

    def preempt(self, handle: dict[str, Any], reason: str, grace_seconds: float) -> None:
        """As :meth:`cancel`: no notice file on Kubernetes (it would need ``exec`` into the pods); the job gets
        SIGTERM and the pods' ``terminationGracePeriodSeconds`` to checkpoint."""
        attempt = self._track(handle["job_id"], int(handle["attempt"]))
        if attempt.stopping is None:
            attempt.stopping = ("Preempted", reason)
        self._delete_jobs(attempt)

    def cleanup(self, handle: dict[str, Any]) -> None:
        """Delete every object of the attempt (by its labels), whatever owns it."""
        attempt = self._track(handle["job_id"], int(handle["attempt"]))
        attempt.ended = True
        selector = cleanup_selector(attempt.job_id, attempt.attempt)
        for kind in ("Job", "Pod", "Service", "NetworkPolicy", "ConfigMap", "Secret"):
            self._kube.delete_matching(kind, selector, "Background" if kind == "Job" else None)

    # -- notebooks -------------------------------------------------------------------------------------------

    def notebook_address(self, job_id: str, handle: dict[str, Any] | None) -> NotebookAddress | None:
        """Read once per attempt (then kept: neither the Service's IP nor the token changes while it lives)."""
        if not handle:
            return None
        attempt = self._track(job_id, int(handle["attempt"]))
        if attempt.notebook is None:
            attempt.notebook = read_notebook_address(self._kube, job_id, attempt.attempt)
        return attempt.notebook

    # -- model services -------------------------------------------------------------------------------------------

    def apply_service(
        self,
        service_id: str,
        org_id: str,
        spec: ServiceSpec,
        model: tuple[str, int],
        revision: int,
        code_sha256: str | None,
        track: DeployTrack = "stable",
    ) -> ServiceAddress:
        return self._services.apply(service_id, org_id, spec, model, revision, code_sha256, track)

    def service_ready(self, service_id: str, track: DeployTrack = "stable") -> int:
        return self._services.ready(service_id, track)

    def delete_service(self, service_id: str, track: DeployTrack | None = None) -> None:
        self._services.delete(service_id, track)

    # -- nodes ----------------------------------------------------------------------------------------------

    def nodes(self) -> list[Inventory]:
        if self._nodes and time.monotonic() - self._nodes_at < self.node_refresh:
            return list(self._nodes)
        try:
            listed = self._kube.call("list nodes", self.core.list_node)
        except Exception as exc:
            log.warning("listing nodes failed (the server needs a ClusterRole to list nodes): %s", exc)
            return list(self._nodes or self.fallback_nodes)
        found = []
        for node in listed.get("items") or []:
            meta, status = node.get("metadata") or {}, node.get("status") or {}
            if (node.get("spec") or {}).get("unschedulable"):
                continue
            ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
            if ready is not None and ready.get("status") != "True":
                continue
            alloc = status.get("allocatable") or {}
            labels = dict(meta.get("labels") or {})
            gpus = int(_parse_quantity(alloc.get(GPU_RESOURCE, 0)))
            product = labels.get(self.cfg.gpu_type_label)
            found.append(
                Inventory(
                    cpus=_parse_quantity(alloc.get("cpu", 0)),
                    memory=int(_parse_quantity(alloc.get("memory", 0))),
                    gpus=tuple(range(gpus)),
                    gpu_names={i: product for i in range(gpus)} if product else {},
                    name=str(meta.get("name")),
                    labels=labels,
                )
            )
        self._nodes, self._nodes_at = found or self.fallback_nodes, time.monotonic()
        return list(self._nodes)

    def inventory(self) -> Inventory:
        nodes = self.nodes()
        return nodes[0] if nodes else Inventory(cpus=0.0, memory=0, name="kubernetes")

    def close(self) -> None:
        self._pod_logs.close()
        self._interrupt()

    def _interrupt(self) -> None:
        """The server stops: the informers' watches and the pods' log streams end now (a step blocked in one
        returns)."""
        self._stop.set()
        for resp in list(self._responses):
            try:
                shutdown = getattr(resp, "shutdown", None)
                if shutdown is not None:
                    shutdown()
            except Exception:
                pass
