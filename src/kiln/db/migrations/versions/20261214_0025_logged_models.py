"""logged models: what MLflow 3's client records before it uploads a model's directory (``log_model``), and the
run, logged model, flavor and signature a model version registered from a run (``--from-run``) came from.

Revision ID: 20261214_0025
Revises: 20261213_0024
"""

import sqlalchemy as sa
from alembic import op

revision = "20261214_0025"
down_revision = "20261213_0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "logged_models",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("experiment_id", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=True),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("model_type", sa.String(length=256), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("lifecycle_stage", sa.String(length=16), nullable=False),
        sa.Column("artifact_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"]),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_logged_models_org_experiment", "logged_models", ["org_id", "experiment_id"])
    op.create_index("ix_logged_models_run", "logged_models", ["run_id"])
    with op.batch_alter_table("model_versions") as batch:
        batch.add_column(sa.Column("run_id", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("logged_model_id", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("flavor", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("signature", sa.JSON(), nullable=True))
    op.create_index("ix_model_versions_run_id", "model_versions", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_model_versions_run_id", table_name="model_versions")
    with op.batch_alter_table("model_versions") as batch:
        batch.drop_column("signature")
        batch.drop_column("flavor")
        batch.drop_column("logged_model_id")
        batch.drop_column("run_id")
    op.drop_index("ix_logged_models_run", table_name="logged_models")
    op.drop_index("ix_logged_models_org_experiment", table_name="logged_models")
    op.drop_table("logged_models")
