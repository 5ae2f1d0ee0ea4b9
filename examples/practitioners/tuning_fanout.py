"""A tuning fan-out, as a KFP user writes it: one trial per learning rate (each trains and evaluates), the
collected accuracies choose the best, and a condition on the best archives it.

KFP original, for comparison::

    with dsl.ParallelFor(learning_rates) as lr:
        model = train(data=data.outputs["data"], learning_rate=lr)
        acc = evaluate(data=data.outputs["data"], model=model.outputs["model"])
    best = choose_best(accuracies=dsl.Collected(acc.output), learning_rates=learning_rates)
    with dsl.If(best.outputs["best_accuracy"] >= 0.8):
        archive(...)

Run it (with examples/ on PYTHONPATH, so that step processes import this module)::

    heteroflow run --pipeline practitioners.tuning_fanout:pipeline -p learning_rates='[1.0, 0.1, 0.001]'
    heteroflow compile --pipeline practitioners.tuning_fanout:pipeline -o tuning.yaml

The steps are plain NumPy (logistic regression on two Gaussian blobs) so that a trial takes milliseconds.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

from heteroflow import ArtifactSpec, ArtifactType, Collected, Else, If, ParallelFor, Pipeline, step


def make_dataset(data: str, samples: int = 400, seed: int = 0) -> dict:
    """Two Gaussian blobs, split 3:1 into train and test rows.

    Args:
        data: output file (.npz).
        samples: how many rows (unit: rows).
        seed: random seed.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, samples)
    x = rng.normal(size=(samples, 2)) + np.where(y[:, None] == 1, 1.5, -1.5)
    cut = samples * 3 // 4
    with open(data, "wb") as f:
        np.savez(f, x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:])
    return {"rows": samples}


def _fit(data: str, learning_rate: float, epochs: int) -> list[float]:
    import numpy as np

    d = np.load(data)
    x, y = d["x_train"], d["y_train"]
    w = np.zeros(3)
    xb = np.hstack([x, np.ones((len(x), 1))])
    for _ in range(epochs):
        p = 1 / (1 + np.exp(-xb @ w))
        w -= learning_rate * xb.T @ (p - y) / len(y)
    return [float(v) for v in w]


def train(data: str, model: str, learning_rate: float, epochs: int = 20) -> dict:
    """Logistic regression by gradient descent.

    Args:
        data: the data set (.npz).
        model: output file (the weights, JSON).
        learning_rate: the step size of gradient descent.
        epochs: passes over the training rows.
    """
    weights = _fit(data, learning_rate, epochs)
    with open(model, "w", encoding="utf-8") as f:
        json.dump({"weights": weights, "learning_rate": learning_rate}, f)
    return {"learning_rate": learning_rate}


def evaluate(data: str, model: str) -> float:
    """Accuracy of the model on the test rows (a fraction in [0, 1]).

    Args:
        data: the data set (.npz).
        model: the weights (JSON).
    """
    import numpy as np

    d = np.load(data)
    w = np.array(json.load(open(model, encoding="utf-8"))["weights"])
    xb = np.hstack([d["x_test"], np.ones((len(d["x_test"]), 1))])
    return float(((xb @ w > 0).astype(int) == d["y_test"]).mean())


class Best(NamedTuple):
    best_learning_rate: float
    best_accuracy: float


def choose_best(accuracies: list, learning_rates: list) -> Best:
    """The learning rate of the most accurate trial (the first one on a tie).

    Args:
        accuracies: one accuracy per trial, in the order of learning_rates.
        learning_rates: the trials' learning rates.
    """
    if len(accuracies) != len(learning_rates):
        raise ValueError(f"{len(accuracies)} accuracies for {len(learning_rates)} learning rates")
    best = max(range(len(accuracies)), key=lambda i: (accuracies[i], -i))
    return Best(float(learning_rates[best]), float(accuracies[best]))


def archive(data: str, archive_dir: str, learning_rate: float, accuracy: float, epochs: int = 20) -> dict:
    """Retrain with the best learning rate and archive the model as a new version (never overwriting one).

    Args:
        data: the data set (.npz).
        archive_dir: the archive folder; empty: ``$HETEROFLOW_RUN_DIR/archive`` (or ./archive).
        learning_rate: the chosen learning rate.
        accuracy: its test accuracy.
        epochs: passes over the training rows.
    """
    folder = archive_dir or os.path.join(os.environ.get("HETEROFLOW_RUN_DIR", "."), "archive")
    os.makedirs(folder, exist_ok=True)
    version = 1 + sum(1 for n in os.listdir(folder) if n.startswith("v"))
    target = os.path.join(folder, f"v{version}.json")
    record = {"weights": _fit(data, learning_rate, epochs), "learning_rate": learning_rate, "accuracy": accuracy}
    with open(target + ".partial", "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.link(target + ".partial", target)  # fails if the version exists: an archived model is never overwritten
    os.unlink(target + ".partial")
    return {"archived": target, "version": version}


def not_good_enough(accuracy: float, threshold: float = 0.8) -> dict:
    """Say that no trial reached the threshold (nothing is archived).

    Args:
        accuracy: the best accuracy.
        threshold: the accuracy an archived model needs.
    """
    print(f"best accuracy {accuracy:.3f} < {threshold}: nothing archived")
    return {"accuracy": accuracy}


MAKE_DATASET = step(make_dataset, outputs=[ArtifactSpec(name="data", type=ArtifactType.DATASET, param="data")])
TRAIN = step(
    train,
    inputs=[ArtifactSpec(name="data", type=ArtifactType.DATASET, param="data")],
    outputs=[ArtifactSpec(name="model", type=ArtifactType.MODEL, param="model")],
)
EVALUATE = step(
    evaluate,
    inputs=[
        ArtifactSpec(name="data", type=ArtifactType.DATASET, param="data"),
        ArtifactSpec(name="model", type=ArtifactType.MODEL, param="model"),
    ],
)
CHOOSE_BEST = step(choose_best)
ARCHIVE = step(archive, inputs=[ArtifactSpec(name="data", type=ArtifactType.DATASET, param="data")])
NOT_GOOD_ENOUGH = step(not_good_enough)

pipeline = Pipeline("tuning-fanout", description="one trial per learning rate; the best one is archived if accurate enough")
data = pipeline.add(MAKE_DATASET)
learning_rates = pipeline.param("learning_rates", default=[1.0, 0.1, 0.001], help="one trial per learning rate")
with ParallelFor(learning_rates, name="trials") as lr:
    trained = pipeline.add(TRAIN, data=data.outputs.data, learning_rate=lr)
    scored = pipeline.add(EVALUATE, data=data.outputs.data, model=trained.outputs.model)
best = pipeline.add(CHOOSE_BEST, accuracies=Collected(scored.output), learning_rates=learning_rates)
with If(best.outputs["best_accuracy"] >= 0.8, name="accurate enough"):
    pipeline.add(
        ARCHIVE,
        data=data.outputs.data,
        learning_rate=best.outputs["best_learning_rate"],
        accuracy=best.outputs["best_accuracy"],
        archive_dir="",
    )
with Else(name="not accurate enough"):
    pipeline.add(NOT_GOOD_ENOUGH, accuracy=best.outputs["best_accuracy"], threshold=0.8)
