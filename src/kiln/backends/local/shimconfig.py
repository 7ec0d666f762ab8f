"""What the local executor hands a shim besides the commands: the job's environment (:func:`job_env`), where
each input's files come from (:func:`input_config`, and :func:`mount_config` for mounted ones), and the
directory that makes ``import kiln`` work in any runtime (:func:`job_pylib`)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

import kiln as kiln_package
from kiln.backends.base import Launch, ResolvedInput
from kiln.domain.spec import format_param, param_env_name
from kiln.domain.tracking import TOKEN_ENV as TRACKING_TOKEN_ENV
from kiln.domain.tracking import tracking_env
from kiln.errors import BackendError
from kiln.injob.fusetools import AWS_ENV
from kiln.settings import Settings
from kiln.storage.store import ObjectStore

log = logging.getLogger(__name__)

# Passed through from the server's environment; nothing else is (the server's own secrets stay out of jobs).
# PATH is not: the server's names its own tool directories (/root/.pyenv/shims, /root/.cargo/bin).
PASSTHROUGH_ENV = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # after the runtime's bin dir
STAGE_URL_SECONDS = 6 * 3600
PARAMS_FILE = "params.json"  # in the attempt's directory, beside the notice file


class MountConfig(NamedTuple):
    config: dict[str, Any]  # shim.json's "mount"
    secret: dict[str, Any]  # each member's mount-secret.json (mode 0600)


def job_env(
    launch: Launch,
    pylib: Path | None,
    bin_dir: str | None,
    dirs: dict[str, Path],
    notice: Path,
    cpus: float,
    gpus: tuple[int, ...],
) -> dict[str, str]:
    """The environment of the job's processes in one slot (``cpus``, ``gpus``): a few of the server's variables,
    a PATH of the runtime's bin dir (its venv's, or its interpreter's) and the system's, the spec's ``env``,
    then Kiln's ``KILN_*`` (which the spec cannot override)."""
    env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    env["PATH"] = f"{bin_dir}:{SYSTEM_PATH}" if bin_dir else SYSTEM_PATH
    if bin_dir and (Path(bin_dir).parent / "pyvenv.cfg").exists():
        env["VIRTUAL_ENV"] = str(Path(bin_dir).parent)
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "PIP_TARGET": str(dirs["site"]),
            # The job's own pip installs first; then `import kiln` for kiln.log (standard library only).
            "PYTHONPATH": f"{dirs['site']}:{pylib}" if pylib else str(dirs["site"]),
            "OMP_NUM_THREADS": str(max(1, int(cpus))),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
        }
    )
    env.update(launch.spec.env)
    env.update(
        {
            "KILN_JOB_ID": launch.job_id,
            "KILN_ATTEMPT": str(launch.attempt),
            "KILN_WORK_DIR": str(dirs["work"]),
            "KILN_OUTPUT_DIR": str(dirs["outputs"]),
            "KILN_CHECKPOINT_DIR": str(dirs["checkpoints"]),
            "KILN_NUM_CPUS": f"{cpus:g}",
            "KILN_NUM_GPUS": str(len(gpus)),
            "KILN_NOTICE_FILE": str(notice),
            "KILN_METRICS_DIR": str(dirs["metrics"]),
            "KILN_TENSORBOARD_DIR": str(dirs["tensorboard"]),
            "KILN_WORKER_INDEX": "0",
            "KILN_NUM_WORKERS": "1",
            "KILN_PARAMS_FILE": str(notice.parent / PARAMS_FILE),
            **{param_env_name(k): format_param(v) for k, v in launch.spec.params.items()},
        }
    )
    if launch.spec.metrics.watch:  # kiln.log writes these metrics' points at once (a study's objective)
        env["KILN_WATCH_METRICS"] = ",".join(launch.spec.metrics.watch)
    if launch.job_token:
        env["KILN_JOB_TOKEN"] = launch.job_token
    if launch.api_endpoint:
        env["KILN_ENDPOINT"] = launch.api_endpoint
        if launch.job_token and "MLFLOW_TRACKING_URI" not in launch.spec.env:  # the team's own tracker wins
            env.update(tracking_env(launch.api_endpoint, launch.job_id))  # MLflow's client: the job's run
            env[TRACKING_TOKEN_ENV] = launch.job_token
    return env


def input_config(store: ObjectStore, item: ResolvedInput) -> dict[str, Any]:
    """What the shim stages: each blob's source is its local file (a local store) or a presigned URL. A mounted
    input's files need none: the shim finds each blob by its hash in the mount (:func:`mount_config`)."""
    ttl = STAGE_URL_SECONDS  # staging a large dataset can take a while; the URLs are only in the job's config
    files: list[dict[str, Any]] = []
    for f in item.files:
        if item.mode == "mount":
            files.append({"path": f.path, "size": f.size, "sha256": f.sha256})
            continue
        local = store.local_path(f.key)
        source = str(local) if local is not None else store.presign_get(f.key, ttl)
        if source is None:
            raise BackendError(f"input {item.name}@{item.version}: no way to read {f.path} from the store")
        files.append({"path": f.path, "size": f.size, "sha256": f.sha256, "source": source})
    return {
        "name": item.name,
        "version": item.version,
        "path": item.path,
        "env": item.env,
        "mode": item.mode,
        "files": files,
    }


def mount_config(store: ObjectStore, settings: Settings, inputs: tuple[ResolvedInput, ...]) -> MountConfig | None:
    """How the shim mounts the ``mode: mount`` inputs (the organisation's blob prefix, read-only), and the
    credentials it needs for that, kept apart (the shim deletes them once mounted); None when nothing is mounted."""
    prefixes = {item.blob_prefix for item in inputs if item.mode == "mount"}
    if not prefixes:
        return None
    if len(prefixes) > 1 or "" in prefixes:
        raise BackendError(f"mounted inputs must come from one organisation's blobs, not {sorted(prefixes)}")
    prefix = prefixes.pop()
    config: dict[str, Any] = {"tools": settings.mount_tool_list, "cache_bytes": settings.mount_cache_bytes}
    secret: dict[str, Any] = {}
    local = store.local_path(prefix)
    if local is not None:
        config["source"] = {"kind": "local", "path": str(local)}
    elif store.is_s3:
        bucket, _, root = store.root.partition("/")
        config["source"] = {
            "kind": "s3",
            "bucket": bucket,
            "prefix": f"{root}/{prefix}" if root else prefix,
            "endpoint": settings.storage_endpoint_url,
            "region": settings.storage_region,
        }
        if settings.storage_access_key_id and settings.storage_secret_access_key is not None:
            secret = {
                "access_key_id": settings.storage_access_key_id,
                "secret_access_key": settings.storage_secret_access_key.get_secret_value(),
            }
        else:  # the usual AWS chain, as the server itself uses it
            secret = {"env": {k: os.environ[k] for k in AWS_ENV if k in os.environ}}
    else:
        raise BackendError(f"mode: mount needs a local or S3 object store, not {store.display}", retryable=False)
    return MountConfig(config, secret)


def write_secret(path: Path, secret: dict[str, Any]) -> None:
    """The mount's credentials for one shim, readable by this user only (created so, never widened)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(secret, fh)


def job_pylib(root: Path) -> Path | None:
    """A directory holding only a ``kiln`` link to this package, put on jobs' PYTHONPATH so that ``import kiln;
    kiln.log(...)`` works in any runtime (``import kiln`` is cheap and ``kiln.log`` needs the standard library
    only) without exposing the server's other packages to the job."""
    package = Path(kiln_package.__file__).resolve().parent
    link = root / "kiln"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and link.resolve() == package:
            return root
        tmp = root / f".kiln-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(package, target_is_directory=True)
        os.replace(tmp, link)
        return root
    except OSError as exc:
        log.warning("cannot link the kiln package for jobs (%s); kiln.log works only where kiln is installed", exc)
        return None
