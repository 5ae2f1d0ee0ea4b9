"""A call's step-level options on a KFP task (:mod:`heteroflow.pipelines.volumes`), with ``kfp-kubernetes``.

- ``env``: ``PipelineTask.set_env_variable`` (kfp.local passes a task's env to its process too).
- ``volumes`` on a cluster: a :class:`~heteroflow.pipelines.volumes.CreatePVC` is one ``kubernetes.CreatePVC`` task
  at the start of the run (``pvc_name_suffix``: the claim is ``<workflow>-<name>``), mounted with
  ``kubernetes.mount_pvc`` from that task's ``name`` output, and deleted by ``kubernetes.DeletePVC`` after the
  calls that mount it (after the run's check task when a call is a fallback chain, whose tasks sit in condition
  groups that nothing outside may name: a failed run then keeps the claim, as KFP's own ``DeletePVC.after(...)``
  does); ``PVC`` is ``mount_pvc``; ``ConfigMapVolume`` / ``SecretVolume`` are ``use_config_map_as_volume`` /
  ``use_secret_as_volume``.
- ``volumes`` on kfp.local (which refuses ``kfp-kubernetes`` PVCs and never reads the other settings): the task
  gets :data:`~heteroflow.components.core.mounts.MOUNTS_ENV`, the folders of the run that stand for its volumes
  (:func:`heteroflow.pipelines.volumes.local_mounts`), created and deleted by
  :func:`heteroflow.pipelines.kfp.local.run_local`.
- ``retry_on="any"``: the task gets ``HETEROFLOW_RETRY_ON=any``, so a permanent failure raises and KFP retries it.
- ``base_image`` / ``packages_to_install``: the component's own (on kfp.local the packages are not installed: this
  environment must have them; a warning says so).
- Generic names: KFP names an If/Else pair's group ``condition-branches-N`` and an importer ``importer``; the
  Kubeflow UI shows those unless a display name is set: :func:`name_condition_branches` and the importers' display
  names give them their call's name.
- Integer defaults: KFP writes every number parameter's default as a float (``10.0``, a protobuf ``Value``);
  :func:`integer_defaults` writes ``NUMBER_INTEGER`` defaults as integers in the compiled YAML.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from heteroflow.components.core.runtime import RETRY_ON_ENV
from heteroflow.pipelines import volumes as vol

__all__ = [
    "apply_call_options",
    "component_options",
    "create_pvcs",
    "delete_pvcs",
    "integer_defaults",
    "name_condition_branches",
    "retry_note",
]


def component_options(call: Any, image: str, *, local: bool) -> dict[str, Any]:
    """``dsl.component`` keyword arguments for ``call``: ``base_image`` (the call's, else ``image``) and
    ``packages_to_install`` (on a cluster; on kfp.local a warning that this environment must provide them, and the
    pipeline's image, since kfp.local runs every step in this Python)."""
    out: dict[str, Any] = {"base_image": image if local else (call.base_image or image)}
    packages = list(getattr(call, "packages_to_install", ()) or ())
    if packages and local:
        warnings.warn(
            f"{call.name}: kfp.local does not install packages_to_install ({', '.join(packages)}): this environment must "
            "have them (kfp.local runs steps in this Python)",
            UserWarning,
            stacklevel=3,
        )
    elif packages:
        out["packages_to_install"] = packages
    return out


def retry_note(call: Any) -> str:
    """The line a call's component description gets about its retries, e.g. ``Retries: 2 retries (transient
    failures), 5 s apart x2 (at most 300 s), within 3600 s (heteroflow's default)``."""
    from heteroflow.components.core.retry import RetryPolicy

    default = " (heteroflow's default)" if call.retry == RetryPolicy() else ""
    return f"Retries: {call.retry.describe()}{default}."


def create_pvcs(pipeline: Any, *, local: bool) -> dict[str, Any]:
    """One ``kubernetes.CreatePVC`` task per CreatePVC the pipeline's calls mount (none on kfp.local):
    ``{name: task}``."""
    if local:
        return {}
    created = vol.created_pvcs(pipeline.calls)
    if not created:
        return {}
    from kfp import kubernetes

    out: dict[str, Any] = {}
    for name, (spec, users) in created.items():
        kwargs: dict[str, Any] = {"pvc_name_suffix": f"-{name}", "access_modes": list(spec.access_modes), "size": spec.size}
        if spec.storage_class_name is not None:
            kwargs["storage_class_name"] = spec.storage_class_name
        task = kubernetes.CreatePVC(**kwargs)
        task.set_display_name(f"create PVC {name} (for {', '.join(users)})")
        task.set_caching_options(enable_caching=False)
        out[name] = task
    return out


def apply_call_options(task: Any, call: Any, *, local: bool, pvcs: Mapping[str, Any]) -> Any:
    """``call``'s env, volumes and ``retry_on`` on ``task`` (see the module docstring); returns ``task``.

    Raises:
        InvalidParameter: on kfp.local, a volume it cannot stand in for (the message names the alternative).
    """
    env = dict(getattr(call, "env", {}) or {})
    if call.retry.retry_on == "any" and call.retry.retries:
        env[RETRY_ON_ENV] = "any"
    if local:
        env.update(vol.step_env(call, engine="kfp-local"))
    for name, value in env.items():
        task.set_env_variable(name, value)
    mounts = vol.call_mounts(call)
    if local or not mounts:
        return task
    from kfp import kubernetes

    for path, volume in mounts.items():
        if isinstance(volume, vol.CreatePVC):
            kubernetes.mount_pvc(task, pvc_name=pvcs[volume.name].outputs["name"], mount_path=path)
        elif isinstance(volume, vol.PVC):
            kubernetes.mount_pvc(task, pvc_name=volume.name, mount_path=path)
        elif isinstance(volume, vol.ConfigMapVolume):
            kubernetes.use_config_map_as_volume(task, config_map_name=volume.name, mount_path=path, optional=volume.optional)
        else:
            kubernetes.use_secret_as_volume(task, secret_name=volume.name, mount_path=path, optional=volume.optional)
    return task


def delete_pvcs(pipeline: Any, pvcs: Mapping[str, Any], tops: Mapping[str, list[Any]], check: Any) -> None:
    """One ``kubernetes.DeletePVC`` per created claim whose ``delete_at_end`` is set, after the top-level tasks of the
    calls that mount it (``tops``: call -> its tasks outside any condition group; none for a chain without
    outputs, then after ``check``, the run's last task)."""
    if not pvcs:
        return
    from kfp import kubernetes

    for name, (spec, users) in vol.created_pvcs(pipeline.calls).items():
        if not spec.delete_at_end:
            continue
        task = kubernetes.DeletePVC(pvc_name=pvcs[name].outputs["name"])
        task.set_display_name(f"delete PVC {name} (after {', '.join(users)})")
        task.set_caching_options(enable_caching=False)
        before = [t for user in users for t in tops.get(user, [])]
        if any(not tops.get(user) for user in users):
            before = [check]
        task.after(*before)


def name_condition_branches(name: str) -> None:
    """Give the If/Else group being built (``condition-branches-N`` in the IR) the display name ``name``: call it
    inside ``with dsl.Else(...)`` (KFP makes that group when the Else opens, and sets no display name on it, so the
    Kubeflow UI would show its id)."""
    from kfp.dsl import pipeline_context
    from kfp.dsl.tasks_group import ConditionBranches

    groups = pipeline_context.Pipeline.get_default_pipeline().groups
    for group in reversed(groups):
        if isinstance(group, ConditionBranches):
            group.display_name = name
            return


def integer_defaults(docs: list[Any]) -> None:
    """Write the default of every ``NUMBER_INTEGER`` parameter as an integer (KFP writes ``10.0``), in place, in a
    compiled pipeline's documents (the IR: root and components)."""
    ir = docs[0] if docs else {}
    specs = [ir.get("root", {}), *ir.get("components", {}).values()]
    for spec in specs:
        for param in (spec.get("inputDefinitions", {}).get("parameters", {}) or {}).values():
            value = param.get("defaultValue")
            if param.get("parameterType") == "NUMBER_INTEGER" and isinstance(value, float) and value.is_integer():
                param["defaultValue"] = int(value)
