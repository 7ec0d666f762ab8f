"""``kiln models``: the model registry — register a version from a job's outputs, list, show, versions, aliases
and removal."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from kiln.cli.common import EXIT_USAGE, Output, OutputFormat, connect, emit_json, emit_list, fail, info, out
from kiln.cli.output import fmt_time, plural
from kiln.domain import models as refs
from kiln.domain.quantities import format_memory

if TYPE_CHECKING:
    from kiln.domain.models import ModelRead, ModelSummary, ModelVersionRead

app = typer.Typer(
    help="The model registry: numbered, immutable versions of the models jobs trained, with their lineage and "
    "aliases (a job or a service reads one as NAME@VERSION or NAME@ALIAS).",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="A model name: lowercase letters, digits and . _ -")]
RefArg = Annotated[str, typer.Argument(help="NAME (the latest version), NAME@VERSION or NAME@ALIAS.")]
METRICS_SHOWN = 4  # metrics in a versions table row; `show NAME@V` lists them all


def parse_ref(ref: str, param: str = "REF") -> refs.ModelRef:
    """``NAME[@VERSION|ALIAS]`` as the server reads it; a usage error (exit 2) naming the argument otherwise."""
    try:
        return refs.parse_ref(ref)
    except refs.ModelRefError as exc:
        raise typer.BadParameter(str(exc), param_hint=param) from None


def metrics_text(metrics: dict[str, float], most: int | None = None) -> str:
    """``loss=0.1 val_acc=0.97`` (values to 6 significant digits), the first ``most`` of them and ``…``."""
    items = list(metrics.items())
    shown = items if most is None else items[:most]
    text = " ".join(f"{name}={value:.6g}" for name, value in shown)
    return text + (" …" if len(shown) < len(items) else "")


def _table(*columns: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in columns:
        table.add_column(name, overflow="fold")
    return table


def models_table(models: list[ModelSummary]) -> None:
    table = _table("NAME", "LATEST", "VERSIONS", "ALIASES", "SIZE", "UPDATED")
    for m in models:
        aliases = " ".join(f"{a}→{v}" for a, v in m.aliases.items()) or "-"
        latest = "-" if m.latest_version is None else str(m.latest_version)
        table.add_row(
            Text(m.name), latest, str(m.versions), Text(aliases), format_memory(m.size), fmt_time(m.updated_at)
        )
    out.print(table)


def versions_table(versions: list[ModelVersionRead]) -> None:
    table = _table("VERSION", "FRAMEWORK", "FILES", "SIZE", "ALIASES", "JOB", "METRICS", "CREATED")
    for v in versions:
        table.add_row(
            Text(v.ref),
            v.framework,
            str(v.file_count),
            format_memory(v.size),
            Text(" ".join(v.aliases) or "-"),
            Text(v.lineage.job_id or v.lineage.run_id or "-"),
            Text(metrics_text(v.lineage.metrics, METRICS_SHOWN) or "-"),
            fmt_time(v.created_at),
        )
    out.print(table)


def _details(rows: list[tuple[str, str | None]]) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in rows:
        grid.add_row(key, Text("-" if value in (None, "") else str(value)))
    out.print(grid)


def version_detail(v: ModelVersionRead) -> None:
    lineage = v.lineage
    trial = f"{lineage.study_id} trial {lineage.trial}" if lineage.study_id else None
    _details(
        [
            ("Version", v.ref),
            ("Framework", v.framework),
            ("Aliases", " ".join(v.aliases)),
            ("Description", v.description),
            ("Size", f"{format_memory(v.size)} in {plural(v.file_count, 'file')}"),
            (
                "Job",
                f"{lineage.job_id} ({lineage.job_name or '-'}, {lineage.job_state or '-'})" if lineage.job_id else None,
            ),
            ("Run", lineage.run_id),
            ("Logged model", lineage.logged_model_id),
            ("Flavor", v.flavor),
            ("Signature", json.dumps(v.signature.get("inputs")) if v.signature else None),
            ("From", v.source_path),
            ("Study", trial),
            ("Metrics", metrics_text(lineage.metrics)),
            ("Created", f"{fmt_time(v.created_at)} by {v.created_by}"),
        ]
    )
    if v.files:
        table = _table("FILE", "SIZE", "SHA256")
        for f in v.files:
            table.add_row(Text(f.path), format_memory(f.size), f.sha256[:16])
        out.print(table)


def model_detail(model: ModelRead) -> None:
    aliases = ", ".join(f"{a} → {v}" for a, v in model.aliases.items())
    _details(
        [
            ("Name", model.name),
            ("Latest", None if model.latest_version is None else f"{model.name}@{model.latest_version}"),
            ("Aliases", aliases),
            ("Size", format_memory(model.size)),
            ("Created", fmt_time(model.created_at)),
            ("Updated", fmt_time(model.updated_at)),
        ]
    )
    if model.items:
        out.print()
        versions_table(model.items)


REGISTER_OPTIONS = {
    "job_id": "--from-job",
    "run_id": "--from-run",
    "path": "--path",
    "description": "--description",
}


def check_register(job_id: str | None, run_id: str | None, path: str, description: str | None) -> None:
    """What the server would refuse in the options of ``register`` (a path outside the job's outputs, an empty
    job id, both or neither of --from-job and --from-run): one line naming the option, exit 2, before anything is
    sent."""
    from pydantic import ValidationError

    try:
        refs.ModelRegister(job_id=job_id, run_id=run_id, path=path, description=description)
    except ValidationError as exc:
        error = exc.errors()[0]
        if not error["loc"]:
            fail("name --from-job JOB or --from-run RUN (one of them)", EXIT_USAGE)
        option = REGISTER_OPTIONS.get(str(error["loc"][0]), "an option")
        message = str(error["msg"]).removeprefix("Value error, ")
        if not message.startswith("'"):
            message = f"{error.get('input')!r}: {message.lower()}"
        fail(f"{option} {message}", EXIT_USAGE)


@app.command()
def register(
    name: NameArg,
    from_job: Annotated[
        str | None, typer.Option("--from-job", "-j", help="The ended job whose outputs hold the model.")
    ] = None,
    from_run: Annotated[
        str | None,
        typer.Option(
            "--from-run",
            "-r",
            help="The run that logged it the MLflow way (mlflow.<flavor>.log_model); a job's run is its job id.",
        ),
    ] = None,
    path: Annotated[
        str | None,
        typer.Option(
            "--path",
            "-p",
            help="A file or directory of the job's outputs; with --from-run, the logged model's name or the run's "
            "artifact directory (default: model).",
        ),
    ] = None,
    framework: Annotated[
        str | None,
        typer.Option(
            "--framework", "-f", help="torch, onnx, sklearn or custom (default: what the files' suffixes say)."
        ),
    ] = None,
    description: Annotated[str | None, typer.Option("--description", "-d", help="A note kept with it.")] = None,
    output: Output = OutputFormat.table,
) -> None:
    """Register the next version of NAME from a job's output file or directory (--from-job), or from an MLflow model
    a run logged (--from-run: its MLmodel names the flavor a service serves it with, and the signature requests are
    checked against). The files are copied on the server (bytes it already holds are not stored again) with the
    job's or run's lineage. Prints NAME@VERSION."""
    try:
        refs.check_name(name)
    except refs.ModelRefError as exc:
        raise typer.BadParameter(str(exc), param_hint="NAME") from None
    if framework is not None and framework not in refs.FRAMEWORKS:
        raise typer.BadParameter(f"{framework!r}: one of {', '.join(refs.FRAMEWORKS)}", param_hint="--framework")
    if from_job is not None and path is None:
        fail("--from-job needs --path: the output file or directory that holds the model", EXIT_USAGE)
    path = path or "model"
    check_register(from_job, from_run, path, description)
    with connect() as client:
        if from_run is not None:
            version = client.register_model_from_run(name, from_run, path, description=description)
        else:
            assert from_job is not None  # check_register: one of the two
            version = client.register_model(name, from_job, path, framework=framework, description=description)
    if output is OutputFormat.json:
        emit_json(version.model_dump(mode="json"))
        return
    source = f"run {from_run}" if from_run is not None else f"job {from_job}"
    out.print(version.ref, markup=False)
    if version.already_registered:
        info(
            f"{version.ref} already holds these files ({path} of {source}, {version.framework}): "
            "no new version registered; use it"
        )
        return
    metrics = metrics_text(version.lineage.metrics, METRICS_SHOWN)
    flavor = f", MLflow flavor {version.flavor}" if version.flavor else ""
    info(
        f"{version.ref}: {plural(version.file_count, 'file')} ({format_memory(version.size)}, {version.framework}"
        f"{flavor}) from {path} of {source}" + (f"; {metrics}" if metrics else "")
    )


@app.command("list")
def list_models(
    run: Annotated[
        str | None, typer.Option("--run", help="Only the versions registered from this run (or job), oldest first.")
    ] = None,
    output: Output = OutputFormat.table,
) -> None:
    """List the organisation's models: latest version, aliases, size; with --run, the versions a run produced."""
    with connect() as client:
        if run is not None:
            versions = client.run_model_versions(run)
            emit_list(versions, output, versions_table, f"no model version was registered from run {run}")
            return
        models = client.list_models()
    emit_list(models, output, models_table, "no models (register one with kiln models register)")


@app.command()
def show(ref: RefArg, output: Output = OutputFormat.table) -> None:
    """Show a model (NAME: its aliases and versions) or one version (NAME@VERSION, NAME@ALIAS: its files and
    lineage)."""
    name, _ = parse_ref(ref)
    with connect() as client:
        if "@" in ref:
            found = client.model_version(ref)
            if output is OutputFormat.json:
                emit_json(found.model_dump(mode="json"))
            else:
                version_detail(found)
            return
        model = client.get_model(name)
    if output is OutputFormat.json:
        emit_json(model.model_dump(mode="json"))
    else:
        model_detail(model)


@app.command()
def versions(name: NameArg, output: Output = OutputFormat.table) -> None:
    """List a model's versions, oldest first: framework, files, aliases, the job and its final metrics."""
    with connect() as client:
        items = client.model_versions(name)
    emit_list(items, output, versions_table, f"model {name} has no versions")


@app.command()
def alias(
    ref: Annotated[str, typer.Argument(help="NAME@VERSION (or NAME@ALIAS: the version it names now).")],
    alias_name: Annotated[str, typer.Argument(metavar="ALIAS", help="e.g. production: lowercase, a letter first.")],
    remove: Annotated[bool, typer.Option("--remove", help="Remove ALIAS of the model instead.")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """Point ALIAS at a version (``kiln models alias digits@3 production``), creating or moving it; with
    ``--remove``, remove it (``kiln models alias digits production --remove``)."""
    name, version = parse_ref(ref)
    if remove:
        if "@" in ref:
            raise typer.BadParameter("with --remove, give the model's NAME alone", param_hint="REF")
    else:
        if "@" not in ref:
            raise typer.BadParameter("NAME@VERSION: which version the alias names", param_hint="REF")
        try:
            refs.check_alias(alias_name)
        except refs.ModelRefError as exc:
            raise typer.BadParameter(str(exc), param_hint="ALIAS") from None
    with connect() as client:
        if remove:
            result = client.delete_alias(name, alias_name)
        else:
            number = version if isinstance(version, int) else client.model_version(ref).version
            result = client.set_alias(name, alias_name, number)
    if output is OutputFormat.json:
        emit_json(result.model_dump(mode="json"))
        return
    verb = "removed" if remove else "now names"
    info(f"{result.name}@{result.alias} {verb} {result.name}@{result.version}")


@app.command()
def delete(
    ref: Annotated[str, typer.Argument(help="NAME@VERSION (one version, by number) or NAME (every version).")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """Remove a version (and the aliases naming it) or a whole model; data nothing else holds is deleted.
    Refused while a service serves it or a job that has not ended reads it."""
    name, version = parse_ref(ref)
    if "@" in ref and not isinstance(version, int):
        raise typer.BadParameter("remove a version by its number (NAME@3), not an alias or latest", param_hint="REF")
    what = f"version {name}@{version}" if isinstance(version, int) else f"model {name} with every version"
    if not yes:
        if not sys.stdin.isatty():
            fail(f"removing {what} cannot be undone; pass --yes to confirm", EXIT_USAGE)
        typer.confirm(f"Remove {what}? This cannot be undone", abort=True)
    with connect() as client:
        removed = client.delete_model_version(name, version) if isinstance(version, int) else client.delete_model(name)
    if output is OutputFormat.json:
        emit_json(removed.model_dump(mode="json"))
        return
    gone = ", ".join(f"{removed.name}@{v}" for v in removed.versions) or removed.name
    dropped = f", aliases {', '.join(removed.aliases)}" if removed.aliases else ""
    info(f"removed {gone}{dropped}; freed {format_memory(removed.bytes_freed)}")
