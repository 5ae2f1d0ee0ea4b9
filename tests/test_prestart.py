"""Prestarted step processes for kfp.local (#15, overhead): each task runs kfp's own executor in a fresh process of
its own, started ahead of the task; the task's output, status, environment and outputs are what kfp.local's own
process gives."""

# no `from __future__ import annotations`: kfp reads the components' annotations as types

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from kfp import dsl

from heteroflow.pipelines.kfp import prestart
from heteroflow.pipelines.kfp.prestart import WarmPool, lightweight_program, prestart_size


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def report_process(label: str) -> str:
    """What the task's process sees: its pid, the run id variable, TMPDIR, its standard input."""
    import json
    import os
    import sys
    import tempfile

    print(f"task {label} running")
    return json.dumps(
        {
            "pid": os.getpid(),
            "run_id": os.environ.get("HETEROFLOW_RUN_ID"),
            "tmp": tempfile.gettempdir(),
            "stdin": sys.stdin.read(),
            "kfp_runtime": os.environ.get("_KFP_RUNTIME"),
        }
    )


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def fails(label: str) -> str:
    raise RuntimeError(f"step {label} failed on purpose")


@dsl.component(base_image="python:3.11", install_kfp_package=False, packages_to_install=["six"])
def with_packages(label: str) -> str:
    return label


def _command(component: Any, tmp_path: Path, label: str) -> list[str]:
    """The task's full command as kfp.local's subprocess handler holds it (the executor input filled in)."""
    container = component.component_spec.implementation.container
    executor_input = json.dumps(
        {
            "inputs": {"parameterValues": {"label": label}},
            "outputs": {
                "parameters": {"Output": {"outputFile": str(tmp_path / label / "Output")}},
                "outputFile": str(tmp_path / label / "executor_output.json"),
            },
        }
    )
    return [executor_input if part == "{{$}}" else part for part in [*container.command, *container.args]]


def _output(tmp_path: Path, label: str) -> Any:
    """The task's returned value, from the executor output file kfp's executor wrote."""
    return json.loads((tmp_path / label / "executor_output.json").read_text())["parameterValues"]["Output"]


def _always_idle() -> float:
    return 2.0


def _run(pool: WarmPool, command: list[str], env_vars: dict[str, str] | None = None) -> tuple[int | None, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = pool.run(command, env_vars)
    return code, out.getvalue()


def test_a_task_runs_in_a_prestarted_process_as_kfp_runs_it(tmp_path: Path) -> None:
    from kfp.local import subprocess_task_handler

    own = subprocess_task_handler.replace_python_executable(_command(report_process, tmp_path, "own"), sys.executable)
    own_out = io.StringIO()
    with contextlib.redirect_stdout(own_out):
        own_code = subprocess_task_handler.run_local_subprocess(own)
    with WarmPool(1, idle_cores=_always_idle) as pool:
        _wait_ready(pool)
        code, printed = _run(pool, _command(report_process, tmp_path, "warm"))
    assert (own_code, code) == (0, 0)
    assert pool.used == 1
    own_seen, seen = json.loads(_output(tmp_path, "own")), json.loads(_output(tmp_path, "warm"))
    assert seen["pid"] != os.getpid() and not psutil.pid_exists(seen["pid"])  # its own process, ended with the task
    assert seen["kfp_runtime"] == own_seen["kfp_runtime"] == "true"
    assert seen["stdin"] == ""
    # the same lines as kfp's own process: the executor's log and the function's print, then the separator
    assert "task warm running" in printed and "task own running" in own_out.getvalue()
    assert "Looking for component `report_process`" in printed
    assert printed.endswith("\n\n") and own_out.getvalue().endswith("\n\n")
    # the executor module runs as __main__ as `python -m` runs it, without runpy's warning that it was imported
    assert "Warning" not in printed and "Warning" not in own_out.getvalue(), printed


def test_each_prestarted_process_runs_one_task(tmp_path: Path) -> None:
    with WarmPool(2, idle_cores=_always_idle) as pool:
        pids = []
        for label in ("a", "b", "c"):
            _wait_ready(pool)
            code, _ = _run(pool, _command(report_process, tmp_path, label))
            assert code == 0
            pids.append(json.loads(_output(tmp_path, label))["pid"])
    assert len(set(pids)) == 3
    assert pool.used == 3 and pool.started >= 3


def test_the_task_gets_the_run_variables_set_after_its_process_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HETEROFLOW_RUN_ID", raising=False)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with WarmPool(1, idle_cores=_always_idle) as pool:
        _wait_ready(pool)
        monkeypatch.setenv("HETEROFLOW_RUN_ID", "run-after-start")  # as run_local sets the step contract
        monkeypatch.setenv("TMPDIR", str(scratch))
        code, _ = _run(pool, _command(report_process, tmp_path, "late"))
    assert code == 0 and pool.used == 1
    seen = json.loads(_output(tmp_path, "late"))
    assert seen["run_id"] == "run-after-start"
    assert seen["tmp"] == str(scratch)


def test_a_process_started_with_another_environment_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HETEROFLOW_TEST_OTHER", raising=False)
    with WarmPool(1, idle_cores=_always_idle) as pool:
        first = _wait_ready(pool)
        monkeypatch.setenv("HETEROFLOW_TEST_OTHER", "1")  # not a task variable: a module may read it on import
        code, _ = _run(pool, _command(report_process, tmp_path, "other"))
    assert code is None  # the task starts its own process, as kfp starts it
    assert pool.used == 0
    assert first.process.poll() is not None  # the stale one was killed


def test_a_failing_task_fails_with_its_traceback(tmp_path: Path) -> None:
    with WarmPool(1, idle_cores=_always_idle) as pool:
        _wait_ready(pool)
        code, printed = _run(pool, _command(fails, tmp_path, "x"))
    assert code == 1
    assert "RuntimeError: step x failed on purpose" in printed and "Traceback" in printed


def test_commands_that_are_not_a_lightweight_component_start_their_own_process(tmp_path: Path) -> None:
    command = _command(report_process, tmp_path, "a")
    source, args = lightweight_program(command) or ("", [])
    assert "def report_process(label: str) -> str:" in source
    assert args[0] == "--executor_input" and args[-2:] == ["--function_to_execute", "report_process"]
    replaced = [command[0], command[1], command[2].replace("python3", sys.executable), *command[3:]]
    assert lightweight_program(replaced) == (source, args)  # after kfp.local's replace_python_executable
    assert lightweight_program([command[0], command[1], command[2].replace("python3", "/other/python"), *command[3:]]) is None
    assert lightweight_program(_command(with_packages, tmp_path, "p")) is None  # pip install first: kfp's own
    assert lightweight_program(["sh", "-c", "echo hi"]) is None
    with WarmPool(1, idle_cores=_always_idle) as pool:
        assert pool.run(["sh", "-c", "echo hi"]) is None
        assert pool.used == 0


def test_nothing_starts_while_no_core_is_idle(tmp_path: Path) -> None:
    with WarmPool(2, idle_cores=lambda: 0.0) as pool:
        time.sleep(3 * prestart.POLL_SECONDS)
        code, _ = _run(pool, _command(report_process, tmp_path, "busy"))
    assert code is None  # none ready nor importing: the task starts its own at once
    assert pool.started == 0


def test_close_kills_the_unused_processes() -> None:
    before = {p.pid for p in psutil.Process().children()}
    pool = WarmPool(2, idle_cores=_always_idle)
    with pool:
        first = _wait_ready(pool)
        deadline = time.monotonic() + 30
        while pool.started < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        children = {p.pid for p in psutil.Process().children()} - before
        assert first.process.pid in children and len(children) == 2
    assert first.process.poll() is not None
    assert not ({p.pid for p in psutil.Process().children()} & children)
    assert pool.run(["sh"]) is None


def test_prestart_size_from_the_environment() -> None:
    assert prestart_size({}) == prestart.DEFAULT_SIZE
    assert prestart_size({"HETEROFLOW_PRESTART": "0"}) == 0
    assert prestart_size({"HETEROFLOW_PRESTART": " 5 "}) == 5
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(ValueError, match=r"HETEROFLOW_PRESTART=.*valid: a whole number >= 0"):
            prestart_size({"HETEROFLOW_PRESTART": bad})


def test_a_bad_prestart_setting_is_refused_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.errors import InvalidParameter
    from heteroflow.pipelines.kfp.local import run_local

    monkeypatch.setenv("HETEROFLOW_PRESTART", "many")
    with pytest.raises(InvalidParameter, match="HETEROFLOW_PRESTART"):
        run_local(run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


_RECORD_READS = r"""
import json, os, sys
reads = set()
class Recording(type(os.environ)):
    def __getitem__(self, key):
        reads.add(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        reads.add(key)
        return super().__contains__(key)
recording = Recording(os.environ._data, os.environ.encodekey, os.environ.decodekey, os.environ.encodevalue, os.environ.decodevalue)
os.environ = recording
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(reads)))
"""


def test_no_preloaded_module_reads_a_task_variable_when_imported() -> None:
    """A prestarted process imports these before its task's variables are set: none may read one on import
    (``os.environ.get``, ``[]`` and ``in``, and ``os.getenv``, all go through the mapping recorded here)."""
    modules = ["heteroflow.pipelines.kfp.prestart", "kfp.dsl.executor_main", *prestart.DEFAULT_PRELOAD]  # as a process imports them
    env = {k: v for k, v in os.environ.items() if k not in prestart.TASK_VARIABLES}
    env.update({"_KFP_RUNTIME": "true", "HETEROFLOW_RUN_DIR": "/nonexistent", "HETEROFLOW_RUN_ID": "r"})
    out = subprocess.run([sys.executable, "-c", _RECORD_READS, *modules], env=env, capture_output=True, text=True, check=True)
    reads = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "_KFP_RUNTIME" in reads  # the recording sees reads at import (kfp's __init__ reads this one)
    assert not reads & prestart.TASK_VARIABLES


def _wait_ready(pool: WarmPool, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with pool._cond:
            if pool._ready:
                return pool._ready[0]
        time.sleep(0.02)
    raise AssertionError("no prestarted process became ready")


# The pool starts a process only while a core is idle (prestart.MIN_IDLE_CORES): alone on a quiet machine it is,
# beside another pytest-xdist worker or a loaded machine it may never be, and no task runs prestarted. Loaded through
# PYTHONPATH as `sitecustomize` in the command line's processes, this sets the threshold to 0 once the module is
# imported, so the test sees the pool's tasks whatever else runs on the machine.
_ANY_LOAD_HOOK = """
import importlib.abc, importlib.util, sys


class _AnyLoad(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "heteroflow.pipelines.kfp.prestart":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.MIN_IDLE_CORES = 0.0

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AnyLoad())
"""


def _cli_run(tmp_path: Path, name: str, digits_dir: Path, env: dict[str, str]) -> tuple[dict, str, list[dict]]:
    out = tmp_path / name
    hook = tmp_path / f"{name}-hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_ANY_LOAD_HOOK)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p), **env}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("heteroflow")), "run", "--dataset", str(digits_dir), "--output", str(out),
         "--param", "epochs=1", "--simulate-devices", "npu,gpu", "--inject-fault", "train@npu=device"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "120", **env},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    attempts = [json.loads(p.read_text()) for p in sorted(out.glob("steps/*/attempt-*.json"))]
    return json.loads((out / "run.json").read_text()), (out / "kfp.log").read_text(), attempts


@pytest.mark.slow
def test_the_command_line_runs_steps_and_a_fallback_in_prestarted_processes(tmp_path: Path, digits_dir: Path) -> None:
    record, log, attempts = _cli_run(tmp_path, "warm", digits_dir, {})
    cold, cold_log, cold_attempts = _cli_run(tmp_path, "cold", digits_dir, {"HETEROFLOW_PRESTART": "0"})
    # tasks that ran in a prestarted process say so in kfp.log (their program's folder); with 0, none did
    assert log.count("/prestarted.") >= 1, "no task ran in a prestarted process"
    assert "/prestarted." not in cold_log
    # the same run either way: statuses, devices, the fallback from the npu to the gpu candidate
    assert record["status"] == cold["status"] == "succeeded"
    assert [(s["name"], s["status"], s["device"]) for s in record["steps"]] == [
        (s["name"], s["status"], s["device"]) for s in cold["steps"]
    ]
    assert [(f["step"], f["kind"], f["failure"]) for f in record["fallbacks"]] == [("train", "npu", "device")]
    assert [(f["step"], f["kind"], f["failure"]) for f in cold["fallbacks"]] == [("train", "npu", "device")]
    # one process per attempt, and none is left running
    pids = [a["pid"] for a in attempts]
    assert len(pids) == len(set(pids)) == len(cold_attempts)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run"], True),
        (["--debug", "run", "-p", "epochs=1"], True),
        (["run", "--engine", "kfp-local"], True),
        (["run", "--engine=kfp-local", "--dataset", "d"], True),
        (["run", "--engine", "inprocess"], False),
        (["run", "--engine=inprocess"], False),
        (["run", "--help"], False),
        (["run", "--", "--help"], True),  # after "--" a word is an argument, not an option
        (["runs", "list"], False),
        (["compile", "run"], False),
        ([], False),
        (["--debug"], False),
    ],
)
def test_the_console_script_reads_whether_it_runs_on_kfp_local_from_the_plain_words(args: list[str], expected: bool) -> None:
    from heteroflow.pipelines.cli.script import runs_on_kfp_local

    assert runs_on_kfp_local(args) is expected


@pytest.mark.parametrize(("args", "started"), [(["run", "--no-such-option"], True), (["run", "--engine", "inprocess", "--x"], False)])
def test_the_console_script_starts_the_step_processes_before_it_imports_the_command_line(args: list[str], started: bool) -> None:
    """``heteroflow run`` on kfp.local starts its pool before typer and the CLI module are imported (their import and
    parse is what the pool's start overlaps); a usage error typer reports next ends the process, and its pool."""
    code = (
        "import atexit, json, sys\n"
        "from heteroflow.pipelines.kfp import prestart\n"
        "seen = []\n"
        "prestart.start_early = lambda *a, **k: seen.append(sorted(m for m in ('typer', 'heteroflow.pipelines.cli.main') if m in sys.modules))\n"
        "atexit.register(lambda: print('SEEN', json.dumps(seen)))\n"
        f"sys.argv = ['heteroflow', *{args!r}]\n"
        "from heteroflow.pipelines.cli.script import console_script\n"
        "console_script()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr  # typer's usage error
    assert "No such option" in proc.stderr
    seen = json.loads(proc.stdout.rpartition("SEEN ")[2])
    assert seen == ([[]] if started else []), seen
