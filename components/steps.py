"""Step adapters: run one step function against artifact objects and record the attempt.

These are what the KFP components (and, later, the Airflow tasks) call; each takes artifacts by duck type
(anything with ``.path`` and a ``.metadata`` dict, as ``kfp.dsl.Artifact`` has), so the step logic is
written once and runs without KFP. Each adapter:

- wraps the work in :func:`heteroflow.components.telemetry.step_attempt` (device, attempts, seconds);
- writes facts into the output artifacts' ``metadata`` (shown by the Kubeflow UI);
- resolves local defaults (empty ``cache_root`` -> the local cache tier) inside the function, never at import.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

from heteroflow.cache.locations import home_dir, local_cache_dir
from heteroflow.cache.prewarm import MANIFEST_NAME, Manifest, cache_key, prewarm
from heteroflow.components.telemetry import step_attempt

__all__ = ["archive_step", "evaluate_step", "plan_step", "prewarm_step", "preprocess_step", "train_step"]


class ArtifactLike(Protocol):
    path: str
    metadata: dict[str, Any]


def _log_metric(metrics: ArtifactLike, key: str, value: float) -> None:
    """``metrics.log_metric`` on a KFP Metrics artifact; a plain metadata entry on anything else."""
    log = getattr(metrics, "log_metric", None)
    if log is not None:
        log(key, value)
    else:
        metrics.metadata[key] = value


def prewarm_step(*, source_uri: str, cache_root: str, dataset: ArtifactLike) -> dict[str, Any]:
    """Prewarm ``source_uri`` into ``<cache_root or local cache>/<cache key>``; ``dataset`` gets the manifest.

    Returns:
        ``dataset_sha256``, ``files_copied``, ``files_skipped``, ``bytes_copied``, ``cache_dir``.
    """
    with step_attempt("prewarm") as rec:
        root = Path(cache_root) if cache_root else local_cache_dir()
        result = prewarm(source_uri, root / cache_key(source_uri))
        out = Path(dataset.path)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(result.manifest_path, out / MANIFEST_NAME)
        facts = {
            "dataset_sha256": result.manifest.dataset_sha256,
            "files": len(result.manifest.files),
            "total_bytes": result.manifest.total_bytes,
            "files_copied": result.files_copied,
            "files_skipped": result.files_skipped,
            "bytes_copied": result.bytes_copied,
            "cache_dir": result.manifest.root,
            "source_uri": source_uri,
        }
        dataset.metadata.update(facts)
        rec.compute_seconds = result.seconds
        rec.details = facts
    return facts


def preprocess_step(
    *,
    dataset: ArtifactLike,
    shards: ArtifactLike,
    validation_fraction: float,
    test_fraction: float,
    seed: int,
    num_workers: int,
) -> dict[str, Any]:
    """Preprocess the prewarmed data set (its manifest in ``dataset``) into ``shards``.

    Args:
        num_workers: parser processes; 0 means every CPU core this step is given.
    """
    from heteroflow.components.preprocess import preprocess

    with step_attempt("preprocess") as rec:
        result = preprocess(
            Path(dataset.path) / MANIFEST_NAME,
            shards.path,
            validation_fraction=validation_fraction,
            test_fraction=test_fraction,
            seed=seed,
            num_workers=num_workers or None,
        )
        facts = {
            "counts": result.counts,
            "num_features": result.num_features,
            "num_classes": len(result.classes),
            "num_workers": result.num_workers,
        }
        shards.metadata.update(facts)
        rec.compute_seconds = result.seconds
        rec.details = facts
    return facts


def plan_step(*, candidates_json: str, placement: ArtifactLike, device_inventory: str = "") -> dict[str, Any]:
    """Choose a candidate for the device-bound steps; ``placement`` gets the decision as JSON.

    Args:
        device_inventory: JSON ``{"gpu": N, "npu": M}`` of the devices the job may get; empty: probe this
            process's devices with PyTorch.

    Returns:
        The :class:`~heteroflow.components.plan.Placement` as a dict.
    """

    from heteroflow.components.plan import plan
    from heteroflow.components.resources import Candidates

    with step_attempt("plan") as rec:
        t0 = time.perf_counter()
        from heteroflow.components.plan import Inventory, local_inventory

        inventory = Inventory.from_json(device_inventory) if device_inventory.strip() else local_inventory
        chosen = plan(Candidates.from_json(candidates_json), inventory=inventory).to_dict()
        rec.compute_seconds = time.perf_counter() - t0
        rec.device = chosen["torch_device"]
        Path(placement.path).write_text(json.dumps(chosen, indent=2), encoding="utf-8")
        placement.metadata.update({k: chosen[k] for k in ("index", "device_kind", "torch_device")})
        placement.metadata["passed_over"] = "; ".join(chosen["passed_over"]) or "none"
        rec.details = chosen
    return chosen


def train_step(
    *,
    shards: ArtifactLike,
    model: ArtifactLike,
    metrics: ArtifactLike,
    torch_device: str,
    device_kind: str,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    hidden_units: int,
    seed: int,
    checkpoint_every_steps: int,
    checkpoint_root: str,
) -> dict[str, Any]:
    """Train on ``torch_device``; ``model`` gets the weights, ``metrics`` the throughput and loss.

    ``device_kind`` is an input so that KFP's cache key, which ignores resources, differs per device kind.
    """
    from heteroflow.components.train import train

    with step_attempt("train", device=torch_device) as rec:
        result = train(
            shards.path,
            model.path,
            device=torch_device,
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=learning_rate,
            hidden_units=hidden_units,
            seed=seed,
            checkpoint_every_steps=checkpoint_every_steps,
            checkpoint_root=checkpoint_root or None,
        )
        facts = {
            "device": result.device,
            "device_kind": device_kind,
            "steps": result.steps,
            "resumed_from_step": result.resumed_from_step,
            "checkpoints_written": result.checkpoints_written,
            "samples_per_second": round(result.samples_per_second, 1),
            "final_loss": result.final_loss,
            "validation_accuracy": result.validation_accuracy,
        }
        model.metadata.update({"framework": "pytorch", "device": result.device, "device_kind": device_kind})
        for key in ("samples_per_second", "final_loss", "validation_accuracy", "steps", "resumed_from_step"):
            if facts[key] is not None:
                _log_metric(metrics, key, facts[key])
        rec.device = result.device
        rec.compute_seconds = result.seconds
        rec.details = facts
    return facts


def evaluate_step(
    *, shards: ArtifactLike, model: ArtifactLike, torch_device: str, metrics: ArtifactLike, classification: ArtifactLike
) -> dict[str, Any]:
    """Score ``model`` on the test split; ``metrics`` gets accuracy and per-class precision/recall,
    ``classification`` the confusion matrix (``log_confusion_matrix`` when it is a KFP ClassificationMetrics)."""
    from heteroflow.components.evaluate import evaluate

    with step_attempt("evaluate", device=torch_device) as rec:
        result = evaluate(shards.path, model.path, device=torch_device)
        values: dict[str, float] = {"accuracy": result.accuracy}
        for c in result.classes:
            values[f"precision_{c}"] = result.precision[c]
            values[f"recall_{c}"] = result.recall[c]
        for key, value in values.items():
            _log_metric(metrics, key, value)
        if hasattr(classification, "log_confusion_matrix"):
            classification.log_confusion_matrix(list(result.classes), result.confusion_matrix)
        else:
            classification.metadata["confusionMatrix"] = {"categories": list(result.classes), "matrix": result.confusion_matrix}
        report = result.to_dict()
        Path(metrics.path).parent.mkdir(parents=True, exist_ok=True)
        Path(metrics.path).write_text(json.dumps(report, indent=2), encoding="utf-8")
        rec.device = result.device
        rec.compute_seconds = result.seconds
        rec.details = {"accuracy": result.accuracy, "samples": result.samples, "precision": result.precision, "recall": result.recall}
    return report


def archive_step(
    *,
    dataset: ArtifactLike,
    shards: ArtifactLike,
    model: ArtifactLike,
    eval_metrics: ArtifactLike,
    archive_root: str,
    model_name: str,
    archived: ArtifactLike,
) -> dict[str, Any]:
    """Archive ``model`` with its metrics and lineage under ``<archive_root or local>/<model_name>/v<N>``.

    Lineage: the data set manifest hash and source, the preprocess and train parameters (read from the
    artifacts themselves), the device that trained, and the code version.
    """

    from heteroflow.components.archive import archive
    from heteroflow.components.preprocess import read_meta

    with step_attempt("archive") as rec:
        t0 = time.perf_counter()
        manifest = Manifest.load(Path(dataset.path) / MANIFEST_NAME)
        meta = read_meta(shards.path)
        config = json.loads(Path(model.path, "model.json").read_text(encoding="utf-8"))
        report = json.loads(Path(eval_metrics.path).read_text(encoding="utf-8"))
        lineage = {
            "dataset": {
                "source_uri": manifest.source_uri,
                "dataset_sha256": manifest.dataset_sha256,
                "files": len(manifest.files),
                "total_bytes": manifest.total_bytes,
            },
            "preprocess": {k: meta[k] for k in ("seed", "validation_fraction", "test_fraction", "counts")},
            "train": config["params"],
            "device": model.metadata.get("device") or config["params"].get("device_type"),
            "device_kind": model.metadata.get("device_kind"),
        }
        root = Path(archive_root) if archive_root else home_dir() / "archive"
        result = archive(model.path, root, name=model_name, metrics=report, lineage=lineage)
        Path(archived.path).write_text(json.dumps({"path": str(result.path), "version": result.version}), encoding="utf-8")
        archived.metadata.update({"archive_path": str(result.path), "version": result.version, "name": model_name})
        rec.compute_seconds = time.perf_counter() - t0
        rec.details = {"path": str(result.path), "version": result.version, "name": model_name}
    return {"path": str(result.path), "version": result.version}
