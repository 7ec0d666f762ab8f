"""The Kubernetes API calls of the backend on Kiln's objects (Secrets, ConfigMaps, Services, NetworkPolicies,
Volcano PodGroups, Pods, Jobs), with the API's failures turned into :class:`BackendError` (retryable or not):
:class:`KubeObjects`.

Creating what exists (``409``) returns the existing object, so a restarted controller never makes a second one;
deleting what is gone (``404``) counts as deleted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kiln.errors import BackendError

Obj = dict[str, Any]


class KubeObjects:
    """Create, patch, list and delete the objects of one namespace through the official client's APIs."""

    def __init__(self, core: Any, batch: Any, custom: Any, namespace: str, networking: Any = None) -> None:
        self.core = core
        self.batch = batch
        self.custom = custom
        self.namespace = namespace
        self.networking = networking  # NetworkingV1Api: the attempts' NetworkPolicies

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = fn(*args, _preload_content=False, **kwargs)
            return json.loads(resp.data or b"{}")  # type: ignore[no-any-return]
        except ApiException as exc:
            if exc.status in (404, 409):
                raise
            retryable = exc.status is None or exc.status >= 500 or exc.status == 429
            detail = exc.reason or ""
            try:
                detail = json.loads(exc.body or "{}").get("message") or detail
            except (ValueError, AttributeError):
                pass
            raise BackendError(f"{what}: Kubernetes answered {exc.status}: {detail}", retryable=retryable) from exc
        except (OSError, ValueError) as exc:
            raise BackendError(f"{what}: {type(exc).__name__}: {exc}", retryable=True) from exc
        except Exception as exc:  # urllib3 errors (MaxRetryError, ProtocolError) are not OSErrors
            if type(exc).__module__.startswith("urllib3"):
                raise BackendError(f"{what}: {type(exc).__name__}: {exc}", retryable=True) from exc
            raise

    def create(self, obj: Obj) -> Obj:
        from kubernetes.client.exceptions import ApiException

        kind, name, ns = obj["kind"], obj["metadata"]["name"], self.namespace
        create_args: tuple[Any, ...]
        get_args: tuple[Any, ...]
        if kind == "PodGroup":
            group, version = obj["apiVersion"].split("/")
            create_fn, create_args = self.custom.create_namespaced_custom_object, (group, version, ns, "podgroups", obj)
            get_fn, get_args = self.custom.get_namespaced_custom_object, (group, version, ns, "podgroups", name)
        else:
            api, suffix = self.api(kind)
            create_fn, create_args = getattr(api, f"create_namespaced_{suffix}"), (ns, obj)
            get_fn, get_args = getattr(api, f"read_namespaced_{suffix}"), (name, ns)
        try:
            return self.call(f"create {kind} {name}", create_fn, *create_args)
        except ApiException as exc:
            if exc.status != 409:
                raise BackendError(f"create {kind} {name}: {exc.status} {exc.reason}", retryable=False) from exc
        try:
            return self.call(
                f"get {kind} {name}", get_fn, *get_args
            )  # created before (a restarted controller): the same object, never a second one
        except ApiException as exc:
            raise BackendError(f"get {kind} {name}: {exc.status} {exc.reason}", retryable=True) from exc

    def read(self, kind: str, name: str) -> Obj | None:
        """The object ``kind``/``name`` of the namespace, None when there is none."""
        from kubernetes.client.exceptions import ApiException

        api, suffix = self.api(kind)
        try:
            return self.call(f"read {kind} {name}", getattr(api, f"read_namespaced_{suffix}"), name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise BackendError(f"read {kind} {name}: {exc.status} {exc.reason}", retryable=True) from exc

    def patch(self, obj: Obj, body: Obj) -> None:
        from kubernetes.client.exceptions import ApiException

        kind, name, ns = obj["kind"], obj["metadata"]["name"], self.namespace
        try:
            if kind == "PodGroup":
                group, version = obj["apiVersion"].split("/")
                self.call(
                    f"patch {kind} {name}",
                    self.custom.patch_namespaced_custom_object,
                    group,
                    version,
                    ns,
                    "podgroups",
                    name,
                    body,
                )
            else:
                api, suffix = self.api(kind)
                self.call(f"patch {kind} {name}", getattr(api, f"patch_namespaced_{suffix}"), name, ns, body)
        except ApiException as exc:
            raise BackendError(f"patch {kind} {name}: {exc.status} {exc.reason}", retryable=True) from exc

    def api(self, kind: str) -> tuple[Any, str]:
        return {
            "Secret": (self.core, "secret"),
            "ConfigMap": (self.core, "config_map"),
            "Service": (self.core, "service"),
            "Pod": (self.core, "pod"),
            "Job": (self.batch, "job"),
            "NetworkPolicy": (self.networking, "network_policy"),
        }[kind]

    def delete_matching(self, kind: str, selector: str, propagation: str | None = None) -> int:
        """List the ``kind`` objects that ``selector`` matches and delete each by name (the Role grants
        ``list`` and ``delete``, not ``deletecollection``); what is already gone counts as deleted."""
        from kubernetes.client.exceptions import ApiException

        api, suffix = self.api(kind)
        listed = self.call(
            f"list {kind}s", getattr(api, f"list_namespaced_{suffix}"), self.namespace, label_selector=selector
        )
        extra = {"propagation_policy": propagation} if propagation else {}
        deleted = 0
        for item in listed.get("items") or []:
            name = item["metadata"]["name"]
            try:
                self.call(
                    f"delete {kind} {name}", getattr(api, f"delete_namespaced_{suffix}"), name, self.namespace, **extra
                )
                deleted += 1
            except ApiException as exc:
                if exc.status != 404:
                    raise BackendError(f"delete {kind} {name}: {exc.status} {exc.reason}", retryable=True) from exc
        return deleted
