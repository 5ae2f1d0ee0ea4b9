"""Kubernetes nodes as inventory nodes: ``kubectl get nodes -o json`` items (:func:`kubectl_nodes`) and API
objects with the pods bound to them (:func:`kubernetes_nodes`, placement's view). The accelerator model comes from
the device kinds' and label conventions' node labels (GPU feature discovery's ``nvidia.com/gpu.product``, GKE's
``cloud.google.com/gke-accelerator``, Ascend's ``node.kubernetes.io/npu.chip.name``); a model not in the registry
counts as CPU-only.

Moved here from :mod:`heteroflow.components.placement.inventory`, which re-exports the public names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from heteroflow.components.devices.accelerators import ACCELERATORS, LABEL_CONVENTIONS, Accelerator, DeviceKind, find_accelerator
from heteroflow.components.devices.quantities import parse_cpu, parse_memory
from heteroflow.components.errors import InvalidResources
from heteroflow.components.placement.views import InvalidInventory, Node, PlacementNode, _assemble

__all__ = ["kubectl_nodes", "kubernetes_nodes"]


def _model_labels() -> tuple[str, ...]:
    """Node labels that name the accelerator model: the device kinds' (gpu: GPU feature discovery's
    ``nvidia.com/gpu.product``; npu: Ascend MindCluster's ``node.kubernetes.io/npu.chip.name``; plugins' own), then
    every label convention's (:data:`~heteroflow.components.devices.accelerators.LABEL_CONVENTIONS`: GKE's
    ``cloud.google.com/gke-accelerator``, AMD's ``amd.com/gpu.product-name``)."""
    keys = [k for kind in DeviceKind for k in kind.node_label_keys]
    keys += [key for key, _vendors in LABEL_CONVENTIONS.values() if key]
    return tuple(dict.fromkeys(keys))


def _model_of_label(value: str) -> tuple[Accelerator | None, int | None]:
    """The model a node label value names, and the device memory (bytes) the value states when it differs from the
    model's data sheet (``Tesla-V100-SXM2-32GB``: the 16 GB V100's entry, 32 GiB), else None.

    A value the registry lists for a model under a label convention (``NVIDIA-A100-SXM4-80GB``,
    ``nvidia-h100-80gb``) is that model; otherwise the product name without its vendor prefix and form factor
    (``Tesla-T4``: T4). A family (``A100``: either A100) or an unknown name is no model (the node counts as CPU-only)."""
    listed = {v.lower(): a for a in ACCELERATORS.values() if not a.is_family for vals in a.node_labels.values() for v in vals}
    if value.lower() in listed:
        return listed[value.lower()], None
    try:
        accel = find_accelerator(value.removeprefix("NVIDIA-").removeprefix("Tesla-").split("-SXM")[0].split("-PCIE")[0])
    except InvalidResources:
        return None, None
    if accel.is_family:
        return None, None
    stated = re.search(r"(\d+)GB", value, re.IGNORECASE)
    memory = int(stated.group(1)) * 2**30 if stated else None  # the registry's nominal GiB (accelerators.py)
    return accel, memory if memory != accel.device_memory_bytes else None


def _k8s_node(name: str, labels: Mapping[str, str], taints: Iterable[Mapping[str, Any]], alloc: Mapping[str, Any],
              used: Mapping[str, int], *, index: int = 0) -> Node:
    """One Kubernetes node: allocatable minus ``used`` (CPU millicores, memory bytes, devices per resource name);
    the model from its labels (a model not in the registry, or not allocatable, counts as CPU-only)."""
    devices: dict[str, int] = {}
    mem = 0
    label = next((labels[k] for k in _model_labels() if labels.get(k)), None)
    if label:
        accel, stated_memory = _model_of_label(label)
        if accel is not None:
            resource = next((r for r in set(accel.resource_names.values()) if r in alloc), None)
            if resource is not None:
                devices = {accel.name: max(int(alloc[resource]) - used.get(resource, 0), 0)}
                mem = stated_memory or accel.device_memory_bytes or 0
    # free = allocatable - requested, 0 when the requests fill it (stated: nothing more fits); None where the node
    # states no allocatable CPU or memory (not checked)
    cpu = max(parse_cpu(alloc["cpu"]) - used.get("cpu", 0), 0) if "cpu" in alloc else None
    memory = max(parse_memory(alloc["memory"]) - used.get("memory", 0), 0) if "memory" in alloc else None
    kept = tuple({k: str(t[k]) for k in ("key", "value", "effect") if t.get(k) is not None} for t in taints)
    return Node(name=name, devices=devices, cpu_millicores=cpu, memory_bytes=memory, device_memory_bytes=mem,
                labels=dict(labels), taints=kept, index=index)


def kubectl_nodes(items: Sequence[Any], *, source: str = "kubectl get nodes -o json") -> list[Node]:
    """Nodes from ``kubectl get nodes -o json`` items (``Node`` objects as JSON): allocatable (else capacity)
    CPU, memory and accelerators, labels and taints.

    Raises:
        InvalidInventory: an item that is not a Node with ``metadata.name``, a name given twice, or a quantity
            that does not parse (the message names the item and the field).
    """
    out: list[Node] = []
    for i, item in enumerate(items):
        field = f"items[{i}]"
        if not isinstance(item, Mapping) or item.get("kind", "Node") != "Node":
            raise InvalidInventory(f"{source}: {field} is not a Node object; valid: kubectl get nodes -o json output")
        meta = item.get("metadata") or {}
        name = meta.get("name")
        if name is None:  # left out: say so, not 'name=None'
            raise InvalidInventory(f"{source}: {field}.metadata has no name; valid: a non-empty string (the node's name)")
        if not isinstance(name, str) or not name:
            raise InvalidInventory(f"{source}: {field}.metadata.name={name!r}; valid: a non-empty string")
        twice = next((j for j, n in enumerate(out) if n.name == name), None)
        if twice is not None:  # two lists pasted together: the node's devices were counted twice
            raise InvalidInventory(f"{source}: {field}.metadata.name={name!r} duplicates items[{twice}]; node names are unique")
        status = item.get("status") or {}
        alloc = status.get("allocatable") or status.get("capacity") or {}
        try:
            out.append(_k8s_node(name, meta.get("labels") or {}, (item.get("spec") or {}).get("taints") or [], alloc, {}, index=i))
        except (InvalidResources, ValueError) as exc:
            raise InvalidInventory(f"{source}: {field} ({name}).status.allocatable: {exc}") from None
    return out


def _quantity(key: str, value: Any) -> int:
    """A request as placement counts it: CPU in millicores, memory in bytes, anything else (devices, storage,
    hugepages) in whole units, rounded up (``kubernetes.utils.parse_quantity``: ``10Gi``, ``500m``)."""
    if key == "cpu":
        return parse_cpu(value)
    if key == "memory":
        return parse_memory(value)
    import math

    from kubernetes.utils import parse_quantity

    return math.ceil(parse_quantity(value))


def _pod_requests(pod: Any) -> dict[str, int]:
    """What a pod holds on its node, as the scheduler counts it: per resource the larger of its app containers' sum
    (plus sidecars: init containers with ``restartPolicy: Always``) and its largest init container, plus the pod's
    ``overhead`` (Kubernetes, "Resource Management for Pods and Containers" and "Pod Overhead")."""
    def requests(container: Any) -> dict[str, int]:
        req = (container.resources.requests or {}) if container.resources is not None else {}
        return {k: _quantity(k, v) for k, v in req.items()}

    total: dict[str, int] = {}
    for c in [*(pod.spec.containers or []),
              *(c for c in pod.spec.init_containers or [] if getattr(c, "restart_policy", None) == "Always")]:
        for k, v in requests(c).items():
            total[k] = total.get(k, 0) + v
    for c in pod.spec.init_containers or []:
        if getattr(c, "restart_policy", None) != "Always":
            for k, v in requests(c).items():
                total[k] = max(total.get(k, 0), v)
    for k, v in (getattr(pod.spec, "overhead", None) or {}).items():
        total[k] = total.get(k, 0) + _quantity(k, v)
    return total


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
        for key, amount in _pod_requests(pod).items():
            acc[key] = acc.get(key, 0) + amount
    parsed = []
    for i, node in enumerate(nodes):
        taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in (getattr(node.spec, "taints", None) or [])]
        parsed.append(_k8s_node(node.metadata.name, node.metadata.labels or {}, taints, node.status.allocatable or {},
                                requested.get(node.metadata.name, {}), index=i))
    if not parsed:
        return []
    return list(_assemble(parsed, source="kubernetes").for_placement().nodes)
