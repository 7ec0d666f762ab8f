"""A job's ``inputs``: pinned to a version at submit, resolved to files when an attempt starts."""

from __future__ import annotations

from collections.abc import Callable

from kiln.backends.base import InputFile, ResolvedInput
from kiln.domain.spec import JobSpec, input_env_name
from kiln.services.dataset_names import data_prefix
from kiln.services.datasets import DatasetService


def dataset_pinner(datasets: DatasetService) -> Callable[[str, str], tuple[str, int]]:
    """(org id, NAME[@VERSION]) → (name, version) of a ready version; NotFound when there is none."""

    def pin(org_id: str, ref: str) -> tuple[str, int]:
        resolved = datasets.resolve(org_id, ref)
        return resolved.name, resolved.version

    return pin


def input_resolver(datasets: DatasetService) -> Callable[[str, JobSpec], tuple[ResolvedInput, ...]]:
    """(org id, spec) → each input's files, at the version the spec pins."""

    def resolve(org_id: str, spec: JobSpec) -> tuple[ResolvedInput, ...]:
        out = []
        for item in spec.inputs:
            found = datasets.resolve(org_id, item.dataset)
            out.append(
                ResolvedInput(
                    name=found.name,
                    version=found.version,
                    path=item.where,
                    env=input_env_name(item.dataset),
                    mode=item.mode,
                    files=tuple(InputFile(f.path, f.size, f.sha256, f.key) for f in found.files),
                    blob_prefix=data_prefix(org_id),
                )
            )
        return tuple(out)

    return resolve
