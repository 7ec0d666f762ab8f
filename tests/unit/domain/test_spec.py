"""JobSpec: the one schema for the API, the SDK and kiln.yaml."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kiln.domain.spec import JobSpec, RuntimeSpec, command_argv, command_text, parse_duration


def errors_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(data)
    return info.value.errors()


def locs(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [tuple(e["loc"]) for e in errors_of(data)]


# -- unknown fields ---------------------------------------------------------------------------------------------


def test_unknown_top_level_field_is_rejected_by_name() -> None:
    errs = errors_of({"command": "true", "resorces": {"cpus": 2}})
    assert [(tuple(e["loc"]), e["type"]) for e in errs] == [(("resorces",), "extra_forbidden")]


def test_unknown_nested_resources_field_is_rejected_by_name() -> None:
    errs = errors_of({"command": "true", "resources": {"gpu": 1}})
    assert [(tuple(e["loc"]), e["type"]) for e in errs] == [(("resources", "gpu"), "extra_forbidden")]


def test_unknown_nested_runtime_field_is_rejected_by_name() -> None:
    assert locs({"command": "true", "runtime": {"framwork": "pytorch"}}) == [("runtime", "framwork")]


def test_every_unknown_field_is_reported() -> None:
    assert sorted(locs({"command": "true", "foo": 1, "bar": 2})) == [("bar",), ("foo",)]


def test_command_is_required() -> None:
    errs = errors_of({})
    assert [(tuple(e["loc"]), e["type"]) for e in errs] == [(("command",), "missing")]


# -- command ------------------------------------------------------------------------------------------------------


def test_command_as_string_runs_through_the_shell() -> None:
    spec = JobSpec.model_validate({"command": "python train.py && echo done"})
    assert spec.command == "python train.py && echo done"
    assert command_argv(spec.command) == ["/bin/sh", "-c", "python train.py && echo done"]
    assert command_text(spec.command) == "python train.py && echo done"


def test_command_as_list_is_executed_as_given() -> None:
    spec = JobSpec.model_validate({"command": ["python", "train.py", "--lr", "0.1 0.2"]})
    assert spec.command == ["python", "train.py", "--lr", "0.1 0.2"]
    assert command_argv(spec.command) == ["python", "train.py", "--lr", "0.1 0.2"]
    assert command_text(spec.command) == "python train.py --lr '0.1 0.2'"


@pytest.mark.parametrize("command", ["", "   ", [], [""], "echo \x00", ["echo", "a\x00b"]])
def test_empty_or_nul_commands_are_rejected(command: Any) -> None:
    assert locs({"command": command})[0][0] == "command"


@pytest.mark.parametrize("field", ["prepare_command", "finish_command"])
def test_prepare_and_finish_commands_are_checked_like_command(field: str) -> None:
    assert locs({"command": "true", field: "  "}) == [(field,)]
    spec = JobSpec.model_validate({"command": "true", field: ["pip", "install", "-r", "req.txt"]})
    assert getattr(spec, field) == ["pip", "install", "-r", "req.txt"]


def test_display_name_defaults_to_the_command_and_is_truncated() -> None:
    assert JobSpec(command="echo hi").display_name == "echo hi"
    assert JobSpec(command="echo hi", name="my job").display_name == "my job"
    long = JobSpec(command="x" * 100).display_name
    assert long == "x" * 39 + "…"
    assert len(long) == 40


@pytest.mark.parametrize("name", ["", "   ", "bad\nname", "tab\there"])
def test_name_must_be_printable(name: str) -> None:
    assert locs({"command": "true", "name": name}) == [("name",)]


# -- resources ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2G", 2 * 1024**3),
        ("2GB", 2 * 1024**3),
        ("2Gi", 2 * 1024**3),
        ("512Mi", 512 * 1024**2),
        ("512M", 512 * 1024**2),
        ("1.5Gi", int(1.5 * 1024**3)),
        (4096, 4096),
    ],
)
def test_memory_is_parsed_to_bytes(text: Any, expected: int) -> None:
    spec = JobSpec.model_validate({"command": "true", "resources": {"memory": text}})
    assert spec.resources.memory == expected


def test_memory_defaults_to_no_limit_and_defaults_are_one_cpu_no_gpu() -> None:
    spec = JobSpec(command="true")
    assert spec.resources.memory is None
    assert spec.resources.cpus == 1.0
    assert spec.resources.gpus == 0


@pytest.mark.parametrize("bad", ["lots", "2 apples", "-1G", 0, "0", True, [1], -5])
def test_bad_memory_is_rejected(bad: Any) -> None:
    assert locs({"command": "true", "resources": {"memory": bad}}) == [("resources", "memory")]


@pytest.mark.parametrize("cpus", [-1, -0.5, 0, 5000])
def test_cpus_out_of_range_are_rejected(cpus: float) -> None:
    assert locs({"command": "true", "resources": {"cpus": cpus}}) == [("resources", "cpus")]


def test_fractional_cpus_are_accepted() -> None:
    assert JobSpec.model_validate({"command": "true", "resources": {"cpus": 0.25}}).resources.cpus == 0.25


@pytest.mark.parametrize("gpus", [-1, 65])
def test_gpus_out_of_range_are_rejected(gpus: int) -> None:
    assert locs({"command": "true", "resources": {"gpus": gpus}}) == [("resources", "gpus")]


# -- timeout ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1h30m", 5400.0),
        ("90", 90.0),
        ("90s", 90.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1w", 604800.0),
        (45, 45.0),
        (1.5, 1.5),
    ],
)
def test_timeout_accepts_seconds_and_durations(value: Any, seconds: float) -> None:
    assert JobSpec.model_validate({"command": "true", "timeout": value}).timeout == seconds


@pytest.mark.parametrize("bad", ["", "soon", "1x", "1y", "h", "-5", 0, -3, "0s", True, "400d"])
def test_bad_timeouts_are_rejected(bad: Any) -> None:
    assert locs({"command": "true", "timeout": bad}) == [("timeout",)]


def test_a_bad_timeout_says_what_a_duration_is() -> None:
    [error] = errors_of({"command": "true", "timeout": "1x"})
    assert error["msg"] == "Value error, '1x' is not a duration (e.g. 90s, 15m, 2h, 1d, 1h30m)"


def test_parse_duration_directly() -> None:
    assert parse_duration("1h30m15s") == 5415.0
    assert parse_duration(" 1h 30m ") == 5400.0
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("forever")


# -- env and labels -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["KILN_JOB_ID", "KILN_", "KILN_OUTPUT_DIR"])
def test_reserved_env_names_are_rejected(name: str) -> None:
    errs = errors_of({"command": "true", "env": {name: "x"}})
    assert [tuple(e["loc"]) for e in errs] == [("env",)]
    assert name in errs[0]["msg"]
    assert "KILN_" in errs[0]["msg"]


@pytest.mark.parametrize("name", ["1ABC", "A-B", "has space", "", "É"])
def test_invalid_env_names_are_rejected(name: str) -> None:
    assert locs({"command": "true", "env": {name: "x"}}) == [("env",)]


def test_env_value_with_nul_is_rejected_and_good_env_is_kept() -> None:
    assert locs({"command": "true", "env": {"A": "x\x00y"}}) == [("env",)]
    spec = JobSpec.model_validate({"command": "true", "env": {"LR": "0.1", "_X": "", "KILNX": "ok"}})
    assert spec.env == {"LR": "0.1", "_X": "", "KILNX": "ok"}


@pytest.mark.parametrize("key", ["bad key", "-lead", "trail-", "", "ümlaut", "a:b"])
def test_bad_label_keys_are_rejected(key: str) -> None:
    errs = errors_of({"command": "true", "labels": {key: "v"}})
    assert [tuple(e["loc"]) for e in errs] == [("labels",)]
    assert "label key" in errs[0]["msg"]


@pytest.mark.parametrize("field", ["labels", "node_selector"])
def test_a_label_key_over_63_characters_is_rejected_by_its_bound(field: str) -> None:
    key = "a" * 64
    errs = errors_of({"command": "true", field: {key: "v"}})
    assert [tuple(e["loc"]) for e in errs] == [(field, key, "[key]")]
    assert errs[0]["type"] == "string_too_long"


@pytest.mark.parametrize("key", ["team", "a", "kiln.dev/owner", "x_y-z.1", "a" * 63])
def test_good_label_keys_are_accepted(key: str) -> None:
    assert JobSpec.model_validate({"command": "true", "labels": {key: "v"}}).labels == {key: "v"}


def test_long_label_values_are_rejected() -> None:
    assert locs({"command": "true", "labels": {"k": "v" * 257}}) == [("labels", "k")]
    assert JobSpec.model_validate({"command": "true", "labels": {"k": "v" * 256}}).labels["k"] == "v" * 256


# -- restarts ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codes", [[0], [256], [-1]])
def test_restart_exit_codes_must_be_1_to_255(codes: list[int]) -> None:
    assert locs({"command": "true", "restart_on_exit_codes": codes})[0][0] == "restart_on_exit_codes"


@pytest.mark.parametrize("n", [-1, 101])
def test_max_restarts_range(n: int) -> None:
    assert locs({"command": "true", "max_restarts": n}) == [("max_restarts",)]


# -- runtime -----------------------------------------------------------------------------------------------------


def test_runtime_defaults_to_the_python_framework() -> None:
    runtime = JobSpec(command="true").runtime
    assert (runtime.framework, runtime.version, runtime.python, runtime.image) == ("python", None, None, None)
    assert runtime.label == "python"


@pytest.mark.parametrize(
    ("runtime", "named"),
    [
        ({"framework": "pytorch", "python": "/usr/bin/python3"}, "framework, python"),
        ({"python": "/usr/bin/python3", "image": "repo/x:1"}, "python, image"),
        ({"framework": "pytorch", "image": "repo/x:1"}, "framework, image"),
        ({"framework": "pytorch", "python": "/p", "image": "i"}, "framework, python, image"),
    ],
)
def test_runtime_takes_only_one_kind(runtime: dict[str, str], named: str) -> None:
    errs = errors_of({"command": "true", "runtime": runtime})
    assert [tuple(e["loc"]) for e in errs] == [("runtime",)]
    assert "only one of framework, python, image" in errs[0]["msg"]
    assert f"(got {named})" in errs[0]["msg"]


def test_version_without_framework_is_rejected() -> None:
    errs = errors_of({"command": "true", "runtime": {"python": "/usr/bin/python3", "version": "3"}})
    assert "version applies only to a catalog framework" in errs[0]["msg"]


@pytest.mark.parametrize(
    ("runtime", "label"),
    [
        ({"framework": "pytorch"}, "pytorch"),
        ({"framework": "pytorch", "version": "2.13"}, "pytorch==2.13"),
        ({"python": "/opt/py/bin/python"}, "python:/opt/py/bin/python"),
        ({"image": "repo/x:1"}, "image:repo/x:1"),
    ],
)
def test_runtime_labels(runtime: dict[str, str], label: str) -> None:
    assert RuntimeSpec.model_validate(runtime).label == label


def test_spec_round_trips_through_json() -> None:
    spec = JobSpec.model_validate(
        {
            "name": "train",
            "command": ["python", "train.py"],
            "runtime": {"framework": "pytorch", "version": "2.13"},
            "resources": {"cpus": 2, "memory": "2G", "gpus": 1},
            "env": {"LR": "0.1"},
            "timeout": "1h30m",
            "labels": {"team": "vision"},
            "max_restarts": 2,
            "restart_on_exit_codes": [137],
        }
    )
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again == spec
    assert again.resources.memory == 2 * 1024**3
    assert again.timeout == 5400.0
