"""Validation against the official Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields fail)."""

from __future__ import annotations

import functools
from typing import Any

from tests.components import require

# Only the tests that validate against the schemas need kubernetes-validate (a dev dependency): they call
# validate_strict, which fails (or, opted out with KILN_TEST_WITHOUT=kubernetes-validate, skips) without it. The
# other tests of this folder run either way.
try:
    import kubernetes_validate
    from kubernetes_validate import utils
    from kubernetes_validate.utils import latest_version
except ImportError:
    kubernetes_validate = None
    NEWEST = "newest"  # a test id only: validate_strict stops before it would use it
else:
    # validate() reads and parses the (large) schema files on every call; the files never change, so parse each
    # once: the validation itself is kubernetes-validate's own, unchanged.
    utils.schema_contents = functools.lru_cache(maxsize=None)(utils.schema_contents)
    NEWEST = ".".join(latest_version().split(".")[:2])

OLDEST = "1.29"
VERSIONS = [OLDEST, NEWEST]
CRD_KINDS = {"PodGroup"}  # Volcano's: not in the official schemas, checked field by field instead


def validate_strict(objects: list[dict[str, Any]], version: str) -> None:
    """Every built-in object validates strictly against ``version``'s schema (a failure names the object)."""
    require("kubernetes-validate")
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
