"""Prewarm throughput against `cp -r` + `sync` of the same tree, and against a single-threaded Python copy.

Usage: python benchmarks/prewarm.py [--large-files 4] [--large-mib 128] [--small-files 20000] [--repeats 3]
       [--workdir DIR] [--json]

Two trees are made under ``--workdir`` (default: a temporary folder on the same filesystem as the cache):

1. a few large files (``--large-files`` x ``--large-mib`` MiB of random bytes): bytes/s of a fresh prewarm vs
   ``cp -r SRC DST && sync`` (target: >= 0.9x);
2. ``--small-files`` files of 1-4 KiB in 100 folders: files/s of a fresh prewarm vs ``cp -r`` + ``sync`` (target:
   >= 1.0x) and vs a single-threaded Python copy (``shutil.copyfile`` per file, then one ``os.sync()``).

Every method starts from the same page-cache state (the sources were just written and read once), each is
run ``--repeats`` times into a fresh destination, and the median is reported; ``sync`` time is included in
every method, as prewarm makes its copy durable before it publishes. Ratios are against baselines measured in
the same run, so the figures compare methods, not machines.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _make_large(root: Path, n: int, mib: int) -> int:
    rng = random.Random(1)
    block = rng.randbytes(1 << 20)
    for i in range(n):
        with open(root / f"large-{i}.npz", "wb") as fh:
            for j in range(mib):
                fh.write(block[j % 7:] + block[: j % 7])  # distinct blocks, cheap to make
    return n * mib << 20


def _make_small(root: Path, n: int) -> int:
    rng = random.Random(2)
    total = 0
    for i in range(n):
        d = root / f"part-{i % 100:03d}"
        if i < 100:
            d.mkdir()
        data = rng.randbytes(rng.randint(1024, 4096))
        (d / f"rec-{i:06d}.csv").write_bytes(data)
        total += len(data)
    return total


def _warm(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            p.read_bytes()


def _cp_sync(src: Path, dst: Path) -> None:
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    subprocess.run(["sync"], check=True)


def _python_copy(src: Path, dst: Path) -> None:
    for dirpath, _dirs, files in os.walk(src):
        out = dst / os.path.relpath(dirpath, src)
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copyfile(os.path.join(dirpath, name), out / name)
    os.sync()


def _prewarm(src: Path, dst: Path) -> None:
    from heteroflow.cache.prewarm import prewarm

    prewarm(str(src), dst)


def _time(method: Callable[[Path, Path], None], src: Path, scratch: Path, repeats: int) -> float:
    times = []
    for i in range(repeats):
        dst = scratch / f"dst-{method.__name__}-{i}"
        subprocess.run(["sync"], check=True)  # start each run without others' dirty pages
        t0 = time.perf_counter()
        method(src, dst)
        times.append(time.perf_counter() - t0)
        shutil.rmtree(dst)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--large-files", type=int, default=4)
    ap.add_argument("--large-mib", type=int, default=128)
    ap.add_argument("--small-files", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="heteroflow-bench-", dir=args.workdir))
    try:
        large, small = work / "large", work / "small"
        large.mkdir()
        small.mkdir()
        large_bytes = _make_large(large, args.large_files, args.large_mib)
        small_bytes = _make_small(small, args.small_files)
        _warm(large)
        _warm(small)
        scratch = work / "out"
        scratch.mkdir()

        t_cp_l = _time(_cp_sync, large, scratch, args.repeats)
        t_pw_l = _time(_prewarm, large, scratch, args.repeats)
        t_cp_s = _time(_cp_sync, small, scratch, args.repeats)
        t_py_s = _time(_python_copy, small, scratch, args.repeats)
        t_pw_s = _time(_prewarm, small, scratch, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mib = 1 << 20
    figures = {
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "large": {
            "files": args.large_files, "bytes": large_bytes,
            "cp_sync_MiB_per_s": round(large_bytes / mib / t_cp_l, 1),
            "prewarm_MiB_per_s": round(large_bytes / mib / t_pw_l, 1),
            "prewarm_vs_cp_sync": round(t_cp_l / t_pw_l, 2), "target": ">= 0.9",
        },
        "small": {
            "files": args.small_files, "bytes": small_bytes,
            "cp_sync_files_per_s": round(args.small_files / t_cp_s),
            "python_single_thread_files_per_s": round(args.small_files / t_py_s),
            "prewarm_files_per_s": round(args.small_files / t_pw_s),
            "prewarm_vs_cp_sync": round(t_cp_s / t_pw_s, 2), "target": ">= 1.0",
            "prewarm_vs_python_single_thread": round(t_py_s / t_pw_s, 2),
        },
        "repeats": args.repeats,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    lg, sm = figures["large"], figures["small"]
    print(f"large files: {lg['files']} x {args.large_mib} MiB; median of {args.repeats} runs; {figures['cpus']} CPUs")
    print(f"  cp -r + sync      {lg['cp_sync_MiB_per_s']:>10} MiB/s")
    print(f"  prewarm           {lg['prewarm_MiB_per_s']:>10} MiB/s   {lg['prewarm_vs_cp_sync']}x cp -r + sync (target >= 0.9x)")
    print(f"small files: {sm['files']} files of 1-4 KiB")
    print(f"  cp -r + sync      {sm['cp_sync_files_per_s']:>10} files/s")
    print(f"  python, 1 thread  {sm['python_single_thread_files_per_s']:>10} files/s")
    print(f"  prewarm           {sm['prewarm_files_per_s']:>10} files/s   {sm['prewarm_vs_cp_sync']}x cp -r + sync "
          f"(target >= 1.0x), {sm['prewarm_vs_python_single_thread']}x python 1 thread")
    return 0


if __name__ == "__main__":
    sys.exit(main())
