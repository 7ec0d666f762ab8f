"""The Kubernetes render of a service's canary and shadow tracks (issue 48): each its own Deployment, ConfigMap,
NetworkPolicy and ClusterIP Service, named and labelled apart from the stable track's so that no selector of one
matches the pods of another, sharing the stable track's Secret, with fixed replicas and no HPA."""

from __future__ import annotations

from typing import Any

import pytest

from kiln.backends.kubernetes.inputs import KubeConfig
from kiln.backends.kubernetes.names import MANAGED_BY
from kiln.backends.kubernetes.serving import (
    LABEL_TRACK,
    render_service,
    service_base,
    service_selector,
    service_url,
    track_base,
)
from kiln.domain.serving import ServiceSpec
from kiln.errors import InvalidInput
from tests.unit.kubernetes.conftest import VERSIONS, validate_strict

SVC = "svc-01jd5y3c2k7q4m9x2a"
ORG = "org-01jd5y3c2k7q4m9x2b"
UID = "9f0b6c1e-3d1a-4a53-9d0e-1b2c3d4e5f60"


def _spec(**fields: Any) -> ServiceSpec:
    return ServiceSpec.model_validate(
        {"name": "digits", "model": "digits@3", "predictor": {"type": "sklearn"}, **fields}
    )


def _render(track: str, spec: ServiceSpec | None = None, **kwargs: Any) -> dict[str, dict[str, Any]]:
    objects = render_service(
        SVC,
        ORG,
        spec or _spec(replicas=2),
        kwargs.pop("model", ("digits", 4)),
        KubeConfig(),
        token="t",
        replica_secret="s3cret",
        track=track,
        **kwargs,
    )
    return {o["kind"]: o for o in objects}


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("track", ["canary", "shadow"])
def test_a_track_is_a_deployment_and_service_of_its_own_beside_the_stable_ones(track: str) -> None:
    autoscaled = _spec(autoscale={"min": 1, "max": 4}, labels={"team": "ml"})
    objects = _render(track, autoscaled.model_copy(update={"replicas": 3}), owner_uid=UID)
    assert sorted(objects) == ["ConfigMap", "Deployment", "NetworkPolicy", "Service"]  # no Secret, no HPA
    name = f"kiln-{SVC}-{track}"
    assert track_base(SVC, track) == name
    for kind in ("Deployment", "Service", "NetworkPolicy"):
        assert objects[kind]["metadata"]["name"] == name
    assert objects["ConfigMap"]["metadata"]["name"].startswith(name + "-")
    for obj in objects.values():
        assert obj["metadata"]["labels"][LABEL_TRACK] == track
        assert obj["metadata"]["labels"]["label.kiln.io/team"] == "ml"
        if obj["kind"] != "Deployment":
            assert obj["metadata"]["ownerReferences"][0]["name"] == name  # gone with its own Deployment
    deployment = objects["Deployment"]
    assert deployment["spec"]["replicas"] == 3  # fixed, even for an autoscaled service
    assert deployment["metadata"]["annotations"]["kiln.io/model"] == "digits@4"
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    refs = [
        e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})
    ]
    (init,) = pod["spec"]["initContainers"]
    refs += [e["valueFrom"]["secretKeyRef"]["name"] for e in init["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert refs and set(refs) == {service_base(SVC)}  # the stable track's Secret: one replica secret

    # Its pods are its own: neither the stable Deployment's nor the stable Service's selector matches them, and
    # its selectors match no stable pod.
    stable = _render("stable", autoscaled)
    stable_pod = stable["Deployment"]["spec"]["template"]["metadata"]["labels"]
    track_pod = pod["metadata"]["labels"]
    for selector in (stable["Deployment"]["spec"]["selector"]["matchLabels"], stable["Service"]["spec"]["selector"]):
        assert _matches(selector, stable_pod) and not _matches(selector, track_pod)
    for selector in (deployment["spec"]["selector"]["matchLabels"], objects["Service"]["spec"]["selector"]):
        assert _matches(selector, track_pod) and not _matches(selector, stable_pod)
    policy = objects["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"]
    assert _matches(policy, track_pod) and not _matches(policy, stable_pod)
    assert LABEL_TRACK not in stable_pod  # the stable track renders as before: no rollout of its pods


def test_a_canary_of_the_stable_version_has_a_configmap_of_its_own() -> None:
    """After a promote, the stable track rolls to the canary's version: their ConfigMaps must differ in name, or
    deleting the canary (whose Deployment owns its ConfigMap) would take the stable pods' ConfigMap with it."""
    stable = _render("stable", model=("digits", 4))["ConfigMap"]["metadata"]["name"]
    canary = _render("canary", model=("digits", 4))["ConfigMap"]["metadata"]["name"]
    assert stable != canary


def test_addresses_and_selectors_per_track() -> None:
    cfg = KubeConfig(namespace="ml", cluster_domain="cluster.local")
    assert service_url(SVC, cfg) == f"http://kiln-{SVC}.ml.svc.cluster.local:8080"
    assert service_url(SVC, cfg, "canary") == f"http://kiln-{SVC}-canary.ml.svc.cluster.local:8080"
    assert service_url(SVC, cfg, "shadow") == f"http://kiln-{SVC}-shadow.ml.svc.cluster.local:8080"
    assert service_selector(SVC) == f"{MANAGED_BY}=kiln,kiln.io/service={SVC}"
    assert service_selector(SVC, "canary") == f"{MANAGED_BY}=kiln,kiln.io/service={SVC},{LABEL_TRACK}=canary"
    long_id = "svc-" + "x" * 60
    assert len(track_base(long_id, "canary")) <= 44 and track_base(long_id, "canary") != track_base(long_id)
    with pytest.raises(InvalidInput, match="track"):
        track_base(SVC, "blue")
    with pytest.raises(InvalidInput, match="stable"):
        service_selector(SVC, "stable")  # the stable track goes with the service


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("track", ["canary", "shadow"])
@pytest.mark.needs("kubernetes-validate")
def test_a_tracks_manifests_validate_strictly(track: str, version: str) -> None:
    for owner in (None, UID):
        objects = render_service(
            SVC,
            ORG,
            _spec(replicas=1),
            ("digits", 4),
            KubeConfig(kubernetes_version=version),
            owner_uid=owner,
            track=track,
        )
        validate_strict(objects, version)
