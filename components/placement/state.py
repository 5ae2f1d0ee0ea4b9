"""What placement works on: the jobs asking for devices, the decisions a round takes, and the cluster's free
capacity as numpy arrays (the simulator's state). Split out of :mod:`heteroflow.components.placement.policies`,
which re-exports these names."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from heteroflow.components.placement.inventory import PlacementInventory as ClusterInventory

__all__ = ["Decision", "Job", "PlacementState"]


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
        cpu_millicores, memory_bytes: CPU and memory it asks for on each node it uses (0: none counted); a node
            that states its CPU or memory must have that much free. With ``pod_devices``: per pod.
        pod_devices: 0: one job, its CPU and memory on each node it uses. N: pods of N devices each (``count / N``
            of them, as the Volcano Job or the training job runs it: a mixed group's replicas one device each, a
            multi-node candidate's workers ``count`` each), each pod's devices on one node, each with its own CPU and
            memory: a node holds as many pods as its free devices, CPU and memory allow.
        distinct_nodes: its pods go to distinct nodes (a multi-node candidate: ``nodes`` workers, one per node).
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
    cpu_millicores: int = 0
    memory_bytes: int = 0
    pod_devices: int = 0
    distinct_nodes: bool = False

    def pods_of(self, devices: int) -> int:
        """The pods ``devices`` of its devices make: one when it is not split into pods."""
        return devices // self.pod_devices if self.pod_devices else 1

    @property
    def host_asks(self) -> dict[str, int]:
        """The CPU (millicores) and memory (bytes) it asks for in all, as its queue counts them."""
        pods = self.pods_of(max(self.count, 1)) if self.pod_devices else 1
        return {"cpu": self.cpu_millicores * pods, "memory": self.memory_bytes * pods}


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

# --- state ----------------------------------------------------------------------------------------------------


class PlacementState:
    """The cluster's free capacity as numpy arrays (one entry per node), plus queue usage.

    Args:
        inventory: the nodes and queues.
        free: free devices per node (default: all).
        queue_used: devices in use per queue.
        queue_used_by: per queue, what it uses per model or device kind, ``cpu`` (millicores), ``memory`` (bytes),
            where known (:class:`~heteroflow.components.placement.scoring.QueueState`'s ``used_by``).
        now: the current time, s.
        device_free_at: optional per model, the time each device becomes free (now for a free one, s); with it
            and a job's ``steps``, policies estimate finish times and may choose to wait for a faster model.
    """

    def __init__(self, inventory: ClusterInventory, *, free: np.ndarray | None = None,
                 queue_used: Mapping[str, int] | None = None, now: float = 0.0,
                 device_free_at: Mapping[str, np.ndarray] | None = None,
                 queue_used_by: Mapping[str, Mapping[str, int]] | None = None) -> None:
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
        self.queue_used_by: dict[str, dict[str, int]] = {q: dict(v) for q, v in (queue_used_by or {}).items()}
        """Per queue, what the jobs placed on this state use per model (devices), ``cpu`` (millicores) and
        ``memory`` (bytes); devices in ``queue_used`` beyond these (stated in use, model unknown) count in every
        device scope (:meth:`used_in`)."""
        unknown = np.iinfo(np.int64).max // 4  # a node that states no CPU or memory (None): not counted; 0: none free
        self.cpu_free = np.fromiter((unknown if n.cpu_millicores is None else n.cpu_millicores for n in nodes), dtype=np.int64, count=len(nodes))
        self.mem_free = np.fromiter((unknown if n.memory_bytes is None else n.memory_bytes for n in nodes), dtype=np.int64, count=len(nodes))
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

    def used_in(self, queue: str, scope: str) -> int:
        """What ``queue`` uses in ``scope`` (a model, a device kind value, :data:`ANY_DEVICES`, ``cpu``,
        ``memory``). Devices whose model is not known count in every scope they may fall in: stated in use without a
        model or kind (the queue state's bare count) in every device scope; of a kind, in that kind's models too."""
        from heteroflow.components.placement.views import ANY_DEVICES, within

        by = self.queue_used_by.get(queue, {})
        if scope == ANY_DEVICES:
            return self.queue_used.get(queue, 0)
        if scope in ("cpu", "memory"):
            return by.get(scope, 0)
        devices = {k: n for k, n in by.items() if k not in ("cpu", "memory")}
        unattributed = max(self.queue_used.get(queue, 0) - sum(devices.values()), 0)
        return unattributed + sum(n for k, n in devices.items() if within(scope, k) or within(k, scope))

    def room(self, job: Job) -> np.ndarray:
        """Free devices per node ``job`` can use: all, or for a job in pods (``pod_devices``), those of the pods each
        node's free devices, CPU and memory hold (one pod a node for ``distinct_nodes``)."""
        if not job.pod_devices:
            return self.free
        pods = self.free // job.pod_devices
        if job.cpu_millicores:
            pods = np.minimum(pods, self.cpu_free // job.cpu_millicores)
        if job.memory_bytes:
            pods = np.minimum(pods, self.mem_free // job.memory_bytes)
        if job.distinct_nodes:
            pods = np.minimum(pods, 1)
        return np.maximum(pods, 0) * job.pod_devices

    def take(self, job: Job, model: str, nodes: Sequence[tuple[int, int]]) -> None:
        """Take ``job``'s devices (``(node, devices)`` pairs), CPU and memory on ``nodes`` and count them in its queue."""
        need = sum(k for _n, k in nodes)
        pods = 0
        for n, k in nodes:
            self.free[n] -= k
            self.cpu_free[n] -= job.cpu_millicores * job.pods_of(k)
            self.mem_free[n] -= job.memory_bytes * job.pods_of(k)
            pods += job.pods_of(k)
        self._count(job, model, need, pods, +1)

    def give_back(self, job: Job, model: str, nodes: Sequence[tuple[int, int]]) -> None:
        """Undo :meth:`take` (the job finished or was preempted)."""
        need = sum(k for _n, k in nodes)
        pods = 0
        for n, k in nodes:
            self.free[n] += k
            self.cpu_free[n] += job.cpu_millicores * job.pods_of(k)
            self.mem_free[n] += job.memory_bytes * job.pods_of(k)
            pods += job.pods_of(k)
        self._count(job, model, need, pods, -1)

    def _count(self, job: Job, model: str, devices: int, pods: int, sign: int) -> None:
        self.queue_used[job.queue] = self.queue_used.get(job.queue, 0) + sign * devices
        by = self.queue_used_by.setdefault(job.queue, {})
        for key, amount in ((model, devices), ("cpu", job.cpu_millicores * pods), ("memory", job.memory_bytes * pods)):
            if amount:
                by[key] = by.get(key, 0) + sign * amount

    def unmet_guarantees(self, excluding: str | None = None) -> int:
        """Devices still reserved for queues using less than their guarantee (other than ``excluding``)."""
        return sum(max(q.guarantee - self.queue_used.get(q.name, 0), 0)
                   for q in self.inventory.queues.values() if q.name != excluding)


def _relative_throughput(job: Job, state: PlacementState) -> np.ndarray:
    if job.throughput is None:
        return np.ones(len(state.models))
    tp = np.array([float(job.throughput.get(m, 0.0)) for m in state.models])
    best = tp.max() if tp.size else 0.0
    return tp / best if best > 0 else tp
