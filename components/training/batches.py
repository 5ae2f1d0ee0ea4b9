"""The training data loaders: :class:`EpochBatches` (seeded, resumable batches, each rank's share of every batch in
distributed training), :func:`make_loader` (a DataLoader over it), :func:`auto_workers` (at most how many DataLoader
worker processes) and :func:`choose_workers` (how many, from the measured load and compute times of a batch)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from heteroflow.components.errors import InvalidParameter

if TYPE_CHECKING:  # numpy and torch are imported where they are used: train's parameter checks import this module
    import numpy as np
    import torch

__all__ = ["EVAL_BYTES", "GATHER_BYTES", "NEGLIGIBLE_LOAD", "PROBE_BATCHES", "RECEIVE_SECONDS", "SHARED_COLLATE_SECONDS_PER_BYTE",
           "WORTH_A_WORKER", "EpochBatches", "auto_workers", "batch_bytes", "batch_seconds", "choose_workers",
           "eval_batch_size", "make_loader", "proportional_sizes", "tensor_batches", "train_threads"]


def proportional_sizes(n: int, parts: Sequence[int]) -> list[int]:
    """``n`` samples split in the proportions of ``parts`` (per-rank sizes of a whole batch of ``sum(parts)``):
    ``parts`` itself when ``n == sum(parts)``, else ``n * part / sum(parts)`` rounded by largest remainders, ties to
    the lower rank (Hamilton's apportionment method). The sizes sum to ``n``; a rank may get 0. Used for an epoch's
    last, partial batch by :meth:`EpochBatches.sizes` and
    :meth:`GlobalSampler.sizes <heteroflow.components.training.shares.GlobalSampler.sizes>`."""
    total = sum(parts)
    if n == total:
        return list(parts)
    exact = [n * p / total for p in parts]
    out = [math.floor(e) for e in exact]
    for r in sorted(range(len(out)), key=lambda r: (out[r] - exact[r], r))[: n - sum(out)]:
        out[r] += 1
    return out


class EpochBatches:
    """The batch sampler of heteroflow's loaders: epoch ``e`` visits a permutation seeded by ``seed + e``, in
    batches of ``batch_size`` (the last may be smaller), from batch ``start`` on (a resume mid-epoch). The same
    seed gives the same batches on every device and with any number of DataLoader workers, and each batch carries
    the key of its samples' random draws (:mod:`heteroflow.components.training.sample_seeds`), so a dataset that
    augments at random draws the same on a resume too.

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
        return proportional_sizes(n_batch, self.parts)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return max(0, math.ceil(self.n / self.batch_size) - self.start)

    def order(self) -> np.ndarray:
        """The epoch's sample order, int64 ``(n,)``: the permutation seeded by ``seed + epoch``, or ``0..n-1``
        unshuffled; batch ``b`` of the epoch is ``order[b * batch_size:(b + 1) * batch_size]`` (before a rank's share)."""
        import numpy as np

        return np.random.default_rng(self.seed + self.epoch).permutation(self.n) if self.shuffle else np.arange(self.n)

    def __iter__(self) -> Iterator[np.ndarray]:
        from heteroflow.components.training.sample_seeds import draws_key, tag

        key = draws_key(self.seed, self.epoch)  # the batches carry it: a sample's random draws follow (seed, epoch)
        order = self.order()
        for b in range(self.start, math.ceil(self.n / self.batch_size)):
            batch = order[b * self.batch_size:(b + 1) * self.batch_size]  # int64 array: one index op per batch
            if self.world_size > 1:
                sizes = self.sizes(len(batch))
                start = sum(sizes[: self.rank])
                part = batch[start:start + sizes[self.rank]]
                batch = part if len(part) else batch[:1]
            yield tag(batch, key)

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
    ``world_size > 1``, ``parts`` the per-rank sizes when given): ``num_workers`` processes prefetching 2 batches each
    (on the CPU handing them over in reused shared-memory slots: :class:`~heteroflow.components.training.slots.SlotLoader`), pinned memory on accelerators, its
    own RNG (the global one stays the training's). A dataset's random draws (augmentation) are seeded per sample
    from (``seed``, epoch, sample index): :func:`heteroflow.components.training.sample_seeds.seeded_dataset`."""
    import torch
    from torch.utils.data import DataLoader

    from heteroflow.components.core.processes import PRELOAD_DATALOADER, worker_context
    from heteroflow.components.data.readers import batch_collate
    from heteroflow.components.training.sample_seeds import seeded_dataset
    from heteroflow.components.training.slots import SlotLoader

    sampler = EpochBatches(len(dataset), batch_size, seed, shuffle=shuffle, rank=rank, world_size=world_size, parts=parts)
    return (SlotLoader if num_workers > 0 and device.type == "cpu" else DataLoader)(
        seeded_dataset(dataset),
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=batch_collate,
        pin_memory=device.type != "cpu",
        prefetch_factor=2 if num_workers > 0 else None,
        persistent_workers=num_workers > 0,
        generator=torch.Generator().manual_seed(seed),
        multiprocessing_context=worker_context(PRELOAD_DATALOADER) if num_workers > 0 else None,  # imports first (#28.13)
        worker_init_fn=_worker_init if num_workers > 0 else None,
    )


WORKER_SHARING_STRATEGY: str | None = "file_system"
"""How a DataLoader worker of :func:`make_loader` hands its batches' shared memory to the training process
(``torch.multiprocessing.set_sharing_strategy``, set in the worker only: the training process's own setting is
left as it is; ``None``: torch's default, ``file_descriptor`` on Linux). With ``file_descriptor`` the training
process fetches every tensor's descriptor from a thread of the worker (``multiprocessing.resource_sharer``: a
socket connection and an HMAC challenge each way per tensor, two per batch), and waits while that thread waits
for a core: a profile of #32's benchmark on a busy 2-core machine put 0.9 s of a 5.6 s epoch there.
``file_system`` names the memory by a file in ``/dev/shm`` that torch's ``torch_shm_manager`` removes when the
last process using it goes, even after a crash (torch's multiprocessing notes). A quiet 2-core machine, 200
batches of 32 float32 3x80x80 crops through a queue: the training process's CPU per batch 1.2 ms instead of
1.6-2.1 ms, the worker's 2.5-2.9 ms instead of 2.9-3.5 ms."""


def _worker_init(worker_id: int) -> None:
    """Each :func:`make_loader` worker's set-up: :data:`WORKER_SHARING_STRATEGY`."""
    import torch.multiprocessing

    if WORKER_SHARING_STRATEGY in torch.multiprocessing.get_all_sharing_strategies():
        torch.multiprocessing.set_sharing_strategy(WORKER_SHARING_STRATEGY)


GATHER_BYTES = 16 * 2**20
"""At most this many bytes of samples are gathered by one index operation in :func:`tensor_batches` (a chunk of
batches; a larger batch is gathered alone)."""


def tensor_batches(x: torch.Tensor, y: torch.Tensor, sampler: EpochBatches) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches ``(x[idx], y[idx])`` of ``sampler``'s epoch from its ``start`` on, for in-memory tensors (a
    :class:`~heteroflow.components.data.readers.TensorData`'s ``x`` and ``y``) in one process: the same batches, in
    the same order, as a DataLoader over them with ``sampler`` yields, gathered a chunk of batches at a time.

    One ``index_select`` per tensor gathers up to :data:`GATHER_BYTES` of consecutive batches, and each batch is a
    view of that chunk (a copy, as the DataLoader's: a model that writes into its input changes no data set),
    instead of two index operations, a sampler step and a collate per batch: digits' epoch (1,257 rows, batches of
    64) took 0.2 ms instead of 0.47 ms (timeit, one core), about 10 us a step, 2% of the built-in MLP's step.

    Args:
        x: samples ``(n, ...)``; y: labels ``(n,)``.
        sampler: the loader's :class:`EpochBatches`, its epoch and start set; ``world_size`` must be 1.

    Raises:
        InvalidParameter: a sampler that splits batches over ranks (``world_size > 1``).
    """
    import torch

    if sampler.world_size != 1:
        raise InvalidParameter(f"world_size={sampler.world_size} is out of range for tensor_batches; valid: 1 (ranks' shares go through the DataLoader)")
    n, size = sampler.n, sampler.batch_size
    first = sampler.start * size
    if first >= n:
        return
    order = torch.from_numpy(sampler.order()[first:])
    row_bytes = max(1, x[:1].numel() * x.element_size() + y.element_size())
    step = max(1, GATHER_BYTES // (row_bytes * size)) * size  # samples per chunk: whole batches
    for at in range(0, len(order), step):
        idx = order[at:at + step]  # index_select: about 8x faster than x[idx] for a thousand rows (torch 2.13, CPU)
        yield from zip(x.index_select(0, idx).split(size), y.index_select(0, idx).split(size))


EVAL_BYTES = 4 * 2**20
"""The validation loader's batches hold about this many bytes of float32 samples (:func:`eval_batch_size`)."""


def eval_batch_size(batch_size: int, input_shape: tuple[int, ...]) -> int:
    """The validation loader's batch size: about :data:`EVAL_BYTES` of float32 samples of ``input_shape``, at least
    256 and ``batch_size``, at most 4096 (evaluation keeps no activations for a backward pass: fewer, larger
    batches cost fewer model calls; digits' 269 validation rows are one batch, a 3x224x224 image batch stays 256)."""
    row_bytes = 4 * math.prod(input_shape or (1,))
    return max(batch_size, min(4096, max(256, EVAL_BYTES // max(1, row_bytes))))


def train_threads(workers: int) -> int:
    """torch's intra-op threads for a training with ``workers`` DataLoader worker processes (at most that many:
    train sizes its threads by the most workers it may use, a count that does not depend on timing): the cores
    this process may use (:func:`heteroflow.components.data.preprocess.available_cpus`: affinity and cgroup quota)
    less one per worker, at least 1, and at most ``OMP_NUM_THREADS`` when that is set (torch reads it at start;
    train's ``torch.set_num_threads`` would otherwise override it).

    Deterministic on purpose: the thread count can change a CPU result's last bits (how a reduction is split), and
    a resumed run must end with the uninterrupted run's weights. On an oversubscribed host (more runnable work
    than cores) extra OpenMP threads cost more than they give: with 2 threads on 2 cores at load average 9, a
    digits MLP epoch took 6x as long as with 1 thread, an MLP of 1024 hidden units at batch 256 5.5x (#32); pin
    the process (``taskset``) or set ``OMP_NUM_THREADS=1`` there.
    """
    import os

    from heteroflow.components.data.preprocess import available_cpus

    threads = max(1, available_cpus() - workers)
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    return min(threads, int(omp)) if omp.isdigit() and int(omp) >= 1 else threads


def auto_workers(in_memory: bool, requested: int) -> int:
    """DataLoader worker processes: ``requested`` when >= 0; else 0 for in-memory tensors (nothing to decode),
    and up to 4, at most one per core, for data decoded from files on 2 cores or more (on one core a worker has
    nothing to overlap with): the most :func:`choose_workers` may pick once the first batches are timed (:meth:`TrainContext.batches
    <heteroflow.components.training.loop.TrainContext.batches>`)."""
    if requested >= 0:
        return requested
    if in_memory:
        return 0
    from heteroflow.components.data.preprocess import available_cpus

    cpus = available_cpus()
    return min(4, cpus) if cpus >= 2 else 0


PROBE_BATCHES = 4
"""Batches :meth:`TrainContext.batches <heteroflow.components.training.loop.TrainContext.batches>` loads in the
training process and times before it chooses the worker count (the first is not counted: start-up)."""

NEGLIGIBLE_LOAD = 0.1
"""Loading a batch that takes under this share of a step's compute is not worth a worker process: overlapping it
gains less than 10% while each worker pickles its batches to the training process and holds a copy of the dataset."""

WORTH_A_WORKER = 0.05
"""Another worker process must shorten the predicted time per batch by more than this share (5%) to be started."""


SHARED_COLLATE_SECONDS_PER_BYTE = 1.0e-3 / (32 * 3 * 80 * 80 * 4)
"""What a DataLoader worker pays per byte of a batch beyond loading it in the training process, seconds: stacking
the batch and copying it into one of its reused shared-memory slots, and the queue's pickling
(:mod:`heteroflow.components.training.slots`). Measured (#32): +1.0 ms for a batch of 32 float32 3x80x80 crops
(2.46 MB; a pass of 375 batches with 1 worker against one without, each pair back to back on 2 cores: worker CPU
per batch 8.40 and 8.00 ms against 7.04 and 7.15 ms, +0.85-1.36 ms, the first, cold pair left out); torch's own
path, ``default_collate`` into new shared memory (every page a fresh fault), cost +2.0-2.9 ms in the same
script's three pairs (+1.9 ms in the first measurement)."""

RECEIVE_SECONDS = 1.0e-3
"""What the training process pays to receive one batch from a worker, seconds: reading it from the queue,
unpickling it and copying it out of its slot. Measured (#32, the run of :data:`SHARED_COLLATE_SECONDS_PER_BYTE`):
0.8-1.4 ms of the training process's CPU per batch (1.0-1.4 ms with torch's path; 1.5 ms with torch's
``file_descriptor`` strategy in the first measurement), about the same for a batch a quarter the size, so a fixed
cost."""


def batch_bytes(batch: Any) -> int:
    """The bytes of the tensors (and NumPy arrays) in ``batch`` (tensors, tuples, lists, dicts of them): what a
    worker moves to the training process per batch."""
    import numpy as np
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, np.ndarray):
        return int(batch.nbytes)
    if isinstance(batch, dict):
        return sum(batch_bytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(v) for v in batch)
    return 0


def batch_seconds(load_seconds: float, compute_seconds: float, *, workers: int, cpus: int, nbytes: int = 0) -> float:
    """The predicted wall time per batch of a training whose batches load in ``load_seconds`` and whose steps
    compute in ``compute_seconds`` (both measured in one process), with ``workers`` DataLoader worker processes
    on ``cpus`` cores, for batches of ``nbytes`` bytes (:func:`batch_bytes`).

    No workers: ``load + compute`` (one process does both in turn). ``n`` workers: each batch costs its worker
    ``load' = load + nbytes * SHARED_COLLATE_SECONDS_PER_BYTE`` and the training process ``compute' = compute +
    RECEIVE_SECONDS`` (the transfer between the processes: :data:`SHARED_COLLATE_SECONDS_PER_BYTE`,
    :data:`RECEIVE_SECONDS`); the time is the largest of three bounds, ``compute'`` (the training process's step),
    ``load' / n`` (the workers' throughput: the pipelining bound of PyTorch's DataLoader prefetching) and
    ``(load' + compute') / cpus`` (all the work of a batch shared by the cores: a worker beyond ``cpus - 1``
    still helps while the training process waits for data, and on 2 cores two workers beat one when loading
    costs more than computing). So a batch that loads in less than its transfer costs is loaded in the training
    process.
    """
    if workers <= 0:
        return load_seconds + compute_seconds
    load = load_seconds + nbytes * SHARED_COLLATE_SECONDS_PER_BYTE
    compute = compute_seconds + RECEIVE_SECONDS
    return max(compute, load / workers, (load + compute) / max(1, cpus))


def choose_workers(load_seconds: float, compute_seconds: float, *, cpus: int, most: int, nbytes: int = 0) -> int:
    """How many DataLoader worker processes keep the training fed: none when loading a batch is negligible
    (under :data:`NEGLIGIBLE_LOAD` of its compute), else the fewest, 0 to ``most``, whose predicted time per batch
    (:func:`batch_seconds`) is within :data:`WORTH_A_WORKER` of the best: ``ceil(load / compute)`` on enough
    cores, fewer when the cores are the bound.

    Args:
        load_seconds: time to load (read, decode, augment, collate) one batch in the training process, seconds.
        compute_seconds: time of one training step on a batch already loaded, seconds.
        cpus: cores this process may use (:func:`heteroflow.components.data.preprocess.available_cpus`).
        most: the largest count allowed (:func:`auto_workers`' bound).
        nbytes: the bytes of a batch (:func:`batch_bytes`; 0: transfers counted at their fixed cost only).

    Returns:
        The worker count, 0 to ``most``.

    Raises:
        InvalidParameter: a negative time or count.
    """
    for name, value in (("load_seconds", load_seconds), ("compute_seconds", compute_seconds), ("cpus", cpus), ("most", most),
                        ("nbytes", nbytes)):
        if not value >= 0:
            raise InvalidParameter(f"{name}={value!r} is out of range; valid: a number >= 0")
    if most <= 0 or load_seconds <= NEGLIGIBLE_LOAD * compute_seconds:
        return 0
    times = [batch_seconds(load_seconds, compute_seconds, workers=n, cpus=cpus, nbytes=nbytes) for n in range(most + 1)]
    best = min(times)
    return next(n for n, t in enumerate(times) if t <= best * (1 + WORTH_A_WORKER) + 1e-12)
