"""kiln.domain.stored_spec: the one way a job's stored spec is read. Its typed fields, read straight from the JSON
for the scheduler's passes, say what the validated model says (defaults included); and no other module of the
server validates a stored spec itself."""

from __future__ import annotations

import ast
from pathlib import Path

import kiln
from kiln.domain.spec import JobSpec
from kiln.domain.stored_spec import SERVICE_LABEL, StoredSpec

SRC = Path(kiln.__file__).parent

FULL = {
    "command": "python train.py",
    "resources": {"cpus": 2.5, "memory": "3G", "gpus": 2, "gpu_type": "h200"},
    "timeout": "2h",
    "labels": {"team": "vision", SERVICE_LABEL: "svc-1"},
    "node_selector": {"zone": "a"},
    "inputs": [
        {"dataset": "digits@3", "path": "digits"},
        {"model": "mlp@2", "path": "mlp"},
        {"dataset": "extra@1", "path": "extra"},
    ],
    "metrics": {"builtin": False, "patterns": [{"regex": "loss=(?P<loss>[0-9.]+)"}]},
}


def stored(spec: dict) -> StoredSpec:  # type: ignore[type-arg]
    """As the database keeps it: the JSON of the model validated at submit."""
    return StoredSpec(JobSpec.model_validate(spec).model_dump(mode="json"))


def fields(view: StoredSpec) -> tuple:  # type: ignore[type-arg]
    return (view.cpus, view.memory, view.gpus, view.gpu_type, view.timeout, dict(view.labels), dict(view.node_selector))


def of_model(model: JobSpec) -> tuple:  # type: ignore[type-arg]
    r = model.resources
    timeout = float(model.timeout) if model.timeout else None
    return (r.cpus, r.memory, r.gpus, r.gpu_type, timeout, dict(model.labels), dict(model.node_selector))


def test_the_typed_fields_say_what_the_model_says() -> None:
    view = stored(FULL)
    assert fields(view) == of_model(view.model)
    assert fields(view) == (
        2.5,
        3 * 1024**3,
        2,
        "h200",
        7200.0,
        {"team": "vision", SERVICE_LABEL: "svc-1"},
        {"zone": "a"},
    )
    assert view.service_id == "svc-1"
    assert list(view.input_refs("dataset")) == ["digits@3", "extra@1"]
    assert list(view.input_refs("model")) == ["mlp@2"]
    assert view.metrics["builtin"] is False and view.metrics["patterns"]


def test_a_minimal_spec_reads_the_models_defaults() -> None:
    view = stored({"command": "true"})
    assert fields(view) == of_model(view.model)
    assert view.service_id is None and list(view.input_refs("dataset")) == []
    assert view.metrics.get("builtin", True) is True


def test_the_model_is_validated_once() -> None:
    view = stored(FULL)
    assert view.model is view.model


def test_no_row_or_junk_reads_as_an_empty_spec() -> None:
    for raw in (None, [], "x"):
        view = StoredSpec(raw)  # type: ignore[arg-type]
        assert view.raw == {} and view.cpus == 1.0 and view.timeout is None and list(view.input_refs("model")) == []


def test_no_other_module_validates_a_stored_spec() -> None:
    """``JobSpec.model_validate(<something>.spec)`` outside stored_spec.py: a second way of reading one."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "model_validate"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "JobSpec"
                and node.args
                and isinstance(node.args[0], ast.Attribute)
                and node.args[0].attr == "spec"
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == [], "read a stored spec through kiln.domain.stored_spec.StoredSpec"
