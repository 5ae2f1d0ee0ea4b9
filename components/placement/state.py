"""What placement works on: the jobs asking for devices, the decisions a round takes, and the cluster's free
capacity as numpy arrays (the simulator's state). Split out of :mod:`heteroflow.components.placement.policies`,
which re-exports these names."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

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


def _relative_throughput(job: Job, state: PlacementState) -> np.ndarray:
    if job.throughput is None:
        return np.ones(len(state.models))
    tp = np.array([float(job.throughput.get(m, 0.0)) for m in state.models])
    best = tp.max() if tp.size else 0.0
    return tp / best if best > 0 else tp
