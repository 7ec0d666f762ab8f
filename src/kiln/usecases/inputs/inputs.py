"""A job's ``inputs``: pinned to a version at submit, resolved to files when an attempt starts. An input is a
dataset version (``dataset: NAME@VERSION``) or a registered model's version (``model: NAME@VERSION|ALIAS``, pinned
to the number), both staged from the organisation's data blobs, or an ended job's outputs (``job: ID``, read at
submit: ``kiln.usecases.inputs.output_manifests``), staged from that job's outputs."""

from __future__ import annotations

from collections.abc import Callable

from kiln.backends.base import InputFile, ResolvedInput
from kiln.domain.spec import InputSpec, JobSpec
from kiln.errors import InvalidInput, NotFound
from kiln.usecases.data.dataset_names import data_prefix
from kiln.usecases.data.datasets import DatasetService
from kiln.usecases.inputs.output_manifests import OutputManifests
from kiln.usecases.models.model_registry import ModelRegistry


def dataset_pinner(datasets: DatasetService) -> Callable[[str, str], tuple[str, int]]:
    """(org id, NAME[@VERSION]) → (name, version) of a ready version; NotFound when there is none."""

    def pin(org_id: str, ref: str) -> tuple[str, int]:
        resolved = datasets.resolve(org_id, ref)
        return resolved.name, resolved.version

    return pin


def model_pinner(models: ModelRegistry) -> Callable[[str, int, InputSpec], InputSpec]:
    """(org id, index in ``inputs``, a model input) → the input with its version as a number (an alias or the
    latest as it is now), so that every attempt reads the same files; a 422 naming the field otherwise."""

    def pin(org_id: str, index: int, item: InputSpec) -> InputSpec:
        field = f"inputs[{index}].model"
        try:
            name, version = models.resolve(org_id, item.model or "")
        except NotFound as exc:
            why = exc.message
            if not exc.details:
                why += " (register one with `kiln models register NAME --from-job JOB --path FILE`)"
            raise InvalidInput(f"{field}: {why}", details={"field": f"spec.{field}"}) from None
        return item.model_copy(update={"model": f"{name}@{version}"})

    return pin


def job_output_pinner(manifests: OutputManifests) -> Callable[[str, int, InputSpec], InputSpec]:
    """(org id, index in ``inputs``, a job input) → the input, its job's outputs checked and read (a 422 naming
    the field when the job is not the organisation's or has not succeeded)."""

    def pin(org_id: str, index: int, item: InputSpec) -> InputSpec:
        manifests.pin(org_id, item.job or "", f"spec.inputs[{index}].job")
        return item

    return pin


def input_resolver(
    datasets: DatasetService, models: ModelRegistry | None = None, manifests: OutputManifests | None = None
) -> Callable[[str, JobSpec], tuple[ResolvedInput, ...]]:
    """(org id, spec) → each input's files, at the version the spec pins."""

    def resolve(org_id: str, spec: JobSpec) -> tuple[ResolvedInput, ...]:
        out = []
        for item in spec.inputs:
            if item.job is not None:
                if manifests is None:
                    raise NotFound(f"input job {item.job}: this server reads no job outputs as inputs")
                out.append(manifests.get(org_id, item.job).resolved(org_id, item))
                continue
            if item.model is not None:
                if models is None:
                    raise NotFound(f"input {item.model}: this server keeps no models")
                found = models.files(org_id, item.model)
                name, version, files = found.name, found.version, found.files
            else:
                data = datasets.resolve(org_id, item.dataset or "")
                name, version, files = data.name, data.version, data.files
            out.append(
                ResolvedInput(
                    name=name,
                    version=version,
                    path=item.where,
                    env=item.env,
                    mode=item.mode,
                    files=tuple(InputFile(f.path, f.size, f.sha256, f.key) for f in files),
                    blob_prefix=data_prefix(org_id),
                )
            )
        return tuple(out)

    return resolve
