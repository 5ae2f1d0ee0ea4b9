"""A candidate's model is never silently lost without a cluster profile (issue #16.20): the default conventions
pick it (a node label, a resource name per device plugin), and rendering says so and which ``--profile`` pins it,
for KFP and for Airflow pods alike."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from heteroflow.components.devices.cluster import DEFAULT_PROFILE, load_profile
from heteroflow.components.resources import Resources
from heteroflow.pipelines.cli.main import app
from heteroflow.pipelines.k8s.resources import DefaultProfileWarning, build_pod_resources, plan_pod

PROFILES = Path(__file__).resolve().parents[1] / "examples" / "profiles"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _first(caught: Any, category: type[Warning]) -> str:
    """The first recorded warning of ``category`` (pytest.warns records every warning: a ResourceWarning of an
    unrelated subprocess collected meanwhile came first once, "subprocess N is still running")."""
    return next(str(w.message) for w in caught if issubclass(w.category, category))


def _platform(path: Path) -> dict[str, Any]:
    docs = list(yaml.safe_load_all(path.read_text()))
    return docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def test_the_issues_compile_warns_and_keeps_the_model(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    with pytest.warns(DefaultProfileWarning) as caught:
        result = CliRunner().invoke(app, ["compile", "-o", str(out), "-c", "gpu:accelerator=t4"])
    assert result.exit_code == 0, result.output
    said = _flat(_first(caught, DefaultProfileWarning))
    assert said.startswith("candidate gpu x1 (nvidia-t4)")
    assert "no cluster profile was given, so the default conventions pick NVIDIA T4: node label nvidia.com/gpu.product in Tesla-T4, TESLA-T4 (vendors.nvidia.labels: gfd)" in said
    assert "--profile FILE (vendors.nvidia.labels: gfd | gke | none; e.g. examples/profiles/nvidia-gfd.yaml" in said
    # the model is in the compiled pipeline, not lost
    terms = _platform(out)["exec-train"]["nodeAffinity"]
    assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4", "TESLA-T4"]} in terms[0]["matchExpressions"]


@pytest.mark.slow
def test_the_cli_says_it_in_one_warning_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("heteroflow")
    proc = subprocess.run(
        [str(exe), "compile", "-o", str(tmp_path / "p.yaml"), "-c", "gpu:accelerator=t4"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("warning: candidate gpu x1 (nvidia-t4)")]
    assert len(lines) == 1 and "--profile FILE" in lines[0], proc.stderr


def test_the_profile_the_warning_names_pins_the_clusters_label_and_silences_it(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DefaultProfileWarning)
        result = CliRunner().invoke(
            app, ["compile", "-o", str(out), "-c", "gpu:accelerator=t4", "--profile", str(PROFILES / "kueue-gke.yaml")]
        )
    assert result.exit_code == 0, result.output
    assert _platform(out)["exec-train"]["nodeSelector"] == {"labels": {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}}


def test_airflow_pods_of_the_same_candidate_warn_and_keep_the_model(tmp_path: Path) -> None:
    """Sibling: Airflow's KubernetesPodOperator pods render the same candidate through the same plan."""
    pytest.importorskip("airflow.providers.cncf.kubernetes", reason="the airflow extra is not installed")
    from heteroflow.dags.factory import build_dag
    from heteroflow.dags.pods import PodStepOperator
    from heteroflow.pipelines.default import default_pipeline

    pipeline = default_pipeline(train_candidates=["gpu:accelerator=t4", "cpu"])
    with pytest.warns(DefaultProfileWarning, match=r"NVIDIA T4: node label nvidia.com/gpu.product in Tesla-T4, TESLA-T4"):
        dag = build_dag(pipeline, "hf-t4", mode="kubernetes", image="r.example.com/hf:1", run_root="/runs",
                        pod_kwargs={"namespace": "ml", "in_cluster": False})
    pods = [t for t in dag.tasks if isinstance(t, PodStepOperator) and t.task_id.startswith("train")]
    gpu = next(t for t in pods if t.container_resources is not None and "nvidia.com/gpu" in (t.container_resources.limits or {}))
    term = gpu.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[0]
    assert [(e.key, e.values) for e in term.match_expressions] == [("nvidia.com/gpu.product", ["Tesla-T4", "TESLA-T4"])]


def test_an_ascend_chip_names_both_assumed_conventions() -> None:
    """Sibling: the 910B3's resource name depends on the device plugin (official vs HAMi) and its chip on a label."""
    with pytest.warns(DefaultProfileWarning) as caught:
        plan = plan_pod(Resources.parse_spec("npu:accelerator=ascend-910b3"))
    message = _flat(_first(caught, DefaultProfileWarning))
    assert "resource huawei.com/Ascend910 (vendors.ascend.plugin: official)" in message
    assert "node label node.kubernetes.io/npu.chip.name=910B3 (vendors.ascend.labels: npu-chip-name)" in message
    assert "vendors.ascend.plugin: hami | official" in message and "examples/profiles/ascend-hami.yaml" in message
    assert plan.node_selector == {"node.kubernetes.io/npu.chip.name": "910B3"}
    # the same candidate under a profile that pins the conventions: no warning, HAMi's per-chip resource
    with warnings.catch_warnings():
        warnings.simplefilter("error", DefaultProfileWarning)
        hami = build_pod_resources(Resources.parse_spec("npu:accelerator=ascend-910b3"), load_profile(PROFILES / "ascend-hami.yaml"))
    assert "huawei.com/Ascend910B3" in hami.resources.limits
    # the profile's file, as a path or a string: loaded (a str said "'str' object has no attribute 'tolerations'")
    for given in (PROFILES / "ascend-hami.yaml", str(PROFILES / "ascend-hami.yaml")):
        by_path = build_pod_resources(Resources.parse_spec("npu:accelerator=ascend-910b3"), given)
        assert by_path.resources.limits == hami.resources.limits and by_path.node_selector == hami.node_selector


@pytest.mark.parametrize(
    "spec",
    ["gpu", "gpu:count=2", "cpu:cpu=4", "gpu:accelerator=amd-mi300x"],
    ids=["any-nvidia", "two-any-nvidia", "cpu", "amd-explicit-profile"],
)
def test_no_warning_where_nothing_is_assumed(spec: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DefaultProfileWarning)
        if spec.startswith("gpu:accelerator=amd"):
            plan_pod(Resources.parse_spec(spec), DEFAULT_PROFILE)  # a profile given, even the default one
        else:
            plan_pod(Resources.parse_spec(spec))


def test_a_local_run_renders_without_the_warning() -> None:
    """kfp.local ignores resources, so its rendering assumes nothing about a cluster."""
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.kfp.render import to_kfp

    pipeline = default_pipeline(train_candidates=["gpu:accelerator=t4", "cpu"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DefaultProfileWarning)
        to_kfp(pipeline, local=True)
    with pytest.warns(DefaultProfileWarning):
        to_kfp(pipeline)


def test_a_share_the_default_profile_cannot_ask_for_is_an_error_without_the_warning_in_front(tmp_path: Path) -> None:
    """A share under the default profile (official plugin) is refused; the warning about the conventions its pod
    would have used no longer comes first (the CLI printed it above the error)."""
    from heteroflow.components.errors import InvalidResources

    share = Resources.parse_spec("gpu:device_share=0.3,accelerator=T4")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(InvalidResources, match="uses the 'official' NVIDIA device plugin, which cannot share a GPU"):
            plan_pod(share)
    assert not [w for w in caught if issubclass(w.category, DefaultProfileWarning)]
    result = CliRunner().invoke(app, ["compile", "-c", "gpu:device_share=0.3,accelerator=T4", "-c", "cpu", "-o", str(tmp_path / "p.yaml")],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "warning:" not in result.output and "cannot share a GPU" in _flat(result.output)
    # a whole T4 still warns (the default conventions pick its node label)
    with pytest.warns(DefaultProfileWarning, match="no cluster profile was given"):
        plan_pod(Resources.parse_spec("gpu:accelerator=T4"))
