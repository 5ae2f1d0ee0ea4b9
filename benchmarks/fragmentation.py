"""GPU fragmentation on the Alibaba 2023 GPU cluster: FGD against the other packing policies.

Setup (Weng et al., "Beware of Fragmentation", USENIX ATC'23, section 5.1; the data is theirs, read where it lies,
``../shared/data/alibaba_gpu_v2023``, research use only, never copied into the project): the cluster is the node
list (1,213 GPU nodes, 6,212 GPUs of 7 models); pods are drawn with replacement from one pod list
(``numpy.random.default_rng(seed)``), placed one by one and never leave, until the next pod would take the arrived
GPU demand past the cluster's GPU capacity. Every policy gets the same draws (same seed) and the same information
(FGD's workload distribution is the pod list it draws from). Reported: the share of the cluster's GPUs left
unallocated at that point (fragmented or idle), the median over seeds 0-4, per workload and policy.

Published on the same inputs (the authors' artifact, median of 10 runs): gpushare40 FGD 6.04 %, BestFit 8.53 %,
Random 15.02 %; multigpu50 FGD 2.90 %, BestFit 4.36 %, Random 18.50 %; gpuspec33 FGD 12.11 %, BestFit 19.47 %,
Random 16.16 % (their default workload: FGD 4.77 %, BestFit 7.14 %).

Prints, read by a script, one line per workload::

    fgd gpushare40: unallocated 6.9% (bestfit 8.6%, random 15.4%)

then every policy's median and range. Target (issue 30): FGD below best-fit on every shipped workload.

Run: ``.venv/bin/python benchmarks/fragmentation.py [--plot fragmentation.png] [--seeds 5] [--policies fgd,bestfit,...]
[--jobs 2]`` (the fills run in ``--jobs`` processes: 412 s in 2, 482 s in one, on 2 cores shared with other work at a
load average of 12-14). Without the data folder it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from heteroflow.components.placement.packing import PACKING_POLICIES, fill
from heteroflow.components.placement.vectors import Cluster

NODES = "openb_node_list_gpu_node.csv"
POLICIES = ("fgd", "bestfit", "random", "dotprod", "gpupacking", "firstfit", "leastloaded", "power-aware")


def workloads(data: Path) -> list[str]:
    """The shipped pod lists' workload names (``openb_pod_list_<name>.csv``): gpushare, multigpu, gpuspec, others."""
    order = ("gpushare", "multigpu", "gpuspec")
    names = [p.name[len("openb_pod_list_"):-4] for p in data.glob("openb_pod_list_*.csv")]
    return sorted(names, key=lambda n: (next((i for i, o in enumerate(order) if n.startswith(o)), len(order)), n))


_CACHE: dict[tuple[str, str], object] = {}


def _one(data: str, workload: str, policy: str, seed: int) -> tuple[float, np.ndarray]:
    """One fill: the final unallocated share (%) and the curve on the 0..100 % arrived grid (%)."""
    from heteroflow.pipelines.alibaba import read_nodes, read_pods

    key_c, key_p = (data, NODES), (data, workload)
    if key_c not in _CACHE:
        _CACHE[key_c] = Cluster(read_nodes(Path(data) / NODES), source=str(Path(data) / NODES))
    if key_p not in _CACHE:
        _CACHE[key_p] = read_pods(Path(data) / f"openb_pod_list_{workload}.csv")
    r = fill(_CACHE[key_p], _CACHE[key_c], policy, seed=seed)  # type: ignore[arg-type]
    grid = np.linspace(0, 1, 101)
    return 100 * r.final_unallocated, np.interp(grid, np.concatenate([[0.0], r.arrived]), np.concatenate([[1.0], r.unallocated])) * 100


def run(data: Path, seeds: int, policies: list[str], plot: str | None, jobs: int = 1) -> dict[str, dict[str, list[float]]]:
    """Every (workload, policy, seed) fill, ``jobs`` processes at a time; prints each policy's median as it lands."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    from heteroflow.pipelines.alibaba import read_nodes

    cluster = Cluster(read_nodes(data / NODES), source=str(data / NODES))
    print(f"{len(cluster.nodes)} nodes, {cluster.gpu_capacity_milli // 1000} GPUs ({', '.join(cluster.models)}); seeds 0-{seeds - 1}; "
          f"{jobs} process(es)")
    grid = np.linspace(0, 1, 101)
    tasks = [(w, name, seed) for w in workloads(data) for name in policies for seed in range(seeds)]
    t0 = time.perf_counter()
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            results = list(pool.map(_one, *zip(*[(str(data), w, n, s) for w, n, s in tasks], strict=True), chunksize=1))
    else:
        results = [_one(str(data), w, n, s) for w, n, s in tasks]
    out: dict[str, dict[str, list[float]]] = {}
    curves: dict[str, dict[str, np.ndarray]] = {}
    for (w, name, _seed), (final, curve) in zip(tasks, results, strict=True):
        out.setdefault(w, {}).setdefault(name, []).append(final)
        curves.setdefault(w, {}).setdefault(name, []).append(curve)  # type: ignore[arg-type]
    for w, by in out.items():
        for name, finals in by.items():
            curves[w][name] = np.median(np.array(curves[w][name]), axis=0)
            print(f"  {w:12s} {name:12s} unallocated median {np.median(finals):5.2f}% (range {min(finals):.2f}-{max(finals):.2f})")
    print(f"  ({len(tasks)} fills in {time.perf_counter() - t0:.0f} s)")
    if plot:
        _plot(curves, grid, plot)
    return out


def _plot(curves: dict[str, dict[str, np.ndarray]], grid: np.ndarray, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4), squeeze=False)
    for ax, (w, by) in zip(axes[0], curves.items(), strict=True):
        for name, c in by.items():
            ax.plot(grid * 100, c, label=name, lw=2 if name == "fgd" else 1)
        ax.plot(grid * 100, 100 - grid * 100, "k:", lw=0.8, label="ideal")
        ax.set(title=w, xlabel="arrived GPU demand (% of capacity)", ylabel="unallocated GPUs (% of capacity)", xlim=(60, 100), ylim=(0, 45))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=None, help="folder with the Alibaba 2023 node and pod lists (default: $HETEROFLOW_ALIBABA_2023, "
                    "else ../shared/data/alibaba_gpu_v2023 beside the checkout)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated (default: {','.join(POLICIES)}; fgd, bestfit and random are always run)")
    ap.add_argument("--plot", help="write the unallocated-vs-arrived plot (PNG) here")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default: 2, or 1 on one core)")
    args = ap.parse_args()
    from heteroflow.pipelines.alibaba import data_dir

    data = args.data.resolve() if args.data else data_dir()
    if data is None or not (data / NODES).is_file() or not workloads(data):
        print(f"skipped: no Alibaba 2023 node and pod lists in {data or '../shared/data/alibaba_gpu_v2023'} "
              "(the data is not shipped with heteroflow: research use only; --data names the folder)")
        return
    names = list(dict.fromkeys(["fgd", "bestfit", "random", *[p.strip() for p in args.policies.split(",") if p.strip()]]))
    unknown = [p for p in names if p not in PACKING_POLICIES]
    if unknown:
        sys.exit(f"--policies: unknown {', '.join(unknown)}; valid: {', '.join(PACKING_POLICIES)}")
    t = time.perf_counter()
    res = run(data, args.seeds, names, args.plot, jobs=max(1, args.jobs))
    print()
    for w, by in res.items():
        m = {p: float(np.median(v)) for p, v in by.items()}
        print(f"fgd {w}: unallocated {m['fgd']:.1f}% (bestfit {m['bestfit']:.1f}%, random {m['random']:.1f}%)")
    print(f"\nwhole benchmark: {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
