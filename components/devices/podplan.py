"""The pod plan: a candidate (:class:`Resources`) and a cluster profile -> what a Kubernetes pod asks for, as plain data.

:func:`plan_pod` is pure and engine-neutral (no Kubernetes client). The pod builder
(:func:`heteroflow.pipelines.k8s.resources.build_pod_resources`, the client's own types), the KFP renderer
(:mod:`heteroflow.pipelines.kfp.resources`), Airflow's KubernetesPodOperator pods and a multi-node train's job
manifests (:func:`heteroflow.components.training.trainjob.training_job_manifests`) all use it, so every engine asks a
cluster for the same thing.

What it decides:

- requests and limits separately, in the units the user wrote; the accelerator's extended resource (named per
  the profile's device-plugin convention) with its count in both, as Kubernetes requires;
- part of one device (``device_share``, :func:`share_resources`): under HAMi one vGPU with ``nvidia.com/gpucores``
  and ``nvidia.com/gpumem`` (or ``gpumem-percentage``); under a plugin that cannot share (the official NVIDIA
  plugin, GKE's) or on a device other than an NVIDIA GPU, an error: never a whole device in its place;
- the node label that picks the model, where the resource name alone does not (``nvidia.com/gpu`` serves
  every NVIDIA model; MindCluster's ``huawei.com/Ascend910`` serves 910A/B/C): one value goes into the node
  selector, several (a family narrowed by ``device_memory`` or ``precision``, or a model with several product
  names) into a required node-affinity ``In`` term, ANDed into each of the candidate's own terms;
- tolerations: the profile's, the accelerator's usual taint (``nvidia.com/gpu`` Exists NoSchedule) unless the
  profile turns that off, then the candidate's;
- pod labels and annotations: the profile's, the queue (Kueue label ``kueue.x-k8s.io/queue-name``, Volcano
  annotation ``scheduling.volcano.sh/queue-name``), then the candidate's (a later one wins on the same key);
- ``schedulerName`` and the image per device kind from the profile.

Raises :class:`~heteroflow.components.errors.InvalidResources` where a candidate cannot be asked for on the
cluster the profile describes (a family HAMi cannot name as one resource, a model the profile's labels cannot
tell apart, a node selector that contradicts the model, a device share the profile's plugin cannot give).

Without a profile (issue #16.20) the default conventions (:data:`~heteroflow.components.devices.cluster.DEFAULT_PROFILE`)
pick a model: ``gpu:accelerator=t4`` asks for ``nvidia.com/gpu`` on nodes labelled ``nvidia.com/gpu.product`` in
``Tesla-T4``/``TESLA-T4`` (NVIDIA GPU feature discovery). Whenever that choice rests on an assumed convention (a
node label, or a resource name that differs between device plugins), :func:`plan_pod` warns with a
:class:`DefaultProfileWarning` naming the label or resource it wrote and the ``--profile`` settings (and example
profiles) that pin the cluster's own; a node labelled another way would never run the step, so it is never silent.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

from heteroflow.components.devices.accelerators import ACCELERATORS, PLUGIN_CONVENTIONS, Accelerator, label_conventions_for
from heteroflow.components.devices.cluster import (
    DEFAULT_PROFILE,
    KUEUE_QUEUE_LABEL,
    VOLCANO_QUEUE_ANNOTATION,
    ClusterProfile,
)
from heteroflow.components.devices.scheduling import Toleration, thaw
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import Resources

__all__ = [
    "HAMI_CORES",
    "HAMI_MEMORY",
    "HAMI_MEMORY_PERCENTAGE",
    "DefaultProfileWarning",
    "PodPlan",
    "plan_pod",
    "share_resources",
]

HAMI_CORES = "nvidia.com/gpucores"
"""HAMi: percent of one GPU's compute per vGPU (integer 0-100)."""
HAMI_MEMORY = "nvidia.com/gpumem"
"""HAMi: device memory per vGPU, MiB (integer)."""
HAMI_MEMORY_PERCENTAGE = "nvidia.com/gpumem-percentage"
"""HAMi: device memory per vGPU as a percentage of the device's (integer 0-100); used where the model, and so its
memory, is not known (a family such as ``nvidia-gpu``)."""


class DefaultProfileWarning(UserWarning):
    """A candidate's model was rendered with the default cluster conventions because no profile was given."""


_EXAMPLE_PROFILES = {  # the repository's examples/profiles/ per vendor
    "nvidia": ("nvidia-gfd.yaml", "kueue-gke.yaml"),
    "ascend": ("ascend-official.yaml", "ascend-hami.yaml"),
}


def _warn_default_profile(resources: Resources, accel: Accelerator, resource_name: str, label: str | None) -> None:
    """Say which default convention picked ``resources``' model, and how ``--profile`` pins the cluster's own."""
    conv = DEFAULT_PROFILE.vendor(accel.vendor)
    by_plugin = any(len(set(m.resource_names.values())) > 1 for m in resources.accelerator_models)
    if label is None and not by_plugin:
        return
    written = [f"resource {resource_name} (vendors.{accel.vendor}.plugin: {conv.plugin})"] if by_plugin else []
    if label is not None:
        written.append(f"node label {label} (vendors.{accel.vendor}.labels: {conv.labels})")
    examples = _EXAMPLE_PROFILES.get(accel.vendor, ())
    choices = f"vendors.{accel.vendor}.plugin: {' | '.join(sorted(PLUGIN_CONVENTIONS))}; " if by_plugin else ""
    choices += f"vendors.{accel.vendor}.labels: {' | '.join(label_conventions_for(accel.vendor))}"
    warnings.warn(
        f"candidate {resources.describe()}: no cluster profile was given, so the default conventions pick "
        f"{accel.display_name}: {' and '.join(written)}; a cluster named or labelled otherwise never runs it. Pin "
        f"your cluster's conventions with --profile FILE ({choices}"
        + (f"; e.g. examples/profiles/{', examples/profiles/'.join(examples)}" if examples else "")
        + ")",
        DefaultProfileWarning,
        stacklevel=3,
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodPlan:
    """What a pod for one candidate asks for, as plain data (engine-neutral; Kubernetes' camelCase in
    ``affinity``).

    Attributes:
        requests, limits: resource name -> quantity string (``cpu``, ``memory``, the accelerator's resource).
        accelerator_resource: the extended resource name (``nvidia.com/gpu``), or None for CPU.
        accelerator_count: devices (0 for CPU).
        node_selector: label -> value.
        affinity: the pod's ``affinity`` object, or None.
        tolerations: in order, without duplicates.
        labels, annotations: pod metadata.
        scheduler_name: ``schedulerName``, or None for the cluster's default.
        image: the profile's image for the candidate's device kind, or None.
        env: environment variables for the container (a multi-node candidate's launcher: the cluster profile).
        shared_claim / shared_mount: a PersistentVolumeClaim to mount and where (a multi-node candidate's
            launcher: the profile's ``shared_storage``), or None.
        field_env: environment variables from the downward API, name -> ``fieldRef.fieldPath`` (a mixed
            candidate's launcher: ``POD_IP`` from ``status.podIP``, where it hosts the job's c10d store).
    """

    requests: dict[str, str]
    limits: dict[str, str]
    accelerator_resource: str | None
    accelerator_count: int
    node_selector: dict[str, str]
    affinity: dict[str, Any] | None
    tolerations: tuple[Toleration, ...]
    labels: dict[str, str]
    annotations: dict[str, str]
    scheduler_name: str | None
    image: str | None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    shared_claim: str | None = None
    shared_mount: str | None = None
    field_env: dict[str, str] = dataclasses.field(default_factory=dict)


def _accelerator_plan(
    resources: Resources, accel: Accelerator, profile: ClusterProfile, node_selector: dict[str, str]
) -> tuple[str, dict[str, Any] | None]:
    """The resource name and, where needed, the node-affinity requirement that picks the model(s)."""
    conv = profile.vendor(accel.vendor)
    where = f"profile {profile.name!r}" + (f" ({profile.source})" if profile.source else "")
    models = resources.accelerator_models
    names = sorted({m.resource_names[conv.plugin] for m in models})
    if len(names) != 1:
        raise InvalidResources(
            f"accelerator={accel.name!r} ({accel.display_name}) is several resources under the {conv.plugin!r} "
            f"device plugin of {where} ({', '.join(names)}), and a pod asks for one; valid: one model of "
            f"{', '.join(m.name for m in models)}"
        )
    resource_name = names[0]
    sharing = {
        m.name
        for m in ACCELERATORS.values()
        if not m.is_family and m.vendor == accel.vendor and m.resource_names.get(conv.plugin) == resource_name
    }
    sharing |= {m.name for m in models if m.name not in ACCELERATORS}  # a plugin kind's own stand-in model
    chosen = [m.name for m in models]
    if set(chosen) == sharing:
        return resource_name, None  # the resource name alone picks them
    key = conv.label_key
    if key is None:
        raise InvalidResources(
            f"accelerator={accel.name!r} asks for {', '.join(chosen)} among the models behind {resource_name}, but "
            f"{where} sets vendors.{accel.vendor}.labels: none, so no node label tells them apart; valid: a profile "
            f"with vendors.{accel.vendor}.labels one of {', '.join(label_conventions_for(accel.vendor)[:-1]) or 'none'}, "
            "or a family accelerator with your own node_selector"
        )
    values: list[str] = []
    for model in models:
        found = model.node_labels.get(conv.labels)
        if not found:
            raise InvalidResources(
                f"accelerator={model.name!r} ({model.display_name}) has no documented {key} value, so {where} "
                f"(vendors.{accel.vendor}.labels: {conv.labels}) cannot select it; valid: a model with one, or a "
                "family accelerator with your own node_selector"
            )
        values.extend(found)
    values = list(dict.fromkeys(values))
    pinned = node_selector.get(key)
    if pinned is not None:
        if pinned not in values:
            raise InvalidResources(
                f"node_selector[{key!r}]={pinned!r} contradicts accelerator={accel.name!r}, whose nodes carry "
                f"{key} in {values}; valid: one of those values, or leave the key out"
            )
        return resource_name, None
    if len(values) == 1:
        node_selector[key] = values[0]
        return resource_name, None
    return resource_name, {"key": key, "operator": "In", "values": values}


def share_resources(resources: Resources, profile: ClusterProfile | None = None, *, resource_name: str | None = None) -> dict[str, str]:
    """The extended resources that ask for ``resources``' ``device_share`` (part of one device), or an error where
    the profile's device plugin cannot share one. The one place every renderer (KFP, Airflow pods, training-job
    and mixed-job manifests, the plan step's placed pod) learns how a share is asked for.

    Under HAMi (``vendors.nvidia.plugin: hami``) a share of an NVIDIA GPU is one vGPU: ``nvidia.com/gpu: 1``,
    ``nvidia.com/gpucores``: the share in percent of the device's compute (rounded down, at least 1: shares that
    fit one device together still do), and device memory: ``nvidia.com/gpumem`` (MiB) of the candidate's
    ``device_memory``, else ``nvidia.com/gpumem-percentage``, the same percentage of the memory the device reports
    (a review: MiB from the model's data sheet asked 8192 for half a T4, which reports 15360 MiB: two halves did
    not fit one). They go in requests and limits alike (Kubernetes requires it of extended resources).

    Source: the HAMi README, "Run GPU jobs" (github.com/Project-HAMi/HAMi, ``examples/nvidia/default_use.yaml``):
    ``nvidia.com/gpu`` the number of vGPUs, ``nvidia.com/gpumem`` each vGPU's device memory in MiB,
    ``nvidia.com/gpumem-percentage`` the same as a percentage of the device's memory, ``nvidia.com/gpucores`` the
    percentage of one GPU's compute each vGPU may use (integers, optional).

    Args:
        resources: a candidate with ``device_share`` set (else ``{}`` is returned).
        profile: the cluster profile; None means :data:`~heteroflow.components.devices.cluster.DEFAULT_PROFILE`.
        resource_name: the accelerator's extended resource under the profile (default: the accelerator's under the
            profile's plugin).

    Returns:
        resource name -> quantity string.

    Raises:
        InvalidResources: the device is not an NVIDIA GPU (only those are rendered), or the profile's NVIDIA
            device plugin is not ``hami`` (the official plugin and GKE cannot share a GPU); one line naming
            ``device_share``, the candidate and the profile, and what would work.
    """
    milli = resources.device_share_milli
    accel = resources.accelerator_spec  # the plan step narrows it to the model it chose (podplace)
    if milli is None or accel is None:
        return {}
    profile = profile or DEFAULT_PROFILE
    what = f"device_share={milli / 1000:g} of candidate {resources.describe()}"
    if accel.vendor != "nvidia":
        raise InvalidResources(
            f"{what}: {accel.display_name} cannot be shared: fractional requests are rendered for NVIDIA GPUs under "
            f"HAMi ({HAMI_CORES}, {HAMI_MEMORY}); valid: an NVIDIA GPU under a profile with vendors.nvidia.plugin: "
            "hami, or a whole device (drop device_share)"
        )
    plugin = profile.vendor("nvidia").plugin
    if plugin != "hami":
        where = f"profile {profile.name!r}" + (f" ({profile.source})" if profile.source else "")
        raise InvalidResources(
            f"{what}: {where} uses the {plugin!r} NVIDIA device plugin, which cannot share a GPU; valid: a profile "
            "with vendors.nvidia.plugin: hami, or a whole GPU (drop device_share)"
        )
    # rounded down: shares that fit one device together still do (3 x 0.333 asked 3 x 34 = 102% of it)
    percent = max(1, milli // 10)
    out = {resource_name or accel.resource_name_for(plugin): "1", HAMI_CORES: str(percent)}
    if resources.device_memory_bytes:
        out[HAMI_MEMORY] = str(math.ceil(resources.device_memory_bytes / 2**20))
    else:  # a percentage of what the device reports (a T4 reports 15360 MiB, not the 16 GiB on its sheet)
        out[HAMI_MEMORY_PERCENTAGE] = str(percent)
    return out


def _merge_requirement(affinity: dict[str, Any] | None, requirement: dict[str, Any]) -> dict[str, Any]:
    """AND ``requirement`` into every required node-selector term (they are ORed), or add the first term."""
    affinity = dict(affinity or {})
    node = dict(affinity.get("nodeAffinity") or {})
    required = dict(node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or []]
    if not terms:
        terms = [{"matchExpressions": [requirement]}]
    else:
        for term in terms:
            term["matchExpressions"] = [*(term.get("matchExpressions") or []), requirement]
    required["nodeSelectorTerms"] = terms
    node["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node
    return affinity


def plan_pod(resources: Resources, profile: ClusterProfile | None = None, *, local: bool = False) -> PodPlan:
    """Decide what a pod for ``resources`` asks for on the cluster ``profile`` describes (pure; no I/O).

    Args:
        resources: the candidate.
        profile: the cluster profile; None means :data:`~heteroflow.components.devices.cluster.DEFAULT_PROFILE`.
        local: for a run with no cluster (kfp.local, which never reads a task's resources): a ``device_share`` is
            planned as its one whole device instead of as the plugin's share resources (:func:`share_resources`),
            so a profile that cannot share does not stop it.

    Returns:
        A :class:`PodPlan`.

    Raises:
        InvalidResources: the candidate cannot be asked for on that cluster (a ``device_share`` included, see
            :func:`share_resources`); the message names the field, the profile and what would work.

    Warns:
        DefaultProfileWarning: ``profile`` is None and the default conventions picked an accelerator model (a node
            label, or a resource name that depends on the device plugin); the message says which ``--profile``
            settings pin the cluster's own.
    """
    if resources.nodes > 1 or getattr(resources, "replicas", None):  # multi-node or mixed (#29): a launcher's pod
        return _launcher_plan(resources, profile, local=local)
    given = profile
    profile = profile or DEFAULT_PROFILE
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    for name, req, lim in (
        ("cpu", resources.cpu_text(), resources.cpu_text(limit=True)),
        ("memory", resources.memory_text(), resources.memory_text(limit=True)),
    ):
        if req is not None:
            requests[name] = req
        if lim is not None:
            limits[name] = lim
    node_selector = dict(resources.node_selector)
    affinity = thaw(resources.affinity) if resources.affinity is not None else None
    tolerations = list(profile.tolerations)
    accel = resources.accelerator_spec
    resource_name = None
    count = 0
    if accel is not None:
        before = dict(node_selector)
        resource_name, requirement = _accelerator_plan(resources, accel, profile, node_selector)
        count = resources.count or 0
        requests[resource_name] = limits[resource_name] = str(count)
        if resources.device_share is not None and not local:  # part of one device: the plugin's share resources
            # before the default-profile warning: a share the profile cannot ask for is an error, and a warning
            # about the conventions the pod would have used only stood in front of it
            shared = share_resources(resources, profile, resource_name=resource_name)
            requests.update(shared)
            limits.update(shared)
        if given is None:
            added = {k: v for k, v in node_selector.items() if before.get(k) != v}
            label = (
                f"{requirement['key']} in {', '.join(requirement['values'])}" if requirement is not None
                else ", ".join(f"{k}={v}" for k, v in added.items()) or None
            )
            _warn_default_profile(resources, accel, resource_name, label)
        if requirement is not None:
            affinity = _merge_requirement(affinity, requirement)
        if profile.accelerator_tolerations:
            keys = dict.fromkeys(k for m in resources.accelerator_models for k in m.taint_keys)
            tolerations.extend(Toleration(key=k, operator="Exists", effect="NoSchedule") for k in keys)
    tolerations.extend(resources.tolerations)
    labels = dict(profile.labels)
    if profile.kueue_queue is not None:
        labels[KUEUE_QUEUE_LABEL] = profile.kueue_queue
    labels.update(resources.labels)
    annotations = dict(profile.annotations)
    if profile.volcano_queue is not None:
        annotations[VOLCANO_QUEUE_ANNOTATION] = profile.volcano_queue
    annotations.update(resources.annotations)
    return PodPlan(
        requests=requests,
        limits=limits,
        accelerator_resource=resource_name,
        accelerator_count=count,
        node_selector=node_selector,
        affinity=affinity,
        tolerations=tuple(dict.fromkeys(tolerations)),
        labels=labels,
        annotations=annotations,
        scheduler_name=profile.scheduler_name,
        image=profile.image_for(resources.kind),  # type: ignore[arg-type]
    )


def _launcher_plan(resources: Resources, profile: ClusterProfile | None, *, local: bool = False) -> PodPlan:
    """A multi-node candidate's task is the launcher of its training job (:mod:`heteroflow.components.training.trainjob`):
    a CPU pod (:func:`~heteroflow.components.training.trainjob.launcher_candidate`) with the profile in its environment and
    the shared claim mounted; the nodes' own pods (checked here, so a bad candidate fails at compile time) are
    the job's, rendered by :func:`heteroflow.components.training.trainjob.training_job_manifests` at run time.
    A mixed candidate's task (``gpu:count=2+npu:count=4``) is the same CPU pod, each kind's pod checked here; it
    launches the mixed job's Volcano Job and hosts its c10d store
    (:func:`heteroflow.components.training.mixed_launch.launch_mixed_job`)."""
    import json

    from heteroflow.components.training.trainjob import PROFILE_ENV, launcher_candidate

    for one in [g.resources for g in getattr(resources, "replicas", ())] or [dataclasses.replace(resources, nodes=1)]:
        plan_pod(one, profile, local=local)
    launcher = plan_pod(launcher_candidate(resources), profile, local=local)
    used = profile or DEFAULT_PROFILE
    env = {PROFILE_ENV: json.dumps(used.to_dict(), sort_keys=True)}
    field_env: dict[str, str] = {}
    labels = dict(launcher.labels)
    if getattr(resources, "replicas", None):  # a mixed job's pods reach the store on this pod's IP and port
        from heteroflow.components.training.mixed_job import RDZV_PORT
        from heteroflow.components.training.mixed_launch import LAUNCHER_LABEL, POD_IP_ENV, PORT_ENV

        env[PORT_ENV] = str(RDZV_PORT)
        field_env[POD_IP_ENV] = "status.podIP"
        labels[LAUNCHER_LABEL] = "true"  # what a NetworkPolicy admitting the port selects
    return dataclasses.replace(launcher, env=env, field_env=field_env, labels=labels,
                               shared_claim=used.shared_claim, shared_mount=used.shared_mount)
