"""Volcano's job controller rules that decide a Job's phase from its pods, ported from volcano-sh/volcano v1.15.1 (the
release of the CRD in ``cache/data/crds``), for tests that check what a rendered Job does when pods fail:

- admission defaults (``pkg/webhooks/admission/jobs/mutate/mutate_job.go``): a task's ``minAvailable`` defaults to
  its ``replicas``;
- the action for a pod's event (``pkg/controllers/job/job_controller_util.go``, applyPolicies): the task's
  ``policies`` first, then the job's; none: ``SyncJob`` (a Failed pod is left as it is);
- a Running job's phase after a sync (``pkg/controllers/job/state/running.go``, runningState.Execute, the default
  branch); a finished job kills the pods still running (``state/finished.go``: KillJob keeping Succeeded and
  Failed pods).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def action_for(job: Mapping[str, Any], task: str, event: str) -> str:
    """The action Volcano takes for ``event`` (``PodFailed``, ``PodEvicted``...) of a pod of ``task``."""
    spec = job["spec"]
    for t in spec["tasks"]:
        if t["name"] == task:
            for policy in t.get("policies") or []:
                if event in [policy.get("event"), *(policy.get("events") or [])] or "*" in [policy.get("event"), *(policy.get("events") or [])]:
                    return str(policy["action"])
    for policy in spec.get("policies") or []:
        if event in [policy.get("event"), *(policy.get("events") or [])] or "*" in [policy.get("event"), *(policy.get("events") or [])]:
            return str(policy["action"])
    return "SyncJob"


def running_phase(job: Mapping[str, Any], succeeded: Mapping[str, int], failed: Mapping[str, int]) -> str:
    """The phase of a Running job whose pods ended as counted (per task; the others still run): ``Running``,
    ``Completed`` or ``Failed`` (running.go's default branch; ``status.Pending`` taken as 0)."""
    spec = job["spec"]
    replicas = sum(int(t["replicas"]) for t in spec["tasks"])
    ok, bad = sum(succeeded.values()), sum(failed.values())
    min_success = spec.get("minSuccess")
    if min_success is not None and ok >= min_success:
        return "Completed"
    task_min = {t["name"]: int(t.get("minAvailable", t["replicas"])) for t in spec["tasks"]}  # the webhook's default
    if ok + bad == replicas:
        if spec["minAvailable"] >= sum(task_min.values()):
            for name, least in task_min.items():
                if succeeded.get(name, 0) < least:
                    return "Failed"
        if min_success is not None and ok < min_success:
            return "Failed"
        return "Completed" if ok >= spec["minAvailable"] else "Failed"
    return "Running"
