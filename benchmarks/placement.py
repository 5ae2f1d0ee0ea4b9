"""Placement on Gavel's setup: policies against static binding, Gavel-style max-min fairness and a makespan bound.

Setup (Gavel, OSDI'20, section 7.1): 36 K80 + 36 P100 + 36 V100 (4 per node); jobs from Gavel's arrival process
(Poisson, job types uniform over its 26 measured types, 1/2/4/8 workers with probability 0.70/0.10/0.15/0.05,
durations 10^x minutes), Gavel's measured throughputs; seeds 0, 1, 2. Each seed replays the same trace under
every policy in this run:

- static: FIFO with static binding (each job on the model it names, drawn uniformly among those that can run it);
- least-loaded: heterogeneity-agnostic FIFO, the model with the most free devices;
- gavel: Gavel-style max-min fairness over throughput-normalised shares (fluid, preemptive, re-solved per event);
- throughput: heteroflow's policy (the model where the job finishes first, then least-loaded node);
- power-aware: the same choice of model, packing nodes so idle machines power down.

Then one placement round for 1,000 pending jobs on 10,000 nodes (the Alibaba PAI machine list, replicated), timed
against a pure-Python loop over the nodes for the same round (the baseline measured in this run).

Targets (issue 19): avg JCT >= 1.5x better than static; within 1.2x of gavel or better; makespan <= 1.3x the bound;
power-aware energy below least-loaded at equal or better JCT; the 10,000-node round under 1 s.

Run: ``.venv/bin/python benchmarks/placement.py [--jobs 300] [--rate 6] [--plot placement.png]`` (about a minute
here with the defaults: 300 jobs per seed keeps the Gavel-style LP replay short).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from heteroflow.components.placement.clusters import gavel_throughputs, pai_inventory, uniform_inventory
from heteroflow.components.placement.rounds import _allowed_models, place_round
from heteroflow.components.placement.state import Job, PlacementState
from heteroflow.pipelines.simulate import lower_bound_makespan, plot_utilization, simulate
from heteroflow.pipelines.traces import generate_gavel_trace

POLICIES = ("static", "least-loaded", "gavel", "throughput", "power-aware")


def gavel_runs(n_jobs: int, rate: float, seeds: list[int], plot: str | None) -> dict[str, dict[str, list[float]]]:
    table = gavel_throughputs()
    inv = uniform_inventory({"k80": 36, "p100": 36, "v100": 36}, source="gavel")
    agg: dict[str, dict[str, list[float]]] = {p: {"jct": [], "p99": [], "makespan": [], "energy": [], "cost": [], "queue": [], "secs": []} for p in POLICIES}
    bounds = []
    for seed in seeds:
        jobs = generate_gavel_trace(n_jobs, jobs_per_hour=rate, seed=seed, table=table)
        bound = lower_bound_makespan(jobs, inv, table)
        bounds.append(bound)
        print(f"\nseed {seed}: {n_jobs} jobs at {rate} jobs/h; makespan lower bound {bound / 3600:.1f} h")
        print(f"  {'policy':13s} {'avg JCT h':>9s} {'p99 JCT h':>9s} {'makespan h':>10s} {'/bound':>6s} {'queue h':>7s} "
              f"{'util k80/p100/v100':>19s} {'energy kWh':>10s} {'cost':>8s} {'replay s':>8s}")
        results = []
        for name in POLICIES:
            t = time.perf_counter()
            r = simulate(jobs, inv, table, name)
            secs = time.perf_counter() - t
            results.append(r)
            a = agg[name]
            a["jct"].append(r.avg_jct)
            a["p99"].append(r.p99_jct)
            a["makespan"].append(r.makespan / bound)
            a["energy"].append(r.energy_kwh)
            a["cost"].append(r.cost)
            a["queue"].append(r.avg_queueing)
            a["secs"].append(secs)
            util = "/".join(f"{r.utilization[m]:.0%}" for m in ("nvidia-k80", "nvidia-p100", "nvidia-v100"))
            print(f"  {name:13s} {r.avg_jct / 3600:9.2f} {r.p99_jct / 3600:9.1f} {r.makespan / 3600:10.1f} "
                  f"{r.makespan / bound:6.2f} {r.avg_queueing / 3600:7.2f} {util:>19s} {r.energy_kwh:10.0f} {r.cost:8.0f} {secs:8.2f}")
        if plot and seed == seeds[0]:
            print(f"  plot: {plot_utilization(results, plot, title=f'Gavel setup, seed {seed}, {n_jobs} jobs at {rate}/h')}")
    return agg


def philly_run(path: str, cluster: str, n_jobs: int) -> None:
    """The first ``n_jobs`` jobs of one Philly virtual cluster (real arrivals, durations, GPU counts) on the same
    cluster, every policy."""
    from heteroflow.pipelines.traces import philly_trace

    table = gavel_throughputs()
    inv = uniform_inventory({"k80": 36, "p100": 36, "v100": 36}, source="gavel")
    jobs = philly_trace(path, table=table, cluster=cluster, limit=n_jobs)
    bound = lower_bound_makespan(jobs, inv, table)
    print(f"\nPhilly cluster {cluster}: {len(jobs)} jobs over {jobs[-1].arrival / 3600:.0f} h; bound {bound / 3600:.1f} h")
    base = None
    for name in POLICIES:
        r = simulate(jobs, inv, table, name)
        base = base or r.avg_jct
        print(f"  {name:13s} avg JCT {r.avg_jct / 3600:7.2f} h ({base / r.avg_jct:4.2f}x static)  makespan/bound "
              f"{r.makespan / bound:5.2f}  energy {r.energy_kwh:7.0f} kWh")


def round_benchmark(n_jobs: int = 1000, replicate: int = 6) -> tuple[float, float, int]:
    """One placement round, 1,000 jobs on the PAI machine list replicated to > 10,000 nodes: numpy policy vs a
    pure-Python per-node loop making the same filter and least-loaded pick (the baseline, same run)."""
    inv = pai_inventory(replicate=replicate)
    rng = np.random.default_rng(0)
    tp_models = ("nvidia-k80", "nvidia-p100", "nvidia-t4", "nvidia-v100")
    jobs = []
    for i in range(n_jobs):
        tp = dict(zip(tp_models, rng.uniform(0.5, 5.0, size=4), strict=True))
        jobs.append(Job(name=f"j{i}", count=int(rng.choice([1, 2, 4, 8], p=[0.7, 0.1, 0.15, 0.05])), kind="gpu",
                        throughput=tp, device_memory_bytes=int(rng.choice([0, 16 * 2**30, 32 * 2**30], p=[0.6, 0.3, 0.1]))))
    state = PlacementState(inv)
    t = time.perf_counter()
    decisions = place_round(jobs, state, "throughput")
    fast = time.perf_counter() - t
    placed = sum(d.placed for d in decisions)

    # baseline: the same round, one Python loop over the nodes per job
    state2 = PlacementState(inv)
    nodes = inv.nodes
    free = [int(x) for x in state2.free]
    t = time.perf_counter()
    for job in jobs:
        allowed = _allowed_models(job, state2)
        best_model, best_tp = None, -1.0
        for i, m in enumerate(state2.models):
            if allowed[i] and job.throughput.get(m, 0) > best_tp:
                total = sum(f for n, f in zip(nodes, free, strict=True) if n.model == m and n.device_memory_bytes >= job.device_memory_bytes)
                if total >= job.count:
                    best_model, best_tp = m, job.throughput.get(m, 0)
        if best_model is None:
            continue
        best, best_free = -1, -1
        for k, n in enumerate(nodes):
            if n.model == best_model and n.device_memory_bytes >= job.device_memory_bytes and free[k] >= job.count and free[k] > best_free:
                best, best_free = k, free[k]
        if best >= 0:
            free[best] -= job.count
    slow = time.perf_counter() - t
    return fast, slow, placed, len(nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300, help="jobs per seed (default 300)")
    ap.add_argument("--rate", type=float, default=6.0, help="jobs per hour (default 6)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--plot", default=None, help="write the utilization-over-time plot of the first seed (PNG)")
    ap.add_argument("--philly", default=None, help="also replay Philly jobs from this philly.csv (Pollux's copy; not shipped)")
    ap.add_argument("--philly-cluster", default="6c71a0", help="the Philly virtual cluster to replay (default 6c71a0)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    agg = gavel_runs(args.jobs, args.rate, seeds, args.plot)

    mean = {p: {k: float(np.mean(v)) for k, v in a.items()} for p, a in agg.items()}
    print(f"\nmean over seeds {seeds}:")
    print(f"  {'policy':13s} {'avg JCT h':>9s} {'static/this':>11s} {'this/gavel':>10s} {'makespan/bound':>14s} {'energy kWh':>10s}")
    for p in POLICIES:
        m = mean[p]
        print(f"  {p:13s} {m['jct'] / 3600:9.2f} {mean['static']['jct'] / m['jct']:11.2f} {m['jct'] / mean['gavel']['jct']:10.2f} "
              f"{m['makespan']:14.2f} {m['energy']:10.0f}")
    hf = mean["throughput"]
    pa = mean["power-aware"]
    ll = mean["least-loaded"]
    print("\ntargets (throughput policy):")
    print(f"  avg JCT vs static binding: {mean['static']['jct'] / hf['jct']:.2f}x better (target >= 1.5x)")
    print(f"  avg JCT vs Gavel-style max-min: {hf['jct'] / mean['gavel']['jct']:.2f}x (target <= 1.2x)")
    print(f"  makespan / lower bound: {hf['makespan']:.2f} (target <= 1.3)")
    print(f"  power-aware energy / least-loaded: {pa['energy'] / ll['energy']:.2f} at avg JCT {pa['jct'] / ll['jct']:.2f}x of least-loaded's")
    print(f"  power-aware energy / throughput (same models, nodes spread): {pa['energy'] / hf['energy']:.3f} at avg JCT {pa['jct'] / hf['jct']:.2f}x")

    if args.philly:
        philly_run(args.philly, args.philly_cluster, args.jobs)

    fast, slow, placed, n_nodes = round_benchmark()
    print(f"\none placement round: 1,000 jobs on {n_nodes:,} nodes (PAI machine list x6): {fast:.3f} s "
          f"({placed} placed); pure-Python loop baseline {slow:.2f} s; {slow / fast:.1f}x faster (target < 1 s)")


if __name__ == "__main__":
    main()
