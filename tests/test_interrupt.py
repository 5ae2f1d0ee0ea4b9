"""An interrupted ``heteroflow run`` stops its step subprocesses, records the run as interrupted, and the same
command then resumes training from the checkpoint (the CLI turns SIGTERM into the same path as Ctrl-C)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

HETEROFLOW_CLI = Path(sys.executable).with_name("heteroflow")
ARGS = ["run", "--param", "epochs=40", "--param", "checkpoint_every_steps=20"]  # one checkpoint is enough


def _wait_for(predicate, deadline_seconds: float, what: str):  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_seconds
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"gave up waiting ({deadline_seconds:.0f} s) for {what}")


@pytest.mark.slow
def test_sigterm_stops_the_steps_and_the_rerun_resumes(
    digits_dir: Path, heteroflow_home: Path, tmp_path: Path, pause_train_at_checkpoint
) -> None:
    env = {**os.environ, "HETEROFLOW_HOME": str(heteroflow_home), "COLUMNS": "120"}
    first = tmp_path / "first"
    # train pauses after its step-20 checkpoint (the point waited for below), so the SIGTERM always lands while
    # training is unfinished: no race with a fast machine finishing train first (issue #16.2's kind)
    proc = subprocess.Popen(
        [str(HETEROFLOW_CLI), *ARGS, "--dataset", str(digits_dir), "--output", str(first)],
        env={**env, **pause_train_at_checkpoint(20)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )

    def checkpoint_step() -> int:
        for info in (heteroflow_home / "checkpoints").glob("*/checkpoint.json"):
            try:
                return json.loads(info.read_text())["step"]
            except (ValueError, OSError):
                return 0
        return 0

    _wait_for(lambda: checkpoint_step() >= 20, 180, "the first train checkpoint")
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "train runs in a step subprocess"
    proc.send_signal(signal.SIGTERM)  # to the CLI process only, not its process group
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == 143, out + err  # 128 + SIGTERM, as a shell reports it (Ctrl-C: 130)
    assert "interrupted: rerun the same command to resume" in err
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], f"step subprocesses outlived the CLI: {[p.pid for p in alive]}"
    record = json.loads((first / "run.json").read_text())
    assert record["status"] == "interrupted"
    joined = out.replace("\n", "")  # a long path may fold at the terminal's width
    assert f"report: {first}/report.html" in joined and (first / "report.html").is_file()  # the run so far, as a page
    assert f"record: {first}/run.json" in joined
    train = next(s for s in record["steps"] if s["name"] == "train")
    assert train["status"] in ("interrupted", "failed")  # stopped with the run, as the report says (not "killed")
    assert train["seconds"] > 0  # its attempt closed when the run ended (it said "running", seconds null)
    attempt = json.loads((first / "steps" / "train" / "attempt-1.json").read_text())
    assert attempt["status"] in ("interrupted", "failed") and attempt["ended_at"] >= attempt["started_at"]
    assert "archive" not in record["results"]
    assert not (heteroflow_home / "archive").exists()
    saved = checkpoint_step()
    assert saved >= 20

    second = tmp_path / "second"
    rerun = subprocess.run(
        [str(HETEROFLOW_CLI), *ARGS, "--dataset", str(digits_dir), "--output", str(second)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    record = json.loads((second / "run.json").read_text())
    assert record["status"] == "succeeded"
    assert record["metrics"]["train"]["resumed_from_step"] == saved == 20
    assert record["results"]["archive"]["version"] == 1


def test_the_interrupted_line_says_what_the_rerun_continues_from() -> None:
    """Trial finding: the line always said "train continues from its last checkpoint", also when train was stopped
    before its first checkpoint (the rerun started it again) or had not started. It now says train continues from
    its last checkpoint only if it wrote one, else from its start; nothing about train when it never ran."""
    from types import SimpleNamespace

    from heteroflow.pipelines.cli.main import interrupted_hint

    def record(**status: str) -> Any:
        steps = [SimpleNamespace(name=n, status=s) for n, s in status.items()]
        return SimpleNamespace(steps=steps, params={"checkpoint_every_steps": 50})

    in_train = interrupted_hint(record(prewarm="succeeded", preprocess="succeeded", train="interrupted", evaluate="not run"))
    assert in_train == ("interrupted: rerun the same command to resume (train continues from its last checkpoint if it "
                        "wrote one; stopped before its first, it starts again)")
    early = interrupted_hint(record(prewarm="interrupted", preprocess="not run", train="not run"))
    assert early == "interrupted: rerun the same command to resume (prewarm skips what is cached)"
    assert interrupted_hint(None) == "interrupted: rerun the same command to resume (prewarm skips what is cached)"


def test_the_table_after_a_stop_keeps_where_the_stopped_step_was() -> None:
    """Trial finding: after Ctrl-C the final steps table cleared the progress column, so the last live state
    (`epoch 1/30, loss 2.034`) disappeared. A step stopped mid-way (interrupted, or killed) keeps its last progress;
    a finished one shows none."""
    import io

    from rich.console import Console

    from heteroflow.pipelines.cli.summary import _steps_table
    from heteroflow.pipelines.runs.records import StepSummary

    progress = {"progress": {"epoch": 1, "epochs": 30, "loss": 2.034}}
    steps = [StepSummary(name="preprocess", status="succeeded", details={"progress": {"files": 3, "files_total": 3}}),
             StepSummary(name="train", status="interrupted", details=progress)]
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(_steps_table(steps))
    lines = out.getvalue().splitlines()
    assert "epoch 1/30, loss 2.034" in next(l for l in lines if "train" in l), lines
    assert "files" not in next(l for l in lines if "preprocess" in l), lines


@pytest.mark.slow
def test_sigterm_of_an_airflow_engine_run_records_it_interrupted_and_ends_airflow(
    digits_dir: Path, heteroflow_home: Path, tmp_path: Path, pause_train_at_checkpoint, migrated_airflow_home
) -> None:
    """`heteroflow run --engine airflow` stopped while train runs (a new user's trial: exit 143, but no run.json, no
    report, and `heteroflow runs` did not list it): the run is recorded ``interrupted`` with the steps so far, as the
    other engines record a stop, Airflow's process ends with the CLI, and `runs show` reads the record."""
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    airflow_home = migrated_airflow_home(tmp_path / "airflow")  # the session's `airflow db migrate` (conftest.py)
    env = {**os.environ, "HETEROFLOW_HOME": str(heteroflow_home), "AIRFLOW_HOME": str(airflow_home), "COLUMNS": "120"}
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [str(HETEROFLOW_CLI), *ARGS, "--engine", "airflow", "--dataset", str(digits_dir), "--output", str(run_dir)],
        env={**env, **pause_train_at_checkpoint(20)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    _wait_for(lambda: any(json.loads(p.read_text()).get("step", 0) >= 20 for p in (heteroflow_home / "checkpoints").glob("*/checkpoint.json")),
              300, "train's checkpoint at step 20 inside Airflow's process")
    children = psutil.Process(proc.pid).children(recursive=True)
    assert any("_airflow_commands" in " ".join(c.cmdline()) for c in children), [c.cmdline()[:3] for c in children]
    proc.send_signal(signal.SIGTERM)  # to the CLI process only
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == 143, out + err
    assert "interrupted: rerun the same command to resume (train continues from its last checkpoint" in " ".join(err.split())
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], f"Airflow's processes outlived the CLI: {[p.pid for p in alive]}"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "interrupted", record
    steps = {s["name"]: s["status"] for s in record["steps"]}
    assert steps["preprocess"] == "succeeded" and steps["train"] == "interrupted" and steps["evaluate"] == steps["archive"] == "not run", steps
    assert (run_dir / "report.html").is_file() and f"record: {run_dir}/run.json" in out.replace("\n", "")
    shown = subprocess.run([str(HETEROFLOW_CLI), "runs", "show", str(run_dir)], env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and ": interrupted, pipeline heteroflow-default" in shown.stdout, shown.stdout + shown.stderr
    # Airflow's own record of the run is ended too, as "Mark failed" in its UI ends one: the run failed, the task
    # that was running failed, those not run skipped (the run and its train task stayed `running` for good)
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        runs = db.execute("SELECT run_id, state FROM dag_run WHERE dag_id = 'heteroflow-engine-heteroflow-default'").fetchall()
        tasks = dict(db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'heteroflow-engine-heteroflow-default'").fetchall())
    assert [state for _, state in runs] == ["failed"], (runs, (run_dir / "airflow.log").read_text()[-1500:])
    assert f"$ airflow: marked Airflow's run {runs[0][0]} failed (stopped)" in (run_dir / "airflow.log").read_text()
    assert tasks["preprocess"] == "success" and tasks["train.cpu-2"] == "failed", tasks  # the candidate that ran
    assert tasks["evaluate"] == tasks["archive"] == tasks["record-run"] == "skipped", tasks  # record-run: by the CLI


@pytest.mark.slow
def test_an_airflow_engine_run_past_timeout_seconds_is_recorded_failed_and_ended_in_airflow(
    digits_dir: Path, heteroflow_home: Path, tmp_path: Path, pause_train_at_checkpoint, migrated_airflow_home,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sibling of a stop: Airflow's process killed at ``timeout_seconds`` (a hung run). The run's record says
    why (``failed``), and Airflow's run is ended with a note, not left ``running`` (it was both: no run.json, and
    a run shown as running in Airflow's UI for good)."""
    pytest.importorskip("airflow", reason="the airflow extra is not installed")
    import heteroflow
    from heteroflow.dags.engine import AirflowRunError

    airflow_home = migrated_airflow_home(tmp_path / "airflow")
    for name, value in pause_train_at_checkpoint(20).items():  # train sleeps 120 s after step 20: past the limit
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "run"
    with pytest.raises(AirflowRunError, match=r"^`airflow dags test` ran past timeout_seconds=30; log: "):
        heteroflow.run(None, {"dataset_uri": str(digits_dir), "epochs": 40, "checkpoint_every_steps": 20}, engine="airflow",
                       run_dir=run_dir, airflow_home=str(airflow_home), timeout_seconds=30)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and "ran past timeout_seconds=30" in record["error"], record
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        runs = db.execute("SELECT run_id, state FROM dag_run WHERE dag_id = 'heteroflow-engine-heteroflow-default'").fetchall()
        notes = [n for (n,) in db.execute("SELECT content FROM dag_run_note")]
        open_tasks = db.execute("SELECT task_id FROM task_instance WHERE state IS NULL OR state IN ('running', 'queued', 'scheduled')").fetchall()
    assert [state for _, state in runs] == ["failed"], (runs, (run_dir / "airflow.log").read_text()[-1500:])
    assert len(notes) == 1 and notes[0].startswith("stopped by heteroflow: `airflow dags test` ran past timeout_seconds=30"), notes
    assert open_tasks == [], open_tasks


@pytest.mark.slow
def test_a_run_stopped_after_train_finished_reruns_without_training_again(
    digits_dir: Path, heteroflow_home: Path, tmp_path: Path
) -> None:
    """A new user's trial: Ctrl-C during evaluate, after train had finished, then the same command: train ran all
    its steps again from step 0 (its checkpoint folder went as training completed), so a stop past train lost the
    whole training. The finished model is now kept in the checkpoint folder until a run that uses it succeeds: the
    rerun takes it (the same steps, not trained again) and its success removes the folder."""
    env = {**os.environ, "HETEROFLOW_HOME": str(heteroflow_home), "COLUMNS": "200"}
    args = ["run", "--param", "epochs=2", "--dataset", str(digits_dir)]
    first = tmp_path / "first"
    # evaluate's first attempt fails (transient): the run waits for its retry, the point the stop lands in
    proc = subprocess.Popen([str(HETEROFLOW_CLI), *args, "--inject-fault", "evaluate@cpu=transient:1", "--output", str(first)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: (first / "steps" / "evaluate" / "attempt-1.json").is_file(), 300, "evaluate's failed first attempt")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, out + err
    record = json.loads((first / "run.json").read_text())
    steps = {s["name"]: s["status"] for s in record["steps"]}
    assert steps["train"] == "succeeded" and steps["evaluate"] in ("interrupted", "failed") and record["status"] == "interrupted", steps
    assert "train takes the model it finished, kept until a run succeeds: it does not train again" in " ".join(err.split())
    trained = record["results"]["train"]
    kept = Path(trained["kept_checkpoint"])
    assert (kept / "finished.json").is_file() and (kept / "finished" / "model.pt").is_file()
    assert not (kept / "checkpoint.pt").exists()  # the checkpoints gave way to the finished model

    second = tmp_path / "second"
    rerun = subprocess.run([str(HETEROFLOW_CLI), *args, "--output", str(second)], env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    again = json.loads((second / "run.json").read_text())["results"]["train"]
    assert again["reused_model"] == str(kept / "finished") and again["steps"] == again["resumed_from_step"] == trained["steps"]
    assert again["history"] == trained["history"] and again["final_loss"] == trained["final_loss"]
    assert "not trained again" in " ".join(rerun.stdout.split()) and "an earlier run" in " ".join(rerun.stdout.split())
    assert not kept.exists()  # the run that used it succeeded: the folder is gone

    third = tmp_path / "third"  # and the next run trains afresh, as before
    fresh = subprocess.run([str(HETEROFLOW_CLI), *args, "--output", str(third)], env=env, capture_output=True, text=True, timeout=600)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert json.loads((third / "run.json").read_text())["results"]["train"]["resumed_from_step"] == 0
    assert list((heteroflow_home / "checkpoints").glob("*/finished.json")) == []
