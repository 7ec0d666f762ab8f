"""A FAKE Kubernetes API server for tests: HTTP on 127.0.0.1, served by a thread, just what Kiln's controller
calls through the official ``kubernetes`` client. It is not Kubernetes and checks little: no schema validation,
no admission, no RBAC, no scheduler or kubelet. What it does implement:

- create / get / list / delete (one, or a collection by label selector) / patch (JSON merge patch) / replace
  (``PUT``, ``409 Conflict`` on a stale ``resourceVersion``) of namespaced secrets, configmaps, services, pods,
  ``batch/v1`` jobs, ``apps/v1`` deployments, ``autoscaling/v2`` horizontalpodautoscalers and
  ``networking.k8s.io/v1`` networkpolicies (stored only: nothing enforces them), and a list of nodes;
  a Secret's ``stringData`` is stored base64-encoded in ``data``, as the API server does; a ClusterIP Service
  gets a ``clusterIP`` from :attr:`FakeKubeAPI.cluster_ips` (a test's loopback address, where it plays the pod),
  else ``10.96.0.N``;
- a Deployment's ``metadata.generation`` (1 at create, +1 whenever its ``spec`` changes) and a status that only a
  test hook sets (:meth:`FakeKubeAPI.set_deployment_ready`): no pods are made for it, no rollout happens;
- ``409 AlreadyExists`` on a duplicate create, ``404 NotFound`` on a missing object;
- a global ``resourceVersion`` counter; WATCH (``?watch=true&resourceVersion=N``) as a chunked stream of JSON
  lines ``{"type": "ADDED|MODIFIED|DELETED", "object": ...}``, and an ``ERROR`` event with a 410 ``Expired``
  status when the requested version is older than the retained window (or after :meth:`FakeKubeAPI.expire_watches`);
- a tiny "job controller": creating a Job creates ``parallelism`` pods (indexed: ``JOB_COMPLETION_INDEX`` and
  the completion-index label/annotation) that stay ``Pending`` until a test hook moves them; a failed pod fails
  the Job (``backoffLimit: 0``), all pods succeeded (or the successPolicy index) completes it; deleting a Job
  deletes its pods (any propagation policy) — or, with :attr:`FakeKubeAPI.graceful_pods`, marks it and its
  pods still running with a ``deletionTimestamp`` and keeps them (a pod's grace period: its container is told
  to stop and exits in its own time) until :meth:`FakeKubeAPI.finish_deletions`;
- pod logs (``/log``, ``follow``, ``timestamps``, ``sinceTime``), appended by a test hook;
- test hooks to drive pods: running, succeeded, failed (exit code, OOMKilled), evicted, image pull back-off,
  unschedulable, phase Unknown, deleted.
"""

from __future__ import annotations

import base64
import builtins
import copy
import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Obj = dict[str, Any]
KINDS = {  # URL plural → kind
    "secrets": "Secret",
    "configmaps": "ConfigMap",
    "services": "Service",
    "pods": "Pod",
    "jobs": "Job",
    "nodes": "Node",
    "deployments": "Deployment",
    "horizontalpodautoscalers": "HorizontalPodAutoscaler",
    "networkpolicies": "NetworkPolicy",
}
INDEX_KEY = "batch.kubernetes.io/job-completion-index"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def nano_iso() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e9):09d}Z"


def _selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for part in selector.split(","):
        part = part.strip()
        if not part:
            continue
        if "!=" in part:
            key, value = part.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in part:
            key, value = part.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif part.startswith("!"):
            if part[1:] in labels:
                return False
        elif part not in labels:
            return False
    return True


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _written(kind: str, body: Obj) -> Obj:
    """What the API server stores of a written object: a Secret's ``stringData`` goes into ``data``, base64."""
    obj = copy.deepcopy(body)
    if kind == "Secret" and "stringData" in obj:
        data = obj.setdefault("data", {})
        for key, value in obj.pop("stringData").items():
            data[key] = base64.b64encode(str(value).encode()).decode()
    return obj


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


class FakeKubeAPI:
    """The fake's state and its test hooks; :meth:`start` serves it. Use as a context manager."""

    def __init__(self, retained_events: int = 1000) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}  # (kind, namespace, name) → object
        self.events: list[tuple[int, str, str, Obj]] = []  # (rv, type, kind, object snapshot)
        self.retained_events = retained_events
        self.rv = 100
        self.logs: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (ns, pod) → [(timestamp, line)]
        self.cond = threading.Condition()
        self.expire_next_watch = 0  # watches still to answer with 410
        self.requests: list[tuple[str, str]] = []  # (method, path?query) of every request, for assertions
        self.cluster_ips: list[str] = []  # the next Services' clusterIPs, in order of creation
        self.graceful_pods = False  # a deleted Job's running pods stay, terminating, until finish_deletions()
        self._next_ip = 1
        self.closed = False
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- serving --------------------------------------------------------------------------------------

    def start(self) -> FakeKubeAPI:
        fake = self

        class Handler(_Handler):
            api = fake

        server = _Server(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-kube-api", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeKubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api_client(self) -> Any:
        """An official ``kubernetes.client.ApiClient`` pointed at this fake."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        return client.ApiClient(config)

    # -- state (call with self.cond held) -------------------------------------------------------------

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, kind: str, kind_event: str, obj: Obj) -> None:
        self.events.append((self.rv, kind_event, kind, copy.deepcopy(obj)))
        if len(self.events) > self.retained_events:
            del self.events[: len(self.events) - self.retained_events]
        self.cond.notify_all()

    def _store(self, kind: str, obj: Obj, event: str) -> Obj:
        obj["metadata"]["resourceVersion"] = self._next_rv()
        meta = obj["metadata"]
        self.objects[(kind, meta.get("namespace", ""), meta["name"])] = obj
        self._emit(kind, event, obj)
        return obj

    def create(self, kind: str, namespace: str, body: Obj) -> Obj:
        with self.cond:
            meta = body.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            name = meta.get("name")
            if not name:
                raise ApiError(422, "Invalid", "metadata.name: Required value")
            if (kind, namespace, name) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists')
            obj = _written(kind, body)
            meta = obj["metadata"]
            meta["namespace"] = namespace
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_iso()
            obj.setdefault("kind", kind)
            if kind == "Deployment":
                meta["generation"] = 1
                obj["status"] = {}
            spec = obj.get("spec") or {}
            if kind == "Service" and spec.get("type", "ClusterIP") == "ClusterIP" and not spec.get("clusterIP"):
                if self.cluster_ips:
                    spec["clusterIP"] = self.cluster_ips.pop(0)
                else:
                    spec["clusterIP"] = f"10.96.0.{self._next_ip}"
                    self._next_ip += 1
            obj = self._store(kind, obj, "ADDED")
            if kind == "Job":
                obj.setdefault("status", {})
                if not (obj.get("spec") or {}).get("suspend"):
                    self._start_job_pods(obj)
            return copy.deepcopy(obj)

    def _start_job_pods(self, job: Obj) -> None:
        spec = job.get("spec") or {}
        meta = job["metadata"]
        template = spec.get("template") or {}
        indexed = spec.get("completionMode") == "Indexed"
        for index in range(int(spec.get("parallelism", 1))):
            labels = {
                **((template.get("metadata") or {}).get("labels") or {}),
                "job-name": meta["name"],
                "batch.kubernetes.io/job-name": meta["name"],
                "controller-uid": meta["uid"],
            }
            annotations = dict((template.get("metadata") or {}).get("annotations") or {})
            pod_spec = copy.deepcopy(template.get("spec") or {})
            if indexed:
                labels[INDEX_KEY] = str(index)
                annotations[INDEX_KEY] = str(index)
                for container in pod_spec.get("containers") or []:
                    container.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
            name = (
                f"{meta['name']}-{index}-{uuid.uuid4().hex[:5]}"
                if indexed
                else f"{meta['name']}-{uuid.uuid4().hex[:5]}"
            )
            pod: Obj = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": meta["namespace"],
                    "uid": str(uuid.uuid4()),
                    "creationTimestamp": now_iso(),
                    "labels": labels,
                    "annotations": annotations,
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "Job",
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": pod_spec,
                "status": {"phase": "Pending"},
            }
            self._store("Pod", pod, "ADDED")
        job["status"] = {"active": int(spec.get("parallelism", 1)), "startTime": now_iso()}
        self._store("Job", job, "MODIFIED")

    def get(self, kind: str, namespace: str, name: str) -> Obj:
        with self.cond:
            obj = self.objects.get((kind, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            return copy.deepcopy(obj)

    def list(self, kind: str, namespace: str | None, selector: str | None = None) -> Obj:
        with self.cond:
            items = [
                copy.deepcopy(obj)
                for (k, ns, _), obj in sorted(self.objects.items())
                if k == kind
                and (namespace is None or ns == namespace)
                and _selector_matches(selector, obj["metadata"].get("labels") or {})
            ]
            return {
                "kind": f"{kind}List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }

    def delete(self, kind: str, namespace: str, name: str) -> Obj:
        with self.cond:
            obj = self.objects.get((kind, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            if kind == "Job" and self.graceful_pods:
                running = [
                    pod
                    for (k, ns, _), pod in self.objects.items()
                    if k == "Pod"
                    and ns == namespace
                    and any(
                        o.get("uid") == obj["metadata"]["uid"] for o in pod["metadata"].get("ownerReferences") or []
                    )
                    and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                ]
                if running:
                    for terminating in [obj, *running]:
                        terminating["metadata"].setdefault("deletionTimestamp", now_iso())
                        terminating["metadata"]["resourceVersion"] = self._next_rv()
                        self._emit(terminating["kind"], "MODIFIED", terminating)
                    return copy.deepcopy(obj)
            self.objects.pop((kind, namespace, name))
            if kind == "Job":
                for (k, ns, pod_name), pod in list(self.objects.items()):
                    owners = pod["metadata"].get("ownerReferences") or []
                    if k == "Pod" and ns == namespace and any(o.get("uid") == obj["metadata"]["uid"] for o in owners):
                        self._delete_locked("Pod", ns, pod_name)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit(kind, "DELETED", obj)
            return copy.deepcopy(obj)

    def _delete_locked(self, kind: str, namespace: str, name: str) -> None:
        obj = self.objects.pop((kind, namespace, name), None)
        if obj is not None:
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit(kind, "DELETED", obj)

    def finish_deletions(self, namespace: str = "kiln") -> None:
        """The terminating pods' containers have exited: they, and the Jobs being deleted, are gone now."""
        with self.cond:
            for (kind, ns, name), obj in list(self.objects.items()):
                if kind in ("Pod", "Job") and ns == namespace and obj["metadata"].get("deletionTimestamp"):
                    self._delete_locked(kind, ns, name)
            self.cond.notify_all()

    def delete_collection(self, kind: str, namespace: str, selector: str | None) -> Obj:
        listed = self.list(kind, namespace, selector)
        for item in listed["items"]:
            try:
                self.delete(kind, namespace, item["metadata"]["name"])
            except ApiError:
                pass
        return listed

    def replace(self, kind: str, namespace: str, name: str, body: Obj) -> Obj:
        """PUT: the object becomes ``body`` (its uid, creation time and status kept; a Deployment's generation
        grows when its spec changed); ``409 Conflict`` if ``body`` names a resourceVersion that is not the
        current one."""
        with self.cond:
            obj = self.objects.get((kind, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            version = (body.get("metadata") or {}).get("resourceVersion")
            if version and version != obj["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'the object has been modified; {kind.lower()}s "{name}"')
            new = _written(kind, body)
            meta = new.setdefault("metadata", {})
            for key in ("uid", "creationTimestamp", "generation"):
                if key in obj["metadata"]:
                    meta[key] = obj["metadata"][key]
            meta["namespace"], meta["name"] = namespace, name
            new.setdefault("kind", kind)
            if "status" in obj:
                new["status"] = obj["status"]
            if kind == "Deployment" and new.get("spec") != obj.get("spec"):
                meta["generation"] = int(obj["metadata"].get("generation", 1)) + 1
            return copy.deepcopy(self._store(kind, new, "MODIFIED"))

    def patch(self, kind: str, namespace: str, name: str, body: Any) -> Obj:
        with self.cond:
            obj = self.objects.get((kind, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            if not isinstance(body, dict):
                raise ApiError(415, "UnsupportedMediaType", "the fake supports merge patches only")
            merged = _merge(obj, body)
            merged["metadata"]["uid"] = obj["metadata"]["uid"]
            if kind == "Deployment" and merged.get("spec") != obj.get("spec"):
                merged["metadata"]["generation"] = int(obj["metadata"].get("generation", 1)) + 1
            return copy.deepcopy(self._store(kind, merged, "MODIFIED"))

    # -- test hooks ---------------------------------------------------------------------------------

    def add_node(
        self, name: str, cpu: str = "8", memory: str = "32Gi", gpus: int = 0, labels: dict[str, str] | None = None
    ) -> None:
        allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
        if gpus:
            allocatable["nvidia.com/gpu"] = str(gpus)
        node: Obj = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
        }
        with self.cond:
            node["metadata"]["uid"] = str(uuid.uuid4())
            self._store("Node", node, "ADDED")

    def set_deployment_ready(self, name: str, ready: int, namespace: str = "kiln") -> None:
        """What a Deployment's controller reports once it has seen the current spec (``observedGeneration``):
        all of ``spec.replicas`` run the current pod template, ``ready`` of them ready."""
        with self.cond:
            deployment = self.objects[("Deployment", namespace, name)]
            replicas = int((deployment.get("spec") or {}).get("replicas", 1))
            deployment["status"] = {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": ready,
                "availableReplicas": ready,
            }
            self._store("Deployment", deployment, "MODIFIED")

    def pods(self, selector: str | None = None, namespace: str = "kiln") -> builtins.list[Obj]:
        return builtins.list(self.list("Pod", namespace, selector)["items"])

    def jobs(self, selector: str | None = None, namespace: str = "kiln") -> builtins.list[Obj]:
        return builtins.list(self.list("Job", namespace, selector)["items"])

    def pod(self, job_name: str, index: int = 0, namespace: str = "kiln") -> str:
        """The name of the pod of ``job_name`` at completion index ``index`` (0 for a non-indexed Job)."""
        for pod in self.pods(f"job-name={job_name}", namespace):
            if pod["metadata"]["labels"].get(INDEX_KEY, "0") == str(index):
                return str(pod["metadata"]["name"])
        raise KeyError(f"no pod {index} of job {job_name}")

    def _update_pod(self, name: str, change: Callable[[Obj], None], namespace: str = "kiln") -> None:
        with self.cond:
            pod = self.objects[("Pod", namespace, name)]
            change(pod)
            self._store("Pod", pod, "MODIFIED")
            self._job_controller(pod)

    def _job_controller(self, pod: Obj) -> None:
        owners = pod["metadata"].get("ownerReferences") or []
        if not owners:
            return
        ns = pod["metadata"]["namespace"]
        job = self.objects.get(("Job", ns, owners[0]["name"]))
        if job is None or any(c.get("status") == "True" for c in (job.get("status") or {}).get("conditions") or []):
            return
        pods = [
            p
            for (k, n, _), p in self.objects.items()
            if k == "Pod" and n == ns and p["metadata"]["labels"].get("controller-uid") == job["metadata"]["uid"]
        ]
        phases = [p["status"].get("phase") for p in pods]
        spec = job.get("spec") or {}
        status = job.setdefault("status", {})
        status["active"] = sum(1 for ph in phases if ph in ("Pending", "Running"))
        status["succeeded"] = phases.count("Succeeded")
        status["failed"] = phases.count("Failed")
        rules = (spec.get("successPolicy") or {}).get("rules") or []
        success_indexes = {r.get("succeededIndexes") for r in rules}
        index_done = any(
            p["status"].get("phase") == "Succeeded" and p["metadata"]["labels"].get(INDEX_KEY) in success_indexes
            for p in pods
        )
        if status["failed"] > int(spec.get("backoffLimit", 6)):
            status["conditions"] = [
                {
                    "type": "FailureTarget",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "lastTransitionTime": now_iso(),
                },
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                    "lastTransitionTime": now_iso(),
                },
            ]
        elif status["succeeded"] >= int(spec.get("completions", 1)) or index_done:
            kind = (
                [{"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now_iso()}]
                if index_done
                else []
            )
            status["conditions"] = [*kind, {"type": "Complete", "status": "True", "lastTransitionTime": now_iso()}]
            status["completionTime"] = now_iso()
        else:
            return
        self._store("Job", job, "MODIFIED")

    def set_running(self, name: str, namespace: str = "kiln") -> None:
        def change(pod: Obj) -> None:
            pod["spec"]["nodeName"] = pod["spec"].get("nodeName") or "node-1"
            pod["status"] = {
                "phase": "Running",
                "startTime": now_iso(),
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": "job",
                        "image": self._image(pod),
                        "ready": True,
                        "state": {"running": {"startedAt": now_iso()}},
                    }
                ],
            }

        self._update_pod(name, change, namespace)

    def set_terminated(
        self, name: str, exit_code: int, reason: str | None = None, message: str = "", namespace: str = "kiln"
    ) -> None:
        """Succeeded (exit 0) or Failed (anything else; ``reason`` e.g. ``OOMKilled``)."""

        def change(pod: Obj) -> None:
            status = pod.setdefault("status", {})
            started = (
                ((status.get("containerStatuses") or [{}])[0].get("state") or {}).get("running", {}).get("startedAt")
            )
            status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            terminated = {
                "exitCode": exit_code,
                "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                "startedAt": started or now_iso(),
                "finishedAt": now_iso(),
            }
            if message:
                terminated["message"] = message
            status["containerStatuses"] = [
                {"name": "job", "image": self._image(pod), "ready": False, "state": {"terminated": terminated}}
            ]

        self._update_pod(name, change, namespace)

    def evict(self, name: str, message: str = "The node was low on resource: memory.", namespace: str = "kiln") -> None:
        def change(pod: Obj) -> None:
            pod["status"] = {**pod.get("status", {}), "phase": "Failed", "reason": "Evicted", "message": message}
            pod["status"].pop("containerStatuses", None)

        self._update_pod(name, change, namespace)

    def image_pull_backoff(self, name: str, message: str = "", namespace: str = "kiln") -> None:
        def change(pod: Obj) -> None:
            image = self._image(pod)
            text = message or f'Back-off pulling image "{image}"'
            pod["spec"]["nodeName"] = "node-1"
            pod["status"] = {
                "phase": "Pending",
                "startTime": now_iso(),
                "containerStatuses": [
                    {
                        "name": "job",
                        "image": image,
                        "ready": False,
                        "state": {"waiting": {"reason": "ImagePullBackOff", "message": text}},
                    }
                ],
            }

        self._update_pod(name, change, namespace)

    def unschedulable(self, name: str, message: str, namespace: str = "kiln") -> None:
        def change(pod: Obj) -> None:
            pod["status"] = {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
                ],
            }

        self._update_pod(name, change, namespace)

    def set_unknown(self, name: str, namespace: str = "kiln") -> None:
        self._update_pod(name, lambda pod: pod["status"].update(phase="Unknown"), namespace)

    def delete_pod(self, name: str, namespace: str = "kiln") -> None:
        """As a lost node's pods go (or ``kubectl delete pod``): the fake's job controller does not replace it."""
        with self.cond:
            self._delete_locked("Pod", namespace, name)

    def append_log(self, name: str, *lines: str, namespace: str = "kiln") -> None:
        with self.cond:
            entries = self.logs.setdefault((namespace, name), [])
            for line in lines:
                entries.append((nano_iso(), line))
                time.sleep(0.000_01)  # distinct timestamps, as a real kubelet's nanoseconds are
            self.cond.notify_all()

    def expire_watches(self, count: int = 1) -> None:
        """The next ``count`` watches get ``410 Gone`` (the resourceVersion fell out of the server's window)."""
        with self.cond:
            self.expire_next_watch += count

    @staticmethod
    def _image(pod: Obj) -> str:
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        return str(containers[0].get("image", ""))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):  # a client that hung up is no error
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    api: FakeKubeAPI
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- plumbing ---------------------------------------------------------------------------------

    def _send_json(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def _route(self) -> tuple[str, str | None, str | None, str | None, dict[str, str]]:
        """(kind, namespace, name, subresource, query)."""
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        segs = [s for s in parts.path.split("/") if s]
        if segs[:1] == ["api"] and len(segs) >= 2:
            segs = segs[2:]
        elif segs[:1] == ["apis"] and len(segs) >= 3:
            segs = segs[3:]
        else:
            raise ApiError(404, "NotFound", f"the fake serves no {parts.path}")
        namespace = None
        if segs[:1] == ["namespaces"] and len(segs) >= 3:
            namespace, segs = segs[1], segs[2:]
        if not segs or segs[0] not in KINDS:
            raise ApiError(404, "NotFound", f"the fake serves no {parts.path}")
        kind = KINDS[segs[0]]
        name = segs[1] if len(segs) > 1 else None
        sub = segs[2] if len(segs) > 2 else None
        return kind, namespace, name, sub, query

    def _handle(self, method: str) -> None:
        self.api.requests.append((method, self.path))
        try:
            kind, ns, name, sub, query = self._route()
            if method == "GET" and sub == "log" and name:
                self._logs(ns or "", name, query)
            elif method == "GET" and query.get("watch") in ("true", "1") and name is None:
                self._watch(kind, ns, query)
            elif method == "GET" and name:
                self._send_json(200, self.api.get(kind, ns or "", name))
            elif method == "GET":
                self._send_json(200, self.api.list(kind, ns, query.get("labelSelector")))
            elif method == "POST" and name is None:
                self._send_json(201, self.api.create(kind, ns or "", self._body()))
            elif method == "DELETE" and name:
                self._body()
                self._send_json(200, self.api.delete(kind, ns or "", name))
            elif method == "DELETE":
                self._body()
                self._send_json(200, self.api.delete_collection(kind, ns or "", query.get("labelSelector")))
            elif method == "PATCH" and name:
                self._send_json(200, self.api.patch(kind, ns or "", name, self._body()))
            elif method == "PUT" and name:
                self._send_json(200, self.api.replace(kind, ns or "", name, self._body()))
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} {self.path}")
        except ApiError as exc:
            self._send_json(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_PUT(self) -> None:
        self._handle("PUT")

    # -- streams ------------------------------------------------------------------------------------

    def _start_chunked(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _watch(self, kind: str, ns: str | None, query: dict[str, str]) -> None:
        api = self.api
        selector = query.get("labelSelector")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        since = int(query.get("resourceVersion") or 0)
        self._start_chunked("application/json")
        with api.cond:
            oldest = api.events[0][0] if api.events else api.rv + 1
            gone = api.expire_next_watch > 0 or (since and since < oldest - 1 and since < api.rv)
            if api.expire_next_watch > 0:
                api.expire_next_watch -= 1
        if gone:
            status = ApiError(410, "Expired", f"too old resource version: {since} ({oldest - 1})").status()
            self._chunk(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
            self._end_chunks()
            return
        sent = since or api.rv
        while True:
            with api.cond:
                pending = [e for e in api.events if e[0] > sent and e[2] == kind]
                if not pending and not api.closed and time.monotonic() < deadline:
                    api.cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                    pending = [e for e in api.events if e[0] > sent and e[2] == kind]
                closed = api.closed
            for rv, event, _, obj in pending:
                sent = max(sent, rv)
                meta = obj.get("metadata") or {}
                if ns is not None and meta.get("namespace") != ns:
                    continue
                if not _selector_matches(selector, meta.get("labels") or {}):
                    continue
                self._chunk(json.dumps({"type": event, "object": obj}).encode() + b"\n")
            if closed or time.monotonic() >= deadline:
                self._end_chunks()
                return

    def _logs(self, ns: str, name: str, query: dict[str, str]) -> None:
        api = self.api
        pod = api.get("Pod", ns, name)
        if pod["status"].get("phase") == "Pending":
            raise ApiError(400, "BadRequest", f'container "job" in pod "{name}" is waiting to start: ContainerCreating')
        follow = query.get("follow") in ("true", "1")
        stamps = query.get("timestamps") in ("true", "1")
        since = query.get("sinceTime")
        since_key = since.replace("Z", "") if since else None
        if query.get("sinceSeconds"):
            cutoff = time.time() - int(query["sinceSeconds"])
            since_key = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(cutoff))
        self._start_chunked("text/plain")
        sent = 0
        while True:
            with api.cond:
                entries = api.logs.get((ns, name), [])
                batch = entries[sent:]
                if not batch and follow and not api.closed:
                    obj = api.objects.get(("Pod", ns, name))
                    if obj is not None and obj["status"].get("phase") in ("Running", "Pending"):
                        api.cond.wait(0.5)
                        continue
                    batch = api.logs.get((ns, name), [])[sent:]
                    finished = True
                else:
                    finished = not follow or api.closed
            sent += len(batch)
            # sinceTime is compared at second precision, as the kubelet's RFC 3339 parameter is.
            lines = [
                (f"{ts} " if stamps else "") + text + "\n"
                for ts, text in batch
                if since_key is None or ts[:19] >= since_key[:19]
            ]
            if lines:
                self._chunk("".join(lines).encode())
            if finished and not (api.logs.get((ns, name), [])[sent:]):
                self._end_chunks()
                return
