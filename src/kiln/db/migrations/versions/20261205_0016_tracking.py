"""tracking: experiments and runs (every job a run), their params and tags; metric series belong to runs

Revision ID: 20261205_0016
Revises: 20261204_0015
"""

import json
import os
import time
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision = "20261205_0016"
down_revision = "20261204_0015"
branch_labels = None
depends_on = None

NAMING = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
BATCH = 5000  # rows per INSERT of the runs and params made for existing jobs


def _new_id(prefix: str) -> str:
    millis, random = int(time.time() * 1000), int.from_bytes(os.urandom(4), "big") >> 2
    text = ""
    for _ in range(10):
        text = _ALPHABET[millis % 32] + text
        millis //= 32
    tail = ""
    for _ in range(6):
        tail = _ALPHABET[random % 32] + tail
        random //= 32
    return f"{prefix}-{text}{tail}"


def _millis(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return int(value.timestamp() * 1000)


def _number(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if number == number and abs(number) != float("inf") else None


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("lifecycle_stage", sa.String(length=16), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ux_experiments_org_name", "experiments", ["org_id", "name"], unique=True)
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("experiment_id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("start_time", sa.BigInteger(), nullable=True),
        sa.Column("end_time", sa.BigInteger(), nullable=True),
        sa.Column("lifecycle_stage", sa.String(length=16), nullable=False),
        sa.Column("artifact_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_runs_experiment_start", "runs", ["experiment_id", "start_time"])
    op.create_index("ix_runs_org", "runs", ["org_id"])
    op.create_index("ix_runs_job", "runs", ["job_id"])
    op.create_table(
        "run_params",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("number", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key"),
    )
    op.create_index("ix_run_params_key_number", "run_params", ["key", "number"])
    op.create_table(
        "run_tags",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key"),
    )
    _runs_of_existing_jobs()
    # A metric series belongs to a run (a job's run has the job's id): runs logged from outside Kiln, which have
    # no job, have series too. No foreign key: deleting a run or a job deletes its series by name.
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("metric_series_job_id_fkey", "metric_series", type_="foreignkey")
    else:
        with op.batch_alter_table("metric_series", recreate="always", naming_convention=NAMING) as batch:
            batch.drop_constraint("fk_metric_series_job_id_jobs", type_="foreignkey")


def _runs_of_existing_jobs() -> None:
    """Every job so far becomes a run of its organisation's Default experiment, with its spec's params."""
    bind = op.get_bind()
    meta = sa.MetaData()
    jobs = sa.Table("jobs", meta, autoload_with=bind)
    experiments = sa.Table("experiments", meta, autoload_with=bind)
    runs = sa.Table("runs", meta, autoload_with=bind)
    params = sa.Table("run_params", meta, autoload_with=bind)
    defaults: dict[str, str] = {}
    made: list[dict[str, object]] = []  # the runs
    logged: list[dict[str, object]] = []  # their params
    now = datetime.now().astimezone()
    rows = bind.execute(
        sa.select(jobs.c.id, jobs.c.org_id, jobs.c.user_id, jobs.c.name, jobs.c.spec, jobs.c.created_at)
    )
    for job_id, org_id, user_id, name, spec, created_at in rows.all():
        if org_id not in defaults:
            defaults[org_id] = _new_id("exp")
            bind.execute(
                experiments.insert().values(
                    id=defaults[org_id],
                    org_id=org_id,
                    name="Default",
                    lifecycle_stage="active",
                    tags={},
                    created_at=now,
                    updated_at=now,
                )
            )
        made.append(
            {
                "id": job_id,
                "org_id": org_id,
                "experiment_id": defaults[org_id],
                "job_id": job_id,
                "user_id": user_id,
                "name": name or "",
                "status": "RUNNING",
                "start_time": _millis(created_at),
                "end_time": None,
                "lifecycle_stage": "active",
                "created_at": now,
            }
        )
        spec = json.loads(spec) if isinstance(spec, str) else spec or {}
        logged += [
            {"run_id": job_id, "key": str(k)[:250], "value": _text(v), "number": _number(_text(v))}
            for k, v in (spec.get("params") or {}).items()
        ]
    # In batches, not a statement per job: 100,000 jobs took 58 s on PostgreSQL one by one (benchmarks/upgrade.py).
    for table, values in ((runs, made), (params, logged)):
        for start in range(0, len(values), BATCH):
            bind.execute(table.insert(), values[start : start + BATCH])


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def downgrade() -> None:
    op.execute("DELETE FROM metric_series WHERE job_id NOT IN (SELECT id FROM jobs)")  # external runs' series
    if op.get_bind().dialect.name == "postgresql":
        op.create_foreign_key(
            "metric_series_job_id_fkey", "metric_series", "jobs", ["job_id"], ["id"], ondelete="CASCADE"
        )
    else:
        with op.batch_alter_table("metric_series", recreate="always") as batch:
            batch.create_foreign_key("fk_metric_series_job_id_jobs", "jobs", ["job_id"], ["id"], ondelete="CASCADE")
    op.drop_table("run_tags")
    op.drop_index("ix_run_params_key_number", table_name="run_params")
    op.drop_table("run_params")
    op.drop_index("ix_runs_job", table_name="runs")
    op.drop_index("ix_runs_org", table_name="runs")
    op.drop_index("ix_runs_experiment_start", table_name="runs")
    op.drop_table("runs")
    op.drop_index("ux_experiments_org_name", table_name="experiments")
    op.drop_table("experiments")
