"""Run a pipeline on this machine with kfp.local (``SubprocessRunner(use_venv=False)``): the kfp.local runner.

The run folder and its record are :mod:`heteroflow.pipelines.runs.records`' (the same for every engine); the step
processes get :mod:`heteroflow.pipelines.environment`'s contract. This module adds kfp.local's own files:
``kfp/`` (its pipeline root, every task's artifacts) and ``kfp.log`` (everything kfp.local printed).

Two changes to how kfp.local runs a pipeline, both while :func:`run_local` runs: tasks whose inputs are ready run
at the same time (kfp 2.17 runs one at a time), and the rendering's bookkeeping tasks run in this process; both are
patches of kfp internals, which :mod:`heteroflow.pipelines.kfp.patches` holds, applies and undoes (only on the kfp
series they were tested on: on another, one warning and kfp.local as it is). Every step task runs in a process of
its own, started ahead of it where one could be (:mod:`heteroflow.pipelines.kfp.prestart`), else when it starts, as kfp
starts it.
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
from heteroflow.pipelines.kfp import patches as kfp_patches
from heteroflow.pipelines.environment import environ, step_environment, testing_environment
from heteroflow.pipelines.graph import Pipeline
from heteroflow.pipelines.kfp.prestart import WarmPool, prestart_size, take_early
from heteroflow.pipelines.volumes import make_local_volumes, remove_local_volumes
from heteroflow.pipelines.runs.prerendering import prerender as prerender_report
from heteroflow.pipelines.runs.prerendering import stop_prerender
from heteroflow.pipelines.runs.records import (
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
    """Names that moved to :mod:`heteroflow.pipelines.runs.records` / :mod:`heteroflow.pipelines.environment` (kept
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
        simulate_devices: device kinds to simulate (``npu``, ``gpu``; see :mod:`heteroflow.components.core.failures`).
        inject_faults: faults to inject (``train@npu=device`` ...).
        parallel: how many tasks that do not depend on each other may run at once (kfp.local itself runs one at
            a time; 1 keeps that).
        prestart: how many step processes are started ahead of the tasks that use them (each task still gets a
            fresh process; see :mod:`heteroflow.pipelines.kfp.prestart`); default ``HETEROFLOW_PRESTART`` or 3; 0 starts
            every task's process when the task starts, as kfp.local does.

    Raises:
        InvalidParameter: an unknown parameter or a bad value, checked before anything runs.
        DatasetError: a local data set folder that is missing, empty or holds no supported file.
        KeyboardInterrupt: the run was interrupted; the step subprocesses were stopped and ``run.json``
            records status ``interrupted``.
    """
    _import_kfp_without_client()
    from kfp import local

    from heteroflow.pipelines.kfp.render import kfp_arguments, to_kfp
    from heteroflow.pipelines.kfp.resources import without_kubernetes_settings

    if pipeline is None:
        from heteroflow.pipelines.default import default_pipeline

        pipeline = default_pipeline(train_candidates=candidates)
    if prestart is None:
        try:
            prestart = prestart_size()
        except ValueError as exc:
            raise InvalidParameter(str(exc)) from None
    if not kfp_patches.patches_usable():
        prestart = 0  # an untested kfp: kfp.local as it is, which never hands a task to a prestarted process
    with testing_environment(simulate_devices, inject_faults, pipeline=pipeline) as testing:
        args = prepare_arguments(pipeline, params)
        with without_kubernetes_settings():  # kfp.local never reads them (and kfp.kubernetes costs 0.3 s)
            rendered = to_kfp(pipeline, local=True)
        active = begin_run(pipeline, run_dir, args, testing=testing)
        folder, run_id = active.folder, active.run_id
        make_local_volumes(pipeline.calls, folder, engine="kfp-local")  # PVCs as folders of the run (deleted below)
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
        kfp_failed: list[list[str]] = []
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
                            kfp_patches.kfp_local_patches(parallel=parallel, pool=pool, on_interrupt=terminate_children),
                            kfp_patches.pipeline_failures(kfp_failed),
                            without_kubernetes_settings(),
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
            remove_local_volumes(folder)  # a CreatePVC lives for the run (KFP's DeletePVC at its end)
        if error is None and not interrupted and kfp_failed and not any(s.status == "failed" for s in collect(folder, pipeline, finished=True)):
            # kfp.local failed a task before any step of it ran (no attempt record says so): the run failed
            task = kfp_failed[-1][0] if kfp_failed[-1] else "a task"
            error = f"kfp.local could not run its task {task}; no step of it ran (see {ENGINE_LOG} in the run folder for why)"
        record = active.finish(wall_seconds=time.perf_counter() - t0, interrupted=interrupted, error=error)
    if on_progress:
        on_progress(record.steps)
    return record


def _warm_pool(size: int, pipeline: Pipeline) -> WarmPool:
    """The run's prestarted step processes: the command line's early pool (:func:`prestart.start_early`), else
    ``size`` new ones preloading :func:`_preload`'s modules (0: none); either starts no more than the run's step
    tasks (:func:`_step_tasks`) can take."""
    early = take_early()
    if early is not None and size > 0:
        early.set_limit(_step_tasks(pipeline))
        return early
    if early is not None:
        early.close()
    return WarmPool(size, preload=_preload(pipeline), limit=_step_tasks(pipeline))


def _step_tasks(pipeline: Pipeline) -> int | None:
    """How many step tasks a run of ``pipeline`` starts when no step fails: one per call, except a device-bound call
    that no planner places, whose candidates may each run in turn (its chain starts at the first); None when a call
    is inside a loop (one task per item). A retry, or a fallback after a placed candidate failed, starts its own
    process, as kfp.local does."""
    if any(getattr(group, "kind", None) == "loop" for call in pipeline.calls for group in call.groups):
        return None
    placed = {call.name for call in pipeline.placed_calls} if pipeline.planner is not None else set()
    return sum(len(call.candidates) if call.device_bound and call.name not in placed else 1 for call in pipeline.calls)


def _preload(pipeline: Pipeline) -> list[str]:
    """The modules a prestarted step process of ``pipeline`` imports while it waits: numpy (heteroflow's data steps
    import it when they run), heteroflow's runtime and the modules of the pipeline's steps that are heteroflow's own
    (a user's module is imported by its task: importing it runs it)."""
    from heteroflow.components.core.step import step_ref

    modules = {"numpy", "heteroflow.components.core.runtime"}
    for call in pipeline.calls:
        with contextlib.suppress(Exception):  # a step no process can import fails in its task, with its message
            module = step_ref(call.step).partition(":")[0]
            if module.startswith("heteroflow."):
                modules.add(module)
    return sorted(modules)


# kfp internals heteroflow replaces live in heteroflow.pipelines.kfp.patches; the old names stay importable here
_import_kfp_without_client = kfp_patches.import_kfp
_parallel_tasks = kfp_patches.parallel_tasks
_bookkeeping_in_process = kfp_patches.bookkeeping_in_process
_run_dag_in_parallel = kfp_patches._run_dag_in_parallel
_TASK_ENDED = kfp_patches.TASK_ENDED
_STOPPING = kfp_patches.STOPPING


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
