"""The queue and job manifests that make heteroflow's annotations take effect on a cluster.

A compiled pipeline and the Airflow pods *annotate* queues (``scheduling.volcano.sh/queue-name``,
``kueue.x-k8s.io/queue-name``); this module renders the objects those annotations point at, from a cluster
inventory and a cluster profile (:mod:`heteroflow.components.devices.cluster`), as side-effect-free builders that return
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
  guarantee; under a HAMi NVIDIA profile the group also covers Kueue's HAMi totals (``nvidia.com/total-gpucores``,
  ``total-gpumem``, ``total-gpumem-percentage``: :data:`HAMI_KUEUE_TOTALS`), which Kueue counts of a GPU share
  under the transformations of :data:`HAMI_KUEUE_TRANSFORMATIONS` [KH]; ``flavorFungibility`` ``TryNextFlavor`` for both borrowing and preemption, so a workload that does
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

The inventory (per device kind or per node, with queues: ``guarantee``, ``capability``, ``reclaimable``,
``weight``, ``priority``, ``namespaces``; ``cohort``) is read by :mod:`heteroflow.components.placement.inventory`, whose
docstring has the forms; bad input raises its :class:`InvalidInventory` naming the file, the node or queue, the
field and what is valid.

Sources: [VQ] Volcano Queue, https://volcano.sh/en/docs/queue/ (v1.15 CRD shipped in ``cache/data/crds``);
[KF] Kueue ResourceFlavor, https://kueue.sigs.k8s.io/docs/concepts/resource_flavor/; [KCQ] Kueue ClusterQueue
(resource groups, cohort, borrowingLimit, flavorFungibility, preemption),
https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/; [KA] Kueue all-or-nothing with ready pods,
https://kueue.sigs.k8s.io/docs/tasks/manage/setup_wait_for_pods_ready/; [KH] Kueue, "Using HAMi",
https://kueue.sigs.k8s.io/docs/tasks/run/using_hami/; [KT] Kubeflow Trainer TrainJob v2,
https://www.kubeflow.org/docs/components/trainer/; [PJ] PyTorchJob (training-operator v1),
https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.components.placement import inventory as _inventory
from heteroflow.components.devices.accelerators import ACCELERATORS, Accelerator, DeviceKind
from heteroflow.components.devices.cluster import DEFAULT_PROFILE, ClusterProfile
from heteroflow.components.devices.podplan import HAMI_CORES, HAMI_MEMORY, HAMI_MEMORY_PERCENTAGE
from heteroflow.components.devices.quantities import format_cpu, format_memory, parse_cpu, parse_memory
from heteroflow.components.errors import InvalidResources
from heteroflow.components.placement.fields import dns_label as _name
from heteroflow.components.placement.views import ANY_DEVICES, ClusterInventory, InvalidInventory, Node, QueueSpec
from heteroflow.components.placement.views import kind_of as _kind_of
from heteroflow.components.placement.views import show_amount as _show
from heteroflow.components.resources import Candidates, Resources
# the multi-node train's job (rendered in components, where the train step's launcher needs it); importable here too
from heteroflow.components.training.trainjob import GROUP_ANNOTATION, TRAINER_CONTAINER, TRAINER_RUNTIME, training_job_manifests

__all__ = [
    "CPU_FLAVOR",
    "GROUP_ANNOTATION",
    "HAMI_KUEUE_TOTALS",
    "HAMI_KUEUE_TRANSFORMATIONS",
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
class _KindNames:
    """The registered device kinds' names (``cpu``, ``gpu``, ``npu``, plugins'), read from the registry when used
    (not at import: a plugin kind loads from its entry point on first use)."""

    def __iter__(self) -> Iterator[str]:
        return iter([k.value for k in DeviceKind])

    def __contains__(self, name: object) -> bool:
        return name in list(self)


_KINDS = _KindNames()
_ANY = ANY_DEVICES
"""The amount key of a guarantee or capability given as a bare number: accelerator devices of any model."""


def load_inventory(path: str | os.PathLike[str]) -> ClusterInventory:
    """Read a cluster inventory (YAML or JSON; every form :mod:`heteroflow.components.placement.inventory` reads).

    Raises:
        InvalidInventory: the file cannot be read or parsed, or holds an invalid value (named, with the valid forms).
    """
    return _inventory.load_inventory(path)


def _is_device_key(key: str) -> bool:
    return key not in ("cpu", "memory")


def _applies(key: str, flavor: str) -> bool:
    """Whether a device amount under ``key`` (a model, a kind, or :data:`_ANY`) counts devices of ``flavor``."""
    if key == _ANY:
        return True
    if key in _KINDS:
        return _kind_of(flavor) == key
    return key == flavor


# --- flavors -------------------------------------------------------------------------------------------------


def _default_accelerator(kind: str) -> Accelerator:
    spec = Resources(kind=kind).accelerator_spec
    if spec is None:
        raise InvalidResources(f"device kind {kind!r} names no default accelerator or resource_name, so no flavor can "
                               "ask for it; valid: a kind with one (DeviceKind(default_accelerator=...) or resource_name=...)")
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
    flavor order, each up to what is not yet guaranteed on it. The inventory parser (:mod:`heteroflow.components.placement.inventory`) made sure it all fits."""
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
    queue is guaranteed) and a LocalQueue per queue and namespace [KF, KCQ]. Under a profile whose NVIDIA plugin is
    ``hami`` the accelerator group also covers :data:`HAMI_KUEUE_TOTALS` per NVIDIA flavor (:func:`_hami_total_entries`
    gives the amounts), so a GPU share can be admitted once Kueue holds :data:`HAMI_KUEUE_TRANSFORMATIONS` [KH].

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
    # under HAMi an NVIDIA share asks for per-vGPU cores and memory beside the device: Kueue admits it only where
    # its transformed totals are covered too (a resource no ClusterQueue covers is never admitted)
    shared = [f for f in accel if _hami_shares(f, profile)]
    covered = list(dict.fromkeys([*(resource_of[f] for f in accel), *(HAMI_KUEUE_TOTALS.values() if shared else ())]))
    rank = {name: i for i, name in enumerate([CPU_FLAVOR, *accel])}
    out = sorted(resource_flavors(inventory, profile), key=lambda d: rank[d["metadata"]["name"]])
    split = _guarantee_split(inventory.queues, flavors, inventory)
    cpu_guaranteed = sum(q.guarantee.get("cpu", 0) for q in inventory.queues)
    memory_guaranteed = sum(q.guarantee.get("memory", 0) for q in inventory.queues)

    def accel_group(quota: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        # one group for every accelerator resource, so its flavors keep the candidates' order across resource
        # names; a flavor lists every covered resource in the covered order (Kueue requires it), 0 for the others
        entries = {f: {resource_of[f]: quota[f], **(_hami_total_entries(f, quota[f]) if f in shared else {})} for f in accel}
        return {
            "coveredResources": covered,
            "flavors": [
                {"name": f, "resources": [entries[f].get(r, {"name": r, "nominalQuota": 0}) for r in covered]}
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


HAMI_KUEUE_TOTALS = {
    HAMI_CORES: "nvidia.com/total-gpucores",
    HAMI_MEMORY: "nvidia.com/total-gpumem",
    HAMI_MEMORY_PERCENTAGE: "nvidia.com/total-gpumem-percentage",
}
"""HAMi's per-vGPU resource -> the total Kueue counts it as, under the resource transformations of
:data:`HAMI_KUEUE_TRANSFORMATIONS` (Kueue's "Using HAMi" guide, kueue.sigs.k8s.io/docs/tasks/run/using_hami/,
names the first two; ``gpumem-percentage``, which a share without ``device_memory`` asks for, the same way)."""

HAMI_KUEUE_TRANSFORMATIONS: dict[str, Any] = {
    "resources": {
        "transformations": [
            {"input": per_vgpu, "strategy": "Replace", "multiplyBy": "nvidia.com/gpu", "outputs": {total: "1"}}
            for per_vgpu, total in HAMI_KUEUE_TOTALS.items()
        ]
    }
}
"""What Kueue's own configuration (``config.kueue.x-k8s.io/v1beta2`` ``Configuration``, in the
``kueue-manager-config`` ConfigMap) must hold for the ClusterQueues :func:`kueue_manifests` renders under a HAMi
NVIDIA profile: each per-vGPU amount times the vGPUs, counted as its total (``Replace``: the per-vGPU input is not
counted itself). Not a Kubernetes object, so not among the rendered manifests: merge it into that Configuration."""


def _hami_shares(flavor: str, profile: ClusterProfile) -> bool:
    """Whether devices of ``flavor`` are shared by HAMi vGPUs under ``profile`` (NVIDIA under ``plugin: hami``)."""
    accel = _default_accelerator(flavor) if flavor in _KINDS else ACCELERATORS[flavor]
    return accel.vendor == "nvidia" and profile.vendor("nvidia").plugin == "hami"


def _hami_total_entries(flavor: str, devices: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The HAMi totals of one NVIDIA flavor, from its device quota entry ``devices`` (``nominalQuota`` and an
    optional ``borrowingLimit``, in devices): cores and memory percentage 100 per device (HAMi's units: percent of
    one device); memory in MiB per device, the model's data-sheet memory (the device reports a little less, e.g. a
    T4 15360 MiB of 16384: Kueue may admit a little more than HAMi then fits, never less); 0 for a flavor without
    a model (a kind-level inventory entry): a share asking ``nvidia.com/gpumem`` is admitted on model flavors only."""
    accel = _default_accelerator(flavor) if flavor in _KINDS else ACCELERATORS[flavor]
    mib = (accel.device_memory_bytes or 0) // 2**20 if flavor not in _KINDS else 0
    per = {HAMI_CORES: 100, HAMI_MEMORY: mib, HAMI_MEMORY_PERCENTAGE: 100}
    out: dict[str, dict[str, Any]] = {}
    for per_vgpu, total in HAMI_KUEUE_TOTALS.items():
        entry: dict[str, Any] = {"name": total, "nominalQuota": devices["nominalQuota"] * per[per_vgpu]}
        if "borrowingLimit" in devices:
            entry["borrowingLimit"] = devices["borrowingLimit"] * per[per_vgpu]
        out[total] = entry
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
    :func:`heteroflow.cache.crds.validate_manifest`); the pod templates inside a PyTorchJob or a Volcano Job also as core
    ``PodTemplate`` objects with ``kubernetes-validate`` (strict: unknown fields rejected) where it is installed
    (the ``dev`` extra).

    Raises:
        InvalidCacheOption: the manifest breaks its CRD schema (the message names the field path).
        kubernetes_validate.ValidationError: a pod template breaks the core schema.
    """
    from heteroflow.cache.crds import validate_manifest

    validate_manifest(manifest)
    if manifest.get("kind") == "Job" and str(manifest.get("apiVersion", "")).startswith("batch.volcano.sh/"):
        from heteroflow.components.training.mixed_job import validate_volcano_job

        validate_volcano_job(manifest, k8s_version=K8S_VERSION)  # each task's pod template, as a PyTorchJob's below
        return
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
    memory), ``train-<i>-<kind>.yaml`` per accelerator candidate (when ``workers`` >= 1 and an image is known);
    a mixed candidate (``gpu:count=2+npu:count=4``) as ``train-<i>-gpu-npu.yaml``, one Volcano Job with a task per
    kind and ``minAvailable`` = all its replicas (:func:`~heteroflow.components.training.mixed_job.mixed_job_manifests`;
    ``workers`` does not apply: its ``count`` per kind is the pods).
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
            try:
                files.update(_train_files(i, res, workers=workers, job_name=job_name, namespace=namespace, image=image,
                                          profile=profile, command=command))
            except InvalidResources as exc:  # which candidate (a mixed one's errors named only roles[1] or a kind)
                err = InvalidResources(f"train candidate {i} ({res.describe()}): {exc}")
                err.candidate_index = i  # type: ignore[attr-defined]  # the CLI says it in the user's spelling
                err.reason = str(exc)  # type: ignore[attr-defined]
                raise err from None
    for docs in files.values():
        for doc in docs:
            validate(doc)
    return files


def _train_files(i: int, res: Resources, *, workers: int, job_name: str, namespace: str, image: str | None,
                 profile: ClusterProfile, command: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """``train-<i>-<kind>.yaml`` of candidate ``i`` (see :func:`render_all`), or nothing (no image, no accelerator)."""
    if getattr(res, "replicas", None):  # a mixed candidate (#29): one Volcano Job, a task per kind
        from heteroflow.components.training.mixed_job import missing_images, mixed_job_manifests

        if missing_images(res, image, profile):
            return {}
        return {f"train-{i}-{'-'.join(res.kinds)}.yaml": mixed_job_manifests(
            res, name=f"{job_name}-{i}", image=image, namespace=namespace, profile=profile, command=command)}
    if res.accelerator_spec is None or not (image or profile.image_for(res.kind)):  # type: ignore[arg-type]
        return {}
    kind = str(getattr(res.kind, "value", res.kind))
    return {f"train-{i}-{kind}.yaml": training_job_manifests(
        res, workers=workers, name=f"{job_name}-{i}", image=image, namespace=namespace, profile=profile, command=command)}


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
