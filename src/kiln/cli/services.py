"""``kiln serve -f service.yaml``, ``kiln predict NAME -d @input.json`` and ``kiln services``: list, show, update,
scale, logs, delete, token and render of model services; how a service and its replicas are shown."""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, NoReturn

import typer
from pydantic import BaseModel, ValidationError
from rich import box
from rich.table import Table
from rich.text import Text

from kiln.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Output,
    OutputFormat,
    connect,
    emit_json,
    emit_list,
    fail,
    info,
    out,
)
from kiln.cli.output import fmt_time, plural, state_text
from kiln.cli.services_canary import (
    canary_text,
    events_text,
    rollout_policy,
    shadow_text,
    traffic_text,
    wait_canary,
)
from kiln.cli.spec import SpecError, _field_path, load_spec_file
from kiln.domain.serving import (
    Autoscale,
    Batching,
    InputSchema,
    PredictorSpec,
    PredictRequest,
    ReplicaState,
    ServiceSpec,
    ServiceState,
)
from kiln.domain.spec import Resources, RuntimeSpec

if TYPE_CHECKING:
    from kiln.domain.serving import ServiceRead
    from kiln.sdk.client import Client

app = typer.Typer(
    help="Inspect, change and delete model services (start one with kiln serve, call it with kiln predict).",
    no_args_is_help=True,
)

ServiceArg = Annotated[str, typer.Argument(help="The service's name.")]
Wait = Annotated[bool, typer.Option("--wait", help="Wait until the change is live; exit 1 if a replica fails.")]
Timeout = Annotated[float, typer.Option(min=1, help="Seconds --wait waits at most.")]

SERVICE_STYLES = {
    ServiceState.DEPLOYING: "cyan",
    ServiceState.READY: "green",
    ServiceState.UPDATING: "blue",
    ServiceState.DEGRADED: "red",
    ServiceState.IDLE: "dim",
    ServiceState.DELETING: "magenta",
}
REPLICA_STYLES = {
    ReplicaState.STARTING: "cyan",
    ReplicaState.READY: "green",
    ReplicaState.DRAINING: "yellow",
    ReplicaState.FAILED: "red",
    ReplicaState.STOPPED: "magenta",
}
# Where an unknown key's "did you mean" looks: the model at that path of a service spec.
_MODELS: dict[tuple[str, ...], type[BaseModel]] = {
    (): ServiceSpec,
    ("predictor",): PredictorSpec,
    ("predictor", "input_schema"): InputSchema,
    ("autoscale",): Autoscale,
    ("batching",): Batching,
    ("resources",): Resources,
    ("runtime",): RuntimeSpec,
}
DATA_FORMS = '{"inputs": [...], "parameters": {...}} or a JSON list of instances'


# -- reading service.yaml and -d ----------------------------------------------------------------------------------


def load_service_spec(file: Path, name: str | None = None) -> ServiceSpec:
    """The service spec in ``file`` (YAML), ``name`` replacing its name; SpecError naming the file and the fields."""
    data = load_spec_file(file)
    if name is not None:
        data["name"] = name
    try:
        return ServiceSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_service_error(exc, file)) from None


def _field_names(model: type[BaseModel]) -> list[str]:
    return [field.alias or key for key, field in model.model_fields.items()]  # class_ is `class` in YAML


def format_service_error(exc: ValidationError, file: Path | None) -> str:
    """Every problem on a line of its own, named by its field's path (``autoscale: min: 3 is above max (2)``,
    ``predictor.input_schema.shape: ...``); an unknown key with the field it was probably meant to be."""
    lines: list[str] = []
    for error in exc.errors():
        path = _field_path(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and path:
            message = "unknown field"
            model = _MODELS.get(path[:-1])
            close = difflib.get_close_matches(path[-1], _field_names(model), n=1) if model else []
            if close:
                message += f" (did you mean {'.'.join((*path[:-1], close[0]))!r}?)"
        line = f"  {'.'.join(path) or '(spec)'}: {message}"
        if line not in lines:
            lines.append(line)
    where = f" in {file}" if file is not None else ""
    return f"invalid service spec{where}:\n" + "\n".join(lines)


def read_predict_data(data: str, stdin: IO[str] | None = None) -> PredictRequest:
    """``-d``: inline JSON, ``@FILE`` or ``@-`` (stdin); an object ``{"inputs": [...], "parameters": {...}}`` or a
    bare list of instances. SpecError naming ``-d`` (and the file, and the field) otherwise."""
    where = "-d"
    text = data
    if data.startswith("@"):
        source = data[1:]
        where = f"-d {data}"
        if not source:
            raise SpecError("-d @: give a file name after @ (or @- for stdin)")
        if source == "-":
            text = (stdin or sys.stdin).read()
        else:
            try:
                text = Path(source).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise SpecError(f"{where}: cannot read {source}: {reason}") from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise SpecError(f"{where}: not valid JSON: {exc}") from None
    if isinstance(value, list):
        value = {"inputs": value}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected {DATA_FORMS}, got {type(value).__name__}")
    try:
        return PredictRequest.model_validate(value)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            path = ".".join(_field_path(error["loc"])) or "(body)"
            message = str(error["msg"]).removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = "unknown field (a request has inputs and parameters)"
            problems.append(f"{path}: {message}")
        raise SpecError(f"{where}: " + "; ".join(problems)) from None


# -- rendering ----------------------------------------------------------------------------------------------------


def service_state_text(state: ServiceState) -> Text:
    return Text(state.value, style=SERVICE_STYLES.get(state, ""))


def replica_state_text(state: ReplicaState) -> Text:
    return Text(state.value, style=REPLICA_STYLES.get(state, ""))


def replicas_wanted(service: ServiceRead) -> str:
    """``2/2``, or with autoscale ``1/1 (autoscale 0-4)``: ready of desired, and the range the load moves it in."""
    text = f"{service.ready_replicas}/{service.desired_replicas}"
    scale = service.spec.autoscale
    return text + (f" (autoscale {scale.min}-{scale.max})" if scale is not None else "")


def predictor_text(spec: ServiceSpec) -> str:
    """``sklearn (predict_proba)``, ``custom predictor:Model``, ``torchscript model.pt``."""
    predictor = spec.predictor
    parts: list[str] = [predictor.type]
    if predictor.class_:
        parts.append(predictor.class_)
    if predictor.file:
        parts.append(predictor.file)
    if predictor.type == "sklearn" and predictor.method != "predict":
        parts.append(f"({predictor.method})")
    return " ".join(parts)


def _table(*columns: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in columns:
        table.add_column(name, overflow="fold")
    return table


def services_table(services: list[ServiceRead]) -> None:
    table = _table("NAME", "STATE", "MODEL", "REPLICAS", "PREDICTOR", "REVISION", "CREATED")
    table.columns[0].no_wrap = True
    for service in services:
        table.add_row(
            Text(service.name),
            service_state_text(service.state),
            f"{service.model_name}@{service.model_version}",
            replicas_wanted(service),
            predictor_text(service.spec),
            str(service.revision),
            fmt_time(service.created_at),
        )
    out.print(table)


def replicas_table(service: ServiceRead) -> None:
    """One row per replica: its state, job (and the job's state), the model version it serves, its revision and
    the requests in flight; a message (why it failed) when it has one."""
    table = _table("REPLICA", "STATE", "JOB", "JOB STATE", "MODEL", "REVISION", "IN-FLIGHT", "READY AT", "MESSAGE")
    table.columns[0].no_wrap = True
    for replica in service.replicas:
        table.add_row(
            Text(replica.id),
            replica_state_text(replica.state),
            Text(replica.job_id or "-"),
            state_text(replica.job_state),
            f"{service.model_name}@{replica.model_version}",
            str(replica.revision),
            str(replica.in_flight),
            fmt_time(replica.ready_at),
            Text(replica.message or "-", style="" if replica.message else "dim"),
        )
    out.print(table)


def _details(rows: list[tuple[str, str | Text | None]]) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in rows:
        grid.add_row(key, value if isinstance(value, Text) else Text("-" if value in (None, "") else str(value)))
    out.print(grid)


def service_detail(service: ServiceRead) -> None:
    spec = service.spec
    batching = None
    if spec.batching is not None:
        batching = f"up to {spec.batching.max_batch_size}, waiting at most {spec.batching.max_latency_ms:g} ms"
    scale = spec.autoscale
    autoscale = None
    if scale is not None:
        autoscale = f"{scale.min}-{scale.max} replicas, {scale.target_concurrency:g} requests in flight each"
        if scale.min == 0:
            autoscale += f", to zero after {scale.idle_seconds:g}s idle"
    _details(
        [
            ("name", service.name),
            ("id", service.id),
            ("state", service_state_text(service.state)),
            ("message", service.message),
            ("model", f"{service.model_name}@{service.model_version} ({spec.model})"),
            ("canary", canary_text(service)),
            ("traffic", traffic_text(service)),
            ("rollout", events_text(service)),
            ("shadow", shadow_text(service)),
            ("predictor", predictor_text(spec)),
            ("replicas", replicas_wanted(service)),
            ("autoscale", autoscale),
            ("batching", batching),
            ("runtime", spec.runtime.label),
            ("endpoint", service.endpoint),
            ("revision", str(service.revision)),
            ("created", fmt_time(service.created_at)),
            ("updated", fmt_time(service.updated_at)),
        ]
    )


def describe_failure(service: ServiceRead, revision: int | None = None) -> str:
    """Why a service is not serving as wanted: its state and message, then each failed replica's message (those
    of ``revision`` or later, if given) that the service's message does not already name."""
    text = f"service {service.name} {service.state}"
    if service.message:
        text += f": {service.message}"
    failed = [
        r
        for r in service.replicas
        if r.state is ReplicaState.FAILED
        and r.message
        and (revision is None or r.revision >= revision)
        and r.id not in (service.message or "")
    ]
    for replica in failed:
        text += f"\n  replica {replica.id} ({replica.job_id or 'no job'}): {replica.message}"
    return text


# -- commands -----------------------------------------------------------------------------------------------------


def wait_live(client: Client, service: ServiceRead, timeout: float, revision: int | None = None) -> NoReturn:
    """Wait until the service settles (READY, or IDLE at zero replicas; with ``revision``, every replica of it),
    print its replicas, exit 0; exit 1 with each failed replica's error if it turns DEGRADED or a replica of the
    new revision fails before it was ready, 1 on timeout, 130 on Ctrl-C (the service goes on)."""
    from kiln.sdk.services import settled

    wanted = ServiceState.IDLE if service.desired_replicas == 0 else ServiceState.READY
    try:
        final = client.wait_service(service.name, wanted, timeout, revision=revision)
    except KeyboardInterrupt:
        info(f"\nstopped waiting; service {service.name} goes on (see it with: kiln services show {service.name})")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except TimeoutError as exc:
        fail(str(exc))
    if final.replicas:
        replicas_table(final)
    if not settled(final, wanted, revision):
        if revision is not None and final.state is ServiceState.UPDATING:
            info("the old replicas keep answering while Kiln starts the new one again (with a growing back-off)")
        fail(describe_failure(final, revision))
    info(f"service {final.name} {final.state}: {final.model_name}@{final.model_version}, {replicas_wanted(final)}")
    raise typer.Exit(0)


def serve(
    file: Annotated[Path, typer.Option("--file", "-f", dir_okay=False, help="The service spec (service.yaml).")],
    name: Annotated[str | None, typer.Option(help="The service's name (replaces the file's).")] = None,
    directory: Annotated[
        Path, typer.Option("--dir", exists=True, file_okay=False, help="A custom predictor's code.")
    ] = Path("."),
    wait: Wait = False,
    timeout: Timeout = 600.0,
) -> None:
    """Serve a registered model: replicas of its predictor answer kiln predict (and POST
    /api/v1/services/NAME/predict). See docs/serving.md for the service spec.

    A custom predictor's class comes from --dir (default: the working directory, packed as kiln run packs it,
    uploaded only if the server lacks it); a built-in one (torchscript, torch-export, onnx, sklearn) needs no code.

    The service's name is the first line on stdout. With --wait: until every replica is ready (exit 0), or one
    failed, e.g. its model did not load (exit 1, with the replica's error)."""
    from kiln.cli.output import transfer_progress
    from kiln.cli.run import pack_code
    from kiln.errors import BadRequest, InvalidInput
    from kiln.sdk.code_manifest import remember

    try:
        spec = load_service_spec(file, name)
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    with connect() as client:
        bundle = pack_code(directory) if spec.predictor.type == "custom" else None
        try:
            if bundle is not None:
                with transfer_progress("uploading code", bundle.size) as progress:
                    client.upload_blob(bundle.path, bundle.sha256, progress)
            try:
                service = client.submit_service(spec, bundle.sha256 if bundle else None)
            except (InvalidInput, BadRequest) as exc:
                fail(f"the server refused the service: {exc.message}", EXIT_USAGE)
        finally:
            if bundle is not None:
                bundle.path.unlink(missing_ok=True)
        if bundle is not None:
            remember(directory, bundle.digests)
        sys.stdout.write(service.name + "\n")
        sys.stdout.flush()
        info(
            f"deploying service {service.name}: {service.model_name}@{service.model_version}, "
            f"{predictor_text(spec)}, {plural(service.desired_replicas, 'replica')}"
        )
        if not wait:
            info(f"see it with: kiln services show {service.name}; call it with: kiln predict {service.name} -d ...")
            return
        wait_live(client, service, timeout)


def predict(
    name: ServiceArg,
    data: Annotated[
        str,
        typer.Option(
            "--data", "-d", help='The request: JSON inline, @FILE or @- (stdin); {"inputs": [...]} or a list.'
        ),
    ],
    full: Annotated[bool, typer.Option("--full", help="Print the whole answer: outputs and model.")] = False,
) -> None:
    """Call a service: print its outputs (one per instance) as JSON on stdout; the model version that answered on
    stderr. A refused instance is reported by its index (inputs[3]: ...)."""
    try:
        request = read_predict_data(data)
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    with connect() as client:
        reply = client.predict(name, request.inputs, request.parameters)
    if full:
        emit_json(reply.model_dump(mode="json"))
        return
    sys.stdout.write(json.dumps(reply.outputs) + "\n")
    sys.stdout.flush()
    info(f"{plural(len(reply.outputs), 'output')} from {reply.model}")


@app.command("list")
def list_services(output: Output = OutputFormat.table) -> None:
    """List your organisation's services."""
    with connect() as client:
        services = client.list_services()
    if output is OutputFormat.json:  # as the API writes it: a custom predictor's `class` by that name
        emit_json([service.model_dump(mode="json", by_alias=True) for service in services])
        return
    emit_list(services, output, services_table, "no services")


@app.command()
def show(name: ServiceArg, output: Output = OutputFormat.table) -> None:
    """A service's state, model, predictor and endpoint, then its replicas: state, job, model version, in-flight."""
    with connect() as client:
        service = client.get_service(name)
    if output is OutputFormat.json:
        emit_json(service.model_dump(mode="json", by_alias=True))
        return
    service_detail(service)
    out.print()
    if service.replicas:
        replicas_table(service)
    else:
        info("no replicas")


@app.command()
def update(
    name: ServiceArg,
    model: Annotated[str | None, typer.Option("--model", help="NAME@VERSION or NAME@ALIAS to roll out.")] = None,
    canary: Annotated[
        int | None, typer.Option("--canary", min=0, max=100, help="Run --model as a canary with this % of predicts.")
    ] = None,
    canary_replicas: Annotated[int | None, typer.Option("--canary-replicas", min=1, help="The canary's.")] = None,
    max_error_rate: Annotated[
        float | None, typer.Option("--max-error-rate", min=0.0, max=1.0, help="Roll the canary back above it (0-1).")
    ] = None,
    max_p99: Annotated[
        float | None, typer.Option("--max-p99", min=0.0, help="Roll the canary back when its p99 (ms) is above it.")
    ] = None,
    min_requests: Annotated[
        int | None, typer.Option("--min-requests", min=1, help="Canary predicts before a verdict (default 100).")
    ] = None,
    steps: Annotated[
        str | None, typer.Option("--steps", help="Shares to advance through, such as 10,50,100 (100 promotes).")
    ] = None,
    step_wait: Annotated[
        float | None, typer.Option("--step-wait", min=0.0, help="Seconds at a share before the next (default 60).")
    ] = None,
    shadow: Annotated[
        str | None,
        typer.Option("--shadow", help="NAME@VERSION sent a copy of the predicts (answers compared, never returned)."),
    ] = None,
    end_shadow: Annotated[bool, typer.Option("--end-shadow", help="Stop sending copies to the shadow.")] = False,
    wait: Wait = False,
    timeout: Timeout = 600.0,
) -> None:
    """Roll out another model version, one replica at a time: a new replica is ready before an old one drains, so
    no request is lost. A new replica that fails (its model does not load) is started again with a growing
    back-off while the old ones keep answering; --wait then exits 1 with its error. With --canary PERCENT the
    version runs beside the stable one with that share of the predicts instead (then promote or rollback);
    --canary alone changes a running canary's share. A rollout policy (--max-error-rate, --max-p99, --min-requests,
    --steps, --step-wait) advances the canary through its steps while it stays within its bounds, promotes it at 100
    and rolls it back on its own when it breaks one."""
    from kiln.domain.serving import parse_model_ref

    policy = rollout_policy(max_error_rate, max_p99, min_requests, steps, step_wait)
    if shadow is not None or end_shadow:
        with connect() as client:
            service = client.update_service(name, shadow="" if end_shadow else shadow)
        info(f"service {service.name}: " + (f"shadow {shadow_text(service)}" if service.shadow else "no shadow"))
        return
    if model is None and canary is None and canary_replicas is None and policy is None:
        fail("give --model, --canary, --canary-replicas or a rollout policy", EXIT_USAGE)
    try:
        if model is not None:
            parse_model_ref(model)
    except ValueError as exc:
        fail(f"--model: {exc}", EXIT_USAGE)
    with connect() as client:
        if canary is not None or canary_replicas is not None or policy is not None:
            service = client.update_service(
                name, model=model, canary=canary, canary_replicas=canary_replicas, rollout=policy
            )
            info(f"service {service.name}: canary {canary_text(service)}")
            if wait:
                wait_canary(client, service, timeout, replicas_table)
        else:
            service = client.update_service(name, model=model)
            info(f"rolling out {model} to service {service.name} (revision {service.revision})")
        if wait:
            wait_live(client, service, timeout, revision=service.revision)


@app.command()
def promote(name: ServiceArg, wait: Wait = False, timeout: Timeout = 600.0) -> None:
    """Make the canary the stable version: its replicas go on answering and take every predict, the old version's
    are rolled over one at a time (no request is dropped)."""
    with connect() as client:
        service = client.promote_service(name)
        info(f"promoted: service {service.name} serves {service.model_name}@{service.model_version}")
        if wait:
            wait_live(client, service, timeout, revision=service.revision)


@app.command()
def rollback(name: ServiceArg) -> None:
    """End the canary: predicts go to the stable version only, and the canary's replicas drain."""
    with connect() as client:
        service = client.rollback_service(name)
        info(f"rolled back: service {service.name} serves {service.model_name}@{service.model_version} only")


@app.command()
def scale(
    name: ServiceArg,
    replicas: Annotated[int, typer.Argument(min=0, help="How many replicas (0: none until scaled up).")],
    wait: Wait = False,
    timeout: Timeout = 600.0,
) -> None:
    """Set the number of replicas (a service with autoscale scales itself)."""
    with connect() as client:
        service = client.scale_service(name, replicas)
        info(f"scaling service {service.name} to {plural(replicas, 'replica')}")
        if wait:
            wait_live(client, service, timeout)


@app.command()
def logs(
    name: ServiceArg,
    replica: Annotated[str | None, typer.Option("--replica", help="Only this replica's (its id in show).")] = None,
) -> None:
    """A replica's log (the newest replica's unless --replica names one): what its predictor printed, and Kiln's
    lines about it."""
    with connect() as client:
        lines = client.service_logs(name, replica)
    for line in lines:
        out.print(Text(str(line)), soft_wrap=True)


@app.command()
def delete(
    name: ServiceArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete a service: its replicas stop and its tokens stop working (the model stays registered)."""
    if not yes:
        if not sys.stdin.isatty():
            fail(f"deleting service {name} stops it answering; pass --yes to confirm", EXIT_USAGE)
        typer.confirm(f"Delete service {name}? Its callers get errors from now on", abort=True)
    with connect() as client:
        client.delete_service(name)
    info(f"deleted service {name}")


@app.command()
def token(name: ServiceArg) -> None:
    """A new token that can call this service's predict and nothing else, for an application. It is printed once
    (on stdout); send it as 'Authorization: Bearer TOKEN'."""
    with connect() as client:
        created = client.service_token(name)
        url = f"{client.endpoint.rstrip('/')}/api/v1/services/{name}/predict"
    if created.token is None:
        fail(f"the server sent no secret for token {created.id}", EXIT_ERROR)
    sys.stdout.write(created.token + "\n")
    sys.stdout.flush()
    info(f"token {created.id} for service {created.service}: shown this once, keep it secret")
    info(f'call it with: curl -H "Authorization: Bearer $TOKEN" -d \'{{"inputs": [...]}}\' {url}')


@app.command()
def render(
    file: Annotated[Path, typer.Option("--file", "-f", dir_okay=False, help="The service spec (service.yaml).")],
    code_sha256: Annotated[str | None, typer.Option(help="A custom predictor's code bundle.")] = None,
) -> None:
    """Print the Kubernetes objects a service spec becomes (YAML): a Secret, a ConfigMap, a Deployment, a Service,
    and with autoscale a HorizontalPodAutoscaler. The server renders them (it resolves the model version); nothing
    is created."""
    from kiln.backends.kubernetes.render import to_yaml
    from kiln.errors import BadRequest, InvalidInput

    try:
        spec = load_service_spec(file)
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    with connect() as client:
        try:
            manifests = client.render_service(spec, code_sha256)
        except (InvalidInput, BadRequest) as exc:
            fail(f"the server refused the service: {exc.message}", EXIT_USAGE)
    typer.echo(to_yaml(manifests), nl=False)
