"""Job-completion-time replay without foreknowledge: every scheduler sees the same estimates, never the truth.

A trace's jobs (:class:`~heteroflow.pipelines.traces.SimJob`) carry their true work (``steps``). This replay keeps
that number to itself: a scheduler sees each job as a :class:`JobView` holding the job's *estimated* work (its
declared steps divided by its profiled throughput gives its estimated duration on each model), its profiled
throughput per model (Gavel's measured table), what it has attained so far, and its queue. Reading
:attr:`JobView.true_steps` raises :class:`ForeknowledgeError`; only the replay's clock uses the truth, to decide
when a job finishes.

Noise model (stated, so a figure can be judged): today's trace generator derives a job's steps from its true
duration, so an estimate taken from them would be the oracle in disguise. The estimate is the true work times
``exp(e)``, ``e ~ Normal(0, sigma^2)`` drawn once per job (log-normal multiplicative noise, median-unbiased; seeded
by the trace seed and independent of the trace). ``sigma=0`` is the oracle.

Model: a job of scale factor k runs on k devices of one model (or, for the fluid Gavel-style policy, on time
fractions of models) at the table's throughput for k workers there; placement is per model (node packing is the
node-level policies' business). A preemptive scheduler may stop a running job and resume it later from where it
stopped; every resume after a preemption, and every move to another model, costs ``restart_s`` seconds without
progress (checkpoint save and load; 60 s by default, an assumption). The fluid Gavel-style baseline reallocates
at every arrival and completion at no cost (the limit of short rounds: optimistic for it). Queues are Volcano
``Queue`` s (:mod:`heteroflow.components.placement.policies`): no scheduler lets a queue use more devices than its
``capability``; queues under their ``guarantee`` go first; a job that can never start raises
:class:`~heteroflow.components.placement.clusters.InvalidTrace` naming the limit that holds it.

Schedulers (:data:`SCHEDULERS`): ``fifo`` (heterogeneity-agnostic FIFO, Gavel's baseline: arrival order, the model
with the most free devices, later jobs backfill), ``static`` (FIFO with static binding: only the model the job
names at submission), ``gavel-style`` (Gavel's max-min fairness over throughput-normalised shares, fluid; it uses
throughputs only, no durations) and ``heteroflow`` (:class:`HeteroflowScheduler`).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from heteroflow.components.placement.clusters import InvalidTrace, ThroughputTable
from heteroflow.components.placement.inventory import PlacementInventory as ClusterInventory
from heteroflow.components.placement.policies import max_min_allocation
from heteroflow.pipelines.simulate import SimResult, _finish, _Meter, _throughputs
from heteroflow.pipelines.traces import SimJob

__all__ = ["SCHEDULERS", "ClusterView", "ForeknowledgeError", "HeteroflowScheduler", "InvalidAllocation", "JobView", "Scheduler",
           "estimate_steps", "replay"]

RESTART_S = 60.0
"""Seconds without progress on each resume after a preemption or move to another model (an assumption)."""
ROUND_S = 360.0
"""A preemptive scheduler re-plans at least this often while jobs wait: Gavel's 6-minute round."""


class ForeknowledgeError(RuntimeError):
    """A scheduler tried to read a job's true work: only the replay's clock may."""


class InvalidAllocation(RuntimeError):
    """A scheduler allocated more than a model's devices, a queue's capability or a job's whole time."""


def estimate_steps(jobs: Sequence[SimJob], *, sigma: float, seed: int) -> dict[str, float]:
    """Each job's estimated work, steps: its true steps times ``exp(e)``, ``e ~ Normal(0, sigma^2)`` (log-normal
    multiplicative noise), one draw per job in trace order from ``numpy.random.default_rng([seed, 7919])``.

    Raises:
        ValueError: ``sigma`` negative.
    """
    if sigma < 0 or not math.isfinite(sigma):
        raise ValueError(f"sigma={sigma} is not a standard deviation; valid: a number >= 0")
    rng = np.random.default_rng([seed, 7919])
    noise = rng.normal(0.0, 1.0, size=len(jobs)) * sigma
    return {j.name: float(j.steps) * float(np.exp(e)) for j, e in zip(jobs, noise, strict=True)}


class JobView:
    """A job as a scheduler sees it: everything but its true work.

    Attributes:
        name, arrival (s), job_type, count (devices), queue, priority, model (the model named at submission, or None).
        throughput: steps/s of the job (``count`` workers) per model, from the profiled table; 0 = cannot run.
        estimated_steps: the job's estimated total work, steps (see the module's noise model).
        attained_steps: steps done so far.
        attained_device_s: device-seconds it has held so far (Tiresias' attained service).
        running_on: per model, the time fraction it holds now (empty while it waits).
        started: whether it has run at all.
    """

    __slots__ = ("name", "arrival", "job_type", "count", "queue", "priority", "model", "throughput", "estimated_steps",
                 "attained_steps", "attained_device_s", "running_on", "started")

    def __init__(self, job: SimJob, throughput: Mapping[str, float], estimated_steps: float) -> None:
        self.name = job.name
        self.arrival = job.arrival
        self.job_type = job.job_type
        self.count = job.scale_factor
        self.queue = job.queue
        self.priority = job.priority
        self.model = job.model
        self.throughput = dict(throughput)
        self.estimated_steps = float(estimated_steps)
        self.attained_steps = 0.0
        self.attained_device_s = 0.0
        self.running_on: dict[str, float] = {}
        self.started = False

    @property
    def true_steps(self) -> float:
        raise ForeknowledgeError(f"job {self.name}: its true work is hidden from schedulers; use estimated_steps")

    @property
    def best_throughput(self) -> float:
        return max(self.throughput.values(), default=0.0)

    def __repr__(self) -> str:
        return f"JobView({self.name}, x{self.count}, est {self.estimated_steps:.0f} steps, attained {self.attained_steps:.0f})"


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterView:
    """The cluster as a scheduler sees it: devices per model and the queues' limits (devices of any model)."""

    models: tuple[str, ...]
    capacity: Mapping[str, int]
    capability: Mapping[str, int | None]
    guarantee: Mapping[str, int]
    reclaimable: Mapping[str, bool] = dataclasses.field(default_factory=dict)

    def queue_limit(self, queue: str) -> int | None:
        return self.capability.get(queue)


Allocation = dict[str, dict[str, float]]
"""job name -> model -> time fraction (1.0 for a job that holds its devices)."""


class Scheduler(abc.ABC):
    """Chooses, at each event, which jobs hold which devices. Subclasses define :meth:`allocate`.

    Attributes:
        name: the registry name.
        fluid: allocations are time fractions re-solved at every event at no cost (no restart overhead).
        tick_s: re-plan at least this often while jobs wait (None: only at arrivals and completions).
        waiting: per waiting job, the limit that holds it (one line), filled by :meth:`allocate`.
    """

    name = "scheduler"
    fluid = False
    tick_s: float | None = None

    def __init__(self) -> None:
        self.waiting: dict[str, str] = {}

    @abc.abstractmethod
    def allocate(self, now: float, jobs: Sequence[JobView], cluster: ClusterView) -> Allocation:
        """The allocation at time ``now`` (seconds): job name -> model -> time fraction, for ``jobs`` (the
        arrived, unfinished ones) on ``cluster``."""

    # shared by the discrete schedulers: place jobs in a given order, keeping running ones where they are
    def _greedy(self, order: Sequence[JobView], cluster: ClusterView, pick) -> Allocation:
        free = dict(cluster.capacity)
        used: dict[str, int] = {}
        out: Allocation = {}
        self.waiting = {}
        for j in order:
            cap = cluster.queue_limit(j.queue)
            have = used.get(j.queue, 0)
            if cap is not None and have + j.count > cap:
                why = (f"queue {j.queue}'s capability {cap} is below the {j.count} device(s) it needs" if j.count > cap
                       else f"queue {j.queue} uses {have} of its capability {cap} device(s); +{j.count} would exceed it")
                self.waiting[j.name] = why
                continue
            runnable = [m for m in cluster.models if j.throughput.get(m, 0.0) > 0]
            if not any(cluster.capacity[m] >= j.count for m in runnable):
                self.waiting[j.name] = f"no model it can run on has {j.count} device(s)"
                continue
            reserved = sum(max(g - used.get(q, 0), 0) for q, g in cluster.guarantee.items() if q != j.queue)
            own_left = max(cluster.guarantee.get(j.queue, 0) - have, 0)
            if (not cluster.reclaimable.get(j.queue, True) and j.count > own_left
                    and sum(free.values()) - j.count < reserved):
                self.waiting[j.name] = (f"{reserved} device(s) are guaranteed to other queues and queue {j.queue} "
                                        "is not reclaimable")
                continue
            fits = [m for m in runnable if free[m] >= j.count]
            model = pick(j, fits, free, cluster) if fits else None
            if model is None:
                self.waiting[j.name] = f"no free {j.count} device(s) of a model it may use"
                continue
            free[model] -= j.count
            used[j.queue] = have + j.count
            out[j.name] = {model: 1.0}
        return out


def _queue_key(j: JobView, cluster: ClusterView, used: Mapping[str, int]) -> tuple:
    """Queues under their guarantee first, then job priority."""
    return (used.get(j.queue, 0) >= cluster.guarantee.get(j.queue, 0), -j.priority)


class _Ordered(Scheduler):
    """A discrete scheduler defined by an order of jobs and a choice of model among those with room."""

    @abc.abstractmethod
    def order(self, jobs: Sequence[JobView], cluster: ClusterView) -> list[JobView]:
        """``jobs`` in the order they take devices."""

    @abc.abstractmethod
    def pick(self, j: JobView, fits: list[str], free: Mapping[str, int], cluster: ClusterView) -> str | None:
        """The model ``j`` runs on among ``fits`` (models with room; ``free``: free devices per model), or None."""

    def allocate(self, now: float, jobs: Sequence[JobView], cluster: ClusterView) -> Allocation:
        def pick(j: JobView, fits: list[str], free: Mapping[str, int], cl: ClusterView) -> str | None:
            current = next(iter(j.running_on), None)
            if current in fits and self.sticky:
                return current
            return self.pick(j, fits, free, cl)

        return self._greedy(self.order(jobs, cluster), cluster, pick)

    sticky = True


def _used_by_running(jobs: Sequence[JobView]) -> dict[str, int]:
    used: dict[str, int] = {}
    for j in jobs:
        if j.running_on:
            used[j.queue] = used.get(j.queue, 0) + j.count
    return used


class FifoAgnostic(_Ordered):
    """Heterogeneity-agnostic FIFO (Gavel's baseline): running jobs keep their devices (never preempted); waiting
    ones in arrival order (queues under their guarantee first) take the model with the most free devices relative
    to its size; later jobs backfill what earlier ones cannot use. Reads no duration."""

    name = "fifo"

    def order(self, jobs: Sequence[JobView], cluster: ClusterView) -> list[JobView]:
        used = _used_by_running(jobs)
        return sorted(jobs, key=lambda j: (not j.running_on, *_queue_key(j, cluster, used), j.arrival, j.name))

    def pick(self, j: JobView, fits: list[str], free: Mapping[str, int], cluster: ClusterView) -> str | None:
        return max(fits, key=lambda m: (free[m] / max(cluster.capacity[m], 1), -cluster.models.index(m)))


class StaticBinding(FifoAgnostic):
    """FIFO with static binding: each job runs only on the model it named at submission (drawn uniformly among
    the models that can run it, by the trace generator), with backfill. Reads no duration."""

    name = "static"

    def pick(self, j: JobView, fits: list[str], free: Mapping[str, int], cluster: ClusterView) -> str | None:
        if j.model is None:
            return super().pick(j, fits, free, cluster)
        return j.model if j.model in fits else None


class GavelStyle(Scheduler):
    """Gavel-style max-min fairness over throughput-normalised shares (Narayanan et al., OSDI'20, section 4.1):
    the fluid allocation of :func:`~heteroflow.components.placement.policies.max_min_allocation`, re-solved at every
    arrival and completion, with each queue's capability as a constraint. Reads throughputs only, no durations."""

    name = "gavel-style"
    fluid = True

    def allocate(self, now: float, jobs: Sequence[JobView], cluster: ClusterView) -> Allocation:
        self.waiting = {}
        ok: list[JobView] = []
        for j in jobs:
            cap = cluster.queue_limit(j.queue)
            if cap is not None and j.count > cap:
                self.waiting[j.name] = f"queue {j.queue}'s capability {cap} is below the {j.count} device(s) it needs"
            elif not any(cluster.capacity[m] >= j.count and j.throughput.get(m, 0.0) > 0 for m in cluster.models):
                self.waiting[j.name] = f"no model it can run on has {j.count} device(s)"
            else:
                ok.append(j)
        if not ok:
            return {}
        models = cluster.models
        tp = np.array([[j.throughput.get(m, 0.0) if cluster.capacity[m] >= j.count else 0.0 for m in models] for j in ok])
        scale = np.array([j.count for j in ok], dtype=float)
        capacity = np.array([cluster.capacity[m] for m in models], dtype=float)
        limits = []
        total = float(capacity.sum())
        for q in sorted({j.queue for j in ok}):
            members = np.array([j.queue == q for j in ok])
            cap = cluster.queue_limit(q)
            if cap is not None:
                limits.append((members, float(cap)))
            if not cluster.reclaimable.get(q, True):  # it may not use what other queues are guaranteed
                others = sum(g for name, g in cluster.guarantee.items() if name != q)
                limits.append((members, max(total - others, float(cluster.guarantee.get(q, 0)))))
        x = max_min_allocation(tp, scale, capacity, limits=limits)
        out: Allocation = {}
        for k, j in enumerate(ok):
            row = {m: float(x[k, i]) for i, m in enumerate(models) if x[k, i] > 1e-9}
            if row:
                out[j.name] = row
            else:
                cap = cluster.queue_limit(j.queue)
                self.waiting[j.name] = (f"queue {j.queue} is at its capability {cap} device(s)" if cap is not None
                                        else "no share left this round")
        return out


def _expected_remaining(estimate: float, attained: float, sigma: float) -> float:
    """E[W - a | W > a] for W log-normal with median ``estimate`` and log-sd ``sigma`` (the noise model's
    posterior with a flat prior), ``a`` = ``attained``; ``max(estimate - a, 0)`` when ``sigma`` is 0."""
    if sigma <= 0 or attained <= 0:
        return max(estimate * (math.exp(sigma * sigma / 2) if attained <= 0 else 1.0) - attained, 0.0)
    from scipy.special import log_ndtr

    mu, la = math.log(max(estimate, 1e-12)), math.log(attained)
    log_num = mu + sigma * sigma / 2 + log_ndtr((mu + sigma * sigma - la) / sigma)
    log_den = log_ndtr((mu - la) / sigma)
    return max(math.exp(log_num - log_den) - attained, 0.0)


class HeteroflowScheduler(Scheduler):
    """heteroflow's JCT policy, from estimates only (it reads :attr:`JobView.estimated_steps`, never the truth).

    - Order: least expected remaining device-time first (queues under their guarantee first, then priority):
      ``count x E[remaining work | attained] / best throughput``, the expectation taken under the estimate's
      log-normal error (``assumed_sigma``): SRPT on the estimate while a job is within it, Tiresias-style least
      attained service once it has overrun (the expectation then grows with the service attained).
    - Preemption: a running job's key is scaled by ``preempt_margin`` (< 1: hysteresis), so a waiting job
      displaces it only when clearly shorter; each resume costs the replay's ``restart_s``.
    - Placement (heterogeneity-aware): in that order, each job takes, among the models with room for its whole
      gang, the slowest whose profiled throughput is within ``tolerance`` of the fastest one with room (1.0: the
      fastest), leaving faster devices to jobs that gain more there; a running job stays on its model while it
      has room there; then a running job moves to a faster model with free devices when the time saved on its
      expected remaining work exceeds ``restart_s``.

    Attributes:
        assumed_sigma: the log-sd of the estimate's error the policy assumes.
        preempt_margin, tolerance: see above; both fitted on seeds 0-4 (benchmarks/placement.py).
        restart_s: the resume cost the policy assumes when weighing a move.
    """

    name = "heteroflow"
    tick_s = ROUND_S

    def __init__(self, *, assumed_sigma: float = 0.5, preempt_margin: float = 0.5, tolerance: float = 1.0,
                 restart_s: float = RESTART_S) -> None:
        super().__init__()
        for field, value, low, high in (("assumed_sigma", assumed_sigma, 0.0, math.inf), ("preempt_margin", preempt_margin, 0.0, 1.0),
                                        ("tolerance", tolerance, 0.0, 1.0)):
            if not (low <= value <= high) or (field != "assumed_sigma" and value == 0):
                raise ValueError(f"{field}={value} is out of range; valid: {'>= 0' if high == math.inf else f'in ({low:g}, {high:g}]'}")
        self.assumed_sigma = assumed_sigma
        self.preempt_margin = preempt_margin
        self.tolerance = tolerance
        self.restart_s = restart_s

    def expected_remaining_steps(self, j: JobView) -> float:
        return _expected_remaining(j.estimated_steps, j.attained_steps, self.assumed_sigma)

    def remaining_device_s(self, j: JobView) -> float:
        best = j.best_throughput
        return j.count * self.expected_remaining_steps(j) / best if best > 0 else math.inf

    def order(self, jobs: Sequence[JobView], cluster: ClusterView) -> list[JobView]:
        used = _used_by_running(jobs)
        key = {j.name: self.remaining_device_s(j) * (self.preempt_margin if j.running_on else 1.0) for j in jobs}
        return sorted(jobs, key=lambda j: (*_queue_key(j, cluster, used), key[j.name], j.arrival, j.name))

    def pick(self, j: JobView, fits: list[str], free: Mapping[str, int], cluster: ClusterView) -> str | None:
        fastest = max(j.throughput.get(m, 0.0) for m in fits)
        near = [m for m in fits if j.throughput.get(m, 0.0) >= self.tolerance * fastest]
        return min(near, key=lambda m: (j.throughput.get(m, 0.0), -free[m]))

    def allocate(self, now: float, jobs: Sequence[JobView], cluster: ClusterView) -> Allocation:
        """Three passes: (1) the run set: greedily in :meth:`order`, each on the model :meth:`pick` chooses;
        (2) the run set placed again in that order, a running job on the model it holds while that has room;
        (3) moves of running jobs to faster free models, largest time saved first."""
        ordered = self.order(jobs, cluster)
        chosen = self._greedy(ordered, cluster, self.pick)
        waiting = dict(self.waiting)

        def stay(j: JobView, fits: list[str], free: Mapping[str, int], cl: ClusterView) -> str | None:
            current = next(iter(j.running_on), None)
            return current if current in fits else self.pick(j, fits, free, cl)

        run = [j for j in ordered if j.name in chosen]
        out = self._greedy(run, cluster, stay)
        waiting.update(self.waiting)
        free = dict(cluster.capacity)
        for j in run:
            for m in out.get(j.name, {}):
                free[m] -= j.count
        moves = []
        for j in run:
            if j.name not in out or not j.running_on:
                continue
            cur = next(iter(out[j.name]))
            rem = self.expected_remaining_steps(j)
            tp_cur = j.throughput.get(cur, 0.0)
            for m in cluster.models:
                tp_new = j.throughput.get(m, 0.0)
                if tp_new > tp_cur > 0 and (saved := rem / tp_cur - rem / tp_new - self.restart_s) > 0:
                    moves.append((-saved, j.name, m, cur, j.count))
        for _neg, name, m, cur, count in sorted(moves):
            if next(iter(out[name])) != cur or free[m] < count:
                continue
            free[m] -= count
            free[cur] += count
            out[name] = {m: 1.0}
        self.waiting = {n: w for n, w in waiting.items() if n not in out}
        return out


SCHEDULERS: dict[str, type[Scheduler]] = {s.name: s for s in (FifoAgnostic, StaticBinding, GavelStyle, HeteroflowScheduler)}
"""The schedulers by name."""


def replay(jobs: Sequence[SimJob], inventory: ClusterInventory, table: ThroughputTable, scheduler: Scheduler | str, *,
           sigma: float = 0.5, seed: int = 0, restart_s: float = RESTART_S) -> SimResult:
    """Replay ``jobs`` under ``scheduler``, which sees only :class:`JobView` s (estimates, never the true work).

    Args:
        jobs: the trace (true work in ``steps``, read here only by the replay's clock).
        inventory: nodes (devices per model) and queues.
        table: the profiled throughputs (steps/s per job type, scale factor, model).
        scheduler: a :class:`Scheduler` or a name in :data:`SCHEDULERS`.
        sigma, seed: the estimate's noise (:func:`estimate_steps`).
        restart_s: seconds without progress per resume after a preemption or a move (discrete schedulers).

    Returns:
        A :class:`~heteroflow.pipelines.simulate.SimResult` (``preemptions``: resumes after a preemption or move).

    Raises:
        InvalidTrace: a job that can never start; the message names the limit that holds it (queue capability,
            no model with that many devices).
    """
    sched = SCHEDULERS[scheduler]() if isinstance(scheduler, str) else scheduler
    models = inventory.models
    cap = inventory.capacity()
    cluster = ClusterView(models=tuple(models), capacity={m: int(cap.get(m, 0)) for m in models},
                          capability={q.name: inventory.any_model_capability(q, who="the JCT replay")
                                      for q in inventory.queues.values()},
                          guarantee={q.name: q.guarantee for q in inventory.queues.values()},
                          reclaimable={q.name: q.reclaimable for q in inventory.queues.values()})
    tps = _throughputs(jobs, models, table)
    est = estimate_steps(jobs, sigma=sigma, seed=seed)
    views = {j.name: JobView(j, tps[j.name], est[j.name]) for j in jobs}
    truth = {j.name: float(j.steps) for j in jobs}  # the clock's own: never handed to the scheduler
    order = sorted(jobs, key=lambda j: (j.arrival, j.name))
    per_node = {m: next(n for n in inventory.nodes if n.model == m) for m in models}
    node_devices = np.array([max(per_node[m].devices, 1) for m in models], dtype=float)
    node_idle = np.array([per_node[m].idle_watts for m in models])
    busy_w = np.array([per_node[m].busy_watts for m in models])
    price = np.array([per_node[m].cost_per_hour / max(per_node[m].devices, 1) / 3600.0 for m in models])
    meter = _Meter(inventory, models)
    index = {m: i for i, m in enumerate(models)}
    active: dict[str, JobView] = {}
    warm_until: dict[str, float] = {}
    start: dict[str, float] = {}
    finish: dict[str, float] = {}
    where: dict[str, str] = {}
    resumes = events = 0
    i = 0
    now = order[0].arrival if order else 0.0
    overhead = 0.0 if sched.fluid else restart_s
    while i < len(order) or active:
        while i < len(order) and order[i].arrival <= now + 1e-9:
            active[order[i].name] = views[order[i].name]
            i += 1
            events += 1
        if not active:
            now = order[i].arrival
            continue
        alloc = sched.allocate(now, tuple(active.values()), cluster)
        _check(alloc, active, cluster, sched.name)
        busy = np.zeros(len(models))
        rate: dict[str, float] = {}
        for name, j in active.items():
            new = alloc.get(name, {})
            if new and not sched.fluid and j.started and new != j.running_on:
                warm_until[name] = now + overhead  # a resume after preemption, or a move
                resumes += 1
            j.running_on = dict(new)
            if new:
                j.started = True
                start.setdefault(name, now)
                where[name] = max(new, key=new.get)
            rate[name] = sum(x * j.throughput[m] for m, x in new.items())
            for m, x in new.items():
                busy[index[m]] += x * j.count
        nodes_on = np.ceil(busy / node_devices - 1e-9)
        meter.record(now, busy, float((nodes_on * node_idle).sum() + (busy * busy_w).sum()), float((busy * price).sum()))
        done_at = {n: max(now, warm_until.get(n, now)) + truth[n] / r for n, r in rate.items() if r > 0}
        nxt = min(done_at.values(), default=math.inf)
        if i < len(order):
            nxt = min(nxt, order[i].arrival)
        if sched.tick_s and any(r == 0 for r in rate.values()) and (done_at or i < len(order)):
            nxt = min(nxt, now + sched.tick_s)  # re-plan while jobs wait (nothing changes when nothing runs)
        if not math.isfinite(nxt):
            stuck = sorted(n for n in active if rate.get(n, 0) == 0)
            reasons = "; ".join(f"{n}: {sched.waiting.get(n, 'no allocation')}" for n in stuck[:5])
            raise InvalidTrace(f"{len(stuck)} job(s) can never start under {sched.name}: {reasons} "
                               f"({len(finish)} other job(s) finished)")
        for name, j in list(active.items()):
            r = rate[name]
            if r <= 0:
                continue
            t0 = max(now, warm_until.get(name, now))
            dt_busy = nxt - now
            progress = r * max(nxt - t0, 0.0)
            j.attained_device_s += j.count * sum(j.running_on.values()) * dt_busy
            if done_at[name] <= nxt + 1e-6 or truth[name] - progress <= 1e-9 * max(truth[name], 1.0):
                j.attained_steps += truth[name]
                truth[name] = 0.0
                finish[name] = done_at[name] if done_at[name] <= nxt + 1e-6 else nxt
                del active[name]
                events += 1
            else:
                truth[name] -= progress
                j.attained_steps += progress
        now = nxt
    meter.record(now, np.zeros(len(models)), 0.0, 0.0)
    return _finish(sched.name, meter, inventory, jobs, start, finish, where, resumes, [], events)


def _check(alloc: Allocation, active: Mapping[str, JobView], cluster: ClusterView, name: str) -> None:
    """The allocation stays within each model's devices and each queue's capability.

    Raises:
        InvalidAllocation: it does not (a scheduler's bug), naming the scheduler, the model or queue and the counts.
    """
    per_model: dict[str, float] = {}
    per_queue: dict[str, float] = {}
    for job, row in alloc.items():
        j = active[job]
        if sum(row.values()) > 1 + 1e-6:
            raise InvalidAllocation(f"{name}: {job} holds more than all of its time")
        for m, x in row.items():
            per_model[m] = per_model.get(m, 0.0) + x * j.count
            per_queue[j.queue] = per_queue.get(j.queue, 0.0) + x * j.count
    for m, used in per_model.items():
        if used > cluster.capacity[m] + 1e-6:
            raise InvalidAllocation(f"{name}: {used:g} {m} devices allocated, {cluster.capacity[m]} exist")
    for q, used in per_queue.items():
        cap = cluster.queue_limit(q)
        if cap is not None and used > cap + 1e-6:
            raise InvalidAllocation(f"{name}: queue {q} holds {used:g} devices, above its capability {cap}")
