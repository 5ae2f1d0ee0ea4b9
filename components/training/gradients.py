"""Mixed replicas: gradients combined weighted by per-rank batch size, gradient compression, the learning rate and
the data each rank sees (the section "Mixed replicas, weighted gradients" of
:mod:`heteroflow.components.training.distributed` says why). :func:`batch_weights`, :func:`weighted_hook` (wraps
an averaging DDP communication hook [DH]), :func:`cpu_relay_hook` (reduces CPU copies in a gloo group of mixed
device types), :func:`comm_hook` (the hook of a compression), :func:`scaled_learning_rate` (the linear scaling
rule), :func:`rank_slice` and :class:`RankBatches` (each rank's part of every global batch).

Sources: [DH] DDP communication hooks, https://pytorch.org/docs/stable/ddp_comm_hooks.html.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from heteroflow.components.errors import InvalidParameter

__all__ = [
    "COMPRESSIONS",
    "RankBatches",
    "batch_weights",
    "comm_hook",
    "cpu_relay_hook",
    "rank_slice",
    "scaled_learning_rate",
    "weighted_hook",
]

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
"""Gradient compression options of :func:`comm_hook`: torch's own DDP hooks [DH]."""


def batch_weights(batch_sizes: Sequence[int]) -> tuple[float, ...]:
    """Each rank's share of the union batch, ``b_r / sum(b)``.

    Raises:
        InvalidParameter: an empty list, or a batch size that is not an integer >= 1.
    """
    sizes = list(batch_sizes)
    if not sizes:
        raise InvalidParameter("batch_sizes is empty; valid: one integer >= 1 per rank")
    for i, b in enumerate(sizes):
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InvalidParameter(f"batch_sizes[{i}]={b!r} is not a batch size; valid: an integer >= 1")
    total = sum(sizes)
    return tuple(b / total for b in sizes)


def weighted_hook(hook: Callable[[Any, Any], Any], batch_sizes: Sequence[int], rank: int) -> Callable[[Any, Any], Any]:
    """Wrap an *averaging* DDP communication hook so it computes the batch-size-weighted gradient.

    The wrapped hook multiplies rank ``r``'s gradient bucket by ``N * b_r / B`` (``N`` ranks, ``B = sum(b)``)
    and calls ``hook``, which averages over ranks; the result is ``sum_r (b_r / B) g_r``, the union-batch
    gradient of a mean-reduced loss. Works with torch's ``allreduce_hook``, ``fp16_compress_hook``,
    ``bf16_compress_hook`` and ``powerSGD_hook`` [DH], which all divide the sum by the world size.

    Args:
        hook: ``hook(state, bucket) -> Future[Tensor]``, averaging over the process group.
        batch_sizes: per-rank batch sizes (samples per step), one per rank.
        rank: this worker's rank.

    Raises:
        InvalidParameter: bad batch sizes, or ``rank`` outside them.
    """
    weights = batch_weights(batch_sizes)
    if not 0 <= rank < len(weights):
        raise InvalidParameter(f"rank={rank} has no batch size; batch_sizes has {len(weights)} entries")
    factor = len(weights) * weights[rank]

    def weighted(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects non-GradBucket annotations
        bucket.buffer().mul_(factor)
        return hook(state, bucket)

    weighted.__name__ = f"weighted_{getattr(hook, '__name__', 'hook')}"
    return weighted


def cpu_relay_hook(process_group, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations
    """A DDP communication hook that averages through CPU copies: the bucket is copied to the CPU, all-reduced
    (SUM, divided by the world size) and copied back. For a gloo group whose ranks hold tensors gloo cannot
    reduce on their device (an Ascend NPU rank beside a CUDA rank); wrap it in :func:`weighted_hook` for
    unequal batches."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    cpu = buffer.detach().to("cpu").div_(dist.get_world_size(group))
    fut = dist.all_reduce(cpu, group=group, async_op=True).get_future()

    def back(f):  # type: ignore[no-untyped-def]
        buffer.copy_(f.value()[0])
        return buffer

    return fut.then(back)


def comm_hook(
    compression: str = "none",
    *,
    batch_sizes: Sequence[int] = (),
    rank: int = 0,
    process_group: Any = None,
    relay_through_cpu: bool = False,
) -> tuple[Any, Callable[[Any, Any], Any]]:
    """The ``(state, hook)`` pair to pass to ``DistributedDataParallel.register_comm_hook``.

    Args:
        compression: ``none`` (``allreduce_hook``, fp32), ``fp16`` (``fp16_compress_hook``), ``bf16``
            (``bf16_compress_hook``), ``powersgd`` (``powerSGD_hook``, rank 1, error feedback, 10 warm-up
            iterations uncompressed: Vogels et al. 2019, "PowerSGD: Practical Low-Rank Gradient Compression for
            Distributed Optimization", NeurIPS) [DH].
        batch_sizes: per-rank batch sizes; when given, the hook weights by them (:func:`weighted_hook`).
        rank: this worker's rank (used with ``batch_sizes``).
        process_group: the group (default: the world; passed as the hook's state).
        relay_through_cpu: reduce CPU copies of the gradients (:func:`cpu_relay_hook`; no compression).

    Raises:
        InvalidParameter: an unknown compression (lists the valid ones), compression with the CPU relay, or bad
            batch sizes.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if compression not in COMPRESSIONS:
        raise InvalidParameter(f"compression={compression!r} is unknown; valid: {', '.join(COMPRESSIONS)}")
    if relay_through_cpu and compression != "none":
        raise InvalidParameter(f"compression={compression!r} with the CPU relay (ranks of mixed device types); valid: none")
    state: Any = process_group
    if relay_through_cpu:
        hook: Callable[[Any, Any], Any] = cpu_relay_hook
    elif compression == "none":
        hook = default_hooks.allreduce_hook
    elif compression == "fp16":
        hook = default_hooks.fp16_compress_hook
    elif compression == "bf16":
        hook = default_hooks.bf16_compress_hook
    else:
        state = powerSGD_hook.PowerSGDState(process_group=process_group, matrix_approximation_rank=1, start_powerSGD_iter=10)
        hook = powerSGD_hook.powerSGD_hook
    if batch_sizes:
        hook = weighted_hook(hook, batch_sizes, rank)
    return state, hook


def scaled_learning_rate(base_lr: float, base_batch_size: int, batch_sizes: Sequence[int]) -> float:
    """The linear scaling rule: ``base_lr * sum(batch_sizes) / base_batch_size``.

    Source: Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", arXiv:1706.02677,
    section 2.1 ("When the minibatch size is multiplied by k, multiply the learning rate by k"); section 2.2 adds a
    gradual warm-up for large batches. With :func:`weighted_hook` one step is one step over the union batch, so
    the rule applies to ``B = sum(batch_sizes)``.

    Args:
        base_lr: the learning rate tuned at ``base_batch_size`` (> 0).
        base_batch_size: samples per step of that tuning (>= 1).
        batch_sizes: per-rank batch sizes now.

    Raises:
        InvalidParameter: a rate <= 0, a base batch < 1 or bad batch sizes.
    """
    batch_weights(batch_sizes)
    if not base_lr > 0:
        raise InvalidParameter(f"base_lr={base_lr!r}; valid: a number > 0")
    if isinstance(base_batch_size, bool) or not isinstance(base_batch_size, int) or base_batch_size < 1:
        raise InvalidParameter(f"base_batch_size={base_batch_size!r}; valid: an integer >= 1")
    return base_lr * sum(batch_sizes) / base_batch_size


def rank_slice(batch_sizes: Sequence[int], rank: int) -> slice:
    """The part of each global batch (of ``sum(batch_sizes)`` samples, in order) that belongs to ``rank``: the
    ``b_rank`` samples after those of ranks ``0 .. rank-1``. ``N`` workers taking these slices see exactly the
    batches one process with batch ``sum(batch_sizes)`` sees.

    Raises:
        InvalidParameter: bad batch sizes or a rank outside them.
    """
    batch_weights(batch_sizes)
    if not 0 <= rank < len(batch_sizes):
        raise InvalidParameter(f"rank={rank} has no batch size; batch_sizes has {len(batch_sizes)} entries")
    start = sum(batch_sizes[:rank])
    return slice(start, start + batch_sizes[rank])


class RankBatches:
    """A batch sampler for one rank of an unequal-batch run: epoch ``e`` visits a permutation of ``n`` samples
    seeded by ``seed + e`` (numpy ``default_rng``, as heteroflow's single-process loader does), cut into global
    batches of ``B = sum(batch_sizes)``; this rank yields its :func:`rank_slice` of each. The union over ranks of
    batch ``i`` is batch ``i`` of one process with batch size ``B``. A last, partial global batch is dropped
    (every rank must take the same number of steps, or the collectives hang).

    Args:
        n: samples in the data set.
        batch_sizes: per-rank batch sizes.
        rank: this rank.
        seed: the shuffling seed.
        shuffle: False: in order.

    Raises:
        InvalidParameter: bad batch sizes or rank, or ``n`` smaller than one global batch.
    """

    def __init__(self, n: int, batch_sizes: Sequence[int], rank: int, seed: int = 0, *, shuffle: bool = True) -> None:
        self.part = rank_slice(batch_sizes, rank)
        self.global_batch = sum(batch_sizes)
        if n < self.global_batch:
            raise InvalidParameter(f"the data set has {n} samples, fewer than one global batch of {self.global_batch} ({list(batch_sizes)})")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Visit epoch ``epoch`` from global batch ``start`` on (a resume mid-epoch)."""
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return max(0, self.n // self.global_batch - self.start)

    def __iter__(self) -> Any:
        import numpy as np

        order = np.random.default_rng(self.seed + self.epoch).permutation(self.n) if self.shuffle else np.arange(self.n)
        for b in range(self.start, self.n // self.global_batch):
            yield order[b * self.global_batch : (b + 1) * self.global_batch][self.part].tolist()
