"""The job methods of ``kiln.Client`` that check before they act: a server-side dry run, ``run`` (pack the code,
have the server check the job, upload the bundle only once it is accepted and only if it is missing, submit),
``rerun`` and ``delete_job``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.domain.idempotency import new_key
from kiln.domain.job_requests import JobDryRun
from kiln.domain.schemas import JobRead, JobSubmit
from kiln.domain.spec import JobSpec
from kiln.sdk.packaging import DEFAULT_MAX_CODE_BYTES, build_bundle
from kiln.sdk.transport import ClientTransport

Progress = Callable[[int], None]


def submit_body(spec: JobSpec | dict[str, Any], code_sha256: str | None) -> dict[str, Any]:
    spec = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec)
    return JobSubmit(spec=spec, code_sha256=code_sha256).model_dump(mode="json", exclude_none=True)


class JobActionsMixin(ClientTransport):
    """``dry_run``, ``run``, ``rerun`` and ``delete_job`` of ``kiln.Client``."""

    if TYPE_CHECKING:

        def upload_blob(self, path: Path, sha256: str, progress: Progress | None = None) -> None: ...

        def submit(
            self,
            spec: JobSpec | dict[str, Any],
            code_sha256: str | None = None,
            *,
            idempotency_key: str | None = None,
        ) -> JobRead: ...

    def dry_run(self, spec: JobSpec | dict[str, Any], code_sha256: str | None = None) -> JobDryRun:
        """Every check a submit makes (spec, runtime, inputs, resources, quota, permissions), creating nothing:
        raises what the submit would raise, else returns the spec as the job would get it (inputs pinned) and
        whether the server holds the code bundle ``code_sha256`` already."""
        body = submit_body(spec, code_sha256)
        # It creates nothing: retried like a read.
        return JobDryRun.model_validate(self.request("POST", "/jobs:dry-run", json_body=body, retry=True).json())

    def run(
        self,
        spec: JobSpec | dict[str, Any],
        code_dir: Path | None = None,
        *,
        max_bytes: int = DEFAULT_MAX_CODE_BYTES,
        progress: Progress | None = None,
        idempotency_key: str | None = None,
    ) -> JobRead:
        """Submit a job with the code of ``code_dir`` (if given). The code is packed here, the server checks the
        job first (``dry_run``), and the bundle is uploaded only once the job is accepted and only if the server
        does not hold it yet: a job the server refuses uploads nothing. ``idempotency_key``: as for ``submit``."""
        if code_dir is None:
            return self.submit(spec, idempotency_key=idempotency_key)
        bundle = build_bundle(code_dir, max_bytes)
        try:
            checked = self.dry_run(spec, bundle.sha256)
            if not checked.code_stored:
                self.upload_blob(bundle.path, bundle.sha256, progress)
        finally:
            bundle.path.unlink(missing_ok=True)
        return self.submit(spec, bundle.sha256, idempotency_key=idempotency_key)

    def rerun(self, job_id: str, *, name: str | None = None, idempotency_key: str | None = None) -> JobRead:
        """A new job with the spec (inputs at the versions the job pinned) and code of ``job_id``, in any state;
        ``name`` replaces its display name. ``idempotency_key``: as for ``submit``."""
        body = {"name": name} if name is not None else {}
        key = new_key() if idempotency_key is None else idempotency_key
        response = self.request("POST", f"/jobs/{job_id}/rerun", json_body=body, idempotency_key=key)
        return JobRead.model_validate(response.json())

    def delete_job(self, job_id: str) -> None:
        """Delete an ended job with its events, log, metrics, artifacts and checkpoints (what it stored stops
        counting against the storage quota). A job that has not ended raises Conflict: cancel it first."""
        self.request("DELETE", f"/jobs/{job_id}")
