"""Kubernetes nodes as inventory nodes: ``kubectl get nodes -o json`` items (:func:`kubectl_nodes`) and API
objects with the pods bound to them (:func:`kubernetes_nodes`, placement's view). The accelerator model comes from
the device kinds' node labels (GPU feature discovery's ``nvidia.com/gpu.product``, Ascend's
``node.kubernetes.io/npu.chip.name``); a model not in the registry counts as CPU-only.

Moved here from :mod:`heteroflow.components.placement.inventory`, which re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from heteroflow.components.devices.accelerators import DeviceKind, find_accelerator
from heteroflow.components.devices.quantities import parse_cpu, parse_memory
from heteroflow.components.errors import InvalidResources
from heteroflow.components.placement.views import InvalidInventory, Node, PlacementNode, _assemble

__all__ = ["kubectl_nodes", "kubernetes_nodes"]


def _model_labels() -> tuple[str, ...]:
    """Node labels that name the accelerator model, from the device kinds (gpu: GPU feature discovery's
    ``nvidia.com/gpu.product``; npu: Ascend MindCluster's ``node.kubernetes.io/npu.chip.name``; plugins' own)."""
    return tuple(k for kind in DeviceKind for k in kind.node_label_keys)


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
        if name is None:  # left out: say so, not 'name=None'
            raise InvalidInventory(f"{source}: {field}.metadata has no name; valid: a non-empty string (the node's name)")
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
