"""Where a job's and an organisation's bytes live in the object store: the one place that names the keys, used by
the reconciler (collecting outputs, syncing checkpoints, fetching code) and the use cases that list, serve and
delete them."""

from __future__ import annotations


def blob_key(org_id: str, sha256: str) -> str:
    """A code archive uploaded by ``kiln run``, by its content hash."""
    return f"orgs/{org_id}/blobs/{sha256}.tar.gz"


def run_artifacts_prefix(org_id: str, run_id: str) -> str:
    """The artifacts of a run logged from outside Kiln (a job's run's artifacts are its outputs)."""
    return f"orgs/{org_id}/runs/{run_id}/artifacts"


def logged_model_prefix(org_id: str, model_id: str) -> str:
    """The files of a model logged the MLflow 3 way (``MLmodel`` and its flavor's files), whoever logged it."""
    return f"orgs/{org_id}/logged-models/{model_id}/artifacts"


def logged_model_digests_prefix(org_id: str, model_id: str) -> str:
    """Beside a logged model's files, outside what MLflow's client lists: ``<sha256> <size>`` of each file, as its
    upload was hashed, so that registering it (content-addressed blobs) need not read it all again."""
    return f"orgs/{org_id}/logged-models/{model_id}/sha256"


def outputs_prefix(org_id: str, job_id: str) -> str:
    """Everything a job's attempts wrote to ``$KILN_OUTPUT_DIR``."""
    return f"orgs/{org_id}/jobs/{job_id}/outputs"


def checkpoints_prefix(org_id: str, job_id: str) -> str:
    """A job's checkpoints, kept across its attempts."""
    return f"orgs/{org_id}/jobs/{job_id}/checkpoints"


def events_prefix(org_id: str, job_id: str) -> str:
    """A job's TensorBoard event files (``events.out.tfevents.*`` under its TensorBoard dir), kept while it runs
    and when each attempt ends: what ``kiln tensorboard`` shows."""
    return f"orgs/{org_id}/jobs/{job_id}/tensorboard"


def log_prefix(org_id: str, job_id: str) -> str:
    """A job's log as shipped by the server writing it: segments named by the offset of their first byte."""
    return f"orgs/{org_id}/jobs/{job_id}/log"
