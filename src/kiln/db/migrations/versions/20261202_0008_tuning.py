"""tuning studies, their trials and events; on PostgreSQL the schema that holds Optuna's own tables

Revision ID: 20261202_0008
Revises: 20261202_0007
"""

import sqlalchemy as sa
from alembic import op

revision = "20261202_0008"
down_revision = "20261202_0007"
branch_labels = None
depends_on = None

# Optuna's storage keeps its own tables and its own Alembic version table (named alembic_version, like Kiln's):
# on PostgreSQL they live in this schema of Kiln's database (kiln.usecases.tuning.tuning_engine).
OPTUNA_SCHEMA = "kiln_optuna"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"CREATE SCHEMA IF NOT EXISTS {OPTUNA_SCHEMA}")
    op.create_table(
        "tuning_studies",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("code_sha256", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("planned_trials", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_tuning_studies_state", "tuning_studies", ["state"])
    op.create_index("ix_tuning_studies_org_created", "tuning_studies", ["org_id", "created_at"])
    op.create_table(
        "tuning_trials",
        sa.Column("study_id", sa.String(length=32), nullable=False),
        sa.Column("number", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("optuna_trial_id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("value", sa.Float(precision=53), nullable=True),
        sa.Column("reported_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=True),
        sa.Column("last_value", sa.Float(precision=53), nullable=True),
        sa.Column("pruned_step", sa.BigInteger(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("told", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["study_id"], ["tuning_studies.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("study_id", "number"),
    )
    op.create_index("ix_tuning_trials_job_id", "tuning_trials", ["job_id"])
    op.create_index("ux_tuning_trials_optuna", "tuning_trials", ["study_id", "optuna_trial_id"], unique=True)
    op.create_table(
        "tuning_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("study_id", sa.String(length=32), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("trial", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["study_id"], ["tuning_studies.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_tuning_events_study_id", "tuning_events", ["study_id"])


def downgrade() -> None:
    op.drop_table("tuning_events")
    op.drop_table("tuning_trials")
    op.drop_table("tuning_studies")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP SCHEMA IF EXISTS {OPTUNA_SCHEMA} CASCADE")
