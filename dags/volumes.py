"""A call's env, volumes, image and packages on Airflow (see :mod:`heteroflow.pipelines.volumes` for the options).

Kubernetes mode (KubernetesPodOperator):

- ``env`` -> the pod's ``env_vars``; ``retry_on="any"`` adds nothing to the pod (the operator retries the pod's
  permanent failure itself, :class:`heteroflow.dags.operators.StepEnding`).
- ``volumes`` -> ``V1Volume`` + ``V1VolumeMount`` (a claim, a ConfigMap or a Secret). A
  :class:`~heteroflow.pipelines.volumes.CreatePVC` is created per DAG run by a ``create-pvc-<name>`` task
  (``KubernetesCreateResourceOperator``, before the first call that mounts it) and deleted by ``delete-pvc-<name>``
  (``KubernetesDeleteResourceOperator``, trigger rule ``all_done``: whatever the calls ended with), named
  ``hf-<dag id>-<run id>-<name>`` (templated; lowercase, ``[a-z0-9.-]``).
- ``base_image`` -> the pod's ``image``; ``packages_to_install`` -> the container first runs
  ``python3 -m pip install ...`` and then ``heteroflow step`` (what KFP's lightweight components do).

Local mode: ``prepare-run`` makes the run's volume folders, each step gets its env and
:data:`~heteroflow.components.core.mounts.MOUNTS_ENV`, ``record-run`` deletes the folders.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from heteroflow.pipelines import volumes as vol

__all__ = ["claim_name", "pod_volumes", "pvc_operators", "with_packages"]

CREATE_PREFIX = "create-pvc-"
DELETE_PREFIX = "delete-pvc-"


def claim_name(name: str) -> str:
    """The templated name of CreatePVC ``name``'s claim in one DAG run: ``hf-<dag id>-<run id>-<name>`` (lowercase;
    ``_ : +`` become ``-``), unique per run as KFP's ``<workflow>-<name>`` is."""
    return (
        "{{ ('hf-' ~ dag.dag_id ~ '-' ~ run_id) | lower | replace('_', '-') | replace(':', '-') | replace('+', '-') }}"
        f"-{name}"
    )


def pod_volumes(call: Any) -> tuple[list[Any], list[Any]]:
    """``(volumes, volume_mounts)`` for the pod of ``call`` (``kubernetes.client`` models)."""
    from kubernetes.client import models as k8s

    volumes: list[Any] = []
    mounts: list[Any] = []
    for i, (path, volume) in enumerate(sorted(vol.call_mounts(call).items())):
        name = f"hf-volume-{i}"
        if isinstance(volume, vol.CreatePVC):
            source = {"persistent_volume_claim": k8s.V1PersistentVolumeClaimVolumeSource(claim_name=claim_name(volume.name))}
        elif isinstance(volume, vol.PVC):
            source = {"persistent_volume_claim": k8s.V1PersistentVolumeClaimVolumeSource(claim_name=volume.name)}
        elif isinstance(volume, vol.ConfigMapVolume):
            source = {"config_map": k8s.V1ConfigMapVolumeSource(name=volume.name, optional=volume.optional)}
        else:
            source = {"secret": k8s.V1SecretVolumeSource(secret_name=volume.name, optional=volume.optional)}
        volumes.append(k8s.V1Volume(name=name, **source))
        mounts.append(k8s.V1VolumeMount(name=name, mount_path=path))
    return volumes, mounts


def with_packages(call: Any, cmds: list[str]) -> list[str]:
    """``cmds`` preceded by ``pip install`` of ``call``'s ``packages_to_install`` (``sh -ec 'pip install ... && exec
    "$@"' sh heteroflow step ...``; the pod's ``arguments`` follow), or ``cmds`` when it has none."""
    packages = list(getattr(call, "packages_to_install", ()) or ())
    if not packages:
        return cmds
    script = "python3 -m pip install --quiet --no-warn-script-location " + " ".join(shlex.quote(p) for p in packages) + ' && exec "$@"'
    return ["sh", "-ec", script, "sh", *cmds]


def pvc_operators(pipeline: Any, *, namespace: str | None, conn_id: str | None = None) -> dict[str, tuple[Any, Any | None, list[str]]]:
    """The ``create-pvc-<name>`` / ``delete-pvc-<name>`` tasks of the pipeline's CreatePVCs (inside a ``with dag:``):
    ``{name: (create task, delete task or None, calls that mount it)}``. Wiring is the caller's (the factory)."""
    from airflow.providers.cncf.kubernetes.operators.resource import (
        KubernetesCreateResourceOperator,
        KubernetesDeleteResourceOperator,
    )
    from airflow.sdk import TriggerRule

    out: dict[str, tuple[Any, Any | None, list[str]]] = {}
    extra: dict[str, Any] = {"namespace": namespace} if namespace else {}
    if conn_id:
        extra["kubernetes_conn_id"] = conn_id
    for name, (spec, users) in vol.created_pvcs(pipeline.calls).items():
        manifest = yaml.safe_dump(spec.manifest(claim_name(name)), sort_keys=False)
        create = KubernetesCreateResourceOperator(
            task_id=f"{CREATE_PREFIX}{name}",
            yaml_conf=manifest,
            retries=2,
            doc_md=f"Creates the run's PersistentVolumeClaim `{name}` ({spec.size}) for {', '.join(users)}.",
            **extra,
        )
        delete = None
        if spec.delete_at_end:
            delete = KubernetesDeleteResourceOperator(
                task_id=f"{DELETE_PREFIX}{name}",
                yaml_conf=manifest,
                trigger_rule=TriggerRule.ALL_DONE,
                retries=2,
                doc_md=f"Deletes the run's PersistentVolumeClaim `{name}` once {', '.join(users)} ended (KFP's DeletePVC).",
                **extra,
            )
        out[name] = (create, delete, users)
    return out


def manifests(pipeline: Any, names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The PersistentVolumeClaim objects of the pipeline's CreatePVCs, with the claim names ``names`` gives
    (default ``<name>``): what ``create-pvc-<name>`` creates, for validation against the Kubernetes schema."""
    return [spec.manifest((names or {}).get(name, name)) for name, (spec, _) in vol.created_pvcs(pipeline.calls).items()]
