"""The sync sidecar's program: a pod's checkpoints and outputs go to the store through the Kiln API.

Shipped in the attempt's ConfigMap beside ``podfetch.py`` (whose helpers it imports: the same directory is on
``sys.path`` in the pod and in this repository) and run as ``python3 /etc/kiln/podsync.py`` in the init image,
as a native sidecar (an init container with ``restartPolicy: Always``, Kubernetes >= 1.29) that shares the
output, checkpoint and run volumes with the job's container. Standard library only; it never imports ``kiln``.

=============================  =======================================================================
KILN_ENDPOINT, KILN_JOB_TOKEN  the API and the attempt's job token (``Authorization: Bearer``)
KILN_JOB_ID                    the job
KILN_OUTPUT_DIR                uploaded as the job's artifacts once the command has ended
KILN_CHECKPOINT_DIR            uploaded as the job's checkpoints: what changed, every sync interval
KILN_TENSORBOARD_DIR           its ``events.out.tfevents.*`` files uploaded likewise (what ``kiln tensorboard`` reads)
KILN_RUN_DIR                   the pod's shared run directory: markers and the sync state
KILN_CHECKPOINT_SYNC_SECONDS   the interval (0: only once the command has ended)
KILN_ROLE, JOB_COMPLETION_INDEX  the member, ``ROLE-INDEX``: only ``worker-0`` uploads (see below)
=============================  =======================================================================

Every ``KILN_CHECKPOINT_SYNC_SECONDS`` it uploads (``PUT /api/v1/jobs/{id}/checkpoints/{path}``) the files of
the checkpoint directory whose size or mtime differ from what the store was last given (the sync state,
``$KILN_RUN_DIR/checkpoints.synced.json``, which ``podfetch.py`` seeds with what it restored). Each upload
carries the file's SHA-256 (``X-Kiln-Content-SHA256``): a file rewritten in place while it is read is refused
by the server and sent again next round, so write checkpoints to a temporary name and rename them. Symbolic
links and anything resolving outside the directory are skipped.

The TensorBoard event files under ``KILN_TENSORBOARD_DIR`` go the same way, at the same times
(``PUT /api/v1/jobs/{id}/tensorboard/{path}``; their sync state keyed ``tensorboard/<path>``).

When the entrypoint writes ``$KILN_RUN_DIR/ended-MEMBER`` (the command and finish_command are over) it does a
last checkpoint pass, uploads every file of the output directory as the job's artifacts
(``PUT .../artifacts/{path}``) and writes ``$KILN_RUN_DIR/synced-MEMBER``: a first line ``ok checkpoints=N
outputs=M bytes=B`` or ``error N uploads failed``, then one line per failure. The entrypoint waits for that file
(bounded) and copies it to the job's log. SIGTERM (the pod is going away) triggers one last checkpoint pass.

Only ``worker-0`` uploads: a gang's members have a directory each here, where the local executor's members share
one, and rank 0 is the one that writes checkpoints and results by convention. Every member restores the stored
checkpoints (``podfetch.py``), as every member on the local executor sees the shared directory.
Nothing here retries forever: an unreachable server ends a pass at once (next pass, or the error marker).
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import podfetch  # shipped beside this file

UPLOADER = "worker-0"
RETRIES = 3
MAX_REPORTED = 20


EVENT_FILE = "events.out.tfevents."


class Unreachable(Exception):
    """The API cannot be reached: the rest of the pass would fail the same way."""


class Syncer:
    def __init__(self, env: dict[str, str]) -> None:
        self.endpoint = env.get("KILN_ENDPOINT", "").rstrip("/")
        self.token = env.get("KILN_JOB_TOKEN", "")
        self.job_id = env.get("KILN_JOB_ID", "")
        self.output_dir = env.get("KILN_OUTPUT_DIR", "/kiln/outputs")
        self.checkpoint_dir = env.get("KILN_CHECKPOINT_DIR", "/kiln/checkpoints")
        self.tensorboard_dir = env.get("KILN_TENSORBOARD_DIR", "")
        self.run_dir = env.get("KILN_RUN_DIR", "/kiln/run")
        self.interval = float(env.get("KILN_CHECKPOINT_SYNC_SECONDS") or 0)
        self.member = f"{env.get('KILN_ROLE') or 'worker'}-{env.get('JOB_COMPLETION_INDEX') or '0'}"
        self.state = podfetch.load_state(self.run_dir)
        self.errors: list[str] = []
        self.stopping = False

    # -- one file, one directory ---------------------------------------------------------------------------------

    def _put(self, kind: str, rel: str, path: str) -> int:
        """Upload one file; its size. Raises Unreachable, or OSError with the server's answer."""
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(podfetch.CHUNK):
                digest.update(chunk)
        size = os.path.getsize(path)
        last: Exception | None = None
        for attempt in range(RETRIES):
            with open(path, "rb") as body:
                request = urllib.request.Request(
                    podfetch.job_url(self.endpoint, self.job_id, kind, rel),
                    data=body,
                    method="PUT",
                    headers={
                        "Authorization": f"Bearer {self.token}",
                        "Content-Length": str(size),
                        "Content-Type": "application/octet-stream",
                        "X-Kiln-Content-SHA256": digest.hexdigest(),
                    },
                )
                try:
                    with urllib.request.urlopen(request, timeout=120) as response:
                        response.read()
                    return size
                except urllib.error.HTTPError as exc:
                    detail = exc.read()[:300].decode("utf-8", "replace")
                    last = OSError(f"HTTP {exc.code}: {detail}")
                    if exc.code < 500 and exc.code != 429:
                        break  # a refusal (quota, ended job, bad path, content changed) will not get better now
                except OSError as exc:  # connection refused, reset, timed out
                    last = Unreachable(f"{self.endpoint}: {getattr(exc, 'reason', exc)}")
            if attempt < RETRIES - 1:
                time.sleep(0.5 * 2**attempt)
        assert last is not None
        raise last

    def _files(self, root: str) -> list[tuple[str, str]]:
        """(relative path, path) of the regular files under ``root``: no symbolic links, nothing outside."""
        real_root = os.path.realpath(root)
        out = []
        for top, dirs, names in os.walk(root):  # does not descend into linked directories
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(top, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if os.path.islink(path) or not os.path.realpath(path).startswith(real_root + os.sep):
                    self._log(f"skipping {rel!r}: a symbolic link or outside {root}")
                    continue
                if os.path.isfile(path):
                    out.append((rel, path))
        return out

    def _upload_dir(
        self, root: str, kind: str, what: str, incremental: bool, key: str = "", only: str = ""
    ) -> tuple[int, int]:
        """Upload the files of ``root`` as ``kind`` (only what changed since the store got it, when
        ``incremental``: the sync state's entry ``key + path``; only names starting with ``only``); (files,
        bytes). An unreachable server ends the pass."""
        files = size = 0
        for rel, path in self._files(root):
            if only and not os.path.basename(rel).startswith(only):
                continue
            try:
                before = podfetch.signature(path)
                if incremental and self.state.get(key + rel) == before:
                    continue
                sent = self._put(kind, rel, path)
                if incremental and podfetch.signature(path) == before:  # else it changed meanwhile: next pass
                    self.state[key + rel] = before
                    podfetch.save_state(self.run_dir, self.state)
                files, size = files + 1, size + sent
            except Unreachable as exc:
                self._fail(f"{what} {rel}: {exc}")
                break
            except OSError as exc:
                self._fail(f"{what} {rel}: {exc}")
        return files, size

    def sync_checkpoints(self) -> tuple[int, int]:
        """The checkpoints that changed, and the TensorBoard event files that grew."""
        files, size = self._upload_dir(self.checkpoint_dir, "checkpoints", "checkpoint", incremental=True)
        if self.tensorboard_dir and os.path.isdir(self.tensorboard_dir):
            events = self._upload_dir(
                self.tensorboard_dir, "tensorboard", "event file", True, key="tensorboard/", only=EVENT_FILE
            )
            files, size = files + events[0], size + events[1]
        return files, size

    def upload_outputs(self) -> tuple[int, int]:
        return self._upload_dir(self.output_dir, "artifacts", "output", incremental=False)

    # -- the loop --------------------------------------------------------------------------------------------------

    def _log(self, text: str) -> None:
        print(f"kiln-sync: {text}", file=sys.stderr, flush=True)

    def _fail(self, text: str) -> None:
        self._log(f"upload failed: {text}")
        self.errors.append(text)

    def finish(self) -> str:
        """The last pass, once the command has ended: the synced marker's text."""
        if self.member != UPLOADER:
            return f"ok skipped: only {UPLOADER} uploads (this is {self.member})\n"
        self.errors = []
        checkpoints, a = self.sync_checkpoints()
        outputs, b = self.upload_outputs()
        if self.errors:
            lines = [f"error {len(self.errors)} uploads failed", *self.errors[:MAX_REPORTED]]
            return "\n".join(lines) + "\n"
        return f"ok checkpoints={checkpoints} outputs={outputs} bytes={a + b}\n"

    def run(self) -> int:
        ended = os.path.join(self.run_dir, f"ended-{self.member}")
        synced = os.path.join(self.run_dir, f"synced-{self.member}")
        if not (self.endpoint and self.token and self.job_id):
            self._log("KILN_ENDPOINT, KILN_JOB_TOKEN and KILN_JOB_ID are needed; nothing will be uploaded")
        next_sync = time.monotonic() + self.interval
        while not self.stopping and not os.path.exists(synced):
            if os.path.exists(ended):
                text = self.finish()
                with open(synced + ".tmp", "w", encoding="utf-8") as fh:
                    fh.write(text)
                os.replace(synced + ".tmp", synced)
                self._log(text.splitlines()[0])
                break
            if self.member == UPLOADER and self.interval > 0 and time.monotonic() >= next_sync:
                files, size = self.sync_checkpoints()
                if files:
                    self._log(f"{files} checkpoint files ({size} bytes) uploaded")
                next_sync = time.monotonic() + self.interval
            time.sleep(0.2)
        # A native sidecar that exits is started again: it stays until the pod goes (SIGTERM).
        while not self.stopping:  # short naps: a SIGTERM's wait for it to exit is at most one of them
            time.sleep(0.1)
        if self.member == UPLOADER and not os.path.exists(synced):
            self.sync_checkpoints()  # the pod is being deleted before the command ended: keep what we can
        return 0

    def on_term(self, *_: object) -> None:
        self.stopping = True


def main() -> int:
    syncer = Syncer(dict(os.environ))
    signal.signal(signal.SIGTERM, syncer.on_term)
    signal.signal(signal.SIGINT, syncer.on_term)
    os.makedirs(syncer.run_dir, exist_ok=True)
    return syncer.run()


if __name__ == "__main__":
    sys.exit(main())
