"""`kiln serve`, `kiln predict` and `kiln services` without a server: reading service.yaml (errors name the field),
reading `-d` (inline, @file, @-), what the tables show (replicas with state, job, model version, in-flight), and
the commands' output and exit codes against a stand-in client."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kiln.cli import services as render
from kiln.cli.main import build_app
from kiln.cli.services import load_service_spec, read_predict_data
from kiln.cli.spec import SpecError
from kiln.domain.rollout import RolloutPolicy
from kiln.domain.serving import (
    CanaryRead,
    PredictorSpec,
    PredictRequest,
    PredictResponse,
    ReplicaRead,
    RolloutEvent,
    ServiceRead,
    ServiceSpec,
    ShadowRead,
    VersionTraffic,
)

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
SERVICE_YAML = """\
name: digits
model: digits@production
predictor:
  type: custom
  class: predictor:Model
  input_schema: {shape: [64], dtype: float32}
runtime: {framework: sklearn}
resources: {cpus: 1, memory: 1G}
autoscale: {min: 0, max: 4, target_concurrency: 8, idle_seconds: 120}
batching: {max_batch_size: 16, max_latency_ms: 2}
env: {THREADS: 1, VERBOSE: true}
"""


def write(tmp_path: Path, text: str, name: str = "service.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def spec_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as caught:
        load_service_spec(write(tmp_path, text))
    return str(caught.value)


def test_a_service_yaml_is_read_with_its_env_as_text_and_name_replaced(tmp_path: Path) -> None:
    spec = load_service_spec(write(tmp_path, SERVICE_YAML), name="digits-2")
    assert spec.name == "digits-2" and spec.model == "digits@production"
    assert spec.predictor.class_ == "predictor:Model" and spec.predictor.input_schema is not None
    assert spec.predictor.input_schema.shape == [64]
    assert spec.autoscale is not None and (spec.autoscale.min, spec.autoscale.max) == (0, 4)
    assert spec.batching is not None and spec.batching.max_batch_size == 16
    assert spec.env == {"THREADS": "1", "VERBOSE": "true"} and spec.runtime.framework == "sklearn"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("{min: 0, max: 4,", "{min: 5, max: 4,"), "autoscale: min: 5 is above max (4)"),
        (("  class: predictor:Model\n", ""), "predictor: class: a custom predictor needs class: module:Class"),
        (("type: custom", "type: sklearn"), "predictor: class: only for a custom predictor, not sklearn"),
        (("type: custom", "type: tensorflow"), "predictor.type: Input should be 'torchscript'"),
        (
            ("  class: predictor", "  clas: predictor"),
            "predictor.clas: unknown field (did you mean 'predictor.class'?)",
        ),
        (("{shape: [64],", "{shap: [64],"), "predictor.input_schema.shap: unknown field (did you mean"),
        (("shape: [64]", "shape: [0]"), "predictor.input_schema.shape[0]: Input should be greater than or equal to 1"),
        (("model: digits@production", "model: digits"), "model: 'digits': expected NAME@VERSION or NAME@ALIAS"),
        (("name: digits", "name: Digits_1"), "name: 'Digits_1': lowercase letters, digits and '-'"),
        (("max_batch_size: 16", "max_batch_size: 0"), "batching.max_batch_size: Input should be greater than"),
        (("batching:", "batchin:"), "batchin: unknown field (did you mean 'batching'?)"),
        (("env: {THREADS: 1,", "env: {KILN_THREADS: 1,"), "env: 'KILN_THREADS': names starting with KILN_"),
        (("autoscale: {min: 0", "replicas: two\nautoscale: {min: 0"), "replicas: Input should be a valid integer"),
    ],
)
def test_a_bad_service_yaml_names_the_file_and_the_field(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    old, new = change
    assert old in SERVICE_YAML
    message = spec_error(tmp_path, SERVICE_YAML.replace(old, new))
    assert message.startswith(f"invalid service spec in {tmp_path / 'service.yaml'}:")
    assert expected in message, message


def test_a_service_yaml_that_is_not_a_mapping_or_not_yaml_is_refused(tmp_path: Path) -> None:
    assert "expected a mapping" in spec_error(tmp_path, "- just\n- a list\n")
    assert "not valid YAML" in spec_error(tmp_path, "predictor: [unclosed\n")
    assert "predictor: Field required" in spec_error(tmp_path, "name: digits\nmodel: digits@1\n")


def test_predict_data_is_inline_json_a_file_or_stdin_an_object_or_a_list(tmp_path: Path) -> None:
    assert read_predict_data('{"inputs": [[1, 2]], "parameters": {"k": 3}}') == PredictRequest(
        inputs=[[1, 2]], parameters={"k": 3}
    )
    assert read_predict_data("[[1, 2], [3, 4]]").inputs == [[1, 2], [3, 4]]
    path = write(tmp_path, json.dumps({"inputs": [[0.5] * 64]}), "input.json")
    assert read_predict_data(f"@{path}").inputs == [[0.5] * 64]
    assert read_predict_data("@-", io.StringIO('["a cat", "a dog"]')).inputs == ["a cat", "a dog"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("@", "-d @: give a file name after @ (or @- for stdin)"),
        ("@{missing}", "-d @{missing}: cannot read {missing}: No such file or directory"),
        ("@{bad}", "-d @{bad}: not valid JSON: Expecting property name"),
        ("{'inputs': 1}", "-d: not valid JSON"),
        ("3", "-d: expected {...}, got int"),
        ('{"input": [[1]]}', "-d: inputs: Field required; input: unknown field (a request has inputs and parameters)"),
        ('{"inputs": 3}', "-d: inputs: Input should be a valid list"),
        ('{"inputs": [1], "parameters": [2]}', "-d: parameters: Input should be a valid dictionary"),
    ],
)
def test_bad_predict_data_names_the_flag_the_file_and_the_field(tmp_path: Path, data: str, expected: str) -> None:
    files = {"{missing}": str(tmp_path / "nope.json"), "{bad}": str(write(tmp_path, "{oops", "bad.json"))}
    for placeholder, path in files.items():
        data, expected = data.replace(placeholder, path), expected.replace(placeholder, path)
    expected = expected.replace("{...}", render.DATA_FORMS)
    with pytest.raises(SpecError) as caught:
        read_predict_data(data)
    assert str(caught.value).startswith(expected), str(caught.value)


# -- views --------------------------------------------------------------------------------------------------------


def replica(number: int, state: str, **fields: Any) -> ReplicaRead:
    base: dict[str, Any] = {
        "id": f"rep-{number}",
        "job_id": f"job-{number}",
        "job_state": "RUNNING",
        "revision": 1,
        "state": state,
        "model_version": 3,
        "created_at": NOW,
    }
    return ReplicaRead(**(base | fields))


def service(state: str = "READY", replicas: list[ReplicaRead] | None = None, **fields: Any) -> ServiceRead:
    spec = ServiceSpec.model_validate(
        {
            "name": "digits",
            "model": "digits@production",
            "predictor": {"type": "sklearn", "method": "predict_proba"},
            "replicas": 2,
            "batching": {"max_batch_size": 16, "max_latency_ms": 2},
        }
    )
    base: dict[str, Any] = {
        "id": "svc-1",
        "name": "digits",
        "org_id": "org-1",
        "user_id": "usr-1",
        "state": state,
        "spec": spec,
        "model_name": "digits",
        "model_version": 3,
        "revision": 1,
        "desired_replicas": 2,
        "ready_replicas": 2,
        "replicas": replicas if replicas is not None else [],
        "endpoint": "http://kiln.test/api/v1/services/digits/predict",
        "created_at": NOW,
        "updated_at": NOW,
    }
    return ServiceRead(**(base | fields))


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch) -> Console:
    # A wide console of its own: the shared one's width depends on COLUMNS when kiln.cli.common was first imported.
    console = Console(file=io.StringIO(), width=200, color_system=None, highlight=False)
    monkeypatch.setattr(render, "out", console)
    return console


def rows(console: Console) -> list[list[str]]:
    text: str = console.file.getvalue()  # type: ignore[attr-defined]
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("─")]


def test_the_replicas_table_shows_state_job_model_version_and_in_flight(console: Console) -> None:
    rolling = service(
        "UPDATING",
        [
            replica(1, "READY", revision=2, model_version=4, in_flight=3, ready_at=NOW),
            replica(2, "DRAINING", in_flight=1),
            replica(3, "FAILED", job_state="FAILED", message="cannot load model: bad magic number"),
            replica(4, "STARTING", job_id=None, job_state=None),
        ],
    )
    render.replicas_table(rolling)
    header, *cells = rows(console)
    assert header[:7] == ["REPLICA", "STATE", "JOB", "JOB", "STATE", "MODEL", "REVISION"]
    assert cells[0][:7] == ["rep-1", "READY", "job-1", "RUNNING", "digits@4", "2", "3"]
    assert cells[1][:7] == ["rep-2", "DRAINING", "job-2", "RUNNING", "digits@3", "1", "1"]
    assert cells[2][:7] == ["rep-3", "FAILED", "job-3", "FAILED", "digits@3", "1", "0"]
    assert " ".join(cells[2]).endswith("cannot load model: bad magic number")
    assert cells[3][:7] == ["rep-4", "STARTING", "-", "-", "digits@3", "1", "0"]


def test_the_service_views_say_model_predictor_replicas_and_autoscale(console: Console) -> None:
    render.services_table([service(ready_replicas=1, state="DEGRADED")])
    assert rows(console)[1][:7] == ["digits", "DEGRADED", "digits@3", "1/2", "sklearn", "(predict_proba)", "1"]
    scaled = service(state="IDLE", ready_replicas=0, desired_replicas=0)
    scaled.spec.autoscale = ServiceSpec.model_validate(
        {"name": "x", "model": "x@1", "predictor": {"type": "onnx"}, "autoscale": {"min": 0, "max": 4}}
    ).autoscale
    render.service_detail(scaled)
    text = " ".join(" ".join(row) for row in rows(console))
    assert "replicas 0/0 (autoscale 0-4)" in text
    assert "autoscale 0-4 replicas, 4 requests in flight each, to zero after 60s idle" in text
    assert "batching up to 16, waiting at most 2 ms" in text
    assert "model digits@3 (digits@production)" in text
    assert "endpoint http://kiln.test/api/v1/services/digits/predict" in text


def test_a_degraded_service_is_described_by_its_failed_replicas_messages() -> None:
    degraded = service(
        "DEGRADED",
        [replica(1, "READY"), replica(2, "FAILED", message="cannot load model: no file model.pt")],
        message="1 of 2 replicas ready",
    )
    assert render.describe_failure(degraded) == (
        "service digits DEGRADED: 1 of 2 replicas ready\n  replica rep-2 (job-2): cannot load model: no file model.pt"
    )


# -- commands against a stand-in client ---------------------------------------------------------------------------


class StandIn:
    """What the commands call on ``kiln.Client``, answering from the test's script and recording the calls."""

    def __init__(self, waited: ServiceRead | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.waited = waited or service()
        self.endpoint = "http://kiln.test"

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit_service(self, spec: ServiceSpec, code_sha256: str | None = None) -> ServiceRead:
        self.calls.append(("submit", (spec.name, code_sha256)))
        return service("DEPLOYING", ready_replicas=0)

    def upload_blob(self, path: Path, sha256: str, progress: Any = None) -> None:
        self.calls.append(("upload", sha256))

    def wait_service(self, name: str, state: Any, timeout: float, revision: int | None = None) -> ServiceRead:
        self.calls.append(("wait", (name, str(state), revision)))
        return self.waited

    def update_service(self, name: str, model: str | None = None, **canary: Any) -> ServiceRead:
        self.calls.append(("update", (name, model, *canary.values())))
        return service("UPDATING", revision=2) if not canary else self.with_canary()

    def with_canary(self, *replicas: ReplicaRead) -> ServiceRead:
        answer = service("READY", list(replicas), updated_at=NOW)
        answer.canary = CanaryRead(model_version=4, weight=10, replicas=1)
        return answer

    def get_service(self, name: str) -> ServiceRead:
        self.calls.append(("get", name))
        return self.with_canary(replica(1, "READY"), replica(2, "READY", model_version=4, canary=True))

    def promote_service(self, name: str) -> ServiceRead:
        self.calls.append(("promote", name))
        return service("UPDATING", revision=2, model_version=4)

    def rollback_service(self, name: str) -> ServiceRead:
        self.calls.append(("rollback", name))
        return service("READY")

    def list_services(self) -> list[ServiceRead]:
        self.calls.append(("list", None))
        custom = service()
        custom.spec.predictor = PredictorSpec.model_validate({"type": "custom", "class": "predictor:Model"})
        return [custom]

    def predict(self, name: str, inputs: list[Any], parameters: dict[str, Any]) -> PredictResponse:
        self.calls.append(("predict", (name, inputs, parameters)))
        return PredictResponse(outputs=[7] * len(inputs), model="digits@3")


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    client = StandIn()
    monkeypatch.setattr(render, "connect", lambda: client)
    yield client


def invoke(*argv: str, stdin: str | None = None) -> Any:
    return CliRunner().invoke(build_app(), list(argv), input=stdin, env={"COLUMNS": "200"})


def test_kiln_predict_prints_the_outputs_as_json_from_a_file_or_stdin(stand_in: StandIn, tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps({"inputs": [[0.0] * 64, [1.0] * 64], "parameters": {"k": 1}}), "input.json")
    result = invoke("predict", "digits", "-d", f"@{path}")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "[7, 7]" and "2 outputs from digits@3" in result.output
    assert stand_in.calls == [("predict", ("digits", [[0.0] * 64, [1.0] * 64], {"k": 1}))]
    result = invoke("predict", "digits", "-d", "@-", "--full", stdin="[[2]]")
    assert json.loads(result.stdout) == {"outputs": [7], "model": "digits@3"}
    refused = invoke("predict", "digits", "-d", '{"inputs": 3}')
    assert refused.exit_code == 2 and "-d: inputs: Input should be a valid list" in refused.output
    assert len(stand_in.calls) == 2  # refused before any request


def test_kiln_serve_prints_the_name_first_and_uploads_no_code_for_a_built_in_predictor(
    stand_in: StandIn, tmp_path: Path
) -> None:
    path = write(tmp_path, SERVICE_YAML.replace("type: custom\n  class: predictor:Model", "type: sklearn"))
    result = invoke("serve", "-f", str(path), "--dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "digits"
    assert stand_in.calls == [("submit", ("digits", None))]


def test_kiln_serve_uploads_a_custom_predictors_code_and_wait_fails_on_a_replica_that_did_not_load(
    stand_in: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "predictor.py").write_text("class Model:\n    pass\n")
    monkeypatch.setenv("KILN_CLIENT_DIR", str(tmp_path / "client"))
    stand_in.waited = service(
        "DEGRADED", [replica(1, "FAILED", message="cannot load model: bad magic number")], ready_replicas=0
    )
    result = invoke("serve", "-f", str(write(tmp_path, SERVICE_YAML)), "--dir", str(code), "--wait")
    assert result.exit_code == 1, result.output
    (upload, sha), (submit, (name, sent)), (wait, waited) = stand_in.calls
    assert (upload, submit, name, sent) == ("upload", "submit", "digits", sha) and len(sha) == 64
    assert (wait, waited) == ("wait", ("digits", "READY", None))
    assert "replica rep-1 (job-1): cannot load model: bad magic number" in result.output

    bad = invoke("serve", "-f", str(write(tmp_path, "name: digits\n", "bad.yaml")))
    assert bad.exit_code == 2 and "invalid service spec in" in bad.output and "model: Field required" in bad.output


def test_kiln_services_update_waits_for_the_new_revision(stand_in: StandIn) -> None:
    new = [replica(n, "READY", revision=2, model_version=4) for n in (3, 4)]
    stand_in.waited = service("READY", [replica(1, "STOPPED"), replica(2, "STOPPED"), *new], revision=2)
    result = invoke("services", "update", "digits", "--model", "digits@4", "--wait")
    assert result.exit_code == 0, result.output
    assert stand_in.calls == [("update", ("digits", "digits@4")), ("wait", ("digits", "READY", 2))]
    assert "rolling out digits@4 to service digits (revision 2)" in result.output
    stand_in.waited = service(
        "UPDATING",
        [replica(1, "READY"), replica(2, "FAILED", revision=2, model_version=4, message="cannot load model: EOF")],
        revision=2,
        message="rolling out revision 2: 0 of 2 new ready",
    )
    failed = invoke("services", "update", "digits", "--model", "digits@4", "--wait")
    assert failed.exit_code == 1, failed.output
    assert "service digits UPDATING: rolling out revision 2: 0 of 2 new ready" in failed.output
    assert "replica rep-2 (job-2): cannot load model: EOF" in failed.output
    assert "the old replicas keep answering" in failed.output
    refused = invoke("services", "update", "digits", "--model", "digits")
    assert refused.exit_code == 2 and "--model: 'digits': expected NAME@VERSION" in refused.output


def test_kiln_services_list_writes_json_as_the_api_does_and_a_table_otherwise(stand_in: StandIn) -> None:
    listed = invoke("services", "ls", "-o", "json")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout)[0]["spec"]["predictor"]["class"] == "predictor:Model"
    table = invoke("services", "list")
    row = next(line for line in table.stdout.splitlines() if line.startswith("digits"))
    assert row.split()[:6] == ["digits", "READY", "digits@3", "2/2", "custom", "predictor:Model"]


def test_kiln_services_update_starts_a_canary_and_waits_for_it_and_promote_and_rollback_end_it(
    stand_in: StandIn,
) -> None:
    result = invoke("services", "update", "digits", "--model", "digits@4", "--canary", "10", "--wait")
    assert result.exit_code == 0, result.output
    assert "canary digits@4: 10% of predicts, 1 replica, ready" in result.output
    assert stand_in.calls == [("update", ("digits", "digits@4", 10, None, None)), ("get", "digits")]
    assert invoke("services", "update", "digits", "--canary", "101").exit_code == 2
    assert invoke("services", "update", "digits").exit_code == 2
    promoted = invoke("services", "promote", "digits")
    assert promoted.exit_code == 0 and "promoted: service digits serves digits@4" in promoted.output
    rolled_back = invoke("services", "rollback", "digits")
    assert rolled_back.exit_code == 0 and "serves digits@3 only" in rolled_back.output
    assert stand_in.calls[-2:] == [("promote", "digits"), ("rollback", "digits")]


def test_kiln_services_update_sends_a_rollout_policy_and_show_prints_the_figures_and_moves(stand_in: StandIn) -> None:
    argv = ["services", "update", "digits", "--model", "digits@4", "--canary", "10", "--max-error-rate", "0.05"]
    argv += ["--max-p99", "250", "--min-requests", "50", "--steps", "10,50,100", "--step-wait", "30"]
    result = invoke(*argv)
    assert result.exit_code == 0, result.output
    policy = RolloutPolicy(max_error_rate=0.05, max_p99_ms=250, min_requests=50, steps=[10, 50, 100], step_wait=30)
    assert stand_in.calls == [("update", ("digits", "digits@4", 10, None, policy))]
    for bad in (["--steps", "50,10"], ["--steps", "ten"], ["--max-error-rate", "2"]):
        refused = invoke("services", "update", "digits", "--canary", "10", *bad)
        assert refused.exit_code == 2, (bad, refused.output)
    assert len(stand_in.calls) == 1  # refused before any request

    shown = service("READY")
    shown.canary = CanaryRead(model_version=4, weight=10, replicas=1, policy=policy)
    shown.versions = [
        VersionTraffic(
            model_version=3,
            role="stable",
            requests=900,
            errors=1,
            error_rate=1 / 900,
            requests_per_second=2.5,
            latency_ms_p50=4.2,
            latency_ms_p99=9.8,
        )
    ]
    moved = RolloutEvent(at=NOW, move="rolled_back", version=5, weight=10, by="policy", message="error rate 20.0%")
    shown.rollout_events = [moved]
    stand_in.get_service = lambda name: shown  # type: ignore[method-assign]
    text = invoke("services", "show", "digits").stdout
    assert "errors <= 5.0%, p99 <= 250 ms after 50 predicts, steps 10%→50%→100% every 30s" in text, text
    assert "@3 stable 900 requests (2.5/s), 1 error (0.1%), p50 4.2 ms, p99 9.8 ms" in text, text
    assert "@5 rolled back by policy at 10%: error rate 20.0%" in text, text


def test_kiln_services_update_starts_and_ends_a_shadow_and_show_prints_its_comparison(stand_in: StandIn) -> None:
    assert invoke("services", "update", "digits", "--shadow", "digits@5").exit_code == 0
    assert invoke("services", "update", "digits", "--end-shadow").exit_code == 0
    assert stand_in.calls == [("update", ("digits", None, "digits@5")), ("update", ("digits", None, ""))]
    shown = service("READY")
    shown.shadow = ShadowRead(
        model_version=5,
        copied=900,
        dropped=3,
        errors=0,
        compared=900,
        agreement_rate=0.97,
        mean_abs_diff=0.0125,
        latency_ms_p50=4.1,
        latency_ms_p99=9.0,
    )
    stand_in.get_service = lambda name: shown  # type: ignore[method-assign]
    text = invoke("services", "show", "digits").stdout
    assert "digits@5: 900 copies (3 dropped, 0 errors), 97.0% agree, mean |diff| 0.0125, p50 4.1 ms" in text, text
