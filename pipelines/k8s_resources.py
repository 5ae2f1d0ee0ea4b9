"""The pure pod builder: a candidate (:class:`Resources`) and a cluster profile -> what a Kubernetes pod asks for.

One side-effect-free function, :func:`build_pod_resources`, renders a candidate into the Kubernetes Python
client's own types (``V1ResourceRequirements``, ``V1Toleration``, a node-selector map, ``V1Affinity``, pod
labels and annotations, the scheduler name), the way Airflow's ``build_pod_request_obj()`` builds a ``V1Pod``.
The KFP renderer (:mod:`heteroflow.pipelines.kfp_resources`) and Airflow's KubernetesPodOperator pods use the
same plan (:func:`plan_pod`), so both engines ask a cluster for the same thing.

What it decides:

- requests and limits separately, in the units the user wrote; the accelerator's extended resource (named per
  the profile's device-plugin convention) with its count in both, as Kubernetes requires;
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
tell apart, a node selector that contradicts the model, an unknown affinity field).

Without a profile (issue #16.20) the default conventions (:data:`~heteroflow.components.cluster.DEFAULT_PROFILE`)
pick a model: ``gpu:accelerator=t4`` asks for ``nvidia.com/gpu`` on nodes labelled ``nvidia.com/gpu.product`` in
``Tesla-T4``/``TESLA-T4`` (NVIDIA GPU feature discovery). Whenever that choice rests on an assumed convention (a
node label, or a resource name that differs between device plugins), :func:`plan_pod` warns with a
:class:`DefaultProfileWarning` naming the label or resource it wrote and the ``--profile`` settings (and example
profiles) that pin the cluster's own; a node labelled another way would never run the step, so it is never silent.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping
from typing import Any

from heteroflow.components.accelerators import ACCELERATORS, PLUGIN_CONVENTIONS, Accelerator, label_conventions_for
from heteroflow.components.cluster import (
    DEFAULT_PROFILE,
    KUEUE_QUEUE_LABEL,
    VOLCANO_QUEUE_ANNOTATION,
    ClusterProfile,
)
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import Resources, Toleration, thaw

__all__ = ["DefaultProfileWarning", "PodPlan", "PodResources", "build_pod_resources", "plan_pod"]


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


def plan_pod(resources: Resources, profile: ClusterProfile | None = None) -> PodPlan:
    """Decide what a pod for ``resources`` asks for on the cluster ``profile`` describes (pure; no I/O).

    Args:
        resources: the candidate.
        profile: the cluster profile; None means :data:`~heteroflow.components.cluster.DEFAULT_PROFILE`.

    Returns:
        A :class:`PodPlan`.

    Raises:
        InvalidResources: the candidate cannot be asked for on that cluster; the message names the field, the
            profile and what would work.

    Warns:
        DefaultProfileWarning: ``profile`` is None and the default conventions picked an accelerator model (a node
            label, or a resource name that depends on the device plugin); the message says which ``--profile``
            settings pin the cluster's own.
    """
    if resources.nodes > 1:
        return _launcher_plan(resources, profile)
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
        if given is None:
            added = {k: v for k, v in node_selector.items() if before.get(k) != v}
            label = (
                f"{requirement['key']} in {', '.join(requirement['values'])}" if requirement is not None
                else ", ".join(f"{k}={v}" for k, v in added.items()) or None
            )
            _warn_default_profile(resources, accel, resource_name, label)
        count = resources.count or 0
        requests[resource_name] = limits[resource_name] = str(count)
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


def _launcher_plan(resources: Resources, profile: ClusterProfile | None) -> PodPlan:
    """A multi-node candidate's task is the launcher of its training job (:mod:`heteroflow.components.trainjob`):
    a CPU pod (:func:`~heteroflow.components.trainjob.launcher_candidate`) with the profile in its environment and
    the shared claim mounted; the nodes' own pods (checked here, so a bad candidate fails at compile time) are
    the job's, rendered by :func:`heteroflow.pipelines.manifests.training_job_manifests` at run time."""
    import json

    from heteroflow.components.trainjob import PROFILE_ENV, launcher_candidate

    plan_pod(dataclasses.replace(resources, nodes=1), profile)
    launcher = plan_pod(launcher_candidate(resources), profile)
    used = profile or DEFAULT_PROFILE
    return dataclasses.replace(launcher, env={PROFILE_ENV: json.dumps(used.to_dict(), sort_keys=True)},
                               shared_claim=used.shared_claim, shared_mount=used.shared_mount)


# --- Kubernetes client types ------------------------------------------------------------------------------

_LIST = re.compile(r"list\[(.+)\]")
_DICT = re.compile(r"dict\((\w+), (.+)\)")


def _to_model(data: Any, type_name: str, path: str) -> Any:
    """Build a kubernetes client model from Kubernetes' camelCase JSON, rejecting unknown fields by path."""
    from kubernetes import client

    if (m := _LIST.fullmatch(type_name)) is not None:
        if not isinstance(data, list):
            raise InvalidResources(f"{path}={data!r} is not a list")
        return [_to_model(item, m[1], f"{path}[{i}]") for i, item in enumerate(data)]
    if (m := _DICT.fullmatch(type_name)) is not None:
        if not isinstance(data, Mapping):
            raise InvalidResources(f"{path}={data!r} is not a mapping")
        return {k: _to_model(v, m[2], f"{path}[{k!r}]") for k, v in data.items()}
    if type_name in ("str", "int", "bool", "float", "object"):
        expected = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}[type_name]
        if not isinstance(data, expected) or (type_name == "int" and isinstance(data, bool)):
            raise InvalidResources(f"{path}={data!r} is not a {type_name}")
        return data
    cls = getattr(client, type_name)
    if not isinstance(data, Mapping):
        raise InvalidResources(f"{path}={data!r} is not a mapping (a {type_name})")
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    unknown = sorted(set(data) - set(by_json))
    if unknown:
        raise InvalidResources(
            f"{path} has unknown field(s) {', '.join(map(str, unknown))}; valid: {', '.join(sorted(by_json))}"
        )
    kwargs = {by_json[k]: _to_model(v, cls.openapi_types[by_json[k]], f"{path}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a required field is missing
        raise InvalidResources(f"{path}: {exc}") from None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodResources:
    """A candidate rendered into the Kubernetes Python client's types (see :func:`build_pod_resources`).

    Attributes:
        resources: ``V1ResourceRequirements`` (requests and limits).
        tolerations: ``list[V1Toleration]``.
        node_selector: ``dict[str, str]``.
        affinity: ``V1Affinity`` or None.
        labels, annotations: pod metadata.
        scheduler_name: the pod's ``schedulerName``, or None.
        image: the profile's image for the device kind, or None.
        env: ``dict[str, str]`` of container environment variables (a multi-node candidate's launcher).
        volumes / volume_mounts: ``list[V1Volume]`` / ``list[V1VolumeMount]`` (the launcher's shared claim).
    """

    resources: Any
    tolerations: list[Any]
    node_selector: dict[str, str]
    affinity: Any
    labels: dict[str, str]
    annotations: dict[str, str]
    scheduler_name: str | None
    image: str | None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    volumes: list[Any] = dataclasses.field(default_factory=list)
    volume_mounts: list[Any] = dataclasses.field(default_factory=list)

    def pod(self, *, name: str, image: str | None = None, command: list[str] | None = None) -> Any:
        """A minimal ``V1Pod`` with one container (``main``) carrying these resources, e.g. to validate or to
        hand to an engine.

        Args:
            name: the pod's name.
            image: the container image; default: :attr:`image`, else ``"heteroflow:latest"``.
            command: the container command, or None.
        """
        from kubernetes import client

        return client.V1Pod(
            api_version="v1",
            kind="Pod",
            metadata=client.V1ObjectMeta(name=name, labels=self.labels or None, annotations=self.annotations or None),
            spec=client.V1PodSpec(
                containers=[
                    client.V1Container(
                        name="main", image=image or self.image or "heteroflow:latest", command=command,
                        resources=self.resources,
                    )
                ],
                node_selector=self.node_selector or None,
                tolerations=self.tolerations or None,
                affinity=self.affinity,
                scheduler_name=self.scheduler_name,
                restart_policy="Never",
            ),
        )

    def kubernetes_pod_operator_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for Airflow's ``KubernetesPodOperator`` (``container_resources``, ``tolerations``,
        ``node_selector``, ``affinity``, ``labels``, ``annotations``, ``schedulername`` and, where the profile
        names one, ``image``; for a multi-node candidate's launcher ``env_vars``, ``volumes``, ``volume_mounts``)."""
        out: dict[str, Any] = {
            "container_resources": self.resources,
            "tolerations": self.tolerations,
            "node_selector": self.node_selector,
            "affinity": self.affinity,
            "labels": self.labels,
            "annotations": self.annotations,
            "schedulername": self.scheduler_name,
        }
        if self.image is not None:
            out["image"] = self.image
        if self.env:
            out["env_vars"] = dict(self.env)
        if self.volumes:
            out["volumes"] = list(self.volumes)
            out["volume_mounts"] = list(self.volume_mounts)
        return out


def build_pod_resources(resources: Resources, profile: ClusterProfile | None = None) -> PodResources:
    """Render a candidate for the cluster ``profile`` describes into the Kubernetes client's types (pure).

    Args:
        resources: the candidate.
        profile: the cluster profile; None means the default (official plugins, feature-discovery labels).

    Returns:
        A :class:`PodResources`; every fragment validates against the Kubernetes API schema.

    Raises:
        InvalidResources: as :func:`plan_pod`, and for an affinity field the Kubernetes API does not have
            (named by its path, e.g. ``affinity.nodeAffinity.requiredDuringScheduling``).
    """
    from kubernetes import client

    plan = plan_pod(resources, profile)
    tolerations = [
        client.V1Toleration(
            key=t.key or None,
            operator=t.operator,
            value=t.value or None,
            effect=t.effect or None,
            toleration_seconds=t.toleration_seconds,
        )
        for t in plan.tolerations
    ]
    return PodResources(
        resources=client.V1ResourceRequirements(requests=plan.requests or None, limits=plan.limits or None),
        tolerations=tolerations,
        node_selector=plan.node_selector,
        affinity=None if plan.affinity is None else _to_model(plan.affinity, "V1Affinity", "affinity"),
        labels=plan.labels,
        annotations=plan.annotations,
        scheduler_name=plan.scheduler_name,
        image=plan.image,
        env=dict(plan.env),
        volumes=[client.V1Volume(name="heteroflow-shared", persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
            claim_name=plan.shared_claim))] if plan.shared_claim else [],
        volume_mounts=[client.V1VolumeMount(name="heteroflow-shared", mount_path=plan.shared_mount)] if plan.shared_claim else [],
    )
