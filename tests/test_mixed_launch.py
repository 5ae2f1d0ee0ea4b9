"""The launcher of a mixed job on a cluster and its pods' worker mode (issue #29): the train step's task hosts the
c10d store and points every pod of the Volcano Job at its pod IP; no task (no kind) hosts the store; the job is
valid against the Volcano CRD; what is missing (credentials, profile, image, the Volcano API, permission, a
reachable IP) is a device failure that says what to do. The whole launch runs in tests/test_mixed_cluster_local.py;
with a cluster (HETEROFLOW_TEST_KUBECONFIG, Volcano installed) the last test submits a real job.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from heteroflow.components.core.failures import FailureClass, classify
from heteroflow.components.devices.cluster import ClusterProfile
from heteroflow.components.errors import DeviceUnavailable, InvalidParameter, InvalidResources
from heteroflow.components.resources import Candidates
from heteroflow.components.training.mixed_job import (
    OUTPUT_ENV,
    POD_NAME_ENV,
    REPLICA_KIND_ENV,
    mixed_job_manifests,
    pod_command,
    validate_volcano_job,
)
from heteroflow.components.training.mixed_launch import (
    PORT_ENV,
    in_launcher_pod,
    job_phase,
    launch_mixed_job,
    pod_ip,
    pod_rendezvous,
    read_job_outcome,
)
from heteroflow.components.training.trainjob import PROFILE_ENV

(MIXED,) = Candidates(["gpu:count=2+npu:count=1"])


def _profile(mount: Path | str = "/mnt/heteroflow", **extra: Any) -> dict[str, Any]:
    return {"name": "mixed", "vendors": {"nvidia": {"labels": "gfd"}, "ascend": {"plugin": "official", "labels": "npu-chip-name"}},
            "images": {"gpu": "reg.example/hf:cuda", "npu": "reg.example/hf:cann8"}, "queue": {"volcano": "research"},
            "shared_storage": {"claim": "hf-shared", "mount_path": str(mount)}, **extra}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _launcher_job(endpoint: str = "10.1.2.3:29400", env: dict[str, str] | None = None) -> dict[str, Any]:
    workdir = "/mnt/heteroflow/jobs/heteroflow-mixed-abc"
    (job,) = mixed_job_manifests(MIXED, name="heteroflow-mixed-abc", profile=ClusterProfile.from_dict(_profile()),
                                 command=pod_command(MIXED, values={"epochs": 2, "deterministic": True}, workdir=workdir),
                                 endpoint=endpoint, workdir=workdir, env=env)
    return job


def test_the_launchers_job_points_every_pod_at_its_pod_ip_and_no_task_hosts_the_store() -> None:
    endpoint = f"{pod_ip({'POD_IP': '10.1.2.3'})}:29400"
    job = _launcher_job(endpoint)
    validate_volcano_job(job)  # the Volcano CRD (unknown fields rejected) and each pod template (kubernetes-validate)
    assert job["spec"]["minAvailable"] == 3 and [(t["name"], t["replicas"]) for t in job["spec"]["tasks"]] == [("gpu", 2), ("npu", 1)]
    workdir = "/mnt/heteroflow/jobs/heteroflow-mixed-abc"
    for task in job["spec"]["tasks"]:
        (c,) = task["template"]["spec"]["containers"]
        env = _env(c)
        assert env["PET_RDZV_ENDPOINT"] == "10.1.2.3:29400" and env["PET_RDZV_CONF"] == "is_host=false"
        assert "ports" not in c  # no pod opens the store's port: the launcher's pod hosts it
        assert env[REPLICA_KIND_ENV] == task["name"] and env["PET_NNODES"] == "1:3" and env[OUTPUT_ENV] == workdir
        assert env[POD_NAME_ENV] == {"fieldRef": {"fieldPath": "metadata.name"}}
        # the train step itself, not under torchrun; the model on the shared storage, each pod's own outcome
        assert c["command"][:3] == ["heteroflow", "step", "train"] and "torch.distributed.run" not in c["command"]
        assert f"model={workdir}/model" in c["command"] and f"{workdir}/pods/$({POD_NAME_ENV})/outcome.json" in c["command"]
        assert "deterministic=true" in c["command"] and f"shards={workdir}/shards" in c["command"]
        assert c["volumeMounts"] == [{"name": "heteroflow-shared", "mountPath": "/mnt/heteroflow"}]
        assert task["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "hf-shared"
    # without a launcher (heteroflow manifests, kubectl create) the first task's pod 0 hosts it, as before
    (plain,) = mixed_job_manifests(MIXED, name="mix", profile=ClusterProfile.from_dict(_profile()))
    first = plain["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    assert _env(first)["PET_RDZV_ENDPOINT"] == "mix-gpu-0.mix:29400" and "PET_RDZV_CONF" not in _env(first) and first["ports"]


def test_a_pod_of_the_job_reads_its_rendezvous_from_the_rendered_environment() -> None:
    job = _launcher_job()
    npu = _env(job["spec"]["tasks"][1]["template"]["spec"]["containers"][0])
    pod = {k: v for k, v in npu.items() if isinstance(v, str)} | {POD_NAME_ENV: "heteroflow-mixed-abc-npu-0"}
    rdzv = pod_rendezvous(pod)
    assert rdzv == {"kind": "npu", "endpoint": "10.1.2.3:29400", "run_id": "heteroflow-mixed-abc", "max_nodes": 3,
                    "max_restarts": 3, "is_host": False, "nproc": 1, "last_call_timeout": 30.0, "rdzv_configs": {},
                    "pod": "heteroflow-mixed-abc-npu-0"}
    assert pod_rendezvous({k: v for k, v in pod.items() if k != "PET_RDZV_CONF"})["is_host"] is None  # torch decides
    assert pod_rendezvous({}) is None and pod_rendezvous({"PET_RDZV_ENDPOINT": "x:1"}) is None  # not a mixed job's pod
    with pytest.raises(InvalidParameter, match="under torchrun .*without `python -m torch.distributed.run`"):
        pod_rendezvous({**pod, "TORCHELASTIC_RUN_ID": "r"})
    with pytest.raises(InvalidParameter, match=r"PET_NNODES='x'; valid: an integer >= 1"):
        pod_rendezvous({**pod, "PET_NNODES": "1:x"})
    with pytest.raises(InvalidParameter, match="PET_RDZV_CONF is_host='maybe'; valid: true or false"):
        pod_rendezvous({**pod, "PET_RDZV_CONF": "is_host=maybe"})


def test_a_pods_rdzv_conf_options_reach_its_agent_as_torchruns_do_and_a_bad_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's ``--rdzv-conf`` passes every c10d option to the rendezvous handler; a pod read ``is_host`` and
    ``last_call_timeout`` only and dropped the rest without a word (``keep_alive_interval=1`` left torch's 5 s x 3
    heartbeats: a dropped kind found dead after 15 s). A value that is not an integer was a bare ValueError
    (``last_call_timeout=abc``), an unknown key was ignored."""
    job = _launcher_job()
    npu = _env(job["spec"]["tasks"][1]["template"]["spec"]["containers"][0])
    pod = {k: v for k, v in npu.items() if isinstance(v, str)} | {POD_NAME_ENV: "heteroflow-mixed-abc-npu-0"}
    conf = "is_host=false,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=900,last_call_timeout=5"
    rdzv = pod_rendezvous({**pod, "PET_RDZV_CONF": conf})
    assert rdzv["rdzv_configs"] == {"keep_alive_interval": 1, "keep_alive_max_attempt": 3, "join_timeout": 900, "last_call_timeout": 5}
    assert rdzv["last_call_timeout"] == 5.0 and rdzv["is_host"] is False
    with pytest.raises(InvalidParameter, match=r"^PET_RDZV_CONF last_call_timeout='abc'; valid: an integer >= 1$"):
        pod_rendezvous({**pod, "PET_RDZV_CONF": "last_call_timeout=abc"})
    with pytest.raises(InvalidParameter, match=r"^PET_RDZV_CONF keep_alive_max_attempt='0'; valid: an integer >= 1$"):
        pod_rendezvous({**pod, "PET_RDZV_CONF": "keep_alive_max_attempt=0"})
    with pytest.raises(InvalidParameter, match=r"^PET_RDZV_CONF names keepalive_interval \(did you mean 'keep_alive_interval'\?\); "
                                               r"valid: is_host, join_timeout, last_call_timeout, close_timeout, heartbeat_timeout, "
                                               r"keep_alive_interval, keep_alive_max_attempt \(torch's c10d rendezvous options\)$"):
        pod_rendezvous({**pod, "PET_RDZV_CONF": "is_host=false,keepalive_interval=1"})
    # a caller's PET_RDZV_CONF reaches the rendered pods beside the rendering's is_host=false (theirs replaced it)
    stated = _launcher_job(env={"PET_RDZV_CONF": "keep_alive_interval=1,is_host=true,keep_alive_max_attempt=5"})
    confs = {_env(t["template"]["spec"]["containers"][0])["PET_RDZV_CONF"] for t in stated["spec"]["tasks"]}
    assert confs == {"is_host=false,keep_alive_interval=1,keep_alive_max_attempt=5"}
    (plain,) = mixed_job_manifests(MIXED, name="mix", profile=ClusterProfile.from_dict(_profile()), env={"PET_RDZV_CONF": "join_timeout=900"})
    assert {_env(t["template"]["spec"]["containers"][0])["PET_RDZV_CONF"] for t in plain["spec"]["tasks"]} == {"join_timeout=900"}
    # and run_mixed hands them to the kind's agent (its config file), as it does is_host and max_nodes
    from heteroflow.components.training import mixed
    from heteroflow.components.training.worker import WorkerError

    written: list[dict] = []

    class Agent:  # stands in for the agent's process: records its config and ends at once, with no result
        def __init__(self, argv: list[str], **_: Any) -> None:
            written.append(json.loads(Path(argv[-1]).read_text()))
            self.pid, self.stderr = os.getpid(), None

        def poll(self) -> int:
            return 0

    job = mixed.MixedJob(model="mixed_models:mlp", data="mixed_models:digits", global_batch=8, learning_rate=0.1, max_steps=1)
    monkeypatch.setattr(mixed.subprocess, "Popen", Agent)
    with pytest.raises(WorkerError, match="without rank 0's result"):
        mixed.run_mixed(job, [mixed.ReplicaGroup("npu", 1)], rendezvous=rdzv, last_call_timeout=rdzv["last_call_timeout"], say=lambda line: None)
    (cfg,) = written
    assert cfg["rdzv_configs"] == rdzv["rdzv_configs"] and cfg["is_host"] is False and cfg["pod"] is True


def test_the_launcher_is_only_an_in_cluster_task_with_a_profile() -> None:
    task = {PROFILE_ENV: json.dumps(_profile()), "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert in_launcher_pod(task)
    assert not in_launcher_pod({PROFILE_ENV: task[PROFILE_ENV]})  # kfp.local / Airflow locally: trains here
    assert not in_launcher_pod({**task, REPLICA_KIND_ENV: "gpu"})  # a pod of the job itself: worker mode


def test_the_pod_ip_comes_from_the_downward_api_and_a_loopback_address_is_refused() -> None:
    assert pod_ip({"POD_IP": "10.244.1.7"}) == "10.244.1.7"
    with pytest.raises(DeviceUnavailable, match=r"\(POD_IP=127\.0\.0\.5\); valid: set POD_IP .*fieldPath: status\.podIP"):
        pod_ip({"POD_IP": "127.0.0.5"})


def test_job_phases_and_the_pods_outcomes(tmp_path: Path) -> None:
    assert job_phase({}) == ("pending", "Pending")
    assert job_phase({"status": {"state": {"phase": "Running"}}}) == ("running", "Running")
    assert job_phase({"status": {"state": {"phase": "Completed"}}}) == ("succeeded", "Completed")
    assert job_phase({"status": {"state": {"phase": "Aborted"}}}) == ("failed", "Aborted")

    def outcome(pod: str, **data: Any) -> None:
        (tmp_path / "pods" / pod).mkdir(parents=True)
        (tmp_path / "pods" / pod / "outcome.json").write_text(json.dumps(data))

    assert read_job_outcome(tmp_path) == (None, None)
    outcome("j-gpu-0", status="failed", failure="device", reason="gpu gone")
    outcome("j-gpu-1", status="succeeded", facts={"steps": 9, "mixed": {"writer": False}})
    # no pod held rank 0 to the end; the failure names the Volcano task (the kind) and the pod
    assert read_job_outcome(tmp_path) == (None, ("device", "Volcano task gpu, pod j-gpu-0: gpu gone"))
    outcome("j-npu-0", status="failed", failure="permanent", reason="a bug")
    outcome("j-npu-1", status="succeeded", facts={"steps": 9, "resumed_from_step": 4, "mixed": {"writer": True, "dropped": []}})
    facts, worst = read_job_outcome(tmp_path, {"cpu": 1})  # Volcano counts a failed cpu pod that wrote no outcome
    assert worst == ("permanent", "Volcano task npu, pod j-npu-0: a bug")
    # the writer's facts, with each kind whose task's pod failed as a kind that dropped out, once per kind
    assert facts == {"steps": 9, "resumed_from_step": 4, "mixed": {"writer": True, "dropped": [
        {"kind": "gpu", "task": "gpu", "pod": "j-gpu-0", "step": None, "reason": "device failure: gpu gone", "resumed_from_step": 4},
        {"kind": "npu", "task": "npu", "pod": "j-npu-0", "step": None, "reason": "permanent failure: a bug", "resumed_from_step": 4},
        {"kind": "cpu", "task": "cpu", "pod": None, "step": None, "resumed_from_step": 4,
         "reason": "1 pod(s) of Volcano task cpu failed without an outcome (killed: out of memory, a lost node?)"}]}}
    # a task name with a dash, read against the job's name (the folder's)
    job = tmp_path / "heteroflow-mixed-abc"
    (job / "pods" / "heteroflow-mixed-abc-npu-v2-1").mkdir(parents=True)
    (job / "pods" / "heteroflow-mixed-abc-npu-v2-1" / "outcome.json").write_text(json.dumps({"status": "failed", "failure": "device", "reason": "x"}))
    assert read_job_outcome(job)[1] == ("device", "Volcano task npu-v2, pod heteroflow-mixed-abc-npu-v2-1: x")


def test_the_endpoint_is_host_and_port_an_ipv6_address_in_brackets() -> None:
    (job,) = mixed_job_manifests(MIXED, name="m", image="img", endpoint="[fd00::2]:29400")
    assert _env(job["spec"]["tasks"][1]["template"]["spec"]["containers"][0])["PET_RDZV_ENDPOINT"] == "[fd00::2]:29400"
    with pytest.raises(InvalidResources, match=r"endpoint='10\.1\.2\.3'; valid: HOST:PORT of the launcher's c10d store"):
        mixed_job_manifests(MIXED, name="m", image="img", endpoint="10.1.2.3")


def test_a_workdir_must_lie_on_the_shared_storage() -> None:
    with pytest.raises(InvalidResources, match="workdir='/tmp/x' is not on the shared storage; valid: a folder under /mnt/heteroflow"):
        mixed_job_manifests(MIXED, name="m", profile=ClusterProfile.from_dict(_profile()), workdir="/tmp/x")
    bare = {k: v for k, v in _profile().items() if k != "shared_storage"}
    with pytest.raises(InvalidResources, match="needs shared storage every pod mounts; valid: a cluster profile with shared_storage"):
        mixed_job_manifests(MIXED, name="m", profile=ClusterProfile.from_dict(bare), workdir="/mnt/heteroflow/jobs/m")


class _Api(http.server.BaseHTTPRequestHandler):
    """A Kubernetes API server that answers every request with one HTTP status (a kube-apiserver ``Status``)."""

    status = 404
    requests: list[tuple[str, str]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        type(self).requests.append((self.command, self.path))
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": self.status,
                           "reason": {404: "NotFound", 403: "Forbidden"}.get(self.status, "")}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(("status", "message"), [
    (404, r"no Volcano Job API \(jobs\.batch\.volcano\.sh/v1alpha1 not found\); install Volcano"),
    (403, r"may not create jobs\.batch\.volcano\.sh in namespace ml \(HTTP 403\); grant it a Role with verbs create, get, delete"),
])
def test_a_cluster_without_volcano_or_without_permission_is_a_device_failure_saying_what_to_do(
        tmp_path: Path, status: int, message: str) -> None:
    """The real kubernetes client against an API server that answers 404 (no such CRD) or 403 (RBAC)."""
    from kubernetes import client

    handler = type("Api", (_Api,), {"status": status, "requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = client.Configuration()
        config.host = f"http://127.0.0.1:{server.server_address[1]}"
        api = client.CustomObjectsApi(client.ApiClient(config))
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "meta.json").write_text("{}")
        environ = {PROFILE_ENV: json.dumps(_profile(tmp_path / "mnt")), "POD_IP": "10.1.2.3", PORT_ENV: "0", "HETEROFLOW_NAMESPACE": "ml"}
        (tmp_path / "mnt").mkdir()
        with pytest.raises(DeviceUnavailable, match=message) as info:
            launch_mixed_job(MIXED, dataset_dir=tmp_path / "data", model_dir=tmp_path / "model", values={"epochs": 1},
                             key="abcdef", environ=environ, api=api)
    finally:
        server.shutdown()
    assert classify(info.value).cls is FailureClass.DEVICE  # the step falls back to its next candidate
    assert handler.requests[0] == ("POST", "/apis/batch.volcano.sh/v1alpha1/namespaces/ml/jobs")
    assert not (tmp_path / "model").exists()


def test_what_the_launcher_lacks_is_named(tmp_path: Path) -> None:
    no_cluster: dict[str, str] = {}
    with pytest.raises(DeviceUnavailable, match="HETEROFLOW_KUBECONFIG unset"):
        launch_mixed_job(MIXED, dataset_dir=tmp_path, model_dir=tmp_path / "m", values={}, key="k", environ=no_cluster)
    with pytest.raises(DeviceUnavailable, match="HETEROFLOW_CLUSTER_PROFILE unset"):
        launch_mixed_job(MIXED, dataset_dir=tmp_path, model_dir=tmp_path / "m", values={}, key="k", environ={}, api=object())
    (tmp_path / "mnt").mkdir()
    no_npu_image = _profile(tmp_path / "mnt", images={"gpu": "reg.example/hf:cuda"})
    with pytest.raises(DeviceUnavailable, match="names no image for npu; add images.<kind>"):
        launch_mixed_job(MIXED, dataset_dir=tmp_path, model_dir=tmp_path / "m", values={}, key="k",
                         environ={PROFILE_ENV: json.dumps(no_npu_image)}, api=object())


@pytest.mark.skipif(not (os.environ.get("HETEROFLOW_TEST_KUBECONFIG") and os.environ.get("HETEROFLOW_TEST_MIXED_PROFILE")),
                    reason="needs a cluster with Volcano and the kinds' devices: set HETEROFLOW_TEST_KUBECONFIG=FILE, "
                           "HETEROFLOW_TEST_MIXED_PROFILE=FILE (a cluster profile, JSON, with shared_storage mounted here and "
                           "images per kind), POD_IP=an address of this machine the cluster's pods reach, and optionally "
                           "HETEROFLOW_TEST_MIXED_CANDIDATE (default gpu:count=1+npu:count=1)")
def test_on_a_real_cluster_the_launcher_runs_a_mixed_job_to_completion(digits_shards: Path, tmp_path: Path) -> None:
    (cand,) = Candidates([os.environ.get("HETEROFLOW_TEST_MIXED_CANDIDATE", "gpu:count=1+npu:count=1")])
    environ = {**os.environ, "HETEROFLOW_KUBECONFIG": os.environ["HETEROFLOW_TEST_KUBECONFIG"],
               PROFILE_ENV: Path(os.environ["HETEROFLOW_TEST_MIXED_PROFILE"]).read_text(encoding="utf-8")}
    facts = launch_mixed_job(cand, dataset_dir=digits_shards, model_dir=tmp_path / "model", values={"epochs": 1, "batch_size": 64},
                             key=os.urandom(6).hex(), environ=environ, say=print)
    assert facts["mixed"]["writer"] is True and sorted(set(facts["mixed"]["kinds"])) == sorted(cand.kinds)
    assert (tmp_path / "model" / "model.pt").is_file() and facts["steps"] > 0


class _FakeVolcano:
    """The Volcano Job API as the launcher uses it: on create, the job's pods 'run' (``pods``: pod -> its outcome,
    written under the job's folder as the pods write them, the writer's model too); every read returns the next of
    ``phases`` (the last repeats) with ``taskStatusCount``."""

    def __init__(self, pods: dict[str, dict[str, Any]], phases: list[str], counts: dict[str, dict[str, int]]) -> None:
        self.pods, self.phases, self.counts, self.created, self.deleted = pods, phases, counts, [], []

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, body: dict) -> None:
        validate_volcano_job(body)
        self.created.append(body)
        workdir = Path(_env(body["spec"]["tasks"][0]["template"]["spec"]["containers"][0])[OUTPUT_ENV])
        for pod, outcome in self.pods.items():
            (workdir / "pods" / pod).mkdir(parents=True)
            (workdir / "pods" / pod / "outcome.json").write_text(json.dumps(outcome))
            if (outcome.get("facts") or {}).get("mixed", {}).get("writer"):
                (workdir / "model").mkdir()
                (workdir / "model" / "model.pt").write_bytes(b"weights")

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str) -> dict:
        phase = self.phases.pop(0) if len(self.phases) > 1 else self.phases[0]
        return {"status": {"state": {"phase": phase}, "taskStatusCount": {t: {"phase": c} for t, c in self.counts.items()}}}

    def delete_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str, **kwargs: Any) -> None:
        self.deleted.append(name)


def _launch(tmp_path: Path, api: _FakeVolcano, gang_wait: str = "60", **kwargs: Any) -> tuple[dict[str, Any], list[str]]:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.json").write_text("{}")
    (tmp_path / "mnt").mkdir()
    environ = {PROFILE_ENV: json.dumps(_profile(tmp_path / "mnt")), "POD_IP": "10.1.2.3", PORT_ENV: "0", "HETEROFLOW_NAMESPACE": "ml",
               "HETEROFLOW_GANG_WAIT_SECONDS": gang_wait}
    lines: list[str] = []
    facts = launch_mixed_job(MIXED, dataset_dir=tmp_path / "data", model_dir=tmp_path / "model", values={"epochs": 1}, key="abcdef",
                             environ=environ, api=api, poll_seconds=0.01, say=lines.append, **kwargs)
    return facts, lines


WRITER = {"status": "succeeded", "facts": {"steps": 9, "resumed_from_step": 4, "mixed": {"writer": True, "kinds": ["gpu", "gpu"], "dropped": []}}}


def test_when_a_kinds_task_fails_the_launcher_says_which_and_returns_the_writers_model(tmp_path: Path) -> None:
    api = _FakeVolcano({"heteroflow-mixed-abcdef-gpu-0": WRITER,
                        "heteroflow-mixed-abcdef-npu-0": {"status": "failed", "failure": "device", "reason": "npu 0 lost"}},
                       ["Pending", "Running", "Completed"], {"gpu": {"Succeeded": 1, "Running": 1}, "npu": {"Failed": 1}})
    facts, lines = _launch(tmp_path, api)
    (job,) = api.created
    assert job["spec"]["minSuccess"] == 1 and "policies" not in job["spec"]
    assert facts["mixed"]["dropped"] == [{"kind": "npu", "task": "npu", "pod": "heteroflow-mixed-abcdef-npu-0", "step": None,
                                          "reason": "device failure: npu 0 lost", "resumed_from_step": 4}]
    assert "train: Volcano task npu (kind npu) failed, pod heteroflow-mixed-abcdef-npu-0: device failure: npu 0 lost; the other " \
           "kinds trained on and resumed from step 4" in lines, lines
    assert (tmp_path / "model" / "model.pt").read_bytes() == b"weights" and not api.deleted
    from heteroflow.components.training.mixed_step import mixed_facts_lines

    assert "train: kind npu dropped out, its Volcano task npu failed (pod heteroflow-mixed-abcdef-npu-0) (device failure: " \
           "npu 0 lost); the others resumed from step 4" in mixed_facts_lines(facts["mixed"])
    from heteroflow.pipelines.runs.mixed_section import mixed_section

    html = mixed_section({"results": {"train": {"mixed": facts["mixed"]}}})  # the run report's section
    assert "kind <b>npu</b> dropped out, its Volcano task <b>npu</b> failed (pod heteroflow-mixed-abcdef-npu-0) " \
           "(device failure: npu 0 lost); the others resumed from step 4" in html, html


def test_a_job_back_to_pending_after_it_ran_is_not_a_gang_timeout_and_ends_once_the_writer_recorded(tmp_path: Path) -> None:
    """A pod recreated after an eviction that the gang cannot place keeps the job Pending (Volcano's pending state
    never completes it): the launcher, past the gang's wait, does not give up on the running training, and once the
    pod holding rank 0 recorded its outcome it deletes the job after the grace and returns the model."""
    api = _FakeVolcano({"heteroflow-mixed-abcdef-gpu-0": WRITER}, ["Running", "Pending"], {"gpu": {"Succeeded": 1}})
    facts, lines = _launch(tmp_path, api, gang_wait="0", finish_grace=0.05)
    assert api.deleted == ["heteroflow-mixed-abcdef"] and facts["steps"] == 9
    assert any("recorded its outcome 0.05 s ago and Volcano Job heteroflow-mixed-abcdef is still Pending; deleting it" in line
               for line in lines), lines


def test_when_every_task_fails_the_error_names_the_tasks(tmp_path: Path) -> None:
    api = _FakeVolcano({"heteroflow-mixed-abcdef-gpu-0": {"status": "failed", "failure": "device", "reason": "gpu 0 lost"}},
                       ["Running", "Failed"], {"gpu": {"Failed": 2}, "npu": {"Failed": 1}})
    with pytest.raises(DeviceUnavailable, match=r"failed on its devices \(failed pods by Volcano task: gpu 2, npu 1\): "
                                                r"Volcano task gpu, pod heteroflow-mixed-abcdef-gpu-0: gpu 0 lost"):
        _launch(tmp_path, api)
    assert not (tmp_path / "model").exists()
