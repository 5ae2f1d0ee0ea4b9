"""Node-packing policies over resource vectors: one interface for the simulator and the plan step.

A :class:`PackingPolicy` scores each node for one :class:`~heteroflow.components.placement.vectors.Request` on the
current :class:`~heteroflow.components.placement.vectors.Cluster`: :meth:`PackingPolicy.score` gives one node's
score (``float``, higher is better) or ``None`` where the node cannot take the request (its queue's capability,
its models, selector, taints, or free CPU, memory and devices); :meth:`PackingPolicy.scores` gives every node's at
once (``nan`` for infeasible, shape (nodes,)). :func:`place` picks the best node (ties broken at random with the
caller's generator, as the Kubernetes scheduler's ``selectHost`` does), the devices on it
(:meth:`PackingPolicy.devices`), and says which limit holds a request no node takes
(:meth:`~heteroflow.components.placement.vectors.Cluster.why_not`). :func:`fill` replays pods drawn with
replacement until the arrived GPU demand reaches the cluster's GPU capacity, the FGD paper's experiment.

Policies (:data:`PACKING_POLICIES`; the scores follow the FGD authors' simulator,
github.com/hkust-adsl/kubernetes-scheduler-simulator ``pkg/simulator/plugin``, where one exists):

- ``random``: any feasible node, uniformly (``random_score.go``); random devices on it.
- ``firstfit``: the first feasible node in inventory order.
- ``bestfit``: least free left after placing, ``sum_r w_r (free_r - request_r) / max_r`` over CPU and GPU
  thousandths, ``w = 0.5`` each (``best_fit_score.go``; ``max_r`` is the largest node of this inventory, where the
  reference fixes Alibaba's 128 cores and 8 GPUs).
- ``dotprod``: smallest dot product of the node's free vector and the request, both over ``max_r``
  (``dot_product_score.go``, ``merge`` dimensions, ``max`` normalisation).
- ``gpupacking``: shared devices first, then free devices of a used node, then an empty node
  (``gpu_packing_score.go``'s three cases).
- ``leastloaded``: the node with the largest free share of devices (then CPU): spreads load.
- ``power-aware``: nodes already on (anything allocated) before idle ones, then best fit, then lower watts
  (background article 004: power-aware packing lets idle machines power down).
- ``fgd``: fragmentation gradient descent (:mod:`heteroflow.components.placement.fgd`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from heteroflow.components.placement.fields import lookup_policy
from heteroflow.components.placement.views import InvalidInventory
from heteroflow.components.placement.vectors import MILLI, Cluster, Request

__all__ = ["PACKING_POLICIES", "FillResult", "PackingDecision", "PackingPolicy", "default_packing_policy", "fill", "get_packing_policy", "packing_registry",
           "place", "ranked"]


class PackingPolicy:
    """Score nodes for a request (higher is better; ``None``/``nan``: the node cannot take it).

    Subclasses override :meth:`node_scores` (vectorised over nodes) and may override :meth:`devices` and
    :meth:`prepare`. Every policy respects queue capability: :meth:`scores` is all ``nan`` when the request's
    queue would exceed it.
    """

    name = "packing"

    def prepare(self, requests: Sequence[Request]) -> None:
        """Learn from the recent requests (FGD's workload distribution); others ignore them."""

    def node_scores(self, request: Request, cluster: Cluster, feasible: np.ndarray) -> np.ndarray:
        """Scores of every node, shape (nodes,) float; only ``feasible`` ones are read."""
        return np.zeros(len(cluster.nodes))

    def scores(self, request: Request, cluster: Cluster) -> np.ndarray:
        """Every node's score, shape (nodes,) float, ``nan`` where the node cannot take the request now."""
        ok = cluster.feasible(request)
        out = np.full(len(cluster.nodes), np.nan)
        if ok.any():
            out[ok] = np.asarray(self.node_scores(request, cluster, ok), dtype=np.float64)[ok]
        return out

    def score(self, node: int | str, request: Request, cluster: Cluster) -> float | None:
        """One node's score (index or name), or None where it cannot take the request.

        Raises:
            InvalidInventory: an unknown node name.
        """
        i = _node_index(node, cluster)
        s = self.scores(request, cluster)[i]
        return None if np.isnan(s) else float(s)

    def devices(self, node: int, request: Request, cluster: Cluster, rng: np.random.Generator) -> tuple[int, ...]:
        """The devices on ``node`` the request takes (default: least free share that fits)."""
        return cluster.best_fit_devices(node, request)


def _node_index(node: int | str, cluster: Cluster) -> int:
    if isinstance(node, str):
        if node not in cluster.index:
            raise InvalidInventory(f"node={node!r} is not in {cluster.source}")
        return cluster.index[node]
    return int(node)


def _max_spec(cluster: Cluster) -> tuple[float, float]:
    return float(max(cluster.cpu_cap.max(), 1)), float(max(cluster.gpu_count.max() * MILLI, 1))


class RandomPolicy(PackingPolicy):
    """Any feasible node, uniformly at random (ties of equal scores are drawn by :func:`place`); random devices."""

    name = "random"

    def devices(self, node: int, request: Request, cluster: Cluster, rng: np.random.Generator) -> tuple[int, ...]:
        if not request.num_gpu:
            return ()
        fit = np.flatnonzero(cluster.gpu_free[node] >= request.gpu_milli)
        return tuple(int(d) for d in sorted(rng.choice(fit, size=request.num_gpu, replace=False)))


class FirstFitPolicy(PackingPolicy):
    """The first feasible node in inventory order."""

    name = "firstfit"

    def node_scores(self, request: Request, cluster: Cluster, feasible: np.ndarray) -> np.ndarray:
        return -np.arange(len(cluster.nodes), dtype=np.float64)


class BestFitPolicy(PackingPolicy):
    """Least free CPU and GPU left after placing: score ``1 - sum_r 0.5 (free_r - request_r) / max_r`` over CPU
    millicores and GPU thousandths (FGD authors' ``best_fit_score.go``; max_r = the inventory's largest node)."""

    name = "bestfit"

    def node_scores(self, request: Request, cluster: Cluster, feasible: np.ndarray) -> np.ndarray:
        mc, mg = _max_spec(cluster)
        left_cpu = (cluster.cpu_free - request.cpu_milli) / mc
        left_gpu = (cluster.gpu_free.sum(axis=1) - request.gpu_total_milli) / mg
        return 1.0 - 0.5 * left_cpu - 0.5 * left_gpu


class DotProductPolicy(PackingPolicy):
    """Smallest dot product of free and requested (CPU, GPU thousandths), each over the inventory's largest node
    (FGD authors' ``dot_product_score.go``, merged GPU dimension, max normalisation): score ``1 - dot / 2``."""

    name = "dotprod"

    def node_scores(self, request: Request, cluster: Cluster, feasible: np.ndarray) -> np.ndarray:
        mc, mg = _max_spec(cluster)
        dot = (cluster.cpu_free / mc) * (request.cpu_milli / mc) + (cluster.gpu_free.sum(axis=1) / mg) * (request.gpu_total_milli / mg)
        return 1.0 - dot / 2.0


class GpuPackingPolicy(PackingPolicy):
    """GPU packing (FGD authors' ``gpu_packing_score.go``), from best: (1) a partly used device that fits,
    ``100 - free share used / 10``; (2) free devices of a used node, ``50 - free devices used`` (>= 33); (3) an
    empty node, ``33 - its free devices``. CPU-only requests: every feasible node alike."""

    name = "gpupacking"

    def node_scores(self, request: Request, cluster: Cluster, feasible: np.ndarray) -> np.ndarray:
        n = len(cluster.nodes)
        if not request.num_gpu:
            return np.zeros(n)
        free = cluster.gpu_free
        exists = np.arange(free.shape[1])[None, :] < cluster.gpu_count[:, None]
        fully = ((free == MILLI) & exists).sum(axis=1)
        empty = fully == cluster.gpu_count
        case3 = np.maximum(100 / 3 - fully, fully).astype(np.float64)
        if request.shared:
            fits = np.where(free >= request.gpu_milli, free, MILLI + 1)
            least = fits.min(axis=1)  # the device the packing would use
            case2 = np.maximum(50.0 - 1, 100 / 3)
            case1 = np.maximum(100.0 - least * 100 / MILLI / 10, 50.0)
            s = np.where(least >= MILLI, case2, case1)
        else:
            s = np.full(n, max(50.0 - request.num_gpu, 100 / 3))
        return np.where(empty, case3, s)


class LeastLoadedPolicy(PackingPolicy):
    """The node with the largest free share of its devices, then of its CPU (spreads load; Gavel's
    heterogeneity-agnostic baseline places this way)."""

    name = "leastloaded"

    def node_scores(self, request: Request, cluster: Cluster, feasible: np.ndarray) -> np.ndarray:
        gshare = cluster.gpu_free.sum(axis=1) / np.maximum(cluster.gpu_count * MILLI, 1)
        return gshare + 1e-3 * cluster.cpu_free / np.maximum(cluster.cpu_cap, 1)


class PowerAwarePolicy(BestFitPolicy):
    """Nodes already on (anything allocated) before idle ones, then best fit, then lower power: whole machines
    stay idle and can be powered down (background article 004, power-aware packing)."""

    name = "power-aware"

    def node_scores(self, request: Request, cluster: Cluster, feasible: np.ndarray) -> np.ndarray:
        on = (cluster.cpu_free < cluster.cpu_cap) | (cluster.gpu_free.sum(axis=1) < cluster.gpu_cap.sum(axis=1))
        watts = cluster.idle_watts * ~on + cluster.busy_watts * request.num_gpu
        return 2.0 * on + super().node_scores(request, cluster, feasible) - 1e-6 * watts


PACKING_POLICIES: dict[str, type[PackingPolicy]] = {p.name: p for p in (RandomPolicy, FirstFitPolicy, BestFitPolicy,
                                                                         DotProductPolicy, GpuPackingPolicy,
                                                                         LeastLoadedPolicy, PowerAwarePolicy)}
"""Packing policies by name, their classes (``fgd``: :class:`~heteroflow.components.placement.fgd.FgdPolicy`, which
registers itself: its module, imported at the end of this one, subclasses :class:`PackingPolicy`);
``module:attribute`` names a user's own."""

ALIASES = {"best-fit": "bestfit", "first-fit": "firstfit", "dot-product": "dotprod", "gpu-packing": "gpupacking",
           "least-loaded": "leastloaded", "poweraware": "power-aware"}


def default_packing_policy(requests: Sequence[Request]) -> str:
    """``fgd`` for a shared-GPU workload (any request for part of one device, ``gpu_milli`` < 1000: FGD leaves the
    fewest GPUs unallocated there, benchmarks/fragmentation.py), else ``bestfit``."""
    return "fgd" if any(r.shared for r in requests) else "bestfit"


def get_packing_policy(name: str | PackingPolicy) -> PackingPolicy:
    """A packing policy by name (see :data:`PACKING_POLICIES`; ``best-fit`` style spellings too) or
    ``module:attribute`` (a :class:`PackingPolicy` subclass or instance).

    Raises:
        InvalidInventory: an unknown name, listing the valid ones.
    """
    return lookup_policy(name, packing_registry(), PackingPolicy, wrong="is not a PackingPolicy",
                         unknown=f"is not a packing policy; valid: {', '.join(sorted(PACKING_POLICIES))}, or module:attribute")


def packing_registry() -> dict[str, type[PackingPolicy]]:
    """:data:`PACKING_POLICIES` and their other spellings (:data:`ALIASES`: ``best-fit``...)."""
    return {**{alias: PACKING_POLICIES[key] for alias, key in ALIASES.items()}, **PACKING_POLICIES}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PackingDecision:
    """Where a request went, or why it waits.

    Attributes:
        request: the request's name.
        placed: whether it was placed.
        nodes: per worker, (node name, device indices).
        score: the winning node's score (the first worker's), or None.
        reason: why it was not placed (which limit holds it), or "".
    """

    request: str
    placed: bool
    nodes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    score: float | None = None
    reason: str = ""

    @property
    def explanation(self) -> str:
        if self.placed:
            where = ", ".join(f"{n}{list(d) if d else ''}" for n, d in self.nodes)
            return f"{self.request} -> {where} (score {self.score:.4g})"
        return f"{self.request} waits: {self.reason}"


def _pick(scores: np.ndarray, rng: np.random.Generator) -> int:
    best = np.nanmax(scores)
    tol = 1e-9 * max(1.0, abs(best))
    cand = np.flatnonzero(scores >= best - tol)
    return int(cand[0]) if len(cand) == 1 else int(rng.choice(cand))


def place(request: Request, cluster: Cluster, policy: PackingPolicy | str, rng: np.random.Generator | None = None) -> PackingDecision:
    """Place ``request`` on ``cluster`` (changed in place) under ``policy``: every worker on its best node (a
    spread request's workers all or none), ties drawn with ``rng`` (default: seed 0).

    Raises:
        InvalidRequest: the request names a queue the cluster does not list.
    """
    pol = get_packing_policy(policy)
    rng = rng if rng is not None else np.random.default_rng(0)
    held = cluster.queue_check(request)  # the whole request against its queue, before any worker
    if held is not None:
        return PackingDecision(request=request.name, placed=False, reason=held)
    done: list[tuple[int, Request, tuple[int, ...]]] = []
    first_score: float | None = None
    for w in request.workers():
        s = pol.scores(w, cluster)
        if np.isnan(s).all():
            reason = cluster.why_not(w) if w is request else f"worker {w.name} of the spread request: {cluster.why_not(w)}"
            for node, wr, devs in reversed(done):
                cluster.release(node, wr, devs)
            return PackingDecision(request=request.name, placed=False, reason=reason)
        node = _pick(s, rng)
        devs = pol.devices(node, w, cluster, rng)
        cluster.allocate(node, w, devs)
        done.append((node, w, devs))
        if first_score is None:
            first_score = float(s[node])
    return PackingDecision(request=request.name, placed=True, score=first_score,
                           nodes=tuple((cluster.nodes[n].name, d) for n, _w, d in done))


def ranked(request: Request, cluster: Cluster, policy: PackingPolicy | str) -> list[tuple[str, float | None]]:
    """Every node with its score under ``policy``, best first, then the nodes that cannot take ``request``
    (score None), for a record of why the winner won (the plan step's explanation)."""
    pol = get_packing_policy(policy)
    s = pol.scores(request, cluster)
    order = sorted(range(len(s)), key=lambda i: (np.isnan(s[i]), -s[i] if not np.isnan(s[i]) else 0.0, i))
    return [(cluster.nodes[i].name, None if np.isnan(s[i]) else float(s[i])) for i in order]


@dataclasses.dataclass(kw_only=True)
class FillResult:
    """What :func:`fill` measured.

    Attributes:
        policy: the policy's name.
        arrived: per arrived pod, the arrived GPU demand so far over the cluster's GPU capacity (0..1).
        unallocated: per arrived pod, the share of the cluster's GPUs left unallocated after it (0..1).
        placed, failed: pods placed and not placed.
        reasons: per limit (the reason's first words), how many pods it held.
        explanations: the first decisions' one-line explanations (``explain`` of them).
    """

    policy: str
    arrived: np.ndarray
    unallocated: np.ndarray
    placed: int
    failed: int
    reasons: dict[str, int]
    explanations: list[str] = dataclasses.field(default_factory=list)

    @property
    def final_unallocated(self) -> float:
        """Share of GPUs unallocated when the arrived demand reached the capacity."""
        return float(self.unallocated[-1]) if len(self.unallocated) else 1.0


def fill(pods: Sequence[Request], cluster: Cluster, policy: PackingPolicy | str, *, seed: int = 0,
         distribution: Sequence[Request] | None = None, explain: int = 0) -> FillResult:
    """Draw pods from ``pods`` with replacement (``numpy.random.default_rng(seed)``) and place each until the
    arrived GPU demand would exceed the cluster's GPU capacity (the FGD paper's experiment, Weng et al., ATC'23,
    section 5.1: pods never leave); ``cluster`` is reset first.

    Args:
        pods: the workload to draw from.
        cluster: the nodes (reset, then filled).
        policy: a name or instance; it is :meth:`~PackingPolicy.prepare`-d with ``distribution`` (default ``pods``).
        seed: the draw's and ties' seed.
        explain: keep the first ``explain`` decisions' explanations.

    Returns:
        :class:`FillResult`, curves per arrived pod.

    Raises:
        InvalidRequest: ``pods`` is empty, or asks for no GPU at all; the cluster has no GPUs.
    """
    from heteroflow.components.placement.vectors import InvalidRequest

    if not pods:
        raise InvalidRequest("pods: empty; valid: at least one request")
    if not any(p.num_gpu for p in pods):
        raise InvalidRequest("pods: no request asks for a GPU, so the arrived GPU demand never reaches the capacity")
    if not cluster.gpu_capacity_milli:
        raise InvalidRequest(f"{cluster.source}: no GPUs, so there is no GPU capacity for the arrived demand to reach")
    pol = get_packing_policy(policy)
    pol.prepare(distribution if distribution is not None else pods)
    cluster.reset()
    rng = np.random.default_rng(seed)
    cap = cluster.gpu_capacity_milli
    arrived_milli = 0
    arrived, unalloc = [], []
    placed = failed = 0
    reasons: dict[str, int] = {}
    explanations: list[str] = []
    allocated = 0
    while True:
        batch = rng.integers(len(pods), size=256)
        stop = False
        for i in batch:
            p = pods[int(i)]
            if arrived_milli + p.gpu_total_milli > cap:
                stop = True
                break
            arrived_milli += p.gpu_total_milli
            d = place(p, cluster, pol, rng)
            if len(explanations) < explain:
                explanations.append(d.explanation)
            if d.placed:
                placed += 1
                allocated += p.gpu_total_milli
            else:
                failed += 1
                key = d.reason.split(":")[0].split(" holds")[0] if not d.reason.startswith("queue") else "queue capability"
                reasons[key] = reasons.get(key, 0) + 1
            arrived.append(arrived_milli / cap)
            unalloc.append(1.0 - allocated / cap)
        if stop:
            break
    return FillResult(policy=pol.name, arrived=np.array(arrived), unallocated=np.array(unalloc), placed=placed, failed=failed,
                      reasons=reasons, explanations=explanations)


import heteroflow.components.placement.fgd  # noqa: E402,F401  (FgdPolicy registers itself in PACKING_POLICIES)
