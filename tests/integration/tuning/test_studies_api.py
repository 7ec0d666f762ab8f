"""Tuning studies through the REST API against a real server: a bad spec is refused with a 422 naming the field
(the trial spec gets every check a job submit makes), studies belong to an organisation (404 across
organisations, viewers read only), a trial spec that can never fit the organisation's train quota is refused like
the same job, and a trial's parameters reach its job as ``{name}`` placeholders, ``KILN_PARAM_<NAME>`` and
``$KILN_PARAMS_FILE``."""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.sdk.client import Client
from tests.helpers import log_text
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant

PY = sys.executable
# A trial that reports its objective once and ends.
QUICK = "echo step=0 score={x}"
# A trial that runs until it is stopped (the study's stop cancels its job).
SLEEPER = "echo step=0 score={x}; sleep 120"
ENDED = {"SUCCEEDED", "FAILED", "STOPPED"}
NO_STUDY = "study-doesnotexist"


def study(command: str | list[str] = QUICK, **extra: Any) -> dict[str, Any]:
    """A study spec over one float parameter ``x``, maximising the metric ``score``, run with this interpreter."""
    spec: dict[str, Any] = {
        "trial": {"command": command, "runtime": {"python": PY}, "resources": {"cpus": 0.5}},
        "parameters": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "score", "direction": "maximize"},
        "max_trials": 1,
        "seed": 7,
    }
    spec.update(extra)
    return spec


def wait_study(api: Api, study_id: str, timeout: float = 60) -> dict[str, Any]:
    """The study once it has ended."""
    deadline = time.monotonic() + timeout
    while True:
        found = api.ok("GET", f"/studies/{study_id}")
        if found["state"] in ENDED:
            return found  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"study {study_id} still {found['state']} after {timeout}s: {found}"
        time.sleep(0.2)


def wait_trial_job(api: Api, study_id: str, state: str, timeout: float = 60) -> dict[str, Any]:
    """The study's first trial once its job is in ``state``."""
    deadline = time.monotonic() + timeout
    while True:
        trials = api.ok("GET", f"/studies/{study_id}/trials", params={"order": "number"})["items"]
        if trials and trials[0]["job_id"] and api.job(trials[0]["job_id"])["state"] == state:
            return trials[0]  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"study {study_id}: no trial job {state} after {timeout}s: {trials}"
        time.sleep(0.1)


def as_text(value: bool | int | float | str) -> str:
    """A parameter as the contract puts it on a command line and in ``KILN_PARAM_*``: a float as its repr, a
    boolean as true or false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def fields(response: Any) -> list[str]:
    """The fields a 422 names in its details."""
    body = response.json()
    details = body.get("details")
    named = [d["field"] for d in details] if isinstance(details, list) else []
    if isinstance(details, dict) and "field" in details:
        named.append(details["field"])
    return named


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    server = KilnServer(tmp_path_factory.mktemp("studies-api") / "home", cpus="4").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def admin(server: KilnServer) -> Iterator[Api]:
    api = Api.admin(server)
    yield api
    api.close()


@pytest.fixture(scope="module")
def alpha(admin: Api) -> Iterator[Tenant]:
    tenant = create_tenant(admin, "tune-alpha")
    yield tenant
    close_all(tenant)


def test_bad_specs_are_refused_naming_the_field(alpha: Tenant) -> None:
    member = alpha["member"].api
    grid_float = study(algorithm="grid", parameters={"lr": {"type": "float", "low": 0.1, "high": 1.0}})
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        # (what, the body, a field its details name, what its message says)
        ("unknown key", {"spec": {**study(), "bogus": 1}}, "spec.bogus", "unknown field"),
        (
            "unknown key of a parameter",
            {"spec": study(parameters={"x": {"type": "float", "low": 0, "high": 1, "bogus": 2}})},
            "spec.parameters.x.bogus",
            "unknown field",
        ),
        (
            "low above high",
            {"spec": study(parameters={"x": {"type": "float", "low": 1.0, "high": 0.1}})},
            "spec.parameters.x",
            "low: 1 is above high (0.1)",
        ),
        (
            "empty objective metric",
            {"spec": study(objective={"metric": "", "direction": "maximize"})},
            "spec.objective.metric",
            "",
        ),
        (
            "blank objective metric",
            {"spec": study(objective={"metric": "  ", "direction": "maximize"})},
            "spec.objective.metric",
            "not empty",
        ),
        (
            "categorical without choices",
            {"spec": study(parameters={"x": {"type": "categorical"}})},
            "spec.parameters.x",
            "choices",
        ),
        (
            "categorical with no choice",
            {"spec": study(parameters={"x": {"type": "categorical", "choices": []}})},
            "spec.parameters.x.choices",
            "",
        ),
        ("grid over a float without step", {"spec": grid_float}, "spec", "parameters.lr: grid search needs a step"),
        ("no parameters", {"spec": study(parameters={})}, "spec.parameters", ""),
        ("max_trials 0", {"spec": study(max_trials=0)}, "spec.max_trials", ""),
        (
            "unknown key of the trial",
            {"spec": study(trial={"command": QUICK, "runtime": {"python": PY}, "bogus": 1})},
            "spec.trial.bogus",
            "unknown field",
        ),
        ("unknown key of the submit", {"spec": study(), "bogus": 1}, "bogus", "unknown field"),
    ]
    for what, body, field, says in cases:
        response = member.post("/studies", body)
        assert response.status_code == 422, f"{what}: {response.status_code} {response.text}"
        error = response.json()
        assert error["code"] == "invalid_input", (what, error)
        assert field in fields(response), (what, error)
        assert says in error["message"], (what, error)
    assert member.ok("GET", "/studies")["items"] == []
    assert member.ok("GET", "/jobs")["items"] == []


def test_the_trial_spec_gets_the_checks_of_a_job_submit(alpha: Tenant) -> None:
    """Refused at submit as the same job would be (its runtime, resources, code bundle), the message naming the
    study's field: ``trial.<the job's field>`` for the trial spec's, ``code_sha256`` for the submit's own."""
    member = alpha["member"].api
    base = study()["trial"]
    cases: list[tuple[str, dict[str, Any], str | None, str, str]] = [
        # (what, the trial spec, the code bundle, the job's field, the study's)
        ("unknown runtime", {**base, "runtime": {"framework": "nope"}}, None, "runtime.framework", "trial."),
        ("more CPUs than the machine", {**base, "resources": {"cpus": 64}}, None, "resources", "trial."),
        ("no uploaded bundle", base, "0" * 64, "code_sha256", ""),
    ]
    for what, trial, code, field, prefix in cases:
        bundle = {"code_sha256": code} if code else {}
        job = member.post("/jobs", {"spec": trial, **bundle})
        assert job.status_code == 422, f"{what}: the job submit gave {job.status_code} {job.text}"
        assert job.json()["message"].startswith(f"{field}: "), (what, job.json())
        response = member.post("/studies", {"spec": study(trial=trial), **bundle})
        assert response.status_code == 422, f"{what}: {response.status_code} {response.text}"
        assert response.json()["code"] == "invalid_input", (what, response.json())
        assert response.json()["message"] == prefix + job.json()["message"], (what, job.json(), response.json())
    assert member.ok("GET", "/studies")["items"] == []
    assert member.ok("GET", "/jobs")["items"] == []


def test_studies_belong_to_their_organisation_and_viewers_only_read(admin: Api, alpha: Tenant) -> None:
    bravo = create_tenant(admin, "tune-bravo", ("admin", "member"))
    try:
        member, viewer = alpha["member"].api, alpha["viewer"].api
        created = member.ok("POST", "/studies", json_body={"spec": study(SLEEPER, name="tenancy")})
        study_id = created["id"]
        assert (created["org_id"], created["user_id"], created["name"]) == (
            alpha.id,
            alpha["member"].user_id,
            "tenancy",
        )
        wait_trial_job(member, study_id, "RUNNING")
        paths = [f"/studies/{study_id}", f"/studies/{study_id}/trials", f"/studies/{study_id}/events"]

        # Another organisation (its member and its org admin): as if the study did not exist.
        for outsider in (bravo["member"].api, bravo["admin"].api):
            for method, path in [("GET", p) for p in [*paths, f"/studies/{study_id}/best"]] + [
                ("POST", f"/studies/{study_id}/stop")
            ]:
                response = outsider.request(method, path)
                missing = outsider.request(method, path.replace(study_id, NO_STUDY))
                assert response.status_code == 404, (outsider.label, method, path, response.text)
                assert response.json()["code"] == "not_found", response.text
                # Word for word what a study that does not exist gets.
                assert response.text.replace(study_id, "?") == missing.text.replace(NO_STUDY, "?"), missing.text
            assert outsider.ok("GET", "/studies")["items"] == []
        assert member.ok("GET", f"/studies/{study_id}")["state"] == "RUNNING"  # the outsiders' stop did nothing

        # The viewer reads everything, creates and stops nothing.
        seen = viewer.ok("GET", f"/studies/{study_id}")
        assert (seen["id"], seen["state"], seen["spec"]) == (study_id, "RUNNING", created["spec"])
        assert [t["number"] for t in viewer.ok("GET", f"/studies/{study_id}/trials")["items"]] == [0]
        assert "Submitted" in [e["reason"] for e in viewer.ok("GET", f"/studies/{study_id}/events")["items"]]
        assert [s["id"] for s in viewer.ok("GET", "/studies")["items"]] == [study_id]
        refused = viewer.post("/studies", {"spec": study()})
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden", refused.text
        refused = viewer.post(f"/studies/{study_id}/stop")
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden", refused.text
        assert [s["id"] for s in member.ok("GET", "/studies")["items"]] == [study_id]
        assert member.ok("GET", f"/studies/{study_id}")["state"] == "RUNNING"

        # A member stops it (again: the same answer); then it has ended, for the viewer too.
        stopped = member.ok("POST", f"/studies/{study_id}/stop")
        assert stopped["state"] == "STOPPED", stopped
        assert member.ok("POST", f"/studies/{study_id}/stop")["state"] == "STOPPED"
        assert viewer.ok("GET", f"/studies/{study_id}")["state"] == "STOPPED"
        assert [s["id"] for s in viewer.ok("GET", "/studies", params={"state": "STOPPED"})["items"]] == [study_id]
        assert viewer.ok("GET", "/studies", params={"state": "RUNNING"})["items"] == []
        # No trial succeeded: no best one, for the owner either.
        assert member.get(f"/studies/{study_id}/best").status_code == 404
    finally:
        close_all(bravo)


def test_a_trial_that_never_fits_the_quota_is_refused_like_its_job(admin: Api) -> None:
    tenant = create_tenant(admin, "tune-quota", ("member",))
    try:
        admin.ok("PUT", f"/orgs/{tenant.id}/quota", json_body={"category": "train", "cpus": 1})
        member = tenant["member"].api
        spec = study()
        spec["trial"]["resources"] = {"cpus": 2}
        job = member.post("/jobs", {"spec": spec["trial"]})
        assert job.status_code == 403, job.text
        assert job.json()["message"].startswith("quota: the job asks cpus 2 but the limit is 1"), job.text
        response = member.post("/studies", {"spec": spec})
        assert (response.status_code, response.json()) == (job.status_code, job.json())
        assert member.ok("GET", "/studies")["items"] == [] and member.ok("GET", "/jobs")["items"] == []
        # Within the quota it is accepted, and its trial is a train job like any other.
        spec["trial"]["resources"] = {"cpus": 1}
        created = member.ok("POST", "/studies", json_body={"spec": spec})
        assert wait_study(member, created["id"])["state"] == "SUCCEEDED"
    finally:
        close_all(tenant)


PARAMS_TRIAL = (
    "printf 'env=%s arg=%s\\n' \"$KILN_PARAM_LR\" {lr}; "
    'printf \'width=%s flag=%s\\n\' "$KILN_PARAM_WIDTH" "$KILN_PARAM_FLAG"; '
    "printf '<%s>\\n' {opt} \"$KILN_PARAM_OPT\"; "
    "printf 'file %s\\n' \"$(cat \"$KILN_PARAMS_FILE\" | tr -d '\\n')\"; "
    "python trial.py {opt} {lr}"
)
# The code bundle's script: its arguments as it got them, and the objective.
REPORTER = """
import json, sys
print("argv", json.dumps(sys.argv[1:]))
print("step=0 score=1")
"""


def test_parameters_reach_the_trial_job(alpha: Tenant, tmp_path: Path) -> None:
    account = alpha["member"]
    client = Client(account.api.url, account.key_id, account.secret)
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(REPORTER)
    sha = client.upload_code(code)
    parameters = {
        "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        "width": {"type": "int", "low": 8, "high": 64},
        "flag": {"type": "categorical", "choices": [True, False]},
        "opt": {"type": "categorical", "choices": ["it's a b; c"]},
    }
    spec = study(PARAMS_TRIAL, parameters=parameters, max_trials=2, parallelism=2, algorithm="random")
    body = {"spec": spec, "code_sha256": sha}
    created = account.api.ok("POST", "/studies", json_body=copy.deepcopy(body))
    assert created["spec"]["trial"]["command"] == PARAMS_TRIAL  # the study keeps the placeholders
    done = wait_study(account.api, created["id"])
    assert done["state"] == "SUCCEEDED", done
    trials = account.api.ok("GET", f"/studies/{created['id']}/trials", params={"order": "number"})["items"]
    assert [t["number"] for t in trials] == [0, 1]
    for trial in trials:
        params = trial["params"]
        assert set(params) == set(parameters), params
        assert isinstance(params["lr"], float) and 1e-4 <= params["lr"] <= 1e-1
        assert isinstance(params["width"], int) and 8 <= params["width"] <= 64
        job = account.api.job(trial["job_id"])
        assert job["spec"]["params"] == params
        assert job["spec"]["labels"] == {"kiln-study": created["id"], "kiln-trial": str(trial["number"])}
        assert job["name"] == f"{done['name']}-trial-{trial['number']}"
        assert job["code_sha256"] == sha
        lines = log_text(client, trial["job_id"])
        lr = as_text(params["lr"])
        assert f"env={lr} arg={lr}" in lines, lines
        assert f"width={params['width']} flag={as_text(params['flag'])}" in lines, lines
        assert lines.count("<it's a b; c>") == 2, lines  # the placeholder shell-quoted, the variable as it is
        (file_line,) = [line for line in lines if line.startswith("file ")]
        assert json.loads(file_line.removeprefix("file ")) == params
        assert "argv " + json.dumps(["it's a b; c", lr]) in lines, lines  # an argument each, as they were
        assert trial["state"] == "SUCCEEDED" and trial["value"] == 1.0
        assert job["spec"]["experiment"] == done["name"]
    # The study's runs sit in its own experiment, not among the Default experiment's.
    experiments = {e["name"]: e for e in account.api.ok("GET", "/experiments")["items"]}
    assert experiments[done["name"]]["run_count"] == 2, experiments
    client.close()
