"""The kfp internals heteroflow replaces (:mod:`heteroflow.pipelines.kfp.patches`): each patch's assumptions about
kfp still hold, the version gate, and that a run puts kfp's originals back (#27)."""

from __future__ import annotations

import builtins
import inspect
import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from heteroflow.pipelines.kfp import patches as kfp_patches
from heteroflow.pipelines.kfp.patches import (
    BOOKKEEPING_IN_PROCESS,
    CHEAP_CONTAINER_CHECK,
    LAZY_KFP_CLIENT,
    NO_DOCKER_IMPORT,
    ONE_LOGGER_SETUP,
    ONE_PRINT_INDENT,
    PARALLEL_DAG,
    PATCHES,
    STOP_ON_INTERRUPT,
    Patch,
    UntestedKfpVersion,
    resolve,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*have no effect in the current local runner:UserWarning")

_DAG_PARAMS = [
    "pipeline_resource_name", "dag_component_spec", "executors", "components", "dag_arguments", "pipeline_root",
    "runner", "unique_pipeline_id", "fail_stack", "parent_io_store",
]
"""What :func:`kfp_patches._run_dag_in_parallel` takes after its own two arguments (kfp's ``run_enhanced_dag``)."""

UNDONE = [p for p in PATCHES if p.undone]


def _params(func: Any) -> list[str]:
    return list(inspect.signature(func).parameters)


def _source(func: Any) -> str:
    return inspect.getsource(func)


# --- the list ------------------------------------------------------------------------------------------------


def test_every_patch_is_named_documented_and_its_targets_exist() -> None:
    assert len({p.name for p in PATCHES}) == len(PATCHES) == 8
    targets = [t for p in PATCHES for t in p.replaces]
    assert len(set(targets)) == len(targets), "each kfp attribute belongs to one patch"
    for patch in UNDONE:
        assert len(patch.works_around) > 80, patch.name
        assert all(t.startswith("kfp.") and ":" in t for t in patch.replaces), patch.name
        # a function or class; no-docker-import replaces a flag (kfp's own `_DOCKER_AVAILABLE`)
        assert all(callable(v) or (patch is NO_DOCKER_IMPORT and isinstance(v, bool)) for v in patch.current().values()), patch.name
    assert all(p.issue is None or p.issue.startswith("https://github.com/kubeflow/pipelines/") for p in PATCHES)


def test_resolve_names_what_is_missing() -> None:
    with pytest.raises(AttributeError):
        resolve("kfp.local.task_dispatcher:no_such_function")
    with pytest.raises(ImportError):
        resolve("kfp.local.no_such_module:x")


# --- one test per patch: what it assumes about kfp ---------------------------------------------------------


def test_parallel_dag_replaces_the_two_orchestrators_kfp_looks_up_at_call_time() -> None:
    from kfp.local import io as kfp_io
    from kfp.local import pipeline_orchestrator
    from kfp.local.orchestrator import enhanced_dag_orchestrator as E
    from kfp.local.orchestrator.orchestrator_utils import OrchestratorUtils

    assert len(PARALLEL_DAG.replaces) == 2
    for original in PARALLEL_DAG.current().values():
        assert _params(original) == _DAG_PARAMS, "the replacement takes run_enhanced_dag's arguments"
    assert _params(kfp_patches._run_dag_in_parallel)[2:12] == _DAG_PARAMS
    # kfp reads both as module attributes when a pipeline runs (a replacement is seen), nested DAGs included
    runner = _source(pipeline_orchestrator._run_local_pipeline_implementation)
    assert "enhanced_dag_orchestrator.run_enhanced_dag(" in runner and "dag_orchestrator.run_dag(" in runner
    assert "return run_enhanced_dag(" in _source(E.execute_task)
    # what the replacement's loop calls
    assert _params(E.execute_task) == [
        "task_name", "task_spec", "pipeline_resource_name", "components", "executors", "io_store", "pipeline_root",
        "runner", "unique_pipeline_id", "fail_stack",
    ]
    assert _params(E.ConditionEvaluator().evaluate_condition) == ["condition", "io_store"]
    assert _params(E._has_valid_iterator) == ["task_spec"]
    assert _params(OrchestratorUtils.join_user_inputs_and_defaults) == ["dag_arguments", "dag_inputs_spec"]
    assert _params(OrchestratorUtils.get_dag_outputs) == ["dag_outputs_spec", "io_store"]
    store = kfp_io.IOStore(parent=None)
    store.put_parent_input("x", 1)
    store.put_task_output("t", "out", 2)
    store.put_task_status("t", "SUCCEEDED")
    assert (store.get_parent_input("x"), store.get_task_output("t", "out")) == (1, 2)


def test_one_logger_setup_replaces_a_context_kfp_enters_per_task() -> None:
    from kfp.local import task_dispatcher

    (target,) = ONE_LOGGER_SETUP.replaces
    original = resolve(target)
    assert _params(original) == []
    assert "logging_utils.local_logger_context()" in _source(task_dispatcher.run_single_task_implementation)
    root = logging.getLogger()
    before = root.handlers[:]
    with original():
        assert len(root.handlers) == 1 and root.handlers[0].stream is sys.stdout, "one handler to stdout, set per entry"
    assert root.handlers == before, "and the previous handlers back on exit"


def test_one_print_indent_replaces_a_context_that_swaps_builtins_print() -> None:
    from kfp.local import task_dispatcher

    (target,) = ONE_PRINT_INDENT.replaces
    original = resolve(target)
    assert _params(original) == ["num_spaces"]
    assert "logging_utils.indented_print()" in _source(task_dispatcher.run_single_task_implementation)
    before = builtins.print
    with original():
        assert builtins.print is not before
    assert builtins.print is before


def test_stop_on_interrupt_wraps_the_per_task_dispatch_kfp_calls_through_its_module() -> None:
    from kfp.local import status
    from kfp.local.orchestrator import task_executor

    (target,) = STOP_ON_INTERRUPT.replaces
    assert _params(resolve(target)) == [
        "pipeline_resource_name", "component_name", "component_spec", "executor_spec", "arguments", "pipeline_root",
        "runner", "raise_on_error", "block_input_artifact", "unique_pipeline_id",
    ]
    assert "task_dispatcher.run_single_task_implementation(" in _source(task_executor)
    assert {status.Status.SUCCESS, status.Status.FAILURE} <= set(status.Status)


def test_bookkeeping_in_process_subclasses_the_handler_kfp_picks_per_task() -> None:
    from kfp.dsl import executor
    from kfp.dsl.types import artifact_types
    from kfp.local import SubprocessRunner, task_dispatcher

    (target,) = BOOKKEEPING_IN_PROCESS.replaces
    handler_class = resolve(target)
    assert _params(handler_class.__init__) == ["self", "image", "full_command", "pipeline_root", "runner", "env_vars"]
    assert _params(handler_class.run) == ["self"]
    from kfp.dsl import component_factory

    def probe() -> None:
        pass

    command, args = component_factory._get_command_and_args_for_lightweight_component(probe)
    command = [*command, *args]
    handler = handler_class(image="python:3.11", full_command=command, pipeline_root="/unused",
                            runner=SubprocessRunner(use_venv=False), env_vars={"A": "1"})
    assert (handler.full_command, handler.env_vars, handler.runner.use_venv) == (command, {"A": "1"}, False)
    assert "subprocess_task_handler.SubprocessTaskHandler" in _source(task_dispatcher.run_single_task_implementation)
    assert _params(executor.Executor.__init__)[1:3] == ["executor_input", "function_to_execute"]
    assert hasattr(artifact_types, "CONTAINER_TASK_ROOT")


def test_bookkeeping_tasks_get_executor_input_on_their_command_line() -> None:
    from heteroflow.components.resources import Candidates
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.kfp.render import bookkeeping_function, to_kfp

    from google.protobuf import json_format

    spec = json_format.MessageToDict(to_kfp(default_pipeline(train_candidates=Candidates(["npu", "cpu"])), local=True).pipeline_spec)
    executors = spec["deploymentSpec"]["executors"].values()
    commands = [list(e["container"]["command"]) + list(e["container"].get("args", [])) for e in executors if "container" in e]
    bookkeeping = [c for c in commands if bookkeeping_function(c) is not None]
    assert bookkeeping and all("--executor_input" in c for c in bookkeeping)


def test_cheap_container_check_keeps_kfps_check_and_message() -> None:
    from kfp.dsl import PipelineTask

    (target,) = CHEAP_CONTAINER_CHECK.replaces
    original = resolve(target)
    assert _params(original) == ["self"]
    assert "inspect.stack()" in _source(original), "kfp no longer walks the stack: the patch can go"
    fake = type("Task", (), {"container_spec": None})()
    with pytest.raises(ValueError, match="can only be used on single-step components, not pipelines used as components"):
        original(fake)
    assert "self._ensure_container_spec_exists()" in _source(PipelineTask.set_cpu_limit)
    with kfp_patches.cheap_container_checks():
        assert PipelineTask._ensure_container_spec_exists is not original
        with pytest.raises(ValueError, match="this setter can only be used on single-step components"):
            PipelineTask._ensure_container_spec_exists(fake)
    assert PipelineTask._ensure_container_spec_exists is original


@pytest.mark.slow
def test_lazy_kfp_client_skips_kfp_client_and_imports_it_on_first_use() -> None:
    """In a fresh interpreter: kfp's ``_KFP_RUNTIME`` switch still skips its eager imports, and ``kfp.Client`` /
    ``kfp.dsl`` still work through the module ``__getattr__``."""
    code = (
        "import json, os, sys\n"
        "from heteroflow.pipelines.kfp.patches import import_kfp, resolve\n"
        "import_kfp()\n"
        "import kfp\n"
        "out = {'client_skipped': 'kfp.client' not in sys.modules, 'env': os.environ.get('_KFP_RUNTIME'),\n"
        "       'getattr': callable(resolve('kfp:__getattr__'))}\n"
        "out['dsl'] = kfp.dsl.__name__\n"
        "out['client'] = kfp.Client.__name__\n"
        "out['client_imported'] = 'kfp.client' in sys.modules\n"
        "print(json.dumps(out))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "_KFP_RUNTIME"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"client_skipped": True, "env": None, "getattr": True, "dsl": "kfp.dsl", "client": "Client",
                   "client_imported": True}
    assert LAZY_KFP_CLIENT.replaces == ("kfp:__getattr__",) and not LAZY_KFP_CLIENT.undone


def test_no_docker_import_relies_on_a_flag_kfp_reads_per_task_and_an_import_it_guards() -> None:
    """kfp's dispatcher imports the docker handler at its top, inside ``try/except ImportError`` that sets
    ``_DOCKER_AVAILABLE``, and reads the flag (a module global) for every task before it touches the handler."""
    import importlib.util

    from kfp.local import task_dispatcher

    source = Path(importlib.util.find_spec("kfp.local.task_dispatcher").origin).read_text()  # type: ignore[arg-type, union-attr]
    assert "    from kfp.local import docker_task_handler\n    _DOCKER_AVAILABLE = True\nexcept ImportError:" in source
    body = _source(task_dispatcher.run_single_task_implementation)
    assert body.index("if _DOCKER_AVAILABLE:") < body.index("docker_task_handler.DockerTaskHandler")
    assert NO_DOCKER_IMPORT.replaces == ("kfp.local.task_dispatcher:_DOCKER_AVAILABLE",) and NO_DOCKER_IMPORT.undone


@pytest.mark.slow
def test_no_docker_import_leaves_docker_unimported_during_a_run_and_usable_after() -> None:
    """In a fresh interpreter: while the run's patches apply, kfp.local's dispatcher is imported without the docker
    SDK and reads no docker handler; after them, kfp's DockerRunner handler loads on first use."""
    pytest.importorskip("docker", reason="kfp's DockerRunner needs the docker package, not installed here")
    code = (
        "import json, sys\n"
        "from heteroflow.pipelines.kfp.patches import import_kfp, kfp_local_patches\n"
        "import_kfp()\n"
        "with kfp_local_patches(parallel=4) as applied:\n"
        "    from kfp.local import task_dispatcher\n"
        "    during = {'applied': applied, 'docker': 'docker' in sys.modules, 'flag': task_dispatcher._DOCKER_AVAILABLE}\n"
        "after = {'docker': 'docker' in sys.modules, 'flag': task_dispatcher._DOCKER_AVAILABLE}\n"
        "handler = task_dispatcher.docker_task_handler.DockerTaskHandler.__name__\n"
        "print(json.dumps({'during': during, 'after': after, 'handler': handler, 'loaded': 'docker' in sys.modules}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "during": {"applied": True, "docker": False, "flag": False},
        "after": {"docker": False, "flag": True},
        "handler": "DockerTaskHandler",
        "loaded": True,
    }


def test_kfps_init_still_has_the_runtime_switch_lazy_kfp_client_relies_on() -> None:
    import importlib.util

    init = Path(importlib.util.find_spec("kfp").origin).read_text()  # type: ignore[arg-type, union-attr]
    assert "os.environ.get('_KFP_RUNTIME', 'false') != 'true'" in init
    assert "from kfp.client import Client" in init


# --- the version gate -----------------------------------------------------------------------------------


@pytest.fixture()
def kfp_version(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set the version :func:`kfp_patches.patches_usable` reads; warnings given before are forgotten."""
    monkeypatch.setattr(kfp_patches, "_WARNED", set())

    def use(version: str | None) -> None:
        monkeypatch.setattr(kfp_patches, "installed_kfp_version", lambda: version)

    return use


def test_the_installed_kfp_is_the_tested_series() -> None:
    kfp_patches.installed_kfp_version.cache_clear()
    version = kfp_patches.installed_kfp_version()
    assert version is not None and version.startswith(kfp_patches.TESTED_KFP_SERIES + ".")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kfp_patches.patches_usable()


@pytest.mark.parametrize(("version", "usable"), [("2.17.0", True), ("2.17.3", True), ("2.17.4rc1", True),
                                                 ("2.18.0", False), ("2.1.7", False), ("3.17.0", False)])
def test_only_the_tested_series_is_usable(kfp_version: Any, version: str, usable: bool) -> None:
    kfp_version(version)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert kfp_patches.patches_usable() is usable


def test_an_untested_kfp_gets_one_warning_and_no_patch(kfp_version: Any) -> None:
    kfp_version("2.99.1")
    originals = {t: v for p in UNDONE for t, v in p.current().items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not kfp_patches.patches_usable()
        with kfp_patches.kfp_local_patches(parallel=4) as applied, kfp_patches.cheap_container_checks():
            assert applied is False
            assert {t: resolve(t) for t in originals} == originals
        kfp_patches.import_kfp()
        assert not kfp_patches.patches_usable()
    untested = [w for w in caught if issubclass(w.category, UntestedKfpVersion)]
    assert len(untested) == 1, [str(w.message) for w in caught]
    message = str(untested[0].message)
    assert "kfp 2.99.1 is installed" in message and "kfp 2.17.x" in message and "one at a time" in message


def test_without_kfp_nothing_applies_and_nothing_warns(kfp_version: Any) -> None:
    kfp_version(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not kfp_patches.patches_usable()


# --- applying and undoing --------------------------------------------------------------------------------


def _applied(patch: Patch, originals: dict[str, Any]) -> bool:
    return all(resolve(t) is not originals[t] for t in patch.replaces)


def test_the_runs_patches_apply_for_the_duration_and_are_undone_after_an_error_too() -> None:
    from kfp.local.orchestrator import dag_orchestrator

    run_patches = [p for p in UNDONE if p is not CHEAP_CONTAINER_CHECK]
    originals = {t: v for p in run_patches for t, v in p.current().items()}
    with pytest.raises(RuntimeError, match="boom"), kfp_patches.kfp_local_patches(parallel=4) as applied:
        assert applied is True
        assert all(_applied(p, originals) for p in run_patches)
        raise RuntimeError("boom")
    assert {t: resolve(t) for t in originals} == originals
    with kfp_patches.kfp_local_patches(parallel=1):  # kfp's own loop: only the bookkeeping handler
        assert resolve(BOOKKEEPING_IN_PROCESS.replaces[0]) is not originals[BOOKKEEPING_IN_PROCESS.replaces[0]]
        assert dag_orchestrator.run_dag is originals["kfp.local.orchestrator.dag_orchestrator:run_dag"]
    assert {t: resolve(t) for t in originals} == originals


def _prewarm_only() -> Any:
    from heteroflow.components.steps import PREWARM
    from heteroflow.pipelines.graph import Pipeline

    p = Pipeline("prewarm-only")
    p.add(PREWARM, source_uri=p.param("dataset_uri"))
    return p


@pytest.mark.slow
def test_a_run_puts_kfps_originals_back(digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.pipelines.kfp.local import run_local

    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    originals = {t: v for p in UNDONE for t, v in p.current().items()}
    seen: list[bool] = []
    real = kfp_patches.bookkeeping_in_process

    def spy(pool: Any = None) -> Any:
        seen.append(pool is not None)  # the run's prestarted processes are handed to the patch
        return real(pool)

    monkeypatch.setattr(kfp_patches, "bookkeeping_in_process", spy)
    record = run_local({"dataset_uri": str(digits_dir)}, pipeline=_prewarm_only(), run_dir=tmp_path / "run")
    assert record.status == "succeeded", record.error
    assert seen == [True], "the run was patched"
    assert {t: resolve(t) for t in originals} == originals


@pytest.mark.slow
def test_an_untested_kfp_runs_the_default_pipeline_on_kfps_own_path(
    digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kfp_version: Any
) -> None:
    """One warning; no patch is applied; the default pipeline (a device fallback included, so the chain's
    arguments and skip tasks and the check run as kfp runs them: each in a process) succeeds."""
    from heteroflow.pipelines.kfp.local import run_local

    kfp_version("2.99.1")
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home"))
    applied: list[str] = []

    def refuse(name: str) -> Any:
        def patch(*args: Any, **kwargs: Any) -> Any:
            applied.append(name)
            raise AssertionError(f"{name} applied on an untested kfp")

        return patch

    for name in ("parallel_tasks", "bookkeeping_in_process"):
        monkeypatch.setattr(kfp_patches, name, refuse(name))
    from heteroflow.pipelines.kfp import local

    sizes: list[int] = []
    real_pool = local._warm_pool

    def pool(size: int, pipeline: Any) -> Any:
        sizes.append(size)
        return real_pool(size, pipeline)

    monkeypatch.setattr(local, "_warm_pool", pool)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = run_local(
            {"epochs": 2, "dataset_uri": str(digits_dir)},
            run_dir=tmp_path / "run",
            simulate_devices="npu",
            inject_faults="train@npu=device",
        )
    log = Path(record.run_dir, "kfp.log").read_text(errors="replace")
    assert record.status == "succeeded", f"{record.error}\n{log[-3000:]}"
    assert applied == []
    assert sizes == [0], "no process is prestarted: kfp.local as it is never hands a task to one"
    assert len([w for w in caught if issubclass(w.category, UntestedKfpVersion)]) == 1
    train = record.step("train")
    assert (train.kind, train.attempts) == ("cpu", 2)
    assert [f["kind"] for f in record.fallbacks] == ["npu"]
    assert {s.name for s in record.steps if s.status == "succeeded"} >= {"prewarm", "preprocess", "plan", "train", "evaluate", "archive"}
    assert "prestarted." not in log, "no task ran in a prestarted process"


# --- parallel-dag: a task's exception is not an interrupt -----------------------------------------------------


def test_a_tasks_exception_leaves_the_tasks_beside_it_to_end_and_is_raised_after_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """kfp's own orchestrator lets an exception from ``execute_task`` (a loop item it cannot coerce to the step's
    parameter type) reach its caller, a ParallelFor iteration's executor, which fails that iteration. The parallel
    DAG handled it as Ctrl-C: it set STOPPING and stopped every step process of the run, so the iterations running
    beside it failed too (CI, stop 43). Now the tasks running beside it end as they would, none starts after it,
    it is raised once they have ended, and nothing is stopped."""
    import time

    from kfp.local.orchestrator import enhanced_dag_orchestrator as E
    from kfp.local import status
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec = pipeline_spec_pb2.ComponentSpec()
    for name in ("slow", "bad"):
        spec.dag.tasks[name].task_info.name = name
    spec.dag.tasks["after-bad"].dependent_tasks.append("bad")
    ended: list[str] = []

    def execute_task(task_name: str, **_: Any) -> Any:
        if task_name == "bad":
            raise ValueError("invalid literal for int() with base 10: 'four'")
        if task_name == "slow":
            time.sleep(0.5)
        ended.append(task_name)
        return {"out": 1}, status.Status.SUCCESS

    monkeypatch.setattr(E, "execute_task", execute_task)
    interrupted: list[bool] = []
    kfp_patches.STOPPING.clear()
    with pytest.raises(ValueError, match="'four'"):
        kfp_patches._run_dag_in_parallel(
            lambda **_: pytest.fail("the DAG has no loop: kfp's own orchestrator is not used"), 4,
            "p", spec, {}, {}, {}, "/nonexistent", None, "id", [], on_interrupt=lambda: interrupted.append(True),
        )
    assert ended == ["slow"], "the task beside the failed one ran to its end; the one after it never started"
    assert interrupted == [] and not kfp_patches.STOPPING.is_set()

    # Ctrl-C in a task's thread is still an interrupt: STOPPING is set and the step processes are stopped
    def interrupt(task_name: str, **_: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(E, "execute_task", interrupt)
    with pytest.raises(KeyboardInterrupt):
        kfp_patches._run_dag_in_parallel(
            lambda **_: None, 4, "p", spec, {}, {}, {}, "/nonexistent", None, "id", [], on_interrupt=lambda: interrupted.append(True),
        )
    assert interrupted == [True] and kfp_patches.STOPPING.is_set()
    kfp_patches.STOPPING.clear()
