"""The runs of jobs Kiln starts to serve or to develop are not runs among a team's trainings: a service's replicas
are runs of the experiment Services, a notebook's (and a TensorBoard's) of Notebooks — so the Default experiment's
table holds what people ran, and each of those kinds is there to open on request."""

from __future__ import annotations

from kiln.domain import tracking
from kiln.domain.notebooks import NotebookSpec
from kiln.domain.serving import ServiceSpec
from kiln.usecases import notebooks
from kiln.usecases.models import serving


def test_a_replicas_run_is_in_services() -> None:
    spec = ServiceSpec.model_validate({"name": "digits", "model": "digits@1", "predictor": {"type": "sklearn"}})
    job = serving.replica_spec(spec, "svc-1", "rep-1", "digits", 1)
    assert job.experiment == tracking.SERVICES_EXPERIMENT != tracking.DEFAULT_EXPERIMENT


def test_a_notebooks_and_a_tensorboards_runs_are_in_notebooks() -> None:
    lab = notebooks.job_spec("nb-1", NotebookSpec.model_validate({"name": "explore"}), "1", 60.0)
    board = notebooks.job_spec(
        "nb-2",
        NotebookSpec.model_validate({"name": "boards", "kind": "tensorboard", "jobs": ["job-01m984w8fprhbevc"]}),
        "1",
        60.0,
        {"job-01m984w8fprhbevc": "r"},
    )
    assert lab.experiment == board.experiment == tracking.NOTEBOOKS_EXPERIMENT
