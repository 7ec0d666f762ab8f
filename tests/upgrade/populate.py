"""Fill an old release's server with one of everything it has, through that release's own SDK, and record its
API's answers (run as a script with the release's ``src`` first on sys.path: it imports only that ``kiln``).

Each feature is used only where the release's client has it, so one script serves every release. It ends with one
job still running (``sleep 300``) and prints a JSON report on stdout: the member's key, the ids, and the answers of
the GETs that name each object, which the upgrade test asks the head server again after the upgrade.

Usage: python populate.py ENDPOINT WORKDIR  (the admin's keys in KILN_ACCESS_KEY and KILN_SECRET_KEY)."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kiln.sdk.client import Client

PY = sys.executable
ORG = "upgrade-org"
TRAIN = r"""
import os, pathlib
out = pathlib.Path(os.environ.get("KILN_OUTPUT_DIR", "out"))
(out / "model" / "sub").mkdir(parents=True, exist_ok=True)
(out / "model.pkl").write_bytes(b"weights " * 64)
(out / "model" / "weights.bin").write_bytes(b"tree " * 64)
(out / "model" / "sub" / "config.json").write_text('{"layers": 2}')
for step in range(40):
    print(f"step={step} loss={1 / (step + 1):.5f} acc={step / 40:.3f}", flush=True)
try:
    import kiln
    if hasattr(kiln, "log"):
        for step in range(20):
            kiln.log({"sdk_loss": 1 / (step + 1)}, step=step)
except ImportError:
    pass
print("trained")
"""
FAIL = "import sys\nprint('step=1 loss=0.5', flush=True)\nprint('about to fail', flush=True)\nsys.exit(3)"
WAIT = "import time\nprint('step=1 loss=0.25', flush=True)\nprint('{}', flush=True)\ntime.sleep({})"
TRIAL = "import os\nprint('score=' + os.environ['KILN_PARAM_X'], flush=True)"


def job(code: str, **extra: Any) -> dict[str, Any]:
    return {"command": [PY, "-c", code], "runtime": {"python": PY}, **extra}


def until(what: str, check: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"populate: timed out waiting for {what}")
        time.sleep(0.2)


def state(client: Client, job_id: str) -> str:
    return str(client.get_job(job_id).state)


def ended(client: Client, job_id: str, expected: str) -> None:
    until(f"job {job_id} to end", lambda: state(client, job_id) not in ("QUEUED", "STARTING", "RUNNING"))
    final = state(client, job_id)
    if final != expected:
        raise SystemExit(f"populate: job {job_id} ended {final}, expected {expected}")


def logged(client: Client, job_id: str, text: bytes) -> None:
    until(f"{text!r} in job {job_id}'s log", lambda: text in client.read_logs(job_id)[0])


def has_points(client: Client, job_id: str, name: str) -> None:
    until(f"metric {name} of job {job_id}", lambda: any(s.name == name and s.count for s in client.metrics(job_id)))


def populate(admin: Client, work: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"jobs": {}, "reads": [], "features": []}
    reads: list[str] = report["reads"]  # paths of /api/v1 GETs, answered by the member's key (or the admin's: "admin:")

    # Tenancy: an organisation, a member, a viewer, keys (one disabled), a quota; the audit log records each.
    admin.create_org(ORG)
    member = admin.create_user("ann", org=ORG, role="admin")
    viewer = admin.create_user("vic", org=ORG, role="viewer")
    key = admin.create_key(user=member.id)
    spare = admin.create_key(user=viewer.id, description="spare")
    admin.disable_key(spare.id)
    admin.set_quota(ORG, cpus=64, count=100)
    report["member"] = {"access_key": key.id, "secret_key": key.secret_key}
    ann = Client(admin.endpoint, key.id, key.secret_key)
    reads += [f"admin:/orgs/{ORG}", "admin:/users", "admin:/keys", "/whoami", "/users"]

    # Jobs in every end state, with logs, events and metric points (their lines, and kiln.log where it exists).
    jobs = report["jobs"]
    code = work / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text(TRAIN)
    jobs["succeeded"] = ann.run({"command": [PY, "train.py"], "runtime": {"python": PY}}, code).id  # a code blob
    jobs["failed"] = ann.submit(job(FAIL)).id
    jobs["cancelled"] = ann.submit(job(WAIT.format("cancel me", 120))).id
    ended(ann, jobs["succeeded"], "SUCCEEDED")
    ended(ann, jobs["failed"], "FAILED")
    logged(ann, jobs["cancelled"], b"cancel me")
    ann.cancel(jobs["cancelled"])
    ended(ann, jobs["cancelled"], "CANCELLED")
    for job_id in jobs.values():
        has_points(ann, job_id, "loss")
    has_points(ann, jobs["succeeded"], "acc")

    # Datasets: two versions of one.
    data = work / "digits"
    data.mkdir(parents=True)
    (data / "train.csv").write_text("x,y\n" + "".join(f"{i},{i % 2}\n" for i in range(100)))
    ann.put_dataset(data, "digits")
    (data / "test.csv").write_text("x,y\n1,1\n")
    ann.put_dataset(data, "digits")
    reads += ["/datasets", "/datasets/digits", "/datasets/digits/versions/1", "/datasets/digits/versions/2"]

    if hasattr(ann, "register_model"):  # 8fc4612 on: the model registry, services and studies
        report["features"] += ["models", "services", "studies"]
        ann.register_model("digits", jobs["succeeded"], "model.pkl")
        ann.register_model("digits", jobs["succeeded"], "model")
        ann.set_alias("digits", "production", 1)
        reads += ["/models", "/models/digits", "/models/digits/versions"]
        service = {"name": "digits-web", "model": "digits@production", "predictor": {"type": "sklearn"}}
        ann.request("POST", "/services", json_body={"spec": {**service, "runtime": {"python": PY}, "replicas": 0}})
        reads += ["/services", "/services/digits-web"]
        study = ann.submit_study(
            {
                "trial": job(TRIAL),
                "parameters": {"x": {"type": "int", "low": 1, "high": 3}},
                "objective": {"metric": "score", "direction": "maximize"},
                "max_trials": 2,
            }
        )
        until("the study", lambda: str(ann.get_study(study.id).state) not in ("PENDING", "RUNNING"), 120)
        report["study"] = study.id
        reads += [f"/studies/{study.id}", f"/studies/{study.id}/trials", f"/studies/{study.id}/events"]

    if hasattr(ann, "run_pipeline"):  # 4fe6d21 on: pipelines, tracking, usage and budgets
        report["features"] += ["pipelines", "tracking", "usage"]
        train = {**job("print('step=1 loss=0.3')"), "depends_on": ["prep"]}
        spec = {"name": "prep-train", "steps": {"prep": job("print('prep')"), "train": train}}
        # A job reading another's outputs (their manifest is kept at its submit).
        jobs["reader"] = ann.submit(job("print('step=1 loss=0.1')", inputs=[{"job": jobs["succeeded"]}])).id
        ended(ann, jobs["reader"], "SUCCEEDED")
        run = ann.run_pipeline(spec)
        until("the pipeline run", lambda: str(ann.get_pipeline_run(run.id).state) not in ("PENDING", "RUNNING"), 120)
        ann.schedule_pipeline(spec, cron="0 3 1 1 *")
        reads += ["/pipelines/runs", f"/pipelines/runs/{run.id}", "/pipelines/schedules"]
        experiment = ann._tracking("POST", "experiments/create", body={"name": "upgrade-exp"})["experiment_id"]
        created = ann._tracking("POST", "runs/create", body={"experiment_id": experiment, "run_name": "r1"})
        run_id = created["run"]["info"]["run_id"]
        batch = {
            "run_id": run_id,
            "params": [{"key": "lr", "value": "0.01"}],
            "tags": [{"key": "team", "value": "vision"}],
            "metrics": [
                {"key": "val", "value": i / 10, "timestamp": 1_800_000_000_000 + i, "step": i} for i in range(5)
            ],
        }
        ann._tracking("POST", "runs/log-batch", body=batch)
        ann._tracking(
            "POST", "runs/update", body={"run_id": run_id, "status": "FINISHED", "end_time": 1_800_000_001_000}
        )
        report["tracking"] = {"experiment": experiment, "run": run_id}
        admin.set_prices(cpu_hour=0.5, memory_gib_hour=0.01)
        admin.set_budget(org=ORG, soft=100.0, hard=200.0)
        reads += ["admin:/prices", "admin:/budgets"]

    # Last, the job that is still running when the server stops (its log and a metric point shipped first).
    jobs["running"] = ann.submit(job(WAIT.format("started", 300))).id
    logged(ann, jobs["running"], b"started")
    has_points(ann, jobs["running"], "loss")
    for job_id in jobs.values():
        reads += [f"/jobs/{job_id}", f"/jobs/{job_id}/events", f"/jobs/{job_id}/logs", f"/jobs/{job_id}/metrics"]
        reads += [f"/jobs/{job_id}/metrics/summary", f"/jobs/{job_id}/artifacts"]
    reads += ["admin:/audit"]
    report["answers"] = {path: answer(admin if path.startswith("admin:") else ann, path) for path in reads}
    return report


def answer(client: Client, path: str) -> dict[str, Any]:
    """The answer to GET ``path``: its JSON, or (logs) its bytes."""
    response = client.request("GET", quote(path.removeprefix("admin:"), safe="/:@"))
    if response.headers.get("content-type", "").startswith("application/json"):
        return {"json": response.json()}
    return {"bytes": base64.b64encode(response.content).decode()}


def main() -> None:
    endpoint, work = sys.argv[1], Path(sys.argv[2])
    admin = Client(endpoint, os.environ["KILN_ACCESS_KEY"], os.environ["KILN_SECRET_KEY"])
    print(json.dumps(populate(admin, work)))


if __name__ == "__main__":
    main()
