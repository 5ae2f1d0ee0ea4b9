"""One training process's setup: its :class:`~heteroflow.components.training.loop.TrainContext` (loaders, AMP,
checkpoints, fault injection), the training function that runs with it, and the plain module it returns (split
out of :mod:`heteroflow.components.training.step`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.training.params import parse_batch_sizes, union_batch_size

if TYPE_CHECKING:
    import torch

__all__: list[str] = []


def _make_context(splits: Any, spec: Any, params: dict[str, Any], ckpt_dir: Path, v: Mapping[str, Any], *,
                  device: torch.device, kind: str, dtype: Any, loader_workers: int, progress: Callable[..., None] | None,
                  distributed: Any = None) -> Any:
    """The :class:`~heteroflow.components.training.loop.TrainContext` of one process (``distributed``: a worker's
    :class:`~heteroflow.components.training.distributed.DistributedContext`, which sets rank and world size).

    ``loader_workers`` is the resolved worker count (:func:`~heteroflow.components.training.batches.auto_workers`);
    when train's ``loader_workers`` was -1 (auto) and the data is decoded from files, it is the most the context's
    batches may use, and the count is chosen from the first batches' load and compute times
    (:meth:`~heteroflow.components.training.loop.TrainContext.measure_loading`)."""
    from heteroflow.components.core.failures import _faults_of, fault_after_steps
    from heteroflow.components.training.batches import eval_batch_size
    from heteroflow.components.training.loop import Checkpoint, TrainContext, make_loader, make_scaler

    rank = distributed.rank if distributed is not None else 0
    world = distributed.world_size if distributed is not None else 1
    batch_size, seed = union_batch_size(v), v["seed"]
    parts = parse_batch_sizes(v["batch_sizes"])

    def train_loader_with(workers: int) -> Any:
        return make_loader(splits.train, batch_size=batch_size, seed=seed, shuffle=True, num_workers=workers,
                           device=device, rank=rank, world_size=world, parts=parts)

    train_loader = train_loader_with(loader_workers)
    val_loader = None
    if splits.validation is not None:
        val_loader = make_loader(splits.validation, batch_size=eval_batch_size(batch_size, splits.input_shape), seed=seed, shuffle=False,
                                 num_workers=loader_workers, device=device)

    def fault_check(step: int) -> None:
        fault = fault_after_steps("train", kind, step)
        if fault is not None:
            raise fault

    # read HETEROFLOW_INJECT_FAULT once: no rehearsed fault for this step and kind, no check per optimizer step
    rehearsed = any(spec.after_steps is not None for spec in _faults_of("train", kind, None))

    amp_name = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    total_steps = v["epochs"] * math.ceil(len(splits.train) / batch_size)
    ctx = TrainContext(
        device=device,
        device_kind=kind,
        autocast_dtype=dtype,
        scaler=make_scaler(dtype, device),
        train_loader=train_loader,
        val_loader=val_loader,
        classes=splits.classes,
        input_shape=splits.input_shape,
        epochs=v["epochs"],
        batch_size=batch_size,
        learning_rate=v["learning_rate"],
        seed=seed,
        params=params,
        checkpoint=Checkpoint(ckpt_dir, every_steps=v["checkpoint_every_steps"], model=spec.to_dict(),
                              amp_dtype=amp_name, total_steps=total_steps),
        model_spec=spec,
        loss_ref=v["loss"],
        optimizer_ref=v["optimizer"],
        progress=progress,
        fault_check=fault_check if rehearsed else None,
        rank=rank,
        world_size=world,
        distributed=distributed,
        loader_workers=loader_workers,
        compile_model=bool(v["compile_model"]),
    )
    if v["loader_workers"] == -1 and not splits.in_memory and loader_workers > 0:
        ctx.measure_loading(train_loader_with, loader_workers)
    return ctx


def _training_function(ref: str) -> Callable[..., Any]:
    """The training function ``ref`` names, or the built-in classifier loop for ``""``.

    Raises:
        InvalidParameter: ``ref`` cannot be imported or is not callable.
    """
    from heteroflow.components.training.loop import _import_callable, classifier_loop

    return _import_callable(ref, what="train_function") if ref else classifier_loop


def _trained_module(trained: Any, ctx: Any, train_function: str) -> torch.nn.Module:
    """The plain module a training function trained (its return value, else ``ctx.model``; DDP unwrapped).

    Raises:
        InvalidParameter: it returned something that is not a ``torch.nn.Module``.
    """
    import torch

    trained = trained if trained is not None else ctx.model
    if not isinstance(trained, torch.nn.Module):
        raise InvalidParameter(
            f"train_function={train_function!r} returned {type(trained).__name__}; return the trained model "
            "(or build it with ctx.build_model())"
        )
    return trained.module if hasattr(trained, "module") else trained
