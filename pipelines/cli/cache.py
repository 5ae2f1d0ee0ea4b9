"""The cache tier on the command line: ``heteroflow prewarm SOURCE`` and ``heteroflow cache status [DATASET]``.

Registered in :mod:`heteroflow.pipelines.cli.main` with::

    from heteroflow.pipelines.cli.cache import cache_app, prewarm_command
    app.command("prewarm")(prewarm_command)
    app.add_typer(cache_app, name="cache")

Errors print one line that names the path or field and what to do; a user error (a bad source, option or
cache URI) exits 2, any other failure (an unreachable source, a full disk, a damaged cache) exits 1.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from heteroflow.cache.progress import format_bytes  # stdlib only: the CLI's start stays light
from heteroflow.pipelines.cli.common import whole_cells

__all__ = ["cache_app", "prewarm_command", "status_command"]

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
cache_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Inspect the cache tier.")


def _fail(exc: BaseException) -> None:
    """One line on stderr; exit 2 for a user error (bad input, a path the user gave), 1 for anything else."""
    from heteroflow.cache.errors import HeteroflowError
    from heteroflow.cache.redact import redact_url

    if isinstance(exc, OSError) and exc.filename and not isinstance(exc, HeteroflowError):
        text, code = f"{exc.filename}: {exc.strerror or exc}", 2
    else:
        text, code = str(exc), 2 if isinstance(exc, ValueError) else 1
    err_console.print(f"[bold red]error:[/] {escape(redact_url(text))}", highlight=False)
    raise typer.Exit(code=code)


def prewarm_command(
    source: Annotated[str, typer.Argument(help="Data set: a local folder or file, or an fsspec URL (s3://, gs://, http(s)://...).")],
    cache: Annotated[
        str,
        typer.Option("--cache", help="Cache tier: a folder, alluxio2://PROXY:PORT or alluxio3://WORKER:PORT. Default: the local cache under HETEROFLOW_HOME."),
    ] = "",
    workers: Annotated[int, typer.Option("--workers", help="Copy threads; 0 sizes them to the work.")] = 0,
    verify: Annotated[str, typer.Option("--verify", help="How cached files are checked before reuse: size, stat or sha256.")] = "stat",
    output: Annotated[
        Optional[str],
        typer.Option("--output", "-o", help="Also write the version's manifest.json into this folder (what a pipeline step hands on)."),
    ] = None,
) -> None:
    """Copy a data set into the cache tier as a version a run can trust (a rerun copies only what changed)."""
    import logging
    import tempfile
    import warnings

    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from heteroflow.cache.errors import HeteroflowError, InvalidCacheOption
    from heteroflow.cache.prewarm import prewarm_dataset, prewarm_option_problems
    from heteroflow.cache.progress import Progress as PrewarmProgress
    from heteroflow.cache.progress import report_progress
    from heteroflow.cache.redact import redact_url

    problems = prewarm_option_problems(  # named as typed here (prewarm_dataset names its own parameters)
        cache_root=cache, copy_threads=workers, verify_cached=verify,
        names={"cache_root": "--cache", "copy_threads": "--workers", "verify_cached": "--verify"},
    )
    if problems:
        _fail(InvalidCacheOption(problems[0] if len(problems) == 1 else
                                 f"{len(problems)} problems with the options:\n- " + "\n- ".join(problems)))
    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[files]} files"), DownloadColumn(),
        TransferSpeedColumn(), TimeRemainingColumn(), console=err_console, transient=True,
    )
    tasks: dict[str, TaskID] = {}

    def on_progress(p: PrewarmProgress) -> None:
        # bytes drive the bar, speed and ETA; files are shown beside them
        if p.phase in ("listing", "done"):
            return
        total = p.bytes_total or None
        files = f"{p.files_done}/{p.files_total}"
        if p.phase not in tasks:
            tasks[p.phase] = bar.add_task(p.phase, total=total, files=files)
        bar.update(tasks[p.phase], completed=p.bytes_done, total=total, files=files)

    quiet = logging.NullHandler()  # the command prints what the library logs (entries not taken) itself
    logging.getLogger("heteroflow.cache").addHandler(quiet)
    try:
        with warnings.catch_warnings(record=True) as caught, tempfile.TemporaryDirectory(prefix="heteroflow-prewarm-") as scratch, \
                bar, report_progress(on_progress):
            warnings.simplefilter("always")
            try:
                result = prewarm_dataset(
                    source, output or scratch, cache_root=cache, copy_threads=workers, verify_cached=verify
                )
            finally:
                for w in caught:
                    err_console.print(f"[yellow]warning:[/] {escape(redact_url(str(w.message)))}", highlight=False)
    except (HeteroflowError, OSError) as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        err_console.print("interrupted: rerun the same command to resume (finished files are kept)", highlight=False)
        raise typer.Exit(code=130) from None
    finally:
        logging.getLogger("heteroflow.cache").removeHandler(quiet)
    f = result.facts()
    rate = f["bytes_copied"] / result.seconds if result.seconds > 0 else 0.0
    console.print(
        f"{escape(redact_url(source))}: version [bold]{f['version']}[/] ({f['files']} files, {format_bytes(f['total_bytes'])}); "
        f"copied {f['files_copied']} ({format_bytes(f['bytes_copied'])}, {format_bytes(rate)}/s), reused {f['files_skipped']}; "
        f"in {escape(f['cache_dir'] or result.manifest.location)}",
        highlight=False,
    )
    if result.changed_during_copy:
        changed = result.changed_during_copy
        console.print(f"  changed at the source during the copy, copied again: {escape(redact_url(', '.join(changed[:10])))}"
                      + (f" and {len(changed) - 10} more" if len(changed) > 10 else ""), highlight=False)
    for entry in result.skipped_entries[:10]:
        console.print(f"  not taken: {escape(entry)}", highlight=False)
    if len(result.skipped_entries) > 10:
        console.print(f"  ... and {len(result.skipped_entries) - 10} more not taken", highlight=False)
    if output:
        console.print(f"manifest: {escape(output)}/manifest.json", highlight=False)


@cache_app.command("status")
def status_command(
    dataset: Annotated[Optional[str], typer.Argument(help="Only this data set: its source URI or cache key (prefix).")] = None,
    cache: Annotated[str, typer.Option("--cache", help="The cache tier's folder. Default: the local cache under HETEROFLOW_HOME.")] = "",
) -> None:
    """List the data sets in the cache tier: versions, and how much of the current one is cached."""
    from heteroflow.cache.errors import HeteroflowError
    from heteroflow.cache.status import cache_status

    try:
        found = cache_status(cache, dataset or "")
    except (HeteroflowError, OSError) as exc:
        _fail(exc)
        return
    if not found:
        where = f" matching {dataset!r}" if dataset else ""
        console.print(f"no data set{where} in the cache tier{(' ' + cache) if cache else ''}; add one with `heteroflow prewarm SOURCE`", highlight=False)
        if dataset:
            raise typer.Exit(code=2)
        return
    table = Table(title="cache tier", title_justify="left")
    table.add_column("data set", overflow="fold")
    table.add_column("current version", no_wrap=True)
    table.add_column("versions", justify="right")
    table.add_column("cached (files, bytes)", no_wrap=True)
    for s in found:
        current = next((v.version for v in s.versions if v.current), "-")
        staged = f", {s.staged_files} staged" if s.staged_files else ""
        table.add_row(s.key, current, str(len(s.versions)),
                      f"{s.files_cached}/{s.files_total}, {s.cached_fraction:.0%} of {format_bytes(s.bytes_total)}{staged}")
    console.print(whole_cells(table))
    for s in found:
        console.print(f"{s.key}: {escape(s.source_uri or '-')} ({s.backend}) in {escape(str(s.folder))}", highlight=False)
