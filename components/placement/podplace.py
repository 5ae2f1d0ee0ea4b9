"""What a pod asks for once the plan step has decided: the chosen model as node affinity, the chosen nodes as a
preference, and a fractional-GPU request as HAMi resources.

:func:`placed_pod_plan` takes the candidate the plan step chose and its
:class:`~heteroflow.components.placement.scoring.CandidateScore` (model, nodes, ``gpu_milli``) and returns the
:class:`~heteroflow.components.devices.podplan.PodPlan` every engine renders (:func:`plan_pod` of the candidate
narrowed to the chosen model), with:

- a *required* node-affinity term ``<model label> In [<the model's label values>]`` (the cluster profile's
  label convention, e.g. ``nvidia.com/gpu.product`` from GPU feature discovery), ANDed into the candidate's own
  terms, so the pod lands only on the model the policy chose;
- a *preferred* node-affinity term (weight 100) for the node(s) the policy chose (``kubernetes.io/hostname``):
  binding stays with the cluster's scheduler (Kubernetes, Volcano or Kueue), which may bind elsewhere when the
  cluster changed since the plan;
- for a fractional request (``gpu_milli`` < 1000, thousandths of one device, as the Alibaba GPU traces and
  GPU-sharing schedulers express it) on NVIDIA with the HAMi device plugin: ``nvidia.com/gpu: 1`` (one vGPU),
  ``nvidia.com/gpucores: <percent of the device's compute>`` and ``nvidia.com/gpumem: <MiB>`` (the request's
  ``device_memory``), else ``nvidia.com/gpumem-percentage`` (the same percent of what the device reports), in requests and limits
  alike: :func:`~heteroflow.components.devices.podplan.share_resources`, the same rendering every engine uses for
  a candidate's ``device_share`` (and the same error under a plugin that cannot share).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from heteroflow.components.devices.accelerators import ACCELERATORS, DeviceKind
from heteroflow.components.devices.cluster import DEFAULT_PROFILE, ClusterProfile
from heteroflow.components.devices.podplan import HAMI_CORES, HAMI_MEMORY, PodPlan, plan_pod
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import Resources

__all__ = ["HAMI_CORES", "HAMI_MEMORY", "HOSTNAME_LABEL", "placed_pod_plan"]

HOSTNAME_LABEL = "kubernetes.io/hostname"
"""The well-known node label holding the node's name (Kubernetes' well-known labels)."""


def placed_pod_plan(resources: Resources, *, model: str, nodes: tuple[str, ...] = (), gpu_milli: int | None = None,
                    profile: ClusterProfile | None = None) -> PodPlan:
    """The pod plan for ``resources`` placed on ``model`` (and preferably ``nodes``) by the plan step.

    Args:
        resources: the chosen candidate.
        model: the device model the policy chose (registry key, e.g. ``nvidia-v100``); ``cpu`` for a CPU candidate.
        nodes: the node(s) the policy chose (a preference, not a binding).
        gpu_milli: for a fractional request, thousandths of one device (1-999); None or 1000: whole devices.
        profile: the cluster profile (default conventions when None).

    Returns:
        A :class:`~heteroflow.components.devices.podplan.PodPlan`.

    Raises:
        InvalidResources: ``model`` is not one the candidate accepts; ``gpu_milli`` is not in 1-1000; a fractional
            request for more than one device, on a vendor other than NVIDIA, or on a profile whose NVIDIA plugin
            is not ``hami`` (the message names the setting that would work); the profile cannot tell the model
            apart by a node label.
    """
    used = profile or DEFAULT_PROFILE
    if gpu_milli is not None:
        resources = _with_share(resources, gpu_milli)
    accel = resources.accelerator_spec
    if accel is None or model == DeviceKind.host().value:  # a node without devices: the host kind's name
        plan = plan_pod(resources, profile)
        return _prefer_nodes(plan, nodes)
    accepted = {m.name for m in resources.accelerator_models}
    if model not in accepted:
        raise InvalidResources(f"model={model!r} is not one candidate {resources.describe()} accepts; valid: "
                               f"{', '.join(sorted(accepted))}")
    narrowed = dataclasses.replace(resources, accelerator=model)
    plan = plan_pod(narrowed, profile)
    chosen = ACCELERATORS[model]
    conv = used.vendor(chosen.vendor)
    key = conv.label_key
    values = list(chosen.node_labels.get(conv.labels) or ()) if key else []
    affinity = plan.affinity
    node_selector = dict(plan.node_selector)
    if key and values:
        node_selector.pop(key, None)  # stated once, as the required affinity term below
        affinity = _require(affinity, {"key": key, "operator": "In", "values": values})
    plan = dataclasses.replace(plan, affinity=affinity, node_selector=node_selector)
    return _prefer_nodes(plan, nodes)


def _with_share(resources: Resources, gpu_milli: Any) -> Resources:
    """``resources`` asking for ``gpu_milli`` thousandths of one device (1000: a whole one), which
    :func:`~heteroflow.components.devices.podplan.plan_pod` renders (or refuses) as every engine does."""
    if not isinstance(gpu_milli, int) or isinstance(gpu_milli, bool) or not 1 <= gpu_milli <= 1000:
        raise InvalidResources(f"gpu_milli={gpu_milli!r} is not thousandths of one device; valid: an integer in 1-1000")
    if gpu_milli == 1000:
        return resources if resources.device_share is None else dataclasses.replace(resources, device_share=None)
    if (resources.count or 0) > 1 or resources.nodes > 1:
        raise InvalidResources(f"gpu_milli={gpu_milli} with count={resources.count}: a fractional request is part of one "
                               "device; valid: count=1")
    if resources.device_share_milli == gpu_milli:
        return resources
    return dataclasses.replace(resources, device_share=gpu_milli / 1000)


def _require(affinity: dict[str, Any] | None, requirement: dict[str, Any]) -> dict[str, Any]:
    """AND ``requirement`` into every required node-selector term (they are ORed), or add the first term."""
    affinity = dict(affinity or {})
    node = dict(affinity.get("nodeAffinity") or {})
    required = dict(node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or []] or [{}]
    for term in terms:
        kept = [e for e in term.get("matchExpressions") or [] if e.get("key") != requirement["key"]]
        term["matchExpressions"] = [*kept, requirement]
    required["nodeSelectorTerms"] = terms
    node["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node
    return affinity


def _prefer_nodes(plan: PodPlan, nodes: tuple[str, ...]) -> PodPlan:
    if not nodes:
        return plan
    affinity = dict(plan.affinity or {})
    node = dict(affinity.get("nodeAffinity") or {})
    preferred = list(node.get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    preferred.append({"weight": 100, "preference": {"matchExpressions": [
        {"key": HOSTNAME_LABEL, "operator": "In", "values": list(dict.fromkeys(nodes))}]}})
    node["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    affinity["nodeAffinity"] = node
    return dataclasses.replace(plan, affinity=affinity)
