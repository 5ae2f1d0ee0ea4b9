"""A mixed job's Volcano pods train on this machine (issue #29, worker mode and the store outside the kinds).

The job is rendered as the launcher renders it (``mixed_job_manifests`` with the launcher's endpoint and the job's
folder on the shared storage); each pod's environment and command are taken from the manifest as the kubelet
would run them (``$(VAR)`` expanded, the downward-API pod name filled in), only the endpoint's host rewritten to
127.0.0.1; this test's process hosts the c10d store as the launcher does (``host_store``), and each pod is a local
subprocess (the kinds simulated on the CPU). The job trains, the pod holding rank 0 writes the model on the shared
storage, and its weights are the local mixed run's with the same global batch (the trajectory property, 1e-5).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from heteroflow.components.devices.cluster import ClusterProfile
from heteroflow.components.resources import Candidates
from heteroflow.components.training.mixed_job import POD_NAME_ENV, mixed_job_manifests, pod_command
from heteroflow.components.training.mixed_launch import host_store, pod_ip, read_job_outcome

TOL = 1e-5  # as tests/test_mixed_trajectory.py
VALUES = {"epochs": 1, "batch_size": 128, "seed": 5, "hidden_units": 16}


def _expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion of a container's command (a defined variable only; ``$$`` escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


@pytest.mark.slow
def test_the_volcano_jobs_pods_train_on_the_launchers_store_and_match_the_local_mixed_run(
        digits_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"  # the ReadWriteMany claim's mount on every pod
    profile = ClusterProfile.from_dict({"name": "mixed", "images": {"gpu": "hf:cuda", "npu": "hf:cann8"},
                                        "shared_storage": {"claim": "hf-shared", "mount_path": str(shared)}})
    (cand,) = Candidates(["gpu:count=1+npu:count=1"])
    name = "mix-local"
    workdir = shared / "jobs" / name
    shutil.copytree(digits_shards, workdir / "shards")  # what the launcher copies
    values = {**VALUES, "checkpoint_root": str(shared / "checkpoints")}

    store = host_store(0)  # the launcher's process hosts the store: no pod (no kind) does
    endpoint = f"{pod_ip({'POD_IP': '10.1.2.3'})}:{store.port}"
    (job,) = mixed_job_manifests(cand, name=name, command=pod_command(cand, values=values, workdir=str(workdir)),
                                 profile=profile, endpoint=endpoint, workdir=str(workdir))
    assert job["spec"]["minAvailable"] == 2

    heteroflow = str(Path(sys.executable).with_name("heteroflow"))
    base = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    base.update(HETEROFLOW_SIMULATE_DEVICES="gpu,npu@0.5", HETEROFLOW_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    procs = []
    for task in job["spec"]["tasks"]:
        (container,) = task["template"]["spec"]["containers"]
        for index in range(task["replicas"]):
            env = {**base, **{e["name"]: e["value"] for e in container["env"] if "value" in e}}
            assert env["PET_RDZV_ENDPOINT"] == f"10.1.2.3:{store.port}" and env["PET_RDZV_CONF"] == "is_host=false"
            env["PET_RDZV_ENDPOINT"] = f"127.0.0.1:{store.port}"  # the only rewrite: this machine is the cluster
            env[POD_NAME_ENV] = f"{name}-{task['name']}-{index}"  # the downward API's metadata.name
            env["VC_TASK_INDEX"] = str(index)  # Volcano's env plugin
            argv = [_expand(a, env) for a in container["command"]]
            assert argv[:3] == ["heteroflow", "step", "train"]
            procs.append(subprocess.Popen([heteroflow, *argv[1:]], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True))
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(log[-3000:] for log in logs)

    facts, failure = read_job_outcome(workdir)
    assert failure is None and facts is not None
    outcomes = sorted(p.name for p in (workdir / "pods").iterdir())
    assert outcomes == ["mix-local-gpu-0", "mix-local-npu-0"]  # each pod's own outcome and metrics
    assert sorted(facts["mixed"]["kinds"]) == ["gpu", "npu"] and facts["mixed"]["writer"] is True
    assert facts["steps"] == (1257 // 128)  # digits' train split, one epoch, last partial batch dropped
    assert (workdir / "model" / "model.pt").is_file()  # the pod holding rank 0 wrote the model on the shared storage
    assert not any((shared / "checkpoints").glob("*/mixed-checkpoint.pt"))  # finished: its checkpoints removed
    cluster = torch.load(workdir / "model" / "model.pt", weights_only=True)

    # the local mixed run (one agent per kind on this process's store) with the same global batch
    from heteroflow.components.training.step import train

    monkeypatch.setenv("HETEROFLOW_SIMULATE_DEVICES", "gpu,npu@0.5")
    monkeypatch.setenv("HETEROFLOW_HOME", str(tmp_path / "home-local"))
    local = train(dataset_dir=str(digits_shards), model_dir=str(tmp_path / "local-model"), resources=cand,
                  checkpoint_root=str(tmp_path / "local-ckpt"), **VALUES)
    reference = torch.load(Path(local.model_dir) / "model.pt", weights_only=True)
    assert local.steps == facts["steps"]
    assert reference.keys() == cluster.keys()
    assert max(float((reference[k] - cluster[k]).abs().max()) for k in reference) <= TOL
    del store
