"""A job's files as the server handles them: never through the job's links; freed when the job ends."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kiln.backends.local import jobfiles


def test_links_the_job_planted_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "server.key"
    secret.write_text("secret")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "other.bin").write_text("another job's")
    out = tmp_path / "outputs"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "model.bin").write_text("mine")
    (out / "key").symlink_to(secret)
    (out / "dir").symlink_to(tmp_path / "secrets", target_is_directory=True)
    os.mkfifo(out / "fifo")  # would block a plain open
    found = {}
    for rel, fd in jobfiles.files_beneath(out):
        with os.fdopen(fd) as fh:
            found[rel] = fh.read()
    assert found == {"sub/model.bin": "mine"}


def test_a_failed_jobs_files_go_once_kept_long_enough(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    ok, failed = jobs / "job-ok", jobs / "job-failed"
    for job in (ok, failed):
        for name in ("work", "outputs", "metrics"):
            (job / name).mkdir(parents=True)
            (job / name / "f").write_text("x")
    jobfiles.release(ok, 0)
    assert sorted(p.name for p in ok.iterdir()) == ["metrics"]  # the ingester may still be reading it
    jobfiles.release(failed, 3600)
    jobfiles.sweep(jobs)
    assert (failed / "work" / "f").exists()
    (failed / "release.json").write_text(json.dumps({"keep_until": time.time() - 1}))
    jobfiles.sweep(jobs)
    assert sorted(p.name for p in failed.iterdir()) == ["metrics"]


def test_event_files_are_kept_incrementally_never_through_a_link_and_within_their_budget(tmp_path: Path) -> None:
    from kiln.storage.store import ObjectStore

    store = ObjectStore(str(tmp_path / "store"))
    victim = tmp_path / "jobs" / "job-victim" / "tensorboard"
    victim.mkdir(parents=True)
    (victim / "events.out.tfevents.1.victim").write_bytes(b"another job's scalars")
    job = tmp_path / "jobs" / "job-mine"
    tb = job / "work" / "logs"
    (tb / "train").mkdir(parents=True)
    (tb / "train" / "events.out.tfevents.1.host").write_bytes(b"a" * 10)
    (tb / "notes.txt").write_text("not an event file")
    (tb / "events.out.tfevents.2.host.tmp").write_bytes(b"half written")
    (tb / "events.out.tfevents.3.link").symlink_to(victim / "events.out.tfevents.1.victim")
    (tb / "other").symlink_to(victim, target_is_directory=True)
    prefix = "orgs/o/jobs/job-mine/tensorboard"
    assert jobfiles.sync_events(store, job, "work/logs", prefix, 100) == (1, 10)
    assert store.list(prefix) == [("train/events.out.tfevents.1.host", 10)]
    assert jobfiles.sync_events(store, job, "work/logs", prefix, 100) == (0, 10)  # nothing changed: nothing copied
    with open(tb / "train" / "events.out.tfevents.1.host", "ab") as fh:
        fh.write(b"b" * 5)
    (tb / "events.out.tfevents.4.host").write_bytes(b"c" * 200)  # past the budget: left out
    assert jobfiles.sync_events(store, job, "work/logs", prefix, 100) == (1, 15)
    assert store.list(prefix) == [("train/events.out.tfevents.1.host", 15)]
    # The job swaps a directory of its TensorBoard path for a link to another job's: nothing is read through it.
    (job / "work" / "logs").rename(job / "work" / "old")
    (job / "work" / "logs").symlink_to(victim, target_is_directory=True)
    assert jobfiles.sync_events(store, job, "work/logs", prefix, 100) == (0, 15)
    assert all("victim" not in rel for rel, _ in store.list(prefix))


def test_an_attempts_tensorboard_dir_is_the_one_its_shim_was_told(tmp_path: Path) -> None:
    job = tmp_path / "job-1"
    attempt = job / "attempts" / "1"
    attempt.mkdir(parents=True)
    members = [("worker", 0, attempt)]
    assert jobfiles.events_dir(members, job) == "tensorboard"  # no shim.json yet: the default
    config = {"metrics": {"tensorboard_dir": str(job / "work" / "runs" / "tb")}}
    (attempt / "shim.json").write_text(json.dumps(config))
    assert jobfiles.events_dir(members, job) == "work/runs/tb"
    (attempt / "shim.json").write_text(json.dumps({"metrics": {"tensorboard_dir": "/elsewhere"}}))
    assert jobfiles.events_dir(members, job) == "tensorboard"  # never outside the job's directory


def test_a_notebooks_address_is_what_its_state_file_names_in_the_work_dir_and_nothing_else(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    assert jobfiles.notebook_address(work) is None  # not there yet: not answering
    state = work / jobfiles.NOTEBOOK_STATE
    state.write_text(json.dumps({"socket": ".kiln-notebook.sock", "token": "t0k", "pid": 1}))
    address = jobfiles.notebook_address(work)
    assert address is not None
    assert (address.socket, address.token, address.url) == (str(work / ".kiln-notebook.sock"), "t0k", "http://notebook")
    for bad in (
        {"socket": "../../server.sock", "token": "t"},  # out of the work dir
        {"socket": "/run/kiln.sock", "token": "t"},
        {"socket": "..", "token": "t"},
        {"socket": "s", "token": ""},
        {"socket": "s", "token": "x" * 300},
        {"socket": "s", "token": "line\nbreak"},
        {"socket": 7, "token": "t"},
        ["s", "t"],
    ):
        state.write_text(json.dumps(bad))
        assert jobfiles.notebook_address(work) is None, bad
    state.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps({"socket": "s", "token": "t"}))
    state.symlink_to(tmp_path / "elsewhere.json")  # the job's link: never followed
    assert jobfiles.notebook_address(work) is None


def test_outputs_are_copied_whole_or_not_at_all(tmp_path: Path) -> None:
    """Sized at their apparent length before anything is written; refused (by the quota's ``admit``, or past
    ``most``) or cut short by a failing store, the store keeps none of them (issue 43)."""
    import pytest

    from kiln.backends.capabilities import OutputsNotKept
    from kiln.storage.store import ObjectStore

    out = tmp_path / "outputs"
    out.mkdir()
    for name in ("a.bin", "b.bin"):
        with open(out / name, "wb") as fh:
            fh.write(b"1")
            fh.truncate(3 * 2**20)  # sparse: a few KiB allocated, 3 MiB to the store
    store = ObjectStore(str(tmp_path / "store"))
    asked: list[int] = []

    def refuse(size: int) -> None:
        asked.append(size)
        raise OutputsNotKept("over the quota")

    with pytest.raises(OutputsNotKept):
        jobfiles.copy_tree(store, out, "outputs/job", refuse)
    assert asked == [6 * 2**20] and store.list("outputs/job") == []
    with pytest.raises(OutputsNotKept, match="more than the job's disk limit of 5 MiB"):
        jobfiles.copy_tree(store, out, "outputs/job", most=5 * 2**20)
    assert store.list("outputs/job") == []

    put = store.put_file

    def fails_second(local: Path, key: str) -> None:
        if key.endswith("b.bin"):
            raise OSError("the store went away")
        put(local, key)

    store.put_file = fails_second  # type: ignore[method-assign]
    with pytest.raises(OSError):
        jobfiles.copy_tree(store, out, "outputs/job")
    assert store.list("outputs/job") == []
    store.put_file = put  # type: ignore[method-assign]
    assert jobfiles.copy_tree(store, out, "outputs/job", asked.append) == (2, 6 * 2**20)
    assert store.list("outputs/job") == [("a.bin", 3 * 2**20), ("b.bin", 3 * 2**20)]
