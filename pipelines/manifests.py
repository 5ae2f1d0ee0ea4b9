"""The queue and job manifests that make heteroflow's annotations take effect on a cluster.

A compiled pipeline and the Airflow pods *annotate* queues (``scheduling.volcano.sh/queue-name``,
``kueue.x-k8s.io/queue-name``); this module renders the objects those annotations point at, from a cluster
inventory and a cluster profile (:mod:`heteroflow.components.cluster`), as side-effect-free builders that return
plain manifests (``dict``), each validated against the real schema:

- Volcano ``Queue`` (``scheduling.volcano.sh/v1beta1``) per inventory queue (a device kind or a team):
  ``guarantee`` (resources reserved for it), ``capability`` (its elastic maximum), ``reclaimable`` (whether
  others may take back what it uses above its share) and ``weight`` [VQ];
- Kueue ``ResourceFlavor`` (``kueue.x-k8s.io/v1beta2``) per accelerator model in the inventory, with the node
  label that selects the model under the profile's label convention (``nvidia.com/gpu.product``,
  ``cloud.google.com/gke-accelerator``, ``node.kubernetes.io/npu.chip.name``) and the tolerations of its nodes'
  usual taint; one ``cpu`` flavor for CPU and memory [KF];
- Kueue ``ClusterQueue`` per inventory queue, in one cohort: ``cpu``/``memory`` in one resource group (flavor
  ``cpu``: a CPU-only pod never walks the accelerator flavors), every accelerator resource name in a second one
  whose flavors come in the order of the pipeline's candidates (then the inventory's other models; each flavor
  lists every covered resource, 0 for the names its model does not use, so the order holds across vendors); ``nominalQuota`` = the queue's guarantee, ``borrowingLimit`` = capability minus
  guarantee; ``flavorFungibility`` ``TryNextFlavor`` for both borrowing and preemption, so a workload that does
  not fit a flavor as it is tries the next candidate's flavor before it borrows or preempts [KCQ]. The capacity no
  queue is guaranteed goes to a lending-only ClusterQueue ``<cohort>-shared`` (Kueue's capacity is the sum of
  the nominal quotas in a cohort);
- Kueue ``LocalQueue`` per queue and namespace;
- a multi-worker train as Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) or training-operator
  v1 ``PyTorchJob`` (``kubeflow.org/v1``), chosen by the profile's ``training_job``, with gang scheduling: a Volcano
  ``PodGroup`` with ``minMember`` = workers (TrainJob; PyTorchJob's ``runPolicy.schedulingPolicy.minAvailable``
  makes the operator create it), or, on a Kueue cluster, the queue label on the job, which Kueue admits as one
  workload: all pods or none [KA].

Mapping Volcano's ``reclaimable`` onto Kueue: Kueue has no per-queue "reclaimable" flag; only *borrowed* capacity
can be reclaimed there (``preemption.reclaimWithinCohort``). A queue with ``reclaimable: false`` is therefore
rendered with ``borrowingLimit: 0`` (it never borrows, so nothing it runs can be reclaimed), and every queue may
reclaim its own guarantee from borrowers (``reclaimWithinCohort: Any``).

Quotas are per resource *name*. Under a device plugin that names several models alike (the official NVIDIA plugin's
``nvidia.com/gpu``, MindCluster's ``huawei.com/Ascend910``), Volcano adds per-model guarantees up under that name;
Kueue keeps them apart by flavor. A guarantee given per device kind (``gpu: 4``) is spread over that kind's
flavors in flavor order, each up to what per-model guarantees leave free; a capability per device kind caps each
of that kind's flavors (Kueue limits borrowing per flavor).

Inventory file (YAML or JSON). Today's ``device_inventory`` form is accepted as is, with queue fields beside it::

    gpu: {nvidia-a100-80gb: 8, nvidia-t4: 4}   # today's form: per kind, a count or a count per model
    npu: {ascend-910b3: 16}
    cpu_cores: 256                             # optional: the CPU and memory the queues share
    memory: 2Ti

or nodes, with devices per model or in the placement inventory's one-model form (``replicas``, ``cost_per_hour``,
``idle_watts``, ``busy_watts``, ``datasets`` and the top-level ``policy`` and ``throughputs`` are read by the
placement step and accepted here)::

    nodes:
      - {name: gpu-a100-0, devices: {nvidia-a100-80gb: 8}, cpu: 96, memory: 1Ti}
      - {name: npu, replicas: 2, devices: {kind: npu, model: ascend-910b3, count: 8}, cpu: 192, memory: 1536Gi}

and in both forms::

    cohort: heteroflow                         # the Kueue cohort (default: heteroflow)
    queues:
      - name: npu-training                     # a DNS label; the Volcano Queue, ClusterQueue and LocalQueue name
        kind: npu                              # optional: the device kind it serves (or team: vision)
        guarantee: {ascend-910b3: 8, cpu: 64, memory: 512Gi}   # model, device kind, cpu (cores), memory;
                                               # a bare number: devices of any model (the placement form)
        capability: {ascend-910b3: 16}         # optional: the elastic maximum (default: no limit)
        reclaimable: true                      # default true
        weight: 1                              # Volcano's share weight, >= 1
        priority: 0                            # optional: Volcano's queue priority (Kueue has none)
        namespaces: [team-vision]              # LocalQueues (default: [default])

Bad input raises :class:`InvalidInventory` naming the file, the field and what is valid: an unknown model, a
family where a model is needed, a negative count, a duplicate node or queue name, a guarantee above the capacity
(summed over queues) or above the queue's own capability.

Sources: [VQ] Volcano Queue, https://volcano.sh/en/docs/queue/ (v1.15 CRD shipped in ``cache/data/crds``);
[KF] Kueue ResourceFlavor, https://kueue.sigs.k8s.io/docs/concepts/resource_flavor/; [KCQ] Kueue ClusterQueue
(resource groups, cohort, borrowingLimit, flavorFungibility, preemption),
https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/; [KA] Kueue all-or-nothing with ready pods,
https://kueue.sigs.k8s.io/docs/tasks/manage/setup_wait_for_pods_ready/; [KT] Kubeflow Trainer TrainJob v2,
https://www.kubeflow.org/docs/components/trainer/; [PJ] PyTorchJob (training-operator v1),
https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.components.accelerators import ACCELERATORS, Accelerator, DeviceKind, find_accelerator
from heteroflow.components.cluster import DEFAULT_PROFILE, ClusterProfile
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import Candidates, Resources, format_cpu, format_memory, parse_cpu, parse_memory
# the multi-node train's job (rendered in components, where the train step's launcher needs it); importable here too
from heteroflow.components.trainjob import GROUP_ANNOTATION, TRAINER_CONTAINER, TRAINER_RUNTIME, training_job_manifests

__all__ = [
    "CPU_FLAVOR",
    "GROUP_ANNOTATION",
    "K8S_VERSION",
    "ClusterInventory",
    "InvalidInventory",
    "Node",
    "QueueSpec",
    "TRAINER_RUNTIME",
    "flavor_order",
    "kueue_manifests",
    "load_inventory",
    "render_all",
    "resource_flavors",
    "training_job_manifests",
    "validate",
    "volcano_queues",
    "write_manifests",
]

CPU_FLAVOR = "cpu"
"""The ResourceFlavor that holds CPU and memory quota (no node labels: CPU and memory are on every node)."""
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_KINDS = tuple(k.value for k in DeviceKind)
_ANY = "accelerators"
"""The amount key of a guarantee or capability given as a bare number: accelerator devices of any model."""
_TOP_KEYS = ("version", "nodes", "queues", "cohort", "cpu_cores", "memory", *_KINDS, "policy", "throughputs")
_NODE_KEYS = ("name", "devices", "cpu", "memory", "replicas", "cost_per_hour", "idle_watts", "busy_watts", "datasets")
_NODE_DEVICE_KEYS = ("kind", "model", "count", "memory")
_QUEUE_KEYS = ("name", "kind", "team", "guarantee", "capability", "reclaimable", "weight", "priority", "namespaces")


class InvalidInventory(InvalidResources):
    """A cluster inventory file or value is invalid; the message names the file, the field and what is valid."""


# --- the inventory -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One node: name, accelerator devices per registry model, CPU (millicores) and memory (bytes), or None
    where not stated."""

    name: str
    devices: Mapping[str, int]
    cpu_millicores: int | None = None
    memory_bytes: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueSpec:
    """One queue (a device kind's or a team's).

    Attributes:
        name: DNS label; the name of its Volcano Queue, Kueue ClusterQueue and LocalQueues.
        kind: the device kind it serves, or None; team: the team it serves, or None (documentation only).
        guarantee, capability: per key (a registry model, a device kind value, ``cpu`` in millicores,
            ``memory`` in bytes) the amount guaranteed and the elastic maximum (a key missing from
            ``capability`` has no limit).
        reclaimable: whether what it uses above its guarantee may be taken back.
        weight: Volcano's share weight (>= 1).
        priority: Volcano's queue priority (higher is served first and reclaimed last), or None.
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


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInventory:
    """A cluster's devices and queues.

    Attributes:
        devices: accelerator count per registry model (``nvidia-a100-80gb``) or, where only the kind is known
            (today's ``{"gpu": 4}``), per device kind value (``gpu``).
        cpu_millicores, memory_bytes: the CPU and memory of the cluster, or None where not stated.
        nodes: the nodes, when the inventory lists them.
        queues: the queues, in file order.
        cohort: the Kueue cohort every ClusterQueue joins.
        source: the file it came from (for messages).
    """

    devices: Mapping[str, int]
    cpu_millicores: int | None = None
    memory_bytes: int | None = None
    nodes: tuple[Node, ...] = ()
    queues: tuple[QueueSpec, ...] = ()
    cohort: str = "heteroflow"
    source: str = "inventory"

    def capacity(self, key: str) -> int | None:
        """Capacity of a key (model, device kind value, ``cpu`` millicores, ``memory`` bytes); None if unknown."""
        if key == "cpu":
            return self.cpu_millicores
        if key == "memory":
            return self.memory_bytes
        if key == _ANY:
            return sum(self.devices.values())
        if key in _KINDS:
            return sum(n for k, n in self.devices.items() if _kind_of(k) == key)
        return self.devices.get(key, 0)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "inventory") -> ClusterInventory:
        """Build from the parsed YAML/JSON mapping (the format is in this module's docstring).

        Raises:
            InvalidInventory: an unknown field, model or kind, a bad count or quantity, a duplicate node or queue
                name, a guarantee above the capacity or above the queue's capability.
        """
        try:
            return _parse(data, source)
        except InvalidInventory:
            raise
        except InvalidResources as exc:
            raise InvalidInventory(f"{source}: {exc}") from None


def _kind_of(key: str) -> str:
    return key if key in _KINDS or key == _ANY else ACCELERATORS[key].kind.value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidResources(f"{where}={value!r} is not a device count; valid: an integer >= 0")
    return value


def _model(name: Any, where: str, kind: str | None = None) -> Accelerator:
    accel = find_accelerator(str(name), field=where)
    if accel.is_family:
        raise InvalidResources(
            f"{where}={name!r} is a family ({accel.display_name}); an inventory counts devices of one model: "
            + ", ".join(m.name for m in accel.models)
        )
    if kind is not None and accel.kind.value != kind:
        raise InvalidResources(f"{where}={name!r} is a {accel.kind.value} model, not a {kind} one")
    return accel


def _mapping(value: Any, where: str, valid: Sequence[str] | None) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidResources(f"{where} is {type(value).__name__}, not a mapping")
    if valid is not None:
        unknown = sorted(str(k) for k in value if k not in valid)
        if unknown:
            raise InvalidResources(f"unknown field {', '.join(map(repr, unknown))} in {where}; valid: {', '.join(valid)}")
    return value


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _DNS_LABEL.fullmatch(value):
        raise InvalidResources(f"{where}={value!r} is not a name; valid: a DNS label (lower case, digits, '-', <= 63)")
    return value


def _amounts(value: Any, where: str, devices: Mapping[str, int]) -> dict[str, int]:
    """A guarantee/capability mapping -> {model | kind | cpu | memory: amount}; a bare number counts
    accelerator devices of any model (the placement inventory's form) under :data:`_ANY`."""
    out: dict[str, int] = {}
    if isinstance(value, int) and not isinstance(value, bool) or (isinstance(value, (int, float)) and value < 0):
        return {_ANY: _count(value, where)}
    for key, amount in _mapping(value, where, None).items():
        field = f"{where}.{key}"
        if key == "cpu":
            out["cpu"] = parse_cpu(amount, field=field)
        elif key == "memory":
            out["memory"] = parse_memory(amount, field=field)
        elif key in _KINDS:
            out[key] = _count(amount, field)
        else:
            out[_model(key, f"{where} key").name] = _count(amount, field)
    return out


def _node_devices(value: Any, i: int) -> dict[str, int]:
    """A node's devices: ``{model: count, ...}``, or the placement inventory's one-model form ``{kind, model,
    count, memory}``."""
    where = f"nodes[{i}].devices"
    raw = _mapping(value, where, None)
    if "model" in raw or "count" in raw:
        raw = _mapping(value, where, _NODE_DEVICE_KEYS)
        count = _count(raw.get("count", 0), f"{where}.count")
        if count == 0 or raw.get("model", "cpu") == "cpu":
            return {}
        accel = _model(raw.get("model"), f"{where}.model")
        if "kind" in raw and str(raw["kind"]).lower() != accel.kind.value:
            raise InvalidResources(f"{where}.kind={raw['kind']!r} but {accel.name} is a {accel.kind.value} model")
        return {accel.name: count}
    per_model: dict[str, int] = {}
    for model, c in raw.items():
        accel = _model(model, f"{where} key")
        per_model[accel.name] = per_model.get(accel.name, 0) + _count(c, f"{where}.{model}")
    return per_model


def _parse(data: Any, source: str) -> ClusterInventory:
    if data is None:
        raise InvalidInventory(f"{source}: the file is empty; valid: a mapping with nodes or device kinds, and queues")
    top = _mapping(data, f"{source} (top level)", _TOP_KEYS)
    if top.get("version", 1) != 1:
        raise InvalidResources(f"version={top.get('version')!r} is unknown; valid: 1")
    devices: dict[str, int] = {}
    cpu_m = parse_cpu(top["cpu_cores"], field="cpu_cores") if top.get("cpu_cores") is not None else None
    mem_b = parse_memory(top["memory"], field="memory") if top.get("memory") is not None else None
    nodes: list[Node] = []
    raw_nodes = top.get("nodes")
    if raw_nodes is not None:
        if any(k in top for k in ("gpu", "npu")):
            raise InvalidResources("give devices either per node (nodes) or per kind (gpu, npu), not both")
        if not isinstance(raw_nodes, list):
            raise InvalidResources(f"nodes is {type(raw_nodes).__name__}, not a list")
        seen: dict[str, int] = {}
        cpu_total, mem_total, cpu_known, mem_known = 0, 0, True, True
        for i, raw in enumerate(raw_nodes):
            n = _mapping(raw, f"nodes[{i}]", _NODE_KEYS)
            base = n.get("name")
            if not isinstance(base, str) or not base.strip():
                raise InvalidResources(f"nodes[{i}].name={base!r}; valid: a non-empty string")
            replicas = n.get("replicas", 1)
            if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
                raise InvalidResources(f"nodes[{i}].replicas={replicas!r}; valid: an integer >= 1")
            per_model = _node_devices(n.get("devices"), i)
            node_cpu = parse_cpu(n["cpu"], field=f"nodes[{i}].cpu") if n.get("cpu") is not None else None
            node_mem = parse_memory(n["memory"], field=f"nodes[{i}].memory") if n.get("memory") is not None else None
            cpu_known &= node_cpu is not None
            mem_known &= node_mem is not None
            for name in [base] if replicas == 1 else [f"{base}-{r}" for r in range(replicas)]:
                if name in seen:
                    raise InvalidResources(f"nodes[{i}].name={name!r} duplicates nodes[{seen[name]}]; node names must be unique")
                seen[name] = i
                cpu_total += node_cpu or 0
                mem_total += node_mem or 0
                nodes.append(Node(name=name, devices=per_model, cpu_millicores=node_cpu, memory_bytes=node_mem))
                for model, c in per_model.items():
                    devices[model] = devices.get(model, 0) + c
        if cpu_m is None and cpu_known and nodes:
            cpu_m = cpu_total
        if mem_b is None and mem_known and nodes:
            mem_b = mem_total
    for kind in ("gpu", "npu"):  # today's form
        value = top.get(kind)
        if value is None:
            continue
        if isinstance(value, Mapping):
            for model, c in value.items():
                accel = _model(model, f"{kind} key", kind)
                devices[accel.name] = devices.get(accel.name, 0) + _count(c, f"{kind}.{model}")
        else:
            devices[kind] = _count(value, kind)
    if "cpu" in top:
        _count(top["cpu"], "cpu")  # today's form: the CPU is present (its cores go in cpu_cores)
    cohort = _name(top.get("cohort", "heteroflow"), "cohort")
    inv = ClusterInventory(devices=devices, cpu_millicores=cpu_m, memory_bytes=mem_b, nodes=tuple(nodes), cohort=cohort, source=source)
    queues = _parse_queues(top.get("queues"), inv)
    return dataclasses.replace(inv, queues=queues)


def _parse_queues(raw: Any, inv: ClusterInventory) -> tuple[QueueSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidResources(f"queues is {type(raw).__name__}, not a list")
    out: list[QueueSpec] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        q = _mapping(item, f"queues[{i}]", _QUEUE_KEYS)
        name = _name(q.get("name"), f"queues[{i}].name")
        if name in seen or name == f"{inv.cohort}-shared":
            raise InvalidResources(f"queues[{i}].name={name!r} is taken (queues[{seen.get(name)}] or the cohort's shared queue)")
        seen[name] = i
        kind = q.get("kind")
        if kind is not None:
            kind = DeviceKind.parse(kind, field=f"queues[{i}].kind").value
        team = q.get("team")
        if team is not None:
            _name(team, f"queues[{i}].team")
        guarantee = _amounts(q.get("guarantee"), f"queues[{i}].guarantee", inv.devices)
        capability = _amounts(q.get("capability"), f"queues[{i}].capability", inv.devices)
        for key, g in guarantee.items():
            if key in capability and g > capability[key]:
                raise InvalidResources(
                    f"queues[{i}] ({name}): guarantee.{key}={_show(key, g)} is above its capability.{key}={_show(key, capability[key])}"
                )
        reclaimable = q.get("reclaimable", True)
        if not isinstance(reclaimable, bool):
            raise InvalidResources(f"queues[{i}].reclaimable={reclaimable!r} is not a boolean; valid: true, false")
        priority = q.get("priority")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise InvalidResources(f"queues[{i}].priority={priority!r} is not an integer")
        weight = q.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise InvalidResources(f"queues[{i}].weight={weight!r}; valid: an integer >= 1")
        namespaces = q.get("namespaces", ["default"])
        if not isinstance(namespaces, list) or not namespaces:
            raise InvalidResources(f"queues[{i}].namespaces={namespaces!r}; valid: a non-empty list of namespace names")
        ns = tuple(_name(n, f"queues[{i}].namespaces[{j}]") for j, n in enumerate(namespaces))
        out.append(
            QueueSpec(
                name=name, kind=kind, team=team, guarantee=guarantee, capability=capability, reclaimable=reclaimable, weight=weight,
                priority=priority, namespaces=ns,
            )
        )
    _check_guarantees(out, inv)
    return tuple(out)


def _show(key: str, amount: int) -> str:
    if key == "cpu":
        return format_cpu(amount)
    if key == "memory":
        return format_memory(amount)
    return str(amount)


def _is_device_key(key: str) -> bool:
    return key not in ("cpu", "memory")


def _applies(key: str, flavor: str) -> bool:
    """Whether a device amount under ``key`` (a model, a kind, or :data:`_ANY`) counts devices of ``flavor``."""
    if key == _ANY:
        return True
    if key in _KINDS:
        return _kind_of(flavor) == key
    return key == flavor


def _check_guarantees(queues: Sequence[QueueSpec], inv: ClusterInventory) -> None:
    """The guarantees, summed over queues, fit the capacity: per model, per device kind (models and kind-level
    guarantees together), over all accelerators (with any-model guarantees), CPU and memory (where the inventory
    states them)."""
    scopes = ["cpu", "memory", *inv.devices, *_KINDS, _ANY]  # the narrowest first: its error names the model
    for scope in dict.fromkeys(scopes):
        if scope in inv.devices and scope in _KINDS:
            continue  # a kind-level inventory entry is checked as its kind
        cap = inv.capacity(scope)
        if cap is None:
            continue

        def within(key: str) -> bool:
            if scope in ("cpu", "memory"):
                return key == scope
            if not _is_device_key(key):
                return False
            if scope == _ANY:
                return True
            if scope in _KINDS:
                return key != _ANY and _kind_of(key) == scope
            return key == scope

        per_queue = {q.name: sum(g for k, g in q.guarantee.items() if within(k)) for q in queues}
        total = sum(per_queue.values())
        if total > cap:
            who = ", ".join(f"{name}: {_show(scope, g)}" for name, g in per_queue.items() if g)
            raise InvalidInventory(
                f"{inv.source}: queues guarantee {_show(scope, total)} of {scope} ({who}), above the capacity "
                f"{_show(scope, cap)}; valid: guarantees that add up to at most the capacity"
            )


def load_inventory(path: str | os.PathLike[str]) -> ClusterInventory:
    """Read a cluster inventory (YAML or JSON; the format is in this module's docstring).

    Raises:
        InvalidInventory: the file cannot be read or parsed, or holds an invalid value (named, with the valid forms).
    """
    import yaml

    where = os.fspath(path)
    try:
        text = Path(where).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInventory(f"inventory {where}: cannot be read ({exc.strerror or exc})") from None
    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise InvalidInventory(f"inventory {where}: not valid YAML or JSON ({exc})") from None
    return ClusterInventory.from_dict(data, source=where)


# --- flavors -------------------------------------------------------------------------------------------------


def _default_accelerator(kind: str) -> Accelerator:
    spec = Resources(kind=kind).accelerator_spec
    assert spec is not None  # gpu and npu always have a default family
    return spec


def _resource_name(key: str, profile: ClusterProfile) -> str:
    accel = _default_accelerator(key) if key in _KINDS else ACCELERATORS[key]
    try:
        return accel.resource_name_for(profile.vendor(accel.vendor).plugin)
    except InvalidResources as exc:
        raise InvalidInventory(f"inventory counts {key!r} devices without naming models: {exc}") from None


def flavor_order(candidates: Candidates | Iterable[Resources | str], inventory: ClusterInventory) -> list[str]:
    """The ResourceFlavor names in the order of ``candidates``: each candidate's accelerator models present in
    the inventory (a family's members in registry order; a kind-level inventory entry ``gpu`` for any gpu
    candidate), :data:`CPU_FLAVOR` for a CPU candidate; then the inventory's models no candidate names.

    Returns:
        Flavor names, without duplicates.
    """
    cands = candidates if isinstance(candidates, Candidates) else Candidates(list(candidates))
    order: list[str] = []
    for res in cands:
        if res.accelerator_spec is None:
            order.append(CPU_FLAVOR)
            continue
        order.extend(m.name for m in res.accelerator_models if m.name in inventory.devices)
        if res.kind in inventory.devices or str(getattr(res.kind, "value", res.kind)) in inventory.devices:
            order.append(str(getattr(res.kind, "value", res.kind)))
    order.extend(k for k in inventory.devices)
    return list(dict.fromkeys(order))


def _flavor_labels(key: str, profile: ClusterProfile) -> dict[str, str]:
    if key in _KINDS:
        return {}
    accel = ACCELERATORS[key]
    conv = profile.vendor(accel.vendor)
    if conv.plugin == "hami" and accel.vendor == "ascend":
        return {}  # the resource name alone picks the chip
    values = accel.node_labels.get(conv.labels, ())
    if conv.label_key is None or not values:
        return {}
    return {conv.label_key: values[0]}


def resource_flavors(inventory: ClusterInventory, profile: ClusterProfile | None = None) -> list[dict[str, Any]]:
    """A Kueue ResourceFlavor (``kueue.x-k8s.io/v1beta2``) per accelerator model (or kind) in the inventory,
    plus :data:`CPU_FLAVOR`. ``nodeLabels``: the model's node label under the profile's convention (none where
    the resource name alone picks the model, e.g. HAMi's per-chip Ascend names); ``tolerations``: its nodes'
    usual taint, when the profile tolerates accelerator taints (Kueue adds them to admitted pods)."""
    profile = profile or DEFAULT_PROFILE
    out = [_flavor(CPU_FLAVOR, {}, [])]
    for key in inventory.devices:
        tolerations: list[dict[str, Any]] = []
        if profile.accelerator_tolerations and key not in _KINDS:
            tolerations = [{"key": k, "operator": "Exists", "effect": "NoSchedule"} for k in ACCELERATORS[key].taint_keys]
        out.append(_flavor(key, _flavor_labels(key, profile), tolerations))
    return out


def _flavor(name: str, labels: Mapping[str, str], tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if labels:
        spec["nodeLabels"] = dict(labels)
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


# --- quotas --------------------------------------------------------------------------------------------------


def _guarantee_split(queues: Sequence[QueueSpec], flavors: Sequence[str], inventory: ClusterInventory) -> dict[str, dict[str, int]]:
    """Per queue, the guaranteed devices per accelerator flavor: per-model guarantees as given; then kind-level
    ones (``gpu: 10``), then any-model ones (a bare number), queue by queue, spread over the flavors they cover in
    flavor order, each up to what is not yet guaranteed on it. :func:`_check_guarantees` made sure it all fits."""
    free = {f: inventory.capacity(f) or 0 for f in flavors if f != CPU_FLAVOR}
    out: dict[str, dict[str, int]] = {q.name: {} for q in queues}
    for q in queues:
        for key, amount in q.guarantee.items():
            if _is_device_key(key) and key not in _KINDS and key != _ANY:
                out[q.name][key] = out[q.name].get(key, 0) + amount
                free[key] = free.get(key, 0) - amount
    for broad in (_KINDS, (_ANY,)):
        for q in queues:
            for key, amount in q.guarantee.items():
                if key not in broad:
                    continue
                left = amount
                for f in flavors:
                    if f == CPU_FLAVOR or not _applies(key, f) or left <= 0:
                        continue
                    take = min(left, max(free.get(f, 0), 0))
                    if take:
                        out[q.name][f] = out[q.name].get(f, 0) + take
                        free[f] -= take
                        left -= take
    return out


def _capability_split(q: QueueSpec, flavors: Sequence[str]) -> dict[str, int]:
    """Per accelerator flavor, the queue's capability: per-model as given; a kind-level or any-model one caps
    each flavor it covers (Kueue limits borrowing per flavor, not across flavors). A flavor absent has no limit."""
    out: dict[str, int] = {}
    for key, amount in q.capability.items():
        if not _is_device_key(key):
            continue
        for f in flavors:
            if f != CPU_FLAVOR and _applies(key, f):
                out[f] = min(out.get(f, amount), amount)
    return out


def volcano_queues(inventory: ClusterInventory, profile: ClusterProfile | None = None) -> list[dict[str, Any]]:
    """A Volcano Queue (``scheduling.volcano.sh/v1beta1``) per inventory queue [VQ].

    ``guarantee.resource`` and ``capability`` are per Kubernetes resource name under the profile's device-plugin
    convention (models that share a name add up); ``reclaimable`` and ``weight`` as given.

    Raises:
        InvalidInventory: a kind-level amount whose models have several resource names (name the models).
    """
    profile = profile or DEFAULT_PROFILE
    out = []
    for q in inventory.queues:
        spec: dict[str, Any] = {"weight": q.weight, "reclaimable": q.reclaimable}
        if q.priority is not None:
            spec["priority"] = q.priority
        guarantee = _resource_list(q.guarantee, inventory, profile, q)
        capability = _resource_list(q.capability, inventory, profile, q)
        if capability:
            spec["capability"] = capability
        if guarantee:
            spec["guarantee"] = {"resource": guarantee}
        meta: dict[str, Any] = {"name": q.name}
        labels = {k: v for k, v in (("heteroflow.io/device-kind", q.kind), ("heteroflow.io/team", q.team)) if v}
        if labels:
            meta["labels"] = labels
        out.append({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": meta, "spec": spec})
    return out


def _resource_list(amounts: Mapping[str, int], inventory: ClusterInventory, profile: ClusterProfile, q: QueueSpec) -> dict[str, str]:
    out: dict[str, int] = {}
    text: dict[str, str] = {}
    for key, amount in amounts.items():
        if key == "cpu":
            text["cpu"] = format_cpu(amount)
            continue
        if key == "memory":
            text["memory"] = format_memory(amount)
            continue
        if key in _KINDS or key == _ANY:
            names = {_resource_name(m, profile) for m in inventory.devices if _applies(key, m)}
            if not names:
                names = {_resource_name(key, profile)} if key in _KINDS else set()
            if len(names) != 1:
                raise InvalidInventory(
                    f"{inventory.source}: queue {q.name}: {key}={amount} cannot be one Volcano quota: the devices it "
                    f"counts have {len(names)} resource names here ({', '.join(sorted(names)) or 'none'}); valid: "
                    "amounts per device kind or model"
                )
            name = names.pop()
        else:
            name = _resource_name(key, profile)
        out[name] = out.get(name, 0) + amount
    text.update({k: str(v) for k, v in out.items()})
    return dict(sorted(text.items()))


def kueue_manifests(
    inventory: ClusterInventory,
    candidates: Candidates | Iterable[Resources | str],
    profile: ClusterProfile | None = None,
) -> list[dict[str, Any]]:
    """Kueue ResourceFlavors, a ClusterQueue per inventory queue (plus ``<cohort>-shared`` with the capacity no
    queue is guaranteed) and a LocalQueue per queue and namespace [KF, KCQ].

    Args:
        inventory: devices and queues.
        candidates: the pipeline's candidates for its device-bound step, most preferred first: the flavor order.
        profile: the cluster profile (resource names, node labels, tolerations).

    Raises:
        InvalidInventory: CPU or memory capacity unknown (Kueue must cover both: a pod asking for a resource no
            resource group covers is never admitted), or a kind-level count under HAMi's per-chip names.
    """
    profile = profile or DEFAULT_PROFILE
    if inventory.cpu_millicores is None or inventory.memory_bytes is None:
        raise InvalidInventory(
            f"{inventory.source}: the CPU or memory capacity is unknown; Kueue's ClusterQueues must cover cpu and "
            "memory (a pod asking for a resource no ClusterQueue covers is never admitted); valid: nodes with cpu "
            "and memory, or cpu_cores and memory at the top level"
        )
    flavors = flavor_order(candidates, inventory)
    accel = [f for f in flavors if f != CPU_FLAVOR]
    resource_of = {f: _resource_name(f, profile) for f in accel}
    covered = list(dict.fromkeys(resource_of[f] for f in accel))
    rank = {name: i for i, name in enumerate([CPU_FLAVOR, *accel])}
    out = sorted(resource_flavors(inventory, profile), key=lambda d: rank[d["metadata"]["name"]])
    split = _guarantee_split(inventory.queues, flavors, inventory)
    cpu_guaranteed = sum(q.guarantee.get("cpu", 0) for q in inventory.queues)
    memory_guaranteed = sum(q.guarantee.get("memory", 0) for q in inventory.queues)

    def accel_group(quota: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        # one group for every accelerator resource, so its flavors keep the candidates' order across resource
        # names; a flavor lists every covered resource in the covered order (Kueue requires it), 0 for the others
        return {
            "coveredResources": covered,
            "flavors": [
                {"name": f, "resources": [quota[f] if r == resource_of[f] else {"name": r, "nominalQuota": 0} for r in covered]}
                for f in accel
            ],
        }

    for q in inventory.queues:
        g = split[q.name]
        cap = _capability_split(q, flavors)
        cpu = _quota_entry("cpu", q.guarantee.get("cpu", 0), q.capability.get("cpu"), q.reclaimable)
        mem = _quota_entry("memory", q.guarantee.get("memory", 0), q.capability.get("memory"), q.reclaimable)
        groups = [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": CPU_FLAVOR, "resources": [cpu, mem]}]}]
        if accel:
            groups.append(accel_group({f: _quota_entry(resource_of[f], g.get(f, 0), cap.get(f), q.reclaimable) for f in accel}))
        out.append(_cluster_queue(q.name, inventory.cohort, groups, q))
    shared_cpu = [
        {"name": "cpu", "nominalQuota": format_cpu(inventory.cpu_millicores - cpu_guaranteed)},
        {"name": "memory", "nominalQuota": format_memory(inventory.memory_bytes - memory_guaranteed)},
    ]
    shared_groups = [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": CPU_FLAVOR, "resources": shared_cpu}]}]
    if accel:
        left = {
            f: {"name": resource_of[f], "nominalQuota": (inventory.capacity(f) or 0) - sum(split[q.name].get(f, 0) for q in inventory.queues)}
            for f in accel
        }
        shared_groups.append(accel_group(left))
    out.append(_cluster_queue(f"{inventory.cohort}-shared", inventory.cohort, shared_groups, None))
    for q in inventory.queues:
        for ns in q.namespaces:
            out.append(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "LocalQueue",
                    "metadata": {"name": q.name, "namespace": ns},
                    "spec": {"clusterQueue": q.name},
                }
            )
    return out


def _quota_entry(resource: str, guarantee: int, capability: int | None, reclaimable: bool) -> dict[str, Any]:
    def show(v: int) -> Any:
        return format_cpu(v) if resource == "cpu" else format_memory(v) if resource == "memory" else v

    entry: dict[str, Any] = {"name": resource, "nominalQuota": show(guarantee)}
    if not reclaimable:
        entry["borrowingLimit"] = show(0)
    elif capability is not None:
        entry["borrowingLimit"] = show(max(capability - guarantee, 0))
    return entry


def _cluster_queue(name: str, cohort: str, groups: list[dict[str, Any]], q: QueueSpec | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if q is not None:
        labels = {k: v for k, v in (("heteroflow.io/device-kind", q.kind), ("heteroflow.io/team", q.team)) if v}
        if labels:
            meta["labels"] = labels
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": meta,
        "spec": {
            "cohortName": cohort,
            "namespaceSelector": {},  # any namespace; LocalQueues decide who submits
            "queueingStrategy": "BestEffortFIFO",
            "flavorFungibility": {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor"},
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
            "resourceGroups": groups,
        },
    }


# --- validation, rendering, files ---------------------------------------------------------------------------

K8S_VERSION = "1.33.0"
"""The Kubernetes version core objects are validated against (``kubernetes-validate``)."""


def validate(manifest: Mapping[str, Any]) -> None:
    """Validate one manifest: custom resources against the shipped CRD (unknown fields rejected,
    :func:`heteroflow.cache.crds.validate_manifest`); the pod templates inside a PyTorchJob also as core
    ``PodTemplate`` objects with ``kubernetes-validate`` (strict: unknown fields rejected) where it is installed
    (the ``dev`` extra).

    Raises:
        InvalidCacheOption: the manifest breaks its CRD schema (the message names the field path).
        kubernetes_validate.ValidationError: a pod template breaks the core schema.
    """
    from heteroflow.cache.crds import validate_manifest

    validate_manifest(manifest)
    if manifest.get("kind") == "PyTorchJob":
        try:
            import kubernetes_validate
        except ImportError:  # a dev extra; the CRD schema above already covers the pod template
            return
        for role, replica in manifest["spec"]["pytorchReplicaSpecs"].items():
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{role.lower()}"}, "template": replica["template"]}
            kubernetes_validate.validate(pod_template, K8S_VERSION, strict=True)


def render_all(
    inventory: ClusterInventory,
    candidates: Candidates | Iterable[Resources | str],
    profile: ClusterProfile | None = None,
    *,
    workers: int = 2,
    job_name: str = "heteroflow-train",
    namespace: str = "default",
    image: str | None = None,
    command: Sequence[str] = ("heteroflow", "step", "train"),
) -> dict[str, list[dict[str, Any]]]:
    """Every manifest, by file name: ``volcano-queues.yaml``, ``kueue.yaml`` (when the inventory states CPU and
    memory), ``train-<i>-<kind>.yaml`` per accelerator candidate (when ``workers`` >= 1 and an image is known).
    Each manifest is validated (:func:`validate`).

    Raises:
        InvalidInventory, InvalidResources: bad input; InvalidCacheOption: a manifest breaks its schema (a bug).
    """
    profile = profile or DEFAULT_PROFILE
    cands = candidates if isinstance(candidates, Candidates) else Candidates(list(candidates))
    files: dict[str, list[dict[str, Any]]] = {}
    if inventory.queues:
        files["volcano-queues.yaml"] = volcano_queues(inventory, profile)
    if inventory.cpu_millicores is not None and inventory.memory_bytes is not None:
        files["kueue.yaml"] = kueue_manifests(inventory, cands, profile)
    if workers >= 1:
        for i, res in enumerate(cands):
            if res.accelerator_spec is None:
                continue
            if not (image or profile.image_for(res.kind)):  # type: ignore[arg-type]
                continue
            kind = str(getattr(res.kind, "value", res.kind))
            files[f"train-{i}-{kind}.yaml"] = training_job_manifests(
                res, workers=workers, name=f"{job_name}-{i}", image=image, namespace=namespace, profile=profile, command=command
            )
    for docs in files.values():
        for doc in docs:
            validate(doc)
    return files


def write_manifests(files: Mapping[str, Sequence[Mapping[str, Any]]], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write each file as a multi-document YAML stream, atomically (``heteroflow.cache.atomic``).

    Returns:
        The paths written, in order.
    """
    import yaml

    from heteroflow.cache.atomic import atomic_write_bytes

    out = Path(out_dir)
    written = []
    for name, docs in files.items():
        text = yaml.safe_dump_all([json.loads(json.dumps(d)) for d in docs], sort_keys=False, default_flow_style=False)
        atomic_write_bytes(out / name, text.encode("utf-8"))
        written.append(out / name)
    return written
