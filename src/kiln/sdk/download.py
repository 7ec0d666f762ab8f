"""Dataset download (``get_dataset``): every file goes to a temporary name, its size and SHA-256 are checked
against the manifest, then it is renamed (from the API, or from the store when the API redirects to a presigned
URL).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from kiln.domain.datasets import DatasetManifest
from kiln.errors import DigestMismatch, KilnError, StoreUnavailable
from kiln.sdk.local_files import READ_CHUNK, safe_target
from kiln.sdk.transfer import DEFAULT_WORKERS, Progress, TransferBase, run_all


class DownloadMixin(TransferBase):
    """``get_dataset`` of ``kiln.Client``."""

    if TYPE_CHECKING:

        def dataset_manifest(self, ref: str) -> DatasetManifest: ...

    def get_dataset(
        self,
        ref: str,
        dest: Path | str,
        progress: Progress | None = None,
        *,
        on_total: Callable[[int], None] | None = None,
        workers: int = DEFAULT_WORKERS,
    ) -> DatasetManifest:
        """Download ``NAME[@VERSION]`` (default: the latest) into ``dest``; every file's size and SHA-256 is checked
        before it takes its name (a mismatch raises DigestMismatch and leaves nothing under that name)."""
        manifest = self.dataset_manifest(ref)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        targets = [(entry, safe_target(dest, entry.path)) for entry in manifest.items]
        if on_total:
            on_total(manifest.size)
        base = f"/datasets/{quote(manifest.name, safe='')}/versions/{manifest.version}/files/"
        with ThreadPoolExecutor(max(1, workers), thread_name_prefix="kiln-get") as pool:
            run_all(
                pool,
                [
                    partial(self._fetch, base + quote(e.path, safe="/"), e.path, e.sha256, e.size, t, progress)
                    for e, t in targets
                ],
            )
        return manifest

    @contextmanager
    def _open_file(self, api_path: str) -> Iterator[httpx.Response]:
        url, headers = self._prepare("GET", api_path, None, b"", False)
        try:
            with self._http.stream("GET", url, headers=headers) as response:
                if response.status_code in (301, 302, 303, 307, 308):
                    location = response.headers["location"]
                    with self._store_http().stream("GET", location) as stored:
                        if stored.status_code >= 300:
                            stored.read()
                            raise StoreUnavailable(
                                f"the object store refused a download: HTTP {stored.status_code} {stored.text[:300]}"
                            )
                        yield stored
                    return
                if response.status_code >= 400:
                    response.read()
                    self._raise_for(response)
                yield response
        except httpx.TransportError as exc:
            raise KilnError(f"download of {api_path} failed: {exc}") from exc

    def _fetch(self, api_path: str, rel: str, sha256: str, size: int, target: Path, progress: Progress | None) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.kiln-{secrets.token_hex(4)}")
        digest = hashlib.sha256()
        got = 0
        try:
            with self._open_file(api_path) as response, open(tmp, "wb") as fh:
                for chunk in response.iter_bytes(READ_CHUNK):
                    digest.update(chunk)
                    fh.write(chunk)
                    got += len(chunk)
                    if progress:
                        progress(len(chunk))
            if got != size or digest.hexdigest() != sha256:
                raise DigestMismatch(
                    f"{rel}: downloaded {got} bytes hashing to {digest.hexdigest()}, the manifest says {size} bytes "
                    f"with SHA-256 {sha256}; nothing written under its name"
                )
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
