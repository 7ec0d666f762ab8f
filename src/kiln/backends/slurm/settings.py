"""What the Slurm backend makes of its settings (``settings.slurm``, :class:`kiln.settings.SlurmSettings`,
``KILN_SLURM_*``): the paths of the Slurm commands the server runs. The renderer takes the settings themselves."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from kiln.errors import BackendUnavailable
from kiln.settings import SlurmSettings

__all__ = ["SlurmCommands", "SlurmSettings", "slurm_commands"]

COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sacct")


@dataclass(frozen=True)
class SlurmCommands:
    """Absolute paths of the Slurm commands the server runs (with its own environment, ``SLURM_CONF`` included)."""

    sbatch: str
    squeue: str
    scontrol: str
    scancel: str
    sacct: str


def slurm_commands(settings: SlurmSettings, path: str | None = None) -> SlurmCommands:
    """Each command: its setting (``KILN_SLURM_SBATCH`` …) if given, which must be an executable file, else found on
    ``path`` (default: the server's ``PATH``). BackendUnavailable names every command that is missing and its
    setting."""
    found: dict[str, str] = {}
    problems = []
    for name in COMMANDS:
        given = getattr(settings, name)
        if given is not None:
            if os.path.isfile(given) and os.access(given, os.X_OK):
                found[name] = os.path.abspath(given)
            else:
                problems.append(f"KILN_SLURM_{name.upper()}={given} is not an executable file")
            continue
        where = shutil.which(name, path=path)
        if where is None:
            problems.append(
                f"{name} is not on the PATH (install Slurm's client commands or set KILN_SLURM_{name.upper()})"
            )
        else:
            found[name] = os.path.abspath(where)
    if problems:
        raise BackendUnavailable("cannot use Slurm: " + "; ".join(problems), details={"backend": "slurm"})
    return SlurmCommands(**found)
