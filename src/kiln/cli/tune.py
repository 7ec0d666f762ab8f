"""``kiln tune -f study.yaml``: package the code, start a hyperparameter tuning study, optionally follow its trials
to the end."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import BaseModel, ValidationError

from kiln.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, connect, fail, info, out
from kiln.cli.output import transfer_progress
from kiln.cli.run import pack_code
from kiln.cli.spec import SpecError, _field_path, load_spec_file
from kiln.cli.studies import best_detail, describe_end, trial_line
from kiln.domain.spec import JobSpec, Resources, RuntimeSpec
from kiln.domain.studies import EarlyStopping, Objective, ParameterSpec, StudySpec, StudyState

if TYPE_CHECKING:
    from kiln.domain.studies import StudyRead
    from kiln.sdk.client import Client
    from kiln.sdk.packaging import Bundle

TUNE_HELP = (
    "Start a hyperparameter tuning study: every trial is a job running the study's `trial` spec with the "
    "parameters a sampler picks, as {name} placeholders in its command, as KILN_PARAM_<NAME> and in the JSON file "
    "$KILN_PARAMS_FILE. See docs/tuning.md for the study spec.\n\n"
    "The code is --dir (default: the working directory, as kiln run packs it), honouring .gitignore and "
    ".kilnignore; the server checks the trial's job spec first and the code is uploaded only if it is accepted "
    "and missing.\n\n"
    "The study id is the first line on stdout (STUDY=$(kiln tune -f study.yaml | head -1)); with --follow each "
    "trial is printed as it ends, then the best one.\n\n"
    "Exit codes: 2 when the spec is invalid or the server refuses it; with --follow, 0 if the study succeeds, "
    "1 if it fails, 130 if it is stopped."
)

# Where an unknown key's "did you mean" looks: the model at that path of a study spec.
_MODELS: dict[tuple[str, ...], type[BaseModel]] = {
    (): StudySpec,
    ("objective",): Objective,
    ("early_stopping",): EarlyStopping,
    ("trial",): JobSpec,
    ("trial", "resources"): Resources,
    ("trial", "runtime"): RuntimeSpec,
}


def _model_at(path: tuple[str, ...]) -> type[BaseModel] | None:
    if len(path) == 2 and path[0] == "parameters":
        return ParameterSpec
    return _MODELS.get(path)


def _text_values(values: Any) -> Any:
    """YAML reads ``EPOCHS: 3`` as a number; a trial's environment values and labels are text (as in kiln.yaml)."""
    if not isinstance(values, dict):
        return values
    text = {True: "true", False: "false"}
    return {
        k: text[v] if isinstance(v, bool) else str(v) if isinstance(v, int | float) else v for k, v in values.items()
    }


def load_study_spec(file: Path, name: str | None = None) -> StudySpec:
    """The study spec in ``file`` (YAML), ``name`` replacing its name; SpecError naming the file and the fields."""
    data = load_spec_file(file)
    if name is not None:
        data["name"] = name
    trial = data.get("trial")
    if isinstance(trial, dict):
        data["trial"] = {**trial, **{k: _text_values(trial[k]) for k in ("env", "labels") if k in trial}}
    try:
        return StudySpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_study_error(exc, file)) from None


def format_study_error(exc: ValidationError, file: Path | None) -> str:
    """Every problem on a line of its own, named by its field's path (``parameters.lr: low: 2 is above high
    (1)``, ``trial.resources.cpus: ...``); an unknown key with the field it was probably meant to be."""
    lines: list[str] = []
    for error in exc.errors():
        path = _field_path(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and path:
            message = "unknown field"
            model = _model_at(path[:-1])
            close = difflib.get_close_matches(path[-1], list(model.model_fields), n=1) if model else []
            if close:
                message += f" (did you mean {'.'.join((*path[:-1], close[0]))!r}?)"
        line = f"  {'.'.join(path) or '(spec)'}: {message}"
        if line not in lines:
            lines.append(line)
    where = f" in {file}" if file is not None else ""
    return f"invalid study spec{where}:\n" + "\n".join(lines)


def check_and_upload(client: Client, spec: StudySpec, bundle: Bundle | None) -> None:
    """The server's dry run of the trial's job spec (runtime, resources, quota, permissions), then the bundle's
    upload if the server lacks it; a refusal exits 2 before anything was uploaded."""
    from kiln.errors import BadRequest, InvalidInput, RuntimeUnavailable

    try:
        checked = client.dry_run(spec.trial, bundle.sha256 if bundle else None)
    except (InvalidInput, BadRequest, RuntimeUnavailable) as exc:
        fail(f"the server refused the study's trial spec: {exc.message}", EXIT_USAGE)
    if bundle is None:
        return
    if checked.code_stored:
        info(f"code bundle {bundle.sha256[:12]} is on the server already")
    else:
        with transfer_progress("uploading code", bundle.size) as progress:
            client.upload_blob(bundle.path, bundle.sha256, progress)
        info(f"uploaded code bundle {bundle.sha256[:12]}")


def follow_study(client: Client, study: StudyRead) -> NoReturn:
    """Print each trial as it ends, then the best one; exit 0 if the study succeeded, 1 if it failed, 130 if it was
    stopped. Ctrl-C stops following (the study goes on) and exits 130."""
    from kiln.errors import NotFound
    from kiln.sdk.studies import parameter_names

    names = parameter_names([], study.spec)
    trials = client.follow_study(study.id)
    try:
        while True:
            try:
                trial = next(trials)
            except StopIteration as end:
                final: StudyRead = end.value
                break
            out.print(trial_line(trial, names), soft_wrap=True)
    except KeyboardInterrupt:
        info(f"\nstopped following; study {study.id} goes on (stop it with: kiln studies stop {study.id})")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    try:
        winner = client.best_trial(study.id)
    except NotFound:
        info("no trial succeeded")
    else:
        out.print("best trial:")
        best_detail(winner, names)
    info(describe_end(final))
    raise typer.Exit(final_exit_code(final))


def final_exit_code(study: StudyRead) -> int:
    if study.state is StudyState.SUCCEEDED:
        return 0
    return EXIT_INTERRUPTED if study.state is StudyState.STOPPED else EXIT_ERROR


def tune(
    file: Annotated[Path, typer.Option("--file", "-f", dir_okay=False, help="The study spec (study.yaml).")],
    name: Annotated[str | None, typer.Option(help="Display name (replaces the file's).")] = None,
    directory: Annotated[Path, typer.Option("--dir", exists=True, file_okay=False, help="The code to upload.")] = (
        Path(".")
    ),
    no_code: Annotated[bool, typer.Option("--no-code", help="Upload no code; trials run in an empty directory.")] = (
        False
    ),
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", help="Print each trial as it ends; exit 0 if the study succeeds, 1 if not, 130 if stopped."
        ),
    ] = False,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            metavar="KEY",
            help="Make running this command again harmless: a repeat with the same KEY and the same study (spec "
            "and code) within 24 h prints the study the first one started and starts none.",
        ),
    ] = None,
) -> None:
    from kiln.domain.idempotency import check_key
    from kiln.errors import BadRequest, InvalidInput
    from kiln.sdk.code_manifest import remember

    try:
        spec = load_study_spec(file, name)
        if idempotency_key is not None:
            check_key(idempotency_key)
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    except InvalidInput as exc:
        fail(f"--idempotency-key: {exc.message.removeprefix('Idempotency-Key: ')}", EXIT_USAGE)
    with connect() as client:
        bundle = None if no_code else pack_code(directory)
        try:
            check_and_upload(client, spec, bundle)
            try:
                study = client.submit_study(spec, bundle.sha256 if bundle else None, idempotency_key=idempotency_key)
            except (InvalidInput, BadRequest) as exc:
                fail(f"the server refused the study: {exc.message}", EXIT_USAGE)
        finally:
            if bundle is not None:
                bundle.path.unlink(missing_ok=True)
        if bundle is not None:
            remember(directory, bundle.digests)
        sys.stdout.write(study.id + "\n")
        sys.stdout.flush()
        info(
            f"started study {study.id} ({study.name}): {study.planned_trials} trials, "
            f"{spec.parallelism} at a time, {spec.algorithm}, early stopping {spec.early_stopping.type}"
        )
        if not follow:
            info(f"follow it with: kiln studies show {study.id}")
            return
        follow_study(client, study)
