"""A mixed job's Volcano pods train on this machine (issue #29, worker mode and the store outside the kinds).

The job is rendered as the launcher renders it (``mixed_job_manifests`` with the launcher's endpoint and the job's
folder on the shared storage); each pod's environment and command are taken from the manifest as the kubelet
would run them (``$(VAR)`` expanded, the downward-API pod name filled in), only the endpoint's host rewritten to
127.0.0.1; this test's process hosts the c10d store as the launcher does (``host_store``), and each pod is a local
subprocess (the kinds simulated on the CPU). The job trains, the pod holding rank 0 writes the model on the shared
storage, and its weights are the local mixed run's with the same global batch (the trajectory property, 1e-5).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from heteroflow.components.resources import Candidates
from heteroflow.components.training.mixed_job import POD_NAME_ENV, validate_volcano_job
from heteroflow.components.training.mixed_launch import PORT_ENV, read_job_outcome
from heteroflow.components.training.trainjob import PROFILE_ENV

TOL = 1e-5  # as tests/test_mixed_trajectory.py
VALUES = {"epochs": 1, "batch_size": 128, "seed": 5, "hidden_units": 16}


def _expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion of a container's command (a defined variable only; ``$$`` escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


class LocalVolcano:
    """The Kubernetes API as the launcher uses it, on this machine: a created Volcano Job's pods start as local
    processes with each task's environment and command from the manifest (``$(VAR)`` expanded as the kubelet does,
    the downward-API pod name and Volcano's ``VC_TASK_INDEX`` filled in), only the endpoint's host rewritten to
    127.0.0.1; its phase follows Volcano's own rules from the pods' exits (tests/volcano_rules.py: a failed pod's
    action must be SyncJob, the phase is runningState's), and a finished job kills the pods still running, as
    Volcano's finished state does (``killed``)."""

    def __init__(self, env: dict[str, str], rdzv_conf: str = "") -> None:
        self.env, self.rdzv_conf, self.created, self.procs, self.logs = env, rdzv_conf, [], [], []
        self.tasks: list[str] = []
        self.pods: list[str] = []
        self.killed: list[str] = []
        self.phase = "Running"

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, body: dict) -> None:
        assert (group, version, plural) == ("batch.volcano.sh", "v1alpha1", "jobs")
        validate_volcano_job(body)
        self.created.append(body)
        name = body["metadata"]["name"]
        heteroflow = str(Path(sys.executable).with_name("heteroflow"))
        for task in body["spec"]["tasks"]:
            (container,) = task["template"]["spec"]["containers"]
            for index in range(task["replicas"]):
                env = {**self.env, **{e["name"]: e["value"] for e in container["env"] if "value" in e}}
                host, _, port = env["PET_RDZV_ENDPOINT"].rpartition(":")
                env["PET_RDZV_ENDPOINT"] = f"127.0.0.1:{port}"  # the only rewrite: this machine is the cluster
                if self.rdzv_conf:  # (the drop-out test: a shorter wait for a dropped agent than a cluster's 30 s)
                    env["PET_RDZV_CONF"] += "," + self.rdzv_conf
                env[POD_NAME_ENV] = f"{name}-{task['name']}-{index}"  # the downward API's metadata.name
                env["VC_TASK_INDEX"] = str(index)  # Volcano's env plugin
                argv = [_expand(a, env) for a in container["command"]]
                assert argv[:3] == ["heteroflow", "step", "train"]
                log = open(Path(self.env["HETEROFLOW_HOME"]) / f"{env[POD_NAME_ENV]}.log", "w+")  # noqa: SIM115
                self.logs.append(log)
                self.procs.append(subprocess.Popen([heteroflow, *argv[1:]], env=env, stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL))
                self.tasks.append(task["name"])
                self.pods.append(env[POD_NAME_ENV])

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str) -> dict:
        from collections import Counter

        from volcano_rules import action_for, running_phase

        job = self.created[-1]
        ok: Counter[str] = Counter()
        bad: Counter[str] = Counter()
        for task, proc in zip(self.tasks, self.procs):
            code = proc.poll()
            if code == 0:
                ok[task] += 1
            elif code is not None:
                bad[task] += 1
                action = action_for(job, task, "PodFailed")
                assert action == "SyncJob", f"Volcano would {action} the job when a pod of task {task} fails"
        if self.phase == "Running":
            self.phase = running_phase(job, ok, bad)
            if self.phase != "Running":  # finished: Volcano kills the pods still running
                for pod, proc in zip(self.pods, self.procs):
                    if proc.poll() is None:
                        proc.terminate()
                        self.killed.append(pod)
        counts = {t: {"phase": {"Succeeded": ok[t], "Failed": bad[t]}} for t in dict.fromkeys(self.tasks)}
        return {"status": {"state": {"phase": self.phase}, "taskStatusCount": counts}}

    def delete_namespaced_custom_object(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("the launcher deleted a job it should have waited for")

    def output(self) -> str:
        out = []
        for log in self.logs:
            log.seek(0)
            out.append(log.read()[-3000:])
        return "\n\n".join(out)


def _cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rdzv_conf: str = "", **pod_env: str) -> LocalVolcano:
    """This process as the launcher (a KFP task's pod: the cluster profile with ``<tmp>/shared`` as the shared
    storage's mount, its IP from the downward API, any free store port) and the cluster it talks to."""
    import heteroflow.components.training.trainjob as trainjob

    shared = tmp_path / "shared"
    shared.mkdir()
    profile = {"name": "mixed", "images": {"gpu": "hf:cuda", "npu": "hf:cann8"},
               "shared_storage": {"claim": "hf-shared", "mount_path": str(shared)}}
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HETEROFLOW_SIMULATE_DEVICES", "gpu,npu@0.5")
    monkeypatch.setenv("HETEROFLOW_HOME", str(home))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # the kubelet sets it in every pod
    cluster = LocalVolcano({**os.environ, **pod_env}, rdzv_conf)
    monkeypatch.setenv(PROFILE_ENV, json.dumps(profile))
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    monkeypatch.setenv(PORT_ENV, "0")
    monkeypatch.setenv("HETEROFLOW_NAMESPACE", "ml")
    monkeypatch.setattr(trainjob, "_cluster", lambda environ, what: cluster)
    monkeypatch.setattr("heteroflow.components.training.mixed_launch.POLL_SECONDS", 0.2)
    return cluster


@pytest.mark.slow
def test_the_launcher_hosts_the_store_and_the_volcano_jobs_pods_train_in_worker_mode_as_the_local_mixed_run(
        digits_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.training.step import train

    shared = tmp_path / "shared"  # the ReadWriteMany claim's mount, on the launcher's pod and every pod of the job
    (cand,) = Candidates(["gpu:count=1+npu:count=1"])
    cluster = _cluster(tmp_path, monkeypatch)
    try:
        launched = train(dataset_dir=str(digits_shards), model_dir=str(tmp_path / "model"), resources=cand, **VALUES)
    finally:
        for proc in cluster.procs:
            proc.kill() if proc.poll() is None else None
    (job,) = cluster.created
    # Volcano calls the job Completed at its first succeeded pod: the other pod waited for the writer's outcome
    # and exited too, or was killed by the finished job after that outcome was recorded
    assert cluster.phase == "Completed" and job["spec"]["minSuccess"] == 1, cluster.output()
    writer = cluster.pods.index(launched.mixed["pod"])
    assert cluster.procs[writer].returncode == 0, cluster.output()
    assert all(p.returncode == 0 or pod in cluster.killed for pod, p in zip(cluster.pods, cluster.procs)), cluster.output()
    assert job["metadata"]["namespace"] == "ml" and job["spec"]["minAvailable"] == 2
    envs = [{e["name"]: e.get("value") for e in t["template"]["spec"]["containers"][0]["env"]} for t in job["spec"]["tasks"]]
    assert {e["PET_RDZV_ENDPOINT"].rpartition(":")[0] for e in envs} == {"10.1.2.3"}  # the launcher's pod IP
    assert all(e["PET_RDZV_CONF"] == "is_host=false" for e in envs)  # no pod, so no kind, hosts the store
    workdir = shared / "jobs" / job["metadata"]["name"]
    facts, failure = read_job_outcome(workdir)
    assert failure is None and facts is not None and facts["mixed"]["writer"] is True
    # the writer's outcome folder, and the other pod's where it ended before the finished job killed it
    outcomes = {p.name for p in (workdir / "pods").iterdir()}
    assert launched.mixed["pod"] in outcomes and outcomes <= set(cluster.pods)
    assert (workdir / "model" / "model.pt").is_file()  # the pod holding rank 0 wrote the model on the shared storage
    assert not any((shared / "checkpoints").glob("*/mixed-checkpoint.pt"))  # finished: its checkpoints removed
    assert sorted(launched.mixed["kinds"]) == ["gpu", "npu"] and launched.steps == facts["steps"] > 0
    weights = torch.load(tmp_path / "model" / "model.pt", weights_only=True)  # copied into the launcher's output

    # the local mixed run (one agent per kind on this process's store) with the same global batch
    for var in ("KUBERNETES_SERVICE_HOST", PROFILE_ENV):
        monkeypatch.delenv(var)
    local = train(dataset_dir=str(digits_shards), model_dir=str(tmp_path / "local-model"), resources=cand,
                  checkpoint_root=str(tmp_path / "local-ckpt"), **VALUES)
    reference = torch.load(tmp_path / "local-model" / "model.pt", weights_only=True)
    assert local.steps == launched.steps and reference.keys() == weights.keys()
    assert max(float((reference[k] - weights[k]).abs().max()) for k in reference) <= TOL


@pytest.mark.slow
def test_when_the_first_tasks_kind_drops_out_the_store_stays_and_the_other_kind_finishes(
        digits_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The npu task comes first (rendered alone, its pod 0 would host the store): its replica fails on its device
    after 3 steps; its pod fails with a device failure, the gpu pod's agent re-forms the group on the launcher's
    store, resumes from the checkpoint at step 2 and writes the model; the launcher reports npu as dropped."""
    from heteroflow.components.training.step import train

    (cand,) = Candidates(["npu:count=1+gpu:count=1"])
    # torchrun's --rdzv-conf options in the pods' PET_RDZV_CONF: the npu pod's agent found dead after 5 missed 1-s
    # heartbeats, as a local job's (torch's default, 3 x 5 s, held the gpu pod 10 s longer), a 3-s wait for it to come back
    cluster = _cluster(tmp_path, monkeypatch, rdzv_conf="last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=5",
                       HETEROFLOW_INJECT_FAULT="train@npu=device:after_steps=3")
    try:
        launched = train(dataset_dir=str(digits_shards), model_dir=str(tmp_path / "model"), resources=cand,
                         checkpoint_every_steps=2, **VALUES)
    finally:
        for proc in cluster.procs:
            proc.kill() if proc.poll() is None else None
    assert [p.returncode for p in cluster.procs] == [4, 0], cluster.output()  # npu: device failure (exit 4); gpu: done
    assert cluster.phase == "Completed"  # Volcano's own rules: the npu task's failure did not fail the job
    (job,) = cluster.created
    assert [t["name"] for t in job["spec"]["tasks"]] == ["npu", "gpu"]
    # an epoch of 1,257 samples: 9 global batches of 128 and a last one of 105, as a single-kind run trains
    assert launched.resumed_from_step == 2 and launched.steps == -(-1257 // VALUES["batch_size"]) == 10
    assert launched.mixed["kinds"] == ["gpu"] and launched.mixed["writer"] is True
    assert [(d["kind"], d.get("task")) for d in launched.mixed["dropped"]] == [("npu", "npu")]  # its Volcano task named
    assert "device" in launched.mixed["dropped"][0]["reason"].lower()
    assert (tmp_path / "model" / "model.pt").is_file()
