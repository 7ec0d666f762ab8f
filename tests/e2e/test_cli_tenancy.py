"""Tenancy from the command line: organisations, users and roles, keys, quotas, the audit log and job tokens —
the real ``kiln`` command as a subprocess against a real server."""

from __future__ import annotations

import json
import shlex
import subprocess
from typing import Any

from tests.e2e.test_cli import PY, base_env, kiln

SECRET_WARNING = "cannot show it again"


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result


def data(env: dict[str, str], *args: str) -> Any:
    """``kiln ARGS --output json``, parsed."""
    return json.loads(ok(kiln(env, *args, "--output", "json")).stdout)


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """The command failed with exit 1 and one ``error: ...`` line naming one of ``words``."""
    assert result.returncode == 1, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert result.stderr.startswith("error:") and "Traceback" not in result.stderr, result.stderr
    assert any(word in result.stderr.lower() for word in words), result.stderr
    return result.stderr


def env_file(text: str) -> dict[str, str]:
    """The KEY=VALUE lines of ``kiln keys create --output env``, as the shell would read them."""
    pairs = dict(shlex.split(line)[0].split("=", 1) for line in text.splitlines() if line.strip())
    assert set(pairs) == {"KILN_ENDPOINT", "KILN_ACCESS_KEY", "KILN_SECRET_KEY"}, text
    return pairs


def new_key(env: dict[str, str], user: str, base: dict[str, str], *extra: str) -> dict[str, str]:
    """``kiln keys create --user USER --output env``: the environment of a shell that sourced its output."""
    created = ok(kiln(env, "keys", "create", "--user", user, "--output", "env", *extra))
    assert SECRET_WARNING in created.stderr
    return {**base, **env_file(created.stdout)}


def rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines()]


def test_org_admins_manage_their_org_and_roles_quotas_keys_and_audit_apply(make_server, tmp_path):
    server = make_server()
    base = base_env(tmp_path)
    admin = {**base, **server.credentials(), "KILN_ENDPOINT": server.url}

    # The platform admin creates an organisation, its first (admin) user, and a key for that user.
    org = data(admin, "orgs", "create", "acme")
    assert org["name"] == "acme" and org["id"]
    assert "acme" in {o["name"] for o in data(admin, "orgs", "list")}
    shown = ok(kiln(admin, "orgs", "show", "acme"))
    assert org["id"] in shown.stdout
    alice_user = data(admin, "users", "create", "alice", "--org", "acme", "--role", "admin")
    assert (alice_user["org_name"], alice_user["role"], alice_user["disabled"]) == ("acme", "admin", False)
    alice = new_key(admin, "alice", base)
    assert alice["KILN_ENDPOINT"] == server.url
    me = data(alice, "whoami")
    assert (me["user_name"], me["org_name"], me["role"], me["platform_admin"]) == ("alice", "acme", "admin", False)

    # The organisation admin adds a member and a viewer to their own organisation, and keys for them.
    bob_user = data(alice, "users", "create", "bob")
    assert (bob_user["org_name"], bob_user["role"]) == ("acme", "member")
    carol_user = data(alice, "users", "create", "carol", "--role", "viewer")
    assert (carol_user["org_name"], carol_user["role"]) == ("acme", "viewer")
    bob = new_key(alice, "bob", base)
    carol = new_key(alice, "carol", base, "--expires", "30d", "--description", "read-only dashboards")
    carol_keys = data(alice, "keys", "list", "--user", "carol")
    assert [k["id"] for k in carol_keys] == [carol["KILN_ACCESS_KEY"]]
    assert carol_keys[0]["expires_at"] and carol_keys[0]["description"] == "read-only dashboards"
    assert "secret_key" not in carol_keys[0]
    members = {u["name"]: u["role"] for u in data(alice, "users", "list")}
    assert members == {"alice": "admin", "bob": "member", "carol": "viewer"}
    listed = ok(kiln(alice, "users", "list"))
    assert ["carol", "acme", "viewer", "active"] in [row[1:5] for row in rows(listed.stdout)]
    assert data(alice, "users", "show", "bob")["id"] == bob_user["id"]

    # ... but neither creates organisations nor users elsewhere.
    refused(kiln(alice, "orgs", "create", "other"), "forbidden")
    refused(kiln(alice, "users", "create", "eve", "--org", "admin"), "forbidden", "not found")
    refused(kiln(bob, "users", "create", "eve"), "forbidden")

    # A member runs jobs; a viewer may read but not run.
    ran = ok(kiln(bob, "run", "--python", PY, "--no-code", "--follow", "--", "echo member ran"))
    assert ran.stdout.splitlines()[1:] == ["member ran"]
    denied = kiln(carol, "run", "--python", PY, "--no-code", "--", "true")
    refused(denied, "forbidden")
    assert denied.stdout == ""
    assert len(data(carol, "jobs", "list")) == 1

    # Quotas: set by the platform admin, seen by a member of the organisation.
    report = data(admin, "quota", "set", "acme", "--gpus", "2", "--memory", "64G", "--count", "5")
    train = next(c for c in report["categories"] if c["category"] == "train")
    assert train["limits"]["gpus"] == 2 and train["limits"]["memory"] == 64 * 1024**3 and train["limits"]["count"] == 5
    mine = data(bob, "quota")
    assert mine["org_name"] == "acme"
    train = next(c for c in mine["categories"] if c["category"] == "train")
    assert (train["limits"]["gpus"], train["limits"]["memory"], train["limits"]["cpus"]) == (2, 64 * 1024**3, None)
    table = rows(ok(kiln(bob, "quota")).stdout)
    assert ["train", "memory"] in [row[:2] for row in table]
    assert next(row for row in table if row[:2] == ["train", "memory"])[-2:] == ["64", "GiB"]
    assert next(row for row in table if row[:2] == ["train", "gpus"])[-1] == "2"
    assert next(row for row in table if row[:2] == ["train", "cpus"])[-1] == "unlimited"
    refused(kiln(bob, "quota", "set", "acme", "--gpus", "8"), "forbidden")
    lifted = data(admin, "quota", "set", "acme", "--gpus", "unlimited")
    train = next(c for c in lifted["categories"] if c["category"] == "train")
    assert (train["limits"]["gpus"], train["limits"]["memory"], train["limits"]["count"]) == (None, 64 * 1024**3, 5)
    assert data(admin, "quota", "--org", "acme")["org_id"] == org["id"]
    assert kiln(admin, "quota", "set", "acme").returncode == 2
    assert kiln(admin, "quota", "set", "acme", "--gpus", "lots").returncode == 2

    # The audit log: the organisation's creation, and the viewer's refused submission.
    created = data(admin, "audit", "--action", "create_org", "--since", "1h")
    assert any(org["id"] in event["resource"] and event["outcome"] == "success" for event in created), created
    audit_table = ok(kiln({**admin, "COLUMNS": "300"}, "audit", "--action", "create_org"))
    assert org["id"] in audit_table.stdout and "create_org" in audit_table.stdout
    refusals = data(alice, "audit", "--user", "carol", "--outcome", "denied")
    assert refusals and {e["status"] for e in refusals} == {403}
    assert {e["org_id"] for e in data(alice, "audit")} == {org["id"]}  # an org admin sees their organisation only
    assert data(admin, "audit", "--since", "2099-01-01T00:00Z") == []
    refused(kiln(bob, "audit"), "forbidden")
    assert kiln(admin, "audit", "--since", "last tuesday").returncode == 2

    # Disabling a key makes it fail; deleting one too; a disabled user comes back when enabled.
    assert data(alice, "keys", "disable", bob["KILN_ACCESS_KEY"])["enabled"] is False
    refused(kiln(bob, "whoami"), f"access key {bob['KILN_ACCESS_KEY'].lower()} is disabled")
    assert [k["enabled"] for k in data(alice, "keys", "list", "--user", "bob")] == [False]
    ok(kiln(alice, "keys", "delete", carol["KILN_ACCESS_KEY"]))
    refused(kiln(carol, "whoami"), "the access key id you provided does not exist")
    assert data(alice, "keys", "list", "--user", "carol") == []
    assert data(alice, "users", "disable", "bob")["disabled"] is True
    assert data(alice, "users", "enable", "bob")["disabled"] is False


def test_keys_create_shows_the_secret_once(shared_server, tmp_path):
    admin = {**base_env(tmp_path), **shared_server.credentials(), "KILN_ENDPOINT": shared_server.url}
    created = ok(kiln(admin, "keys", "create", "--description", "laptop"))
    secret_lines = [row for row in rows(created.stdout) if row[:2] == ["secret", "key"]]
    assert len(secret_lines) == 1 and len(secret_lines[0]) == 3
    secret = secret_lines[0][2]
    assert SECRET_WARNING in created.stderr and secret not in created.stderr
    access_key = next(row for row in rows(created.stdout) if row[:2] == ["access", "key"])[2]
    listed = ok(kiln(admin, "keys", "list"))
    assert access_key in listed.stdout and secret not in listed.stdout

    as_json = data(admin, "keys", "create", "--expires", "2h")
    assert as_json["secret_key"] and as_json["expires_at"] and as_json["endpoint"] == shared_server.url
    new = {**base_env(tmp_path), "KILN_ENDPOINT": shared_server.url}
    new |= {"KILN_ACCESS_KEY": as_json["id"], "KILN_SECRET_KEY": as_json["secret_key"]}
    assert data(new, "whoami")["access_key"] == as_json["id"]

    bad = kiln(admin, "keys", "create", "--expires", "whenever")
    assert bad.returncode == 2 and "--expires" in bad.stderr


def test_a_running_job_reports_with_its_token(shared_server, tmp_path):
    admin = {**base_env(tmp_path), **shared_server.credentials(), "KILN_ENDPOINT": shared_server.url}
    (tmp_path / "report.py").write_text(
        "import os\n"
        "import kiln\n"
        "from kiln.errors import KilnError\n"
        "client = kiln.Client()\n"
        "print('token' if client.uses_job_token else 'keys', os.environ['KILN_JOB_TOKEN'] in repr(client))\n"
        "job = os.environ['KILN_JOB_ID']\n"
        "print('appended', client.append_logs(job, ['from the sdk 1', 'from the sdk 2']), flush=True)\n"
        "artifact = client.upload_artifact(job, 'reports/summary.txt', b'accuracy 0.99\\n')\n"
        "print('uploaded', artifact.path, artifact.size)\n"
        "try:\n"
        "    client.list_users()\n"
        "except KilnError as exc:\n"
        "    print('refused', exc.code)\n"
    )
    result = ok(kiln(admin, "run", "--python", PY, "--follow", "--", PY, "report.py", cwd=tmp_path))
    job_id, *lines = result.stdout.splitlines()
    assert lines[0] == "token False"  # authenticated by the job token, which repr() does not show
    assert "appended 2" in lines and "from the sdk 1" in lines and "from the sdk 2" in lines
    assert "uploaded reports/summary.txt 14" in lines
    assert lines[-1] in ("refused forbidden", "refused unauthenticated")

    dest = tmp_path / "out"
    ok(kiln(admin, "jobs", "download", job_id, "reports/summary.txt", "--dest", str(dest)))
    assert (dest / "reports" / "summary.txt").read_text() == "accuracy 0.99\n"
