"""The runtime catalog: framework + version → what a job runs in (a managed virtualenv's packages on the
local executor, an image on container backends)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kiln.domain.notebooks import VARIANTS
from kiln.domain.spec import RuntimeSpec
from kiln.errors import InvalidInput


@dataclass(frozen=True)
class CatalogEntry:
    framework: str
    version: str
    packages: tuple[str, ...]
    image: str
    default: bool = False
    description: str = ""
    derived: bool = False  # a variant Kiln made (base entry + its packages, the base's image), not the catalog's

    @property
    def name(self) -> str:
        return f"{self.framework}-{self.version}"


@dataclass
class Catalog:
    entries: list[CatalogEntry] = field(default_factory=list)

    def frameworks(self) -> list[str]:
        return sorted({e.framework for e in self.entries})

    def resolve(self, framework: str, version: str | None = None) -> CatalogEntry:
        """The entry for a framework and version (default version when None); InvalidInput names what
        exists when nothing matches. ``VERSION+lab`` is that entry with JupyterLab added (a notebook's runtime:
        kiln.domain.notebooks), ``VERSION+tensorboard`` with TensorBoard: each a managed environment of its own,
        unless the catalog has an entry of that very version (an operator's image with JupyterLab in it)."""
        exact = [e for e in self.entries if e.framework == framework and e.version == version]
        if exact:
            return exact[0]
        for suffix, (packages, what) in VARIANTS.items():
            if version is not None and version.endswith(suffix):
                base = self.resolve(framework, version.removesuffix(suffix))
                return CatalogEntry(
                    base.framework,
                    base.version + suffix,
                    base.packages + packages,
                    base.image,
                    description=f"{(base.description or base.name).rstrip('.')}, with {what}",
                    derived=True,
                )
        candidates = [e for e in self.entries if e.framework == framework]
        if not candidates:
            raise InvalidInput(
                f"runtime.framework: unknown framework {framework!r}; known: {', '.join(self.frameworks())}"
            )
        if version is None:
            return next((e for e in candidates if e.default), candidates[0])
        for entry in candidates:
            if entry.version == version or entry.version.startswith(version + "."):
                return entry
        known = ", ".join(e.version for e in candidates)
        raise InvalidInput(f"runtime.version: {framework} has no version {version!r}; known: {known}")

    def check(self, runtime: RuntimeSpec) -> None:
        if runtime.framework:
            self.resolve(runtime.framework, runtime.version)

    def extended(self, extra: list[CatalogEntry]) -> Catalog:
        """This catalog with ``extra`` entries added; same framework and version replaces, a new default
        replaces the framework's old default."""
        keys = {(e.framework, e.version) for e in extra}
        new_defaults = {e.framework for e in extra if e.default}
        kept = [
            CatalogEntry(
                e.framework,
                e.version,
                e.packages,
                e.image,
                e.default and e.framework not in new_defaults,
                e.description,
            )
            for e in self.entries
            if (e.framework, e.version) not in keys
        ]
        return Catalog([*kept, *extra])


class CatalogFileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    framework: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    # "+lab" (+tensorboard): the operator's own variant of a version, e.g. an image with JupyterLab in it
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*(\+lab|\+tensorboard)?$")
    packages: list[str] = Field(default_factory=list)
    image: str = ""
    default: bool = Field(False, strict=True)  # true or false, not 1 or "yes"
    description: str = ""


def load_catalog_file(text: str, source: str) -> list[CatalogEntry]:
    """Entries from a YAML list; raises InvalidInput naming the file and the entry."""
    import yaml

    try:
        data = yaml.safe_load(text) or []
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, list):
        raise InvalidInput(f"{source}: expected a list of runtime entries")
    entries = []
    for index, item in enumerate(data):
        try:
            parsed = CatalogFileEntry.model_validate(item)
        except ValidationError as exc:
            raise InvalidInput(f"{source}: entry {index}: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from exc
        for suffix, (needed, what) in VARIANTS.items():
            names = {re.split(r"[<>=!~\[; ]", p, maxsplit=1)[0].lower() for p in parsed.packages}
            wanted = re.split(r"[<>=!~\[; ]", needed[0], maxsplit=1)[0]
            if parsed.version.endswith(suffix) and parsed.packages and wanted not in names:
                raise InvalidInput(
                    f"{source}: entry {index}: version {parsed.version} is a {what} variant: its packages must "
                    f"include {wanted} (or give no packages: an image that has it)"
                )
        entries.append(
            CatalogEntry(
                parsed.framework,
                parsed.version,
                tuple(parsed.packages),
                parsed.image,
                parsed.default,
                parsed.description,
            )
        )
    return entries


# MLflow's client in the runtimes whose flavors Kiln serves (``mlflow.sklearn.log_model`` in a job, as the ML
# images of Databricks and SageMaker ship it); pandas because mlflow.sklearn and mlflow.pytorch import it and
# mlflow-skinny leaves it out; SciPy because inferring a signature (log_model's input_example, infer_signature)
# imports it, and full mlflow has it too. cloudpickle, which it brings, also loads what those flavors pickle.
MLFLOW_CLIENT = ("mlflow-skinny>=3.17,<4", "pandas>=2.2,<4", "scipy>=1.11,<2")

DEFAULT_CATALOG = Catalog(
    [
        CatalogEntry(
            "python",
            "3",
            (),
            "python:3.11-slim",
            default=True,
            description="Bare Python in a clean virtualenv (pip available).",
        ),
        CatalogEntry(
            "pytorch",
            "2.13",
            ("torch==2.13.0", "numpy", *MLFLOW_CLIENT),
            "pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime",
            default=True,
            description="PyTorch 2.13 with NumPy and MLflow's client.",
        ),
        CatalogEntry(
            "sklearn",
            "1.9",
            # skops: what mlflow.sklearn.log_model saves with unless told otherwise (and a replica loads it with)
            ("scikit-learn>=1.9,<1.10", *MLFLOW_CLIENT, "skops>=0.13,<1"),
            "kiln/sklearn:1.9",
            default=True,
            description="scikit-learn 1.9 with NumPy, SciPy and MLflow's client.",
        ),
        # Official images where the project publishes one (python, pytorch, tensorflow); kiln/<framework>:<version>
        # (built from the same packages) where it does not. The local executor's virtualenvs are CPU builds where
        # the framework ships one (tensorflow-cpu; jax without a CUDA plugin).
        CatalogEntry(
            "tensorflow",
            "2.21",
            ("tensorflow-cpu>=2.21,<2.22",),
            "tensorflow/tensorflow:2.21.0",
            default=True,
            description="TensorFlow 2.21 (CPU build) with Keras 3.",
        ),
        CatalogEntry(
            "jax",
            "0.10",
            ("jax>=0.10,<0.11",),
            "kiln/jax:0.10",
            default=True,
            description="JAX 0.10 with jaxlib (CPU).",
        ),
        CatalogEntry(
            "xgboost",
            "3.2",
            ("xgboost>=3.2,<3.3", "scikit-learn"),
            "kiln/xgboost:3.2",
            default=True,
            description="XGBoost 3.2 with scikit-learn (its XGBClassifier and XGBRegressor need it).",
        ),
        CatalogEntry(
            "lightgbm",
            "4.7",
            ("lightgbm>=4.7,<4.8", "scikit-learn"),
            "kiln/lightgbm:4.7",
            default=True,
            description="LightGBM 4.7 with scikit-learn (its LGBMClassifier and LGBMRegressor need it).",
        ),
    ]
)
