"""One dataset-reference parser (kiln.domain.dataset_refs) for the server, the SDK, the CLI and job inputs: what
one refuses, the others refuse with the same message."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kiln.cli.spec import Overrides, SpecError, build_spec, parse_input
from kiln.domain.dataset_refs import DatasetRef, DatasetRefError, parse_ref, parse_version
from kiln.domain.spec import JobSpec
from kiln.errors import BadRequest
from kiln.sdk import datasets as sdk_datasets
from kiln.usecases.data import dataset_names

NAME_RULE = "use lowercase letters, digits and . _ - (at most 100, starting with a letter or digit)"
VERSION_RULE = "the version after @ is a number from 1 to 1000000000, or 'latest'"


@pytest.mark.parametrize(
    ("ref", "parsed"),
    [
        ("mnist", ("mnist", None)),
        ("mnist@latest", ("mnist", None)),
        ("mnist@3", ("mnist", 3)),
        ("img.net_v2-b@1000000000", ("img.net_v2-b", 10**9)),
        ("0" + "a" * 99, ("0" + "a" * 99, None)),
    ],
)
def test_references(ref: str, parsed: tuple[str, int | None]) -> None:
    assert parse_ref(ref) == DatasetRef(*parsed)


BAD = [
    ("", f"dataset name '': {NAME_RULE}"),
    ("@3", f"dataset name '': {NAME_RULE}"),
    ("Mnist", f"dataset name 'Mnist': {NAME_RULE}"),
    ("-mnist", f"dataset name '-mnist': {NAME_RULE}"),
    ("a" * 101, f"dataset name '{'a' * 101}': {NAME_RULE}"),
    ("mn ist", f"dataset name 'mn ist': {NAME_RULE}"),
    ("a..b", "dataset name 'a..b': '..' is not allowed"),
    ("a/b", "dataset name 'a/b': '/', '\\' and NUL are not allowed"),
    ("a%2fb", "dataset name 'a%2fb': percent-encoded characters are not allowed"),
    ("mnist@", f"dataset reference 'mnist@': {VERSION_RULE}"),
    ("mnist@0", f"dataset reference 'mnist@0': {VERSION_RULE}"),
    ("mnist@x", f"dataset reference 'mnist@x': {VERSION_RULE}"),
    ("mnist@-1", f"dataset reference 'mnist@-1': {VERSION_RULE}"),
    ("mnist@²", f"dataset reference 'mnist@²': {VERSION_RULE}"),
    ("mnist@1000000001", f"dataset reference 'mnist@1000000001': {VERSION_RULE}"),
    ("mnist@Latest", f"dataset reference 'mnist@Latest': {VERSION_RULE}"),
    ("mnist@1@2", f"dataset reference 'mnist@1@2': {VERSION_RULE}"),
]


@pytest.mark.parametrize(("ref", "message"), BAD)
def test_the_server_the_sdk_and_a_jobs_inputs_refuse_alike(ref: str, message: str) -> None:
    with pytest.raises(DatasetRefError) as domain:
        parse_ref(ref)
    assert str(domain.value) == message
    with pytest.raises(BadRequest) as server:
        dataset_names.parse_ref(ref)
    with pytest.raises(BadRequest) as sdk:
        sdk_datasets.parse_ref(ref)
    assert server.value.message == sdk.value.message == message
    with pytest.raises(ValidationError) as spec:
        JobSpec.model_validate({"command": "true", "inputs": [{"dataset": ref}]})
    [error] = spec.value.errors()
    assert error["loc"] == ("inputs", 0, "dataset")
    assert error["msg"] == f"Value error, {message}"


def test_the_sdk_refused_names_the_server_refuses_but_it_let_through() -> None:
    # Before the one parser, the SDK took any non-empty name and the server refused it after the round trip.
    for ref in ("Mnist", "a/b", "a..b", "a%2fb", "mnist@²"):
        with pytest.raises(BadRequest):
            sdk_datasets.parse_ref(ref)


def test_an_input_flag_with_a_bad_reference_is_the_specs_error_with_the_servers_message() -> None:
    with pytest.raises(SpecError) as info:
        build_spec(None, Overrides(command=["true"], inputs=[parse_input("Mnist@3:mount")]))
    assert f"inputs[0].dataset: dataset name 'Mnist': {NAME_RULE}" in str(info.value)
    latest = build_spec(None, Overrides(command=["true"], inputs=[parse_input("mnist@latest:mount")]))
    assert latest.inputs[0].label == "mnist" and latest.inputs[0].where == "/data/mnist"


def test_versions_as_urls_write_them() -> None:
    assert parse_version("latest") is None
    assert parse_version("7") == 7
    for text in ("0", "x", "", "1000000001", "LATEST"):
        with pytest.raises(DatasetRefError) as info:
            parse_version(text)
        assert str(info.value) == f"version {text!r}: a number from 1 to 1000000000, or 'latest'"


def test_the_sdk_refuses_a_bad_name_before_it_hashes_or_sends_anything(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kiln.sdk.client import Client

    # Port 9 (discard) on a closed address: any request would fail with a connection error, not BadRequest.
    client = Client("http://127.0.0.1:9", "AKEXAMPLE00000000001", "x" * 40)
    for call in (
        lambda: client.put_dataset(tmp_path / "missing", "Bad_Name"),
        lambda: client.dataset_manifest("Bad_Name@3"),
        lambda: client.remove_dataset("bad@0"),
    ):
        with pytest.raises(BadRequest, match=r"dataset (name 'Bad_Name'|reference 'bad@0')"):
            call()
