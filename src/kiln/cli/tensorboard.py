"""``kiln tensorboard JOB [JOB…]``: TensorBoard over those jobs' event files, one run per job, on the platform's
machines and reached through Kiln's proxy like a notebook (``kiln notebooks list|stop|start|delete`` manage it)."""

from __future__ import annotations

import webbrowser
from typing import Annotated

import typer
from pydantic import ValidationError

from kiln.cli.common import EXIT_ERROR, EXIT_USAGE, connect, fail, info
from kiln.domain.notebooks import NotebookSpec, NotebookState
from kiln.errors import NotFound


def tensorboard(
    jobs: Annotated[list[str], typer.Argument(help="Job ids, shown as one run each (their names).")],
    name: Annotated[str | None, typer.Option(help="Its name (default: tb- and the first job's id).")] = None,
    idle_timeout: Annotated[
        str, typer.Option("--idle-timeout", help="Stop after nothing reached it for this long (e.g. 30m); 0: never.")
    ] = "1h",
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until TensorBoard answers.")] = True,
    browser: Annotated[bool, typer.Option("--browser/--no-browser", help="Open it in a web browser too.")] = False,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds --wait waits at most.")] = 900.0,
) -> None:
    """Serve TensorBoard over the jobs' event files (kept by Kiln while they run and after they end), the jobs
    named as runs; stopped when nothing reached it for --idle-timeout. Prints its URL."""
    chosen = name or (f"tb-{jobs[0].removeprefix('job-')}" if jobs else "")
    try:
        spec = NotebookSpec.model_validate(
            {"name": chosen, "kind": "tensorboard", "jobs": jobs, "idle_timeout": idle_timeout}
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
        fail(problems.replace("Value error, ", ""), EXIT_USAGE)
    with connect() as client:
        try:
            board = client.get_notebook(spec.name)
        except NotFound:  # none of that name yet
            board = client.create_notebook(spec)
            info(f"created tensorboard {board.name} ({board.id}) over {', '.join(spec.jobs)}; job {board.job_id}")
        else:
            if board.spec.kind != "tensorboard" or board.spec.jobs != spec.jobs:
                fail(f"{spec.name} exists and is not a tensorboard over these jobs: give another --name", EXIT_USAGE)
            if board.state in (NotebookState.STOPPED, NotebookState.FAILED):
                board = client.start_notebook(board.id)
                info(f"started tensorboard {board.name} again (job {board.job_id})")
        if wait:
            board = client.wait_notebook(board.id, timeout=timeout)
            if board.state is not NotebookState.RUNNING:
                fail(f"tensorboard {board.name} is {board.state}: {board.message}", EXIT_ERROR)
    print(board.url)
    if browser:
        webbrowser.open(board.url)
