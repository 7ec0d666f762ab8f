"""The model registry's grammar and request shapes (kiln.domain.models) and a job's model inputs (InputSpec): one
parser for the server, the SDK and the CLI, whose errors name the field and say what is allowed."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kiln.domain import models as refs
from kiln.domain.models import AliasSet, ModelRegister
from kiln.domain.serving import parse_model_ref
from kiln.domain.spec import InputSpec, JobSpec


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("digits", ("digits", None)),
        ("digits@latest", ("digits", None)),
        ("digits@3", ("digits", 3)),
        ("digits@production", ("digits", "production")),
        ("my.model_v2-x@canary-2", ("my.model_v2-x", "canary-2")),
    ],
)
def test_references_name_a_number_an_alias_or_the_latest(ref: str, expected: tuple[str, Any]) -> None:
    assert tuple(refs.parse_ref(ref)) == expected


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("Digits@1", "model name 'Digits': use lowercase letters"),
        ("a..b@1", "model name 'a..b': '..' is not allowed"),
        ("@1", "model name '': use lowercase"),
        ("digits@0", "version '0': a number from 1 to 1000000000"),
        ("digits@Prod", "version 'Prod': a number from 1, an alias, or 'latest'"),
        ("digits@", "version '': a number from 1, an alias, or 'latest'"),
        ("digits@1@2", "version '1@2'"),
    ],
)
def test_a_bad_reference_says_what_is_wrong_with_it(ref: str, message: str) -> None:
    with pytest.raises(refs.ModelRefError, match=message.replace("(", r"\(").replace(")", r"\)")):
        refs.parse_ref(ref)


def test_every_reference_a_service_spec_accepts_parses_here_too() -> None:
    for ref in ("digits@3", "digits@production", "x-1@a.b_c"):
        name, version = parse_model_ref(ref)
        assert refs.parse_ref(ref).name == name and str(refs.parse_ref(ref).ref) == version


@pytest.mark.parametrize(
    ("alias", "message"),
    [
        ("latest", "'latest' always means the newest version"),
        ("3", "starting with a letter"),
        ("Production", "use lowercase letters"),
        ("a" * 64, "at most 63"),
    ],
)
def test_an_alias_is_lowercase_starts_with_a_letter_and_is_not_latest(alias: str, message: str) -> None:
    with pytest.raises(refs.ModelRefError, match=message):
        refs.check_alias(alias)
    assert refs.check_alias("production-2") == "production-2"


@pytest.mark.parametrize(
    ("paths", "framework"),
    [
        (["model.pt"], "torch"),
        (["a/model.PTH", "b.pt2"], "torch"),
        (["model.onnx"], "onnx"),
        (["model.joblib", "extra.pkl"], "sklearn"),
        (["model.pt", "model.onnx"], "custom"),  # no agreement
        (["weights.bin", "config.json"], "custom"),
        (["model.pt", "config.json"], "torch"),  # files without a known suffix do not vote
    ],
)
def test_the_framework_is_what_the_files_suffixes_agree_on(paths: list[str], framework: str) -> None:
    assert refs.guess_framework(paths) == framework


def test_a_registration_names_a_path_inside_the_jobs_outputs() -> None:
    assert ModelRegister(job_id="job-1", path="./ckpt//best/").path == "ckpt/best"
    for path in ("../x", "a/../../b", "/", "a\\b"):
        with pytest.raises(ValidationError) as caught:
            ModelRegister(job_id="job-1", path=path)
        assert caught.value.errors()[0]["loc"] == ("path",)
    with pytest.raises(ValidationError) as caught:
        ModelRegister.model_validate({"job_id": "job-1", "path": "m.pt", "framework": "keras"})
    assert caught.value.errors()[0]["loc"] == ("framework",)
    with pytest.raises(ValidationError) as caught:
        ModelRegister.model_validate({"job_id": "job-1", "path": "m.pt", "frameworks": "torch"})
    assert caught.value.errors()[0]["loc"] == ("frameworks",)
    with pytest.raises(ValidationError):
        AliasSet.model_validate({"version": "3"})  # strict: a number, not a string


def test_an_input_is_a_dataset_or_a_model_never_both() -> None:
    model = InputSpec.model_validate({"model": "digits@production"})
    assert (model.ref, model.label, model.where, model.dataset) == (
        "digits@production",
        "digits",
        "/models/digits",
        None,
    )
    data = InputSpec.model_validate({"dataset": "mnist@2"})
    assert (data.ref, data.where) == ("mnist@2", "/data/mnist")
    job = InputSpec.model_validate({"job": "job-01abc", "name": "prep"})
    assert (job.ref, job.label, job.where, job.env) == ("job-01abc", "prep", "/data/prep", "KILN_INPUT_PREP")
    for bad in ({}, {"dataset": "mnist", "model": "digits@1"}, {"dataset": "mnist", "job": "job-01abc"}):
        with pytest.raises(ValidationError, match="give exactly one of dataset"):
            InputSpec.model_validate(bad)
    with pytest.raises(ValidationError) as caught:
        InputSpec.model_validate({"model": "digits@Prod"})
    assert caught.value.errors()[0]["loc"] == ("model",)
    assert "version 'Prod'" in caught.value.errors()[0]["msg"]


def test_a_job_cannot_read_a_dataset_and_a_model_under_one_name_or_at_one_path() -> None:
    base = {"command": "true"}
    with pytest.raises(ValidationError, match="'digits@1' and 'digits' would share KILN_INPUT_DIGITS"):
        JobSpec.model_validate({**base, "inputs": [{"dataset": "digits"}, {"model": "digits@1"}]})
    with pytest.raises(ValidationError, match="two inputs at the same path 'model'"):
        JobSpec.model_validate(
            {**base, "inputs": [{"dataset": "mnist", "path": "/model"}, {"model": "digits@1", "path": "model"}]}
        )
    spec = JobSpec.model_validate({**base, "inputs": [{"dataset": "mnist"}, {"model": "digits@1", "path": "/m"}]})
    assert [i.ref for i in spec.inputs] == ["mnist", "digits@1"]
    # A spec stored before inputs could name a model reads as it did.
    assert JobSpec.model_validate({**base, "inputs": [{"dataset": "mnist@1", "mode": "mount"}]}).inputs[0].model is None
