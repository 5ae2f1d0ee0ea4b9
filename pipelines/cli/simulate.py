"""``heteroflow simulate``: replay a job trace on an inventory under one or more placement policies.

Registered in :mod:`heteroflow.pipelines.cli.main` with::

    from heteroflow.pipelines.cli.simulate import simulate_command
    app.command("simulate")(simulate_command)

Bad input (a trace or inventory with unknown models, negative counts, duplicate names, guarantees above
capacity) prints one line naming the file and line and exits 2.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["simulate_command"]

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def _print_results(title: str, headers: list[str], rows: list[list[str]], *, left: tuple[str, ...],
                   drop_order: list[str]) -> None:
    """The results table: a rich table in a terminal; piped (into a file, ``grep``, ``cat``), its title as one line,
    then plain columns with every cell whole (:func:`heteroflow.pipelines.cli.common.print_table`, as
    ``heteroflow runs`` prints them), never cut to the 80 columns rich assumes without a terminal.

    In a terminal narrower than the table no cell is cut either (rich ended them in ``…``: ``least…``, ``2,…``):
    headers wrap between words, a number is never split (its column keeps its widest cell), a text column
    (``left``) folds over lines, and where even that does not fit the columns of ``drop_order`` are hidden, first
    named first, and named under the table (:func:`~heteroflow.pipelines.cli.common.fit_columns`)."""
    from heteroflow.pipelines.cli.common import fit_columns, hidden_note, print_table

    def longest_word(i: int) -> int:
        return max([len(w) for w in headers[i].split()] + [len(w) for r in rows for w in r[i].split()] + [1])

    # a text column may wrap down to its longest word; a number column is as wide as its widest cell
    wrap = {h: longest_word(i) for i, h in enumerate(headers) if h in left}
    kept, hidden = fit_columns(console, headers, rows, drop_order, wrap=wrap, header_words=True)
    natural = 1 + sum(3 + max([len(headers[i])] + [len(r[i]) for r in rows]) for i in kept)
    table = Table(title=title)
    for i in kept:
        col = headers[i]
        if col in left:
            table.add_column(col, justify="left", overflow="fold")
        else:  # too narrow for the whole headers: a fixed width keeps every number whole, its header wraps
            narrowest = max([len(w) for w in col.split()] + [len(r[i]) for r in rows])
            table.add_column(col, justify="right", overflow="fold", width=narrowest if natural > console.width else None)
    for row in rows:
        table.add_row(*(escape(row[i]) for i in kept))
    if not console.is_terminal:
        console.print(title, markup=False, highlight=False, soft_wrap=True)
    print_table(console, table, headers, rows)
    if hidden:
        console.print(hidden_note(hidden, console.width, "piped output, `| cat`, has every column"), highlight=False, style="dim")


def _inventory(spec: str):  # type: ignore[no-untyped-def]
    from heteroflow.components.placement.inventory import load_inventory
    from heteroflow.components.placement.clusters import pai_inventory, uniform_inventory

    if spec == "gavel":
        return uniform_inventory({"k80": 36, "p100": 36, "v100": 36}, source="gavel (36 K80 + 36 P100 + 36 V100)")
    if spec == "pai":
        return pai_inventory()
    return load_inventory(spec).for_placement()


def _trace(spec: str, table, inventory):  # type: ignore[no-untyped-def]
    from heteroflow.components.placement.clusters import InvalidTrace
    from heteroflow.pipelines.traces import generate_gavel_trace, read_trace

    if spec.startswith("gavel:"):
        parts = spec.split(":")
        try:
            n, rate, seed = int(parts[1]), float(parts[2]), int(parts[3])
        except (IndexError, ValueError):
            raise InvalidTrace(f"--trace {spec!r}: valid: a file, or gavel:JOBS:JOBS_PER_HOUR:SEED (e.g. gavel:300:6:0)") from None
        if n <= 0 or rate <= 0:
            raise InvalidTrace(f"--trace {spec!r}: JOBS and JOBS_PER_HOUR must be positive")
        return generate_gavel_trace(n, jobs_per_hour=rate, seed=seed, table=table, models=[m for m in table.models if m in inventory.models])
    return read_trace(spec, table=table, inventory=inventory)


def _packing(trace: str, inventory: str, policy: Optional[list[str]], seeds: int, json_out: Optional[Path], explain: int) -> bool:
    """Run a packing replay when the trace is an Alibaba 2023 pod list or a Pollux workload, or the inventory an
    Alibaba 2023 node list; False otherwise (a job trace)."""
    from heteroflow.components.errors import HeteroflowError
    from heteroflow.components.placement.clusters import InvalidTrace
    from heteroflow.pipelines.alibaba import detect_csv

    try:
        fmt = "" if trace.startswith("gavel:") or not Path(trace).is_file() else _trace_format(trace)
        inv_fmt = detect_csv(inventory) if inventory.endswith(".csv") and Path(inventory).is_file() else None
        if fmt not in ("alibaba-pods", "pollux-workload", "alibaba-nodes") and inv_fmt != "alibaba-nodes":
            return False
        if fmt == "alibaba-nodes":
            raise InvalidTrace(f"--trace {trace}: an Alibaba 2023 node list; give it as --inventory and a pod list as --trace")
        if fmt not in ("alibaba-pods", "pollux-workload"):
            raise InvalidTrace(f"--inventory {inventory} is an Alibaba 2023 node list: --trace needs an Alibaba 2023 pod list "
                               "(name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]) or a Pollux workload")
        from heteroflow.pipelines.alibaba import read_pods
        from heteroflow.pipelines.fragmentation import packing_cluster, replay
        from heteroflow.pipelines.traces import read_pollux_workload

        pods = read_pods(trace) if fmt == "alibaba-pods" else read_pollux_workload(trace)
        if inventory == "gavel" and fmt == "alibaba-pods":
            raise InvalidTrace(f"--trace {trace} is an Alibaba 2023 pod list: --inventory needs its node list "
                               "(sn,cpu_milli,memory_mib,gpu,model) or an inventory YAML with each node's cpu and memory")
        cluster = packing_cluster(inventory)
        if not inventory.endswith(".csv"):  # an inventory YAML names models by registry key: the pods' T4 is nvidia-t4,
            import dataclasses  # as the plan step reads the same pod list (T4 pods waited for "no node with model T4")

            from heteroflow.components.placement.packplan import _registry_models

            pods = [dataclasses.replace(p, models=_registry_models(p.models)) if p.models else p for p in pods]
        rep = replay(pods, cluster, policy, seeds=range(seeds), explain=explain)
    except (HeteroflowError, ValueError) as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    gpus = cluster.gpu_capacity_milli / 1000
    headers = ["policy", "unallocated", "placed", "waiting", "what holds them"]
    rows, summary = [], []
    import statistics

    for name, runs in rep.results.items():
        r = runs[0]
        held = ", ".join(f"{k} {v}" for k, v in sorted(r.reasons.items(), key=lambda kv: -kv[1])) or "-"
        # every column over the same seeds: the medians (the placed and waiting counts were seed 0's beside the
        # median unallocated share), the reasons seed 0's (said in the title)
        placed, waiting = (statistics.median([getattr(x, k) for x in runs]) for k in ("placed", "failed"))
        rows.append([name + (" (default)" if name == rep.default else ""), f"{100 * rep.median_unallocated(name):.2f}%", f"{placed:g}", f"{waiting:g}", held])
        summary.append({"policy": name, "unallocated_share": rep.median_unallocated(name), "per_seed": [x.final_unallocated for x in runs],
                        "placed": [x.placed for x in runs], "waiting": [x.failed for x in runs]})
    # the pods are the trace's; each seed draws from them (their order) until the drawn pods ask for the cluster's
    # GPUs, so placed + waiting is the pods drawn, not the trace's count (a trial read "200 pods drawn" beside 60 + 4)
    medians = f"{seeds} seed(s)" + (": medians; what holds them: seed 0" if seeds > 1 else "")
    _print_results(f"{len(pods)} pods in the trace ({sum(p.shared for p in pods)} shared-GPU), drawn until they ask for "
                   f"{gpus:g} GPUs, on {len(cluster.nodes)} nodes of {cluster.source}; {medians}", headers, rows,
                   left=("policy", "what holds them"), drop_order=["waiting", "placed", "what holds them"])
    for name, runs in rep.results.items():
        for line in runs[0].explanations:
            console.print(f"  {name}: {escape(line)}", highlight=False)
    for name in rep.results:
        console.print(f"{name}: unallocated {100 * rep.median_unallocated(name):.1f}% of {gpus:g} GPUs", highlight=False)
    if json_out is not None:
        _write_json(json_out, {"gpus": gpus, "pods": len(pods), "default": rep.default, "results": summary})
    return True


def _write_json(path: Path, data: Any) -> None:
    """``--json``: the results, written atomically (its folder made, as ``--plot``'s is); a folder at ``path`` or a
    path that cannot be written is a user error naming ``path`` (it was an unexpected FileNotFoundError after the
    replay had printed)."""
    from heteroflow.cache.atomic import atomic_write_bytes
    from heteroflow.pipelines.cli.common import _fail

    try:
        atomic_write_bytes(path, json.dumps(data, indent=2).encode("utf-8"), durable=False)
    except OSError as exc:
        _fail(exc)


def _job_results(jobs, inv, table, policy: Optional[list[str]], noise_sigma: Optional[float], trace: str) -> list:  # type: ignore[no-untyped-def]
    """Each named policy's replay: a name of the no-foreknowledge replay's schedulers (:data:`heteroflow.pipelines.jct.SCHEDULERS`)
    runs there when ``--noise-sigma`` is given or the name is only that replay's (``fifo``, ``gavel-style``,
    ``heteroflow``), labelled with its sigma; any other name runs in :func:`heteroflow.pipelines.simulate.simulate`.
    The estimate's noise is seeded with the trace seed of ``gavel:JOBS:RATE:SEED`` (else 0)."""
    from heteroflow.components.placement.policies import POLICIES
    from heteroflow.pipelines.jct import SCHEDULERS, replay
    from heteroflow.pipelines.simulate import simulate

    if policy:
        names = list(policy)
    elif noise_sigma is not None:
        names = list(SCHEDULERS)
    else:
        names = ["static", "least-loaded", "gavel", "throughput", "power-aware"]
    sigma = 0.5 if noise_sigma is None else noise_sigma
    parts = trace.split(":")
    seed = int(parts[3]) if trace.startswith("gavel:") and len(parts) > 3 and parts[3].isdigit() else 0
    for name in names:  # a packing policy (fgd) on a job trace: say what it is for, not only 'unknown'
        if name not in POLICIES and name not in SCHEDULERS and ":" not in name:
            from heteroflow.components.errors import HeteroflowError
            from heteroflow.components.placement.packing import get_packing_policy

            try:
                get_packing_policy(name)
            except HeteroflowError:
                continue  # unknown to both: simulate() says so, listing the job trace's policies
            from heteroflow.components.placement.clusters import InvalidTrace

            raise InvalidTrace(
                f"--policy {name} packs pods: it applies to a pod trace (--trace an Alibaba 2023 pod list or a Pollux "
                f"workload), and {trace} is a job trace; valid here: {', '.join(sorted(POLICIES))}, the replay's "
                f"schedulers {', '.join(s for s in SCHEDULERS if s not in POLICIES)}, or module:attribute")
    out = []
    for name in names:
        if name in SCHEDULERS and (noise_sigma is not None or name not in POLICIES):
            r = replay(jobs, inv, table, name, sigma=sigma, seed=seed)
            out.append(dataclasses.replace(r, policy=f"{name} (sigma {sigma:g})" if sigma else f"{name} (oracle, sigma 0)"))
        else:
            out.append(simulate(jobs, inv, table, name))
    return out


def _trace_format(path: str) -> str:
    from heteroflow.pipelines.traces import trace_format

    return trace_format(path)


def simulate_command(
    trace: Annotated[str, typer.Option("--trace", help="Trace file (CSV with a header, or Gavel's TSV), or gavel:JOBS:JOBS_PER_HOUR:SEED to generate one with Gavel's arrival process.")],
    inventory: Annotated[str, typer.Option("--inventory", help="Inventory YAML, or 'gavel' (36 K80 + 36 P100 + 36 V100) or 'pai' (the Alibaba PAI machine list).")] = "gavel",
    policy: Annotated[Optional[list[str]], typer.Option("--policy", help="Policy name or module:attribute; repeat to compare (default: every baseline and throughput). Pod packing: fgd, bestfit, firstfit, dotprod, gpupacking, leastloaded, power-aware, random (default: fgd for shared GPUs, bestfit, random).")] = None,
    throughputs: Annotated[Optional[Path], typer.Option("--throughputs", help="Throughput table CSV (model,scale_factor,<model>_steps_per_s...). Default: Gavel's measurements.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a utilization-over-time plot (PNG; needs matplotlib, the 'sim' extra).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write every policy's summary as JSON.")] = None,
    explain: Annotated[int, typer.Option("--explain", help="Print the first N placement explanations of each policy.")] = 0,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Pod packing (an Alibaba 2023 pod list or a Pollux workload): seeds 0..N-1, median reported.")] = 1,
    noise_sigma: Annotated[Optional[float], typer.Option("--noise-sigma", min=0.0, help="Job replay without foreknowledge (heteroflow.pipelines.jct): schedulers see each job's work estimated with log-normal noise of this sigma (0: the oracle); with it the default policies are the replay's schedulers fifo, static, gavel-style, heteroflow. Naming fifo, gavel-style or heteroflow as --policy selects that replay too (sigma 0.5).")] = None,
) -> None:
    """Replay a trace: average and p99 JCT, makespan, utilization per device model, queueing delay, cost, energy.

    The trace's format is detected: heteroflow's job CSV, Gavel's TSV and the Philly trace replay jobs over time;
    an Alibaba 2023 pod list or a Pollux workload packs pods onto nodes (--inventory: an Alibaba 2023 node list or an
    inventory YAML with each node's cpu and memory) until the arrived GPU demand reaches the capacity, and prints
    the share of GPUs each packing policy leaves unallocated (default: fgd for shared GPUs, bestfit, random)."""
    from heteroflow.components.errors import HeteroflowError

    if _packing(trace, inventory, policy, seeds, json_out, explain):
        return
    from heteroflow.components.placement.clusters import gavel_throughputs
    from heteroflow.pipelines.simulate import lower_bound_makespan, plot_utilization

    try:
        table = gavel_throughputs(throughputs)
        inv = _inventory(inventory)
        jobs = _trace(trace, table, inv)
        results = _job_results(jobs, inv, table, policy, noise_sigma, trace)
    except (HeteroflowError, ValueError) as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    bound = lower_bound_makespan(jobs, inv, table)
    from heteroflow.components.devices import DeviceKind

    models = [m for m in inv.models if m != DeviceKind.host().value]  # the devices' models, not the host's
    headers = ["policy", "avg JCT h", "p99 JCT h", "makespan h", "/bound", "queueing h", *(f"util {m.removeprefix('nvidia-')}" for m in models), "cost", "energy kWh"]
    rows = [
        [r.policy, f"{r.avg_jct / 3600:.2f}", f"{r.p99_jct / 3600:.1f}", f"{r.makespan / 3600:.1f}",
         f"{r.makespan / bound:.2f}" if bound else "-", f"{r.avg_queueing / 3600:.2f}",
         *(f"{r.utilization.get(m, 0.0):.0%}" for m in models), f"{r.cost:,.0f}", f"{r.energy_kwh:,.0f}"]
        for r in results
    ]
    utils = [h for h in headers if h.startswith("util ")]
    _print_results(f"{len(jobs)} jobs on {inv.source}; makespan lower bound {bound / 3600:.1f} h", headers, rows, left=("policy",),
                   drop_order=["energy kWh", "cost", "queueing h", "/bound", *reversed(utils), "p99 JCT h", "makespan h"])
    for r in results:
        for line in r.explanations[:explain]:
            console.print(f"  {r.policy}: {escape(line)}", highlight=False)
    if plot is not None:
        plot_utilization(results, plot, title=f"{len(jobs)} jobs, {inv.source}")
        console.print(f"plot: {escape(str(plot))}", highlight=False)
    if json_out is not None:
        _write_json(json_out, {"bound_h": bound / 3600, "results": [r.summary() for r in results]})
