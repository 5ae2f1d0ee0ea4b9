"""A mixed job (replicas of several device kinds) renders as one gang-scheduled Volcano Job (issue #29 item 6).

The renderings are checked against the Volcano CRD shipped in the project (unknown fields rejected) and the pod
templates against the core Kubernetes schema (kubernetes-validate); with a cluster (HETEROFLOW_TEST_KUBECONFIG and
Volcano installed) the API server itself checks the Job in a server-side dry run.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest

from heteroflow.cache.errors import InvalidCacheOption
from heteroflow.components.devices.cluster import ClusterProfile
from heteroflow.components.errors import InvalidResources
from heteroflow.components.training.mixed_job import (
    REPLICA_KIND_ENV,
    ROLES_ENV,
    RoleSpec,
    mixed_job_manifests,
    validate_volcano_job,
    volcano_mixed_job,
)

PROFILE = ClusterProfile.from_dict({
    "name": "mixed",
    "vendors": {"nvidia": {"labels": "gfd"}, "ascend": {"plugin": "official", "labels": "npu-chip-name"}},
    "queue": {"volcano": "research"},
    "images": {"gpu": "reg.example/hf:cuda", "npu": "reg.example/hf:cann8", "cpu": "reg.example/hf:cpu"},
    "shared_storage": {"claim": "hf-shared"},
})
ROLES = [
    RoleSpec("gpu", 2, "gpu:accelerator=a100-80gb,count=4,cpu=8,memory=64Gi"),
    RoleSpec("npu", 4, "npu:accelerator=ascend-910b3,count=8,cpu=16,memory=128Gi"),
]


def _env(task: dict[str, Any]) -> dict[str, str]:
    (container,) = task["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_two_gpu_and_four_npu_pods_render_as_one_gang_scheduled_volcano_job_with_a_task_per_kind() -> None:
    job = volcano_mixed_job("mix-a", ROLES, profile=PROFILE, command=("heteroflow", "step", "train", "--param", "epochs=3"))
    validate_volcano_job(job)  # also done inside; here against the CRD and the core schema explicitly

    assert (job["apiVersion"], job["kind"]) == ("batch.volcano.sh/v1alpha1", "Job")
    spec = job["spec"]
    assert spec["minAvailable"] == 6  # 2 + 4 pods: all or none start
    assert (spec["schedulerName"], spec["queue"]) == ("volcano", "research")
    assert set(spec["plugins"]) == {"svc", "env"}
    gpu, npu = spec["tasks"]
    assert [(t["name"], t["replicas"]) for t in (gpu, npu)] == [("gpu", 2), ("npu", 4)]

    # each task's pod asks for its kind: resources, node selection, tolerations and image from the kind and profile
    g, n = gpu["template"]["spec"], npu["template"]["spec"]
    assert g["containers"][0]["resources"]["limits"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"}
    assert n["containers"][0]["resources"]["limits"] == {"cpu": "16", "memory": "128Gi", "huawei.com/Ascend910": "8"}
    (term,) = g["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"
    assert "NVIDIA-A100-SXM4-80GB" in term["matchExpressions"][0]["values"]
    assert n["nodeSelector"] == {"node.kubernetes.io/npu.chip.name": "910B3"}
    assert [t["key"] for t in g["tolerations"]] == ["nvidia.com/gpu"]
    assert [t["key"] for t in n["tolerations"]] == ["huawei.com/Ascend910"]
    assert (g["containers"][0]["image"], n["containers"][0]["image"]) == ("reg.example/hf:cuda", "reg.example/hf:cann8")
    for s in (g, n):
        assert s["restartPolicy"] == "Never"
        assert s["volumes"][0]["persistentVolumeClaim"]["claimName"] == "hf-shared"
        # heteroflow's train step starts its kind's elastic agent itself: not under torchrun (it was wrapped)
        assert s["containers"][0]["command"] == ["heteroflow", "step", "train", "--param", "epochs=3"]

    # the rendezvous: one c10d endpoint on the first task's pod 0 (Volcano svc hostnames), elastic 1..6 agents
    envs = [_env(gpu), _env(npu)]
    for env in envs:
        assert env["PET_RDZV_BACKEND"] == "c10d"
        assert env["PET_RDZV_ENDPOINT"] == "mix-a-gpu-0.mix-a:29400"
        assert env["PET_RDZV_ID"] == "mix-a" and env["PET_NNODES"] == "1:6" and env["PET_MAX_RESTARTS"] == "3"
        assert json.loads(env[ROLES_ENV]) == [{"task": "gpu", "kind": "gpu", "replicas": 2, "devices": 4},
                                              {"task": "npu", "kind": "npu", "replicas": 4, "devices": 8}]
    assert [e["PET_NPROC_PER_NODE"] for e in envs] == ["4", "8"]
    assert [e[REPLICA_KIND_ENV] for e in envs] == ["gpu", "npu"]
    assert g["containers"][0]["ports"] == [{"name": "c10d", "containerPort": 29400, "protocol": "TCP"}]
    assert "ports" not in n["containers"][0]


def test_a_cpu_role_and_defaults_render_too_and_the_image_can_be_given_per_kind() -> None:
    job = volcano_mixed_job("mix-b", [RoleSpec("npu", 1), RoleSpec("cpu", 3, task="hosts")],
                            image={"npu": "a:npu", "cpu": "a:cpu"}, env={"HETEROFLOW_X": "1"}, port=29500,
                            max_restarts=0, torchrun=False, command=("my-launcher",), labels={"team": "ml"})
    npu, cpu = job["spec"]["tasks"]
    assert job["spec"]["minAvailable"] == 4 and "queue" not in job["spec"]  # the default profile names no queue
    assert job["metadata"] == {"name": "mix-b", "namespace": "default", "labels": {"team": "ml"}}
    assert cpu["name"] == "hosts" and cpu["replicas"] == 3
    c = cpu["template"]["spec"]["containers"][0]
    assert c["image"] == "a:cpu" and c["command"] == ["my-launcher"]
    assert not any(k.endswith("/gpu") or "Ascend" in k for k in c["resources"]["limits"])
    assert "tolerations" not in cpu["template"]["spec"]
    assert npu["template"]["spec"]["containers"][0]["resources"]["limits"]["huawei.com/Ascend910"] == "1"
    env = _env(cpu)
    assert env["PET_RDZV_ENDPOINT"] == "mix-b-npu-0.mix-b:29500" and env["PET_NPROC_PER_NODE"] == "1"
    assert env["PET_MAX_RESTARTS"] == "0" and env["HETEROFLOW_X"] == "1" and env[REPLICA_KIND_ENV] == "cpu"


def test_the_schema_checks_catch_a_broken_job() -> None:
    job = volcano_mixed_job("mix-c", ROLES, profile=PROFILE)
    typo = copy.deepcopy(job)
    typo["spec"]["minAvaliable"] = typo["spec"].pop("minAvailable")
    with pytest.raises(InvalidCacheOption, match="minAvaliable"):
        validate_volcano_job(typo)
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["tasks"][1]["replicas"] = "four"
    with pytest.raises(InvalidCacheOption, match=r"spec\.tasks\.1\.replicas"):
        validate_volcano_job(wrong_type)
    bad_env = copy.deepcopy(job)
    bad_env["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"][0]["valu"] = "x"
    with pytest.raises(InvalidCacheOption, match=r"containers\.0\.env\.0: .*'valu' was unexpected"):
        validate_volcano_job(bad_env)
    bad_meta = copy.deepcopy(job)
    bad_meta["spec"]["tasks"][1]["template"]["metadata"]["labelz"] = {"a": "b"}
    with pytest.raises(InvalidCacheOption, match=r"spec\.tasks\.1\.template\.metadata: .*'labelz' was unexpected"):
        validate_volcano_job(bad_meta)


@pytest.mark.parametrize(("roles", "kwargs", "message"), [
    ([], {}, r"roles=\[\]; valid: one or more RoleSpec"),
    ([RoleSpec("tpu", 1)], {}, r"roles\[0\]\.kind"),
    ([RoleSpec("gpu", 0)], {}, r"roles\[0\]\.replicas=0; valid: an integer >= 1"),
    ([RoleSpec("gpu", 1), RoleSpec("npu", 2, "gpu:count=1")], {}, r"roles\[1\]\.resources is a gpu candidate .*valid: one of kind npu"),
    ([RoleSpec("gpu", 1, "gpu:count=1,nodes=2")], {}, r"nodes=2; valid: nodes=1"),
    ([RoleSpec("gpu", 1), RoleSpec("gpu", 1, "gpu:accelerator=t4")], {}, r"two roles have the task name 'gpu'"),
    ([RoleSpec("gpu", 1, task="GPU")], {}, r"roles\[0\]\.task='GPU' is not a task name"),
    ([RoleSpec("gpu", 10)], {"name": "j" * 58}, r"pod hostname 'j+-gpu-9' has 64 characters; valid: <= 63"),
    ([RoleSpec("gpu", 1)], {"name": "Mixed_Job"}, r"name='Mixed_Job' is not a job name"),
    ([RoleSpec("gpu", 1)], {"port": 0}, r"port=0; valid: an integer 1..65535"),
    ([RoleSpec("gpu", 1)], {"image": None}, r"no image for the gpu role"),
    ([RoleSpec("gpu", 1)], {"torchrun": True}, r"torchrun=True around 'heteroflow step train': the train step starts its kind's "
                                               r"elastic agent itself \(worker mode\) and must not run under torchrun"),
    ([RoleSpec("gpu", 1)], {"torchrun": True, "command": ("python", "-m", "heteroflow", "step", "train")}, r"torchrun=True around"),
])
def test_bad_input_names_the_field_and_what_is_valid(roles: list[RoleSpec], kwargs: dict[str, Any], message: str) -> None:
    args = {"name": "mix-d", "image": "img", **kwargs}
    with pytest.raises(InvalidResources, match=message):
        volcano_mixed_job(args.pop("name"), roles, **args)


def _launched_job() -> dict[str, Any]:
    """The Job the train step's launcher creates (tests/test_mixed_launch.py): the store on its pod IP, the pods'
    outcomes under the job's folder on the shared storage."""
    from heteroflow.components.resources import Candidates
    from heteroflow.components.training.mixed_job import pod_command

    (mixed,) = Candidates(["gpu:count=2+npu:count=4"])
    workdir = "/mnt/heteroflow/jobs/heteroflow-mixed-abc"
    (job,) = mixed_job_manifests(mixed, name="heteroflow-mixed-abc", profile=PROFILE, endpoint="10.1.2.3:29400", workdir=workdir,
                                 command=pod_command(mixed, values={"epochs": 2}, workdir=workdir))
    return job


def test_a_launched_jobs_kind_failing_neither_fails_nor_restarts_it_and_it_completes_with_the_training() -> None:
    """Volcano's own rules (tests/volcano_rules.py, ported from v1.15.1) applied to the launcher's Job: the npu
    task's pods fail while the gpu pods train on; the job completes when the pod holding rank 0 succeeds."""
    from volcano_rules import action_for, running_phase

    job = _launched_job()
    validate_volcano_job(job)  # the CRD (minSuccess >= 1) and the pod templates
    spec = job["spec"]
    assert spec["minAvailable"] == 6 and spec["minSuccess"] == 1  # the gang stays all pods of all kinds
    assert "policies" not in spec and all("policies" not in t for t in spec["tasks"])
    for task in ("gpu", "npu"):  # a failed pod stays Failed, an evicted one is recreated: nothing restarts the job
        assert action_for(job, task, "PodFailed") == action_for(job, task, "PodEvicted") == "SyncJob"
    assert running_phase(job, {}, {"npu": 4}) == "Running"  # npu dropped out; the gpu pods train on
    assert running_phase(job, {"gpu": 1}, {"npu": 4}) == "Completed"  # the pod holding rank 0 succeeded
    assert running_phase(job, {"gpu": 1}, {}) == "Completed"  # no kind dropped: the same
    assert running_phase(job, {}, {"gpu": 2, "npu": 4}) == "Failed"  # every pod failed: the training did
    # as rendered before: a job-level PodEvicted -> RestartJob and no minSuccess, so the task minAvailable (its
    # replicas, the webhook's default) failed the whole job although the gpu pods finished the training
    before = {**job, "spec": {**{k: v for k, v in spec.items() if k != "minSuccess"},
                              "policies": [{"event": "PodEvicted", "action": "RestartJob"}]}}
    assert running_phase(before, {"gpu": 2}, {"npu": 4}) == "Failed"
    assert action_for(before, "npu", "PodEvicted") == "RestartJob"


def test_the_default_command_runs_as_is_and_another_command_under_torchrun_once_per_device() -> None:
    """A new user's trial: volcano_mixed_job's defaults (the README's way) wrapped heteroflow step train in torchrun,
    which the train step must not run under; heteroflow manifests rendered it plain."""
    job = volcano_mixed_job("mix", ROLES, profile=PROFILE)
    assert {t["template"]["spec"]["containers"][0]["command"][0] for t in job["spec"]["tasks"]} == {"heteroflow"}
    assert job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"] == ["heteroflow", "step", "train"]
    worker = volcano_mixed_job("mix", ROLES, profile=PROFILE, command=("python", "worker.py"))
    assert worker["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["command"] == [
        "python", "-m", "torch.distributed.run", "--no-python", "python", "worker.py"]
    plain = volcano_mixed_job("mix", ROLES, profile=PROFILE, command=("python", "worker.py"), torchrun=False)
    assert plain["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["command"] == ["python", "worker.py"]


def test_a_job_rendered_alone_restarts_when_a_pod_is_evicted_as_its_first_pod_hosts_the_store() -> None:
    from volcano_rules import action_for

    job = volcano_mixed_job("mix", ROLES, profile=PROFILE)
    assert action_for(job, "npu", "PodEvicted") == "RestartJob" and action_for(job, "npu", "PodFailed") == "SyncJob"
    assert "minSuccess" not in job["spec"]  # its workers exit as they finish: the first would end the job


@pytest.mark.skipif(not os.environ.get("HETEROFLOW_TEST_KUBECONFIG"),
                    reason="needs a cluster with Volcano installed: set HETEROFLOW_TEST_KUBECONFIG=FILE "
                           "(the Job is created in a server-side dry run, nothing runs)")
def test_on_a_real_cluster_the_api_server_accepts_the_job_in_a_dry_run() -> None:
    kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client (k8s extra) talks to the cluster")
    kubernetes.config.load_kube_config(os.environ["HETEROFLOW_TEST_KUBECONFIG"])
    namespace = os.environ.get("HETEROFLOW_NAMESPACE", "default")
    job = volcano_mixed_job("heteroflow-mixed-dry-run", ROLES, profile=PROFILE, namespace=namespace)
    api = kubernetes.client.CustomObjectsApi()
    created = api.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", namespace, "jobs", job, dry_run="All")
    assert created["spec"]["minAvailable"] == 6
    assert [t["name"] for t in created["spec"]["tasks"]] == ["gpu", "npu"]
    launched = _launched_job()  # the launcher's: minSuccess 1 and no policies pass Volcano's admission webhook too
    launched["metadata"]["namespace"] = namespace
    created = api.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", namespace, "jobs", launched, dry_run="All")
    assert created["spec"]["minSuccess"] == 1


def test_the_readmes_mixed_job_snippet_renders_the_supported_command() -> None:
    """README, "Mixed jobs on a cluster": its volcano_mixed_job snippet, run as written, renders the train step as each
    pod's command as is (it rendered `python -m torch.distributed.run --no-python heteroflow step train`), as
    `heteroflow manifests` does."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Mixed jobs on a cluster"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None and "volcano_mixed_job(" in snippet[1]
    scope: dict[str, Any] = {}
    exec(snippet[1], scope)  # noqa: S102 - our own README
    job = scope["job"]
    assert [t["template"]["spec"]["containers"][0]["command"] for t in job["spec"]["tasks"]] == [["heteroflow", "step", "train"]] * 2
    env = {e["name"]: e["value"] for e in job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ENDPOINT"] == "mix-gpu-0.mix:29400" and env["PET_NNODES"] == "1:6"  # as the README says
    assert job["spec"]["minAvailable"] == 6
