"""Preprocessing throughput against parsing alone: rows/s of ``preprocess`` on a 1,000,000-row, 20-column CSV,
and rows/s of ``pandas.read_csv`` on the same file, measured in the same run.

The table: 16 numeric columns (4 decimals), 3 text columns (3, 4 and 12 distinct values) and an integer class
column that depends on them (so it is a learnable table, not noise). ``preprocess`` does everything it does in
a pipeline: sniff, parse, clean, check, split, fit the transformation on the train split, transform every
split, and write the shards, the transformation and ``meta.json``.

Target (issue #9): preprocess rows/s >= 0.5 x read_csv rows/s, i.e. everything after the parse costs no more
than the parse. Each figure is the best of ``--repeat`` runs, the two kinds interleaved (after one read that
warms the page cache).

    .venv/bin/python benchmarks/preprocess.py                 # 1,000,000 rows
    .venv/bin/python benchmarks/preprocess.py --rows 200000   # quicker
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def make_table(path: Path, rows: int, seed: int = 0) -> None:
    """Write the benchmark CSV (20 columns: f0..f15, color, size, city, label)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({f"f{i}": rng.normal(size=rows).round(4) for i in range(16)})
    frame["color"] = rng.choice(["red", "green", "blue"], size=rows)
    frame["size"] = rng.choice(["S", "M", "L", "XL"], size=rows)
    frame["city"] = rng.choice([f"city-{k}" for k in range(12)], size=rows)
    score = frame["f0"] + 0.5 * frame["f1"] - frame["f2"] + (frame["color"] == "red") + 0.1 * rng.normal(size=rows)
    frame["label"] = np.digitize(score, [-1.0, 0.0, 1.0])
    frame.to_csv(path, index=False)


def best_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="folder to keep (and reuse) the generated CSV in")
    args = parser.parse_args()

    import pandas as pd

    from heteroflow.components.preprocess import preprocess

    work = Path(tempfile.mkdtemp(prefix="hf-bench-preprocess-"))
    try:
        folder = args.keep or work
        folder.mkdir(parents=True, exist_ok=True)
        csv_path = folder / f"table-{args.rows}.csv"
        if not csv_path.is_file():
            started = time.perf_counter()
            make_table(csv_path, args.rows)
            print(f"wrote {csv_path} ({csv_path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s")
        pd.read_csv(csv_path)  # warm the page cache for both measurements

        # Interleaved (parse, preprocess, parse, ...) so that both see the same machine; best of each.
        parses, fulls = [], []
        for _ in range(args.repeat):
            parses.append(best_seconds(lambda: pd.read_csv(csv_path), 1))
            started = time.perf_counter()
            result = preprocess(csv_path, work / "shards", num_workers=1)
            fulls.append(time.perf_counter() - started)
        parse, full = min(parses), min(fulls)
        rows = result.report["rows_used"]
        print(f"rows: {rows:,}  columns: 20  features after the transformation: {result.num_features}")
        print(f"pandas.read_csv alone : {args.rows / parse:12,.0f} rows/s  ({parse:.2f} s)")
        print(f"heteroflow preprocess : {rows / full:12,.0f} rows/s  ({full:.2f} s)")
        ratio = (rows / full) / (args.rows / parse)
        print(f"ratio                 : {ratio:.2f}x  (target >= 0.5x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
