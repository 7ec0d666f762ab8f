"""``kiln runtimes``: the catalog of managed runtimes, installing one ahead of first use, and following that build."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from kiln.cli.common import EXIT_INTERRUPTED, Output, OutputFormat, connect, emit_json, err, fail, info, out
from kiln.cli.logs import print_log_lines
from kiln.cli.output import runtimes_table

if TYPE_CHECKING:
    from kiln.domain.runtime_builds import RuntimeDetail
    from kiln.sdk.client import Client

app = typer.Typer(help="The runtime catalog (managed Python environments).", no_args_is_help=True)

NameArg = Annotated[str, typer.Argument(help="A runtime, e.g. pytorch-2.13, or a framework (its default version).")]
TAIL_LINES = 20  # of a failed build's log, printed with the error
POLL_SECONDS = 1.0


@app.command("list")
def list_runtimes(output: Output = OutputFormat.table) -> None:
    """Every catalog runtime and whether it is installed on the server."""
    with connect() as client:
        items = client.runtimes()
    if output is OutputFormat.json:
        emit_json([rt.model_dump(mode="json") for rt in items])
    else:
        runtimes_table(items)


def _detail_rows(runtime: RuntimeDetail) -> None:
    rows: list[tuple[str, object]] = [
        ("name", runtime.name),
        ("status", runtime.status),
        ("packages", " ".join(runtime.packages) or "none"),
        ("image", runtime.image or "-"),
    ]
    if runtime.path:
        rows.append(("path", runtime.path))
    if runtime.message:
        rows.append(("message", runtime.message))
    build = runtime.build
    if build is not None:
        rows.append(("build", f"{build.id}: {build.state}" + (f" ({build.phase})" if build.state == "running" else "")))
        rows.append(("started", build.started_at.strftime("%Y-%m-%d %H:%M:%S")))
        if build.finished_at:
            took = (build.finished_at - build.started_at).total_seconds()
            rows.append(("finished", f"{build.finished_at:%Y-%m-%d %H:%M:%S} ({took:.0f}s)"))
        if build.message:
            rows.append(("build message", build.message))
    for key, value in rows:
        out.print(Text(f"{key + ':':<15}{value}"))


@app.command()
def show(name: NameArg, output: Output = OutputFormat.table) -> None:
    """A runtime: its status, packages, image and latest build (started with `kiln runtimes install`)."""
    with connect() as client:
        runtime = client.runtime(name)
    if output is OutputFormat.json:
        emit_json(runtime.model_dump(mode="json"))
    else:
        _detail_rows(runtime)


@app.command()
def log(
    name: NameArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the build ends.")] = False,
) -> None:
    r"""Print the log of a runtime's latest build: pip's output on stdout, Kiln's own lines (\[kiln] ...) on stderr."""
    with connect() as client:
        _print_log(client, name, follow)


def _print_log(client: Client, name: str, follow: bool) -> None:
    try:
        print_log_lines(client.runtime_log_lines(name, follow=follow, poll=POLL_SECONDS))
    except KeyboardInterrupt:
        info(f"\nstopped following; the build goes on (kiln runtimes show {name})")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _status_line(runtime: RuntimeDetail) -> str:
    build = runtime.build
    if build is None or build.state != "running":
        return f"{runtime.name}: {runtime.message or runtime.status}"
    started = time.time() - build.started_at.timestamp()
    last = f": {build.message}" if build.message else ""
    return f"building {runtime.name} ({build.phase}, {started:.0f}s){last}"


def _wait(client: Client, runtime: RuntimeDetail, build_id: str | None) -> RuntimeDetail:
    """Show the build's phase and last log line on a status line until it ends."""
    try:
        with err.status(_status_line(runtime)) as status:
            return client.wait_runtime(
                runtime.name,
                build_id=build_id,
                poll=POLL_SECONDS,
                progress=lambda detail: status.update(Text(_status_line(detail))),
            )
    except KeyboardInterrupt:
        info(f"\nstopped waiting; the build goes on (kiln runtimes show {runtime.name})")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _failed(client: Client, runtime: RuntimeDetail) -> None:
    """The tail of the failed build's log on stderr."""
    lines = [line for line in client.runtime_log_lines(runtime.name) if line][-TAIL_LINES:]
    if lines:
        info(f"the last {len(lines)} lines of the build log (all of it: kiln runtimes log {runtime.name}):")
        for line in lines:
            err.print(Text("  " + line.split(" ", 2)[-1]), soft_wrap=True)


@app.command()
def install(
    framework: Annotated[str, typer.Argument(help="e.g. pytorch, tensorflow, jax, xgboost, sklearn, python.")],
    version: Annotated[str | None, typer.Option("--version", "-v", help="Default: the catalog's default.")] = None,
    wait: Annotated[
        bool,
        typer.Option("--wait/--no-wait", help="Show the build's progress until it ends, or return at once."),
    ] = True,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Print the whole build log as it grows.")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """Build a runtime on the server ahead of its first use (platform admins only). Shows the build's progress
    until it ends; exits 1 with the end of its log when it fails."""
    with connect() as client:
        runtime = client.install_runtime(framework, version)
        build = runtime.build
        ours = build.id if build is not None and build.state == "running" else None
        if runtime.status == "installed" and ours is None:
            if output is OutputFormat.json:
                emit_json(runtime.model_dump(mode="json"))
            else:
                info(f"runtime {runtime.name} is installed")
            return
        if not wait:
            if output is OutputFormat.json:
                emit_json(runtime.model_dump(mode="json"))
            else:
                info(f"building runtime {runtime.name}; follow it with: kiln runtimes log {runtime.name} --follow")
            return
        if follow and ours is not None:
            _print_log(client, runtime.name, follow=True)
        runtime = _wait(client, runtime, ours)
        build = runtime.build
        ours_failed = build is not None and build.id == ours and build.state == "failed"
        ok = runtime.status == "installed" and not ours_failed
        if ours_failed and not follow:
            _failed(client, runtime)
    if output is OutputFormat.json:
        emit_json(runtime.model_dump(mode="json"))
    if not ok:
        message = build.message if ours_failed and build is not None else runtime.message or runtime.status
        fail(f"runtime {runtime.name} failed to build: {message}")
    if output is not OutputFormat.json:
        took = ""
        if build is not None and build.id == ours and build.finished_at is not None:
            took = f" in {(build.finished_at - build.started_at).total_seconds():.0f}s"
        info(f"runtime {runtime.name} is installed{took}")
