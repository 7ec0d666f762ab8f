"""``kiln jobs render -f kiln.yaml --backend kubernetes``: print the manifests Kiln would create, as YAML.

Client-side only: no server is asked. The token and SSH keys are placeholders, the job id a fixed example
unless ``--job-id`` is given, and the image comes from the built-in runtime catalog unless ``--image`` is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kiln.cli.common import EXIT_USAGE, fail
from kiln.cli.spec import Overrides, SpecError, build_spec
from kiln.errors import InvalidInput

EXAMPLE_JOB_ID = "job-0000000000example"
EXAMPLE_ORG_ID = "org-0000000000example"


RENDERS = "kubernetes"  # the one backend whose objects a spec becomes can be printed


def check_backend(name: str) -> str:
    """The backend to render for, or a usage error naming the backends there are (Typer's choice answered
    ``'slurm' is not one of 'kubernetes'.``, which said nothing of the backends Kiln has)."""
    from kiln.backends.registry import BACKENDS

    chosen = name.strip().lower()
    if chosen not in BACKENDS:
        fail(f"unknown backend {name!r}: the backends are {', '.join(BACKENDS)}", EXIT_USAGE)
    if chosen != RENDERS:
        fail(
            f"backend {chosen!r} has nothing to render (it runs a job's processes on this machine); "
            f"--backend {RENDERS} prints the objects a spec becomes",
            EXIT_USAGE,
        )
    return chosen


def render(
    file: Annotated[Path, typer.Option("--file", "-f", dir_okay=False, help="The job spec (kiln.yaml).")],
    backend: Annotated[
        str, typer.Option(help=f"The backend whose objects to print (only {RENDERS} has any).")
    ] = RENDERS,
    namespace: Annotated[str | None, typer.Option(help="Namespace (default: KILN_KUBERNETES_NAMESPACE).")] = None,
    job_id: Annotated[str, typer.Option(help="The job id to render for.")] = EXAMPLE_JOB_ID,
    org_id: Annotated[str, typer.Option(help="The organisation id to render for.")] = EXAMPLE_ORG_ID,
    attempt: Annotated[int, typer.Option(min=0, help="The attempt number.")] = 1,
    image: Annotated[str | None, typer.Option(help="The job's image (default: from the runtime catalog).")] = None,
    endpoint: Annotated[str, typer.Option(help="The Kiln API as pods reach it.")] = "http://kiln:8080",
    code_sha256: Annotated[str | None, typer.Option(help="Render the code fetch for this bundle.")] = None,
) -> None:
    """Print the manifests one attempt of a job would create (YAML documents); no server needed."""
    from kiln.backends.kubernetes.render import RenderInput, to_yaml
    from kiln.backends.kubernetes.render import render as render_manifests
    from kiln.backends.kubernetes.settings import KubernetesSettings, kube_config

    check_backend(backend)
    try:
        spec = build_spec(file, Overrides())
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
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
