"""Part of one device (``device_share``) in every rendering of a candidate into Kubernetes resources.

A new user's trial: ``-c gpu:device_share=0.3,accelerator=T4`` compiled, rendered Airflow pods and manifests asking
for ``nvidia.com/gpu: 1`` (a whole GPU) under every profile, silently. Now one function
(:func:`heteroflow.components.devices.podplan.share_resources`) decides: under HAMi the share is one vGPU with
``nvidia.com/gpucores`` and ``nvidia.com/gpumem`` (``gpumem-percentage`` for a family), under a plugin that cannot
share (the official NVIDIA plugin) or on an NPU an error naming ``device_share``, and KFP (which sets one
accelerator resource per task) refuses the HAMi share rather than compile a whole GPU.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import yaml

from heteroflow.components.devices.accelerators import ACCELERATORS
from heteroflow.components.devices.cluster import ClusterProfile, load_profile
from heteroflow.components.devices.podplan import DefaultProfileWarning
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import Resources

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "examples" / "profiles"
INVENTORY = ROOT / "examples" / "manifests" / "inventory.yaml"
HAMI_YAML = "version: 1\nname: nv-hami\nvendors:\n  nvidia: {plugin: hami, labels: gfd}\n"  # the trial's /tmp/hami-nv.yaml
SHARE = "gpu:device_share=0.3,accelerator=T4"
# a percentage of the memory the device reports (MiB of the data sheet's 16 GiB asked 2 x 8192 for two halves of a T4, which reports 15360)
HAMI_SHARE = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem-percentage": "30"}
REFUSED = (r"device_share=0\.3 of candidate gpu x1 \(nvidia-t4\).*: profile '{name}'.* uses the 'official' NVIDIA device "
           r"plugin, which cannot share a GPU; valid: a profile with vendors\.nvidia\.plugin: hami, or a whole GPU "
           r"\(drop device_share\)")


@pytest.fixture
def hami(tmp_path: Path) -> Path:
    path = tmp_path / "hami-nv.yaml"
    path.write_text(HAMI_YAML)
    return path


def _cli(args: list[str]):
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    return CliRunner().invoke(app, args, env={"COLUMNS": "400"})


def _one_line(output: str) -> str:
    return " ".join(output.split())


# --- the one decision ----------------------------------------------------------------------------------------


def test_share_resources_renders_hami_and_refuses_what_cannot_share(hami: Path) -> None:
    from heteroflow.components.devices.podplan import plan_pod, share_resources

    profile = load_profile(hami)
    assert share_resources(Resources.parse_spec(SHARE), profile) == HAMI_SHARE
    # a family's memory differs per model: the same share of whichever it lands on
    assert share_resources(Resources(kind="gpu", device_share=0.3), profile) == {
        "nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem-percentage": "30"}
    # the candidate's own device memory wins over the share of the model's
    stated = share_resources(Resources(kind="gpu", accelerator="t4", device_share=0.25, device_memory="4Gi"), profile)
    assert stated == {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "25", "nvidia.com/gpumem": "4096"}
    assert share_resources(Resources(kind="gpu", accelerator="t4", device_share=0.001), profile)["nvidia.com/gpucores"] == "1"
    # a review: the percentages were rounded up (3 x 0.333 asked 3 x 34% of one device) and the memory in MiB of the
    # data sheet's 16 GiB (two halves of a T4 asked 2 x 8192 MiB of the 15360 it reports): neither fitted one device
    third = share_resources(Resources(kind="gpu", accelerator="t4", device_share=0.333), profile)
    assert third["nvidia.com/gpucores"] == third["nvidia.com/gpumem-percentage"] == "33"
    half = share_resources(Resources(kind="gpu", accelerator="t4", device_share=0.5), profile)
    assert half == {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem-percentage": "50"}
    assert share_resources(Resources.parse_spec("gpu:accelerator=T4"), profile) == {}
    with pytest.raises(InvalidResources, match=REFUSED.format(name="nvidia-gfd")):
        share_resources(Resources.parse_spec(SHARE), load_profile(PROFILES / "nvidia-gfd.yaml"))
    # kfp.local reads no resources: the share is its one device there, whatever the profile
    local = plan_pod(Resources.parse_spec(SHARE), load_profile(PROFILES / "nvidia-gfd.yaml"), local=True)
    assert local.limits["nvidia.com/gpu"] == "1" and "nvidia.com/gpucores" not in local.limits


def test_a_shared_npu_is_refused_not_rendered_whole() -> None:
    """Sibling: NPUs can be shared on paper (``npu:device_share=0.5``), but only NVIDIA GPUs under HAMi are
    rendered; an Ascend share under the HAMi Ascend profile asked for a whole ``huawei.com/Ascend910B3``."""
    from heteroflow.pipelines.k8s.resources import build_pod_resources

    with pytest.raises(InvalidResources, match=r"device_share=0\.5 of candidate npu x1 \(ascend-910b3\).*: Ascend 910B3 cannot "
                       r"be shared: fractional requests are rendered for NVIDIA GPUs under HAMi .*; valid: .* or a whole "
                       r"device \(drop device_share\)"):
        build_pod_resources(Resources(kind="npu", accelerator="910B3", device_share=0.5), load_profile(PROFILES / "ascend-hami.yaml"))


def test_official_plugin_maps_refuse_a_share() -> None:
    """Sibling: ``Resources.k8s_requests()`` / ``k8s_limits()`` render under the official plugins, which cannot
    share; they gave ``nvidia.com/gpu: '1'``."""
    with pytest.raises(InvalidResources, match=REFUSED.format(name="default")):
        Resources.parse_spec(SHARE).k8s_requests()
    with pytest.raises(InvalidResources, match=REFUSED.format(name="default")):
        Resources.parse_spec(SHARE).k8s_limits()


# --- KFP -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", [None, "nvidia-gfd"], ids=["default", "nvidia-gfd"])
def test_compile_refuses_a_share_under_the_official_plugin(tmp_path: Path, profile: str | None) -> None:
    args = ["compile", "-c", SHARE, "-c", "cpu", "-o", str(tmp_path / "s.yaml")]
    if profile:
        args[1:1] = ["--profile", str(PROFILES / f"{profile}.yaml")]
    result = _cli(args)
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "s.yaml").exists()
    import re

    assert re.search("error: " + REFUSED.format(name=profile or "default"), _one_line(result.output)), result.output


def test_compile_refuses_a_hami_share_that_kfp_cannot_set(tmp_path: Path, hami: Path) -> None:
    result = _cli(["compile", "--profile", str(hami), "-c", SHARE, "-c", "cpu", "-o", str(tmp_path / "s3.yaml")])
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "s3.yaml").exists()
    said = _one_line(result.output)
    assert ("error: device_share=0.3 of candidate gpu x1 (nvidia-t4), 1 CPU, 2Gi, share 0.3 of the device asks for "
            "nvidia.com/gpucores, nvidia.com/gpumem-percentage beside nvidia.com/gpu, which a KFP task cannot set") in said
    assert "valid: Airflow pods (heteroflow.dags.factory.build_dag with mode='kubernetes' and this profile), or a whole GPU" in said


def test_compile_checks_a_mixed_candidates_share_its_launcher_submits(tmp_path: Path, hami: Path) -> None:
    """Sibling: a mixed candidate's task is a CPU launcher; the Volcano Job it submits asks for the share, so compile
    checks it under the profile (it compiled under the official plugin, whose job then asked for a whole GPU)."""
    mixed = "gpu:device_share=0.3+cpu"
    result = _cli(["compile", "--profile", str(hami), "-c", mixed, "-o", str(tmp_path / "ok.yaml")])
    assert result.exit_code == 0, result.output
    result = _cli(["compile", "--profile", str(PROFILES / "nvidia-gfd.yaml"), "-c", mixed, "-o", str(tmp_path / "no.yaml")])
    assert result.exit_code == 2, result.output
    assert "error: device_share=0.3 of candidate gpu x1 (nvidia-gpu)" in _one_line(result.output)
    assert "profile 'nvidia-gfd'" in result.output and not (tmp_path / "no.yaml").exists()


def test_kfp_local_renders_a_share_as_its_device() -> None:
    from heteroflow.components.resources import Candidates
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.kfp.render import to_kfp

    pipeline = default_pipeline(train_candidates=Candidates([SHARE, "cpu"]))
    to_kfp(pipeline, local=True)  # kfp.local never reads resources: no cluster to refuse it
    with warnings.catch_warnings(record=True) as caught:  # refused, with no default-profile warning before it
        warnings.simplefilter("always")
        with pytest.raises(InvalidResources, match=REFUSED.format(name="default")):
            to_kfp(pipeline)
    assert not [w for w in caught if issubclass(w.category, DefaultProfileWarning)]


# --- Airflow pods --------------------------------------------------------------------------------------------


def test_airflow_pod_resources_ask_hami_for_the_share(hami: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from kubernetes import client

    from heteroflow.pipelines.k8s.resources import build_pod_resources

    built = build_pod_resources(Resources(kind="gpu", device_share=0.3, accelerator="T4"), load_profile(hami))
    assert built.resources.requests == built.resources.limits == {"cpu": "1", "memory": "2Gi", **HAMI_SHARE}
    pod = client.ApiClient().sanitize_for_serialization(built.pod(name="train"))
    assert kubernetes_validate.validate(pod, "1.33.0", strict=True) == "1.33"
    with pytest.raises(InvalidResources, match=REFUSED.format(name="nvidia-gfd")):
        build_pod_resources(Resources(kind="gpu", device_share=0.3, accelerator="T4"), load_profile(PROFILES / "nvidia-gfd.yaml"))


def test_the_airflow_dag_builds_hami_share_pods(hami: Path) -> None:
    pytest.importorskip("airflow")
    from heteroflow.components.resources import Candidates
    from heteroflow.dags.factory import build_dag
    from heteroflow.pipelines.default import default_pipeline

    pipeline = default_pipeline(train_candidates=Candidates([SHARE, "cpu"]))
    kw = {"mode": "kubernetes", "image": "img:1", "run_root": "/runs", "pod_kwargs": {"namespace": "ml", "in_cluster": False}}
    dag = build_dag(pipeline, "share", profile=str(hami), **kw)
    [task] = [t for t in dag.tasks if t.task_id.startswith("train.gpu")]
    limits = task.container_resources.limits
    assert {k: limits[k] for k in HAMI_SHARE} == HAMI_SHARE
    with warnings.catch_warnings(record=True) as caught:  # refused, with no default-profile warning before it
        warnings.simplefilter("always")
        with pytest.raises(InvalidResources, match=REFUSED.format(name="default")):
            build_dag(pipeline, "share", **kw)
    assert not [w for w in caught if issubclass(w.category, DefaultProfileWarning)]


# --- manifests and the mixed job -----------------------------------------------------------------------------


def test_manifests_ask_hami_for_the_share_and_refuse_it_without(tmp_path: Path, hami: Path) -> None:
    from heteroflow.pipelines.k8s.manifests import validate

    out = tmp_path / "m"
    result = _cli(["manifests", "--inventory", str(INVENTORY), "--profile", str(hami), "-o", str(out), "-c", SHARE, "-c", "cpu",
                   "--image", "img:1"])
    assert result.exit_code == 0, result.output
    docs = [d for p in sorted(out.iterdir()) for d in yaml.safe_load_all(p.read_text())]
    for doc in docs:
        validate(doc)
    [job] = list(yaml.safe_load_all((out / "train-0-gpu.yaml").read_text()))
    res = job["spec"]["trainer"]["resourcesPerNode"]
    assert res["requests"] == res["limits"] == {"cpu": "1", "memory": "2Gi", **HAMI_SHARE}
    result = _cli(["manifests", "--inventory", str(INVENTORY), "-o", str(tmp_path / "m1"), "-c", SHARE, "-c", "cpu",
                   "--image", "img:1"])
    assert result.exit_code == 2, result.output
    import re

    # manifests names the candidate as it was written (-c ...), then the refusal
    assert re.search(f"error: -c '{re.escape(SHARE)}': " + REFUSED.format(name="default"), _one_line(result.output)), result.output
    assert not (tmp_path / "m1").exists()


def test_the_mixed_job_roles_ask_hami_for_the_share(hami: Path) -> None:
    from heteroflow.components.training.mixed_job import RoleSpec, volcano_mixed_job

    roles = [RoleSpec("gpu", 2, "gpu:device_share=0.3"), RoleSpec("cpu", 1, "cpu")]
    job = volcano_mixed_job("mj", roles, image="img:1", profile=load_profile(hami))  # validated against the schema
    gpu = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"]
    shared = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem-percentage": "30"}
    assert gpu["requests"] == gpu["limits"] == {"cpu": "1", "memory": "2Gi", **shared}
    with pytest.raises(InvalidResources, match=r"device_share=0\.3 of candidate gpu x1 \(nvidia-gpu\).*profile 'default' uses the 'official'"):
        volcano_mixed_job("mj", roles, image="img:1")
    with pytest.raises(InvalidResources, match=r"profile 'plain' uses the 'official' NVIDIA device plugin, which cannot share"):
        volcano_mixed_job("mj", roles, image="img:1", profile=ClusterProfile.from_dict({"name": "plain"}))
