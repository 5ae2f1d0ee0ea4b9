"""A multi-node train (a candidate with ``nodes > 1``): the launcher (heteroflow.components.training.trainjob), the nodes'
rendezvous (heteroflow.components.training.distributed.node_role / launch(nodes=...)), and the job's manifests.

- On CPU, for real: two ``heteroflow step train`` processes as the two nodes of a job (the environment a TrainJob's
  operator sets), gloo over the loopback, a shared checkpoint folder; their model equals one process's.
- The launcher against ``LocalOperator``, a **test double** of ``kubernetes.client.CustomObjectsApi`` (named as
  such: no Kubernetes runs here) that plays the operator: it starts each pod's command as a local process with the
  operator's ``PET_*`` variables and ``$(VAR)`` expanded, and reports the job's conditions.
- Against a real cluster with the Kubeflow Trainer: ``HETEROFLOW_TEST_KUBECONFIG`` (skipped otherwise).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from heteroflow.components.training.distributed import NODES_ENV, free_port, node_role
from heteroflow.components.errors import DeviceUnavailable, InvalidParameter
from heteroflow.components.resources import Resources
from heteroflow.components.training.trainjob import (
    PROFILE_ENV,
    JobPermanentFailure,
    JobTransientFailure,
    job_command,
    job_status,
    run_training_job,
)

TWO_NODES = "gpu:count=1,nodes=2"


def test_nodes_is_a_candidate_field_with_a_clear_error() -> None:
    r = Resources.parse_spec("gpu:count=8,nodes=2")
    assert r.nodes == 2 and "on each of 2 nodes" in r.describe()
    assert Resources.from_dict(r.to_dict()) == r and "nodes" not in Resources.parse_spec("gpu").to_dict()
    for bad, match in (("gpu:nodes=0", "nodes=0 is not a node count; valid: an integer >= 1"),
                       ("gpu:nodes=two", "nodes='two' .* valid: a whole number of nodes")):
        with pytest.raises(Exception, match=match):
            Resources.parse_spec(bad)


def test_node_role_reads_the_trainer_and_the_training_operator_variables() -> None:
    assert node_role({}) is None
    assert node_role({"PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "a"}) is None
    trainer = node_role({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"})
    assert (trainer.nodes, trainer.node_rank, trainer.master_addr, trainer.master_port) == (2, 1, "job-node-0-0.job", 29400)
    operator_v1 = node_role({NODES_ENV: "3", "RANK": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"})
    assert (operator_v1.nodes, operator_v1.node_rank, operator_v1.master_port) == (3, 2, 23456)
    with pytest.raises(InvalidParameter, match=r"PET_NODE_RANK=2 is out of range for 2 nodes; valid: 0 \.\. 1"):
        node_role({"PET_NNODES": "2", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "a", "PET_MASTER_PORT": "1"})
    with pytest.raises(InvalidParameter, match="MASTER_PORT='x' is not a number"):
        node_role({NODES_ENV: "2", "RANK": "0", "MASTER_ADDR": "a", "MASTER_PORT": "x"})


@pytest.mark.parametrize(
    ("obj", "phase"),
    [
        ({"kind": "TrainJob"}, "pending"),
        ({"kind": "TrainJob", "status": {"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended"}]}}, "pending"),
        ({"kind": "TrainJob", "status": {"conditions": [{"type": "Suspended", "status": "False"}, {"type": "Created", "status": "True"}]}}, "running"),
        ({"kind": "TrainJob", "status": {"conditions": [{"type": "Complete", "status": "True"}]}}, "succeeded"),
        ({"kind": "TrainJob", "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}, "failed"),
        ({"kind": "PyTorchJob", "status": {"conditions": [{"type": "Created", "status": "True"}]}}, "pending"),
        ({"kind": "PyTorchJob", "status": {"conditions": [{"type": "Running", "status": "True"}]}}, "running"),
        ({"kind": "PyTorchJob", "status": {"conditions": [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}]}}, "succeeded"),
        ({"kind": "PyTorchJob", "status": {"conditions": [{"type": "Failed", "status": "True"}]}}, "failed"),
    ],
)
def test_job_status_from_the_conditions(obj: dict[str, Any], phase: str) -> None:
    assert job_status(obj).phase == phase


def _profile(tmp_path: Path, training_job: str = "trainjob", **extra: Any) -> dict[str, Any]:
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    return {"name": "test", "training_job": training_job, "images": {"gpu": "registry.example.com/heteroflow:cuda"},
            "shared_storage": {"claim": "heteroflow-shared", "mount_path": str(shared)}, **extra}


@pytest.mark.parametrize("training_job", ["trainjob", "pytorchjob"])
def test_the_job_mounts_the_shared_claim_and_runs_the_step_on_each_node_and_validates(tmp_path: Path, training_job: str) -> None:
    from heteroflow.components.devices.cluster import ClusterProfile
    from heteroflow.pipelines.k8s.manifests import training_job_manifests, validate

    profile = ClusterProfile.from_dict(_profile(tmp_path, training_job, queue={"volcano": "training"}))
    cmd = job_command(call="train", candidate=Resources.parse_spec(TWO_NODES), values={"epochs": 2, "deterministic": True},
                      workdir="/mnt/x/jobs/j", training_job=training_job)
    var = "RANK" if training_job == "pytorchjob" else "PET_NODE_RANK"
    assert f"model=/mnt/x/jobs/j/node-$({var})/model" in cmd and "deterministic=true" in cmd
    docs = training_job_manifests(TWO_NODES, workers=2, name="heteroflow-train-abc", command=cmd, profile=profile,
                                  labels={"heteroflow.io/call": "train"})
    for doc in docs:
        validate(doc)  # the shipped CRD schemas, unknown fields rejected; PyTorchJob pods also as core PodTemplates
    job = docs[-1]
    text = json.dumps(job)
    assert '"claimName": "heteroflow-shared"' in text and f'"mountPath": "{tmp_path / "shared"}"' in text
    assert f'"name": "{NODES_ENV}", "value": "2"' in text and job["metadata"]["labels"]["heteroflow.io/call"] == "train"
    if training_job == "trainjob":
        assert [d["kind"] for d in docs] == ["PodGroup", "TrainJob"] and docs[0]["spec"]["minMember"] == 2
    else:
        assert [d["kind"] for d in docs] == ["PyTorchJob"] and job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 2


def test_bad_shared_storage_in_a_profile_names_the_field() -> None:
    from heteroflow.components.devices.cluster import ClusterProfile, InvalidProfile

    with pytest.raises(InvalidProfile, match="shared_storage.claim='Not_A_Name' is not a PersistentVolumeClaim name"):
        ClusterProfile.from_dict({"shared_storage": {"claim": "Not_A_Name"}})
    with pytest.raises(InvalidProfile, match="shared_storage.mount_path='data' is not absolute"):
        ClusterProfile.from_dict({"shared_storage": {"claim": "a", "mount_path": "data"}})


def test_without_a_cluster_a_multi_node_candidate_is_a_device_failure_that_says_what_is_missing(digits_shards: Path, tmp_path: Path,
                                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """So the step falls back to its next candidate (not a permanent failure that ends the run)."""
    from heteroflow.components.core.failures import FailureClass, classify
    from heteroflow.components.training.step import train

    for var in ("KUBERNETES_SERVICE_HOST", "HETEROFLOW_KUBECONFIG", "PET_NNODES", NODES_ENV):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(DeviceUnavailable, match="needs a Kubernetes cluster with the Kubeflow Trainer") as info:
        train(digits_shards, tmp_path / "m", resources=Resources.parse_spec(TWO_NODES))
    assert classify(info.value).cls is FailureClass.DEVICE and not (tmp_path / "m").exists()
    monkeypatch.setenv("HETEROFLOW_KUBECONFIG", str(tmp_path / "kubeconfig"))  # credentials, but no profile
    with pytest.raises(DeviceUnavailable, match=f"no cluster profile reached this task \\({PROFILE_ENV} unset\\)"):
        run_training_job(Resources.parse_spec(TWO_NODES), call="train", dataset_dir=digits_shards, model_dir=tmp_path / "m",
                         values={}, key="k", api=object())
    monkeypatch.setenv(PROFILE_ENV, json.dumps({"name": "nfs-less"}))
    with pytest.raises(DeviceUnavailable, match="names no shared_storage; add shared_storage"):
        run_training_job(Resources.parse_spec(TWO_NODES), call="train", dataset_dir=digits_shards, model_dir=tmp_path / "m",
                         values={}, key="k", api=object())


@pytest.mark.slow
def test_the_plan_passes_over_a_multi_node_candidate_without_a_cluster(digits_dir: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "HETEROFLOW_KUBECONFIG", "PET_NNODES", NODES_ENV)}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("heteroflow")), "run", "--simulate-devices", "gpu", "-c", TWO_NODES, "-c", "cpu",
         "--param", "epochs=1", "--dataset", str(digits_dir)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        env={**env, "HETEROFLOW_HOME": str(tmp_path / "home"), "COLUMNS": "120"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (run,) = (tmp_path / "heteroflow-runs").iterdir()
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "succeeded" and record["results"]["train"]["device_kind"] == "cpu", json.dumps(record)[:3000]
    # the plan step passes over it, saying why (without a planner, train's device failure falls back: above)
    (why,) = record["placement"]["train"]["passed_over"]
    assert "needs 2 nodes: a Kubernetes cluster with the Kubeflow Trainer" in why


# --- two nodes on this machine, for real ---------------------------------------------------------------------


def _node_env(rank: int, port: int, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"PET_NNODES": "2", "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port),
                "PET_NPROC_PER_NODE": "1", "HETEROFLOW_SIMULATE_DEVICES": "gpu", "HETEROFLOW_HOME": str(home),
                "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])})
    return env


def _expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' ``$(VAR)`` expansion of a container's command from its environment."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]


@pytest.mark.slow
def test_two_nodes_train_like_one_process(digits_shards: Path, tmp_path: Path) -> None:
    """Two ``heteroflow step train`` processes with a TrainJob's node environment (simulated gpu, one device
    each: a 2-rank gloo group over the loopback) share a checkpoint folder; both write the model of one process
    with the same batch size (1e-6), the first node's outcome says 2 processes."""
    from heteroflow.components.training.step import train

    params = {"epochs": 2, "batch_size": 64, "checkpoint_every_steps": 10, "deterministic": True,
              "checkpoint_root": str(tmp_path / "shared-ckpt")}
    single = train(digits_shards, tmp_path / "one", **{**params, "checkpoint_root": str(tmp_path / "ck1")})
    workdir = tmp_path / "job"
    (workdir).mkdir()
    (workdir / "shards").symlink_to(digits_shards)
    cmd = job_command(call="train", candidate=Resources.parse_spec(TWO_NODES), values=params, workdir=str(workdir),
                      training_job="trainjob")
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = _node_env(rank, port, tmp_path / "home")
        argv = _expand(cmd, env)
        argv[0] = str(Path(sys.executable).with_name("heteroflow"))
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-3000:] for o in outs]
    w1 = torch.load(tmp_path / "one" / "model.pt", weights_only=True)
    for rank in (0, 1):
        w2 = torch.load(workdir / f"node-{rank}" / "model" / "model.pt", weights_only=True)
        assert all(torch.allclose(w1[k], w2[k], atol=1e-6, rtol=0) for k in w1), {k: float((w1[k] - w2[k]).abs().max()) for k in w1}
    facts = json.loads((workdir / "node-0" / "outcome.json").read_text())["facts"]
    assert facts["processes"] == 2 and facts["steps"] == single.steps
    assert not (tmp_path / "shared-ckpt").exists() or not any((tmp_path / "shared-ckpt").iterdir())  # node 0 removed it


# --- the launcher, against a test double of the cluster -------------------------------------------------------


class LocalOperator:
    """TEST DOUBLE of ``kubernetes.client.CustomObjectsApi`` for a cluster with Volcano and the Kubeflow Trainer:
    ``create`` of a TrainJob starts one local process per node running the trainer's command (``$(VAR)``
    expanded from the operator's ``PET_*`` variables and the trainer's env); ``get`` reports ``Complete`` or
    ``Failed`` once they end. ``admit=False`` never admits the gang (the job stays ``Suspended``)."""

    def __init__(self, home: Path, *, admit: bool = True, fail_node: int | None = None) -> None:
        self.home, self.admit, self.fail_node = home, admit, fail_node
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]) -> None:
        self.created.append(body)
        if body["kind"] != "TrainJob" or not self.admit:
            return
        trainer = body["spec"]["trainer"]
        port = free_port()
        for rank in range(trainer["numNodes"]):
            env = _node_env(rank, port, self.home)
            env.update({e["name"]: e["value"] for e in trainer["env"]})
            argv = _expand(trainer["command"], env)
            argv[0] = str(Path(sys.executable).with_name("heteroflow"))
            if rank == self.fail_node:
                argv = [sys.executable, "-c", "import sys; sys.exit(137)"]  # a pod lost without an outcome
            self.procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str) -> dict[str, Any]:
        if not self.admit:
            return {"kind": "TrainJob", "status": {"conditions": [{"type": "Suspended", "status": "True", "reason": "gang not admitted"}]}}
        codes = [p.poll() for p in self.procs]
        if any(c not in (None, 0) for c in codes):
            for p in self.procs:
                p.kill()
            return {"kind": "TrainJob", "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailed"}]}}
        if all(c == 0 for c in codes):
            return {"kind": "TrainJob", "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
        return {"kind": "TrainJob", "status": {"conditions": [{"type": "Created", "status": "True"}]}}

    def delete_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str) -> None:
        self.deleted.append(name)


def _launcher_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **profile: Any) -> None:
    monkeypatch.setenv(PROFILE_ENV, json.dumps(_profile(tmp_path, **profile)))
    monkeypatch.setenv("HETEROFLOW_NAMESPACE", "ml")
    for var in ("PET_NNODES", NODES_ENV):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.slow
def test_the_launcher_submits_the_gang_waits_and_returns_node_0s_model(digits_shards: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.training.step import train

    _launcher_env(tmp_path, monkeypatch, queue={"volcano": "training"})
    operator = LocalOperator(tmp_path / "home")
    import heteroflow.components.training.trainjob as trainjob

    monkeypatch.setattr(trainjob, "_cluster", lambda environ, what: operator)
    monkeypatch.setattr(trainjob, "POLL_SECONDS", 0.2)
    kwargs: dict[str, Any] = dict(epochs=2, batch_size=64, deterministic=True)
    result = train(digits_shards, tmp_path / "model", resources=Resources.parse_spec(TWO_NODES), **kwargs)
    single = train(digits_shards, tmp_path / "one", checkpoint_root=str(tmp_path / "ck1"), **kwargs)
    assert [b["kind"] for b in operator.created] == ["PodGroup", "TrainJob"]
    assert operator.created[1]["metadata"]["namespace"] == "ml" and operator.created[0]["spec"]["queue"] == "training"
    assert result.processes == 2 and result.steps == single.steps and result.history
    w1 = torch.load(tmp_path / "one" / "model.pt", weights_only=True)
    w2 = torch.load(tmp_path / "model" / "model.pt", weights_only=True)  # node 0's, copied into the step's output
    assert all(torch.allclose(w1[k], w2[k], atol=1e-6, rtol=0) for k in w1)
    assert (tmp_path / "model" / "model.json").is_file() and not list(tmp_path.glob(".model.partial-*"))


def failing_loop(ctx: Any) -> None:
    """A training function with a bug of the user's: a permanent failure, on every node."""
    raise ValueError("label column 'y' holds strings")


@pytest.mark.slow
def test_a_lost_pod_is_transient_a_bug_permanent_and_a_gang_never_admitted_falls_back(
        digits_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import heteroflow.components.training.trainjob as trainjob
    from heteroflow.components.core.failures import FailureClass, classify

    _launcher_env(tmp_path, monkeypatch)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    two = Resources.parse_spec(TWO_NODES)
    lost = LocalOperator(tmp_path / "home", fail_node=1)
    with pytest.raises(JobTransientFailure, match="failed \\(PodFailed\\); a retry resubmits it") as info:
        run_training_job(two, call="train", dataset_dir=digits_shards, model_dir=tmp_path / "m", values={"epochs": 1},
                         key="lost", api=lost, poll_seconds=0.2)
    assert classify(info.value).cls is FailureClass.TRANSIENT and not (tmp_path / "m").exists()
    buggy = LocalOperator(tmp_path / "home")
    with pytest.raises(JobPermanentFailure, match="label column 'y' holds strings") as info2:
        run_training_job(two, call="train", dataset_dir=digits_shards, model_dir=tmp_path / "m",
                         values={"epochs": 1, "train_function": "test_trainjob:failing_loop"}, key="bug", api=buggy, poll_seconds=0.2)
    assert classify(info2.value).cls is FailureClass.PERMANENT
    monkeypatch.setenv(trainjob.GANG_WAIT_ENV, "0.5")
    never = LocalOperator(tmp_path / "home", admit=False)
    with pytest.raises(DeviceUnavailable, match="did not admit all 2 nodes of TrainJob .* within 0.5 s \\(gang not admitted\\)"):
        run_training_job(two, call="train", dataset_dir=digits_shards, model_dir=tmp_path / "m", values={"epochs": 1},
                         key="never", api=never, poll_seconds=0.1)
    assert never.deleted == ["heteroflow-train-never"]  # the TrainJob (no Volcano queue in this profile: no PodGroup)


@pytest.mark.skipif(not os.environ.get("HETEROFLOW_TEST_KUBECONFIG"),
                    reason="needs a cluster with the Kubeflow Trainer, 2 GPU nodes and a ReadWriteMany claim: set "
                           "HETEROFLOW_TEST_KUBECONFIG=FILE, HETEROFLOW_CLUSTER_PROFILE (JSON with shared_storage, images) "
                           "and mount the claim here")
def test_on_a_real_cluster_the_job_trains_and_the_model_comes_back(digits_shards: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.training.step import train

    monkeypatch.setenv("HETEROFLOW_KUBECONFIG", os.environ["HETEROFLOW_TEST_KUBECONFIG"])
    result = train(digits_shards, tmp_path / "model", epochs=1, resources=Resources.parse_spec(TWO_NODES))
    assert result.processes == 2 and (tmp_path / "model" / "model.pt").is_file()


# --- the renderings: a multi-node candidate's task is the job's launcher ------------------------------------------


def _two_node_pipeline() -> Any:
    from heteroflow.components.resources import Candidates
    from heteroflow.pipelines.default import default_pipeline

    return default_pipeline(train_candidates=Candidates(["gpu:count=8,nodes=2,cpu=8,memory=32Gi", "cpu"]))


def test_kfp_renders_the_launcher_task_cpu_only_with_the_profile_and_the_shared_claim(tmp_path: Path) -> None:
    import yaml

    from heteroflow.components.devices.cluster import ClusterProfile
    from heteroflow.pipelines.kfp.render import compile_pipeline

    profile = ClusterProfile.from_dict({"name": "mn", "shared_storage": {"claim": "heteroflow-shared"}, "images": {"gpu": "img:cuda"}})
    out = compile_pipeline(_two_node_pipeline(), tmp_path / "p.yaml", profile=profile)
    spec, platform = list(yaml.safe_load_all(out.read_text()))
    containers = [e["container"] for e in spec["deploymentSpec"]["executors"].values() if "container" in e]  # not importers
    launchers = [c for c in containers if any(v.get("name") == PROFILE_ENV for v in c.get("env", []))]
    assert len(launchers) == 1  # the 2-node candidate's task only
    launcher = launchers[0]
    assert "accelerator" not in launcher["resources"] and launcher["resources"]["resourceCpuRequest"] == "1"
    (env,) = [v for v in launcher["env"] if v["name"] == PROFILE_ENV]
    assert ClusterProfile.from_dict(json.loads(env["value"])) == profile  # the launcher renders the job from it
    mounts = [e.get("pvcMount") for e in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values()]
    assert [m[0]["mountPath"] for m in mounts if m] == ["/mnt/heteroflow"]  # the launcher only


def test_airflow_pods_render_the_launcher_with_the_profile_and_the_shared_claim(tmp_path: Path) -> None:
    pytest.importorskip("airflow.providers.cncf.kubernetes", reason="the airflow extra is not installed")
    import yaml
    from kubernetes import client

    from heteroflow.dags.factory import build_dag
    from heteroflow.dags.pods import PodStepOperator

    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"name": "mn", "shared_storage": {"claim": "heteroflow-shared"},
                                       "images": {"cpu": "img:cpu", "gpu": "img:cuda"}}))
    kube = tmp_path / "kubeconfig"
    kube.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: n, cluster: {server: 'https://127.0.0.1:9'}}]\n"
                    "users: [{name: n, user: {}}]\ncontexts: [{name: n, context: {cluster: n, user: n}}]\ncurrent-context: n\n")
    dag = build_dag(_two_node_pipeline(), "hf-mn", mode="kubernetes", profile=profile, run_root="/mnt/runs",
                    pod_kwargs={"namespace": "ml", "in_cluster": False, "config_file": str(kube)})
    api = client.ApiClient()
    pods = {t.task_id: api.sanitize_for_serialization(t.build_pod_request_obj()) for t in dag.tasks if isinstance(t, PodStepOperator)}
    launcher = pods["train.gpu-0"]
    container = launcher["spec"]["containers"][0]  # the step (the xcom sidecar beside it)
    assert container["image"] == "img:cpu" and "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert any(e["name"] == PROFILE_ENV for e in container["env"]) and any(e["name"] == "HETEROFLOW_RUN_ID" for e in container["env"])
    assert "/mnt/heteroflow" in [m["mountPath"] for m in container["volumeMounts"]]
    claims = lambda pod: [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"].get("volumes") or [] if "persistentVolumeClaim" in v]  # noqa: E731
    assert claims(launcher) == ["heteroflow-shared"] and claims(pods["train.cpu-1"]) == []


@pytest.mark.parametrize(("replicas", "index"), [(2, 0), (1, 1)])
def test_on_a_node_inventory_a_multi_node_candidate_needs_a_gang_of_its_nodes(tmp_path: Path, replicas: int, index: int) -> None:
    """The plan step with a node inventory asks for nodes x count devices of one model (a gang across nodes): two
    8-GPU nodes hold gpu:count=8,nodes=2; one does not, and the plan takes the next candidate."""
    from heteroflow.components.placement.plan import plan_step
    from heteroflow.components.resources import Candidates

    inventory = f"nodes:\n  - {{name: a100, replicas: {replicas}, devices: {{model: a100-80gb, count: 8}}}}\n  - {{name: cpu, cpu: 32, memory: 128Gi}}\n"
    result = plan_step(str(tmp_path / "placement"), device_inventory=inventory,
                       placements=json.dumps({"train": Candidates(["gpu:accelerator=a100-80gb,count=8,nodes=2", "cpu"]).to_json()}))
    assert result.indices["train"] == index
    if index == 0:
        assert len(result.placements["train"]["nodes"]) == 2


# --- what a new user's trial found ------------------------------------------------------------------------------


def test_compiling_a_multi_node_candidate_for_a_cluster_without_shared_storage_warns(tmp_path: Path) -> None:
    from heteroflow.components.devices.cluster import ClusterProfile
    from heteroflow.components.training.trainjob import MultiNodeWarning
    from heteroflow.pipelines.kfp.render import compile_pipeline

    with pytest.warns(MultiNodeWarning, match="names no shared_storage, so its train task cannot launch the job"):
        compile_pipeline(_two_node_pipeline(), tmp_path / "a.yaml", profile=ClusterProfile.from_dict({"name": "nfs-less"}))
    with pytest.warns(MultiNodeWarning, match="no cluster profile was given"):
        compile_pipeline(_two_node_pipeline(), tmp_path / "b.yaml")
    with pytest.raises(Exception, match=r"shared_storage has no claim; valid: shared_storage: \{claim: NAME"):
        ClusterProfile.from_dict({"shared_storage": {"mount_path": "/mnt/x"}})


def test_a_planned_call_with_one_candidate_waits_for_the_plan(tmp_path: Path) -> None:
    """With one train candidate no fallback level reads the plan's route: train still reads it (and does not start
    beside a plan that fails)."""
    import yaml

    from heteroflow.components.resources import Candidates
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.kfp.render import compile_pipeline

    out = compile_pipeline(default_pipeline(train_candidates=Candidates(["cpu"])), tmp_path / "one.yaml")
    root = next(yaml.safe_load_all(out.read_text()))["root"]["dag"]["tasks"]
    train = root["train"]
    assert "plan" in train["dependentTasks"]
    assert train["inputs"]["parameters"]["heteroflow_after_plan"]["taskOutputParameter"]["producerTask"] == "plan"


@pytest.mark.slow
def test_batch_sizes_for_another_number_of_workers_says_it_splits_the_union_evenly(digits_shards: Path, tmp_path: Path,
                                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    from heteroflow.components.training.step import train

    result = train(digits_shards, tmp_path / "m", epochs=1, batch_sizes="64,32", checkpoint_root=str(tmp_path / "ck"))
    assert result.batch_size == 96 and result.steps == -(-1259 // 96) and result.processes == 1
    assert "batch_sizes lists 2 size(s) for 1 worker(s) on this candidate: each optimizer step takes the union batch of 96" in capfd.readouterr().err
