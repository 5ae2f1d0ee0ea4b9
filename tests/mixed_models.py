"""Models and data of the mixed-job tests (imported by the worker processes by name: tests/ is on their path)."""

from __future__ import annotations

import torch
from torch import nn

from heteroflow.components.data.readers import TensorData


def digits(limit: int = 0) -> TensorData:
    """scikit-learn's bundled digits (1,797 8x8 images, 10 classes), scaled to [0, 1], shape (n, 1, 8, 8).

    Read from the file ``sklearn.datasets.load_digits`` reads (``sklearn/datasets/data/digits.csv.gz``: 64 pixel
    values 0-16 and the label per row), the same values, without importing scikit-learn: every worker process of
    a mixed test calls this, and the import cost about 2 s of CPU in each."""
    import gzip
    import importlib.util
    from pathlib import Path

    import numpy as np

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    assert spec is not None and spec.submodule_search_locations, "scikit-learn is not installed"
    path = Path(next(iter(spec.submodule_search_locations)), "datasets", "data", "digits.csv.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    x = torch.tensor(data[:, :-1].reshape(-1, 8, 8), dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data[:, -1].astype(int), dtype=torch.int64)
    if limit:
        x, y = x[:limit], y[:limit]
    return TensorData(x, y)


def blobs(n: int = 512) -> TensorData:
    """Synthetic data shaped like the digits, (n, 1, 8, 8) in [0, 1], 10 classes labelled by a fixed random linear
    teacher: the quick test's data, without importing scikit-learn into every worker process."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 1, 8, 8, generator=g)
    y = (x.flatten(1) @ torch.randn(64, 10, generator=g)).argmax(1)
    return TensorData(x, y)


def cnn() -> nn.Module:
    """A small CNN without dropout or batch norm (its result does not depend on how a batch is split)."""
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 4 * 4, 10))


def mlp() -> nn.Module:
    """heteroflow's built-in MLP on the flattened digits."""
    from heteroflow.components.training.factories import mlp as builtin

    return builtin(64, 10, hidden_units=32, input_shape=(1, 8, 8))


def wide_mlp() -> nn.Module:
    """An MLP of 167k parameters (0.67 MB of gradients): DDP sends them in several buckets in a mixed job."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


def sgd(params, lr):  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def sgd_no_momentum(params, lr):  # type: ignore[no-untyped-def]
    """Plain SGD: what top-k with momentum correction and masking is when it sends everything (DGC)."""
    return torch.optim.SGD(params, lr=lr)
