"""Request models refuse what is over a platform maximum (kiln.domain.limits) with a validation error naming the
field: never an OverflowError (a 500), never a value too large for a database integer."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from kiln.domain import limits
from kiln.domain.datasets import DatasetFileEntry, DraftCreate, PartUrlsRequest, SmallBlobsHeader, UploadCreate
from kiln.domain.schemas import KeyCreate, QuotaSet
from kiln.domain.spec import JobSpec

SHA = "0" * 64


def refused(model: type[BaseModel], data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The locations of the errors ``data`` has (ValidationError, the only exception allowed)."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return [tuple(e["loc"]) for e in info.value.errors()]


def job(**fields: Any) -> dict[str, Any]:
    return {"command": "true", **fields}


@pytest.mark.parametrize(
    "size", [2**63, 2628206758546830848, 36_000_000_000_000_000_000, limits.MAX_FILE_BYTES + 1, -1]
)
def test_a_file_size_over_5_tib_is_refused_wherever_a_client_sends_one(size: int) -> None:
    assert refused(UploadCreate, {"sha256": SHA, "size": size}) == [("size",)]
    assert refused(DatasetFileEntry, {"path": "a", "size": size, "sha256": SHA}) == [("size",)]
    assert UploadCreate(sha256=SHA, size=limits.MAX_FILE_BYTES).size == 5 * 1024**4


def test_upload_part_sizes_and_numbers_stay_within_s3s_limits() -> None:
    assert refused(UploadCreate, {"sha256": SHA, "size": 1, "part_size": limits.MAX_PART_BYTES + 1}) == [("part_size",)]
    part = {"size": 1, "md5": "0" * 32, "crc32": "0" * 8}
    assert refused(PartUrlsRequest, {"parts": [{**part, "number": limits.MAX_UPLOAD_PARTS + 1}]}) == [
        ("parts", 0, "number")
    ]
    assert refused(SmallBlobsHeader, {"blobs": [{"sha256": SHA, "size": limits.MAX_SIGNED_BODY_BYTES + 1}]}) == [
        ("blobs", 0, "size")
    ]


def test_numbers_are_numbers_not_booleans_or_numeric_strings() -> None:
    assert refused(UploadCreate, {"sha256": SHA, "size": 10, "part_size": True}) == [("part_size",)]
    assert refused(UploadCreate, {"sha256": SHA, "size": "10"}) == [("size",)]
    assert refused(JobSpec, job(resources={"gpus": True})) == [("resources", "gpus")]
    assert refused(JobSpec, job(distributed={"framework": "pytorch", "workers": True})) == [("distributed", "workers")]
    assert refused(JobSpec, job(metrics={"system": "yes"})) == [("metrics", "system")]
    assert JobSpec.model_validate(job(resources={"cpus": 2})).resources.cpus == 2.0  # an int is a number


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_infinities_and_nan_are_refused(value: float) -> None:
    assert refused(JobSpec, job(resources={"cpus": value})) == [("resources", "cpus")]
    assert refused(JobSpec, job(metrics={"system_interval": value})) == [("metrics", "system_interval")]
    assert refused(KeyCreate, {"expires_in": value}) == [("expires_in",)]
    assert refused(QuotaSet, {"cpus": value}) == [("cpus",)]


@pytest.mark.parametrize("memory", ["9" * 400 + "G", "1" * 33, 2**63, limits.MAX_RESOURCE_BYTES + 1, math.inf, "2P"])
def test_memory_and_disk_over_the_maximum_or_out_of_range_are_refused(memory: Any) -> None:
    assert refused(JobSpec, job(resources={"memory": memory})) == [("resources", "memory")]
    assert refused(JobSpec, job(resources={"disk": memory})) == [("resources", "disk")]


def test_quantities_up_to_the_maximum_are_taken() -> None:
    spec = JobSpec.model_validate(job(resources={"memory": "1024Ti", "disk": "20G"}))
    assert spec.resources.memory == limits.MAX_RESOURCE_BYTES and spec.resources.disk == 20 * 1024**3


@pytest.mark.parametrize("timeout", [limits.MAX_DURATION_SECONDS + 1, "9" * 400, "1" * 40 + "h", 10**400])
def test_timeouts_over_a_year_or_out_of_range_are_refused(timeout: Any) -> None:
    assert refused(JobSpec, job(timeout=timeout)) == [("timeout",)]


def test_quota_limits_fit_their_database_columns() -> None:
    assert refused(QuotaSet, {"gpus": limits.MAX_INT32 + 1}) == [("gpus",)]
    assert refused(QuotaSet, {"count": 2**40}) == [("count",)]
    assert refused(QuotaSet, {"storage": "9" * 30 + "T"}) == [("storage",)]
    assert refused(QuotaSet, {"memory": 2**63}) == [("memory",)]
    assert QuotaSet.model_validate({"storage": "1T"}).storage == 1024**4


def test_key_lifetimes_are_bounded_and_convertible_to_utc() -> None:
    assert refused(KeyCreate, {"expires_in": 1e308}) == [("expires_in",)]
    late = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5)))
    assert refused(KeyCreate, {"expires_at": late}) == [("expires_at",)]
    assert KeyCreate(expires_in=limits.MAX_KEY_LIFETIME_SECONDS).expires_in == limits.MAX_KEY_LIFETIME_SECONDS


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"env": {f"V{i}": "x" for i in range(limits.MAX_ENV_VARS + 1)}}, ("env",)),
        ({"env": {"V": "x" * (limits.MAX_ARG_LENGTH + 1)}}, ("env", "V")),
        ({"labels": {f"k{i}": "v" for i in range(limits.MAX_LABELS + 1)}}, ("labels",)),
        ({"node_selector": {f"k{i}": "v" for i in range(limits.MAX_LABELS + 1)}}, ("node_selector",)),
        ({"command": ["x"] * (limits.MAX_COMMAND_ARGS + 1)}, ("command",)),
        ({"command": ["x" * (limits.MAX_ARG_LENGTH + 1)]}, ("command",)),
        ({"command": "x" * (limits.MAX_COMMAND_LENGTH + 1)}, ("command",)),
        ({"runtime": {"python": "/" + "p" * limits.MAX_TEXT_LENGTH}}, ("runtime", "python")),
        ({"restart_on_exit_codes": [1] * (limits.MAX_EXIT_CODES + 1)}, ("restart_on_exit_codes",)),
        ({"inputs": [{"dataset": "d" * 200}]}, ("inputs", 0, "dataset")),
        ({"inputs": [{"dataset": "data@²"}]}, ("inputs", 0, "dataset")),
        ({"inputs": [{"dataset": "data@99999999999"}]}, ("inputs", 0, "dataset")),
        ({"metrics": {"tensorboard_dir": "t" * (limits.MAX_PATH_LENGTH + 1)}}, ("metrics", "tensorboard_dir")),
    ],
)
def test_job_spec_sizes_are_bounded(fields: dict[str, Any], where: tuple[Any, ...]) -> None:
    assert any(loc[: len(where)] == where for loc in refused(JobSpec, job(**fields)))


@pytest.mark.parametrize("regex", [r"(?P<loss>a){99999999999}", r"(?P<loss>a{5,2})"])
def test_a_metric_regex_that_cannot_compile_is_a_validation_error(regex: str) -> None:
    assert refused(JobSpec, job(metrics={"patterns": [{"regex": regex}]})) == [("metrics", "patterns", 0)]


def test_a_manifest_lists_at_most_a_million_files() -> None:
    field = DraftCreate.model_fields["files"]
    assert any(getattr(m, "max_length", None) == limits.MAX_MANIFEST_FILES for m in field.metadata)
