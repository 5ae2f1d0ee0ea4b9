"""Render a candidate onto a KFP ``PipelineTask``: one call, :func:`apply_resources`.

The same plan as the pod builder (:func:`heteroflow.pipelines.k8s.resources.plan_pod`) is written with KFP's
own setters and the ``kfp-kubernetes`` extension (``kfp.kubernetes``, installed with the ``kfp`` extra):

- ``set_cpu_request`` / ``set_cpu_limit`` / ``set_memory_request`` / ``set_memory_limit``, each only where the
  candidate has it, in the unit the user wrote (``8G`` stays ``8G``) unless KFP's validator does not take that
  spelling (it wants an integer and no lowercase ``k``: ``1.5Gi`` becomes the exact ``1536Mi``);
- ``set_accelerator_type`` / ``set_accelerator_limit`` with the extended resource the profile's device-plugin
  convention names (``huawei.com/Ascend910`` or ``huawei.com/Ascend910B3`` for the same 910B3);
- part of one device (``device_share``): the plan's HAMi resources (``nvidia.com/gpucores``, ``nvidia.com/gpumem``)
  beside ``nvidia.com/gpu`` cannot be set on a KFP task (below), so such a candidate is an error on a cluster
  rather than a whole GPU in its place; on kfp.local (``local=True``, which never reads a task's resources) it is
  asked for as its one device;
- ``kfp.kubernetes.add_node_selector``, ``add_node_affinity`` (one call per node-selector term: the KFP
  backend ORs the terms, and the model's requirement is ANDed into each), ``add_toleration``,
  ``add_pod_label`` and ``add_pod_annotation``; a mixed candidate's launcher gets ``POD_IP`` from the downward API
  with ``use_field_path_as_env`` (``status.podIP``: the address the job's pods reach its c10d store on).

Not expressible on KFP (kfp 2.17 / kfp-kubernetes 2.17): a pod's ``schedulerName`` (a warning is issued when the
profile sets one: make it the namespace default or inject it with a webhook), pod affinity and anti-affinity
(an error), extended resources beyond the one accelerator (an error: a task has one accelerator type and limit,
and neither the SDK nor kfp-kubernetes sets other resource limits, kubeflow/pipelines#10996; so a HAMi device
share, whose ``nvidia.com/gpucores`` and ``nvidia.com/gpumem`` sit beside ``nvidia.com/gpu``, runs as Airflow
pods or inside a mixed job's manifests, not as a KFP task), and the image per device kind (a component's image
is fixed where the component is defined).
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from heteroflow.components.devices.cluster import ClusterProfile
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import Resources
from heteroflow.pipelines.k8s.resources import plan_pod

if TYPE_CHECKING:
    from kfp.dsl import PipelineTask

__all__ = ["apply_resources", "kfp_memory_text", "without_kubernetes_settings"]

_KUBERNETES_SETTINGS: contextvars.ContextVar[bool] = contextvars.ContextVar("heteroflow_kfp_kubernetes_settings", default=True)


@contextlib.contextmanager
def without_kubernetes_settings() -> Iterator[None]:
    """For the duration, :func:`apply_resources` checks the candidate and sets KFP's own requests and limits, but
    writes no ``kfp-kubernetes`` settings (node selector and affinity, tolerations, pod labels and annotations).

    For kfp.local, which never reads a task's platform settings: importing ``kfp.kubernetes`` imports the
    kubernetes client, about 0.3 s of every local run for settings nothing reads.
    """
    token = _KUBERNETES_SETTINGS.set(False)
    try:
        yield
    finally:
        _KUBERNETES_SETTINGS.reset(token)

# kfp.dsl.PipelineTask._validate_memory_request_limit (kfp 2.17)
_KFP_MEMORY = re.compile(r"[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|Ki)?")
_KFP_UNITS = (
    ("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10),
    ("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6),
)


def kfp_memory_text(text: str, num_bytes: int) -> str:
    """``text`` if KFP's memory validator accepts it, else the shortest exact spelling it accepts.

    KFP accepts ``^[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$``; its ``K`` is not a Kubernetes unit (Kubernetes
    writes ``k``), so kilobytes are written as bytes. Example: ``("1.5Gi", 1610612736)`` -> ``"1536Mi"``.
    """
    if _KFP_MEMORY.fullmatch(text):
        return text
    for suffix, unit in _KFP_UNITS:
        if num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def apply_resources(
    task: PipelineTask, resources: Resources, *, profile: ClusterProfile | None = None, local: bool = False
) -> PipelineTask:
    """Ask for ``resources`` on ``task`` the way the cluster ``profile`` describes names things.

    Args:
        task: a single-step KFP task (not a pipeline used as a component).
        resources: the candidate.
        profile: the cluster profile; None means the default (official device plugins, NVIDIA feature-discovery
            labels, usual accelerator tolerations).
        local: the task runs on kfp.local, which never reads a task's resources: a ``device_share`` is set as its
            one device (see :func:`~heteroflow.pipelines.k8s.resources.plan_pod`).

    Returns:
        ``task``, for chaining.

    Raises:
        InvalidResources: the candidate cannot be asked for on that cluster (see
            :func:`~heteroflow.pipelines.k8s.resources.plan_pod`; a ``device_share`` under a plugin that cannot
            share), or it has pod affinity / anti-affinity or extended resources beside its accelerator (a HAMi
            device share), which KFP cannot set.
    """
    plan = plan_pod(resources, profile, local=local)
    extra = sorted(set(plan.limits) - {"cpu", "memory", plan.accelerator_resource})
    if extra:
        share = f"device_share={resources.device_share:g} of " if resources.device_share is not None else ""
        raise InvalidResources(
            f"{share}candidate {resources.describe()} asks for {', '.join(extra)} beside {plan.accelerator_resource}, "
            "which a KFP task cannot set (one accelerator type and limit per task; kfp-kubernetes sets no other "
            "resource limits: kubeflow/pipelines#10996); valid: Airflow pods (heteroflow.dags.factory.build_dag with "
            "mode='kubernetes' and this profile), or a whole GPU (drop device_share)"
        )
    if plan.affinity:
        extra = sorted(set(plan.affinity) - {"nodeAffinity"})
        if extra:
            raise InvalidResources(
                f"affinity.{extra[0]} cannot be set on a KFP task: kfp-kubernetes sets node affinity only; valid: "
                "affinity.nodeAffinity, or run this step as an Airflow pod"
            )
    for setter, value in (
        (task.set_cpu_request, plan.requests.get("cpu")),
        (task.set_cpu_limit, plan.limits.get("cpu")),
    ):
        if value is not None:
            setter(value)
    for setter, value, num in (
        (task.set_memory_request, plan.requests.get("memory"), resources.memory_bytes),
        (task.set_memory_limit, plan.limits.get("memory"), resources.memory_limit_bytes),
    ):
        if value is not None and num is not None:
            setter(kfp_memory_text(value, num))
    if plan.accelerator_resource is not None:
        task.set_accelerator_type(plan.accelerator_resource).set_accelerator_limit(plan.accelerator_count)
    for name, value in plan.env.items():  # a multi-node candidate's launcher: the cluster profile
        task.set_env_variable(name, value)
    if _KUBERNETES_SETTINGS.get():
        _kubernetes_settings(task, plan)
        if resources.nodes > 1:
            from heteroflow.components.training.trainjob import warn_if_unlaunchable

            warn_if_unlaunchable(resources, profile)
    if plan.scheduler_name is not None:
        warnings.warn(
            f"the cluster profile sets scheduler_name={plan.scheduler_name!r}, which KFP cannot set on a task; make "
            "it the namespace's default scheduler or inject it with a mutating webhook (Airflow pods get it)",
            UserWarning,
            stacklevel=2,
        )
    return task


def _kubernetes_settings(task: PipelineTask, plan: Any) -> None:
    """The plan's ``kfp-kubernetes`` settings on ``task``."""
    from kfp import kubernetes

    for key, value in plan.node_selector.items():
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    node = (plan.affinity or {}).get("nodeAffinity") or {}
    required = (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in required:
        kubernetes.add_node_affinity(
            task, match_expressions=term.get("matchExpressions"), match_fields=term.get("matchFields")
        )
    for preferred in node.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        term = preferred.get("preference") or {}
        kubernetes.add_node_affinity(
            task,
            match_expressions=term.get("matchExpressions"),
            match_fields=term.get("matchFields"),
            weight=preferred.get("weight"),
        )
    for t in plan.tolerations:
        kubernetes.add_toleration(
            task,
            key=t.key or None,
            operator=t.operator,
            value=t.value or None,
            effect=t.effect or None,  # type: ignore[arg-type]
            toleration_seconds=t.toleration_seconds,
        )
    for key, value in plan.labels.items():
        kubernetes.add_pod_label(task, label_key=key, label_value=value)
    for key, value in plan.annotations.items():
        kubernetes.add_pod_annotation(task, annotation_key=key, annotation_value=value)
    for name, field_path in plan.field_env.items():  # a mixed candidate's launcher: POD_IP from status.podIP
        kubernetes.use_field_path_as_env(task, env_name=name, field_path=field_path)
    if plan.shared_claim is not None:  # a multi-node candidate's launcher: where the job's nodes share data
        kubernetes.mount_pvc(task, pvc_name=plan.shared_claim, mount_path=str(plan.shared_mount))
