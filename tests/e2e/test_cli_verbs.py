"""The verbs a new user tries first, as the real ``kiln`` command against a real server: ``ls`` and ``list`` for
every collection, and ``kiln quota ORG``."""

from __future__ import annotations

import json
import uuid

from tests.e2e.test_cli import base_env, kiln
from tests.e2e.test_cli_tenancy import data, new_key, ok, refused


def test_every_collection_lists_with_list_and_ls(shared_server, tmp_path):
    admin = {**base_env(tmp_path), **shared_server.credentials(), "KILN_ENDPOINT": shared_server.url}
    for collection in ("jobs", "studies", "data", "runtimes", "orgs", "users", "keys"):
        by_list = data(admin, collection, "list")
        by_ls = data(admin, collection, "ls")
        assert isinstance(by_list, list) and by_ls == by_list, collection
    assert "python-3" in {r["name"] for r in data(admin, "runtimes", "ls")}


def test_quota_names_the_organisation_as_its_first_word(shared_server, tmp_path):
    base = base_env(tmp_path)
    admin = {**base, **shared_server.credentials(), "KILN_ENDPOINT": shared_server.url}
    name = f"quota-{uuid.uuid4().hex[:8]}"
    org = data(admin, "orgs", "create", name)
    data(admin, "users", "create", f"{name}-ann", "--org", name, "--role", "admin")
    ann = new_key(admin, f"{name}-ann", base)

    # A platform admin names any organisation, by name or id, before or after the options.
    set_report = data(admin, "quota", "set", name, "--gpus", "3")
    assert set_report["org_id"] == org["id"]
    for argv in ((name, "-o", "json"), (org["id"], "-o", "json"), ("-o", "json", name)):
        report = json.loads(ok(kiln(admin, "quota", *argv)).stdout)
        assert report["org_id"] == org["id"], argv
        train = next(c for c in report["categories"] if c["category"] == "train")
        assert train["limits"]["gpus"] == 3
    table = ok(kiln(admin, "quota", name)).stdout
    assert f"organisation {name} ({org['id']})" in table
    own = data(admin, "quota")
    assert own["org_id"] != org["id"]  # no ORG: the caller's own

    # Anyone else sees their own organisation, and another one's is not there for them.
    assert data(ann, "quota")["org_id"] == org["id"]
    assert data(ann, "quota", name)["org_id"] == org["id"]
    refused(kiln(ann, "quota", own["org_name"]), "not found")
