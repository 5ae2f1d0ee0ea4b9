"""The pure pod builder: a candidate (:class:`Resources`) and a cluster profile -> what a Kubernetes pod asks for.

One side-effect-free function, :func:`build_pod_resources`, renders a candidate into the Kubernetes Python
client's own types (``V1ResourceRequirements``, ``V1Toleration``, a node-selector map, ``V1Affinity``, pod
labels and annotations, the scheduler name), the way Airflow's ``build_pod_request_obj()`` builds a ``V1Pod``.
The KFP renderer (:mod:`heteroflow.pipelines.kfp.resources`) and Airflow's KubernetesPodOperator pods use the
same plan (:func:`plan_pod`, from :mod:`heteroflow.components.devices.podplan`, importable here too), so both engines ask
a cluster for the same thing.

What the plan decides (requests and limits, the accelerator's resource name, the node label or affinity that
picks the model, tolerations, labels and annotations, the scheduler and the image), and the
:class:`DefaultProfileWarning` it gives without a profile: :mod:`heteroflow.components.devices.podplan`.

Raises :class:`~heteroflow.components.errors.InvalidResources` where a candidate cannot be asked for on the
cluster the profile describes (as :func:`plan_pod`), or it names an affinity field the Kubernetes API does not
have.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from heteroflow.components.devices.cluster import ClusterProfile
from heteroflow.components.errors import InvalidResources
from heteroflow.components.devices.podplan import DefaultProfileWarning, PodPlan, plan_pod
from heteroflow.components.resources import Resources

__all__ = ["DefaultProfileWarning", "PodPlan", "PodResources", "build_pod_resources", "plan_pod"]


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
        field_env: ``dict[str, str]`` of variables from the downward API, name -> ``fieldRef.fieldPath`` (a mixed
            candidate's launcher: ``POD_IP`` from ``status.podIP``); :meth:`env_vars` renders them.
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
    field_env: dict[str, str] = dataclasses.field(default_factory=dict)

    def field_env_vars(self) -> list[Any]:
        """:attr:`field_env` as ``V1EnvVar`` values from the downward API (``valueFrom.fieldRef.fieldPath``)."""
        from kubernetes import client

        return [client.V1EnvVar(name=name, value_from=client.V1EnvVarSource(field_ref=client.V1ObjectFieldSelector(field_path=path)))
                for name, path in self.field_env.items()]

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
        names one, ``image``; for a multi-node candidate's launcher ``env_vars``, ``volumes``, ``volume_mounts``:
        ``env_vars`` is a dict, or a list of ``V1EnvVar`` where some come from the downward API, a mixed
        candidate's launcher's ``POD_IP``)."""
        from kubernetes import client

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
        if self.field_env:  # some from the downward API: the operator's list form
            out["env_vars"] = [*(client.V1EnvVar(name=k, value=v) for k, v in self.env.items()), *self.field_env_vars()]
        elif self.env:
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

    import os

    if isinstance(profile, (str, os.PathLike)):  # a profile's file: loaded (said "'str' object has no attribute 'tolerations'")
        from heteroflow.components.devices.cluster import load_profile

        profile = load_profile(profile)
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
        field_env=dict(plan.field_env),
        volumes=[client.V1Volume(name="heteroflow-shared", persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
            claim_name=plan.shared_claim))] if plan.shared_claim else [],
        volume_mounts=[client.V1VolumeMount(name="heteroflow-shared", mount_path=plan.shared_mount)] if plan.shared_claim else [],
    )
