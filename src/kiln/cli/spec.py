"""Building a JobSpec for ``kiln run``: a ``kiln.yaml`` file, then the command-line flags on top."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from kiln.domain.spec import JobSpec, Resources, RuntimeSpec

# One argument with any of these runs through the shell: `kiln run -- "python a.py && python b.py"`.
_SHELL_CHARS = frozenset(" \t\n|&;<>()$`\\\"'*?[]#~{}")
# Pydantic puts union members and validator names into error locations; they are not fields.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "list[str]"})
_MODELS: dict[tuple[str, ...], type[BaseModel]] = {
    (): JobSpec,
    ("resources",): Resources,
    ("runtime",): RuntimeSpec,
}


class SpecError(Exception):
    """The job spec is invalid; the message names the file and the fields."""


@dataclass
class Overrides:
    """What the flags of ``kiln run`` set; None means "not given" (keep the file's value)."""

    command: list[str] = field(default_factory=list)
    name: str | None = None
    cpus: float | None = None
    memory: str | None = None
    disk: str | None = None
    pids: int | None = None
    log: str | None = None
    gpus: int | None = None
    runtime: str | None = None
    python: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    timeout: str | None = None
    max_restarts: int | None = None
    priority: str | None = None
    gpu_type: str | None = None
    inputs: list[dict[str, str]] = field(default_factory=list)
    network: str | None = None
    params: dict[str, str] = field(default_factory=dict)  # --param: typed by param_value
    experiment: str | None = None


def param_value(text: str) -> bool | int | float | str:
    """A ``--param`` value as the spec's params hold it: true/false, an integer, a number, else the text."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        if kind is int or (isinstance(value, float) and value == value and abs(value) != float("inf")):
            return value
    return text


def parse_pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    """``["K=V", ...]`` → ``{"K": "V"}``; raises SpecError naming the flag."""
    pairs: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"{flag} expects KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value
    return pairs


def command_from_args(args: list[str]) -> str | list[str]:
    """One argument that needs a shell (spaces, pipes, ...) is a shell string; otherwise an argv list."""
    if len(args) == 1 and any(c in _SHELL_CHARS for c in args[0]):
        return args[0]
    return list(args)


def parse_runtime(text: str) -> dict[str, str]:
    """``pytorch`` or ``pytorch==2.13`` → a RuntimeSpec mapping."""
    framework, sep, version = text.partition("==")
    framework, version = framework.strip(), version.strip()
    if not framework or (sep and not version):
        raise SpecError(f"--runtime expects FRAMEWORK or FRAMEWORK==VERSION, got {text!r}")
    return {"framework": framework, "version": version} if version else {"framework": framework}


INPUT_FORMAT = "NAME[@VERSION][:PATH][:mount]"
INPUT_MODES = ("stage", "mount")


def parse_input(text: str) -> dict[str, str]:
    """``--input mnist@3:/data/digits:mount`` → an InputSpec mapping (the dataset's own rules are the spec's)."""
    dataset, *rest = text.split(":")
    item = {"dataset": dataset.strip()}
    problem = "" if item["dataset"] else "no dataset name"
    for part in rest:
        if part in INPUT_MODES and "mode" not in item:
            item["mode"] = part
        elif part and part not in INPUT_MODES and "path" not in item and "mode" not in item:
            item["path"] = part
        else:
            problem = f"unexpected {part!r}" if part else "an empty part"
            break
    if problem:
        raise SpecError(f"--input expects {INPUT_FORMAT}, e.g. mnist@3 or imagenet:mount; got {text!r} ({problem})")
    return item


def _dataset_name(item: Any) -> str | None:
    dataset = item.get("dataset") if isinstance(item, dict) else None
    return dataset.split("@", 1)[0] if isinstance(dataset, str) else None


def merge_inputs(current: Any, extra: list[dict[str, str]]) -> Any:
    """The file's inputs with the flags' added; a flag naming a dataset the file has replaces that entry."""
    if not isinstance(current, list):
        return list(extra) if current is None else current  # anything else is reported by validation
    named = {_dataset_name(item) for item in extra}
    return [item for item in current if _dataset_name(item) not in named] + list(extra)


def load_spec_file(path: Path) -> dict[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)  # marks in errors name the file
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path} is not UTF-8 text: {exc}") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"{path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of job spec fields, got {type(data).__name__}")
    for key in ("env", "labels"):
        # YAML reads `EPOCHS: 3` as a number; environment values and labels are text.
        values = data.get(key)
        if isinstance(values, dict):
            data[key] = {k: _scalar_text(v) for k, v in values.items()}
    return data


def _scalar_text(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def apply_overrides(data: dict[str, Any], flags: Overrides) -> dict[str, Any]:
    """The file's mapping with the flags applied on top (maps merge, everything else replaces)."""
    data = dict(data)
    if flags.command:
        data["command"] = command_from_args(flags.command)
    if flags.name is not None:
        data["name"] = flags.name
    resources = {
        "cpus": flags.cpus,
        "memory": flags.memory,
        "disk": flags.disk,
        "pids": flags.pids,
        "log": flags.log,
        "gpus": flags.gpus,
        "gpu_type": flags.gpu_type,
    }
    if any(v is not None for v in resources.values()):
        current = data.get("resources")
        if current is None:
            current = {}
        if isinstance(current, dict):  # anything else is reported by validation
            data["resources"] = {**current, **{k: v for k, v in resources.items() if v is not None}}
    if flags.runtime is not None and flags.python is not None:
        raise SpecError("give only one of --runtime and --python")
    if flags.runtime is not None:
        data["runtime"] = parse_runtime(flags.runtime)
    if flags.python is not None:
        data["runtime"] = {"python": flags.python}
    params = {k: param_value(v) for k, v in flags.params.items()}
    for key, extra in (("env", flags.env), ("labels", flags.labels), ("params", params)):
        if extra:
            current = data.get(key) or {}
            data[key] = {**current, **extra} if isinstance(current, dict) else current
    if flags.inputs:
        data["inputs"] = merge_inputs(data.get("inputs"), flags.inputs)
    if flags.timeout is not None:
        data["timeout"] = flags.timeout
    if flags.max_restarts is not None:
        data["max_restarts"] = flags.max_restarts
    if flags.priority is not None:
        data["priority"] = flags.priority
    if flags.network is not None:
        data["network"] = flags.network
    if flags.experiment is not None:
        data["experiment"] = flags.experiment
    return data


def build_spec(file: Path | None, flags: Overrides) -> JobSpec:
    data = load_spec_file(file) if file is not None else {}
    data = apply_overrides(data, flags)
    if data.get("command") in (None, "", []):
        where = f" and {file} has no `command`" if file is not None else ""
        missing = f"no command to run: give it after `--` (kiln run -- python train.py){where}"
        if any(key not in JobSpec.model_fields for key in data):
            # A misspelt `comand:` is why there is none: name it (with its "did you mean") before the rest.
            try:
                JobSpec.model_validate({**data, "command": ["true"]})
            except ValidationError as exc:
                raise SpecError(f"{format_validation_error(exc, file)}\n  command: {missing}") from None
        raise SpecError(missing)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, file)) from None


def _field_path(loc: tuple[int | str, ...]) -> tuple[str, ...]:
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts[-1:] = [f"{parts[-1]}[{part}]"] if parts else [f"[{part}]"]
        elif part in _TYPE_TAGS or "[" in part or "(" in part:
            continue
        else:
            parts.append(part)
    return tuple(parts)


def format_validation_error(exc: ValidationError, file: Path | None) -> str:
    lines: list[str] = []
    seen: set[tuple[tuple[str, ...], str]] = set()
    for error in exc.errors():
        path = _field_path(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and path:
            message = "unknown field"
            model = _MODELS.get(path[:-1])
            if model is not None:
                close = difflib.get_close_matches(path[-1], list(model.model_fields), n=1)
                if close:
                    message += f" (did you mean {'.'.join((*path[:-1], close[0]))!r}?)"
        if (path, message) in seen:
            continue
        seen.add((path, message))
        lines.append(f"  {'.'.join(path) or '(spec)'}: {message}")
    where = f" in {file}" if file is not None else ""
    return f"invalid job spec{where}:\n" + "\n".join(lines)
