"""The model registry: a mixin of ``kiln.Client``. A version is registered from a finished job's outputs (its
files are copied on the server, content-addressed) and read by number, alias or as the latest:

    v = client.register_model("digits", job_id, "model.pkl", framework="sklearn")   # digits@1
    client.set_alias("digits", "production", v.version)
    client.model_version("digits@production").lineage.metrics                        # {"val_acc": 0.97, ...}
    client.submit({..., "inputs": [{"model": "digits@production", "path": "/model"}]})

References are checked here with the server's own parser (``kiln.domain.models``): a malformed one raises the
same BadRequest the server would, unsent.
"""

from __future__ import annotations

from urllib.parse import quote

from kiln.domain import models as refs
from kiln.domain.idempotency import new_key
from kiln.domain.models import (
    AliasRead,
    AliasSet,
    ModelList,
    ModelRead,
    ModelRegister,
    ModelRemoved,
    ModelSummary,
    ModelVersionList,
    ModelVersionRead,
    RunModelVersions,
)
from kiln.errors import BadRequest
from kiln.sdk.transport import ClientTransport


def parse_ref(ref: str) -> refs.ModelRef:
    """``NAME``, ``NAME@VERSION``, ``NAME@ALIAS`` or ``NAME@latest`` → (name, number, alias or None: the latest)."""
    try:
        return refs.parse_ref(ref)
    except refs.ModelRefError as exc:
        raise BadRequest(str(exc)) from None


def _name(name: str) -> str:
    try:
        return quote(refs.check_name(name), safe="")
    except refs.ModelRefError as exc:
        raise BadRequest(str(exc)) from None


class ModelsMixin(ClientTransport):
    """The model registry's methods of ``kiln.Client``."""

    def register_model(
        self,
        name: str,
        job_id: str,
        path: str,
        *,
        framework: str | None = None,
        description: str | None = None,
        idempotency_key: str | None = None,
    ) -> ModelVersionRead:
        """The next version of ``name`` from the output file or directory ``path`` of the ended job ``job_id``
        (``framework``: torch, onnx, sklearn or custom; by default what the files' suffixes say). Sent with
        ``idempotency_key`` (by default a new one per call) and retried with it: a retry never registers a second
        version."""
        body = ModelRegister.model_validate(
            {"job_id": job_id, "path": path, "framework": framework, "description": description}
        )
        response = self.request(
            "POST",
            f"/models/{_name(name)}/versions",
            json_body=body.model_dump(mode="json", exclude_none=True),
            idempotency_key=new_key() if idempotency_key is None else idempotency_key,
        )
        return ModelVersionRead.model_validate(response.json())

    def register_model_from_run(
        self,
        name: str,
        run_id: str,
        path: str = "model",
        *,
        description: str | None = None,
        idempotency_key: str | None = None,
    ) -> ModelVersionRead:
        """The next version of ``name`` from the MLflow model ``path`` of run ``run_id``: the model the run logged
        under that name (``mlflow.<flavor>.log_model(m, name=path)``), else the run's artifact directory ``path``.
        Its ``MLmodel`` file gives the version's flavor and signature."""
        body = ModelRegister.model_validate({"run_id": run_id, "path": path, "description": description})
        response = self.request(
            "POST",
            f"/models/{_name(name)}/versions",
            json_body=body.model_dump(mode="json", exclude_none=True),
            idempotency_key=new_key() if idempotency_key is None else idempotency_key,
        )
        return ModelVersionRead.model_validate(response.json())

    def run_model_versions(self, run_id: str) -> list[ModelVersionRead]:
        """The versions registered from run ``run_id`` (a job's run is its job id), oldest first."""
        response = self.request("GET", f"/runs/{quote(run_id, safe='')}/model-versions")
        return RunModelVersions.model_validate(response.json()).items

    def list_models(self) -> list[ModelSummary]:
        return ModelList.model_validate(self.request("GET", "/models").json()).items

    def get_model(self, name: str) -> ModelRead:
        """The model, its aliases, and its versions newest first (each with its files and lineage)."""
        return ModelRead.model_validate(self.request("GET", f"/models/{_name(name)}").json())

    def model_versions(self, name: str) -> list[ModelVersionRead]:
        """Every version, oldest first (without their file lists: ``model_version`` has them)."""
        return ModelVersionList.model_validate(self.request("GET", f"/models/{_name(name)}/versions").json()).items

    def model_version(self, ref: str) -> ModelVersionRead:
        """``NAME@VERSION``, ``NAME@ALIAS``, ``NAME@latest`` or ``NAME`` (the latest)."""
        name, version = parse_ref(ref)
        path = f"/models/{_name(name)}/versions/{quote(refs.LATEST if version is None else str(version), safe='')}"
        return ModelVersionRead.model_validate(self.request("GET", path).json())

    def set_alias(self, name: str, alias: str, version: int) -> AliasRead:
        """Point ``alias`` (e.g. ``production``) at ``version`` of ``name``, creating it or moving it."""
        try:
            refs.check_alias(alias)
        except refs.ModelRefError as exc:
            raise BadRequest(str(exc)) from None
        body = AliasSet(version=version).model_dump(mode="json")
        response = self.request("PUT", f"/models/{_name(name)}/aliases/{quote(alias, safe='')}", json_body=body)
        return AliasRead.model_validate(response.json())

    def delete_alias(self, name: str, alias: str) -> AliasRead:
        """Remove the alias (the version it named stays); returns what it named."""
        response = self.request("DELETE", f"/models/{_name(name)}/aliases/{quote(alias, safe='')}")
        return AliasRead.model_validate(response.json())

    def delete_model_version(self, name: str, version: int) -> ModelRemoved:
        """Remove one version (and the aliases naming it); data nothing else holds is deleted."""
        response = self.request("DELETE", f"/models/{_name(name)}/versions/{int(version)}")
        return ModelRemoved.model_validate(response.json())

    def delete_model(self, name: str) -> ModelRemoved:
        """Remove the model: every version and alias."""
        return ModelRemoved.model_validate(self.request("DELETE", f"/models/{_name(name)}").json())
