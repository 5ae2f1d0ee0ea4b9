"""kfp.local runs the rendering's bookkeeping tasks (a chain's arguments and skip, the final check) in the driver process, with
kfp's own executor; every step task still starts a process of its own (#15, overhead)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from heteroflow.components.resources import Candidates
from heteroflow.pipelines.default import default_pipeline
from heteroflow.pipelines.kfp.render import bookkeeping_function, to_kfp


def _commands() -> dict[str, list[str]]:
    """Executor label -> its full command (command + args) in the default pipeline rendered for kfp.local."""
    rendered = to_kfp(default_pipeline(train_candidates=Candidates(["npu", "gpu", "cpu"])), local=True)
    spec = json_format.MessageToDict(rendered.pipeline_spec)
    return {
        label: list(e["container"]["command"]) + list(e["container"].get("args", []))
        for label, e in spec["deploymentSpec"]["executors"].items()
        if "container" in e
    }


def _executor_input(tmp_path: Path, params: dict[str, Any], outputs: list[str]) -> str:
    return json.dumps(
        {
            "inputs": {"parameterValues": params},
            "outputs": {
                "parameters": {name: {"outputFile": str(tmp_path / "out" / name)} for name in outputs},
                "outputFile": str(tmp_path / "out" / "executor_output.json"),
            },
        }
    )


def _filled(command: list[str], executor_input: str) -> list[str]:
    return [executor_input if part == "{{$}}" else part for part in command]


def _handler(command: list[str]) -> Any:
    from kfp.local import SubprocessRunner, subprocess_task_handler

    return subprocess_task_handler.SubprocessTaskHandler(
        image="heteroflow-python:0.1.0", full_command=command, pipeline_root="/unused", runner=SubprocessRunner(use_venv=False)
    )


@pytest.fixture()
def no_process(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every process kfp.local would start is recorded and refused."""
    started: list[list[str]] = []

    def popen(cmd: list[str], *args: Any, **kwargs: Any) -> Any:
        started.append(cmd)
        raise RuntimeError("a process was started")

    monkeypatch.setattr(subprocess, "Popen", popen)
    return started


def test_only_the_bookkeeping_functions_with_their_exact_source_are_found() -> None:
    commands = _commands()
    skips = [c for label, c in commands.items() if "skip" in label]
    checks = [c for label, c in commands.items() if "check" in label]
    arguments = [c for label, c in commands.items() if "arguments" in label]
    steps = [c for label, c in commands.items() if not any(k in label for k in ("skip", "check", "arguments"))]
    assert skips and checks and arguments and len(steps) >= 6
    assert all(bookkeeping_function(c).__name__ == "heteroflow_skip_train" for c in skips)
    assert bookkeeping_function(checks[0]).__name__ == "heteroflow_check"
    assert bookkeeping_function(arguments[0]).__name__ == "heteroflow_arguments_train"
    assert all(bookkeeping_function(c) is None for c in steps), "a step task never runs in the driver"
    tampered = [p.replace("return route", "return route + 'x'") for p in skips[0]]
    assert tampered != skips[0] and bookkeeping_function(tampered) is None, "another program than ours runs as kfp runs it"


def test_a_skip_task_runs_in_this_process_with_kfps_executor(tmp_path: Path, no_process: list[list[str]]) -> None:
    from kfp.local import status

    from heteroflow.pipelines.kfp.local import _bookkeeping_in_process

    skip = next(c for label, c in _commands().items() if "skip" in label)
    outputs = ["Output", "heteroflow_uri_model", "heteroflow_uri_metrics"]
    executor_input = _executor_input(tmp_path, {"route": "to-2", "uri_model": "file:///m", "uri_metrics": "file:///x"}, outputs)
    with _bookkeeping_in_process():
        assert _handler(_filled(skip, executor_input)).run() == status.Status.SUCCESS
    assert no_process == []
    written = json.loads((tmp_path / "out" / "executor_output.json").read_text())
    assert written["parameterValues"]["Output"] == "to-2"
    assert (tmp_path / "out" / "heteroflow_uri_model").read_text() == "file:///m"
    assert (tmp_path / "out" / "heteroflow_uri_metrics").read_text() == "file:///x"


def test_a_failing_check_is_the_tasks_failure_with_its_message(tmp_path: Path, no_process: list[list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    from kfp.local import status

    from heteroflow.pipelines.kfp.local import _bookkeeping_in_process

    check = next(c for label, c in _commands().items() if "check" in label)
    routes = {f"route_{c}": "succeeded" for c in ("prewarm", "preprocess", "plan", "evaluate", "archive")}
    routes["route_train"] = 'failed: permanent: ValueError: bad \\"label\\"'
    with _bookkeeping_in_process():
        result = _handler(_filled(check, _executor_input(tmp_path, routes, ["Output"]))).run()
    assert result == status.Status.FAILURE and no_process == []
    printed = capsys.readouterr().out
    assert "RuntimeError: step 'train' failed (permanent; not retried): ValueError: bad \"label\"" in printed


def test_step_tasks_and_everything_outside_the_context_start_their_process(tmp_path: Path, no_process: list[list[str]]) -> None:
    from heteroflow.pipelines.kfp.local import _bookkeeping_in_process

    commands = _commands()
    train = next(c for label, c in commands.items() if label.startswith("exec-train"))
    skip = next(c for label, c in commands.items() if "skip" in label)
    executor_input = _executor_input(tmp_path, {}, ["Output"])
    with _bookkeeping_in_process(), pytest.raises(RuntimeError, match="a process was started"):
        _handler(_filled(train, executor_input)).run()
    with pytest.raises(RuntimeError, match="a process was started"):  # the context restores kfp's handler
        _handler(_filled(skip, executor_input)).run()
    assert len(no_process) == 2


def test_a_chains_arguments_task_returns_the_parameters_as_one_json_object(tmp_path: Path, no_process: list[list[str]]) -> None:
    from kfp.local import status

    from heteroflow.pipelines.kfp.local import _bookkeeping_in_process

    command = next(c for label, c in _commands().items() if "arguments" in label)
    given = {"epochs": 3, "learning_rate": 0.05, "model_factory": "my.models:build", "deterministic": True, "batch_size": 32}
    with _bookkeeping_in_process():
        assert _handler(_filled(command, _executor_input(tmp_path, given, ["Output"]))).run() == status.Status.SUCCESS
    out = json.loads(json.loads((tmp_path / "out" / "executor_output.json").read_text())["parameterValues"]["Output"])
    assert {k: out[k] for k in given} == given
    assert out["hidden_units"] == 128 and out["precision"] == "auto", "unset parameters take the step's defaults"
    assert isinstance(out["epochs"], int) and isinstance(out["learning_rate"], float)


def test_print_is_kfps_own_again_after_runs_whose_tasks_start_and_end_at_once(tmp_path: Path) -> None:
    """kfp's per-task print indentation swaps builtins.print; tasks that start and end together in several
    threads (the arguments task, plan and prewarm, all ready at once) must not leave a wrapper behind."""
    import builtins
    import threading
    import time

    from kfp.local import logging_utils

    from heteroflow.pipelines.kfp.local import _parallel_tasks

    before = builtins.print
    barrier = threading.Barrier(8)

    def task() -> None:
        barrier.wait()
        for _ in range(50):
            with logging_utils.indented_print():
                time.sleep(0.001)  # a task's work: the threads' entries and exits interleave (kfp's own leaks then)

    with _parallel_tasks(8):
        threads = [threading.Thread(target=task) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert builtins.print is not before, "the run's lines are indented, as kfp indents a task's"
    assert builtins.print is before


TOY = '''
from pathlib import Path

from heteroflow.components.core.step import ArtifactSpec, ArtifactType, step


def scale(out_path: str, *, factor: float = 2.0, count: int = 3, label: str = "x", flag: bool = False,
          device: str = "cpu") -> dict:
    """Write factor * 1..count.

    Args:
        out_path: output file.
        factor: what to multiply by (unit: times).
        count: how many numbers.
        label: a name.
        flag: a switch.
        device: injected torch device type.
    """
    values = [factor * (i + 1) for i in range(count)]
    Path(out_path).write_text(" ".join(map(str, values)))
    return {"label": label, "flag": flag, "total": sum(values), "types": [type(v).__name__ for v in (factor, count, label, flag)]}


SCALE = step(scale, outputs=[ArtifactSpec(name="scaled", type=ArtifactType.DATASET, param="out_path")],
             candidates=["npu", "gpu", "cpu"], device_bound=True, device_param="device")
'''


@pytest.mark.slow
def test_a_user_chain_without_a_planner_gets_its_parameters_through_the_arguments_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chained call's constant, pipeline-parameter and default values reach the candidate that runs, typed,
    after device failures on the candidates before it (no plan step: candidate 0 starts the chain)."""
    import sys
    import textwrap
    import warnings

    from heteroflow.pipelines.graph import Pipeline
    from heteroflow.pipelines.kfp.local import run_local

    folder = tmp_path / "mod"
    folder.mkdir()
    (folder / "scaletoy.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))  # kfp.local's step processes import the step by name
    sys.modules.pop("scaletoy", None)
    import scaletoy

    p = Pipeline("scale-chain")
    p.add(scaletoy.SCALE, factor=1.5, label=p.param("label", default="unset"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = run_local({"label": "mine"}, pipeline=p, run_dir=tmp_path / "run", inject_faults="scale@npu=device,scale@gpu=device")
    assert not [w for w in caught if "does not fire" in str(w.message)], "without a plan step the faults do fire"
    assert record.status == "succeeded", record.error
    step = record.step("scale")
    assert (step.kind, step.attempts) == ("cpu", 3)
    assert [(f["kind"], f["failure"]) for f in record.fallbacks] == [("npu", "device"), ("gpu", "device")]
    assert record.results["scale"] == {**record.results["scale"], "label": "mine", "flag": False, "total": 9.0,
                                       "types": ["float", "int", "str", "bool"]}


def test_a_fault_on_a_kind_not_here_warns_only_where_a_plan_step_passes_that_kind_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import textwrap
    import warnings

    from heteroflow.pipelines.environment import testing_environment
    from heteroflow.pipelines.graph import Pipeline

    monkeypatch.delenv("HETEROFLOW_SIMULATE_DEVICES", raising=False)
    (tmp_path / "scaletoy.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("scaletoy", None)
    import scaletoy

    unplanned = Pipeline("scale-chain")
    unplanned.add(scaletoy.SCALE)
    for pipeline, expected in ((default_pipeline(), 1), (unplanned, 0)):
        step = "train" if pipeline.planner is not None else "scale"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with testing_environment(None, f"{step}@npu=device", pipeline=pipeline):
                pass
        fired = [str(w.message) for w in caught if "does not fire" in str(w.message)]
        assert len(fired) == expected, fired
