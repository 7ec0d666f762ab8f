"""An upgrade to head from every supported release keeps every row and every answer (issue 44: the upgrade
through 20261205_0016 deleted every metric point and chunk recorded before it, on SQLite).

For each release of tests/upgrade/releases.toml, on SQLite and on PostgreSQL: that release's own server (its
source from this repository's history) is filled with one of everything its API makes (tests/upgrade/populate.py)
and stopped with SIGTERM while a job runs; the database is upgraded to head, and must hold every row it held,
with the same content over the columns both schemas have; the head server then answers every GET about each
object as the old one did, adopts the running job (cancelled here, its log kept), and the newest migration goes
down one step and up again without losing a row."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from kiln.db import migrate
from kiln.db.session import Database
from kiln.sdk.client import Client
from tests.kilnserver import KilnServer
from tests.upgrade.answers import ask, audit_kept, differences, series_kept
from tests.upgrade.oldrelease import Release, ReleaseServer, populate, releases
from tests.upgrade.snapshot import Snapshot, empty, lost, snapshot

# Tables populate.py leaves empty, and why: what would fill them costs more than it proves here, or no API fills
# them. Every other table of a release must hold rows before the upgrade, so that a new table no release
# populates is noticed here (add to populate.py, or here with the reason).
LEFT_EMPTY = {
    "nonces": "a signed request's nonce is kept in memory (or only for replays)",
    "data_uploads": "an upload's parts are removed once it completes",
    "data_upload_parts": "as data_uploads",
    "metric_cursors": "kept only for metrics a job sends over HTTP with its token",
    "offline_actions": "written only while the database is unreachable",
    "servers": "a server's row is removed when it stops",
    "usage_hours": "holds are summed by hour 10 minutes after they end (time, not an API call, fills them)",
    "usage_days": "as usage_hours",
    "notebooks": "a notebook needs JupyterLab in a catalog runtime: minutes to install",
    "service_replicas": "the service is created with 0 replicas (a replica is a running server process)",
    "service_traffic": "as service_replicas",
    "service_tokens": "as service_replicas",
}


def _revision(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar())
    finally:
        engine.dispose()


def _migrate(url: str, step: str) -> None:
    """Upgrade to head (the server does the same at start) or, with a revision, down to it: kiln.db.migrate."""
    db = Database(url)
    try:
        if step == "head":
            migrate.upgrade(db.engine)
        else:
            migrate.downgrade(db.engine, step)
    finally:
        db.dispose()


def _same_answers(report: dict[str, Any], admin: Client, member: Client) -> list[str]:
    running = report["jobs"]["running"]
    problems: list[str] = []
    for path, old in report["answers"].items():
        if running in path and not path.endswith(("/metrics", "/metrics/summary", "/artifacts")):
            continue  # the running job's state, events and log move on: checked in _adopted
        new = ask(admin if path.startswith("admin:") else member, path)
        if running in path:  # its series go on (system metrics every few seconds): what they had, they keep
            found = series_kept(old, new)
        elif path == "admin:/audit":
            found = audit_kept(old, new)
        else:
            found = differences(old, new)
        problems += [f"GET {path}: {d}" for d in found]
    return problems


def _adopted(report: dict[str, Any], member: Client) -> None:
    """The job the old server left running is the head server's now: running still, then cancelled on request,
    its log what it was with the cancellation after."""
    job_id = report["jobs"]["running"]
    assert str(member.get_job(job_id).state) == "RUNNING", member.events(job_id)
    member.cancel(job_id)
    deadline = time.monotonic() + 60
    while (state := str(member.get_job(job_id).state)) == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert state == "CANCELLED", member.events(job_id)
    old_log = base64.b64decode(report["answers"][f"/jobs/{job_id}/logs"]["bytes"])
    new_log = member.read_logs(job_id)[0]
    assert b"started" in old_log and new_log.startswith(old_log), (old_log, new_log)


def _check_filled(release: Release, before: Snapshot, url: str) -> None:
    assert _revision(url).startswith(release.migration), "releases.toml names another migration for this release"
    unfilled = sorted(empty(before) - set(LEFT_EMPTY))
    assert not unfilled, f"populate.py left these tables of {release} empty: {unfilled}"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize("release", releases(), ids=str)
def test_an_upgrade_from_a_release_keeps_every_row_and_answer(
    release: Release, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'kiln.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    home = tmp_path / "home"
    old = ReleaseServer(release, home, url)
    head = KilnServer(home, url)
    head.port, head.env["KILN_PORT"] = old.port, str(old.port)  # the same address: answers naming it match
    try:
        old.start()
        try:
            report = populate(old, tmp_path / "work")
        finally:
            old.stop(jobs=False)  # SIGTERM: the job's shim outlives the server, as on a real upgrade
        before = snapshot(url)
        _check_filled(release, before, url)

        _migrate(url, "head")
        problems = lost(before, snapshot(url))
        assert not problems, "\n".join(problems)

        head.start()
        member = Client(head.url, report["member"]["access_key"], report["member"]["secret_key"])
        with member, head.client() as admin:
            problems = _same_answers(report, admin, member)
            assert not problems, "\n".join(problems)
            _adopted(report, member)
        head.stop()

        # The newest migration down one step and up again, with the head server's rows in.
        upgraded = snapshot(url)
        _migrate(url, "-1")
        down = snapshot(url)
        problems = lost(upgraded, down)
        assert not problems, "\n".join(problems)
        _migrate(url, "head")
        problems = lost(down, snapshot(url))
        assert not problems, "\n".join(problems)
    finally:
        head.stop()  # and every shim still running under the home, the old server's included
