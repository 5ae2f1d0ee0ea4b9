"""The multi-node launcher's reading of a job beyond its conditions (issue #28.15, #28.16, #28.22), against a
scripted **test double** of the cluster (no Kubernetes runs here): every poll returns the next scripted state, so
each test waits for observable states only, never for time (the gang deadline is 0 s where it must fire).

- #28.22: a failed job takes the most severe failure any node reported: a bug on node 1 is permanent though node 0
  was stopped before it wrote an outcome (the flaky input of test_trainjob.py, made deterministic here).
- #28.15: a TrainJob ``Created`` (a PyTorchJob ``Running``) with members the gang scheduler cannot place
  (kubeflow/trainer#1617) times out on "not all members Running": a device failure, the job deleted.
- #28.16: a member held by Kueue (``SchedulingGated``) is classified the same way, the message naming the queue.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heteroflow.components.core.failures import FailureClass, classify
from heteroflow.components.errors import DeviceUnavailable
from heteroflow.components.resources import Resources
from heteroflow.components.training.gang import gang_running, job_failure, pod_hold
from heteroflow.components.training.trainjob import (
    GANG_WAIT_ENV,
    PROFILE_ENV,
    JobPermanentFailure,
    JobTransientFailure,
    run_training_job,
)

TWO = Resources.parse_spec("gpu:count=1,nodes=2")


def _condition(kind: str) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": kind, "status": "True", "reason": kind}]}}


class ScriptedCluster:
    """TEST DOUBLE of ``CustomObjectsApi``: ``get`` returns the scripted job states in turn and fails the test
    when polled past the script (a launcher that never decides fails instead of hanging)."""

    def __init__(self, kind: str, states: list[str]) -> None:
        self.kind, self.states = kind, iter(states)
        self.deleted: list[str] = []

    def create_namespaced_custom_object(self, *args: Any) -> None:
        pass

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str) -> dict[str, Any]:
        state = next(self.states, None)
        assert state is not None, f"the launcher polled {name} past the script: it never decided"
        return {"kind": self.kind, **_condition(state)}

    def delete_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str) -> None:
        self.deleted.append(name)


def _pod(name: str, phase: str, *, reason: str = "", message: str = "", queue: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue} if queue else {}}
    status: dict[str, Any] = {"phase": phase}
    spec: dict[str, Any] = {}
    if reason:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": reason, "message": message}]
    if reason == "SchedulingGated":
        spec["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    return {"metadata": meta, "status": status, "spec": spec}


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    shared = tmp_path / "shared"
    shared.mkdir()
    data = tmp_path / "shards"
    data.mkdir()
    (data / "x").write_text("x")
    profile = {"name": "test", "images": {"gpu": "registry.example.com/heteroflow:cuda"},
               "shared_storage": {"claim": "heteroflow-shared", "mount_path": str(shared)}}
    monkeypatch.setenv(PROFILE_ENV, json.dumps(profile))
    monkeypatch.setenv("HETEROFLOW_NAMESPACE", "ml")
    yield {"dataset_dir": data, "model_dir": tmp_path / "model", "values": {"epochs": 1}, "poll_seconds": 0,
           "workdir": lambda key: shared / "jobs" / f"heteroflow-train-{key}"}


def _outcome(workdir: Path, rank: int, **outcome: Any) -> None:
    (workdir / f"node-{rank}").mkdir(parents=True, exist_ok=True)
    (workdir / f"node-{rank}" / "outcome.json").write_text(json.dumps(outcome))


def _run(launcher: dict[str, Any], api: Any, key: str, **kwargs: Any) -> dict[str, Any]:
    args = {k: v for k, v in launcher.items() if k != "workdir"}
    return run_training_job(TWO, call="train", key=key, api=api, **args, **kwargs)


# --- #28.22: the failure class of a failed job ------------------------------------------------------------------


def test_a_bug_on_node_1_is_permanent_though_node_0_was_stopped_before_its_outcome(launcher: dict[str, Any]) -> None:
    """The issue's input: node 1 raised the user's ValueError; node 0 was killed when the job failed (no outcome)."""
    _outcome(launcher["workdir"]("bug"), 1, status="failed", failure="permanent", reason="ValueError: label column 'y' holds strings")
    with pytest.raises(JobPermanentFailure, match="failed: node 1: ValueError: label column 'y' holds strings") as info:
        _run(launcher, ScriptedCluster("TrainJob", ["Failed"]), "bug")
    assert classify(info.value).cls is FailureClass.PERMANENT and not launcher["model_dir"].exists()


def test_the_most_severe_class_of_any_node_wins_and_pods_lost_without_outcomes_are_transient(launcher: dict[str, Any]) -> None:
    """The sibling: node 0 wrote an outcome of its own (a lost peer: transient) while node 1 hit the bug."""
    work = launcher["workdir"]("peer")
    _outcome(work, 0, failure="transient", reason="RuntimeError: Connection closed by peer")
    _outcome(work, 1, failure="permanent", reason="ValueError: bad model_args")
    assert job_failure(work, 2) == ("permanent", "node 1: ValueError: bad model_args")
    with pytest.raises(JobPermanentFailure, match="node 1: ValueError: bad model_args"):
        _run(launcher, ScriptedCluster("TrainJob", ["Failed"]), "peer")
    device = launcher["workdir"]("device")
    _outcome(device, 1, failure="device", reason="CUDA error: an illegal memory access")
    with pytest.raises(DeviceUnavailable, match="failed on its devices: node 1: CUDA error"):
        _run(launcher, ScriptedCluster("TrainJob", ["Failed"]), "device")
    with pytest.raises(JobTransientFailure, match=r"failed \(Failed\); a retry resubmits it") as info:
        _run(launcher, ScriptedCluster("TrainJob", ["Failed"]), "lost")
    assert classify(info.value).cls is FailureClass.TRANSIENT


# --- #28.15 / #28.16: the gang is admitted when every member runs ------------------------------------------------


def test_a_created_trainjob_with_an_unschedulable_member_times_out_as_a_device_failure(
        launcher: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's input (kubeflow/trainer#1617): Created, one pod Running, the other unschedulable."""
    monkeypatch.setenv(GANG_WAIT_ENV, "0")
    members = [_pod("heteroflow-train-gang-node-0-0", "Running"),
               _pod("heteroflow-train-gang-node-0-1", "Pending", reason="Unschedulable",
                    message="0/4 nodes are available: 4 Insufficient nvidia.com/gpu")]
    seen: list[str] = []
    api = ScriptedCluster("TrainJob", ["Created"])
    with pytest.raises(DeviceUnavailable) as info:
        _run(launcher, api, "gang", pods=lambda ns, selector: seen.append(f"{ns} {selector}") or members)
    assert seen == ["ml jobset.sigs.k8s.io/jobset-name=heteroflow-train-gang"]
    assert "did not admit all 2 nodes of TrainJob heteroflow-train-gang within 0 s (1 of 2 pods Running; pod " \
           "heteroflow-train-gang-node-0-1 cannot be scheduled: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu)" in str(info.value)
    assert classify(info.value).cls is FailureClass.DEVICE and api.deleted == ["heteroflow-train-gang"]


def test_a_member_held_by_kueue_times_out_naming_the_queue(launcher: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """#28.16, on a PyTorchJob (the sibling kind): Running with one member held by Kueue."""
    profile = json.loads(__import__("os").environ[PROFILE_ENV])
    monkeypatch.setenv(PROFILE_ENV, json.dumps({**profile, "training_job": "pytorchjob", "queue": {"kueue": "team-a"}}))
    monkeypatch.setenv(GANG_WAIT_ENV, "0")
    members = [_pod("w-0", "Running"), _pod("w-1", "Pending", reason="SchedulingGated", queue="team-a")]
    with pytest.raises(DeviceUnavailable, match=r"1 of 2 pods Running; pod w-1 is held by Kueue in queue 'team-a' "
                                                r"\(SchedulingGated: kueue.x-k8s.io/admission\)") as info:
        _run(launcher, ScriptedCluster("PyTorchJob", ["Running"]), "kueue", pods=lambda ns, selector: members)
    assert classify(info.value).cls is FailureClass.DEVICE


def test_a_gang_whose_members_all_run_is_admitted_and_waited_for(launcher: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GANG_WAIT_ENV, "0")  # admitted at the first poll: the deadline no longer applies
    work = launcher["workdir"]("ok")
    _outcome(work, 0, status="succeeded", facts={"steps": 7})
    (work / "node-0" / "model").mkdir()
    (work / "node-0" / "model" / "model.pt").write_text("weights")
    members = [_pod("a", "Running"), _pod("b", "Running")]
    api = ScriptedCluster("TrainJob", ["Created", "Created", "Complete"])
    assert _run(launcher, api, "ok", pods=lambda ns, selector: members) == {"steps": 7}
    assert (launcher["model_dir"] / "model.pt").read_text() == "weights" and api.deleted == []


def test_pod_hold_and_gang_running() -> None:
    assert not gang_running([_pod("a", "Running")], 2) and gang_running([_pod("a", "Running"), _pod("b", "Succeeded")], 2)
    assert pod_hold(_pod("a", "Running")) is None
    assert pod_hold(_pod("g", "Pending", reason="SchedulingGated")) == (
        "pod g is held by a scheduling gate (no Kueue queue label) (SchedulingGated: kueue.x-k8s.io/admission)")
