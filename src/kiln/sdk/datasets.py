"""Datasets: versioned, content-addressed file sets. A mixin of ``kiln.Client`` (which supplies the transport).

``put_dataset`` hashes every file (SHA-256), sends the manifest, and uploads only the blobs the server lacks, in
parts, a few at a time: through the API on a local store, straight to the store through presigned URLs on S3.
It is resumable: the server keeps each blob's upload session and the parts it holds, and a small state file
(under ``uploads/`` in the client's state directory, ``kiln.sdk.config.client_dir()``; keyed by endpoint, dataset
name and manifest hash) records the draft and the parts the server acknowledged, so running the same ``put`` again
after an interruption sends only what is left.

``get_dataset`` downloads every file to a temporary name, checks its size and SHA-256 against the manifest, then
renames it: the hash computed before the upload is verified again after the download (end to end).

The pieces: ``kiln.sdk.local_files`` (scanning, hashing, the resume file), ``kiln.sdk.upload`` (``put_dataset``),
``kiln.sdk.download`` (``get_dataset``) and ``kiln.sdk.transfer`` (what they share); this module holds the reads and
removal, and ``DatasetsMixin``, which brings them together.
"""

from __future__ import annotations

from urllib.parse import quote

from kiln.domain import dataset_refs
from kiln.domain.datasets import DatasetManifest, DatasetRemoved, DatasetSummary, DatasetVersionRead
from kiln.errors import BadRequest
from kiln.sdk.download import DownloadMixin
from kiln.sdk.local_files import READ_CHUNK, LocalFile, UploadState, manifest_sha256, scan_local, sha256_file
from kiln.sdk.transfer import DEFAULT_WORKERS, Progress
from kiln.sdk.upload import (
    HASHERS,
    MAX_PARTS,
    PART_SHA256_HEADER,
    PUT_PART_BYTES,
    PUT_WORKERS,
    URL_BATCH,
    URL_FRESH,
    PartHook,
    UploadMixin,
    preferred_part_size,
)

# Defined in the modules above; importable from here as before the split.
__all__ = [
    "DEFAULT_WORKERS",
    "HASHERS",
    "MAX_PARTS",
    "PART_SHA256_HEADER",
    "PUT_PART_BYTES",
    "PUT_WORKERS",
    "READ_CHUNK",
    "URL_BATCH",
    "URL_FRESH",
    "DatasetsMixin",
    "LocalFile",
    "PartHook",
    "Progress",
    "UploadState",
    "manifest_sha256",
    "parse_ref",
    "preferred_part_size",
    "scan_local",
    "sha256_file",
]


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``NAME``, ``NAME@latest`` or ``NAME@VERSION`` → (name, version or None). The server's own parser
    (``kiln.domain.dataset_refs``): a reference the server refuses raises the same BadRequest here, unsent."""
    try:
        return dataset_refs.parse_ref(ref)
    except dataset_refs.DatasetRefError as exc:
        raise BadRequest(str(exc)) from None


class DatasetsMixin(UploadMixin, DownloadMixin):
    """The dataset methods of ``kiln.Client``."""

    # -- reads ----------------------------------------------------------------------------------------------

    def datasets(self) -> list[DatasetSummary]:
        return [DatasetSummary.model_validate(d) for d in self.request("GET", "/datasets").json()["items"]]

    def dataset_versions(self, name: str) -> list[DatasetVersionRead]:
        data = self.request("GET", f"/datasets/{quote(name, safe='')}").json()
        return [DatasetVersionRead.model_validate(v) for v in data["items"]]

    def dataset_manifest(self, ref: str) -> DatasetManifest:
        name, version = parse_ref(ref)
        path = f"/datasets/{quote(name, safe='')}/versions/{version or 'latest'}"
        return DatasetManifest.model_validate(self.request("GET", path).json())

    def remove_dataset(self, ref: str) -> DatasetRemoved:
        """``NAME@VERSION``: that version; ``NAME``: every version. Blobs no other version uses are deleted."""
        name, version = parse_ref(ref)
        # NAME@latest is not NAME (every version): the server refuses it, as any version that is not a number.
        versioned = "@" in ref
        path = f"/datasets/{quote(name, safe='')}" + (f"/versions/{version or 'latest'}" if versioned else "")
        return DatasetRemoved.model_validate(self.request("DELETE", path).json())
