"""The default pipeline: prewarm -> preprocess -> plan -> train -> evaluate -> archive, as one
:class:`~heteroflow.pipelines.graph.Pipeline` value that every engine renders.

Its parameters are the steps' own (``heteroflow params`` lists them), plus ``dataset_uri``, which feeds
prewarm's ``source_uri``, and ``model``, which feeds train's ``model_factory`` (your ``package.module:function``). ``plan`` places ``train`` (Ascend 910, else NVIDIA GPU, else 8 CPUs by default) and
``evaluate`` (the CPU by default); each falls back to its next candidate on a device failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from heteroflow.components.resources import Candidates, Resources
from heteroflow.components.steps import ARCHIVE, EVALUATE, PLAN, PREPROCESS, PREWARM, TRAIN
from heteroflow.pipelines.graph import Pipeline

__all__ = ["PIPELINE_NAME", "build_default_pipeline", "default_pipeline"]

PIPELINE_NAME = "heteroflow-default"


def default_pipeline(
    *,
    train_candidates: Candidates | Iterable[Resources | str] | None = None,
    evaluate_candidates: Candidates | Iterable[Resources | str] | None = None,
    name: str = PIPELINE_NAME,
) -> Pipeline:
    """A new copy of the default pipeline (change it freely: add calls, replace candidates).

    Args:
        train_candidates: where train may run, first preferred; default the train step's (Ascend 910 x1, else
            NVIDIA GPU x1, else 8 CPUs).
        evaluate_candidates: where evaluate may run; default the evaluate step's (2 CPUs).
        name: pipeline name shown in the Kubeflow UI.
    """
    p = Pipeline(name, description="heteroflow default: prewarm -> preprocess (CPU) -> plan -> train -> evaluate -> archive")
    data = p.add(
        PREWARM,
        source_uri=p.param(
            "dataset_uri",
            help="folder (local path or fsspec URL) of data: tables (.csv, .tsv, .parquet, .npz), an image folder "
            "(one folder per class), or .pt tensors",
        ),
    )
    shards = p.add(PREPROCESS, dataset=data.outputs.dataset)
    profile = p.param("training_profile")  # one parameter: plan scores with it, a mixed train's first shares (#29)
    p.add(PLAN, training_profile=profile)
    model = p.add(
        TRAIN,
        shards=shards.outputs.shards,
        candidates=train_candidates,
        model_factory=p.param("model"),
        training_profile=profile,
    )
    scores = p.add(EVALUATE, shards=shards.outputs.shards, model=model.outputs.model, candidates=evaluate_candidates)
    p.add(
        ARCHIVE,
        dataset=data.outputs.dataset,
        shards=shards.outputs.shards,
        model=model.outputs.model,
        eval_metrics=scores.outputs.metrics,
    )
    return p


def build_default_pipeline(
    *,
    candidates: Candidates | None = None,
    image: str | None = None,
    name: str = PIPELINE_NAME,
) -> Any:
    """The default pipeline rendered as a KFP pipeline function (call it under ``kfp.local.init``, or compile
    it), for those who compose with the KFP DSL.

    Args:
        candidates: train candidates, first preferred; default the train step's.
        image: container image with heteroflow installed; default :data:`~heteroflow.pipelines.kfp.render.DEFAULT_IMAGE`.
        name: pipeline name.
    """
    from heteroflow.pipelines.kfp.render import DEFAULT_IMAGE, to_kfp

    return to_kfp(default_pipeline(train_candidates=candidates, name=name), image=image or DEFAULT_IMAGE)
