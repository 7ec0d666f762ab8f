"""The replica's MLflow reading without PyYAML (a catalog runtime has none): an ``MLmodel`` as MLflow writes it,
with a column signature folded over lines, reads as PyYAML reads it; a signature's columns name the wrong field."""

from __future__ import annotations

import pytest
import yaml

from kiln.injob.serve_mlflow import ColumnSchema, parse_yaml, signature_schema
from kiln.injob.serve_schema import InputSchema, InvalidInput

MLMODEL = """artifact_path: model
flavors:
  python_function:
    env:
      conda: conda.yaml
      virtualenv: python_env.yaml
    loader_module: mlflow.sklearn
    model_path: model.pkl
  sklearn:
    code: null
    pickled_model: model.pkl
    serialization_format: cloudpickle
model_id: m-01m9849ekv9nq5na
signature:
  inputs: '[{"type": "double", "name": "sepal length", "required": true}, {"type":
    "double", "name": "b", "required": true}, {"type": "long", "name": "it''s", "required":
    false}]'
  outputs: '[{"type": "tensor", "tensor-spec": {"dtype": "int64", "shape": [-1]}}]'
  params: null
utc_time_created: '2026-12-07 11:32:06.485347'
"""


def test_mlmodel_reads_as_pyyaml_reads_it() -> None:
    assert parse_yaml(MLMODEL) == yaml.safe_load(MLMODEL)


def test_a_signatures_columns_name_the_wrong_field() -> None:
    schema = signature_schema(parse_yaml(MLMODEL)["signature"])
    assert isinstance(schema, ColumnSchema)
    assert schema.check([{"sepal length": 1.0, "b": 2}, [1.0, 2.0, 3]]) == [[1.0, 2, None], [1.0, 2.0, 3]]
    with pytest.raises(InvalidInput) as missing:
        schema.check([{"sepal length": 1.0, "b": 2}, {"sepal length": 1.0}])
    assert missing.value.field == "inputs[1].b"
    with pytest.raises(InvalidInput) as wrong:
        schema.check([{"sepal length": "x", "b": 2}])
    assert wrong.value.field == "inputs[0].sepal length"


def test_a_tensor_spec_is_an_input_schema() -> None:
    spec = '[{"type": "tensor", "tensor-spec": {"dtype": "float64", "shape": [-1, 4]}}]'
    assert signature_schema({"inputs": spec}) == InputSchema((4,), "float64")
