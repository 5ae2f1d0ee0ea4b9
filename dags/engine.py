"""The ``airflow`` engine: ``heteroflow.run(engine="airflow")`` / ``heteroflow run --engine airflow`` run the pipeline's
DAG (:func:`heteroflow.dags.factory.build_dag`, local mode) with a real Airflow 3 on SQLite, ``airflow dags test``
style, and return the run's record (the ``run.json`` the DAG's ``record-run`` task writes).

It lives in ``dags/`` because imports go ``dags -> pipelines``, and it is registered through the ``heteroflow.engines``
entry point (pyproject.toml), the extension point any other package uses. Importing this module imports nothing
from Airflow; :class:`AirflowEngine` runs Airflow's own command line in a child process:

1. ``airflow db migrate`` in ``AIRFLOW_HOME`` (option ``airflow_home``; default ``$AIRFLOW_HOME``, else
   ``<heteroflow home>/airflow``; Airflow's default SQLite database ``airflow.db`` lives there);
2. ``airflow dags reserialize`` over a DAGS_FOLDER of the engine's own, ``<AIRFLOW_HOME>/heteroflow-engine-dags``,
   holding one DAG file per pipeline (DESIGN.md: Airflow 3.3 tests only a serialized DAG);
3. ``airflow dags test DAG_ID -c PARAMS``: every task in that process, one after another.

The DAG is built in Airflow's process from the pipeline's ``module:attribute`` (``source``): a Pipeline value made in
this process cannot be handed over. Its tasks use Airflow's default pool (no ``heteroflow airflow pools`` needed).
Airflow's output goes to ``<run_dir>/airflow.log`` (``echo_engine_output``: to this process's stdout). Runs that
share an ``AIRFLOW_HOME`` must not run at once (SQLite, and one DAG file per pipeline).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.components.errors import HeteroflowError, InvalidParameter

if TYPE_CHECKING:
    from heteroflow.pipelines.graph import Pipeline
    from heteroflow.pipelines.runs.records import RunRecord

__all__ = ["ENGINE", "RUN_DIR_ENV", "AirflowEngine", "AirflowRunError", "engine_dag"]

RUN_DIR_ENV = "HETEROFLOW_AIRFLOW_ENGINE_RUN_DIR"
"""The run folder of the engine's run, read by :func:`engine_dag` while Airflow parses the engine's DAG file."""

ENGINE_LOG = "airflow.log"
"""Airflow's own output, in the run folder."""

_DAG_FILE = """\
# Airflow DAG file written by heteroflow's airflow engine (heteroflow.dags.engine); rewritten by each run.
from heteroflow.dags.engine import engine_dag

dag = engine_dag({source!r}, {dag_id!r})
"""


class AirflowRunError(HeteroflowError, RuntimeError):
    """Airflow could not be set up or ended without writing the run's record; the message holds its output's tail
    and the log file."""


def engine_dag(source: str, dag_id: str) -> Any:
    """The DAG of the engine's DAG file: the pipeline at ``source`` (``module:attribute``) in local mode, without pools,
    its run folder fixed to ``$HETEROFLOW_AIRFLOW_ENGINE_RUN_DIR`` when set (else ``<heteroflow home>/airflow-runs/
    <dag id>/<run id>``, as any DAG of :func:`heteroflow.dags.factory.build_dag`).

    Raises:
        InvalidParameter: ``source`` does not name a pipeline (see :func:`heteroflow.pipelines.graph.load_pipeline`).
    """
    from heteroflow.dags.factory import build_dag
    from heteroflow.dags.layout import PREPARE_TASK
    from heteroflow.pipelines.graph import load_pipeline

    dag = build_dag(load_pipeline(source), dag_id, pools=False)
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir:
        folder = Path(run_dir)
        dag.get_task(PREPARE_TASK).run_folder = lambda run_id: folder  # this one run's folder, whatever its Airflow run id
    return dag


def _dag_id(pipeline_name: str) -> str:
    return "heteroflow-engine-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", pipeline_name).strip("-") or "pipeline")


class AirflowEngine:
    """``airflow``: the pipeline's DAG on a real Airflow 3 with SQLite (module docstring).

    Options: ``airflow_home`` (default ``$AIRFLOW_HOME``, else ``<heteroflow home>/airflow``), ``timeout_seconds``
    (each Airflow command; default 3600). ``on_progress`` is not honoured (Airflow runs the tasks in its own process).
    """

    name = "airflow"
    description = "a real Airflow 3 on SQLite, `airflow dags test` style (the pipeline as its DAG)"
    extra: str | None = "airflow"
    modules = ("airflow",)
    options = frozenset({"echo_engine_output"})

    def run(
        self,
        pipeline: Pipeline,
        params: Mapping[str, Any] | None,
        *,
        run_dir: str | os.PathLike[str] | None,
        simulate_devices: Any,
        inject_faults: Any,
        on_progress: Any = None,
        echo_engine_output: bool = False,
        source: str | None = None,
        **options: Any,
    ) -> RunRecord:
        """Run ``pipeline`` (imported in Airflow's process from ``source``) and return its record.

        Raises:
            InvalidParameter: no ``source`` (a Pipeline value made in this process), an unknown option or
                parameter, bad testing settings, a run folder that cannot be used.
            AirflowRunError: an Airflow command failed, or the run ended without ``run.json``.
        """
        from heteroflow.cache.locations import home_dir
        from heteroflow.pipelines.environment import testing_environment
        from heteroflow.pipelines.runs.records import RunRecord, StepSummary, new_run_id, prepare_arguments, prepare_run_dir

        unknown = sorted(set(options) - {"airflow_home", "timeout_seconds"})
        if unknown:
            raise InvalidParameter(f"engine='airflow' has no option {unknown[0]!r}; valid engine options: airflow_home, timeout_seconds")
        if not source:
            raise InvalidParameter(
                "engine='airflow' builds the DAG in Airflow's own process, so it needs the pipeline as 'module:attribute' "
                "(pipeline='mymodule:build', or source=... beside a Pipeline value); valid: a reference, or None for the default pipeline"
            )
        prepare_arguments(pipeline, params)  # names, types and a local data set checked before Airflow starts
        timeout = float(options.get("timeout_seconds") or 3600)
        home = Path(options.get("airflow_home") or os.environ.get("AIRFLOW_HOME") or home_dir() / "airflow").absolute()
        dags = home / "heteroflow-engine-dags"
        dags.mkdir(parents=True, exist_ok=True)
        dag_id = _dag_id(pipeline.name)
        (dags / f"{dag_id.replace('-', '_').replace('.', '_')}.py").write_text(_DAG_FILE.format(source=source, dag_id=dag_id), encoding="utf-8")
        run_id = new_run_id()
        folder = prepare_run_dir(Path(run_dir) if run_dir is not None else Path.cwd() / "heteroflow-runs" / run_id)
        conf = {k: v for k, v in dict(params or {}).items()}
        with testing_environment(simulate_devices, inject_faults, pipeline=pipeline):
            env = {
                **os.environ,
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                RUN_DIR_ENV: str(folder),
                # the pipeline's module is imported in Airflow's process as load_pipeline finds it here
                "PYTHONPATH": os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]),
            }
            log_path = folder / ENGINE_LOG
            with open(log_path, "a", encoding="utf-8") as log:
                out = sys.stdout if echo_engine_output else log
                for command in (["db", "migrate"], ["dags", "reserialize"], ["dags", "test", dag_id, "-c", json.dumps(conf, default=str)]):
                    started = time.monotonic()
                    try:
                        done = subprocess.run(
                            [sys.executable, "-m", "airflow", *command],
                            env=env,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            text=True,
                            timeout=timeout,
                        )
                    except subprocess.TimeoutExpired:
                        raise AirflowRunError(f"`airflow {' '.join(command[:2])}` ran past timeout_seconds={timeout:g}; log: {log_path}") from None
                    out.write(f"$ airflow {' '.join(command)}  ({time.monotonic() - started:.1f} s, exit {done.returncode})\n{done.stdout}")
                    out.flush()
                    if done.returncode != 0 and command[1] != "test":  # a failed run is told by its record
                        tail = " ".join(done.stdout[-1500:].split())
                        raise AirflowRunError(f"`airflow {' '.join(command)}` failed (exit {done.returncode}): {tail}; log: {log_path}")
        path = folder / "run.json"
        if not path.is_file():
            tail = " ".join(done.stdout[-1500:].split())
            raise AirflowRunError(f"the Airflow run of {dag_id} ended without a record ({path}): {tail}; log: {log_path}")
        data = json.loads(path.read_text(encoding="utf-8"))
        data["steps"] = [StepSummary.from_dict(s) for s in data.get("steps", [])]
        return RunRecord(**data)


ENGINE = AirflowEngine()
"""The engine object the ``heteroflow.engines`` entry point ``airflow`` names."""
