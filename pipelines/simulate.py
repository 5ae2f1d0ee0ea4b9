"""Discrete-event replay of a job trace on an inventory under a placement policy (the plan step's policies).

Events are arrivals and completions (and, for a preemptive policy, re-allocations at each of them); between two
events nothing changes, so the replay costs O(events x placement round), not O(simulated time). Every policy in
:mod:`heteroflow.components.placement.policies` runs here through the same :func:`~heteroflow.components.placement.policies.place_round`
the plan step calls; the Gavel-style policy runs its fluid allocation (:func:`max_min_allocation`).

Model (stated so results can be judged):
- a job of scale factor k holds k devices of one model from its start to its end at the throughput Gavel
  measured for k workers of its type on that model (steps/s); non-preemptive policies never move a running job,
  except a queue *reclaim* (Volcano semantics), which preempts it and later resumes it from where it stopped
  (checkpoint-resume; restart overhead not modelled);
- the Gavel-style policy shares time between jobs (its allocation X, re-solved at every event), like Gavel's
  6-minute rounds in the limit of short rounds; no preemption overhead; a queue's ``capability`` bounds what its
  jobs hold together (a constraint of X), and a job larger than it never starts (an error naming the capability);
- power: a node is on while any device on it is busy (idle nodes are powered down), drawing ``idle_watts`` plus
  ``busy_watts`` per busy device; for the time-sharing policy, busy devices are assumed packed on as few nodes as
  possible; cost: busy device-hours at each node's price per device.

The jobs and their trace files (reading, writing, Gavel's arrival process, the Philly trace) are in
:mod:`heteroflow.pipelines.traces`; their names are also importable from here.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heteroflow.components.devices import DeviceKind
from heteroflow.components.placement.clusters import InvalidTrace, ThroughputTable
from heteroflow.components.placement.inventory import PlacementInventory as ClusterInventory
from heteroflow.components.placement.policies import get_policy, max_min_allocation
from heteroflow.components.placement.rounds import Running, place_round, reclaim
from heteroflow.components.placement.state import Job, PlacementState
from heteroflow.pipelines.traces import (
    SCALE_FACTORS,
    SCALE_PROBABILITIES,
    SimJob,
    generate_gavel_trace,
    philly_trace,
    read_trace,
    write_trace,
)

__all__ = ["SimJob", "SimResult", "generate_gavel_trace", "philly_trace", "lower_bound_makespan", "plot_utilization", "read_trace",
           "simulate", "write_trace"]


# --- results --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class SimResult:
    """What a replay measured.

    Attributes:
        policy: the policy's name.
        jct: per job, completion time minus arrival, s.
        queueing: per job, first start minus arrival, s.
        finish: per job, completion time, s.
        model: per job, the model it (last) ran on (``mixed`` when time-shared across models).
        makespan: last completion minus first arrival, s.
        utilization: per model, busy device-seconds over (devices x makespan).
        cost: busy device-hours times each node's price per device-hour.
        energy_kwh: energy of powered-on nodes, kWh.
        timeline: (times s, busy devices per model (shape (len(times), len(models)))), a step function.
        models: the models, the timeline's columns.
        preemptions: jobs preempted by reclaim.
        explanations: the first decisions' one-line explanations (at most 50), for reading.
        events: events processed.
    """

    policy: str
    jct: dict[str, float]
    queueing: dict[str, float]
    finish: dict[str, float]
    model: dict[str, str]
    makespan: float
    utilization: dict[str, float]
    cost: float
    energy_kwh: float
    timeline: tuple[np.ndarray, np.ndarray]
    models: tuple[str, ...]
    preemptions: int = 0
    explanations: list[str] = dataclasses.field(default_factory=list)
    events: int = 0

    @property
    def avg_jct(self) -> float:
        return float(np.mean(list(self.jct.values()))) if self.jct else 0.0

    @property
    def p99_jct(self) -> float:
        return float(np.percentile(list(self.jct.values()), 99)) if self.jct else 0.0

    @property
    def avg_queueing(self) -> float:
        return float(np.mean(list(self.queueing.values()))) if self.queueing else 0.0

    def summary(self) -> dict[str, Any]:
        """The headline figures (JSON-ready): hours for times, utilization as fractions."""
        return {
            "policy": self.policy, "jobs": len(self.jct), "avg_jct_h": self.avg_jct / 3600, "p99_jct_h": self.p99_jct / 3600,
            "makespan_h": self.makespan / 3600, "avg_queueing_h": self.avg_queueing / 3600,
            "utilization": {m: round(u, 4) for m, u in self.utilization.items()}, "cost": self.cost,
            "energy_kwh": self.energy_kwh, "preemptions": self.preemptions, "events": self.events,
        }


def lower_bound_makespan(jobs: Sequence[SimJob], inventory: ClusterInventory, table: ThroughputTable) -> float:
    """A lower bound on the makespan, s: the larger of (a) the latest ``arrival + duration at the job's best
    throughput`` and (b) the total work at each job's best throughput (device-seconds) over the cluster's devices,
    both measured from the first arrival."""
    if not jobs:
        return 0.0
    models = set(inventory.models)
    t0 = min(j.arrival for j in jobs)
    latest, work = 0.0, 0.0
    for j in jobs:
        tp = table.of(j.job_type, j.scale_factor)
        best = max((v for m, v in tp.items() if m in models), default=0.0)
        d = j.steps / best
        latest = max(latest, j.arrival - t0 + d)
        work += d * j.scale_factor
    return max(latest, work / max(inventory.total_devices(), 1))


# --- the replay -----------------------------------------------------------------------------------------------


def _throughputs(jobs: Sequence[SimJob], models: Sequence[str], table: ThroughputTable) -> dict[str, dict[str, float]]:
    cache: dict[tuple[str, int], dict[str, float]] = {}
    out = {}
    for j in jobs:
        key = (j.job_type, j.scale_factor)
        if key not in cache:
            tp = table.of(*key)
            cache[key] = {m: tp.get(m, 0.0) for m in models}
        out[j.name] = cache[key]
    return out


def simulate(jobs: Sequence[SimJob], inventory: ClusterInventory, table: ThroughputTable, policy: str = "throughput") -> SimResult:
    """Replay ``jobs`` on ``inventory`` under ``policy`` (a name in
    :data:`~heteroflow.components.placement.policies.POLICIES` or ``module:attribute``).

    Deterministic: the same inputs give the same result (ties broken by name and index).

    Raises:
        InvalidTrace: a job that no model of the inventory can run, or that needs more devices than any model has.
    """
    pol = get_policy(policy)
    models = inventory.models
    tps = _throughputs(jobs, models, table)
    cap = inventory.capacity()
    for j in jobs:
        if not any(v > 0 and cap.get(m, 0) >= j.scale_factor for m, v in tps[j.name].items()):
            measured = sorted(m for m, v in tps[j.name].items() if v > 0)
            raise InvalidTrace(f"job {j.name} ({j.job_type} x{j.scale_factor}): no model of the inventory can run it "
                               f"with {j.scale_factor} devices; the inventory has {cap}; the throughput table measured "
                               f"{j.job_type} on {', '.join(measured) or 'none of its models'}: give --throughputs FILE, a "
                               "CSV like Gavel's (model,scale_factor,<model>_steps_per_s...: a column of steps/s per "
                               "inventory model, a row per job type and scale factor), or an inventory of the measured models")
    if pol.preemptive:
        return _simulate_fluid(jobs, inventory, tps, pol.name)
    return _simulate_events(jobs, inventory, tps, pol)


class _Meter:
    """Integrates busy devices, powered-on nodes' power and cost between events."""

    def __init__(self, inventory: ClusterInventory, models: Sequence[str]) -> None:
        self.models = list(models)
        self.index = {m: i for i, m in enumerate(models)}
        self.times: list[float] = []
        self.busy: list[np.ndarray] = []
        self.busy_seconds = np.zeros(len(models))
        self.energy_j = 0.0
        self.cost = 0.0
        self.last_t: float | None = None
        self.last_busy = np.zeros(len(models))
        self.last_power = 0.0
        self.last_cost_rate = 0.0

    def record(self, t: float, busy: np.ndarray, power_w: float, cost_per_s: float) -> None:
        if self.last_t is not None:
            dt = t - self.last_t
            self.busy_seconds += self.last_busy * dt
            self.energy_j += self.last_power * dt
            self.cost += self.last_cost_rate * dt
        self.last_t, self.last_busy, self.last_power, self.last_cost_rate = t, busy.copy(), power_w, cost_per_s
        if self.times and self.times[-1] == t:
            self.busy[-1] = busy.copy()
        else:
            self.times.append(t)
            self.busy.append(busy.copy())


def _finish(policy: str, meter: _Meter, inventory: ClusterInventory, jobs: Sequence[SimJob], start: dict[str, float],
            finish: dict[str, float], where: dict[str, str], preemptions: int, explanations: list[str], events: int) -> SimResult:
    t0 = min(j.arrival for j in jobs) if jobs else 0.0
    makespan = (max(finish.values()) - t0) if finish else 0.0
    cap = inventory.capacity()
    util = {m: float(meter.busy_seconds[i] / (cap[m] * makespan)) if cap.get(m) and makespan > 0 else 0.0
            for i, m in enumerate(meter.models) if m != DeviceKind.host().value}  # devices, not the host CPU
    return SimResult(
        policy=policy,
        jct={j.name: finish[j.name] - j.arrival for j in jobs},
        queueing={j.name: start[j.name] - j.arrival for j in jobs},
        finish=dict(finish), model=dict(where), makespan=makespan, utilization=util, cost=meter.cost,
        energy_kwh=meter.energy_j / 3.6e6, timeline=(np.array(meter.times), np.array(meter.busy)),
        models=tuple(meter.models), preemptions=preemptions, explanations=explanations[:50], events=events,
    )


def _simulate_events(jobs: Sequence[SimJob], inventory: ClusterInventory, tps: Mapping[str, Mapping[str, float]], pol: Any) -> SimResult:
    state = PlacementState(inventory)
    models = state.models
    meter = _Meter(inventory, models)
    by_name = {j.name: j for j in jobs}
    heap: list[tuple[float, int, int, str, int]] = []  # (time, kind 0=finish 1=arrival, seq, name, version)
    for seq, j in enumerate(sorted(jobs, key=lambda j: (j.arrival, j.name))):
        heapq.heappush(heap, (j.arrival, 1, seq, j.name, 0))
    seq = len(jobs)
    remaining = {j.name: float(j.steps) for j in jobs}
    pending: dict[str, None] = {}
    running: dict[str, tuple[Running, str, float, float, int]] = {}  # name -> (Running, model, start, finish, version)
    version: dict[str, int] = {}
    start: dict[str, float] = {}
    finish: dict[str, float] = {}
    where: dict[str, str] = {}
    explanations: list[str] = []
    last_why: dict[str, str] = {}  # per waiting job, its last decision's explanation
    preemptions = 0
    events = 0
    node_idle = np.array([n.idle_watts for n in inventory.nodes])
    node_busy_w = np.array([n.busy_watts for n in inventory.nodes])
    node_price = state.cost / 3600.0  # per device-second
    has_queues = bool(inventory.queues)

    def job_of(name: str) -> Job:
        sj = by_name[name]
        return Job(name=name, count=sj.scale_factor, queue=sj.queue, priority=sj.priority, throughput=tps[name],
                   steps=remaining[name], requested_model=sj.model, dataset=sj.dataset, arrival=sj.arrival)

    def release(name: str, now: float) -> None:
        r, model, st, _f, _v = running.pop(name)
        state.give_back(r.job, model, r.nodes)  # its devices, and its queue's use of its model, kind and any model
        remaining[name] = max(remaining[name] - (now - st) * tps[name][model], 0.0)

    while heap:
        now = heap[0][0]
        while heap and heap[0][0] == now:
            t, kind, _s, name, ver = heapq.heappop(heap)
            events += 1
            if kind == 1:
                pending[name] = None
            elif name in running and running[name][4] == ver:
                release(name, now)
                finish[name] = now
        state.now = now
        if pending:
            if pol.wait_for_faster:
                free_at: dict[str, list[float]] = {m: [] for m in models}
                free_per_model = state.free_per_model()
                for i, m in enumerate(models):
                    free_at[m].extend([now] * int(free_per_model[i]))
                for r, m, _st, f, _v in running.values():
                    free_at[m].extend([f] * r.job.count)
                state.device_free_at = {m: np.array(v) for m, v in free_at.items() if v}
            decisions = place_round([job_of(n) for n in pending], state, pol)
            if has_queues:
                waiting = [d for d in decisions if not d.placed]
                for d in waiting:
                    job = job_of(d.job)
                    victims, why = reclaim(job, [v[0] for v in running.values()], state)
                    if not victims:
                        continue
                    for v in victims:
                        release(v.job.name, now)
                        pending[v.job.name] = None
                        preemptions += 1
                    if len(explanations) < 200:
                        explanations.append(why)
                    decisions += place_round([job_of(d.job)], state, pol)
            for d in decisions:
                if len(explanations) < 200:
                    explanations.append(f"t={now / 3600:.2f} h {d.explanation}")
                if not d.placed:
                    last_why[d.job] = d.explanation
                    continue
                assert d.model is not None
                pending.pop(d.job, None)
                job = job_of(d.job)
                start.setdefault(d.job, now)
                where[d.job] = d.model
                end = now + remaining[d.job] / tps[d.job][d.model]
                version[d.job] = version.get(d.job, 0) + 1
                running[d.job] = (Running(job=job, nodes=d.nodes, started=now, borrowed=d.borrowed), d.model, now, end, version[d.job])
                seq += 1
                heapq.heappush(heap, (end, 0, seq, d.job, version[d.job]))
        busy_nodes = state.capacity - state.free
        busy = np.bincount(state.model_of, weights=busy_nodes, minlength=len(models))
        on = busy_nodes > 0
        power = float(node_idle[on].sum() + (node_busy_w * busy_nodes).sum())
        meter.record(now, busy, power, float((node_price * busy_nodes).sum()))
    if pending:
        reasons = "; ".join(last_why.get(n, f"{n} waits") for n in list(pending)[:5])
        raise InvalidTrace(f"{len(pending)} job(s) never started under {pol.name}: {reasons} ({len(finish)} other job(s) finished)")
    return _finish(pol.name, meter, inventory, jobs, start, finish, where, preemptions, explanations, events)


def _simulate_fluid(jobs: Sequence[SimJob], inventory: ClusterInventory, tps: Mapping[str, Mapping[str, float]], name: str) -> SimResult:
    models = inventory.models
    meter = _Meter(inventory, models)
    cap = inventory.capacity()
    capacity = np.array([cap[m] for m in models], dtype=float)
    per_node = {m: next(n for n in inventory.nodes if n.model == m) for m in models}
    node_devices = np.array([max(per_node[m].devices, 1) for m in models], dtype=float)
    node_idle = np.array([per_node[m].idle_watts for m in models])
    busy_w = np.array([per_node[m].busy_watts for m in models])
    price = np.array([per_node[m].cost_per_hour / max(per_node[m].devices, 1) / 3600.0 for m in models])
    order = sorted(jobs, key=lambda j: (j.arrival, j.name))
    remaining = {j.name: float(j.steps) for j in jobs}
    from heteroflow.components.devices.registry import has_devices
    from heteroflow.components.placement.views import ANY_DEVICES, within

    capability: dict[str, float] = {}  # devices of any model
    keyed: list[tuple[str, str, np.ndarray, float]] = []  # per model or device kind: (queue, key, models it holds, devices)
    for q in inventory.queues.values():
        for key, c in q.limits().items():
            if key == ANY_DEVICES:
                capability[q.name] = float(c)
            elif key not in ("cpu", "memory"):  # the jobs of a replay ask for no CPU or memory
                keyed.append((q.name, key, np.array([has_devices(m) and within(key, m) for m in models]), float(c)))
    total = float(capacity.sum())
    for q in inventory.queues.values():  # a queue that is not reclaimable may not use what others are guaranteed
        if not q.reclaimable:
            others = sum(o.guarantee for o in inventory.queues.values() if o.name != q.name)
            capability[q.name] = min(capability.get(q.name, math.inf), max(total - others, float(q.guarantee)))
    # Volcano: a job larger than its queue's capability never starts (volcano-sh/volcano#1331); the rest run
    never = {j.name: f"{j.name}: queue {j.queue}'s capability {capability[j.queue]:g} is below the {j.scale_factor} device(s) it needs"
             for j in order if j.scale_factor > capability.get(j.queue, math.inf)}
    for j in order:  # and one that no model it runs on admits under the queue's per-model or per-kind limits
        runs = np.array([tps[j.name].get(m, 0.0) > 0 for m in models])
        held = [(key, c, mask) for q, key, mask, c in keyed if q == j.queue and j.scale_factor > c]
        if j.name not in never and held and runs.any() and all(any(mask[i] for _k, _c, mask in held) for i in np.flatnonzero(runs)):
            key, c, _mask = held[0]
            never[j.name] = f"{j.name}: queue {j.queue}'s capability.{key}={c:g} is below the {j.scale_factor} device(s) it needs"
    order = [j for j in order if j.name not in never]
    active: list[SimJob] = []
    start: dict[str, float] = {}
    finish: dict[str, float] = {}
    where: dict[str, str] = {}
    i = 0
    now = order[0].arrival if order else 0.0
    events = 0
    eps = 1e-9
    while i < len(order) or active:
        while i < len(order) and order[i].arrival <= now + eps:
            active.append(order[i])
            i += 1
            events += 1
        if not active:
            now = order[i].arrival
            continue
        tp = np.array([[tps[j.name][m] for m in models] for j in active])
        scale = np.array([j.scale_factor for j in active], dtype=float)
        limits: list[tuple] = [(np.array([j.queue == q for j in active]), float(c)) for q, c in capability.items()
                               if any(j.queue == q for j in active)]
        limits += [(np.array([j.queue == q for j in active]), c, mask) for q, _key, mask, c in keyed
                   if any(j.queue == q for j in active)]
        x = max_min_allocation(tp, scale, capacity, limits=limits)
        rate = (x * tp).sum(axis=1)
        busy = (x * scale[:, None]).sum(axis=0)
        nodes_on = np.ceil(busy / node_devices - 1e-9)
        power = float((nodes_on * node_idle).sum() + (busy * busy_w).sum())
        meter.record(now, busy, power, float((busy * price).sum()))
        for k, j in enumerate(active):
            if rate[k] > 0 and j.name not in start:
                start[j.name] = now
        rem = np.array([remaining[j.name] for j in active])
        with np.errstate(divide="ignore"):
            to_done = np.where(rate > 0, rem / np.maximum(rate, 1e-300), np.inf)
        next_arrival = order[i].arrival if i < len(order) else np.inf
        dt = min(float(to_done.min()), next_arrival - now)
        if not math.isfinite(dt):
            raise InvalidTrace(f"{len(active)} job(s) can make no progress under {name}")
        now += dt
        keep: list[SimJob] = []
        for k, j in enumerate(active):
            remaining[j.name] -= rate[k] * dt
            if x[k].sum() > 0:
                where[j.name] = models[int(np.argmax(x[k]))]  # the model it spent most of this interval on
            if remaining[j.name] <= max(1e-6 * j.steps, 1e-9) or to_done[k] <= dt + 1e-9:
                finish[j.name] = now
                events += 1
            else:
                keep.append(j)
        active = keep
    meter.record(now, np.zeros(len(models)), 0.0, 0.0)
    if never:
        raise InvalidTrace(f"{len(never)} job(s) never started under {name}: {'; '.join(list(never.values())[:5])} "
                           f"({len(finish)} other job(s) finished)")
    return _finish(name, meter, inventory, jobs, start, finish, where, 0, [], events)


def plot_utilization(results: Sequence[SimResult], path: str | Path, *, title: str = "") -> Path:
    """A step plot of busy devices over time (hours) per model, one panel per policy; written to ``path`` (PNG).

    Raises:
        ImportError: matplotlib is not installed (the ``sim`` extra).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.2 * len(results) + 0.6), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        times, busy = r.timeline
        for k, m in enumerate(r.models):
            if m != DeviceKind.host().value and busy.size:
                ax.step(times / 3600, busy[:, k], where="post", label=m.removeprefix("nvidia-"))
        ax.set_ylabel("busy devices")
        ax.set_title(f"{r.policy}: avg JCT {r.avg_jct / 3600:.1f} h, makespan {r.makespan / 3600:.1f} h", fontsize=9)
        ax.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("time (h)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    tmp.replace(path)
    return path
