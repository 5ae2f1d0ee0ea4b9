"""Job traces for the discrete-event replay (:mod:`heteroflow.pipelines.simulate`): the job (:class:`SimJob`), Gavel's
arrival process (:func:`generate_gavel_trace`), the Philly trace (:func:`philly_trace`), and the trace files
(:func:`read_trace`, :func:`write_trace`).

Trace files: CSV with a header (``name,arrival_s,job_type,scale_factor,total_steps`` and optionally ``queue``,
``priority``, ``model``, ``dataset``), Gavel's 7-column TSV (``job_type, command, num_steps_arg,
needs_data_dir, total_steps, arrival_time, scale_factor``), or the Philly trace as Pollux ships it
(``timestamp,duration,num_gpus,gpu_time,cluster``; see :func:`philly_trace`).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heteroflow.components.placement.policies import ClusterInventory, InvalidTrace, ThroughputTable

__all__ = ["SCALE_FACTORS", "SCALE_PROBABILITIES", "SimJob", "generate_gavel_trace", "philly_trace", "read_trace", "write_trace"]

@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SimJob:
    """One job of a trace.

    Attributes:
        name: unique in the trace.
        arrival: submission time, s.
        job_type: a row of the throughput table (e.g. ``ResNet-50 (batch size 64)``).
        scale_factor: devices it takes (1, 2, 4, 8).
        steps: total training steps.
        queue, priority: where it is submitted and its priority.
        model: the device model the job names (static binding); None: any.
        dataset: the data set it reads.
    """

    name: str
    arrival: float
    job_type: str
    scale_factor: int
    steps: float
    queue: str = "default"
    priority: int = 0
    model: str | None = None
    dataset: str | None = None


# --- traces ---------------------------------------------------------------------------------------------------

SCALE_FACTORS = (1, 2, 4, 8)
SCALE_PROBABILITIES = (0.70, 0.10, 0.15, 0.05)
"""Gavel's multi-GPU job mix (OSDI'20, section 7.1): 1/2/4/8 workers with probability 0.70/0.10/0.15/0.05."""


def generate_gavel_trace(n_jobs: int, *, jobs_per_hour: float, seed: int, table: ThroughputTable,
                         models: Sequence[str] | None = None) -> list[SimJob]:
    """Jobs following Gavel's arrival process (OSDI'20, section 7.1): Poisson arrivals at ``jobs_per_hour``;
    job type uniform over the table's types; scale factor 1/2/4/8 with probability 0.70/0.10/0.15/0.05 (types
    measured only on one worker stay at 1); duration ``10**x`` minutes on a V100 (Gavel's reference type), x
    uniform in [1.5, 3] with probability 0.8 and in [3, 4] otherwise; steps = duration x V100 steps/s. The model
    each job names (static binding) is drawn uniformly among the models that can run it: Gavel's traces name
    none.

    Args:
        n_jobs: how many jobs.
        jobs_per_hour: the Poisson rate.
        seed: numpy seed; the same seed gives the same trace.
        table: the throughput table.
        models: the models the named one is drawn from (default: the table's).
    """
    rng = np.random.default_rng(seed)
    types = table.job_types
    models = list(models or table.models)
    ref = "nvidia-v100" if "nvidia-v100" in table.models else table.models[-1]
    t = 0.0
    out: list[SimJob] = []
    for i in range(n_jobs):
        t += rng.exponential(3600.0 / jobs_per_hour)
        job_type = types[int(rng.integers(len(types)))]
        sf = int(rng.choice(SCALE_FACTORS, p=SCALE_PROBABILITIES))
        if (job_type, sf) not in table.rows:
            sf = 1
        x = rng.uniform(1.5, 3.0) if rng.uniform() < 0.8 else rng.uniform(3.0, 4.0)
        duration_s = 60.0 * 10**x
        tp = table.of(job_type, sf)
        runnable = [m for m in models if tp.get(m, 0.0) > 0]
        named = runnable[int(rng.integers(len(runnable)))] if runnable else None
        out.append(SimJob(name=f"job{i}", arrival=round(t, 3), job_type=job_type, scale_factor=sf,
                          steps=round(duration_s * tp[ref]), model=named))
    return out


def philly_trace(path: str | Path, *, table: ThroughputTable, seed: int = 0, cluster: str | None = None,
                 limit: int | None = None, reference_model: str = "nvidia-p100") -> list[SimJob]:
    """Jobs from the Microsoft Philly trace as Pollux ships it (``simulator/traces/philly.csv`` of
    petuum/adaptdl, Apache-2.0; the trace itself CC BY 4.0, Jeon et al., ATC'19): real submission times,
    durations and GPU counts. The trace names no job type nor GPU model, so, as Gavel does for its Philly-derived
    traces, each job's type is drawn (seeded) uniformly among the table's types measured at its scale factor, and
    its steps are its duration times that type's throughput on ``reference_model`` (the model the durations are
    taken to be measured on: an assumption, stated). GPU counts round up to the next measured scale factor
    (1, 2, 4, 8); larger jobs are capped at 8.

    Args:
        path: the CSV (``timestamp,duration,num_gpus,gpu_time,cluster``).
        table: the throughput table.
        seed: for the job types.
        cluster: keep only this virtual cluster (e.g. ``6214e9``); None: all.
        limit: keep the first ``limit`` jobs by submission time.
        reference_model: see above.

    Raises:
        InvalidTrace: a row that does not parse, a non-positive duration or GPU count (``FILE:LINE:``).
    """
    from datetime import datetime

    path = Path(path)
    rows: list[tuple[float, int, float, int]] = []
    try:
        fh = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise InvalidTrace(f"{path}: cannot read the trace ({exc.strerror or exc})") from None
    with fh:
        reader = csv.DictReader(fh)
        for lineno, row in enumerate(reader, start=2):
            if cluster is not None and row.get("cluster") != cluster:
                continue
            try:
                t = datetime.fromisoformat(row["timestamp"]).timestamp()
                duration = float(row["duration"])
                gpus = int(float(row["num_gpus"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise InvalidTrace(f"{path}:{lineno}: {exc}; a Philly row is timestamp,duration,num_gpus,gpu_time,cluster") from None
            if duration <= 0 or gpus <= 0:
                raise InvalidTrace(f"{path}:{lineno}: duration={duration}, num_gpus={gpus}; both must be positive")
            rows.append((t, gpus, duration, lineno))
    rows.sort()
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise InvalidTrace(f"{path}: no jobs" + (f" in cluster {cluster!r}" if cluster else ""))
    rng = np.random.default_rng(seed)
    by_scale: dict[int, list[str]] = {}
    for job_type, sf in sorted(table.rows):
        if table.of(job_type, sf).get(reference_model, 0.0) > 0:
            by_scale.setdefault(sf, []).append(job_type)
    t0 = rows[0][0]
    out = []
    for i, (t, gpus, duration, _line) in enumerate(rows):
        sf = next((s for s in sorted(by_scale) if s >= gpus), max(by_scale))
        types = by_scale[sf]
        job_type = types[int(rng.integers(len(types)))]
        out.append(SimJob(name=f"philly{i}", arrival=t - t0, job_type=job_type, scale_factor=sf,
                          steps=duration * table.of(job_type, sf)[reference_model]))
    return out


_CSV_REQUIRED = ("name", "arrival_s", "job_type", "scale_factor", "total_steps")
_CSV_OPTIONAL = ("queue", "priority", "model", "dataset")


def write_trace(jobs: Sequence[SimJob], path: str | Path) -> None:
    """Write ``jobs`` as the CSV trace format :func:`read_trace` reads."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(_CSV_REQUIRED + _CSV_OPTIONAL)
        for j in jobs:
            w.writerow([j.name, j.arrival, j.job_type, j.scale_factor, j.steps, j.queue, j.priority, j.model or "", j.dataset or ""])


def read_trace(path: str | Path, *, table: ThroughputTable, inventory: ClusterInventory | None = None) -> list[SimJob]:
    """Read a trace (CSV with a header, or Gavel's 7-column TSV) and check it against the table and inventory.

    Raises:
        InvalidTrace: ``FILE:LINE:`` and what is wrong: a missing column, a number that does not parse, a negative
            or zero count, a job type or scale factor not in the throughput table, a model not in the registry or
            the inventory, a queue not in the inventory, a duplicate job name.
    """
    from heteroflow.components.placement.inventory import InvalidInventory, model_key

    from heteroflow.components.data.csvformat import file_not_text

    path = Path(path)
    binary = file_not_text(path)
    if binary:
        raise InvalidTrace(f"{path}: not a text trace: {binary}; a trace is a CSV (or Gavel's TSV) text file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidTrace(f"{path}: cannot read the trace ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise InvalidTrace(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the trace as UTF-8") from None
    lines = text.splitlines()
    if not lines:
        raise InvalidTrace(f"{path}: empty trace")
    if lines[0].startswith("timestamp,duration,num_gpus"):
        return philly_trace(path, table=table)
    gavel = "\t" in lines[0] and not lines[0].startswith("name")
    rows: list[tuple[int, dict[str, str]]] = []
    if gavel:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) != 7:
                raise InvalidTrace(f"{path}:{lineno}: {len(cols)} columns; Gavel's trace has 7 (job_type, command, "
                                   "num_steps_arg, needs_data_dir, total_steps, arrival_time, scale_factor)")
            rows.append((lineno, {"name": f"job{len(rows)}", "job_type": cols[0], "total_steps": cols[4],
                                  "arrival_s": cols[5], "scale_factor": cols[6]}))
    else:
        reader = csv.DictReader(lines)
        missing = [c for c in _CSV_REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise InvalidTrace(f"{path}:1: missing column(s) {', '.join(missing)}; valid header: "
                               f"{','.join(_CSV_REQUIRED)}[,{','.join(_CSV_OPTIONAL)}]")
        for i, row in enumerate(reader, start=2):
            rows.append((i, row))
    models = set(inventory.models) if inventory is not None else set(table.models)
    out: list[SimJob] = []
    names: dict[str, int] = {}
    for lineno, row in rows:
        where = f"{path}:{lineno}: "
        try:
            arrival = float(row["arrival_s"])
            sf = int(row["scale_factor"])
            steps = float(row["total_steps"])
            priority = int(row.get("priority") or 0)
        except (TypeError, ValueError) as exc:
            raise InvalidTrace(f"{where}{exc}; arrival_s, total_steps are numbers, scale_factor and priority integers") from None
        if not math.isfinite(arrival) or arrival < 0:
            what = "is negative" if math.isfinite(arrival) else "is not a finite number"  # nan read as 'negative'
            raise InvalidTrace(f"{where}arrival_s={arrival} {what}; valid: seconds >= 0")
        if sf <= 0:
            raise InvalidTrace(f"{where}scale_factor={sf} is not a device count; valid: an integer >= 1")
        if not math.isfinite(steps) or steps <= 0:
            what = "is not positive" if math.isfinite(steps) else "is not a finite number"
            raise InvalidTrace(f"{where}total_steps={steps} {what}; valid: a number of steps > 0")
        job_type = row["job_type"]
        if (job_type, sf) not in table.rows:
            known = sorted({s for t, s in table.rows if t == job_type})
            hint = f"; it has scale factors {known}" if known else f"; valid types: {', '.join(table.job_types)}"
            raise InvalidTrace(f"{where}job_type={job_type!r} with scale_factor={sf} is not in the throughput table{hint}")
        model = (row.get("model") or "").strip() or None
        if model is not None:
            try:
                model = model_key(model, field="model")
            except InvalidInventory as exc:
                raise InvalidTrace(f"{where}{exc}") from None
            if model not in models:
                raise InvalidTrace(f"{where}model={model!r} is not in the inventory; valid: {', '.join(sorted(models))}")
        queue = (row.get("queue") or "").strip() or "default"
        if inventory is not None:
            inventory.queue(queue) if queue == "default" else None
            if queue != "default" and queue not in inventory.queues:
                raise InvalidTrace(f"{where}queue={queue!r} is not in the inventory; valid: default, {', '.join(sorted(inventory.queues))}")
        name = row.get("name") or f"job{len(out)}"
        if name in names:
            raise InvalidTrace(f"{where}name={name!r} duplicates line {names[name]}")
        names[name] = lineno
        out.append(SimJob(name=name, arrival=arrival, job_type=job_type, scale_factor=sf, steps=steps, queue=queue,
                          priority=priority, model=model, dataset=(row.get("dataset") or "").strip() or None))
    return out


# --- format detection (issue 30) ------------------------------------------------------------------------------

POLLUX_WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
"""Pollux's workload CSV (petuum/adaptdl ``simulator/workloads/workload-N.csv``)."""


def trace_format(path: str | Path) -> str:
    """What a trace file is, from its first line: ``alibaba-pods`` / ``alibaba-nodes`` (Alibaba 2023 pod or node
    list), ``pollux-workload`` (Pollux's workload CSV), ``philly`` (the Philly trace as Pollux ships it), ``gavel``
    (Gavel's TSV) or ``csv`` (heteroflow's job CSV, ``name,arrival_s,job_type,scale_factor,total_steps``).

    Raises:
        InvalidTrace: unreadable or empty file.
    """
    from heteroflow.pipelines.alibaba import detect_csv

    from heteroflow.components.data.csvformat import file_not_text

    p = Path(path)
    binary = file_not_text(p)
    if binary:  # said "'utf-8' codec can't decode byte 0x92 in position 1", naming no file
        raise InvalidTrace(f"{p}: not a text trace: {binary}; a trace is a CSV (or Gavel's TSV) text file")
    try:
        with p.open(encoding="utf-8") as f:
            first = f.readline().strip()
    except OSError as exc:
        raise InvalidTrace(f"{p}: cannot read the trace ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise InvalidTrace(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the trace as UTF-8") from None
    if not first:
        raise InvalidTrace(f"{p}: empty trace")
    cols = {c.strip() for c in first.split(",")}
    alibaba = detect_csv(p)
    if alibaba:
        return alibaba
    if set(POLLUX_WORKLOAD_COLUMNS) <= cols:
        return "pollux-workload"
    if first.startswith("timestamp,duration,num_gpus"):
        return "philly"
    if "\t" in first and not first.startswith("name"):
        return "gavel"
    return "csv"


def read_pollux_workload(path: str | Path) -> list:
    """Pollux's workload CSV as resource requests for a packing replay: each job asks for ``num_replicas`` whole
    GPUs, spread over nodes (Pollux places replicas across nodes); CPU and memory are not stated (0).

    Returns:
        :class:`~heteroflow.components.placement.vectors.Request` values, in file order.

    Raises:
        InvalidTrace: a missing column (named) or a bad ``num_replicas`` (file and line named).
    """
    from heteroflow.components.placement.vectors import Request

    p = Path(path)
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("name", "num_replicas") if c not in (reader.fieldnames or [])]
        if missing:
            raise InvalidTrace(f"{p}:1: missing column(s) {', '.join(missing)}; Pollux's workload has {', '.join(POLLUX_WORKLOAD_COLUMNS)}")
        out = []
        for lineno, row in enumerate(reader, start=2):
            try:
                n = int(row["num_replicas"])
            except (TypeError, ValueError):
                n = 0
            if n < 1:
                raise InvalidTrace(f"{p}:{lineno}: num_replicas={row.get('num_replicas')!r}; valid: an integer >= 1")
            out.append(Request(name=row["name"], num_gpu=n, gpu_milli=1000, single_node=False))
    return out
