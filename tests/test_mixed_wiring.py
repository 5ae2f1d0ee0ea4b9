"""A mixed candidate wired into the cluster renderings and the plan step's profile (#29 items 2 and 6):

- ``heteroflow manifests -c 'gpu:count=2+npu:count=4'`` renders one Volcano Job with a task per kind and
  ``minAvailable`` 6, validated against the Volcano CRD and (each task's pod template) kubernetes-validate;
- the KFP rendering compiles: the mixed candidate's task (and Airflow pod) is a CPU launcher pod, as a multi-node
  candidate's; in a pod it launches the Volcano Job (tests/test_mixed_launch.py), without credentials it fails
  with a device failure (the step falls back) saying what to give it;
- a pod of the mixed Volcano Job (``PET_NNODES=1:6``, no master address) is not taken for a static multi-node job;
- the plan step's ``training_profile`` reaches the train step and sets a mixed job's first shares.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from heteroflow.components.core.failures import FailureClass, classify
from heteroflow.components.errors import DeviceUnavailable, InvalidParameter
from heteroflow.components.resources import Candidates
from heteroflow.components.training.mixed_job import REPLICA_KIND_ENV, ROLES_ENV, validate_volcano_job

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = ROOT / "examples" / "manifests" / "inventory.yaml"
PROFILE_YAML = """\
name: mixed
vendors: {nvidia: {labels: gfd}, ascend: {plugin: official, labels: npu-chip-name}}
queue: {volcano: research}
images: {gpu: reg.example/hf:cuda, npu: reg.example/hf:cann8, cpu: reg.example/hf:cpu}
shared_storage: {claim: hf-shared}
"""
MIXED = "gpu:count=2+npu:count=4"


def _env(task: dict) -> dict[str, str]:
    (container,) = task["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_heteroflow_manifests_renders_a_mixed_candidate_as_one_gang_scheduled_volcano_job(tmp_path: Path) -> None:
    from heteroflow.pipelines.cli.main import app

    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE_YAML, encoding="utf-8")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["manifests", "--inventory", str(INVENTORY), "--profile", str(profile), "-c", MIXED,
                                      "-c", "cpu", "-o", str(out), "--command", "heteroflow step train --param epochs=3"])
    assert result.exit_code == 0, result.output
    assert "train-0-gpu-npu.yaml (1: Job)" in result.output
    (job,) = list(yaml.safe_load_all((out / "train-0-gpu-npu.yaml").read_text(encoding="utf-8")))
    validate_volcano_job(job)  # the Volcano CRD (unknown fields rejected) and each pod template with kubernetes-validate
    assert (job["apiVersion"], job["kind"]) == ("batch.volcano.sh/v1alpha1", "Job")
    spec = job["spec"]
    assert spec["minAvailable"] == 6 and spec["queue"] == "research"
    gpu, npu = spec["tasks"]
    assert [(t["name"], t["replicas"]) for t in (gpu, npu)] == [("gpu", 2), ("npu", 4)]
    # count is replicas: one device per pod, from each kind's device plugin and the profile's image
    g, n = gpu["template"]["spec"]["containers"][0], npu["template"]["spec"]["containers"][0]
    assert g["resources"]["limits"]["nvidia.com/gpu"] == "1" and n["resources"]["limits"]["huawei.com/Ascend910"] == "1"
    assert (g["image"], n["image"]) == ("reg.example/hf:cuda", "reg.example/hf:cann8")
    # the train step's command under torchrun, the elastic rendezvous and the roles in every pod
    # not under torchrun: in the pod the step starts its kind's elastic agent itself (worker mode)
    assert g["command"] == ["heteroflow", "step", "train", "--param", "epochs=3"]
    env = _env(npu)
    assert env["PET_NNODES"] == "1:6" and env[REPLICA_KIND_ENV] == "npu"
    assert [(r["kind"], r["replicas"]) for r in json.loads(env[ROLES_ENV])] == [("gpu", 2), ("npu", 4)]
    # the cpu candidate has no job of its own; the queues and flavors are still there
    assert sorted(p.name for p in out.iterdir()) == ["kueue.yaml", "train-0-gpu-npu.yaml", "volcano-queues.yaml"]


def test_a_mixed_candidate_without_an_image_for_a_kind_renders_no_job_and_says_why(tmp_path: Path) -> None:
    """No train job for the only candidate asked for: the notes say why and the command exits 1 (it exited 0, a
    trial took the README's command for a success); beside a candidate that gets its job, the note and exit 0."""
    from heteroflow.pipelines.cli.main import app

    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE_YAML.replace(" npu: reg.example/hf:cann8,", ""), encoding="utf-8")
    result = CliRunner().invoke(app, ["manifests", "--inventory", str(INVENTORY), "--profile", str(profile), "-c", MIXED,
                                      "-o", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert not (tmp_path / "out" / "train-0-gpu-npu.yaml").exists()
    said = " ".join(result.output.split())
    assert "no train-0-gpu-npu.yaml: the profile names no image for npu (images.npu)" in said
    assert "error: no train job written: the candidate lacks an image for a device kind" in said
    beside = CliRunner().invoke(app, ["manifests", "--inventory", str(INVENTORY), "--profile", str(profile), "-c", MIXED,
                                      "-c", "gpu", "-o", str(tmp_path / "out2")])
    assert beside.exit_code == 0, beside.output
    assert (tmp_path / "out2" / "train-1-gpu.yaml").exists() and "no train-0-gpu-npu.yaml" in " ".join(beside.output.split())
    single = CliRunner().invoke(app, ["manifests", "--inventory", str(INVENTORY), "-c", "npu", "-o", str(tmp_path / "out3")])
    assert single.exit_code == 1 and "no train-0-npu.yaml" in " ".join(single.output.split()), single.output
    nothing = CliRunner().invoke(app, ["manifests", "--inventory", str(INVENTORY), "-c", "npu", "--workers", "0", "-o", str(tmp_path / "out4")])
    assert nothing.exit_code == 0, nothing.output  # no train job asked for
    negative = CliRunner().invoke(app, ["manifests", "--inventory", str(INVENTORY), "--workers", "-1", "-o", str(tmp_path / "out5")])
    assert negative.exit_code == 2 and "--workers" in negative.output and not (tmp_path / "out5").exists()


def test_the_readmes_manifests_command_writes_the_mixed_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README, "Mixed jobs on a cluster": its heteroflow manifests command, as written (in the repository, out/ under
    tmp_path), writes out/train-0-gpu-npu.yaml (it printed a note and wrote none: no shipped profile names images
    for both gpu and npu)."""
    import re
    import shlex

    from heteroflow.pipelines.cli.main import app

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Mixed jobs on a cluster"):]
    (line,) = [m for m in re.findall(r"`(heteroflow manifests [^`]*)`", section) if MIXED in m][:1]
    argv = shlex.split(line)[1:]
    assert argv[-2:] == ["-o", "out/"], argv
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, [*argv[:-1], str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    (job,) = list(yaml.safe_load_all((tmp_path / "out" / "train-0-gpu-npu.yaml").read_text(encoding="utf-8")))
    assert [t["template"]["spec"]["containers"][0]["command"] for t in job["spec"]["tasks"]] == [["heteroflow", "step", "train"]] * 2


def test_the_python_api_renders_the_same_job_and_validates_it() -> None:
    from heteroflow.components.devices.cluster import ClusterProfile
    from heteroflow.pipelines.k8s.manifests import load_inventory, render_all, validate

    files = render_all(load_inventory(INVENTORY), Candidates([MIXED, "gpu"]), ClusterProfile.from_dict(yaml.safe_load(PROFILE_YAML)))
    (job,) = files["train-0-gpu-npu.yaml"]
    validate(job)
    assert job["spec"]["minAvailable"] == 6 and [t["name"] for t in job["spec"]["tasks"]] == ["gpu", "npu"]
    assert files["train-1-gpu.yaml"][0]["kind"] in ("TrainJob", "PodGroup", "PyTorchJob")  # a single-kind one as before


def test_the_kfp_rendering_compiles_and_the_mixed_task_is_the_jobs_launcher_in_a_pod(tmp_path: Path) -> None:
    from heteroflow.components.devices.cluster import ClusterProfile
    from heteroflow.components.training.mixed_launch import in_launcher_pod, launch_mixed_job
    from heteroflow.components.training.trainjob import PROFILE_ENV
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.kfp.render import compile_pipeline

    cands = Candidates([MIXED, "cpu"])
    path = compile_pipeline(default_pipeline(train_candidates=cands), tmp_path / "p.yaml",
                            profile=ClusterProfile.from_dict(yaml.safe_load(PROFILE_YAML)))
    compiled = path.read_text(encoding="utf-8")
    executors = next(yaml.safe_load_all(compiled))["deploymentSpec"]["executors"]
    mixed_task = executors["exec-train"]["container"]
    # the Kubeflow UI's labels name the mixed candidate by every kind, not its first one alone
    assert "train: gpu+npu -> cpu" in compiled and "on gpu+npu (candidate 0)" in compiled
    assert "train: gpu -> cpu" not in compiled
    # a launcher's pod, as a multi-node candidate's: no accelerator, the cluster profile in its environment
    assert "accelerator" not in mixed_task["resources"] and mixed_task["resources"]["resourceCpuLimit"] == "1"
    env = {e["name"]: e["value"] for e in mixed_task["env"]}
    assert json.loads(env[PROFILE_ENV])["name"] == "mixed"

    from heteroflow.pipelines.k8s.resources import build_pod_resources

    airflow_pod = build_pod_resources(cands[0], ClusterProfile.from_dict(yaml.safe_load(PROFILE_YAML))).kubernetes_pod_operator_kwargs()
    assert airflow_pod["container_resources"].limits == {"cpu": "1", "memory": "2Gi"}
    # the operator's list form: the profile, and POD_IP from the downward API (tests/test_mixed_launcher_pod.py)
    assert {e.name for e in airflow_pod["env_vars"]} >= {PROFILE_ENV, "POD_IP"}

    in_pod = {**env, "KUBERNETES_SERVICE_HOST": "10.96.0.1"}  # the kubelet sets it in every pod
    assert in_launcher_pod(in_pod)  # it launches the Volcano Job and hosts the store (tests/test_mixed_launch.py)
    assert not in_launcher_pod({})  # on one machine (heteroflow run) it trains
    # kfp.local's task (the default engine of `heteroflow run`) carries the compiled profile but runs on this machine:
    # a fresh clone's `heteroflow run -c 'gpu:count=1+npu:count=1'` fell back to cpu here before
    assert not in_launcher_pod(env)
    assert not in_launcher_pod({**in_pod, REPLICA_KIND_ENV: "gpu"})  # a pod of the mixed job's own Volcano Job
    # a pod without a service account token: a device failure (the step falls back) saying what to give it
    with pytest.raises(DeviceUnavailable, match="no Kubernetes credentials .*automountServiceAccountToken") as exc:
        launch_mixed_job(cands[0], dataset_dir=tmp_path, model_dir=tmp_path / "m", values={}, key="k", environ=in_pod)
    assert classify(exc.value).cls is FailureClass.DEVICE


def test_a_mixed_jobs_pod_is_not_taken_for_a_static_multi_node_job() -> None:
    from heteroflow.components.training import rendezvous
    from heteroflow.components.training.mixed_job import RoleSpec, volcano_mixed_job
    from heteroflow.components.training.rendezvous import node_role

    job = volcano_mixed_job("mix", [RoleSpec("gpu", 2), RoleSpec("npu", 4)], image="reg.example/hf:latest")
    env = _env(job["spec"]["tasks"][1])
    assert env["PET_NNODES"] == "1:6" and "PET_MASTER_ADDR" not in env
    assert node_role(env) is None  # the mixed path: torchrun's c10d rendezvous, no master address needed
    assert node_role({k: v for k, v in env.items() if k != REPLICA_KIND_ENV}) is None
    bare = {**{k: v for k, v in env.items() if k not in (REPLICA_KIND_ENV, ROLES_ENV)}, "PET_MASTER_PORT": "29500"}
    with pytest.raises(InvalidParameter, match="without PET_MASTER_ADDR"):  # a static job still needs its master
        node_role(bare)
    assert (rendezvous._MIXED_KIND_ENV, rendezvous._MIXED_ROLES_ENV) == (REPLICA_KIND_ENV, ROLES_ENV)


def _profile(path: Path, seconds: dict[str, float]) -> Path:
    path.write_text(json.dumps({"device": "cpu", "samples_per_second": 100.0, "operators": [], "step_seconds_by_model": seconds}))
    return path


def test_profile_throughput_is_one_over_each_kinds_step_time_or_nothing(tmp_path: Path) -> None:
    from heteroflow.components.replicas import MixedResources
    from heteroflow.components.training.mixed_step import profile_throughput

    mixed = MixedResources.parse_spec("gpu:accelerator=a100-80gb+npu:accelerator=ascend-910b3+cpu:count=2")
    full = _profile(tmp_path / "a.json", {"nvidia-a100-80gb": 0.01, "ascend-910b3": 0.03, "cpu": 0.1})
    assert profile_throughput(mixed, str(full)) == pytest.approx({"gpu": 100.0, "npu": 100 / 3, "cpu": 10.0})
    partial = _profile(tmp_path / "b.json", {"nvidia-a100-80gb": 0.01})
    assert profile_throughput(mixed, str(partial)) == {}  # a kind without a step time: the first steps measure
    assert profile_throughput(mixed, "") == {}
    with pytest.raises(InvalidParameter, match="training_profile="):
        profile_throughput(mixed, str(tmp_path / "missing.json"))


def test_the_plan_and_train_steps_share_the_training_profile_parameter() -> None:
    from heteroflow.components.steps import PLAN, TRAIN
    from heteroflow.pipelines.default import default_pipeline

    assert "training_profile" in PLAN.param_names and "training_profile" in TRAIN.param_names
    params = default_pipeline().params
    assert list(params).count("training_profile") == 1  # one pipeline parameter, bound to both steps


@pytest.mark.slow
def test_the_first_shares_of_a_mixed_train_come_from_the_plan_steps_profile(digits_dir: Path, tmp_path: Path) -> None:
    """Through the CLI: simulated kinds at equal speed, a profile that times the GPU 3x faster than the NPU: the
    first shares of the 64-sample global batch are 47 and 17 (3:1 after one sample each); without the profile the first shares are equal."""
    heteroflow = Path(sys.executable).with_name("heteroflow")
    prof = _profile(tmp_path / "profile.json", {"nvidia-a100-80gb": 0.01, "ascend-910b3": 0.03})

    def run(where: Path, *extra: str) -> dict:
        where.mkdir()
        proc = subprocess.run(
            [str(heteroflow), "run", "--engine", "inprocess", "--simulate-devices", "gpu,npu", "--dataset", str(digits_dir),
             "-c", "gpu:accelerator=a100-80gb+npu:accelerator=ascend-910b3", "--param", "epochs=1", "--param", "batch_size=64",
             *extra],
            cwd=where, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
            env={**os.environ, "HETEROFLOW_HOME": str(tmp_path / "home"), "COLUMNS": "160"})
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        (run_dir,) = (where / "heteroflow-runs").iterdir()
        return json.loads((run_dir / "run.json").read_text()) | {"_out": proc.stdout + proc.stderr}

    profiled = run(tmp_path / "profiled", "--param", f"training_profile={prof}")
    first = profiled["results"]["train"]["mixed"]["shares_history"][0]
    from heteroflow.components.training.shares import shares_from_throughput

    assert first["why"] == "start" and first["shares"] == shares_from_throughput(64, [1 / 0.01, 1 / 0.03]) == [48, 16]
    assert "the first shares come from the training profile" in profiled["_out"]
    plain = run(tmp_path / "plain")
    assert plain["results"]["train"]["mixed"]["shares_history"][0]["shares"] == [32, 32]


def test_a_mixed_train_reports_its_kinds_epoch_loss_and_speed_live(digits_shards: Path, tmp_path: Path, monkeypatch) -> None:
    """While a mixed candidate trains, the live table words the step by its kinds (``gpu+npu``, not the first kind's
    model) and shows rank 0's epoch, loss and samples/s, relayed from the workers about every 0.5 s."""
    from heteroflow.components.core.telemetry import where_ran
    from heteroflow.components.training.step import train
    from heteroflow.pipelines.cli.summary import _progress_text

    monkeypatch.setenv("HETEROFLOW_SIMULATE_DEVICES", "gpu,npu")
    mixed = Candidates(["gpu:count=1+npu:count=1"])[0]
    reports: list[dict] = []
    result = train(digits_shards, tmp_path / "model", resources=mixed, epochs=4, batch_size=32,
                   checkpoint_root=str(tmp_path / "ck"), progress=lambda **facts: reports.append(facts))
    assert result.device_kind == "gpu+npu"
    assert reports and all(r["device_kind"] == "gpu+npu" for r in reports)
    trained = [r for r in reports if "loss" in r]
    assert trained, reports  # 4 epochs of 40 steps: several relays of rank 0's progress
    last = trained[-1]
    assert 1 <= last["epoch"] <= last["epochs"] == 4 and 0 < last["step"] <= last["steps"] == 160
    assert last["samples_per_second"] > 0 and last["loss"] > 0 and sum(last["shares"]) == 32
    assert where_ran("gpu", "cpu", accelerator="nvidia-gpu", simulated=True, details={"progress": last}) == "gpu+npu (simulated, on cpu)"
    assert _progress_text({"progress": last}).startswith(f"epoch {last['epoch']}/4, loss ")
    # before the replicas train: what it waits for, not where it runs (the device column says that)
    waiting = next(r for r in reports if "waiting" in r)
    assert _progress_text({"progress": waiting}) == waiting["waiting"] and "device_kind" not in _progress_text({"progress": waiting})
    # a short run still shows rank 0's progress: after its first step and at its last
    assert trained[0]["step"] == 1 and trained[-1]["step"] == 160


def test_a_batch_larger_than_the_data_trains_a_mixed_candidate_as_it_trains_one_kind(digits_shards: Path, tmp_path: Path, monkeypatch, capfd) -> None:
    """A review's input: batch_size=2000 on the digits samples trained one step an epoch on a single kind, but failed
    a mixed candidate permanently ("fewer than one global batch"), so the next candidate never ran. It is one global
    batch of every sample now, said in the log."""
    from heteroflow.components.training.step import train

    monkeypatch.setenv("HETEROFLOW_SIMULATE_DEVICES", "gpu,npu")
    mixed = Candidates(["gpu:count=1+npu:count=1"])[0]
    result = train(digits_shards, tmp_path / "model", resources=mixed, epochs=2, batch_size=5000,
                   checkpoint_root=str(tmp_path / "ck"))
    assert result.device_kind == "gpu+npu" and result.steps == 2, result  # one step an epoch
    said = " ".join(capfd.readouterr().err.split())
    assert "train: batch_size=5000 is more than the" in said and "training samples: one global batch of" in said, said


@pytest.mark.slow
def test_a_finished_mixed_training_is_kept_for_a_rerun_as_a_single_kind_one(digits_shards: Path, tmp_path: Path, monkeypatch) -> None:
    """The sibling of a new user's trial (a stop during evaluate, after train finished, then the same command
    trained from step 0): a single-kind training now keeps its finished model for the rerun, but a mixed
    candidate's training removed its checkpoint folder as it finished, and held no lock on it. It now keeps its
    model in a run that records itself, and the rerun takes it, with the mixed facts; a second identical training
    waiting on the folder's lock would take it too."""
    from heteroflow.components.training.checkpoint_lock import KEPT_FACTS, release_kept
    from heteroflow.components.training.step import train

    monkeypatch.setenv("HETEROFLOW_SIMULATE_DEVICES", "gpu,npu")
    monkeypatch.setenv("HETEROFLOW_RUN_DIR", str(tmp_path / "run"))  # a run that records itself
    mixed = Candidates(["gpu:count=1+npu:count=1"])[0]
    kwargs = dict(resources=mixed, epochs=1, batch_size=64, seed=0, checkpoint_root=str(tmp_path / "ck"))
    first = train(digits_shards, tmp_path / "m1", **kwargs)
    folder = Path(first.kept_checkpoint)
    assert first.device_kind == "gpu+npu" and first.resumed_from_step == 0 and first.steps > 0
    assert (folder / KEPT_FACTS).is_file() and (folder / "finished" / "model.pt").is_file()
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "finished", KEPT_FACTS]  # no checkpoint left beside it
    again = train(digits_shards, tmp_path / "m2", **kwargs)
    assert again.reused_model == str(folder / "finished") and again.resumed_from_step == again.steps == first.steps
    assert again.device_kind == "gpu+npu" and again.mixed["kinds"] == first.mixed["kinds"] and again.history == first.history
    assert (tmp_path / "m2" / "model.pt").read_bytes() == (tmp_path / "m1" / "model.pt").read_bytes()
    assert release_kept(folder) and not folder.exists()  # the run that used it succeeded
    monkeypatch.delenv("HETEROFLOW_RUN_DIR")  # a training outside a recorded run keeps nothing, as before
    plain = train(digits_shards, tmp_path / "m3", **kwargs)
    assert plain.kept_checkpoint == "" and plain.resumed_from_step == 0 and not any((tmp_path / "ck").iterdir())


@pytest.mark.parametrize("spec", ["npu+gpu", "npu"])
def test_a_candidate_the_profile_cannot_render_is_named_as_written(spec: str, tmp_path: Path) -> None:
    """A train job the profile cannot ask for (any Ascend 910 under HAMi's per-chip resources): the error names the
    -c candidate as written (it named no candidate at all), exit 2; from Python, its index and shape."""
    from heteroflow.components.devices.cluster import load_profile
    from heteroflow.components.errors import InvalidResources
    from heteroflow.pipelines.cli.main import app
    from heteroflow.pipelines.k8s.manifests import load_inventory, render_all

    hami = ROOT / "examples" / "profiles" / "ascend-hami.yaml"
    result = CliRunner().invoke(app, ["manifests", "--inventory", str(INVENTORY), "--profile", str(hami), "-c", "cpu", "-c", spec,
                                      "--image", "x", "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"error: -c '{spec}': accelerator='ascend-910' (any Ascend 910) is several resources under the 'hami' device plugin" \
        in " ".join(result.output.split())
    with pytest.raises(InvalidResources, match=r"^train candidate 1 \(npu x1 \(ascend-910\)"):
        render_all(load_inventory(INVENTORY), Candidates(["cpu", spec]), load_profile(hami), image="x")
