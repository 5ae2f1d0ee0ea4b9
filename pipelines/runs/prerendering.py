"""The run report's work ahead of the end of a run, in background threads: importing matplotlib while the steps run
(:func:`prewarm`), and drawing the plots of each finished step while later steps run (:func:`prerender`, stopped
by :func:`stop_prerender`). The drawings go to the memo of :mod:`heteroflow.pipelines.runs.charts`; the report
(:func:`heteroflow.pipelines.runs.report.write_report`) joins and stops these threads first."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any

from heteroflow.pipelines.runs.charts import _history_plots, _import_plotting, _plotting_imported
from heteroflow.pipelines.runs.folders import history_of
from heteroflow.pipelines.runs.sections import _classification

__all__ = ["prerender", "prewarm", "stop_prerender"]

_PREWARM: threading.Thread | None = None
_PRERENDER: tuple[threading.Thread, threading.Event, threading.Event] | None = None


def _has_plots(details: Any) -> bool:
    """Whether a step's result ``details`` hold something the report plots (a per-epoch history, evaluate's
    confusion matrix or per-class scores)."""
    if not isinstance(details, dict):
        return False
    return bool(history_of({"results": {"step": dict(details)}})) or "confusion_matrix" in details or "precision" in details


def prewarm() -> None:
    """Import matplotlib (about 0.4 s) in a background thread while a run's steps execute, so the report written
    when the run ends does not wait for it (the driver is idle then, waiting for step processes). Idempotent;
    :func:`~heteroflow.pipelines.runs.report.write_report` joins the thread first."""
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
    plots are kept by their inputs (:func:`heteroflow.pipelines.runs.charts._memo`): the report written at the end
    uses one only when the final record holds the same data, and draws anything else itself, so the report is the
    same with or without this.
    matplotlib is imported (about 0.5 s of CPU) after the first task has ended (or ``interval`` has passed), once a
    core is idle
    (:func:`heteroflow.pipelines.kfp.prestart.idle_cores_meter`, as prestarted step processes start) or a finished step
    has plots to draw: never while the driver starts the run or a step uses every core. The thread reads the
    attempt records (:func:`heteroflow.pipelines.runs.records.collect`) each time ``wake`` is set
    (the runner sets it when a task ends) and at least every ``interval`` seconds; it stops at
    :func:`stop_prerender`, which :func:`~heteroflow.pipelines.runs.report.write_report` calls first. Problems are
    ignored here: the report's own rendering reports them.

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
        with contextlib.suppress(Exception):  # metrics.prom is written when the run ends too (~10 ms of import)
            import prometheus_client  # noqa: F401
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
                        facts = summary.details
                        _history_plots(call, history, facts.get("resumed_from_step") or 0, facts.get("steps") or 0)
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
