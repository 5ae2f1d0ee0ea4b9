"""Your own model and data with heteroflow: two model factories and a training function, in a module of your own.

Put this folder on ``PYTHONPATH`` (step processes import the factories by name), then::

    python examples/digits_models.py images /tmp/digits-images     # the scikit-learn digits as PNG files
    heteroflow run --dataset /tmp/digits-images --param model=digits_models:cnn --param epochs=15
    heteroflow run --dataset /tmp/digits-images --param model=digits_models:cnn \\
        --param train_function=digits_models:train_loop          # your loop instead of heteroflow's
    heteroflow run --param model=digits_models:mlp --param model_args='{"hidden_units": 64}'   # the digits table

A model factory returns a ``torch.nn.Module`` and may take ``num_classes``, ``in_features``, ``input_shape`` and
``hidden_units`` (heteroflow passes those it takes) plus anything in ``model_args``. The archive records the
factory and its arguments, so ``load_archived(path).predict(images)`` rebuilds the model wherever this module
can be imported.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn


def mlp(in_features: int, num_classes: int, hidden_units: int = 128) -> nn.Module:
    """The digits MLP: ``(batch, in_features)`` -> logits ``(batch, num_classes)``."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, hidden_units),
        nn.ReLU(),
        nn.Linear(hidden_units, num_classes),
    )


def cnn(num_classes: int, input_shape: tuple[int, ...] = (1, 8, 8), channels: int = 16) -> nn.Module:
    """A small CNN for small images: two 3x3 convolutions, a 2x2 max-pool, two linear layers.
    Input ``(batch, C, H, W)`` float32 in [0, 1] (H and W even), output logits ``(batch, num_classes)``."""
    c, h, w = input_shape
    return nn.Sequential(
        nn.Conv2d(c, channels, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * channels * (h // 2) * (w // 2), 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )


def train_loop(ctx: Any) -> nn.Module:
    """A training function (``train_function=digits_models:train_loop``): SGD with momentum and a cosine
    schedule, autocast (and fp16's GradScaler) and checkpoints from heteroflow's context, one report per epoch.

    What it needs back after a resume rides in the checkpoint's ``extra``: the epochs already reported and the
    partial epoch's loss sum, so a resumed run reports the same history and losses as an uninterrupted one. It
    runs unchanged on a candidate with several devices (``ctx.mean_across_workers`` is the whole batch's loss).
    """
    model = ctx.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=ctx.learning_rate * 50, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=ctx.total_steps)
    state = ctx.checkpoint.load(model=model, optimizer=opt, scheduler=sched, scaler=ctx.scaler)
    step = state["step"] if state else 0
    extra = state["extra"] if state else {}
    ctx.history[:] = list(extra.get("history", []))
    total, count = float(extra.get("loss_sum", 0.0)), int(extra.get("loss_count", 0))
    if count and step % ctx.steps_per_epoch == 0:  # saved at an epoch's last step, before that epoch's report
        ctx.report(epoch=step // ctx.steps_per_epoch, step=step, loss=total / count,
                   validation_accuracy=ctx.evaluate_accuracy(model))
        total, count = 0.0, 0
    for epoch in range(ctx.epoch_of(step), ctx.epochs):
        for x, y in ctx.batches(epoch, step):
            with ctx.autocast():
                loss = ctx.loss_fn(model(x), y)
            ctx.backward(loss, opt)  # through the GradScaler for fp16
            sched.step()
            step += 1
            ctx.samples_seen += len(y)
            total, count = total + loss.detach().item(), count + 1
            extra = None
            if ctx.checkpoint.due(step):  # every worker takes part in the mean, so compute it only when saving
                extra = {"history": ctx.history, "loss_sum": ctx.mean_across_workers(total), "loss_count": count}
            ctx.step_done(step, model=model, optimizer=opt, scheduler=sched, extra=extra)
        ctx.report(epoch=epoch + 1, step=step, loss=ctx.mean_across_workers(total) / max(count, 1),
                   validation_accuracy=ctx.evaluate_accuracy(model))
        total, count = 0.0, 0
    return model


def export_digits_images(folder: str | Path) -> Path:
    """Write scikit-learn's digits (1,797 8x8 images) as grayscale PNG files in the ImageFolder layout
    ``<folder>/<digit>/<index>.png`` (pixel values 0-16 scaled to 0-255). Returns ``folder``."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    root = Path(folder)
    for i, (img, label) in enumerate(zip(digits.images, digits.target)):
        out = root / str(label)
        out.mkdir(parents=True, exist_ok=True)
        Image.fromarray((img * (255 / 16)).round().astype(np.uint8), mode="L").save(out / f"{i:04d}.png")
    return root


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "images":
        print(export_digits_images(sys.argv[2]))
    else:
        print(__doc__)
