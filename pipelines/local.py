"""Run a pipeline on this machine with kfp.local (``SubprocessRunner(use_venv=False)``): the kfp.local runner.

The run folder and its record are :mod:`heteroflow.pipelines.records`' (the same for every engine); the step
processes get :mod:`heteroflow.pipelines.environment`'s contract. This module adds kfp.local's own files:
``kfp/`` (its pipeline root, every task's artifacts) and ``kfp.log`` (everything kfp.local printed).

Two changes to how kfp.local runs a pipeline, both while :func:`run_local` runs: tasks whose inputs are ready run
at the same time (:func:`_parallel_tasks`; kfp 2.17 runs one at a time), and the rendering's bookkeeping tasks run
in this process (:func:`_bookkeeping_in_process`). Every step task runs in a process of its own, started ahead of it
where one could be (:mod:`heteroflow.pipelines.prestart`), else when it starts, as kfp starts it.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.cache.redact import redact_url
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.resources import Candidates
from heteroflow.pipelines.environment import environ, step_environment, testing_environment
from heteroflow.pipelines.graph import Pipeline
from heteroflow.pipelines.prestart import WarmPool, prestart_size, take_early
from heteroflow.pipelines.report import prerender as prerender_report
from heteroflow.pipelines.report import stop_prerender
from heteroflow.pipelines.records import (
    RunRecord,
    StepSummary,
    begin_run,
    collect,
    prepare_arguments,
)

__all__ = ["ENGINE_LOG", "run_local", "terminate_children"]

ENGINE_LOG = "kfp.log"
"""kfp.local's own output, in the run folder."""

_MOVED = {
    "DATASET_PARAM": "records", "RunRecord": "records", "StepSummary": "records", "collect": "records",
    "fallbacks": "records", "build_record": "records", "check_dataset": "records", "prepare_arguments": "records",
    "DRIVER_FILE": "records", "prepare_run_dir": "records", "recover_killed_runs": "records", "new_run_id": "records",
    "testing_environment": "environment", "environ": "environment",
}


def __getattr__(name: str) -> Any:
    """Names that moved to :mod:`heteroflow.pipelines.records` / :mod:`heteroflow.pipelines.environment` (kept
    importable from here for code written against the old layout)."""
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(f"heteroflow.pipelines.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- the kfp.local run --------------------------------------------------------------------------------------


def run_local(
    params: Mapping[str, Any] | None = None,
    *,
    pipeline: Pipeline | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    candidates: Candidates | None = None,
    on_progress: Callable[[list[StepSummary]], None] | None = None,
    echo_engine_output: bool = False,
    simulate_devices: Sequence[str] | str | None = None,
    inject_faults: Sequence[str] | str | None = None,
    parallel: int = 4,
    prestart: int | None = None,
) -> RunRecord:
    """Run a pipeline with kfp.local and return (and write) its :class:`RunRecord`.

    Args:
        params: pipeline arguments; unset ones take the pipeline's defaults (an empty ``dataset_uri`` takes the
            built-in digits sample).
        pipeline: the pipeline; default :func:`heteroflow.pipelines.default.default_pipeline`.
        run_dir: the run's folder; default ``./heteroflow-runs/<run id>``.
        candidates: train candidates of the default pipeline (ignored with ``pipeline``).
        on_progress: called about twice a second with the step summaries so far.
        echo_engine_output: print kfp.local's own output instead of writing it to ``<run_dir>/kfp.log``.
        simulate_devices: device kinds to simulate (``npu``, ``gpu``; see :mod:`heteroflow.components.failures`).
        inject_faults: faults to inject (``train@npu=device`` ...).
        parallel: how many tasks that do not depend on each other may run at once (kfp.local itself runs one at
            a time; 1 keeps that).
        prestart: how many step processes are started ahead of the tasks that use them (each task still gets a
            fresh process; see :mod:`heteroflow.pipelines.prestart`); default ``HETEROFLOW_PRESTART`` or 3; 0 starts
            every task's process when the task starts, as kfp.local does.

    Raises:
        InvalidParameter: an unknown parameter or a bad value, checked before anything runs.
        DatasetError: a local data set folder that is missing, empty or holds no supported file.
        KeyboardInterrupt: the run was interrupted; the step subprocesses were stopped and ``run.json``
            records status ``interrupted``.
    """
    _import_kfp_without_client()
    from kfp import local

    from heteroflow.pipelines.kfp_render import kfp_arguments, to_kfp
    from heteroflow.pipelines.kfp_resources import without_kubernetes_settings

    if pipeline is None:
        from heteroflow.pipelines.default import default_pipeline

        pipeline = default_pipeline(train_candidates=candidates)
    if prestart is None:
        try:
            prestart = prestart_size()
        except ValueError as exc:
            raise InvalidParameter(str(exc)) from None
    with testing_environment(simulate_devices, inject_faults, pipeline=pipeline) as testing:
        args = prepare_arguments(pipeline, params)
        with without_kubernetes_settings():  # kfp.local never reads them (and kfp.kubernetes costs 0.3 s)
            rendered = to_kfp(pipeline, local=True)
        active = begin_run(pipeline, run_dir, args, testing=testing)
        folder, run_id = active.folder, active.run_id
        _TASK_ENDED.clear()
        prerender_report(folder, pipeline, wake=_TASK_ENDED)  # matplotlib imports, and plots are drawn, while the steps run
        t0 = time.perf_counter()

        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.5):
                on_progress(collect(folder, pipeline))  # type: ignore[misc]

        watcher = threading.Thread(target=watch, daemon=True) if on_progress else None
        # Each lightweight component writes its source into `mktemp -d` and leaves it there; point TMPDIR of the
        # step subprocesses into the run folder and remove that folder when the run ends. This process keeps its
        # own temporary folder: tempfile caches the first one it resolves, and must not cache the scratch folder.
        tempfile.gettempdir()
        scratch = folder / "tmp"
        scratch.mkdir(exist_ok=True)
        interrupted = False
        error: str | None = None
        try:
            with (
                environ({**step_environment(folder, run_id, driver_pid=os.getpid()), "TMPDIR": str(scratch)}),
                _warm_pool(prestart, pipeline) as pool,
            ):
                if watcher:
                    watcher.start()
                with contextlib.ExitStack() as stack:
                    if echo_engine_output:
                        log: Any = _Redacting(sys.stdout)
                    else:
                        log = _Redacting(stack.enter_context(open(folder / ENGINE_LOG, "w", encoding="utf-8")))
                    stack.callback(log.flush)
                    stack.enter_context(contextlib.redirect_stdout(log))
                    stack.enter_context(contextlib.redirect_stderr(log))
                    stack.enter_context(_root_logging_to(log))
                    with warnings.catch_warnings():
                        # Our steps run in this environment on purpose; kfp warns about the image name otherwise.
                        warnings.filterwarnings("ignore", message=".*custom or non-Python base image.*")
                        warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
                        local.init(
                            runner=local.SubprocessRunner(use_venv=False),
                            pipeline_root=str(folder / "kfp"),
                            raise_on_error=False,
                        )
                        with (
                            _parallel_tasks(parallel) if parallel > 1 else contextlib.nullcontext(),
                            without_kubernetes_settings(),
                            _bookkeeping_in_process(pool),
                        ):
                            rendered(**kfp_arguments(pipeline, args))
        except KeyboardInterrupt:
            # Ctrl-C (or SIGTERM turned into it by the CLI): stop the step subprocesses too, so none trains on as
            # an orphan; their checkpoints stay, and the same command resumes.
            terminate_children()
            interrupted = True
        except Exception as exc:  # an engine crash: the run still gets its record
            error = f"{type(exc).__name__}: {exc}"
        finally:
            stop.set()
            if watcher:
                watcher.join()
            stop_prerender()  # every step has ended: the report draws what is left (and no thread outlives the run)
            shutil.rmtree(scratch, ignore_errors=True)
        record = active.finish(wall_seconds=time.perf_counter() - t0, interrupted=interrupted, error=error)
    if on_progress:
        on_progress(record.steps)
    return record


def _warm_pool(size: int, pipeline: Pipeline) -> WarmPool:
    """The run's prestarted step processes: the command line's early pool (:func:`prestart.start_early`), else
    ``size`` new ones preloading :func:`_preload`'s modules (0: none)."""
    early = take_early()
    if early is not None and size > 0:
        return early
    if early is not None:
        early.close()
    return WarmPool(size, preload=_preload(pipeline))


def _preload(pipeline: Pipeline) -> list[str]:
    """The modules a prestarted step process of ``pipeline`` imports while it waits: numpy (heteroflow's data steps
    import it when they run), heteroflow's runtime and the modules of the pipeline's steps that are heteroflow's own
    (a user's module is imported by its task: importing it runs it)."""
    from heteroflow.components.step import step_ref

    modules = {"numpy", "heteroflow.components.runtime"}
    for call in pipeline.calls:
        with contextlib.suppress(Exception):  # a step no process can import fails in its task, with its message
            module = step_ref(call.step).partition(":")[0]
            if module.startswith("heteroflow."):
                modules.add(module)
    return sorted(modules)


_KFP_LAZY = {"Client": "kfp.client", "client": "kfp.client", "components": "kfp.components", "dsl": "kfp.dsl"}
"""What ``kfp/__init__`` imports eagerly, and :func:`_import_kfp_without_client` leaves to first use."""


def _import_kfp_without_client() -> None:
    """Import the ``kfp`` package without its eager ``kfp.client`` import (kubernetes, the KFP server client:
    about 0.3 s a run, and a local run never talks to a server).

    ``kfp/__init__`` skips its eager imports when ``_KFP_RUNTIME`` is ``true`` (kfp's own executor sets it in
    every step process); set it only while the package's ``__init__`` runs, then give the package a module
    ``__getattr__`` that imports what it skipped on first use, so ``kfp.Client`` and ``kfp.dsl`` keep working for
    code in this process. ``kfp.dsl`` and ``kfp.local`` are then imported in full as usual. Does nothing when kfp
    is already imported.
    """
    if "kfp" in sys.modules:
        return
    previous = os.environ.get("_KFP_RUNTIME")
    os.environ["_KFP_RUNTIME"] = "true"
    try:
        import kfp
    finally:
        if previous is None:
            os.environ.pop("_KFP_RUNTIME", None)
        else:
            os.environ["_KFP_RUNTIME"] = previous

    if getattr(kfp, "__getattr__", None) is None:
        import importlib

        def lazy(name: str) -> Any:
            if name in _KFP_LAZY:
                module = importlib.import_module(_KFP_LAZY[name])
                return getattr(module, name) if name == "Client" else module
            raise AttributeError(f"module 'kfp' has no attribute {name!r}")

        kfp.__getattr__ = lazy  # type: ignore[attr-defined]


_TASK_ENDED = threading.Event()
"""Set when a task of the run has ended (:func:`_run_dag_in_parallel`): wakes the report's
:func:`~heteroflow.pipelines.report.prerender`."""

_STOPPING = threading.Event()
"""Set when a run is interrupted: kfp.local starts no task (and no retry of one) after it."""


@contextlib.contextmanager
def _parallel_tasks(max_workers: int) -> Iterator[None]:
    """Let kfp.local run the tasks of a DAG that do not depend on each other at the same time (as a cluster does).

    kfp 2.17's local orchestrators run a DAG's tasks one at a time in a topological order; for the duration this
    replaces both with :func:`_run_dag_in_parallel`, which starts every task whose upstream tasks have settled,
    up to ``max_workers`` at once, with the same per-task semantics (kfp's own ``execute_task``: conditions,
    sub-DAGs, OneOf outputs, skipping tasks whose upstream failed). A DAG with exit handlers or ``ParallelFor``
    keeps kfp's own orchestrator. kfp's per-task logger setup and print indentation are made once for the whole
    run, so the threads do not undo each other's.
    """
    from kfp.local import logging_utils
    from kfp.local.orchestrator import dag_orchestrator, enhanced_dag_orchestrator

    original_enhanced = enhanced_dag_orchestrator.run_enhanced_dag
    original_simple = dag_orchestrator.run_dag
    original_logger = logging_utils.local_logger_context
    lock = threading.RLock()
    depth = [0]

    @contextlib.contextmanager
    def logger_once() -> Iterator[None]:
        with lock:
            depth[0] += 1
            outer = depth[0] == 1
            if outer:
                manager = original_logger()
                manager.__enter__()
        try:
            yield
        finally:
            with lock:
                depth[0] -= 1
                if outer:
                    manager.__exit__(None, None, None)

    original_indented = logging_utils.indented_print

    @contextlib.contextmanager
    def indented_once(num_spaces: int = 4) -> Iterator[None]:
        yield  # the run's one indentation (below) is in force for every task's lines

    def run_dag(*args: Any, **kwargs: Any) -> Any:
        return _run_dag_in_parallel(original_enhanced, max_workers, *args, **kwargs)

    from kfp.local import status, task_dispatcher

    original_dispatch = task_dispatcher.run_single_task_implementation

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if _STOPPING.is_set():
            return {}, status.Status.FAILURE
        return original_dispatch(*args, **kwargs)

    _STOPPING.clear()
    task_dispatcher.run_single_task_implementation = dispatch  # type: ignore[assignment]
    enhanced_dag_orchestrator.run_enhanced_dag = run_dag  # type: ignore[assignment]
    dag_orchestrator.run_dag = run_dag  # type: ignore[assignment]
    logging_utils.local_logger_context = logger_once  # type: ignore[assignment]
    logging_utils.indented_print = indented_once  # type: ignore[assignment]
    try:
        # one logger setup and one print indentation for the whole run: kfp's per-task `indented_print` swaps
        # builtins.print on entry and puts back what it found on exit, so tasks that start and end at the same
        # time in several threads would leave wrappers behind (every later print indented again, and slower)
        with logger_once(), original_indented():
            yield
    finally:
        logging_utils.indented_print = original_indented  # type: ignore[assignment]
        enhanced_dag_orchestrator.run_enhanced_dag = original_enhanced  # type: ignore[assignment]
        dag_orchestrator.run_dag = original_simple  # type: ignore[assignment]
        logging_utils.local_logger_context = original_logger  # type: ignore[assignment]
        task_dispatcher.run_single_task_implementation = original_dispatch  # type: ignore[assignment]


_EXECUTOR_LOCK = threading.Lock()


@contextlib.contextmanager
def _bookkeeping_in_process(pool: WarmPool | None = None) -> Iterator[None]:
    """Run the rendering's bookkeeping tasks (a fallback chain's ``arguments`` and ``skip``, the final ``check``) in
    this process, and the step tasks in ``pool``'s prestarted processes (:mod:`heteroflow.pipelines.prestart`).

    They only pass strings on, or read the routes and fail the run, yet each took a step process of its own
    (~0.09 s: interpreter, kfp's executor). While this is active, kfp.local's subprocess task handler runs a task
    whose program is one of those functions (:func:`heteroflow.pipelines.kfp_render.bookkeeping_function`: the
    same source text, so the same code) through kfp's own ``Executor`` here: the same executor input, the same
    output file, the same task status (an exception is the task's failure, its traceback in ``kfp.log`` as a step
    process would print it). Every other task runs in a process of its own: one of ``pool``'s, started ahead of
    it, where the pool has one for it, else one started as kfp starts it.
    """
    import traceback

    from kfp.local import status, subprocess_task_handler

    from heteroflow.pipelines.kfp_render import bookkeeping_function

    original = subprocess_task_handler.SubprocessTaskHandler

    class Handler(original):  # type: ignore[misc, valid-type]
        def run(self) -> Any:
            func = bookkeeping_function(self.full_command)
            if func is None:
                code = pool.run(self.full_command, self.env_vars) if pool is not None and not self.runner.use_venv else None
                if code is None:
                    return super().run()
                return status.Status.SUCCESS if code == 0 else status.Status.FAILURE
            import json

            from kfp.dsl import executor
            from kfp.dsl.types import artifact_types

            args = self.full_command
            executor_input = json.loads(args[args.index("--executor_input") + 1])
            with _EXECUTOR_LOCK:  # kfp's Executor sets a module global (the task root)
                root = artifact_types.CONTAINER_TASK_ROOT
                try:
                    executor.Executor(executor_input=executor_input, function_to_execute=func).execute()
                except Exception:  # noqa: BLE001 - the task's failure, as a step process reports it
                    print(traceback.format_exc(), end="")
                    return status.Status.FAILURE
                finally:
                    artifact_types.CONTAINER_TASK_ROOT = root
            return status.Status.SUCCESS

    subprocess_task_handler.SubprocessTaskHandler = Handler  # type: ignore[misc]
    try:
        yield
    finally:
        subprocess_task_handler.SubprocessTaskHandler = original  # type: ignore[misc]


def _run_dag_in_parallel(
    fallback: Callable[..., Any],
    max_workers: int,
    pipeline_resource_name: str,
    dag_component_spec: Any,
    executors: Any,
    components: Any,
    dag_arguments: Any,
    pipeline_root: str,
    runner: Any,
    unique_pipeline_id: str,
    fail_stack: list[str],
    parent_io_store: Any = None,
) -> Any:
    """kfp.local's ``run_enhanced_dag`` (same arguments and result), running ready tasks concurrently."""
    import queue

    from kfp.local import io as kfp_io
    from kfp.local import status
    from kfp.local.orchestrator import enhanced_dag_orchestrator as E
    from kfp.local.orchestrator.orchestrator_utils import OrchestratorUtils
    from kfp.pipeline_spec import pipeline_spec_pb2

    dag_spec = dag_component_spec.dag
    all_completed = pipeline_spec_pb2.PipelineTaskSpec.TriggerPolicy.TriggerStrategy.ALL_UPSTREAM_TASKS_COMPLETED
    special = any(
        t.trigger_policy.strategy == all_completed or (t.WhichOneof("iterator") and E._has_valid_iterator(t))
        for t in dag_spec.tasks.values()
    )
    if special:
        return fallback(
            pipeline_resource_name=pipeline_resource_name, dag_component_spec=dag_component_spec, executors=executors,
            components=components, dag_arguments=dag_arguments, pipeline_root=pipeline_root, runner=runner,
            unique_pipeline_id=unique_pipeline_id, fail_stack=fail_stack, parent_io_store=parent_io_store,
        )
    arguments = OrchestratorUtils.join_user_inputs_and_defaults(dag_arguments=dag_arguments, dag_inputs_spec=dag_component_spec.input_definitions)
    io_store = kfp_io.IOStore(parent=parent_io_store)
    for key, value in arguments.items():
        io_store.put_parent_input(key, value)
    pending = dict(dag_spec.tasks)
    settled: set[str] = set()
    failed: set[str] = set()
    evaluator = E.ConditionEvaluator()

    def run(name: str, spec: Any) -> Any:
        return E.execute_task(
            task_name=name, task_spec=spec, pipeline_resource_name=pipeline_resource_name, components=components,
            executors=executors, io_store=io_store, pipeline_root=pipeline_root, runner=runner,
            unique_pipeline_id=unique_pipeline_id, fail_stack=fail_stack,
        )

    # daemon threads, not a ThreadPoolExecutor: after Ctrl-C nothing may keep the process alive (kfp's retry loop
    # sleeps its backoff in the thread that runs a task)
    results: queue.Queue[tuple[str, Any, BaseException | None]] = queue.Queue()
    running: set[str] = set()

    def worker(name: str, spec: Any) -> None:
        try:
            results.put((name, run(name, spec), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the scheduling thread
            results.put((name, None, exc))

    try:
        while pending or running:
            for name in sorted(n for n, t in pending.items() if set(t.dependent_tasks) <= settled):
                if len(running) >= max_workers:
                    break
                spec = pending.pop(name)
                if set(spec.dependent_tasks) & failed:
                    failed.add(name)
                    settled.add(name)
                    io_store.put_task_status(name, "FAILED")
                    continue
                if spec.trigger_policy.condition and not evaluator.evaluate_condition(spec.trigger_policy.condition, io_store):
                    settled.add(name)  # skipped: its condition is false
                    continue
                running.add(name)
                threading.Thread(target=worker, args=(name, spec), name=f"kfp-local-{name}", daemon=True).start()
            if not running:
                if pending and not any(set(t.dependent_tasks) <= settled for t in pending.values()):
                    raise RuntimeError(f"kfp.local DAG: tasks {sorted(pending)} wait for tasks that do not exist")
                continue
            try:
                name, result, error = results.get(timeout=0.5)
            except queue.Empty:
                continue
            running.discard(name)
            _TASK_ENDED.set()
            if error is not None:
                raise error
            outputs, task_status = result
            io_store.put_task_status(name, "SUCCEEDED" if task_status == status.Status.SUCCESS else "FAILED")
            if task_status == status.Status.FAILURE:
                fail_stack.append(name)
                failed.add(name)
            else:
                for key, output in outputs.items():
                    io_store.put_task_output(name, key, output)
            settled.add(name)
    except BaseException:
        # Ctrl-C / SIGTERM lands in this (the main) thread: no task may start from now on, and the running ones'
        # step processes are stopped (their threads end with them)
        _STOPPING.set()
        terminate_children()
        raise
    if failed:
        return {}, status.Status.FAILURE
    return OrchestratorUtils.get_dag_outputs(dag_outputs_spec=dag_spec.outputs, io_store=io_store), status.Status.SUCCESS


class _Redacting(io.TextIOBase):
    """A text stream that writes whole lines to ``target`` with credentials in URLs redacted
    (:func:`heteroflow.cache.redact.redact_url`): kfp.local prints every task's inputs, a data set URL included.

    Thread-safe: with parallel tasks, one thread per running task prints its subprocess's lines here (kfp's
    ``run_local_subprocess``) and kfp's logging handlers write beside them. Neither this buffer nor
    ``io.TextIOWrapper`` is safe for concurrent writers (lines were lost or merged, and a multi-byte character
    could be split into invalid UTF-8 in ``kfp.log``), so every write and flush holds one lock.
    """

    def __init__(self, target: Any) -> None:
        self._target = target
        self._pending = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            if "\n" in self._pending:
                lines, _, self._pending = self._pending.rpartition("\n")
                self._target.write(redact_url(lines + "\n"))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self._target.write(redact_url(self._pending))
                self._pending = ""
            self._target.flush()


@contextlib.contextmanager
def _root_logging_to(stream: Any) -> Iterator[None]:
    """kfp.local logs through the ``logging`` module to handlers bound to the real stderr: send them to ``stream``."""
    import logging

    changed = []
    for logger in [logging.getLogger(), *[l for l in logging.Logger.manager.loggerDict.values() if isinstance(l, logging.Logger)]]:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (sys.__stderr__, sys.__stdout__, sys.stderr, sys.stdout):
                changed.append((handler, handler.stream))
                handler.setStream(stream)
    try:
        yield
    finally:
        for handler, old in changed:
            handler.setStream(old)


def terminate_children(grace_seconds: float = 5.0) -> None:
    """SIGTERM every descendant process, then SIGKILL those still alive after ``grace_seconds``."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace_seconds)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
