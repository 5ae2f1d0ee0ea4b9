"""The steps as KFP v2 lightweight components.

:func:`make_components` builds the six components for a container image that has heteroflow installed. The
component bodies are one call into :mod:`heteroflow.components.steps` (KFP runs a lightweight component's
source text in the executor, so each body imports what it uses). ``install_kfp_package=False``: the image
provides kfp and heteroflow (heteroflow is not on PyPI, so it cannot be pip-installed at run time).

Artifacts are typed (``Dataset``, ``Model``, ``Metrics``, ``ClassificationMetrics``) so the Kubeflow UI
shows lineage from the data set to the archived model.
"""


import dataclasses
from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, ClassificationMetrics, Dataset, Input, Metrics, Model, Output
from kfp.dsl.python_component import PythonComponent

__all__ = ["DEFAULT_IMAGE", "Components", "make_components"]

DEFAULT_IMAGE = "heteroflow-python:0.1.0"
"""Default base image: an image with ``pip install heteroflow[all]`` inside (see the README). The name
contains "python" because kfp.local's SubprocessRunner warns on images that do not."""


def prewarm(source_uri: str, cache_root: str, dataset: Output[Dataset]) -> NamedTuple(
    "PrewarmOutputs", [("dataset_sha256", str), ("files_copied", int)]
):
    """Copy the data set at source_uri into the cache tier; the Dataset artifact holds its manifest."""
    from typing import NamedTuple as _NT

    from heteroflow.components.steps import prewarm_step

    facts = prewarm_step(source_uri=source_uri, cache_root=cache_root, dataset=dataset)
    out = _NT("PrewarmOutputs", [("dataset_sha256", str), ("files_copied", int)])
    return out(facts["dataset_sha256"], facts["files_copied"])


def preprocess(
    dataset: Input[Dataset],
    validation_fraction: float,
    test_fraction: float,
    seed: int,
    num_workers: int,
    shards: Output[Dataset],
):
    """Split (stratified, seeded), normalise and shard the data set on CPU workers."""
    from heteroflow.components.steps import preprocess_step

    preprocess_step(
        dataset=dataset,
        shards=shards,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
        seed=seed,
        num_workers=num_workers,
    )


def plan(candidates_json: str, device_inventory: str, placement: Output[Artifact]) -> int:
    """Pick the first candidate whose device exists; return its index (0 = preferred).

    device_inventory: JSON {"gpu": N, "npu": M} of the devices the job may get (set it on a cluster, where
    this pod has no accelerator to probe); empty: probe with PyTorch where the step runs.

    The placement artifact (JSON) says which device and why earlier candidates were passed over. A single
    ``int`` output, because kfp.local resolves ``dsl.If`` conditions only on a task's single ``Output``.
    """
    from heteroflow.components.steps import plan_step

    return plan_step(candidates_json=candidates_json, device_inventory=device_inventory, placement=placement)["index"]


def train(
    shards: Input[Dataset],
    torch_device: str,
    device_kind: str,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    hidden_units: int,
    seed: int,
    checkpoint_every_steps: int,
    checkpoint_root: str,
    model: Output[Model],
    metrics: Output[Metrics],
):
    """Train the classifier on the chosen device, checkpointing atomically and resuming after a restart."""
    from heteroflow.components.steps import train_step

    train_step(
        shards=shards,
        model=model,
        metrics=metrics,
        torch_device=torch_device,
        device_kind=device_kind,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        hidden_units=hidden_units,
        seed=seed,
        checkpoint_every_steps=checkpoint_every_steps,
        checkpoint_root=checkpoint_root,
    )


def evaluate(
    shards: Input[Dataset],
    model: Input[Model],
    torch_device: str,
    metrics: Output[Metrics],
    classification: Output[ClassificationMetrics],
):
    """Accuracy, per-class precision and recall, and the confusion matrix on the test split."""
    from heteroflow.components.steps import evaluate_step

    evaluate_step(shards=shards, model=model, torch_device=torch_device, metrics=metrics, classification=classification)


def archive(
    dataset: Input[Dataset],
    shards: Input[Dataset],
    model: Input[Model],
    eval_metrics: Input[Metrics],
    archive_root: str,
    model_name: str,
    archived: Output[Model],
) -> str:
    """Store the model, its metrics and lineage under an immutable versioned path; return that path."""
    from heteroflow.components.steps import archive_step

    return archive_step(
        dataset=dataset,
        shards=shards,
        model=model,
        eval_metrics=eval_metrics,
        archive_root=archive_root,
        model_name=model_name,
        archived=archived,
    )["path"]


@dataclasses.dataclass(frozen=True)
class Components:
    """The six KFP components built for one image."""

    prewarm: PythonComponent
    preprocess: PythonComponent
    plan: PythonComponent
    train: PythonComponent
    evaluate: PythonComponent
    archive: PythonComponent


def make_components(image: str = DEFAULT_IMAGE) -> Components:
    """Build the components for ``image`` (a container image with heteroflow and kfp installed)."""

    def build(func):  # type: ignore[no-untyped-def]
        return dsl.component(func, base_image=image, install_kfp_package=False)

    return Components(
        prewarm=build(prewarm),
        preprocess=build(preprocess),
        plan=build(plan),
        train=build(train),
        evaluate=build(evaluate),
        archive=build(archive),
    )
