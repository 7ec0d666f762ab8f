"""Runs and experiments: a mixin of ``kiln.Client``, over the MLflow tracking protocol Kiln serves at ``/mlflow``
(signed like every request). Every job is a run; runs logged with MLflow's client from anywhere are runs too.

    runs = client.search_runs(experiment="mnist", filter="params.lr < 0.1 and metrics.val_acc > 0.9",
                              order_by=["metrics.val_acc DESC"])
    client.get_run("job-01jd5y3c2k7q4m9x2a").params
    client.metric_history(run.id, "loss")
    client.compare_run_metrics([a.id, b.id], ["loss"], downsample=1000)  # downsampled by the server
    client.experiments()  # with their run counts; rename_experiment, delete_experiment
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kiln.auth.signing import canonical_query
from kiln.domain import run_table
from kiln.errors import Conflict, Forbidden, InvalidInput, KilnError, NotFound, Unauthenticated
from kiln.sdk.transport import ClientTransport

if TYPE_CHECKING:
    import httpx

    from kiln.domain.schemas import ExperimentRead, MetricSeriesData

BASE = "/mlflow/api/2.0/mlflow"
_ERRORS: dict[str, type[KilnError]] = {
    "RESOURCE_DOES_NOT_EXIST": NotFound,
    "RESOURCE_ALREADY_EXISTS": Conflict,
    "INVALID_PARAMETER_VALUE": InvalidInput,
    "PERMISSION_DENIED": Forbidden,
    "UNAUTHENTICATED": Unauthenticated,
}


@dataclass
class RunMetric:
    key: str
    value: float
    step: int
    timestamp: int  # ms since the epoch


@dataclass
class TrackedRun:
    """A run as search and get return it: its params and tags, each metric's latest value."""

    id: str
    name: str
    experiment_id: str
    status: str
    user: str
    start_time: int | None
    end_time: int | None
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def job_id(self) -> str | None:
        return self.tags.get("kiln.job_id")

    @property
    def state(self) -> str:
        """Its state in Kiln's words (SUCCEEDED, CANCELLED, QUEUED, PRUNED…), as the console and ``kiln runs``
        show it; ``status`` is MLflow's (FINISHED, KILLED, SCHEDULED…), as MLflow's client reads it."""
        return run_table.run_state(self.status, self.tags)

    def value(self, column: str) -> Any:
        """``params.X``, ``metrics.X``, ``tags.X`` or an attribute (``name``, ``status``, ``start_time``…)."""
        kind, _, key = column.partition(".")
        if key and kind in ("params", "param"):
            return self.params.get(key)
        if key and kind in ("metrics", "metric"):
            return self.metrics.get(key)
        if key and kind in ("tags", "tag"):
            return self.tags.get(key)
        if column in ("state", "status"):
            return self.state if column == "state" else self.status
        name = key if kind in ("attributes", "attribute", "attr") and key else column
        return getattr(self, {"run_id": "id", "run_name": "name"}.get(name, name), None)


def _run(data: dict[str, Any]) -> TrackedRun:
    info, body = data["info"], data.get("data") or {}
    return TrackedRun(
        id=info["run_id"],
        name=info.get("run_name", ""),
        experiment_id=info["experiment_id"],
        status=info["status"],
        user=info.get("user_id", ""),
        start_time=info.get("start_time"),
        end_time=info.get("end_time"),
        params={p["key"]: p["value"] for p in body.get("params") or []},
        tags={t["key"]: t["value"] for t in body.get("tags") or []},
        metrics={m["key"]: m["value"] for m in body.get("metrics") or []},
    )


class TrackingMixin(ClientTransport):
    """The run and experiment methods of ``kiln.Client``."""

    if TYPE_CHECKING:

        def signed_headers(self, method: str, url_path: str, query: str = "", body: bytes = b"") -> dict[str, str]: ...

    def _tracking(self, method: str, endpoint: str, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        path = f"{BASE}/{endpoint}"
        query = canonical_query((k, str(v)) for k, v in (params or {}).items())  # what the signature covers
        raw = json.dumps(body).encode() if body is not None else b""
        headers = self.signed_headers(method, path, query, raw)
        if body is not None:
            headers["Content-Type"] = "application/json"
        response: httpx.Response = self._http.request(
            method, path + (f"?{query}" if query else ""), content=raw, headers=headers
        )
        if response.status_code >= 400:
            try:
                answer = response.json()
            except ValueError:
                answer = {}
            kind = _ERRORS.get(str(answer.get("error_code")), KilnError)
            message = str(answer.get("message") or answer.get("code") or response.text[:200])
            raise kind(message)
        return response.json()

    def experiment_id(self, name: str) -> str:
        """The id of the organisation's experiment ``name`` (NotFound if none)."""
        found = self._tracking("GET", "experiments/get-by-name", {"experiment_name": name})
        return str(found["experiment"]["experiment_id"])

    def experiments(self, *, deleted: bool = False) -> list[ExperimentRead]:
        """The organisation's experiments (the deleted ones instead with ``deleted``), oldest first, each with its
        run count and when its newest run started (``GET /api/v1/experiments``)."""
        from kiln.domain.schemas import ExperimentList

        answer = self.request("GET", "/experiments", params={"deleted": "true" if deleted else None})
        return ExperimentList.model_validate(answer.json()).items

    def get_experiment(self, name: str) -> ExperimentRead:
        """The experiment ``name`` with its run count (NotFound if none)."""
        from kiln.domain.schemas import ExperimentList

        items = ExperimentList.model_validate(self.request("GET", "/experiments", params={"name": name}).json()).items
        if not items:
            raise NotFound(f"experiment {name!r} not found")
        return items[0]

    def rename_experiment(self, name: str, new_name: str) -> None:
        """Rename the experiment ``name`` (its runs stay in it; Conflict if ``new_name`` is taken)."""
        self._tracking(
            "POST", "experiments/update", body={"experiment_id": self.experiment_id(name), "new_name": new_name}
        )

    def delete_experiment(self, name: str) -> None:
        """Delete the experiment ``name`` (MLflow's soft delete: its runs are kept, and MLflow's client can restore
        it); Default cannot be deleted."""
        self._tracking("POST", "experiments/delete", body={"experiment_id": self.experiment_id(name)})

    def search_runs(
        self,
        experiment: str | None = None,
        *,
        filter: str | None = None,
        order_by: list[str] | None = None,
        max_results: int = 1000,
        deleted: bool = False,
    ) -> list[TrackedRun]:
        """Runs of ``experiment`` (a name; Default when None) that match ``filter`` (MLflow's syntax, plus
        numeric comparisons of params), in ``order_by`` order (``metrics.val_acc DESC`` or ``-metrics.val_acc``),
        filtered and sorted by the server; every page up to ``max_results`` runs."""
        experiment_id = self.experiment_id(experiment or "Default")
        runs: list[TrackedRun] = []
        token: str | None = None
        while len(runs) < max_results:
            body: dict[str, Any] = {
                "experiment_ids": [experiment_id],
                "filter": filter or "",
                "order_by": list(order_by or []),
                "max_results": min(1000, max_results - len(runs)),
                "run_view_type": "DELETED_ONLY" if deleted else "ACTIVE_ONLY",
            }
            if token:
                body["page_token"] = token
            page = self._tracking("POST", "runs/search", body=body)
            runs += [_run(r) for r in page.get("runs") or []]
            token = page.get("next_page_token")
            if not token:
                break
        return runs

    def get_run(self, run_id: str) -> TrackedRun:
        return _run(self._tracking("GET", "runs/get", {"run_id": run_id})["run"])

    def metric_history(self, run_id: str, key: str) -> list[RunMetric]:
        """Every point of the run's metric ``key``, in the order logged."""
        points: list[RunMetric] = []
        token: str | None = None
        while True:
            params = {"run_id": run_id, "metric_key": key, "max_results": 25000}
            if token:
                params["page_token"] = token
            page = self._tracking("GET", "metrics/get-history", params)
            points += [
                RunMetric(m["key"], m["value"], m.get("step", 0), m["timestamp"]) for m in page.get("metrics") or []
            ]
            token = page.get("next_page_token")
            if not token:
                return points

    def compare_run_metrics(
        self, run_ids: list[str], names: list[str] | str | None = None, downsample: int | None = 1000
    ) -> dict[str, list[MetricSeriesData]]:
        """The metrics ``names`` (default: all) of several runs, by run id, each series downsampled by the server
        to at most ``downsample`` points keeping its shape (first, last, min and max kept; None: every point, up to
        the server's limit), in one request to ``GET /api/v1/runs/metrics``. NotFound if any run is not one of
        your organisation's."""
        from kiln.domain.schemas import RunMetrics  # pydantic's models: only when asked (the CLI starts faster)

        listed = [names] if isinstance(names, str) else list(names or [])
        params: dict[str, Any] = {"run": list(run_ids), "name": listed or None, "downsample": downsample}
        return RunMetrics.model_validate(self.request("GET", "/runs/metrics", params=params).json()).runs
