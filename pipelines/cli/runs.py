"""Runs on the command line: ``heteroflow report``, ``heteroflow runs [show ID | compare ID ID]`` and
``heteroflow metrics [write RUN_DIR | serve]``.

Registered in :mod:`heteroflow.pipelines.cli.main` with ``register(app)``. Run folders of every engine are read as
plain JSON (:mod:`heteroflow.pipelines.runs.folders`). A user error (a run that does not exist, an ambiguous id, an
unwritable output) prints one line and exits 2.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from heteroflow.components.core.telemetry import where_ran
from heteroflow.pipelines.cli.common import fit_columns, hidden_note, print_table, whole_cells

__all__ = ["register"]

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

runs_app = typer.Typer(
    add_completion=False,
    invoke_without_command=True,
    short_help="Runs of every engine (kfp.local, in-process, Airflow): list them, show one, compare two.",
    help="Runs of every engine (kfp.local, in-process, Airflow): list them, show one, compare two. A terminal too "
    "narrow for the list's columns hides whole ones, named under the table, in this order: pipeline, fallbacks, "
    "error, dataset, seconds, started, device, model, accuracy, status; the run id always shows whole (piped output "
    "and --json have every column).",
)
metrics_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Run metrics in Prometheus' text format.")

_ROOTS = typer.Option(
    "--root",
    help="A folder holding run folders (searched 3 levels deep; repeatable). Default: ./heteroflow-runs and "
    "$HETEROFLOW_HOME/airflow-runs.",
)


def register(app: typer.Typer) -> None:
    """Add ``report``, ``runs`` and ``metrics`` to the ``heteroflow`` app, and ``prune`` to its ``archive`` and
    ``cache`` groups (call it after those are added)."""
    app.command("report")(report_command)
    groups = {g.name: g.typer_instance for g in app.registered_groups}
    if "archive" in groups:
        groups["archive"].command("prune")(archive_prune)
    if "cache" in groups:
        groups["cache"].command("prune")(cache_prune)
    app.add_typer(runs_app, name="runs")
    if metrics_app.registered_commands:
        app.add_typer(metrics_app, name="metrics")


def _fail(exc: BaseException) -> None:
    from heteroflow.cache.redact import redact_url

    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"cannot use {exc.filename}: {exc.strerror or exc}"
    else:
        text = " ".join(str(exc).split())
    err_console.print(f"[bold red]error:[/] {escape(redact_url(text))}", highlight=False)
    raise typer.Exit(code=2)


# --- report ---------------------------------------------------------------------------------------------------


def report_command(
    run_dir: Annotated[str, typer.Argument(help="A run folder (holding run.json), or a run id under the default roots.")],
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="The HTML file to write. Default: <run folder>/report.html.")] = None,
) -> None:
    """Write a run's report: one self-contained HTML file (steps, attempts, retries, fallbacks, plots, lineage)."""
    from heteroflow.components.errors import HeteroflowError
    from heteroflow.pipelines.runs.report import REPORT_FILE, render_report
    from heteroflow.pipelines.runs.folders import resolve_run
    from heteroflow.cache.atomic import atomic_write_bytes
    from heteroflow.cache.redact import redact_url

    try:
        run = resolve_run(run_dir)
        target = Path(output).expanduser() if output else Path(run["run_dir"]) / REPORT_FILE
        atomic_write_bytes(target, redact_url(render_report(run)).encode("utf-8"), durable=False)
    except (HeteroflowError, OSError) as exc:
        _fail(exc)
    console.print(f"report: {escape(str(target))}", highlight=False)


# --- runs -------------------------------------------------------------------------------------------------


def _when(ts: Any) -> str:
    if not isinstance(ts, (int, float)) or ts <= 0:
        return "-"
    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).strftime("%m-%d %H:%M")


def _secs(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    from heteroflow.pipelines.cli.runs_rows import run_row

    return run_row(run)


_ERROR_WIDTH = 80  # the table's error column; --json has the whole text

_HIDDEN_FIRST = ("pipeline", "fallbacks", "error", "dataset", "seconds", "started UTC", "device", "model", "accuracy", "status")
"""The columns of ``heteroflow runs`` a terminal too narrow for them all hides, first named first (the run id never)."""


@runs_app.callback()
def runs_list(
    ctx: typer.Context,
    root: Annotated[Optional[list[str]], _ROOTS] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Show at most this many runs (after --filter and --sort).")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list instead of a table.")] = False,
    filters: Annotated[Optional[list[str]], typer.Option(
        "--filter", "-f",
        help="Keep the runs whose column matches (repeatable; all must match): KEY=PATTERN or KEY!=PATTERN (a glob, "
        "case-insensitive; '-' matches an empty column), KEY>N, KEY>=N, KEY<N, KEY<=N for accuracy and seconds. "
        "Keys: run, started, status, pipeline, dataset (its name or URI), model, device, accuracy, seconds, error. "
        "E.g. --filter dataset=iris --filter status!=succeeded.",
    )] = None,
    sort: Annotated[Optional[list[str]], typer.Option(
        "--sort", "-s",
        help="Order by a column (repeatable, first key first): KEY ascending, -KEY descending (--sort=-accuracy); "
        "runs without the value come last. Keys as for --filter. Default: newest first.",
    )] = None,
) -> None:
    """List runs, newest first: status, pipeline, data set, model, device per device-bound step, accuracy, duration,
    error, fallbacks (a narrow terminal hides whole columns: runs_app's help says which, _HIDDEN_FIRST holds them)."""
    ctx.obj = {"roots": root}
    if ctx.invoked_subcommand is not None:
        return
    from heteroflow.components.errors import HeteroflowError
    from heteroflow.pipelines.cli.runs_rows import filter_rows, sort_rows
    from heteroflow.pipelines.runs.folders import default_roots, find_runs

    unreadable: list = []
    runs = find_runs(root, unreadable=unreadable)
    for folder, why in unreadable[:3]:  # skipped, and said (it left them out without a word)
        err_console.print(f"note: left out {escape(str(folder))}: {escape(' '.join(why.split()))}", highlight=False)
    if len(unreadable) > 3:
        err_console.print(f"note: and {len(unreadable) - 3} more run folders whose run.json cannot be read", highlight=False)
    try:
        chosen = sort_rows(filter_rows((_summary(r) for r in runs), filters or []), sort or [])
    except HeteroflowError as exc:
        _fail(exc)
    rows = chosen[:limit]
    if as_json:
        console.print_json(json.dumps(rows, default=str))
        return
    if not rows:
        where = ", ".join(str(r) for r in (root or default_roots()))
        if runs:
            console.print(f"no run of the {len(runs)} in {escape(where)} passes --filter {escape(' '.join(filters or []))}", highlight=False)
        else:
            console.print(f"no runs in {escape(where)} (give --root FOLDER)", highlight=False)
        return
    shown = f"{len(rows)} of {len(chosen)}" + (f" passing --filter, of {len(runs)}" if filters else "")
    headers = ["run", "started UTC", "status", "pipeline", "dataset", "model", "device", "accuracy", "seconds", "error", "fallbacks"]
    cells = []
    for row in rows:
        error = row["error"] or "-"
        cells.append([
            str(row["run_id"]),
            row["started"],
            str(row["status"]),
            str(row["pipeline"]),
            row["dataset"] or "-",
            row["model"] or "-",
            row["devices"] or "-",
            f"{row['accuracy']:.4f}" if row["accuracy"] is not None else "-",
            _secs(row["seconds"]),
            error if len(error) <= _ERROR_WIDTH or not console.is_terminal else error[: _ERROR_WIDTH - 1] + "…",  # piped: whole
            "; ".join(row["fallbacks"]) or "-",
        ])
    # at a narrow terminal the least useful columns go first (_HIDDEN_FIRST); the run id never goes, nor is it cut
    # (below about 70 columns the device and then the model go too: wrapped over several lines each, no row was
    # readable; the airflow engine's 77-character run ids leave room for nothing else at 80 columns: accuracy and
    # status go too, named in the note, not drawn zero wide)
    kept, hidden = fit_columns(console, headers, cells, list(_HIDDEN_FIRST),
                               wrap={"device": 14, "error": 20, "fallbacks": 20, "dataset": 16})
    table = Table(title=f"runs ({shown})")
    for i in kept:
        col = headers[i]
        # the run id is what `runs show` takes: never cut or wrapped
        table.add_column(col, justify="right" if col in ("accuracy", "seconds") else "left", no_wrap=col == "run",
                         min_width=max(len(r[0]) for r in cells) if col == "run" else None)
    for row_cells in cells:
        table.add_row(*(escape(row_cells[i]) for i in kept))
    print_table(console, table, headers, cells)
    if hidden:
        console.print(hidden_note(hidden, console.width), highlight=False, style="dim")


def _roots(ctx: typer.Context, own: list[str] | None = None) -> Any:
    return own or ((ctx.obj or {}).get("roots") if ctx.obj else None)


def _resolve(ctx: typer.Context, ref: str, own: list[str] | None = None) -> dict[str, Any]:
    from heteroflow.components.errors import HeteroflowError
    from heteroflow.pipelines.runs.folders import resolve_run

    try:
        return resolve_run(ref, _roots(ctx, own))
    except HeteroflowError as exc:
        _fail(exc)
        raise  # unreachable: _fail exits


def _plain_values(facts: Any) -> bool:
    """Whether a step's results are a few plain values (1-8 numbers, booleans or short strings, nothing else), as a
    step of yours returns them (``best_learning_rate``, ``best_accuracy``): ``runs show`` prints those. The shipped
    steps' facts (lists, tables, paths and their metrics) have views of their own."""
    if not isinstance(facts, dict) or not 0 < len(facts) <= 8:
        return False
    return all(isinstance(v, (int, float, bool)) or (isinstance(v, str) and 0 < len(v) <= 60) for v in facts.values())


def _scalars(run: dict[str, Any]) -> dict[str, Any]:
    """``call.metric`` -> value for every scalar metric of the run."""
    out: dict[str, Any] = {}
    for call, values in (run.get("metrics") or {}).items():
        if isinstance(values, dict):
            for k, v in values.items():
                if isinstance(v, (int, float, str)) and not isinstance(v, bool):
                    out[f"{call}.{k}"] = v
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return "-"
    return str(value)


@runs_app.command("show")
def runs_show(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="A run id (a unique prefix is enough) or a run folder.")],
    as_json: Annotated[bool, typer.Option("--json", help="The run record (with its attempts) as JSON.")] = False,
    root: Annotated[Optional[list[str]], _ROOTS] = None,
) -> None:
    """One run: its steps (status, device, candidate, attempts, seconds; a loop step's iterations), retries,
    fallbacks, metrics, parameters."""
    from heteroflow.components.core.telemetry import iteration_label
    from heteroflow.pipelines.runs.folders import (device_of, fallback_step, iteration_name, iteration_results, iterations_of,
                                                   retries, scalar_results, step_label, waiting_text)

    run = _resolve(ctx, run_id, root)
    if as_json:
        console.print_json(json.dumps(run, default=str))
        return
    s = _summary(run)
    console.print(
        f"run {escape(str(s['run_id']))}: {escape(str(s['status']))}, pipeline {escape(str(s['pipeline']))}, "
        f"started {_when(run.get('started_at'))} UTC, {_secs(s['seconds'])} s; folder {escape(str(s['run_dir']))}",
        highlight=False,
    )
    console.print(f"data set {escape(str(s['dataset_uri'] or '-'))}, model {escape(str(s['model'] or '-'))}", highlight=False)
    if run.get("error"):
        console.print(f"stopped by: {escape(str(run['error']))}", highlight=False)
    headers = ["step", "status", "device", "candidate", "attempts", "seconds", "error"]

    def cells(step: dict[str, Any], label: str) -> list[str]:
        # a step that never ran made no attempt: `-`, as the run's summary and the live table say (not `0`)
        return [label, str(step.get("status")), device_of(step), _fmt(step.get("candidate")), _fmt(step.get("attempts") or None),
                _secs(step.get("seconds")), _short(step.get("error")) or "-"]

    rows = []
    for step in run.get("steps") or []:
        rows.append(cells(step, step_label(step)))
        for it in iterations_of(step):  # a loop step: one row per iteration (Airflow's mapped instances)
            rows.append(cells(it, "  " + iteration_name(it)))
    # a terminal too narrow for every column hides the candidate, then the seconds and the attempts (named under the
    # table), and folds the device and the error over lines: no cell is cut; piped: plain columns, as `runs` prints
    kept, hidden = fit_columns(console, headers, rows, ["candidate", "seconds", "attempts"], wrap={"device": 12, "error": 14})
    table = Table(title="steps")
    for i in kept:
        table.add_column(headers[i], justify="right" if headers[i] in ("attempts", "seconds", "candidate") else "left")
    for row in rows:
        table.add_row(*(escape(row[i]) for i in kept))
    print_table(console, table, headers, rows)
    if hidden:
        console.print(hidden_note(hidden, console.width), highlight=False, style="dim")
    results = run.get("results") or {}
    for step in run.get("steps") or []:  # a loop step's results are its iterations' (run.json has no one result)
        lines = iteration_results(step)
        if lines:
            console.print(escape(f"results of {step_label(step)}:\n  " + "\n  ".join(lines)), highlight=False)
        elif _plain_values(results.get(step.get("name"))):  # what a step of yours returned (a few plain values)
            console.print(escape(f"results of {step.get('name')}: {scalar_results(results.get(step.get('name')), limit=8)}"), highlight=False)
    items = retries(run)
    if items:
        console.print(f"retries: {len(items)}, {waiting_text(items, run.get('wall_seconds'))}", highlight=False)
        for r in items:
            console.print(f"  {escape(str(r['step']) + iteration_label(r.get('iteration')))} attempt {r['attempt']} after a {escape(str(r['after']))} failure, waited {_secs(r['wait_seconds'])} s", highlight=False)
    for f in run.get("fallbacks") or []:
        console.print(
            f"fallback: {escape(fallback_step(f))} left candidate {f.get('candidate')} ({escape(str(f.get('kind')))}) after a "
            f"{escape(str(f.get('failure')))} failure: {escape(str(f.get('reason')))}",
            highlight=False,
        )
    metrics = _scalars(run)
    if metrics:
        console.print("metrics: " + ", ".join(f"{escape(k)} {_fmt(v)}" for k, v in metrics.items()), highlight=False)
    report = Path(str(run.get("run_dir")), "report.html")
    if report.is_file():
        console.print(f"report: {escape(str(report))}", highlight=False)


def _placed_candidate(run: dict[str, Any], call: str) -> str | None:
    """The candidate ``call`` was placed on, worded with its options: ``gpu x1 (nvidia-gpu) + npu x1 (ascend-910),
    compression=topk, topk_ratio=0.05`` (a mixed candidate's job options, those not at their defaults); None when
    the record holds no placement of it."""
    from heteroflow.components.errors import InvalidParameter
    from heteroflow.components.replicas import MixedResources
    from heteroflow.components.resources import Resources

    placed = (run.get("placement") or {}).get(call)
    res = placed.get("resources") if isinstance(placed, dict) else None
    if not isinstance(res, dict):
        return None
    try:
        text = (MixedResources if "replicas" in res else Resources).from_dict(res).describe()
    except (InvalidParameter, TypeError, ValueError):
        text = str(res.get("kind") or "-")
    options = res.get("mixed") if isinstance(res.get("mixed"), dict) else {}
    return ", ".join([text, *(f"{k}={v}" for k, v in sorted(options.items()))])


@runs_app.command("compare")
def runs_compare(
    ctx: typer.Context,
    first: Annotated[str, typer.Argument(help="A run id or run folder.")],
    second: Annotated[str, typer.Argument(help="Another run id or run folder.")],
    all_params: Annotated[bool, typer.Option("--all", help="List every parameter (not only those that differ) and per-class metrics.")] = False,
    root: Annotated[Optional[list[str]], _ROOTS] = None,
) -> None:
    """Two runs side by side: status, duration, parameters (those that differ), steps' devices and seconds, metrics."""
    from heteroflow.pipelines.runs.folders import device_of, model_overrides

    a, b = _resolve(ctx, first, root), _resolve(ctx, second, root)
    headers = ["field", str(a.get("run_id")), str(b.get("run_id")), "differs"]
    cells: list[list[str]] = []

    def row(name: str, x: Any, y: Any) -> None:
        cells.append([name, _fmt(x), _fmt(y), "*" if x != y else ""])

    row("status", a.get("status"), b.get("status"))
    row("pipeline", a.get("pipeline"), b.get("pipeline"))
    sa_row, sb_row = _summary(a), _summary(b)
    for key in ("dataset_uri", "model", "error"):
        row(key.replace("_uri", ""), sa_row[key], sb_row[key])
    seconds = [None if r.get("wall_seconds") is None else round(r["wall_seconds"], 1) for r in (a, b)]  # unknown: '-', as
    row("seconds", *seconds)  # `runs` and `runs show` print it (it read 0)
    row("fallbacks", len(a.get("fallbacks") or []), len(b.get("fallbacks") or []))
    pa, pb = a.get("params") or {}, b.get("params") or {}
    oa, ob = model_overrides(a), model_overrides(b)  # a default that model_args replaced: the value the model used

    def used(params: dict[str, Any], overridden: dict[str, Any], key: str) -> Any:
        return f"{_fmt(overridden[key])} (model_args)" if key in overridden else params.get(key)

    for key in list(pa) + [k for k in pb if k not in pa]:
        x, y = used(pa, oa, key), used(pb, ob, key)
        if all_params or x != y:
            row(f"param {key}", x, y)
    sa = {s.get("name"): s for s in a.get("steps") or []}
    sb = {s.get("name"): s for s in b.get("steps") or []}
    for name in list(sa) + [n for n in sb if n not in sa]:
        x, y = sa.get(name, {}), sb.get(name, {})
        row(f"{name} status", x.get("status"), y.get("status"))
        if x.get("candidate") is not None or y.get("candidate") is not None:
            row(f"{name} device", device_of(x) if x else None, device_of(y) if y else None)
        ca, cb = _placed_candidate(a, name), _placed_candidate(b, name)
        if (ca or cb) and (all_params or ca != cb):  # the candidate's shape and a mixed job's options (compression)
            row(f"{name} candidate", ca, cb)
        row(f"{name} seconds", round(x["seconds"], 2) if isinstance(x.get("seconds"), (int, float)) else None,
            round(y["seconds"], 2) if isinstance(y.get("seconds"), (int, float)) else None)
    ma, mb = _scalars(a), _scalars(b)
    for key in list(ma) + [k for k in mb if k not in ma]:
        if not all_params and key.split(".")[-1].startswith(("precision_", "recall_")):
            continue  # per-class figures: with --all
        row(key, ma.get(key), mb.get(key))
    # a terminal: rich's table, every cell whole (folded, never `…`); piped: plain columns, as `heteroflow runs`
    table = Table(title=f"{a.get('run_id')} vs {b.get('run_id')}")
    for col in headers:
        table.add_column(escape(col))
    for cells_of_row in cells:
        table.add_row(*(escape(c) for c in cells_of_row))
    print_table(console, table, headers, cells)


# --- metrics ------------------------------------------------------------------------------------------------

_PROFILE = typer.Option("--profile", help="Cluster profile YAML whose `prices` (per device-hour) cost the device time. Default: $HETEROFLOW_CLUSTER_PROFILE.")


@metrics_app.command("write")
def metrics_write(
    run_dir: Annotated[str, typer.Argument(help="A run folder, or a run id under the default roots.")],
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="The file to write. Default: <run folder>/metrics.prom.")] = None,
    profile: Annotated[Optional[str], _PROFILE] = None,
) -> None:
    """Write a run's metrics as a Prometheus textfile-collector file (what every run writes when it ends)."""
    from heteroflow.components.errors import HeteroflowError
    from heteroflow.pipelines.runs.metrics import write_textfile
    from heteroflow.pipelines.runs.folders import resolve_run

    try:
        written = write_textfile(resolve_run(run_dir)["run_dir"], output, profile=profile)
    except (HeteroflowError, OSError) as exc:
        _fail(exc)
    for path in written:
        console.print(f"metrics: {escape(str(path))}", highlight=False)


@metrics_app.command("serve")
def metrics_serve(
    root: Annotated[Optional[list[str]], _ROOTS] = None,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port; 0 picks a free one (printed).")] = 9464,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    profile: Annotated[Optional[str], _PROFILE] = None,
) -> None:
    """Serve /metrics (Prometheus text format) for every run under the run roots, read at each scrape; Ctrl-C stops."""
    import threading

    from heteroflow.components.errors import HeteroflowError
    from heteroflow.pipelines.runs.metrics import serve

    try:
        server, _thread = serve(root, port=port, host=host, profile=profile)
    except (HeteroflowError, OSError) as exc:
        _fail(exc)
    console.print(f"serving http://{host}:{server.server_port}/metrics (Ctrl-C stops)", highlight=False)
    sys.stdout.flush()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()


# --- prune (registered into `heteroflow archive` and `heteroflow cache`) ----------------------------------------


def _print_pruned(entries: list[dict[str, Any]], what: str, key: str, dry_run: bool) -> None:
    if not entries:
        console.print(f"nothing to prune: no {what} beyond the newest kept", highlight=False)
        return
    for e in entries:
        label = f"{e[key]}:v{e['version']}" if key == "model" else f"{e[key]} version {e['version']}"
        reason = f" ({e['reason']})" if e.get("reason") else ""
        console.print(f"{e['action']}: {escape(label)} {escape(e['path'])}{escape(reason)}", highlight=False)
    removed = sum(e["action"] in ("removed", "would remove") for e in entries)
    kept = sum(e["action"] == "kept" for e in entries)
    console.print(f"{'would remove' if dry_run else 'removed'} {removed}, kept {kept} that runs name", highlight=False)
    if kept:  # every version may be named by a run (a new user's trial: "would remove 0, kept 13" and nothing to do)
        console.print(f"a version a run names stays while that run's folder does: remove the runs you no longer need "
                      f"(heteroflow runs lists them, with their folders), or add --force to remove those {what}s anyway",
                      highlight=False)


def archive_prune(
    model: Annotated[Optional[str], typer.Argument(help="Only this model (default: every model).")] = None,
    keep: Annotated[int, typer.Option("--keep", "-k", help="Versions to keep per model, newest first (>= 1).")] = 3,
    force: Annotated[bool, typer.Option("--force", help="Also remove versions a kept run's lineage names.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
    root: Annotated[Optional[Path], typer.Option("--root", help="Archive folder. Default: $HETEROFLOW_HOME/archive.")] = None,
    runs_root: Annotated[Optional[list[str]], typer.Option("--runs-root", help="Run folders whose lineage protects versions (repeatable). Default: ./heteroflow-runs and $HETEROFLOW_HOME/airflow-runs.")] = None,
) -> None:
    """Remove archived versions beyond the newest N of each model; never one a kept run archived (without --force)."""
    from heteroflow.components.errors import HeteroflowError
    from heteroflow.pipelines.runs.folders import prune_archive

    try:
        entries = prune_archive(keep, model=model, archive_root=root, roots=runs_root, force=force, dry_run=dry_run)
    except (HeteroflowError, OSError) as exc:
        _fail(exc)
    _print_pruned(entries, "archived version", "model", dry_run)


def cache_prune(
    dataset: Annotated[Optional[str], typer.Argument(help="Only this data set: its source URI or cache key (prefix).")] = None,
    keep: Annotated[int, typer.Option("--keep", "-k", help="Versions to keep per data set, newest first, the current one always (>= 1).")] = 1,
    force: Annotated[bool, typer.Option("--force", help="Also remove versions a kept run or archived model names.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
    cache: Annotated[str, typer.Option("--cache", help="The cache tier's folder. Default: the local cache under HETEROFLOW_HOME.")] = "",
    runs_root: Annotated[Optional[list[str]], typer.Option("--runs-root", help="Run folders whose lineage protects versions (repeatable).")] = None,
) -> None:
    """Remove cached data set versions beyond the newest N; never the current one, nor one a kept run or archived model names (without --force)."""
    from heteroflow.cache.errors import HeteroflowError as CacheError
    from heteroflow.components.errors import HeteroflowError
    from heteroflow.pipelines.runs.folders import prune_cache

    try:
        if dataset:  # as `cache status DATASET` does: a name that matches nothing is an error, not "nothing to prune"
            from heteroflow.cache.status import cache_status

            if not cache_status(cache, dataset):
                from heteroflow.components.errors import InvalidParameter

                raise InvalidParameter(f"no data set matching {dataset!r} in the cache tier{(' ' + cache) if cache else ''}; "
                                       "`heteroflow cache status` lists them")
        entries = prune_cache(keep, dataset=dataset or "", cache_root=cache, roots=runs_root, force=force, dry_run=dry_run)
    except (HeteroflowError, CacheError, OSError) as exc:
        _fail(exc)
    _print_pruned(entries, "cached version", "dataset", dry_run)


# --- the live table of `heteroflow run` and the summary's retries ----------------------------------------------


def live_state(step: Any, records: list[dict[str, Any]], retry: Any, now: float) -> tuple[str, float | None, str]:
    """What the live table shows for one call while a run goes on: ``(status, seconds, note)``.

    - a call whose last attempt failed with a *transient* failure and has retries left on its candidate (per
      ``retry``, a :class:`~heteroflow.components.core.retry.RetryPolicy`, within its window) is ``retrying``, with
      the note ``retrying in N s (attempt k of n)``: N counts down from the policy's delay for that retry, k and
      n count attempts on the candidate;
    - a running call's seconds tick (now - the attempt's start);
    - a call inside a loop: each iteration as above (``[1] retrying in N s (attempt k of n)``; its running
      iterations' seconds tick), else how its iterations ended (``3 iterations: 3 succeeded``);
    - else the summary's status and seconds.

    Args:
        step: the call's summary (``name``, ``status``, ``failure``, ``seconds``).
        records: its attempt records (dicts, in order: by iteration, then attempt), from ``steps/<call>/``.
        retry: its retry policy, or None when unknown.
        now: the time, Unix seconds.
    """
    from heteroflow.components.core.telemetry import iteration_key, iteration_label

    if any(iteration_key(r) is not None for r in records):  # a loop: each iteration retries apart
        groups: dict[Any, list[dict[str, Any]]] = {}
        for r in records:
            groups.setdefault(iteration_key(r), []).append(r)
        notes, running = [], []
        for key, recs in groups.items():
            alone = [{k: v for k, v in r.items() if k not in ("iteration", "outer_iterations")} for r in recs]
            state, _, note = live_state(step, alone, retry, now)
            if recs[-1].get("status") == "running" and isinstance(recs[-1].get("started_at"), (int, float)):
                running.append(max(now - recs[-1]["started_at"], 0.0))
            if state == "retrying":
                notes.append(f"{iteration_label(key)} {note}")
        from heteroflow.pipelines.runs.folders import iterations_note

        status = "retrying" if notes and not running else step.status
        seconds = (step.seconds or 0.0) + sum(running) if running else step.seconds
        return status, seconds, "; ".join(notes) or iterations_note(step)
    last = records[-1] if records else None
    if last is not None and last.get("status") == "running" and isinstance(last.get("started_at"), (int, float)):
        return step.status, max(now - last["started_at"], 0.0), ""
    if (
        retry is not None
        and last is not None
        and last.get("status") == "failed"
        and last.get("failure") == "transient"
        and isinstance(last.get("ended_at"), (int, float))
    ):
        on_candidate = [r for r in records if r.get("candidate") == last.get("candidate")]
        done = len(on_candidate)  # attempts made on this candidate
        first = on_candidate[0].get("started_at")
        delay = retry.delay_seconds(done - 1)
        inside = not isinstance(first, (int, float)) or last["ended_at"] + delay - first <= retry.window_seconds
        if done <= retry.retries and inside:
            left = max(last["ended_at"] + delay - now, 0.0)
            return "retrying", step.seconds, f"retrying in {left:.0f} s (attempt {done + 1} of {retry.retries + 1})"
    return step.status, step.seconds, ""


def read_attempts(run_dir: str | None) -> dict[str, list[dict[str, Any]]]:
    """The attempt records of a run folder so far (empty without one)."""
    if not run_dir:
        return {}
    from heteroflow.pipelines.runs.folders import _read_attempts

    return _read_attempts(Path(run_dir))


def _short(error: Any) -> str:
    """``heteroflow.x.SomeError: message`` -> ``message`` (our errors' messages say it all)."""
    kind, sep, message = str(error or "").partition(": ")
    return message if sep and kind.startswith("heteroflow.") else str(error or "")


def retry_lines(run_dir: str | Path) -> list[str]:
    """The summary's retry lines: each retry (step, attempt, the failure before it, the wait) and the time spent
    waiting against the run's wall time; empty when the run retried nothing."""
    from heteroflow.components.core.telemetry import iteration_label
    from heteroflow.components.errors import HeteroflowError
    from heteroflow.pipelines.runs.folders import load_run, retries, waiting_text

    try:
        run = load_run(run_dir)
    except HeteroflowError:
        return []
    items = retries(run)
    if not items:
        return []
    # loop iterations that retried side by side: their waits' sum can exceed the run's wall time, so it is named as a
    # sum beside the time some retry was waiting (#new-user trial: "20.3 s spent waiting of the run's 16.0 s")
    lines = [f"retries: {len(items)}, {waiting_text(items, run.get('wall_seconds'))}"]
    for r in items:
        where = f" (candidate {r['candidate']})" if r.get("candidate") is not None else ""
        lines.append(
            f"  {r['step']}{iteration_label(r.get('iteration'))} attempt {r['attempt']} on {r['kind']}{where} after a {r['after']} failure, "
            f"waited {_secs(r['wait_seconds'])} s: {_short(r['error'])}"
        )
    return lines


def next_line(run: dict[str, Any], *, engine_log: str | Path | None = None) -> str:
    """The summary's last line: the commands that naturally follow the run, with its own id and model. Succeeded:
    ``next: heteroflow runs show <run id>; heteroflow archive show <model>:v<N>`` (the second where it archived a
    model; ``--root`` where the archive is not the default one). Else: ``next: heteroflow runs show <run id> (each
    attempt and its error)`` and, where the engine wrote one, its log in the run folder. The run is named by its id
    when ``heteroflow runs`` finds it under the default roots, else by its folder."""
    from heteroflow.pipelines.runs.folders import default_roots

    folder = Path(str(run.get("run_dir") or ""))
    ref = str(run.get("run_id") or folder)
    try:
        found = folder.is_dir() and any(root.resolve() in folder.resolve().parents[:3] for root in default_roots())
    except OSError:
        found = False
    if not found and str(folder) not in ("", "."):
        ref = str(folder)
    if run.get("status") != "succeeded":
        text = f"next: heteroflow runs show {ref} (each attempt and its error)"
        return text + (f"; the engine's log: {engine_log}" if engine_log else "")
    parts = [f"heteroflow runs show {ref}"]
    archived = (run.get("results") or {}).get("archive")
    if isinstance(archived, dict) and archived.get("name") and archived.get("version"):
        from heteroflow.components.models.archive import archive_root_dir

        shown = f"heteroflow archive show {archived['name']}:v{archived['version']}"
        path = Path(str(archived.get("path") or ""))
        if archived.get("path") and len(path.parents) > 1 and path.parents[1] != archive_root_dir(None):
            shown += f" --root {path.parents[1]}"  # an archive_root of the run's own
        parts.append(shown)
    return "next: " + "; ".join(parts)


# --- the one-screen summary of a run, from its record (Airflow's record-run logs it) ----------------------------


def summary_text(run: dict[str, Any], pipeline: Any = None, *, width: int = 120) -> str:
    """The one-screen summary ``heteroflow run`` prints, from a run record of any engine (a dict as
    :func:`heteroflow.pipelines.runs.folders.load_run` returns it): the steps table, placement, fallbacks, retries, what
    each step reported (with ``pipeline``: its steps' own summary lines) or why the run failed, the outcome, and
    where the record and report are. Plain text, no colour."""
    import io

    from heteroflow.pipelines.runs.folders import fallback_step, iterations_note, iterations_of, step_label

    out = Console(file=io.StringIO(), width=width, no_color=True, highlight=False, soft_wrap=True, force_terminal=False)
    table = Table(title="steps", title_justify="left")
    for col in ("step", "status", "device", "attempts", "seconds"):
        table.add_column(col, justify="right" if col in ("attempts", "seconds") else "left")
    for s in run.get("steps") or []:
        device = where_ran(s.get("kind"), s.get("device"), accelerator=s.get("accelerator"),
                           simulated=bool(s.get("simulated")), details=s.get("details"))
        if s.get("candidate"):
            device += f" [candidate {s['candidate']}]"
        table.add_row(escape(step_label(s)), escape(str(s.get("status"))), escape(device), _fmt(s.get("attempts") or None),
                      f"{s['seconds']:.2f}" if isinstance(s.get("seconds"), (int, float)) else "-")
    out.print(whole_cells(table))
    for s in run.get("steps") or []:
        if iterations_of(s):  # a loop step (`train ×3`): how its iterations ended, its attempts being theirs
            out.print(escape(f"{s.get('name')}: {iterations_note(s)}"))
    from heteroflow.pipelines.runs.folders import ran_on

    for call, decision in (run.get("placement") or {}).items():
        if isinstance(decision, dict):
            ran = ran_on(run, call)  # where it ran in the end, as the table says (#28 item 17)
            out.print(
                f"placement of {escape(call)}: {escape(ran)}" if ran else
                f"placement of {escape(call)}: candidate {decision.get('index')} -> "
                f"{escape(str(decision.get('device_kind')))} (placed; it did not run)"
            )
            for why in decision.get("passed_over") or []:
                out.print(f"  passed over: {escape(str(why))}")
    for f in run.get("fallbacks") or []:
        accel = f" ({f['accelerator']})" if f.get("accelerator") else ""
        out.print(escape(f"fallback: {fallback_step(f)} left candidate {f.get('candidate')} ({f.get('kind')}{accel}) after a {f.get('failure')} failure: {_short(f.get('reason'))}"))
    if run.get("run_dir"):
        for line in retry_lines(run["run_dir"]):
            out.print(escape(line))
    if run.get("status") == "succeeded":
        if pipeline is not None:
            for call in pipeline.calls:
                try:
                    lines = call.step.summarize((run.get("results") or {}).get(call.name, {}))
                except Exception:  # a summary must never fail the task that prints it
                    lines = []
                for line in lines:
                    out.print(escape(line))
    else:
        for s in run.get("steps") or []:
            if s.get("status") in ("failed", "killed"):
                kind = f" ({s['failure']} failure)" if s.get("failure") else ""
                out.print(escape(f"step {s.get('name')} {s.get('status')}{kind}: {_short(s.get('error'))}"))
        if run.get("error"):
            out.print(escape(f"stopped by: {run['error']}"))
    wall = run.get("wall_seconds")
    folder = run.get("run_dir", "")
    out.print(escape(f"run {run.get('status')} in {wall:.1f} s; record: {folder}/run.json" if isinstance(wall, (int, float)) else f"run {run.get('status')}; record: {folder}/run.json"))
    if folder and Path(folder, "report.html").is_file():
        out.print(escape(f"report: {folder}/report.html"))
    out.print(escape(next_line(run)))
    return out.file.getvalue()  # type: ignore[attr-defined]
