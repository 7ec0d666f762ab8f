"""``kiln notebooks``: JupyterLab on the platform's machines — create, list, show, open, stop, start, delete."""

from __future__ import annotations

import sys
import webbrowser
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from rich import box
from rich.table import Table
from rich.text import Text

from kiln.cli.common import EXIT_ERROR, EXIT_USAGE, Output, OutputFormat, connect, emit_json, emit_list, fail, info, out
from kiln.cli.output import fmt_time
from kiln.cli.spec import INPUT_FORMAT, SpecError, parse_input, parse_pairs, parse_runtime
from kiln.domain.durations import format_duration
from kiln.domain.notebooks import NotebookSpec, NotebookState
from kiln.domain.quantities import format_bytes

if TYPE_CHECKING:
    from kiln.domain.notebooks import NotebookRead

app = typer.Typer(help="JupyterLab on the platform's machines, reached through Kiln.", no_args_is_help=True)

EXAMPLE_NOTEBOOK_ID = "nb-0000000000example"
NotebookArg = Annotated[str, typer.Argument(help="The notebook's name (or id).")]
Wait = Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until JupyterLab answers (or it stops).")]
Timeout = Annotated[float, typer.Option(min=1, help="Seconds --wait waits at most.")]
STYLES = {
    NotebookState.STARTING: "cyan",
    NotebookState.RUNNING: "green",
    NotebookState.STOPPING: "yellow",
    NotebookState.STOPPED: "dim",
    NotebookState.FAILED: "red",
}


def _state(notebook: NotebookRead) -> Text:
    return Text(str(notebook.state), style=STYLES.get(notebook.state, ""))


def notebooks_table(notebooks: list[NotebookRead]) -> None:
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("NAME", "STATE", "RUNTIME", "IDLE TIMEOUT", "LAST ACTIVITY", "JOB"):
        table.add_column(column)
    for nb in notebooks:
        idle = _idle(nb.spec.idle_timeout)
        table.add_row(nb.name, _state(nb), nb.spec.runtime.label, idle, fmt_time(nb.last_activity), nb.job_id or "-")
    out.print(table)


def _idle(seconds: float | None) -> str:
    """The idle timeout as it is written in a spec (2h, 30m), or never."""
    return format_duration(seconds) if seconds else "never"


def _detail(nb: NotebookRead) -> None:
    out.print(Text.assemble(("notebook ", ""), (nb.name, "bold"), f" ({nb.id}) ", _state(nb)))
    if nb.message:
        out.print(f"  {nb.message}")
    out.print(f"  url        {nb.url}")
    out.print(f"  runtime    {nb.spec.runtime.label} (with JupyterLab)")
    res = nb.spec.resources
    memory = format_bytes(res.memory) if res.memory else "-"
    out.print(f"  resources  cpus {res.cpus:g}, memory {memory}, gpus {res.gpus}")
    for item in nb.spec.inputs:
        out.print(f"  input      {item.ref} at {item.where}")
    out.print(f"  idle after {_idle(nb.spec.idle_timeout)}")
    out.print(f"  job        {nb.job_id or '-'}   last activity {fmt_time(nb.last_activity)}")


def _wait(client: object, name: str, timeout: float) -> NotebookRead:
    from kiln.sdk.client import Client

    assert isinstance(client, Client)
    notebook = client.wait_notebook(name, timeout=timeout)
    if notebook.state is not NotebookState.RUNNING:
        fail(f"notebook {notebook.name} is {notebook.state}: {notebook.message}", EXIT_ERROR)
    return notebook


# What `create` and `render` take: the notebook's spec.
Runtime = Annotated[str, typer.Option(help="Catalog runtime: FRAMEWORK or FRAMEWORK==VERSION.")]
Cpus = Annotated[float | None, typer.Option(help="CPU cores to reserve.")]
Memory = Annotated[str | None, typer.Option(help="Memory to reserve and enforce, e.g. 8G.")]
Gpus = Annotated[int | None, typer.Option(help="Whole GPUs to reserve.")]
Inputs = Annotated[
    list[str] | None,
    typer.Option("--input", "-i", metavar=INPUT_FORMAT, help="A dataset at /data/NAME (or PATH), repeatable."),
]
IdleTimeout = Annotated[str, typer.Option("--idle-timeout", help="Stop after this long idle (e.g. 30m, 2h); 0: never.")]
Env = Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, repeatable.")]


def _problems(exc: ValidationError) -> str:
    problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return problems.replace("Value error, ", "")


def notebook_spec(
    name: str,
    runtime: str,
    cpus: float | None,
    memory: str | None,
    gpus: int | None,
    inputs: list[str] | None,
    idle_timeout: str,
    env: list[str] | None,
) -> NotebookSpec:
    """The spec the options say, or a usage error saying what is wrong."""
    try:
        resources = {k: v for k, v in {"cpus": cpus, "memory": memory, "gpus": gpus}.items() if v is not None}
        return NotebookSpec.model_validate(
            {
                "name": name,
                "runtime": parse_runtime(runtime),
                "resources": resources,
                "inputs": [parse_input(text) for text in inputs or []],
                "idle_timeout": idle_timeout,
                "env": parse_pairs(env, "--env"),
            }
        )
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    except ValidationError as exc:
        fail(_problems(exc), EXIT_USAGE)


@app.command()
def create(
    name: NotebookArg,
    runtime: Runtime = "python",
    cpus: Cpus = None,
    memory: Memory = None,
    gpus: Gpus = None,
    inputs: Inputs = None,
    idle_timeout: IdleTimeout = "1h",
    env: Env = None,
    wait: Wait = True,
    timeout: Timeout = 900.0,
) -> None:
    """Create a notebook and start it: JupyterLab in the runtime (with JupyterLab added), in a job of quota category
    dev, its home kept between starts. Prints its URL once it answers."""
    spec = notebook_spec(name, runtime, cpus, memory, gpus, inputs, idle_timeout, env)
    with connect() as client:
        notebook = client.create_notebook(spec)
        info(f"created notebook {notebook.name} ({notebook.id}); starting JupyterLab in job {notebook.job_id}")
        if wait:
            notebook = _wait(client, notebook.id, timeout)
    print(notebook.url)


@app.command()
def render(
    name: NotebookArg,
    runtime: Runtime = "python",
    cpus: Cpus = None,
    memory: Memory = None,
    gpus: Gpus = None,
    inputs: Inputs = None,
    idle_timeout: IdleTimeout = "1h",
    env: Env = None,
    namespace: Annotated[str | None, typer.Option(help="Namespace (default: KILN_KUBERNETES_NAMESPACE).")] = None,
    endpoint: Annotated[str, typer.Option(help="The Kiln API as pods reach it.")] = "http://kiln:8080",
) -> None:
    """Print the Kubernetes manifests one start of this notebook would be (YAML documents): its job's objects with
    JupyterLab on the pod's port 8888, a Service and a NetworkPolicy admitting only Kiln's server. No server needed:
    example ids, placeholder tokens, the image from the built-in catalog, the cluster's settings from
    KILN_KUBERNETES_*."""
    spec = notebook_spec(name, runtime, cpus, memory, gpus, inputs, idle_timeout, env)
    from kiln.backends.kubernetes.notebooks import render_notebook
    from kiln.backends.kubernetes.render import to_yaml
    from kiln.backends.kubernetes.settings import KubernetesSettings, kube_config
    from kiln.cli.render import EXAMPLE_JOB_ID, EXAMPLE_ORG_ID
    from kiln.domain.catalog import DEFAULT_CATALOG
    from kiln.errors import KilnError
    from kiln.usecases.notebooks import HOME_SYNC_SECONDS, job_spec

    try:
        settings = KubernetesSettings()
        cfg = kube_config(settings, **({"namespace": namespace} if namespace else {}))
    except ValueError as exc:
        fail(f"kubernetes settings: {exc}", EXIT_USAGE)
    try:
        entry = DEFAULT_CATALOG.resolve(spec.runtime.framework or "python", spec.runtime.version)
        job = job_spec(EXAMPLE_NOTEBOOK_ID, spec, entry.version, HOME_SYNC_SECONDS)
        objects = render_notebook(EXAMPLE_NOTEBOOK_ID, job, EXAMPLE_JOB_ID, EXAMPLE_ORG_ID, 1, cfg, endpoint=endpoint)
    except ValidationError as exc:
        fail(f"notebook: {_problems(exc)}", EXIT_USAGE)
    except KilnError as exc:
        fail(f"notebook: {exc.message}", EXIT_USAGE)
    typer.echo(to_yaml(objects), nl=False)


@app.command("list")
def list_notebooks(output: Output = OutputFormat.table) -> None:
    """Your organisation's notebooks."""
    with connect() as client:
        notebooks = client.list_notebooks()
    emit_list(notebooks, output, notebooks_table, "no notebooks")


@app.command()
def show(name: NotebookArg, output: Output = OutputFormat.table) -> None:
    """A notebook's state (and why), URL, runtime, resources, inputs and idle rule."""
    with connect() as client:
        notebook = client.get_notebook(name)
    if output is OutputFormat.json:
        emit_json(notebook.model_dump(mode="json"))
        return
    _detail(notebook)


@app.command("open")
def open_notebook(
    name: NotebookArg,
    browser: Annotated[bool, typer.Option("--browser/--no-browser", help="Open it in a web browser too.")] = True,
) -> None:
    """Print the notebook's URL (and open it in a browser: signed in to the console, it opens there)."""
    with connect() as client:
        notebook = client.get_notebook(name)
    if notebook.state is not NotebookState.RUNNING:
        info(f"notebook {notebook.name} is {notebook.state}{': ' + notebook.message if notebook.message else ''}")
    print(notebook.url)
    if browser:
        webbrowser.open(notebook.url)


@app.command()
def stop(name: NotebookArg) -> None:
    """Stop it (its home is saved first); `kiln notebooks start` brings it back."""
    with connect() as client:
        notebook = client.stop_notebook(name)
    info(f"notebook {notebook.name}: {notebook.state}")


@app.command()
def start(name: NotebookArg, wait: Wait = True, timeout: Timeout = 900.0) -> None:
    """Start a stopped notebook again, with its home."""
    with connect() as client:
        notebook = client.start_notebook(name)
        info(f"starting notebook {notebook.name} in job {notebook.job_id}")
        if wait:
            notebook = _wait(client, notebook.id, timeout)
    print(notebook.url)


@app.command()
def delete(
    name: NotebookArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Stop it and delete it with its home (its files: this cannot be undone)."""
    if not yes:
        if not sys.stdin.isatty():
            fail(f"deleting notebook {name} deletes its home and cannot be undone; pass --yes to confirm", EXIT_USAGE)
        typer.confirm(f"Delete notebook {name} and every file in its home? This cannot be undone", abort=True)
    with connect() as client:
        client.delete_notebook(name)
    info(f"deleted notebook {name}")
