"""A model service's objects on the cluster: apply what :func:`~kiln.backends.kubernetes.serving.render_service`
renders, read how many replicas are ready, delete them. The Kubernetes backend's
:class:`~kiln.backends.capabilities.ServiceDeployer` is this class.

- **Apply** creates what does not exist and replaces (``PUT``, with the read ``resourceVersion``: a concurrent
  change is a retryable conflict, never overwritten) what does, in the renderer's order: Secret, ConfigMap,
  NetworkPolicy, Deployment, Service, HPA. A replace, not a merge patch: a field the new render drops (a GPU limit,
  a label, a node selector) must go. The ConfigMap is immutable and named by its content, so an existing one is the
  same and a changed spec or model version makes a new one, which rolls the Deployment; the old ones stay for the
  old pods until the service is deleted. Two fields are the cluster's, not the render's: an autoscaled Deployment's
  ``replicas`` (the HPA's choice, carried over from the live object) and a Service's ``clusterIP``.
- **The replica secret** is made once, on the first apply, and read back from the Secret on every later one: the
  router sends one secret for every revision, and old and new pods of a rolling update accept it alike.
- **The model-fetch token**: the init container reads the model version (and a custom predictor's code) through
  the API with the Secret's ``token``. Kiln mints tokens for job attempts only (``kjt.``: valid while that
  attempt runs) and a service on Kubernetes runs no job, so there is no token to mint here: the Secret keeps the
  renderer's placeholder, or whatever an operator put there instead (an apply never overwrites it).
- **Tracks**: a canary's (shadow's) objects are a track of their own (``serving.track_base``: a Deployment,
  ConfigMap, NetworkPolicy and Service named ``kiln-<service id>-canary``), applied after the stable track's and
  using its Secret (an apply of a canary before the Secret exists is a retryable error); deleting a track deletes
  the objects with its ``kiln.io/track`` label, deleting the service deletes every track.
- **Ownership**: once the Deployment exists, every other object carries it as owner (patched onto the Secret
  and ConfigMap made before it), so the cluster's garbage collector removes them with it; :meth:`delete` deletes
  every object with the service's labels anyway, whatever owns it.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Any

from kubernetes import client

from kiln.backends.capabilities import DeployTrack, ServiceAddress
from kiln.backends.kubernetes.inputs import KubeConfig
from kiln.backends.kubernetes.kubeapi import KubeObjects
from kiln.backends.kubernetes.render import TOKEN_PLACEHOLDER
from kiln.backends.kubernetes.serving import (
    SECRET_PLACEHOLDER,
    render_service,
    service_base,
    service_selector,
    service_url,
    track_base,
)
from kiln.domain.catalog import Catalog
from kiln.domain.serving import ServiceSpec
from kiln.errors import BackendError

Obj = dict[str, Any]
# Deletion: the pods go first, their NetworkPolicy after them.
ORDER = ("Deployment", "HorizontalPodAutoscaler", "Service", "NetworkPolicy", "ConfigMap", "Secret")


class ServiceObjects:
    """Create, replace, read and delete the objects of model services in one namespace."""

    def __init__(self, api_client: Any, kube: KubeObjects, cfg: KubeConfig, catalog: Catalog | None, endpoint: str):
        self._kube = kube
        self.cfg = cfg
        self.catalog = catalog
        self.endpoint = endpoint
        self.namespace = cfg.namespace
        self._apis: dict[str, tuple[Any, str]] = {
            "Secret": (kube.core, "secret"),
            "ConfigMap": (kube.core, "config_map"),
            "Service": (kube.core, "service"),
            "Deployment": (client.AppsV1Api(api_client), "deployment"),
            "HorizontalPodAutoscaler": (client.AutoscalingV2Api(api_client), "horizontal_pod_autoscaler"),
            "NetworkPolicy": (client.NetworkingV1Api(api_client), "network_policy"),
        }

    # -- one object ---------------------------------------------------------------------------------------------

    def _call(self, verb: str, kind: str, name: str, *args: Any, **kwargs: Any) -> Obj:
        """``{verb}_namespaced_{kind}`` of the official client, its failures as the backend's other calls'."""
        api, suffix = self._apis[kind]
        return self._kube.call(f"{verb} {kind} {name}", getattr(api, f"{verb}_namespaced_{suffix}"), *args, **kwargs)

    def read(self, kind: str, name: str) -> Obj | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call("read", kind, name, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise BackendError(f"read {kind} {name}: {exc.status} {exc.reason}", retryable=True) from exc

    def _write(self, obj: Obj, live: Obj | None) -> Obj:
        """Create ``obj``, or replace ``live`` with it."""
        from kubernetes.client.exceptions import ApiException

        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            if live is None:
                return self._call("create", kind, name, self.namespace, obj)
            obj["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
            return self._call("replace", kind, name, name, self.namespace, obj)
        except ApiException as exc:  # 409: created or changed meanwhile (another server): the next apply
            verb = "create" if live is None else "replace"
            raise BackendError(f"{verb} {kind} {name}: {exc.status} {exc.reason}", retryable=True) from exc

    # -- the capability -----------------------------------------------------------------------------------------

    def apply(
        self,
        service_id: str,
        org_id: str,
        spec: ServiceSpec,
        model: tuple[str, int],
        revision: int,
        code_sha256: str | None,
        track: DeployTrack = "stable",
    ) -> ServiceAddress:
        base = track_base(service_id, track)
        secret = self.read("Secret", service_base(service_id))
        replica_secret = _secret_value(secret, "replica-secret", SECRET_PLACEHOLDER)
        if replica_secret is None and track != "stable":
            raise BackendError(
                f"apply the {track} of service {service_id}: the stable track's Secret is not there yet",
                retryable=True,
            )
        replica_secret = replica_secret or secrets.token_urlsafe(32)
        token = _secret_value(secret, "token", TOKEN_PLACEHOLDER)  # an operator's, if one was put there
        deployment = self.read("Deployment", base)
        owner_uid = deployment["metadata"]["uid"] if deployment is not None else None
        objects = render_service(
            service_id,
            org_id,
            spec,
            model,
            self.cfg,
            self.catalog,
            self.endpoint,
            revision=revision,
            code_sha256=code_sha256,
            token=token,
            replica_secret=replica_secret,
            owner_uid=owner_uid,
            track=track,
        )
        unowned: list[Obj] = []  # written before the Deployment existed
        for obj in objects:
            kind, name = obj["kind"], obj["metadata"]["name"]
            if owner_uid is None and kind != "Deployment":
                unowned.append(obj)
            if kind == "ConfigMap":  # immutable and named by its content: one that exists is this one
                if self.read(kind, name) is None:
                    self._write(obj, None)
                continue
            live = secret if kind == "Secret" else deployment if kind == "Deployment" else self.read(kind, name)
            if live is not None and kind == "Deployment" and "replicas" not in obj["spec"]:
                obj["spec"]["replicas"] = (live.get("spec") or {}).get("replicas", 1)  # the HPA's choice
            if live is not None and kind == "Service":
                for key in ("clusterIP", "clusterIPs"):
                    if key in (live.get("spec") or {}):
                        obj["spec"][key] = live["spec"][key]
            written = self._write(obj, live)
            if kind == "Deployment" and owner_uid is None:
                owner_uid = written["metadata"]["uid"]
                owner = {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": name,
                    "uid": owner_uid,
                    "controller": True,
                }
                for earlier in unowned:
                    self._own(earlier, owner)
                unowned = []
                for later in objects[objects.index(obj) + 1 :]:
                    later["metadata"]["ownerReferences"] = [owner]
        if track == "stable" and spec.autoscale is None and self.read("HorizontalPodAutoscaler", base) is not None:
            self._delete("HorizontalPodAutoscaler", base)  # autoscale was turned off: the replicas are fixed now
        return ServiceAddress(service_url(service_id, self.cfg, track), replica_secret)

    def _own(self, obj: Obj, owner: Obj) -> None:
        from kubernetes.client.exceptions import ApiException

        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            self._call("patch", kind, name, name, self.namespace, {"metadata": {"ownerReferences": [owner]}})
        except ApiException as exc:
            raise BackendError(f"patch {kind} {name}: {exc.status} {exc.reason}", retryable=True) from exc

    def ready(self, service_id: str, track: DeployTrack = "stable") -> int:
        """Ready replicas that run the Deployment's current pod template, from its status: none until its
        controller has seen the current spec (``observedGeneration``); during a rolling update the replicas not
        updated yet are counted as the ready old ones (maxUnavailable 0 keeps them), so the rest are new."""
        deployment = self.read("Deployment", track_base(service_id, track))
        if deployment is None:
            return 0
        status = deployment.get("status") or {}
        if int(status.get("observedGeneration") or 0) < int(deployment["metadata"].get("generation") or 1):
            return 0
        old = int(status.get("replicas") or 0) - int(status.get("updatedReplicas") or 0)
        return max(0, int(status.get("readyReplicas") or 0) - max(0, old))

    def delete(self, service_id: str, track: DeployTrack | None = None) -> None:
        """Every object of the service (``track`` None), or of its canary's or shadow's track only."""
        selector = service_selector(service_id, track)
        from kubernetes.client.exceptions import ApiException

        for kind in ORDER:
            try:
                listed = self._call("list", kind, f"({selector})", self.namespace, label_selector=selector)
            except ApiException as exc:
                raise BackendError(f"list {kind}s: {exc.status} {exc.reason}", retryable=True) from exc
            for item in listed.get("items") or []:
                self._delete(kind, item["metadata"]["name"])

    def _delete(self, kind: str, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        extra = {"propagation_policy": "Background"} if kind == "Deployment" else {}
        try:
            self._call("delete", kind, name, name, self.namespace, **extra)
        except ApiException as exc:
            if exc.status != 404:  # what is gone counts as deleted
                raise BackendError(f"delete {kind} {name}: {exc.status} {exc.reason}", retryable=True) from exc


def _secret_value(secret: Obj | None, key: str, placeholder: str) -> str | None:
    """A Secret's value (``data`` is base64, as the API server returns it), or None if absent or the
    renderer's placeholder."""
    raw = ((secret or {}).get("data") or {}).get(key)
    if not raw:
        return None
    try:
        value = base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return value if value and value != placeholder else None
