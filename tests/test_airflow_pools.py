"""A missing Airflow pool fails the run at once (issue #16.14), on a real Airflow 3 with SQLite.

Airflow leaves a task whose pool does not exist ``scheduled`` for ever, and ``airflow dags test`` ignores pools,
so trying a DAG never showed it. The DAG's first task (``prepare-run``) now checks every pool its tasks use:

- ``airflow dags test`` (tasks in one process, Airflow's database readable): a missing pool (the issue's input)
  and a pool too small for a task (sibling) fail ``prepare-run`` before any step, naming ``heteroflow airflow
  pools``; once that command ran, the same DAG passes the check;
- the scheduler (``airflow scheduler`` + ``api-server`` + ``dag-processor``, LocalExecutor: workers cannot read
  the database in Airflow 3): the triggered run fails within seconds instead of hanging, from the record
  ``heteroflow airflow pools`` leaves in an Airflow Variable; after the command the run gets past the check.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("airflow", reason="the airflow extra is not installed")

from heteroflow.components.core.failures import FAULT_ENV, SIMULATE_ENV  # noqa: E402
from heteroflow.dags.pools import POOLS_VARIABLE  # noqa: E402

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

DAG_FILE = """\
# Airflow DAG file for the pool tests: the default pipeline, and one whose GPU candidate takes 2 devices
from heteroflow.dags.factory import build_dag
from heteroflow.pipelines.default import default_pipeline

default = build_dag(default_pipeline(name="hf-pools"), "hf-pools")
two_gpus = build_dag(default_pipeline(name="hf-two-gpus", train_candidates=["gpu:count=2", "cpu"]), "hf-two-gpus")
"""


def _env(home: Path, dags: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (SIMULATE_ENV, FAULT_ENV)}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **extra})
    return env


def _run(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*args], env=env, capture_output=True, text=True, timeout=timeout)


def _home(root: Path, migrated_airflow_home: Callable[[Path], Path], *, reserialize: bool = True) -> tuple[Path, Path, dict[str, str]]:
    """An AIRFLOW_HOME with the session's migrated database (conftest.py) and the DAG file; ``reserialize``: the DAGs
    serialized into the database too (what the scheduler reads; ``airflow dags test`` parses and syncs the file itself,
    so the test that uses only it skips this ``airflow`` process)."""
    home, dags = migrated_airflow_home(root / "home"), root / "dags"  # the session's `airflow db migrate` (conftest.py)
    dags.mkdir(parents=True)
    (dags / "hf_pools.py").write_text(DAG_FILE)
    env = _env(home, dags)
    for args in ((("dags", "reserialize"),) if reserialize else ()):
        done = _run(env, str(BIN / "airflow"), *args)
        assert done.returncode == 0, done.stderr[-3000:]
    return home, dags, env


def _states(db: Path, dag_id: str) -> tuple[str | None, dict[str, str | None]]:
    with sqlite3.connect(db) as c:
        row = c.execute("select run_id, state from dag_run where dag_id=? order by id desc limit 1", (dag_id,)).fetchone()
        if row is None:
            return None, {}
        tasks = dict(c.execute("select task_id, state from task_instance where dag_id=? and run_id=?", (dag_id, row[0])))
    return row[1], tasks


def test_dags_test_fails_fast_on_a_missing_or_too_small_pool(tmp_path: Path, migrated_airflow_home: Callable[[Path], Path]) -> None:
    home, dags, env = _home(tmp_path, migrated_airflow_home, reserialize=False)
    airflow = str(BIN / "airflow")

    # the issue's input: no pools made; the DAG's train candidates use heteroflow-npu and heteroflow-gpu
    missing = _run(env, airflow, "dags", "test", "hf-pools")
    state, tasks = _states(home / "airflow.db", "hf-pools")
    assert state == "failed" and tasks["prepare-run"] == "failed", missing.stdout[-3000:]
    assert tasks["prewarm"] in ("upstream_failed", "skipped")  # nothing ran
    out = " ".join((missing.stdout + missing.stderr).split())
    assert "its tasks use the Airflow pool(s) heteroflow-gpu, heteroflow-npu, which do not exist" in out
    assert "`heteroflow airflow pools --inventory FILE`" in out

    # sibling: a pool that exists but has fewer slots than a task takes (gpu:count=2 in a 1-GPU pool)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("gpu: 1\nnpu: 0\n")
    made = _run(env, str(BIN / "heteroflow"), "airflow", "pools", "--inventory", str(inventory))
    assert made.returncode == 0, made.stderr
    short = _run(env, airflow, "dags", "test", "hf-two-gpus")
    state, tasks = _states(home / "airflow.db", "hf-two-gpus")
    assert state == "failed" and tasks["prepare-run"] == "failed", short.stdout[-3000:]
    assert "a task takes 2 slots of pool heteroflow-gpu, which has 1, so it can never start" in " ".join(short.stdout.split())

    # what the message says to do: the pools exist, the check passes (0 slots: none here, the planner passes over)
    inventory.write_text("gpu: 2\nnpu: 0\n")
    assert _run(env, str(BIN / "heteroflow"), "airflow", "pools", "--inventory", str(inventory)).returncode == 0
    recorded = _run(env, airflow, "variables", "get", POOLS_VARIABLE)
    assert json.loads(recorded.stdout.strip().splitlines()[-1]) == {"heteroflow-gpu": 2, "heteroflow-npu": 0}
    passed = _run(env, airflow, "tasks", "test", "hf-two-gpus", "prepare-run")  # the first task alone
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-3000:]
    assert "which do not exist" not in passed.stdout and "can never start" not in passed.stdout

    # a new user's trial: a model an earlier inventory had kept its pool and slots after an inventory without it
    inventory.write_text("gpu: {t4: 2}\nnpu: 0\n")
    assert _run(env, str(BIN / "heteroflow"), "airflow", "pools", "--inventory", str(inventory)).returncode == 0
    inventory.write_text("gpu: 2\nnpu: 0\n")
    again = _run(env, str(BIN / "heteroflow"), "airflow", "pools", "--inventory", str(inventory), "--json")
    rows = {r["name"]: r for r in json.loads(again.stdout)}
    assert (rows["heteroflow-gpu-nvidia-t4"]["slots"], rows["heteroflow-gpu-nvidia-t4"]["previous"]) == (0, 2)
    assert "not in the last inventory" in rows["heteroflow-gpu-nvidia-t4"]["description"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_state(db: Path, dag_id: str, task: str, states: set[str], deadline_s: float) -> dict[str, str | None]:
    end = time.monotonic() + deadline_s  # a deadline to give up, not a timing the test depends on
    tasks: dict[str, str | None] = {}
    while time.monotonic() < end:
        _, tasks = _states(db, dag_id)
        if tasks.get(task) in states:
            return tasks
        time.sleep(1)
    pytest.fail(f"{dag_id}.{task} did not reach {states} within {deadline_s:.0f} s: {tasks}")


def _wait_for_url(url: str, deadline_s: float, procs: list[subprocess.Popen[bytes]]) -> None:
    """Return once ``url`` answers 200; fail if a server process ends first. The deadline is to give up, not a timing
    tested."""
    import urllib.error
    import urllib.request

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert all(p.poll() is None for p in procs), [p.args[1] for p in procs if p.poll() is not None]
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    pytest.fail(f"{url} did not answer within {deadline_s:.0f} s")


def _api(port: int, method: str, path: str, body: dict[str, object]) -> dict[str, object]:
    """One call of Airflow's REST API (``/api/v2``) on the test's api-server; its JSON answer."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://localhost:{port}/api/v2{path}", data=json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        pytest.fail(f"{method} {path}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:2000]}")


def _task_log(home: Path, dag_id: str, task: str, *texts: str, deadline_s: float = 60) -> str:
    """The task's first-attempt log once it holds every one of ``texts``: the task's state reaches the database
    before its log file is complete (a loaded machine read its first line only). The deadline is to give up, not
    a timing tested."""
    end = time.monotonic() + deadline_s
    log = ""
    while time.monotonic() < end:
        found = list((home / "logs").glob(f"dag_id={dag_id}/run_id=manual__*/task_id={task}/attempt=1.log"))
        log = found[0].read_text() if found else ""
        if all(t in log for t in texts):
            break
        time.sleep(1)
    return log


def test_a_scheduled_run_fails_at_once_instead_of_hanging(tmp_path: Path, migrated_airflow_home: Callable[[Path], Path]) -> None:
    home, dags, env = _home(tmp_path, migrated_airflow_home)
    port = _free_port()
    env = {
        **env,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{port}/execution/",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        # the scheduler's log server (default 8793): a free port, as another Airflow on the machine may hold 8793
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
        # the REST API without logging in (the simple auth manager's all-admins mode): unpause and trigger through the
        # running api-server instead of one `airflow dags ...` process each (an Airflow import, 5-30 s of a loaded CPU)
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
    }
    airflow = str(BIN / "airflow")
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = [
        subprocess.Popen([airflow, *args], env=env, stdout=open(logs / f"{args[0]}.log", "wb"), stderr=subprocess.STDOUT)
        for args in (["api-server", "--port", str(port)], ["scheduler"], ["dag-processor"])
    ]
    try:
        # a task reaches its supervisor through the api-server's execution API: trigger once it answers (on a loaded
        # machine the api-server took over 90 s to start and the first task failed with "Connection refused")
        _wait_for_url(f"http://localhost:{port}/execution/health", 300, procs)
        assert _api(port, "PATCH", "/dags/hf-pools", {"is_paused": False})["is_paused"] is False
        triggered = _api(port, "POST", "/dags/hf-pools/dagRuns", {"logical_date": None, "conf": {"epochs": 1}})
        assert triggered["state"] == "queued" and triggered["conf"] == {"epochs": 1}, triggered
        tasks = _wait_for_state(home / "airflow.db", "hf-pools", "prepare-run", {"failed", "success"}, 240)
        assert tasks["prepare-run"] == "failed", tasks  # not left scheduled: the run ends
        log = _task_log(home, "hf-pools", "prepare-run", "which do not exist", "heteroflow airflow pools --inventory FILE")
        assert "heteroflow-gpu, heteroflow-npu, which do not exist (read from the Airflow Variable heteroflow_pools" in log
        assert "`heteroflow airflow pools --inventory FILE`" in log

        made = _run(env, str(BIN / "heteroflow"), "airflow", "pools")
        assert made.returncode == 0, made.stderr
        again = _api(port, "POST", "/dags/hf-pools/dagRuns", {"logical_date": None, "conf": {"epochs": 1}})
        run_id = again["dag_run_id"]  # wait for the second run's prepare-run
        assert run_id != triggered["dag_run_id"], again
        end = time.monotonic() + 240
        state = None
        while time.monotonic() < end and state not in ("success", "failed"):
            with sqlite3.connect(home / "airflow.db") as c:
                row = c.execute("select state from task_instance where dag_id='hf-pools' and run_id=? and task_id='prepare-run'", (run_id,)).fetchone()
            state = row[0] if row else None
            time.sleep(1)
        assert state == "success", (state, (logs / "scheduler.log").read_text(errors="replace")[-2000:])
    finally:
        import psutil

        started = [psutil.Process(p.pid) for p in procs if p.poll() is None]
        tree = [*started, *(c for p in started for c in p.children(recursive=True))]
        for proc in tree:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(tree, timeout=30)
        for proc in alive:
            proc.kill()
