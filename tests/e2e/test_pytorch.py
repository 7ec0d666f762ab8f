"""A real PyTorch job on the `pytorch` catalog runtime (torch 2.13.0, CPU here), installed ahead of time with
`kiln runtimes install`, trained through the CLI, and its weights downloaded and loaded again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kilnserver import REPO, TEST_RUNTIMES

pytestmark = pytest.mark.slow


def _kiln(server, tmp_path: Path, *args: str, cwd: Path | None = None, timeout: float = 120):  # type: ignore[no-untyped-def]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "KILN_CONFIG": str(tmp_path / "config"), **server.credentials()}
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


# What it waits for, at most: the build 900 s, the listing 60 s, the training run 600 s, the download 120 s and
# the load 60 s (1740 s), and a minute for the server.
@pytest.mark.timeout(1800)
def test_pytorch_runtime_trains_and_saves_a_model(make_server, tmp_path: Path) -> None:
    server = make_server()
    install = _kiln(server, tmp_path, "runtimes", "install", "pytorch", timeout=900)  # waits for the build
    assert install.returncode == 0, install.stderr
    deadline = time.monotonic() + 60  # installed once `install` returned 0: this only reads it back
    while True:
        listing = _kiln(server, tmp_path, "runtimes", "list", "--output", "json")
        status = {r["name"]: r["status"] for r in json.loads(listing.stdout)}
        if status["pytorch-2.13"] == "installed":
            break
        assert status["pytorch-2.13"] in ("installing", "not-installed"), status
        assert time.monotonic() < deadline, "pytorch runtime did not install in time"
        time.sleep(2)

    example = REPO / "examples" / "torch-spiral"
    run = _kiln(server, tmp_path, "run", "-f", "kiln.yaml", "--cpus", "1", "--follow", cwd=example, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = run.stdout.splitlines()[0].strip()
    assert "step=300" in run.stdout
    out = tmp_path / "out"
    download = _kiln(server, tmp_path, "jobs", "download", job_id, "--dest", str(out))
    assert download.returncode == 0, download.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["torch"].startswith("2.13.0") and metrics["accuracy"] > 0.9
    load = "import sys, torch; s = torch.load(sys.argv[1]); print(sorted(s)[:2], sum(v.numel() for v in s.values()))"
    python = TEST_RUNTIMES / "pytorch-2.13" / "bin" / "python"
    loaded = subprocess.run(
        [str(python), "-c", load, str(out / "model.pt")], capture_output=True, text=True, timeout=60
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split()[-1] == str(2 * 64 + 64 + 64 * 64 + 64 + 64 * 2 + 2)
