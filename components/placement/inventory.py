"""Cluster inventories: one parser for every form, one value with a view per consumer.

An inventory lists a cluster's accelerator devices (per node, or per device kind), its CPU and memory, and the
queues jobs are submitted to. This module reads it once, into :class:`ClusterInventory`, and the consumers take
their views of that one value:

- the plan step (:mod:`heteroflow.components.placement.plan`): devices per kind and per model
  (:meth:`ClusterInventory.devices_per_kind`, :meth:`ClusterInventory.models_per_kind`);
- the manifests (:mod:`heteroflow.pipelines.k8s.manifests`): :attr:`ClusterInventory.devices`, queues with their
  per-resource guarantees and capabilities, node labels and taints;
- the simulator and the plan step's node placement (:mod:`heteroflow.components.placement.policies`): nodes of one model
  each, queues counting devices of any model, throughputs (:meth:`ClusterInventory.for_placement`, a
  :class:`PlacementInventory`).

Forms read (YAML; JSON is YAML too). Per device kind, a count or a count per model (the plan step's
``device_inventory``; any key :meth:`DeviceKind.parse` reads)::

    gpu: {nvidia-a100-80gb: 8, nvidia-t4: 4}
    npu: 16
    cpu_cores: 256                      # optional: the CPU (cores or millicores) and memory the queues share
    memory: 2Ti

Nodes, with devices per model or in the one-model form, and the placement fields::

    version: 1
    policy: throughput                  # the placement policy (optional; heteroflow.components.placement.policies)
    nodes:
      - {name: gpu-a100-0, devices: {nvidia-a100-80gb: 8}, cpu: 96, memory: 1Ti,
         labels: {zone: a}, taints: [{key: dedicated, value: ml, effect: NoSchedule}]}
      - name: v100                      # with replicas: N the nodes are v100-0 .. v100-(N-1)
        replicas: 2
        devices: {kind: gpu, model: v100, count: 4, memory: 16Gi}   # memory default: the registry's
        cost_per_hour: 9.92             # whole node, any currency (default 0)
        idle_watts: 300                 # W, node on and no device busy (default 0)
        busy_watts: 250                 # W added per busy device (default 0)
        datasets: [imagenet]            # data sets cached on the node (data locality)
    throughputs: {train: {v100: 10.0}}  # job type -> model -> steps/s

and, in both forms, queues (Volcano ``Queue`` semantics; see :mod:`heteroflow.components.placement.policies` and
:mod:`heteroflow.pipelines.k8s.manifests` for the sources)::

    cohort: heteroflow                  # the Kueue cohort (default: heteroflow)
    queues:
      - name: npu-training              # a DNS label
        kind: npu                       # optional: the device kind it serves (or team: vision)
        guarantee: {ascend-910b3: 8, cpu: 64, memory: 512Gi}   # per model, device kind, cpu, memory;
                                        # a bare number: devices of any model
        capability: {ascend-910b3: 16}  # optional: the elastic maximum (default: no limit)
        reclaimable: true               # default true
        weight: 1                       # Volcano's share weight, >= 1
        priority: 0                     # optional: the queue's priority
        namespaces: [team-vision]       # LocalQueues (default: [default])

and ``kubectl get nodes -o json`` output (a ``List`` or ``NodeList`` of ``Node`` objects): each node's
allocatable CPU, memory and accelerator extended resources (capacity where allocatable is absent), its labels and
taints; the model comes from the GPU feature discovery label ``nvidia.com/gpu.product`` or the Ascend label
``node.kubernetes.io/npu.chip.name``, and a node whose model is not in the registry counts as CPU-only.

Every error is an :class:`InvalidInventory` whose message starts with the source (``FILE:LINE:`` where the YAML
gives a line), names the node or queue (``nodes[i]``, ``queues[i]``, with the name once it is read) and the field,
and lists what is valid.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.components.devices.accelerators import ACCELERATORS, Accelerator, DeviceKind, find_accelerator
from heteroflow.components.errors import HeteroflowError, InvalidResources
from heteroflow.components.resources import format_cpu, format_memory, parse_cpu, parse_memory

__all__ = [
    "ANY_DEVICES",
    "ClusterInventory",
    "InvalidInventory",
    "Node",
    "PlacementInputError",
    "PlacementInventory",
    "PlacementNode",
    "PlacementQueue",
    "QueueSpec",
    "from_mapping",
    "kubectl_nodes",
    "kubernetes_nodes",
    "load_inventory",
    "load_yaml_with_lines",
    "model_key",
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

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_FIELDS = ("version", "nodes", "queues", "cohort", "cpu_cores", "memory", "policy", "throughputs")
_NODE_KEYS = ("busy_watts", "cost_per_hour", "cpu", "datasets", "devices", "idle_watts", "labels", "memory", "name",
              "replicas", "taints")
_NODE_DEVICE_KEYS = ("count", "kind", "memory", "model")
_QUEUE_KEYS = ("name", "kind", "team", "guarantee", "capability", "reclaimable", "weight", "priority", "namespaces")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
def _model_labels() -> tuple[str, ...]:
    """Node labels that name the accelerator model, from the device kinds (gpu: GPU feature discovery's
    ``nvidia.com/gpu.product``; npu: Ascend MindCluster's ``node.kubernetes.io/npu.chip.name``; plugins' own)."""
    return tuple(k for kind in DeviceKind for k in kind.node_label_keys)


def _kinds() -> tuple[str, ...]:
    return tuple(k.value for k in DeviceKind)


def _accelerator_kinds() -> tuple[str, ...]:
    return tuple(k.value for k in DeviceKind if k.has_devices)


# --- YAML with line numbers ----------------------------------------------------------------------------------


class _Lined(dict):
    """A mapping from YAML that remembers its own line and each key's line (1-based)."""

    line: int = 0
    key_lines: dict[str, int]


class _LinedList(list):
    line: int = 0


def load_yaml_with_lines(text: str) -> Any:
    """Parse YAML (or JSON); mappings and lists remember their line, mappings each key's line (for messages).

    Raises:
        yaml.YAMLError: not YAML.
    """
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: Any, node: Any) -> _Lined:
        out = _Lined()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            out[key] = loader.construct_object(value_node, deep=True)
            out.key_lines[str(key)] = key_node.start_mark.line + 1
        return out

    def sequence(loader: Any, node: Any) -> _LinedList:
        out = _LinedList(loader.construct_object(v, deep=True) for v in node.value)
        out.line = node.start_mark.line + 1
        return out

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, sequence)
    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass


def _line_of(obj: Any, key: str | None = None) -> int:
    if isinstance(obj, _Lined) and key is not None and key in obj.key_lines:
        return obj.key_lines[key]
    return int(getattr(obj, "line", 0))


def _where(source: str, line: int) -> str:
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


def kind_of(key: str) -> str:
    """The device kind value of an amount key (a model, a kind value, or :data:`ANY_DEVICES`, returned as is)."""
    return key if key in _kinds() or key == ANY_DEVICES else ACCELERATORS[key].kind.value


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
        return from_mapping(data, source=source)

    # --- the plan step's view

    def devices_per_kind(self) -> dict[DeviceKind, int]:
        """Devices per kind, the CPU always present (its stated count, at least 1); a kind the per-kind form
        names with 0 devices is present with 0."""
        cpu = self.stated.get(DeviceKind.CPU.value)
        out: dict[DeviceKind, int] = {DeviceKind.CPU: max(cpu, 1) if isinstance(cpu, int) else 1}
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
        """The simulator's and node placement's view: one model per node, queues counting devices of any model.

        Raises:
            InvalidInventory: no nodes, a node with devices of several models, or a queue whose guarantee or
                capability is not a bare device count (each message names the node or queue and the field).
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
                model, count, kind = DeviceKind.CPU.value, 0, DeviceKind.CPU.value
            nodes.append(PlacementNode(
                name=n.name, kind=kind, model=model, devices=count, device_memory_bytes=n.device_memory_bytes,
                cpu_millicores=n.cpu_millicores or 0, memory_bytes=n.memory_bytes or 0, cost_per_hour=n.cost_per_hour,
                idle_watts=n.idle_watts, busy_watts=n.busy_watts, datasets=n.datasets,
            ))
        queues: dict[str, PlacementQueue] = {}
        for i, q in enumerate(self.queues):
            amounts = {}
            for what, value in (("guarantee", q.guarantee), ("capability", q.capability)):
                if set(value) - {ANY_DEVICES}:
                    raise InvalidInventory(
                        f"{self.source}: queues[{i}] ({q.name}).{what}={dict(value)!r}; valid for placement: a bare "
                        "count of devices of any model"
                    )
                amounts[what] = value.get(ANY_DEVICES)
            queues[q.name] = PlacementQueue(name=q.name, guarantee=amounts["guarantee"] or 0, capability=amounts["capability"],
                                            priority=q.priority or 0, reclaimable=q.reclaimable)
        return PlacementInventory(nodes=tuple(nodes), queues=queues, throughputs=self.throughputs, policy=self.policy,
                                  source=self.source)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlacementNode:
    """One machine as placement sees it (:meth:`ClusterInventory.for_placement`).

    Attributes:
        name: unique in the inventory.
        kind: the device kind value of its accelerators, or ``cpu`` (a node without accelerators).
        model: accelerator registry key (``nvidia-v100``), or ``cpu`` for a node without accelerators.
        devices: accelerator devices on the node (0 for a CPU-only node).
        device_memory_bytes: memory per device, bytes.
        cpu_millicores, memory_bytes: allocatable CPU (millicores) and memory (bytes).
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
    cpu_millicores: int = 0
    memory_bytes: int = 0
    cost_per_hour: float = 0.0
    idle_watts: float = 0.0
    busy_watts: float = 0.0
    datasets: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlacementQueue:
    """A Volcano-style queue as placement sees it (see :mod:`heteroflow.components.placement.policies` for the semantics).

    Attributes:
        name: the queue's name.
        guarantee: accelerator devices reserved for the queue (its minimum).
        capability: the most devices the queue may use (its elastic maximum); None: the whole cluster.
        priority: higher wins contended capacity and may reclaim borrowed capacity of lower ones.
        reclaimable: whether devices it borrowed beyond its guarantee may be reclaimed.
    """

    name: str
    guarantee: int = 0
    capability: int | None = None
    priority: int = 0
    reclaimable: bool = True


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
    """

    nodes: tuple[PlacementNode, ...]
    queues: Mapping[str, PlacementQueue] = dataclasses.field(default_factory=dict)
    throughputs: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    policy: str | None = None
    source: str = "inventory"

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

    def queue(self, name: str) -> PlacementQueue:
        """The queue ``name`` (``default`` exists even when not listed).

        Raises:
            InvalidTrace: no such queue.
        """
        if name in self.queues:
            return self.queues[name]
        if name == "default":
            return DEFAULT_QUEUE
        from heteroflow.components.placement.clusters import InvalidTrace

        raise InvalidTrace(f"queue={name!r} is not in {self.source}; valid: {', '.join(sorted(self.queues) or ['default'])}")


# --- field checks ---------------------------------------------------------------------------------------------


def model_key(name: object, *, field: str) -> str:
    """The registry key of an accelerator model (``V100`` -> ``nvidia-v100``), or ``cpu``.

    Raises:
        InvalidInventory: unknown name or a family (the message lists the valid models).
    """
    if isinstance(name, str) and name.strip().lower() == DeviceKind.CPU.value:
        return DeviceKind.CPU.value
    return _model(name, field).name


def _model(name: object, field: str, kind: str | None = None, container: str | None = None) -> Accelerator:
    """One model of the registry; ``field`` names it for lookup errors, ``container`` (default ``field``) for
    the others."""
    try:
        accel = find_accelerator(str(name), field=field)
    except InvalidResources as exc:
        raise InvalidInventory(str(exc)) from None
    subject = container or field
    if accel.is_family:
        raise InvalidInventory(
            f"{subject} names {name!r}, a family ({accel.display_name}); an inventory counts devices of one model: "
            + ", ".join(m.name for m in accel.models)
        )
    if kind is not None and accel.kind.value != kind:
        raise InvalidInventory(
            f"{subject} names {name!r}, a {accel.kind.value} model ({accel.name} is a {accel.kind.value} model, "
            f"not a {kind} one)"
        )
    return accel


def _count(value: object, field: str, *, minimum: int = 0, noun: str = "count") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInventory(f"{field}={value!r} is not a {noun}; valid: an integer >= {minimum}")
    return value


def _number(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidInventory(f"{field}={value!r} is not a number >= 0")
    return float(value)


def dns_label(value: object, field: str) -> str:
    """``value`` if it is a DNS label (lower case, digits, ``-``, at most 63).

    Raises:
        InvalidResources: it is not (the message names ``field``).
    """
    if not isinstance(value, str) or not _DNS_LABEL.fullmatch(value):
        raise InvalidResources(f"{field}={value!r} is not a name; valid: a DNS label (lower case, digits, '-', <= 63)")
    return value


def _mapping(value: Any, field: str, valid: Sequence[str] | None, *, source: str, line: int) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInventory(f"{_where(source, line)}{field} is {type(value).__name__}, not a mapping")
    if valid is not None:
        for key in value:
            if key not in valid:
                raise InvalidInventory(
                    f"{_where(source, _line_of(value, str(key)) or line)}{field} key {key!r} is unknown; valid: {', '.join(valid)}"
                )
    return value


def _quantity(parse: Any, value: object, field: str) -> int:
    try:
        return int(parse(value, field=field))
    except InvalidResources as exc:
        raise InvalidInventory(str(exc)) from None


# --- the parser -----------------------------------------------------------------------------------------------


def load_inventory(source: str | os.PathLike[str], *, text: str | None = None) -> ClusterInventory:
    """Read an inventory from a YAML or JSON file (any form in the module docstring, ``kubectl get nodes -o json``
    output included), or from ``text`` with ``source`` naming it in messages.

    Raises:
        InvalidInventory: the file cannot be read or is not YAML, or holds an invalid value; the message starts
            ``FILE:LINE:``, names the node or queue and the field, and what is valid.
    """
    name = os.fspath(source)
    if text is None:
        try:
            text = Path(name).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidInventory(f"{name}: cannot be read as an inventory ({exc.strerror or exc})") from None
    try:
        data = load_yaml_with_lines(text)
    except Exception as exc:  # yaml.YAMLError carries the line in its message
        raise InvalidInventory(f"{name}: not valid YAML or JSON ({exc})") from None
    return from_mapping(data, source=name)


def _is_node_list(data: Mapping[str, Any]) -> bool:
    return data.get("kind") in ("List", "NodeList") and "items" in data


def from_mapping(data: Any, *, source: str = "inventory") -> ClusterInventory:
    """Build an inventory from parsed YAML/JSON (see :func:`load_inventory`; same errors)."""
    if data is None:
        raise InvalidInventory(f"{source}: the file is empty; valid: a mapping with nodes or device kinds, and queues")
    if not isinstance(data, Mapping):
        raise InvalidInventory(f"{_where(source, _line_of(data))}an inventory is a mapping (nodes or device kinds, "
                               f"and queues), not {type(data).__name__}")
    if _is_node_list(data):
        items = data["items"]
        if not isinstance(items, list):
            raise InvalidInventory(f"{source}: items is {type(items).__name__}, not a list of Node objects")
        nodes = kubectl_nodes(items, source=source)
        return _assemble(nodes, source=source)
    stated: dict[str, Any] = {}
    for key in data:
        if key in _FIELDS:
            continue
        try:
            kind = DeviceKind.parse(key, field=f"{source} key")
        except InvalidResources as exc:
            raise InvalidInventory(
                f"{_where(source, _line_of(data, str(key)))}unknown field {key!r}: {exc}; valid: {', '.join(_FIELDS)}, "
                f"or a device kind: {', '.join(_kinds())}"
            ) from None
        stated[kind.value] = _stated_kind(data[key], key, kind.value, source=source, line=_line_of(data, str(key)))
    if data.get("version", 1) != 1:
        raise InvalidInventory(f"{_where(source, _line_of(data, 'version'))}version={data.get('version')!r} is unknown; valid: 1")
    raw_nodes = data.get("nodes")
    nodes: list[Node] = []
    if raw_nodes is not None:
        both = [k for k in stated if k in _accelerator_kinds()]
        if both:
            raise InvalidInventory(f"{_where(source, _line_of(data, 'nodes'))}give devices either per node (nodes) or per "
                                   f"device kind ({', '.join(both)}), not both")
        if not isinstance(raw_nodes, list):
            raise InvalidInventory(f"{_where(source, _line_of(data, 'nodes'))}nodes is {type(raw_nodes).__name__}, not a list")
        nodes = _parse_nodes(raw_nodes, source=source)
    cpu_m = _quantity(parse_cpu, data["cpu_cores"], "cpu_cores") if data.get("cpu_cores") is not None else None
    mem_b = _quantity(parse_memory, data["memory"], "memory") if data.get("memory") is not None else None
    try:
        cohort = dns_label(data.get("cohort", "heteroflow"), "cohort")
    except InvalidResources as exc:
        raise InvalidInventory(f"{_where(source, _line_of(data, 'cohort'))}{exc}") from None
    inv = _assemble(nodes, source=source, stated=stated, cpu_millicores=cpu_m, memory_bytes=mem_b, cohort=cohort)
    queues = _parse_queues(data.get("queues"), inv, line=_line_of(data, "queues"))
    throughputs = _parse_throughputs(data.get("throughputs"), source=source, line=_line_of(data, "throughputs"))
    policy = data.get("policy")
    if policy is not None:
        from heteroflow.components.placement.policies import get_policy

        get_policy(str(policy), where=_where(source, _line_of(data, "policy")))
    return dataclasses.replace(inv, queues=queues, throughputs=throughputs, policy=None if policy is None else str(policy))


def _stated_kind(value: Any, key: str, kind: str, *, source: str, line: int) -> int | dict[str, int]:
    """One per-kind entry: a count, or (for an accelerator kind) a count per model."""
    prefix = f"{source}:{line}: " if line else ""
    field = f"{source}[{key!r}]"
    try:
        if isinstance(value, Mapping) and kind in _accelerator_kinds():
            per_model: dict[str, int] = {}
            for name, n in value.items():
                accel = _model(name, f"{field} model", kind, container=field)
                per_model[accel.name] = per_model.get(accel.name, 0) + _count(n, f"{field}[{name!r}]", noun="device count")
            return per_model
        return _count(value, field, noun="device count")
    except InvalidInventory as exc:
        raise InvalidInventory(f"{prefix}{exc}") from None


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


def _node_devices(value: Any, i: int, *, source: str, line: int) -> tuple[dict[str, int], int | None]:
    """A node's devices, ``{model: count, ...}`` or the one-model form ``{kind, model, count, memory}``, and the
    one-model form's device memory (bytes) when it states one."""
    field = f"nodes[{i}].devices"
    raw = _mapping(value, field, None, source=source, line=line)
    where = _where(source, _line_of(raw) or line)
    try:
        if "model" in raw or "count" in raw or "kind" in raw:
            raw = _mapping(value, field, _NODE_DEVICE_KEYS, source=source, line=line)
            count = _count(raw.get("count", 0), f"{field}.count", noun="count of devices")
            if count == 0 or str(raw.get("model", DeviceKind.CPU.value)).lower() == DeviceKind.CPU.value:
                return {}, None
            accel = _model(raw.get("model"), f"{field}.model")
            if "kind" in raw:
                try:
                    stated = DeviceKind.parse(raw["kind"], field=f"{field}.kind")
                except InvalidResources as exc:
                    raise InvalidInventory(str(exc)) from None
                if stated is not accel.kind:
                    raise InvalidInventory(f"{field}.kind={raw['kind']!r} but {accel.name} is a {accel.kind.value} model")
            mem = _quantity(parse_memory, raw["memory"], f"{field}.memory") if "memory" in raw else None
            return {accel.name: count}, mem
        per_model: dict[str, int] = {}
        for model, c in raw.items():
            accel = _model(model, f"{field} key")
            per_model[accel.name] = per_model.get(accel.name, 0) + _count(c, f"{field}.{model}", noun="device count")
        return per_model, None
    except InvalidInventory as exc:
        raise InvalidInventory(f"{where}{exc}") from None


def _labels(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in value.items()):
        raise InvalidInventory(f"{field}={value!r}; valid: a mapping of label key -> value")
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def _taints(value: Any, field: str) -> tuple[dict[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidInventory(f"{field}={value!r}; valid: a list of {{key, value, effect}}")
    out = []
    for j, t in enumerate(value):
        if not isinstance(t, Mapping) or not isinstance(t.get("key"), str) or set(t) - {"key", "value", "effect", "timeAdded"}:
            raise InvalidInventory(f"{field}[{j}]={t!r}; valid: a mapping with key, value (optional) and effect")
        if t.get("effect") not in _TAINT_EFFECTS:
            raise InvalidInventory(f"{field}[{j}].effect={t.get('effect')!r}; valid: {', '.join(_TAINT_EFFECTS)}")
        out.append({k: str(t[k]) for k in ("key", "value", "effect") if t.get(k) is not None})
    return tuple(out)


def _parse_nodes(raw_nodes: Sequence[Any], *, source: str) -> list[Node]:
    nodes: list[Node] = []
    seen: dict[str, tuple[int, int]] = {}
    for i, raw in enumerate(raw_nodes):
        line = _line_of(raw)
        where = _where(source, line)
        n = _mapping(raw, f"nodes[{i}]", _NODE_KEYS, source=source, line=line)
        if raw is None:
            raise InvalidInventory(f"{where}nodes[{i}] is empty; valid: a mapping with at least a name")
        base = n.get("name")
        if not isinstance(base, str) or not base.strip():
            raise InvalidInventory(f"{where}nodes[{i}].name={base!r}; valid: a non-empty string")
        try:
            replicas = _count(n.get("replicas", 1), f"nodes[{i}].replicas", minimum=1)
            per_model, mem = _node_devices(n.get("devices"), i, source=source, line=line)
            node_cpu = _quantity(parse_cpu, n["cpu"], f"nodes[{i}].cpu") if n.get("cpu") is not None else None
            node_mem = _quantity(parse_memory, n["memory"], f"nodes[{i}].memory") if n.get("memory") is not None else None
            datasets = n.get("datasets") or []
            if not isinstance(datasets, list) or not all(isinstance(d, str) for d in datasets):
                raise InvalidInventory(f"nodes[{i}].datasets={datasets!r}; valid: a list of data set names")
            fields = dict(
                devices=per_model, cpu_millicores=node_cpu, memory_bytes=node_mem,
                device_memory_bytes=mem if mem is not None else min(
                    (ACCELERATORS[m].device_memory_bytes or 0 for m in per_model), default=0),
                labels=_labels(n.get("labels"), f"nodes[{i}].labels"), taints=_taints(n.get("taints"), f"nodes[{i}].taints"),
                cost_per_hour=_number(n.get("cost_per_hour", 0), f"nodes[{i}].cost_per_hour"),
                idle_watts=_number(n.get("idle_watts", 0), f"nodes[{i}].idle_watts"),
                busy_watts=_number(n.get("busy_watts", 0), f"nodes[{i}].busy_watts"),
                datasets=frozenset(datasets),
            )
        except InvalidInventory as exc:
            text = str(exc)
            raise InvalidInventory(text if text.startswith(f"{source}:") else f"{where}{text}") from None
        for name in [base] if replicas == 1 else [f"{base}-{r}" for r in range(replicas)]:
            if name in seen:
                j, first_line = seen[name]
                what = f"the node on line {first_line} (nodes[{j}])" if first_line else f"nodes[{j}]"
                raise InvalidInventory(f"{where}nodes[{i}].name={name!r} duplicates {what}; node names must be unique")
            seen[name] = (i, line)
            nodes.append(Node(name=name, index=i, line=line, **fields))  # type: ignore[arg-type]
    return nodes


def _amounts(value: Any, field: str) -> dict[str, int]:
    """A guarantee/capability -> {model | kind | cpu | memory: amount}; a bare number counts accelerator devices
    of any model under :data:`ANY_DEVICES`."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        return {ANY_DEVICES: _count(value, field, noun="device count")}
    out: dict[str, int] = {}
    for key, amount in value.items():
        sub = f"{field}.{key}"
        if key == "cpu":
            out["cpu"] = _quantity(parse_cpu, amount, sub)
        elif key == "memory":
            out["memory"] = _quantity(parse_memory, amount, sub)
        elif key in _kinds():
            out[key] = _count(amount, sub, noun="device count")
        else:
            out[_model(key, f"{field} key").name] = _count(amount, sub, noun="device count")
    return out


def _show_field(field: str, key: str, amount: int) -> str:
    """``guarantee 4`` for a bare device count, ``guarantee.nvidia-t4=3`` for a keyed amount."""
    return f"{field} {amount}" if key == ANY_DEVICES else f"{field}.{key}={show_amount(key, amount)}"


def _parse_queues(raw: Any, inv: ClusterInventory, *, line: int) -> tuple[QueueSpec, ...]:
    source = inv.source
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidInventory(f"{_where(source, line)}queues is {type(raw).__name__}, not a list")
    out: list[QueueSpec] = []
    seen: dict[str, int] = {}
    scopes = [s for s in dict.fromkeys(["cpu", "memory", *inv.devices, *_kinds(), ANY_DEVICES])
              if not (s in inv.devices and s in _kinds()) and inv.capacity(s) is not None]
    for i, item in enumerate(raw):
        qline = _line_of(item)
        where = _where(source, qline)
        q = _mapping(item, f"queues[{i}]", _QUEUE_KEYS, source=source, line=qline)
        try:
            name = dns_label(q.get("name"), f"queues[{i}].name")
            if name in seen or name == f"{inv.cohort}-shared":
                raise InvalidInventory(f"queues[{i}].name={name!r} is taken (queues[{seen.get(name)}] or the cohort's shared queue)")
            seen[name] = i
            kind = q.get("kind")
            if kind is not None:
                kind = DeviceKind.parse(kind, field=f"queues[{i}].kind").value
            team = q.get("team")
            if team is not None:
                dns_label(team, f"queues[{i}].team")
            guarantee = _amounts(q.get("guarantee"), f"queues[{i}].guarantee")
            capability = _amounts(q.get("capability"), f"queues[{i}].capability")
            for key, g in guarantee.items():
                if key in capability and g > capability[key]:
                    raise InvalidInventory(f"queues[{i}] ({name}): {_show_field('guarantee', key, g)} is above its "
                                           f"{_show_field('capability', key, capability[key])}")
            reclaimable = q.get("reclaimable", True)
            if not isinstance(reclaimable, bool):
                raise InvalidInventory(f"queues[{i}].reclaimable={reclaimable!r} is not a boolean; valid: true, false")
            priority = q.get("priority")
            if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
                raise InvalidInventory(f"queues[{i}].priority={priority!r} is not an integer")
            weight = q.get("weight", 1)
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
                raise InvalidInventory(f"queues[{i}].weight={weight!r}; valid: an integer >= 1")
            namespaces = q.get("namespaces", ["default"])
            if not isinstance(namespaces, list) or not namespaces:
                raise InvalidInventory(f"queues[{i}].namespaces={namespaces!r}; valid: a non-empty list of namespace names")
            ns = tuple(dns_label(n, f"queues[{i}].namespaces[{j}]") for j, n in enumerate(namespaces))
        except InvalidResources as exc:
            raise InvalidInventory(f"{where}{exc}") from None
        out.append(QueueSpec(name=name, kind=kind, team=team, guarantee=guarantee, capability=capability,
                             reclaimable=reclaimable, weight=weight, priority=priority, namespaces=ns))
        _check_guarantees(out, inv, scopes, index=i, where=where)
    return tuple(out)


def _within(scope: str, key: str) -> bool:
    """Whether a guarantee under ``key`` counts against the capacity of ``scope``."""
    if scope in ("cpu", "memory"):
        return key == scope
    if key in ("cpu", "memory"):
        return False
    if scope == ANY_DEVICES:
        return True
    if scope in _kinds():
        return key != ANY_DEVICES and kind_of(key) == scope
    return key == scope


def _check_guarantees(queues: Sequence[QueueSpec], inv: ClusterInventory, scopes: Sequence[str], *, index: int, where: str) -> None:
    """The guarantees of the queues so far, summed, fit the capacity: per model, per device kind, over all
    accelerators (with any-model guarantees), CPU and memory (where the inventory states them); the narrowest
    scope first, so the message names the model. A guarantee is capacity reserved for its queue."""
    last = queues[-1]
    for scope in scopes:
        cap = inv.capacity(scope)
        assert cap is not None  # scopes hold only known capacities
        per_queue = {q.name: sum(g for k, g in q.guarantee.items() if _within(scope, k)) for q in queues}
        total = sum(per_queue.values())
        if total <= cap:
            continue
        own = per_queue[last.name]
        of = "" if scope == ANY_DEVICES else f" of {scope}"
        unit = " devices" if scope == ANY_DEVICES else of
        head = (f"guarantee {show_amount(scope, own)}{of} is above the cluster's capacity of {show_amount(scope, cap)}"
                if own > cap else
                f"guarantees add up to {show_amount(scope, total)}{unit}, above the cluster's capacity of {show_amount(scope, cap)}")
        who = ", ".join(f"{name}: {show_amount(scope, g)}" for name, g in per_queue.items() if g)
        raise InvalidInventory(
            f"{where}queues[{index}] ({last.name}): {head}; queues guarantee {show_amount(scope, total)} of {scope} ({who}), "
            f"above the capacity {show_amount(scope, cap)}; valid: guarantees that add up to at most the capacity"
        )


def _parse_throughputs(raw: Any, *, source: str, line: int) -> dict[str, dict[str, float]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidInventory(f"{_where(source, line)}throughputs must map job -> model -> steps/s")
    out: dict[str, dict[str, float]] = {}
    for job, per_model in raw.items():
        where = _where(source, _line_of(raw, str(job)))
        if not isinstance(per_model, Mapping):
            raise InvalidInventory(f"{where}throughputs[{job!r}] must map model -> steps/s")
        row: dict[str, float] = {}
        for m, v in per_model.items():
            mwhere = _where(source, _line_of(per_model, str(m)))
            try:
                row[model_key(m, field=f"throughputs[{job!r}] model")] = _number(v, f"throughputs[{job!r}][{m!r}]")
            except InvalidInventory as exc:
                raise InvalidInventory(f"{mwhere}{exc}") from None
        out[str(job)] = row
    return out


# --- Kubernetes nodes -----------------------------------------------------------------------------------------


def _k8s_node(name: str, labels: Mapping[str, str], taints: Iterable[Mapping[str, Any]], alloc: Mapping[str, Any],
              used: Mapping[str, int], *, index: int = 0) -> Node:
    """One Kubernetes node: allocatable minus ``used`` (CPU millicores, memory bytes, devices per resource name);
    the model from its labels (a model not in the registry, or not allocatable, counts as CPU-only)."""
    devices: dict[str, int] = {}
    mem = 0
    label = next((labels[k] for k in _model_labels() if labels.get(k)), None)
    if label:
        try:
            accel = find_accelerator(label.removeprefix("NVIDIA-").removeprefix("Tesla-").split("-SXM")[0].split("-PCIE")[0])
        except InvalidResources:
            accel = None
        if accel is not None and not accel.is_family:
            resource = next((r for r in set(accel.resource_names.values()) if r in alloc), None)
            if resource is not None:
                devices = {accel.name: max(int(alloc[resource]) - used.get(resource, 0), 0)}
                mem = accel.device_memory_bytes or 0
    cpu = max(parse_cpu(alloc.get("cpu", "0")) - used.get("cpu", 0), 0)
    memory = max(parse_memory(alloc.get("memory", "0")) - used.get("memory", 0), 0)
    kept = tuple({k: str(t[k]) for k in ("key", "value", "effect") if t.get(k) is not None} for t in taints)
    return Node(name=name, devices=devices, cpu_millicores=cpu, memory_bytes=memory, device_memory_bytes=mem,
                labels=dict(labels), taints=kept, index=index)


def kubectl_nodes(items: Sequence[Any], *, source: str = "kubectl get nodes -o json") -> list[Node]:
    """Nodes from ``kubectl get nodes -o json`` items (``Node`` objects as JSON): allocatable (else capacity)
    CPU, memory and accelerators, labels and taints.

    Raises:
        InvalidInventory: an item that is not a Node with ``metadata.name``, or a quantity that does not parse
            (the message names the item and the field).
    """
    out: list[Node] = []
    for i, item in enumerate(items):
        field = f"items[{i}]"
        if not isinstance(item, Mapping) or item.get("kind", "Node") != "Node":
            raise InvalidInventory(f"{source}: {field} is not a Node object; valid: kubectl get nodes -o json output")
        meta = item.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInventory(f"{source}: {field}.metadata.name={name!r}; valid: a non-empty string")
        status = item.get("status") or {}
        alloc = status.get("allocatable") or status.get("capacity") or {}
        try:
            out.append(_k8s_node(name, meta.get("labels") or {}, (item.get("spec") or {}).get("taints") or [], alloc, {}, index=i))
        except (InvalidResources, ValueError) as exc:
            raise InvalidInventory(f"{source}: {field} ({name}).status.allocatable: {exc}") from None
    return out


def kubernetes_nodes(nodes: Iterable[Any], pods: Iterable[Any] = ()) -> list[PlacementNode]:
    """Nodes from Kubernetes API objects (``V1Node``, ``V1Pod``; no I/O), as placement sees them: allocatable
    minus what running and pending-bound pods request; the model as :func:`kubectl_nodes` reads it."""
    requested: dict[str, dict[str, int]] = {}
    for pod in pods:
        if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
            continue
        node_name = pod.spec.node_name
        if not node_name:
            continue
        acc = requested.setdefault(node_name, {})
        for c in pod.spec.containers or []:
            req = (c.resources.requests or {}) if c.resources is not None else {}
            for key, value in req.items():
                if key == "cpu":
                    acc["cpu"] = acc.get("cpu", 0) + parse_cpu(value)
                elif key == "memory":
                    acc["memory"] = acc.get("memory", 0) + parse_memory(value)
                else:
                    acc[key] = acc.get(key, 0) + int(value)
    parsed = []
    for i, node in enumerate(nodes):
        taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in (getattr(node.spec, "taints", None) or [])]
        parsed.append(_k8s_node(node.metadata.name, node.metadata.labels or {}, taints, node.status.allocatable or {},
                                requested.get(node.metadata.name, {}), index=i))
    if not parsed:
        return []
    return list(_assemble(parsed, source="kubernetes").for_placement().nodes)
