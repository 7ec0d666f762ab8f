"""The pieces of a distributed job (a gang) that its pods receive besides the manifests: the rendezvous
environment of every process as env files (:func:`gang_env`), the MPI hostfile, and an MPI gang's SSH keys
(:func:`new_ssh_keypair`, mounted from the Secret at ``/etc/kiln/ssh``)."""

from __future__ import annotations

import shlex
from typing import Any

from kiln.backends.kubernetes.inputs import KubeConfig, RenderInput
from kiln.backends.kubernetes.names import HOSTFILE, base_name
from kiln.domain.distributed import DistributedSpec, Member, gang_members, hostfile_text, member_env
from kiln.domain.spec import JobSpec

SSH_KEY_PLACEHOLDER = "REPLACE-WITH-AN-SSH-KEY"


def env_file(values: dict[str, str]) -> str:
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in sorted(values.items()))


def _member_host(base: str, role: str, index: int, cfg: KubeConfig) -> str:
    suffix = f"svc.{cfg.cluster_domain}" if cfg.cluster_domain else "svc"
    return f"{base}-{role}-{index}.{base}.{cfg.namespace}.{suffix}"


def gang_env(job: RenderInput, cfg: KubeConfig) -> tuple[dict[str, str], dict[str, dict[str, str]], str | None]:
    """The distributed env of every process of the gang, split as the pods receive it: ``(shared, files,
    hostfile)`` with ``shared`` the values every process has, ``files`` ``{"ROLE-INDEX-LOCAL.env" values:
    only what differs}``, and the MPI hostfile text (or None)."""
    dist = job.spec.distributed
    assert dist is not None
    base = base_name(job.job_id, job.attempt)
    members = [
        Member(role, index, _member_host(base, role, index, cfg), cfg.rendezvous_port)
        for role, index in gang_members(dist)
    ]
    hostfile = hostfile_text(dist, members) if dist.framework == "mpi" else None
    shared, files = split_member_env(job.job_id, dist, members, HOSTFILE if dist.framework == "mpi" else None)
    return shared, files, hostfile


def split_member_env(
    job_id: str, dist: DistributedSpec, members: list[Member], hostfile: str | None
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """:func:`~kiln.domain.distributed.member_env` of every process of the gang, split as the entrypoint sources
    it: ``(shared, files)``, ``shared`` the values every process has, ``files`` ``{"ROLE-INDEX-LOCAL.env": only
    what differs}`` (also the Slurm backend's, whose members' hosts are only known on the nodes)."""
    per_proc: dict[str, dict[str, str]] = {}
    for me, member in enumerate(members):
        for local, env in enumerate(member_env(job_id, dist, members, me, hostfile=hostfile)):
            per_proc[f"{member.role}-{member.index}-{local}.env"] = env
    all_envs = list(per_proc.values())
    shared = {k: v for k, v in all_envs[0].items() if all(e.get(k) == v for e in all_envs[1:])}
    files = {name: {k: v for k, v in env.items() if k not in shared} for name, env in per_proc.items()}
    return shared, files


def launcher_gang(spec: JobSpec) -> bool:
    dist = spec.distributed
    return dist is not None and (dist.framework == "mpi" or (dist.framework == "tensorflow" and dist.ps > 0))


def ssh_items() -> list[dict[str, Any]]:
    # Readable by the container's user whoever it is: every process in the container is the job's own.
    return [{"key": k, "path": f"ssh/{k}", "mode": 0o444} for k in ("id_ed25519", "id_ed25519.pub", "authorized_keys")]


def new_ssh_keypair() -> tuple[str, str]:
    """A fresh Ed25519 key pair for an MPI gang, ``(private OpenSSH PEM, public OpenSSH line)``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode() + " kiln-mpi\n"
