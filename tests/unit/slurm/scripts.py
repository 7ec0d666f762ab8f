"""Reading a rendered sbatch script back: its directives, its exports and the archive it carries."""

from __future__ import annotations

import base64
import io
import subprocess
import zipfile

from kiln.backends.slurm.render import SlurmJob, render
from kiln.domain.spec import JobSpec
from kiln.settings import SlurmSettings


def script_of(spec: dict, settings: SlurmSettings | None = None, **job: object) -> str:  # type: ignore[type-arg]
    fields = {"job_id": "job-0001", "org_id": "org-0001", "attempt": 1, **job}
    return render(SlurmJob(spec=JobSpec.model_validate(spec), **fields), settings or SlurmSettings())  # type: ignore[arg-type]


def sbatch_options(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def sourced(text: str) -> dict[str, str]:
    """What a shell text (export lines, env files) sets, as bash reads it, in an otherwise empty environment."""
    out = subprocess.run(["bash", "-c", text + "\nenv -0"], capture_output=True, env={}, check=True).stdout
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    return {k: v for k, v in env.items() if k not in ("PWD", "SHLVL", "_")}


def exports(script: str) -> dict[str, str]:
    """What the script's ``export`` lines set."""
    return sourced("\n".join(line for line in script.splitlines() if line.startswith("export ")))


def archive(script: str) -> zipfile.ZipFile:
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("exit 1; }") and "KILN_ARCHIVE" in line)
    end = lines.index("KILN_ARCHIVE", start + 1)
    return zipfile.ZipFile(io.BytesIO(base64.b64decode("".join(lines[start + 1 : end]))))
