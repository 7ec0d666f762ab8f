"""The init container's program: fetch an attempt's code bundle, staged inputs and the job's checkpoints.

It is shipped to the pod as a file of the attempt's ConfigMap and run as ``python3 /etc/kiln/podfetch.py`` in the
init image (setting ``init_image``), so it uses the standard library only and never imports ``kiln``.
Everything it needs comes from the environment:

=======================  =============================================================================
KILN_ENDPOINT            the API, e.g. ``http://kiln.kiln.svc:8080``
KILN_JOB_TOKEN           the attempt's job token (``Authorization: Bearer``), from the attempt's Secret
KILN_JOB_ID              the job
KILN_CODE_SHA256         the code bundle's digest; empty: the job has no code bundle
KILN_WORK_DIR            where the bundle is unpacked
KILN_INPUTS              JSON ``[{"dataset": "NAME@VERSION", "dir": "/kiln/inputs/0"}, ...]``; a model version
                         the same with ``"model": "NAME@VERSION"`` (pinned at submit: a number)
KILN_CHECKPOINT_DIR      where the job's stored checkpoints are restored; unset: none are
KILN_RUN_DIR             the pod's shared run directory: the sync state (:data:`SYNC_STATE`) is kept there
KILN_FETCH_RETRY_SECONDS how long the API may be away (refusing, 5xx) before the fetch fails (120)
=======================  =============================================================================

The bundle comes from ``GET /api/v1/jobs/{id}/code`` (a gzipped tar); its SHA-256 must equal
``KILN_CODE_SHA256`` and it is unpacked with the ``data`` filter (no absolute paths, no ``..``, no links out).
A dataset version's manifest comes from ``GET /api/v1/datasets/{name}/versions/{version}``, each file from
``.../files/{path}``; the server may answer a file with a redirect to a presigned store URL, which is followed
*without* the bearer token (the store would refuse a second credential, and it must never see the token).
A model version is staged alike from ``GET /api/v1/models/{name}/versions/{version}`` (its ``files``) and
``.../files/{path}`` (:func:`fetch_model`; a service replica's init container, ``podmodel.py``, uses it too).
Every file's size and SHA-256 are checked against the manifest. The checkpoints a previous attempt left in the
store (``GET /api/v1/jobs/{id}/checkpoints``, then each file, sizes checked) are restored into
``KILN_CHECKPOINT_DIR``, so a restarted or preempted job resumes as on the local executor; they are recorded in
the sync state, so the sync sidecar (``podsync.py``, which imports this file's helpers) does not send them back.
Any failure exits non-zero with one line on stderr, so the pod fails before the command runs.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from typing import Any

CHUNK = 1024 * 1024
RETRIES = 5
RETRY_SECONDS = 120.0  # how long the API may be away before a fetch gives up (``_get``)
SYNC_STATE = "checkpoints.synced.json"  # {path: [size, mtime_ns]}: what the store holds of the checkpoint dir


class _NoAuthOnRedirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never send the job token to another place (a presigned store URL)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.remove_header("Authorization")
        return new


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(_NoAuthOnRedirect)


def _get(url: str, token: str, deadline: float | None = None) -> Any:
    """The response to ``GET url``. While the API is away (refused, reset, cut off, a 5xx or 429: a server
    restarting, a failover to another) it is asked again, 0.25 s after the first failure and twice as long each time
    up to 5 s, until ``deadline`` (monotonic; default ``KILN_FETCH_RETRY_SECONDS``, 120 s, from now); a 4xx will not
    get better and is raised at once."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    deadline = deadline if deadline is not None else _retry_deadline()
    pause = 0.25
    while True:
        try:
            return _opener().open(request, timeout=60)
        except (OSError, http.client.HTTPException) as exc:  # URLError and HTTPError are OSErrors
            code = getattr(exc, "code", None)
            if (code is not None and 400 <= code < 500 and code != 429) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 5.0)


def _get_json(url: str, token: str) -> Any:
    """``GET url``'s JSON body, read whole: an answer cut off by a server that went away (a short body, invalid
    JSON) is asked for again, like a refusal, within the same time (``_get``)."""
    deadline = _retry_deadline()
    while True:
        try:
            with _get(url, token, deadline) as response:
                return json.loads(response.read())
        except (http.client.HTTPException, ValueError, ConnectionError, TimeoutError):
            if time.monotonic() + 0.5 > deadline:
                raise
        time.sleep(0.5)


def _retry_deadline() -> float:
    return time.monotonic() + float(os.environ.get("KILN_FETCH_RETRY_SECONDS") or RETRY_SECONDS)


def job_url(endpoint: str, job_id: str, *parts: str) -> str:
    """``{endpoint}/api/v1/jobs/{job}/PART/...``, every part quoted (a path keeps its slashes)."""
    return "/".join([f"{endpoint}/api/v1/jobs", urllib.parse.quote(job_id, safe=""), *map(urllib.parse.quote, parts)])


def signature(path: str) -> list[int]:
    """What tells a changed file: its size and modification time (ns)."""
    st = os.stat(path, follow_symlinks=False)
    return [st.st_size, st.st_mtime_ns]


def load_state(run_dir: str) -> dict[str, list[int]]:
    try:
        with open(os.path.join(run_dir, SYNC_STATE), encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def save_state(run_dir: str, state: dict[str, list[int]]) -> None:
    """Written then renamed: a reader (or a restarted sidecar) never sees half of it."""
    path = os.path.join(run_dir, SYNC_STATE)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(state, fh)
    os.replace(path + ".tmp", path)


def _download(url: str, token: str, dest: str, sha256: str | None, size: int | None) -> None:
    """``url`` into ``dest``, checked against ``sha256`` and ``size`` when given; retried on I/O errors."""
    last: Exception | None = None
    for _ in range(RETRIES):
        digest = hashlib.sha256()
        written = 0
        try:
            with _get(url, token) as response, open(dest, "wb") as out:
                while chunk := response.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    written += len(chunk)
        except (OSError, http.client.HTTPException) as exc:  # URLError, HTTPError: OSErrors; a 4xx will not get better
            last = exc
            code = getattr(exc, "code", None)
            if code is not None and 400 <= code < 500 and code != 429:
                break
            continue
        if size is not None and written != size:
            raise SystemExit(f"kiln-fetch: {url}: got {written} bytes, expected {size}")
        if sha256 and digest.hexdigest() != sha256:
            raise SystemExit(f"kiln-fetch: {url}: SHA-256 {digest.hexdigest()} differs from {sha256}")
        return
    raise SystemExit(f"kiln-fetch: {url}: {last}")


def fetch_code(endpoint: str, token: str, job_id: str, sha256: str, work_dir: str) -> None:
    os.makedirs(work_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = os.path.join(tmp, "code.tar.gz")
        _download(job_url(endpoint, job_id, "code"), token, bundle, sha256, None)
        with tarfile.open(bundle, "r:gz") as archive:
            archive.extractall(work_dir, filter="data")
    # The job's container may run as another user than this one: the pod's scratch copy is everyone's.
    for root, dirs, names in os.walk(work_dir):
        for name in dirs + names:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o666 | (0o111 if name in dirs else 0))


def _inside(root: str, relative: str) -> str:
    target = os.path.realpath(os.path.join(root, relative))
    if os.path.isabs(relative) or not target.startswith(os.path.realpath(root) + os.sep):
        raise SystemExit(f"kiln-fetch: refusing a path outside its directory: {relative!r}")
    return target


def fetch_dataset(endpoint: str, token: str, ref: str, dest: str) -> int:
    """Every file of dataset version ``ref`` (``NAME@VERSION`` or ``NAME``: latest) into ``dest``; bytes."""
    name, _, version = ref.partition("@")
    base = f"{endpoint}/api/v1/datasets/{urllib.parse.quote(name)}/versions"
    manifest = _get_json(f"{base}/{version or 'latest'}", token)
    number = manifest.get("version", version)
    total = 0
    for item in manifest.get("items", []):
        target = _inside(dest, item["path"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        url = f"{base}/{number}/files/{urllib.parse.quote(item['path'])}"
        _download(url, token, target, item.get("sha256"), item.get("size"))
        total += int(item.get("size", 0))
    return total


def fetch_model(endpoint: str, token: str, ref: str, dest: str) -> tuple[int, int]:
    """Every file of model version ``ref`` (``NAME@VERSION``) into ``dest``; (files, bytes)."""
    name, _, version = ref.partition("@")
    if not name or not version.isdigit():
        raise SystemExit(f"kiln-fetch: model {ref!r}: expected NAME@VERSION with a version number")
    base = f"{endpoint}/api/v1/models/{urllib.parse.quote(name, safe='')}/versions/{version}"
    manifest = _get_json(base, token)
    files = manifest.get("files")
    if not isinstance(files, list):
        raise SystemExit(f"kiln-fetch: {base}: the answer lists no files")
    total = 0
    for item in files:
        target = _inside(dest, item["path"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        url = f"{base}/files/{urllib.parse.quote(item['path'])}"
        _download(url, token, target, item.get("sha256"), item.get("size"))
        total += int(item.get("size", 0))
    return len(files), total


def restore_checkpoints(endpoint: str, token: str, job_id: str, dest: str, run_dir: str) -> tuple[int, int]:
    """The job's stored checkpoints into ``dest`` (sizes checked), recorded as synced; (files, bytes)."""
    items = _get_json(job_url(endpoint, job_id, "checkpoints"), token).get("items", [])
    state = load_state(run_dir)
    total = 0
    for item in items:
        target = _inside(dest, item["path"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _download(job_url(endpoint, job_id, "checkpoints", item["path"]), token, target, None, int(item["size"]))
        state[item["path"]] = signature(target)
        total += int(item["size"])
    save_state(run_dir, state)
    return len(items), total


def main() -> int:
    env = os.environ
    endpoint = env.get("KILN_ENDPOINT", "").rstrip("/")
    token = env.get("KILN_JOB_TOKEN", "")
    sha256 = env.get("KILN_CODE_SHA256", "")
    inputs = json.loads(env.get("KILN_INPUTS") or "[]")
    checkpoint_dir = env.get("KILN_CHECKPOINT_DIR", "")
    if (sha256 or inputs or checkpoint_dir) and not (endpoint and token):
        print("kiln-fetch: KILN_ENDPOINT and KILN_JOB_TOKEN are needed to fetch code and data", file=sys.stderr)
        return 2
    work_dir = env.get("KILN_WORK_DIR", "/kiln/work")
    try:
        if checkpoint_dir:
            run_dir = env.get("KILN_RUN_DIR", "/kiln/run")
            os.umask(0)  # what is restored stays writable by the job, whichever user its container runs as
            os.makedirs(checkpoint_dir, exist_ok=True)
            files, size = restore_checkpoints(endpoint, token, env["KILN_JOB_ID"], checkpoint_dir, run_dir)
            if files:
                print(f"kiln-fetch: {files} checkpoint files ({size} bytes) restored", flush=True)
        if sha256:
            fetch_code(endpoint, token, env["KILN_JOB_ID"], sha256, work_dir)
            print(f"kiln-fetch: code {sha256[:12]} unpacked into {work_dir}", flush=True)
        for item in inputs:
            os.makedirs(item["dir"], exist_ok=True)
            if item.get("model"):
                _, size = fetch_model(endpoint, token, item["model"], item["dir"])
                print(f"kiln-fetch: model {item['model']} ({size} bytes) staged", flush=True)
                continue
            size = fetch_dataset(endpoint, token, item["dataset"], item["dir"])
            print(f"kiln-fetch: dataset {item['dataset']} ({size} bytes) staged", flush=True)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, tarfile.TarError, http.client.HTTPException) as exc:
        print(f"kiln-fetch: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
