"""Pipeline specs: checked whole before anything runs (errors name the step and the field), and the ``when``
language evaluated without eval."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kiln.domain.pipeline_when import Ref, WhenError, parse_when
from kiln.domain.pipelines import PipelineError, cache_key, parse_pipeline

EXAMPLE: dict[str, Any] = {
    "name": "digits-flow",
    "steps": {
        "deploy": {
            "depends_on": ["register"],
            "when": "steps.train.metrics.val_acc >= 0.95",
            "serve": {"name": "digits", "predictor": {"type": "sklearn"}, "replicas": 1},
        },
        "register": {
            "depends_on": ["train"],
            "register_model": {"name": "digits", "from": "train", "path": "m.joblib"},
        },
        "train": {
            "depends_on": ["prep"],
            "command": "python train.py",
            "inputs": [{"step": "prep"}, {"dataset": "mnist@2"}],
            "retries": 2,
            "params": {"lr": 0.1},
        },
        "prep": {"command": "python prep.py"},
    },
}


def _refused(data: dict[str, Any]) -> PipelineError:
    with pytest.raises(PipelineError) as caught:
        parse_pipeline(data)
    return caught.value


def _with(step: str, **fields: Any) -> dict[str, Any]:
    data = copy.deepcopy(EXAMPLE)
    data["steps"][step].update(fields)
    return data


def test_the_example_parses_in_dependency_order_with_its_kinds() -> None:
    pipeline = parse_pipeline(EXAMPLE)
    assert list(pipeline.steps) == ["prep", "train", "register", "deploy"]  # written backwards, run forwards
    train = pipeline.steps["train"]
    assert train.kind == "job" and train.retries == 2 and train.cache
    assert [i.step for i in train.step_inputs] == ["prep"]
    assert train.job is not None and [i.dataset for i in train.job.inputs] == ["mnist@2"]  # the step input apart
    assert pipeline.steps["register"].kind == "register_model"
    assert pipeline.steps["register"].register_model.source == "train"  # type: ignore[union-attr]
    deploy = pipeline.steps["deploy"]
    assert deploy.kind == "serve" and deploy.serve_model_step == "register"
    assert deploy.when is not None and deploy.when.refs == (Ref("train", "metrics", "val_acc"),)
    assert pipeline.upstream("deploy") == {"register", "train", "prep"}
    assert pipeline.downstream("train") == {"register", "deploy"}


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (_with("prep", depends_on=["deploy"]), "steps.", "a cycle: "),
        (_with("train", depends_on=["prep", "nope"]), "steps.train.depends_on[1]", "no step named 'nope'"),
        (_with("prep", depends_on=["prep"]), "steps.prep.depends_on[0]", "itself"),
        (_with("train", inputs=[{"step": "ghost"}]), "steps.train.inputs[0].step", "no step named 'ghost'"),
        (_with("prep", inputs=[{"step": "train"}]), "steps.prep.inputs[0].step", "'train' is not upstream of prep"),
        (_with("train", depends_on=[], inputs=[{"step": "prep"}]), "steps.train.inputs[0].step", "not upstream"),
        (_with("train", inputs=[{"step": "prep", "mode": "x"}]), "steps.train.inputs[0].mode", "step and path"),
        (_with("deploy", when="steps.train.metrics.val_acc >="), "steps.deploy.when", "expected a value"),
        (_with("deploy", when="val_acc > 1"), "steps.deploy.when", "unknown word"),
        (_with("train", when="steps.deploy.metrics.x > 1"), "steps.train.when", "not upstream"),
        (_with("train", resorces={"cpus": 1}), "steps.train.resorces", "Extra inputs"),
        (_with("train", retries=11), "steps.train.retries", "0 to 10"),
        (_with("train", cache="yes"), "steps.train.cache", "true or false"),
        (
            _with("register", register_model={"name": "d", "from": "prep2", "path": "m"}),
            "steps.register.register_model.from",
            "no step named 'prep2'",
        ),
        (_with("register", command="true"), "steps.register.command", "takes no job fields"),
        (_with("deploy", depends_on=["train"]), "steps.deploy.serve", "exactly one upstream register_model"),
        (_with("deploy", serve={"name": "Bad Name", "predictor": {"type": "sklearn"}}), "steps.deploy.serve.name", ""),
        ({**EXAMPLE, "stepz": {}}, "stepz", "unknown field"),
        ({**EXAMPLE, "name": "no spaces"}, "name", "letters"),
        ({"name": "x", "steps": {"bad name": {"command": "true"}}}, "steps.bad name", "a step name"),
        ({"name": "x", "steps": {}}, "steps", "at least one"),
    ],
)
def test_bad_pipelines_are_refused_naming_the_step_and_field(data: dict[str, Any], field: str, words: str) -> None:
    error = _refused(data)
    assert error.field.startswith(field), error
    assert words in error.message, error


def test_a_cycle_is_named_step_by_step() -> None:
    steps = {"a": ["c"], "b": ["a"], "c": ["b"]}
    error = _refused({"name": "x", "steps": {k: {"command": "true", "depends_on": v} for k, v in steps.items()}})
    assert "a -> c -> b -> a" in error.message


def _eval(text: str, **values: float | str | None) -> tuple[bool, str]:
    when = parse_when(text)
    return when.evaluate({Ref(*key.split("__")): value for key, value in values.items()})


def test_when_compares_numbers_text_and_params_read_as_numbers() -> None:
    acc = "steps.train.metrics.val_acc"
    assert _eval(f"{acc} >= 0.95", train__metrics__val_acc=0.96) == (True, "")
    assert _eval(f"{acc} >= 0.95", train__metrics__val_acc=0.5) == (False, "")
    assert _eval("steps.p.params.rows > 1000", p__params__rows="1500")[0]  # a param's text, read as a number
    assert _eval("steps.p.params.opt == 'adam'", p__params__opt="adam")[0]
    assert not _eval("steps.p.params.opt < 'b'", p__params__opt="adam")[0]  # text is only equal or not
    assert _eval("steps.p.params.flag == true", p__params__flag="true")[0]
    assert _eval('steps.p.params.opt != "sgd"', p__params__opt="adam")[0]


def test_when_precedence_parentheses_and_missing_values() -> None:
    a, b = "steps.s.metrics.a", "steps.s.metrics.b"
    assert _eval(f"{a} > 1 or {b} > 1 and {a} > 5", s__metrics__a=2, s__metrics__b=0)[0]  # and binds tighter
    assert not _eval(f"({a} > 1 or {b} > 1) and {a} > 5", s__metrics__a=2, s__metrics__b=0)[0]
    assert _eval(f"not {a} > 5", s__metrics__a=2)[0]
    result, why = _eval(f"{a} > 1 and {b} > 1", s__metrics__a=2)
    assert not result and why == "steps.s.metrics.b has no value"
    assert _eval(f"{b} or {a} > 1", s__metrics__a=2)[0]  # a bare reference: has a value
    assert _eval("true")[0] and not _eval("false")[0]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("1 > 0 and 5", "not a condition"),
        ("steps.s.metrics.a", ""),  # a bare reference alone is a condition: no error
        ("steps.s.metrics.a > 1 > 2", "unexpected"),
        ("(steps.s.metrics.a > 1", "expected '\\)'"),
        ("steps.s.metrics.a > 1 and", "expected a value"),
        ("__import__('os')", "unknown word"),
        ("steps.s.metrics.a ~ 1", "cannot read"),
        ("true < false", "== or != only"),
        ("not " * 40 + "true", "nested more than"),
        ("x" * 1001, "at most"),
    ],
)
def test_bad_when_expressions_say_what_is_wrong(text: str, words: str) -> None:
    if not words:
        parse_when(text)
        return
    with pytest.raises(WhenError, match=words):
        parse_when(text)


def test_the_cache_key_follows_the_job_code_and_inputs_not_their_layout() -> None:
    pipeline = parse_pipeline(EXAMPLE)
    train = pipeline.steps["train"]
    key = cache_key(train, "abc", ["mnist@2:sha1", "prep:sha2"])
    reordered = dict(reversed(list(EXAMPLE["steps"]["train"].items())))
    again = parse_pipeline({**EXAMPLE, "steps": {**EXAMPLE["steps"], "train": reordered}}).steps["train"]
    assert cache_key(again, "abc", ["mnist@2:sha1", "prep:sha2"]) == key  # key order in the YAML aside
    assert cache_key(train, "abd", ["mnist@2:sha1", "prep:sha2"]) != key  # other code
    assert cache_key(train, "abc", ["mnist@2:sha1", "prep:sha3"]) != key  # other upstream outputs
    changed = parse_pipeline(_with("train", command="python train.py --epochs 2")).steps["train"]
    assert cache_key(changed, "abc", ["mnist@2:sha1", "prep:sha2"]) != key  # another command
