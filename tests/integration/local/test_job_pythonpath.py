"""Inside a job on a catalog runtime (its own virtualenv), `import kiln` works for `kiln.log` — cheaply, and
without exposing the server's other packages to the job."""

from __future__ import annotations

from tests.helpers import log_text, wait_for

CHECK = (
    "import importlib.util, sys, kiln; "
    "print('kiln', kiln.__version__); "
    "print('heavy', sorted(m for m in ('pydantic', 'httpx', 'sqlalchemy', 'fastapi') if m in sys.modules)); "
    "print('server packages visible', importlib.util.find_spec('pydantic') is not None)"
)


def test_import_kiln_in_a_catalog_runtime(make_server):
    client = make_server().client()
    job = client.submit({"command": ["python", "-c", CHECK], "runtime": {"framework": "python"}})
    done = wait_for(client, job.id, timeout=240)
    assert done.state == "SUCCEEDED", (done.message, log_text(client, job.id))
    out = log_text(client, job.id)
    assert out[0].startswith("kiln ") and out[1] == "heavy []" and out[2] == "server packages visible False", out
