"""heteroflow: ML training pipelines on heterogeneous compute (GPU, NPU, CPU) for Kubeflow Pipelines and Airflow.

The public API in one import::

    from heteroflow import step, Pipeline, Resources, Candidates, RetryPolicy, default_pipeline, run, compile

and the shipped steps (``PREWARM``, ``PREPROCESS``, ``PLAN``, ``TRAIN``, ``EVALUATE``, ``ARCHIVE``) with the artifact
declarations a new step needs (``ArtifactSpec``, ``ArtifactType``).

Names are resolved on first use (PEP 562), so ``import heteroflow.cache`` (or any subpackage) imports nothing
else; the subpackages are ``heteroflow.cache``, ``heteroflow.components``, ``heteroflow.pipelines`` and
``heteroflow.dags``. (This file is the package's ``__init__``: pyproject.toml maps ``heteroflow`` to this folder.)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "ARCHIVE",
    "EVALUATE",
    "PLAN",
    "PREPROCESS",
    "PREWARM",
    "TRAIN",
    "ArtifactSpec",
    "ArtifactType",
    "Candidates",
    "ConfigMapVolume",
    "CreatePVC",
    "PVC",
    "Pipeline",
    "Resources",
    "RetryPolicy",
    "SecretEnv",
    "SecretVolume",
    "compile",
    "default_pipeline",
    "load_pipeline",
    "local_path",
    "run",
    "step",
]

_WHERE = {
    **{name: ("heteroflow.components.steps", name) for name in ("ARCHIVE", "EVALUATE", "PLAN", "PREPROCESS", "PREWARM", "TRAIN")},
    "step": ("heteroflow.components.core.step", "step"),
    "ArtifactSpec": ("heteroflow.components.core.step", "ArtifactSpec"),
    "ArtifactType": ("heteroflow.components.core.step", "ArtifactType"),
    "Resources": ("heteroflow.components.resources", "Resources"),
    "Candidates": ("heteroflow.components.resources", "Candidates"),
    "RetryPolicy": ("heteroflow.components.resources", "RetryPolicy"),
    "Pipeline": ("heteroflow.pipelines.graph", "Pipeline"),
    "SecretEnv": ("heteroflow.pipelines.graph", "SecretEnv"),
    **{name: ("heteroflow.pipelines.volumes", name) for name in ("CreatePVC", "PVC", "ConfigMapVolume", "SecretVolume")},
    "local_path": ("heteroflow.components.core.mounts", "local_path"),
    "load_pipeline": ("heteroflow.pipelines.graph", "load_pipeline"),
    "default_pipeline": ("heteroflow.pipelines.default", "default_pipeline"),
    "run": ("heteroflow.pipelines.engines.runner", "run"),
    "compile": ("heteroflow.pipelines.kfp.render", "compile_pipeline"),
}
_CONTROL = ("Collected", "Elif", "Else", "If", "ParallelFor")  # KFP's dsl.If ... (#31)
__all__ += [*_CONTROL, "pipeline_input"]
_WHERE.update({name: ("heteroflow.pipelines.control", name) for name in _CONTROL})
_WHERE["pipeline_input"] = ("heteroflow.pipelines.subpipelines", "pipeline_input")

if TYPE_CHECKING:
    from heteroflow.components.resources import Candidates, Resources, RetryPolicy
    from heteroflow.components.core.step import ArtifactSpec, ArtifactType, step
    from heteroflow.components.steps import ARCHIVE, EVALUATE, PLAN, PREPROCESS, PREWARM, TRAIN
    from heteroflow.pipelines.default import default_pipeline
    from heteroflow.pipelines.graph import Pipeline, SecretEnv, load_pipeline
    from heteroflow.pipelines.kfp.render import compile_pipeline as compile  # noqa: A001
    from heteroflow.pipelines.engines.runner import run
    from heteroflow.pipelines.control import Collected, Elif, Else, If, ParallelFor
    from heteroflow.pipelines.subpipelines import pipeline_input
    from heteroflow.components.core.mounts import local_path
    from heteroflow.pipelines.volumes import PVC, ConfigMapVolume, CreatePVC, SecretVolume


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'heteroflow' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
