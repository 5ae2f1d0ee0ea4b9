"""Evaluate: accuracy, per-class precision and recall, and the confusion matrix on the test split, for any model a
factory built (``model.json`` names the factory and its arguments) and any data kind the readers read; for a binary
task also the ROC curve and its area (KFP's ``ClassificationMetrics`` shows the curve in the Kubeflow UI)."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import TYPE_CHECKING, Any

from heteroflow.cache.errors import DatasetError
from heteroflow.components.errors import NonFiniteError
from heteroflow.components.training.model_files import load_model
from heteroflow.components.resources import Resources, RetryPolicy
from heteroflow.components.core.step import ArtifactSpec, ArtifactType, Step, step

if TYPE_CHECKING:  # numpy is imported where it is used: the command line imports this module to define the step
    import numpy as np

__all__ = ["ROC_MAX_POINTS", "EvalResult", "check_finite_metrics", "classification_report", "evaluate", "roc_curve"]

ROC_MAX_POINTS = 200
"""Most points of the ROC curve kept in the facts and the artifact's metadata (evenly spaced, ends kept)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EvalResult:
    """Test-split metrics.

    Attributes:
        accuracy: share of correct predictions, in [0, 1].
        precision / recall: per class name, in [0, 1] (0.0 where the class is never predicted / present).
        confusion_matrix: ``matrix[i][j]`` = samples of true class i predicted as class j, shape ``(k, k)``.
        classes: class names, index = label id.
        samples: test samples.
        device: torch device used.
        seconds: wall time, seconds.
        roc: binary tasks: ``{"positive_class", "fpr", "tpr", "thresholds", "auc"}`` (:func:`roc_curve`); else None.
    """

    accuracy: float
    precision: dict[str, float]
    recall: dict[str, float]
    confusion_matrix: list[list[int]]
    classes: tuple[str, ...]
    samples: int
    device: str
    seconds: float
    roc: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def classification_report(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """Accuracy, precision ``(k,)``, recall ``(k,)`` and confusion matrix ``(k, k)`` of integer labels.

    Precision of class c = TP / (TP + FP), recall = TP / (TP + FN); 0 when the denominator is 0 (the
    ``zero_division=0`` convention of scikit-learn).

    Raises:
        DatasetError: a label outside ``0..num_classes-1`` (a dataset factory's split holds a class the model
            was not built for; it was a bare IndexError of ``np.add.at``).
    """
    import numpy as np

    bad = (y_true < 0) | (y_true >= num_classes)
    if bad.any():
        raise DatasetError(
            f"label {int(y_true[bad][0])} is outside the model's {num_classes} classes (0..{num_classes - 1}) in "
            f"{int(bad.sum())} sample(s); valid: labels of classes the model was built for (a dataset_factory's "
            "splits share one set of classes: give its train split a classes attribute listing them all)")
    cm = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(cm, (y_true, y_pred), 1)
    tp = np.diag(cm).astype(np.float64)
    predicted = cm.sum(axis=0)
    actual = cm.sum(axis=1)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, actual, out=np.zeros_like(tp), where=actual > 0)
    accuracy = float(tp.sum() / max(len(y_true), 1))
    return accuracy, precision, recall, cm


def roc_curve(y_true: np.ndarray, scores: np.ndarray, *, max_points: int = ROC_MAX_POINTS) -> dict[str, Any]:
    """The ROC curve of a binary task: scikit-learn's ``roc_curve`` (``drop_intermediate=True``) and ``auc``.

    Args:
        y_true: labels ``(n,)``, 1 = the positive class.
        scores: the positive class's probability ``(n,)``, in [0, 1].
        max_points: most points kept (evenly spaced, first and last kept); the area is computed on every point.

    Returns:
        ``{"fpr", "tpr", "thresholds", "auc"}``: false positive rate, true positive rate (recall) and the score
        threshold of each point, ascending in fpr; the first point (nothing predicted positive) has threshold 1.0
        where scikit-learn writes infinity (a probability never exceeds 1, and JSON has no infinity).

    Raises:
        DatasetError: ``y_true`` holds one class only (no curve exists).
    """
    import numpy as np
    from sklearn.metrics import auc
    from sklearn.metrics import roc_curve as sk_roc_curve

    if len(np.unique(y_true)) < 2:
        raise DatasetError("the test split holds one class only: no ROC curve")
    fpr, tpr, thresholds = sk_roc_curve(y_true, scores, drop_intermediate=True)
    area = float(auc(fpr, tpr))
    thresholds = np.minimum(thresholds, 1.0)
    if len(fpr) > max_points:
        keep = np.unique(np.linspace(0, len(fpr) - 1, max_points).round().astype(int))
        fpr, tpr, thresholds = fpr[keep], tpr[keep], thresholds[keep]
    return {"fpr": [float(v) for v in fpr], "tpr": [float(v) for v in tpr],
            "thresholds": [float(v) for v in thresholds], "auc": area}


def check_finite_metrics(metrics: dict[str, float]) -> None:
    """Every metric is a finite number (a NaN cannot be logged to KFP nor written as JSON).

    Raises:
        NonFiniteError: names the first metric that is NaN or infinite.
    """
    for name, value in metrics.items():
        if not math.isfinite(value):
            raise NonFiniteError(f"metric {name} is {value}, not a finite number")


def evaluate(dataset_dir: str | os.PathLike[str], model_dir: str | os.PathLike[str], *, device: str = "cpu") -> EvalResult:
    """Score a trained model on the ``test`` split.

    Args:
        dataset_dir: preprocess output.
        model_dir: train output.
        device: torch device string.

    Raises:
        DatasetError / CheckpointError: inputs are not preprocess / train output.
        DeviceUnavailable: the device is absent.
        NonFiniteError: the model's outputs on the test split, or a metric, are NaN or infinite.
    """
    import torch  # imported before the clock starts: seconds measure the evaluation, not the import

    from heteroflow.components.data.readers import open_splits
    from heteroflow.components.training.batches import auto_workers, make_loader

    started = time.perf_counter()
    model, config = load_model(model_dir, device)
    dev = next(model.parameters()).device
    splits = open_splits(dataset_dir, info=config.get("data"))
    if splits.test is None:
        raise DatasetError(f"{dataset_dir} has an empty test split; nothing to evaluate")
    loader = make_loader(splits.test, batch_size=512, seed=0, shuffle=False,
                         num_workers=auto_workers(splits.in_memory, -1), device=dev)
    binary = len(config["classes"]) == 2
    ys, preds, finites, scores = [], [], [], []
    with torch.no_grad():
        for xb, yb in loader:
            logits = model(xb.to(dev, non_blocking=True)).float()
            finites.append(torch.isfinite(logits).all(dim=1).cpu())
            preds.append(logits.argmax(dim=1).cpu())
            if binary:
                scores.append(torch.softmax(logits, dim=1)[:, 1].cpu())
            ys.append(yb)
    y = torch.cat(ys).numpy()
    pred = torch.cat(preds).numpy()
    finite = torch.cat(finites).numpy()
    if not finite.all():
        raise NonFiniteError(
            f"the model's outputs are not finite numbers for {int((~finite).sum())} of {len(finite)} test samples "
            f"(first: sample {int((~finite).argmax())}): its weights or the test features hold NaN or infinity; "
            "train again with a lower learning_rate"
        )
    classes = tuple(config["classes"])
    accuracy, precision, recall, cm = classification_report(y, pred, len(classes))
    roc = None
    if binary and len(set(y.tolist())) == 2:  # a test split of one class has no curve
        roc = {"positive_class": classes[1], **roc_curve(y, torch.cat(scores).numpy())}
    check_finite_metrics({"accuracy": accuracy, **{f"precision_{c}": p for c, p in zip(classes, precision)},
                          **{f"recall_{c}": r for c, r in zip(classes, recall)}})
    return EvalResult(
        accuracy=accuracy,
        precision={c: float(p) for c, p in zip(classes, precision)},
        recall={c: float(r) for c, r in zip(classes, recall)},
        confusion_matrix=cm.tolist(),
        classes=classes,
        samples=int(len(y)),
        device=str(dev),
        seconds=time.perf_counter() - started,
        roc=roc,
    )


# --- the step definition ----------------------------------------------------------------------------------

_HOUR = 3600.0


def _eval_metrics(facts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"accuracy": facts["accuracy"]}
    for c in facts["classes"]:
        out[f"precision_{c}"] = facts["precision"][c]
        out[f"recall_{c}"] = facts["recall"][c]
    if facts.get("roc"):
        out["roc_auc"] = facts["roc"]["auc"]
    return out


def _confusion_matrix(facts: dict[str, Any]) -> dict[str, Any]:
    """KFP's ClassificationMetrics metadata: what ``log_confusion_matrix`` writes, and for a binary task what
    ``log_roc_curve`` writes (``confidenceMetrics``, one point per threshold of the positive class's probability)."""
    classes = list(facts["classes"])
    out: dict[str, Any] = {
        "confusionMatrix": {
            "annotationSpecs": [{"displayName": c} for c in classes],
            "rows": [{"row": list(row)} for row in facts["confusion_matrix"]],
        }
    }
    roc = facts.get("roc")
    if roc:
        out["confidenceMetrics"] = [
            {"confidenceThreshold": t, "recall": r, "falsePositiveRate": f}
            for f, r, t in zip(roc["fpr"], roc["tpr"], roc["thresholds"])
        ]
    return out


def _eval_summary(f: dict[str, Any]) -> list[str]:
    per_class = ", ".join(f"{c}: {f['precision'][c]:.3f}/{f['recall'][c]:.3f}" for c in f["classes"])
    roc = f.get("roc")
    return [
        f"test accuracy: {f['accuracy']:.4f} on {f['samples']} samples",
        f"per class (precision/recall): {per_class}",
    ] + ([f"ROC AUC: {roc['auc']:.4f} (positive class {roc['positive_class']})"] if roc else [])


EVALUATE: Step = step(
    evaluate,
    name="evaluate",
    inputs=[
        ArtifactSpec(name="shards", type=ArtifactType.DATASET, param="dataset_dir"),
        ArtifactSpec(name="model", type=ArtifactType.MODEL, param="model_dir"),
    ],
    outputs=[
        ArtifactSpec(name="metrics", type=ArtifactType.METRICS, help="accuracy, per-class precision and recall", metadata=_eval_metrics),
        ArtifactSpec(name="classification", type=ArtifactType.CLASSIFICATION_METRICS, help="confusion matrix; ROC curve for two classes", metadata=_confusion_matrix),
    ],
    # Evaluation of the test split is small: on the CPU by default, as practitioners do.
    candidates=[Resources(kind="cpu", cpu="2", memory="4Gi")],
    retry=RetryPolicy(retries=1, backoff_seconds=5, max_delay_seconds=60, window_seconds=2 * _HOUR),
    device_bound=True,
    device_param="device",
    summary=_eval_summary,
    ref="heteroflow.components.models.evaluate:EVALUATE",
)
