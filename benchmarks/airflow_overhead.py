"""Orchestration overhead of heteroflow's local-mode Airflow DAG per task, as a ratio to a raw Airflow DAG's, in one run.

Both DAGs run with ``airflow dags test DAG_ID`` (Airflow 3, SQLite, a temporary AIRFLOW_HOME migrated and
reserialized once), as a user would try them, alternately, ``--repeats`` times each:

- **heteroflow**: ``build_dag(default_pipeline())`` in local mode (prepare-run, prewarm, preprocess, plan, the train
  candidates with their fallback gates and join, evaluate, archive, record-run); the plan's choice skips the
  candidates it passed over, which never start.
- **raw Airflow** (the baseline): a chain of trivial PythonOperator tasks, each pulling the previous task's XCom and
  pushing its own, as many as heteroflow's run *started* (every task instance that ran, skipped ones excluded).

For each:

- ``wall``: seconds from starting ``airflow dags test`` to its exit (interpreter start, DAG parsing, Airflow's
  in-process API server, every task);
- ``work``: for heteroflow, the time inside the step functions (each attempt record's ``call_seconds``: the wall
  time of the function call, its own imports of torch and friends included); 0 for the raw tasks;
- **overhead per task** = (wall - work) / tasks started.

The printed ratio is heteroflow's overhead per task over raw Airflow's (target <= 1.3x). Both are dominated by the
fixed cost of one ``airflow dags test`` (interpreter, parsing, API server: most of the wall time). So the script
also runs a raw chain three times as long and separates that fixed cost from the marginal cost of one task
(a straight line through the two raw chains); the second ratio compares the marginal costs per task (heteroflow's
= its wall minus work minus the fixed cost, per started task).

Usage: ``python benchmarks/airflow_overhead.py [--repeats 3] [--epochs 2]``. Uses a temporary HETEROFLOW_HOME and
AIRFLOW_HOME; the digits sample is exported once beforehand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HETEROFLOW_DAG = """\
# airflow DAG file: heteroflow's default pipeline in local mode
from heteroflow.dags.factory import build_dag
from heteroflow.pipelines.default import default_pipeline

dag = build_dag(default_pipeline(), "hf-bench", pools=False)
"""

RAW_DAG = """\
# airflow DAG file: a chain of {n} trivial tasks (the baseline)
import datetime
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG


def step(ti, previous):
    value = ti.xcom_pull(task_ids=previous) if previous else 0
    return (value or 0) + 1


with DAG("{dag_id}", schedule=None, start_date=datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc), catchup=False):
    task = None
    for i in range({n}):
        nxt = PythonOperator(task_id=f"t{{i}}", python_callable=step, op_kwargs={{"previous": task.task_id if task else None}})
        if task is not None:
            task >> nxt
        task = nxt
"""


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.dags = root / "dags"
        self.dags.mkdir()
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")},
            "AIRFLOW_HOME": str(root / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "HETEROFLOW_HOME": str(root / "hf-home"),
        }
        self.bin = Path(sys.executable).parent

    def airflow(self, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
        t0 = time.perf_counter()
        done = subprocess.run([str(self.bin / "airflow"), *args], env=self.env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(f"airflow {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return wall, done

    def last_run(self, dag_id: str) -> tuple[str, str, list[tuple[str, str, int]]]:
        with sqlite3.connect(self.root / "airflow" / "airflow.db") as c:
            run_id, state = c.execute("select run_id, state from dag_run where dag_id=? order by id desc limit 1", (dag_id,)).fetchone()
            tis = c.execute("select task_id, state, try_number from task_instance where dag_id=? and run_id=?", (dag_id, run_id)).fetchall()
        return run_id, state, tis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    opts = parser.parse_args()

    from heteroflow.dags.layout import safe_run_id

    root = Path(tempfile.mkdtemp(prefix="hf-airflow-bench-"))
    try:
        bench = Bench(root)
        dataset = subprocess.run(
            [sys.executable, "-c", "from heteroflow.components.data.datasets import export_digits; print(export_digits())"],
            env=bench.env, capture_output=True, text=True, check=True,
        ).stdout.strip()
        (bench.dags / "hf_bench.py").write_text(HETEROFLOW_DAG)
        bench.airflow("db", "migrate")
        bench.airflow("dags", "reserialize")
        conf = json.dumps({"dataset_uri": dataset, "epochs": opts.epochs})

        hf: list[dict[str, float]] = []
        raw: list[float] = []
        raw_long: list[float] = []
        started = total = 0
        for i in range(opts.repeats):
            wall, _ = bench.airflow("dags", "test", "hf-bench", "-c", conf)
            run_id, state, tis = bench.last_run("hf-bench")
            if state != "success":
                sys.exit(f"the heteroflow DAG run ended {state}: {tis}")
            record = json.loads((root / "hf-home" / "airflow-runs" / "hf-bench" / safe_run_id(run_id) / "run.json").read_text())
            work, compute = work_seconds(Path(record["run_dir"]))
            started = sum(1 for _, _, tries in tis if tries > 0)
            total = len(tis)
            hf.append({"wall": wall, "work": work, "compute": compute})
            if i == 0:  # the baselines, now that the number of tasks is known
                (bench.dags / "raw_bench.py").write_text(RAW_DAG.format(n=started, dag_id="raw-bench"))
                (bench.dags / "raw_bench_long.py").write_text(RAW_DAG.format(n=3 * started, dag_id="raw-bench-long"))
                bench.airflow("dags", "reserialize")
            for dag_id, into in (("raw-bench", raw), ("raw-bench-long", raw_long)):
                wall, _ = bench.airflow("dags", "test", dag_id)
                _, state, _ = bench.last_run(dag_id)
                if state != "success":
                    sys.exit(f"the raw DAG {dag_id} ended {state}")
                into.append(wall)
            print(
                f"repeat {i + 1}: heteroflow {hf[-1]['wall']:.1f} s (work {hf[-1]['work']:.1f} s), "
                f"raw {raw[-1]:.1f} s ({started} tasks), raw {raw_long[-1]:.1f} s ({3 * started} tasks)",
                flush=True,
            )

        hf_wall = statistics.median(h["wall"] for h in hf)
        hf_work = statistics.median(h["work"] for h in hf)
        hf_compute = statistics.median(h["compute"] for h in hf)
        raw_wall, raw_long_wall = statistics.median(raw), statistics.median(raw_long)
        hf_per_task = (hf_wall - hf_work) / started
        raw_per_task = raw_wall / started
        print()
        print(f"heteroflow local-mode DAG: {total} tasks, {started} started; median of {opts.repeats} runs (epochs={opts.epochs})")
        print(f"  wall {hf_wall:.2f} s, work in step functions {hf_work:.2f} s (their compute without imports: {hf_compute:.2f} s)")
        print(f"  overhead per started task: {hf_per_task:.3f} s")
        print(f"raw Airflow DAG of {started} trivial tasks: wall {raw_wall:.2f} s, per task {raw_per_task:.3f} s")
        print(f"ratio (heteroflow / raw, per started task): {hf_per_task / raw_per_task:.2f}x   (target <= 1.3x)")
        marginal = (raw_long_wall - raw_wall) / (2 * started)
        fixed = raw_wall - marginal * started
        hf_marginal = (hf_wall - hf_work - fixed) / started
        print(
            f"fixed cost of one `airflow dags test` {fixed:.2f} s; marginal cost per task: raw {marginal:.3f} s "
            f"(from chains of {started} and {3 * started}), heteroflow {hf_marginal:.3f} s = {hf_marginal / marginal:.2f}x"
            if marginal > 0 else f"marginal cost per raw task not measurable in this run ({raw_wall:.2f} s vs {raw_long_wall:.2f} s)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def work_seconds(run_dir: Path) -> tuple[float, float]:
    """The run's time inside the step functions and the steps' own compute time, summed over every attempt record
    (read as the project reads them: a loop's are under ``steps/<step>/iteration-<i>/``)."""
    from heteroflow.components.core.telemetry import read_step_records

    records = [r for rs in read_step_records(run_dir).values() for r in rs]
    return sum(r.call_seconds or 0.0 for r in records), sum(r.compute_seconds or 0.0 for r in records)


if __name__ == "__main__":
    main()
