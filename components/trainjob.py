"""A multi-node train on a Kubernetes cluster: the train step submits a gang-scheduled Kubeflow Trainer job and waits.

A candidate with ``nodes > 1`` (``gpu:count=8,nodes=2``) cannot run inside one pod. On every engine the train
step's own task (a KFP task, an Airflow pod, a local process) is then the job's *launcher*
(:func:`run_training_job`), as Kubeflow's own PyTorchJob launcher component is [KL]:

1. It needs a cluster: in-cluster credentials (``KUBERNETES_SERVICE_HOST``, a service account allowed to create
   the job) or :data:`KUBECONFIG_ENV`; the cluster profile (:data:`PROFILE_ENV`, JSON, set on the task by the
   KFP and Airflow renderings) with ``shared_storage``, a ReadWriteMany claim mounted here too. Without any of
   these the candidate cannot run here: a *device* failure, so the step falls back to its next candidate, with
   the reason saying what is missing.
2. It copies the input data to ``<mount>/jobs/<job>/shards`` and renders the job with
   :func:`heteroflow.pipelines.manifests.training_job_manifests`: a TrainJob (Trainer v2) or PyTorchJob (v1), as the
   profile's ``training_job`` says, gang-scheduled (a Volcano PodGroup with ``minMember`` = nodes, or Kueue's
   admission of the whole job), each pod running ``heteroflow step train`` on the same candidate with the same
   parameters, its checkpoints under ``<mount>/checkpoints`` unless ``checkpoint_root`` names a folder.
3. In each pod, train sees :func:`heteroflow.components.distributed.node_role` (the operator's ``PET_*`` or
   ``MASTER_ADDR``/``RANK``) and runs one worker per device of an ``nodes * count``-rank group; every node writes
   its (identical) model to ``node-<rank>/model`` and its outcome to ``node-<rank>/outcome.json``.
4. The launcher waits (:func:`job_status`), then copies node 0's model into its output (atomically) and returns
   node 0's facts. A failed job fails the step with node 0's failure class (a permanent error in the user's code
   stays permanent); pods lost without an outcome are *transient* (the retry resubmits, and the new job resumes
   from the shared checkpoints). A job the gang scheduler does not admit within :data:`GANG_WAIT_ENV` seconds
   (default :data:`GANG_WAIT_SECONDS`) is deleted: a device failure, so the step falls back. The job's name is
   derived from the checkpoint folder, so a retried launcher finds the job it submitted and waits for it.

Sources: [KL] Kubeflow Pipelines' ``kubeflow/pytorch-launcher`` component (launch a PyTorchJob from a pipeline
step and wait for it), https://github.com/kubeflow/pipelines/tree/master/components/kubeflow/pytorch-launcher;
[KT] TrainJob status conditions ``Complete``/``Failed``/``Suspended``, https://www.kubeflow.org/docs/components/trainer/;
[PJ] PyTorchJob conditions ``Created``/``Running``/``Restarting``/``Succeeded``/``Failed``,
https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from heteroflow.components.errors import DeviceUnavailable, HeteroflowError

__all__ = [
    "GANG_WAIT_SECONDS",
    "KUBECONFIG_ENV",
    "PROFILE_ENV",
    "JobPermanentFailure",
    "MultiNodeWarning",
    "JobStatus",
    "JobTransientFailure",
    "job_command",
    "job_status",
    "launcher_candidate",
    "run_training_job",
    "warn_if_unlaunchable",
]

PROFILE_ENV = "HETEROFLOW_CLUSTER_PROFILE"
"""The cluster profile as JSON (:meth:`~heteroflow.components.cluster.ClusterProfile.to_dict`), set on a task whose
candidates include a multi-node one by the KFP and Airflow renderings."""
KUBECONFIG_ENV = "HETEROFLOW_KUBECONFIG"
"""A kubeconfig file for the launcher outside a cluster (inside one, the pod's service account is used)."""
NAMESPACE_ENV = "HETEROFLOW_NAMESPACE"
"""The namespace of the job; default: the launcher pod's own, else ``default``."""
GANG_WAIT_ENV = "HETEROFLOW_GANG_WAIT_SECONDS"
GANG_WAIT_SECONDS = 900.0
"""How long a submitted job may wait for the gang scheduler to admit all its pods before the step falls back (s)."""
POLL_SECONDS = 5.0
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

_PLURALS = {"TrainJob": "trainjobs", "PyTorchJob": "pytorchjobs", "PodGroup": "podgroups"}  # the CRDs' spec.names.plural


def _coordinates(manifest: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(group, version, plural)`` of a manifest, for ``CustomObjectsApi`` (group and version from its apiVersion)."""
    group, _, version = str(manifest["apiVersion"]).partition("/")
    return group, version, _PLURALS[manifest["kind"]]


class JobTransientFailure(HeteroflowError, TimeoutError):
    """The training job failed without a step failure of its own (pods lost, preempted, evicted): *transient*."""


class JobPermanentFailure(HeteroflowError, ValueError):
    """The training job failed with a permanent failure of the step in its pods (bad data, a bug): *permanent*."""


@dataclasses.dataclass(frozen=True, slots=True)
class JobStatus:
    """Where a training job is: ``pending`` (not admitted or not started), ``running``, ``succeeded`` or
    ``failed``, with the condition's reason and message."""

    phase: str
    reason: str = ""


def job_status(obj: Mapping[str, Any]) -> JobStatus:
    """The phase of a TrainJob or PyTorchJob from its ``status.conditions`` [KT][PJ].

    TrainJob: ``Complete`` -> succeeded, ``Failed`` -> failed, ``Suspended`` (Kueue has not admitted it) ->
    pending, else running once any condition is set. PyTorchJob: ``Succeeded``, ``Failed``, ``Running`` /
    ``Restarting`` -> running, else pending.
    """
    conditions = [c for c in (obj.get("status") or {}).get("conditions") or [] if str(c.get("status")) == "True"]
    true = {c.get("type"): c for c in conditions}

    def why(kind: str) -> str:
        c = true[kind]
        return ": ".join(x for x in (c.get("reason"), c.get("message")) if x)

    for kind, phase in (("Complete", "succeeded"), ("Succeeded", "succeeded"), ("Failed", "failed")):
        if kind in true:
            return JobStatus(phase, why(kind))
    if "Suspended" in true:
        return JobStatus("pending", why("Suspended"))
    if obj.get("kind") == "PyTorchJob":
        return JobStatus("running") if {"Running", "Restarting"} & set(true) else JobStatus("pending")
    return JobStatus("running") if true else JobStatus("pending")


def launcher_candidate(resources: Any) -> Any:
    """What the task of a multi-node candidate asks for: it only launches and watches the job (and copies the data
    and the model), so one CPU and 2Gi, the candidate's labels and annotations, no devices."""
    from heteroflow.components.resources import Resources

    return Resources(kind="cpu", labels=resources.labels, annotations=resources.annotations)


class MultiNodeWarning(UserWarning):
    """A multi-node candidate rendered for a cluster whose profile lacks what its launcher needs."""


def warn_if_unlaunchable(resources: Any, profile: Any) -> None:
    """Warn at compile time (KFP, Airflow pods) when a multi-node candidate's launcher could never submit its job:
    no cluster profile, or one without ``shared_storage``. On the cluster it would be a device failure every run
    (the step falls back to its next candidate), so it is never silent."""
    if resources.nodes <= 1 or (profile is not None and profile.shared_claim is not None):
        return
    import warnings

    where = "no cluster profile was given" if profile is None else f"the cluster profile {profile.name!r} names no shared_storage"
    warnings.warn(
        f"candidate {resources.describe()}: {where}, so its train task cannot launch the job on the cluster (a device "
        "failure every run: the step falls back to its next candidate); give --profile FILE with shared_storage: "
        "{claim: NAME, mount_path: /mnt/heteroflow} (a ReadWriteMany PersistentVolumeClaim)",
        MultiNodeWarning,
        stacklevel=3,
    )


def _rank_variable(training_job: str) -> str:
    return "RANK" if training_job == "pytorchjob" else "PET_NODE_RANK"


def job_command(*, call: str, candidate: Any, values: Mapping[str, Any], workdir: str, training_job: str) -> list[str]:
    """The command every pod of the job runs: ``heteroflow step train`` on ``candidate`` with ``values``, its
    input in ``<workdir>/shards``, its outputs in ``<workdir>/node-$(RANK)/`` (Kubernetes expands ``$(VAR)``
    from the container's environment: ``PET_NODE_RANK`` for a TrainJob, ``RANK`` for a PyTorchJob)."""
    from heteroflow.components.runtime import candidate_to_json

    node = f"{workdir}/node-$({_rank_variable(training_job)})"
    out = ["heteroflow", "step", "train", "--call", call, "--candidate", candidate_to_json(0, candidate),
           "--input", f"shards={workdir}/shards", "--output", f"model={node}/model", "--output", f"metrics={node}/metrics",
           "--outcome", f"{node}/outcome.json"]
    for name, value in values.items():
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        out += ["--param", f"{name}={text}"]
    return out


def _cluster(environ: Mapping[str, str], what: str) -> Any:
    """``kubernetes.client.CustomObjectsApi`` with this process's credentials.

    Raises:
        DeviceUnavailable: no credentials here (the message says how to give them).
    """
    path = environ.get(KUBECONFIG_ENV)
    if not path and not environ.get("KUBERNETES_SERVICE_HOST"):
        raise DeviceUnavailable(
            f"{what} needs a Kubernetes cluster with the Kubeflow Trainer, and this process has none (no in-cluster "
            f"service account, {KUBECONFIG_ENV} unset); run the pipeline on the cluster, or set {KUBECONFIG_ENV}=FILE"
        )
    try:
        from kubernetes import client, config
    except ImportError:
        raise DeviceUnavailable(f"{what} needs the kubernetes client: pip install 'heteroflow[kfp]'") from None
    if path:
        config.load_kube_config(config_file=path)
    else:
        config.load_incluster_config()
    return client.CustomObjectsApi()


def _profile(environ: Mapping[str, str], what: str) -> Any:
    from heteroflow.components.cluster import ClusterProfile

    text = environ.get(PROFILE_ENV)
    if not text:
        raise DeviceUnavailable(
            f"{what}: no cluster profile reached this task ({PROFILE_ENV} unset); compile or build the DAG with "
            "--profile FILE naming shared_storage (a ReadWriteMany claim the job's nodes share)"
        )
    profile = ClusterProfile.from_dict(json.loads(text), source=PROFILE_ENV)
    if profile.shared_claim is None:
        raise DeviceUnavailable(
            f"{what}: the cluster profile {profile.name!r} names no shared_storage; add shared_storage: {{claim: NAME, "
            "mount_path: /mnt/heteroflow}} (a ReadWriteMany PersistentVolumeClaim) so the nodes share data and checkpoints"
        )
    if not Path(str(profile.shared_mount)).is_dir():
        raise DeviceUnavailable(
            f"{what}: shared storage {profile.shared_claim!r} is not mounted here at {profile.shared_mount} (the "
            "renderings mount it on the train task; a local run cannot reach it)"
        )
    return profile


def _namespace(environ: Mapping[str, str]) -> str:
    if environ.get(NAMESPACE_ENV):
        return environ[NAMESPACE_ENV]
    try:
        return _SA_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def _copy_atomic(src: Path, dst: Path) -> None:
    """Copy folder ``src`` to ``dst`` so that ``dst`` appears complete or not at all."""
    tmp = dst.with_name(f".{dst.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)


def _create(api: Any, namespace: str, manifest: Mapping[str, Any]) -> None:
    group, version, plural = _coordinates(manifest)
    try:
        api.create_namespaced_custom_object(group, version, namespace, plural, dict(manifest))
    except Exception as exc:  # noqa: BLE001 - the client's ApiException; 409: a retried launcher's own job
        if getattr(exc, "status", None) != 409:
            raise


def _delete(api: Any, namespace: str, manifests: list[dict[str, Any]]) -> None:
    for m in manifests:
        group, version, plural = _coordinates(m)
        try:
            api.delete_namespaced_custom_object(group, version, namespace, plural, m["metadata"]["name"])
        except Exception:  # noqa: BLE001,S110 - best effort: gone already, or the API is unreachable
            pass


def run_training_job(
    resources: Any,
    *,
    call: str,
    dataset_dir: str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    values: Mapping[str, Any],
    key: str,
    say: Callable[[str], None] = lambda line: None,
    environ: Mapping[str, str] | None = None,
    api: Any = None,
    poll_seconds: float = POLL_SECONDS,
) -> dict[str, Any]:
    """Run a multi-node train as a training job on the cluster and wait for it (the module docstring's steps).

    Args:
        resources: the candidate (``nodes > 1``).
        call: the train call's name (the job's label ``heteroflow.io/call``).
        dataset_dir: the step's input folder (copied to the shared storage).
        model_dir: the step's output folder: node 0's model is copied here, atomically.
        values: train's parameters (the job's pods get the same).
        key: a stable key of this training (the checkpoint folder's name): names the job.
        say: prints a progress line.
        environ: the environment (default ``os.environ``).
        api: a ``kubernetes.client.CustomObjectsApi`` (default: from the environment's credentials).
        poll_seconds: seconds between status reads.

    Returns:
        Node 0's outcome facts (train's facts: steps, history, samples_per_second...).

    Raises:
        DeviceUnavailable: no cluster, profile or shared storage here, or the gang was not admitted in time.
        JobPermanentFailure / JobTransientFailure: the job failed (see the module docstring).
    """
    from heteroflow.pipelines.manifests import training_job_manifests

    env = os.environ if environ is None else environ
    kind = str(getattr(resources.kind, "value", resources.kind))
    what = f"candidate {resources.describe()}"
    api = api if api is not None else _cluster(env, what)
    profile = _profile(env, what)
    namespace = _namespace(env)
    name = f"heteroflow-{call.replace('_', '-').lower()[:30]}-{key[:12]}".strip("-")
    mount = Path(str(profile.shared_mount))
    workdir = mount / "jobs" / name
    shards = workdir / "shards"
    if not shards.is_dir():
        workdir.mkdir(parents=True, exist_ok=True)
        _copy_atomic(Path(dataset_dir), shards)
    job_values = dict(values)
    if not job_values.get("checkpoint_root"):
        job_values["checkpoint_root"] = str(mount / "checkpoints")
    command = job_command(call=call, candidate=resources, values=job_values, workdir=str(workdir), training_job=profile.training_job)
    manifests = training_job_manifests(resources, workers=resources.nodes, name=name, command=command, namespace=namespace,
                                       profile=profile, labels={"heteroflow.io/call": call[:63]})
    job = manifests[-1]
    group, version, plural = _coordinates(job)
    for m in manifests:
        _create(api, namespace, m)
    say(f"train: submitted {job['kind']} {namespace}/{name} ({resources.nodes} nodes of {kind} x{resources.count}, gang-scheduled)")
    gang_wait = float(env.get(GANG_WAIT_ENV) or GANG_WAIT_SECONDS)
    started, seen = time.monotonic(), None
    try:
        while True:
            status = job_status(api.get_namespaced_custom_object(group, version, namespace, plural, name))
            if status.phase != seen:
                seen = status.phase
                say(f"train: {job['kind']} {name} is {status.phase}" + (f" ({status.reason})" if status.reason else ""))
            if status.phase in ("succeeded", "failed"):
                break
            if status.phase == "pending" and time.monotonic() - started > gang_wait:
                _delete(api, namespace, manifests)
                raise DeviceUnavailable(
                    f"{what}: the cluster did not admit all {resources.nodes} nodes of {job['kind']} {name} within "
                    f"{gang_wait:g} s ({status.reason or 'pending'}); deleted it (set {GANG_WAIT_ENV} to wait longer)"
                )
            time.sleep(poll_seconds)
    except KeyboardInterrupt:
        _delete(api, namespace, manifests)  # an interrupted run leaves no job behind; the rerun resumes from checkpoints
        raise
    outcome_file = workdir / "node-0" / "outcome.json"
    outcome = json.loads(outcome_file.read_text(encoding="utf-8")) if outcome_file.is_file() else None
    if status.phase == "failed":
        reason = (outcome or {}).get("reason") or status.reason or "no reason given"
        if outcome is not None and outcome.get("failure") == "permanent":
            raise JobPermanentFailure(f"{job['kind']} {name} failed: {reason}")
        if outcome is not None and outcome.get("failure") == "device":
            raise DeviceUnavailable(f"{job['kind']} {name} failed on its devices: {reason}")
        raise JobTransientFailure(f"{job['kind']} {name} failed ({reason}); a retry resubmits it and resumes from its checkpoints")
    if outcome is None:
        raise JobTransientFailure(f"{job['kind']} {name} succeeded but node 0 wrote no outcome ({outcome_file})")
    _copy_atomic(workdir / "node-0" / "model", Path(model_dir))
    return dict(outcome.get("facts") or {})
