"""The plan step under a node-packing policy (FGD, best-fit, ...): candidates as request vectors, nodes scored.

An inventory's ``policy:`` may name a packing policy of :mod:`heteroflow.components.placement.packing`
(``fgd``, ``bestfit``, ``firstfit``, ``dotprod``, ``gpupacking``, ``leastloaded``, ``random``, their ``best-fit``
spellings, or ``module:attribute`` of a :class:`~heteroflow.components.placement.packing.PackingPolicy`); the names
of :data:`~heteroflow.components.placement.policies.POLICIES` (``throughput``, ``listed``, ``power-aware``,
``least-loaded``, ...) keep naming the whole-device policies. :func:`resolve_policy` tells them apart.

Under a packing policy the plan step (:class:`PackingPlanner`):

1. builds the cluster's resource vectors from the live inventory (:func:`cluster_of`: each node's CPU, memory and
   devices; the queues' device capabilities and, from the queue state, what each queue uses now);
2. turns each candidate into a :class:`~heteroflow.components.placement.vectors.Request` (:func:`request_of`: CPU
   millicores, memory MiB, devices, ``device_share`` as ``gpu_milli``, the models it accepts);
3. for FGD, learns the workload distribution from the recent requests (:func:`recent_requests`): the pod list the
   inventory's ``workload:`` names, else the resources chosen by the plans of the recent run records
   (``./heteroflow-runs`` and ``$HETEROFLOW_HOME/airflow-runs``, newest :data:`RECENT_RUNS` runs), else the
   candidates being placed; the record says which;
4. scores every node for every candidate (:func:`~heteroflow.components.placement.packing.ranked`); a candidate's
   score is its best node's (FGD: minus the increase of the cluster's expected fragmentation, GPU thousandths), and
   its reason names that node, the runner-up and the estimated step time where the profile or the ``throughputs``
   table gives one;
5. picks the winner: for a candidate list with ``policy="any"`` the highest score (ties: listed first); for an
   ``ordered`` list (the default) the first feasible candidate (the user's preference order, as under ``listed``),
   and the packing policy chooses its node and devices. The chosen request is taken from the cluster, so the next
   call sees it used.

Not modelled here: node labels, taints and the queues' guarantees (the placement view of an inventory has none of
them per node; the whole-device policies handle guarantees).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heteroflow.components.placement.packing import PACKING_POLICIES, PackingPolicy, get_packing_policy, packing_registry, place, ranked
from heteroflow.components.placement.vectors import MILLI, Cluster, NodeSpec, QueueLimit, Request
from heteroflow.components.placement.views import InvalidInventory
from heteroflow.components.resources import Candidates, DeviceKind, Resources

__all__ = ["RECENT_RUNS", "Distribution", "PackingPlanner", "cluster_of", "is_packing_policy", "recent_requests",
           "request_of", "requests_of", "resolve_policy", "shared_gpu_default"]

_MIB = 1 << 20
RECENT_RUNS = 50
"""Run records read for FGD's workload distribution when the inventory names no workload file (newest first)."""


def resolve_policy(name: str, *, where: str = "") -> tuple[str, Any]:
    """``("round", Policy)`` for a whole-device policy, ``("packing", PackingPolicy)`` for a packing policy.

    Raises:
        InvalidInventory: an unknown name (both registries' names listed), or ``module:attribute`` that is neither.
    """
    from heteroflow.components.placement.fields import lookup_policy
    from heteroflow.components.placement.policies import POLICIES, Policy

    # a whole-device policy's name first (``least-loaded``, ``power-aware`` name one of each)
    policy = lookup_policy(name, {**packing_registry(), **POLICIES}, (PackingPolicy, Policy), where=where,
                           wrong="is neither a Policy nor a PackingPolicy",
                           unknown=f"is unknown; valid: placement policies {', '.join(sorted(POLICIES))}; "
                                   f"packing policies {', '.join(sorted(PACKING_POLICIES))}; or module:attribute")
    return ("packing" if isinstance(policy, PackingPolicy) else "round"), policy


def is_packing_policy(name: str) -> bool:
    """Whether ``name`` resolves to a packing policy (see :func:`resolve_policy`; an unknown name raises)."""
    return resolve_policy(name)[0] == "packing"


def cluster_of(inventory: Any, used: Mapping[str, int] | None = None,
               used_by: Mapping[str, Mapping[str, int]] | None = None) -> Cluster:
    """The resource vectors of a :class:`~heteroflow.components.placement.views.PlacementInventory` (the file's, or
    the live cluster's free capacity): per node CPU millicores, memory MiB (bytes // 2^20), devices of its model
    (``None`` model for a CPU-only node); per queue with a capability, ``gpu_milli`` = its device capability x 1000
    (:meth:`~heteroflow.components.placement.views.PlacementInventory.any_model_capability`), ``cpu_milli`` and
    ``memory_mib`` from its cpu and memory capability; ``used``
    (devices per queue, the queue state) and ``used_by`` (its cpu and memory per queue) are counted against them.

    Raises:
        InvalidInventory: a node states no CPU or memory (a packing policy places by both), or a queue's capability
            per model or kind holds only some of the devices.
    """
    nodes = []
    for n in inventory.nodes:
        if n.cpu_millicores is None or n.memory_bytes is None:
            lacking = " and ".join(f for f, v in (("cpu", n.cpu_millicores), ("memory", n.memory_bytes)) if v is None)
            raise InvalidInventory(f"{inventory.source}: node {n.name!r} states no {lacking}; a packing policy places by "
                                   "CPU, memory and device shares: give each node cpu and memory, or name a placement "
                                   "policy (e.g. policy: throughput)")
        nodes.append(NodeSpec(name=n.name, cpu_milli=n.cpu_millicores, memory_mib=n.memory_bytes // _MIB, gpus=n.devices,
                              model=n.model if n.devices else None, idle_watts=n.idle_watts, busy_watts=n.busy_watts,
                              device_memory_mib=(n.device_memory_bytes or 0) // _MIB if n.devices else 0))
    queues = []
    for q in inventory.queues.values():  # devices of any model (per model or kind only where that is every device), CPU, memory
        devices = inventory.any_model_capability(q, who="a packing policy")
        limits = q.limits()
        cap = {k: v for k, v in (("gpu_milli", None if devices is None else devices * MILLI), ("cpu_milli", limits.get("cpu")),
                                 ("memory_mib", None if "memory" not in limits else limits["memory"] // _MIB)) if v is not None}
        queues.append(QueueLimit(name=q.name, capability=cap))
    cluster = Cluster(nodes, queues, source=inventory.source)
    for q, n in (used or {}).items():
        cluster.queue_used[q] = {"cpu_milli": 0, "memory_mib": 0, "gpu_milli": int(n) * MILLI}
    for q, by in (used_by or {}).items():
        u = cluster.queue_used.setdefault(q, {"cpu_milli": 0, "memory_mib": 0, "gpu_milli": 0})
        u["cpu_milli"], u["memory_mib"] = by.get("cpu", 0), by.get("memory", 0) // _MIB
    return cluster


def requests_of(res: Resources, *, name: str = "candidate", queue: str = "default") -> list[Request]:
    """The request vectors of a candidate: one (:func:`request_of`), or one per replica group of a mixed candidate
    (``count`` replicas of the group's kind, its CPU and memory per replica), placed together or not at all; a
    group of devices is a spread request, one one-device worker (with its replica's CPU and memory) per replica,
    as the Volcano Job runs one pod per replica."""
    from heteroflow.components.replicas import is_mixed

    if not is_mixed(res):
        return [request_of(res, name=name, queue=queue)]
    out = []
    for g in res.replicas:
        one = g.resources
        has = DeviceKind(one.kind).has_devices
        milli = one.device_share_milli or (MILLI if has else 0)
        out.append(Request(name=f"{name} {g.kind.value}", cpu_milli=(one.cpu_millicores or 0) * g.count,
                           memory_mib=math.ceil((one.memory_bytes or 0) / _MIB) * g.count, num_gpu=g.count if has else 0,
                           gpu_milli=milli, models=tuple(m.name for m in one.accelerator_models) if has else (),
                           single_node=not (has and g.count > 1), queue=queue,
                           device_memory_mib=math.ceil((one.device_memory_bytes or 0) / _MIB) if has else 0))
    return out


def request_of(res: Resources, *, name: str = "candidate", queue: str = "default") -> Request:
    """The request vector of a candidate: CPU millicores and memory MiB (rounded up) per pod, times ``nodes``;
    ``count x nodes`` devices of the models it accepts (registry keys), each whole or ``device_share`` of one
    (``gpu_milli``); a multi-node candidate is a spread request (one one-device worker per device, placed together
    or not at all), an approximation for ``count`` > 1 per node."""
    kind = DeviceKind(res.kind)
    num = (res.count or 0) * res.nodes if kind.has_devices else 0
    milli = res.device_share_milli or (MILLI if num else 0)
    return Request(name=name, cpu_milli=(res.cpu_millicores or 0) * res.nodes,
                   memory_mib=math.ceil((res.memory_bytes or 0) / _MIB) * res.nodes, num_gpu=num, gpu_milli=milli,
                   models=tuple(m.name for m in res.accelerator_models) if num else (), single_node=res.nodes == 1,
                   queue=queue, device_memory_mib=math.ceil((res.device_memory_bytes or 0) / _MIB) if num else 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Distribution:
    """The recent requests FGD expects, and where they came from (one line, recorded with the placement)."""

    requests: tuple[Request, ...]
    source: str


def _registry_models(models: Iterable[str]) -> tuple[str, ...]:
    """Model names of a pod list as the inventory's registry keys where the registry knows them (``T4`` ->
    ``nvidia-t4``; a family, ``A100``, -> its models); others kept as written."""
    from heteroflow.components.devices.accelerators import find_accelerator
    from heteroflow.components.errors import InvalidResources

    out: list[str] = []
    for m in models:
        try:
            accel = find_accelerator(m)
        except InvalidResources:
            out.append(m)
            continue
        if accel.is_family:
            out.extend(x.name for x in accel.models)
        else:
            out.append(accel.name)
    return tuple(dict.fromkeys(out))


def _run_roots() -> list[Path]:
    from heteroflow.cache.locations import home_dir

    return [Path.cwd() / "heteroflow-runs", home_dir() / "airflow-runs"]


def _runs_requests(roots: Sequence[Path], queue: str) -> tuple[list[Request], int]:
    """The resources chosen by the plans of the newest :data:`RECENT_RUNS` run records under ``roots`` (three levels
    deep), as requests; and how many runs held one."""
    files: list[Path] = []
    for root in roots:
        if root.is_dir():
            for depth in ("*/run.json", "*/*/run.json", "*/*/*/run.json"):
                files.extend(root.glob(depth))
    files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    out: list[Request] = []
    runs = 0
    for f in files[:RECENT_RUNS]:
        try:
            placement = json.loads(f.read_text(encoding="utf-8")).get("placement") or {}
            got = [request_of(Resources.from_dict(p["resources"]), name=f"{f.parent.name}/{call}", queue=queue)
                   for call, p in placement.items() if isinstance(p, dict) and isinstance(p.get("resources"), dict)]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue  # a record of another version, or one being written: not a request
        if got:
            runs += 1
            out.extend(got)
    return out, runs


def recent_requests(inventory: Any, fallback: Sequence[Request], *, queue: str = "default",
                    roots: Sequence[Path] | None = None) -> Distribution:
    """FGD's workload distribution: the inventory's ``workload`` pod list (CSV, see
    :mod:`heteroflow.components.placement.podlists`), else the plans of the recent run records under ``roots``
    (default ``./heteroflow-runs`` and ``$HETEROFLOW_HOME/airflow-runs``), else ``fallback`` (the candidates being
    placed).

    Raises:
        InvalidTrace: the workload file cannot be read, lacks a column or holds a bad value (named).
    """
    from heteroflow.components.placement.podlists import read_pods

    if getattr(inventory, "workload", None):
        pods = [dataclasses.replace(p, models=_registry_models(p.models), queue=queue) for p in read_pods(inventory.workload)]
        return Distribution(requests=tuple(pods), source=f"workload file {inventory.workload} ({len(pods)} requests)")
    roots = list(roots) if roots is not None else _run_roots()
    got, runs = _runs_requests(roots, queue)
    if got:
        where = ", ".join(str(r) for r in roots if r.is_dir())
        return Distribution(requests=tuple(got), source=f"runs records under {where} ({len(got)} requests from {runs} runs)")
    return Distribution(requests=tuple(fallback), source=f"the candidates being placed ({len(fallback)} requests: no workload "
                                                         "file in the inventory, no run records with a plan)")


def shared_gpu_default(inventory: Any, candidates: Iterable[Candidates]) -> bool:
    """Whether FGD is the default policy: some candidate asks for part of one device (``device_share``), or the
    inventory's workload file holds requests for part of one device (a shared-GPU inventory)."""
    if any(r.device_share is not None for c in candidates for r in c):
        return True
    if getattr(inventory, "workload", None):
        from heteroflow.components.placement.podlists import read_pods

        return any(p.shared for p in read_pods(inventory.workload))
    return False


class PackingPlanner:
    """Places the plan step's calls one by one on the cluster's resource vectors under one packing policy (see the
    module docstring). ``place`` returns the same :class:`~heteroflow.components.placement.plan.Placement` the
    whole-device path does, with ``packing``: the policy and the workload distribution's source.

    Raises:
        InvalidInventory: a node without CPU or memory; an unknown policy.
        InvalidTrace: the workload file is invalid.
    """

    def __init__(self, inventory: Any, policy: str | PackingPolicy, *, queue_state: Any = None,
                 profile: Mapping[str, Any] | None = None, candidates: Sequence[Candidates] = (), seed: int = 0) -> None:
        """``seed``: ties between equal nodes are drawn with ``numpy.random.default_rng(seed)`` (the scored trial and
        the placement draw alike)."""
        from heteroflow.components.placement.scoring import QueueState

        self.inventory = inventory
        self.policy = get_packing_policy(policy)
        self.queue_state = queue_state or QueueState()
        self.profile = profile
        self.cluster = cluster_of(inventory, self.queue_state.used, self.queue_state.used_by)
        self.seed = seed
        self.distribution: Distribution | None = None
        if self.policy.name == "fgd":
            fallback = [request_of(r, name=f"candidate {i}", queue=self.queue_state.queue)
                        for c in candidates for i, r in enumerate(c)]
            self.distribution = recent_requests(inventory, fallback, queue=self.queue_state.queue)
            self.policy.prepare(self.distribution.requests)

    def score(self, call: str, candidates: Candidates) -> tuple[list[Any], list[list[Request]]]:
        """Each candidate's :class:`~heteroflow.components.placement.scoring.CandidateScore` (in the listed order)
        and its request vectors (one per replica group of a mixed candidate); the cluster is not changed."""
        import copy

        from heteroflow.components.placement.scoring import CandidateScore, step_seconds_per_model

        times = step_seconds_per_model(self.profile, self.inventory.throughputs.get(call))
        out, requests = [], []
        name = self.policy.name
        for i, res in enumerate(candidates):
            group = requests_of(res, name=f"{call} candidate {i}", queue=self.queue_state.queue)  # a mixed one: per kind
            req = group[0]
            requests.append(group)
            trial = copy.deepcopy(self.cluster)
            rng = np.random.default_rng(self.seed)
            held = None
            for k, r in enumerate(group):
                d = place(r, trial, self.policy, rng)
                if not d.placed:
                    held = d.reason if len(group) == 1 else f"its {res.replicas[k].kind.value} x{res.replicas[k].count} replicas: {d.reason}"
                    break
                if k == 0:
                    first_d = d
            milli = res.device_share_milli
            if held is not None:
                out.append(CandidateScore(candidate=i, score=-math.inf, feasible=False, gpu_milli=milli, reason=held))
                continue
            d = first_d
            top = [(n, s + 0.0) for n, s in ranked(req.workers()[0], self.cluster, self.policy) if s is not None]
            first = d.nodes[0][0]
            model = self.cluster.nodes[self.cluster.index[first]].model or DeviceKind.host().value
            known = times.get(model)
            share = f" ({milli} milli)" if milli else ""
            where = f"{model} x{req.num_gpu}{share}" if req.num_gpu else "cpu only"
            nxt = next(((n, s) for n, s in top if n != first), None)
            runner = f"; next best node {nxt[0]} {nxt[1]:.4g}" if nxt else ""
            timing = f"; est. {known[0]:.4g} s/step ({known[1]})" if known else ""
            out.append(CandidateScore(
                candidate=i, score=float(d.score or 0.0) + 0.0, feasible=True, model=model,
                nodes=tuple(dict.fromkeys(n for n, _ in d.nodes)), step_seconds=known[0] if known else None,
                gpu_milli=milli, basis=f"{name} score",
                reason=f"{where} on {', '.join(dict.fromkeys(n for n, _ in d.nodes))}: {name} score {d.score + 0.0:.4g}, best of "
                       f"{len(top)} feasible node(s){runner}{timing}"))
        return out, requests

    def place(self, call: str, candidates: Candidates) -> Any:
        """Choose a candidate and its node(s) for ``call`` and take them from the cluster.

        Raises:
            NoCandidateAvailable: no candidate fits; each candidate's limit is listed.
        """
        from heteroflow.components.errors import NoCandidateAvailable
        from heteroflow.components.placement.plan import Placement, _pod_of
        from heteroflow.components.placement.scoring import winner

        scores, requests = self.score(call, candidates)
        by = "any" if candidates.policy == "any" else "listed"
        picked = winner(scores, policy=self.policy.name if by == "any" else "listed")
        if picked is None:
            raise NoCandidateAvailable("no candidate can run on the node inventory:\n  " + "\n  ".join(
                f"candidate {x.candidate} ({candidates[x.candidate].describe()}): {x.reason}" for x in scores))
        i, why = picked
        res = candidates[i]
        win = scores[i]
        if by == "listed":
            why += (f" (an ordered candidate list; {self.policy.name} chooses its node: {win.nodes[0]}, score {win.score:.4g})")
        rng = np.random.default_rng(self.seed)
        decisions = [place(r, self.cluster, self.policy, rng) for r in requests[i]]  # every group of a mixed candidate
        decision = decisions[0]
        nodes = tuple(dict.fromkeys(n for d in decisions for n, _ in d.nodes))
        passed = tuple(f"candidate {x.candidate} ({candidates[x.candidate].describe()}): {x.reason}"
                       for x in scores if x.candidate < i and not x.feasible)
        kind = DeviceKind(res.kind)
        packing = {"policy": self.policy.name, "candidates": by}
        if self.distribution is not None:
            packing["distribution"] = self.distribution.source
        return Placement(index=i, resources=res, device_kind=kind.value, torch_device=res.torch_device_type,
                         passed_over=passed, explanation=f"[{self.policy.name}] candidate {i}: " + "; ".join(d.explanation for d in decisions),
                         nodes=nodes, scores=tuple(x.to_dict() for x in scores), why=why,
                         pod=_pod_of(res, win.model, nodes, win.gpu_milli), packing=packing)

