"""The replica's ``mlflow`` predictor: a model version registered from a run (``--from-run``) is an MLflow model
directory; its ``MLmodel`` file names the flavor to load (``sklearn``: the pickled or skops model; ``pytorch``: the
``torch.export`` graph, MLflow 3's default, or the pickled module; ``python_function`` only: ``mlflow.pyfunc``,
which the runtime must then have) and the signature each instance of a request is checked against (a tensor spec:
its shape and dtype; columns: each named field, so that a wrong instance is refused naming
``inputs[3].petal_width``). The replica's server (kiln.injob.serve) makes it for ``predictor: mlflow``.

Standard library only, as all of kiln.injob: ``MLmodel`` is YAML, read with PyYAML where the runtime has it, else
with the small reader below, enough for what MLflow writes (``yaml.safe_dump``: block mappings, plain or quoted
scalars, long quoted strings folded over lines).
"""

from __future__ import annotations

import importlib
import json
import pickle
from pathlib import Path
from typing import Any

from kiln.injob.serve_predictors import Predictor, rows
from kiln.injob.serve_schema import InputSchema, InvalidInput

MLMODEL = "MLmodel"
FLAVORS = ("sklearn", "pytorch", "python_function")
TENSOR_DTYPES = {"float64": "float64", "float32": "float32", "int64": "int64", "int32": "int64", "str": "string"}
COLUMN_TYPES = {"double": "number", "float": "number", "long": "integer", "integer": "integer", "string": "string"}


def _scalar(text: str) -> Any:
    text = text.strip()
    if text in ("", "null", "~"):
        return None
    if text in ("true", "false"):
        return text == "true"
    if text.startswith("'") and text.endswith("'") and len(text) > 1:
        return text[1:-1].replace("''", "'")
    if text.startswith('"') and text.endswith('"') and len(text) > 1:
        return json.loads(text)
    return text


def _closed(text: str, quote: str) -> bool:
    """Whether the quoted scalar ``text`` (starting with ``quote``) has its closing quote (``''`` is an escaped
    one in a single-quoted string, ``\\"`` in a double-quoted one)."""
    body = text[1:]
    if quote == "'":
        trailing = len(body) - len(body.rstrip("'"))
        return trailing % 2 == 1
    return body.endswith('"') and not body.endswith('\\"')


def parse_yaml(text: str) -> dict[str, Any]:
    """The block mappings of ``text`` (lists are skipped: MLmodel's are not read here)."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "- ", "---")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, _, rest = stripped.partition(":")
        if key.startswith(("'", '"')):
            key = str(_scalar(key))
        rest = rest.strip()
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if not rest:
            child: dict[str, Any] = {}
            parent[key] = child
            stack.append((indent, child))
            continue
        quote = rest[0] if rest[0] in "'\"" else ""
        # A quoted string folded over lines: the lines that follow, up to the closing quote, joined by spaces.
        while quote and not _closed(rest, quote) and i < len(lines):
            nxt = lines[i].strip()
            i += 1
            rest = f"{rest} {nxt}" if nxt else rest + "\n"
        parent[key] = _scalar(rest)
    return root


def read_mlmodel(model_dir: Path) -> dict[str, Any]:
    """The ``MLmodel`` file of ``model_dir`` as a dict; FileNotFoundError when there is none."""
    path = model_dir / MLMODEL
    if not path.is_file():
        raise FileNotFoundError(f"no {MLMODEL} file in {model_dir}: not an MLflow model (register it --from-run)")
    text = path.read_text()
    try:
        yaml = importlib.import_module("yaml")
    except ImportError:
        return parse_yaml(text)
    loaded = yaml.safe_load(text)
    return loaded if isinstance(loaded, dict) else {}


class ColumnSchema:
    """Named columns: an instance is an object with each required column (or a list in the columns' order)."""

    def __init__(self, columns: list[dict[str, Any]]) -> None:
        self.columns = [(str(c.get("name")), str(c.get("type", "")), bool(c.get("required", True))) for c in columns]

    def check(self, inputs: list[Any]) -> list[list[Any]]:
        """Each instance as a row in the columns' order; InvalidInput naming the first wrong field."""
        out = []
        names = [name for name, _, _ in self.columns]
        for i, instance in enumerate(inputs):
            if isinstance(instance, list):
                if len(instance) != len(names):
                    raise InvalidInput(f"inputs[{i}]", f"expected {len(names)} values ({', '.join(names)})")
                instance = dict(zip(names, instance, strict=True))
            if not isinstance(instance, dict):
                raise InvalidInput(f"inputs[{i}]", f"expected an object with {', '.join(names)}")
            unknown = sorted(set(instance) - set(names))
            if unknown:
                raise InvalidInput(f"inputs[{i}].{unknown[0]}", f"not a column of the model's signature ({names})")
            row: list[Any] = []
            for name, kind, required in self.columns:
                field = f"inputs[{i}].{name}"
                if name not in instance or instance[name] is None:
                    if required:
                        raise InvalidInput(field, "required by the model's signature")
                    row.append(None)
                    continue
                value = instance[name]
                want = COLUMN_TYPES.get(kind)
                if want == "string" and not isinstance(value, str):
                    raise InvalidInput(field, f"expected a string ({kind}), got {value!r}")
                if want in ("number", "integer") and (isinstance(value, bool) or not isinstance(value, int | float)):
                    raise InvalidInput(field, f"expected a number ({kind}), got {value!r}")
                if want == "integer" and not isinstance(value, int):
                    raise InvalidInput(field, f"expected a whole number ({kind}), got {value!r}")
                row.append(value)
            out.append(row)
        return out


def signature_schema(signature: dict[str, Any]) -> InputSchema | ColumnSchema | None:
    """What the signature's ``inputs`` ask of one instance (a single tensor spec, or columns)."""
    inputs = signature.get("inputs")
    if isinstance(inputs, str):
        inputs = json.loads(inputs)
    if not isinstance(inputs, list) or not inputs:
        return None
    if len(inputs) == 1 and inputs[0].get("type") == "tensor":
        spec = inputs[0].get("tensor-spec") or {}
        shape = [None if d == -1 else int(d) for d in list(spec.get("shape") or [])[1:]]
        return InputSchema(tuple(shape), TENSOR_DTYPES.get(str(spec.get("dtype")), "float64"))
    if all(isinstance(c, dict) and c.get("name") is not None for c in inputs):
        return ColumnSchema(inputs)
    return None


class MlflowPredictor(Predictor):
    """An MLflow model directory, loaded by its flavor; requests checked against its signature."""

    def __init__(self, model_dir: Path, method: str) -> None:
        doc = read_mlmodel(model_dir)
        flavors = doc.get("flavors") or {}
        self.flavor = next((f for f in FLAVORS if f in flavors), None)
        if self.flavor is None:
            raise ValueError(f"{MLMODEL}: flavors {sorted(flavors)}; the mlflow predictor loads {', '.join(FLAVORS)}")
        conf = flavors[self.flavor] or {}
        self.numpy: Any = None
        try:
            self.numpy = importlib.import_module("numpy")
        except ImportError:
            pass
        signature = doc.get("signature")
        self.columns: ColumnSchema | None = None
        schema = signature_schema(signature) if isinstance(signature, dict) else None
        if isinstance(schema, ColumnSchema):
            self.columns = schema
        self.input_schema = schema
        self.dtype = schema.dtype if isinstance(schema, InputSchema) else "float32"
        if self.flavor == "sklearn":
            self.model = _load_sklearn(model_dir / str(conf.get("pickled_model", "model.pkl")), conf)
            if not callable(getattr(self.model, method, None)):
                raise TypeError(f"the {type(self.model).__name__} has no {method}()")
            self.call = getattr(self.model, method)
        elif self.flavor == "pytorch":
            self.torch: Any = importlib.import_module("torch")
            data = model_dir / str(conf.get("model_data", "data"))
            if (data / "model.pth").is_file():  # pickled (serialization_format="pickle"; Databricks' default)
                self.model = self.torch.load(str(data / "model.pth"), map_location="cpu", weights_only=False)
                self.model.eval()
            else:  # the graph torch.export saved: MLflow 3's default elsewhere (no eval(): an exported one refuses it)
                self.model = self.torch.export.load(str(data / "model.pt2")).module()
            self.call = self._torch
        else:
            pyfunc = importlib.import_module("mlflow.pyfunc")  # a python_function model needs MLflow in the runtime
            self.model = pyfunc.load_model(str(model_dir))
            self.call = self.model.predict
        self.label = f"the MLflow {self.flavor} model"

    def check(self, batch: list[Any]) -> list[Any]:
        """The batch as the model takes it, checked against the signature's columns (the tensor spec is checked
        by the replica's server before the batch is made)."""
        return self.columns.check(batch) if self.columns is not None else batch

    def _torch(self, inputs: Any) -> Any:
        dtype = getattr(self.torch, {"float64": "float64", "int64": "int64"}.get(self.dtype, "float32"))
        with self.torch.no_grad():
            return self.model(self.torch.as_tensor(inputs, dtype=dtype))

    def predict(self, batch: list[Any], parameters: dict[str, Any] | None = None) -> list[Any]:
        rows_in = self.check(batch)
        if self.flavor == "python_function" and self.columns is not None:
            pandas = importlib.import_module("pandas")
            inputs: Any = pandas.DataFrame(rows_in, columns=[name for name, _, _ in self.columns.columns])
        elif self.flavor == "sklearn" and self.columns is not None and _has("pandas"):
            # fitted on a DataFrame: its column names (without pandas, the rows in the columns' order do)
            pandas = importlib.import_module("pandas")
            inputs = pandas.DataFrame(rows_in, columns=[name for name, _, _ in self.columns.columns])
        elif self.numpy is not None and self.flavor != "pytorch":
            inputs = self.numpy.asarray(rows_in)
        else:
            inputs = rows_in
        return rows(self.call(inputs), len(batch), self.label)


def _has(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _load_sklearn(path: Path, conf: dict[str, Any]) -> Any:
    form = conf.get("serialization_format") or "cloudpickle"
    if form == "skops":
        try:
            skops_io = importlib.import_module("skops.io")
        except ImportError:
            raise ImportError(
                "this model was saved with skops (MLflow 3's default for sklearn): add skops to the service's "
                "runtime, or log it with serialization_format='cloudpickle'"
            ) from None
        trusted = conf.get("skops_trusted_types") or skops_io.get_untrusted_types(file=str(path))
        return skops_io.load(str(path), trusted=trusted)
    with open(path, "rb") as fh:
        return pickle.load(fh)
