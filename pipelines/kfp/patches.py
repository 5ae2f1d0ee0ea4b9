"""Every replacement of a kfp (kfp.local, kfp.dsl, the ``kfp`` package) internal heteroflow makes, in one place.

Each patch is one named unit (:class:`Patch`, listed in :data:`PATCHES`): the ``module.attribute`` values it
replaces, the kfp behaviour it works around (with the kubeflow/pipelines issue where there is one) and the
context manager that applies it and puts the originals back. ``tests/test_kfp_patches.py`` checks, per patch,
that the internal it relies on is still there with the signature and behaviour it assumes.

They were written against, and tested on, kfp :data:`TESTED_KFP_SERIES`.x only. :func:`patches_usable` reads the
installed version (``importlib.metadata``, no kfp import); on any other version it warns once
(:class:`UntestedKfpVersion`) and every entry point here applies nothing: the run takes kfp.local's own, slower
path (kfp's DAG loop, one task at a time, every task in a process of its own), with the same results.

What applies them:

- :func:`kfp_local_patches`: for the duration of one kfp.local run (:func:`heteroflow.pipelines.kfp.local.run_local`):
  :data:`NO_DOCKER_IMPORT`, :data:`PARALLEL_DAG`, :data:`ONE_LOGGER_SETUP`, :data:`ONE_PRINT_INDENT`,
  :data:`STOP_ON_INTERRUPT` (those four only with ``parallel > 1``) and :data:`BOOKKEEPING_IN_PROCESS`;
- :func:`cheap_container_checks`: :data:`CHEAP_CONTAINER_CHECK` while a pipeline is rendered
  (:func:`heteroflow.pipelines.kfp.render.to_kfp`);
- :func:`import_kfp`: :data:`LAZY_KFP_CLIENT`, once per process (the one patch that is not undone: the ``kfp``
  module stays imported, and its ``__getattr__`` only adds what ``kfp/__init__`` would have imported eagerly).

May import: kfp (inside functions), :mod:`heteroflow.pipelines.kfp.render` (inside functions), the standard library.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heteroflow.pipelines.kfp.prestart import WarmPool

__all__ = [
    "BOOKKEEPING_IN_PROCESS",
    "CHEAP_CONTAINER_CHECK",
    "LAZY_KFP_CLIENT",
    "NO_DOCKER_IMPORT",
    "ONE_LOGGER_SETUP",
    "ONE_PRINT_INDENT",
    "PARALLEL_DAG",
    "PATCHES",
    "STOPPING",
    "STOP_ON_INTERRUPT",
    "TASK_ENDED",
    "TESTED_KFP_SERIES",
    "Patch",
    "UntestedKfpVersion",
    "bookkeeping_in_process",
    "cheap_container_checks",
    "import_kfp",
    "installed_kfp_version",
    "kfp_local_patches",
    "no_docker_import",
    "parallel_tasks",
    "patches_usable",
    "resolve",
]

TESTED_KFP_SERIES = "2.17"
"""The kfp release series (major.minor) the patches were written against and tested on."""


class UntestedKfpVersion(UserWarning):
    """The installed kfp is not of :data:`TESTED_KFP_SERIES`: no patch is applied, kfp.local runs as it is."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Patch:
    """One replacement of kfp internals.

    Attributes:
        name: a short name (``parallel-dag``).
        replaces: what it replaces, each ``"module:attribute"`` (``"kfp.local.task_dispatcher:run_single_task_implementation"``;
            an attribute path may have dots: ``"kfp.dsl.pipeline_task:PipelineTask._ensure_container_spec_exists"``).
        works_around: the kfp behaviour it works around, and what it does instead.
        issue: the kubeflow/pipelines issue or pull request about that behaviour, where there is one.
        undone: whether the originals are put back when its context ends (False: applied once per process).
    """

    name: str
    replaces: tuple[str, ...]
    works_around: str
    issue: str | None = None
    undone: bool = True

    def current(self) -> dict[str, Any]:
        """Each replaced ``"module:attribute"`` -> its value now (imports the modules).

        Raises:
            ImportError: a module is gone from kfp.
            AttributeError: an attribute is gone from kfp.
        """
        return {target: resolve(target) for target in self.replaces}


def resolve(target: str) -> Any:
    """The value of ``"module:attr.path"`` (imports the module).

    Raises:
        ImportError: no such module.
        AttributeError: no such attribute.
    """
    module, _, path = target.partition(":")
    value: Any = importlib.import_module(module)
    for part in path.split("."):
        value = getattr(value, part)
    return value


PARALLEL_DAG = Patch(
    name="parallel-dag",
    replaces=(
        "kfp.local.orchestrator.enhanced_dag_orchestrator:run_enhanced_dag",
        "kfp.local.orchestrator.dag_orchestrator:run_dag",
    ),
    works_around=(
        "kfp.local runs a DAG's tasks one at a time in a topological order (kfp 2.17; local execution shipped "
        "sequential-only); replaced by a loop that starts every task whose upstream tasks have settled, up to "
        "`parallel` at once, with kfp's own per-task semantics (enhanced_dag_orchestrator.execute_task). DAGs with "
        "exit handlers or ParallelFor keep kfp's orchestrator."
    ),
    issue="https://github.com/kubeflow/pipelines/pull/10423",
)
ONE_LOGGER_SETUP = Patch(
    name="one-logger-setup",
    replaces=("kfp.local.logging_utils:local_logger_context",),
    works_around=(
        "kfp.local sets up (and tears down) the root logger around every task; with tasks in several threads "
        "one thread's exit would remove another's handler. Replaced by a reentrant context that sets it up once "
        "for the run (used with parallel-dag only)."
    ),
)
ONE_PRINT_INDENT = Patch(
    name="one-print-indent",
    replaces=("kfp.local.logging_utils:indented_print",),
    works_around=(
        "kfp.local indents a task's output by swapping builtins.print on entry and putting back what it found on "
        "exit; tasks that start and end at the same time in several threads leave wrappers behind (every later "
        "print indented again, and slower). Replaced by a no-op; the run holds one indentation throughout "
        "(used with parallel-dag only)."
    ),
)
STOP_ON_INTERRUPT = Patch(
    name="stop-on-interrupt",
    replaces=("kfp.local.task_dispatcher:run_single_task_implementation",),
    works_around=(
        "after Ctrl-C in the driver, kfp's task threads would go on starting tasks and retries (its retry loop "
        "sleeps its backoff in the task's thread); wrapped so that no task starts once STOPPING is set "
        "(used with parallel-dag only)."
    ),
)
BOOKKEEPING_IN_PROCESS = Patch(
    name="bookkeeping-in-process",
    replaces=("kfp.local.subprocess_task_handler:SubprocessTaskHandler",),
    works_around=(
        "kfp.local's SubprocessRunner starts a process (interpreter + kfp's executor, ~0.1-0.4 s) for every "
        "lightweight task; replaced by a subclass that runs the rendering's bookkeeping tasks (arguments, skip, "
        "check) in this process through kfp's own Executor, and step tasks in prestarted processes "
        "(heteroflow.pipelines.kfp.prestart)."
    ),
)
CHEAP_CONTAINER_CHECK = Patch(
    name="cheap-container-check",
    replaces=("kfp.dsl.pipeline_task:PipelineTask._ensure_container_spec_exists",),
    works_around=(
        "every resource setter of a PipelineTask calls _ensure_container_spec_exists, which walks inspect.stack() "
        "only to name the caller in an error message (~50 ms per call in a deep stack); replaced, while a "
        "pipeline is rendered, by the same check without the stack walk."
    ),
)
LAZY_KFP_CLIENT = Patch(
    name="lazy-kfp-client",
    replaces=("kfp:__getattr__",),
    works_around=(
        "kfp/__init__ imports kfp.client (the KFP server client and kubernetes, ~0.3 s) eagerly, and a local run "
        "never talks to a server. The package is imported with _KFP_RUNTIME=true (kfp's own switch for step "
        "processes, which skips those imports) and given a module __getattr__ that imports Client, client, "
        "components and dsl on first use. Applied once per process and not undone."
    ),
    undone=False,
)

NO_DOCKER_IMPORT = Patch(
    name="no-docker-import",
    replaces=("kfp.local.task_dispatcher:_DOCKER_AVAILABLE",),
    works_around=(
        "kfp.local.task_dispatcher imports kfp.local.docker_task_handler, and with it the docker SDK (requests, "
        "urllib3: ~0.1 s of the driver's start), when it is imported, and reads DockerTaskHandler from it for every "
        "task, though only DockerRunner uses it; a heteroflow run uses SubprocessRunner. The handler module is "
        "imported lazily (importlib.util.LazyLoader: run on first attribute use; only where the docker package is "
        "installed, so a missing one still fails at import as kfp expects), and _DOCKER_AVAILABLE reads False "
        "for the run's duration, so that no task touches it; after the run a DockerRunner task loads it as usual."
    ),
)

PATCHES: tuple[Patch, ...] = (
    NO_DOCKER_IMPORT,
    PARALLEL_DAG,
    ONE_LOGGER_SETUP,
    ONE_PRINT_INDENT,
    STOP_ON_INTERRUPT,
    BOOKKEEPING_IN_PROCESS,
    CHEAP_CONTAINER_CHECK,
    LAZY_KFP_CLIENT,
)
"""Every patch, in the order :func:`kfp_local_patches` applies the run's ones."""


# --- the version check --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def installed_kfp_version() -> str | None:
    """The installed kfp distribution's version (``importlib.metadata``; kfp is not imported), None if absent."""
    from importlib import metadata

    try:
        return metadata.version("kfp")
    except metadata.PackageNotFoundError:
        return None


_WARNED: set[str] = set()


def patches_usable() -> bool:
    """Whether the installed kfp is of :data:`TESTED_KFP_SERIES` (the patches apply).

    On another version, warns :class:`UntestedKfpVersion` once per process (naming the installed and the tested
    versions) and returns False: callers then leave kfp as it is. Without kfp installed: False, no warning (the
    kfp import that follows says what is missing).
    """
    version = installed_kfp_version()
    if version is None:
        return False
    if version.split(".")[:2] == TESTED_KFP_SERIES.split("."):
        return True
    if version not in _WARNED:
        _WARNED.add(version)
        warnings.warn(
            UntestedKfpVersion(
                f"kfp {version} is installed; heteroflow's kfp.local patches were tested on kfp "
                f"{TESTED_KFP_SERIES}.x only, so this process runs kfp.local as it is: tasks one at a time, every "
                f"task in a process of its own (slower; same results). Install kfp=={TESTED_KFP_SERIES}.* for the "
                "faster path."
            ),
            stacklevel=3,
        )
    return False


# --- lazy-kfp-client ----------------------------------------------------------------------------------------

_KFP_LAZY = {"Client": "kfp.client", "client": "kfp.client", "components": "kfp.components", "dsl": "kfp.dsl"}
"""What ``kfp/__init__`` imports eagerly, and :func:`import_kfp` leaves to first use."""


def import_kfp() -> None:
    """Import the ``kfp`` package, without its eager ``kfp.client`` import where :func:`patches_usable`
    (:data:`LAZY_KFP_CLIENT`).

    ``kfp/__init__`` skips its eager imports when ``_KFP_RUNTIME`` is ``true`` (kfp's own executor sets it in
    every step process); set it only while the package's ``__init__`` runs, then give the package a module
    ``__getattr__`` that imports what it skipped on first use, so ``kfp.Client`` and ``kfp.dsl`` keep working for
    code in this process. ``kfp.dsl`` and ``kfp.local`` are then imported in full as usual. Does nothing when kfp
    is already imported; a plain ``import kfp`` on an untested kfp.
    """
    if "kfp" in sys.modules:
        return
    if not patches_usable():
        import kfp  # noqa: F401
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

        def lazy(name: str) -> Any:
            if name in _KFP_LAZY:
                module = importlib.import_module(_KFP_LAZY[name])
                return getattr(module, name) if name == "Client" else module
            raise AttributeError(f"module 'kfp' has no attribute {name!r}")

        kfp.__getattr__ = lazy  # type: ignore[attr-defined]


# --- applying and undoing -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _replaced(owner: Any, attribute: str, value: Any) -> Iterator[Any]:
    """``owner.attribute = value`` for the duration (yields the original), then the original again."""
    original = getattr(owner, attribute)
    setattr(owner, attribute, value)
    try:
        yield original
    finally:
        setattr(owner, attribute, original)


@contextlib.contextmanager
def kfp_local_patches(*, parallel: int = 4, pool: WarmPool | None = None, on_interrupt: Callable[[], None] | None = None) -> Iterator[bool]:
    """Apply the kfp.local run's patches for the duration and put kfp's originals back after (an exception
    included); yields whether they were applied (False on an untested kfp: :func:`patches_usable`).

    Args:
        parallel: how many independent tasks may run at once; > 1 applies :func:`parallel_tasks` (1: kfp's own
            one-at-a-time loop).
        pool: prestarted step processes for :func:`bookkeeping_in_process`.
        on_interrupt: called in the driver thread when the run is interrupted while tasks run in parallel
            (heteroflow's: stop the step processes).
    """
    if not patches_usable():
        yield False
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(no_docker_import())  # first: the others import kfp.local.task_dispatcher
        if parallel > 1:
            stack.enter_context(parallel_tasks(parallel, on_interrupt=on_interrupt))
        stack.enter_context(bookkeeping_in_process(pool))
        from heteroflow.pipelines.kfp.loop_patch import loop_inputs

        stack.enter_context(loop_inputs())
        yield True


@contextlib.contextmanager
def pipeline_failures(into: list[list[str]]) -> Iterator[None]:
    """For the duration, append to ``into`` the chain of tasks (innermost first) of every kfp.local pipeline run that
    finished with status FAILURE (kfp's ``pipeline_orchestrator.log_and_maybe_raise_for_failure``, which logs it
    when ``raise_on_error`` is off and still does). A task kfp.local could not even start (a loop item it cannot
    coerce to the step's parameter type) leaves no attempt record: this is how the run learns it failed."""
    from kfp.local import pipeline_orchestrator

    original = pipeline_orchestrator.log_and_maybe_raise_for_failure

    def recording(pipeline_name: str, raise_on_error: bool, fail_stack: list[str]) -> None:
        into.append(list(fail_stack))
        original(pipeline_name=pipeline_name, raise_on_error=raise_on_error, fail_stack=fail_stack)

    pipeline_orchestrator.log_and_maybe_raise_for_failure = recording
    try:
        yield
    finally:
        pipeline_orchestrator.log_and_maybe_raise_for_failure = original


_DOCKER_HANDLER = "kfp.local.docker_task_handler"


@contextlib.contextmanager
def no_docker_import() -> Iterator[None]:
    """:data:`NO_DOCKER_IMPORT` for the duration (applied whatever the kfp version: :func:`kfp_local_patches` checks
    it): ``kfp.local.task_dispatcher`` imported without running ``kfp.local.docker_task_handler`` (nor the docker
    SDK), and its ``_DOCKER_AVAILABLE`` False while the run's SubprocessRunner tasks are dispatched.

    The handler module is made lazy only when neither it nor the dispatcher is imported yet and the ``docker``
    package is installed (without it, kfp's own import fails at once and sets ``_DOCKER_AVAILABLE`` False); it
    stays lazy after the run (a module that runs on first use, as imported modules stay imported), so a later
    DockerRunner task in this process loads it then.
    """
    import importlib.util

    if _DOCKER_HANDLER not in sys.modules and "kfp.local.task_dispatcher" not in sys.modules:
        with contextlib.suppress(ImportError, ValueError):
            if importlib.util.find_spec("docker") is not None:
                spec = importlib.util.find_spec(_DOCKER_HANDLER)
                if spec is not None and spec.loader is not None:
                    spec.loader = importlib.util.LazyLoader(spec.loader)
                    module = importlib.util.module_from_spec(spec)
                    sys.modules[_DOCKER_HANDLER] = module
                    spec.loader.exec_module(module)  # LazyLoader: the module's code runs on first attribute use
                    import kfp.local

                    kfp.local.docker_task_handler = module  # type: ignore[attr-defined]  # as an import sets it
    from kfp.local import task_dispatcher

    with _replaced(task_dispatcher, "_DOCKER_AVAILABLE", False):
        yield


@contextlib.contextmanager
def cheap_container_checks() -> Iterator[None]:
    """:data:`CHEAP_CONTAINER_CHECK` for the duration (nothing on an untested kfp).

    KFP's resource setters each call ``PipelineTask._ensure_container_spec_exists``, which calls
    ``inspect.stack()`` only to name the caller in an error message: ~50 ms per call in a deep stack, seconds for
    a pipeline with fallback branches. While rendering, use the same check without the stack walk (kfp 2.17's
    check, message included)."""
    if not patches_usable():
        yield
        return
    from kfp.dsl import PipelineTask

    def ensure(self: PipelineTask) -> None:
        if self.container_spec is None:
            raise ValueError(
                "this setter can only be used on single-step components, not pipelines used as components, or "
                "special components like importers."
            )

    with _replaced(PipelineTask, "_ensure_container_spec_exists", ensure):
        yield


# --- parallel-dag, one-logger-setup, one-print-indent, stop-on-interrupt ------------------------------------

TASK_ENDED = threading.Event()
"""Set when a task of the run has ended (:func:`_run_dag_in_parallel`): wakes the report's
:func:`~heteroflow.pipelines.runs.prerendering.prerender`. Never set on kfp's own loop."""

STOPPING = threading.Event()
"""Set when a run is interrupted: kfp.local starts no task (and no retry of one) after it."""


@contextlib.contextmanager
def parallel_tasks(max_workers: int, *, on_interrupt: Callable[[], None] | None = None) -> Iterator[None]:
    """Let kfp.local run the tasks of a DAG that do not depend on each other at the same time (as a cluster does):
    :data:`PARALLEL_DAG`, :data:`ONE_LOGGER_SETUP`, :data:`ONE_PRINT_INDENT` and :data:`STOP_ON_INTERRUPT` for the
    duration (applied whatever the kfp version: :func:`kfp_local_patches` checks it).

    kfp 2.17's local orchestrators run a DAG's tasks one at a time in a topological order; for the duration this
    replaces both with :func:`_run_dag_in_parallel`, which starts every task whose upstream tasks have settled,
    up to ``max_workers`` at once, with the same per-task semantics (kfp's own ``execute_task``: conditions,
    sub-DAGs, OneOf outputs, skipping tasks whose upstream failed). A DAG with exit handlers or ``ParallelFor``
    keeps kfp's own orchestrator. kfp's per-task logger setup and print indentation are made once for the whole
    run, so the threads do not undo each other's.

    Args:
        max_workers: the most tasks running at once.
        on_interrupt: called in the driver thread when the run is interrupted (after :data:`STOPPING` is set).
    """
    from kfp.local import logging_utils, status, task_dispatcher
    from kfp.local.orchestrator import dag_orchestrator, enhanced_dag_orchestrator

    original_enhanced = enhanced_dag_orchestrator.run_enhanced_dag
    original_logger = logging_utils.local_logger_context
    original_indented = logging_utils.indented_print
    original_dispatch = task_dispatcher.run_single_task_implementation
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

    @contextlib.contextmanager
    def indented_once(num_spaces: int = 4) -> Iterator[None]:
        yield  # the run's one indentation (below) is in force for every task's lines

    def run_dag(*args: Any, **kwargs: Any) -> Any:
        return _run_dag_in_parallel(original_enhanced, max_workers, *args, on_interrupt=on_interrupt, **kwargs)

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if STOPPING.is_set():
            return {}, status.Status.FAILURE
        return original_dispatch(*args, **kwargs)

    STOPPING.clear()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_replaced(task_dispatcher, "run_single_task_implementation", dispatch))
        stack.enter_context(_replaced(enhanced_dag_orchestrator, "run_enhanced_dag", run_dag))
        stack.enter_context(_replaced(dag_orchestrator, "run_dag", run_dag))
        stack.enter_context(_replaced(logging_utils, "local_logger_context", logger_once))
        stack.enter_context(_replaced(logging_utils, "indented_print", indented_once))
        # one logger setup and one print indentation for the whole run: kfp's per-task `indented_print` swaps
        # builtins.print on entry and puts back what it found on exit, so tasks that start and end at the same
        # time in several threads would leave wrappers behind (every later print indented again, and slower)
        stack.enter_context(logger_once())
        stack.enter_context(original_indented())
        yield


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
    *,
    on_interrupt: Callable[[], None] | None = None,
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

    raised: BaseException | None = None  # the first task exception: no task starts after it, the running ones end
    try:
        while pending or running:
            if raised is not None:
                pending.clear()
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
            TASK_ENDED.set()
            if error is not None:
                if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: the interrupt path below
                    raise error
                # kfp's own orchestrator lets a task's exception (an item it cannot coerce to the step's parameter
                # type) propagate to the caller, a loop iteration's executor, which fails that iteration. It is
                # not an interrupt: the tasks running beside it (other iterations' steps) end as they would, and
                # it is raised once they have
                io_store.put_task_status(name, "FAILED")
                failed.add(name)
                settled.add(name)
                raised = raised or error
                continue
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
        STOPPING.set()
        if on_interrupt is not None:
            on_interrupt()
        raise
    if raised is not None:
        raise raised
    if failed:
        return {}, status.Status.FAILURE
    return OrchestratorUtils.get_dag_outputs(dag_outputs_spec=dag_spec.outputs, io_store=io_store), status.Status.SUCCESS


# --- bookkeeping-in-process ---------------------------------------------------------------------------------

_EXECUTOR_LOCK = threading.Lock()


@contextlib.contextmanager
def bookkeeping_in_process(pool: WarmPool | None = None) -> Iterator[None]:
    """:data:`BOOKKEEPING_IN_PROCESS` for the duration (applied whatever the kfp version: :func:`kfp_local_patches`
    checks it): run the rendering's bookkeeping tasks (a fallback chain's ``arguments`` and ``skip``, the final
    ``check``) in this process, and the step tasks in ``pool``'s prestarted processes
    (:mod:`heteroflow.pipelines.kfp.prestart`).

    They only pass strings on, or read the routes and fail the run, yet each took a step process of its own
    (~0.09 s: interpreter, kfp's executor). While this is active, kfp.local's subprocess task handler runs a task
    whose program is one of those functions (:func:`heteroflow.pipelines.kfp.render.bookkeeping_function`: the
    same source text, so the same code) through kfp's own ``Executor`` here: the same executor input, the same
    output file, the same task status (an exception is the task's failure, its traceback in ``kfp.log`` as a step
    process would print it). Every other task runs in a process of its own: one of ``pool``'s, started ahead of
    it, where the pool has one for it, else one started as kfp starts it.
    """
    import traceback

    from kfp.local import status, subprocess_task_handler

    from heteroflow.pipelines.kfp.render import bookkeeping_function

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

    with _replaced(subprocess_task_handler, "SubprocessTaskHandler", Handler):
        yield
