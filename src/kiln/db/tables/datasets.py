"""Datasets: blobs, datasets, versions and their files, uploads."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from kiln.db.tables.base import Base, utcnow


class DataBlob(Base):
    """The content of dataset files, content-addressed per organisation (``orgs/<org>/data/sha256/..``): one row
    however many files of however many versions hold these bytes."""

    __tablename__ = "data_blobs"

    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Dataset(Base):
    """A dataset name of an organisation; its content lives in numbered, immutable versions."""

    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    name: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_datasets_org_name", "org_id", "name", unique=True),)


class DatasetVersion(Base):
    """A manifest of files. A draft (``version`` NULL) is invisible; committing it, once every blob is stored,
    gives it the next number and makes it the latest."""

    __tablename__ = "dataset_versions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    version: Mapped[int | None] = mapped_column(Integer, default=None)
    state: Mapped[str] = mapped_column(String(16), default="draft")  # draft | ready
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    file_count: Mapped[int] = mapped_column(Integer, default=0)
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    committed_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (
        Index("ux_dataset_versions_number", "dataset_id", "version", unique=True),
        Index("ix_dataset_versions_manifest", "dataset_id", "manifest_sha256"),
    )


class DatasetFile(Base):
    """One file of a dataset version: its relative path and the blob that holds its bytes."""

    __tablename__ = "dataset_files"

    version_id: Mapped[str] = mapped_column(ForeignKey("dataset_versions.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(32))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))

    __table_args__ = (Index("ix_dataset_files_org_sha", "org_id", "sha256"),)


class DataUpload(Base):
    """An open upload session of one blob: one per (organisation, sha256), so asking again resumes it. Its size
    counts against the storage quota from the moment it is opened."""

    __tablename__ = "data_uploads"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    part_size: Mapped[int] = mapped_column(BigInteger)
    mode: Mapped[str] = mapped_column(String(16))  # api | presigned
    store_upload_id: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_data_uploads_org_sha", "org_id", "sha256", unique=True),)


class DataUploadPart(Base):
    """A part of an upload session: what the client declared (size, checksums) and whether it was received."""

    __tablename__ = "data_upload_parts"

    upload_id: Mapped[str] = mapped_column(ForeignKey("data_uploads.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    md5: Mapped[str | None] = mapped_column(String(32), default=None)  # hex
    received: Mapped[bool] = mapped_column(Boolean, default=False)
