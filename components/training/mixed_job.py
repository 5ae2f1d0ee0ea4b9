"""A mixed training job on a cluster: replicas of several device kinds in one gang-scheduled Volcano Job.

:func:`volcano_mixed_job` renders one Volcano ``Job`` (``batch.volcano.sh/v1alpha1``) [VJ] for a job whose replicas
are of several device kinds (for example 2 GPU pods and 4 NPU pods), given one :class:`RoleSpec` per kind:

- one *task* per kind, ``replicas`` pods each; a pod's resources (requests and limits, the accelerator's extended
  resource), node selector, node affinity, tolerations, labels and annotations, and its image, come from the kind's
  registration and the cluster profile through :func:`heteroflow.components.devices.podplan.plan_pod`, as every
  other pod heteroflow renders;
- gang scheduling: ``minAvailable`` = the sum of the replicas, so Volcano starts every pod of every kind together
  or none (a GPU half of the job never holds its devices waiting for NPUs); ``schedulerName`` is the profile's
  (default ``volcano``), ``queue`` the profile's Volcano queue;
- lifecycle (:func:`lifecycle`): launched by the train step, a kind's failing pods neither fail nor restart the
  job while the other kinds train on, and the job completes when the training does (``minSuccess: 1``, no
  policies); rendered alone, an evicted pod restarts the job (its first pod hosts the store);
- the rendezvous in every container's environment, in torchrun's ``PET_*`` variables [TR]:
  ``PET_RDZV_BACKEND=c10d``, ``PET_RDZV_ID=<job>``, ``PET_NNODES=1:<pods>`` (elastic: the group re-forms with the
  agents that remain when a kind's pods fail), ``PET_NPROC_PER_NODE`` = the pod's devices (1 on the CPU),
  ``PET_MAX_RESTARTS`` and ``PET_RDZV_ENDPOINT``. Where the c10d store lives:

  * launched by the train step (:mod:`heteroflow.components.training.mixed_launch`, the way a pipeline runs it
    on a cluster): the step's own task pod hosts the store, ``PET_RDZV_ENDPOINT=<its pod IP>:<port>`` and
    ``PET_RDZV_CONF=is_host=false`` in every pod, so no kind's failure takes the store down;
  * rendered alone (``heteroflow manifests``, then ``kubectl create``): ``PET_RDZV_ENDPOINT=<job>-<first
    task>-0.<job>:<port>`` (Volcano's ``svc`` plugin gives each pod the hostname ``<job>-<task>-<index>`` under
    a headless service named after the job [VS]; the ``env`` plugin gives ``VC_TASK_INDEX``), and the agent of
    the first task's pod 0 hosts it (torch's c10d backend hosts it on the pod whose hostname is the endpoint's),
    so losing that pod loses the store.

  heteroflow's own: :data:`REPLICA_KIND_ENV` (this pod's device kind) and :data:`ROLES_ENV` (every role, JSON);
  launched: :data:`OUTPUT_ENV` (the job's folder on the shared storage) and :data:`POD_NAME_ENV` (downward API).
- what a pod runs (:func:`mixed_job_manifests`, :func:`pod_command`): ``heteroflow step train`` on the mixed
  candidate, *not* under torchrun: in a pod (``HETEROFLOW_REPLICA_KIND`` and ``PET_RDZV_ENDPOINT`` set) the train
  step is in worker mode and starts ONE torch elastic agent for its kind that joins the rendezvous (the same
  launch code as on one machine, :func:`heteroflow.components.training.mixed.run_mixed`); the pod holding rank 0
  writes the model to ``<workdir>/model`` and every pod its outcome to ``<workdir>/pods/<pod>/`` on the shared
  storage (the profile's ``shared_storage`` claim, mounted at ``mount_path`` on every pod: the output location
  must be such a path; fsspec URLs are not an output the train step writes). :func:`volcano_mixed_job` alone
  runs ``heteroflow step train`` (its default command) as is too, and wraps any other command in torchrun
  (``torchrun=None``: for commands that are one worker each); ``torchrun=True`` with the train step is refused.

It is a value (a dict), validated against the Volcano CRD shipped in the project (``heteroflow.cache.crds``,
unknown fields rejected) and each task's pod template against the core Kubernetes schema where
``kubernetes-validate`` is installed (:func:`validate_volcano_job`).

Kubeflow Trainer: a TrainJob has one resource shape per job today (``trainer.resourcesPerNode`` for all
``numNodes``), so a mixed job cannot be one TrainJob. When TrainJob gains per-role resources, this rendering maps
one to one onto it: each :class:`RoleSpec` becomes one replicated job of the runtime's JobSet (replicas = the
role's pods, with its resources, node selector and tolerations, i.e. this module's per-task pod template as the
role's patch); ``minAvailable`` becomes the runtime's pod-group policy (a PodGroup ``minMember`` = all pods, as
:func:`heteroflow.components.training.trainjob.training_job_manifests` writes one today); Volcano's
``<job>-<task>-0.<job>`` becomes the JobSet hostname of the first role's first pod
(``<job>-<replicatedJob>-0-0.<job>``); the ``PET_*`` variables become the trainer's ``env`` (Trainer's torch plugin
sets a static ``PET_MASTER_ADDR``/``PET_NNODES`` rendezvous, which ``PET_RDZV_*`` with c10d would replace for
elasticity). Until then a Volcano cluster runs mixed jobs with this Job, and a single-kind multi-node job keeps
using TrainJob.

Sources: [VJ] Volcano Job, https://volcano.sh/en/docs/vcjob/ (v1.15 CRD in ``cache/data/crds``);
[VS] Volcano job plugins ``svc`` and ``env``, https://github.com/volcano-sh/volcano/blob/master/docs/user-guide/how_to_use_svc_plugin.md
and ``how_to_use_env_plugin.md``; [TR] torchrun's arguments from ``PET_<ARG>`` variables
(``torch/distributed/argparse_util.py``) and c10d rendezvous, https://pytorch.org/docs/stable/elastic/run.html.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from heteroflow.components.errors import InvalidResources

if TYPE_CHECKING:
    from heteroflow.components.devices.cluster import ClusterProfile
    from heteroflow.components.resources import Resources

__all__ = [
    "OUTPUT_ENV",
    "POD_NAME_ENV",
    "RDZV_PORT",
    "REPLICA_KIND_ENV",
    "ROLES_ENV",
    "RoleSpec",
    "lifecycle",
    "missing_images",
    "mixed_job_manifests",
    "mixed_roles",
    "pod_command",
    "validate_volcano_job",
    "volcano_mixed_job",
]

RDZV_PORT = 29400
"""The c10d rendezvous port (torchrun's default for ``--rdzv-endpoint`` without a port)."""
REPLICA_KIND_ENV = "HETEROFLOW_REPLICA_KIND"
"""Set on every container of a mixed job: the device kind of this pod's role (``gpu``, ``npu``...)."""
ROLES_ENV = "HETEROFLOW_MIXED_ROLES"
"""Set on every container of a mixed job: JSON ``[{"task", "kind", "replicas", "devices"}, ...]`` in task order."""
CONTAINER = "train"
"""The container name in every task's pod."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_ENDPOINT = re.compile(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):([1-9][0-9]{0,4})")
POD_NAME_ENV = "HETEROFLOW_POD_NAME"
"""Set on every container of a launched mixed job from the downward API (``metadata.name``): the pod's name."""
OUTPUT_ENV = "HETEROFLOW_MIXED_OUTPUT"
"""Set on every container of a launched mixed job: the job's folder on the shared storage (its ``shards``, and the
``model``, ``metrics`` and ``outcome.json`` that the pod holding rank 0 writes)."""
_KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@dataclasses.dataclass(frozen=True, slots=True)
class RoleSpec:
    """One device kind's replicas in a mixed job.

    Attributes:
        kind: a registered device kind name or alias (``gpu``, ``npu``, ``cpu``...).
        replicas: pods of this kind, >= 1 (one torchrun agent each).
        resources: one pod's :class:`~heteroflow.components.resources.Resources` (or a candidate spec such as
            ``"gpu:accelerator=a100-80gb,count=8"``), of ``kind``; default ``kind`` with one device (CPU: none).
        task: the Volcano task name (a DNS label); default the kind's name.
    """

    kind: str
    replicas: int
    resources: Resources | str | None = None
    task: str = ""


def _resolve(role: RoleSpec, i: int) -> tuple[str, str, int, Resources]:
    """(task name, kind name, replicas, resources) of ``roles[i]``.

    Raises:
        InvalidResources: an unknown kind, replicas < 1, resources of another kind or of several nodes, a task
            name that is not a DNS label.
    """
    from heteroflow.components.devices.kind import DeviceKind
    from heteroflow.components.resources import Resources

    where = f"roles[{i}]"
    if not isinstance(role, RoleSpec):
        raise InvalidResources(f"{where} is a {type(role).__name__}; valid: RoleSpec(kind, replicas, resources)")
    kind = DeviceKind.parse(role.kind, field=f"{where}.kind")  # InvalidResources naming the field and the kinds
    if isinstance(role.replicas, bool) or not isinstance(role.replicas, int) or role.replicas < 1:
        raise InvalidResources(f"{where}.replicas={role.replicas!r}; valid: an integer >= 1 (pods of kind {kind.name})")
    res = role.resources
    if res is None:
        res = Resources(kind=kind.name, count=1) if kind.has_devices else Resources(kind=kind.name)
    elif isinstance(res, str):
        res = Resources.parse_spec(res)
    if str(getattr(res.kind, "value", res.kind)) != kind.name:
        raise InvalidResources(f"{where}.resources is a {res.kind} candidate ({res.describe()}); valid: one of kind {kind.name}")
    if res.nodes != 1:
        raise InvalidResources(f"{where}.resources has nodes={res.nodes}; valid: nodes=1 (replicas counts the pods)")
    task = role.task or kind.name
    if not _DNS_LABEL.fullmatch(task):
        raise InvalidResources(f"{where}.task={task!r} is not a task name; valid: a DNS label (lower case, digits, '-')")
    return task, kind.name, role.replicas, res


def volcano_mixed_job(
    name: str,
    roles: Sequence[RoleSpec],
    image: str | Mapping[str, str] | None = None,
    command: Sequence[str] = ("heteroflow", "step", "train"),
    *,
    namespace: str = "default",
    profile: ClusterProfile | None = None,
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    port: int = RDZV_PORT,
    max_restarts: int = 3,
    torchrun: bool | None = None,
    validate: bool = True,
    endpoint: str | None = None,
    writer_last: bool = False,
) -> dict[str, Any]:
    """One Volcano Job for a mixed job: a task per role, gang-scheduled, with the c10d rendezvous in the environment
    (see the module docstring for every field and its source).

    Args:
        name: the job's name (a DNS label; with the longest task name and pod index it must stay a valid hostname,
            <= 63 characters).
        roles: one :class:`RoleSpec` per device kind, in order; without ``endpoint`` the first role's pod 0 hosts
            the rendezvous store (put the most reliable kind first).
        image: the container image: one for every role, or one per kind name; default the profile's image per kind.
        command: what the pod runs: by default ``heteroflow step train``, which starts the pod's elastic agent
            itself (not under torchrun); another command is one worker process, which ``torchrun --no-python`` runs
            once per device of the pod unless ``torchrun=False``.
        namespace: the job's namespace.
        profile: the cluster profile (device-plugin conventions, queue, scheduler, images, shared storage);
            default :data:`~heteroflow.components.devices.cluster.DEFAULT_PROFILE`.
        env: more environment variables for every container. Its ``PET_RDZV_CONF`` (torchrun's ``--rdzv-conf``
            options of the c10d rendezvous, ``keep_alive_interval=1,keep_alive_max_attempt=5``) is kept, after
            the rendering's own ``is_host=false`` where ``endpoint`` hosts the store outside the pods.
        labels: labels on the job.
        port: the c10d rendezvous port on the first task's pod 0.
        max_restarts: torchrun's worker-group restarts per agent (``PET_MAX_RESTARTS``), >= 0.
        torchrun: wrap ``command`` in torch's elastic launcher (``python -m torch.distributed.run --no-python``);
            default (None): every command but ``heteroflow step train``; True with that command is refused.
        validate: check the result with :func:`validate_volcano_job`.
        endpoint: ``host:port`` of a c10d store hosted outside the job (the launcher's pod IP,
            :func:`heteroflow.components.training.mixed_launch.launch_mixed_job`): every pod joins it with
            ``PET_RDZV_CONF=is_host=false`` and no pod opens the port; default: the first task's pod 0 hosts it.
        writer_last: the pods exit only after the pod holding rank 0 recorded its outcome (a launched job's pods,
            :func:`mixed_job_manifests` with a ``workdir``): with ``endpoint``, the job completes at its first
            succeeded pod (``minSuccess: 1``, :func:`lifecycle`).

    Returns:
        The Job manifest (``apiVersion``, ``kind``, ``metadata``, ``spec``).

    Raises:
        InvalidResources: no roles, a bad role (see :class:`RoleSpec`), two roles with one task name, a job name
            that is not a DNS label or makes a pod hostname longer than 63 characters, a bad port or restart
            count, no image for a kind, ``torchrun=True`` around ``heteroflow step train``; or a role that cannot
            be asked for on the profile's cluster
            (:func:`~heteroflow.components.devices.podplan.plan_pod`).
        heteroflow.cache.errors.InvalidCacheOption: the manifest breaks the Volcano CRD schema (a bug).
    """
    from heteroflow.components.devices.cluster import DEFAULT_PROFILE
    from heteroflow.components.devices.podplan import plan_pod

    profile = profile or DEFAULT_PROFILE
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
        raise InvalidResources(f"name={name!r} is not a job name; valid: a DNS label (lower case, digits, '-', <= 63)")
    if isinstance(roles, (str, bytes)) or not roles:
        raise InvalidResources(f"roles={roles!r}; valid: one or more RoleSpec(kind, replicas, resources)")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidResources(f"port={port!r}; valid: an integer 1..65535")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise InvalidResources(f"max_restarts={max_restarts!r}; valid: an integer >= 0")
    train_step = _is_train_step(command)
    if torchrun and train_step:
        raise InvalidResources(
            "torchrun=True around 'heteroflow step train': the train step starts its kind's elastic agent itself "
            "(worker mode) and must not run under torchrun; valid: torchrun=None or False with it, or another command")
    if torchrun is None:
        torchrun = not train_step
    resolved = [_resolve(r, i) for i, r in enumerate(roles)]
    tasks = [t for t, *_ in resolved]
    if len(set(tasks)) != len(tasks):
        dup = next(t for t in tasks if tasks.count(t) > 1)
        raise InvalidResources(f"two roles have the task name {dup!r}; valid: one task per role (set RoleSpec.task)")
    for task, _, replicas, _ in resolved:
        host = f"{name}-{task}-{replicas - 1}"
        if len(host) > 63:
            raise InvalidResources(f"name={name!r}: pod hostname {host!r} has {len(host)} characters; valid: <= 63 (a shorter job or task name)")

    pods = sum(r for _, _, r, _ in resolved)
    plans = [plan_pod(res, profile) for *_, res in resolved]
    role_facts = [{"task": t, "kind": k, "replicas": r, "devices": p.accelerator_count}
                  for (t, k, r, _), p in zip(resolved, plans)]
    hosted_outside = endpoint is not None
    if hosted_outside and not _ENDPOINT.fullmatch(str(endpoint)):
        raise InvalidResources(f"endpoint={endpoint!r}; valid: HOST:PORT of the launcher's c10d store (an IP or a DNS name, port 1..65535)")
    endpoint = endpoint or f"{name}-{tasks[0]}-0.{name}:{port}"
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if profile.shared_claim is not None:
        volumes.append({"name": "heteroflow-shared", "persistentVolumeClaim": {"claimName": profile.shared_claim}})
        mounts.append({"name": "heteroflow-shared", "mountPath": profile.shared_mount})
    spec_tasks: list[dict[str, Any]] = []
    # the caller's c10d options (env's PET_RDZV_CONF, torchrun's --rdzv-conf), after is_host=false where the store is
    # hosted outside the pods (that one is the rendering's, not the caller's)
    stated = [p for p in (dict(env or {}).get("PET_RDZV_CONF") or "").split(",") if p.strip()]
    if hosted_outside:
        stated = ["is_host=false", *(p for p in stated if p.partition("=")[0].strip() != "is_host")]
    rdzv_conf = ",".join(stated)
    for i, ((task, kind, replicas, _), plan) in enumerate(zip(resolved, plans)):
        img = image.get(kind) if isinstance(image, Mapping) else image
        img = img or plan.image
        if not img:
            raise InvalidResources(f"no image for the {kind} role: pass image=, or name images.{kind} in the cluster profile")
        variables = {
            **dict(env or {}),
            "PET_NNODES": f"1:{pods}",
            "PET_NPROC_PER_NODE": str(max(plan.accelerator_count, 1)),
            "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ENDPOINT": endpoint,
            "PET_RDZV_ID": name,
            "PET_MAX_RESTARTS": str(max_restarts),
            **({"PET_RDZV_CONF": rdzv_conf} if rdzv_conf else {}),
            REPLICA_KIND_ENV: kind,
            ROLES_ENV: json.dumps(role_facts, separators=(",", ":")),
        }
        run = ["python", "-m", "torch.distributed.run", "--no-python", *command] if torchrun else list(command)
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": img,
            "command": run,
            "env": [{"name": k, "value": str(v)} for k, v in variables.items()],
            "resources": {"requests": dict(plan.requests), "limits": dict(plan.limits)},
        }
        if i == 0 and not hosted_outside:
            container["ports"] = [{"name": "c10d", "containerPort": port, "protocol": "TCP"}]
        if mounts:
            container["volumeMounts"] = mounts
        pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
        if plan.node_selector:
            pod_spec["nodeSelector"] = dict(plan.node_selector)
        if plan.affinity:
            pod_spec["affinity"] = plan.affinity
        if plan.tolerations:
            pod_spec["tolerations"] = [t.to_dict() for t in plan.tolerations]
        if volumes:
            pod_spec["volumes"] = volumes
        template: dict[str, Any] = {"spec": pod_spec}
        pod_labels = {k: v for k, v in plan.labels.items() if k != _KUEUE_QUEUE_LABEL}  # Kueue does not admit Volcano Jobs
        meta = {k: v for k, v in (("labels", pod_labels), ("annotations", dict(plan.annotations))) if v}
        if meta:
            template["metadata"] = meta
        spec_tasks.append({"name": task, "replicas": replicas, "template": template})
    spec: dict[str, Any] = {
        "schedulerName": profile.scheduler_name or "volcano",
        "minAvailable": pods,
        "plugins": {"svc": [], "env": []},
        **lifecycle(store_in_job=not hosted_outside, writer_last=writer_last),
        "tasks": spec_tasks,
    }
    if profile.volcano_queue:
        spec["queue"] = profile.volcano_queue
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": metadata, "spec": spec}
    if validate:
        validate_volcano_job(job)
    return job


def _is_train_step(command: Sequence[str]) -> bool:
    """Whether ``command`` runs heteroflow's train step (``heteroflow step train ...``, or ``python -m heteroflow
    step train ...``), which starts its own elastic agent in a mixed job's pod."""
    words = [str(w) for w in command]
    for i, word in enumerate(words):
        if word.rsplit("/", 1)[-1] == "heteroflow" and words[i + 1:i + 3] == ["step", "train"]:
            return True
    return False


def lifecycle(*, store_in_job: bool, writer_last: bool) -> dict[str, Any]:
    """The Volcano Job's lifecycle fields (``minSuccess``, ``policies``) for a mixed job.

    What Volcano does (v1.15.1 sources, the release of the CRD in ``cache/data/crds``):

    - a pod turning Failed is the event ``PodFailed``, a pod deleted by anyone but the job controller (eviction,
      preemption, a drained node) ``PodEvicted`` (``pkg/controllers/job/job_controller_handler.go``, updatePod and
      deletePod); with no policy for the event (task-level ``policies`` first, then the job's) the action is
      ``SyncJob`` (``job_controller_util.go``, applyPolicies: "default action is sync job"), which leaves a Failed
      pod as it is and recreates a deleted one (``job_controller_actions.go``, syncJob); ``RestartJob`` kills
      every pod and starts the job over (up to ``maxRetry``, which the admission webhook defaults to 3);
    - a Running job's phase after a sync (``pkg/controllers/job/state/running.go``, runningState.Execute, the
      default branch): ``Completed`` as soon as ``status.succeeded >= minSuccess`` (when set); else, once every pod
      has ended, ``Failed`` if a task has fewer Succeeded pods than its ``minAvailable`` (the mutating webhook,
      ``pkg/webhooks/admission/jobs/mutate/mutate_job.go``, defaults a task's ``minAvailable`` to its
      ``replicas``) or fewer than the job's ``minAvailable``. So with the gang's ``minAvailable`` = all pods and no
      ``minSuccess``, a kind whose pods failed makes the job ``Failed`` although the other kinds finished the
      training; and a finished job kills the pods still running (``state/finished.go``: KillJob, keeping
      Succeeded and Failed pods);
    - ``SyncJob`` and the other internal actions are refused in ``policies`` by the admission webhook
      (``pkg/webhooks/admission/jobs/validate/util.go``, policyActionMap), so "do nothing" is no policy at all.

    Launched by the train step (``store_in_job=False``: the launcher hosts the store; ``writer_last=True``: every
    pod but the one holding rank 0 waits for that pod's outcome on the shared storage before it exits,
    :func:`heteroflow.components.training.mixed_launch.wait_for_writer`): no policies (a kind's failing pod is left
    Failed while the others train on; an evicted one is recreated, and joins the elastic rendezvous again where
    the scheduler places it: with Failed pods the gang of all pods cannot be met, so it may stay Pending, and the
    launcher ends the job once the training's outcome is recorded; not exercised in the tests), and
    ``minSuccess: 1``: the first pod to succeed is one whose training ended with the model written, so the job is
    ``Completed`` then, whichever kinds dropped out; when every pod fails, ``Failed`` (0 succeeded < 1). The job's
    ``minAvailable`` stays the gang (all pods of all kinds start together).

    Rendered alone (``store_in_job=True``, ``heteroflow manifests``): the first task's pod 0 hosts the store, so an
    evicted pod restarts the whole job (``PodEvicted`` -> ``RestartJob``), and without the writer's barrier no
    ``minSuccess`` (the first worker to exit would end the job before rank 0 wrote its output).

    Args:
        store_in_job: a pod of the job hosts the c10d store.
        writer_last: the pods exit only after the pod holding rank 0 recorded its outcome.

    Returns:
        ``{"policies": [...]}`` and/or ``{"minSuccess": 1}``, or ``{}``.
    """
    out: dict[str, Any] = {}
    if store_in_job:
        out["policies"] = [{"event": "PodEvicted", "action": "RestartJob"}]
    if writer_last and not store_in_job:
        out["minSuccess"] = 1
    return out


def validate_volcano_job(job: Mapping[str, Any], *, k8s_version: str = "1.33.0") -> None:
    """Check a Volcano Job against the shipped CRD (unknown fields rejected,
    :func:`heteroflow.cache.crds.validate_manifest`) and each task's pod template against the core Kubernetes schema
    of ``k8s_version`` with ``kubernetes-validate`` (strict) where it is installed (the ``dev`` extra).

    Raises:
        heteroflow.cache.errors.InvalidCacheOption: the Job breaks the CRD schema (the message names the field path).
        kubernetes_validate.ValidationError: a pod template breaks the core schema.
    """
    from heteroflow.cache.crds import validate_manifest

    validate_manifest(job)
    try:
        import kubernetes_validate
    except ImportError:  # a dev extra; the CRD schema covers the template's shape
        return
    for task in job["spec"]["tasks"]:
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": task["name"]}, "template": task["template"]}
        kubernetes_validate.validate(pod_template, k8s_version, strict=True)


def mixed_roles(resources: Any) -> list[RoleSpec]:
    """One :class:`RoleSpec` per replica group of a mixed candidate
    (:class:`~heteroflow.components.replicas.MixedResources`): the group's kind, its ``count`` replicas as pods
    (one replica's resources each: one device on an accelerator kind), the kind's name as the task.

    Raises:
        InvalidResources: ``resources`` is not a mixed candidate (it has no ``replicas``).
    """
    groups = getattr(resources, "replicas", None)
    if not groups:
        raise InvalidResources(f"{resources!r} is not a mixed candidate; valid: MixedResources (e.g. gpu:count=2+npu:count=4)")
    return [RoleSpec(g.kind.value, g.count, g.resources) for g in groups]


def pod_command(resources: Any, *, values: Mapping[str, Any], workdir: str, call: str = "train") -> list[str]:
    """What every pod of a launched mixed job runs: ``heteroflow step train`` on the mixed candidate with the train
    step's parameters, its input ``<workdir>/shards``, the model output ``<workdir>/model`` (only the pod holding
    rank 0 writes it) and each pod's own metrics and outcome, ``<workdir>/pods/<pod>/metrics`` and
    ``.../outcome.json`` (``$(HETEROFLOW_POD_NAME)``, which the kubelet expands from the pod's downward-API
    variable). ``workdir`` lies on the shared storage. The step in a pod starts its kind's elastic agent itself
    (worker mode, :mod:`heteroflow.components.training.mixed_launch`), so the command is not wrapped in torchrun."""
    from heteroflow.components.core.runtime import candidate_to_json

    pod = f"{workdir}/pods/$({POD_NAME_ENV})"
    out = ["heteroflow", "step", "train", "--call", call, "--candidate", candidate_to_json(0, resources),
           "--input", f"shards={workdir}/shards", "--output", f"model={workdir}/model",
           "--output", f"metrics={pod}/metrics", "--outcome", f"{pod}/outcome.json"]
    for key, value in values.items():
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        out += ["--param", f"{key}={text}"]
    return out


def mixed_job_manifests(
    resources: Any,
    *,
    name: str,
    image: str | Mapping[str, str] | None = None,
    command: Sequence[str] = ("heteroflow", "step", "train"),
    namespace: str = "default",
    profile: ClusterProfile | None = None,
    endpoint: str | None = None,
    workdir: str | None = None,
    env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The manifests of a mixed candidate's train on a cluster: one Volcano Job (:func:`volcano_mixed_job`) with a
    task per replica group of ``resources`` (:func:`mixed_roles`), each pod running ``command`` as is (the train
    step starts the pod's elastic agent itself: not under torchrun).

    Args:
        endpoint: ``host:port`` of the launcher's c10d store (see :func:`volcano_mixed_job`); default the first
            task's pod 0 hosts it.
        workdir: the job's folder on the shared storage (:data:`OUTPUT_ENV` on every container); it must lie under
            the profile's ``shared_storage.mount_path`` (the ReadWriteMany claim every pod mounts), where the pod
            holding rank 0 writes the outputs.
        env: more environment variables for every container.

    Raises:
        InvalidResources: as :func:`volcano_mixed_job` (no image for a kind: pass ``image`` or name ``images.<kind>``
            in the profile); a ``workdir`` without shared storage in the profile, or outside its mount.
    """
    variables = dict(env or {})
    if workdir is not None:
        mount = profile.shared_mount if profile is not None and profile.shared_claim is not None else None
        if mount is None:
            raise InvalidResources(
                f"workdir={workdir!r} needs shared storage every pod mounts; valid: a cluster profile with shared_storage: "
                "{claim: NAME, mount_path: /mnt/heteroflow} (a ReadWriteMany PersistentVolumeClaim)")
        if not (workdir == mount or workdir.startswith(mount.rstrip("/") + "/")):
            raise InvalidResources(f"workdir={workdir!r} is not on the shared storage; valid: a folder under {mount}")
        variables[OUTPUT_ENV] = workdir
    job = volcano_mixed_job(name, mixed_roles(resources), image, command, namespace=namespace, profile=profile,
                            env=variables, endpoint=endpoint, torchrun=False, writer_last=workdir is not None)
    if workdir is not None:  # each pod's name (Volcano: <job>-<task>-<index>) names its own outcome folder
        for task in job["spec"]["tasks"]:
            for container in task["template"]["spec"]["containers"]:
                container["env"].append({"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        validate_volcano_job(job)
    return [job]


def missing_images(resources: Any, image: str | Mapping[str, str] | None, profile: ClusterProfile | None) -> list[str]:
    """The kinds of a mixed candidate with no image (neither ``image`` nor the profile's ``images.<kind>``)."""
    from heteroflow.components.devices.cluster import DEFAULT_PROFILE

    used = profile or DEFAULT_PROFILE
    out = []
    for g in resources.replicas:
        kind = g.kind.value
        given = image.get(kind) if isinstance(image, Mapping) else image
        if not (given or used.image_for(kind)):
            out.append(kind)
    return out
