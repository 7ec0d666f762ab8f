"""An old release of Kiln, from this repository's own history: its source, its server, and one of everything
its API makes (populate.py, run under that release's code)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kilnserver import REPO, KilnServer

HERE = Path(__file__).resolve().parent
# Extracted once per commit and kept: a CI machine pays for each release's `git archive` once.
CACHE = REPO / ".cache" / "upgrade-releases"


@dataclass(frozen=True)
class Release:
    commit: str
    landed: str
    migration: str  # the newest migration it carries: where an upgrade from it starts

    def __str__(self) -> str:
        return self.commit


def releases() -> list[Release]:
    with open(HERE / "releases.toml", "rb") as f:
        return [Release(r["commit"], r["landed"], r["migration"]) for r in tomllib.load(f)["release"]]


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)


def source(release: Release) -> Path:
    """The release's ``src`` directory, extracted from the repository's history (cached under .cache/)."""
    found = _git("rev-parse", "--verify", "--quiet", f"{release.commit}^{{commit}}")
    if found.returncode != 0:
        raise AssertionError(
            f"release {release.commit} (tests/upgrade/releases.toml) is not in this repository's history: "
            "the upgrade test needs a clone with full history (git fetch --unshallow)"
        )
    full = found.stdout.decode().strip()
    target = CACHE / full
    if (target / "src" / "kiln").is_dir():
        return target / "src"
    CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=CACHE, prefix=f".{full[:12]}-"))
    archive = _git("archive", "--format=tar", full, "src")
    if archive.returncode != 0:
        raise AssertionError(f"git archive {full} src failed: {archive.stderr.decode()}")
    subprocess.run(["tar", "-x", "-C", str(staging)], input=archive.stdout, check=True)
    try:
        staging.rename(target)  # atomic: two workers extracting the same release keep whichever came first
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target / "src"


class ReleaseServer(KilnServer):
    """A ``kiln server`` of an old release: this interpreter and its packages, the release's own ``kiln``
    first on the path (every release so far needs no package the head's environment lacks; one that does fails
    to start here, with its ImportError in the message)."""

    migrated_copy = False  # the head's migrated database would be from its future

    def __init__(self, release: Release, home: Path, database_url: str | None = None) -> None:
        super().__init__(home, database_url)
        self.src = source(release)
        self.env["PYTHONPATH"] = str(self.src)
        self.log_path = home.parent / f"{home.name}-{release.commit}-server.log"


def populate(server: ReleaseServer, work: Path) -> dict[str, Any]:
    """Run populate.py against ``server`` under its release's code: its report (ids, the member's key, the
    answers of its GETs)."""
    env = {**server.env, **server.credentials()}
    done = subprocess.run(
        [sys.executable, str(HERE / "populate.py"), server.url, str(work)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"populating {server.src} failed:\n{done.stderr[-6000:]}\nserver log:\n{server.log()}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report
