"""A pipeline of pipelines, as a KFP user writes it: a data sub-pipeline and a training sub-pipeline, each a
Pipeline of its own (runnable and testable alone where it has no inputs), composed into one.

KFP original, for comparison::

    @dsl.pipeline
    def data_pipeline(samples: int) -> NamedTuple("Outputs", data=Dataset, rows=int): ...
    @dsl.pipeline
    def training_pipeline(data: Input[Dataset], learning_rate: float) -> NamedTuple("Outputs", model=Model, accuracy=float): ...
    @dsl.pipeline
    def end_to_end(samples: int = 400, learning_rate: float = 0.1):
        d = data_pipeline(samples=samples)
        t = training_pipeline(data=d.outputs["data"], learning_rate=learning_rate)
        report(rows=d.outputs["rows"], accuracy=t.outputs["accuracy"])

Compiled for KFP, each sub-pipeline is a nested DAG (its own node in the Kubeflow UI); Airflow gets a TaskGroup per
sub-pipeline; local engines run the calls in place. With examples/ on PYTHONPATH::

    heteroflow run --pipeline practitioners.pipeline_of_pipelines:pipeline
"""

from __future__ import annotations

from typing import NamedTuple

from heteroflow import ArtifactSpec, ArtifactType, Pipeline, pipeline_input, step
from practitioners.tuning_fanout import EVALUATE, MAKE_DATASET, TRAIN


class Standardized(NamedTuple):
    rows: int
    features: int


def standardize(data: str, standardized: str) -> Standardized:
    """Scale every feature to mean 0 and standard deviation 1 (statistics of the training rows only).

    Args:
        data: the data set (.npz).
        standardized: output file (.npz, same arrays).
    """
    import numpy as np

    d = dict(np.load(data))
    mean, std = d["x_train"].mean(axis=0), d["x_train"].std(axis=0) + 1e-12
    for key in ("x_train", "x_test"):
        d[key] = (d[key] - mean) / std
    with open(standardized, "wb") as f:
        np.savez(f, **d)
    return Standardized(rows=int(len(d["x_train"]) + len(d["x_test"])), features=int(d["x_train"].shape[1]))


def report(rows: int, accuracy: float) -> str:
    """One line about the run.

    Args:
        rows: rows in the data set.
        accuracy: test accuracy of the trained model.
    """
    line = f"trained on {rows} rows: test accuracy {accuracy:.3f}"
    print(line)
    return line


STANDARDIZE = step(
    standardize,
    inputs=[ArtifactSpec(name="data", type=ArtifactType.DATASET, param="data")],
    outputs=[ArtifactSpec(name="standardized", type=ArtifactType.DATASET, param="standardized")],
)
REPORT = step(report)

# the data sub-pipeline: runnable alone (heteroflow run --pipeline practitioners.pipeline_of_pipelines:data_pipeline)
data_pipeline = Pipeline("data-pipeline", description="make the data set, then standardize it")
raw = data_pipeline.add(MAKE_DATASET)
scaled = data_pipeline.add(STANDARDIZE, data=raw.outputs.data)
data_pipeline.set_outputs(data=scaled.outputs.standardized, rows=scaled.outputs["rows"])

# the training sub-pipeline: takes the data set as an input artifact, so it runs only inside another pipeline
training_pipeline = Pipeline("training-pipeline", description="train, then evaluate on the test rows")
training_data = pipeline_input(training_pipeline, "data", ArtifactType.DATASET)
model = training_pipeline.add(TRAIN, data=training_data, learning_rate=training_pipeline.param("learning_rate", default=0.1))
scored = training_pipeline.add(EVALUATE, data=training_data, model=model.outputs.model)
training_pipeline.set_outputs(model=model.outputs.model, accuracy=scored.output)

pipeline = Pipeline("pipeline-of-pipelines", description="the data sub-pipeline, then the training sub-pipeline")
data = pipeline.add(data_pipeline, name="data")
trained = pipeline.add(training_pipeline, name="training", data=data.outputs.data)
pipeline.add(REPORT, rows=data.outputs.rows, accuracy=trained.outputs.accuracy)
