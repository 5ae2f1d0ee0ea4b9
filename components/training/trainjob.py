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
   :func:`training_job_manifests`: a TrainJob (Trainer v2) or PyTorchJob (v1), as the
   profile's ``training_job`` says, gang-scheduled (a Volcano PodGroup with ``minMember`` = nodes, or Kueue's
   admission of the whole job), each pod running ``heteroflow step train`` on the same candidate with the same
   parameters, its checkpoints under ``<mount>/checkpoints`` unless ``checkpoint_root`` names a folder.
3. In each pod, train sees :func:`heteroflow.components.training.distributed.node_role` (the operator's ``PET_*`` or
   ``MASTER_ADDR``/``RANK``) and runs one worker per device of an ``nodes * count``-rank group; every node writes
   its (identical) model to ``node-<rank>/model`` and its outcome to ``node-<rank>/outcome.json``.
4. The launcher waits (:func:`job_status`), then copies node 0's model into its output (atomically) and returns
   node 0's facts. A failed job fails the step with node 0's failure class (a permanent error in the user's code
   stays permanent); pods lost without an outcome are *transient* (the retry resubmits, and the new job resumes
   from the shared checkpoints); the class is the most severe any node reported (:mod:`.gang`), so a bug on node 1
   stays permanent when node 0 was stopped before writing its outcome. A job whose pods are not all ``Running``
   within :data:`GANG_WAIT_ENV` seconds (default :data:`GANG_WAIT_SECONDS`), whether the job is still suspended or
   already ``Created`` with members the gang scheduler cannot place or Kueue holds (kubeflow/trainer#1617), is
   deleted: a device failure, so the step falls back; the message says which pods wait and why, naming the queue. The job's name is
   derived from the checkpoint folder, so a retried launcher finds the job it submitted and waits for it.

Sources: [KL] Kubeflow Pipelines' ``kubeflow/pytorch-launcher`` component (launch a PyTorchJob from a pipeline
step and wait for it), https://github.com/kubeflow/pipelines/tree/master/components/kubeflow/pytorch-launcher;
[KT] TrainJob status conditions ``Complete``/``Failed``/``Suspended``, https://www.kubeflow.org/docs/components/trainer/;
[PJ] PyTorchJob conditions ``Created``/``Running``/``Restarting``/``Succeeded``/``Failed``,
https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/; [KA] Kueue all-or-nothing with
ready pods, https://kueue.sigs.k8s.io/docs/tasks/manage/setup_wait_for_pods_ready/.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.components.errors import DeviceUnavailable, HeteroflowError
from heteroflow.components.training.gang import gang_running, job_failure, pod_hold, pod_lister, pod_selector

if TYPE_CHECKING:
    from heteroflow.components.devices.cluster import ClusterProfile
    from heteroflow.components.resources import Resources

__all__ = [
    "GANG_WAIT_SECONDS",
    "GROUP_ANNOTATION",
    "KUBECONFIG_ENV",
    "PROFILE_ENV",
    "TRAINER_CONTAINER",
    "TRAINER_RUNTIME",
    "JobPermanentFailure",
    "MultiNodeWarning",
    "JobStatus",
    "JobTransientFailure",
    "job_command",
    "job_status",
    "launcher_candidate",
    "run_training_job",
    "training_job_manifests",
    "warn_if_unlaunchable",
]

PROFILE_ENV = "HETEROFLOW_CLUSTER_PROFILE"
"""The cluster profile as JSON (:meth:`~heteroflow.components.devices.cluster.ClusterProfile.to_dict`), set on a task whose
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
    from heteroflow.components.resources import DeviceKind, Resources

    return Resources(kind=DeviceKind.host(), labels=resources.labels, annotations=resources.annotations)


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
    from heteroflow.components.core.runtime import candidate_to_json

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
    from heteroflow.components.devices.cluster import ClusterProfile

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
    pods: Callable[[str, str], list[dict[str, Any]]] | None = None,
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
        pods: ``(namespace, label selector) -> pods`` (the API's JSON): the job's pods, to know when the whole gang
            runs (default: read with ``api``'s credentials; none for an ``api`` without them).

    Returns:
        Node 0's outcome facts (train's facts: steps, history, samples_per_second...).

    Raises:
        DeviceUnavailable: no cluster, profile or shared storage here, or the gang was not admitted in time.
        JobPermanentFailure / JobTransientFailure: the job failed (see the module docstring).
    """
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
    list_pods = pods if pods is not None else pod_lister(api)
    selector = pod_selector(job["kind"], name)
    started, seen, admitted = time.monotonic(), None, False
    try:
        while True:
            status = job_status(api.get_namespaced_custom_object(group, version, namespace, plural, name))
            if status.phase != seen:
                seen = status.phase
                say(f"train: {job['kind']} {name} is {status.phase}" + (f" ({status.reason})" if status.reason else ""))
            if status.phase in ("succeeded", "failed"):
                break
            if not admitted:
                # "running" is not enough: a TrainJob is Created (a PyTorchJob Running) while the gang scheduler
                # still cannot place some members (kubeflow/trainer#1617); admitted means every member Running
                members = list_pods(namespace, selector) if list_pods is not None and status.phase == "running" else None
                admitted = status.phase == "running" and (members is None or gang_running(members, resources.nodes))
                if not admitted and time.monotonic() - started > gang_wait:
                    _delete(api, namespace, manifests)
                    if members is None:
                        state = status.reason or status.phase
                    else:
                        running = sum(gang_running([m], 1) for m in members)
                        holds = [h for h in map(pod_hold, members) if h]
                        state = f"{running} of {resources.nodes} pods Running" + "".join(f"; {h}" for h in holds)
                    raise DeviceUnavailable(
                        f"{what}: the cluster did not admit all {resources.nodes} nodes of {job['kind']} {name} within "
                        f"{gang_wait:g} s ({state}); deleted it (set {GANG_WAIT_ENV} to wait longer)"
                    )
            time.sleep(poll_seconds)
    except KeyboardInterrupt:
        _delete(api, namespace, manifests)  # an interrupted run leaves no job behind; the rerun resumes from checkpoints
        raise
    outcome_file = workdir / "node-0" / "outcome.json"
    if status.phase == "failed":
        # every node's outcome: the failing node may not be node 0, which is often stopped before it writes one
        failure, reason = job_failure(workdir, resources.nodes) or ("transient", status.reason or "no reason given")
        if failure == "permanent":
            raise JobPermanentFailure(f"{job['kind']} {name} failed: {reason}")
        if failure == "device":
            raise DeviceUnavailable(f"{job['kind']} {name} failed on its devices: {reason}")
        raise JobTransientFailure(f"{job['kind']} {name} failed ({reason}); a retry resubmits it and resumes from its checkpoints")
    outcome = json.loads(outcome_file.read_text(encoding="utf-8")) if outcome_file.is_file() else None
    if outcome is None:
        raise JobTransientFailure(f"{job['kind']} {name} succeeded but node 0 wrote no outcome ({outcome_file})")
    _copy_atomic(workdir / "node-0" / "model", Path(model_dir))
    return dict(outcome.get("facts") or {})


TRAINER_RUNTIME = "torch-distributed"
"""The ClusterTrainingRuntime a TrainJob references by default (Kubeflow Trainer's PyTorch runtime) [KT]."""
TRAINER_CONTAINER = "node"
"""The trainer container's name in Kubeflow Trainer's torch runtimes (replicated job ``node``), which a TrainJob's
runtime patch names to add volume mounts [KT]."""
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
"""The pod annotation that puts a pod in a Volcano PodGroup (DESIGN.md "Cluster annotations")."""
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


# --- the multi-worker train ------------------------------------------------------------------------------------


def _quantity_sum(values: Iterable[str], resource: str) -> str:
    from fractions import Fraction

    from heteroflow.components.devices.quantities import format_cpu, format_memory, parse_cpu, parse_memory

    if resource == "cpu":
        return format_cpu(sum(parse_cpu(v, field=resource) for v in values))
    if resource == "memory":
        return format_memory(sum(parse_memory(v, field=resource) for v in values))
    return str(sum(int(Fraction(v)) for v in values))


def training_job_manifests(
    candidate: Resources | str,
    *,
    workers: int,
    name: str,
    image: str | None = None,
    command: Sequence[str] = ("heteroflow", "step", "train"),
    namespace: str = "default",
    profile: ClusterProfile | None = None,
    runtime: str = TRAINER_RUNTIME,
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A multi-worker train on ``candidate``: ``workers`` pods (one per node) with ``candidate.count`` devices
    and one process per device each, rendered as the profile's ``training_job`` kind with gang scheduling.

    Every pod gets ``env`` and :data:`~heteroflow.components.training.distributed.NODES_ENV` = workers; with the profile's
    ``shared_storage``, the claim is mounted at its ``mount_path`` in every pod (the job's data, model and
    checkpoints). ``$(VAR)`` in ``command`` is expanded by Kubernetes from the container's environment (the
    operator's ``PET_NODE_RANK`` / ``RANK``). ``labels`` go on the job's metadata.

    - ``trainjob``: a TrainJob (``trainer.kubeflow.org/v1alpha1``) on the ClusterTrainingRuntime ``runtime``,
      ``numNodes`` = workers, ``numProcPerNode`` = devices, ``resourcesPerNode`` from the candidate; node
      selector, affinity, tolerations and pod labels/annotations through ``runtimePatches`` [KT]. On a Volcano
      cluster (the profile names a Volcano queue or ``schedulerName: volcano``) a PodGroup with ``minMember`` =
      workers comes with it and the pods carry ``scheduling.k8s.io/group-name``; ``schedulerName`` itself must
      come from the runtime or the namespace (a TrainJob cannot patch it).
    - ``pytorchjob``: a PyTorchJob (``kubeflow.org/v1``) with one Master and workers - 1 Workers, ``nprocPerNode``
      = devices, ``runPolicy.schedulingPolicy`` (``minAvailable`` = workers, the Volcano queue): the training
      operator creates the PodGroup [PJ].
    - Kueue (the profile names a LocalQueue): the label ``kueue.x-k8s.io/queue-name`` on the job; Kueue admits the
      job's pods together or not at all [KA].

    Args:
        candidate: the train candidate (``Resources`` or a spec such as ``"gpu:accelerator=a100-80gb,count=8"``).
        workers: pods (nodes), >= 1.
        name: the job's name (DNS label).
        image: the container image; default the profile's image for the candidate's device kind.
        command: the container command.
        namespace: the job's namespace.
        profile: the cluster profile.
        runtime: the ClusterTrainingRuntime a TrainJob references.

    Returns:
        The job, and a Volcano PodGroup first where one is needed.

    Raises:
        InvalidResources: workers < 1, a name that is not a DNS label, no image, or the candidate cannot be
            asked for on this cluster.
    """
    from heteroflow.components.devices.cluster import DEFAULT_PROFILE, KUEUE_QUEUE_LABEL
    from heteroflow.components.training.rendezvous import NODES_ENV
    from heteroflow.components.errors import InvalidResources
    from heteroflow.components.devices.podplan import plan_pod
    from heteroflow.components.resources import Resources

    profile = profile or DEFAULT_PROFILE
    res = candidate if isinstance(candidate, Resources) else Resources.parse_spec(candidate)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidResources(f"workers={workers!r}; valid: an integer >= 1 (pods, one per node)")
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
        raise InvalidResources(f"name={name!r} is not a name; valid: a DNS label (lower case, digits, '-', <= 63)")
    plan = plan_pod(dataclasses.replace(res, nodes=1), profile)  # one node's pod (plan_pod of nodes > 1: the launcher's)
    image = image or plan.image
    if not image:
        raise InvalidResources(f"no image for a {res.kind} train: pass one, or name images.{res.kind} in the cluster profile")
    procs = max(plan.accelerator_count, 1)
    volcano = profile.volcano_queue is not None or profile.scheduler_name == "volcano"
    job_labels: dict[str, str] = {}
    if profile.kueue_queue is not None:
        job_labels[KUEUE_QUEUE_LABEL] = profile.kueue_queue
    pod_labels = {k: v for k, v in plan.labels.items() if k != KUEUE_QUEUE_LABEL}  # Kueue reads the job's label
    pod_annotations = dict(plan.annotations)
    resources: dict[str, Any] = {"requests": plan.requests, "limits": plan.limits}
    env_list = [{"name": k, "value": str(v)} for k, v in {**dict(env or {}), NODES_ENV: str(workers)}.items()]
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if profile.shared_claim is not None:
        volumes.append({"name": "heteroflow-shared", "persistentVolumeClaim": {"claimName": profile.shared_claim}})
        mounts.append({"name": "heteroflow-shared", "mountPath": profile.shared_mount})
    job_labels.update(labels or {})
    pod_spec: dict[str, Any] = {}
    if plan.node_selector:
        pod_spec["nodeSelector"] = plan.node_selector
    if plan.affinity:
        pod_spec["affinity"] = plan.affinity
    if plan.tolerations:
        pod_spec["tolerations"] = [t.to_dict() for t in plan.tolerations]
    out: list[dict[str, Any]] = []
    if profile.training_job == "pytorchjob":
        container: dict[str, Any] = {"name": "pytorch", "image": image, "command": list(command), "resources": resources,
                                     "env": env_list}
        if mounts:
            container["volumeMounts"] = mounts
        template_spec = {**pod_spec, "containers": [container]}
        if volumes:
            template_spec["volumes"] = volumes
        if plan.scheduler_name:
            template_spec["schedulerName"] = plan.scheduler_name
        meta = {k: v for k, v in (("labels", pod_labels), ("annotations", pod_annotations)) if v}
        replicas = {"Master": _replica(1, meta, template_spec)}
        if workers > 1:
            replicas["Worker"] = _replica(workers - 1, meta, template_spec)
        spec: dict[str, Any] = {"nprocPerNode": str(procs), "pytorchReplicaSpecs": replicas}
        if volcano:
            policy: dict[str, Any] = {"minAvailable": workers}
            if profile.volcano_queue:
                policy["queue"] = profile.volcano_queue
            spec["runPolicy"] = {"schedulingPolicy": policy}
        job_meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if job_labels:
            job_meta["labels"] = job_labels
        out.append({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": job_meta, "spec": spec})
        return out
    if volcano:
        pg_spec: dict[str, Any] = {
            "minMember": workers,
            "minResources": {k: _quantity_sum([v] * workers, k) for k, v in plan.requests.items()},
        }
        if profile.volcano_queue:
            pg_spec["queue"] = profile.volcano_queue
        out.append(
            {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": name, "namespace": namespace}, "spec": pg_spec}
        )
        pod_annotations[GROUP_ANNOTATION] = name
    pod_meta = {k: v for k, v in (("labels", pod_labels), ("annotations", pod_annotations)) if v}
    patch_pod: dict[str, Any] = {}
    if pod_meta:
        patch_pod["metadata"] = pod_meta
    if volumes:
        pod_spec = {**pod_spec, "volumes": volumes, "containers": [{"name": TRAINER_CONTAINER, "volumeMounts": mounts}]}
    if pod_spec:
        patch_pod["spec"] = pod_spec
    spec = {
        "runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime", "apiGroup": "trainer.kubeflow.org"},
        "trainer": {"image": image, "command": list(command), "numNodes": workers, "numProcPerNode": procs, "resourcesPerNode": resources,
                    "env": env_list},
    }
    if patch_pod:
        spec["runtimePatches"] = [
            {
                "manager": "heteroflow.io/manifests",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": patch_pod}}}]}}},
            }
        ]
    job_meta = {"name": name, "namespace": namespace}
    if job_labels:
        job_meta["labels"] = job_labels
    out.append({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": job_meta, "spec": spec})
    return out


def _replica(n: int, meta: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": dict(spec)}
    if meta:
        template["metadata"] = dict(meta)
    return {"replicas": n, "restartPolicy": "OnFailure", "template": template}
