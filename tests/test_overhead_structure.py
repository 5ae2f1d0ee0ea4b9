"""What heteroflow adds per task over raw kfp.local (#32 item 6), guarded structurally, never by a timer: what a step
task's process imports, what the console script imports before its prestarted processes start, that a kfp.local run
never imports the docker SDK, that a pool starts no process its run's tasks cannot take, and that the run report's
timeline is drawn once for the check task's artifact and ``report.html``. ``benchmarks/overhead.py`` measures the
time."""

# no `from __future__ import annotations`: kfp reads the components' annotations as types

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from heteroflow.pipelines.kfp import prestart
from heteroflow.pipelines.kfp.prestart import WarmPool

HEAVY = ("torch", "numpy", "pandas", "pyarrow", "sklearn", "matplotlib", "airflow", "kubernetes", "kfp.client",
         "kfp.kubernetes", "docker", "typer", "rich", "PIL")
"""Libraries a step task's process must not import before its step function runs (the function imports what it
uses: train and evaluate import torch, preprocess numpy and pandas)."""
NOT_AT_START = ("importlib.metadata", "secrets", "ctypes")
"""Standard modules a step task needs only when it archives (the installed version) or syncs a file system: a few ms
each of every step process's start."""

SHIPPED = {
    "prewarm": "heteroflow.components.data.prewarm:PREWARM",
    "preprocess": "heteroflow.components.data.preprocess:PREPROCESS",
    "plan": "heteroflow.components.placement.plan:PLAN",
    "train": "heteroflow.components.training.step:TRAIN",
    "evaluate": "heteroflow.components.models.evaluate:EVALUATE",
    "archive": "heteroflow.components.models.archive:ARCHIVE",
}


def _python(code: str, **env: str) -> Any:
    """Run ``code`` in a fresh interpreter; the JSON its last line prints."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_shipped_steps_refs_are_the_steps_the_default_pipeline_runs() -> None:
    from heteroflow.components.core.step import step_ref
    from heteroflow.pipelines.default import default_pipeline

    assert {c.name: step_ref(c.step) for c in default_pipeline().calls} == SHIPPED


def test_a_step_tasks_entry_imports_no_heavy_library_before_its_function_runs() -> None:
    """What a kfp.local step task runs before the step's function: kfp's executor module (``_KFP_RUNTIME=true``, as
    kfp's command sets it), the component's entry (``heteroflow.components.core.runtime``) and the step's module
    (``load_step``). Each step's module is loaded in turn; none of them imports torch, numpy, pandas, matplotlib,
    Airflow, the Kubernetes client, kfp's server client, docker or the command line's libraries (nor
    :data:`NOT_AT_START`)."""
    code = (
        "import json, sys\n"
        "import kfp.dsl.executor_main\n"
        "from heteroflow.components.core.runtime import kfp_task\n"
        f"heavy = {HEAVY + NOT_AT_START!r}\n"
        "seen = {'entry': sorted(m for m in heavy if m in sys.modules)}\n"
        "from heteroflow.components.core.step import load_step\n"
        f"for name, ref in {SHIPPED!r}.items():\n"
        "    load_step(ref)\n"
        "    seen[name] = sorted(m for m in heavy if m in sys.modules)\n"
        "print(json.dumps(seen))\n"
    )
    seen = _python(code, _KFP_RUNTIME="true")
    assert seen == {"entry": [], **{name: [] for name in SHIPPED}}, seen


def test_a_step_that_does_not_train_runs_without_torch(tmp_path: Path) -> None:
    """The plan step, run as a task runs it (``run_step``), places the default candidates without importing torch,
    numpy or pandas (the CPU inventory comes from the device files, not from torch, where no driver is present)."""
    code = (
        "import json, os, sys\n"
        "from heteroflow.components.core.runtime import run_step\n"
        "from heteroflow.components.core.step import load_step\n"
        "from heteroflow.pipelines.default import default_pipeline\n"
        "from heteroflow.components.devices import all_kinds\n"
        "p = default_pipeline()\n"
        "outputs = {s.name: os.path.join(os.environ['HETEROFLOW_RUN_DIR'], 'out', s.name) for s in p['plan'].step.outputs}\n"
        "outcome = run_step(p['plan'].step, placements=p.placements(), outputs=outputs)  # records: $HETEROFLOW_RUN_DIR\n"
        "driver = any(os.path.exists(f) for k in all_kinds() for f in k.device_files)\n"
        "print(json.dumps({'status': outcome.status, 'reason': outcome.reason, 'driver': driver,\n"
        "                  'heavy': sorted(m for m in ('torch', 'numpy', 'pandas', 'matplotlib') if m in sys.modules)}))\n"
    )
    seen = _python(code, HETEROFLOW_RUN_DIR=str(tmp_path))
    assert seen["status"] == "succeeded", seen["reason"]
    if seen["driver"]:
        pytest.skip("a GPU or NPU driver's device file is present here: the plan asks torch for the devices")
    assert seen["heavy"] == []
    attempt = json.loads((tmp_path / "steps" / "plan" / "attempt-1.json").read_text())
    assert attempt["status"] == "succeeded"


def test_the_console_scripts_pool_starts_before_the_step_contract_is_imported() -> None:
    """``heteroflow run`` starts its prestarted processes (:func:`prestart.start_early`) before it imports the command
    line; the prestart module imports nothing of heteroflow's but itself (the step contract's modules are read when a
    task first compares environments), so the pool starts at once."""
    code = (
        "import json, sys\n"
        "import heteroflow.pipelines.kfp.prestart as prestart\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('heteroflow.'))\n"
        "other = sorted(m for m in ('psutil', 'kfp', 'numpy', 'typer', 'rich') if m in sys.modules)\n"
        "from heteroflow.pipelines.environment import CONTRACT\n"
        "print(json.dumps({'loaded': loaded, 'other': other, 'task_variables': sorted(prestart.TASK_VARIABLES),\n"
        "                  'contract': sorted({*CONTRACT, 'TMPDIR'})}))\n"
    )
    seen = _python(code)
    assert seen["loaded"] == ["heteroflow.pipelines", "heteroflow.pipelines.kfp", "heteroflow.pipelines.kfp.prestart"]
    assert seen["other"] == []
    assert seen["task_variables"] == seen["contract"]
    assert prestart.TASK_VARIABLES == frozenset(seen["contract"])
    with pytest.raises(AttributeError, match="no attribute 'NOT_THERE'"):
        prestart.NOT_THERE  # noqa: B018


# --- the pool's limit ------------------------------------------------------------------------------------------

from kfp import dsl  # noqa: E402


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def say(label: str) -> str:
    return label


def _command(tmp_path: Path, label: str) -> list[str]:
    container = say.component_spec.implementation.container
    executor_input = json.dumps({
        "inputs": {"parameterValues": {"label": label}},
        "outputs": {"parameters": {"Output": {"outputFile": str(tmp_path / label / "Output")}},
                    "outputFile": str(tmp_path / label / "executor_output.json")},
    })
    return [executor_input if part == "{{$}}" else part for part in [*container.command, *container.args]]


def _always_idle() -> float:
    return 2.0


def _wait(condition: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the pool"
        time.sleep(0.02)


def _ready(pool: WarmPool) -> int:
    with pool._cond:
        return len(pool._ready)


def test_a_pool_starts_no_process_its_runs_tasks_cannot_take(tmp_path: Path) -> None:
    """A run with 2 step tasks and a pool of 3: 2 processes are started, each taken by a task, and none after the
    last task (it would import for nothing while the run ends); a task that started its own process counts too.
    Raising the limit starts more."""
    with WarmPool(3, idle_cores=_always_idle, limit=2) as pool:
        _wait(lambda: _ready(pool) == 2)
        assert pool.run(_command(tmp_path, "a")) == 0
        assert pool.run(_command(tmp_path, "b")) == 0
        time.sleep(5 * prestart.POLL_SECONDS)  # the filling thread has been woken by both takes
        assert (pool.started, pool.used, _ready(pool)) == (2, 2, 0)
        pool.set_limit(3)  # one more task (a fallback the run could not foresee)
        _wait(lambda: _ready(pool) == 1)
        assert pool.started == 3
    assert json.loads((tmp_path / "b" / "executor_output.json").read_text())["parameterValues"]["Output"] == "b"
    with WarmPool(2, idle_cores=_always_idle, limit=1) as pool:
        pool.set_limit(0)  # e.g. a task that asked before any was ready, and started its own
        time.sleep(5 * prestart.POLL_SECONDS)
        assert pool.started <= 1  # the one already importing when the limit came


def test_a_runs_step_tasks_are_one_per_call_a_chain_without_planner_each_candidate_a_loop_unknown() -> None:
    from heteroflow.components.resources import Candidates
    from heteroflow.components.steps import PREWARM
    from heteroflow.pipelines.control import ParallelFor
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.graph import Pipeline
    from heteroflow.pipelines.kfp.local import _step_tasks

    assert _step_tasks(default_pipeline()) == 6  # the planner places train's candidate: one task each
    unplanned = default_pipeline(train_candidates=Candidates(["gpu", "cpu"])).subset(["prewarm", "preprocess", "train"], name="x")
    assert unplanned.planner is None
    assert _step_tasks(unplanned) == 4  # no planner: train's chain may run its gpu candidate, then its cpu one
    looped = Pipeline("looped")
    with ParallelFor(["a", "b", "c"]) as item:
        looped.add(PREWARM, source_uri=item)
    assert _step_tasks(looped) is None


# --- the run -------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_kfp_local_run_imports_no_docker_and_draws_its_timeline_once(digits_dir: Path, tmp_path: Path) -> None:
    """A whole kfp.local run in a fresh interpreter (prewarm only): kfp.local's dispatcher never imports the docker
    SDK (the run uses SubprocessRunner), and the report's timeline, drawn by the check task for its HTML artifact, is
    not drawn again for ``report.html`` (the same attempts), which holds the same plot."""
    code = (
        "import json, sys\n"
        "from heteroflow.pipelines.runs import charts\n"
        "drawn = []\n"
        "real = charts._svg\n"
        "def count(fig, label):\n"
        "    drawn.append(label)\n"
        "    return real(fig, label)\n"
        "charts._svg = count\n"
        "from heteroflow.components.steps import PREWARM\n"
        "from heteroflow.pipelines.graph import Pipeline\n"
        "from heteroflow.pipelines.kfp.local import run_local\n"
        "p = Pipeline('prewarm-only')\n"
        "p.add(PREWARM, source_uri=p.param('dataset_uri'))\n"
        "record = run_local({'dataset_uri': sys.argv[1]}, pipeline=p, run_dir=sys.argv[2])\n"
        "print(json.dumps({'status': record.status, 'error': record.error, 'docker': 'docker' in sys.modules,\n"
        "                  'drawn': drawn}))\n"
    )
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", code, str(digits_dir), str(run_dir)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HETEROFLOW_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["status"] == "succeeded", seen["error"]
    assert seen["docker"] is False
    assert seen["drawn"] == ["timeline"], seen["drawn"]
    artifact = next(run_dir.glob("kfp/*/heteroflow-check/report"))
    for html in (artifact.read_text(encoding="utf-8"), (run_dir / "report.html").read_text(encoding="utf-8")):
        assert 'data-plot="timeline"' in html


# --- the report's plots ----------------------------------------------------------------------------------------


def test_a_plot_another_thread_is_drawing_is_waited_for_not_drawn_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """kfp.local's check task renders the report while the prerendering thread may still draw a plot: the second
    caller waits for that drawing and gets its result; the function ran once. Where the drawing fails, the waiting
    caller draws the plot itself."""
    import threading

    from heteroflow.pipelines.runs import charts

    monkeypatch.setattr(charts, "_CHARTS", {})
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    @charts._memo
    def plot(label: str) -> str:
        calls.append(label)
        started.set()
        assert release.wait(30)
        if label == "broken" and len(calls) == 1:
            raise RuntimeError("the first drawing failed")
        return f"<svg>{label}</svg>"

    results: dict[str, Any] = {}

    def first(label: str) -> None:
        try:
            results["first"] = plot(label)
        except RuntimeError as exc:
            results["first"] = exc

    for label, expected_calls in (("same", ["same"]), ("broken", ["broken", "broken"])):
        calls.clear()
        started.clear()
        release.clear()
        drawer = threading.Thread(target=first, args=(label,))
        drawer.start()
        assert started.wait(30)
        waiter = threading.Thread(target=lambda label=label: results.__setitem__("second", plot(label)))
        waiter.start()
        time.sleep(0.2)
        assert calls == [label], "the second caller waits while the first draws"
        release.set()
        drawer.join(30)
        waiter.join(30)
        assert calls == expected_calls
        assert results["second"] == f"<svg>{label}</svg>"
        assert charts._DRAWING == {}
    assert isinstance(results["first"], RuntimeError)


def _benchmark(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # both import Airflow, kfp and heteroflow's runs only inside their functions
    return module


def test_the_overhead_benchmarks_count_a_loops_attempts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both benchmarks globbed ``steps/*/attempt-*.json`` and missed the attempts of a call inside a ParallelFor
    (``steps/<call>/iteration-<i>/attempt-<n>.json``): they now read the run's records as the project does."""
    from heteroflow.components.core.telemetry import RUN_DIR_ENV, Iteration, step_attempt

    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    with step_attempt("prepare") as record:
        record.call_seconds, record.compute_seconds = 1.0, 0.5
    for i in range(3):
        with step_attempt("train", iteration=Iteration(index=i, item=i)) as record:
            record.call_seconds, record.compute_seconds = 2.0, 1.5
    assert len(list(tmp_path.glob("steps/train/iteration-*/attempt-1.json"))) == 3
    found = _benchmark("overhead").attempts(tmp_path)
    assert sorted((r["step"], r["iteration"]) for r in found) == [("prepare", None), ("train", 0), ("train", 1), ("train", 2)]
    assert _benchmark("airflow_overhead").work_seconds(tmp_path) == (7.0, 5.0)
