"""pipelines: runs of pipeline specs and their steps, and pipelines on a cron schedule

Revision ID: 20261208_0019
Revises: 20261207_0018
"""

import sqlalchemy as sa
from alembic import op

revision = "20261208_0019"
down_revision = "20261207_0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pipeline_runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("code_sha256", sa.String(length=64), nullable=True),
        sa.Column("use_cache", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"], name="fk_pipeline_runs_org_id_organizations"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_pipeline_runs_user_id_users"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_pipeline_runs_org_created", "pipeline_runs", ["org_id", "created_at"])
    op.create_index("ix_pipeline_runs_state", "pipeline_runs", ["state"])
    op.create_table(
        "pipeline_steps",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cache_key", sa.String(length=64), nullable=True),
        sa.Column("cached", sa.Boolean(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["pipeline_runs.id"], name="fk_pipeline_steps_run_id_pipeline_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "name"),
    )
    op.create_index("ix_pipeline_steps_cache_key", "pipeline_steps", ["cache_key"])
    op.create_table(
        "pipeline_schedules",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("code_sha256", sa.String(length=64), nullable=True),
        sa.Column("use_cache", sa.Boolean(), nullable=False),
        sa.Column("cron", sa.String(length=128), nullable=False),
        sa.Column("next_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_run_id", sa.String(length=32), nullable=True),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"], name="fk_pipeline_schedules_org_id_organizations"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_pipeline_schedules_user_id_users"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_pipeline_schedules_next_at", "pipeline_schedules", ["next_at"])


def downgrade() -> None:
    op.drop_table("pipeline_schedules")
    op.drop_table("pipeline_steps")
    op.drop_table("pipeline_runs")
