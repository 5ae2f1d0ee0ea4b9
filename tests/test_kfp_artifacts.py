"""KFP artifacts the Kubeflow UI shows (#31.4): typed outputs in the compiled YAML (Dataset, Model, Metrics,
ClassificationMetrics, HTML), the ROC curve of a binary task as KFP's own ``log_roc_curve`` writes it, the run report
as the last task's HTML artifact, and the archived Model's metadata (version, content hash) in kfp.local's outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from heteroflow.components.models import onnx as hf_onnx


def _output_types(ir: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Component name -> {output artifact: schema title}."""
    return {
        name: {out: spec["artifactType"]["schemaTitle"] for out, spec in comp.get("outputDefinitions", {}).get("artifacts", {}).items()}
        for name, comp in ir["components"].items()
    }


def test_the_compiled_pipeline_declares_every_artifact_type_the_ui_shows(tmp_path: Path) -> None:
    from kfp import components

    from heteroflow.components.resources import Candidates
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.kfp.render import compile_pipeline

    path = compile_pipeline(default_pipeline(train_candidates=Candidates(["gpu", "cpu"])), tmp_path / "p.yaml")
    components.load_component_from_file(str(path))  # KFP's own loader takes it
    ir = next(yaml.safe_load_all(path.read_text()))
    types = _output_types(ir)
    assert types["comp-prewarm"] == {"dataset": "system.Dataset"}
    assert types["comp-preprocess"] == {"shards": "system.Dataset"}
    assert types["comp-train"] == {"model": "system.Model", "metrics": "system.Metrics"}
    assert types["comp-evaluate"] == {"metrics": "system.Metrics", "classification": "system.ClassificationMetrics"}
    assert types["comp-archive"] == {"archived": "system.Model"}
    assert types["comp-heteroflow-check"] == {"report": "system.HTML"}
    # the check task is the run's last task: it reads every call's route
    check = ir["root"]["dag"]["tasks"]["heteroflow-check"]
    assert set(check["inputs"]["parameters"]) == {f"route_{c}" for c in ("prewarm", "preprocess", "plan", "train", "evaluate", "archive")}


# --- ROC ---------------------------------------------------------------------------------------------------


def test_the_roc_metadata_is_what_kfps_log_roc_curve_writes() -> None:
    from kfp.dsl import ClassificationMetrics
    from sklearn.metrics import roc_auc_score

    from heteroflow.components.models.evaluate import EVALUATE, roc_curve

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    scores = np.clip(y * 0.3 + rng.random(400) * 0.7, 0, 1)
    roc = roc_curve(y, scores)
    assert roc["auc"] == pytest.approx(roc_auc_score(y, scores))
    assert roc["fpr"][0] == 0.0 and roc["tpr"][-1] == 1.0 and roc["thresholds"][0] == 1.0  # sklearn's inf, as 1.0
    assert all(np.isfinite(roc["thresholds"])) and np.all(np.diff(roc["fpr"]) >= 0)
    facts = {"classes": ["no", "yes"], "confusion_matrix": [[150, 50], [40, 160]], "roc": {"positive_class": "yes", **roc}}
    spec = next(s for s in EVALUATE.outputs if s.name == "classification")
    kfp = ClassificationMetrics()
    kfp.log_confusion_matrix(["no", "yes"], [[150, 50], [40, 160]])
    kfp.log_roc_curve(roc["fpr"], roc["tpr"], roc["thresholds"])
    assert spec.metadata_for(facts) == kfp.metadata
    metrics = next(s for s in EVALUATE.outputs if s.name == "metrics")
    assert "roc_auc" not in metrics.metadata_for({**facts, "accuracy": 0.8, "precision": {"no": 1, "yes": 1}, "recall": {"no": 1, "yes": 1}, "roc": None})
    assert metrics.metadata_for({**facts, "accuracy": 0.8, "precision": {"no": 1, "yes": 1}, "recall": {"no": 1, "yes": 1}})["roc_auc"] == roc["auc"]
    # three or more classes: a confusion matrix and no curve
    assert "confidenceMetrics" not in spec.metadata_for({"classes": ["a", "b", "c"], "confusion_matrix": [[1, 0, 0], [0, 1, 0], [0, 0, 1]], "roc": None})


def test_a_long_roc_curve_is_thinned_to_its_cap_with_both_ends_kept() -> None:
    from heteroflow.components.models.evaluate import roc_curve

    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 20_000)
    scores = rng.random(20_000)
    full = roc_curve(y, scores, max_points=10**9)
    thin = roc_curve(y, scores, max_points=50)
    assert len(full["fpr"]) > 50 and len(thin["fpr"]) == 50 and thin["auc"] == full["auc"]  # the area uses every point
    assert (thin["fpr"][0], thin["tpr"][0], thin["fpr"][-1], thin["tpr"][-1]) == (0.0, 0.0, 1.0, 1.0)
    with pytest.raises(Exception, match="one class only"):
        roc_curve(np.ones(10, dtype=int), np.linspace(0, 1, 10))


@pytest.mark.slow
def test_evaluate_gives_no_curve_for_ten_classes(digits_shards: Path, digits_model: Path) -> None:
    from heteroflow.components.models.evaluate import evaluate

    result = evaluate(digits_shards, digits_model)  # the session's trained model (conftest.py), read only
    assert len(result.classes) == 10 and result.roc is None


# --- the run report as an HTML artifact ----------------------------------------------------------------------


class _Artifact:
    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.metadata: dict[str, Any] = {}


def test_the_report_artifact_without_a_run_folder_shows_the_routes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.pipelines.kfp.artifacts import write_report_artifact

    monkeypatch.setenv("HETEROFLOW_RUN_ID", "kfp-run-7")
    report = _Artifact(tmp_path / "out" / "report")
    steps = {"prewarm": "heteroflow.cache.prewarm:PREWARM", "train": "heteroflow.components.training.step:TRAIN", "archive": "x:y"}
    routes = {"prewarm": "succeeded", "train": "failed: permanent: ValueError: bad label", "archive": "upstream"}
    write_report_artifact(report, pipeline="my-pipe", steps=steps, routes=routes)
    html = Path(report.path).read_text()
    assert html.startswith("<!DOCTYPE html>") and "kfp-run-7" in html and "my-pipe" in html
    assert 'data-step="train"' in html and "bad label" in html and "not run" in html
    assert report.metadata == {"run_id": "kfp-run-7", "status": "failed", "pipeline": "my-pipe"}
    write_report_artifact(None, pipeline="p", steps={}, routes={})  # no artifact asked for: nothing written, no error


# --- kfp.local: a binary task end to end ---------------------------------------------------------------------


def _executor_outputs(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Task folder name -> {output artifact: its metadata}, from kfp.local's executor_output.json files."""
    out: dict[str, dict[str, Any]] = {}
    for f in run_dir.glob("kfp/*/*/executor_output.json"):
        data = json.loads(f.read_text())
        out[f.parent.name] = {name: a["artifacts"][0].get("metadata", {}) for name, a in data.get("artifacts", {}).items()}
    return out


@pytest.mark.slow
def test_kfp_local_outputs_carry_roc_report_and_the_archived_version(tmp_path: Path, heteroflow_home: Path) -> None:
    import pandas as pd
    from sklearn.datasets import load_breast_cancer

    from heteroflow.components.models.archive import content_sha256
    from heteroflow.pipelines.kfp.local import run_local

    frame = load_breast_cancer(as_frame=True).frame
    frame["diagnosis"] = np.where(frame.pop("target") == 0, "malignant", "benign")
    (tmp_path / "cancer").mkdir()
    frame.to_csv(tmp_path / "cancer" / "cancer.csv", index=False)
    params: dict[str, Any] = {"dataset_uri": str(tmp_path / "cancer"), "epochs": 3}
    if not hf_onnx.missing_onnx_packages():
        params["export_formats"] = "onnx"
    record = run_local(params, run_dir=tmp_path / "run")
    assert record.status == "succeeded", record.error
    outputs = _executor_outputs(tmp_path / "run")

    evaluated = record.results["evaluate"]
    roc = evaluated["roc"]
    assert evaluated["classes"] == ["benign", "malignant"] and roc["positive_class"] == "malignant"
    points = outputs["evaluate"]["classification"]["confidenceMetrics"]
    assert [p["falsePositiveRate"] for p in points] == roc["fpr"] and [p["recall"] for p in points] == roc["tpr"]
    assert len(points) >= 3 and outputs["evaluate"]["metrics"]["roc_auc"] == pytest.approx(roc["auc"]) and roc["auc"] > 0.8
    assert outputs["evaluate"]["classification"]["confusionMatrix"]["rows"] == [{"row": r} for r in evaluated["confusion_matrix"]]

    archived = outputs["archive"]["archived"]
    version_dir = Path(archived["path"])
    lineage = json.loads((version_dir / "lineage.json").read_text())
    assert (archived["name"], archived["version"]) == (record.results["archive"]["name"], record.results["archive"]["version"])
    assert archived["model_sha256"] == lineage["model_sha256"] == content_sha256(version_dir / "model")
    assert archived["run_id"] == record.run_id and archived["dataset_sha256"] == lineage["dataset"]["dataset_sha256"]
    assert archived["formats"] == sorted(lineage["formats"]) and ("onnx" in archived["formats"]) == ("export_formats" in params)

    report = outputs["heteroflow-check"]["report"]
    assert report == {"run_id": record.run_id, "status": "succeeded", "pipeline": record.pipeline}
    html = next((tmp_path / "run").glob("kfp/*/heteroflow-check/report")).read_text()
    assert f"<b>{archived['name']}:v{archived['version']}</b>" in html  # the lineage section, down to the archived version
    assert all(f'data-step="{c}"' in html for c in ("prewarm", "preprocess", "train", "evaluate", "archive"))
