"""Validation against the official Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields fail)."""

from __future__ import annotations

from typing import Any

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]'")
import functools  # noqa: E402

from kubernetes_validate import utils  # noqa: E402
from kubernetes_validate.utils import latest_version  # noqa: E402

# validate() reads and parses the (large) schema files on every call; the files never change, so parse each
# once: the validation itself is kubernetes-validate's own, unchanged.
utils.schema_contents = functools.lru_cache(maxsize=None)(utils.schema_contents)

OLDEST = "1.29"
NEWEST = ".".join(latest_version().split(".")[:2])
VERSIONS = [OLDEST, NEWEST]
CRD_KINDS = {"PodGroup"}  # Volcano's: not in the official schemas, checked field by field instead


def validate_strict(objects: list[dict[str, Any]], version: str) -> None:
    """Every built-in object validates strictly against ``version``'s schema (a failure names the object)."""
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            raise AssertionError(
                f"{obj['kind']}/{obj['metadata']['name']} @ {version}: {path}: {exc.message}"
            ) from None
