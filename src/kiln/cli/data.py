"""``kiln data``: versioned datasets — put a file or directory, list, get (SHA-256 verified), remove."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from kiln.cli.common import Output, OutputFormat, connect, emit_json, emit_list, info, out
from kiln.cli.output import byte_progress, display_path, plural
from kiln.domain.quantities import format_memory

app = typer.Typer(
    help="Datasets: immutable numbered versions of a set of files, stored once per content.",
    no_args_is_help=True,
)

Workers = Annotated[int, typer.Option("--workers", "-j", min=1, max=32, help="Parts or files in flight at once.")]
PutWorkers = Annotated[
    int | None,
    typer.Option(
        "--workers",
        "-j",
        min=1,
        max=32,
        help="Files hashed and parts in flight at once (default: 8 parts straight to S3, else 4).",
        show_default=False,
    ),
]


def _rate(size: int, seconds: float) -> str:
    return f"{format_memory(int(size / seconds))}/s" if seconds > 0 and size else "-"


@app.command("put")
def put(
    local_path: Annotated[Path, typer.Argument(help="A file or a directory (links are refused).")],
    name: Annotated[str, typer.Argument(help="Dataset name: lowercase letters, digits and . _ -")],
    workers: PutWorkers = None,
    rehash: Annotated[
        bool, typer.Option("--rehash", help="Read every file again, whatever the hash cache holds.")
    ] = False,
    output: Output = OutputFormat.table,
) -> None:
    """Upload LOCAL_PATH as the next version of NAME. Only blobs the server lacks are sent, in parts; run the
    same command again after an interruption to send only what is left. Files unchanged since an earlier put
    (same inode, size and times) are not read again: their hashes come from hashes.sqlite in the client's state
    directory ($KILN_CLIENT_DIR, else $KILN_HOME, else ~/.kiln)."""
    if not local_path.exists() and not local_path.is_symlink():
        raise typer.BadParameter(f"{local_path} does not exist", param_hint="LOCAL_PATH")
    started = time.monotonic()
    sent = 0

    with connect() as client, byte_progress(f"uploading {name}") as (set_total, advance):

        def count(n: int) -> None:
            nonlocal sent
            sent += n
            advance(n)

        version = client.put_dataset(
            local_path, name, progress=count, on_total=set_total, workers=workers, rehash=rehash
        )
    elapsed = time.monotonic() - started
    if output is OutputFormat.json:
        emit_json(version.model_dump(mode="json"))
        return
    out.print(f"{version.name}@{version.version}", markup=False)
    info(
        f"{version.name}@{version.version}: {plural(version.files, 'file')}, {format_memory(version.size)}; "
        f"sent {format_memory(sent)} in {elapsed:.1f}s ({_rate(sent, elapsed)})"
    )


@app.command("list")
def list_datasets(
    name: Annotated[str | None, typer.Argument(help="A dataset: list its versions.")] = None,
    output: Output = OutputFormat.table,
) -> None:
    """List the organisation's datasets, or the versions of NAME."""
    from rich.table import Table

    with connect() as client:
        if name is None:
            datasets = client.datasets()

            def table(items: list) -> None:  # type: ignore[type-arg]
                t = Table(box=None, header_style="bold")
                for col in ("NAME", "LATEST", "VERSIONS", "FILES", "SIZE", "UPDATED"):
                    t.add_column(col)
                for d in items:
                    t.add_row(
                        d.name,
                        str(d.latest_version),
                        str(d.versions),
                        str(d.files),
                        format_memory(d.size),
                        d.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
                    )
                out.print(t)

            emit_list(datasets, output, table, "no datasets")
            return
        versions = client.dataset_versions(name)

        def vtable(items: list) -> None:  # type: ignore[type-arg]
            t = Table(box=None, header_style="bold")
            for col in ("VERSION", "FILES", "SIZE", "CREATED", "MANIFEST"):
                t.add_column(col)
            for v in items:
                t.add_row(
                    f"{v.name}@{v.version}",
                    str(v.files),
                    format_memory(v.size),
                    v.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                    v.manifest_sha256[:12],
                )
            out.print(t)

        emit_list(versions, output, vtable, f"dataset {name} has no versions")


@app.command("get")
def get(
    ref: Annotated[str, typer.Argument(help="NAME or NAME@VERSION (default: the latest version).")],
    dest: Annotated[Path, typer.Argument(help="Directory to write the files into.")],
    workers: Workers = 4,
    output: Output = OutputFormat.table,
) -> None:
    """Download a dataset version into DEST; every file's SHA-256 is verified before it takes its name."""
    started = time.monotonic()
    with connect() as client, byte_progress(f"downloading {ref}") as (set_total, advance):
        manifest = client.get_dataset(ref, dest, progress=advance, on_total=set_total, workers=workers)
    elapsed = time.monotonic() - started
    if output is OutputFormat.json:
        emit_json(manifest.model_dump(mode="json"))
        return
    info(
        f"{manifest.name}@{manifest.version}: {plural(manifest.files, 'file')} ({format_memory(manifest.size)}) "
        f"verified and written to {display_path(dest.resolve())} in {elapsed:.1f}s ({_rate(manifest.size, elapsed)})"
    )


@app.command("rm")
def rm(
    ref: Annotated[str, typer.Argument(help="NAME@VERSION (one version) or NAME (every version).")],
    output: Output = OutputFormat.table,
) -> None:
    """Remove a version, or a whole dataset; data no other version uses is deleted."""
    with connect() as client:
        removed = client.remove_dataset(ref)
    if output is OutputFormat.json:
        emit_json(removed.model_dump(mode="json"))
        return
    versions = ", ".join(f"{removed.name}@{v}" for v in removed.versions) or removed.name
    info(f"removed {versions}; freed {format_memory(removed.bytes_freed)} ({plural(removed.blobs_deleted, 'blob')})")
