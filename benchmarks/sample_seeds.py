"""What seeding a dataset's random draws per sample costs (heteroflow.components.training.sample_seeds), as ratios.

heteroflow's loaders read a dataset that may draw at random (``draws_random`` not False) through
:class:`~heteroflow.components.training.sample_seeds.SeededSamples`, which seeds torch's, Python's and NumPy's
global generators before each sample so a resumed epoch draws the same augmentations (pytorch/pytorch#36650). This
times reading batches of 64 through it against reading the same samples directly (the baseline, in the same run),
in the training process (the generators saved and restored around each batch) for two datasets:

- ``noise``: a 13-feature tensor, a random flip, roll and noise (a read costs tens of microseconds: the worst case);
- ``image``: a 96x96 RGB PNG decoded with Pillow, randomly cropped to 88x88 and flipped (a typical augmentation).

Each pair runs alternately ``--repeats`` times and the best of each is used (a shared machine disturbs some runs).
Nothing asserts a time: it prints. Usage: ``python benchmarks/sample_seeds.py [--repeats 5]`` (under a minute).
"""

from __future__ import annotations

import argparse
import io
import os
import random
import time

import numpy as np
import torch

from heteroflow.components.training.sample_seeds import SeededSamples, draws_key, tag


class Noise:
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 13, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.x[i]
        if torch.rand(()) < 0.5:
            x = x.flip(0)
        x = torch.roll(x, random.randint(0, 2)) + 0.1 * torch.from_numpy(np.random.standard_normal(13).astype("float32"))
        return x, 0


class Image:
    def __init__(self, n: int) -> None:
        from PIL import Image as PILImage

        rng = np.random.default_rng(0)
        self.files = []
        for _ in range(n):
            buf = io.BytesIO()
            PILImage.fromarray(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(buf, format="PNG")
            self.files.append(buf.getvalue())

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image as PILImage

        a = np.asarray(PILImage.open(io.BytesIO(self.files[i])).convert("RGB"), dtype=np.float32) / 255.0
        top, left = np.random.randint(0, 9, size=2)
        a = a[top:top + 88, left:left + 88]
        if torch.rand(()) < 0.5:
            a = a[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))), 0


def _time(read: object, batches: list[np.ndarray]) -> float:
    start = time.perf_counter()
    for b in batches:
        read(b)  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}")
    for name, ds in (("noise", Noise(2048)), ("image", Image(512))):
        seeded = SeededSamples(ds)
        order = np.random.default_rng(1).permutation(len(ds))
        batches = [tag(order[i:i + 64], draws_key(0, 0)) for i in range(0, len(ds), 64)]
        plain_t, seeded_t = [], []
        for _ in range(args.repeats):
            plain_t.append(_time(lambda b: [ds[i] for i in b], batches))
            seeded_t.append(_time(seeded.__getitems__, batches))
        per_sample = (min(seeded_t) - min(plain_t)) / len(ds) * 1e6
        print(f"{name}: seeded reads {min(plain_t) / min(seeded_t):.2f}x the speed of plain reads "
              f"({min(plain_t) / len(ds) * 1e6:.0f} us a sample plain, {per_sample:+.0f} us seeded)")


if __name__ == "__main__":
    main()
