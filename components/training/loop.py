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
                ctx.backward(loss, opt)                   # backward and step (through ctx.scaler for fp16; pass
                                                          # scheduler= to step it, never on a skipped step)
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

Where the parts live: the built-in model and :class:`ModelSpec` in
:mod:`heteroflow.components.training.factories`, precision and the ``GradScaler`` in
:mod:`heteroflow.components.training.precision`, :class:`Checkpoint` in :mod:`heteroflow.components.training.checkpoint`,
the loaders (:class:`EpochBatches`, :func:`make_loader`, :func:`auto_workers`) in
:mod:`heteroflow.components.training.batches`. This module keeps :class:`TrainContext` and :func:`classifier_loop`
and re-exports the others, so ``heteroflow.components.training.loop:mlp`` and
``heteroflow.components.training:mlp`` keep resolving.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from heteroflow.components.errors import InvalidParameter, NonFiniteError
from heteroflow.components.training.batches import (
    PROBE_BATCHES,
    EpochBatches,
    auto_workers,
    batch_bytes,
    choose_workers,
    make_loader,
    tensor_batches,
)
from heteroflow.components.training.checkpoint import (
    _FORMAT,
    CHECKPOINT_FILE,
    CHECKPOINT_INFO,
    Checkpoint,
    _rng_state,
    _set_rng_state,
    _to_cpu,
)
from heteroflow.components.training.factories import BUILTIN_MODEL, ModelSpec, _import_callable, mlp
from heteroflow.components.training.precision import (
    PRECISIONS,
    _device_bf16,
    _synchronize,
    make_scaler,
    resolve_precision,
    scaled_step,
)
from heteroflow.components.training.step import TRAIN

if TYPE_CHECKING:  # torch is imported where it is used: train's parameter checks import this module
    import torch
    from torch import nn

__all__ = [
    "BUILTIN_MODEL",
    "PRECISIONS",
    "Checkpoint",
    "EpochBatches",
    "ModelSpec",
    "TrainContext",
    "auto_workers",
    "classifier_loop",
    "compile_available",
    "make_loader",
    "make_scaler",
    "mlp",
    "resolve_precision",
]
# moved names re-exported above for `from heteroflow.components.training.loop import X` (and private ones that
# other modules import): CHECKPOINT_FILE, CHECKPOINT_INFO, _FORMAT, _rng_state, _set_rng_state, _to_cpu,
# _import_callable, _device_bf16, _synchronize


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
        loader_workers: the training loader's worker processes (the count :meth:`batches` chose, once it has,
            when :meth:`measure_loading` asked it to).
        compile_model: :meth:`build_model` compiles the model with ``torch.compile`` where it is available.

    ``loss_ref``, ``optimizer_ref`` and ``compile_model`` default to the train step's ``loss``, ``optimizer`` and
    ``compile_model`` (:data:`~heteroflow.components.training.step.TRAIN`).
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
    loss_ref: str = TRAIN.param("loss").default
    optimizer_ref: str = TRAIN.param("optimizer").default
    rank: int = 0
    world_size: int = 1
    distributed: Any = None
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    progress: Callable[..., None] | None = None
    fault_check: Callable[[int], None] | None = None
    model: Any = None
    loader_workers: int = 0
    compile_model: bool = TRAIN.param("compile_model").default
    samples_seen: int = 0
    loop_seconds: float = 0.0
    _started: float = dataclasses.field(default_factory=time.perf_counter)
    _share: float = 1.0
    _amp_skips: Any = None  # skipped steps not yet added to checkpoint.counters (a device tensor: no wait per step)
    _loader_with: Callable[[int], Any] | None = None  # the training loader with N workers (measure_loading)
    _most_workers: int = 0
    _probe: list[tuple[float, float, int]] | None = None  # (load, compute) seconds and bytes of the batches timed so far
    _iterators: list[Any] = dataclasses.field(default_factory=list)  # DataLoader iterators with workers (stop_loaders)

    def __post_init__(self) -> None:
        # one list: the checkpoint saves the history reported so far and restores it in place on load, whatever
        # training function runs (#28 item 11)
        self.checkpoint.history = self.history

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
        """The model factory's model, built after seeding torch with ``seed``, on :attr:`device`; compiled in
        place (``nn.Module.compile``: the state dict keeps its keys, so checkpoints and the saved model do not
        change) when :attr:`compile_model` is set and ``torch.compile`` can run here (:func:`compile_available`;
        else it says why and trains eagerly)."""
        import torch

        torch.manual_seed(self.seed)
        self.model = self.model_spec.build().to(self.device)
        if self.compile_model:
            why_not = compile_available(self.device)
            if why_not:
                if self.rank == 0:
                    print(f"train: compile_model=True, but {why_not}: training without torch.compile", file=sys.stderr, flush=True)
            else:
                self.model.compile()
        if self.distributed is not None and self.world_size > 1:
            # DDP with DDP's averaging hook: loss_fn's per-rank factor makes the average the whole batch's gradient
            self.model = self.distributed.ddp(self.model, weighted=False)
        return self.model

    def build_optimizer(self, model: nn.Module) -> Any:
        """The optimizer ``optimizer`` names (:func:`~heteroflow.components.training.factories.build_optimizer`:
        a built-in name or a factory ``fn(params, lr=...)``), default ``torch.optim.Adam(lr=learning_rate)``."""
        from heteroflow.components.training.factories import build_optimizer

        return build_optimizer(self.optimizer_ref, model.parameters(), self.learning_rate)

    def loss_fn(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss factory's loss (``fn()`` returning a callable), default cross-entropy on logits."""
        if not self.loss_ref:
            value = _cross_entropy()(output, target)
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

    def backward(self, loss: torch.Tensor, optimizer: Any, scheduler: Any = None) -> torch.Tensor:
        """Zero ``optimizer``'s gradients, backpropagate ``loss`` (a scalar tensor) and take the optimizer step,
        through :attr:`scaler` when fp16 needs one (scale the loss, unscale before the step, update the scale:
        ``torch.amp.GradScaler``'s documented order), then step ``scheduler`` (an LR scheduler stepped once per
        optimizer step) unless the scaler skipped the step.

        A scaler skips the step when the gradients hold an inf or NaN (:func:`scaled_step`); stepping the scheduler
        anyway moves the learning rate on for an update that never happened (pytorch/pytorch#55585). Skips are
        counted in :attr:`amp_skipped_steps` (saved in checkpoints, reported in the run record). Deciding the
        scheduler's step reads one flag from the device; without a scheduler nothing waits.

        Returns:
            ``loss``, detached (for logging: ``loss = ctx.backward(loss, opt)``).
        """
        optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            skipped = scaled_step(self.scaler, loss, optimizer)
            self._amp_skips = skipped.long() if self._amp_skips is None else self._amp_skips + skipped
            if scheduler is not None and not bool(skipped):
                scheduler.step()
        else:
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        return loss.detach()

    @property
    def amp_skipped_steps(self) -> int:
        """Optimizer steps the GradScaler skipped (inf/NaN gradients) in the whole training, those before a resume
        included (0 without a scaler). Reading it waits for the device."""
        self._flush_amp_skips()
        return int(self.checkpoint.counters.get("amp_skipped_steps", 0))

    def _flush_amp_skips(self) -> None:
        if self._amp_skips is not None:
            counters = self.checkpoint.counters
            counters["amp_skipped_steps"] = int(counters.get("amp_skipped_steps", 0)) + int(self._amp_skips.item())
            self._amp_skips = None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` in :attr:`autocast_dtype` on this device type (a no-op context for fp32)."""
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def to_device(self, batch: Any) -> Any:
        """Move a batch (tensors, tuples, lists, dicts of them) to :attr:`device` (non-blocking: the loaders pin
        host memory on accelerators, so the copy overlaps the step before it; on the CPU nothing moves)."""
        import torch

        if self.device.type == "cpu":
            return batch  # a loader's tensors are host tensors already
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self.to_device(b) for b in batch)
        if isinstance(batch, dict):
            return {k: self.to_device(v) for k, v in batch.items()}
        return batch

    def batches(self, epoch: int, step: int = 0) -> Iterator[Any]:
        """Epoch ``epoch``'s training batches on :attr:`device`, from the batch after optimizer step ``step``
        (the whole epoch when ``step`` lies before it).

        After :meth:`measure_loading`, the first :data:`~heteroflow.components.training.batches.PROBE_BATCHES`
        batches load in this process, each timed with the step that consumes it, while the loader with the most
        workers starts on the batches after them (its start-up overlaps the probe); the rest of the training
        comes from a loader with the worker count :func:`~heteroflow.components.training.batches.choose_workers`
        picks from those times (printed; that loader kept when it has the count). The batches and their order are
        the same with any worker count.

        Nothing here waits for the device or reads a clock per batch, apart from those first batches.
        """
        start = max(0, step - epoch * self.steps_per_epoch)
        if self._probe is not None:
            return self._probed_batches(epoch, start)
        return self._loader_batches(self.train_loader, epoch, start)  # one generator between the loop and the data

    def _loader_batches(self, loader: Any, epoch: int, start: int, *, shares: bool = True,
                        started: Iterator[Any] | None = None) -> Iterator[Any]:
        sampler = loader.batch_sampler
        shared, on_cpu = shares and self.world_size > 1, self.device.type == "cpu"
        if started is not None:
            source: Iterator[Any] = started  # its sampler was set to this epoch and batch when it started
        elif loader.num_workers == 0 and not loader.pin_memory:
            sampler.set_epoch(epoch, start)
            # a DataLoader without workers fetches and collates in this process: the same calls without its
            # iterator's per-batch bookkeeping (about 10 us a batch, several % of a small model's step)
            dataset, collate = loader.dataset, loader.collate_fn
            if type(dataset) is _tensor_data() and sampler.world_size == 1:
                # in-memory tensors: a chunk of batches gathered at once, each batch a view of it
                source = tensor_batches(dataset.x, dataset.y, sampler)
            else:
                fetch = getattr(dataset, "__getitems__", None) or (lambda idx: [dataset[i] for i in idx])
                source = (collate(fetch(idx)) for idx in sampler)
        else:
            sampler.set_epoch(epoch, start)
            source = self._started_iter(loader)
        if on_cpu and not shared:
            yield from source
            return
        for b, batch in enumerate(source, start):
            if shared:
                self._share = sampler.share(b)
            yield batch if on_cpu else self.to_device(batch)

    def _started_iter(self, loader: Any) -> Iterator[Any]:
        """``iter(loader)``, kept for :meth:`stop_loaders` when it has worker processes."""
        it = iter(loader)
        if loader.num_workers > 0:
            self._iterators = [i for i in self._iterators if not getattr(i, "_shutdown", True)]  # the ones still running
            self._iterators.append(it)
        return it

    def stop_loaders(self) -> None:
        """Stop the worker processes of every DataLoader iterator this context started (torch's own shutdown:
        workers told to end and joined, queues closed). The train step calls it when the training raises: the
        iterator of the batch it stopped in stays referenced by the exception's frames, and with it two forked
        workers and the queues' feeder threads, until the exception is collected. A fallback or a rerun in the
        same process then forked its own workers beside them (a forked DataLoader worker died at its first
        ``index_queue.get`` with "semaphore or lock released too many times", once in about 5 suite runs). Idempotent."""
        for it in self._iterators:
            _stop_workers(it)
        self._iterators.clear()

    def measure_loading(self, loader_with: Callable[[int], Any], most: int) -> None:
        """Let :meth:`batches` choose the training loader's worker count (0 to ``most``) from the times of its
        first batches. ``loader_with(n)`` builds the training loader with ``n`` workers."""
        self._loader_with, self._most_workers, self._probe = loader_with, most, []

    def _probed_batches(self, epoch: int, start: int) -> Iterator[Any]:
        assert self._loader_with is not None and self._probe is not None
        probe = self._probe
        in_process = self._loader_with(0)
        sampler = in_process.batch_sampler
        sampler.set_epoch(epoch, start)
        fetched = iter(in_process)
        b = start
        # The loader built with the most workers starts now on the batches after the probe, so its start-up (a
        # fork, the workers' first touches of the parent's memory, their first batches) overlaps the probe batches
        # this process loads and computes, and it is kept when the choice is the most (2 workers on 2 cores when
        # loading costs more than computing). Before, the training waited for that start-up after the probe (#32).
        # An epoch too short to reach past the probe starts nothing.
        ahead_loader, ahead = self.train_loader, None
        after_probe = start + PROBE_BATCHES - len(probe)
        if ahead_loader.num_workers > 0 and after_probe < start + len(sampler):
            ahead_loader.batch_sampler.set_epoch(epoch, after_probe)
            ahead = self._started_iter(ahead_loader)
        while len(probe) < PROBE_BATCHES:
            t0 = time.perf_counter()
            batch = next(fetched, None)
            if batch is None:
                return  # the epoch ended first: the next one goes on timing
            t1 = time.perf_counter()
            nbytes = batch_bytes(batch)
            if self.world_size > 1:
                self._share = sampler.share(b)
            yield self.to_device(batch)
            probe.append((t1 - t0, time.perf_counter() - t1, nbytes))  # loading the batch, the step that used it, its bytes
            b += 1
        n = self._choose_workers()
        if n == 0 or ahead is None:
            _stop_workers(ahead)
            if n == 0:
                self.train_loader = in_process
            elif n != self.train_loader.num_workers:
                self.train_loader = self._loader_with(n)  # type: ignore[misc]
            yield from self._loader_batches(self.train_loader, epoch, b)
            return
        if n == ahead_loader.num_workers:
            yield from self._loader_batches(ahead_loader, epoch, b, started=ahead)
            return
        # Another count: its workers start on the batches after HEAD_START more from the loader started ahead
        # (already prefetched), which then stops.
        self.train_loader = self._loader_with(n)  # type: ignore[misc]
        self.train_loader.batch_sampler.set_epoch(epoch, b + HEAD_START)
        chosen = self._started_iter(self.train_loader)
        for _, batch in zip(range(HEAD_START), ahead, strict=False):
            if self.world_size > 1:
                self._share = ahead_loader.batch_sampler.share(b)
            yield self.to_device(batch)
            b += 1
        _stop_workers(ahead)
        yield from self._loader_batches(self.train_loader, epoch, b, started=chosen)

    def _choose_workers(self) -> int:
        """The worker count from the probe's times (printed); ends the probe."""
        from heteroflow.components.data.preprocess import available_cpus
        from heteroflow.components.training.batches import RECEIVE_SECONDS, SHARED_COLLATE_SECONDS_PER_BYTE, batch_seconds

        timed = (self._probe or [])[1:] or (self._probe or [(0.0, 0.0, 0)])  # the first batch pays start-up costs
        load = statistics.median(t[0] for t in timed)
        compute = statistics.median(t[1] for t in timed)
        nbytes = max(t[2] for t in timed)
        cpus = available_cpus()
        n = choose_workers(load, compute, cpus=cpus, most=self._most_workers, nbytes=nbytes)
        self._probe = None
        self.loader_workers = n
        # torch's threads stay what train set from the most workers (batches.train_threads): a count that depends
        # on this timed choice could change a CPU result's last bits between a run and its resumed rerun
        if self.rank == 0:
            predicted = batch_seconds(load, compute, workers=n, cpus=cpus, nbytes=nbytes)
            transfer = (nbytes * SHARED_COLLATE_SECONDS_PER_BYTE + RECEIVE_SECONDS) * 1e3
            print(f"train: loader_workers={n} (chosen: a batch loads in {load * 1e3:.1f} ms and a step computes in "
                  f"{compute * 1e3:.1f} ms; a batch of {nbytes / 2**20:.2f} MiB costs {transfer:.1f} ms to pass from a "
                  f"worker; {cpus} cores, at most {self._most_workers}; predicted {predicted * 1e3:.1f} ms a batch; "
                  "set loader_workers to choose)", file=sys.stderr, flush=True)
        return n

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
            self._flush_amp_skips()  # the checkpoint holds the count so far
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
            # the history so far rides along: a run stopped mid-training still has its curves (its report)
            self.progress(**{**clean, "epochs": self.epochs,
                             "samples_per_second": round(self.samples_seen / elapsed, 1) if elapsed > 0 else 0.0,
                             "history": [dict(e) for e in self.history]})

    def evaluate_accuracy(self, model: nn.Module, loader: Any = None) -> float | None:
        """Accuracy of ``model`` on ``loader`` (default the validation loader); None without one."""
        import torch

        loader = self.val_loader if loader is None else loader
        if loader is None:
            return None
        model = model.module if hasattr(model, "module") else model  # DDP: every rank evaluates its own copy
        was_training = model.training
        model.eval()
        correct, total = None, 0
        # inference_mode: no autograd and no version counters (torch's recommended mode for evaluation; Lightning
        # validates in it by default)
        with torch.inference_mode(), self.autocast():
            for x, y in self._loader_batches(loader, 0, 0, shares=False):
                hits = (model(x).argmax(dim=1) == y).sum()
                correct = hits if correct is None else correct + hits  # on the device: one wait, at the end
                total += len(y)
        model.train(was_training)
        return int(correct.item()) / total if total and correct is not None else None


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
    model = ctx.build_model()
    optimizer = ctx.build_optimizer(model)
    state = ctx.checkpoint.load(model=model, optimizer=optimizer, scaler=ctx.scaler)
    step = state["step"] if state else 0
    extra = state["extra"] if state else {}  # the history came back with the checkpoint (Checkpoint.load)
    loss_sum = float(extra.get("epoch_loss_sum", 0.0))  # float64, as the sums below
    loss_count = int(extra.get("epoch_loss_count", 0))
    if loss_count and step % ctx.steps_per_epoch == 0:
        # The checkpoint fell on the last step of an epoch, before that epoch was reported: report it now (the
        # weights are those it ended with, so validation accuracy is what it would have said).
        _report_epoch(ctx, model, epoch=step // ctx.steps_per_epoch - 1, step=step, loss=loss_sum / loss_count)
        loss_sum, loss_count = 0.0, 0
    model.train()
    started = time.perf_counter()
    amp = ctx.autocast_dtype is not None
    # per step: no device wait, no clock, no file system; the next checkpoint is a step number (Checkpoint.next_due)
    checkpoint, fault_check, loss_fn, backward = ctx.checkpoint, ctx.fault_check, ctx.loss_fn, ctx.backward
    next_due = checkpoint.next_due(step)
    for epoch in range(ctx.epoch_of(step), ctx.epochs):
        losses: list[torch.Tensor] = []  # device tensors: nothing waits for the device per step
        first_step, seen = step, 0
        for x, y in ctx.batches(epoch, step):
            if amp:
                with ctx.autocast():
                    loss = loss_fn(model(x), y)
            else:
                loss = loss_fn(model(x), y)
            losses.append(backward(loss, optimizer))
            step += 1
            seen += len(y)
            if step == next_due:
                # never save NaN weights: _loss_sum raises first
                part = ctx.mean_across_workers(loss_sum + _loss_sum(losses, first_step=first_step, epoch=epoch, ctx=ctx))
                ctx.step_done(step, model=model, optimizer=optimizer, extra={
                    "epoch_loss_sum": part, "epoch_loss_count": loss_count + len(losses),
                })
                next_due = checkpoint.next_due(step)
            elif fault_check is not None:
                fault_check(step)
        ctx.samples_seen += seen
        total = ctx.mean_across_workers(loss_sum + _loss_sum(losses, first_step=first_step, epoch=epoch, ctx=ctx))
        count = loss_count + len(losses)
        epoch_loss = total / count if count else float("nan")
        loss_sum, loss_count = 0.0, 0
        _report_epoch(ctx, model, epoch=epoch, step=step, loss=epoch_loss)
    _synchronize(ctx.device)
    ctx.loop_seconds = time.perf_counter() - started
    return model


def compile_available(device: torch.device) -> str:
    """Why ``torch.compile`` cannot run on ``device`` here (an empty string when it can): TorchDynamo unsupported
    on this Python or platform (``torch._dynamo.is_dynamo_supported``), or, on the CPU, no C++ compiler for
    Inductor's kernels (``$CXX``, ``g++``, ``clang++`` or ``c++`` on the PATH)."""
    import os

    try:
        import torch._dynamo
    except ImportError as exc:
        return f"torch._dynamo cannot be imported ({exc})"
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile does not support this Python or platform"
    if device.type == "cpu" and not any(shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if c):
        return "no C++ compiler for torch.compile's CPU kernels (set CXX or install g++)"
    return ""


HEAD_START = 2
"""Batches taken from the loader started during the probe when another worker count is chosen, while the chosen
count's workers start."""


def _stop_workers(batches: Any) -> None:
    """Stop the worker processes of a DataLoader iterator (None: nothing to stop)."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


_CROSS_ENTROPY: list[Callable[..., Any]] = []


def _cross_entropy() -> Callable[..., Any]:
    """``torch.nn.functional.cross_entropy``, imported once (torch is imported where it is used)."""
    if not _CROSS_ENTROPY:
        import torch.nn.functional as F

        _CROSS_ENTROPY.append(F.cross_entropy)
    return _CROSS_ENTROPY[0]


def _tensor_data() -> type:
    """:class:`heteroflow.components.data.readers.TensorData` (imported where used: the readers import NumPy)."""
    from heteroflow.components.data.readers import TensorData

    return TensorData


def _report_epoch(ctx: TrainContext, model: nn.Module, *, epoch: int, step: int, loss: float) -> None:
    val = ctx.evaluate_accuracy(model)
    ctx.report(epoch=epoch + 1, step=step, total_steps=ctx.total_steps, loss=round(loss, 6),
               **({"validation_accuracy": round(val, 6)} if val is not None else {}))


def _loss_sum(losses: list[torch.Tensor], *, first_step: int, epoch: int, ctx: TrainContext) -> float:
    """The sum of ``losses`` (scalar tensors of steps ``first_step + 1`` on) in float64: one wait for the device.

    A sum in float64 of finite losses (float32 or narrower: at most 3.4e38 each) cannot overflow, so it is finite
    exactly when every loss is; only then are they not looked at one by one.

    Raises:
        NonFiniteError: a loss is NaN or infinite (:func:`_check_losses`).
    """
    import torch

    if not losses:
        return 0.0
    total = float(torch.stack(losses).double().sum())
    if not math.isfinite(total):
        _check_losses(losses, first_step=first_step, epoch=epoch, ctx=ctx)
    return total


def _check_losses(losses: list[torch.Tensor], *, first_step: int, epoch: int, ctx: TrainContext) -> None:
    """Raise at the first loss among ``losses`` (of steps ``first_step + 1`` on) that is NaN or infinite.

    Raises:
        NonFiniteError: names the epoch and step, and suggests a lower learning rate.
    """
    import torch

    if not losses:
        return
    stacked = torch.stack(losses).float()
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
