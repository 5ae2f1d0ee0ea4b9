"""The run report as a KFP ``HTML`` artifact, written by the run's last task (``check: every step succeeded``).

The Kubeflow UI shows an ``HTML`` output artifact in the task's Visualizations; this one is the report
``heteroflow report`` renders (:func:`heteroflow.pipelines.runs.report.render_report`), of the run as it stands
when every step has ended:

- with a run folder (``$HETEROFLOW_RUN_DIR``: ``heteroflow run`` on kfp.local, or a cluster whose steps share
  one), from the steps' attempt records (:func:`heteroflow.pipelines.runs.records.build_record`): devices,
  attempts, retries, fallbacks, metrics, the confusion matrix, lineage down to the archived ``name:vN``;
- without one, from the steps' routes alone (each step's status and failure).

The status is ``succeeded`` when every step succeeded, else ``failed``. A task that fails registers no outputs
in KFP, so a run that failed has the file written but not shown as an artifact; ``heteroflow run`` writes
``report.html`` in the run folder either way. A report that cannot be made never changes the run's outcome: the
artifact then says why.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__all__ = ["report_record", "write_report_artifact"]


def _route_status(route: str) -> str:
    if route == "succeeded":
        return "succeeded"
    if route == "upstream":
        return "not run"
    return "failed"


def report_record(pipeline: str, steps: Mapping[str, str], routes: Mapping[str, str]) -> dict[str, Any]:
    """The run record the report renders (the shape :func:`heteroflow.pipelines.runs.folders.load_run` returns).

    Args:
        pipeline: the pipeline's name.
        steps: call name -> its step's ``module:attribute``, in pipeline order.
        routes: call name -> the route its task returned (``succeeded``, ``failed: <class>: <reason>``, ``upstream``).
    """
    from heteroflow.components.core.telemetry import RUN_DIR_ENV
    from heteroflow.components.models.archive import RUN_ID_ENV

    status = "succeeded" if all(routes.get(c) == "succeeded" for c in steps) else "failed"
    error = next((f"step {c!r} {r}" for c, r in routes.items() if r.startswith("failed")), None)
    folder = Path(os.environ[RUN_DIR_ENV]) if os.environ.get(RUN_DIR_ENV) else None
    if folder is not None and (folder / "steps").is_dir():
        from heteroflow.components.core.step import load_step
        from heteroflow.pipelines.runs.folders import _read_attempts
        from heteroflow.pipelines.runs.records import DRIVER_FILE, build_record

        try:
            driver = json.loads((folder / DRIVER_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            driver = {}
        calls = [SimpleNamespace(name=c, step=load_step(ref)) for c, ref in steps.items()]
        started = float(driver.get("started_at") or time.time())
        record = build_record(
            SimpleNamespace(name=pipeline, calls=calls),  # type: ignore[arg-type]  # what build_record reads of a Pipeline
            run_id=str(driver.get("run_id") or os.environ.get(RUN_ID_ENV) or folder.name),
            folder=folder,
            started=started,
            wall_seconds=time.time() - started,
            args=driver.get("params") or {},
            interrupted=False,
            error=error,
        ).to_dict()
        record["status"] = status
        record["attempts"] = _read_attempts(folder)
        return record
    return {
        "run_id": os.environ.get(RUN_ID_ENV) or "",
        "pipeline": pipeline,
        "status": status,
        "error": error,
        "steps": [
            {"name": c, "status": _route_status(routes.get(c, "")),
             "error": routes[c].partition(": ")[2] if routes.get(c, "").startswith("failed") else None}
            for c in steps
        ],
        "attempts": {},
        "results": {},
        "metrics": {},
    }


def write_report_artifact(report: Any, *, pipeline: str, steps: Mapping[str, str], routes: Mapping[str, str]) -> None:
    """Write the run report into ``report`` (a KFP ``Output[HTML]``: ``path`` and ``metadata``), atomically, and put
    the run's id, status and pipeline in its metadata. Never raises: a report that cannot be made is a warning
    and a page that says why; a task given no artifact (``report`` None: an executor input without the output)
    writes nothing."""
    from heteroflow.cache.atomic import atomic_write_bytes
    from heteroflow.cache.redact import redact_url

    if report is None:
        return
    try:
        from heteroflow.pipelines.runs.report import render_report

        record = report_record(pipeline, steps, routes)
        html = render_report(record)
    except Exception as exc:  # the run's outcome is the check's to decide, never the report's
        warnings.warn(f"could not render the run report: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
        from html import escape

        record = {"status": "failed" if any(r != "succeeded" for r in routes.values()) else "succeeded", "run_id": ""}
        html = (f"<!DOCTYPE html><html><body><h1>heteroflow run {escape(pipeline)}</h1><p>The report could not be "
                f"rendered: {escape(type(exc).__name__)}: {escape(str(exc))}</p></body></html>\n")
    path = Path(report.path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, redact_url(html).encode("utf-8"), durable=False)
    except OSError as exc:
        warnings.warn(f"could not write the run report to {path}: {exc}", RuntimeWarning, stacklevel=2)
    report.metadata.update({"run_id": record.get("run_id") or "", "status": record.get("status") or "", "pipeline": pipeline})
