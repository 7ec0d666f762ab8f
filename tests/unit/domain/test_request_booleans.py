"""Every true/false field of a request body takes only JSON's true and false: pydantic's lax mode reads 0, 1,
"yes" and "off" as booleans, which the API's schema says are not (schemathesis found PUT /budgets taking
``"stop_running": 0``)."""

from __future__ import annotations

import importlib
import pkgutil
import types
import typing

import pytest
from pydantic import BaseModel, ValidationError

import kiln.domain
from kiln.domain.usage import BudgetSet


def _request_models() -> list[type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for info in pkgutil.walk_packages(kiln.domain.__path__, "kiln.domain."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            ours = isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == info.name
            if ours and value.model_config.get("extra") == "forbid":  # a request body's (responses allow more)
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


def _is_bool(annotation: object) -> bool:
    if annotation is bool:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return bool in typing.get_args(annotation)
    return False


def test_every_boolean_of_a_request_body_is_strict() -> None:
    models = _request_models()
    assert len(models) > 20, [m.__name__ for m in models]  # the walk found the request bodies
    lax = [
        f"{model.__module__}.{model.__qualname__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if _is_bool(field.annotation)
        and not model.model_config.get("strict")
        and not any(getattr(m, "strict", False) for m in field.metadata)
    ]
    assert lax == [], f"booleans that take 0/1/'yes' (give them strict=True): {lax}"


@pytest.mark.parametrize("value", [0, 1, "yes", "true"])
def test_a_budget_refuses_a_number_or_a_word_for_stop_running(value: object) -> None:
    with pytest.raises(ValidationError, match="stop_running"):
        BudgetSet.model_validate({"hard": 1.0, "stop_running": value})
    assert BudgetSet.model_validate({"hard": 1.0, "stop_running": True}).stop_running is True
