"""The Kubernetes renderer: semantics of the manifests, and strict validation of every one of them against the
official schemas of the oldest (1.29) and the newest Kubernetes version kubernetes-validate ships."""

from __future__ import annotations

import json
import shlex
import subprocess
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kiln.backends.kubernetes.render import (
    ANNOTATION_LABELS,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_ORG,
    LABEL_ROLE,
    MANAGED_BY,
    KubeConfig,
    RenderInput,
    base_name,
    cleanup_selector,
    dns_label,
    gang_env,
    label_value,
    render,
    to_yaml,
    user_labels,
)
from kiln.domain.distributed import Member, gang_members, tf_config
from kiln.domain.spec import JobSpec
from kiln.errors import InvalidInput
from tests.unit.kubernetes.conftest import NEWEST, OLDEST, VERSIONS, validate_strict

JOB = "job-01jd5y3c2k7q4m9x2a"
ORG = "org-01jd5y3c2k7q4m9x2b"
UID = "9f0b6c1e-3d1a-4a53-9d0e-1b2c3d4e5f60"


def spec(**fields: Any) -> JobSpec:
    return JobSpec.model_validate({"command": "python train.py", **fields})


def rendered(spec_: JobSpec, cfg: KubeConfig | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    job = RenderInput(JOB, ORG, kwargs.pop("attempt", 1), spec_, **{"token": "tok", **kwargs})
    return render(job, cfg or KubeConfig())


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def files_of(objects: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for cm in of_kind(objects, "ConfigMap"):
        out |= cm["data"]
    return out


CASES: dict[str, dict[str, Any]] = {
    "single": {},
    "single-full": {
        "runtime": {"image": "ghcr.io/acme/train:1.0"},
        "resources": {"cpus": 0.5, "memory": "2Gi"},
        "env": {"LR": "3e-4", "PRICE": "$(NOT_EXPANDED) $HOME"},
        "prepare_command": "pip install -r requirements.txt",
        "finish_command": ["python", "upload.py"],
        "timeout": "1h30m",
        "labels": {"team": "ML Research", "a.b/c": "x"},
        "priority": "high",
        "inputs": [{"dataset": "mnist@3"}, {"dataset": "imagenet@1", "path": "/mnt/in"}],
    },
    "pytorch-2x2": {
        "runtime": {"framework": "pytorch"},
        "resources": {"cpus": 8, "memory": "64G", "gpus": 2, "gpu_type": "H200"},
        "node_selector": {"zone": "a", "kiln.io/hostname": "node-1"},
        "distributed": {"framework": "pytorch", "workers": 2, "procs_per_worker": 2},
    },
    "tensorflow-ps": {
        "runtime": {"image": "tensorflow/tensorflow:2.17.0"},
        "distributed": {"framework": "tensorflow", "workers": 3, "ps": 2},
    },
    "tensorflow-mirrored": {
        "runtime": {"image": "tensorflow/tensorflow:2.17.0"},
        "distributed": {"framework": "tensorflow", "workers": 2},
    },
    "jax": {"runtime": {"image": "ghcr.io/acme/jax:0.4"}, "distributed": {"framework": "jax", "workers": 4}},
    "mpi": {
        "runtime": {"image": "mpioperator/openmpi:0.5"},
        "command": "$KILN_MPI_LAUNCHER python train.py",
        "distributed": {"framework": "mpi", "workers": 3, "procs_per_worker": 4},
    },
}
CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "kueue": {"gang_scheduler": "kueue", "queue": "team-a"},
    "volcano": {
        "gang_scheduler": "volcano",
        "queue": "research",
        "priority_classes": {"high": "kiln-high", "normal": "kiln-normal"},
        "image_pull_secrets": ["regcred"],
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    },
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.needs("kubernetes-validate")
def test_every_manifest_validates_strictly(case: str, config: str, version: str) -> None:
    cfg = KubeConfig(**CONFIGS[config], kubernetes_version=version)
    for owner in (None, UID):
        objects = rendered(spec(**CASES[case]), cfg, owner_uid=owner, code_sha256="ab" * 32)
        validate_strict(objects, version)
        # What the CLI prints reads back as the same objects.
        assert list(yaml.safe_load_all(to_yaml(objects))) == objects


@pytest.mark.needs("kubernetes-validate")
def test_the_versions_are_the_oldest_supported_and_the_newest_known() -> None:
    assert OLDEST == "1.29"
    assert tuple(int(p) for p in NEWEST.split(".")) >= (1, 31)


@pytest.mark.needs("kubernetes-validate")
def test_the_validator_is_strict() -> None:
    objects = rendered(spec())
    objects[-1]["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(AssertionError, match="imagePullPolicyy"):
        validate_strict(objects, NEWEST)


@pytest.mark.parametrize("case", sorted(CASES))
def test_labels_on_every_object_and_pod_and_owner_references(case: str) -> None:
    objects = rendered(spec(**CASES[case]), owner_uid=UID)
    jobs = of_kind(objects, "Job")
    main = jobs[0]
    for obj in objects:
        for meta in [obj["metadata"]] + ([obj["spec"]["template"]["metadata"]] if obj["kind"] == "Job" else []):
            labels = meta["labels"]
            assert labels[MANAGED_BY] == "kiln"
            assert labels[LABEL_JOB] == JOB
            assert labels[LABEL_ORG] == ORG
            assert labels[LABEL_ATTEMPT] == "1"
            assert labels[LABEL_ROLE] in ("worker", "ps", "shared")
        assert obj["metadata"]["namespace"] == "kiln"
        if obj is main:
            assert "ownerReferences" not in obj["metadata"]
        else:
            (ref,) = obj["metadata"]["ownerReferences"]
            assert ref == {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": main["metadata"]["name"],
                "uid": UID,
                "controller": True,
            }
    # Without the owner's uid: no ownerReferences, and the cleanup selector matches everything.
    selector = dict(part.split("=") for part in cleanup_selector(JOB, 1).split(","))
    for obj in rendered(spec(**CASES[case])):
        assert "ownerReferences" not in obj["metadata"]
        assert selector.items() <= obj["metadata"]["labels"].items()


def test_single_job() -> None:
    objects = rendered(spec(resources={"cpus": 2, "memory": "4G"}), code_sha256="cd" * 32)
    assert [o["kind"] for o in objects] == ["Secret", "ConfigMap", "NetworkPolicy", "Job"]
    job = objects[-1]
    assert job["metadata"]["name"] == f"kiln-{JOB}-a1"
    js = job["spec"]
    assert js["backoffLimit"] == 0
    assert js["parallelism"] == js["completions"] == 1
    assert "completionMode" not in js and "activeDeadlineSeconds" not in js
    assert js["ttlSecondsAfterFinished"] == 3600
    pod = js["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["image"] == "python:3.11-slim"  # the catalog's default python runtime
    assert container["command"] == ["/bin/sh", "/etc/kiln/entrypoint.sh"]
    assert container["args"] == ["/bin/sh", "-c", "python train.py"]
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "4294967296"},
        "limits": {"cpu": "2", "memory": "4294967296"},
    }
    env = env_of(container)
    assert env["KILN_JOB_TOKEN"] == {"secretKeyRef": {"name": f"kiln-{JOB}-a1", "key": "token"}}
    for key in (
        "KILN_JOB_ID",
        "KILN_ATTEMPT",
        "KILN_WORK_DIR",
        "KILN_OUTPUT_DIR",
        "KILN_CHECKPOINT_DIR",
        "KILN_NOTICE_FILE",
        "KILN_TENSORBOARD_DIR",
        "KILN_NUM_CPUS",
        "KILN_NUM_GPUS",
        "KILN_ENDPOINT",
    ):
        assert key in env
    # No KILN_METRICS_DIR: nothing in a pod reads spool files, so `kiln.log` must post with the job token instead.
    assert "KILN_METRICS_DIR" not in env
    assert "kiln_sdk.py" in files_of(objects)
    assert (env["KILN_JOB_ID"], env["KILN_NUM_CPUS"], env["KILN_NUM_GPUS"]) == (JOB, "2", "0")
    assert (env["KILN_WORKER_INDEX"], env["KILN_NUM_WORKERS"]) == ("0", "1")
    init, sync = pod["initContainers"]
    init_env = env_of(init)
    assert init["command"] == ["python3", "/etc/kiln/podfetch.py"] and "restartPolicy" not in init
    assert init_env["KILN_CODE_SHA256"] == "cd" * 32
    assert init_env["KILN_JOB_TOKEN"] == env["KILN_JOB_TOKEN"]
    assert init_env["KILN_CHECKPOINT_DIR"] == env["KILN_CHECKPOINT_DIR"]  # restored before the command runs
    secret = objects[0]
    assert secret["stringData"] == {"token": "tok"}
    # The sync sidecar: a native sidecar in the init image, with the token, sharing the output, checkpoint, metrics
    # (for TensorBoard event files) and run volumes (all but run read-only); the entrypoint waits for it at most
    # upload_timeout.
    assert (sync["name"], sync["restartPolicy"], sync["image"]) == ("kiln-sync", "Always", "python:3.11-slim")
    assert sync["command"] == ["python3", "/etc/kiln/podsync.py"]
    sync_env = env_of(sync)
    assert sync_env["KILN_JOB_TOKEN"] == env["KILN_JOB_TOKEN"] and sync_env["KILN_CHECKPOINT_SYNC_SECONDS"] == "300"
    assert (sync_env["KILN_ROLE"], env["KILN_SYNC_TIMEOUT"]) == ("worker", "600")
    main_mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    sync_mounts = {m["name"]: (m["mountPath"], m.get("readOnly", False)) for m in sync["volumeMounts"]}
    assert sync_mounts == {
        "kiln-conf": ("/etc/kiln", True),
        "kiln-outputs": (main_mounts["kiln-outputs"], True),
        "kiln-checkpoints": (main_mounts["kiln-checkpoints"], True),
        "kiln-metrics": (main_mounts["kiln-metrics"], True),
        "kiln-run": (main_mounts["kiln-run"], False),
    }
    assert sync_env["KILN_TENSORBOARD_DIR"] == env["KILN_TENSORBOARD_DIR"]
    assert {"podfetch.py", "podsync.py"} <= set(files_of(objects))
    cfg = KubeConfig(checkpoint_sync_seconds=30, upload_timeout=90)
    other = rendered(spec(), cfg)[-1]["spec"]["template"]["spec"]
    assert env_of(other["initContainers"][1])["KILN_CHECKPOINT_SYNC_SECONDS"] == "30"
    assert env_of(other["containers"][0])["KILN_SYNC_TIMEOUT"] == "90"


def test_full_single_job() -> None:
    objects = rendered(spec(**CASES["single-full"]), KubeConfig(priority_classes={"high": "kiln-high"}))
    job = objects[-1]
    assert job["spec"]["activeDeadlineSeconds"] == 5400
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "kiln-high"
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/acme/train:1.0"
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": str(2 * 1024**3)}
    env = env_of(container)
    assert env["LR"] == "3e-4"
    assert env["PRICE"] == "$$(NOT_EXPANDED) $$HOME"  # Kubernetes turns $$ into $: the value arrives as given
    assert env["KILN_INPUT_MNIST"] == "/data/mnist" and env["KILN_INPUT_IMAGENET"] == "/mnt/in"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/data/mnist"]["readOnly"] and mounts["/mnt/in"]["readOnly"]
    fetch = json.loads(env_of(pod["initContainers"][0])["KILN_INPUTS"])
    assert fetch == [
        {"dataset": "mnist@3", "dir": "/kiln/inputs/0"},
        {"dataset": "imagenet@1", "dir": "/kiln/inputs/1"},
    ]
    script = files_of(objects)["entrypoint.sh"]
    assert "kiln_prepare() { step /bin/sh -c 'pip install -r requirements.txt'; }" in script
    assert "kiln_finish() { step python upload.py; }" in script
    labels = job["metadata"]["labels"]
    assert labels["label.kiln.io/team"].startswith("ML-Research-")
    assert json.loads(job["metadata"]["annotations"][ANNOTATION_LABELS]) == {"team": "ML Research", "a.b/c": "x"}


def test_pytorch_gang() -> None:
    objects = rendered(spec(**CASES["pytorch-2x2"]))
    assert [o["kind"] for o in objects] == ["Secret", "ConfigMap", "Service", "NetworkPolicy", "Job"]
    base = base_name(JOB, 1)
    service, job = objects[2], objects[4]
    assert job["metadata"]["name"] == f"{base}-worker"
    js = job["spec"]
    assert js["completionMode"] == "Indexed"
    assert js["parallelism"] == js["completions"] == 2
    assert "successPolicy" not in js  # every worker ends on its own
    pod = js["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == base
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= js["template"]["metadata"]["labels"].items()
    assert pod["nodeSelector"] == {"zone": "a", "kubernetes.io/hostname": "node-1", "nvidia.com/gpu.product": "H200"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    container = pod["containers"][0]
    assert container["image"].startswith("pytorch/pytorch:")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert env_of(container)["KILN_PROCS"] == "2"
    assert any(v.get("emptyDir") == {"medium": "Memory"} for v in pod["volumes"])
    files = files_of(objects)
    gang = parse_env(files["gang.env"])
    # MASTER_ADDR is worker 0's stable DNS name: the Indexed Job's pod hostname in the Service's subdomain.
    assert gang["MASTER_ADDR"] == f"{base}-worker-0.{base}.kiln.svc"
    assert (gang["WORLD_SIZE"], gang["MASTER_PORT"]) == ("4", "29500")
    ranks = {}
    for index in range(2):
        for local in range(2):
            env = {**gang, **parse_env(files[f"worker-{index}-{local}.env"])}
            assert (env["LOCAL_RANK"], env["GROUP_RANK"], env["KILN_WORKER_INDEX"]) == (
                str(local),
                str(index),
                str(index),
            )
            ranks[(index, local)] = int(env["RANK"])
    assert sorted(ranks.values()) == [0, 1, 2, 3]
    # The gpu type maps to the node label value the setting says.
    cfg = KubeConfig(gpu_types={"H200": "NVIDIA-H200"}, gpu_type_label="gpu.example.com/model")
    pod = rendered(spec(**CASES["pytorch-2x2"]), cfg)[-1]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["gpu.example.com/model"] == "NVIDIA-H200"


def parse_env(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        assert line.startswith("export ")
        key, _, value = line.removeprefix("export ").partition("=")
        (out[key],) = shlex.split(value)
    return out


def test_tensorflow_ps_gang_and_tf_config() -> None:
    objects = rendered(spec(**CASES["tensorflow-ps"]), KubeConfig(kubernetes_version="1.31"))
    workers, ps = of_kind(objects, "Job")
    base = base_name(JOB, 1)
    assert (workers["metadata"]["name"], ps["metadata"]["name"]) == (f"{base}-worker", f"{base}-ps")
    assert (workers["spec"]["completions"], ps["spec"]["completions"]) == (3, 2)
    assert ps["spec"]["completionMode"] == "Indexed" and ps["spec"]["template"]["spec"]["subdomain"] == base
    # Only the chief ends on its own: its success is the gang's (successPolicy from 1.31).
    assert workers["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    assert "successPolicy" not in ps["spec"]
    old = of_kind(rendered(spec(**CASES["tensorflow-ps"]), KubeConfig(kubernetes_version="1.29")), "Job")[0]
    assert "successPolicy" not in old["spec"] and old["metadata"]["annotations"]["kiln.io/success-index"] == "0"
    files = files_of(objects)
    gang = parse_env(files["gang.env"])
    dist = spec(**CASES["tensorflow-ps"]).distributed
    assert dist is not None
    members = [Member(r, i, f"{base}-{r}-{i}.{base}.kiln.svc", 29500) for r, i in gang_members(dist)]
    configs = []
    for me, (role, index) in enumerate(gang_members(dist)):
        env = {**gang, **parse_env(files[f"{role}-{index}-0.env"])}
        assert env["TF_CONFIG"] == tf_config(dist, members, me)
        configs.append(json.loads(env["TF_CONFIG"]))
        assert env["KILN_ROLE"] == role
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)
    assert configs[0]["cluster"]["chief"] == [f"{base}-worker-0.{base}.kiln.svc:29500"]
    assert [c["task"] for c in configs] == [
        {"type": "chief", "index": 0},
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
        {"type": "ps", "index": 0},
        {"type": "ps", "index": 1},
    ]
    # The ps pods are selected by the same headless Service.
    service = of_kind(objects, "Service")[0]
    assert service["spec"]["selector"].items() <= ps["spec"]["template"]["metadata"]["labels"].items()


def test_jax_and_mpi_env() -> None:
    base = base_name(JOB, 1)
    files = files_of(rendered(spec(**CASES["jax"])))
    gang = parse_env(files["gang.env"])
    assert gang["JAX_COORDINATOR_ADDRESS"] == f"{base}-worker-0.{base}.kiln.svc:29500"
    assert gang["JAX_NUM_PROCESSES"] == "4"
    assert [parse_env(files[f"worker-{i}-0.env"])["JAX_PROCESS_ID"] for i in range(4)] == ["0", "1", "2", "3"]

    objects = rendered(spec(**CASES["mpi"]), KubeConfig(kubernetes_version="1.33"), ssh_public_key="ssh-ed25519 AAA")
    files = files_of(objects)
    assert files["hostfile"] == "".join(f"{base}-worker-{i}.{base}.kiln.svc slots=4\n" for i in range(3))
    launcher = {**parse_env(files["gang.env"]), **parse_env(files["worker-0-0.env"])}
    assert launcher["KILN_MPI_HOSTFILE"] == "/etc/kiln/hostfile"
    assert launcher["KILN_MPI_LAUNCHER"].startswith("mpirun --hostfile /etc/kiln/hostfile -np 12")
    assert "KILN_MPI_LAUNCHER" not in parse_env(files["worker-1-0.env"])
    job = of_kind(objects, "Job")[0]
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert env_of(container)["KILN_PROCS"] == "1"  # slots, not processes: mpirun starts the ranks
    assert "sshd" in env_of(container)["KILN_MPI_DAEMON"]
    secret = objects[0]["stringData"]
    assert secret["authorized_keys"] == secret["id_ed25519.pub"] == "ssh-ed25519 AAA"


def test_gang_schedulers() -> None:
    gang = spec(**CASES["tensorflow-ps"])
    kueue = rendered(gang, KubeConfig(**CONFIGS["kueue"]))
    for job in of_kind(kueue, "Job"):
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert job["spec"]["suspend"] is True
    volcano = rendered(gang, KubeConfig(**CONFIGS["volcano"]))
    (group,) = of_kind(volcano, "PodGroup")
    base = base_name(JOB, 1)
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["metadata"]["name"] == base
    assert group["spec"] == {"minMember": 5, "queue": "research", "priorityClassName": "kiln-normal"}
    for job in of_kind(volcano, "Job"):
        template = job["spec"]["template"]
        assert template["spec"]["schedulerName"] == "volcano"
        assert template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == base
        assert template["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
        assert "suspend" not in job["spec"]
    with pytest.raises(ValueError, match="queue"):
        KubeConfig(gang_scheduler="kueue")


def test_refusals() -> None:
    with pytest.raises(InvalidInput, match=r"runtime\.python.*host"):
        rendered(spec(runtime={"python": "/usr/bin/python3"}))
    with pytest.raises(InvalidInput, match=r"kiln\.io/backend=local"):
        rendered(spec(node_selector={"kiln.io/backend": "local"}))
    with pytest.raises(InvalidInput, match="node_selector"):
        rendered(spec(node_selector={"zone": "not a label value"}))


@pytest.mark.needs("kubernetes-validate")
def test_per_index_env_files_spill_into_more_configmaps() -> None:
    big = spec(runtime={"image": "tf:1"}, distributed={"framework": "tensorflow", "workers": 200, "ps": 20})
    objects = rendered(big)
    maps = of_kind(objects, "ConfigMap")
    assert len(maps) > 1
    for cm in maps:
        assert sum(len(k) + len(v.encode()) for k, v in cm["data"].items()) < 1024**2
    projected = objects[-1]["spec"]["template"]["spec"]["volumes"][0]["projected"]["sources"]
    assert [s["configMap"]["name"] for s in projected] == [cm["metadata"]["name"] for cm in maps]
    assert len(files_of(objects)) == 5 + 1 + 220  # scripts, the SDK, params.json, gang.env, one per member
    validate_strict(objects, NEWEST)


@pytest.mark.needs("kubernetes-validate")
def test_names_are_deterministic_valid_dns_labels() -> None:
    assert base_name(JOB, 1) == f"kiln-{JOB}-a1"
    odd = base_name("Job_With Spaces/and-UPPER-case-and-a-very-long-tail-beyond-limits", 12)
    assert odd == base_name("Job_With Spaces/and-UPPER-case-and-a-very-long-tail-beyond-limits", 12)
    assert len(odd) <= 44 and dns_label(odd) == odd
    assert odd != base_name("job_with spaces/and-upper-case-and-a-very-long-tail-beyond-limits", 12)
    for text in ("", "-", "9lives", "UPPER", "a" * 200, "ünïcødé", "x--y"):
        name = dns_label(text)
        assert len(name) <= 63 and dns_label(name) == name and name == dns_label(text)
    assert dns_label("fine-name") == "fine-name"
    assert label_value("ok.value_1") == "ok.value_1"
    for text in ("", "x" * 100, "has space", "-lead", "trail-", "ü"):
        value = label_value(text)
        assert len(value) <= 63 and label_value(value) == value
    assert label_value("") == ""
    labels, mapping = user_labels({"team": "ml", "a.b/c": "x y", "z" * 80: "v"})
    assert labels["label.kiln.io/team"] == "ml"
    assert mapping["a.b/c"] == ("label.kiln.io/a.b_c", label_value("x y"))
    assert all(len(k.split("/", 1)[1]) <= 63 for k in labels)
    # A long job id still renders, and its objects validate.
    objects = render(
        RenderInput("job-" + "q" * 120, ORG, 3, spec(distributed={"framework": "jax", "workers": 2}), token="t"),
        KubeConfig(),
    )
    validate_strict(objects, NEWEST)
    assert (
        len(gang_env(RenderInput("job-" + "q" * 120, ORG, 3, spec(distributed={"framework": "jax"})), KubeConfig())[1])
        == 1
    )


@pytest.mark.needs("kubernetes-validate")
def test_cli_prints_the_manifests(tmp_path: Any) -> None:
    from kiln.cli.main import app

    spec_file = tmp_path / "kiln.yaml"
    spec_file.write_text(
        yaml.safe_dump({"command": "python train.py", "distributed": {"framework": "pytorch", "workers": 2}})
    )
    result = CliRunner().invoke(
        app, ["jobs", "render", "-f", str(spec_file), "--backend", "kubernetes", "--namespace", "ml", "--job-id", JOB]
    )
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == ["Secret", "ConfigMap", "Service", "NetworkPolicy", "Job"]
    assert {d["metadata"]["namespace"] for d in docs} == {"ml"}
    assert docs[0]["stringData"]["token"] == "REPLACE-WITH-THE-JOB-TOKEN"
    validate_strict(docs, OLDEST)
    spec_file.write_text(yaml.safe_dump({"command": "x", "runtime": {"python": "/usr/bin/python3"}}))
    result = CliRunner().invoke(app, ["jobs", "render", "-f", str(spec_file)])
    assert result.exit_code == 2 and "runtime.python" in result.output


def test_entrypoint_runs_prepare_command_finish_and_per_process_env(tmp_path: Any) -> None:
    """The rendered entrypoint, run by a real /bin/sh with the rendered env files (no cluster needed)."""
    objects = rendered(
        spec(
            command="echo rank=$RANK local=$LOCAL_RANK master=$MASTER_ADDR >> $KILN_OUTPUT_DIR/log",
            prepare_command="echo prepared > $KILN_OUTPUT_DIR/prepared",
            finish_command="echo finish=$KILN_EXIT_CODE >> $KILN_OUTPUT_DIR/log",
            distributed={"framework": "pytorch", "workers": 2, "procs_per_worker": 2},
        )
    )
    conf = tmp_path / "conf"
    conf.mkdir()
    for name, text in files_of(objects).items():
        (conf / name).write_text(text)
    container = of_kind(objects, "Job")[0]["spec"]["template"]["spec"]["containers"][0]
    env = {k: v.replace("$$", "$") for k, v in env_of(container).items() if isinstance(v, str)}
    dirs = {k: str(tmp_path / k.lower()) for k in ("KILN_WORK_DIR", "KILN_OUTPUT_DIR", "KILN_CHECKPOINT_DIR")}
    env |= dirs | {
        "KILN_TENSORBOARD_DIR": str(tmp_path / "m/tb"),
        "KILN_RUN_DIR": str(tmp_path / "run"),
        "KILN_CONF_DIR": str(conf),
        "JOB_COMPLETION_INDEX": "1",
        "PATH": "/usr/bin:/bin",
        "KILN_SYNC_TIMEOUT": "0",  # no sync sidecar here (test_podsync.py runs the pair)
    }
    args = [a.replace("$$", "$") for a in container["args"]]
    done = subprocess.run(
        ["/bin/sh", str(conf / "entrypoint.sh"), *args],
        env=env,
        capture_output=True,
        timeout=30,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "kiln_output_dir"
    assert (out / "prepared").read_text() == "prepared\n"
    lines = (out / "log").read_text().splitlines()
    base = base_name(JOB, 1)
    assert sorted(lines[:2]) == [f"rank={r} local={r - 2} master={base}-worker-0.{base}.kiln.svc" for r in (2, 3)]
    assert lines[2] == "finish=0"


def test_entrypoint_failure_stops_the_other_processes_and_runs_finish(tmp_path: Any) -> None:
    objects = rendered(
        spec(
            command='if [ "$LOCAL_RANK" = 1 ]; then exit 3; fi; sleep 30',
            finish_command="echo finish=$KILN_EXIT_CODE > $KILN_OUTPUT_DIR/finish",
            distributed={"framework": "pytorch", "workers": 1, "procs_per_worker": 2},
        )
    )
    conf = tmp_path / "conf"
    conf.mkdir()
    for name, text in files_of(objects).items():
        (conf / name).write_text(text)
    container = of_kind(objects, "Job")[0]["spec"]["template"]["spec"]["containers"][0]
    env = {k: v.replace("$$", "$") for k, v in env_of(container).items() if isinstance(v, str)}
    for key in ("KILN_WORK_DIR", "KILN_OUTPUT_DIR", "KILN_CHECKPOINT_DIR", "KILN_RUN_DIR"):
        env[key] = str(tmp_path / key.lower())
    env |= {"KILN_TENSORBOARD_DIR": str(tmp_path / "tb"), "KILN_CONF_DIR": str(conf), "PATH": "/usr/bin:/bin"}
    env["KILN_SYNC_TIMEOUT"] = "0"  # no sync sidecar here (test_podsync.py runs the pair)
    args = [a.replace("$$", "$") for a in container["args"]]
    done = subprocess.run(
        ["/bin/sh", str(conf / "entrypoint.sh"), *args],
        env=env,
        capture_output=True,
        timeout=20,
        start_new_session=True,
    )
    assert done.returncode == 3, done.stderr
    assert b"local process 1 exited with 3" in done.stderr
    assert (tmp_path / "kiln_output_dir" / "finish").read_text() == "finish=3\n"


def test_entrypoint_passes_sigterm_to_the_whole_tree_and_skips_finish(tmp_path: Any) -> None:
    import signal
    import time

    objects = rendered(spec(command="sleep 30; echo never", finish_command="echo finished > $KILN_OUTPUT_DIR/finish"))
    conf = tmp_path / "conf"
    conf.mkdir()
    for name, text in files_of(objects).items():
        (conf / name).write_text(text)
    container = of_kind(objects, "Job")[0]["spec"]["template"]["spec"]["containers"][0]
    env = {k: v.replace("$$", "$") for k, v in env_of(container).items() if isinstance(v, str)}
    for key in ("KILN_WORK_DIR", "KILN_OUTPUT_DIR", "KILN_CHECKPOINT_DIR", "KILN_RUN_DIR"):
        env[key] = str(tmp_path / key.lower())
    env |= {"KILN_TENSORBOARD_DIR": str(tmp_path / "tb"), "KILN_CONF_DIR": str(conf), "PATH": "/usr/bin:/bin"}
    env["KILN_SYNC_TIMEOUT"] = "0"  # no sync sidecar here (test_podsync.py runs the pair)
    proc = subprocess.Popen(
        ["/bin/sh", str(conf / "entrypoint.sh"), *container["args"]],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    time.sleep(1.0)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # what the kubelet sends to PID 1
    out, _ = proc.communicate(timeout=15)  # returns only when the grandchild `sleep` has gone too
    assert time.monotonic() - started < 10
    assert proc.returncode != 0 and b"never" not in out
    assert not (tmp_path / "kiln_output_dir" / "finish").exists()


def test_a_jobs_params_reach_its_pod_as_variables_and_a_file() -> None:
    objects = rendered(spec(params={"lr": 0.01, "act": "relu", "deep": True}))
    pod = objects[-1]["spec"]["template"]["spec"]
    env = env_of(pod["containers"][0])
    assert (env["KILN_PARAM_LR"], env["KILN_PARAM_ACT"], env["KILN_PARAM_DEEP"]) == ("0.01", "relu", "true")
    assert env["KILN_PARAMS_FILE"] == "/etc/kiln/params.json"
    assert json.loads(files_of(objects)["params.json"]) == {"act": "relu", "deep": True, "lr": 0.01}
