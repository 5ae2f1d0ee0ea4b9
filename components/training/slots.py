"""Batches handed from DataLoader workers to the training process through shared-memory slots that are reused.

A DataLoader worker's ``default_collate`` writes every batch into *new* shared memory (``_new_shared`` for each
tensor), and the training process maps each one afresh: on a 2-core machine that costs the worker about 2 ms per
batch of 32 float32 3x80x80 crops (2.46 MB: every page a fresh fault; 0.06 ms to stack the same batch into memory
that is reused, ``benchmarks/training.py`` section 4's batch, timeit) and the training process another mapping
per batch. Here each worker keeps a few shared buffers (:data:`SLOTS`) that it fills in turn: the batch is
stacked in the worker's own memory, copied into a free slot, and only a small :class:`SlotBatch` (the slot, its
layout, the non-tensor leaves) crosses the queue; torch's ``file_system`` sharing hands the same slot over by
name each time, and the training process, which keeps every slot it has seen mapped, finds it in torch's
``shared_cache`` instead of mapping it again. The training process copies the batch out of the slot (its own
memory: a batch kept by the caller is never overwritten) and marks the slot free.

The worker never waits for a slot: when none is free (the training process holds more batches than the
DataLoader's prefetching allows, or dropped some without reading them) it uses torch's own ``default_collate``
for that batch. A :class:`SlotBatch` dropped unread in the training process (an epoch stopped early) frees its
slot when it is collected.

Used by :func:`heteroflow.components.training.batches.make_loader` for loaders on the CPU; loaders that pin memory
for an accelerator keep torch's path (the pin-memory thread would need the same unpacking; not measured here).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

__all__ = ["SLOTS", "SlotBatch", "SlotCollate", "SlotLoader", "unpack"]

SLOTS = 6
"""Shared buffers per worker: one per batch in flight. A DataLoader worker has at most ``prefetch_factor`` (2 in
:func:`~heteroflow.components.training.batches.make_loader`) batches outstanding, plus the one being copied out and
those the in-order delivery holds while another worker's batch comes first."""

_ALIGN = 64  # each tensor of a batch starts on a cache line of the slot


class _Leaf:
    """Where one tensor of a batch lies in its slot: byte offset, byte count, dtype, shape."""

    __slots__ = ("dtype", "nbytes", "offset", "shape")

    def __init__(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.offset, self.nbytes, self.dtype, self.shape = offset, nbytes, dtype, shape

    def __reduce__(self) -> tuple[Any, ...]:
        return _Leaf, (self.offset, self.nbytes, self.dtype, self.shape)


class SlotBatch:
    """A batch in a worker's slot, as it crosses the DataLoader's queue: ``layout`` is the batch with each CPU tensor
    replaced by a :class:`_Leaf`; ``buf`` the slot (uint8, shared), ``busy`` the worker's flags (int8, shared; 1
    while the slot holds a batch not yet copied out), ``index`` this slot's flag."""

    __slots__ = ("_owner", "buf", "busy", "index", "layout")

    def __init__(self, buf: torch.Tensor, busy: torch.Tensor, index: int, layout: Any, owner: int) -> None:
        self.buf, self.busy, self.index, self.layout, self._owner = buf, busy, index, layout, owner

    def __reduce__(self) -> tuple[Any, ...]:
        return SlotBatch, (self.buf, self.busy, self.index, self.layout, self._owner)

    def take(self) -> Any:
        """The batch, its tensors copied out of the slot into this process's memory; frees the slot."""
        buf = self.buf

        def out(leaf: Any) -> Any:
            if isinstance(leaf, _Leaf):
                return buf[leaf.offset:leaf.offset + leaf.nbytes].view(leaf.dtype).view(leaf.shape).clone()
            return _map(leaf, out)

        batch = out(self.layout)
        self._free()
        return batch

    def _free(self) -> None:
        if self.busy is not None and os.getpid() != self._owner:  # the worker's own copy frees nothing
            self.busy[self.index] = 0
            self.busy = None  # type: ignore[assignment]

    def __del__(self) -> None:  # dropped unread (an epoch stopped early): the slot is free again
        try:
            self._free()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to free
            pass


def _map(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """``obj`` with ``fn`` applied to the items of its tuples, lists and dicts (namedtuples keep their type)."""
    if isinstance(obj, tuple):
        items = [fn(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [fn(v) for v in obj]
    if isinstance(obj, dict):
        return {k: fn(v) for k, v in obj.items()}
    return obj


def _stack_plain(batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
    return torch.stack(batch, 0)


_PLAIN_MAP: dict[Any, Any] = {}


def _collate_plain(samples: Any) -> Any:
    """torch's ``default_collate`` with tensors stacked into this process's memory (in a worker, torch's own
    stacks into new shared memory: the cost the slots save)."""
    from torch.utils.data._utils import collate as tcollate

    if not _PLAIN_MAP:
        _PLAIN_MAP.update({**tcollate.default_collate_fn_map, torch.Tensor: _stack_plain})
    return tcollate.collate(samples, collate_fn_map=_PLAIN_MAP)


class SlotCollate:
    """A DataLoader ``collate_fn`` that, in a worker, hands the batch ``collate(samples)`` over in a slot (a
    :class:`SlotBatch`); in the training process itself (no workers) it is ``collate``.

    Args:
        collate: the loader's collate function; ``torch.utils.data.default_collate`` is replaced, in a worker, by
            the same collation into the worker's own memory (its shared-memory path is what the slots save), and so
            is its use inside :func:`~heteroflow.components.data.readers.batch_collate`.
    """

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate
        self._slots: list[torch.Tensor] = []
        self._busy: torch.Tensor | None = None

    def __call__(self, samples: Any) -> Any:
        if get_worker_info() is None:
            return self.collate(samples)
        from heteroflow.components.data.readers import batch_collate

        if self.collate is batch_collate:
            batch = batch_collate(samples, collate=_collate_plain)
        elif self.collate is torch.utils.data.default_collate:
            batch = _collate_plain(samples)
        else:
            batch = self.collate(samples)  # a collate of its own: its tensors, wherever it put them, go in a slot
        return self._to_slot(batch)

    def _to_slot(self, batch: Any) -> Any:
        if self._busy is None:
            self._busy = torch.zeros(SLOTS, dtype=torch.int8).share_memory_()
        tensors: list[tuple[_Leaf, torch.Tensor]] = []
        offset = 0

        def place(item: Any) -> Any:  # the batch with each CPU tensor replaced by where it goes in the slot
            nonlocal offset
            if isinstance(item, torch.Tensor) and item.device.type == "cpu" and not item.is_sparse:
                leaf = _Leaf(offset, item.numel() * item.element_size(), item.dtype, tuple(item.shape))
                offset += -(-leaf.nbytes // _ALIGN) * _ALIGN
                tensors.append((leaf, item))
                return leaf
            return _map(item, place)

        layout = place(batch)
        if not tensors:
            return batch  # no tensor to move
        busy = self._busy.tolist()
        free = [i for i in range(len(self._slots)) if busy[i] == 0]
        if free:
            index = next((i for i in free if self._slots[i].numel() >= offset), free[0])
            if self._slots[index].numel() < offset:
                self._slots[index] = torch.empty(offset, dtype=torch.uint8).share_memory_()
        elif len(self._slots) < SLOTS:
            index = len(self._slots)
            self._slots.append(torch.empty(offset, dtype=torch.uint8).share_memory_())
        else:
            return batch  # every slot in use: torch's queue moves this batch into new shared memory
        buf = self._slots[index]
        for leaf, tensor in tensors:
            buf[leaf.offset:leaf.offset + leaf.nbytes].view(leaf.dtype).view(leaf.shape).copy_(tensor)
        self._busy[index] = 1
        return SlotBatch(buf, self._busy, index, layout, os.getpid())


def unpack(batch: Any) -> Any:
    """``batch`` as the training uses it: a :class:`SlotBatch` copied out of its slot, anything else as is."""
    return batch.take() if isinstance(batch, SlotBatch) else batch


class _SlotIter(_MultiProcessingDataLoaderIter):
    """torch's multi-process DataLoader iterator, unpacking each :class:`SlotBatch` as it is returned and keeping the
    slots it has seen (so each is mapped into this process once, not once per batch)."""

    def __init__(self, loader: DataLoader) -> None:  # type: ignore[type-arg]
        super().__init__(loader)
        self._kept: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def _next_data(self) -> Any:
        batch = super()._next_data()
        if isinstance(batch, SlotBatch):
            self._kept[(batch._owner, batch.index)] = (batch.buf, batch.busy)
            return batch.take()
        return batch


class SlotLoader(DataLoader):  # type: ignore[type-arg]
    """A DataLoader whose workers hand batches over in reused slots (:class:`SlotCollate`): the same batches, in the
    same order, as the DataLoader with ``collate_fn`` alone. ``collate_fn`` is wrapped here."""

    def __init__(self, *args: Any, collate_fn: Callable[[Any], Any], **kwargs: Any) -> None:
        super().__init__(*args, collate_fn=SlotCollate(collate_fn), **kwargs)

    def _get_iterator(self) -> Any:
        if self.num_workers == 0 or self.pin_memory:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        return _SlotIter(self)
