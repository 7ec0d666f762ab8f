"""Distributed training: the gang spec and the rendezvous environment of every process in the gang.

A distributed job runs as a *gang* of members, one shim each: ``workers`` workers and, for TensorFlow only,
``ps`` parameter servers. ``resources`` in the job spec are per worker. Each member has an address (``host``,
``port``) that the others can reach: on the local executor every host is ``127.0.0.1`` and each member has a
port of its own; on Kubernetes the host is a DNS name. The backend allocates the members, then asks
:func:`member_env` for the environment of each process a member runs and merges it over the job's own
environment (the shim's ``procs`` list). Everything here is pure: no I/O, no clock.

Environment per framework (``W`` workers, ``P`` procs_per_worker, ``K`` parameter servers, worker 0 at
``H0:P0``; ``w`` is the member's index within its role, ``l`` the local rank of a process within a worker):

=============  ==================================  ====================================================
framework      variable                            value
=============  ==================================  ====================================================
all            KILN_JOB_ID                         the job id
all            KILN_ROLE                           ``worker`` or ``ps``
all            KILN_WORKER_INDEX                   ``w``: the member's index within its role
all            KILN_NUM_WORKERS                    ``W``
pytorch        MASTER_ADDR / MASTER_PORT           ``H0`` / ``P0``
pytorch        WORLD_SIZE                          ``W*P``
pytorch        RANK                                ``w*P + l``
pytorch        LOCAL_RANK                          ``l``
pytorch        LOCAL_WORLD_SIZE                    ``P``
pytorch        GROUP_RANK / NODE_RANK              ``w``
pytorch        GROUP_WORLD_SIZE                    ``W``
pytorch        ROLE_NAME                           ``default``
pytorch        ROLE_RANK / ROLE_WORLD_SIZE         ``w*P + l`` / ``W*P`` (one role: same as RANK, WORLD_SIZE)
pytorch        TORCHELASTIC_RUN_ID                 the job id
pytorch        TORCHELASTIC_RESTART_COUNT          ``0``
pytorch        TORCHELASTIC_MAX_RESTARTS           ``0`` (Kiln restarts the whole gang: max_restarts)
tensorflow     TF_CONFIG                           ``{"cluster": {"chief": [..], "worker": [..], "ps": [..]},
                                                   "task": {"type": .., "index": ..}}``; worker 0 is the chief,
                                                   workers 1.. are ``worker`` 0..; ``ps`` only when K > 0,
                                                   ``worker`` only when W > 1
jax            JAX_COORDINATOR_ADDRESS             ``H0:P0`` (read by ``jax.distributed.initialize()``)
jax            JAX_NUM_PROCESSES                   ``W``
jax            JAX_PROCESS_ID                      ``w``
jax            KILN_JAX_COORDINATOR_ADDRESS,       the same three values under Kiln's names
               KILN_JAX_NUM_PROCESSES,
               KILN_JAX_PROCESS_ID
mpi            KILN_MPI_HOSTFILE                   member 0 only: the hostfile's path (:func:`hostfile_text`)
mpi            KILN_MPI_LAUNCHER                   member 0 only: ``mpirun --hostfile F -np W*P
                                                   --allow-run-as-root`` (openmpi) or ``mpiexec -f F -n W*P``
                                                   (mpich)
=============  ==================================  ====================================================

Decisions:

- ``procs_per_worker > 1`` is for ``pytorch`` (one process per GPU, as ``torchrun --nproc-per-node``: the
  shim starts them) and ``mpi`` (slots per host: ``mpirun`` starts them). TensorFlow and JAX run one process
  per worker that drives all of the worker's GPUs; more processes there is an error naming the field.
- ``ps`` is TensorFlow only, and needs ``workers >= 2`` (ParameterServerStrategy needs a chief, the
  coordinator, and at least one worker).
- ``NODE_RANK`` is not set by torchrun, but PyTorch Lightning and others read it; it equals ``GROUP_RANK``.
  ``TORCHELASTIC_USE_AGENT_STORE`` is left unset: there is no elastic agent, rank 0 hosts the TCP store on
  ``MASTER_PORT`` as with ``init_method="env://"``. ``OMP_NUM_THREADS`` and ``TORCH_NCCL_ASYNC_ERROR_HANDLING``
  are not overridden, so the job's own settings of them stand.
- JAX reads only ``JAX_COORDINATOR_ADDRESS`` from the environment; ``num_processes`` and ``process_id`` must be
  passed (outside Slurm, Open MPI, TPU and Kubernetes auto-detection). ``JAX_NUM_PROCESSES`` and
  ``JAX_PROCESS_ID`` are the names other launchers (Kubeflow Trainer) use for them, so the one-liner is::

      jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                                 process_id=int(os.environ["JAX_PROCESS_ID"]))

- MPI: Kiln does not rewrite the command. Member 0 (the launcher) runs the user's command, which is written
  ``$KILN_MPI_LAUNCHER python train.py`` (extra mpirun flags may follow the variable); the other members only
  host slots (on Kubernetes: an sshd the launcher reaches) and do not run the command. Hosts that appear more
  than once (every member of a local gang is ``127.0.0.1``) are merged in the hostfile, slots summed.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

Framework = Literal["pytorch", "tensorflow", "jax", "mpi"]
MULTI_PROCESS_FRAMEWORKS = ("pytorch", "mpi")


class DistributedSpec(BaseModel):
    """A gang of ``workers`` (plus TensorFlow parameter servers) that rendezvous with each other."""

    model_config = ConfigDict(extra="forbid")

    framework: Framework = Field(description="Whose launcher's environment the processes get.")
    workers: int = Field(1, ge=1, le=256, description="Gang size; the job's resources are per worker.", strict=True)
    procs_per_worker: int = Field(
        1, ge=1, le=64, description="Processes per worker (pytorch: one per GPU; mpi: slots per host).", strict=True
    )
    ps: int = Field(0, ge=0, le=64, description="TensorFlow parameter servers.", strict=True)
    mpi_implementation: Literal["openmpi", "mpich"] = Field(
        "openmpi", description="The MPI whose launcher and hostfile syntax are used (mpi only)."
    )

    @field_validator("procs_per_worker")
    @classmethod
    def _procs(cls, value: int, info: ValidationInfo) -> int:
        framework = info.data.get("framework")
        if value > 1 and framework is not None and framework not in MULTI_PROCESS_FRAMEWORKS:
            raise ValueError(
                f"procs_per_worker > 1 applies only to pytorch and mpi; a {framework} worker runs one process "
                "that uses all of its GPUs (use more workers instead)"
            )
        return value

    @field_validator("ps")
    @classmethod
    def _ps(cls, value: int, info: ValidationInfo) -> int:
        framework = info.data.get("framework")
        if value > 0 and framework is not None and framework != "tensorflow":
            raise ValueError(f"ps (parameter servers) applies only to tensorflow, not {framework}")
        workers = info.data.get("workers")
        if value > 0 and workers is not None and workers < 2:
            raise ValueError("ps > 0 needs workers >= 2: a chief (worker 0) and at least one worker")
        return value

    @field_validator("mpi_implementation")
    @classmethod
    def _mpi(cls, value: str, info: ValidationInfo) -> str:
        framework = info.data.get("framework")
        # The default is written out with the spec and read back: only a non-default choice is an error.
        if framework is not None and framework != "mpi" and value != "openmpi":
            raise ValueError(f"mpi_implementation applies only to framework mpi, not {framework}")
        return value

    @property
    def world_size(self) -> int:
        """Processes in the whole gang that take part in training (parameter servers not counted)."""
        return self.workers * self.procs_per_worker


@dataclass(frozen=True)
class Member:
    """One gang member (one shim): a worker or a TensorFlow parameter server."""

    role: str  # "worker" | "ps"
    index: int  # index within its role
    host: str  # the address the others reach it at
    port: int  # its own free port (rendezvous / TF server port)

    def __post_init__(self) -> None:
        if self.role not in ("worker", "ps"):
            raise ValueError(f"member role must be 'worker' or 'ps', not {self.role!r}")
        if self.index < 0:
            raise ValueError(f"member index must be >= 0, not {self.index}")
        if not self.host or any(c.isspace() for c in self.host):
            raise ValueError(f"member host must be a non-empty address without spaces, not {self.host!r}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"member port must be 1..65535, not {self.port}")

    @property
    def address(self) -> str:
        """``host:port`` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


def gang_members(spec: DistributedSpec) -> list[tuple[str, int]]:
    """``[(role, index)]`` of every member, in the fixed order: workers 0..W-1, then ps 0..K-1."""
    return [("worker", i) for i in range(spec.workers)] + [("ps", i) for i in range(spec.ps)]


def mpi_launcher_argv(spec: DistributedSpec, hostfile: str) -> list[str]:
    """The launcher command prefix of the spec's MPI implementation, for ``workers * procs_per_worker`` ranks."""
    np = str(spec.world_size)
    if spec.mpi_implementation == "mpich":
        return ["mpiexec", "-f", hostfile, "-n", np]
    return ["mpirun", "--hostfile", hostfile, "-np", np, "--allow-run-as-root"]


def hostfile_text(spec: DistributedSpec, members: Sequence[Member]) -> str:
    """The MPI hostfile: one line per distinct worker host with its slots (openmpi ``host slots=M``, mpich
    ``host:M``). Members on the same host are merged, so the slots always sum to ``workers * procs_per_worker``."""
    _check_members(spec, members)
    slots: dict[str, int] = {}
    for member in members:
        if member.role == "worker":
            slots[member.host] = slots.get(member.host, 0) + spec.procs_per_worker
    if spec.mpi_implementation == "mpich":
        return "".join(f"{host}:{n}\n" for host, n in slots.items())
    return "".join(f"{host} slots={n}\n" for host, n in slots.items())


def member_env(
    job_id: str,
    spec: DistributedSpec,
    members: Sequence[Member],
    me: int,
    *,
    hostfile: str | None = None,
) -> list[dict[str, str]]:
    """The environment of each process that ``members[me]`` runs: ``procs_per_worker`` dicts for a pytorch
    worker, one otherwise. ``members`` must follow :func:`gang_members`; ``hostfile`` (a path) is required for
    member 0 of an mpi gang. The dicts hold only the gang's variables, to be merged over the job's environment.
    """
    _check_members(spec, members)
    if not 0 <= me < len(members):
        raise ValueError(f"member {me} is not in a gang of {len(members)}")
    member = members[me]
    chief = members[0]
    common = {
        "KILN_JOB_ID": job_id,
        "KILN_ROLE": member.role,
        "KILN_WORKER_INDEX": str(member.index),
        "KILN_NUM_WORKERS": str(spec.workers),
    }
    if spec.framework == "pytorch":
        procs = spec.procs_per_worker
        world = spec.world_size
        out = []
        for local in range(procs):
            rank = member.index * procs + local
            out.append(
                {
                    **common,
                    "MASTER_ADDR": chief.host,
                    "MASTER_PORT": str(chief.port),
                    "WORLD_SIZE": str(world),
                    "RANK": str(rank),
                    "LOCAL_RANK": str(local),
                    "LOCAL_WORLD_SIZE": str(procs),
                    "GROUP_RANK": str(member.index),
                    "NODE_RANK": str(member.index),
                    "GROUP_WORLD_SIZE": str(spec.workers),
                    "ROLE_NAME": "default",
                    "ROLE_RANK": str(rank),
                    "ROLE_WORLD_SIZE": str(world),
                    "TORCHELASTIC_RUN_ID": job_id,
                    "TORCHELASTIC_RESTART_COUNT": "0",
                    "TORCHELASTIC_MAX_RESTARTS": "0",
                }
            )
        return out
    if spec.framework == "tensorflow":
        return [{**common, "TF_CONFIG": tf_config(spec, members, me)}]
    if spec.framework == "jax":
        jax = {
            "JAX_COORDINATOR_ADDRESS": chief.address,
            "JAX_NUM_PROCESSES": str(spec.workers),
            "JAX_PROCESS_ID": str(member.index),
        }
        return [{**common, **jax, **{"KILN_" + k: v for k, v in jax.items()}}]
    # mpi: only the launcher (member 0) runs the command; mpirun starts every rank.
    if me != 0:
        return [common]
    if not hostfile:
        raise ValueError("an mpi gang's member 0 (the launcher) needs the hostfile path")
    return [
        {
            **common,
            "KILN_MPI_HOSTFILE": hostfile,
            "KILN_MPI_LAUNCHER": shlex.join(mpi_launcher_argv(spec, hostfile)),
        }
    ]


def tf_config(spec: DistributedSpec, members: Sequence[Member], me: int) -> str:
    """``TF_CONFIG`` of member ``me``: worker 0 is the ``chief``, workers 1.. are ``worker`` 0.., then ``ps``."""
    workers = [m for m in members if m.role == "worker"]
    ps = [m for m in members if m.role == "ps"]
    cluster: dict[str, list[str]] = {"chief": [workers[0].address]}
    if len(workers) > 1:
        cluster["worker"] = [m.address for m in workers[1:]]
    if ps:
        cluster["ps"] = [m.address for m in ps]
    member = members[me]
    if member.role == "ps":
        task = {"type": "ps", "index": member.index}
    elif member.index == 0:
        task = {"type": "chief", "index": 0}
    else:
        task = {"type": "worker", "index": member.index - 1}
    return json.dumps({"cluster": cluster, "task": task}, separators=(",", ":"))


def _check_members(spec: DistributedSpec, members: Sequence[Member]) -> None:
    want = gang_members(spec)
    got = [(m.role, m.index) for m in members]
    if got != want:
        raise ValueError(f"members must be {want} in that order (gang_members), got {got}")
