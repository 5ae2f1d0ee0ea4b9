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

This module writes and assembles the report; the rest is in :mod:`~heteroflow.pipelines.runs.sections` (the
sections as HTML), :mod:`~heteroflow.pipelines.runs.charts` (the matplotlib plots as inline SVG, and their memo),
:mod:`~heteroflow.pipelines.runs.markup` (style sheet, escaping, formats) and
:mod:`~heteroflow.pipelines.runs.prerendering` (matplotlib imported and plots drawn in the background while a run
goes on: :func:`prewarm`, :func:`prerender`, :func:`stop_prerender`, re-exported here).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from heteroflow.cache.atomic import atomic_write_bytes
from heteroflow.cache.redact import redact_url
from heteroflow.pipelines.runs import charts, prerendering
from heteroflow.pipelines.runs.folders import load_run
from heteroflow.pipelines.runs.markup import _CSS, _e
from heteroflow.pipelines.runs.mixed_section import mixed_section
from heteroflow.pipelines.runs.prerendering import prerender, prewarm, stop_prerender  # noqa: F401 - re-exported: the old path
from heteroflow.pipelines.runs.sections import (
    _attempts_table,
    _classification,
    _fallbacks,
    _graph,
    _header,
    _lineage,
    _params,
    _placement,
    _plots,
    _retries,
)

__all__ = ["REPORT_FILE", "render_report", "write_report", "write_report_quietly", "write_run_outputs"]

REPORT_FILE = "report.html"


# --- writing ------------------------------------------------------------------------------------------------


def write_report(run_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None) -> Path:
    """Render the report of ``run_dir`` and write it atomically to ``output`` (default ``<run_dir>/report.html``).

    Returns:
        The path written.

    Raises:
        InvalidParameter: ``run_dir`` holds no readable ``run.json``.
        OSError: ``output`` cannot be written.
    """
    thread = prerendering._PREWARM
    if thread is not None:
        thread.join()
    stop_prerender()
    run = load_run(run_dir)
    target = Path(output).expanduser() if output is not None else Path(run["run_dir"]) / REPORT_FILE
    try:
        # run.json is redacted when written; redact again so a record from elsewhere never puts credentials in a report
        atomic_write_bytes(target, redact_url(render_report(run)).encode("utf-8"), durable=False)
    finally:
        with charts._CHARTS_LOCK:
            charts._CHARTS.clear()
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
        mixed_section(run),
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
