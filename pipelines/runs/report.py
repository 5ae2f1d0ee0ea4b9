"""One self-contained HTML report per run: ``heteroflow report RUN_DIR``, also written as ``<run_dir>/report.html``
at the end of every run (kfp.local, in-process and Airflow engines).

The file needs no network and no script to be read: styles are inline, plots are matplotlib figures embedded as
inline SVG (text kept as text, so a browser's find works), and nothing is fetched at view time. It shows:

- the run: status, pipeline, start, wall time, the error that stopped it, the testing settings in force;
- the step graph (the calls in pipeline order) with each call's status, device (kind, accelerator, simulated),
  candidate, attempts and seconds, and a table of every attempt with its failure class and error;
- retries with the wait before each (and the total time spent waiting), fallbacks with their reasons, and the
  planner's placement (why earlier candidates were passed over);
- a timeline of the attempts, the per-epoch history the record holds (loss and metric curves), the confusion
  matrix and per-class precision and recall;
- lineage: data set (source, version, sha256) -> preprocess -> train (device) -> archived model (name:version).

The report reads ``run.json`` and the attempt records as plain JSON (:mod:`heteroflow.pipelines.runs.folders`), so it
renders records of any engine, and of failed or killed runs (sections without data are left out or say so).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import html
import io
import json
import os
import re
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from heteroflow.cache.atomic import atomic_write_bytes
from heteroflow.cache.redact import redact_url
from heteroflow.pipelines.runs.folders import attempts, device_of, headline_metric, history_of, load_run, retries

__all__ = ["REPORT_FILE", "render_report", "write_report", "write_report_quietly", "write_run_outputs"]

REPORT_FILE = "report.html"

_STATUS_COLOURS = {
    "succeeded": "#1a7f37",
    "failed": "#cf222e",
    "killed": "#cf222e",
    "interrupted": "#9a6700",
    "running": "#0969da",
    "not run": "#6e7781",
}

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1f2328;max-width:1200px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:6px 0} th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:1px 9px;font-size:12px;font-weight:600}
.graph{display:flex;flex-wrap:wrap;align-items:stretch;gap:0;margin:8px 0}
.node{border:2px solid;border-radius:8px;padding:6px 10px;min-width:120px;font-size:12px;background:#fff}
.node b{font-size:14px} .arrow{align-self:center;font-size:20px;color:#6e7781;padding:0 6px}
.muted{color:#6e7781} .error{color:#cf222e;white-space:pre-wrap;word-break:break-word}
.plots{display:flex;flex-wrap:wrap;gap:16px} .plot{border:1px solid #d0d7de;border-radius:6px;padding:4px}
.plot svg{display:block;max-width:100%;height:auto} code{font-size:12px}
"""


# --- writing ------------------------------------------------------------------------------------------------

_PREWARM: threading.Thread | None = None
_PRERENDER: tuple[threading.Thread, threading.Event, threading.Event] | None = None
_CHARTS: dict[str, Any] = {}
"""Rendered plots by their inputs (:func:`_memo`): what :func:`prerender` drew while the run went on."""
_CHARTS_LOCK = threading.Lock()


def _import_plotting() -> None:
    with contextlib.suppress(Exception):  # a problem shows when the report is rendered, as a warning
        import matplotlib.backends.backend_svg  # noqa: F401
        import matplotlib.figure  # noqa: F401


def _plotting_imported() -> bool:
    return "matplotlib.figure" in sys.modules and "matplotlib.backends.backend_svg" in sys.modules


def _has_plots(details: Any) -> bool:
    """Whether a step's result ``details`` hold something the report plots (a per-epoch history, evaluate's
    confusion matrix or per-class scores)."""
    if not isinstance(details, dict):
        return False
    return bool(history_of({"results": {"step": dict(details)}})) or "confusion_matrix" in details or "precision" in details


def prewarm() -> None:
    """Import matplotlib (about 0.4 s) in a background thread while a run's steps execute, so the report written
    when the run ends does not wait for it (the driver is idle then, waiting for step processes). Idempotent;
    :func:`write_report` joins the thread first."""
    global _PREWARM
    if _PREWARM is None and "matplotlib.figure" not in sys.modules:
        _PREWARM = threading.Thread(target=_import_plotting, name="heteroflow-report-prewarm", daemon=True)
        _PREWARM.start()


def prerender(
    run_dir: str | os.PathLike[str], pipeline: Any, *, wake: threading.Event | None = None, interval: float = 1.0
) -> None:
    """Draw the plots of each call as soon as it has succeeded, in a background thread, while later steps run.

    The per-epoch history of train and evaluate's confusion matrix and per-class plots are known once their
    step ends, and the driver waits idle for the step processes after them (evaluate, archive: about a second);
    drawing them then (matplotlib: about 0.1 s a plot) leaves only the timeline for the end of the run. The
    plots are kept by their inputs (:func:`_memo`): the report written at the end uses one only when the final
    record holds the same data, and draws anything else itself, so the report is the same with or without this.
    matplotlib is imported (about 0.5 s of CPU) after the first task has ended (or ``interval`` has passed), once a
    core is idle
    (:func:`heteroflow.pipelines.kfp.prestart.idle_cores_meter`, as prestarted step processes start) or a finished step
    has plots to draw: never while the driver starts the run or a step uses every core. The thread reads the
    attempt records (:func:`heteroflow.pipelines.runs.records.collect`) each time ``wake`` is set
    (the runner sets it when a task ends) and at least every ``interval`` seconds; it stops at
    :func:`stop_prerender`, which :func:`write_report` calls first. Problems are ignored here: the report's own
    rendering reports them.

    Args:
        run_dir: the run's folder.
        pipeline: the :class:`~heteroflow.pipelines.graph.Pipeline` being run.
        wake: set by the runner when a task has ended (cleared here once read).
        interval: the longest wait between two reads, seconds.
    """
    global _PRERENDER
    stop_prerender()
    stop = threading.Event()
    woken = wake if wake is not None else threading.Event()

    def loop() -> None:
        from heteroflow.pipelines.kfp.prestart import MIN_IDLE_CORES, POLL_SECONDS, idle_cores_meter
        from heteroflow.pipelines.runs.records import collect

        drawn: set[str] = set()
        # matplotlib's import (~0.5 s of CPU, holding the GIL) waits until a task has ended or `interval` has
        # passed (until then the driver renders the pipeline and starts the first tasks, and would wait on this
        # thread), then for a core the steps leave idle (preprocess reads with a process per core; training's
        # torch import uses one), or for a finished step with plots to draw, whichever comes first
        woken.wait(interval)
        idle = idle_cores_meter()
        while not stop.is_set() and not _plotting_imported():
            if woken.wait(POLL_SECONDS):  # a task ended: idle time is read over whole windows only
                woken.clear()
                with contextlib.suppress(Exception):
                    if any(_has_plots(s.details) for s in collect(run_dir, pipeline) if s.status == "succeeded"):
                        break
            elif idle() >= MIN_IDLE_CORES:
                break
        if stop.is_set():
            return  # the report imports matplotlib itself
        _import_plotting()
        while not stop.is_set():
            woken.clear()  # before reading: a task that ends while the records are read wakes the next read
            try:
                for summary in collect(run_dir, pipeline):
                    if stop.is_set():
                        return
                    if summary.status != "succeeded" or summary.name in drawn:
                        continue
                    drawn.add(summary.name)
                    partial = {"results": {summary.name: dict(summary.details)}}
                    for call, history in history_of(partial).items():
                        _history_plots(call, history)
                    _classification(partial)
            except Exception:  # noqa: BLE001 - the final rendering reports what is wrong
                pass
            woken.wait(interval)

    thread = threading.Thread(target=loop, name="heteroflow-report-prerender", daemon=True)
    _PRERENDER = (thread, stop, woken)
    thread.start()


def stop_prerender() -> None:
    """Stop :func:`prerender`'s thread (after the plot it is drawing) and wait for it; does nothing when none runs."""
    global _PRERENDER
    if _PRERENDER is not None:
        thread, stop, woken = _PRERENDER
        stop.set()
        woken.set()
        thread.join()
        _PRERENDER = None


def _memo(func: Any) -> Any:
    """Keep ``func``'s result by its (JSON) arguments in :data:`_CHARTS`, for :func:`prerender`."""

    @functools.wraps(func)
    def wrapper(*args: Any) -> Any:
        key = func.__name__ + json.dumps(args, sort_keys=True, default=str)
        with _CHARTS_LOCK:
            hit = _CHARTS.get(key)
        if hit is not None:
            return hit
        out = func(*args)
        with _CHARTS_LOCK:
            _CHARTS[key] = out
        return out

    return wrapper


def write_report(run_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None) -> Path:
    """Render the report of ``run_dir`` and write it atomically to ``output`` (default ``<run_dir>/report.html``).

    Returns:
        The path written.

    Raises:
        InvalidParameter: ``run_dir`` holds no readable ``run.json``.
        OSError: ``output`` cannot be written.
    """
    if _PREWARM is not None:
        _PREWARM.join()
    stop_prerender()
    run = load_run(run_dir)
    target = Path(output).expanduser() if output is not None else Path(run["run_dir"]) / REPORT_FILE
    try:
        # run.json is redacted when written; redact again so a record from elsewhere never puts credentials in a report
        atomic_write_bytes(target, redact_url(render_report(run)).encode("utf-8"), durable=False)
    finally:
        with _CHARTS_LOCK:
            _CHARTS.clear()
    return target


def write_report_quietly(run_dir: str | os.PathLike[str]) -> Path | None:
    """:func:`write_report` for the end of a run: a report that cannot be made is a warning, never a failed run."""
    try:
        return write_report(run_dir)
    except Exception as exc:  # the run's record is written; a report problem must not change the run's outcome
        warnings.warn(f"could not write {REPORT_FILE} for {run_dir}: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
        return None


def write_run_outputs(run_dir: str | os.PathLike[str]) -> None:
    """What every engine writes beside ``run.json`` when a run ends: ``report.html`` and the run's metrics
    (``metrics.prom``, :func:`heteroflow.pipelines.runs.metrics.write_textfile`). Problems are warnings."""
    from heteroflow.pipelines.runs.metrics import write_textfile_quietly

    write_report_quietly(run_dir)
    write_textfile_quietly(run_dir)


# --- rendering ----------------------------------------------------------------------------------------------


def render_report(run: dict[str, Any] | str | os.PathLike[str]) -> str:
    """The report of one run as an HTML document (a string).

    Args:
        run: a run record as :func:`heteroflow.pipelines.runs.folders.load_run` returns it, or a run folder.
    """
    if not isinstance(run, dict):
        run = load_run(run)
    parts = [
        _header(run),
        _graph(run),
        _attempts_table(run),
        _retries(run),
        _fallbacks(run),
        _placement(run),
        _plots(run),
        _classification(run),
        _lineage(run),
        _params(run),
    ]
    title = f"heteroflow run {run.get('run_id', '')}: {run.get('status', '')}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(p for p in parts if p)
        + "\n</body></html>\n"
    )


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _badge(status: Any) -> str:
    colour = _STATUS_COLOURS.get(str(status), "#6e7781")
    return f'<span class="badge" style="background:{colour}">{_e(status)}</span>'


def _seconds(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def _num(value: Any) -> str:
    """Numbers with 4 significant digits (losses keep theirs), others as text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _e(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}"


def _short_error(error: Any) -> str:
    text = str(error or "")
    kind, sep, message = text.partition(": ")
    return message if sep and kind.startswith("heteroflow.") else text


def _header(run: dict[str, Any]) -> str:
    started = run.get("started_at")
    when = (
        _dt.datetime.fromtimestamp(started, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        if isinstance(started, (int, float)) and started > 0
        else "-"
    )
    rows = [
        ("pipeline", _e(run.get("pipeline"))),
        ("started", _e(when)),
        ("wall time", f"{_seconds(run.get('wall_seconds'))} s"),
        ("run folder", f"<code>{_e(run.get('run_dir'))}</code>"),
    ]
    metric = headline_metric(run)
    if metric:
        rows.append((f"test {metric[0]}", f"{metric[1]:.4f}"))
    waits = [r["wait_seconds"] for r in retries(run) if r["wait_seconds"] is not None]
    if waits:
        rows.append(("waiting for retries", f"{sum(waits):.1f} s over {len(waits)} retr{'y' if len(waits) == 1 else 'ies'}"))
    if run.get("testing"):
        rows.append(("testing settings", _e(", ".join(f"{k}={v}" for k, v in run["testing"].items()))))
    out = [f"<h1>Run {_e(run.get('run_id'))} {_badge(run.get('status'))}</h1>", _kv_table(rows)]
    if run.get("error"):
        out.append(f'<p class="error" id="run-error"><b>Stopped by:</b> {_e(_short_error(run["error"]))}</p>')
    failed = [s for s in run.get("steps") or [] if s.get("status") in ("failed", "killed") and s.get("error")]
    for s in failed:
        failure = f" ({_e(s['failure'])} failure)" if s.get("failure") else ""
        out.append(
            f'<p class="error step-error"><b>step {_e(s.get("name"))} {_e(s.get("status"))}{failure}:</b> '
            f'{_e(_short_error(s.get("error")))}</p>'
        )
    return "\n".join(out)


def _kv_table(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _graph(run: dict[str, Any]) -> str:
    steps = [s for s in run.get("steps") or [] if isinstance(s, dict)]
    if not steps:
        return "<h2>Steps</h2><p class=\"muted\">The record holds no steps.</p>"
    nodes = []
    for s in steps:
        colour = _STATUS_COLOURS.get(str(s.get("status")), "#6e7781")
        cand = s.get("candidate")
        lines = [
            f"<b>{_e(s.get('name'))}</b>",
            _e(s.get("status")),
            f"device: {_e(device_of(s))}",
            f"candidate: {_e(cand) if cand is not None else '-'}",
            f"attempts: {_e(s.get('attempts', 0))}",
            f"seconds: {_seconds(s.get('seconds'))}",
        ]
        nodes.append(f'<div class="node" data-step="{_e(s.get("name"))}" style="border-color:{colour}">' + "<br>".join(lines) + "</div>")
    graph = '<div class="graph">' + '<span class="arrow">&rarr;</span>'.join(nodes) + "</div>"
    return "<h2>Steps</h2>" + graph


def _attempts_table(run: dict[str, Any]) -> str:
    rows = []
    for s in run.get("steps") or []:
        recs = attempts(run, s.get("name"))
        if not recs:
            rows.append(
                f"<tr><td>{_e(s.get('name'))}</td><td class=num>-</td><td>{_badge(s.get('status'))}</td>"
                f"<td>{_e(device_of(s))}</td><td class=num>-</td><td class=num>{_seconds(s.get('seconds'))}</td><td></td><td class=error>{_e(_short_error(s.get('error')))}</td></tr>"
            )
            continue
        prev = None
        for r in recs:
            wait = ""
            if prev is not None and isinstance(prev.get("ended_at"), (int, float)) and isinstance(r.get("started_at"), (int, float)):
                wait = f"{max(r['started_at'] - prev['ended_at'], 0.0):.1f}"
            rows.append(
                f"<tr><td>{_e(r.get('step', s.get('name')))}</td><td class=num>{_e(r.get('attempt'))}</td><td>{_badge(r.get('status'))}</td>"
                f"<td>{_e(device_of(r))}</td><td class=num>{_e(r.get('candidate')) if r.get('candidate') is not None else '-'}</td>"
                f"<td class=num>{_seconds(r.get('seconds'))}</td><td class=num>{wait}</td>"
                f"<td class=error>{_e(r.get('failure') + ': ' if r.get('failure') else '')}{_e(_short_error(r.get('error')))}</td></tr>"
            )
            prev = r
    head = "<tr><th>step</th><th>attempt</th><th>status</th><th>device</th><th>candidate</th><th>seconds</th><th>waited s</th><th>failure</th></tr>"
    return "<h2>Attempts</h2><table>" + head + "".join(rows) + "</table>"


def _retries(run: dict[str, Any]) -> str:
    items = retries(run)
    if not items:
        return ""
    rows = "".join(
        f"<tr><td>{_e(r['step'])}</td><td class=num>{_e(r['attempt'])}</td><td>{_e(r['kind'])} (candidate {_e(r['candidate'])})</td>"
        f"<td>{_e(r['after'])}</td><td class=num>{_wait(r['wait_seconds'])}</td>"
        f"<td class=error>{_e(_short_error(r['error']))}</td></tr>"
        for r in items
    )
    total = sum(r["wait_seconds"] or 0.0 for r in items)
    return (
        f"<h2>Retries</h2><p>{len(items)} retr{'y' if len(items) == 1 else 'ies'}, {total:.1f} s spent waiting (backoff).</p>"
        "<table><tr><th>step</th><th>attempt</th><th>on</th><th>after a failure of class</th><th>waited s</th><th>the failure</th></tr>"
        + rows
        + "</table>"
    )


def _wait(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def _fallbacks(run: dict[str, Any]) -> str:
    items = run.get("fallbacks") or []
    if not items:
        return ""
    lis = []
    for f in items:
        acc = f" ({f['accelerator']})" if f.get("accelerator") else ""
        lis.append(
            f'<li class="fallback"><b>{_e(f.get("step"))}</b> left candidate {_e(f.get("candidate"))} '
            f"({_e(f.get('kind'))}{_e(acc)}) after a {_e(f.get('failure'))} failure: <span class=error>{_e(_short_error(f.get('reason')))}</span></li>"
        )
    return "<h2>Fallbacks</h2><ul>" + "".join(lis) + "</ul>"


def _placement(run: dict[str, Any]) -> str:
    placement = run.get("placement") or {}
    if not placement:
        return ""
    lis = []
    for call, p in placement.items():
        if not isinstance(p, dict):
            continue
        res = p.get("resources") or {}
        lis.append(f"<li><b>{_e(call)}</b>: candidate {_e(p.get('index'))} &rarr; {_e(p.get('device_kind') or res.get('kind'))}"
                   f"{' (' + _e(res.get('accelerator')) + ')' if res.get('accelerator') else ''}")
        passed = p.get("passed_over") or []
        if passed:
            lis.append("<ul>" + "".join(f"<li>passed over: {_e(_passed(x))}</li>" for x in passed) + "</ul>")
        lis.append("</li>")
    return "<h2>Placement</h2><ul>" + "".join(lis) + "</ul>"


def _passed(item: Any) -> str:
    if isinstance(item, dict):
        return f"candidate {item.get('index', '?')}: {item.get('reason', json.dumps(item, default=str))}"
    return str(item)


# --- plots --------------------------------------------------------------------------------------------------


_FONT_SIZE = 9.0
"""Points: tick labels and axis labels; titles are matplotlib's ``large`` (1.2x)."""
_TICK_SPACE = 7.0
"""Points between an axis and its tick labels: matplotlib's default tick length (3.5) plus its pad (3.5)."""
_LABEL_PAD = 4.0
"""Points between tick labels and the axis label (matplotlib's ``axes.labelpad``)."""
_TITLE_PAD = 6.0
"""Points between the axes and the title (matplotlib's ``axes.titlepad``)."""
_EDGE = 5.0
"""Points of white space kept at each edge of a figure."""


@contextlib.contextmanager
def _style(label: str) -> Any:
    """matplotlib's settings for the report's plot ``label``, while it is built and saved (a text's size is fixed
    when the text is made): text kept as text in the SVG, and ids salted with the label, so a report's SVG is the
    same for the same run."""
    import matplotlib

    with matplotlib.rc_context({"font.size": _FONT_SIZE, "svg.fonttype": "none", "svg.hashsalt": label}):
        yield


def _figure(width: float, height: float) -> Any:
    """A figure of ``width`` x ``height`` inches, with no layout engine: :func:`_fit` places its axes."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=96)


def _text_extent(texts: Any, size: float, rotation: float = 0.0) -> tuple[float, float]:
    """The widest and the tallest of ``texts`` at ``size`` points, rotated by ``rotation`` degrees, in points
    (``(0, 0)`` for none), measured with the text metrics matplotlib's SVG backend itself uses
    (:class:`matplotlib.textpath.TextToPath`; ``$...$`` as mathtext, as matplotlib draws it), without drawing."""
    import math

    from matplotlib import cbook
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    prop = FontProperties(size=size)
    cos, sin = abs(math.cos(math.radians(rotation))), abs(math.sin(math.radians(rotation)))
    widest = tallest = 0.0
    for text in texts:
        if not text:
            continue
        text = str(text)
        w, h, _ = text_to_path.get_text_width_height_descent(text, prop, ismath=cbook.is_math_text(text))
        widest, tallest = max(widest, w * cos + h * sin), max(tallest, w * sin + h * cos)
    return widest, tallest


def _tick_labels(axis: Any) -> list[str]:
    """The major tick labels ``axis`` draws at its present size, from its locator and formatter (no ticks are
    made)."""
    lo, hi = sorted(axis.get_view_interval())
    slack = 1e-9 * (hi - lo)
    values = list(axis.get_major_locator()())
    labels = axis.get_major_formatter().format_ticks(values)  # all of them, as matplotlib formats them
    return [str(label) for value, label in zip(values, labels) if lo - slack <= value <= hi + slack]


def _rotated_xticks(ax: Any, labels: list[str]) -> float:
    """Set ``labels`` as ``ax``'s x ticks at 0, 1, ...: turned 45 degrees and ending at their tick (matplotlib's
    ``ha="right", rotation_mode="anchor"``) when one is longer than 2 characters, else level; returns the rotation."""
    rotation = 45.0 if max(map(len, labels), default=0) > 2 else 0.0
    if rotation:
        ax.set_xticks(range(len(labels)), labels=labels, rotation=rotation, ha="right", rotation_mode="anchor")
    else:
        ax.set_xticks(range(len(labels)), labels=labels)
    return rotation


def _fit(fig: Any, ax: Any, *, x_rotation: float = 0.0, colorbar: Any = None) -> None:
    """Place ``ax`` (and its ``colorbar``) in ``fig`` with room for the tick labels, axis labels and title.

    What matplotlib's constrained layout finds by drawing the figure twice (about 60% of a plot's time), computed
    from the texts themselves: their sizes (:func:`_text_extent`) plus matplotlib's default tick length, pads and
    title offset. An axis's tick locator picks its ticks for the axes' size, so the labels are measured again once
    the axes is placed, until they no longer change (at most 3 passes). Long texts (step or class names) make the
    figure larger: the axes keep at least half the planned width and height, and the title's width.

    Args:
        fig: the figure (:func:`_figure`); ``ax``: its only axes, fully drawn on (limits and ticks set).
        x_rotation: the x tick labels' rotation, degrees (:func:`_rotated_xticks`: they end at their tick).
        colorbar: a colorbar beside ``ax`` (``fig.colorbar(..., ax=ax)``: placed by ``ax``'s grid, so it moves
            with it); its tick labels are kept in the figure.
    """
    size = _FONT_SIZE
    _, line = _text_extent(["Ag"], size)
    title_w, title = _text_extent([ax.get_title()], size * 1.2) if ax.get_title() else (0.0, 0.0)
    planned_w, planned_h = (v * 72 for v in fig.get_size_inches())
    seen: Any = None
    for _ in range(3):
        labels = (_tick_labels(ax.yaxis), _tick_labels(ax.xaxis), _tick_labels(colorbar.ax.yaxis) if colorbar else [])
        if labels == seen:
            break
        seen = labels
        ytick_w, _ = _text_extent(labels[0], size)
        xtick_w, xtick_h = _text_extent(labels[1], size, x_rotation)
        scale_w = _text_extent(labels[2], size)[0] + _TICK_SPACE if colorbar else 0.0
        left = _EDGE + ytick_w + _TICK_SPACE + (line + _LABEL_PAD if ax.get_ylabel() else 0.0)
        if x_rotation:  # the first label reaches left of its tick by its whole turned width
            left = max(left, _EDGE + _text_extent(labels[1][:1], size, x_rotation)[0])
        bottom = _EDGE + xtick_h + _TICK_SPACE + (line + _LABEL_PAD if ax.get_xlabel() else 0.0)
        top = _EDGE + (title + _TITLE_PAD if title else 0.0)
        # level x labels are centred on their tick: the last one reaches right of the axes by half its width
        right = _EDGE + max(scale_w, 0.0 if x_rotation else xtick_w / 2)
        # long texts make the figure larger rather than the axes smaller than half the planned size (or than the
        # title, which is centred over the axes): a report has room, and nothing is clipped
        width = max(planned_w, left + right + max(planned_w / 2, title_w))
        height = max(planned_h, bottom + top + planned_h / 2)
        fig.set_size_inches(width / 72, height / 72)
        fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)


def _svg(fig: Any, label: str) -> str:
    """``fig`` as an inline SVG element of the report; called inside ``_style(label)``."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, flags=re.S)  # RDF/Dublin Core boilerplate with URLs
    # ids are unique per document: prefix the ones matplotlib made with the plot's label
    prefix = re.sub(r"[^a-z0-9]", "", label.lower()) + "-"
    text = re.sub(r'id="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', text)
    text = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", text)
    text = re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#{prefix}{m.group(1)}"', text)
    return f'<div class="plot" data-plot="{_e(label)}" role="img" aria-label="{_e(label)}">{text}</div>'


def _plots(run: dict[str, Any]) -> str:
    out = []
    timeline = _timeline_plot(run)
    if timeline:
        out.append(timeline)
    for call, history in history_of(run).items():
        out.extend(_history_plots(call, history))
    if not out:
        return ""
    note = "" if history_of(run) else '<p class="muted">The record holds no per-epoch history.</p>'
    return "<h2>Plots</h2>" + note + '<div class="plots">' + "".join(out) + "</div>"


def _timeline_plot(run: dict[str, Any]) -> str:
    recs = [(name, r) for name, rs in (run.get("attempts") or {}).items() for r in rs if isinstance(r.get("started_at"), (int, float))]
    if not recs:
        return ""
    t0 = min(r["started_at"] for _, r in recs)
    order = [s.get("name") for s in run.get("steps") or []]
    names = [n for n in order if any(n == name for name, _ in recs)] + sorted({n for n, _ in recs} - set(order))
    with _style("timeline"):
        return _draw_timeline(run, recs, t0, names)


def _draw_timeline(run: dict[str, Any], recs: list[tuple[str, dict[str, Any]]], t0: float, names: list[str]) -> str:
    fig = _figure(7.5, 0.45 * len(names) + 1.0)
    ax = fig.add_subplot()
    colours = {"succeeded": "#2da44e", "failed": "#cf222e", "running": "#0969da", "interrupted": "#bf8700"}
    for y, name in enumerate(names):
        for _, r in (x for x in recs if x[0] == name):
            start = r["started_at"] - t0
            end = (r.get("ended_at") or r["started_at"] + (r.get("seconds") or 0.0)) - t0
            ax.barh(y, max(end - start, 0.01), left=start, color=colours.get(r.get("status"), "#8c959f"), edgecolor="black", linewidth=0.4)
    waited = [r for r in retries(run) if r["wait_seconds"]]
    for r in waited:
        if r["wait_seconds"]:
            nxt = next((x for n, x in recs if n == r["step"] and x.get("attempt") == r["attempt"]), None)
            if nxt is not None:
                ax.barh(names.index(r["step"]), r["wait_seconds"], left=nxt["started_at"] - t0 - r["wait_seconds"], color="none", hatch="//", edgecolor="#9a6700", linewidth=0.4)
    ax.set_yticks(range(len(names)), labels=names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first attempt started" + (" (hatched: waiting to retry)" if waited else ""))
    ax.set_title("attempts over time (green succeeded, red failed)")
    _fit(fig, ax)
    return _svg(fig, "timeline")


@_memo
def _history_plots(call: str, history: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for entry in history:
        for k, v in entry.items():
            if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool) and k not in keys:
                keys.append(k)
    if not keys:
        return []
    xs = [e.get("epoch", i + 1) for i, e in enumerate(history)]
    losses = [k for k in keys if "loss" in k]
    scores = [k for k in keys if k in ("accuracy", "validation_accuracy", "train_accuracy", "f1", "precision", "recall") or k.endswith("accuracy")]
    groups = [("loss", losses), ("metrics", scores)]
    out = []
    for title, group in groups:
        if not group:
            continue
        with _style(f"{call} {title}"):
            out.append(_history_plot(call, title, group, xs, history))
    return out


def _history_plot(call: str, title: str, group: list[str], xs: list[Any], history: list[dict[str, Any]]) -> str:
    fig = _figure(5.0, 3.0)
    ax = fig.add_subplot()
    for k in group:
        pts = [(x, e[k]) for x, e in zip(xs, history) if isinstance(e.get(k), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=k)
    ax.set_xlabel("epoch")
    ax.set_ylabel(title)
    ax.set_title(f"{call}: {title} per epoch")
    ax.grid(alpha=0.3)
    ax.legend()
    _fit(fig, ax)
    return _svg(fig, f"{call} {title}")


# --- classification --------------------------------------------------------------------------------------


def _classification(run: dict[str, Any]) -> str:
    out = []
    for call, facts in (run.get("results") or {}).items():
        if not isinstance(facts, dict):
            continue
        # Any step's results are read here, a user's step too: a key named like evaluate's ("classes": 10, a
        # "confusion_matrix" of another shape) is drawn only when it has evaluate's shape.
        cm = facts.get("confusion_matrix")
        prec, rec = facts.get("precision"), facts.get("recall")
        named = facts.get("classes")
        classes = [str(c) for c in named] if isinstance(named, list) else []
        if _is_square_matrix(cm):
            if len(classes) != len(cm):
                classes = [str(i) for i in range(len(cm))]
            out.append(f"<h3>{_e(call)}: confusion matrix</h3>" + _confusion_table(cm, classes) + _confusion_plot(call, cm, classes))
        if _is_per_class(prec) and _is_per_class(rec) and prec:
            out.append(f"<h3>{_e(call)}: per-class precision and recall</h3>" + _per_class_table(prec, rec, facts) + _per_class_plot(call, prec, rec))
    if not out:
        return ""
    return "<h2>Evaluation</h2>" + "".join(out)


def _is_square_matrix(cm: Any) -> bool:
    """True for a non-empty n x n list of lists of numbers (evaluate's ``confusion_matrix``)."""
    return (
        isinstance(cm, list)
        and bool(cm)
        and all(isinstance(row, list) and len(row) == len(cm) for row in cm)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for row in cm for v in row)
    )


def _is_per_class(values: Any) -> bool:
    """True for evaluate's per-class ``precision``/``recall``: a dict of class name -> number (or None)."""
    return isinstance(values, dict) and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values.values())


def _confusion_table(cm: list[list[Any]], classes: list[str]) -> str:
    peak = max((v for row in cm for v in row if isinstance(v, (int, float))), default=1) or 1
    head = "<tr><th>true \\ predicted</th>" + "".join(f"<th>{_e(c)}</th>" for c in classes) + "</tr>"
    rows = []
    for name, row in zip(classes, cm):
        cells = []
        for v in row:
            share = (v / peak) if isinstance(v, (int, float)) else 0
            cells.append(f'<td class=num style="background:rgba(9,105,218,{0.08 + 0.6 * share:.2f})">{_e(v)}</td>')
        rows.append(f"<tr><th>{_e(name)}</th>{''.join(cells)}</tr>")
    return '<table class="confusion">' + head + "".join(rows) + "</table>"


@_memo
def _confusion_plot(call: str, cm: list[list[Any]], classes: list[str]) -> str:
    with _style(f"{call} confusion"):
        fig = _figure(4.2, 3.6)
        ax = fig.add_subplot()
        image = ax.imshow(cm, cmap="Blues")
        rotation = _rotated_xticks(ax, classes)
        ax.set_yticks(range(len(classes)), labels=classes)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_title(f"{call}: confusion matrix")
        bar = fig.colorbar(image, ax=ax)  # placed beside ax by its grid: _fit moves both
        _fit(fig, ax, x_rotation=rotation, colorbar=bar)
        return '<div class="plots">' + _svg(fig, f"{call} confusion") + "</div>"


def _per_class_table(prec: dict[str, Any], rec: dict[str, Any], facts: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{_e(c)}</td><td class=num>{_num(prec.get(c))}</td><td class=num>{_num(rec.get(c))}</td></tr>" for c in prec
    )
    extra = f"<p>accuracy {_num(facts.get('accuracy'))} on {_e(facts.get('samples', '?'))} samples</p>" if "accuracy" in facts else ""
    return extra + "<table><tr><th>class</th><th>precision</th><th>recall</th></tr>" + rows + "</table>"


@_memo
def _per_class_plot(call: str, prec: dict[str, Any], rec: dict[str, Any]) -> str:
    classes = list(prec)
    with _style(f"{call} per class"):
        fig = _figure(max(4.0, 0.45 * len(classes) + 1.5), 3.0)
        ax = fig.add_subplot()
        xs = range(len(classes))
        ax.bar([x - 0.2 for x in xs], [prec.get(c) or 0 for c in classes], width=0.4, label="precision")
        ax.bar([x + 0.2 for x in xs], [rec.get(c) or 0 for c in classes], width=0.4, label="recall")
        rotation = _rotated_xticks(ax, classes)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{call}: precision and recall per class")
        ax.legend(loc="lower right")
        _fit(fig, ax, x_rotation=rotation)
        return '<div class="plots">' + _svg(fig, f"{call} per class") + "</div>"


# --- lineage and parameters ----------------------------------------------------------------------------------


def _lineage(run: dict[str, Any]) -> str:
    results = run.get("results") or {}
    data = next((f for f in results.values() if isinstance(f, dict) and "dataset_sha256" in f), None)
    model = next((f for f in results.values() if isinstance(f, dict) and "version" in f and "name" in f and "path" in f), None)
    steps = {s.get("name"): s for s in run.get("steps") or []}
    chain = []
    if data:
        chain.append(
            f"data set <code>{_e(data.get('source_uri'))}</code> version <code>{_e(data.get('version'))}</code> "
            f"(sha256 <code>{_e(str(data.get('dataset_sha256'))[:12])}</code>, {_e(data.get('files'))} files)"
        )
    for name, facts in results.items():
        counts = facts.get("counts") if isinstance(facts, dict) else None
        if isinstance(counts, dict) and "num_classes" in facts and all(isinstance(v, (int, float)) for v in counts.values()):
            chain.append(f"{_e(name)}: {_e(sum(counts.values()))} rows, {_e(facts.get('num_features'))} features, {_e(facts.get('num_classes'))} classes")
        if isinstance(facts, dict) and "final_loss" in facts:
            chain.append(f"{_e(name)} on {_e(device_of(steps.get(name, {})))}: final loss {_num(facts.get('final_loss'))}")
    if model:
        chain.append(f"model <b>{_e(model.get('name'))}:v{_e(model.get('version'))}</b> <code>{_e(model.get('path'))}</code>")
    if not chain:
        return ""
    return "<h2>Lineage</h2><ol class=\"lineage\">" + "".join(f"<li>{c}</li>" for c in chain) + "</ol>"


def _params(run: dict[str, Any]) -> str:
    params = run.get("params") or {}
    if not params:
        return ""
    return "<h2>Parameters</h2>" + _kv_table([(k, _e(json.dumps(v) if not isinstance(v, str) else v)) for k, v in params.items()])
