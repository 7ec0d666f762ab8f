"""The rendezvous environment of a distributed gang: every member's view must agree with every other's."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
from pydantic import ValidationError

from kiln.domain.distributed import (
    DistributedSpec,
    Member,
    gang_members,
    hostfile_text,
    member_env,
    mpi_launcher_argv,
)

JOB = "job-123"
COMMON = {"KILN_JOB_ID", "KILN_ROLE", "KILN_WORKER_INDEX", "KILN_NUM_WORKERS"}


def gang(spec: DistributedSpec, hosts: list[str] | None = None) -> list[Member]:
    """Members on distinct hosts (a Kubernetes-like gang), or the hosts given, each with its own port."""
    out = []
    for n, (role, index) in enumerate(gang_members(spec)):
        host = hosts[n] if hosts else f"{JOB}-{role}-{index}.kiln.svc"
        out.append(Member(role, index, host, 29500 + n))
    return out


def all_envs(spec: DistributedSpec, members: list[Member], hostfile: str | None = None) -> list[list[dict[str, str]]]:
    return [member_env(JOB, spec, members, me, hostfile=hostfile) for me in range(len(members))]


# -- spec validation ----------------------------------------------------------------------------------------


def errors_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as info:
        DistributedSpec.model_validate(data)
    return info.value.errors()


def test_defaults() -> None:
    spec = DistributedSpec(framework="pytorch")
    assert (spec.workers, spec.procs_per_worker, spec.ps, spec.mpi_implementation) == (1, 1, 0, "openmpi")
    assert gang_members(spec) == [("worker", 0)]


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"framework": "pytorch", "ps": 1}, "ps", "only to tensorflow"),
        ({"framework": "jax", "workers": 2, "ps": 2}, "ps", "only to tensorflow"),
        ({"framework": "tensorflow", "workers": 1, "ps": 1}, "ps", "workers >= 2"),
        ({"framework": "tensorflow", "procs_per_worker": 2}, "procs_per_worker", "only to pytorch and mpi"),
        ({"framework": "jax", "procs_per_worker": 4}, "procs_per_worker", "only to pytorch and mpi"),
        ({"framework": "pytorch", "mpi_implementation": "mpich"}, "mpi_implementation", "only to framework mpi"),
        ({"framework": "pytorch", "workers": 0}, "workers", "greater than or equal to 1"),
        ({"framework": "pytorch", "workers": 257}, "workers", "less than or equal to 256"),
        ({"framework": "pytorch", "procs_per_worker": 65}, "procs_per_worker", "less than or equal to 64"),
        ({"framework": "tensorflow", "workers": 3, "ps": -1}, "ps", "greater than or equal to 0"),
        ({"framework": "horovod"}, "framework", "'pytorch', 'tensorflow', 'jax' or 'mpi'"),
        ({"framework": "mpi", "mpi_implementation": "intel"}, "mpi_implementation", "'openmpi' or 'mpich'"),
        ({"framework": "pytorch", "worker": 2}, "worker", "Extra inputs"),
    ],
)
def test_validation_errors_name_the_field(data: dict[str, Any], field: str, words: str) -> None:
    errors = errors_of(data)
    assert [e["loc"] for e in errors] == [(field,)]
    assert words in errors[0]["msg"]
    if errors[0]["type"] == "value_error":
        assert field.split("_")[0] in errors[0]["msg"]  # the message itself names the field too


def test_valid_combinations() -> None:
    DistributedSpec(framework="pytorch", workers=4, procs_per_worker=8)
    DistributedSpec(framework="mpi", workers=2, procs_per_worker=4, mpi_implementation="mpich")
    DistributedSpec(framework="tensorflow", workers=3, ps=2)
    DistributedSpec(framework="mpi", mpi_implementation="openmpi")


def test_members_must_follow_the_gang_order() -> None:
    spec = DistributedSpec(framework="tensorflow", workers=2, ps=1)
    members = gang(spec)
    with pytest.raises(ValueError, match="gang_members"):
        member_env(JOB, spec, list(reversed(members)), 0)
    with pytest.raises(ValueError, match="gang_members"):
        member_env(JOB, spec, members[:2], 0)
    with pytest.raises(ValueError, match="not in a gang of 3"):
        member_env(JOB, spec, members, 3)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("chief", 0, "h", 1), "role"),
        (("worker", -1, "h", 1), "index"),
        (("worker", 0, "", 1), "host"),
        (("worker", 0, "a b", 1), "host"),
        (("worker", 0, "h", 0), "port"),
        (("worker", 0, "h", 65536), "port"),
    ],
)
def test_member_is_checked(args: tuple[Any, ...], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Member(*args)


# -- pytorch ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("workers", "procs"), [(3, 1), (2, 4), (3, 2)])
def test_pytorch_ranks_are_distinct_and_agree(workers: int, procs: int) -> None:
    spec = DistributedSpec(framework="pytorch", workers=workers, procs_per_worker=procs)
    members = gang(spec)
    envs = all_envs(spec, members)
    assert [len(e) for e in envs] == [procs] * workers
    flat = [env for member in envs for env in member]
    world = workers * procs
    assert sorted(int(e["RANK"]) for e in flat) == list(range(world))
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in flat} == {(members[0].host, str(members[0].port))}
    assert {e["WORLD_SIZE"] for e in flat} == {str(world)}
    assert {e["ROLE_WORLD_SIZE"] for e in flat} == {str(world)}
    assert {e["LOCAL_WORLD_SIZE"] for e in flat} == {str(procs)}
    assert {e["GROUP_WORLD_SIZE"] for e in flat} == {str(workers)}
    assert {e["TORCHELASTIC_RUN_ID"] for e in flat} == {JOB}
    for w, member in enumerate(envs):
        assert [int(e["LOCAL_RANK"]) for e in member] == list(range(procs))
        for local, e in enumerate(member):
            assert int(e["RANK"]) == w * procs + local == int(e["ROLE_RANK"])
            assert e["GROUP_RANK"] == e["NODE_RANK"] == e["KILN_WORKER_INDEX"] == str(w)
            assert e["KILN_ROLE"] == "worker" and e["KILN_NUM_WORKERS"] == str(workers)
            assert e["KILN_JOB_ID"] == JOB


def test_pytorch_sets_what_torchrun_sets() -> None:
    spec = DistributedSpec(framework="pytorch", workers=2, procs_per_worker=2)
    env = member_env(JOB, spec, gang(spec, ["10.0.0.1", "10.0.0.2"]), 1)[1]
    assert env == {
        "KILN_JOB_ID": JOB,
        "KILN_ROLE": "worker",
        "KILN_WORKER_INDEX": "1",
        "KILN_NUM_WORKERS": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "4",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "NODE_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_NAME": "default",
        "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4",
        "TORCHELASTIC_RUN_ID": JOB,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def test_every_value_is_a_string() -> None:
    for framework, extra in [("pytorch", {"procs_per_worker": 2}), ("tensorflow", {"ps": 1}), ("jax", {})]:
        spec = DistributedSpec.model_validate({"framework": framework, "workers": 2, **extra})
        for member in all_envs(spec, gang(spec)):
            for env in member:
                assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
                assert env.keys() >= COMMON


# -- tensorflow ---------------------------------------------------------------------------------------------


def test_tensorflow_cluster_is_identical_and_tasks_unique() -> None:
    spec = DistributedSpec(framework="tensorflow", workers=3, ps=2)
    members = gang(spec)
    envs = all_envs(spec, members)
    assert [len(e) for e in envs] == [1] * 5
    configs = [json.loads(e[0]["TF_CONFIG"]) for e in envs]
    clusters = [c["cluster"] for c in configs]
    assert all(c == clusters[0] for c in clusters)
    cluster = clusters[0]
    assert cluster == {
        "chief": [f"{members[0].host}:29500"],
        "worker": [f"{members[1].host}:29501", f"{members[2].host}:29502"],
        "ps": [f"{members[3].host}:29503", f"{members[4].host}:29504"],
    }
    tasks = [(c["task"]["type"], c["task"]["index"]) for c in configs]
    assert tasks == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("ps", 1)]
    assert len(set(tasks)) == len(tasks)
    for (kind, index), member in zip(tasks, members, strict=True):
        assert 0 <= index < len(cluster[kind])
        assert cluster[kind][index] == member.address  # each task is its own member's address
    roles = [(e[0]["KILN_ROLE"], e[0]["KILN_WORKER_INDEX"]) for e in envs]
    assert roles == [("worker", "0"), ("worker", "1"), ("worker", "2"), ("ps", "0"), ("ps", "1")]


def test_tensorflow_omits_empty_jobs() -> None:
    spec = DistributedSpec(framework="tensorflow")
    config = json.loads(member_env(JOB, spec, gang(spec, ["127.0.0.1"]), 0)[0]["TF_CONFIG"])
    assert config == {"cluster": {"chief": ["127.0.0.1:29500"]}, "task": {"type": "chief", "index": 0}}
    spec = DistributedSpec(framework="tensorflow", workers=2)
    config = json.loads(member_env(JOB, spec, gang(spec, ["127.0.0.1"] * 2), 1)[0]["TF_CONFIG"])
    assert config == {
        "cluster": {"chief": ["127.0.0.1:29500"], "worker": ["127.0.0.1:29501"]},
        "task": {"type": "worker", "index": 0},
    }


def test_ipv6_hosts_are_bracketed() -> None:
    spec = DistributedSpec(framework="jax", workers=2)
    env = member_env(JOB, spec, gang(spec, ["fd00::1", "fd00::2"]), 1)[0]
    assert env["JAX_COORDINATOR_ADDRESS"] == "[fd00::1]:29500"


# -- jax ----------------------------------------------------------------------------------------------------


def test_jax_process_ids_are_dense_with_one_coordinator() -> None:
    spec = DistributedSpec(framework="jax", workers=3)
    members = gang(spec)
    envs = [e[0] for e in all_envs(spec, members)]
    assert sorted(int(e["JAX_PROCESS_ID"]) for e in envs) == [0, 1, 2]
    assert {e["JAX_COORDINATOR_ADDRESS"] for e in envs} == {f"{members[0].host}:{members[0].port}"}
    assert {e["JAX_NUM_PROCESSES"] for e in envs} == {"3"}
    for e in envs:
        for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
            assert e["KILN_" + name] == e[name]
        assert e["KILN_WORKER_INDEX"] == e["JAX_PROCESS_ID"]


# -- mpi ----------------------------------------------------------------------------------------------------


def _slots(text: str, implementation: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        if implementation == "openmpi":
            host, slots = line.split(" slots=")
        else:
            host, slots = line.rsplit(":", 1)
        out[host] = int(slots)
    return out


@pytest.mark.parametrize("implementation", ["openmpi", "mpich"])
@pytest.mark.parametrize("local", [False, True])
def test_mpi_hostfile_slots_sum_to_np(implementation: str, local: bool) -> None:
    spec = DistributedSpec(framework="mpi", workers=3, procs_per_worker=2, mpi_implementation=implementation)
    members = gang(spec, ["127.0.0.1"] * 3 if local else None)
    text = hostfile_text(spec, members)
    slots = _slots(text, implementation)
    assert sum(slots.values()) == 6
    assert len(slots) == (1 if local else 3)  # a local gang's members share one host line
    envs = all_envs(spec, members, hostfile="/jobs/j/hostfile")
    assert [len(e) for e in envs] == [1, 1, 1]
    launcher = envs[0][0]
    assert launcher["KILN_MPI_HOSTFILE"] == "/jobs/j/hostfile"
    argv = shlex.split(launcher["KILN_MPI_LAUNCHER"])
    np_flag = "-np" if implementation == "openmpi" else "-n"
    assert int(argv[argv.index(np_flag) + 1]) == sum(slots.values())
    assert "/jobs/j/hostfile" in argv
    for other in envs[1:]:
        assert "KILN_MPI_LAUNCHER" not in other[0] and "KILN_MPI_HOSTFILE" not in other[0]
        assert other[0].keys() >= COMMON


def test_mpi_launchers_and_hostfile_syntax() -> None:
    openmpi = DistributedSpec(framework="mpi", workers=2, procs_per_worker=4)
    mpich = DistributedSpec(framework="mpi", workers=2, procs_per_worker=4, mpi_implementation="mpich")
    assert mpi_launcher_argv(openmpi, "/h f") == ["mpirun", "--hostfile", "/h f", "-np", "8", "--allow-run-as-root"]
    assert mpi_launcher_argv(mpich, "/h") == ["mpiexec", "-f", "/h", "-n", "8"]
    env = member_env(JOB, openmpi, gang(openmpi), 0, hostfile="/h f")[0]
    assert env["KILN_MPI_LAUNCHER"] == "mpirun --hostfile '/h f' -np 8 --allow-run-as-root"
    assert hostfile_text(openmpi, gang(openmpi, ["a", "b"])) == "a slots=4\nb slots=4\n"
    assert hostfile_text(mpich, gang(mpich, ["a", "b"])) == "a:4\nb:4\n"


def test_mpi_launcher_needs_the_hostfile() -> None:
    spec = DistributedSpec(framework="mpi", workers=2)
    with pytest.raises(ValueError, match="hostfile"):
        member_env(JOB, spec, gang(spec), 0)
    assert member_env(JOB, spec, gang(spec), 1)[0]["KILN_ROLE"] == "worker"  # the others need none
