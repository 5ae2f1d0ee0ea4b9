"""What a training job's launcher reads besides the job's conditions (issue #28.15, #28.16, #28.22): its pods (is
the whole gang Running, and why a member is not) and every node's outcome (which failure class the job ends with).

- A TrainJob says ``Created`` as soon as its JobSet exists, and a PyTorchJob ``Running`` as soon as one pod runs,
  even when the gang scheduler cannot place the others (kubeflow/trainer#1617): the gang is admitted only when all
  its members are ``Running``, so the launcher's gang deadline runs until then (:func:`gang_running`).
- A member may be pending because no node fits (``Unschedulable``) or because Kueue holds it
  (``PodScheduled=False``, reason ``SchedulingGated``, while the pod has scheduling gates): :func:`pod_hold` says
  which, naming the Kueue queue (the pod's ``kueue.x-k8s.io/queue-name`` label).
- Any node may hold the failure: the job fails as soon as one pod fails and the others are stopped, often before
  node 0 wrote its outcome; :func:`job_failure` reads every node's outcome and keeps the most severe class, so a bug
  in the user's code (permanent on every node that got that far) is never taken for a lost pod (transient).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.components.devices.cluster import KUEUE_QUEUE_LABEL

__all__ = ["job_failure", "gang_running", "pod_hold", "pod_lister", "pod_selector"]

_SEVERITY = {"permanent": 3, "device": 2, "transient": 1}
_SELECTORS = {"TrainJob": "jobset.sigs.k8s.io/jobset-name", "PyTorchJob": "training.kubeflow.org/job-name"}


def pod_selector(kind: str, name: str) -> str:
    """The label selector of a job's pods (the JobSet a TrainJob creates has its name; the training operator
    labels a PyTorchJob's pods with the job's name)."""
    return f"{_SELECTORS[kind]}={name}"


def pod_lister(api: Any) -> Callable[[str, str], list[dict[str, Any]]] | None:
    """A function ``(namespace, selector) -> pods`` (as plain dicts, the API's JSON) with the credentials of
    ``api`` (a ``CustomObjectsApi``), or None where ``api`` carries none (a test double of the job API only)."""
    client = getattr(api, "api_client", None)
    if client is None:
        return None
    from kubernetes.client import CoreV1Api

    core = CoreV1Api(client)

    def pods(namespace: str, selector: str) -> list[dict[str, Any]]:
        items = core.list_namespaced_pod(namespace, label_selector=selector).items
        return [client.sanitize_for_serialization(p) for p in items]

    return pods


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def gang_running(pods: Sequence[Mapping[str, Any]], members: int) -> bool:
    """All ``members`` of the gang exist and are ``Running`` (or already ended well)."""
    return len(pods) >= members and sum(_phase(p) in ("Running", "Succeeded") for p in pods) >= members


def pod_hold(pod: Mapping[str, Any]) -> str | None:
    """Why a pending pod does not run, in one line; None for a pod that is not held.

    ``SchedulingGated`` (Kueue holds the pod until its queue admits the workload) names the queue;
    ``Unschedulable`` gives the scheduler's message.
    """
    if _phase(pod) != "Pending":
        return None
    meta, status, spec = pod.get("metadata") or {}, pod.get("status") or {}, pod.get("spec") or {}
    name = meta.get("name", "a pod")
    for cond in status.get("conditions") or []:
        if cond.get("type") != "PodScheduled" or str(cond.get("status")) != "False":
            continue
        if cond.get("reason") == "SchedulingGated" or spec.get("schedulingGates"):
            queue = (meta.get("labels") or {}).get(KUEUE_QUEUE_LABEL)
            gates = ", ".join(str(g.get("name")) for g in spec.get("schedulingGates") or []) or "a scheduling gate"
            held = f"held by Kueue in queue {queue!r}" if queue else "held by a scheduling gate (no Kueue queue label)"
            return f"pod {name} is {held} (SchedulingGated: {gates})"
        if cond.get("reason") == "Unschedulable":
            return f"pod {name} cannot be scheduled: {cond.get('message') or 'no node fits it'}"
    return f"pod {name} is Pending"


def job_failure(workdir: Path, nodes: int) -> tuple[str, str] | None:
    """``(failure class, reason)`` of a failed job from its nodes' outcomes (``node-<rank>/outcome.json``): the
    most severe class any node reported (permanent > device > transient), its reason naming the node; None when
    no node wrote a failed outcome (pods lost before they could)."""
    found: list[tuple[int, int, str, str]] = []
    for rank in range(nodes):
        try:
            outcome = json.loads((workdir / f"node-{rank}" / "outcome.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        failure = outcome.get("failure") if isinstance(outcome, Mapping) else None
        if failure in _SEVERITY:
            found.append((-_SEVERITY[failure], rank, failure, str(outcome.get("reason") or "no reason given")))
    if not found:
        return None
    _, rank, failure, reason = min(found)
    return failure, (reason if rank == 0 else f"node {rank}: {reason}")
