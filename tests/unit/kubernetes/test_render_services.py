"""The Kubernetes render of a model service: strict validation of every manifest against the official schemas of
the oldest (1.29) and the newest Kubernetes version kubernetes-validate ships, and what the manifests say (names,
labels, the HPA, probes, the replica's environment and params file). The programs the pods run (replica.sh, the
shipped replica server, podmodel.py) are run for real in tests/unit/kubernetes/test_service_pods.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from kiln.backends.kubernetes.inputs import KubeConfig
from kiln.backends.kubernetes.names import MANAGED_BY, dns_label
from kiln.backends.kubernetes.render import ANNOTATION_LABELS, to_yaml
from kiln.backends.kubernetes.serving import (
    HPA_METRIC,
    LABEL_SERVICE,
    REPLICA_PORT,
    render_service,
    replica_params,
    service_base,
    service_selector,
    service_url,
)
from kiln.domain.serving import ServiceSpec
from kiln.errors import InvalidInput
from tests.unit.kubernetes.conftest import VERSIONS, validate_strict

SVC = "svc-01jd5y3c2k7q4m9x2a"
ORG = "org-01jd5y3c2k7q4m9x2b"
UID = "9f0b6c1e-3d1a-4a53-9d0e-1b2c3d4e5f60"
CODE = "ab" * 32
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def service(**fields: Any) -> ServiceSpec:
    return ServiceSpec.model_validate(
        {"name": "digits", "model": "digits@production", "predictor": {"type": "sklearn"}, **fields}
    )


def rendered(spec: ServiceSpec, cfg: KubeConfig | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    model = kwargs.pop("model", ("digits", 3))
    kwargs = {"token": "job-token", "replica_secret": "s3cret", **kwargs}
    return render_service(kwargs.pop("service_id", SVC), ORG, spec, model, cfg or KubeConfig(), **kwargs)


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = of_kind(objects, kind)
    return obj


def pod_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


CASES: dict[str, dict[str, Any]] = {
    "replicas": {"replicas": 2},
    "zero-replicas": {"replicas": 0},
    "autoscale": {
        "autoscale": {"min": 0, "max": 8, "target_concurrency": 2.5, "idle_seconds": 7200},
        "batching": {"max_batch_size": 16, "max_latency_ms": 2},
    },
    "gpu": {
        "predictor": {"type": "torchscript", "file": "model.pt", "input_schema": {"shape": [64]}},
        "runtime": {"framework": "pytorch"},
        "resources": {"cpus": 4, "memory": "16Gi", "gpus": 1, "gpu_type": "H200"},
        "autoscale": {"min": 2, "max": 4},
    },
    "custom": {
        "predictor": {
            "type": "custom",
            "class": "predictor:Model",
            "input_schema": {"shape": [None, 3], "dtype": "float64"},
        },
        "runtime": {"image": "ghcr.io/acme/serve:1.0"},
        "resources": {"cpus": 0.5, "memory": "1Gi"},
        "env": {"PRICE": "$(NOT_EXPANDED) $HOME", "PYTHONPATH": "/opt/lib"},
        "labels": {"team": "ML Research", "tier": "gold"},
        "request_timeout": 300,
        "batching": {"max_batch_size": 4, "max_latency_ms": 0},
    },
}
CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "cluster": {
        "namespace": "ml-serving",
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "image_pull_secrets": ["regcred"],
        "service_account": "kiln-replicas",
        "gpu_types": {"H200": "NVIDIA-H200"},
        "cluster_domain": "cluster.local",
        "termination_grace_seconds": 120,
    },
}


def _extra(case: str) -> dict[str, Any]:
    return {"code_sha256": CODE, "job_id": "job-01jd5y3c2k7q4m9x2c"} if case == "custom" else {}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.needs("kubernetes-validate")
def test_every_manifest_validates_strictly(case: str, config: str, version: str) -> None:
    cfg = KubeConfig(**CONFIGS[config], kubernetes_version=version)
    for owner in (None, UID):
        objects = rendered(service(**CASES[case]), cfg, owner_uid=owner, **_extra(case))
        validate_strict(objects, version)
        # What `kiln services render` prints reads back as the same objects.
        assert list(yaml.safe_load_all(to_yaml(objects))) == objects


@pytest.mark.parametrize("case", sorted(CASES))
def test_objects_labels_selectors_and_owners(case: str) -> None:
    objects = rendered(service(**CASES[case]), owner_uid=UID, **_extra(case))
    autoscaled = "autoscale" in CASES[case]
    kinds = ["Secret", "ConfigMap", "NetworkPolicy", "Deployment", "Service"]
    kinds += ["HorizontalPodAutoscaler"] if autoscaled else []
    assert [o["kind"] for o in objects] == kinds
    deployment = one(objects, "Deployment")
    template = deployment["spec"]["template"]
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert (labels[MANAGED_BY], labels[LABEL_SERVICE], labels["kiln.io/org"]) == ("kiln", SVC, ORG)
        assert labels["kiln.io/service-name"] == "digits"
        assert labels["kiln.io/role"] == ("replica" if obj is deployment else "shared")
        assert obj["metadata"]["namespace"] == "kiln"
        if obj is deployment:
            assert "ownerReferences" not in obj["metadata"]
        else:
            (ref,) = obj["metadata"]["ownerReferences"]  # deleting the Deployment removes everything
            assert ref == {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": deployment["metadata"]["name"],
                "uid": UID,
                "controller": True,
            }
    # The Deployment's and the Service's selectors pick the replicas' pods, and only them.
    pod_labels = template["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert one(objects, "Service")["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert (pod_labels["kiln.io/role"], pod_labels["kiln.io/revision"]) == ("replica", "1")
    assert template["metadata"]["annotations"]["kiln.io/model"] == "digits@3"
    # service_selector selects every object; without an owner there are no ownerReferences.
    wanted = dict(part.split("=") for part in service_selector(SVC).split(","))
    for obj in rendered(service(**CASES[case]), **_extra(case)):
        assert wanted.items() <= obj["metadata"]["labels"].items()
        assert "ownerReferences" not in obj["metadata"]


def test_user_labels_are_kept_and_renamed_like_a_jobs() -> None:
    objects = rendered(service(**CASES["custom"]), **_extra("custom"))
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["label.kiln.io/tier"] == "gold"
        assert labels["label.kiln.io/team"].startswith("ML-Research-")
        assert json.loads(obj["metadata"]["annotations"][ANNOTATION_LABELS]) == {"team": "ML Research", "tier": "gold"}
    assert one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]["label.kiln.io/tier"] == "gold"


@pytest.mark.needs("kubernetes-validate")
def test_names_are_deterministic_and_dns_valid() -> None:
    spec = service(**CASES["autoscale"])
    objects = rendered(spec)
    base = service_base(SVC)
    assert base == f"kiln-{SVC}"
    assert rendered(spec) == objects  # the same inputs, the same manifests, byte for byte
    for obj in objects:
        name = obj["metadata"]["name"]
        assert DNS_1035.match(name) and len(name) <= 63, name
        assert name == base or obj["kind"] == "ConfigMap"
    assert re.fullmatch(rf"{base}-[0-9a-f]{{10}}", one(objects, "ConfigMap")["metadata"]["name"])
    # An id that is no DNS label (or too long) is cleaned, cut and hashed the same way every time.
    odd = "Svc_With Spaces/AND-a-long-tail-" + "q" * 80
    objects = rendered(spec, service_id=odd)
    base = service_base(odd)
    assert base == service_base(odd) != service_base(odd.lower())
    assert len(base) <= 44 and dns_label(base) == base
    assert {o["metadata"]["name"] for o in objects if o["kind"] != "ConfigMap"} == {base}
    for obj in objects:
        value = obj["metadata"]["labels"][LABEL_SERVICE]
        assert len(value) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", value)
    validate_strict(objects, VERSIONS[-1])
    assert service_url(SVC, KubeConfig()) == f"http://kiln-{SVC}.kiln.svc:{REPLICA_PORT}"
    cfg = KubeConfig(namespace="ml", cluster_domain="cluster.local")
    assert service_url(SVC, cfg) == f"http://kiln-{SVC}.ml.svc.cluster.local:8080"


def test_a_new_model_version_rolls_the_pods_and_keeps_the_names_and_selector() -> None:
    spec = service(replicas=2)
    old, new = rendered(spec), rendered(spec, model=("digits", 4), revision=2)
    old_cm, new_cm = one(old, "ConfigMap"), one(new, "ConfigMap")
    assert old_cm["metadata"]["name"] != new_cm["metadata"]["name"]  # old pods keep mounting theirs meanwhile
    assert old_cm["immutable"] is new_cm["immutable"] is True
    assert json.loads(new_cm["data"]["params.json"])["model"] == "digits@4"
    assert new_cm["metadata"]["labels"]["kiln.io/revision"] == "2"
    old_dep, new_dep = one(old, "Deployment"), one(new, "Deployment")
    assert old_dep["metadata"]["name"] == new_dep["metadata"]["name"]
    assert old_dep["spec"]["selector"] == new_dep["spec"]["selector"]  # immutable in Kubernetes
    new_pod = new_dep["spec"]["template"]
    (source,) = next(v for v in new_pod["spec"]["volumes"] if v["name"] == "kiln-conf")["projected"]["sources"]
    assert source["configMap"]["name"] == new_cm["metadata"]["name"]
    assert new_pod["metadata"]["annotations"]["kiln.io/model"] == "digits@4"
    assert env_of(new_pod["spec"]["initContainers"][0])["KILN_MODEL"] == "digits@4"
    # A new replica is ready before an old one goes.
    assert new_dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


def test_the_hpa_only_with_autoscale() -> None:
    objects = rendered(service(replicas=3))
    assert not of_kind(objects, "HorizontalPodAutoscaler")
    assert one(objects, "Deployment")["spec"]["replicas"] == 3
    assert one(rendered(service(replicas=0)), "Deployment")["spec"]["replicas"] == 0

    objects = rendered(service(**CASES["autoscale"]))
    deployment = one(objects, "Deployment")
    assert "replicas" not in deployment["spec"]  # the HPA's to set; an apply must not reset it
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 8)  # min 0: scale-to-zero is the local router's
    (metric,) = spec["metrics"]
    assert metric == {
        "type": "External",
        "external": {
            "metric": {"name": HPA_METRIC, "selector": {"matchLabels": {"service_id": SVC}}},
            "target": {"type": "AverageValue", "averageValue": "2500m"},
        },
    }
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 3600  # 7200 s idle, Kubernetes' maximum
    hpa = one(rendered(service(autoscale={"min": 3, "max": 5})), "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 5)
    assert hpa["spec"]["metrics"][0]["external"]["target"]["averageValue"] == "4"
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 60


def test_probes_drain_and_grace() -> None:
    objects = rendered(service(request_timeout=120))
    pod = pod_of(objects)
    (container,) = pod["containers"]
    script = ["/bin/sh", "/etc/kiln/replica.sh"]
    assert (container["command"], container["args"]) == (script, ["serve"])
    # Startup and readiness ask the real /healthz with the replica's secret (exec: a probe cannot read a Secret).
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["exec"] == {"command": [*script, "healthz"]}
        assert "httpGet" not in container[probe]
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 600
    # Liveness only notices a replica that stopped listening, on the port the Service targets.
    assert container["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": REPLICA_PORT, "protocol": "TCP"}]
    service_port = one(objects, "Service")["spec"]
    assert service_port["type"] == "ClusterIP"
    assert service_port["ports"] == [{"name": "http", "port": REPLICA_PORT, "targetPort": "http", "protocol": "TCP"}]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [*script, "drain"]
    # The grace period covers the drain and an in-flight request's whole request_timeout.
    assert pod["terminationGracePeriodSeconds"] >= 5 + 120
    longer = pod_of(rendered(service(), KubeConfig(termination_grace_seconds=600)))
    assert longer["terminationGracePeriodSeconds"] == 600  # the setting, when it is longer
    assert pod.get("restartPolicy", "Always") == "Always"
    assert (pod["enableServiceLinks"], pod["automountServiceAccountToken"]) == (False, False)
    assert container["securityContext"] == {"allowPrivilegeEscalation": False}
    init = pod["initContainers"][0]
    assert init["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}


def test_the_replicas_environment_and_params_file() -> None:
    spec = service(**CASES["custom"])
    objects = rendered(spec, **_extra("custom"))
    base = service_base(SVC)
    pod = pod_of(objects)
    container = pod["containers"][0]
    env = env_of(container)
    cm = one(objects, "ConfigMap")
    params = json.loads(cm["data"]["params.json"])
    assert params == {
        "model_dir": "/model",
        "predictor": "custom",
        "class": "predictor:Model",
        "method": "predict",
        "input_schema": '{"shape":[null,3],"dtype":"float64"}',
        "max_batch_size": 4,
        "max_latency_ms": 0.0,
        "model": "digits@3",
    }
    assert params == replica_params(spec, ("digits", 3))
    # Every value is a scalar (a JSON-encoded schema, not an object), as in a local replica's job params.
    assert all(isinstance(v, str | int | float) for v in params.values())
    assert replica_params(service(), ("digits", 3)) | {"model": "x"} == {
        "model_dir": "/model",
        "predictor": "sklearn",
        "method": "predict",
        "max_batch_size": 1,
        "max_latency_ms": 0.0,
        "model": "x",
    }
    # $KILN_PARAMS_FILE is that file, as the projected volume lays it out at /etc/kiln.
    conf = next(v for v in pod["volumes"] if v["name"] == "kiln-conf")
    (source,) = conf["projected"]["sources"]
    items = {i["key"]: i["path"] for i in source["configMap"]["items"]}
    assert set(items) == set(cm["data"])  # every key projected, none missing (the pod would not start)
    mount = next(m for m in container["volumeMounts"] if m["name"] == "kiln-conf")
    assert env["KILN_PARAMS_FILE"] == f"{mount['mountPath']}/{items['params.json']}" == "/etc/kiln/params.json"
    # The replica server is importable as kiln.injob.serve from PYTHONPATH, before the user's own path.
    assert items["serve.py"] == "pylib/kiln/injob/serve.py" and items["kiln_sdk.py"] == "pylib/kiln/__init__.py"
    assert env["PYTHONPATH"] == "/etc/kiln/pylib:/opt/lib"
    assert env["PRICE"] == "$$(NOT_EXPANDED) $$HOME"  # Kubernetes turns $$ into $: the value arrives as given
    assert (env["KILN_REPLICA_HOST"], env["KILN_REPLICA_PORT"]) == ("0.0.0.0", str(REPLICA_PORT))
    assert env["KILN_REPLICA_SECRET"] == {"secretKeyRef": {"name": base, "key": "replica-secret"}}
    assert env["KILN_REPLICA_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert (env["KILN_SERVICE_ID"], env["KILN_MODEL"], env["KILN_WORK_DIR"]) == (SVC, "digits@3", "/kiln/work")
    assert container["workingDir"] == "/kiln/work"  # python -m puts it on sys.path: the custom predictor's module
    assert container["image"] == "ghcr.io/acme/serve:1.0"
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": str(1024**3)},
        "limits": {"cpu": "500m", "memory": str(1024**3)},
    }
    secret = one(objects, "Secret")
    assert secret["stringData"] == {"token": "job-token", "replica-secret": "s3cret"}
    # The init container stages the model version and the code bundle with the token, into the volumes the
    # replica mounts (the model read-only at /model).
    (init,) = pod["initContainers"]
    init_env = env_of(init)
    assert init["command"] == ["python3", "/etc/kiln/podmodel.py"]
    assert (init_env["KILN_MODEL"], init_env["KILN_CODE_SHA256"]) == ("digits@3", CODE)
    assert init_env["KILN_JOB_ID"] == "job-01jd5y3c2k7q4m9x2c"
    assert init_env["KILN_JOB_TOKEN"] == {"secretKeyRef": {"name": base, "key": "token"}}
    init_mounts = {m["name"]: m for m in init["volumeMounts"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert (
        init_mounts["kiln-model"]["mountPath"] == init_env["KILN_MODEL_DIR"]
        and "readOnly" not in init_mounts["kiln-model"]
    )
    assert mounts["kiln-model"] == {"name": "kiln-model", "mountPath": "/model", "readOnly": True}
    assert init_mounts["kiln-work"]["mountPath"] == mounts["kiln-work"]["mountPath"] == init_env["KILN_WORK_DIR"]
    # Placeholders when the render is a preview (no token, no secret, no job).
    preview = render_service(SVC, ORG, spec, ("digits", 3), KubeConfig(), code_sha256=CODE)
    assert one(preview, "Secret")["stringData"] == {
        "token": "REPLACE-WITH-THE-JOB-TOKEN",
        "replica-secret": "REPLACE-WITH-THE-REPLICA-SECRET",
    }
    assert env_of(pod_of(preview)["initContainers"][0])["KILN_JOB_ID"] == "REPLACE-WITH-THE-JOB-ID"


def test_gpus_node_selection_and_cluster_settings() -> None:
    objects = rendered(service(**CASES["gpu"]), KubeConfig(**CONFIGS["cluster"]))
    pod = pod_of(objects)
    container = pod["containers"][0]
    assert container["image"].startswith("pytorch/pytorch:")  # the catalog's image for the runtime
    assert (
        container["resources"]["limits"]["nvidia.com/gpu"]
        == container["resources"]["requests"]["nvidia.com/gpu"]
        == "1"
    )
    assert container["resources"]["limits"]["memory"] == str(16 * 1024**3)
    assert env_of(container)["KILN_NUM_GPUS"] == "1" and env_of(container)["OMP_NUM_THREADS"] == "4"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod["tolerations"]
    assert any(v.get("emptyDir") == {"medium": "Memory"} for v in pod["volumes"])
    assert {"name": "kiln-shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "kiln-replicas" and "automountServiceAccountToken" not in pod
    assert {o["metadata"]["namespace"] for o in objects} == {"ml-serving"}
    cpu_only = pod_of(rendered(service(resources={"cpus": 2})))
    assert "nvidia.com/gpu" not in cpu_only["containers"][0]["resources"]["limits"]
    assert "nodeSelector" not in cpu_only and "tolerations" not in cpu_only
    assert not any(v["name"] == "kiln-shm" for v in cpu_only["volumes"])
    assert cpu_only["containers"][0]["image"] == "python:3.11-slim"
    sklearn = pod_of(rendered(service(runtime={"framework": "sklearn"})))
    assert sklearn["containers"][0]["image"] == "kiln/sklearn:1.9"


def test_refusals_name_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"runtime\.python.*host"):
        rendered(service(runtime={"python": "/usr/bin/python3"}))
    with pytest.raises(InvalidInput, match=r"runtime\.framework"):
        rendered(service(runtime={"framework": "no-such-framework"}))
    for model in (("digits", 0), ("", 3), ("digits", "production"), ("digits", True)):
        with pytest.raises(InvalidInput, match=r"^model: expected the resolved"):
            rendered(service(), model=model)
    with pytest.raises(InvalidInput, match=r"resources\.gpu_type"):
        rendered(service(resources={"gpus": 1, "gpu_type": "not a label value"}))
