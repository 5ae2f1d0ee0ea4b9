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
may only use capacity no other queue is guaranteed. Quotas count accelerator devices of any model, as a cluster
whose device plugin advertises one resource (``nvidia.com/gpu``) for every model does. A job's ``priority``
orders jobs within a queue and, on reclaim, across queues (Volcano's PriorityClass).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from heteroflow.components.placement.fields import model_key as _model_key
from heteroflow.components.placement.k8s_nodes import kubernetes_nodes
from heteroflow.components.placement.views import InvalidInventory, PlacementInputError
from heteroflow.components.placement.views import PlacementInventory as ClusterInventory
from heteroflow.components.placement.views import PlacementNode as Node
from heteroflow.components.placement.views import PlacementQueue as Queue

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

DATA_DIR = Path(__file__).parent / "data"
"""Data shipped with the package (each folder has its LICENSE and a README naming source and commit)."""


class InvalidTrace(PlacementInputError):
    """A job trace that cannot be replayed."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A job asking for devices.

    Attributes:
        name: unique among the jobs placed together.
        count: devices, all of one model (a gang).
        queue: the queue it is submitted to.
        priority: higher first (within the queue, and on reclaim).
        kind: device kind wanted (``gpu``, ``npu``, ``cpu``); None: any accelerator kind.
        models: accelerator models it accepts (registry keys); None: any of ``kind``.
        device_memory_bytes: memory it needs per device, bytes (0: any).
        throughput: steps/s of the whole job (``count`` devices) per device model; a model missing or 0 cannot run
            it. None: unknown (every allowed model counts as equally fast).
        steps: remaining work in steps (with ``throughput``, lets a policy estimate finish times); None: unknown.
        requested_model: the model the job names (static binding uses only it).
        dataset: the data set it reads (data locality).
        arrival: submission time, s.
    """

    name: str
    count: int = 1
    queue: str = "default"
    priority: int = 0
    kind: str | None = None
    models: frozenset[str] | None = None
    device_memory_bytes: int = 0
    throughput: Mapping[str, float] | None = None
    steps: float | None = None
    requested_model: str | None = None
    dataset: str | None = None
    arrival: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One job's outcome in a round.

    Attributes:
        job: the job's name.
        placed: whether it starts now.
        model: the device model chosen (or waited for); None when nothing can run it.
        nodes: ``(node index, devices)`` per node used (empty when not placed).
        node_names: the nodes' names.
        borrowed: whether it uses capacity guaranteed to another queue (reclaimable later).
        explanation: one line: what was chosen and why, or why it waits.
    """

    job: str
    placed: bool
    model: str | None
    nodes: tuple[tuple[int, int], ...] = ()
    node_names: tuple[str, ...] = ()
    borrowed: bool = False
    explanation: str = ""


# --- throughput table -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ThroughputTable:
    """Steps/s per (job type, scale factor) and device model.

    Attributes:
        models: device models (registry keys), the columns.
        rows: ``{(job type, scale factor): steps/s per model}``; 0.0 = cannot run (does not fit).
    """

    models: tuple[str, ...]
    rows: Mapping[tuple[str, int], tuple[float, ...]]

    def of(self, job_type: str, scale_factor: int) -> dict[str, float]:
        """Steps/s of ``job_type`` with ``scale_factor`` devices on each model.

        Raises:
            KeyError: the job type and scale factor are not in the table.
        """
        return dict(zip(self.models, self.rows[(job_type, scale_factor)], strict=True))

    @property
    def job_types(self) -> list[str]:
        return sorted({t for t, _ in self.rows})


def gavel_throughputs(path: str | Path | None = None) -> ThroughputTable:
    """Gavel's measured isolated throughputs (steps/s) of 26 job types with 1/2/4/8 workers on K80, P100, V100.

    Source: stanford-futuredata/gavel ``scheduler/simulation_throughputs.json`` (commit c4fa400, MIT), reduced to
    the isolated (``null``) entries; shipped as ``heteroflow/components/placement/data/gavel/derived_isolated_throughputs.csv``.

    Raises:
        InvalidTrace: a row that is not ``model,scale_factor,k80,p100,v100`` numbers (the message names the line).
    """
    import csv

    path = Path(path) if path is not None else DATA_DIR / "gavel" / "derived_isolated_throughputs.csv"
    rows: dict[tuple[str, int], tuple[float, ...]] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        models = tuple(_model_key(h.removesuffix("_steps_per_s"), field=f"{path}:1 column") for h in header[2:])
        for lineno, row in enumerate(reader, start=2):
            try:
                rows[(row[0], int(row[1]))] = tuple(float(v) for v in row[2:])
            except (ValueError, IndexError):
                raise InvalidTrace(f"{path}:{lineno}: {row!r} is not model,scale_factor,steps/s per model") from None
    return ThroughputTable(models=models, rows=rows)


# --- the inventory (parsed by heteroflow.components.placement.inventory) ----------------------------------------------


def load_inventory(source: str | Path, *, text: str | None = None) -> ClusterInventory:
    """Read an inventory file (or ``text``, ``source`` naming it) and return its placement view
    (:func:`heteroflow.components.placement.inventory.load_inventory`, then
    :meth:`~heteroflow.components.placement.inventory.ClusterInventory.for_placement`).

    Raises:
        InvalidInventory: the message starts ``FILE:LINE:`` and names the node or queue, the field and what is
            valid: unknown keys, unknown or family models, negative or fractional counts, duplicate node names, a
            queue guarantee above its capability or guarantees above the cluster's capacity, throughputs for
            unknown models, more than one model on a node.
    """
    from heteroflow.components.placement import inventory

    return inventory.load_inventory(source, text=text).for_placement()


def inventory_from_mapping(data: object, *, source: str = "inventory") -> ClusterInventory:
    """The placement view of an inventory from parsed YAML/JSON (see :func:`load_inventory`; same errors)."""
    from heteroflow.components.placement import inventory

    return inventory.from_mapping(data, source=source).for_placement()


# Prices per GPU-hour are those Gavel uses for its cost policies (GCP on-demand, 2020): K80 0.45, P100 1.46,
# V100 2.48 (gavel scheduler/utils.py); T4 0.35 (GCP price list, 2020).
DEVICE_DEFAULTS: Mapping[str, tuple[float, float, float]] = {
    # model: (busy watts per device, idle watts per device, price per device-hour)
    "nvidia-k80": (150.0, 25.0, 0.45),
    "nvidia-p100": (250.0, 30.0, 1.46),
    "nvidia-v100": (300.0, 40.0, 2.48),
    "nvidia-t4": (70.0, 10.0, 0.35),
}
HOST_IDLE_WATTS = 150.0
"""Idle power of a server without its accelerators, W (an assumption: typical 2-socket server at idle)."""


def uniform_inventory(per_model: Mapping[str, int], *, devices_per_node: int = 4, source: str = "inventory") -> ClusterInventory:
    """Nodes of ``devices_per_node`` devices each, ``per_model[model]`` devices per model, with
    :data:`DEVICE_DEFAULTS` power and prices (Gavel's cluster: ``{"k80": 36, "p100": 36, "v100": 36}``).

    Raises:
        InvalidInventory: unknown model, or a count that is not a multiple of ``devices_per_node``.
    """
    from heteroflow.components.devices.accelerators import ACCELERATORS

    nodes: list[Node] = []
    for name, n in per_model.items():
        model = _model_key(name, field=f"{source} model")
        if n % devices_per_node:
            raise InvalidInventory(f"{source}: {n} {model} devices is not a multiple of {devices_per_node} per node")
        busy, idle, price = DEVICE_DEFAULTS.get(model, (250.0, 30.0, 1.0))
        for i in range(n // devices_per_node):
            nodes.append(Node(
                name=f"{model.removeprefix('nvidia-')}-{i}", kind=ACCELERATORS[model].kind.value, model=model,
                devices=devices_per_node, device_memory_bytes=ACCELERATORS[model].device_memory_bytes or 0,
                cost_per_hour=price * devices_per_node, idle_watts=HOST_IDLE_WATTS + idle * devices_per_node,
                busy_watts=busy - idle,
            ))
    return ClusterInventory(nodes=tuple(nodes), source=source)


_PAI_MODELS = {"V100": ("nvidia-v100", 16), "V100M32": ("nvidia-v100", 32), "P100": ("nvidia-p100", 16),
               "T4": ("nvidia-t4", 16), "MISC": ("nvidia-k80", 12)}
"""Alibaba PAI gpu_type -> (registry model, GiB per device). ``MISC`` is "older GPUs (K40m, K80, M60)" in the
trace's documentation; it is modelled as K80. ``V100M32`` is the 32 GB V100."""


def pai_inventory(path: str | Path | None = None, *, replicate: int = 1) -> ClusterInventory:
    """The Alibaba PAI machine list (cluster-trace-gpu-v2020 ``pai_machine_spec.csv``, CC BY 4.0, Weng et al.,
    NSDI'22) as an inventory: 1,897 machines, 6,742 GPUs. ``replicate`` copies the list (names suffixed ``/r``)
    to model a larger cluster.

    Raises:
        InvalidInventory: a row that is not ``machine,gpu_type,cap_cpu,cap_mem,cap_gpu`` (names the line), an
            unknown gpu_type, or a duplicate machine name.
    """
    import csv

    path = Path(path) if path is not None else DATA_DIR / "alibaba_pai" / "pai_machine_spec.csv"
    base: list[Node] = []
    seen: set[str] = set()
    with open(path, newline="", encoding="utf-8") as fh:
        for lineno, row in enumerate(csv.reader(fh), start=1):
            try:
                machine, gpu_type, cap_cpu, cap_mem, cap_gpu = row
                cpu, mem, ngpu = int(float(cap_cpu)), int(float(cap_mem)), int(float(cap_gpu))
            except ValueError:
                raise InvalidInventory(f"{path}:{lineno}: {row!r} is not machine,gpu_type,cap_cpu,cap_mem,cap_gpu") from None
            if machine in seen:
                raise InvalidInventory(f"{path}:{lineno}: machine {machine!r} is listed twice")
            seen.add(machine)
            if ngpu < 0:
                raise InvalidInventory(f"{path}:{lineno}: cap_gpu={ngpu} is negative")
            if gpu_type == "CPU" or ngpu == 0:
                base.append(Node(name=machine, kind="cpu", model="cpu", devices=0, cpu_millicores=cpu * 1000,
                                 memory_bytes=mem * 2**30, idle_watts=HOST_IDLE_WATTS))
                continue
            if gpu_type not in _PAI_MODELS:
                raise InvalidInventory(f"{path}:{lineno}: gpu_type={gpu_type!r} is unknown; valid: CPU, {', '.join(_PAI_MODELS)}")
            model, gib = _PAI_MODELS[gpu_type]
            busy, idle, price = DEVICE_DEFAULTS[model]
            base.append(Node(name=machine, kind="gpu", model=model, devices=ngpu, device_memory_bytes=gib * 2**30,
                             cpu_millicores=cpu * 1000, memory_bytes=mem * 2**30, cost_per_hour=price * ngpu,
                             idle_watts=HOST_IDLE_WATTS + idle * ngpu, busy_watts=busy - idle))
    nodes = base if replicate == 1 else [dataclasses.replace(n, name=f"{n.name}/{r}") for r in range(replicate) for n in base]
    return ClusterInventory(nodes=tuple(nodes), source=str(path))


def kubernetes_inventory(*, kubeconfig: str | None = None) -> ClusterInventory:  # pragma: no cover - needs a cluster
    """The live cluster's free capacity through the Kubernetes API (allocatable minus requested), with the
    kubeconfig at ``kubeconfig`` (default: ``$HETEROFLOW_KUBECONFIG``, else the client's default lookup)."""
    from kubernetes import client, config

    path = kubeconfig or os.environ.get("HETEROFLOW_KUBECONFIG")
    config.load_kube_config(config_file=path) if path else config.load_kube_config()
    api = client.CoreV1Api()
    nodes = api.list_node().items
    pods = api.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items
    return ClusterInventory(nodes=tuple(kubernetes_nodes(nodes, pods)), source=f"kubernetes ({path or 'default kubeconfig'})")


# --- state ----------------------------------------------------------------------------------------------------


class PlacementState:
    """The cluster's free capacity as numpy arrays (one entry per node), plus queue usage.

    Args:
        inventory: the nodes and queues.
        free: free devices per node (default: all).
        queue_used: devices in use per queue.
        now: the current time, s.
        device_free_at: optional per model, the time each device becomes free (now for a free one, s); with it
            and a job's ``steps``, policies estimate finish times and may choose to wait for a faster model.
    """

    def __init__(self, inventory: ClusterInventory, *, free: np.ndarray | None = None,
                 queue_used: Mapping[str, int] | None = None, now: float = 0.0,
                 device_free_at: Mapping[str, np.ndarray] | None = None) -> None:
        self.inventory = inventory
        self.models: tuple[str, ...] = inventory.models
        index = {m: i for i, m in enumerate(self.models)}
        nodes = inventory.nodes
        self.model_of = np.fromiter((index[n.model] for n in nodes), dtype=np.int32, count=len(nodes))
        self.capacity = np.fromiter((n.devices for n in nodes), dtype=np.int64, count=len(nodes))
        self.free = self.capacity.copy() if free is None else np.asarray(free, dtype=np.int64).copy()
        self.mem = np.fromiter((n.device_memory_bytes for n in nodes), dtype=np.int64, count=len(nodes))
        self.cost = np.fromiter((n.cost_per_hour / max(n.devices, 1) for n in nodes), dtype=np.float64, count=len(nodes))
        self.watts = np.fromiter((n.busy_watts + n.idle_watts / max(n.devices, 1) for n in nodes), dtype=np.float64, count=len(nodes))
        self.queue_used: dict[str, int] = dict(queue_used or {})
        self.now = now
        self.device_free_at = {m: np.asarray(v, dtype=np.float64).copy() for m, v in (device_free_at or {}).items()}
        self._datasets: dict[str, np.ndarray] = {}

    def has_dataset(self, name: str) -> np.ndarray:
        """Boolean per node: ``name`` is cached there."""
        if name not in self._datasets:
            self._datasets[name] = np.fromiter((name in n.datasets for n in self.inventory.nodes), dtype=bool,
                                               count=len(self.inventory.nodes))
        return self._datasets[name]

    def free_per_model(self) -> np.ndarray:
        return np.bincount(self.model_of, weights=self.free, minlength=len(self.models)).astype(np.int64)

    def unmet_guarantees(self, excluding: str | None = None) -> int:
        """Devices still reserved for queues using less than their guarantee (other than ``excluding``)."""
        return sum(max(q.guarantee - self.queue_used.get(q.name, 0), 0)
                   for q in self.inventory.queues.values() if q.name != excluding)


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


def _relative_throughput(job: Job, state: PlacementState) -> np.ndarray:
    if job.throughput is None:
        return np.ones(len(state.models))
    tp = np.array([float(job.throughput.get(m, 0.0)) for m in state.models])
    best = tp.max() if tp.size else 0.0
    return tp / best if best > 0 else tp


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
    if isinstance(name, Policy):
        return name
    if name in POLICIES:
        return POLICIES[name]()
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise InvalidInventory(f"{where}policy={name!r} cannot be imported ({exc})") from None
        if isinstance(obj, type) and issubclass(obj, Policy):
            return obj()
        if isinstance(obj, Policy):
            return obj
        raise InvalidInventory(f"{where}policy={name!r} is not a Policy")
    raise InvalidInventory(f"{where}policy={name!r} is unknown; valid: {', '.join(sorted(POLICIES))}, or module:attribute")


# --- a round --------------------------------------------------------------------------------------------------


def _allowed_models(job: Job, state: PlacementState) -> np.ndarray:
    ok = np.ones(len(state.models), dtype=bool)
    for i, m in enumerate(state.models):
        if m == "cpu":
            ok[i] = job.kind == "cpu"
            continue
        if job.kind == "cpu":
            ok[i] = False
        elif job.models is not None and m not in job.models:
            ok[i] = False
        elif job.throughput is not None and job.throughput.get(m, 0.0) <= 0:
            ok[i] = False
    if job.kind not in (None, "cpu"):
        from heteroflow.components.devices.accelerators import ACCELERATORS

        for i, m in enumerate(state.models):
            if ok[i] and ACCELERATORS[m].kind.value != job.kind:
                ok[i] = False
    return ok


def _take_nodes(job: Job, state: PlacementState, policy: Policy, model_idx: int, mask: np.ndarray) -> list[tuple[int, int]]:
    """Nodes for ``job.count`` devices of one model: one node when one has room, else a gang across nodes."""
    need = max(job.count, 1) if job.kind != "cpu" else 0
    cand = np.flatnonzero(mask & (state.model_of == model_idx))
    if need == 0:
        if cand.size == 0:
            return []
        scores = policy.node_scores(job, state, cand)
        return [(int(cand[int(np.argmax(scores))]), 0)]
    whole = cand[state.free[cand] >= need]
    if whole.size:
        scores = policy.node_scores(job, state, whole)
        return [(int(whole[int(np.argmax(scores))]), need)]
    part = cand[state.free[cand] > 0]
    if int(state.free[part].sum()) < need:
        return []
    order = part[np.argsort(-policy.node_scores(job, state, part), kind="stable")]
    taken: list[tuple[int, int]] = []
    for n in order:
        k = int(min(state.free[n], need))
        taken.append((int(n), k))
        need -= k
        if need == 0:
            break
    return taken


def _fmt_s(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def place_round(jobs: Sequence[Job], state: PlacementState, policy: Policy | str = "throughput") -> list[Decision]:
    """Place ``jobs`` on ``state`` (updated in place: free devices, queue usage, device free times).

    Jobs are taken in :meth:`Policy.order`; later jobs backfill what earlier ones cannot use. For each job:
    filter (model allowed by the job and its throughput, device memory, free devices, queue capability, other
    queues' guarantees), score the models (:meth:`Policy.model_scores`, or the estimated finish time when the job
    has ``steps`` and ``state.device_free_at`` is known), pick a model, then the best node(s)
    (:meth:`Policy.node_scores`).

    Returns:
        One :class:`Decision` per job, in placement order.
    """
    policy = get_policy(policy)
    out: list[Decision] = []
    inv = state.inventory
    total_free = int(state.free.sum())
    for job in policy.order(jobs, state):
        q = inv.queue(job.queue)
        need = max(job.count, 1) if job.kind != "cpu" else 0
        used = state.queue_used.get(q.name, 0)
        if q.capability is not None and used + need > q.capability:
            out.append(Decision(job=job.name, placed=False, model=None,
                                explanation=f"{job.name} waits: queue {q.name} uses {used} of its capability {q.capability}, +{need} would exceed it"))
            continue
        allowed = _allowed_models(job, state)
        mem_ok = state.mem >= job.device_memory_bytes if job.device_memory_bytes else np.ones(len(state.mem), dtype=bool)
        room = state.free > 0 if need else np.ones(len(state.free), dtype=bool)
        mask = mem_ok & room & allowed[state.model_of]
        free_by_model = np.bincount(state.model_of[mask], weights=state.free[mask], minlength=len(state.models))
        fits = allowed & (free_by_model >= need) if need else allowed & (np.bincount(state.model_of[mask], minlength=len(state.models)) > 0)
        if not allowed.any():
            why = "no model in the inventory can run it" + (f" (it names {job.requested_model})" if job.requested_model else "")
            out.append(Decision(job=job.name, placed=False, model=None, explanation=f"{job.name} waits: {why}"))
            continue
        # quota: others' unmet guarantees stay free unless this queue's jobs are reclaimable
        reserved = state.unmet_guarantees(excluding=q.name)
        own_left = max(q.guarantee - used, 0)
        borrowed = need > 0 and total_free - need < reserved and need > own_left
        if borrowed and not q.reclaimable:
            out.append(Decision(job=job.name, placed=False, model=None,
                                explanation=f"{job.name} waits: {total_free} free devices, {reserved} guaranteed to other queues, and queue {q.name} is not reclaimable"))
            continue
        rel = _relative_throughput(job, state)
        scores = policy.model_scores(job, state, allowed)
        finish = None
        if policy.wait_for_faster and job.steps is not None and job.throughput is not None and state.device_free_at and need:
            finish = np.full(len(state.models), np.inf)
            start = np.full(len(state.models), np.inf)
            for i, m in enumerate(state.models):
                times = state.device_free_at.get(m)
                tp = job.throughput.get(m, 0.0)
                if allowed[i] and times is not None and times.size >= need and tp > 0:
                    start[i] = max(float(np.partition(times, need - 1)[need - 1]), state.now)
                    finish[i] = start[i] + job.steps / tp
            scores = np.where(np.isfinite(finish), -finish, -np.inf)
        choice = int(np.argmax(scores)) if np.isfinite(scores).any() else -1
        if choice < 0:
            out.append(Decision(job=job.name, placed=False, model=None, explanation=f"{job.name} waits: no model it may use"))
            continue
        model = state.models[choice]
        if finish is not None and not fits[choice]:
            # wait for the faster model: hold its devices from their free time on (later jobs see them taken)
            times = state.device_free_at[model]
            k = np.argpartition(times, need - 1)[:need]
            times[k] = finish[choice]
            alt = np.where(fits & np.isfinite(finish), finish, np.inf)
            alt_text = (f" vs {_fmt_s(float(alt.min()) - state.now)} on free {state.models[int(np.argmin(alt))]}"
                        if np.isfinite(alt).any() else "")
            out.append(Decision(job=job.name, placed=False, model=model, explanation=(
                f"{job.name} waits for {model} (x{need} free in {_fmt_s(start[choice] - state.now)}): done in "
                f"{_fmt_s(finish[choice] - state.now)} there{alt_text}")))
            continue
        if not fits[choice]:
            # no finish estimate: take the best model that fits now
            fit_scores = np.where(fits, scores, -np.inf)
            if not np.isfinite(fit_scores).any():
                best_free = int(free_by_model[allowed].max()) if allowed.any() else 0
                mem_note = f" with >= {job.device_memory_bytes / 2**30:.0f} GiB device memory" if job.device_memory_bytes else ""
                out.append(Decision(job=job.name, placed=False, model=model, explanation=(
                    f"{job.name} waits: needs {need} free device(s){mem_note} of one model among "
                    f"{', '.join(m for m, a in zip(state.models, allowed, strict=True) if a)}; most free: {best_free}")))
                continue
            choice = int(np.argmax(fit_scores))
            model = state.models[choice]
        taken = _take_nodes(job, state, policy, choice, mask)
        if not taken:
            out.append(Decision(job=job.name, placed=False, model=model, explanation=f"{job.name} waits: no {model} node fits"))
            continue
        for n, k in taken:
            state.free[n] -= k
        total_free -= need
        state.queue_used[q.name] = used + need
        if finish is not None and model in state.device_free_at:
            times = state.device_free_at[model]
            k = np.argpartition(times, need - 1)[:need]
            times[k] = finish[choice]
        names = tuple(inv.nodes[n].name for n, _ in taken)
        where = names[0] if len(names) == 1 else f"{len(names)} nodes ({names[0]}, ...)"
        tp_text = (f"{job.throughput.get(model, 0.0):.3g} steps/s = {rel[choice]:.2f} of its best"
                   if job.throughput is not None else "throughput unknown")
        reason = {
            "static": "the model it names",
            "least-loaded": "the least-loaded model",
            "listed": "the first listed that fits",
        }.get(policy.name, "finishes first" if finish is not None else "fastest that fits")
        extras = []
        if finish is not None:
            extras.append(f"done in {_fmt_s(finish[choice] - state.now)}")
        if job.dataset and any(job.dataset in inv.nodes[n].datasets for n, _ in taken):
            extras.append(f"{job.dataset} cached")
        if inv.queues:
            cap_text = "" if q.capability is None else f", capability {q.capability}"
            extras.append(f"queue {q.name} uses {used + need} (guarantee {q.guarantee}{cap_text})" + (", borrowed" if borrowed else ""))
        node0 = taken[0][0]
        extras.append(f"{state.cost[node0]:.2f}/device-h")
        out.append(Decision(job=job.name, placed=True, model=model, nodes=tuple(taken), node_names=names, borrowed=borrowed,
                            explanation=f"{job.name} -> {model if not need else f'{model} x{need}'} on {where}: {reason}, {tp_text}; " + ", ".join(extras)))
    return out


# --- reclaim --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Running:
    """A running job, as :func:`reclaim` sees it: its nodes, queue, priority, start time and whether it borrowed."""

    job: Job
    nodes: tuple[tuple[int, int], ...]
    started: float
    borrowed: bool


def reclaim(job: Job, running: Sequence[Running], state: PlacementState) -> tuple[list[Running], str]:
    """Running jobs to preempt so ``job`` can start, Volcano's *reclaim* action: only jobs that borrowed capacity
    (their queue beyond its guarantee) in a reclaimable queue, and only for a job whose queue is under its
    guarantee or whose (queue priority, priority) is higher. Victims: lowest priority first, newest first.

    Returns:
        (victims, one-line explanation); no victims when that cannot make room.
    """
    inv = state.inventory
    q = inv.queue(job.queue)
    need = max(job.count, 1)
    under = state.queue_used.get(q.name, 0) + need <= q.guarantee
    mine = (q.priority, job.priority)
    pool = [r for r in running
            if r.job.queue != q.name and inv.queue(r.job.queue).reclaimable
            and state.queue_used.get(r.job.queue, 0) > inv.queue(r.job.queue).guarantee
            and (under or (inv.queue(r.job.queue).priority, r.job.priority) < mine)]
    pool.sort(key=lambda r: (inv.queue(r.job.queue).priority, r.job.priority, -r.started))
    allowed = _allowed_models(job, state)
    free = state.free_per_model()
    for i, m in enumerate(state.models):
        if not allowed[i]:
            continue
        victims: list[Running] = []
        got = int(free[i])
        over = {name: state.queue_used.get(name, 0) - inv.queue(name).guarantee for name in inv.queues}
        for r in pool:
            if got >= need:
                break
            if not any(state.model_of[n] == i for n, _ in r.nodes) or over.get(r.job.queue, 0) <= 0:
                continue
            victims.append(r)
            got += sum(k for n, k in r.nodes if state.model_of[n] == i)
            over[r.job.queue] = over.get(r.job.queue, 0) - r.job.count
        if got >= need and victims:
            names = ", ".join(f"{v.job.name} ({v.job.queue})" for v in victims)
            why = "its queue is under its guarantee" if under else "it has the higher priority"
            return victims, f"{job.name} reclaims {m} from {names}: {why} and they borrowed capacity"
    return [], f"{job.name}: nothing reclaimable makes room"


# --- Gavel-style max-min fairness ----------------------------------------------------------------------------


def max_min_allocation(throughput: np.ndarray, scale: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair allocation over throughput-normalised shares (Gavel, OSDI'20, eq. for max-min fairness).

    Args:
        throughput: shape (jobs, models), steps/s of each job on each model (0 = cannot run).
        scale: shape (jobs,), devices each job takes while it runs.
        capacity: shape (models,), devices per model.

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
    a = vstack([rows_one, rows_cap, rows_min]).tocsr()
    b = np.concatenate([np.ones(n), capacity.astype(float), np.zeros(n)])
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
