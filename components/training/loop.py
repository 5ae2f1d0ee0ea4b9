"""The training context a training function receives, device-portable checkpoints, and the built-in loop.

A *training function* is ``package.module:function(ctx)``, the shape of Ray Train's ``train_loop_per_worker``
and Kubeflow Trainer's ``train_func``. heteroflow hands it a :class:`TrainContext` and owns what differs per
device kind: the torch device (``torch_npu`` imported only for ``npu``), the autocast dtype and ``GradScaler``
(from the accelerator registry: bf16 where the device computes in bf16, fp16 with a scaler otherwise, fp32 on
the CPU unless asked), DataLoaders with worker processes, prefetching and pinned memory on accelerators, and
atomic, device-portable checkpoints (:class:`Checkpoint`). The built-in classifier loop,
:func:`classifier_loop`, is one such function::

    def my_loop(ctx):
        model = ctx.build_model()                       # the model factory's model, seeded, on ctx.device
        opt = ctx.build_optimizer(model)
        state = ctx.checkpoint.load(model=model, optimizer=opt, scaler=ctx.scaler)   # None on a fresh start
        step = state["step"] if state else 0
        for epoch in range(ctx.epoch_of(step), ctx.epochs):
            for x, y in ctx.batches(epoch, step):        # resumes mid-epoch where the checkpoint was
                with ctx.autocast():
                    loss = ctx.loss_fn(model(x), y)
                ctx.backward(loss, opt)                   # backward and step (through ctx.scaler for fp16)
                step += 1
                ctx.step_done(step, model=model, optimizer=opt)   # checkpoints when due; rehearsed faults
            ctx.report(epoch=epoch + 1, loss=...)        # live progress and the per-epoch history in run.json
        return model

Several devices (a candidate with ``count > 1``): :func:`heteroflow.components.training.step.train` starts one worker
per device (:func:`heteroflow.components.training.distributed.launch`, the registry's backend) and builds this context in
each with ``rank``/``world_size`` set. The same training function then runs unchanged: :meth:`TrainContext.build_model`
wraps the model in DDP, :meth:`TrainContext.batches` yields this rank's share of each batch of ``batch_size``
samples (the batches one process would see, split), :meth:`TrainContext.loss_fn` scales the rank's mean loss by
``world_size * n_rank / n_batch`` so DDP's averaging gives exactly the gradient of the whole batch (unequal shares,
a short last batch, per-device batch sizes such as 64 on one device and 32 on another: train's ``batch_sizes``),
and only rank 0 writes checkpoints and reports live. One optimizer step is the same step as
in one process, so a checkpoint of a 2-device candidate resumes on a 1-device one and the other way round.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.cache.atomic import atomic_file, atomic_write_bytes
from heteroflow.components.errors import CheckpointError, InvalidParameter, NonFiniteError

if TYPE_CHECKING:  # numpy and torch are imported where they are used: train's parameter checks import this module
    import numpy as np
    import torch
    from torch import nn

__all__ = [
    "PRECISIONS",
    "Checkpoint",
    "EpochBatches",
    "ModelSpec",
    "TrainContext",
    "classifier_loop",
    "mlp",
    "resolve_precision",
]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_INFO = "checkpoint.json"
_FORMAT = 2


# --- models ------------------------------------------------------------------------------------------------


def mlp(in_features: int, num_classes: int, hidden_units: int = 128, input_shape: tuple[int, ...] = ()) -> nn.Module:
    """The built-in classifier: ``in -> hidden -> ReLU -> hidden -> ReLU -> classes`` (inputs of more than one
    dimension are flattened first). Input ``(batch, *input_shape)`` float32, output logits ``(batch, num_classes)``."""
    from torch import nn

    body = nn.Sequential(
        nn.Linear(in_features, hidden_units),
        nn.ReLU(),
        nn.Linear(hidden_units, hidden_units),
        nn.ReLU(),
        nn.Linear(hidden_units, num_classes),
    )
    return nn.Sequential(nn.Flatten(), body) if len(input_shape) > 1 else body


BUILTIN_MODEL = "heteroflow.components.training.loop:mlp"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A model factory and the keyword arguments it is called with (recorded in ``model.json`` and the archive).

    Attributes:
        ref: ``package.module:function`` returning a ``torch.nn.Module``.
        args: JSON-ready keyword arguments.
    """

    ref: str
    args: dict[str, Any]

    @classmethod
    def resolve(cls, ref: str, *, offered: Mapping[str, Any], given: Mapping[str, Any]) -> ModelSpec:
        """Choose the arguments: every ``given`` one (each must be a parameter of the factory), plus those of
        ``offered`` (``in_features``, ``num_classes``, ``input_shape``, ``hidden_units``) the factory accepts.

        Raises:
            InvalidParameter: the factory cannot be imported, is not callable, or does not take a given argument.
        """
        fn = _import_callable(ref, what="model_factory")
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return cls(ref=ref, args={**dict(offered), **dict(given)})
        takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        unknown = [k for k in given if k not in sig.parameters and not takes_any]
        if unknown:
            raise InvalidParameter(
                f"model_args: {ref} takes no argument {unknown[0]!r}; it takes: {', '.join(sig.parameters) or 'none'}"
            )
        args = {k: v for k, v in offered.items() if k in sig.parameters}
        args.update(given)
        return cls(ref=ref, args=args)

    def build(self) -> nn.Module:
        """Call the factory.

        Raises:
            InvalidParameter: it does not return a ``torch.nn.Module`` (or raises while building).
        """
        from torch import nn

        fn = _import_callable(self.ref, what="model_factory")
        args = {k: tuple(v) if k == "input_shape" else v for k, v in self.args.items()}
        try:
            model = fn(**args)
        except TypeError as exc:
            raise InvalidParameter(f"model_factory={self.ref!r} cannot be called with {sorted(args)}: {exc}") from None
        if not isinstance(model, nn.Module):
            raise InvalidParameter(f"model_factory={self.ref!r} returned a {type(model).__name__}, not a torch.nn.Module")
        return model

    def to_dict(self) -> dict[str, Any]:
        return {"factory": self.ref, "args": dict(self.args)}


def _import_callable(ref: str, *, what: str) -> Callable[..., Any]:
    from heteroflow.components.core.step import import_object

    fn = import_object(ref, what=what, example="mypkg.models:make_model")
    if not callable(fn):
        raise InvalidParameter(f"{what}={ref!r} is a {type(fn).__name__}, not a function")
    return fn  # type: ignore[no-any-return]


# --- devices and precision ---------------------------------------------------------------------------------


def resolve_precision(precision: str, device: torch.device, *, bf16: bool | None = None) -> torch.dtype | None:
    """The autocast dtype for ``precision`` on ``device`` (None: fp32, no autocast).

    ``auto``: fp32 on the CPU; on an accelerator bf16 when it computes in bf16 (``bf16`` from the accelerator
    registry, :mod:`heteroflow.components.devices.accelerators`; unknown: asked of torch), else fp16 (with a GradScaler).

    Raises:
        InvalidParameter: an unknown precision, or bf16/fp16 asked of a device that lacks it.
    """
    import torch

    if precision not in PRECISIONS:
        raise InvalidParameter(f"precision={precision!r} is unknown; valid: {', '.join(PRECISIONS)}")
    if precision == "fp32" or (precision == "auto" and device.type == "cpu"):
        return None
    if precision == "fp16":
        return torch.float16
    if bf16 is None:
        bf16 = _device_bf16(device)
    if precision == "bf16":
        return torch.bfloat16
    return torch.bfloat16 if bf16 else torch.float16


def _device_bf16(device: torch.device) -> bool:
    from heteroflow.components.devices import for_torch_device_type
    from heteroflow.components.devices.kind import device_bf16

    kind = for_torch_device_type(device.type)
    return kind.bf16_supported(device) if kind is not None else device_bf16(device)


def _synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` when its kind says timing must (``gpu``)."""
    from heteroflow.components.devices import for_torch_device_type

    kind = for_torch_device_type(device.type)
    if kind is not None:
        kind.synchronize(device)


def make_scaler(dtype: torch.dtype | None, device: torch.device) -> Any:
    """A ``torch.amp.GradScaler`` for fp16 autocast (None otherwise: bf16 and fp32 need none)."""
    import torch

    if dtype is not torch.float16:
        return None
    return torch.amp.GradScaler(device.type)


# --- checkpoints -------------------------------------------------------------------------------------------


def _to_cpu(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)],
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "python_gauss": random.getstate()[2],
    }


def _set_rng_state(state: Mapping[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate((state["python_version"], tuple(state["python"]), state.get("python_gauss")))


class Checkpoint:
    """Atomic, device-portable checkpoints in one folder (keyed by data, parameters and model; never device).

    Everything is saved from CPU copies (model, optimizer, scheduler and scaler states, RNG states, the data
    position, the partial epoch's loss and the per-epoch history), written to a temporary file, fsynced and
    renamed, so a checkpoint is complete or absent and loads on any device kind.

    Attributes:
        folder: the checkpoint folder.
        every_steps: optimizer steps between checkpoints.
        model: the model's :class:`ModelSpec` dict (checked on load).
        amp_dtype: the autocast dtype name of this run ("float32", "bfloat16", "float16").
        resumed_from_step: the step of the checkpoint loaded (0 before :meth:`load`, or on a fresh start).
        written: checkpoints written by this process.
    """

    def __init__(self, folder: Path, *, every_steps: int, model: Mapping[str, Any], amp_dtype: str,
                 total_steps: int, enabled: bool = True) -> None:
        self.folder = folder
        self.every_steps = every_steps
        self.model = dict(model)
        self.amp_dtype = amp_dtype
        self.total_steps = total_steps
        self.enabled = enabled
        self.resumed_from_step = 0
        self.written = 0
        self.state: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return self.folder / CHECKPOINT_FILE

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due after optimizer step ``step`` (every ``every_steps``, not the last)."""
        return self.enabled and step % self.every_steps == 0 and step < self.total_steps

    def save(self, step: int, *, model: nn.Module, optimizer: Any = None, scheduler: Any = None, scaler: Any = None,
             extra: Mapping[str, Any] | None = None) -> None:
        """Write a checkpoint after optimizer step ``step`` (atomically; CPU copies of every tensor).

        Args:
            step: optimizer steps done.
            model / optimizer / scheduler / scaler: their ``state_dict()`` is saved (None: left out).
            extra: JSON-like values the training function wants back (e.g. the partial epoch's loss sum).
        """
        import torch

        raw = model.module if hasattr(model, "module") else model  # DDP / DataParallel wrappers
        state = {
            "format": _FORMAT,
            "step": int(step),
            "model_spec": json.dumps(self.model, sort_keys=True, default=str),
            "amp_dtype": self.amp_dtype,
            "model": _to_cpu(raw.state_dict()),
            "rng": _rng_state(),
            "extra": _to_cpu(dict(extra or {})),
        }
        if optimizer is not None:
            state["optimizer"] = _to_cpu(optimizer.state_dict())
        if scheduler is not None:
            state["scheduler"] = _to_cpu(scheduler.state_dict())
        if scaler is not None:
            state["scaler"] = scaler.state_dict()
        with atomic_file(self.path) as fh:
            torch.save(state, fh)
        atomic_write_bytes(self.folder / CHECKPOINT_INFO,
                           json.dumps({"step": int(step), "total_steps": self.total_steps}).encode())
        self.written += 1

    def load(self, *, model: nn.Module, optimizer: Any = None, scheduler: Any = None, scaler: Any = None) -> dict[str, Any] | None:
        """Restore the last checkpoint into the objects given (on their devices) and the RNG states.

        Returns:
            None when there is no checkpoint; else ``{"step": int, "extra": dict}``.

        Raises:
            CheckpointError: the file cannot be read; it holds another model's weights; its run used fp16 (a
                GradScaler) but it has no scaler state. Each says to delete the folder to start over.
        """
        import torch

        if not self.path.is_file():
            return None
        where = f"checkpoint {self.path}"
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{where} cannot be loaded ({exc}); delete that folder to start over") from exc
        if not isinstance(state, dict) or "model" not in state or "step" not in state:
            raise CheckpointError(f"{where} is not a heteroflow checkpoint; delete that folder to start over")
        spec = state.get("model_spec")
        mine = json.dumps(self.model, sort_keys=True, default=str)
        if spec is not None and spec != mine:
            raise CheckpointError(f"{where} holds another model ({spec}, this run trains {mine}); delete that folder to start over")
        raw = model.module if hasattr(model, "module") else model
        try:
            raw.load_state_dict(state["model"])
        except RuntimeError as exc:
            first = " ".join(str(exc).split())[:300]
            raise CheckpointError(
                f"{where} holds weights of another model ({first}); the model's code changed since it was written: "
                "delete that folder to start over"
            ) from None
        if scaler is not None:
            if "scaler" in state:
                scaler.load_state_dict(state["scaler"])
            elif state.get("amp_dtype") == "float16":
                raise CheckpointError(
                    f"{where} was written by an fp16 run but holds no GradScaler state; it is damaged or was saved "
                    "without scaler=: delete that folder to start over"
                )
            # a bf16 or fp32 run's checkpoint resumed in fp16: a fresh scaler calibrates itself in a few steps
        try:
            if optimizer is not None and "optimizer" in state:
                optimizer.load_state_dict(state["optimizer"])
            if scheduler is not None and "scheduler" in state:
                scheduler.load_state_dict(state["scheduler"])
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{where}: the optimizer state does not fit ({exc}); delete that folder to start over") from None
        if "rng" in state:
            _set_rng_state(state["rng"])
        self.resumed_from_step = int(state["step"])
        self.state = state
        return {"step": int(state["step"]), "extra": state.get("extra", {})}


# --- batches -----------------------------------------------------------------------------------------------


class EpochBatches:
    """The batch sampler of heteroflow's loaders: epoch ``e`` visits a permutation seeded by ``seed + e``, in
    batches of ``batch_size`` (the last may be smaller), from batch ``start`` on (a resume mid-epoch). The same
    seed gives the same batches on every device and with any number of DataLoader workers.

    Distributed training (``rank`` / ``world_size``): every rank walks the same batches and yields its share of
    each, consecutive slices in rank order, so the union over ranks of step ``i``'s samples is step ``i`` of one
    process. The shares are ``parts`` when it gives one size per rank (per-device batch sizes summing to
    ``batch_size``; a short last batch is split in the same proportions, largest remainders first), else even
    (``numpy.array_split``'s sizes). A rank whose share of a batch is empty gets the batch's first sample, which
    :meth:`TrainContext.loss_fn` weights 0 (every rank must take every step, or DDP's collectives hang).

    Raises:
        InvalidParameter: ``parts`` with one size per rank that does not sum to ``batch_size``.
    """

    def __init__(self, n: int, batch_size: int, seed: int, *, shuffle: bool = True, rank: int = 0, world_size: int = 1,
                 parts: tuple[int, ...] = ()) -> None:
        self.n, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.parts = tuple(parts) if len(parts) == world_size > 1 else ()
        if self.parts and sum(self.parts) != batch_size:
            raise InvalidParameter(f"parts={list(parts)} sum to {sum(parts)}, not batch_size={batch_size}; valid: per-rank sizes of one batch")
        self.epoch, self.start = 0, 0

    def sizes(self, n_batch: int) -> list[int]:
        """Each rank's number of samples of a batch of ``n_batch`` (sums to ``n_batch``)."""
        w = self.world_size
        if w == 1:
            return [n_batch]
        if not self.parts:
            return [n_batch // w + (r < n_batch % w) for r in range(w)]  # numpy.array_split's sizes
        if n_batch == self.batch_size:
            return list(self.parts)
        exact = [n_batch * p / self.batch_size for p in self.parts]
        out = [math.floor(e) for e in exact]
        for r in sorted(range(w), key=lambda r: (out[r] - exact[r], r))[: n_batch - sum(out)]:
            out[r] += 1  # largest remainder (Hamilton's method), ties to the lower rank
        return out

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return max(0, math.ceil(self.n / self.batch_size) - self.start)

    def __iter__(self) -> Iterator[np.ndarray]:
        import numpy as np

        order = np.random.default_rng(self.seed + self.epoch).permutation(self.n) if self.shuffle else np.arange(self.n)
        for b in range(self.start, math.ceil(self.n / self.batch_size)):
            batch = order[b * self.batch_size:(b + 1) * self.batch_size]  # int64 array: one index op per batch
            if self.world_size > 1:
                sizes = self.sizes(len(batch))
                start = sum(sizes[: self.rank])
                part = batch[start:start + sizes[self.rank]]
                batch = part if len(part) else batch[:1]
            yield batch

    def share(self, b: int) -> float:
        """The factor rank ``rank``'s mean loss on batch ``b`` (of the epoch) gets so that DDP's average over ranks
        is the mean loss of the whole batch: ``world_size * n_rank / n_batch`` (0 for a stand-in sample; 1 in one
        process)."""
        if self.world_size == 1:
            return 1.0
        n_batch = min(self.batch_size, self.n - b * self.batch_size)
        return self.world_size * self.sizes(n_batch)[self.rank] / n_batch


def make_loader(dataset: Any, *, batch_size: int, seed: int, shuffle: bool, num_workers: int, device: torch.device,
                rank: int = 0, world_size: int = 1, parts: tuple[int, ...] = ()) -> Any:
    """A DataLoader over ``dataset`` with :class:`EpochBatches` (this rank's share of each batch when
    ``world_size > 1``, ``parts`` the per-rank sizes when given): ``num_workers`` processes prefetching 2 batches each, pinned memory on accelerators, its
    own RNG (the global one stays the training's)."""
    import torch
    from torch.utils.data import DataLoader

    from heteroflow.components.data.readers import batch_collate

    sampler = EpochBatches(len(dataset), batch_size, seed, shuffle=shuffle, rank=rank, world_size=world_size, parts=parts)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=batch_collate,
        pin_memory=device.type != "cpu",
        prefetch_factor=2 if num_workers > 0 else None,
        persistent_workers=num_workers > 0,
        generator=torch.Generator().manual_seed(seed),
    )


# --- the context -------------------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True, eq=False)
class TrainContext:
    """What a training function gets.

    Attributes:
        device: the torch device to train on (``cpu``, ``cuda:0``, ``npu:0``).
        device_kind: the candidate's device kind (``cpu``, ``gpu``, ``npu``; a simulated kind runs on the CPU).
        autocast_dtype: ``torch.bfloat16`` / ``torch.float16``, or None for fp32 (use :meth:`autocast`).
        scaler: a ``torch.amp.GradScaler`` for fp16, else None; its state is in every checkpoint.
        train_loader / val_loader: DataLoaders of ``(x, y)`` batches (val_loader None without a validation split);
            use :meth:`batches` to resume mid-epoch.
        classes: class names, index = label id.
        input_shape: one sample's shape.
        epochs / batch_size / learning_rate / seed: the step's parameters.
        params: every training parameter (JSON-ready).
        checkpoint: the run's :class:`Checkpoint` (save / load).
        model_spec: the model factory and its arguments.
        rank / world_size: this worker's rank and the number of workers (one per device of the candidate).
        distributed: the worker's :class:`heteroflow.components.training.distributed.DistributedContext` (None in one
            process): its ``ddp``, ``barrier`` and backend.
        history: the per-epoch metrics :meth:`report` collected (into ``run.json``).
    """

    device: torch.device
    device_kind: str
    autocast_dtype: Any
    scaler: Any
    train_loader: Any
    val_loader: Any
    classes: tuple[str, ...]
    input_shape: tuple[int, ...]
    epochs: int
    batch_size: int
    learning_rate: float
    seed: int
    params: dict[str, Any]
    checkpoint: Checkpoint
    model_spec: ModelSpec
    loss_ref: str = ""
    optimizer_ref: str = ""
    rank: int = 0
    world_size: int = 1
    distributed: Any = None
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    progress: Callable[..., None] | None = None
    fault_check: Callable[[int], None] | None = None
    model: Any = None
    samples_seen: int = 0
    loop_seconds: float = 0.0
    _started: float = dataclasses.field(default_factory=time.perf_counter)
    _share: float = 1.0

    @property
    def steps_per_epoch(self) -> int:
        return len(range(0, len(self.train_loader.dataset), self.batch_size))

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def epoch_of(self, step: int) -> int:
        """The epoch (0-based) optimizer step ``step`` + 1 falls in."""
        return step // self.steps_per_epoch

    def build_model(self) -> nn.Module:
        """The model factory's model, built after seeding torch with ``seed``, on :attr:`device`."""
        import torch

        torch.manual_seed(self.seed)
        self.model = self.model_spec.build().to(self.device)
        if self.distributed is not None and self.world_size > 1:
            # DDP with DDP's averaging hook: loss_fn's per-rank factor makes the average the whole batch's gradient
            self.model = self.distributed.ddp(self.model, weighted=False)
        return self.model

    def build_optimizer(self, model: nn.Module) -> Any:
        """The optimizer factory's optimizer (``fn(params, lr=...)``), default ``torch.optim.Adam(lr=learning_rate)``."""
        import torch

        if not self.optimizer_ref:
            return torch.optim.Adam(model.parameters(), lr=self.learning_rate)
        fn = _import_callable(self.optimizer_ref, what="optimizer")
        opt = fn(model.parameters(), lr=self.learning_rate)
        if not isinstance(opt, torch.optim.Optimizer):
            raise InvalidParameter(f"optimizer={self.optimizer_ref!r} returned a {type(opt).__name__}, not a torch.optim.Optimizer")
        return opt

    def loss_fn(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss factory's loss (``fn()`` returning a callable), default cross-entropy on logits."""
        import torch.nn.functional as F

        if not self.loss_ref:
            value = F.cross_entropy(output, target)
        else:
            if not hasattr(self, "_loss"):
                object.__setattr__(self, "_loss", _import_callable(self.loss_ref, what="loss")())
            value = self._loss(output, target)  # type: ignore[attr-defined]
        if self.world_size > 1:
            # this rank's part of the batch's mean loss, times world_size (DDP divides the sum by it): the
            # averaged gradient is the whole batch's, whatever each rank's share (0 for a stand-in sample)
            return value * self._share
        return value  # type: ignore[no-any-return]

    def mean_across_workers(self, value: float) -> float:
        """The mean of ``value`` over the workers (``value`` itself in one process). With :meth:`loss_fn`'s
        factors, the mean over ranks of their losses is the whole batch's loss. Every rank must call it."""
        if self.world_size == 1:
            return float(value)
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item()) / self.world_size

    def backward(self, loss: torch.Tensor, optimizer: Any) -> None:
        """Zero ``optimizer``'s gradients, backpropagate ``loss`` (a scalar tensor) and take the optimizer step,
        through :attr:`scaler` when fp16 needs one (scale the loss, unscale before the step, update the scale:
        ``torch.amp.GradScaler``'s documented order)."""
        optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            loss.backward()
            optimizer.step()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` in :attr:`autocast_dtype` on this device type (a no-op context for fp32)."""
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def to_device(self, batch: Any) -> Any:
        """Move a batch (tensors, tuples, lists, dicts of them) to :attr:`device` (non-blocking from pinned memory)."""
        import torch

        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self.to_device(b) for b in batch)
        if isinstance(batch, dict):
            return {k: self.to_device(v) for k, v in batch.items()}
        return batch

    def batches(self, epoch: int, step: int = 0) -> Iterator[Any]:
        """Epoch ``epoch``'s training batches on :attr:`device`, from the batch after optimizer step ``step``
        (the whole epoch when ``step`` lies before it)."""
        start = max(0, step - epoch * self.steps_per_epoch)
        sampler = self.train_loader.batch_sampler
        sampler.set_epoch(epoch, start)
        for b, batch in enumerate(self.train_loader, start):
            if self.world_size > 1:
                self._share = sampler.share(b)
            yield self.to_device(batch)

    def step_done(self, step: int, *, model: nn.Module, optimizer: Any = None, scheduler: Any = None,
                  extra: Mapping[str, Any] | None = None) -> bool:
        """Call after each optimizer step: saves a checkpoint when due (rank 0 only), then raises a rehearsed
        fault (``HETEROFLOW_INJECT_FAULT=train@KIND=device:after_steps=N``) once ``step >= N``.

        Returns:
            Whether a checkpoint was written.
        """
        saved = False
        due = self.checkpoint.due(step)
        if due and self.rank == 0:
            self.checkpoint.save(step, model=model, optimizer=optimizer, scheduler=scheduler, scaler=self.scaler, extra=extra)
            saved = True
        if due and self.distributed is not None and self.world_size > 1:
            self.distributed.barrier()  # no rank runs on (or fails) before rank 0's checkpoint is complete
        if self.fault_check is not None:
            self.fault_check(step)
        return saved

    def report(self, **metrics: Any) -> None:
        """Record one epoch's metrics (``epoch``, ``loss``, ``validation_accuracy``, anything JSON-ready):
        appended to :attr:`history` (into ``run.json``) and shown live by the engine."""
        clean = {k: (float(v) if hasattr(v, "item") else v) for k, v in metrics.items()}
        self.history.append(clean)
        if self.progress is not None and self.rank == 0:
            elapsed = time.perf_counter() - self._started
            self.progress(**{**clean, "epochs": self.epochs,
                             "samples_per_second": round(self.samples_seen / elapsed, 1) if elapsed > 0 else 0.0})

    def evaluate_accuracy(self, model: nn.Module, loader: Any = None) -> float | None:
        """Accuracy of ``model`` on ``loader`` (default the validation loader); None without one."""
        import torch

        loader = self.val_loader if loader is None else loader
        if loader is None:
            return None
        model = model.module if hasattr(model, "module") else model  # DDP: every rank evaluates its own copy
        was_training = model.training
        model.eval()
        correct = total = 0
        with torch.no_grad(), self.autocast():
            loader.batch_sampler.set_epoch(0, 0)
            for x, y in loader:
                x, y = self.to_device((x, y))
                correct += int((model(x).argmax(dim=1) == y).sum().item())
                total += len(y)
        model.train(was_training)
        return correct / total if total else None


# --- the built-in loop -------------------------------------------------------------------------------------


def classifier_loop(ctx: TrainContext) -> nn.Module:
    """heteroflow's classifier loop, a training function like any other: the model factory's model, its
    optimizer and loss, autocast (and a GradScaler for fp16), a checkpoint every ``checkpoint_every_steps``,
    and a report per epoch (mean train loss of the whole epoch, also across a resume; validation accuracy).

    Raises:
        NonFiniteError: a loss is NaN or infinite (names the epoch and step; checked at each checkpoint and epoch
            end, so NaN weights are never saved).
        CheckpointError: see :meth:`Checkpoint.load`.
    """
    import torch

    model = ctx.build_model()
    optimizer = ctx.build_optimizer(model)
    state = ctx.checkpoint.load(model=model, optimizer=optimizer, scaler=ctx.scaler)
    step = state["step"] if state else 0
    extra = state["extra"] if state else {}
    ctx.history[:] = list(extra.get("history", []))
    loss_sum = torch.as_tensor(float(extra.get("epoch_loss_sum", 0.0)), dtype=torch.float64)
    loss_count = int(extra.get("epoch_loss_count", 0))
    if loss_count and step % ctx.steps_per_epoch == 0:
        # The checkpoint fell on the last step of an epoch, before that epoch was reported: report it now (the
        # weights are those it ended with, so validation accuracy is what it would have said).
        _report_epoch(ctx, model, epoch=step // ctx.steps_per_epoch - 1, step=step, loss=float(loss_sum / loss_count))
        loss_sum, loss_count = torch.zeros((), dtype=torch.float64), 0
    model.train()
    started = time.perf_counter()
    for epoch in range(ctx.epoch_of(step), ctx.epochs):
        losses: list[torch.Tensor] = []
        first_step = step
        for x, y in ctx.batches(epoch, step):
            with ctx.autocast():
                loss = ctx.loss_fn(model(x), y)
            ctx.backward(loss, optimizer)
            step += 1
            ctx.samples_seen += len(y)
            losses.append(loss.detach().float())
            if ctx.checkpoint.due(step):
                _check_losses(losses, first_step=first_step, epoch=epoch, ctx=ctx)  # never save NaN weights
                part = ctx.mean_across_workers(float((loss_sum + torch.stack(losses).double().sum().cpu()).item()))
                ctx.step_done(step, model=model, optimizer=optimizer, extra={
                    "epoch_loss_sum": part, "epoch_loss_count": loss_count + len(losses),
                    "history": ctx.history,
                })
            elif ctx.fault_check is not None:
                ctx.fault_check(step)
        _check_losses(losses, first_step=first_step, epoch=epoch, ctx=ctx)
        total = ctx.mean_across_workers(float(loss_sum + (torch.stack(losses).double().sum().cpu() if losses else 0.0)))
        count = loss_count + len(losses)
        epoch_loss = float(total / count) if count else float("nan")
        loss_sum, loss_count = torch.zeros((), dtype=torch.float64), 0
        _report_epoch(ctx, model, epoch=epoch, step=step, loss=epoch_loss)
    _synchronize(ctx.device)
    ctx.loop_seconds = time.perf_counter() - started
    return model


def _report_epoch(ctx: TrainContext, model: nn.Module, *, epoch: int, step: int, loss: float) -> None:
    val = ctx.evaluate_accuracy(model)
    ctx.report(epoch=epoch + 1, step=step, total_steps=ctx.total_steps, loss=round(loss, 6),
               **({"validation_accuracy": round(val, 6)} if val is not None else {}))


def _check_losses(losses: list[torch.Tensor], *, first_step: int, epoch: int, ctx: TrainContext) -> None:
    """Raise at the first loss among ``losses`` (of steps ``first_step + 1`` on) that is NaN or infinite.

    Raises:
        NonFiniteError: names the epoch and step, and suggests a lower learning rate.
    """
    import torch

    if not losses:
        return
    stacked = torch.stack(losses)
    finite = torch.isfinite(stacked)
    if bool(finite.all()):
        return
    k = int((~finite).nonzero()[0].item())
    lr = ctx.learning_rate
    raise NonFiniteError(
        f"training loss is {float(stacked[k].item())} at epoch {epoch + 1} of {ctx.epochs}, step {first_step + k + 1}: "
        f"training diverged; lower learning_rate={lr:g} (e.g. learning_rate={lr / 10:g}), or check the data for "
        "extreme values"
    )


def auto_workers(in_memory: bool, requested: int) -> int:
    """DataLoader worker processes: ``requested`` when >= 0; else 0 for in-memory tensors (nothing to decode),
    and up to 4 (leaving one core to the training) for data decoded from files."""
    if requested >= 0:
        return requested
    if in_memory:
        return 0
    from heteroflow.components.data.preprocess import available_cpus

    return max(0, min(4, available_cpus() - 1))


__all__ += ["BUILTIN_MODEL", "auto_workers", "make_loader", "make_scaler"]
