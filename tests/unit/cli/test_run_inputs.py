"""`kiln run --input NAME[@VERSION][:PATH][:mount]`, merged with the inputs of a kiln.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.cli.spec import Overrides, SpecError, build_spec, parse_input


def test_input_flags_parse_to_input_specs() -> None:
    assert parse_input("mnist") == {"dataset": "mnist"}
    assert parse_input("mnist@3") == {"dataset": "mnist@3"}
    assert parse_input("mnist@3:mount") == {"dataset": "mnist@3", "mode": "mount"}
    assert parse_input("mnist:/data/digits") == {"dataset": "mnist", "path": "/data/digits"}
    assert parse_input("mnist@2:data/d:stage") == {"dataset": "mnist@2", "path": "data/d", "mode": "stage"}


@pytest.mark.parametrize("text", ["", ":mount", "mnist:", "mnist:mount:/p", "mnist:a:b", "mnist:mount:stage"])
def test_a_bad_input_flag_says_the_format(text: str) -> None:
    with pytest.raises(SpecError, match=r"--input expects NAME\[@VERSION\]\[:PATH\]\[:mount\]"):
        parse_input(text)


def flags(*inputs: str) -> Overrides:
    return Overrides(command=["true"], inputs=[parse_input(text) for text in inputs])


def test_input_flags_add_to_the_files_inputs_and_replace_the_same_dataset(tmp_path: Path) -> None:
    spec_file = tmp_path / "kiln.yaml"
    spec_file.write_text(
        "command: python train.py\ninputs:\n  - {dataset: mnist@1, path: /data/m}\n  - {dataset: labels}\n"
    )
    spec = build_spec(spec_file, flags("mnist@3:mount", "extra@2"))
    assert [(i.dataset, i.path, i.mode) for i in spec.inputs] == [
        ("labels", None, "stage"),
        ("mnist@3", None, "mount"),
        ("extra@2", None, "stage"),
    ]
    assert build_spec(None, flags("mnist")).inputs[0].where == "/data/mnist"


@pytest.mark.parametrize("text", ["Not_Lower", "@3", "mnist@x"])
def test_an_invalid_dataset_is_the_specs_error(text: str) -> None:
    with pytest.raises(SpecError, match=r"inputs\[0\]\.dataset"):
        build_spec(None, flags(text))
