"""Orchestration overhead of ``heteroflow run``.

Runs the default pipeline with the real command line (``heteroflow run``, kfp.local, one subprocess per step)
and reports, per repeat and as the median:

- wall: seconds from starting the command to its exit;
- compute: the sum of the steps' own compute time (their work, timed inside each step; from ``run.json``);
- overhead fraction = (wall - compute) / wall: process starts, imports, kfp.local bookkeeping, artifact I/O;
- ratio vs direct: wall / the wall time of the same six step functions chained in one Python process
  (the baseline, measured in the same benchmark run, same data and parameters).

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


def run_cli(home: Path, out: Path, epochs: int, dataset: Path) -> tuple[float, dict]:
    exe = Path(sys.executable).with_name("heteroflow")
    env = {**os.environ, "HETEROFLOW_HOME": str(home)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(exe), "run", "--param", f"epochs={epochs}", "--dataset", str(dataset), "--output", str(out)],
        env=env, capture_output=True, text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"heteroflow run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return wall, json.loads((out / "run.json").read_text())


def run_direct(home: Path, epochs: int, dataset: Path) -> float:
    """The baseline: the same steps as plain function calls in this process (torch already imported)."""
    os.environ["HETEROFLOW_HOME"] = str(home)
    from heteroflow.cache.prewarm import prewarm
    from heteroflow.components.archive import archive
    from heteroflow.components.evaluate import evaluate
    from heteroflow.components.plan import plan
    from heteroflow.components.preprocess import preprocess
    from heteroflow.components.spec import DEFAULT_TRAIN_CANDIDATES
    from heteroflow.components.train import train

    t0 = time.perf_counter()
    pw = prewarm(str(dataset), home / "cache" / "direct")
    preprocess(pw.manifest_path, home / "shards")
    placement = plan(DEFAULT_TRAIN_CANDIDATES)
    train(home / "shards", home / "model", device=placement.torch_device, epochs=epochs)
    ev = evaluate(home / "shards", home / "model", device=placement.torch_device)
    archive(home / "model", home / "archive", name="bench", metrics={"accuracy": ev.accuracy}, lineage={})
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    from heteroflow.components.datasets import export_digits

    root = Path(tempfile.mkdtemp(prefix="hf-bench-"))
    try:
        dataset = export_digits(root / "digits")
        run_direct(root / "direct-warmup", args.epochs, dataset)  # the baseline pays its imports once, not per repeat
        rows = []
        for i in range(args.repeats):
            home = root / f"home-{i}"
            wall, record = run_cli(home, root / f"run-{i}", args.epochs, dataset)
            compute = sum(s["compute_seconds"] or 0.0 for s in record["steps"])
            direct = run_direct(root / f"direct-{i}", args.epochs, dataset)
            rows.append((wall, compute, (wall - compute) / wall, direct, wall / direct))
            print(
                f"repeat {i}: wall {wall:6.2f} s  compute {compute:6.2f} s  overhead fraction {(wall - compute) / wall:5.1%}"
                f"  direct {direct:6.2f} s  ratio vs direct {wall / direct:5.2f}x"
            )
        med = [statistics.median(col) for col in zip(*rows)]
        print(
            f"median ({args.repeats} repeats, epochs={args.epochs}): wall {med[0]:.2f} s, compute {med[1]:.2f} s, "
            f"orchestration overhead {med[2]:.1%} of the total, {med[4]:.2f}x the direct in-process chain"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
