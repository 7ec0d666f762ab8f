"""datasets: names, numbered versions, files, content-addressed data blobs, resumable upload sessions

Revision ID: 20261130_0005
Revises: 20261130_0004
"""

import sqlalchemy as sa
from alembic import op

revision = "20261130_0005"
down_revision = "20261130_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "data_blobs",
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        sa.PrimaryKeyConstraint("org_id", "sha256"),
    )
    op.create_table(
        "datasets",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ux_datasets_org_name", "datasets", ["org_id", "name"], unique=True)
    op.create_table(
        "dataset_versions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("manifest_sha256", sa.String(length=64), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ux_dataset_versions_number", "dataset_versions", ["dataset_id", "version"], unique=True)
    op.create_index("ix_dataset_versions_manifest", "dataset_versions", ["dataset_id", "manifest_sha256"])
    op.create_table(
        "dataset_files",
        sa.Column("version_id", sa.String(length=32), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["version_id"], ["dataset_versions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("version_id", "path"),
    )
    op.create_index("ix_dataset_files_org_sha", "dataset_files", ["org_id", "sha256"])
    op.create_table(
        "data_uploads",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("part_size", sa.BigInteger(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("store_upload_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ux_data_uploads_org_sha", "data_uploads", ["org_id", "sha256"], unique=True)
    op.create_table(
        "data_upload_parts",
        sa.Column("upload_id", sa.String(length=32), nullable=False),
        sa.Column("number", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("md5", sa.String(length=32), nullable=True),
        sa.Column("received", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["upload_id"], ["data_uploads.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("upload_id", "number"),
    )


def downgrade() -> None:
    op.drop_table("data_upload_parts")
    op.drop_index("ux_data_uploads_org_sha", table_name="data_uploads")
    op.drop_table("data_uploads")
    op.drop_index("ix_dataset_files_org_sha", table_name="dataset_files")
    op.drop_table("dataset_files")
    op.drop_index("ix_dataset_versions_manifest", table_name="dataset_versions")
    op.drop_index("ux_dataset_versions_number", table_name="dataset_versions")
    op.drop_table("dataset_versions")
    op.drop_index("ux_datasets_org_name", table_name="datasets")
    op.drop_table("datasets")
    op.drop_table("data_blobs")
