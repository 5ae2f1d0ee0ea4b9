"""A mixed candidate's train on a cluster (issue #29): the train step's task launches one Volcano Job and hosts its
rendezvous store; each pod of the job runs the train step in *worker mode*.

Launcher (:func:`launch_mixed_job`)
    The train step's own task (a KFP task or Airflow pod, in a Kubernetes pod: ``KUBERNETES_SERVICE_HOST``, with the
    cluster profile in ``HETEROFLOW_CLUSTER_PROFILE``: :func:`in_launcher_pod`) is the launcher, as for a multi-node
    candidate (:mod:`heteroflow.components.training.trainjob`, whose credential, profile, namespace and copy
    helpers it reuses). It

    1. copies the input data to ``<mount>/jobs/<job>/shards`` on the profile's shared storage (a ReadWriteMany
       claim mounted on the task and on every pod of the job: a path under ``shared_storage.mount_path``; fsspec
       URLs are not an output location the train step writes today);
    2. hosts the c10d store itself (:func:`host_store`: a ``torch.distributed.TCPStore`` server, as the local
       launch :func:`~heteroflow.components.training.mixed.run_mixed` does), so no kind's failure takes the store
       down; the endpoint is its pod IP (:func:`pod_ip`: ``POD_IP`` from the downward API, else what ``hostname -i``
       gives) and the store's port;
    3. renders the Volcano Job (:func:`~heteroflow.components.training.mixed_job.mixed_job_manifests`) with
       ``PET_RDZV_ENDPOINT=<pod IP>:<port>`` and ``PET_RDZV_CONF=is_host=false`` in every pod, each pod running
       :func:`~heteroflow.components.training.mixed_job.pod_command`, and creates it with the kubernetes client; a
       job of the same name (a retried launcher's: its pods point at a store that is gone) is deleted first, and
       the new one resumes from the shared checkpoints;
    4. waits for it (``status.state.phase``); a job still ``Pending`` after ``HETEROFLOW_GANG_WAIT_SECONDS`` that
       never ran is deleted (a device failure: the step falls back to its next candidate). A kind's failing pods
       leave the job Running while the other kinds train on, and it is Completed at its first succeeded pod, every
       other pod having waited for the pod holding rank 0 to record its outcome (:func:`wait_for_writer`; the
       lifecycle and its Volcano sources: :func:`~heteroflow.components.training.mixed_job.lifecycle`); a job
       still not finished :data:`FINISH_GRACE_SECONDS` after that outcome is deleted;
    5. reads the outputs: the pod that held rank 0 wrote ``<workdir>/model`` and its outcome (``writer``) under
       ``<workdir>/pods/<pod>/``; the model is copied into the step's output atomically and its facts returned,
       with each kind whose Volcano task failed in ``mixed.dropped`` (from the pods' outcomes and the job's
       ``status.taskStatusCount``). Without such an outcome the most severe failure a pod reported fails the step
       (permanent > device > transient; none: transient), naming the Volcano tasks with failed pods.

    No cluster, no profile, no shared storage, no image for a kind, no Volcano CRD or no permission to create
    Jobs: :class:`~heteroflow.components.errors.DeviceUnavailable` naming what is missing and what to do.

Worker mode (:func:`pod_rendezvous`, :func:`pod_group`)
    In a pod of the job (``HETEROFLOW_REPLICA_KIND`` and ``PET_RDZV_ENDPOINT`` set) the train step starts ONE
    elastic agent for its kind (``nproc_per_node`` = ``PET_NPROC_PER_NODE``) through the same
    :func:`~heteroflow.components.training.mixed.run_mixed`, joining the rendezvous (``PET_RDZV_ID``,
    ``--nnodes=1:<pods>`` from ``PET_NNODES``, ``is_host`` from ``PET_RDZV_CONF``: false when the launcher hosts the
    store; unset, torch decides by hostname, so a job from ``heteroflow manifests`` has its first task's pod 0 host
    it). Every pod gets the (all-gathered, identical) result; the pod holding rank 0 writes the model.

Sources: Volcano Job phases (``status.state.phase``: Pending, Running, Completing, Completed, Failed, Aborted,
Terminated...), https://volcano.sh/en/docs/vcjob/ and the CRD in ``cache/data/crds``; torchrun's ``PET_*``
variables and ``--rdzv-conf is_host``, https://pytorch.org/docs/stable/elastic/run.html; the downward API,
https://kubernetes.io/docs/concepts/workloads/pods/downward-api/.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from heteroflow.components.errors import DeviceUnavailable, InvalidParameter

__all__ = [
    "JOB_GROUP",
    "JOB_PLURAL",
    "JOB_VERSION",
    "LAUNCHER_LABEL",
    "WRITER_WAIT_ENV",
    "failed_tasks",
    "POD_IP_ENV",
    "PORT_ENV",
    "host_store",
    "in_launcher_pod",
    "job_phase",
    "launch_mixed_job",
    "pod_group",
    "pod_ip",
    "RDZV_CONF_KEYS",
    "pod_rendezvous",
    "read_job_outcome",
    "wait_for_writer",
]

JOB_GROUP, JOB_VERSION, JOB_PLURAL = "batch.volcano.sh", "v1alpha1", "jobs"
"""The Volcano Job's API coordinates (the CRD's ``spec.group``, version and ``spec.names.plural``)."""
PORT_ENV = "HETEROFLOW_RDZV_PORT"
"""The port of the launcher's c10d store (default 29400; 0: any free port)."""
POD_IP_ENV = "POD_IP"
"""The launcher pod's IP, from the downward API (``fieldRef: status.podIP``); else the hostname's address."""
LAUNCHER_LABEL = "heteroflow.io/rendezvous-host"
"""A label (value ``"true"``) on a mixed candidate's train task pod, the launcher hosting the job's c10d store: what a
NetworkPolicy admitting the store's port (:data:`PORT_ENV`, TCP) from the job's pods selects."""
POLL_SECONDS = 5.0
"""Seconds between the launcher's reads of the job's status."""
FINISH_GRACE_SECONDS = 60.0
"""Seconds the launcher gives Volcano to call the job finished once the pod holding rank 0 recorded its outcome
(a pod recreated after an eviction that the gang cannot place keeps the job Pending for ever); then it deletes it."""
WRITER_WAIT_ENV = "HETEROFLOW_WRITER_WAIT_SECONDS"
"""Seconds a pod of a launched mixed job waits for the pod holding rank 0 to record its outcome (default 600)."""
_DONE = {"Completed": "succeeded", "Failed": "failed", "Aborted": "failed", "Terminated": "failed"}
_SEVERITY = {"permanent": 3, "device": 2, "transient": 1}


def in_launcher_pod(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a cluster rendering's train task (a KFP task or an Airflow pod, in a Kubernetes pod:
    ``KUBERNETES_SERVICE_HOST`` set by the kubelet, carrying the cluster profile in ``HETEROFLOW_CLUSTER_PROFILE``)
    and not a pod of a mixed job (``HETEROFLOW_REPLICA_KIND``): it launches the mixed job. kfp.local's and Airflow's
    local tasks carry the profile too but run on this machine, where the kinds train as local processes."""
    from heteroflow.components.training.mixed_job import REPLICA_KIND_ENV
    from heteroflow.components.training.trainjob import PROFILE_ENV

    env = os.environ if environ is None else environ
    return bool(env.get(PROFILE_ENV) and env.get("KUBERNETES_SERVICE_HOST") and not env.get(REPLICA_KIND_ENV))


RDZV_CONF_KEYS = ("join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout", "keep_alive_interval",
                  "keep_alive_max_attempt")
"""The options of torch's c10d rendezvous handler (besides ``is_host``) a pod's ``PET_RDZV_CONF`` may state, as
torchrun's ``--rdzv-conf`` takes them (``torch.distributed.elastic.rendezvous.dynamic_rendezvous.create_handler``:
``*_timeout`` in seconds, ``keep_alive_interval`` in seconds, ``keep_alive_max_attempt`` a count)."""


def pod_rendezvous(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The rendezvous a pod of a mixed job joins (worker mode), from its environment; None outside such a pod.

    Returns:
        ``{"kind", "endpoint", "run_id", "max_nodes", "max_restarts", "is_host", "nproc", "last_call_timeout",
        "rdzv_configs", "pod"}``: ``is_host`` False/True from ``PET_RDZV_CONF`` (``is_host=false``), None when
        unset (torch decides by hostname); ``last_call_timeout`` from ``PET_RDZV_CONF`` too, default 30 s (pods
        start at different times); ``rdzv_configs``: the other c10d options ``PET_RDZV_CONF`` states
        (:data:`RDZV_CONF_KEYS`, integers >= 1, in seconds but the attempts), given to the kind's agent as
        torchrun's ``--rdzv-conf`` gives them (a pod's heartbeats otherwise keep torch's 5 s x 3).

    Raises:
        InvalidParameter: a variable that is not what the rendering writes (the message names it), or the step runs
            under torchrun (``TORCHELASTIC_RUN_ID``): in a mixed job's pod the step starts the agent itself.
    """
    from heteroflow.components.training.mixed_job import POD_NAME_ENV, REPLICA_KIND_ENV

    env = os.environ if environ is None else environ
    kind, endpoint = env.get(REPLICA_KIND_ENV), env.get("PET_RDZV_ENDPOINT")
    if not kind or not endpoint:
        return None
    if env.get("TORCHELASTIC_RUN_ID"):
        raise InvalidParameter(
            "heteroflow step train runs under torchrun in a mixed job's pod; valid: the command without "
            "`python -m torch.distributed.run` (the step starts its kind's elastic agent itself: render with mixed_job_manifests)")

    def number(name: str, text: str, low: int) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise InvalidParameter(f"{name}={text!r}; valid: an integer >= {low}")
        return value

    nnodes = env.get("PET_NNODES", "1:1")
    max_nodes = number("PET_NNODES", nnodes.rpartition(":")[2], 1)
    conf: dict[str, str] = {}
    for pair in filter(None, (env.get("PET_RDZV_CONF") or "").split(",")):
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidParameter(f"PET_RDZV_CONF={env['PET_RDZV_CONF']!r}; valid: key=value pairs separated by commas")
        conf[key.strip()] = value.strip()
    unknown = sorted(set(conf) - {"is_host", *RDZV_CONF_KEYS})
    if unknown:
        from heteroflow.components.errors import did_you_mean

        raise InvalidParameter(f"PET_RDZV_CONF names {', '.join(unknown)}{did_you_mean(unknown, ['is_host', *RDZV_CONF_KEYS])}; "
                               f"valid: is_host, {', '.join(RDZV_CONF_KEYS)} (torch's c10d rendezvous options)")
    host = conf.get("is_host", "").lower()
    if host not in ("", "true", "false", "1", "0"):
        raise InvalidParameter(f"PET_RDZV_CONF is_host={host!r}; valid: true or false")
    # the c10d handler reads each as an integer (torch's create_handler: get_as_int); 0 would never wait
    rdzv_configs = {key: number(f"PET_RDZV_CONF {key}", conf[key], 1) for key in RDZV_CONF_KEYS if key in conf}
    return {
        "kind": kind,
        "endpoint": endpoint,
        "run_id": env.get("PET_RDZV_ID") or "heteroflow-mixed",
        "max_nodes": max_nodes,
        "max_restarts": number("PET_MAX_RESTARTS", env.get("PET_MAX_RESTARTS", "3"), 0),
        "is_host": None if not host else host in ("true", "1"),
        "nproc": number("PET_NPROC_PER_NODE", env.get("PET_NPROC_PER_NODE", "1"), 1),
        "last_call_timeout": float(rdzv_configs.get("last_call_timeout", 30)),
        "rdzv_configs": rdzv_configs,
        "pod": env.get(POD_NAME_ENV) or socket.gethostname(),
    }


def pod_group(resources: Any, rendezvous: Mapping[str, Any], say: Callable[[str], None]) -> Any:
    """This pod's :class:`~heteroflow.components.training.mixed.ReplicaGroup`: its kind's replica group of the mixed
    candidate, ``PET_NPROC_PER_NODE`` workers, on the kind's device (or the CPU where the kind is simulated, as
    on one machine).

    Raises:
        InvalidParameter: ``HETEROFLOW_REPLICA_KIND`` names no kind of the candidate.
        DeviceUnavailable: the kind's device is not in this pod.
    """
    from heteroflow.components.training.mixed_step import _groups

    kind = rendezvous["kind"]
    mine = [g for g in resources.replicas if g.kind.value == kind]
    if not mine:
        raise InvalidParameter(f"HETEROFLOW_REPLICA_KIND={kind!r} is not a kind of the candidate {resources.describe()}; "
                               f"valid: {', '.join(g.kind.value for g in resources.replicas)}")

    @dataclasses.dataclass
    class _One:
        replicas: list[Any]

    groups, left_out = _groups(_One(mine), say)
    if not groups:
        raise DeviceUnavailable(f"this pod of the mixed job has no {kind} device: {left_out[0]['reason']}")
    return dataclasses.replace(groups[0], count=int(rendezvous["nproc"]))


def pod_ip(environ: Mapping[str, str] | None = None) -> str:
    """This pod's IP: ``POD_IP`` (the downward API's ``status.podIP``), else the address of this host's name (what
    ``hostname -i`` prints; in a pod, the kubelet's ``/etc/hosts`` maps the pod's hostname to its IP).

    Raises:
        DeviceUnavailable: neither gives an address other pods can reach (only a loopback one).
    """
    env = os.environ if environ is None else environ
    ip = env.get(POD_IP_ENV, "").strip()
    if not ip:
        try:
            ip = socket.gethostbyname(socket.gethostname())
        except OSError:
            ip = ""
    if not ip or ip.startswith("127.") or ip == "::1":
        where = f"POD_IP={ip}" if env.get(POD_IP_ENV, "").strip() else f"POD_IP unset, the hostname resolves to {ip or 'nothing'}"
        raise DeviceUnavailable(
            f"the mixed job's launcher has no address its pods can reach ({where}); "
            "valid: set POD_IP on the train task from the downward API (valueFrom.fieldRef.fieldPath: status.podIP)")
    return ip


def host_store(port: int) -> Any:
    """A c10d store server (``torch.distributed.TCPStore``, multi-tenant, not waiting for workers) on ``port`` of every
    interface of this process (0: any free port; the store's ``port`` says which); it lives as long as the returned
    object. The local launch hosts its store the same way."""
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True)


def job_phase(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(phase, Volcano's phase)`` of a Volcano Job: ``succeeded`` (Completed), ``failed`` (Failed, Aborted,
    Terminated), else ``pending`` (Pending, or no status yet) or ``running``."""
    state = (obj.get("status") or {}).get("state") or {}
    vc = str(state.get("phase") or "Pending")
    if vc in _DONE:
        return _DONE[vc], vc
    return ("pending" if vc == "Pending" else "running"), vc


def _task_of(pod: str, job: str) -> str:
    """The Volcano task (a mixed job's device kind) of pod ``<job>-<task>-<index>``."""
    if pod.startswith(job + "-"):
        return pod[len(job) + 1:].rpartition("-")[0] or pod
    return pod.rsplit("-", 2)[-2] if pod.count("-") >= 2 else pod


def failed_tasks(obj: Mapping[str, Any]) -> dict[str, int]:
    """Failed pods per task of a Volcano Job, from its ``status.taskStatusCount.<task>.phase.Failed``."""
    counts = (obj.get("status") or {}).get("taskStatusCount") or {}
    out = {str(t): int(((c or {}).get("phase") or {}).get("Failed", 0) or 0) for t, c in counts.items()}
    return {t: n for t, n in out.items() if n}


def read_job_outcome(workdir: Path, failed: Mapping[str, int] | None = None) -> tuple[dict[str, Any] | None, tuple[str, str] | None]:
    """The pods' outcomes under ``<workdir>/pods/*/outcome.json``: (the facts of the pod that held rank 0 when it
    succeeded, else None; the most severe failure ``(class, reason)`` any pod reported, else None). A pod that
    failed while the job went on is its kind's Volcano task failing, the kind dropping out: it joins the writer's
    ``mixed.dropped`` as ``{"kind", "task", "pod", "step", "reason", "resumed_from_step"}`` (the task from the
    pod's name, ``<job>-<task>-<index>``, the job being ``workdir``'s name), once per kind; so does a task that
    Volcano counts Failed pods of (``failed``: task -> pods, :func:`failed_tasks`) without any pod outcome (a pod
    killed before it could write one: OOM, a lost node)."""
    writer, worst = None, None
    dropped: dict[str, dict[str, Any]] = {}
    for path in sorted(workdir.glob("pods/*/outcome.json")):
        try:
            outcome = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        facts = outcome.get("facts") or {}
        if outcome.get("status") == "succeeded" and (facts.get("mixed") or {}).get("writer"):
            writer = dict(facts)
        elif outcome.get("status") == "failed":
            cls = str(outcome.get("failure") or "transient")
            task = _task_of(path.parent.name, workdir.name)
            if worst is None or _SEVERITY.get(cls, 1) > _SEVERITY.get(worst[0], 1):
                worst = (cls, f"Volcano task {task}, pod {path.parent.name}: {outcome.get('reason') or 'no reason given'}")
            dropped.setdefault(task, {"kind": task, "task": task, "pod": path.parent.name, "step": None,
                                      "reason": f"{cls} failure: {outcome.get('reason') or 'no reason given'}"})
    for task, pods in (failed or {}).items():
        dropped.setdefault(task, {"kind": task, "task": task, "pod": None, "step": None,
                                  "reason": f"{pods} pod(s) of Volcano task {task} failed without an outcome (killed: out of memory, a lost node?)"})
        if worst is None:
            worst = ("transient", dropped[task]["reason"])
    if writer is not None and dropped:
        mixed = writer.setdefault("mixed", {})
        known = {d.get("kind") for d in mixed.get("dropped") or []}
        mixed["dropped"] = [*(mixed.get("dropped") or []),
                            *({**d, "resumed_from_step": writer.get("resumed_from_step")} for k, d in dropped.items() if k not in known)]
    return writer, worst


def wait_for_writer(workdir: Path, *, timeout: float, say: Callable[[str], None] = lambda line: None,
                    poll: float = 1.0) -> bool:
    """In a pod of a launched mixed job that did not hold rank 0: wait until the pod that did recorded its outcome
    under ``<workdir>/pods/`` (:func:`read_job_outcome`), at most ``timeout`` seconds. The job completes at its first
    succeeded pod (``minSuccess: 1``, :func:`~heteroflow.components.training.mixed_job.lifecycle`) and Volcano then
    kills the pods still running, so no pod may exit before the training's output is recorded.

    Returns:
        Whether the writer's outcome is there (False: ``timeout`` passed; this pod exits anyway, saying so).
    """
    deadline = time.monotonic() + timeout
    while read_job_outcome(workdir)[0] is None:
        if time.monotonic() > deadline:
            say(f"train: the pod holding rank 0 recorded no outcome under {workdir}/pods within {timeout:g} s; "
                f"this pod ends anyway (set {WRITER_WAIT_ENV} to wait longer)")
            return False
        time.sleep(poll)
    return True


def _api_error(exc: BaseException, what: str, namespace: str) -> DeviceUnavailable:
    status = getattr(exc, "status", None)
    if status == 404:
        return DeviceUnavailable(
            f"{what}: the cluster has no Volcano Job API ({JOB_PLURAL}.{JOB_GROUP}/{JOB_VERSION} not found); install Volcano "
            "(https://volcano.sh/en/docs/installation/), or give the step a single-kind candidate")
    if status in (401, 403):
        return DeviceUnavailable(
            f"{what}: this task's service account may not create {JOB_PLURAL}.{JOB_GROUP} in namespace {namespace} "
            f"(HTTP {status}); grant it a Role with verbs create, get, delete on {JOB_PLURAL}.{JOB_GROUP} and a RoleBinding")
    return DeviceUnavailable(f"{what}: creating the Volcano Job failed ({type(exc).__name__}: {exc})")


def launch_mixed_job(
    resources: Any,
    *,
    dataset_dir: str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    values: Mapping[str, Any],
    key: str,
    say: Callable[[str], None] = lambda line: None,
    environ: Mapping[str, str] | None = None,
    api: Any = None,
    poll_seconds: float | None = None,
    port: int | None = None,
    image: str | Mapping[str, str] | None = None,
    finish_grace: float | None = None,
) -> dict[str, Any]:
    """Launch a mixed candidate's train as one Volcano Job, host its store, wait, and return the facts of the pod
    that held rank 0 (its model copied into ``model_dir``); the module docstring's steps.

    Args:
        resources: the mixed candidate (:class:`~heteroflow.components.replicas.MixedResources`).
        dataset_dir: the step's input (copied to the shared storage once).
        model_dir: the step's model output (the job's model is copied here, atomically).
        values: train's parameters (every pod gets the same; ``checkpoint_root`` defaults to ``<mount>/checkpoints``).
        key: a stable key of this training (the checkpoint folder's name): names the job ``heteroflow-mixed-<key>``.
        say: prints a progress line.
        environ: the environment (default ``os.environ``).
        api: a ``kubernetes.client.CustomObjectsApi`` (default: from the pod's service account or ``HETEROFLOW_KUBECONFIG``).
        poll_seconds: seconds between status reads (default :data:`POLL_SECONDS`).
        port: the store's port (default :data:`PORT_ENV`, else :data:`~heteroflow.components.training.mixed_job.RDZV_PORT`;
            0: any free one).
        image: the pods' image, one or per kind (default the profile's ``images``).
        finish_grace: seconds Volcano has to call the job finished once the pod holding rank 0 recorded its
            outcome, before the launcher deletes it (default :data:`FINISH_GRACE_SECONDS`).

    Returns:
        The facts of the pod that held rank 0; ``mixed.dropped`` names each kind whose Volcano task failed
        (``kind``, ``task``, ``pod``, ``reason``, ``resumed_from_step``), from the pods' outcomes and Volcano's
        ``status.taskStatusCount``.

    Raises:
        DeviceUnavailable: no cluster, profile, shared storage, reachable pod IP, image, Volcano API or permission;
            the job not admitted in time; every pod reported a device failure.
        JobPermanentFailure / JobTransientFailure: the job failed (a pod's permanent failure; pods lost without one).
    """
    from heteroflow.components.training.mixed_job import RDZV_PORT, missing_images, mixed_job_manifests, pod_command
    from heteroflow.components.training.trainjob import (
        GANG_WAIT_ENV,
        GANG_WAIT_SECONDS,
        JobPermanentFailure,
        KUBECONFIG_ENV,
        JobTransientFailure,
        _cluster,
        _copy_atomic,
        _namespace,
        _profile,
    )

    env = os.environ if environ is None else environ
    poll_seconds = POLL_SECONDS if poll_seconds is None else poll_seconds
    what = f"the mixed candidate {resources.describe()}"
    if api is None:
        try:
            api = _cluster(env, what)
        except DeviceUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - the client's ConfigException: no service account token in the pod
            raise DeviceUnavailable(
                f"{what}: this pod has no Kubernetes credentials ({type(exc).__name__}: {exc}); valid: a service account "
                f"token mounted in the train task's pod (automountServiceAccountToken), or {KUBECONFIG_ENV}=FILE") from exc
    profile = _profile(env, what)
    lacking = missing_images(resources, image, profile)
    if lacking:
        raise DeviceUnavailable(f"{what}: the cluster profile names no image for {', '.join(lacking)}; add images.<kind> to it")
    namespace = _namespace(env)
    name = f"heteroflow-mixed-{key[:12]}".strip("-")
    mount = Path(str(profile.shared_mount))
    workdir = mount / "jobs" / name
    if not (workdir / "shards").is_dir():
        workdir.mkdir(parents=True, exist_ok=True)
        _copy_atomic(Path(dataset_dir), workdir / "shards")
    job_values = dict(values)
    job_values.pop("progress", None)
    if not job_values.get("checkpoint_root"):
        job_values["checkpoint_root"] = str(mount / "checkpoints")
    if job_values.get("training_profile"):  # the pods read it from the shared storage
        import shutil

        shutil.copyfile(str(job_values["training_profile"]), workdir / "training_profile.json")
        job_values["training_profile"] = str(workdir / "training_profile.json")
    if port is None:
        port = int(env.get(PORT_ENV) or RDZV_PORT)
    store = host_store(port)
    ip = pod_ip(env)
    endpoint = f"[{ip}]:{store.port}" if ":" in ip else f"{ip}:{store.port}"  # an IPv6 address in brackets
    (job,) = mixed_job_manifests(resources, name=name, image=image, command=pod_command(resources, values=job_values, workdir=str(workdir)),
                                 namespace=namespace, profile=profile, endpoint=endpoint, workdir=str(workdir))
    import shutil

    shutil.rmtree(workdir / "pods", ignore_errors=True)  # a retried launcher: the last job's outcomes are not this one's
    _create_job(api, namespace, job, what)
    pods = sum(t["replicas"] for t in job["spec"]["tasks"])
    say(f"train: submitted Volcano Job {namespace}/{name} ({pods} pods: "
        + ", ".join(f"{t['name']} x{t['replicas']}" for t in job["spec"]["tasks"]) + f", gang-scheduled); this task hosts its c10d store at {endpoint}")
    gang_wait = float(env.get(GANG_WAIT_ENV) or GANG_WAIT_SECONDS)
    grace = FINISH_GRACE_SECONDS if finish_grace is None else finish_grace
    started, seen, ran, trained, obj = time.monotonic(), None, False, None, {}
    try:
        while True:
            obj = api.get_namespaced_custom_object(JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, name)
            phase, vc = job_phase(obj)
            if vc != seen:
                seen = vc
                say(f"train: Volcano Job {name} is {vc}")
            if phase in ("succeeded", "failed"):
                break
            ran = ran or phase == "running"
            # the gang's wait: only before the job first ran (back to Pending later: a pod recreated after an
            # eviction waits for room while the other pods train on)
            if phase == "pending" and not ran and time.monotonic() - started > gang_wait:
                _delete_job(api, namespace, name)
                raise DeviceUnavailable(f"{what}: the cluster did not start all {pods} pods of Volcano Job {name} within "
                                        f"{gang_wait:g} s (still Pending); deleted it (set {GANG_WAIT_ENV} to wait longer)")
            if trained is None and read_job_outcome(workdir)[0] is not None:
                trained = time.monotonic()
            if trained is not None and time.monotonic() - trained > grace:
                say(f"train: the pod holding rank 0 recorded its outcome {grace:g} s ago and Volcano Job {name} is still "
                    f"{vc}; deleting it")
                _delete_job(api, namespace, name)
                break
            time.sleep(poll_seconds)
    except KeyboardInterrupt:
        _delete_job(api, namespace, name)  # an interrupted run leaves no job behind; the rerun resumes from checkpoints
        raise
    finally:
        del store  # the store closes when the job is over
    failed = failed_tasks(obj)
    facts, worst = read_job_outcome(workdir, failed)
    if facts is not None and (workdir / "model").is_dir():
        # a kind's task failing leaves the job running (no policy restarts it) and Completed at the end (minSuccess 1)
        for d in (facts.get("mixed") or {}).get("dropped") or []:
            if d.get("task"):
                say(f"train: Volcano task {d['task']} (kind {d['kind']}) failed" + (f", pod {d['pod']}" if d.get("pod") else "")
                    + f": {d['reason']}; the other kinds trained on and resumed from step {d.get('resumed_from_step')}")
        _copy_atomic(workdir / "model", Path(model_dir))
        return facts
    tasks = (" (failed pods by Volcano task: " + ", ".join(f"{t} {n}" for t, n in sorted(failed.items())) + ")") if failed else ""
    cls, reason = worst or ("transient", f"Volcano Job {name} ended {seen} without an outcome of the pod holding rank 0")
    if cls == "permanent":
        raise JobPermanentFailure(f"Volcano Job {name} failed{tasks}: {reason}")
    if cls == "device":
        raise DeviceUnavailable(f"Volcano Job {name} failed on its devices{tasks}: {reason}")
    raise JobTransientFailure(f"Volcano Job {name} failed{tasks} ({reason}); a retry resubmits it and resumes from its checkpoints")


def _create_job(api: Any, namespace: str, job: Mapping[str, Any], what: str) -> None:
    name = job["metadata"]["name"]
    for attempt in range(30):
        try:
            api.create_namespaced_custom_object(JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, dict(job))
            return
        except Exception as exc:  # noqa: BLE001 - the client's ApiException
            if getattr(exc, "status", None) != 409:
                raise _api_error(exc, what, namespace) from exc
            if attempt == 0:  # a retried launcher's job: its pods point at a store that is gone
                _delete_job(api, namespace, name)
            time.sleep(2.0)
    raise DeviceUnavailable(f"{what}: Volcano Job {namespace}/{name} from an earlier attempt is still being deleted; retry")


def _delete_job(api: Any, namespace: str, name: str) -> None:
    try:
        api.delete_namespaced_custom_object(JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, name, propagation_policy="Foreground")
    except Exception:  # noqa: BLE001,S110 - best effort: gone already, or the API is unreachable
        pass
