"""A job's spec as the database stores it, read one way.

A job row keeps its spec as the JSON of a :class:`~kiln.domain.spec.JobSpec` that was valid at submit (``Job.spec``).
Every reader goes through :class:`StoredSpec`: the whole model, validated once and cached (``model``), where a
caller needs all of it (launching an attempt, deciding how it ended), and typed fields read straight from the JSON
where a pass reads thousands of rows (the scheduler's snapshot, the checks for pinned inputs): a full model per
row would dominate such a pass, and those fields need no validation to be read (they were valid at submit, and
the defaults here are the model's).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from kiln.domain.spec import JobSpec

# The label a model service's replica jobs carry: the service's id (kiln.usecases.models.serving sets it).
SERVICE_LABEL = "kiln-service"


class StoredSpec:
    __slots__ = ("_model", "raw")

    def __init__(self, raw: Mapping[str, Any] | None) -> None:
        self.raw: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        self._model: JobSpec | None = None

    @property
    def model(self) -> JobSpec:
        """The whole spec, validated (once)."""
        if self._model is None:
            self._model = JobSpec.model_validate(dict(self.raw))
        return self._model

    def _section(self, name: str) -> Mapping[str, Any]:
        value = self.raw.get(name)
        return value if isinstance(value, Mapping) else {}

    @property
    def timeout(self) -> float | None:
        """Seconds a run may take (None: no limit)."""
        value = self.raw.get("timeout")
        return float(value) if value else None

    @property
    def labels(self) -> Mapping[str, str]:
        return self._section("labels")

    @property
    def service_id(self) -> str | None:
        """The model service whose replica this job is, if it is one."""
        value = self.labels.get(SERVICE_LABEL)
        return value if isinstance(value, str) else None

    @property
    def cpus(self) -> float:
        return float(self._section("resources").get("cpus", 1.0))

    @property
    def memory(self) -> int | None:
        value = self._section("resources").get("memory")
        return int(value) if value is not None else None

    @property
    def gpus(self) -> int:
        return int(self._section("resources").get("gpus", 0))

    @property
    def gpu_type(self) -> str | None:
        value = self._section("resources").get("gpu_type")
        return str(value) if value is not None else None

    @property
    def node_selector(self) -> Mapping[str, str]:
        return self._section("node_selector")

    def input_refs(self, kind: Literal["dataset", "model"]) -> Iterator[str]:
        """The ``NAME@VERSION`` (or ``NAME``) of each input of this kind, as pinned at submit."""
        inputs = self.raw.get("inputs")
        for item in inputs if isinstance(inputs, list) else ():
            ref = item.get(kind) if isinstance(item, Mapping) else None
            if isinstance(ref, str):
                yield ref

    @property
    def metrics(self) -> dict[str, Any]:
        """The ``metrics`` section as stored (what the log's metric extraction is configured with)."""
        return dict(self._section("metrics"))
