"""Rendering of tenancy output: the quota table and the env lines of `kiln keys create --output env`."""

from __future__ import annotations

import shlex
import subprocess

from kiln.cli.keys import env_lines
from kiln.cli.output import audit_table, quota_amount, quota_table
from kiln.domain.schemas import AuditRead, QuotaReport
from kiln.sdk.config import read_config_file


def test_quota_amounts():
    assert quota_amount("memory", None, limit=True) == "unlimited"
    assert quota_amount("memory", None, limit=False) == "-"
    assert quota_amount("memory", 128 * 1024**3, limit=True) == "128 GiB"
    assert quota_amount("storage", 1024**4, limit=True) == "1 TiB"
    assert quota_amount("cpus", 2.5, limit=True) == "2.5"
    assert quota_amount("gpus", 4.0, limit=False) == "4"


def test_quota_table_shows_use_and_limits(capsys):
    report = QuotaReport.model_validate(
        {
            "org_id": "org-1",
            "org_name": "acme",
            "categories": [
                {
                    "category": "train",
                    "limits": {"gpus": 2, "memory": 64 * 1024**3},
                    "used": {"gpus": 1, "cpus": 3, "memory": 2 * 1024**3, "count": 1},
                },
                {"category": "serve", "limits": {"gpus": 1}, "used": {"gpus": 0, "cpus": 0}},
                {"category": "dev", "limits": {}, "used": {"gpus": 0}},
                {"category": "total", "limits": {"storage": 1024**4}, "used": {"storage": 5 * 1024**2}},
            ],
        }
    )
    quota_table(report)
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == "organisation acme (org-1)"
    rows = [line.split() for line in captured.out.splitlines()]
    assert ["train", "gpus", "1", "2"] in rows
    assert ["train", "cpus", "3", "unlimited"] in rows
    assert ["train", "memory", "2", "GiB", "64", "GiB"] in rows
    assert ["total", "storage", "5", "MiB", "1", "TiB"] in rows
    assert ["total", "gpus", "-", "unlimited"] in rows
    assert not any(row[:2] == ["train", "storage"] for row in rows)  # storage: the organisation as a whole
    assert ["serve", "gpus", "0", "1"] in rows
    assert not any(row[:2] == ["serve", "cpus"] for row in rows)  # unlimited and unused: left out
    assert not any(row[:1] == ["dev"] for row in rows)
    assert "not shown are unlimited and unused" in captured.err


def test_env_lines_can_be_sourced_and_read_back(tmp_path):
    text = env_lines("http://127.0.0.1:8080", "AKXYZ", "se'cr et")
    path = tmp_path / "bob.env"
    path.write_text(text)
    assert text.splitlines()[1] == "KILN_ACCESS_KEY=AKXYZ"
    script = f'set -a; . {shlex.quote(str(path))}; set +a; printf \'%s\\n\' "$KILN_SECRET_KEY" "$KILN_ENDPOINT"'
    shell = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    assert shell.stdout.splitlines() == ["se'cr et", "http://127.0.0.1:8080"]
    assert read_config_file(path)["KILN_ACCESS_KEY"] == "AKXYZ"


def test_the_audit_tables_org_and_user_columns_show_names(capsys):
    """The ORG and USER columns read names (issue 26: they showed ids); a record without a name keeps its id."""
    records = [
        AuditRead.model_validate(
            {
                "id": 2,
                "time": "2026-12-03T09:00:00Z",
                "org_id": "org-01HZX",
                "user_id": "usr-01HZY",
                "org_name": "acme",
                "user_name": "ann",
                "key_id": "AK1",
                "action": "submit_job",
                "resource": "id=job-1",
                "outcome": "success",
                "status": 201,
                "client": "127.0.0.1",
            }
        ),
        AuditRead.model_validate(
            {
                "id": 1,
                "time": "2026-12-03T08:59:00Z",
                "org_id": "org-gone",
                "user_id": None,
                "key_id": "AKX",
                "action": "GET /api/v1/jobs",
                "resource": "/api/v1/jobs",
                "outcome": "unauthenticated",
                "status": 401,
                "client": "127.0.0.1",
            }
        ),
    ]
    audit_table(records)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows[0][2:5] == ["acme", "ann", "AK1"]
    assert rows[1][2:5] == ["org-gone", "-", "AKX"]
