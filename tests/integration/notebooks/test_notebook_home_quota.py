"""A notebook's home counts in its organisation's storage quota, checked and reserved under the organisation's
lock before the store takes it (issue 43): ``save_home`` checked the quota in a read transaction and recorded the
home's size only once it was stored, so two saves at once each found room for themselves and together passed the
limit. On SQLite and PostgreSQL: two saves that each fit alone but not together, held at the store until both
got there (or 3 s passed), and only one is kept."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select

from kiln.db.tables import Job, Notebook, Quota
from kiln.domain.states import JobState
from kiln.errors import Forbidden
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService, storage_used
from kiln.usecases.notebooks import NotebookService, home_key
from tests.helpers import acme_database

MiB = 2**20


class MeetingStore:
    """A store whose ``put_file`` waits for the other save to get there too (at most 3 s), then keeps the key."""

    def __init__(self) -> None:
        self.both = threading.Barrier(2, timeout=3)
        self.kept: list[str] = []

    def put_file(self, local: Path, key: str) -> None:
        try:
            self.both.wait()
        except threading.BrokenBarrierError:
            pass  # the other save never got to the store
        self.kept.append(key)


def test_two_home_saves_at_once_never_pass_the_storage_limit(database_url: str, tmp_path: Path) -> None:
    db = acme_database(database_url)
    try:
        with db.transaction() as s:
            s.add(Quota(org_id="org-1", category="total", storage=10 * MiB))
            for name in ("a", "b"):
                s.add(
                    Job(id=f"job-{name}", org_id="org-1", user_id="usr-1", name=name, spec={}, state=JobState.RUNNING)
                )
            s.flush()
            for name in ("a", "b"):
                s.add(
                    Notebook(
                        id=f"nb-{name}",
                        org_id="org-1",
                        user_id="usr-1",
                        name=name,
                        spec={},
                        desired="RUNNING",
                        job_id=f"job-{name}",
                    )
                )
        store = MeetingStore()
        jobs: Any = SimpleNamespace(idempotency=None)
        notebooks = NotebookService(db, jobs, store, "http://127.0.0.1", lambda: None, QuotaService(db))  # type: ignore[arg-type]
        outcomes: dict[str, object] = {}

        def save(name: str) -> None:
            tar = tmp_path / f"home-{name}.tar.gz"
            with open(tar, "wb") as f:
                f.truncate(6 * MiB)  # 6 MiB each: one fits the 10 MiB limit, not both
            principal = Principal("usr-1", "ann", "org-1", "acme", "", "member", False, job_id=f"job-{name}")
            try:
                outcomes[name] = notebooks.save_home(principal, f"nb-{name}", tar)
            except Forbidden as exc:
                outcomes[name] = exc

        threads = [threading.Thread(target=save, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
        kept = sorted(name for name, outcome in outcomes.items() if outcome == 6 * MiB)
        refused = [outcome for outcome in outcomes.values() if isinstance(outcome, Forbidden)]
        assert len(kept) == 1 and len(refused) == 1, outcomes
        assert "would exceed the limit of 10 MiB" in str(refused[0])
        assert store.kept == [home_key("org-1", f"nb-{kept[0]}")]  # the refused one never reached the store
        with db.read() as s:
            sizes = {nb: size for nb, size in s.execute(select(Notebook.id, Notebook.home_size))}
            assert sizes == {f"nb-{kept[0]}": 6 * MiB, f"nb-{'b' if kept[0] == 'a' else 'a'}": 0}
            assert storage_used(s, "org-1") <= 10 * MiB
    finally:
        db.engine.dispose()
