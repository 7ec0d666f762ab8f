"""The outbox's bookkeeping on a real (SQLite) database: failed deliveries counted towards pausing a subscription
each, however many one batch wrote, and the pause told to its owner's other subscriptions only; a notebook's cull
written with its stop (culling needs JupyterLab running to go through a server); a service's recovery (a server
test sees it degrade; making it recover takes a model that loads on the second try)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import (
    Job,
    Notebook,
    NotificationDelivery,
    NotificationEvent,
    NotificationSubscription,
    Organization,
    Service,
    User,
)
from kiln.usecases.notebooks import NotebookService
from kiln.usecases.notifications import notification_events
from kiln.usecases.notifications import notification_outbox as outbox


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'kiln.db'}")
    migrate.upgrade(database.engine)
    yield database
    database.dispose()


def _sub(sub_id: str, user_id: str, events: list[str]) -> NotificationSubscription:
    target = f"https://hooks.example/{sub_id}"
    return NotificationSubscription(
        id=sub_id, org_id="org-n", user_id=user_id, name=sub_id, events=events, channel="webhook", target=target
    )


def test_five_refusals_in_one_batch_pause_it_and_its_owner_alone_is_told(db: Database) -> None:
    with db.transaction() as s:
        s.add(Organization(id="org-n", name="notify-unit"))
        s.flush()
        s.add_all([User(id="usr-a", org_id="org-n", name="ann"), User(id="usr-b", org_id="org-n", name="bob")])
        s.flush()
        broken = _sub("sub-broken", "usr-a", ["test"])
        s.add_all([broken, _sub("sub-ann", "usr-a", ["subscription.*"]), _sub("sub-bob", "usr-b", ["*"])])
        s.flush()
        ids = [outbox.test_event(s, broken).id for _ in range(5)]
    refused = [outbox.Outcome(i, ok=False, retry=False, status_code=410, error="HTTP 410: gone") for i in ids]
    with db.transaction() as s:
        outbox.record(s, refused, retry_base=1.0, max_attempts=5, pause_after=5)
    with db.transaction() as s:
        sub = s.get(NotificationSubscription, "sub-broken")
        assert sub is not None and (sub.state, sub.failures) == ("paused", 5)
        assert outbox.fan_out(s) == 1
    with db.read() as s:
        told = s.scalars(select(NotificationDelivery).where(NotificationDelivery.event_type == "subscription.paused"))
        assert [d.subscription_id for d in told] == ["sub-ann"]  # not bob's "*": the pause is ann's business


def test_a_culled_notebook_is_told_in_the_transaction_that_stops_it(db: Database) -> None:
    with db.transaction() as s:
        s.add(Organization(id="org-n", name="notify-unit"))
        s.flush()
        s.add(User(id="usr-a", org_id="org-n", name="ann"))
        s.flush()
        s.add(Job(id="job-nb", org_id="org-n", user_id="usr-a", name="nb", spec={}, state="SUCCEEDED"))
        s.flush()
        spec = {"name": "lab", "runtime": {"framework": "python"}}
        nb = Notebook(id="nb-1", org_id="org-n", user_id="usr-a", name="lab", spec=spec, desired="RUNNING")
        s.add(nb)
        nb.job_id = "job-nb"
    jobs = SimpleNamespace(wake=lambda: None, idempotency=None)
    service = NotebookService(db, jobs, store=None, endpoint="", wake=lambda: None)  # type: ignore[arg-type]
    assert service.cull("nb-1", "job-nb", "culled: idle for 8s")
    assert not service.cull("nb-1", "job-nb", "culled: idle for 8s")  # stopped already: told once
    with db.read() as s:
        (event,) = s.scalars(select(NotificationEvent).where(NotificationEvent.type == "notebook.culled"))
        assert (event.user_id, event.name, event.body["subject"]["message"]) == ("usr-a", "lab", "culled: idle for 8s")


def test_a_service_told_unhealthy_when_degraded_and_recovered_when_ready_again(db: Database) -> None:
    with db.transaction() as s:
        s.add(Organization(id="org-n", name="notify-unit"))
        s.flush()
        s.add(User(id="usr-a", org_id="org-n", name="ann"))
        s.flush()
        row = Service(id="svc-1", org_id="org-n", user_id="usr-a", name="web", spec={}, state="READY")
        row.model_name, row.model_version, row.desired_replicas = "m", 1, 1
        s.add(row)
        moves = (("DEPLOYING", "READY"), ("READY", "DEGRADED"), ("DEGRADED", "DEGRADED"), ("DEGRADED", "READY"))
        for was, now in moves:
            row.state = now
            notification_events.service_state_changed(s, row, was)
    with db.read() as s:
        kinds = [e.type for e in s.scalars(select(NotificationEvent).order_by(NotificationEvent.created_at))]
    assert kinds == ["service.unhealthy", "service.recovered"]
