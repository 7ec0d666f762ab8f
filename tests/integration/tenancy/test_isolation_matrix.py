"""THE tenancy acceptance test: every route of the API, driven from the server's own OpenAPI document, against
another organisation's real resources.

Organisation A (an org admin, a member and a viewer) owns a finished job with an artifact and log lines, a
running job, a job queued on quota and an uploaded code bundle. Then, for every path and method the server
publishes:

* organisation B (its member and its org admin) sends it with A's resources in the path, query and body: the
  answer must be exactly what the same request gets for a resource that does not exist (404, or 403 where the
  caller may not use the route at all, e.g. platform-admin-only routes), it must not contain any of A's
  identifiers, names, secrets or data that the request did not itself carry, and list routes must not include
  A's items;
* A's viewer sends every mutating route: refused (403 or 404);
* A's org admin sends every platform-admin-only route: refused (403);
* afterwards everything of A, re-read with the platform admin's key, is exactly as it was.

The route table below must know every route: a route added to the server without an entry here fails the test,
so new routes cannot slip past the matrix. On failure the whole table of (who, method, path, status) is shown.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kiln.auth.secrets import new_access_key_id
from kiln.domain.ids import new_id
from kiln.sdk.client import Client
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant, job_spec, tar_gz
from tests.tensorboard_events import event_file, file_version, image_event, png

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
PLACEHOLDER = re.compile(r"\{([a-z_0-9]+)\}")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]

# Raw request bodies (not JSON) some routes take.
BLOB = object()  # the bytes of the bound bundle
LOG = b"a line an intruder tries to append\n"
ARTIFACT = b"an artifact an intruder tries to write\n"
X_SHA = hashlib.sha256(b"x").hexdigest()
SMALL_BLOBS = b'{"blobs": [{"sha256": "%s", "size": 1}]}\nx' % X_SHA.encode()  # POST /uploads/blobs
METRICS = b'{"t": 1.0, "s": 1, "w": "worker0", "m": {"intruder": 1.0}}\n'
OWN_PAIR = object()  # {"key_id", "secret"} of the caller's own access key (the console's sign-in)
# A TensorBoard event file with one image (its second record), which every job of A has: the finished one wrote
# it to its TensorBoard dir, the others had it uploaded as a pod's sidecar does.
TB_FILE = "events.out.tfevents.1800000000.matrix"
TB_EVENTS, _TB_OFFSETS = event_file([file_version(), image_event("samples", 7, png(), 3, 2, 1_800_000_000.0)])
TB_IMAGE = (("file", TB_FILE), ("offset", str(_TB_OFFSETS[1])), ("index", "0"))


@dataclass(frozen=True)
class Case:
    """One way of calling a route.

    kind: ``public`` (no authentication), ``self`` (acts on the caller's own organisation: may succeed, must not
    leak), ``scoped`` (names the target organisation's resources: must be refused exactly like a nonexistent
    one), ``platform`` (platform admins only: everyone else gets 403).
    """

    kind: str
    body: Any = None
    query: tuple[tuple[str, str], ...] = ()
    cross: frozenset[int] = frozenset({403, 404})  # what another organisation may get
    reader: str | None = None  # role of the owning organisation whose (read) request must succeed: a control
    owner: str | None = None  # who may do this (mutating) request at the end: proves the bindings are real
    only: tuple[tuple[str, tuple[str, ...]], ...] = ()  # restrict bindings, e.g. (("job_id", ("finished",)),)
    last: bool = False  # run after every other request (its effect would change other answers)
    writes: bool = True  # False: a mutating method that changes nothing stored (signing in or out of the console)


OWN_OK = frozenset({200, 201, 204, 403})
SERVICE_SPEC = {
    "name": "x",
    "model": "x@1",
    "predictor": {"type": "sklearn"},
    "replicas": 0,
    "runtime": {"python": sys.executable},
}
STUDY_SPEC = {
    "trial": job_spec("true"),
    "parameters": {"x": {"type": "int", "low": 1, "high": 2}},
    "objective": {"metric": "x", "direction": "maximize"},
    "max_trials": 1,
}
PIPELINE_SPEC = {"name": "matrix-flow", "steps": {"only": job_spec("true")}}
JOB = (("job_id", ("finished", "running", "queued")),)
FINISHED = (("job_id", ("finished",)),)
PIPELINE_RUN = (("run_id", ("pipeline-run",)),)
JOB_RUN = (("run_id", ("job-run",)),)  # a finished job's run (a run's id is its job's)

# Every route of the API. A route missing here fails the test (see test body).
ROUTES: dict[tuple[str, str], list[Case]] = {
    ("GET", "/healthz"): [Case("public")],
    ("GET", "/metrics"): [Case("public")],  # Prometheus: aggregates only, no tenant labels
    ("GET", "/readyz"): [Case("public")],
    ("GET", "/api/v1/whoami"): [Case("self", cross=OWN_OK)],
    # The console's session: B signs in with its own pair (a cookie of B's own); a signed request has no session
    # (401), whatever cookie it carries; signing out needs nothing and clears the cookie.
    ("POST", "/api/v1/session"): [Case("self", body=OWN_PAIR, cross=frozenset({200}), writes=False)],
    ("GET", "/api/v1/session"): [Case("self", cross=frozenset({401}))],
    ("DELETE", "/api/v1/session"): [Case("public", writes=False)],
    # B uploading the same bytes gets its own copy (it knows the content); runs last so that B's HEAD is
    # checked while B has no copy.
    ("PUT", "/api/v1/blobs/{sha256}"): [Case("self", body=BLOB, cross=OWN_OK, last=True)],
    ("HEAD", "/api/v1/blobs/{sha256}"): [Case("scoped", reader="member")],
    ("POST", "/api/v1/jobs"): [
        Case("self", body={"spec": job_spec("true")}, cross=OWN_OK),
        # Another organisation's bundle cannot be run by naming its hash.
        Case(
            "scoped",
            body={"spec": job_spec("true"), "code_sha256": "{sha256}"},
            cross=frozenset({403, 404, 422}),
            owner="admin",
        ),
    ],
    ("GET", "/api/v1/jobs"): [
        Case("self", cross=OWN_OK),
        Case("self", query=(("state", "QUEUED"), ("state", "RUNNING"), ("state", "SUCCEEDED")), cross=OWN_OK),
        Case("scoped", query=(("before", "{job_id}"),), cross=frozenset({200}), only=JOB),
    ],
    ("GET", "/api/v1/jobs/{job_id}"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/jobs/{job_id}/events"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/jobs/{job_id}/why"): [Case("scoped", reader="member")],
    ("POST", "/api/v1/jobs/{job_id}/cancel"): [Case("scoped", owner="admin")],
    # A dry run creates nothing; naming another organisation's bundle says it is not stored (as for none).
    ("POST", "/api/v1/jobs:dry-run"): [
        Case("self", body={"spec": job_spec("true")}, cross=OWN_OK),
        Case("scoped", body={"spec": job_spec("true"), "code_sha256": "{sha256}"}, cross=OWN_OK, owner="admin"),
    ],
    ("POST", "/api/v1/jobs/{job_id}/rerun"): [Case("scoped", owner="admin")],
    ("DELETE", "/api/v1/jobs/{job_id}"): [Case("scoped", owner="admin", last=True)],
    ("GET", "/api/v1/jobs/{job_id}/logs"): [
        Case("scoped", reader="member"),
        # Regression test (found by this suite, since fixed):
        # (src/kiln/api/routers/jobs.py job_logs + src/kiln/usecases/data/outputs.py OutputService.follow_log):
        # follow_log is a generator, so its "404 before the stream starts" check (self.jobs.get) only runs once
        # StreamingResponse iterates it, after "200 OK" has been sent. GET /jobs/{another org's
        # job}/logs?follow=true (or any nonexistent job) gets status 200 and then a broken chunked body (the server
        # logs the NotFound as an ASGI exception) instead of 404 {"code": "not_found"}. Expected 404 like the
        # non-follow call.
        Case("scoped", query=(("follow", "true"),), reader="member", only=(("job_id", ("finished",)),)),
    ],
    ("POST", "/api/v1/jobs/{job_id}/logs"): [Case("scoped", body=LOG, owner="admin")],
    ("GET", "/api/v1/jobs/{job_id}/artifacts"): [Case("scoped", reader="member")],
    # The matrix's jobs carry no code bundle (the owner gets 404 too); test_job_code.py reads a real one.
    ("GET", "/api/v1/jobs/{job_id}/code"): [Case("scoped")],
    ("PUT", "/api/v1/jobs/{job_id}/artifacts/{path}"): [Case("scoped", body=ARTIFACT, owner="admin")],
    ("GET", "/api/v1/jobs/{job_id}/artifacts/{path}"): [Case("scoped", reader="member")],
    # Checkpoints: the same rules as artifacts (a pod's sync sidecar writes them, its next attempt reads them).
    ("GET", "/api/v1/jobs/{job_id}/checkpoints"): [Case("scoped", reader="member")],
    ("PUT", "/api/v1/jobs/{job_id}/checkpoints/{path}"): [Case("scoped", body=ARTIFACT, owner="admin")],
    ("GET", "/api/v1/jobs/{job_id}/checkpoints/{path}"): [Case("scoped", reader="member")],
    ("PUT", "/api/v1/jobs/{job_id}/tensorboard/{path}"): [Case("scoped", body=ARTIFACT)],
    # The images in a job's event files: A's member reads the list and the image of every job; B gets 404.
    ("GET", "/api/v1/jobs/{job_id}/tensorboard-images"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/jobs/{job_id}/tensorboard-images/image"): [Case("scoped", query=TB_IMAGE, reader="member")],
    ("POST", "/api/v1/jobs/{job_id}/metrics"): [Case("scoped", body=METRICS, owner="admin")],
    ("GET", "/api/v1/jobs/{job_id}/metrics"): [
        Case("scoped", reader="member"),
        Case("scoped", query=(("format", "csv"), ("downsample", "100")), reader="member"),
    ],
    ("GET", "/api/v1/jobs/{job_id}/metrics/summary"): [Case("scoped", reader="member")],
    # A trial's verdict: the matrix's jobs are no trials (their owner gets 404 too); test_trial_verdict.py reads one.
    ("GET", "/api/v1/jobs/{job_id}/trial"): [Case("scoped"), Case("scoped", query=(("judged", "3"), ("wait", "0.2")))],
    # Every job of the comparison is checked: one of another organisation's fails the whole request (404).
    ("GET", "/api/v1/metrics/compare"): [
        Case("scoped", query=(("jobs", "{job_id}"),), reader="member"),
        Case("scoped", query=(("jobs", "{job_id}"), ("names", "loss"), ("format", "csv")), reader="member"),
    ],
    # Runs' metrics (every job is a run, its id the job's): one run of another organisation fails the whole request.
    ("GET", "/api/v1/runs/metrics"): [
        Case("scoped", query=(("run", "{job_id}"),), reader="member"),
        Case("scoped", query=(("run", "{job_id}"), ("name", "loss"), ("downsample", "100")), reader="member"),
    ],
    # Tuning studies: another organisation's study reads and stops like a missing one; its bundle cannot be named.
    ("POST", "/api/v1/studies"): [
        Case("self", body={"spec": STUDY_SPEC}, cross=OWN_OK),
        Case(
            "scoped",
            body={"spec": STUDY_SPEC, "code_sha256": "{sha256}"},
            cross=frozenset({403, 404, 422}),
            owner="admin",
        ),
    ],
    ("GET", "/api/v1/studies"): [
        Case("self", cross=OWN_OK),
        Case("scoped", query=(("before", "{study_id}"),), cross=frozenset({200})),
    ],
    ("GET", "/api/v1/studies/{study_id}"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/studies/{study_id}/trials"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/studies/{study_id}/best"): [Case("scoped")],  # no trial succeeded: A's reader gets 404 too
    ("GET", "/api/v1/studies/{study_id}/events"): [Case("scoped", reader="member")],
    ("POST", "/api/v1/studies/{study_id}/stop"): [Case("scoped", owner="admin", last=True)],
    # Pipelines: another organisation's run reads, cancels and resumes like a missing one; its bundle cannot be named.
    ("POST", "/api/v1/pipelines/runs"): [
        Case("self", body={"spec": PIPELINE_SPEC}, cross=OWN_OK),
        Case(
            "scoped",
            body={"spec": PIPELINE_SPEC, "code_sha256": "{sha256}"},
            cross=frozenset({403, 404, 422}),
            owner="admin",
        ),
    ],
    # A dry run creates nothing and looks at no code: each organisation checks its own spec.
    ("POST", "/api/v1/pipelines/runs:dry-run"): [Case("self", body={"spec": PIPELINE_SPEC}, cross=OWN_OK)],
    ("GET", "/api/v1/pipelines/runs"): [Case("self", cross=OWN_OK)],
    # The model versions a run produced: A's finished job's run, which B cannot name.
    ("GET", "/api/v1/runs/{run_id}/model-versions"): [Case("scoped", reader="member", only=JOB_RUN)],
    ("GET", "/api/v1/experiments"): [Case("self", cross=OWN_OK)],
    ("GET", "/api/v1/pipelines/runs/{run_id}"): [Case("scoped", reader="member", only=PIPELINE_RUN)],
    # A's run is running: A gets 409
    ("POST", "/api/v1/pipelines/runs/{run_id}/resume"): [Case("scoped", only=PIPELINE_RUN)],
    ("POST", "/api/v1/pipelines/runs/{run_id}/cancel"): [Case("scoped", owner="admin", last=True, only=PIPELINE_RUN)],
    ("POST", "/api/v1/pipelines/schedules"): [
        Case("self", body={"spec": PIPELINE_SPEC, "cron": "0 0 1 1 *"}, cross=OWN_OK),
        Case(
            "scoped",
            body={"spec": PIPELINE_SPEC, "cron": "0 0 1 1 *", "code_sha256": "{sha256}"},
            cross=frozenset({403, 404, 422}),
            owner="admin",
        ),
    ],
    ("GET", "/api/v1/pipelines/schedules"): [Case("self", cross=OWN_OK)],
    ("DELETE", "/api/v1/pipelines/schedules/{schedule_id}"): [Case("scoped", owner="admin", last=True)],
    # Usage: an org admin reports on its own organisation; naming another is refused like a missing one. Prices are
    # the platform's (anyone reads them, only the platform admin sets them).
    ("GET", "/api/v1/usage"): [
        Case("self", cross=OWN_OK),
        Case("scoped", query=(("org", "{org}"),), cross=frozenset({403, 404}), reader="admin"),
    ],
    ("GET", "/api/v1/prices"): [Case("self", cross=OWN_OK)],
    ("POST", "/api/v1/prices"): [Case("platform", body={"cpu_hour": 1.0}, cross=frozenset({403}))],
    # Who holds what: every organisation's jobs and the platform's hosts, for the platform admin only.
    ("GET", "/api/v1/admin/servers"): [Case("platform", cross=frozenset({403}))],
    # Budgets: an org admin sets its members' (naming another organisation's member is refused like a missing one);
    # a list shows only the caller's organisation's.
    ("GET", "/api/v1/budgets"): [
        Case("self", cross=OWN_OK),
        Case("scoped", query=(("org", "{org}"),), cross=frozenset({403, 404}), reader="admin"),
    ],
    ("PUT", "/api/v1/budgets"): [
        Case("self", body={"soft": 5.0}, cross=frozenset({403})),
        Case("scoped", body={"user": "{user}", "soft": 1e9}, cross=frozenset({403, 404}), owner="admin"),
    ],
    ("DELETE", "/api/v1/budgets/{budget_id}"): [Case("scoped", owner="admin", last=True)],
    # Notifications: a subscription is its owner's (and their org admins'); another organisation's is refused like a
    # missing one, and so are its deliveries. Targets are on loopback (the server's KILN_WEBHOOK_ALLOW opens it).
    ("GET", "/api/v1/notifications/subscriptions"): [Case("self", cross=OWN_OK)],
    ("POST", "/api/v1/notifications/subscriptions"): [
        Case("self", body={"name": "x", "events": ["test"], "url": "http://127.0.0.1:9/intruder"}, cross=OWN_OK)
    ],
    ("GET", "/api/v1/notifications/subscriptions/{subscription_id}"): [Case("scoped", reader="member")],
    ("PATCH", "/api/v1/notifications/subscriptions/{subscription_id}"): [
        Case("scoped", body={"paused": False}, owner="member")
    ],
    ("DELETE", "/api/v1/notifications/subscriptions/{subscription_id}"): [Case("scoped", owner="admin", last=True)],
    ("POST", "/api/v1/notifications/subscriptions/{subscription_id}/test"): [Case("scoped", owner="member")],
    ("GET", "/api/v1/notifications/subscriptions/{subscription_id}/deliveries"): [Case("scoped", reader="member")],
    ("POST", "/api/v1/notifications/subscriptions/{subscription_id}/deliveries/{delivery_id}/resend"): [
        Case("scoped", owner="member")
    ],
    # The machines: A's running job takes its share on B's view, without its id or name (the leak check).
    ("GET", "/api/v1/nodes"): [Case("self", cross=OWN_OK)],
    ("GET", "/api/v1/runtimes"): [Case("self", cross=OWN_OK)],
    ("POST", "/api/v1/runtimes/{framework}/install"): [Case("platform", cross=frozenset({403}))],
    # The catalog is the platform's, not an organisation's; {name} is bound to a dataset's name: no such runtime.
    ("GET", "/api/v1/runtimes/{name}"): [Case("self", cross=frozenset({404}))],
    ("GET", "/api/v1/runtimes/{name}/log"): [Case("self", cross=frozenset({404}))],
    ("GET", "/api/v1/orgs"): [Case("self", cross=OWN_OK)],
    ("POST", "/api/v1/orgs"): [Case("platform", body={"name": "intruder-org"}, cross=frozenset({403}))],
    ("GET", "/api/v1/orgs/{org}"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/orgs/{org}/quota"): [Case("scoped", reader="member")],
    ("PATCH", "/api/v1/orgs/{org}"): [
        Case("platform", body={"share_weight": 3, "max_priority": "high"}, cross=frozenset({403}), owner="platform")
    ],
    ("PUT", "/api/v1/orgs/{org}/quota"): [
        Case("platform", body={"category": "train", "count": 100}, cross=frozenset({403}), owner="platform")
    ],
    ("POST", "/api/v1/users"): [
        Case("scoped", body={"name": "intruder-user", "org": "{org}", "role": "admin"}, owner="admin")
    ],
    ("GET", "/api/v1/users"): [
        Case("self", cross=OWN_OK),
        Case("scoped", query=(("org", "{org}"),), reader="admin"),
    ],
    ("GET", "/api/v1/users/{user}"): [Case("scoped", reader="admin")],
    ("POST", "/api/v1/users/{user}/disable"): [Case("scoped", owner="admin")],
    ("POST", "/api/v1/users/{user}/enable"): [Case("scoped", owner="admin")],
    ("POST", "/api/v1/keys"): [
        Case("self", body={"description": "my own key"}, cross=OWN_OK),
        Case("scoped", body={"user": "{user}"}, owner="admin"),
    ],
    ("GET", "/api/v1/keys"): [
        Case("self", cross=OWN_OK),
        Case("scoped", query=(("user", "{user}"),), reader="admin"),
    ],
    ("POST", "/api/v1/keys/{key}/disable"): [Case("scoped", owner="admin")],
    ("DELETE", "/api/v1/keys/{key}"): [Case("scoped", owner="admin", last=True)],
    # Datasets: names, versions and upload sessions are per organisation; another one's are "not found".
    # (Mutating controls by A's org admin: the member's key is disabled by then.)
    ("GET", "/api/v1/datasets"): [Case("self", cross=OWN_OK)],
    ("POST", "/api/v1/datasets"): [
        Case("self", body={"name": "intruder-data", "files": [{"path": "x", "size": 1, "sha256": X_SHA}]}, cross=OWN_OK)
    ],
    ("POST", "/api/v1/datasets/drafts/{draft_id}/commit"): [Case("scoped", owner="admin")],
    ("GET", "/api/v1/datasets/{name}"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/datasets/{name}/versions/{version}"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/datasets/{name}/versions/{version}/files/{path}"): [Case("scoped", reader="member")],
    ("DELETE", "/api/v1/datasets/{name}/versions/{version}"): [Case("scoped", owner="admin")],
    ("DELETE", "/api/v1/datasets/{name}"): [Case("scoped", owner="admin", last=True)],
    # Models: another organisation's model reads, is aliased and removed exactly like a missing one; a version
    # cannot be registered from its job. (Mutating controls in this order: a version registered, the alias moved
    # and removed, version 1 removed, then the model.)
    # Model services (before the models: deleting A's service, last, lets the model it serves go too). A's
    # service has no replica (replicas: 0): a predict by B or A's viewer is refused before any cold start.
    ("POST", "/api/v1/services"): [
        Case("scoped", body={"spec": {**SERVICE_SPEC, "name": "intruder-svc", "model": "{served}@1"}}, owner="admin")
    ],
    ("POST", "/api/v1/services:render"): [
        Case("scoped", body={"spec": {**SERVICE_SPEC, "name": "intruder-svc", "model": "{served}@1"}}, owner="admin")
    ],
    ("GET", "/api/v1/services"): [Case("self", cross=OWN_OK)],
    ("GET", "/api/v1/services/{service}"): [Case("scoped", reader="member")],
    ("PATCH", "/api/v1/services/{service}"): [Case("scoped", body={"replicas": 0}, owner="admin")],
    ("POST", "/api/v1/services/{service}/tokens"): [Case("scoped", owner="admin")],
    ("POST", "/api/v1/services/{service}/promote"): [Case("scoped")],  # A's runs no canary: a 409 to its own
    ("POST", "/api/v1/services/{service}/rollback"): [Case("scoped")],
    ("GET", "/api/v1/services/{service}/logs"): [Case("scoped")],  # no replica ran: A's reader gets 404 too
    ("POST", "/api/v1/services/{service}/predict"): [Case("scoped", body={"inputs": [[0.0]]})],
    ("DELETE", "/api/v1/services/{service}"): [Case("scoped", owner="admin", last=True)],
    # Notebooks: A's is stopped (its job never ran). B's own create asks for more than any machine has (422):
    # creating a notebook of B's own would start a JupyterLab; B's reach into A's is what is tested.
    ("POST", "/api/v1/notebooks"): [
        Case("self", body={"name": "intruder-nb", "resources": {"cpus": 1000}}, cross=frozenset({403, 422}))
    ],
    ("GET", "/api/v1/notebooks"): [Case("self", cross=OWN_OK)],
    ("GET", "/api/v1/notebooks/{notebook}"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/notebooks/{notebook}/home"): [Case("scoped", reader="member")],
    ("PUT", "/api/v1/notebooks/{notebook}/home"): [Case("scoped", body=ARTIFACT)],
    # A TensorBoard's event files (A's notebook is JupyterLab: its own member gets 404 too; no reader control).
    ("GET", "/api/v1/notebooks/{notebook}/events"): [Case("scoped")],
    ("GET", "/api/v1/notebooks/{notebook}/events/{job_id}/{path}"): [Case("scoped")],
    ("POST", "/api/v1/notebooks/{notebook}/start"): [Case("scoped")],
    ("POST", "/api/v1/notebooks/{notebook}/stop"): [Case("scoped", owner="admin")],
    ("DELETE", "/api/v1/notebooks/{notebook}"): [Case("scoped", owner="admin", last=True)],
    ("GET", "/api/v1/models"): [Case("self", cross=OWN_OK)],
    ("GET", "/api/v1/models/{model}"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/models/{model}/versions"): [Case("scoped", reader="member")],
    ("GET", "/api/v1/models/{model}/versions/{version}"): [Case("scoped", reader="member")],
    # The version's file is named like the artifact it was copied from: one {path} binding serves all three.
    ("GET", "/api/v1/models/{model}/versions/{version}/files/{path}"): [Case("scoped", reader="member")],
    ("POST", "/api/v1/models/{model}/versions"): [
        Case("scoped", body={"job_id": "{job_id}", "path": "{path}"}, owner="admin", only=FINISHED)
    ],
    ("PUT", "/api/v1/models/{model}/aliases/{alias}"): [Case("scoped", body={"version": 1}, owner="admin")],
    ("DELETE", "/api/v1/models/{model}/aliases/{alias}"): [Case("scoped", owner="admin")],
    ("DELETE", "/api/v1/models/{model}/versions/{version}"): [Case("scoped", owner="admin")],
    ("DELETE", "/api/v1/models/{model}"): [Case("scoped", owner="admin", last=True)],
    ("GET", "/api/v1/uploads/config"): [Case("self", cross=OWN_OK)],
    ("POST", "/api/v1/uploads"): [Case("self", body={"sha256": X_SHA, "size": 1}, cross=OWN_OK)],
    ("POST", "/api/v1/uploads/blobs"): [Case("self", body=SMALL_BLOBS, cross=OWN_OK)],
    ("PUT", "/api/v1/uploads/{upload_id}/parts/{number}"): [Case("scoped", body=ARTIFACT, owner="admin")],
    ("POST", "/api/v1/uploads/{upload_id}/parts/{number}/url"): [
        Case("scoped", body={"size": 1, "md5": "0" * 32, "crc32": "0" * 8}, owner="admin")
    ],
    ("POST", "/api/v1/uploads/{upload_id}/parts/urls"): [
        Case("scoped", body={"parts": [{"number": 1, "size": 1, "md5": "0" * 32, "crc32": "0" * 8}]}, owner="admin")
    ],
    ("POST", "/api/v1/uploads/{upload_id}/complete"): [Case("scoped", owner="admin")],
    ("GET", "/api/v1/quota"): [Case("self", cross=OWN_OK)],
    ("GET", "/api/v1/audit"): [
        Case("self", cross=OWN_OK),
        Case("scoped", query=(("org", "{org}"),), reader="admin"),
        # Filtering by another organisation's user must find nothing, exactly as for a nonexistent user.
        Case("scoped", query=(("user", "{user}"),), cross=frozenset({200, 403}), reader="admin"),
    ],
}


# -- the target organisation's resources and their stand-ins -----------------------------------------------


@dataclass
class Choice:
    label: str
    value: str
    bogus: str
    body: bytes | None = None  # bundle bytes for sha256
    bogus_body: bytes | None = None


@dataclass
class Target:
    tenant: Tenant
    choices: dict[str, list[Choice]]
    sensitive: set[str]


def bindings(template: str, case: Case, target: Target) -> Iterator[dict[str, Choice]]:
    names = sorted(set(PLACEHOLDER.findall(template)))
    only = dict(case.only)
    options = []
    for name in names:
        choices = target.choices[name]
        if name in only:
            choices = [c for c in choices if c.label in only[name]]
        options.append(choices)
    for combo in itertools.product(*options):
        yield dict(zip(names, combo, strict=True))


def fill(value: Any, binding: dict[str, Choice], bogus: bool) -> Any:
    if isinstance(value, str):
        return PLACEHOLDER.sub(lambda m: binding[m.group(1)].bogus if bogus else binding[m.group(1)].value, value)
    if isinstance(value, dict):
        return {k: fill(v, binding, bogus) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(fill(v, binding, bogus) for v in value)
    return value


@dataclass
class Sent:
    method: str
    path: str
    query: list[tuple[str, str]]
    body: bytes
    json_body: Any
    response: httpx.Response | None
    error: str = ""

    @property
    def status(self) -> str:
        if self.response is None:
            return f"ERR {self.error}"
        return f"{self.response.status_code} ({self.error})" if self.error else str(self.response.status_code)

    @property
    def failed(self) -> bool:
        """No answer, or the answer's body broke off."""
        return self.response is None or bool(self.error)

    def request_text(self) -> str:
        return self.path + json.dumps(self.query) + self.body.decode(errors="replace") + json.dumps(self.json_body)

    def response_text(self) -> str:
        if self.response is None or self.error:
            return ""
        return self.response.text + json.dumps(dict(self.response.headers))


def send(
    api: Api | None, url: str, method: str, template: str, case: Case, binding: dict[str, Choice], bogus: bool = False
) -> Sent:
    path = fill(template, binding, bogus)
    query = [(k, fill(v, binding, bogus)) for k, v in case.query]
    json_body: Any = None
    raw = b""
    if case.body is BLOB:
        choice = binding["sha256"]
        raw = (choice.bogus_body if bogus else choice.body) or b""
    elif case.body is OWN_PAIR:
        json_body = {"key_id": api.access_key, "secret": api.secret_key} if api is not None else None
    elif isinstance(case.body, bytes):
        raw = case.body
    elif case.body is not None:
        json_body = fill(case.body, binding, bogus)
    if api is None:
        client = httpx.Client(base_url=url, timeout=10)
        request = client.build_request(method, path)
    else:
        client = api.http
        request = api.build(
            method,
            path,
            params=query,
            json_body=json_body,
            content=raw or None,
            content_type="application/octet-stream" if raw else None,
        )
    try:
        response = client.send(request, stream=True)
    except httpx.HTTPError as exc:
        return Sent(method, path, query, raw, json_body, None, f"{type(exc).__name__}: {exc}")
    try:
        response.read()  # a status line may come before the body fails (a broken stream)
    except httpx.HTTPError as exc:
        return Sent(method, path, query, raw, json_body, response, f"body broke off: {type(exc).__name__}: {exc}")
    finally:
        response.close()
        if api is None:
            client.close()
    return Sent(method, path, query, raw, json_body, response)


def normalised(sent: Sent, binding: dict[str, Choice], bogus: bool) -> tuple[str, Any]:
    """Status and body with the bound values replaced by their names (to compare real and bogus answers)."""
    if sent.response is None:
        return sent.status, None
    if sent.error:
        return sent.status, None
    text = sent.response.text
    for name, choice in sorted(binding.items(), key=lambda kv: -len(kv[1].value)):
        text = text.replace(choice.bogus if bogus else choice.value, f"<{name}>")
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = text
    headers = {k: v for k, v in sent.response.headers.items() if k.lower().startswith("x-kiln")}
    return sent.status, (body, headers)


def leaks(sent: Sent, sensitive: set[str]) -> list[str]:
    """The target's secrets, ids, names and data in the answer that the request did not itself carry."""
    asked = sent.request_text()
    answer = sent.response_text()
    return sorted(s for s in sensitive if s in answer and s not in asked)


# -- the matrix ------------------------------------------------------------------------------------------------


@dataclass
class Matrix:
    url: str
    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    covered: dict[str, set[tuple[str, str]]] = field(default_factory=dict)

    def row(self, who: str, sent: Sent, problem: str = "") -> None:
        query = "&".join(f"{k}={v}" for k, v in sent.query)
        self.rows.append((who, sent.method, sent.path + (f"?{query}" if query else ""), sent.status, problem))
        if problem:
            self.problems.append(f"{who} {sent.method} {sent.path}: {problem}")

    def table(self) -> str:
        widths = [max(len(r[i]) for r in self.rows) for i in range(4)]
        lines = [
            f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:<{widths[3]}}  {r[4]}"
            for r in self.rows
        ]
        return "\n".join(["who  method  path  status  problem", *lines])

    def cover(self, who: str, route: tuple[str, str]) -> None:
        self.covered.setdefault(who, set()).add(route)

    def cross(self, who: str, api: Api, target: Target, route: tuple[str, str], case: Case) -> None:
        """Another organisation calls a route with the target's resources."""
        method, template = route
        self.cover(who, route)
        for binding in bindings(template + json.dumps(case.query) + json.dumps(_str_body(case)), case, target):
            sent = send(api, self.url, method, template, case, binding)
            problems = []
            if sent.failed or sent.response is None or sent.response.status_code not in case.cross:
                problems.append(f"status {sent.status}, expected one of {sorted(case.cross)}: {_excerpt(sent)}")
            leaked = leaks(sent, target.sensitive)
            if leaked:
                problems.append(f"answer contains the other organisation's {leaked}: {_excerpt(sent)}")
            if case.kind in ("scoped", "platform") and binding:
                twin = send(api, self.url, method, template, case, binding, bogus=True)
                real, fake = normalised(sent, binding, False), normalised(twin, binding, True)
                if real != fake:
                    problems.append(f"answers differently than for a nonexistent resource: {real} vs {fake}")
            self.row(who, sent, "; ".join(problems))

    def refused(self, who: str, api: Api, target: Target, route: tuple[str, str], case: Case, ok: set[int]) -> None:
        """A caller of the owning organisation who may not do this: every binding is refused."""
        method, template = route
        self.cover(who, route)
        for binding in bindings(template + json.dumps(case.query) + json.dumps(_str_body(case)), case, target):
            sent = send(api, self.url, method, template, case, binding)
            problem = ""
            if sent.failed or sent.response is None or sent.response.status_code not in ok:
                problem = f"status {sent.status}, expected one of {sorted(ok)}: {_excerpt(sent)}"
            self.row(who, sent, problem)

    def control(self, who: str, api: Api, target: Target, route: tuple[str, str], case: Case, read: bool) -> None:
        """The owning organisation's reader (or owner) may do it: proves the bindings name real resources."""
        method, template = route
        for binding in bindings(template + json.dumps(case.query) + json.dumps(_str_body(case)), case, target):
            sent = send(api, self.url, method, template, case, binding)
            bad = (
                sent.failed
                or sent.response is None
                or (sent.response.status_code >= 300 if read else sent.response.status_code in (401, 403, 404, 500))
            )
            self.row(who, sent, f"control failed: {_excerpt(sent)}" if bad else "")
            if not read:
                return  # one binding proves the mutation route resolves; more would only change more state


def _str_body(case: Case) -> Any:
    return None if case.body is BLOB or case.body is OWN_PAIR or isinstance(case.body, bytes) else case.body


def _excerpt(sent: Sent) -> str:
    if sent.response is None or sent.error:
        return sent.error
    return sent.response.text[:200].replace("\n", "\\n")


# -- what must not change ----------------------------------------------------------------------------------------


def snapshot(admin: Api, a: Tenant, a_reader: Api, sha: str) -> dict[str, Any]:
    """Everything of organisation A (and the organisation list), read with the platform admin's key."""
    jobs = [j for j in admin.ok("GET", "/jobs", params={"limit": 500})["items"] if j["org_id"] == a.id]
    out: dict[str, Any] = {
        "orgs": sorted((o["id"], o["name"]) for o in admin.ok("GET", "/orgs")["items"]),
        "quota": admin.ok("GET", f"/orgs/{a.id}/quota"),
        "users": sorted(
            (u["id"], u["name"], u["role"], u["disabled"], u["org_id"])
            for u in admin.ok("GET", "/users", params={"org": a.id})["items"]
        ),
        "keys": sorted(
            (k["id"], k["user_id"], k["enabled"], k["expires_at"], k["description"])
            for k in admin.ok("GET", "/keys")["items"]
            if k["org_id"] == a.id
        ),
        "jobs": sorted(
            (j["id"], j["state"], j["cancel_requested"], j["attempt"], j["restarts"], j["message"]) for j in jobs
        ),
        "blob": a_reader.request("HEAD", f"/blobs/{sha}").headers.get("X-Kiln-Blob-Size"),
        "budgets": sorted(
            (b["id"], b["user_id"], b["soft"], b["hard"], b["stop_running"])
            for b in admin.ok("GET", "/budgets", params={"org": a.id})["items"]
        ),
        "runtimes": sorted((r["name"], r["status"]) for r in admin.ok("GET", "/runtimes")["items"]),
        "datasets": [
            (d, a_reader.ok("GET", f"/datasets/{d['name']}")) for d in a_reader.ok("GET", "/datasets")["items"]
        ],
        "models": [(m, a_reader.ok("GET", f"/models/{m['name']}")) for m in a_reader.ok("GET", "/models")["items"]],
        "services": sorted(
            (x["id"], x["name"], x["state"], x["desired_replicas"], x["model_version"], x["revision"])
            for x in a_reader.ok("GET", "/services")["items"]
        ),
        "studies": sorted(
            (x["id"], x["state"], x["trials"]["total"], json.dumps(x["spec"], sort_keys=True))
            for x in a_reader.ok("GET", "/studies")["items"]
        ),
        "pipelines": sorted(
            (x["id"], x["state"], json.dumps(x["steps"], sort_keys=True))
            for x in a_reader.ok("GET", "/pipelines/runs")["items"]
        ),
        "schedules": sorted(json.dumps(x, sort_keys=True) for x in a_reader.ok("GET", "/pipelines/schedules")["items"]),
    }
    for job in jobs:
        out[job["id"]] = {
            "events": [(e["id"], e["to_state"], e["reason"], e["message"]) for e in admin.events(job["id"])],
            "logs": admin.get(f"/jobs/{job['id']}/logs").text,
            "artifacts": admin.ok("GET", f"/jobs/{job['id']}/artifacts")["items"],
            "checkpoints": admin.ok("GET", f"/jobs/{job['id']}/checkpoints")["items"],
        }
        for kind in ("artifacts", "checkpoints"):
            for item in out[job["id"]][kind]:
                item["content"] = admin.get(f"/jobs/{job['id']}/{kind}/{item['path']}").text
    return out


# -- the test ----------------------------------------------------------------------------------------------------


def test_no_route_crosses_organisations(make_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Its own runtimes directory: the shared test cache changes while another test builds a runtime in it, and the
    # snapshot below would take that for a change made by a refused request.
    server = make_server(cpus="8", runtimes_dir=str(tmp_path / "runtimes"), webhook_allow="127.0.0.1/32")
    admin = Api.admin(server)
    a = create_tenant(admin, "tenant-alpha", ("admin", "member", "viewer"))
    b = create_tenant(admin, "tenant-bravo", ("admin", "member"))
    member = a["member"].api
    try:
        # -- organisation A's resources, made by its member ---------------------------------------------------
        tag = uuid.uuid4().hex[:8]
        log_marker, artifact_marker, artifact = f"alpha-log-{tag}", f"alpha-artifact-{tag}", f"alpha-out-{tag}.txt"
        finished = member.submit(
            f'echo {log_marker}; echo {artifact_marker} > "$KILN_OUTPUT_DIR/{artifact}"; '
            f'echo {artifact_marker} > "$KILN_CHECKPOINT_DIR/{artifact}"; '
            f'printf %s {base64.b64encode(TB_EVENTS).decode()} | base64 -d > "$KILN_TENSORBOARD_DIR/{TB_FILE}"'
        )
        assert member.wait(finished["id"])["state"] == "SUCCEEDED"
        bundle, sha = tar_gz({"train.py": f"print('{tag}')\n".encode()})
        assert member.request("PUT", f"/blobs/{sha}", content=bundle, unsigned=True).status_code == 201
        admin.ok("PUT", f"/orgs/{a.id}/quota", json_body={"category": "train", "count": 1})
        running = member.submit(SLEEPER)
        member.wait(running["id"], "RUNNING")
        queued = member.submit("true")
        member.wait_message(queued["id"], "quota: count 1 of 1 in use")
        for job in (running, queued):  # every job has log lines, the artifact and a checkpoint of that name
            member.ok("POST", f"/jobs/{job['id']}/logs", content=f"{log_marker}\n".encode())
            member.ok("PUT", f"/jobs/{job['id']}/artifacts/{artifact}", content=artifact_marker.encode())
            member.ok("PUT", f"/jobs/{job['id']}/checkpoints/{artifact}", content=artifact_marker.encode())
            member.ok("PUT", f"/jobs/{job['id']}/tensorboard/{TB_FILE}", content=TB_EVENTS)
        assert [x["path"] for x in member.ok("GET", f"/jobs/{finished['id']}/artifacts")["items"]] == [artifact]
        assert [x["path"] for x in member.ok("GET", f"/jobs/{finished['id']}/checkpoints")["items"]] == [artifact]
        assert log_marker in member.get(f"/jobs/{finished['id']}/logs").text
        deadline = time.monotonic() + 20  # the finished job's event file is copied as its attempt ends
        for job in (finished, running, queued):
            while not (images := member.ok("GET", f"/jobs/{job['id']}/tensorboard-images")["items"]):
                assert time.monotonic() < deadline, f"{job['id']}: no TensorBoard image listed"
                time.sleep(0.1)
            assert [(i["tag"], i["step"], i["file"], i["offset"]) for i in images] == [
                ("samples", 7, TB_FILE, _TB_OFFSETS[1])
            ], images

        # A dataset (its file named like the artifact, so one {path} binding serves both), a draft ready to
        # commit, and an open upload session.
        dataset = f"alpha-data-{tag}"
        data_client = Client(server.url, a["member"].key_id, a["member"].secret)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / artifact).write_text(artifact_marker)
            data_client.put_dataset(Path(tmp), dataset, state_dir=Path(tmp) / ".state")
        data_sha = hashlib.sha256(artifact_marker.encode()).hexdigest()
        draft_files = [{"path": f"copy/{artifact}", "size": len(artifact_marker), "sha256": data_sha}]
        draft = member.ok("POST", "/datasets", json_body={"name": dataset, "files": draft_files})
        pending = b"alpha pending upload " + tag.encode()
        upload = member.ok(
            "POST", "/uploads", json_body={"sha256": hashlib.sha256(pending).hexdigest(), "size": len(pending)}
        )
        data_client.close()
        # A model: a version registered from the finished job's artifact, and an alias naming it.
        model, alias = f"alpha-model-{tag}", f"champion-{tag}"
        member.ok("POST", f"/models/{model}/versions", json_body={"job_id": finished["id"], "path": artifact})
        member.ok("PUT", f"/models/{model}/aliases/{alias}", json_body={"version": 1})
        # A service of another model (the model routes remove theirs), with no replica.
        served, service = f"alpha-served-{tag}", f"alpha-svc-{tag}"
        member.ok("POST", f"/models/{served}/versions", json_body={"job_id": finished["id"], "path": artifact})
        svc = member.ok(
            "POST", "/services", json_body={"spec": {**SERVICE_SPEC, "name": service, "model": f"{served}@1"}}
        )
        # A notebook, stopped at once (its job is cancelled before it starts a JupyterLab).
        notebook = f"alpha-nb-{tag}"
        nb = member.ok("POST", "/notebooks", json_body={"name": notebook, "runtime": {"framework": "python"}})
        member.ok("POST", f"/notebooks/{notebook}/stop")
        # A study: its one trial waits on the quota behind the running job, so the study stays RUNNING.
        study = member.ok("POST", "/studies", json_body={"spec": {**STUDY_SPEC, "name": f"alpha-study-{tag}"}})
        deadline = time.monotonic() + 30
        while not (trials := member.ok("GET", f"/studies/{study['id']}/trials")["items"]):
            assert time.monotonic() < deadline, "the study never started its trial"
            time.sleep(0.05)
        member.wait_message(trials[0]["job_id"], "quota: count 1 of 1 in use")
        # A pipeline run: its step's job waits on the quota too, so the run stays RUNNING.
        prun = member.ok("POST", "/pipelines/runs", json_body={"spec": {**PIPELINE_SPEC, "name": f"alpha-flow-{tag}"}})
        deadline = time.monotonic() + 30
        while not (step_job := member.ok("GET", f"/pipelines/runs/{prun['id']}")["steps"][0]["job_id"]):
            assert time.monotonic() < deadline, "the pipeline never started its step"
            time.sleep(0.05)
        member.wait_message(step_job, "quota: count 1 of 1 in use")
        schedule = member.ok(
            "POST",
            "/pipelines/schedules",
            json_body={"spec": {**PIPELINE_SPEC, "name": f"alpha-nightly-{tag}"}, "cron": "0 0 1 1 *"},
        )
        budget = a["admin"].api.ok("PUT", "/budgets", json_body={"user": a["member"].user_name, "soft": 1e9})
        subscription = member.ok(
            "POST",
            "/notifications/subscriptions",
            json_body={"name": f"alpha-sub-{tag}", "events": ["test"], "url": f"http://127.0.0.1:9/alpha-{tag}"},
        )
        delivery = member.ok("POST", f"/notifications/subscriptions/{subscription['id']}/test")
        bogus_bundle, bogus_sha = tar_gz({"train.py": b"print('nobody uploaded this')\n"})
        choices = {
            "job_id": [Choice(name, job["id"], new_id("job")) for name, job in _jobs(finished, running, queued)],
            "sha256": [Choice("bundle", sha, bogus_sha, bundle, bogus_bundle)],
            "path": [Choice("artifact", artifact, "no-such-file.txt")],
            "org": [Choice("id", a.id, new_id("org")), Choice("name", a.name, "no-such-org")],
            "user": [
                Choice("id", a["member"].user_id, new_id("usr")),
                Choice("name", a["member"].user_name, "no-such-user"),
            ],
            "key": [Choice("member-key", a["member"].key_id, new_access_key_id())],
            "framework": [Choice("framework", "pytorch", "no-such-framework")],
            "name": [Choice("dataset", dataset, "no-such-dataset")],
            "version": [Choice("version", "1", "7")],
            "draft_id": [Choice("draft", draft["id"], new_id("dsv"))],
            "upload_id": [Choice("upload", upload["id"], new_id("up"))],
            "number": [Choice("part", "1", "2")],
            "study_id": [Choice("study", study["id"], new_id("study"))],
            "run_id": [
                Choice("pipeline-run", prun["id"], new_id("prun")),
                Choice("job-run", finished["id"], new_id("job")),
            ],
            "schedule_id": [Choice("pipeline-schedule", schedule["id"], new_id("psch"))],
            "budget_id": [Choice("budget", budget["id"], new_id("bud"))],
            "subscription_id": [Choice("subscription", subscription["id"], new_id("sub"))],
            "delivery_id": [Choice("delivery", delivery["id"], new_id("dlv"))],
            "model": [Choice("model", model, "no-such-model")],
            "alias": [Choice("alias", alias, "no-such-alias")],
            "served": [Choice("served-model", served, "no-such-model")],
            "service": [Choice("service", service, "no-such-service")],
            "notebook": [Choice("notebook", notebook, "no-such-notebook")],
        }
        sensitive = {a.id, a.name, sha, log_marker, artifact_marker, artifact}
        sensitive |= {dataset, data_sha, draft["id"], upload["id"], study["id"], study["name"], model, alias}
        sensitive |= {served, service, svc["id"], notebook, nb["id"], prun["id"], prun["name"]}
        sensitive |= {schedule["id"], schedule["name"], budget["id"]}
        sensitive |= {subscription["id"], subscription["name"], subscription["target"], delivery["id"]}
        sensitive |= {job["id"] for job in (finished, running, queued)}
        for account in a.accounts.values():
            sensitive |= {account.user_id, account.user_name, account.key_id, account.secret}
        target = Target(a, choices, sensitive)

        # -- the route table knows every route the server publishes -------------------------------------------
        document = httpx.get(server.url + "/api/v1/openapi.json", timeout=10).json()
        published = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
        unknown = sorted(published - set(ROUTES))
        assert not unknown, f"routes missing from the isolation matrix's ROUTES table (add them): {unknown}"
        stale = sorted(set(ROUTES) - published)
        assert not stale, f"ROUTES entries the server no longer publishes (remove them): {stale}"
        for route in published:
            params = set(PLACEHOLDER.findall(route[1]))
            assert params <= set(choices), f"{route}: no binding for path parameters {params - set(choices)}"

        matrix = Matrix(server.url)
        before = snapshot(admin, a, member, sha)
        cases = [(route, case) for route, route_cases in ROUTES.items() for case in route_cases]
        cases.sort(key=lambda rc: rc[1].last)

        # Controls: A's own readers get 2xx for every read with these bindings, so B's 404s mean something.
        for route, case in cases:
            if route[0] not in MUTATING and case.reader:
                matrix.control(f"A {case.reader}", a[case.reader].api, target, route, case, read=True)

        cross_actors = [("B member", b["member"].api), ("B org-admin", b["admin"].api)]
        for phase in ("read", "write"):  # reads first: B's own writes (a job, a key, a bundle) come after
            for route, case in cases:
                if (route[0] in MUTATING) != (phase == "write"):
                    continue
                if case.kind == "public":
                    matrix.cover("B member", route)
                    matrix.cover("B org-admin", route)
                    sent = send(None, server.url, route[0], route[1], case, {})
                    matrix.row("anonymous", sent, _leak_problem(sent, sensitive))
                    continue
                for who, api in cross_actors:
                    matrix.cross(who, api, target, route, case)

        for route, case in cases:
            if route[0] in MUTATING and case.writes:
                matrix.refused("A viewer", a["viewer"].api, target, route, case, {403, 404})
            if case.kind == "platform":
                matrix.refused("A org-admin", a["admin"].api, target, route, case, {403})

        after = snapshot(admin, a, member, sha)
        changes = {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}

        # Nothing was skipped: every published route ran for every cross-organisation caller, every mutating
        # route for the viewer, every platform-admin route for the org admin.
        for who, _ in cross_actors:
            missing = published - matrix.covered.get(who, set())
            assert not missing, f"{who} never sent {sorted(missing)}"
        writes = {r for r in published if r[0] in MUTATING and all(c.writes for c in ROUTES[r])}
        assert writes and not writes - matrix.covered["A viewer"], sorted(writes - matrix.covered["A viewer"])
        platform_routes = {r for r, cs in ROUTES.items() for c in cs if c.kind == "platform"}
        assert platform_routes == matrix.covered["A org-admin"]

        # Controls for the mutating routes (at the end: they change things): the owner's request resolves.
        owners = {"admin": a["admin"].api, "member": member, "platform": admin}
        for route, case in cases:
            if route[0] in MUTATING and case.owner:
                matrix.control(f"A {case.owner}", owners[case.owner], target, route, case, read=False)

        assert not matrix.problems and not changes, (
            f"{len(matrix.problems)} problem(s):\n"
            + "\n".join(matrix.problems)
            + (f"\n\nchanged by refused requests: {json.dumps(changes, indent=1, default=str)}" if changes else "")
            + f"\n\nall {len(matrix.rows)} requests:\n{matrix.table()}"
        )
        assert len(matrix.rows) > 150, len(matrix.rows)
    finally:
        for job_id in (j["id"] for j in admin.ok("GET", "/jobs", params={"limit": 500})["items"]):
            admin.request("POST", f"/jobs/{job_id}/cancel")
        close_all(a, b)
        admin.close()


def _jobs(finished: dict[str, Any], running: dict[str, Any], queued: dict[str, Any]) -> list[tuple[str, Any]]:
    return [("finished", finished), ("running", running), ("queued", queued)]


def _leak_problem(sent: Sent, sensitive: set[str]) -> str:
    if sent.failed or sent.response is None or sent.response.status_code not in (200, 204):
        return f"status {sent.status}"
    leaked = leaks(sent, sensitive)
    return f"answer contains {leaked}" if leaked else ""
