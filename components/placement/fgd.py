"""Fragmentation gradient descent (FGD): place a pod where it increases the cluster's expected GPU fragmentation
least.

Source: Q. Weng, L. Yang, Y. Yu, W. Wang, X. Tang, G. Yang, L. Zhang, "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23; the definitions below follow the
authors' reference implementation, github.com/hkust-adsl/kubernetes-scheduler-simulator (``pkg/utils/frag.go``:
``NodeGpuShareFragAmount``, ``GetNodePodFrag``, ``GetTypicalPods``; ``pkg/simulator/plugin/fgd_score.go``).

Definitions (amounts in GPU thousandths, "milli"):

- The *workload distribution* :class:`TypicalRequests`: requests grouped by (CPU millicores, GPU milli per
  device, device count, allowed models), most frequent first, kept until they cover ``coverage`` of the requests
  (CPU-only ones included, as the reference's ``isInvolvedCpuPods: true``), frequencies renormalised to sum to 1.
  The default keeps every type (coverage 1.0, the paper's sum over all task types); the reference's artifact cuts
  at 95 % (``podPopularityThreshold: 95``), which on the Alibaba 2023 cluster drops the rare 8-GPU pods from the
  distribution: FGD then breaks up whole 8-GPU nodes and leaves 11-12 % of the GPUs unallocated on gpushare40
  instead of 6.9 % (benchmarks/fragmentation.py, seeds 0-2).
- A node's fragmentation *for one request type* ``m``, ``F_n(m)``: if ``m`` asks for no GPU, may not use the
  node's model, or cannot fit (fewer than its count of devices with its share free, or less free CPU than it
  asks), every free GPU milli on the node is a fragment: ``F_n(m) = sum_g free_g``. If it fits, the fragments are
  the devices too small for it: ``F_n(m) = sum_{g: free_g < milli_m} free_g``. (Memory is not part of it, as in
  the reference.)
- The node's *expected fragmentation*: ``F_n = sum_m p_m F_n(m)`` (``NodeGpuShareFragAmountScore``).
- FGD's *fragmentation delta* of placing a request on node ``n``: ``F_n(after) - F_n(before)``; for a shared
  request, on the device of ``n`` that makes it least. The policy's score is its negative (higher is better);
  the reference maps it through ``sigmoid(-delta / 1000) * 100`` (monotone, the same order) and picks the best
  node, ties at random.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from heteroflow.components.placement.packing import PACKING_POLICIES, PackingPolicy
from heteroflow.components.placement.vectors import MILLI, Cluster, InvalidRequest, Request

__all__ = ["FgdPolicy", "TypicalRequests", "node_fragmentation"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TypicalRequests:
    """The workload distribution FGD expects (``GetTypicalPods``).

    Attributes (arrays over request types, most frequent first):
        cpu_milli, gpu_milli, num_gpu: int arrays, shape (types,).
        models: per type, allowed models (empty: any).
        p: float array, shape (types,), sums to 1.
    """

    cpu_milli: np.ndarray
    gpu_milli: np.ndarray
    num_gpu: np.ndarray
    models: tuple[tuple[str, ...], ...]
    p: np.ndarray

    @classmethod
    def from_requests(cls, requests: Sequence[Request], *, coverage: float = 1.0) -> TypicalRequests:
        """Group ``requests`` by (cpu_milli, gpu_milli, num_gpu, models), keep the most frequent until they cover
        ``coverage`` of them (at least one), renormalise.

        Raises:
            InvalidRequest: no requests, or coverage outside (0, 1].
        """
        if not requests:
            raise InvalidRequest("FGD workload distribution: no requests; valid: the recent requests (a pod list)")
        if not 0 < coverage <= 1:
            raise InvalidRequest(f"FGD coverage={coverage}; valid: 0 < coverage <= 1 (the reference uses 0.95)")
        counts: dict[tuple, int] = {}
        for r in requests:
            k = (r.cpu_milli, int(r.gpu_milli or 0), r.num_gpu, tuple(sorted(r.models)))
            counts[k] = counts.get(k, 0) + 1
        items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        total = sum(counts.values())
        kept, cum = [], 0
        for k, c in items:
            if cum >= coverage * total:
                break
            kept.append((k, c))
            cum += c
        p = np.array([c for _k, c in kept], dtype=np.float64)
        return cls(cpu_milli=np.array([k[0] for k, _c in kept], dtype=np.int64), gpu_milli=np.array([k[1] for k, _c in kept], dtype=np.int64),
                   num_gpu=np.array([k[2] for k, _c in kept], dtype=np.int64), models=tuple(k[3] for k, _c in kept), p=p / p.sum())

    def __len__(self) -> int:
        return len(self.p)


class _Bound:
    """A distribution's arrays for one cluster's models: the GPU types, their distinct shares and access."""

    def __init__(self, dist: TypicalRequests, models: Sequence[str]) -> None:
        gpu = dist.gpu_milli > 0
        self.cpu = dist.cpu_milli[gpu]
        self.num = dist.num_gpu[gpu]
        self.p = dist.p[gpu]
        self.shares, self.k = np.unique(dist.gpu_milli[gpu], return_inverse=True)
        tmodels = [m for m, g in zip(dist.models, gpu, strict=True) if g]
        # acc[model index + 1, type]: row 0 is a CPU-only node (only types naming no model may use it, as in the reference)
        acc = np.zeros((len(models) + 1, len(tmodels)), dtype=bool)
        for t, ms in enumerate(tmodels):
            if not ms:
                acc[:, t] = True
            else:
                for i, m in enumerate(models):
                    acc[i + 1, t] = m in ms
        self.acc = acc

    def fragmentation(self, cpu_free: np.ndarray, gpu_free: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        """Expected fragmentation ``F_n`` of node states, GPU milli, shape (states,).

        Args:
            cpu_free: (states,) millicores; gpu_free: (states, devices) free milli per device (0 for absent ones);
            model_idx: (states,) index into the cluster's models, -1 for a CPU-only node.
        """
        total = gpu_free.sum(axis=1).astype(np.float64)
        if not len(self.p):
            return total
        ge = gpu_free[:, None, :] >= self.shares[None, :, None]  # (C, K, G)
        cnt = ge.sum(axis=2)
        big = (gpu_free[:, None, :] * ge).sum(axis=2)  # free milli on devices that fit each share
        fits = (self.acc[model_idx + 1] & (cnt[:, self.k] >= self.num[None, :]) & (cpu_free[:, None] >= self.cpu[None, :]))
        return total - (fits * big[:, self.k]) @ self.p


def node_fragmentation(cluster: Cluster, dist: TypicalRequests, nodes: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Expected GPU fragmentation of ``cluster``'s nodes (all, or ``nodes``) under ``dist``, GPU milli, float
    array (see the module docstring; ``NodeGpuShareFragAmountScore`` of the reference)."""
    idx = np.arange(len(cluster.nodes)) if nodes is None else np.asarray(nodes, dtype=np.int64)
    return _Bound(dist, cluster.models).fragmentation(cluster.cpu_free[idx], cluster.gpu_free[idx], cluster.model_idx[idx])


class FgdPolicy(PackingPolicy):
    """Fragmentation gradient descent (Weng et al., USENIX ATC'23): the node (and, for a shared request, the
    device) whose expected fragmentation grows least; score = ``-(F_n(after) - F_n(before))`` in GPU milli
    (:meth:`delta` is the increase itself). :meth:`prepare` sets the workload distribution (the recent
    requests); without one, the request being placed is the whole distribution.

    Per-node figures are cached by the node's version, so a replay recomputes only the nodes that changed.
    """

    name = "fgd"

    def __init__(self, distribution: TypicalRequests | Sequence[Request] | None = None, *, coverage: float = 1.0) -> None:
        self.coverage = coverage
        self.dist: TypicalRequests | None = None
        if distribution is not None:
            self.prepare(distribution)

    def prepare(self, requests: TypicalRequests | Sequence[Request]) -> None:
        self.dist = requests if isinstance(requests, TypicalRequests) else TypicalRequests.from_requests(requests, coverage=self.coverage)
        self._bound_to: tuple | None = None

    def _bind(self, request: Request, cluster: Cluster) -> _Bound:
        if self.dist is None:
            self.prepare([request])
        key = (id(cluster), cluster.epoch, cluster.models)
        if getattr(self, "_bound_to", None) != key:
            assert self.dist is not None
            self._bound = _Bound(self.dist, cluster.models)
            self._bound_to = key
            n = len(cluster.nodes)
            self._before = np.zeros(n)
            self._before_v = np.full(n, -1, dtype=np.int64)
            self._cache: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        return self._bound

    def _deltas(self, request: Request, cluster: Cluster, feasible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = self._bind(request, cluster)
        stale_b = np.flatnonzero(self._before_v != cluster.version)
        if len(stale_b):
            self._before[stale_b] = b.fragmentation(cluster.cpu_free[stale_b], cluster.gpu_free[stale_b], cluster.model_idx[stale_b])
            self._before_v[stale_b] = cluster.version[stale_b]
        key = (request.cpu_milli, request.num_gpu, request.gpu_milli, request.models)
        got = self._cache.get(key)
        if got is None:
            n = len(cluster.nodes)
            got = self._cache[key] = (np.zeros(n), np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64))
        delta, device, ver = got
        idx = np.flatnonzero(feasible & (ver != cluster.version))
        if len(idx):
            cpu_after = cluster.cpu_free[idx] - request.cpu_milli
            free = cluster.gpu_free[idx]
            models = cluster.model_idx[idx]
            if request.shared:
                order = np.argsort(free, axis=1, kind="stable")
                vals = np.take_along_axis(free, order, axis=1)
                first = np.ones_like(vals, dtype=bool)
                first[:, 1:] = vals[:, 1:] != vals[:, :-1]
                rr, cc = np.nonzero(first & (vals >= request.gpu_milli))  # one device per distinct free share
                dev = order[rr, cc]
                after = free[rr].copy()
                after[np.arange(len(rr)), dev] -= request.gpu_milli
                d = b.fragmentation(cpu_after[rr], after, models[rr]) - self._before[idx[rr]]
                # per node the smallest increase, the lowest device among equals (the reference keeps the first best)
                o = np.lexsort((dev, d, rr))
                rr, d, dev = rr[o], d[o], dev[o]
                keep = np.ones(len(rr), dtype=bool)
                keep[1:] = rr[1:] != rr[:-1]
                delta[idx[rr[keep]]] = d[keep]
                device[idx[rr[keep]]] = dev[keep]
            else:
                after = free.copy()
                if request.num_gpu:
                    whole = free >= MILLI
                    take = whole & (np.cumsum(whole, axis=1) <= request.num_gpu)
                    after = free - take * MILLI
                delta[idx] = b.fragmentation(cpu_after, after, models) - self._before[idx]
            ver[idx] = cluster.version[idx]
        return delta, device

    def delta(self, node: int | str, request: Request, cluster: Cluster) -> float | None:
        """The increase of ``node``'s expected fragmentation (GPU milli) if it takes ``request`` (on its best
        device), or None where it cannot."""
        s = self.score(node, request, cluster)
        return None if s is None else -s

    def node_scores(self, request: Request, cluster: Cluster, feasible: np.ndarray) -> np.ndarray:
        delta, _device = self._deltas(request, cluster, feasible)
        return -delta

    def devices(self, node: int, request: Request, cluster: Cluster, rng: np.random.Generator) -> tuple[int, ...]:
        if request.shared:
            ok = np.zeros(len(cluster.nodes), dtype=bool)
            ok[node] = True
            _delta, device = self._deltas(request, cluster, ok)
            return (int(device[node]),)
        return cluster.best_fit_devices(node, request)


PACKING_POLICIES[FgdPolicy.name] = FgdPolicy
