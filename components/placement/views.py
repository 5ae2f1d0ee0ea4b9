"""The parsed cluster inventory and the views its consumers take of it.

:class:`ClusterInventory` is the one value the parser (:mod:`heteroflow.components.placement.inventory`) reads
every form into: its devices, CPU and memory, :class:`Node` values and :class:`QueueSpec` queues. Its views: the
plan step's devices per kind and per model, and placement's :class:`PlacementInventory` (nodes of one model each,
:class:`PlacementNode`, :class:`PlacementQueue`). The errors every inventory reader raises
(:class:`InvalidInventory`, :class:`PlacementInputError`) live here too.

Moved here from :mod:`heteroflow.components.placement.inventory`, which re-exports the public names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from heteroflow.components.devices.accelerators import ACCELERATORS, DeviceKind
from heteroflow.components.devices.quantities import format_cpu, format_memory
from heteroflow.components.errors import HeteroflowError, InvalidResources

__all__ = [
    "ANY_DEVICES",
    "DEFAULT_QUEUE",
    "ClusterInventory",
    "InvalidInventory",
    "Node",
    "PlacementInputError",
    "PlacementInventory",
    "PlacementNode",
    "PlacementQueue",
    "QueueSpec",
    "kind_of",
    "show_amount",
    "within",
]


class PlacementInputError(HeteroflowError, ValueError):
    """Bad placement input; the message starts with ``FILE:LINE:`` where a line is known."""


class InvalidInventory(PlacementInputError, InvalidResources):
    """An inventory (nodes, queues, throughputs) that cannot be used; the message names the source (and line),
    the node or queue, the field and what is valid. Both bases of the former per-module classes
    (:class:`PlacementInputError` and :class:`~heteroflow.components.errors.InvalidResources`), so existing
    ``except`` clauses keep catching it."""


ANY_DEVICES = "accelerators"
"""The amount key of a guarantee or capability given as a bare number: accelerator devices of any model."""


def _kinds() -> tuple[str, ...]:
    return tuple(k.value for k in DeviceKind)


def _accelerator_kinds() -> tuple[str, ...]:
    return tuple(k.value for k in DeviceKind if k.has_devices)


def _where(source: str, line: int) -> str:
    """The start of an :class:`InvalidInventory` message: ``FILE:LINE: `` (``FILE: `` where no line is known)."""
    return f"{source}:{line}: " if line else f"{source}: "


# --- values ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One node.

    Attributes:
        name: unique in the inventory.
        devices: accelerator devices per registry model (empty for a CPU-only node).
        cpu_millicores, memory_bytes: allocatable CPU (millicores) and memory (bytes), or None where not stated.
        device_memory_bytes: memory per device, bytes (the one-model form's ``memory``, else the registry's
            figure; the smallest over the node's models; 0 for a CPU-only node).
        labels: Kubernetes node labels.
        taints: Kubernetes taints, each ``{key, value?, effect}``.
        cost_per_hour: whole node, per hour (any currency).
        idle_watts: power with no device busy, W; busy_watts: power added per busy device, W.
        datasets: data sets cached on the node.
        index, line: where it was listed (``nodes[index]``, the file line or 0), for messages.
    """

    name: str
    devices: Mapping[str, int] = dataclasses.field(default_factory=dict)
    cpu_millicores: int | None = None
    memory_bytes: int | None = None
    device_memory_bytes: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    cost_per_hour: float = 0.0
    idle_watts: float = 0.0
    busy_watts: float = 0.0
    datasets: frozenset[str] = frozenset()
    index: int = dataclasses.field(default=0, compare=False, repr=False)
    line: int = dataclasses.field(default=0, compare=False, repr=False)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueSpec:
    """One queue (a device kind's or a team's).

    Attributes:
        name: DNS label; the name of its Volcano Queue, Kueue ClusterQueue and LocalQueues.
        kind: the device kind it serves, or None; team: the team it serves, or None (documentation only).
        guarantee, capability: per key (a registry model, a device kind value, :data:`ANY_DEVICES` for a bare
            number, ``cpu`` in millicores, ``memory`` in bytes) the amount guaranteed and the elastic maximum (a
            key missing from ``capability`` has no limit).
        reclaimable: whether what it uses above its guarantee may be taken back.
        weight: Volcano's share weight (>= 1).
        priority: the queue's priority (higher is served first and reclaimed last), or None.
        namespaces: namespaces that get a LocalQueue pointing at its ClusterQueue.
    """

    name: str
    kind: str | None = None
    team: str | None = None
    guarantee: Mapping[str, int] = dataclasses.field(default_factory=dict)
    capability: Mapping[str, int] = dataclasses.field(default_factory=dict)
    reclaimable: bool = True
    weight: int = 1
    priority: int | None = None
    namespaces: tuple[str, ...] = ("default",)


_HOST_KEYS = ("cpu", "memory")
"""Amount keys of a guarantee or capability that are not devices."""


def within(scope: str, key: str) -> bool:
    """Whether an amount under ``key`` (a model, a device kind value, :data:`ANY_DEVICES`, ``cpu``, ``memory``)
    counts in ``scope`` (the same kinds of key): a model's devices count in the model, its kind and any-model
    scopes; a kind's in the kind and any-model scopes; devices of any model only in the any-model scope."""
    if scope in _HOST_KEYS or key in _HOST_KEYS:
        return key == scope
    if scope == ANY_DEVICES:
        return True
    if scope in _kinds():
        return key != ANY_DEVICES and kind_of(key) == scope
    return key == scope


def kind_of(key: str) -> str:
    """The device kind value of an amount key (a model, a kind value, or :data:`ANY_DEVICES`, returned as is)."""
    if key in _kinds() or key == ANY_DEVICES or key not in ACCELERATORS:  # a name outside the registry: its own kind
        return key
    return ACCELERATORS[key].kind.value


def show_amount(key: str, amount: int) -> str:
    """An amount as the file writes it: CPU as cores, memory as a quantity, devices as a number."""
    if key == "cpu":
        return format_cpu(amount)
    if key == "memory":
        return format_memory(amount)
    return str(amount)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInventory:
    """A cluster's devices, nodes and queues: the one parsed value (the forms are in the module docstring).

    Attributes:
        devices: accelerator count per registry model (``nvidia-a100-80gb``) or, where only the kind is known
            (``{"gpu": 4}``), per device kind value (``gpu``).
        cpu_millicores, memory_bytes: the CPU and memory of the cluster, or None where not stated.
        nodes: the nodes, when the inventory lists them.
        queues: the queues, in file order.
        cohort: the Kueue cohort every ClusterQueue joins.
        source: where it was read from (for messages).
        policy: the default placement policy, or None.
        throughputs: job type -> model -> steps/s (the plan step's profile table); may be empty.
        workload: the recent requests' pod list (a CSV path, resolved against the inventory's folder) for FGD's
            workload distribution, or None.
        stated: the per-kind form as given (kind value -> count, or model -> count); empty for the node form.
    """

    devices: Mapping[str, int]
    cpu_millicores: int | None = None
    memory_bytes: int | None = None
    nodes: tuple[Node, ...] = ()
    queues: tuple[QueueSpec, ...] = ()
    cohort: str = "heteroflow"
    source: str = "inventory"
    policy: str | None = None
    throughputs: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    workload: str | None = None
    stated: Mapping[str, int | Mapping[str, int]] = dataclasses.field(default_factory=dict)

    def capacity(self, key: str) -> int | None:
        """Capacity of a key (model, device kind value, :data:`ANY_DEVICES`, ``cpu`` millicores, ``memory``
        bytes); None if unknown."""
        if key == "cpu":
            return self.cpu_millicores
        if key == "memory":
            return self.memory_bytes
        if key == ANY_DEVICES:
            return sum(self.devices.values())
        if key in _kinds():
            return sum(n for k, n in self.devices.items() if kind_of(k) == key)
        return self.devices.get(key, 0)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "inventory") -> ClusterInventory:
        """Build from parsed YAML/JSON (:func:`from_mapping`; same errors)."""
        from heteroflow.components.placement.inventory import from_mapping  # the parser builds on these values

        return from_mapping(data, source=source)

    # --- the plan step's view

    def devices_per_kind(self) -> dict[DeviceKind, int]:
        """Devices per kind, the CPU always present (its stated count, at least 1); a kind the per-kind form
        names with 0 devices is present with 0."""
        host = DeviceKind.host()
        cpu = self.stated.get(host.value)
        out: dict[DeviceKind, int] = {host: max(cpu, 1) if isinstance(cpu, int) else 1}
        for key in self.stated:
            out.setdefault(DeviceKind.parse(key), 0)
        for key, n in self.devices.items():
            kind = DeviceKind.parse(kind_of(key))
            out[kind] = out.get(kind, 0) + n
        return out

    def models_per_kind(self) -> dict[DeviceKind, dict[str, int]]:
        """Per kind, devices per registry model, for the kinds whose models are known (all of the node form; the
        per-kind form's kinds given per model)."""
        out: dict[DeviceKind, dict[str, int]] = {}
        for key, value in self.stated.items():
            if isinstance(value, Mapping):
                out[DeviceKind.parse(key)] = {}
        for key, n in self.devices.items():
            if key in _kinds():
                continue
            per_model = out.setdefault(DeviceKind.parse(kind_of(key)), {})
            per_model[key] = per_model.get(key, 0) + n
        return out

    # --- the placement view

    def for_placement(self) -> PlacementInventory:
        """The simulator's and node placement's view: one model per node, queues with their amounts per key.

        Raises:
            InvalidInventory: no nodes, or a node with devices of several models (the message names the node).
        """
        if not self.nodes:
            raise InvalidInventory(f"{self.source}: placement needs the node form; valid: an inventory with a 'nodes' list")
        nodes: list[PlacementNode] = []
        for n in self.nodes:
            where = _where(self.source, n.line)
            if len(n.devices) > 1:
                raise InvalidInventory(
                    f"{where}nodes[{n.index}] ({n.name}).devices has {len(n.devices)} models ({', '.join(n.devices)}); "
                    "valid for placement: one model per node (list a node per model)"
                )
            if n.devices:
                [(model, count)] = n.devices.items()
                kind = ACCELERATORS[model].kind.value
            else:
                model, count, kind = DeviceKind.host().value, 0, DeviceKind.host().value
            nodes.append(PlacementNode(
                name=n.name, kind=kind, model=model, devices=count, device_memory_bytes=n.device_memory_bytes,
                cpu_millicores=n.cpu_millicores, memory_bytes=n.memory_bytes, cost_per_hour=n.cost_per_hour,
                idle_watts=n.idle_watts, busy_watts=n.busy_watts, datasets=n.datasets,
            ))
        queues: dict[str, PlacementQueue] = {}
        for q in self.queues:
            # every form the parser reads: per model, per device kind, devices of any model, cpu and memory (each
            # enforced in its own scope by the placement round, as Kueue's nominalQuota per flavor is)
            devices = sum(g for k, g in q.guarantee.items() if k not in _HOST_KEYS)
            queues[q.name] = PlacementQueue(name=q.name, guarantee=devices, capability=q.capability.get(ANY_DEVICES),
                                            priority=q.priority or 0, reclaimable=q.reclaimable,
                                            guarantees=dict(q.guarantee), capabilities=dict(q.capability))
        return PlacementInventory(nodes=tuple(nodes), queues=queues, throughputs=self.throughputs, policy=self.policy,
                                  source=self.source, workload=self.workload)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlacementNode:
    """One machine as placement sees it (:meth:`ClusterInventory.for_placement`).

    Attributes:
        name: unique in the inventory.
        kind: the device kind value of its accelerators, or ``cpu`` (a node without accelerators).
        model: accelerator registry key (``nvidia-v100``), or ``cpu`` for a node without accelerators.
        devices: accelerator devices on the node (0 for a CPU-only node).
        device_memory_bytes: memory per device, bytes.
        cpu_millicores, memory_bytes: allocatable (or free) CPU (millicores) and memory (bytes); None where not
            stated (not checked). 0 is stated: none free (a Kubernetes node its pods' requests fill).
        cost_per_hour: whole node, per hour (any currency; the simulator reports the same unit).
        idle_watts: power of the node when on and no device is busy, W.
        busy_watts: power added per busy device, W.
        datasets: data sets cached on the node.
    """

    name: str
    kind: str
    model: str
    devices: int
    device_memory_bytes: int = 0
    cpu_millicores: int | None = None
    memory_bytes: int | None = None
    cost_per_hour: float = 0.0
    idle_watts: float = 0.0
    busy_watts: float = 0.0
    datasets: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlacementQueue:
    """A Volcano-style queue as placement sees it (see :mod:`heteroflow.components.placement.policies` for the semantics).

    Attributes:
        name: the queue's name.
        guarantee: accelerator devices reserved for the queue (its minimum): the sum of its device guarantees, of
            any model, per kind and per model (orders the queues, and reclaim compares usage with it).
        capability: the most devices of any model the queue may use (its elastic maximum, a bare number in the
            inventory); None: no such limit.
        priority: higher wins contended capacity and may reclaim borrowed capacity of lower ones.
        reclaimable: whether devices it borrowed beyond its guarantee may be reclaimed.
        guarantees, capabilities: per key as the inventory states them (a registry model, a device kind value,
            :data:`ANY_DEVICES`, ``cpu`` in millicores, ``memory`` in bytes); empty: ``guarantee`` and
            ``capability`` alone (devices of any model). See :meth:`guaranteed` and :meth:`limits`.
    """

    name: str
    guarantee: int = 0
    capability: int | None = None
    priority: int = 0
    reclaimable: bool = True
    guarantees: Mapping[str, int] = dataclasses.field(default_factory=dict)
    capabilities: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def guaranteed(self) -> dict[str, int]:
        """The guarantee per key (model, kind, :data:`ANY_DEVICES`, ``cpu``, ``memory``)."""
        if self.guarantees:
            return dict(self.guarantees)
        return {ANY_DEVICES: self.guarantee} if self.guarantee else {}

    def limits(self) -> dict[str, int]:
        """The capability per key (model, kind, :data:`ANY_DEVICES`, ``cpu``, ``memory``); a key missing: no limit."""
        out = dict(self.capabilities)
        if self.capability is not None:
            out.setdefault(ANY_DEVICES, self.capability)
        return out


DEFAULT_QUEUE = PlacementQueue(name="default")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlacementInventory:
    """Nodes of one model each, and queues (the placement view of :class:`ClusterInventory`).

    Attributes:
        nodes: the nodes, names unique.
        queues: by name; a job naming no queue goes to ``default`` (created when absent, no guarantee).
        throughputs: job type -> model -> steps/s (the plan step's profile table); may be empty.
        policy: the default policy name, or None.
        source: where it was read from (for messages).
        workload: the recent requests' pod list (CSV path) for FGD, or None.
    """

    nodes: tuple[PlacementNode, ...]
    queues: Mapping[str, PlacementQueue] = dataclasses.field(default_factory=dict)
    throughputs: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    policy: str | None = None
    source: str = "inventory"
    workload: str | None = None

    @property
    def models(self) -> tuple[str, ...]:
        """Device models present, in first-seen order (``cpu`` for CPU-only nodes)."""
        return tuple(dict.fromkeys(n.model for n in self.nodes))

    def capacity(self) -> dict[str, int]:
        """Accelerator devices per model."""
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.model] = out.get(n.model, 0) + n.devices
        return out

    def total_devices(self) -> int:
        return sum(n.devices for n in self.nodes)

    def any_model_capability(self, queue: PlacementQueue, *, who: str) -> int | None:
        """``queue``'s device capability for a consumer that counts a queue's devices of any model (``who``: the
        JCT replay, the fluid ``gavel`` policy, a packing policy): the smallest of its device limits that cover every
        device of the inventory (a bare number; a kind or model when every device here is of it); None: no limit.

        Raises:
            InvalidInventory: a limit that holds only some of the devices here (per model or kind), which such a
                consumer cannot keep; the message names the queue and the limit as the inventory writes it.
        """
        from heteroflow.components.devices.registry import has_devices

        here = [m for m in self.models if has_devices(m)]
        caps = []
        for key, cap in queue.limits().items():
            if key in _HOST_KEYS:
                continue
            if all(within(key, m) for m in here):
                caps.append(cap)
                continue
            covered = [m for m in here if within(key, m)]
            raise InvalidInventory(
                f"{self.source}: queue {queue.name}: capability.{key}={cap} holds only some of the devices here "
                f"({', '.join(covered) or 'none of them'}, of {', '.join(here)}), and {who} counts a queue's devices of any "
                "model; valid there: a capability of any model (a bare number) or of every device here; the round "
                "policies (throughput, power-aware, least-loaded, static, listed) keep it per model"
            )
        return min(caps) if caps else None

    def queue(self, name: str) -> PlacementQueue:
        """The queue ``name`` (``default`` exists even when not listed).

        Raises:
            InvalidTrace: no such queue.
        """
        if name in self.queues:
            return self.queues[name]
        if name == "default":
            return DEFAULT_QUEUE
        from heteroflow.components.placement.policies import InvalidTrace

        raise InvalidTrace(f"queue={name!r} is not in {self.source}; valid: {', '.join(sorted(self.queues) or ['default'])}")


def _assemble(nodes: Sequence[Node], *, source: str, stated: Mapping[str, Any] | None = None,
              cpu_millicores: int | None = None, memory_bytes: int | None = None, cohort: str = "heteroflow") -> ClusterInventory:
    """Devices and (where every node states them) CPU and memory totals from the nodes and the per-kind form."""
    devices: dict[str, int] = {}
    for n in nodes:
        for model, c in n.devices.items():
            devices[model] = devices.get(model, 0) + c
    for kind, value in (stated or {}).items():
        if kind not in _accelerator_kinds():
            continue
        if isinstance(value, Mapping):
            for model, c in value.items():
                devices[model] = devices.get(model, 0) + c
        else:
            devices[kind] = value
    if nodes and cpu_millicores is None and all(n.cpu_millicores is not None for n in nodes):
        cpu_millicores = sum(n.cpu_millicores or 0 for n in nodes)
    if nodes and memory_bytes is None and all(n.memory_bytes is not None for n in nodes):
        memory_bytes = sum(n.memory_bytes or 0 for n in nodes)
    return ClusterInventory(devices=devices, cpu_millicores=cpu_millicores, memory_bytes=memory_bytes, nodes=tuple(nodes),
                            cohort=cohort, source=source, stated=dict(stated or {}))
