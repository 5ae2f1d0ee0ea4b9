"""Kubernetes mode: each step task is a KubernetesPodOperator running ``heteroflow step`` in a pod.

Each pod gets, from the candidate and the cluster profile (:func:`heteroflow.pipelines.k8s.resources.build_pod_resources`,
the builder the KFP rendering shares): requests and limits, the accelerator's extended resource, node selector
or affinity, tolerations, ``schedulerName``, the Volcano queue annotation / Kueue queue label, the profile's
labels and annotations, and the image for its device kind. Its command is::

    heteroflow step <module:attribute> --call CALL --run-dir RUN_DIR --outcome /airflow/xcom/return.json \\
        --param NAME=VALUE ... --input NAME=PATH ... --output NAME=PATH ... [--candidate JSON] [--placements JSON]

with the run folder and argument values rendered (Jinja) from the ``prepare-run`` task's XCom. Pod names are
``<dag id>-<task id>`` plus the operator's random suffix, so every try gets a new pod.

The pod's exit status carries the failure class (:data:`heteroflow.components.core.runtime.EXIT_CODES`): 4 device,
3 permanent (2, a usage error, too), 5 transient; a pod the scheduler cannot place
(``PodScheduled=False``, reason ``Unschedulable``: no node has the device) is a device failure too, and so is one
Kueue holds (reason ``SchedulingGated``: its queue has no quota for it; the message names the queue) when the
operator's ``schedule_timeout_seconds`` (its pending deadline; default its ``startup_timeout_seconds``) ends. The
operator then ends the task as the local one does (:class:`heteroflow.dags.operators.StepEnding`); the reason
comes from the container's termination message (``FallbackToLogsOnError``: the tail of its log, where
``heteroflow step`` prints the outcome). Anything else (an image that cannot be pulled, the API server gone)
is left to Airflow's own retries.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from heteroflow.components.devices.cluster import KUEUE_QUEUE_LABEL, ClusterProfile
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.resources import DeviceKind
from heteroflow.components.core.runtime import EXIT_CODES, candidate_to_json
from heteroflow.components.core.step import step_ref
from heteroflow.dags.layout import PREPARE_TASK, Layout
from heteroflow.dags.operators import StepEnding, outcome_record
from heteroflow.dags.volumes import pod_volumes, with_packages
from heteroflow.pipelines.graph import Call, Const, ParamRef, Pipeline
from heteroflow.pipelines.k8s.resources import build_pod_resources

__all__ = ["OUTCOME_PATH", "PodStepOperator", "pod_task_factory", "route_of_pod"]

OUTCOME_PATH = "/airflow/xcom/return.json"
"""Where ``heteroflow step`` writes its outcome in the pod; the operator's XCom sidecar reads it."""

_PREP = f"ti.xcom_pull(task_ids='{PREPARE_TASK}')"
RUN_DIR = "{{ " + _PREP + "['run_dir'] }}"
RUN_ID = "{{ " + _PREP + "['run_id'] }}"

_ROUTES = {
    EXIT_CODES["device"]: "device",
    EXIT_CODES["permanent"]: "permanent",
    EXIT_CODES["usage"]: "permanent",
    EXIT_CODES["transient"]: "transient",
    137: "transient",  # SIGKILL: a killed worker (DESIGN.md: transient)
    143: "transient",  # SIGTERM
}


def _raw(text: str) -> str:
    """``text`` kept literal by Jinja (JSON has braces)."""
    return "{% raw %}" + text + "{% endraw %}"


def _arg(name: str) -> str:
    return "{{ " + _PREP + f"['args'][{name!r}] }}}}"


def _reason(message: str) -> str:
    """The failure reason in a termination message (the tail of ``heteroflow step``'s output)."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and data.get("reason"):
                return str(data["reason"])
    for line in reversed(lines):
        if line.startswith("step ") and " failed " in line:
            return line
    return lines[-1] if lines else ""


def route_of_pod(pod: Any, container: str = "base") -> tuple[str | None, str]:
    """The failure class of a finished (or stuck) step pod, and its reason.

    Args:
        pod: a ``kubernetes.client.V1Pod`` as read from the API server (its ``status``).
        container: the step's container (the operator's ``base``).

    Returns:
        ``(route, reason)``: route ``device`` / ``permanent`` / ``transient`` from the container's exit code
        (4 / 3 or 2 / 5, 137 or 143 killed), ``device`` for a pod the scheduler cannot place
        (``Unschedulable``) or Kueue holds (``SchedulingGated``, the queue named), else None (not a step outcome: Airflow's own retries decide).
    """
    status = getattr(pod, "status", None)
    if status is None:
        return None, ""
    for cs in status.container_statuses or []:
        terminated = cs.state.terminated if cs.name == container and cs.state is not None else None
        if terminated is not None:
            code = terminated.exit_code
            reason = _reason(terminated.message or "") or f"container {container} exited with code {code}" + (
                f" ({terminated.reason})" if terminated.reason else ""
            )
            return _ROUTES.get(code), reason
    if status.phase == "Pending":
        for cond in status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
                return "device", f"the pod cannot be scheduled: {cond.message or 'no node has the requested device'}"
            if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "SchedulingGated":
                # Kueue holds the pod until its queue admits it (#28.16): the candidate has no quota now, so fall back
                labels = getattr(getattr(pod, "metadata", None), "labels", None) or {}
                queue = labels.get(KUEUE_QUEUE_LABEL)
                held = f"held by Kueue in queue {queue!r}" if queue else "held by a scheduling gate (no Kueue queue label)"
                return "device", f"the pod is {held} (SchedulingGated): the queue did not admit it before the schedule timeout"
    return None, ""


class PodStepOperator(KubernetesPodOperator, StepEnding):
    """A KubernetesPodOperator that runs one call on one candidate and ends like the local step task.

    Args:
        pipeline, layout, call_name, candidate_index: as :class:`heteroflow.dags.operators.StepEnding`.
        kwargs: KubernetesPodOperator's.
    """

    def execute(self, context: Any) -> Any:
        call = self.pipeline[self.call_name]
        index = (self.candidate_index or 0) if call.device_bound else None
        try:
            outcome = super().execute(context)
        except (AirflowFailException, AirflowSkipException):
            raise
        except Exception:
            pod = self.remote_pod or self.pod
            try:  # the freshest state (an unschedulable pod is still Pending)
                if self.pod is not None:
                    pod = self.find_pod(self.pod.metadata.namespace, context=context) or pod
            except Exception:  # noqa: BLE001 - the API server may be gone; keep what we have
                pass
            route, reason = route_of_pod(pod, self.base_container_name)
            if route is None:
                raise
            res = call.candidates[index or 0]
            failed = {
                "call": call.name, "step": call.step.name, "status": "failed", "failure": route, "reason": reason,
                "candidate": index, "kind": DeviceKind(res.kind).value,
                "accelerator": res.accelerator_spec.name if res.accelerator_spec else None,
            }
            return self.finish(context, outcome_record(failed, {}))
        outcome = outcome if isinstance(outcome, Mapping) else {}
        outputs = {k: (v.get("path") if isinstance(v, Mapping) else v) for k, v in (outcome.get("outputs") or {}).items()}
        return self.finish(context, outcome_record(outcome, outputs, call.step.returns))


def _profile(value: ClusterProfile | str | os.PathLike[str] | None) -> ClusterProfile | None:
    if value is None or isinstance(value, ClusterProfile):
        return value
    from heteroflow.components.devices.cluster import load_profile

    return load_profile(Path(value))


def step_command(pipeline: Pipeline, call: Call, index: int | None) -> tuple[list[str], list[str]]:
    """``(cmds, arguments)`` of the pod for ``call`` on candidate ``index`` (Jinja-templated arguments).

    Raises:
        InvalidParameter: the call's step cannot be imported in a pod (defined in ``__main__``).
    """
    cmds = ["heteroflow", "step", step_ref(call.step)]
    args = ["--call", call.name, "--run-dir", RUN_DIR, "--outcome", OUTCOME_PATH]
    for name, binding in call.param_bindings().items():
        if isinstance(binding, ParamRef):
            args += ["--param", f"{name}={_arg(binding.name)}"]
        elif isinstance(binding, Const):
            args += ["--param", _raw(f"{name}={binding.value}")]
    for name, ref in call.input_refs().items():
        args += ["--input", f"{name}={RUN_DIR}/artifacts/{ref.call}/{ref.output}"]
    for spec in call.step.outputs:
        args += ["--output", f"{spec.name}={RUN_DIR}/artifacts/{call.name}/{spec.name}"]
    if call.device_bound:
        k = index or 0
        args += ["--candidate", _raw(candidate_to_json(k, call.candidates[k]))]
    if call.step.planner:
        args += ["--placements", _raw(json.dumps(pipeline.placements(), sort_keys=True))]
    return cmds, args


def pod_task_factory(
    pipeline: Pipeline,
    *,
    profile: ClusterProfile | str | os.PathLike[str] | None,
    image: str | None,
    pod_kwargs: Mapping[str, Any],
) -> Callable[..., PodStepOperator]:
    """A function ``make(call, index, *, dag_id, layout, **task_kwargs)`` that builds the pod task of a call's
    candidate (used by :func:`heteroflow.dags.factory.build_dag`).

    Raises:
        InvalidParameter: a device kind with no image (neither the profile's ``images`` nor ``image``).
        InvalidResources: a candidate the profile cannot ask for.
    """
    cluster = _profile(profile)
    reserved = {"cmds", "arguments", "name", "image", "container_resources", "do_xcom_push"}
    clash = sorted(reserved & set(pod_kwargs))
    if clash:
        raise InvalidParameter(f"pod_kwargs may not set {', '.join(clash)}: heteroflow renders them from the step and its candidate")

    def make(call: Call, index: int | None, *, dag_id: str, layout: Layout, **task_kwargs: Any) -> PodStepOperator:
        res = call.candidates[index or 0]
        pod_resources = build_pod_resources(res, cluster)
        built = pod_resources.kubernetes_pod_operator_kwargs()
        if res.nodes > 1:
            from heteroflow.components.training.trainjob import warn_if_unlaunchable

            warn_if_unlaunchable(res, cluster)
        kind = DeviceKind(res.kind).value
        built.setdefault("image", image)
        if not built["image"]:
            raise InvalidParameter(
                f"{call.name}: no image for device kind {kind!r}; give build_dag(image=...) or the profile's images.{kind}"
            )
        labels = {**built.pop("labels", {}), **dict(pod_kwargs.get("labels") or {})}
        annotations = {**built.pop("annotations", {}), **dict(pod_kwargs.get("annotations") or {})}
        from kubernetes.client import models as k8s

        # the candidate's own (a multi-node candidate's launcher: the cluster profile), then the caller's
        built.pop("env_vars", None)
        plain = {"HETEROFLOW_RUN_ID": RUN_ID, **pod_resources.env, **dict(pod_kwargs.get("env_vars") or {}), **call.env}
        env = [k8s.V1EnvVar(name=k, value=v) for k, v in plain.items()]
        # a mixed candidate's launcher: POD_IP from the downward API (status.podIP), unless the caller set it
        env += [e for e in pod_resources.field_env_vars() if e.name not in plain]
        for secret in call.secrets:  # credentials from a Kubernetes Secret, never a parameter
            for var, key in secret.env.items():
                selector = k8s.V1SecretKeySelector(name=secret.secret, key=key)
                env.append(k8s.V1EnvVar(name=var, value_from=k8s.V1EnvVarSource(secret_key_ref=selector)))
        own = dict(zip(("volumes", "volume_mounts"), pod_volumes(call)))  # the call's volumes (dags/volumes.py)
        for key in ("volumes", "volume_mounts"):  # the launcher's shared claim beside the caller's own
            if key in built or key in pod_kwargs or own[key]:
                built[key] = [*built.get(key, []), *list(pod_kwargs.get(key) or []), *own[key]]
        if call.base_image:
            built["image"] = call.base_image
        rest = {k: v for k, v in pod_kwargs.items() if k not in ("labels", "annotations", "env_vars", "volumes", "volume_mounts")}
        cmds, arguments = step_command(layout.pipeline, call, index)
        cmds = with_packages(call, cmds)
        task_id = task_kwargs["task_id"]
        pod_name = f"{dag_id}-{call.name}" + ("" if task_id == call.name else f"-{task_id}")
        cls = task_kwargs.pop("operator_class", PodStepOperator)  # dags.control: conditions, values, loops
        made = cls(
            pipeline=layout.pipeline,
            layout=layout,
            call_name=call.name,
            candidate_index=index,
            name=re.sub(r"[^a-z0-9-]+", "-", pod_name.lower()).strip("-")[:50],
            cmds=cmds,
            arguments=arguments,
            labels=labels,
            annotations=annotations,
            env_vars=env,
            do_xcom_push=True,
            random_name_suffix=True,
            termination_message_policy="FallbackToLogsOnError",
            **built,
            **rest,
            **task_kwargs,
        )
        return made  # inside a ParallelFor: a task of the loop's mapped task group (dags.control)

    return make
