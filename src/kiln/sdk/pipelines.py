"""Pipelines: a mixin of ``kiln.Client``.

    run = client.run_pipeline(yaml.safe_load(open("pipeline.yaml")), base_dir=Path("."))
    run = client.wait_pipeline(run.id)            # until it ends; every step's state, job id and ``cached``

A job step's ``code: DIR`` (relative to ``base_dir``) is packed and uploaded as that step's own bundle, so that
changing one step's code re-runs that step (and the steps after it) only; the steps without one run the code of
``base_dir`` (when given).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.domain.pipelines import (
    STEP_ENDED,
    PipelineDryRun,
    PipelineRunList,
    PipelineRunRead,
    PipelineScheduleList,
    PipelineScheduleRead,
    PipelineScheduleSubmit,
    PipelineSubmit,
    RunState,
)
from kiln.errors import InvalidInput
from kiln.sdk.packaging import DEFAULT_MAX_CODE_BYTES, build_bundle
from kiln.sdk.transport import ClientTransport

Progress = Callable[[int], None]


class PipelinesMixin(ClientTransport):
    """The pipeline methods of ``kiln.Client``."""

    if TYPE_CHECKING:

        def upload_blob(self, path: Path, sha256: str, progress: Progress | None = None) -> None: ...

    def run_pipeline(
        self,
        spec: dict[str, Any],
        base_dir: Path | None = None,
        *,
        use_cache: bool = True,
        max_bytes: int = DEFAULT_MAX_CODE_BYTES,
    ) -> PipelineRunRead:
        """Start a run of the pipeline ``spec`` (the mapping of a pipeline.yaml). ``base_dir``: the directory its
        steps' ``code`` paths are relative to, and the code of the job steps that name none. The server checks the
        pipeline before any code is uploaded: a refused one uploads nothing."""
        self.check_pipeline(spec)
        spec, default = self._packed(spec, base_dir, max_bytes)
        body = PipelineSubmit(spec=spec, code_sha256=default, use_cache=use_cache)
        answer = self.request("POST", "/pipelines/runs", json_body=body.model_dump(mode="json", exclude_none=True))
        return PipelineRunRead.model_validate(answer.json())

    def check_pipeline(self, spec: dict[str, Any]) -> PipelineDryRun:
        """The server's checks of a run of ``spec`` (its steps' code aside), creating nothing; InvalidInput naming
        ``spec.steps.STEP.field`` where it would be refused."""
        bare = copy.deepcopy(spec)
        for step in (bare.get("steps") or {}).values():
            if isinstance(step, dict):
                step.pop("code", None)  # packed and uploaded after the check
        body = PipelineSubmit(spec=bare)
        answer = self.request(
            "POST", "/pipelines/runs:dry-run", json_body=body.model_dump(mode="json", exclude_none=True), retry=True
        )
        return PipelineDryRun.model_validate(answer.json())

    def schedule_pipeline(
        self,
        spec: dict[str, Any],
        cron: str,
        base_dir: Path | None = None,
        *,
        use_cache: bool = True,
        max_bytes: int = DEFAULT_MAX_CODE_BYTES,
    ) -> PipelineScheduleRead:
        """Run the pipeline ``spec`` on the cron schedule ``cron`` (UTC), with its code packed as ``run_pipeline``
        packs it (each run runs that code). Checked before any code is uploaded, as ``run_pipeline`` is."""
        self.check_pipeline(spec)
        spec, default = self._packed(spec, base_dir, max_bytes)
        body = PipelineScheduleSubmit(spec=spec, code_sha256=default, use_cache=use_cache, cron=cron)
        answer = self.request("POST", "/pipelines/schedules", json_body=body.model_dump(mode="json", exclude_none=True))
        return PipelineScheduleRead.model_validate(answer.json())

    def list_pipeline_schedules(self) -> list[PipelineScheduleRead]:
        return PipelineScheduleList.model_validate(self.request("GET", "/pipelines/schedules").json()).items

    def unschedule_pipeline(self, schedule_id: str) -> None:
        self.request("DELETE", f"/pipelines/schedules/{schedule_id}")

    def _packed(self, spec: dict[str, Any], base_dir: Path | None, max_bytes: int) -> tuple[dict[str, Any], str | None]:
        """The spec with each step's ``code`` directory packed, uploaded and named by its digest; and the digest of
        ``base_dir``'s bundle (the other job steps' code), if given."""
        spec = copy.deepcopy(spec)
        bundles: dict[Path, str] = {}

        def bundle_of(directory: Path) -> str:
            directory = directory.resolve()
            if directory not in bundles:
                bundle = build_bundle(directory, max_bytes)
                try:
                    self.upload_blob(bundle.path, bundle.sha256)
                finally:
                    bundle.path.unlink(missing_ok=True)
                bundles[directory] = bundle.sha256
            return bundles[directory]

        for name, step in (spec.get("steps") or {}).items():
            if isinstance(step, dict) and "code" in step:
                code = step.pop("code")
                directory = (base_dir or Path(".")) / str(code)
                if not directory.is_dir():
                    raise InvalidInput(f"steps.{name}.code: {directory} is not a directory")
                step["code_sha256"] = bundle_of(directory)
        return spec, (bundle_of(base_dir) if base_dir is not None else None)

    def get_pipeline_run(self, run_id: str) -> PipelineRunRead:
        return PipelineRunRead.model_validate(self.request("GET", f"/pipelines/runs/{run_id}").json())

    def list_pipeline_runs(self, name: str | None = None, limit: int = 50) -> list[PipelineRunRead]:
        params = {"name": name, "limit": limit}
        return PipelineRunList.model_validate(self.request("GET", "/pipelines/runs", params=params).json()).items

    def cancel_pipeline_run(self, run_id: str) -> PipelineRunRead:
        return PipelineRunRead.model_validate(self.request("POST", f"/pipelines/runs/{run_id}/cancel").json())

    def resume_pipeline_run(self, run_id: str) -> PipelineRunRead:
        return PipelineRunRead.model_validate(self.request("POST", f"/pipelines/runs/{run_id}/resume").json())

    def wait_pipeline(self, run_id: str, timeout: float = 3600.0, poll: float = 0.5) -> PipelineRunRead:
        """The run once it has ended (every step too); TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.get_pipeline_run(run_id)
            if run.state != RunState.RUNNING and all(step.state in STEP_ENDED for step in run.steps):
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"pipeline run {run_id} is still {run.state} after {timeout:g} s")
            time.sleep(poll)
