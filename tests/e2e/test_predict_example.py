"""The service page's "Try a prediction" starts with a body the model takes: console/src/predictExample.ts, run by
Node.js (transpiled by the console's own TypeScript), shapes one instance from the service's input schema or the
signature of a version registered --from-run, and each body it gives passes the checks a replica makes of a request
(kiln.injob.serve_schema for an input schema, kiln.injob.serve_mlflow for a signature). A tester's 64-feature model
got a body of 4 numbers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kiln.injob.serve_mlflow import signature_schema
from kiln.injob.serve_schema import InputSchema
from tests.console_modules import run_module

pytestmark = pytest.mark.needs("node")

SCHEMAS: list[dict[str, Any]] = [
    {"shape": [64], "dtype": "float32"},
    {"shape": [2, 3], "dtype": "float64"},
    {"shape": [None, 4], "dtype": "int64"},
    {"shape": [], "dtype": "float32"},
    {"dtype": "string"},
]
TENSOR = {"type": "tensor", "tensor-spec": {"dtype": "float64", "shape": [-1, 64]}}
COLUMNS = [{"type": "double", "name": "sepal length"}, {"type": "long", "name": "n"}, {"type": "string", "name": "s"}]
SIGNATURES: list[dict[str, Any]] = [
    {"inputs": json.dumps([TENSOR]), "outputs": "[]"},  # as the MLmodel file holds it: a JSON string
    {"inputs": [TENSOR]},
    {"inputs": json.dumps(COLUMNS)},
]
RUNNER = """(t, [schemas, signatures]) => ({
  schemas: schemas.map((s) => t.exampleBody(s)),
  signatures: signatures.map((s) => t.exampleBody(null, s)),
  first: t.exampleBody({ shape: [3] }, signatures[2]),
  neither: t.exampleBody(null, null),
  huge: t.exampleBody({ shape: [4096, 4096] }),
})"""


def test_the_prediction_form_starts_with_a_body_the_model_takes() -> None:
    bodies = run_module("predictExample.ts", RUNNER, [SCHEMAS, SIGNATURES])
    for schema, body in zip(SCHEMAS, bodies["schemas"], strict=True):
        inputs = json.loads(body)["inputs"]
        assert len(inputs) == 1, body
        InputSchema.parse(schema).check(inputs)  # raises InvalidInput naming the field where it does not fit
    assert len(json.loads(bodies["schemas"][0])["inputs"][0]) == 64
    for signature, body in zip(SIGNATURES, bodies["signatures"], strict=True):
        checker = signature_schema(signature)
        assert checker is not None
        checker.check(json.loads(body)["inputs"])
    assert json.loads(bodies["signatures"][2])["inputs"] == [{"sepal length": 0, "n": 0, "s": "text"}]
    assert json.loads(bodies["first"])["inputs"] == [[0, 0, 0]]  # the service's own schema before the signature
    for fallback in (bodies["neither"], bodies["huge"]):  # nothing to go on, or too big to spell out
        assert json.loads(fallback) == {"inputs": [[0.0, 1.0, 2.0, 3.0]]}
