"""What one instance of a predict request must be: the replica's copy of ``kiln.domain.serving.InputSchema``
(``{"shape": [64], "dtype": "float32"}``), checked before the predictor sees a batch. Standard library only: it
runs in the replica, inside the job's runtime, where Kiln's dependencies (pydantic) are not installed.

A wrong instance is named by its place in the request (``inputs[3]``, ``inputs[3][5]`` for an inner value), which
the replica answers as a 422 and the router passes on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

DTYPES = ("float32", "float64", "int64", "string")
MAX_DIMS = 8
INT64 = 2**63


class InstanceCheck(Protocol):
    """What the replica checks a request's instances with before batching: an ``InputSchema``, or the columns of
    an MLflow signature (kiln.injob.serve_mlflow.ColumnSchema). Raises InvalidInput naming the first wrong one."""

    def check(self, inputs: list[Any]) -> object: ...


class InvalidInput(ValueError):
    """An instance that does not fit the schema; ``field`` names it (``inputs[3]``), the message starts with it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


@dataclass(frozen=True)
class InputSchema:
    """Per-instance ``shape`` (``None`` for any length; ``()`` for a scalar) and leaf ``dtype``."""

    shape: tuple[int | None, ...]
    dtype: str = "float32"

    @classmethod
    def parse(cls, value: object, where: str = "input_schema") -> InputSchema:
        """From the JSON form (a dict, or an object with ``shape`` and ``dtype`` attributes such as a custom
        predictor's pydantic model); ValueError naming ``where`` and the key."""
        if not isinstance(value, dict):
            value = {"shape": getattr(value, "shape", None), "dtype": getattr(value, "dtype", "float32")}
        unknown = sorted(set(value) - {"shape", "dtype"})
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (expected shape and dtype)")
        shape = value.get("shape") or []
        if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS:
            raise ValueError(f"{where}.shape: a list of at most {MAX_DIMS} dimensions, got {shape!r}")
        for i, dim in enumerate(shape):
            if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
                raise ValueError(f"{where}.shape[{i}]: a dimension is a whole number ≥ 1 or null, got {dim!r}")
        dtype = value.get("dtype") or "float32"
        if dtype not in DTYPES:
            raise ValueError(f"{where}.dtype: one of {', '.join(DTYPES)}, got {dtype!r}")
        return cls(tuple(shape), dtype)

    def as_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}

    def check(self, inputs: list[Any]) -> None:
        """InvalidInput for the first instance of ``inputs`` that does not fit."""
        for i, instance in enumerate(inputs):
            self._check(instance, 0, f"inputs[{i}]")

    def _check(self, value: Any, depth: int, field: str) -> None:
        if depth == len(self.shape):
            self._leaf(value, field)
            return
        want = self.shape[depth]
        inner = depth + 1 == len(self.shape)
        items = ("strings" if self.dtype == "string" else "numbers") if inner else "lists"
        if not isinstance(value, list):
            size = f"{want} " if want is not None else ""
            raise InvalidInput(field, f"expected a list of {size}{items}, got {_kind(value)}")
        if want is not None and len(value) != want:
            raise InvalidInput(field, f"expected {want} {items}, got {len(value)}")
        for j, item in enumerate(value):
            self._check(item, depth + 1, f"{field}[{j}]")

    def _leaf(self, value: Any, field: str) -> None:
        if self.dtype == "string":
            if not isinstance(value, str):
                raise InvalidInput(field, f"expected a string, got {_kind(value)}")
            return
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(field, f"expected a number, got {_kind(value)}")
        if self.dtype == "int64":
            if not isinstance(value, int):
                raise InvalidInput(field, f"expected a whole number (int64), got {value!r}")
            if not -INT64 <= value < INT64:
                raise InvalidInput(field, f"{value} is out of the int64 range")
        elif isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput(field, f"expected a finite number, got {value!r}")


def _kind(value: Any) -> str:
    """How a wrong value reads in a message: its JSON type, and a short value for scalars."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        shown = value if len(value) <= 20 else value[:20] + "…"
        return f"the string {shown!r}"
    return repr(value)
