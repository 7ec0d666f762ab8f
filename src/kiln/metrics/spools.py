"""Where a job's metric spool files are when its backend does not say (a backend without
:class:`kiln.backends.capabilities.MetricSpools`, e.g. Kubernetes, whose pods run no shim): the server extracts
the job's metrics from its log itself (kiln.tasks.log_metrics) into spool files in its own home, and its ingester
reads them there."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from kiln.backends.capabilities import MetricSpools


class ServerSpools(MetricSpools):
    """``<jobs dir>/<job id>/metrics`` in this server's home, whatever the handle (no attempt writes there)."""

    def __init__(self, jobs_dir: Path) -> None:
        self.jobs_dir = jobs_dir

    def metric_spool(self, job_id: str, handle: dict[str, Any] | None) -> Path:
        return self.jobs_dir / job_id / "metrics"

    def remove_metric_spool(self, job_id: str, handle: dict[str, Any] | None) -> None:
        shutil.rmtree(self.metric_spool(job_id, handle), ignore_errors=True)


def metric_spools(backend: object, jobs_dir: Path) -> MetricSpools:
    """The backend's spools where it has them; else the server's own under ``jobs_dir``."""
    return backend if isinstance(backend, MetricSpools) else ServerSpools(jobs_dir)
