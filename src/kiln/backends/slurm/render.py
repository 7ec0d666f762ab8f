"""Render one attempt of a Kiln job as ONE sbatch script: a pure function, no cluster, no Slurm command.

:func:`render` turns the job spec that runs on the local executor and on Kubernetes, unchanged, into the text of a
self-contained batch script that a controller hands to ``sbatch`` or that ``kiln jobs render --backend slurm``
prints. docs/slurm.md has the mapping table; in short:

- ``#SBATCH`` directives: ``--job-name=kiln-<job id>-a<attempt>`` (an operator finds it in ``squeue``), one task
  per node (``--nodes`` = the gang's members, ``--ntasks-per-node=1``), ``--cpus-per-task``, ``--mem`` (MiB),
  ``--gres=gpu[:type]:N``, ``--time`` (the timeout, rounded up to minutes), ``--partition``/``--account`` and
  ``--qos`` (from the priority) from the settings, ``--constraint``/``--nodelist`` from the node selector,
  ``--output``/``--error`` on the node, ``--export=NONE`` (the server's environment, its secrets with it, never
  reaches the job) and ``--no-requeue`` (Kiln restarts attempts itself: ``max_restarts``), then the operator's
  ``extra_directives``;
- the job's environment as ``export`` lines, as the other backends give it (``KILN_*``, the spec's ``env``,
  parameters), the job token included (a placeholder unless given);
- an archive, base64 in a here-document, that the script writes to the node's scratch directory and runs
  with the nodes' Python: ``slurmnode.py`` (its ``__main__``) and the programs it runs.

**Which in-job programs, and why not the local executor's shim.** The archive carries the Kubernetes backend's pod
programs unchanged — ``podfetch.py`` (checkpoints, code, inputs, with the job token), ``podsync.py`` (checkpoints
every ``checkpoint_sync_seconds`` and the outputs at the end, with the job token) and ``entrypoint.sh`` (prepare,
the command once per local process, finish, signals to the whole tree, the wait for the upload) — plus the metrics
SDK. They were made for exactly this situation: a machine that does not see the server's disk and talks to it only
through ``/api/v1`` with the job token, and they are already tested against a real server. The local executor's
shim (``kiln/injob/shim.py``) is the other candidate, but everything it reports goes into files the server reads
on its own disk (``exit.json``, ``status.json``, the job log, metric spools, a Unix datagram to wake it), which
a Slurm node cannot write; running it there would need a second channel for each of those files. So on Slurm, as
in a pod, the exit status comes from Slurm (``sacct``/``scontrol``: the controller's work), metrics from
``kiln.log`` (posted with the token) and from the log the server receives, and the checkpoint directory, the
notice file's path and the outputs behave as in a pod.

**What a runtime is on Slurm.** There are no images: ``runtime.image`` is refused (no container runtime is
assumed on the nodes). ``runtime.python`` is the absolute path of an interpreter on the nodes; its directory goes
first on the job's ``PATH``. A catalog ``runtime.framework`` is an interpreter the operator installed on the nodes
and named in ``KILN_SLURM_RUNTIMES`` (by the catalog entry's name, then by framework); the default runtime
(``python``) is ``KILN_SLURM_PYTHON`` (``python3`` on the node's ``PATH`` by default), which also runs Kiln's own
programs.

**A gang.** ``srun`` starts one member per node (``$SLURM_PROCID`` = its place: workers, then parameter servers)
after ``sbcast`` copied the archive to every node. The rendezvous environment is exactly
:func:`kiln.domain.distributed.member_env`'s, split into env files as on Kubernetes
(:func:`kiln.backends.kubernetes.gang.split_member_env`), with member ``i``'s host written ``@KILN_HOST_i@``: the
nodes are only known once the job runs, and ``slurmnode.py`` puts the ``i``-th host of ``$SLURM_JOB_NODELIST``
there. Every member's port is :func:`rendezvous_port` (one per job and attempt, so two gangs sharing a node
differ). MPI is refused for now: ``mpirun`` in a Slurm allocation starts its ranks through Slurm itself, a launch
this one-task-per-worker shape does not fit yet.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import re
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kiln.backends.kubernetes.entrypoint import entrypoint
from kiln.backends.kubernetes.gang import env_file, split_member_env
from kiln.backends.kubernetes.render import TOKEN_PLACEHOLDER
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.domain.distributed import Member, gang_members
from kiln.domain.spec import JobSpec, command_argv, format_param, param_env_name
from kiln.domain.tracking import TOKEN_ENV as TRACKING_TOKEN_ENV
from kiln.domain.tracking import tracking_env
from kiln.errors import InvalidInput
from kiln.settings import SlurmSettings

__all__ = ["TOKEN_PLACEHOLDER", "SlurmJob", "directives", "job_name", "render", "rendezvous_port"]

MIB = 1024**2
PORT_LOW, PORT_COUNT = 20000, 12000  # below Linux's ephemeral ports (32768-60999)
HOST_PLACEHOLDER = "@KILN_HOST_{}@"  # slurmnode.py's
BACKEND = "slurm"  # the value of the node_selector key kiln.io/backend that can match here
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_FEATURE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_GRES_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_HERE = Path(__file__).parent
_POD_PROGRAMS = _HERE.parent / "kubernetes"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # every archive member's time: the same input renders the same script


@dataclass(frozen=True)
class SlurmJob:
    """One attempt of one job, as the script needs it."""

    job_id: str
    org_id: str
    attempt: int
    spec: JobSpec
    endpoint: str = "http://kiln:8080"  # the Kiln API as the nodes reach it
    token: str | None = None  # the attempt's job token; None: TOKEN_PLACEHOLDER
    code_sha256: str | None = None  # the job's code bundle; None: no code is fetched
    checkpoint_sync_seconds: float = 300.0  # the server's KILN_CHECKPOINT_SYNC_SECONDS


def job_name(job_id: str, attempt: int) -> str:
    """``kiln-<job id>-a<attempt>``: the Slurm job's name."""
    return f"kiln-{job_id}-a{attempt}"


def rendezvous_port(job_id: str, attempt: int) -> int:
    """Every member's rendezvous port (MASTER_PORT, TF, JAX): derived from the job and attempt, so it is the same
    on every node without asking anyone, and two gangs that share a node almost never collide."""
    digest = hashlib.sha256(job_name(job_id, attempt).encode()).digest()
    return PORT_LOW + int.from_bytes(digest[:4], "big") % PORT_COUNT


def _refuse(message: str, field: str) -> InvalidInput:
    return InvalidInput(message, details={"field": field})


def _check(job: SlurmJob) -> None:
    spec = job.spec
    for value, what in ((job.job_id, "job id"), (job.org_id, "organisation id")):
        if not _ID.fullmatch(value):
            raise InvalidInput(f"{what} {value!r}: letters, digits and _.- only")
    if job.attempt < 0:
        raise InvalidInput("attempt must be >= 0")
    if spec.runtime.image:
        raise _refuse(
            f"runtime.image {spec.runtime.image!r}: Slurm nodes run no container images here; use runtime.python "
            "(an interpreter on the nodes) or a catalog framework the operator set up (KILN_SLURM_RUNTIMES)",
            "spec.runtime.image",
        )
    if spec.distributed is not None and spec.distributed.framework == "mpi":
        raise _refuse(
            "distributed.framework mpi is not supported on Slurm yet: mpirun starts its ranks through Slurm "
            "itself; use pytorch, tensorflow or jax",
            "spec.distributed.framework",
        )
    if spec.network == "none":
        raise _refuse(
            "network: none cannot be enforced on Slurm nodes (Kiln sets up no network namespace there); use "
            "isolated or host",
            "spec.network",
        )
    for i, item in enumerate(spec.inputs):
        if item.job is not None:
            raise _refuse(
                f"inputs[{i}].job: another job's outputs are inputs on the local executor only for now; register "
                "them as a dataset or a model version and read that",
                f"spec.inputs.{i}.job",
            )
        if item.mode == "mount":
            raise _refuse(
                f"inputs[{i}] ({item.ref}): mode: mount is not available on Slurm (no FUSE is assumed on the "
                "nodes); use mode: stage",
                f"spec.inputs.{i}.mode",
            )


def _interpreter(spec: JobSpec, settings: SlurmSettings) -> str:
    """The job's Python on the nodes (see the module's docstring: what a runtime is on Slurm)."""
    runtime = spec.runtime
    if runtime.python:
        if not runtime.python.startswith("/"):
            raise _refuse(
                f"runtime.python {runtime.python!r}: on Slurm, the absolute path of an interpreter on the nodes",
                "spec.runtime.python",
            )
        return runtime.python
    entry = DEFAULT_CATALOG.resolve(runtime.framework or "python", runtime.version)
    for key in (entry.name, entry.framework):
        if key in settings.runtimes:
            return settings.runtimes[key]
    if entry.framework == "python":
        return settings.python
    raise _refuse(
        f"runtime {entry.name}: no interpreter for it on the Slurm nodes; the operator names one in "
        f'KILN_SLURM_RUNTIMES (e.g. {{"{entry.framework}": "/opt/venvs/{entry.framework}/bin/python"}})',
        "spec.runtime.framework",
    )


def _placement(spec: JobSpec) -> tuple[list[str], str | None]:
    """The node selector as Slurm node features (``--constraint``) and a node (``--nodelist``)."""
    features: list[str] = []
    node: str | None = None
    for key, value in spec.node_selector.items():
        if key == "kiln.io/backend":  # the local executor's own node label
            if value != BACKEND:
                raise _refuse(f"node_selector: kiln.io/backend={value} can never match on Slurm", "spec.node_selector")
        elif key == "kiln.io/hostname":
            if not _ID.fullmatch(value):
                raise _refuse(f"node_selector: kiln.io/hostname={value!r} is not a node name", "spec.node_selector")
            node = value
        elif value != "true" or not _FEATURE.fullmatch(key):
            raise _refuse(
                f"node_selector: {key}={value}: Slurm nodes have features (names), not labels with values; select "
                'the feature NAME with "NAME": "true" (letters, digits and _.+-)',
                "spec.node_selector",
            )
        else:
            features.append(key)
    return features, node


def directives(job: SlurmJob, settings: SlurmSettings) -> list[str]:
    """The script's ``#SBATCH`` options, in order (without the ``#SBATCH`` prefix)."""
    spec, res = job.spec, job.spec.resources
    name = job_name(job.job_id, job.attempt)
    out = [
        f"--job-name={name}",
        f"--nodes={spec.gang_size}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={max(1, math.ceil(res.cpus))}",
    ]
    if res.memory is not None:
        out.append(f"--mem={math.ceil(res.memory / MIB)}M")
    if res.gpus:
        gres = "gpu"
        if res.gpu_type:
            gpu_type = settings.gpu_types.get(res.gpu_type, res.gpu_type)
            if not _GRES_TYPE.fullmatch(gpu_type):
                raise _refuse(
                    f"resources.gpu_type {res.gpu_type!r} is not a Slurm GRES type (letters, digits and _.+-); "
                    "the operator maps it in KILN_SLURM_GPU_TYPES",
                    "spec.resources.gpu_type",
                )
            gres += f":{gpu_type}"
        out.append(f"--gres={gres}:{res.gpus}")
    if spec.timeout is not None:
        out.append(f"--time={max(1, math.ceil(spec.timeout / 60))}")
    if settings.partition:
        out.append(f"--partition={settings.partition}")
    if settings.account:
        out.append(f"--account={settings.account}")
    if spec.priority in settings.qos:
        out.append(f"--qos={settings.qos[spec.priority]}")
    features, node = _placement(spec)
    if features:
        out.append(f"--constraint={'&'.join(features)}")
    if node:
        out.append(f"--nodelist={node}")
    out += [
        f"--chdir={settings.scratch_dir or settings.log_dir}",
        f"--output={settings.log_dir}/{name}.%j.out",
        f"--error={settings.log_dir}/{name}.%j.err",
        "--export=NONE",
        "--no-requeue",
        *settings.extra_directives,
    ]
    return out


def _job_env(job: SlurmJob, settings: SlurmSettings) -> dict[str, str]:
    """What every member's processes get (the directories, the member and the rendezvous are added on the node)."""
    spec, res = job.spec, job.spec.resources
    dist = spec.distributed
    env = {
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": str(max(1, int(res.cpus))),
        **spec.env,
        "KILN_JOB_ID": job.job_id,
        "KILN_ATTEMPT": str(job.attempt),
        "KILN_NUM_CPUS": f"{res.cpus:g}",
        "KILN_NUM_GPUS": str(res.gpus),
        "KILN_ENDPOINT": job.endpoint.rstrip("/"),
        "KILN_WORKER_INDEX": "0",
        "KILN_NUM_WORKERS": str(dist.workers if dist else 1),
        "KILN_SYNC_TIMEOUT": str(settings.upload_timeout),
        "KILN_CHECKPOINT_SYNC_SECONDS": f"{job.checkpoint_sync_seconds:g}",
        **{param_env_name(k): format_param(v) for k, v in spec.params.items()},
    }
    if spec.metrics.watch:  # kiln.log sends these metrics' points at once (a study's objective)
        env["KILN_WATCH_METRICS"] = ",".join(spec.metrics.watch)
    if "MLFLOW_TRACKING_URI" not in spec.env:  # MLflow's client logs into the job's run (token: the job's)
        env.update(tracking_env(job.endpoint, job.job_id))
    return env


def _archive(job: SlurmJob) -> bytes:
    """The zip the nodes run: slurmnode.py as __main__, the pod programs, node.json, params and env files."""
    spec, dist = job.spec, job.spec.distributed
    members = gang_members(dist) if dist is not None else [("worker", 0)]
    prepare = shlex.join(command_argv(spec.prepare_command)) if spec.prepare_command else None
    finish = shlex.join(command_argv(spec.finish_command)) if spec.finish_command else None
    node = {
        "members": [list(m) for m in members],
        "procs": dist.procs_per_worker if dist is not None and dist.framework == "pytorch" else 1,
        "code_sha256": job.code_sha256 or "",
        "inputs": [
            {
                "source": {"dataset": item.dataset} if item.dataset is not None else {"model": item.model},
                # The local executor's rule: an input's path is taken inside the job's work dir.
                "path": "/".join(p for p in item.where.split("/") if p),
                "env": item.env,
            }
            for item in spec.inputs
        ],
    }
    files: dict[str, str] = {
        "__main__.py": (_HERE / "slurmnode.py").read_text(encoding="utf-8"),
        "node.json": json.dumps(node, sort_keys=True),
        "podfetch.py": (_POD_PROGRAMS / "podfetch.py").read_text(encoding="utf-8"),
        "podsync.py": (_POD_PROGRAMS / "podsync.py").read_text(encoding="utf-8"),
        "entrypoint.sh": entrypoint(prepare, finish),
        "kiln_sdk.py": (_HERE.parents[1] / "injob" / "metrics_sdk.py").read_text(encoding="utf-8"),
        "params.json": json.dumps(spec.params, sort_keys=True),
    }
    if dist is not None:
        port = rendezvous_port(job.job_id, job.attempt)
        gang = [Member(role, index, HOST_PLACEHOLDER.format(i), port) for i, (role, index) in enumerate(members)]
        shared, member_files = split_member_env(job.job_id, dist, gang, None)
        files["gang.env"] = env_file(shared)
        files |= {name: env_file(values) for name, values in member_files.items()}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, text.encode())
    return buffer.getvalue()


def _wrapped(data: bytes, width: int = 76) -> str:
    text = base64.b64encode(data).decode()
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


def render(job: SlurmJob, settings: SlurmSettings) -> str:
    """The sbatch script of one attempt (docs/slurm.md): ``#SBATCH`` directives, the job's environment, and the
    archive of Kiln's in-job programs, which it unpacks and runs on the nodes. InvalidInput, naming the field,
    for a spec Slurm cannot run as asked."""
    _check(job)
    spec = job.spec
    python = _interpreter(spec, settings)
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives(job, settings))]
    lines += [
        f"# Rendered by Kiln (kiln.backends.slurm.render): attempt {job.attempt} of job {job.job_id} of organisation",
        f"# {job.org_id}. What it does: docs/slurm.md. The job token in it is valid only while the attempt runs.",
    ]
    if spec.network == "isolated":
        lines.append("# network: isolated is not enforced on Slurm: the job has its node's network (docs/slurm.md).")
    lines += ["set -u", 'export PATH="${PATH:-/usr/local/bin:/usr/bin:/bin}"']
    lines += [f"export {key}={shlex.quote(value)}" for key, value in _job_env(job, settings).items()]
    lines.append(f"export KILN_JOB_TOKEN={shlex.quote(job.token or TOKEN_PLACEHOLDER)}")
    if "MLFLOW_TRACKING_URI" not in spec.env:
        lines.append(f'export {TRACKING_TOKEN_ENV}="$KILN_JOB_TOKEN"')
    if "/" in python:  # the job's interpreter first on its PATH (a bare name is looked up on the node's PATH)
        lines.append(f'export PATH={shlex.quote(python.rsplit("/", 1)[0])}:"$PATH"')
    scratch = shlex.quote(settings.scratch_dir) if settings.scratch_dir else '"${TMPDIR:-/tmp}"'
    lines += [
        f"kiln_python={shlex.quote(settings.python)}",
        f"export KILN_SLURM_SCRATCH={scratch}",
        'export KILN_SLURM_BATCH_NODE="${SLURMD_NODENAME:-}"',
        'kiln_archive="$KILN_SLURM_SCRATCH/kiln-${SLURM_JOB_ID:?this script runs as a Slurm batch job}.pyz"',
        f"kiln_command=({' '.join(shlex.quote(a) for a in command_argv(spec.command))})",
        "umask 077",
        "\"$kiln_python\" -c 'import base64, sys; sys.stdout.buffer.write(base64.b64decode(sys.stdin.read()))' "
        '> "$kiln_archive" <<\'KILN_ARCHIVE\' || { echo "kiln: cannot write $kiln_archive with $kiln_python" >&2; '
        "exit 1; }",
        _wrapped(_archive(job)),
        "KILN_ARCHIVE",
    ]
    if spec.distributed is None:
        lines.append('"$kiln_python" "$kiln_archive" "${kiln_command[@]}" &')
    else:
        n = spec.gang_size
        cpus = max(1, math.ceil(spec.resources.cpus))
        lines += [
            # Every node gets the archive at the same path; srun then starts one member per node.
            'sbcast --force "$kiln_archive" "$kiln_archive" || { echo "kiln: sbcast failed" >&2; exit 1; }',
            f"srun --export=ALL --kill-on-bad-exit=1 --nodes={n} --ntasks={n} --ntasks-per-node=1 "
            f'--cpus-per-task={cpus} "$kiln_python" "$kiln_archive" "${{kiln_command[@]}}" &',
        ]
    lines += [
        "kiln_child=$!",
        "trap 'kill -TERM \"$kiln_child\" 2>/dev/null' TERM INT",
        'wait "$kiln_child"',
        "kiln_code=$?",
        'while kill -0 "$kiln_child" 2>/dev/null; do wait "$kiln_child"; kiln_code=$?; done',
        'rm -f "$kiln_archive"',
        'exit "$kiln_code"',
    ]
    return "\n".join(lines) + "\n"
