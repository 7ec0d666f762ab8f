"""Catalog runtimes on the local executor: built on first use, once, and never left half-built."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import log_text, wait_for

CATALOG = """
- framework: bare
  version: "1"
  packages: []
  default: true
  description: a clean virtualenv
- framework: broken
  version: "1"
  packages: ["kiln-test-no-such-package-anywhere==0.0.1"]
"""


def test_runtime_is_built_once_for_concurrent_jobs(make_server, tmp_path: Path):
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    runtimes = tmp_path / "runtimes"
    client = make_server(runtime_catalog=str(tmp_path / "catalog.yaml"), runtimes_dir=str(runtimes)).client()
    listed = {r.name: r.status for r in client.runtimes()}
    assert listed["bare-1"] == "not-installed" and "pytorch-2.13" in listed
    show = {
        "command": ["python", "-c", "import sys; print(sys.prefix)"],
        "runtime": {"framework": "bare"},
        "resources": {"cpus": 1},
    }
    jobs = [client.submit(show) for _ in range(2)]
    done = {}
    for job in jobs:
        done[job.id] = wait_for(client, job.id, timeout=120)
        assert done[job.id].state == "SUCCEEDED"
        assert log_text(client, job.id)[-1] == str(runtimes / "bare-1")
    builds = [
        sum("building runtime bare-1" in line.text for line in client.stream_logs(job.id, follow=False)) for job in jobs
    ]
    assert sorted(builds) == [0, 1]
    assert {r.name: r.status for r in client.runtimes()}["bare-1"] == "installed"
    # The build is the platform's cost, not the job's that happened to need the runtime first: its hold starts
    # when the runtime was ready (it held 1 CPU from its placement through the whole build before).
    held = {row.key: row.cpu_seconds for row in client.usage(by="job").rows}
    for job, built in zip(jobs, builds, strict=True):
        read = done[job.id]
        assert read.started_at and read.running_at and read.finished_at
        whole = (read.finished_at - read.started_at).total_seconds()
        starting = (read.running_at - read.started_at).total_seconds()
        if built:  # the build (seconds, for a virtualenv with pip) is most of its start
            assert held[job.id] <= whole - starting / 2, (held[job.id], whole, starting)
        assert 0 < held[job.id] <= whole + 0.01, (held[job.id], whole)


def test_a_runtime_that_cannot_be_built_fails_the_job_without_retries(make_server, tmp_path: Path):
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    runtimes = tmp_path / "runtimes"
    client = make_server(runtime_catalog=str(tmp_path / "catalog.yaml"), runtimes_dir=str(runtimes)).client()
    job = client.submit({"command": "true", "runtime": {"framework": "broken"}, "max_restarts": 2})
    done = wait_for(client, job.id, timeout=180)
    assert (done.state, done.reason, done.restarts) == ("FAILED", "RuntimeError", 0)
    assert "broken-1" in (done.message or "")
    text = "\n".join(line.text for line in client.stream_logs(job.id, follow=False))
    assert "kiln-test-no-such-package-anywhere" in text
    assert not (runtimes / "broken-1").exists(), "a failed build must leave nothing half-built"
