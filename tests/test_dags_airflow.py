"""A real Airflow 3 on SQLite (a temporary AIRFLOW_HOME): ``airflow db migrate``, ``airflow dags reserialize``,
then ``airflow dags test DAG_ID`` for each case, read back from Airflow's own database (task states, tries,
XComs, asset events) and from the run's ``run.json``:

(a) the default DAG end to end on the digits data, accuracy >= 0.90;
(b) simulated npu and gpu, a device fault in train on npu: the run succeeds on gpu, the npu task's reason is kept;
(c) preprocess fails permanently: no train candidate runs, the run fails;
(d) a permanent fault in train: no fallback, no retry spent, the run fails;
(e) a transient fault: retried on the same candidate with the step's backoff, the run succeeds;

and, over the repository's ``dags/`` as DAGS_FOLDER: no import errors, the example DAGs listed with their
schedules (cron; an Asset), the prewarm DAG's asset event queueing the training DAG; the pools command.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow", reason="the airflow extra is not installed")

from heteroflow.components.core.failures import FAULT_ENV, SIMULATE_ENV  # noqa: E402
from heteroflow.dags.layout import DECISION_KEY, FAILURE_KEY, safe_run_id  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

TWO_LINE_FILE = """\
# Airflow DAG file: heteroflow's default pipeline (the two lines a user drops into a DAGS_FOLDER)
from heteroflow.dags.example_default import dag
"""

VARIANTS = """\
# Airflow DAG file for the tests: the default pipeline with a short retry backoff on train
from heteroflow.components.core.retry import RetryPolicy
from heteroflow.dags.factory import build_dag
from heteroflow.pipelines.default import default_pipeline

_quick = default_pipeline(name="hf-quick-retry")
_quick.replace("train", retry=RetryPolicy(retries=2, backoff_seconds=1, factor=2, max_delay_seconds=5, window_seconds=600))
quick_retry = build_dag(_quick, "hf-quick-retry")
"""


def _airflow(home: Path, dags: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in (SIMULATE_ENV, FAULT_ENV)}
    full.update(
        {"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **(env or {})}
    )
    return subprocess.run([str(BIN / "airflow"), *args], env=full, capture_output=True, text=True, timeout=timeout)


def _setup_home(home: Path, dags: Path) -> None:
    """``home`` holds a migrated database (the session's ``airflow db migrate``, conftest.py ``migrated_airflow_home``)."""
    for args in (("dags", "reserialize"),):
        done = _airflow(home, dags, *args)
        assert done.returncode == 0, f"airflow {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    # the device pools the DAGs' tasks use (this machine's devices: 0 slots where there are none); without them
    # prepare-run fails the run at once (#16.14, tests/test_airflow_pools.py)
    env = {k: v for k, v in os.environ.items() if k not in (SIMULATE_ENV, FAULT_ENV)}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags)})
    pools = subprocess.run([str(BIN / "heteroflow"), "airflow", "pools"], env=env, capture_output=True, text=True, timeout=300)
    assert pools.returncode == 0, pools.stderr[-3000:]


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory, migrated_airflow_home: Callable[[Path], Path]) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("airflow")
    dags = root / "dags"
    dags.mkdir()
    (dags / "heteroflow_dags.py").write_text(TWO_LINE_FILE)
    (dags / "heteroflow_test_variants.py").write_text(VARIANTS)
    _setup_home(migrated_airflow_home(root / "home"), dags)
    return root / "home", dags


@dataclasses.dataclass
class Run:
    """One ``airflow dags test`` run, read back from Airflow's database and the run folder."""

    returncode: int
    output: str
    dag_id: str
    run_id: str
    state: str
    tasks: dict[str, tuple[str | None, int]]
    db: Path
    run_dir: Path

    def xcom(self, task: str, key: str = "return_value") -> Any:
        with sqlite3.connect(self.db) as c:
            row = c.execute(
                "select value from xcom where dag_id=? and run_id=? and task_id=? and key=?", (self.dag_id, self.run_id, task, key)
            ).fetchone()
        return None if row is None else json.loads(row[0])

    def ti(self, task: str, *columns: str) -> tuple[Any, ...]:
        with sqlite3.connect(self.db) as c:
            return c.execute(
                f"select {', '.join(columns)} from task_instance where dag_id=? and run_id=? and task_id=?", (self.dag_id, self.run_id, task)
            ).fetchone()

    @property
    def record(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "run.json").read_text())

    def attempts(self, call: str) -> list[dict[str, Any]]:
        folder = self.run_dir / "steps" / call
        files = sorted(folder.glob("attempt-*.json"), key=lambda p: int(p.stem.split("-")[1])) if folder.is_dir() else []
        return [json.loads(p.read_text()) for p in files]

    def explain(self) -> str:
        return f"dag run {self.state}; tasks {self.tasks}\n--- output tail ---\n{self.output[-4000:]}"


def dags_test(home: Path, dags: Path, dag_id: str, conf: dict[str, Any], *, simulate: str | None = None, fault: str | None = None) -> Run:
    env = {}
    if simulate:
        env[SIMULATE_ENV] = simulate
    if fault:
        env[FAULT_ENV] = fault
    done = _airflow(home, dags, "dags", "test", dag_id, "-c", json.dumps(conf), env=env)
    db = home / "airflow.db"
    with sqlite3.connect(db) as c:
        run_id, state = c.execute("select run_id, state from dag_run where dag_id=? order by id desc limit 1", (dag_id,)).fetchone()
        tasks = {t: (s, n) for t, s, n in c.execute("select task_id, state, try_number from task_instance where dag_id=? and run_id=?", (dag_id, run_id))}
    run_dir = Path(os.environ["HETEROFLOW_HOME"], "airflow-runs", dag_id, safe_run_id(run_id))
    return Run(done.returncode, done.stdout + done.stderr, dag_id, run_id, state, tasks, db, run_dir)


TRAIN = ("train.npu-0", "train.gpu-1", "train.cpu-2")


def test_a_default_dag_end_to_end_on_digits(airflow_home: tuple[Path, Path], digits_dir: Path) -> None:
    run = dags_test(*airflow_home, "heteroflow-default", {"dataset_uri": str(digits_dir), "epochs": 10})
    assert run.returncode == 0 and run.state == "success", run.explain()
    record = run.record
    assert record["status"] == "succeeded" and record["fallbacks"] == []
    assert record["metrics"]["evaluate"]["accuracy"] >= 0.90
    start = record["placement"]["train"]["index"]  # the candidate the plan chose on this machine
    for k, task in enumerate(TRAIN):
        expected = ("success", 1) if k == start else ("skipped", 0)  # passed over or not needed: never started
        assert run.tasks[task] == expected, (task, run.explain())
    assert run.tasks["train.done"][0] == "success" and run.tasks["archive"] == ("success", 1)
    # XCom holds paths and small facts only
    evaluate = run.xcom("evaluate")
    assert evaluate["outputs"]["metrics"] == str(run.run_dir / "artifacts" / "evaluate" / "metrics")
    assert evaluate["facts"]["accuracy"] == record["metrics"]["evaluate"]["accuracy"]
    assert all(not isinstance(v, (list, dict)) or k in ("indices", "inventory", "explanations") for k, v in run.xcom("plan")["facts"].items())
    assert run.xcom("prepare-run")["args"]["epochs"] == 10
    assert run.xcom("record-run")["status"] == "succeeded"
    assert "run succeeded in" in run.output  # record-run prints the summary `heteroflow run` prints (not under the engine)


def test_b_device_failure_on_npu_falls_back_to_gpu(airflow_home: tuple[Path, Path], digits_dir: Path) -> None:
    run = dags_test(*airflow_home, "heteroflow-default", {"dataset_uri": str(digits_dir), "epochs": 10}, simulate="npu,gpu", fault="train@npu=device")
    assert run.returncode == 0 and run.state == "success", run.explain()
    assert run.tasks["train.npu-0"] == ("failed", 1)  # no retry spent on the failed device
    assert run.tasks["train.fallback-to-1"] == ("success", 1)
    assert run.tasks["train.gpu-1"] == ("success", 1)
    assert run.tasks["train.fallback-to-2"][0] == run.tasks["train.cpu-2"][0] == "skipped"
    failure = run.xcom("train.npu-0", FAILURE_KEY)
    assert (failure["route"], failure["candidate"], failure["kind"]) == ("device", 0, "npu")
    assert "InjectedDeviceFault" in failure["reason"]
    decision = run.xcom("train.fallback-to-1", DECISION_KEY)
    assert (decision["decision"], decision["target"]) == ("fallback", 1) and "InjectedDeviceFault" in decision["why"]
    record = run.record
    assert record["status"] == "succeeded"
    assert record["placement"]["train"]["index"] == 0  # placed on the (simulated) npu first
    train = next(s for s in record["steps"] if s["name"] == "train")
    assert (train["kind"], train["candidate"], train["simulated"], train["attempts"]) == ("gpu", 1, True, 2)
    assert [(f["step"], f["candidate"], f["kind"], f["failure"]) for f in record["fallbacks"]] == [("train", 0, "npu", "device")]
    assert "InjectedDeviceFault" in record["fallbacks"][0]["reason"]
    assert record["metrics"]["evaluate"]["accuracy"] >= 0.90
    assert record["testing"] == {SIMULATE_ENV: "npu,gpu", FAULT_ENV: "train@npu=device"}
    assert run.xcom("record-run")["fallbacks"][0]["kind"] == "npu"


def test_a_typo_in_the_runs_conf_fails_before_any_step(airflow_home: tuple[Path, Path], digits_dir: Path) -> None:
    """Trial input: `airflow dags test heteroflow-default -c '{"epoch": 10}'` trained with epochs=30."""
    run = dags_test(*airflow_home, "heteroflow-default", {"dataset_uri": str(digits_dir), "epoch": 10})
    assert run.state == "failed", run.explain()
    assert run.tasks["prepare-run"][0] == "failed"
    assert run.tasks["prewarm"][0] in ("upstream_failed", "skipped") and run.attempts("prewarm") == []
    assert "unknown parameter(s) epoch in the run's conf (did you mean 'epochs'?); valid:" in run.output
    assert "unknown parameter(s) epoch" in (run.record.get("error") or "")


def test_c_permanent_failure_in_preprocess_runs_no_train(airflow_home: tuple[Path, Path], digits_dir: Path) -> None:
    run = dags_test(*airflow_home, "heteroflow-default", {"dataset_uri": str(digits_dir), "epochs": 2}, simulate="npu,gpu", fault="preprocess@cpu=permanent")
    assert run.state == "failed", run.explain()
    assert run.tasks["preprocess"] == ("failed", 1)  # permanent: its retry is not spent
    for task in TRAIN:
        state, tries = run.tasks[task]
        assert state in ("skipped", "upstream_failed") and tries == 0, (task, run.explain())
    assert run.attempts("train") == []
    assert run.tasks["evaluate"][0] == run.tasks["archive"][0] == "upstream_failed"
    record = run.record
    assert record["status"] == "failed" and record["fallbacks"] == []
    assert next(s for s in record["steps"] if s["name"] == "preprocess")["failure"] == "permanent"


def test_d_permanent_failure_in_train_neither_falls_back_nor_retries(airflow_home: tuple[Path, Path], digits_dir: Path) -> None:
    run = dags_test(*airflow_home, "heteroflow-default", {"dataset_uri": str(digits_dir), "epochs": 2}, simulate="npu,gpu", fault="train@npu=permanent")
    assert run.state == "failed", run.explain()
    assert run.tasks["train.npu-0"] == ("failed", 1)  # train has 2 retries; none spent
    assert run.ti("train.npu-0", "max_tries") == (2,)
    assert run.tasks["train.gpu-1"] == ("skipped", 0) and run.tasks["train.cpu-2"] == ("skipped", 0)
    decision = run.xcom("train.fallback-to-1", DECISION_KEY)
    assert decision["decision"] == "stop" and "failed permanently" in decision["why"]
    assert [(a["candidate"], a["status"], a["failure"]) for a in run.attempts("train")] == [(0, "failed", "permanent")]
    assert run.tasks["train.done"][0] == run.tasks["evaluate"][0] == "upstream_failed"
    record = run.record
    assert record["status"] == "failed" and record["fallbacks"] == []
    assert "AirflowFailException" in run.output and "not retried, no fallback" in run.output


def test_e_transient_failure_is_retried_with_backoff_on_the_same_candidate(airflow_home: tuple[Path, Path], digits_dir: Path) -> None:
    run = dags_test(*airflow_home, "hf-quick-retry", {"dataset_uri": str(digits_dir), "epochs": 2}, simulate="npu,gpu", fault="train@npu=transient:2")
    assert run.returncode == 0 and run.state == "success", run.explain()
    assert run.tasks["train.npu-0"] == ("success", 3)  # two retries on the npu
    assert run.tasks["train.gpu-1"] == ("skipped", 0)
    attempts = run.attempts("train")
    assert [(a["candidate"], a["kind"], a["status"], a["failure"]) for a in attempts] == [
        (0, "npu", "failed", "transient"),
        (0, "npu", "failed", "transient"),
        (0, "npu", "succeeded", None),
    ]
    # the step's backoff: 1 s, then 1 s x 2 (exact: the retry policy overrides Airflow's jittered backoff)
    waits = [attempts[i + 1]["started_at"] - attempts[i]["ended_at"] for i in range(2)]
    assert waits[0] >= 1.0 and waits[1] >= 2.0, waits
    with sqlite3.connect(run.db) as c:
        overrides = [row for row in c.execute(
            "select try_number, retry_delay_override, retry_reason from task_instance_history where dag_id=? and run_id=? and task_id=? order by try_number",
            (run.dag_id, run.run_id, "train.npu-0"),
        )]
    assert [(n, d) for n, d, _ in overrides] == [(1, 1.0), (2, 2.0)], overrides
    assert "transient failure: retry 2 of 2 in 2 s" in overrides[1][2]
    record = run.record
    assert record["status"] == "succeeded" and record["fallbacks"] == []


# --- the repository's dags/ as DAGS_FOLDER ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo_home(tmp_path_factory: pytest.TempPathFactory, migrated_airflow_home: Callable[[Path], Path]) -> tuple[Path, Path]:
    home = migrated_airflow_home(tmp_path_factory.mktemp("airflow-repo") / "home")
    _setup_home(home, ROOT / "dags")
    return home, ROOT / "dags"


def test_example_dags_import_without_errors_and_are_listed(repo_home: tuple[Path, Path]) -> None:
    errors = _airflow(*repo_home, "dags", "list-import-errors", "-o", "json")
    assert errors.returncode == 0, errors.stderr[-2000:]
    assert json.loads(errors.stdout.strip().splitlines()[-1] or "[]") == [], errors.stdout
    listed = _airflow(*repo_home, "dags", "list", "-o", "json")
    dag_ids = {d["dag_id"] for d in json.loads(listed.stdout.strip().splitlines()[-1])}
    assert dag_ids == {"heteroflow-default", "heteroflow-prewarm", "heteroflow-train-on-prewarm"}
    with sqlite3.connect(repo_home[0] / "airflow.db") as c:
        schedules = dict(c.execute("select dag_id, timetable_summary from dag"))
    assert schedules["heteroflow-default"] == "0 3 * * *"
    assert schedules["heteroflow-prewarm"] == "0 * * * *"  # @hourly
    assert "heteroflow-prewarmed-dataset" in schedules["heteroflow-train-on-prewarm"] or schedules["heteroflow-train-on-prewarm"] == "Asset"


def test_prewarm_updates_the_asset_that_schedules_training(repo_home: tuple[Path, Path], digits_dir: Path) -> None:
    unpaused = _airflow(*repo_home, "dags", "unpause", "heteroflow-train-on-prewarm")  # paused DAGs are not queued
    assert unpaused.returncode == 0, unpaused.stderr[-2000:]
    run = dags_test(*repo_home, "heteroflow-prewarm", {"dataset_uri": str(digits_dir)})
    assert run.returncode == 0 and run.state == "success", run.explain()
    assert set(run.tasks) == {"prepare-run", "prewarm", "record-run"}
    with sqlite3.connect(run.db) as c:
        events = c.execute(
            "select e.extra from asset_event e join asset a on a.id = e.asset_id where a.name = ? and e.source_run_id = ?",
            ("heteroflow-prewarmed-dataset", run.run_id),
        ).fetchall()
        queued = c.execute(
            "select q.target_dag_id from asset_dag_run_queue q join asset a on a.id = q.asset_id where a.name = ?",
            ("heteroflow-prewarmed-dataset",),
        ).fetchall()
    assert len(events) == 1
    extra = json.loads(events[0][0])
    assert extra["outputs"]["dataset"] == str(run.run_dir / "artifacts" / "prewarm" / "dataset")
    assert extra["run_dir"] == str(run.run_dir)
    assert queued == [("heteroflow-train-on-prewarm",)]  # the scheduler starts training from this queue


def test_pools_command_creates_and_updates_pools(airflow_home: tuple[Path, Path], tmp_path: Path) -> None:
    home, dags = airflow_home
    inventory = tmp_path / "inventory.yaml"
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
    cli = [str(BIN / "heteroflow"), "airflow", "pools", "--inventory", str(inventory), "--json"]
    inventory.write_text("gpu: {a100-80gb: 2, t4: 4}\nnpu: {910b3: 8}\n")
    first = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    inventory.write_text("gpu: {a100-80gb: 4, t4: 4}\nnpu: {910b3: 8}\n")
    second = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300)
    rows = {r["name"]: (r["slots"], r["previous"]) for r in json.loads(second.stdout)}
    assert rows == {
        "heteroflow-gpu": (8, 6),
        "heteroflow-gpu-nvidia-a100-80gb": (4, 2),
        "heteroflow-gpu-nvidia-t4": (4, 4),
        "heteroflow-npu": (8, 8),
        "heteroflow-npu-ascend-910b3": (8, 8),
    }
    listed = _airflow(home, dags, "pools", "list", "-o", "json")
    pools = {p["pool"]: int(p["slots"]) for p in json.loads(listed.stdout.strip().splitlines()[-1])}
    assert pools["heteroflow-gpu"] == 8 and pools["heteroflow-npu-ascend-910b3"] == 8
    bad = subprocess.run([*cli[:3], "--inventory", str(tmp_path / "missing.yaml")], env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "missing.yaml: cannot be read (No such file or directory)" in bad.stderr
    # the table at 80 columns: each pool's name whole on one line, to be copied into a DAG (it was cut mid-name)
    table = subprocess.run(cli[:-1] + ["--dry-run"], env={**env, "COLUMNS": "80"}, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    assert all(f"│ {name} " in table.stdout for name in rows), table.stdout
