"""Placement: one policy module for the plan step and the simulator (filter, score, pick; each decision explained).

A *cluster inventory* lists nodes, each with one accelerator model (or none), and the queues jobs are submitted
to. A *placement round* takes the pending jobs in the policy's order and, for each, *filters* the nodes (device
kind and model, device memory, free devices, the queue's quota), *scores* what is left (the job's throughput on
each device type, the queue's water level, data locality, cost, power) and *picks* the best; every decision
(placed or waiting) carries a one-line explanation. Policies are pluggable: :data:`POLICIES` maps a name to a
:class:`Policy`, and ``module:attribute`` names a user's own.

The inventory (nodes, queues, throughputs, a default policy) is read by :mod:`heteroflow.components.placement.inventory`;
placement takes its view with one model per node (:class:`~heteroflow.components.placement.inventory.PlacementInventory`,
aliased here as ``ClusterInventory``, ``Node`` and ``Queue``).

Queues follow Volcano's ``Queue`` (scheduling.volcano.sh/v1beta1). Sources: the Queue documentation
(https://volcano.sh/en/docs/queue/: ``capability`` is a hard upper bound on what the queue's jobs use together;
``reclaimable`` says whether other queues may reclaim what it uses beyond its share, default true), the design
"Volcano Resource Reservation For Queue" (volcano-sh/volcano docs/design/queue-resource-reservation-design.md:
``guarantee`` reserves resources for the queue, non-preemptively; it may not exceed the cluster, nor the
``capability`` when one is set) and the v1.10 release notes (queue ``priority``: higher-priority queues get
resources first; lower-priority queues' jobs are reclaimed first). Here the queue's share for reclaim (Volcano's
*deserved*, from ``weight`` or the capacity plugin) is its guarantee: a reclaimable queue may borrow beyond its
guarantee, even idle capacity guaranteed to others, and gives it back (its newest, lowest-priority jobs are
preempted) when the owner, or a job of a higher-priority queue or job, needs it; a queue that is not reclaimable
may only use capacity no other queue is guaranteed. A guarantee or capability counts in its own scope, as the
inventory writes it: devices of one model, of one device kind, of any model (a bare number, as a cluster whose
device plugin advertises one resource, ``nvidia.com/gpu``, for every model counts them), CPU or memory; Kueue's
ClusterQueue keeps a nominalQuota per ResourceFlavor and resource the same way. A job's ``priority``
orders jobs within a queue and, on reclaim, across queues (Volcano's PriorityClass).

This module holds the policies (:class:`Policy` and the built-in ones, :data:`POLICIES`, :func:`get_policy`) and
Gavel's max-min allocation; the rest moved beside it, its names still importable here:
:mod:`~heteroflow.components.placement.state` (:class:`Job`, :class:`Decision`, :class:`PlacementState`),
:mod:`~heteroflow.components.placement.clusters` (throughput tables and inventories: :func:`gavel_throughputs`,
:func:`load_inventory`, :func:`uniform_inventory`, :func:`pai_inventory`, ...) and
:mod:`~heteroflow.components.placement.rounds` (:func:`place_round`, :func:`reclaim`, ``Running``; it imports this
module, so its names are resolved here on first use).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from heteroflow.components.placement.clusters import (  # noqa: F401  (re-exported: they moved there)
    DATA_DIR,
    DEVICE_DEFAULTS,
    HOST_IDLE_WATTS,
    _PAI_MODELS,
    InvalidTrace,
    ThroughputTable,
    gavel_throughputs,
    inventory_from_mapping,
    kubernetes_inventory,
    load_inventory,
    pai_inventory,
    uniform_inventory,
)
from heteroflow.components.placement.fields import lookup_policy
from heteroflow.components.placement.inventory import InvalidInventory, PlacementInputError, kubernetes_nodes  # noqa: F401
from heteroflow.components.placement.inventory import PlacementInventory as ClusterInventory
from heteroflow.components.placement.inventory import PlacementNode as Node
from heteroflow.components.placement.inventory import PlacementQueue as Queue
from heteroflow.components.placement.inventory import model_key as _model_key  # noqa: F401
from heteroflow.components.placement.state import Decision, Job, PlacementState, _relative_throughput

__all__ = [
    "ClusterInventory",
    "Decision",
    "InvalidInventory",
    "InvalidTrace",
    "Job",
    "Node",
    "POLICIES",
    "Policy",
    "PlacementState",
    "Queue",
    "ThroughputTable",
    "gavel_throughputs",
    "get_policy",
    "load_inventory",
    "max_min_allocation",
    "pai_inventory",
    "place_round",
    "reclaim",
]

_IN_ROUNDS = frozenset({"Running", "place_round", "reclaim", "_allowed_models", "_take_nodes", "_fmt_s"})
"""Names that moved to :mod:`heteroflow.components.placement.rounds`, which imports this module."""


def __getattr__(name: str) -> Any:
    """The names of :mod:`heteroflow.components.placement.rounds` (:func:`place_round`, :func:`reclaim`, ``Running``
    and its helpers), resolved on first use (PEP 562): that module imports the policies from this one."""
    if name in _IN_ROUNDS:
        return getattr(importlib.import_module("heteroflow.components.placement.rounds"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- policies -------------------------------------------------------------------------------------------------


class Policy:
    """Filter, score, pick. Subclasses override :meth:`model_scores` (per device model, higher is better; -inf
    forbids) and :meth:`node_scores` (per node among the feasible ones), and may set :attr:`wait_for_faster`.

    Attributes:
        name: the registry name.
        pack: node choice packs busy nodes (frees whole machines to power down) instead of spreading.
        wait_for_faster: with finish-time estimates, a job waits for a busy faster model when it would finish
            earlier there than on a free slower one.
        preemptive: the allocation is recomputed at every event (see :func:`max_min_allocation`).
    """

    name = "policy"
    pack = False
    wait_for_faster = False
    preemptive = False

    def order(self, jobs: Sequence[Job], state: PlacementState) -> list[Job]:
        """Pending jobs in the order they are placed: queues under their guarantee first, then queue priority,
        job priority, the queue's water level (used / guarantee), arrival (FIFO)."""
        inv = state.inventory

        def key(j: Job) -> tuple:
            q = inv.queue(j.queue)
            used = state.queue_used.get(q.name, 0)
            water = used / max(q.guarantee, 1)
            return (used >= q.guarantee, -q.priority, -j.priority, water, *self.job_key(j))

        return sorted(jobs, key=key)

    def job_key(self, job: Job) -> tuple:
        """Order among jobs of equal queue standing and priority; default FIFO (arrival, then name)."""
        return (job.arrival, job.name)

    def model_scores(self, job: Job, state: PlacementState, allowed: np.ndarray) -> np.ndarray:
        """Per model: higher is better. Default: the job's throughput relative to its best model (1.0 = best)."""
        return _relative_throughput(job, state) * 1.0 + np.where(allowed, 0.0, -np.inf)

    def node_scores(self, job: Job, state: PlacementState, idx: np.ndarray) -> np.ndarray:
        """Per feasible node (indices ``idx``): higher is better. Default: least loaded (most free devices),
        then data locality, then lower cost and power per device."""
        score = state.free[idx] / np.maximum(state.capacity[idx], 1) * (-1.0 if self.pack else 1.0)
        if job.dataset:
            score = score + 2.0 * state.has_dataset(job.dataset)[idx]
        return score - 1e-3 * state.cost[idx] - 1e-6 * state.watts[idx]


class ThroughputPolicy(Policy):
    """The model where the job finishes first (throughput from its profile or the table;
    with device free times, waiting for a busy faster model counts), then least-loaded node; data locality,
    cost and power break ties. Pending jobs are ordered long-first then shortest-first (:meth:`job_key`)."""

    name = "throughput"
    wait_for_faster = True
    long_work_device_hours = 400.0
    """A job whose work at its best throughput (devices x hours) reaches this is *long*."""

    def job_key(self, job: Job) -> tuple:
        """Long jobs first, longest first (LPT: they bound the makespan; Graham, 1969), then the rest shortest
        work first (SJF lowers the mean JCT); FIFO among equals and for jobs of unknown work. The 400
        device-hour threshold was chosen on Gavel's setup with seeds 0-2 and checked on seeds 3-7 at 4 and 6
        jobs/h, where it beat FIFO order on both average JCT and makespan (benchmarks/placement.py)."""
        if job.steps is None or not job.throughput:
            return (1, 0.0, job.arrival, job.name)
        best = max(job.throughput.values())
        work = job.steps / best * max(job.count, 1) / 3600.0 if best > 0 else math.inf
        if work >= self.long_work_device_hours:
            return (0, -work, job.arrival, job.name)
        return (1, work, job.arrival, job.name)


class PowerAwarePolicy(ThroughputPolicy):
    """:class:`ThroughputPolicy` that packs jobs onto busy nodes (best fit), so whole machines go idle and can be
    powered down (background article 004: placement by fit, power-aware packing)."""

    name = "power-aware"
    pack = True


class LeastLoadedPolicy(Policy):
    """Heterogeneity-agnostic: any model the job fits, the node with the most free devices (Gavel's baseline)."""

    name = "least-loaded"

    def model_scores(self, job: Job, state: PlacementState, allowed: np.ndarray) -> np.ndarray:
        free = state.free_per_model().astype(np.float64)
        cap = np.bincount(state.model_of, weights=state.capacity, minlength=len(state.models))
        return np.where(allowed, free / np.maximum(cap, 1), -np.inf)


class StaticPolicy(Policy):
    """FIFO with static binding: only the model the job names (``requested_model``), least-loaded node."""

    name = "static"

    def model_scores(self, job: Job, state: PlacementState, allowed: np.ndarray) -> np.ndarray:
        want = job.requested_model
        return np.array([0.0 if ok and (want is None or m == want) else -np.inf for m, ok in zip(state.models, allowed, strict=True)])


class ListedPolicy(Policy):
    """The plan step's historic behaviour: candidates in the order listed; the first that fits wins."""

    name = "listed"

    def model_scores(self, job: Job, state: PlacementState, allowed: np.ndarray) -> np.ndarray:
        return np.where(allowed, 0.0, -np.inf)


class GavelMaxMinPolicy(Policy):
    """Gavel-style max-min fairness over throughput-normalised shares (Narayanan et al., OSDI'20, section 4.1):
    every event re-solves the allocation X (time fraction of each job on each model) that maximises the
    minimum of ``throughput(X) / throughput(equal share)``, then the total of those ratios at that minimum.
    Jobs run at ``sum_m X[j, m] * throughput[j, m]`` (the fluid schedule Gavel's rounds approximate)."""

    name = "gavel"
    preemptive = True


POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (ThroughputPolicy, PowerAwarePolicy, LeastLoadedPolicy, StaticPolicy, ListedPolicy, GavelMaxMinPolicy)
}
"""The policies by name; add your own here or name it as ``module:attribute`` (a Policy subclass)."""


def get_policy(name: str | Policy, *, where: str = "") -> Policy:
    """A policy by registry name or ``module:attribute``.

    Raises:
        InvalidInventory: unknown name (lists the valid ones), or an attribute that is not a Policy.
    """
    return lookup_policy(name, POLICIES, Policy, where=where, wrong="is not a Policy",
                         unknown=f"is unknown; valid: {', '.join(sorted(POLICIES))}, or module:attribute")

# --- Gavel-style max-min fairness ----------------------------------------------------------------------------


def max_min_allocation(throughput: np.ndarray, scale: np.ndarray, capacity: np.ndarray,
                       limits: Sequence[tuple[np.ndarray, float]] = ()) -> np.ndarray:
    """Max-min fair allocation over throughput-normalised shares (Gavel, OSDI'20, eq. for max-min fairness).

    Args:
        throughput: shape (jobs, models), steps/s of each job on each model (0 = cannot run).
        scale: shape (jobs,), devices each job takes while it runs.
        capacity: shape (models,), devices per model.
        limits: ``(members, devices)`` pairs: the jobs of ``members`` (bool, shape (jobs,)) together hold at most
            ``devices`` devices of any model (a Volcano queue's ``capability``); or ``(members, devices, models)``
            triples: at most ``devices`` of the models ``models`` (bool, shape (models,)) marks (a capability per
            model or device kind).

    Returns:
        X, shape (jobs, models): fraction of time each job runs on each model (rows sum to <= 1;
        ``sum_j scale[j] * X[j, m] <= capacity[m]``). Stage 1 maximises ``min_j throughput_j(X) /
        throughput_j(X_equal)`` with X_equal an equal time share of every model; stage 2 keeps each job at that
        minimum and maximises the sum of the ratios (Gavel's water-filling goal: no capacity left idle that a
        job could use).
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix, vstack

    n, m = throughput.shape
    if n == 0:
        return np.zeros((0, m))
    feasible = throughput > 0
    share = min(1.0, float(capacity.sum()) / max(float(scale.sum()), 1e-9))
    equal = np.where(feasible, throughput, 0).sum(axis=1) / np.maximum(feasible.sum(axis=1), 1) * share
    norm = np.where(feasible, throughput / np.maximum(equal[:, None], 1e-12), 0.0)
    jj, mm = np.nonzero(feasible)
    nv = jj.size
    # variables: x (nv), z
    rows_one = coo_matrix((np.ones(nv), (jj, np.arange(nv))), shape=(n, nv + 1))
    rows_cap = coo_matrix((scale[jj], (mm, np.arange(nv))), shape=(m, nv + 1))
    rows_min = coo_matrix((np.concatenate([-norm[jj, mm], np.ones(n)]),
                           (np.concatenate([jj, np.arange(n)]), np.concatenate([np.arange(nv), np.full(n, nv)]))),
                          shape=(n, nv + 1))
    blocks = [rows_one, rows_cap, rows_min]
    bounds_b = [np.ones(n), capacity.astype(float), np.zeros(n)]
    for members, devices, *scope in limits:
        in_scope = np.asarray(scope[0], dtype=bool)[mm] if scope else np.ones(nv, dtype=bool)
        sel = np.flatnonzero(np.asarray(members, dtype=bool)[jj] & in_scope)
        blocks.append(coo_matrix((scale[jj[sel]], (np.zeros(sel.size, dtype=int), sel)), shape=(1, nv + 1)))
        bounds_b.append(np.array([float(devices)]))
    if limits:
        # the equal share a job could get is bounded by its queue's capability too
        for members, devices, *scope in limits:
            if scope:  # a per-model limit: the job may run elsewhere, its equal share is not bounded by it
                continue
            m_ = np.asarray(members, dtype=bool)
            demand = float(scale[m_].sum())
            if demand > devices > 0:
                equal[m_] *= devices / demand
        norm = np.where(feasible, throughput / np.maximum(equal[:, None], 1e-12), 0.0)
        blocks[2] = coo_matrix((np.concatenate([-norm[jj, mm], np.ones(n)]),
                                (np.concatenate([jj, np.arange(n)]), np.concatenate([np.arange(nv), np.full(n, nv)]))),
                               shape=(n, nv + 1))
    a = vstack(blocks).tocsr()
    b = np.concatenate(bounds_b)
    c = np.zeros(nv + 1)
    c[-1] = -1.0
    bounds = [(0, 1)] * nv + [(0, None)]
    r1 = linprog(c, A_ub=a, b_ub=b, bounds=bounds, method="highs")
    x = np.zeros((n, m))
    if r1.status != 0:
        return x
    z = float(r1.x[-1]) * (1 - 1e-6)
    c2 = np.concatenate([-norm[jj, mm], [0.0]])
    bounds2 = [(0, 1)] * nv + [(z, z)]
    r2 = linprog(c2, A_ub=a, b_ub=b, bounds=bounds2, method="highs")
    sol = r2.x if r2.status == 0 else r1.x
    x[jj, mm] = np.clip(sol[:nv], 0.0, 1.0)
    return x
