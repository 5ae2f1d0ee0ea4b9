"""Orchestration overhead of ``heteroflow run`` per task, as a ratio to raw kfp.local's, measured in one run.

Two commands run as a user would start them, alternately, ``--repeats`` times each:

- **heteroflow**: ``heteroflow run --param epochs=E --dataset D --output O`` (the default pipeline on kfp.local:
  prewarm, preprocess, plan, train, evaluate, archive; one subprocess per task).
- **raw kfp.local** (the baseline): a plain ``python`` script that builds a KFP pipeline of the same number of
  tasks, each a trivial lightweight component that reads the previous task's artifact and writes its own, and
  runs it with the same runner (``SubprocessRunner(use_venv=False)``).

For each:

- ``wall``: seconds from starting the command to its exit (interpreter start, imports, rendering, every task);
- ``work``: for heteroflow, the time spent inside the step functions (each attempt record's ``call_seconds``,
  the wall time of the function call, its own imports included: torch, and numpy where the step's process did not
  preload it, as a prestarted one does); 0 for the raw tasks;
- **overhead per task** = (wall - work) / tasks, split into the driver's share (wall minus the run's own
  ``wall_seconds``: interpreter start, imports, rendering, printing) and the share inside the run (per task: process
  start, the executor, heteroflow's imports and records, and the bookkeeping tasks of the KFP rendering: a fallback
  chain's skip tasks for candidates the plan passed over, and the final check task, which kfp.local runs in the
  driver process, and the report drawn at the end: its plots of train and evaluate are drawn while later steps run).

The printed ratio is heteroflow's overhead per task over raw kfp.local's (target <= 1.1x, issue #32). It also prints the
steps' ``compute_seconds`` (their work without imports), for reference.

How fair the baseline is: both use ``SubprocessRunner(use_venv=False)`` with warm caches and the same number of step
tasks (6), each raw task reading the one before; two things favour heteroflow a little. The raw script's driver
imports ``kfp`` as a plain script does, with its eager ``kfp.client`` (the Kubernetes client, ~0.3 s), which
heteroflow's driver leaves out (:mod:`heteroflow.pipelines.kfp.patches`); and heteroflow's work is the sum of its steps'
``call_seconds``, though plan runs beside prewarm (its call time overlaps prewarm's instead of adding to the wall).

Each repeat also runs heteroflow with ``HETEROFLOW_PRESTART=0`` (every step process started when its task starts,
as kfp.local starts it; see :mod:`heteroflow.pipelines.kfp.prestart`), and prints that run's overhead ratio and the
wall-time ratio of the two heteroflow runs. Prestarted processes do a task's imports earlier, on a core the run
leaves idle; where they still take CPU from a step, that step's work grows instead of the overhead, so the wall
ratio is the figure that says what a user gains.

Both commands run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` removed, ``PYTHONPYCACHEPREFIX`` in the
temporary folder), as on a user's machine: a shell that sets ``PYTHONDONTWRITEBYTECODE=1`` would otherwise make
every process compile heteroflow's modules from source (30-50 ms a step process), and the warm-up run could not
warm anything.

Usage: ``python benchmarks/overhead.py [--repeats 3] [--epochs 30]``. Uses a temporary HETEROFLOW_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAW_PIPELINE = r'''
import sys, tempfile
from kfp import dsl, local
from kfp.dsl import Dataset, Input, Output


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def first(out: Output[Dataset]) -> str:
    with open(out.path, "w") as fh:
        fh.write("0")
    return "succeeded"


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def step(data: Input[Dataset], out: Output[Dataset]) -> str:
    with open(data.path) as fh:
        value = int(fh.read())
    with open(out.path, "w") as fh:
        fh.write(str(value + 1))
    return "succeeded"


@dsl.pipeline(name="raw-chain")
def chain():
    task = first()
    for _ in range(int(sys.argv[1]) - 1):
        task = step(data=task.outputs["out"])


local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=sys.argv[2], raise_on_error=True)
chain()
'''


ENV: dict[str, str] = {}
"""The environment both commands run in (set in main: bytecode caching on, in the temporary folder)."""


def run_heteroflow(home: Path, out: Path, epochs: int, dataset: Path, prestart: str | None = None) -> tuple[float, dict]:
    exe = Path(sys.executable).with_name("heteroflow")
    env = {**ENV, "HETEROFLOW_HOME": str(home)}
    if prestart is not None:
        env["HETEROFLOW_PRESTART"] = prestart
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(exe), "run", "--param", f"epochs={epochs}", "--dataset", str(dataset), "--output", str(out)],
        env=env, capture_output=True, text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"heteroflow run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return wall, json.loads((out / "run.json").read_text())


def run_raw(script: Path, tasks: int, root: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(script), str(tasks), str(root)], capture_output=True, text=True, env=ENV)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"raw kfp.local pipeline failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall


def attempts(run_dir: Path) -> list[dict]:
    """Every attempt record of the run, as the project reads them (a loop's are under ``steps/<step>/iteration-<i>/``)."""
    import dataclasses

    from heteroflow.components.core.telemetry import read_step_records

    return [dataclasses.asdict(r) for records in read_step_records(run_dir).values() for r in records]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    from heteroflow.components.data.datasets import export_digits

    root = Path(tempfile.mkdtemp(prefix="hf-bench-"))
    ENV.update({k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, PYTHONPYCACHEPREFIX=str(root / "pycache"))
    try:
        dataset = export_digits(root / "digits")
        script = root / "raw_pipeline.py"
        script.write_text(RAW_PIPELINE)
        run_heteroflow(root / "warm-home", root / "warm-run", 1, dataset)  # page cache and .pyc files, not measured
        run_raw(script, 6, root / "warm-raw")  # the same for the baseline (kfp's own .pyc files in the prefix)
        rows = []
        for i in range(args.repeats):
            wall, record = run_heteroflow(root / f"home-{i}", root / f"run-{i}", args.epochs, dataset)
            records = attempts(root / f"run-{i}")
            tasks = len(records)
            work = sum(r.get("call_seconds") or 0.0 for r in records)
            compute = sum(r.get("compute_seconds") or 0.0 for r in records)
            raw_wall = run_raw(script, tasks, root / f"raw-{i}")
            cold_wall, _ = run_heteroflow(root / f"cold-home-{i}", root / f"cold-{i}", args.epochs, dataset, prestart="0")
            cold_records = attempts(root / f"cold-{i}")
            cold_work = sum(r.get("call_seconds") or 0.0 for r in cold_records)
            hf_per_task = (wall - work) / tasks
            cold_per_task = (cold_wall - cold_work) / len(cold_records)
            raw_per_task = raw_wall / tasks
            driver = wall - float(record["wall_seconds"])  # CLI start, imports, rendering, printing: outside the run
            in_run = (float(record["wall_seconds"]) - work) / tasks
            rows.append((wall, work, compute, hf_per_task, raw_wall, raw_per_task, hf_per_task / raw_per_task, driver, in_run,
                         cold_per_task / raw_per_task, wall / cold_wall))
            print(
                f"repeat {i}: heteroflow wall {wall:6.2f} s, work {work:5.2f} s (compute {compute:5.2f} s), {tasks} tasks, "
                f"overhead {hf_per_task:5.3f} s/task (driver {driver:4.2f} s + {in_run:5.3f} s/task in the run) | raw "
                f"kfp.local wall {raw_wall:5.2f} s, {raw_per_task:5.3f} s/task | ratio {hf_per_task / raw_per_task:4.2f}x | "
                f"without prestart: wall {cold_wall:6.2f} s, work {cold_work:5.2f} s, overhead {cold_per_task:5.3f} s/task, "
                f"ratio {cold_per_task / raw_per_task:4.2f}x; wall with/without {wall / cold_wall:4.2f}"
            )
        med = [statistics.median(col) for col in zip(*rows)]
        print(
            f"median of {args.repeats} (epochs={args.epochs}): heteroflow overhead {med[3]:.3f} s/task, raw kfp.local "
            f"{med[5]:.3f} s/task: {med[6]:.2f}x (target <= 1.1x, issue #32); without prestart {med[9]:.2f}x; heteroflow's wall "
            f"with/without prestart {med[10]:.2f}"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
