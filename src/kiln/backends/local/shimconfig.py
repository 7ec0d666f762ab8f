"""What the local executor hands a shim besides the commands: the job's environment (:func:`job_env`), where
each input's files come from (:func:`input_config`), and the directory that makes ``import kiln`` work in any
runtime (:func:`job_pylib`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import kiln as kiln_package
from kiln.backends.base import Launch, ResolvedInput
from kiln.errors import BackendError
from kiln.storage.store import ObjectStore

log = logging.getLogger(__name__)

# Passed through from the server's environment; nothing else is (the server's own secrets stay out of jobs).
PASSTHROUGH_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR")
STAGE_URL_SECONDS = 6 * 3600


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
    the runtime's bin dir, the spec's ``env``, then Kiln's ``KILN_*`` (which the spec cannot override)."""
    env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    if bin_dir:
        env["PATH"] = f"{bin_dir}:{path}"
        if (Path(bin_dir).parent / "pyvenv.cfg").exists():
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
        }
    )
    if launch.job_token:
        env["KILN_JOB_TOKEN"] = launch.job_token
    if launch.api_endpoint:
        env["KILN_ENDPOINT"] = launch.api_endpoint
    return env


def input_config(store: ObjectStore, item: ResolvedInput) -> dict[str, Any]:
    """What the shim stages: each blob's source is its local file (a local store) or a presigned URL."""
    ttl = STAGE_URL_SECONDS  # staging a large dataset can take a while; the URLs are only in the job's config
    files = []
    for f in item.files:
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
