"""``kiln jobs render -f kiln.yaml --backend kubernetes|slurm``: print what Kiln would hand the cluster for one
attempt: the manifests, as YAML (Kubernetes), or the sbatch script (Slurm).

Client-side only: no server is asked. The token and SSH keys are placeholders, the job id a fixed example
unless ``--job-id`` is given; on Kubernetes the image comes from the built-in runtime catalog unless ``--image``
is; the cluster's settings are read from this environment (``KILN_KUBERNETES_*``, ``KILN_SLURM_*``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kiln.cli.common import EXIT_USAGE, fail
from kiln.cli.spec import Overrides, SpecError, build_spec
from kiln.errors import InvalidInput

if TYPE_CHECKING:
    from kiln.domain.spec import JobSpec

EXAMPLE_JOB_ID = "job-0000000000example"
EXAMPLE_ORG_ID = "org-0000000000example"


RENDERS = ("kubernetes", "slurm")  # the backends whose objects a spec becomes can be printed


def check_backend(name: str) -> str:
    """The backend to render for, or a usage error naming the backends there are (Typer's choice answered
    ``'slurm' is not one of 'kubernetes'.``, which said nothing of the backends Kiln has). Slurm renders before
    its controller exists (it is not in the registry yet)."""
    from kiln.backends.registry import BACKENDS

    chosen = name.strip().lower()
    known = [*BACKENDS, *(r for r in RENDERS if r not in BACKENDS)]
    if chosen not in known:
        fail(f"unknown backend {name!r}: the backends are {', '.join(known)}", EXIT_USAGE)
    if chosen not in RENDERS:
        fail(
            f"backend {chosen!r} has nothing to render (it runs a job's processes on this machine); "
            f"--backend {' or '.join(RENDERS)} prints what a spec becomes",
            EXIT_USAGE,
        )
    return chosen


def render(
    file: Annotated[Path, typer.Option("--file", "-f", dir_okay=False, help="The job spec (kiln.yaml).")],
    backend: Annotated[str, typer.Option(help=f"The backend whose objects to print ({', '.join(RENDERS)}).")] = RENDERS[
        0
    ],
    namespace: Annotated[
        str | None, typer.Option(help="Namespace (kubernetes; default: KILN_KUBERNETES_NAMESPACE).")
    ] = None,
    job_id: Annotated[str, typer.Option(help="The job id to render for.")] = EXAMPLE_JOB_ID,
    org_id: Annotated[str, typer.Option(help="The organisation id to render for.")] = EXAMPLE_ORG_ID,
    attempt: Annotated[int, typer.Option(min=0, help="The attempt number.")] = 1,
    image: Annotated[
        str | None, typer.Option(help="The job's image (kubernetes; default: from the runtime catalog).")
    ] = None,
    endpoint: Annotated[str, typer.Option(help="The Kiln API as pods (or Slurm nodes) reach it.")] = "http://kiln:8080",
    code_sha256: Annotated[str | None, typer.Option(help="Render the code fetch for this bundle.")] = None,
) -> None:
    """Print what one attempt of a job would hand the cluster: manifests (YAML documents) or an sbatch script; no
    server needed."""
    chosen = check_backend(backend)
    try:
        spec = build_spec(file, Overrides())
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    if chosen == "slurm":
        if image is not None or namespace is not None:
            fail("--image and --namespace apply to --backend kubernetes only", EXIT_USAGE)
        typer.echo(_slurm_script(spec, job_id, org_id, attempt, endpoint, code_sha256), nl=False)
        return
    from kiln.backends.kubernetes.render import RenderInput, to_yaml
    from kiln.backends.kubernetes.render import render as render_manifests
    from kiln.backends.kubernetes.settings import KubernetesSettings, kube_config

    try:
        settings = KubernetesSettings()
        cfg = kube_config(settings, **({"namespace": namespace} if namespace else {}))
    except ValueError as exc:
        fail(f"kubernetes settings: {exc}", EXIT_USAGE)
    job = RenderInput(
        job_id=job_id,
        org_id=org_id,
        attempt=attempt,
        spec=spec,
        image=image,
        code_sha256=code_sha256,
        endpoint=endpoint,
    )
    try:
        objects = render_manifests(job, cfg)
    except InvalidInput as exc:
        fail(exc.message, EXIT_USAGE)
    typer.echo(to_yaml(objects), nl=False)


def _slurm_script(spec: JobSpec, job_id: str, org_id: str, attempt: int, endpoint: str, code_sha256: str | None) -> str:
    from pydantic import ValidationError

    from kiln.api.startup import settings_problems
    from kiln.backends.slurm.render import SlurmJob
    from kiln.backends.slurm.render import render as render_script
    from kiln.backends.slurm.settings import SlurmSettings

    try:
        settings = SlurmSettings()
    except ValidationError as exc:
        fail(f"invalid settings: {settings_problems(exc)}", EXIT_USAGE)
    job = SlurmJob(job_id, org_id, attempt, spec, endpoint=endpoint, code_sha256=code_sha256)
    try:
        return render_script(job, settings)
    except InvalidInput as exc:
        fail(exc.message, EXIT_USAGE)
