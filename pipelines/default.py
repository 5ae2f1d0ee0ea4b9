"""The default pipeline: prewarm -> preprocess -> plan -> train -> evaluate -> archive.

Placement in KFP (which has no trigger rules): the plan step picks a train candidate at run time, and one
``dsl.If`` branch per candidate runs train, evaluate and archive as a sub-pipeline whose tasks carry that
candidate's static resources (device type and count, CPU, memory). Exactly one branch runs; the Kubeflow UI
shows which. Merging the branches with ``dsl.OneOf`` is avoided on purpose: kfp.local cannot select among
artifacts, and the open-source backend does not support it.
"""

from typing import Any

from kfp import dsl
from kfp.dsl import Dataset, Input

from heteroflow.components.kfp_components import DEFAULT_IMAGE, Components, make_components
from heteroflow.components.resources import Candidates, DeviceKind, Resources
from heteroflow.components.spec import DEFAULT_STEPS, StepSpec
from heteroflow.pipelines.kfp_render import apply_step

__all__ = ["PIPELINE_NAME", "build_default_pipeline"]

PIPELINE_NAME = "heteroflow-default"


def _train_branch(c: Components, index: int, resources: Resources, steps: dict[str, StepSpec]) -> Any:
    kind = DeviceKind(resources.kind).value

    @dsl.pipeline(name=f"train-on-{kind}-{index}", description=f"train, evaluate, archive on {resources.describe()}")
    def branch(
        dataset: Input[Dataset],
        shards: Input[Dataset],
        epochs: int,
        batch_size: int,
        learning_rate: float,
        hidden_units: int,
        seed: int,
        checkpoint_every_steps: int,
        checkpoint_root: str,
        archive_root: str,
        model_name: str,
    ):
        train = c.train(
            shards=shards,
            torch_device=resources.torch_device_type,
            device_kind=kind,
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=learning_rate,
            hidden_units=hidden_units,
            seed=seed,
            checkpoint_every_steps=checkpoint_every_steps,
            checkpoint_root=checkpoint_root,
        ).set_display_name("train")
        apply_step(train, steps["train"], resources)
        evaluate = c.evaluate(
            shards=shards, model=train.outputs["model"], torch_device=resources.torch_device_type
        ).set_display_name("evaluate")
        apply_step(evaluate, steps["evaluate"], resources)
        archive = c.archive(
            dataset=dataset,
            shards=shards,
            model=train.outputs["model"],
            eval_metrics=evaluate.outputs["metrics"],
            archive_root=archive_root,
            model_name=model_name,
        ).set_display_name("archive")
        apply_step(archive, steps["archive"])

    return branch


def build_default_pipeline(
    *,
    candidates: Candidates | None = None,
    image: str = DEFAULT_IMAGE,
    steps: dict[str, StepSpec] | None = None,
    name: str = PIPELINE_NAME,
) -> Any:
    """Build the default pipeline as a KFP pipeline function.

    Args:
        candidates: train/evaluate candidates, first preferred; default
            :data:`~heteroflow.components.spec.DEFAULT_TRAIN_CANDIDATES` (Ascend 910, NVIDIA GPU, 8 CPUs).
        image: container image with heteroflow installed, for every step.
        steps: per-step declarations; default :data:`~heteroflow.components.spec.DEFAULT_STEPS`.
        name: pipeline name shown in the Kubeflow UI.

    Returns:
        A ``@dsl.pipeline`` function: call it under ``kfp.local.init`` to run locally, or compile it.
    """
    specs = dict(DEFAULT_STEPS if steps is None else steps)
    train_candidates = candidates if candidates is not None else specs["train"].candidates
    c = make_components(image)
    branches = [_train_branch(c, i, res, specs) for i, res in enumerate(train_candidates)]
    candidates_json = train_candidates.to_json()

    @dsl.pipeline(
        name=name,
        description="heteroflow default: prewarm -> preprocess (CPU) -> plan -> train -> evaluate -> archive",
    )
    def default_pipeline(
        dataset_uri: str,
        cache_root: str = "",
        archive_root: str = "",
        model_name: str = "digits-mlp",
        epochs: int = 30,
        batch_size: int = 64,
        learning_rate: float = 0.001,
        hidden_units: int = 128,
        seed: int = 0,
        validation_fraction: float = 0.15,
        test_fraction: float = 0.15,
        num_workers: int = 0,
        checkpoint_every_steps: int = 50,
        checkpoint_root: str = "",
        device_inventory: str = "",
    ):
        """Args:
        dataset_uri: folder (local path or fsspec URL) of .csv or .npz files.
        cache_root: cache tier folder; empty: the local cache (<heteroflow home>/cache).
        archive_root: archive folder; empty: <heteroflow home>/archive.
        model_name: name of the archived model ([a-z0-9][a-z0-9._-]*).
        epochs: passes over the train split.
        batch_size: samples per optimizer step.
        learning_rate: Adam step size.
        hidden_units: width of the MLP's hidden layers.
        seed: seed of the split, the initial weights and the batch order.
        validation_fraction: share of each class for validation.
        test_fraction: share of each class for test.
        num_workers: preprocess worker processes; 0: every CPU core the step is given.
        checkpoint_every_steps: optimizer steps between checkpoints.
        checkpoint_root: checkpoint folder (shared storage on a cluster); empty: <heteroflow home>/checkpoints.
        device_inventory: JSON {"gpu": N, "npu": M} of the devices the job may get, for plan; empty: probe with PyTorch where plan runs (set it on a cluster).
        """
        prewarm = c.prewarm(source_uri=dataset_uri, cache_root=cache_root).set_display_name("prewarm")
        apply_step(prewarm, specs["prewarm"])
        preprocess = c.preprocess(
            dataset=prewarm.outputs["dataset"],
            validation_fraction=validation_fraction,
            test_fraction=test_fraction,
            seed=seed,
            num_workers=num_workers,
        ).set_display_name("preprocess")
        apply_step(preprocess, specs["preprocess"])
        plan = c.plan(candidates_json=candidates_json, device_inventory=device_inventory).set_display_name("plan")
        apply_step(plan, specs["plan"])
        for i, branch in enumerate(branches):
            kind = DeviceKind(train_candidates[i].kind).value
            with dsl.If(plan.outputs["Output"] == i, name=f"placed-on-{kind}-{i}"):
                branch(
                    dataset=prewarm.outputs["dataset"],
                    shards=preprocess.outputs["shards"],
                    epochs=epochs,
                    batch_size=batch_size,
                    learning_rate=learning_rate,
                    hidden_units=hidden_units,
                    seed=seed,
                    checkpoint_every_steps=checkpoint_every_steps,
                    checkpoint_root=checkpoint_root,
                    archive_root=archive_root,
                    model_name=model_name,
                ).set_display_name(f"train-on-{kind}")

    return default_pipeline
