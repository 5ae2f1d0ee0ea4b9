"""Random draws of a dataset seeded by the sampler's position: a resumed epoch draws the same augmentations.

A user's dataset that augments at random (a flip, a crop, noise) draws from the global generators of the process
that fetches the sample. With DataLoader workers that is each worker's generator, seeded once when the worker
starts (``base_seed + worker_id``) and never saved in a checkpoint, so an epoch resumed mid-way draws other
augmentations than the uninterrupted run (pytorch/pytorch#36650; with no workers the draws come from the
training process's generator, whose state the checkpoint holds, and the runs agree). Which worker fetches which
batch also depends on where the epoch started, so seeding workers once cannot fix it.

heteroflow seeds the draws from the sampler's state instead: :class:`~heteroflow.components.training.batches.EpochBatches`
tags every batch it yields (a :class:`SampleIndices`) with a key of ``(seed, epoch)``, and :class:`SeededSamples`,
the dataset the loaders read through, seeds torch's default CPU generator, Python's ``random`` and NumPy's global
generator before each sample from ``(key, sample index)`` (SplitMix64, Steele, Lea & Flood, OOPSLA 2014). A
sample's draws then depend only on the seed, the epoch and the sample: the same after a resume, with any number
of workers, and whichever rank's share of the batch holds it. In the training process (no workers) the global
generators are restored after each batch, so the training's own draws (dropout, initialisation) stay as they
were. A dataset with its own ``__getitems__`` (a whole batch at once) is seeded once per batch from ``(key, the
batch's indices)``: the same after a resume and with any number of workers, but not across another split of a
batch over ranks. A dataset whose items draw nothing sets ``draws_random = False`` and is read as is
(heteroflow's own readers do). Draws from a generator the dataset owns (``numpy.random.default_rng()`` made in
``__init__``) are the dataset's to seed.

Cost: three generators seeded per sample, mostly Python's ``random.seed`` (about 10 us). ``benchmarks/sample_seeds.py``
on a shared 2-core machine: reading a 96x96 PNG with a random crop and flip ran at 0.85-0.98x of plain reads (+20 to
+120 us a sample, load average 11), a 50 us tensor augmentation at 0.5x; with DataLoader workers the cost is the
workers' and overlaps training.
"""

from __future__ import annotations

import contextlib
import random
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["SampleIndices", "SeededSamples", "draws_key", "sample_seed", "seeded_dataset", "tag"]

_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One SplitMix64 output for state ``x`` (Steele, Lea & Flood, OOPSLA 2014; the constants are theirs)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix(*values: int) -> int:
    h = 0
    for v in values:
        h = _splitmix64(h ^ (int(v) & _M64))
    return h


def draws_key(seed: int, epoch: int) -> int:
    """The key of epoch ``epoch``'s draws for run seed ``seed`` (a 64-bit int)."""
    return _mix(seed, epoch)


def sample_seed(key: int, index: int) -> int:
    """The seed of sample ``index``'s draws under ``key`` (a 64-bit int)."""
    return _mix(key, index)


class SampleIndices(np.ndarray):  # type: ignore[type-arg]
    """A batch's dataset indices (int64 array) carrying ``key``, the key of its draws (:func:`draws_key`); the key
    survives pickling to a DataLoader worker."""

    key: int | None

    def __array_finalize__(self, obj: Any) -> None:
        self.key = getattr(obj, "key", None)

    def __reduce__(self) -> tuple[Any, ...]:
        fn, args, state = super().__reduce__()[:3]
        return fn, args, (state, self.key)

    def __setstate__(self, state: Any) -> None:
        base, self.key = state
        super().__setstate__(base)


def tag(indices: np.ndarray, key: int) -> SampleIndices:
    """``indices`` as :class:`SampleIndices` with ``key`` (a view, nothing copied)."""
    out = np.asarray(indices).view(SampleIndices)
    out.key = key
    return out


def _seed_all(seed: int) -> None:
    import torch

    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)  # the legacy global generator takes 32 bits


@contextlib.contextmanager
def _kept_rng() -> Iterator[None]:
    """Restore the global generators afterwards, in the training process (a DataLoader worker's are its own)."""
    import torch
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None:
        yield
        return
    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])


class SeededSamples:
    """The dataset a heteroflow loader reads ``dataset`` through: a batch of :class:`SampleIndices` is fetched with
    the global generators seeded per sample (per batch for a dataset with ``__getitems__``); anything else passes
    through. Attributes not its own (``classes``...) are the dataset's.

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``).
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[_plain(index)]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset" or name.startswith("__"):  # unpickling asks before dataset is set
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitems__(self, indices: Sequence[Any]) -> Any:
        key = getattr(indices, "key", None)
        batched = getattr(self.dataset, "__getitems__", None)
        plain = [_plain(i) for i in indices]  # Python ints, as torch's samplers give them
        if key is None:
            return batched(plain) if batched is not None else [self.dataset[i] for i in plain]
        with _kept_rng():
            if batched is not None:
                _seed_all(_mix(key, zlib.crc32(np.asarray(indices, dtype=np.int64).tobytes())))
                return batched(plain)
            out = []
            for i in plain:
                _seed_all(sample_seed(key, int(i)))
                out.append(self.dataset[i])
            return out


def _plain(index: Any) -> Any:
    """A numpy integer index as a Python ``int`` (what torch's samplers pass a Dataset: user code such as
    ``torch.Generator().manual_seed(i)`` or ``json`` refuses ``numpy.int64``); any other index as it is."""
    return int(index) if isinstance(index, np.integer) else index


def seeded_dataset(dataset: Any) -> Any:
    """``dataset`` read through :class:`SeededSamples`, or as is when it says ``draws_random = False``."""
    return dataset if getattr(dataset, "draws_random", True) is False else SeededSamples(dataset)
