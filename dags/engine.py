"""The ``airflow`` engine: ``heteroflow.run(engine="airflow")`` / ``heteroflow run --engine airflow`` run the pipeline's
DAG (:func:`heteroflow.dags.factory.build_dag`, local mode) with a real Airflow 3 on SQLite, ``airflow dags test``
style, and return the run's record (the ``run.json`` the DAG's ``record-run`` task writes).

It lives in ``dags/`` because imports go ``dags -> pipelines``, and it is registered through the ``heteroflow.engines``
entry point (pyproject.toml), the extension point any other package uses. Importing this module imports nothing
from Airflow; :class:`AirflowEngine` runs Airflow's own commands in one child process (:func:`_airflow_commands`
parses each with Airflow's own CLI parser and calls it as ``airflow ...`` would), so Airflow and its providers are
imported and configured once per run, not once per command:

1. ``airflow db migrate`` in ``AIRFLOW_HOME`` (option ``airflow_home``; default ``$AIRFLOW_HOME``, else
   ``<heteroflow home>/airflow``; Airflow's default SQLite database ``airflow.db`` lives there); on a database
   already at Airflow's head revision it changes nothing;
2. ``airflow dags test DAG_ID LOGICAL_DATE -c PARAMS`` (the logical date from this process's clock: it identifies
   the Airflow run) over a DAGS_FOLDER of the engine's own, ``<AIRFLOW_HOME>/heteroflow-engine-dags``,
   holding one DAG file per pipeline: every task in that process, one after another. ``dags test`` parses the DAG
   file and writes the serialized DAG to the database itself before it runs (Airflow 3.3 tests only a serialized
   DAG, DESIGN.md), so no ``airflow dags reserialize`` is run first (it cost a process start and a second parse).

The DAG is built in Airflow's process from the pipeline's ``module:attribute`` (``source``): a Pipeline value made in
this process cannot be handed over, but its device-bound calls' candidates are (given to Airflow's process as JSON in
:data:`PLACEMENTS_ENV`, not in the DAG file every run shares, and set on the imported pipeline's calls), so ``heteroflow run --engine airflow -c cpu`` runs the default pipeline with
those candidates. Its tasks use Airflow's default pool (no ``heteroflow airflow pools`` needed).
A run stopped here (Ctrl-C, SIGTERM) kills Airflow's process, writes heteroflow's record, then ends Airflow's record of
the run as that one says, as "Mark failed" in Airflow's UI does (:func:`_fail_stopped_run`, in a short child process
of its own): the run ``failed`` with a note, its running task ``failed``, those not started ``skipped`` (``success``
where every step had finished); left ``running``, it would show as running in the UI for good.
Airflow's output goes to ``<run_dir>/airflow.log`` as it comes (``echo_engine_output``: to this process's stdout too). Runs that
share an ``AIRFLOW_HOME`` must not run at once (SQLite, and one DAG file per pipeline).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.components.errors import HeteroflowError, InvalidParameter

if TYPE_CHECKING:
    from heteroflow.pipelines.graph import Pipeline
    from heteroflow.pipelines.runs.records import RunRecord

__all__ = ["ENGINE", "RUN_DIR_ENV", "AirflowEngine", "AirflowRunError", "engine_dag"]

RUN_DIR_ENV = "HETEROFLOW_AIRFLOW_ENGINE_RUN_DIR"
"""The run folder of the engine's run, read by :func:`engine_dag` while Airflow parses the engine's DAG file."""

PLACEMENTS_ENV = "HETEROFLOW_AIRFLOW_ENGINE_PLACEMENTS"
"""The run's ``{call: candidates JSON}`` (JSON), read by :func:`engine_dag` while Airflow parses the engine's DAG
file: in the environment of the run's own Airflow process, not in the DAG file, which every run of the pipeline
shares (two runs at once with other ``-c`` candidates took each other's)."""

ENGINE_LOG = "airflow.log"
"""Airflow's own output, in the run folder."""

_DAG_FILE = """\
# Airflow DAG file written by heteroflow's airflow engine (heteroflow.dags.engine); a run's candidates come from
# its own Airflow process's environment (HETEROFLOW_AIRFLOW_ENGINE_PLACEMENTS).
from heteroflow.dags.engine import engine_dag

dag = engine_dag({source!r}, {dag_id!r})
"""


class AirflowRunError(HeteroflowError, RuntimeError):
    """Airflow could not be set up or ended without writing the run's record; the message holds its output's tail
    and the log file."""


class _AirflowTimedOut(AirflowRunError):
    """Airflow's process ran past ``timeout_seconds`` and was killed."""


def engine_dag(source: str, dag_id: str, placements: Mapping[str, str] | None = None) -> Any:
    """The DAG of the engine's DAG file: the pipeline at ``source`` (``module:attribute``) in local mode, without pools
    and without the run's summary in record-run's output (``heteroflow run`` prints it once Airflow has ended), its
    run folder fixed to ``$HETEROFLOW_AIRFLOW_ENGINE_RUN_DIR`` when set (else ``<heteroflow home>/airflow-runs/
    <dag id>/<run id>``, as any DAG of :func:`heteroflow.dags.factory.build_dag`).

    Args:
        placements: ``{call: candidates JSON}`` of the pipeline value the run was given
            (:attr:`~heteroflow.pipelines.graph.Pipeline.placements`): each call's candidates are set to them (the
            default pipeline with ``-c`` candidates is imported from its function, then given those); None: from
            ``$HETEROFLOW_AIRFLOW_ENGINE_PLACEMENTS`` (:data:`PLACEMENTS_ENV`, set by the engine for its run) when set.

    Raises:
        InvalidParameter: ``source`` does not name a pipeline (see :func:`heteroflow.pipelines.graph.load_pipeline`),
            or a call in ``placements`` that it does not have.
    """
    from heteroflow.components.resources import Candidates
    from heteroflow.dags.factory import build_dag
    from heteroflow.dags.layout import PREPARE_TASK, RECORD_TASK
    from heteroflow.pipelines.graph import load_pipeline

    pipeline = load_pipeline(source)
    if placements is None and os.environ.get(PLACEMENTS_ENV):
        placements = json.loads(os.environ[PLACEMENTS_ENV])
    for call, text in (placements or {}).items():
        if call not in pipeline:
            raise InvalidParameter(f"{source} has no call {call!r}, which the run's pipeline places; valid: {', '.join(pipeline.placements())}")
        if pipeline[call].candidates.to_json() != text:
            pipeline.replace(call, candidates=Candidates.from_json(text))
    dag = build_dag(pipeline, dag_id, pools=False)
    dag.get_task(RECORD_TASK).print_summary = False  # `heteroflow run` prints the summary once Airflow has ended
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir:
        folder = Path(run_dir)
        dag.get_task(PREPARE_TASK).run_folder = lambda run_id: folder  # this one run's folder, whatever its Airflow run id
    return dag


def _dag_id(pipeline_name: str) -> str:
    return "heteroflow-engine-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", pipeline_name).strip("-") or "pipeline")


_COMMAND_LINE = "$ airflow "
"""How :func:`_airflow_commands` announces each command in its output, before it (``$ airflow db migrate``) and after
it with its time and exit status (``$ airflow db migrate: 1.2 s, exit 0``)."""


def _airflow_commands(commands: Sequence[Sequence[str]]) -> int:
    """Run the Airflow CLI ``commands`` (each an argument list, ``["db", "migrate"]``) one after another in this
    process, as ``airflow`` does (``airflow.__main__.main``: the default configuration written if needed, then
    Airflow's own parser and the command's function), and stop at the first that fails. :class:`AirflowEngine` runs
    it in its child process.

    Returns:
        0, or the failed command's exit status: its ``SystemExit`` code (1 for a message, as Python exits), or 1 for
        an exception (its traceback printed).
    """
    import traceback

    from airflow.cli import cli_parser
    from airflow.configuration import write_default_airflow_configuration_if_needed

    parser = cli_parser.get_parser()
    write_default_airflow_configuration_if_needed()
    for command in commands:
        print(_COMMAND_LINE + shlex.join(command), flush=True)  # quoted: the line pastes into a shell as it is
        started = time.monotonic()
        code = 0
        try:
            args = parser.parse_args(list(command))
            args.func(args)
        except SystemExit as stop:  # `dags test` of a failed run: SystemExit("DagRun failed")
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
                code = 1
        except Exception:  # noqa: BLE001 - told by its exit status and traceback, as `airflow` tells it
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        print(f"{_COMMAND_LINE}{shlex.join(command)}: {time.monotonic() - started:.1f} s, exit {code}", flush=True)
        if code:
            return code
    return 0


class AirflowEngine:
    """``airflow``: the pipeline's DAG on a real Airflow 3 with SQLite (module docstring).

    Options: ``airflow_home`` (default ``$AIRFLOW_HOME``, else ``<heteroflow home>/airflow``), ``timeout_seconds``
    (Airflow's process, all its commands; default 3600). ``on_progress`` is not honoured (Airflow runs the tasks in its own process).
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
        """Run ``pipeline`` (imported in Airflow's process from ``source``, with ``pipeline``'s candidates) and return
        its record.

        Raises:
            InvalidParameter: no ``source`` (a Pipeline value made in this process), an unknown option or
                parameter, bad testing settings, a run folder that cannot be used.
            AirflowRunError: an Airflow command failed, the run ended without ``run.json``, or Airflow ran past
                ``timeout_seconds`` (killed; the run's record ``failed`` with that error, Airflow's run ended).
        """
        from heteroflow.cache.locations import home_dir
        from heteroflow.pipelines.environment import testing_environment
        from heteroflow.pipelines.runs.records import begin_run, prepare_arguments

        unknown = sorted(set(options) - {"airflow_home", "timeout_seconds"})
        if unknown:
            raise InvalidParameter(f"engine='airflow' has no option {unknown[0]!r}; valid engine options: airflow_home, timeout_seconds")
        source = source or _source_of(pipeline)  # a Pipeline value an importable module holds: imported from there
        if not source:
            main = sys.modules.get("__main__")
            held = [k for k, v in vars(main).items() if v is pipeline] if main is not None else []
            where = (f": {held[0]!r} is defined in __main__ (the script you run), which Airflow's process cannot "
                     f"import; define it in a module and pass pipeline='module:{held[0]}'") if held else \
                " (pipeline='mymodule:build', or source=... beside a Pipeline value)"
            raise InvalidParameter(
                f"engine='airflow' builds the DAG in Airflow's own process, so it needs the pipeline as 'module:attribute'{where}; "
                "valid: a reference, a Pipeline held by an importable module, or None for the default pipeline"
            )
        args = prepare_arguments(pipeline, params)  # names, types and a local data set checked before Airflow starts
        timeout = float(options.get("timeout_seconds") or 3600)
        home = Path(options.get("airflow_home") or os.environ.get("AIRFLOW_HOME") or home_dir() / "airflow").absolute()
        dags = home / "heteroflow-engine-dags"
        dags.mkdir(parents=True, exist_ok=True)
        dag_id = _dag_id(pipeline.name)
        dag_file = dags / f"{dag_id.replace('-', '_').replace('.', '_')}.py"
        text = _DAG_FILE.format(source=source, dag_id=dag_id)
        if not dag_file.is_file() or dag_file.read_text(encoding="utf-8") != text:  # never half-written for a run parsing it
            from heteroflow.cache.atomic import atomic_write_bytes

            atomic_write_bytes(dag_file, text.encode())
        conf = {k: v for k, v in dict(params or {}).items()}
        with testing_environment(simulate_devices, inject_faults, pipeline=pipeline) as testing:
            # the run's folder and driver.json (as every engine's): a stopped run gets its record here, a killed
            # one from the next run beside it or `heteroflow runs`; a finished one from the DAG's record-run task
            active = begin_run(pipeline, run_dir, args, testing=testing)
            folder = active.folder
            env = {
                **os.environ,
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                RUN_DIR_ENV: str(folder),
                PLACEMENTS_ENV: json.dumps(pipeline.placements()),  # this run's candidates (-c), not another's
                # the pipeline's module is imported in Airflow's process as load_pipeline finds it here
                "PYTHONPATH": os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]),
            }
            log_path = folder / ENGINE_LOG
            # the logical date identifies Airflow's run (unique per DAG), so that a stopped run can be ended by it
            logical_date = datetime.now(timezone.utc).isoformat()
            commands = [["db", "migrate"], ["dags", "test", dag_id, logical_date, "-c", json.dumps(conf, default=str)]]
            started = time.monotonic()
            try:
                code, tail, last = _run_airflow(commands, env, log_path, echo=echo_engine_output, timeout=timeout)
            except KeyboardInterrupt as stop:  # Airflow was stopped with this process (_run_airflow): record what ran
                if (folder / "run.json").is_file():  # the DAG's record-run task had written it: the run had ended
                    record = _read_record(folder / "run.json")
                else:  # interrupted, or succeeded when every step had finished (finish_run decides)
                    try:
                        record = active.finish(wall_seconds=time.monotonic() - started, interrupted=True)
                    except KeyboardInterrupt as stopped:  # the record (interrupted) rides on the stop, as elsewhere
                        record = stopped.record  # type: ignore[attr-defined]
                # then Airflow's own record of the run (if `dags test` had begun it), as heteroflow's says it ended
                _end_stopped_run(dag_id, logical_date, folder, env, log_path, succeeded=record.status == "succeeded")
                stop.record = record  # type: ignore[attr-defined]
                raise
            except _AirflowTimedOut as exc:  # killed: the record says why (unless record-run had written it)
                if (folder / "run.json").is_file():
                    record = _read_record(folder / "run.json")
                else:
                    record = active.finish(wall_seconds=time.monotonic() - started, interrupted=False, error=str(exc))
                _end_stopped_run(dag_id, logical_date, folder, env, log_path, succeeded=record.status == "succeeded",
                                 note=_TIMEOUT_NOTE.format(error=exc, record=folder / "run.json"))
                raise
            if code != 0 and last[:2] != ["dags", "test"]:  # a failed run is told by its record
                raise AirflowRunError(f"`airflow {shlex.join(last)}` failed (exit {code}): {_squeeze(tail)}; log: {log_path}")
        path = folder / "run.json"
        if not path.is_file():
            raise AirflowRunError(f"the Airflow run of {dag_id} ended without a record ({path}): {_squeeze(tail)}; log: {log_path}")
        return _read_record(path)


_STOP_NOTE = "stopped by heteroflow: the run was interrupted (Ctrl-C or SIGTERM); rerun the same command to resume. Record: {record}"
_TIMEOUT_NOTE = "stopped by heteroflow: {error}. Record: {record}"
_STOPPED_DONE_NOTE = ("stopped by heteroflow (Ctrl-C or SIGTERM) after every step had finished: the run succeeded, and "
                      "heteroflow wrote its record instead of record-run. Record: {record}")


def _fail_stopped_run(dag_id: str, logical_date: str, note: str, succeeded: bool = False) -> str | None:
    """In Airflow's environment: end the run of ``dag_id`` at ``logical_date`` (ISO 8601) as "Mark failed" in
    Airflow's UI and its REST API (``PATCH .../dagRuns/{run_id}`` with ``state: failed``) end one:
    ``airflow.api.common.mark_tasks.set_dag_run_state_to_failed`` (its running tasks ``failed``, those not finished
    ``skipped``), then the teardown task (record-run, which Airflow leaves for a scheduler to run: none runs here,
    and the engine records the stop itself) ``skipped`` and the run ``failed``, with ``note`` on the run. :class:`AirflowEngine` calls it in a child process
    once Airflow's process has been killed for a stop.

    ``succeeded``: heteroflow's record of the run says it succeeded (every step had finished when it was stopped,
    and the engine wrote the record instead of record-run): the tasks not finished are ``skipped`` and the run
    ``success``, not failed.

    Returns:
        The Airflow run id it ended, or None: no such run, or it had already finished (left as it is).
    """
    from airflow.api.common.mark_tasks import set_dag_run_state_to_failed
    from airflow.models.dagrun import DagRun
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, State, TaskInstanceState
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.logical_date == datetime.fromisoformat(logical_date)))
        if run is None or run.state not in (DagRunState.RUNNING, DagRunState.QUEUED):
            return None
        dag = SerializedDagModel.get_dag(dag_id, session=session)
        if dag is None:
            return None
        if not succeeded:
            set_dag_run_state_to_failed(dag=dag, run_id=run.run_id, commit=True, session=session)
        # Airflow leaves a teardown task (record-run) and so the run unfinished, for its scheduler to run the
        # teardown later; no scheduler runs here, and this engine has recorded the stop itself (the teardown's work)
        for ti in run.get_task_instances(session=session):
            if ti.state not in State.finished:
                ti.set_state(TaskInstanceState.SKIPPED, session=session)
        run.set_state(DagRunState.SUCCESS if succeeded else DagRunState.FAILED)
        run.note = (note, None)
        return str(run.run_id)


def _end_stopped_run(dag_id: str, logical_date: str, folder: Path, env: Mapping[str, str], log_path: Path, *,
                     succeeded: bool = False, note: str | None = None) -> None:
    """Run :func:`_fail_stopped_run` in a child process with Airflow's ``env`` (at most 60 s), its outcome appended
    to ``log_path``; ``note``: the run's note (default: stopped by Ctrl-C or SIGTERM). Best effort: a second stop,
    a failure or the time limit leaves Airflow's run as it is (said in the log), never hiding the first stop."""
    note = note or (_STOPPED_DONE_NOTE if succeeded else _STOP_NOTE).format(record=folder / "run.json")
    code = (f"from heteroflow.dags.engine import _fail_stopped_run; "
            f"print(_fail_stopped_run({dag_id!r}, {logical_date!r}, {note!r}, {succeeded!r}) or '')")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", code], env=dict(env), capture_output=True, text=True, timeout=60)
        ended = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
        outcome = (f"marked Airflow's run {ended[0]} {'success' if succeeded else 'failed'} (stopped)" if ended and ended[0]
                   else "no running Airflow run to mark failed" if done.returncode == 0
                   else f"could not mark Airflow's run failed (exit {done.returncode}): {_squeeze(done.stderr)}")
    except (KeyboardInterrupt, subprocess.TimeoutExpired, OSError) as exc:
        outcome = f"left Airflow's run of {dag_id} at {logical_date} as it was ({type(exc).__name__})"
    try:
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"{_COMMAND_LINE.rstrip()}: {outcome} ({time.monotonic() - started:.1f} s)\n")
    except OSError:
        pass


def _source_of(pipeline: Any) -> str | None:
    """``module:attribute`` of an importable module (not ``__main__``) that holds this very Pipeline value, for the
    engines that import the pipeline in other processes (``airflow``); None when no such module holds it."""
    for name, module in list(sys.modules.items()):
        if name == "__main__" or module is None or name.startswith(("heteroflow.", "_")):
            continue
        try:
            holders = [k for k, v in vars(module).items() if v is pipeline and not k.startswith("_")]
        except TypeError:
            continue
        if holders:
            return f"{name}:{holders[0]}"
    return None


def _read_record(path: Path) -> RunRecord:
    from heteroflow.pipelines.runs.records import RunRecord, StepSummary

    data = json.loads(path.read_text(encoding="utf-8"))
    data["steps"] = [StepSummary.from_dict(s) for s in data.get("steps", [])]
    return RunRecord(**data)


def _squeeze(text: str) -> str:
    """What Airflow's output says went wrong, on one line of at most 600 characters: the lines after the last
    indented one (a traceback's exception, all its lines), else its last line; this module's own lines left out."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(_COMMAND_LINE)]
    indented = [i for i, line in enumerate(lines) if line[:1].isspace()]
    lines = (lines[indented[-1] + 1:] if indented else []) or lines[-1:]
    return " ".join(" ".join(lines).split())[:600] if lines else "no output"


def _run_airflow(commands: list[list[str]], env: Mapping[str, str], log_path: Path, *, echo: bool, timeout: float) -> tuple[int, str, list[str]]:
    """Run ``commands`` in one child process (:func:`_airflow_commands`) with ``env``; its output (stderr merged) is
    appended to ``log_path`` line by line as it comes (and written to stdout with ``echo``).

    Returns:
        The child's exit status, the last 4,000 characters of its output, and the last command it started.

    Raises:
        AirflowRunError: it ran past ``timeout`` seconds (it is killed, and the command it was in is named).
    """
    code = f"import sys; from heteroflow.dags.engine import _airflow_commands; sys.exit(_airflow_commands({commands!r}))"
    tail: deque[str] = deque(maxlen=400)
    announced = {_COMMAND_LINE + shlex.join(command): command for command in commands}
    last = commands[0]
    timed_out = threading.Event()
    with open(log_path, "a", encoding="utf-8") as log:
        proc = subprocess.Popen([sys.executable, "-c", code], env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")

        def stop() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout, stop)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                tail.append(line)
                last = announced.get(line.rstrip("\n"), last)
            returncode = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:  # this process was interrupted: Airflow goes with it
                proc.kill()
                proc.wait()
    if timed_out.is_set():
        raise _AirflowTimedOut(f"`airflow {' '.join(last[:2])}` ran past timeout_seconds={timeout:g}; log: {log_path}")
    return returncode, "".join(tail)[-4000:], last


ENGINE = AirflowEngine()
"""The engine object the ``heteroflow.engines`` entry point ``airflow`` names."""
