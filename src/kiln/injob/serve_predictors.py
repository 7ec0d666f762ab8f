"""The replica's predictors: load a registered model version's files and answer ``predict(batch)`` with one plain
JSON-ready output per instance.

Built-ins: ``sklearn`` (joblib, else pickle; ``predict`` or ``predict_proba``), ``torchscript`` (torch.jit.load),
``torch-export`` (torch.export.load(...).module()), ``onnx`` (onnxruntime, the first input and output),
``mlflow`` (an MLflow model directory, by the flavor its MLmodel names: kiln.injob.serve_mlflow) and ``custom``
(``module:Class`` from the service's code bundle: an instance, ``load(path)``, ``predict(batch)``, and optionally
``input_schema``).

The frameworks are the job runtime's, not Kiln's: each is imported by name (``importlib``) when its predictor
loads, so that this module, like all of ``kiln.injob``, needs only the standard library.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from kiln.injob.serve_schema import InputSchema, InstanceCheck

TORCH_DTYPES = {"float32": "float32", "float64": "float64", "int64": "int64"}
ONNX_DTYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
}


class Predictor:
    """A loaded model. ``predict`` gets a non-empty list of instances (already checked against ``input_schema``
    when there is one) and returns one output per instance."""

    input_schema: InstanceCheck | None = None
    takes_parameters = False  # a custom predictor whose predict() accepts ``parameters=``

    def predict(self, batch: list[Any], parameters: dict[str, Any] | None = None) -> list[Any]:
        raise NotImplementedError


def model_path(model_dir: str, file: str | None) -> Path:
    """The model file: ``file`` inside ``model_dir`` if given, else the only file there (in any subfolder).
    FileNotFoundError/ValueError saying what is there."""
    root = Path(model_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    if file:
        path = (root / file).resolve()
        if not path.is_relative_to(root.resolve()):
            raise ValueError(f"file {file!r} is outside the model directory")
        if not path.is_file():
            raise FileNotFoundError(f"no file {file!r} in {model_dir} (it holds {_listing(root)})")
        return path
    files = sorted(p for p in root.rglob("*") if p.is_file())
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no file")
    if len(files) > 1:
        raise ValueError(f"{model_dir} holds {len(files)} files ({_listing(root)}): say which one in predictor.file")
    return files[0]


def _listing(root: Path, limit: int = 5) -> str:
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    shown = ", ".join(names[:limit]) + (f", … ({len(names)} in all)" if len(names) > limit else "")
    return shown or "nothing"


def plain(value: Any) -> Any:
    """A framework's output (an array, a tensor, a numpy scalar, nested tuples of them) as lists and numbers."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu()
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return value.tolist()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def rows(output: Any, count: int, who: str) -> list[Any]:
    """``output`` as ``count`` per-instance outputs; ValueError when it has another length."""
    result = plain(output)
    if not isinstance(result, list):
        raise ValueError(f"{who} returned {type(output).__name__}, not one output per instance")
    if len(result) != count:
        raise ValueError(f"{who} returned {len(result)} outputs for {count} inputs")
    return result


class SklearnPredictor(Predictor):
    def __init__(self, path: Path, method: str) -> None:
        try:
            joblib = importlib.import_module("joblib")
        except ImportError:
            with open(path, "rb") as fh:
                self.model = pickle.load(fh)
        else:
            self.model = joblib.load(path)
        if not callable(getattr(self.model, method, None)):
            raise TypeError(f"the {type(self.model).__name__} in {path.name} has no {method}()")
        self.method = getattr(self.model, method)
        self.label = f"{type(self.model).__name__}.{method}"
        features = getattr(self.model, "n_features_in_", None)
        if isinstance(features, int) and features > 0:
            self.input_schema = InputSchema((features,), "float64")
        try:
            self.numpy: Any = importlib.import_module("numpy")
        except ImportError:
            self.numpy = None

    def predict(self, batch: list[Any], parameters: dict[str, Any] | None = None) -> list[Any]:
        inputs = self.numpy.asarray(batch) if self.numpy is not None else batch
        return rows(self.method(inputs), len(batch), self.label)


class TorchPredictor(Predictor):
    def __init__(self, path: Path, kind: str, dtype: str) -> None:
        self.torch: Any = importlib.import_module("torch")
        if kind == "torchscript":
            self.model = self.torch.jit.load(str(path), map_location="cpu")
        else:
            self.model = self.torch.export.load(str(path)).module()
        if hasattr(self.model, "eval") and kind == "torchscript":
            self.model.eval()
        self.dtype = getattr(self.torch, TORCH_DTYPES.get(dtype, "float32"))
        self.label = f"the {kind} model"

    def predict(self, batch: list[Any], parameters: dict[str, Any] | None = None) -> list[Any]:
        with self.torch.no_grad():
            output = self.model(self.torch.tensor(batch, dtype=self.dtype))
        return rows(output, len(batch), self.label)


class OnnxPredictor(Predictor):
    def __init__(self, path: Path) -> None:
        ort = importlib.import_module("onnxruntime")
        self.numpy: Any = importlib.import_module("numpy")
        self.session = ort.InferenceSession(str(path), providers=ort.get_available_providers())
        first = self.session.get_inputs()[0]
        self.input_name = first.name
        self.output_name = self.session.get_outputs()[0].name
        self.dtype = ONNX_DTYPES.get(first.type, "float32")
        dims = list(first.shape)[1:]
        if dims and all(isinstance(d, int) and d > 0 for d in dims) and self.dtype in ("float32", "float64", "int64"):
            self.input_schema = InputSchema(tuple(dims), self.dtype)

    def predict(self, batch: list[Any], parameters: dict[str, Any] | None = None) -> list[Any]:
        array = self.numpy.asarray(batch, dtype=self.dtype)
        output = self.session.run([self.output_name], {self.input_name: array})[0]
        return rows(output, len(batch), "the ONNX model")


class CustomPredictor(Predictor):
    def __init__(self, class_path: str, target: Path) -> None:
        module_name, _, class_name = class_path.partition(":")
        if os.getcwd() not in sys.path:  # the work dir holds the service's code bundle
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name, None)
        if cls is None:
            raise AttributeError(f"module {module_name!r} has no {class_name!r}")
        self.instance = cls()
        for method in ("load", "predict"):
            if not callable(getattr(self.instance, method, None)):
                raise TypeError(f"{class_path} has no {method}() method")
        self.instance.load(str(target))
        schema = getattr(self.instance, "input_schema", None)
        if schema is not None:
            self.input_schema = InputSchema.parse(schema, f"{class_path}.input_schema")
        try:
            self.takes_parameters = "parameters" in inspect.signature(self.instance.predict).parameters
        except (TypeError, ValueError):  # a builtin without a signature
            self.takes_parameters = False
        self.label = f"{class_path}.predict"

    def predict(self, batch: list[Any], parameters: dict[str, Any] | None = None) -> list[Any]:
        if self.takes_parameters:
            output = self.instance.predict(batch, parameters=parameters or {})
        else:
            output = self.instance.predict(batch)
        return rows(output, len(batch), self.label)


def load_predictor(
    kind: str, model_dir: str, file: str | None, class_path: str | None, method: str, dtype: str
) -> Predictor:
    """Load the model; whatever the loader raises propagates (the replica reports it and exits 3)."""
    if kind == "custom":
        if not class_path:
            raise ValueError("class: a custom predictor needs class: module:Class")
        target = model_path(model_dir, file) if file else Path(model_dir)
        return CustomPredictor(class_path, target)
    path = model_path(model_dir, file)
    if kind == "sklearn":
        return SklearnPredictor(path, method)
    if kind in ("torchscript", "torch-export"):
        return TorchPredictor(path, kind, dtype)
    if kind == "onnx":
        return OnnxPredictor(path)
    raise ValueError(f"predictor: unknown type {kind!r}")
