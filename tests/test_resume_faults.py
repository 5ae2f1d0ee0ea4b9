"""Two resume defects replayed from public PyTorch reports (issue #29 item 8), each kept as a test with its right value.

1. pytorch/pytorch#36650: a mid-epoch resume with DataLoader workers and a dataset that augments at random drew
   other augmentations than the uninterrupted run (each worker's generator is seeded once at its start and not in
   the checkpoint), so the losses differed; with no workers they agreed. Right value: the resumed run's losses,
   validation accuracies and weights equal the uninterrupted run's. Siblings: the validation split (augmenting
   too) evaluates the same at every epoch; 0 and 2 workers read the same samples, and a batch split over ranks
   draws what one process draws; the training process's own generators are left as they were.
2. pytorch/pytorch#55585: with fp16 AMP, a step the GradScaler skips (inf/NaN gradients) still stepped the LR
   scheduler, and ``ctx.backward`` returned None. Right value: after N steps of which k were skipped, the learning
   rate is ``lr * gamma ** (N - k)``, the run record counts the k skips (a resume included), and backward returns the
   loss.

Everything runs on the CPU: fp16 autocast on the CPU with ``torch.amp.GradScaler("cpu")``; the inf gradient is forced
by a model layer whose backward multiplies by inf when its batch holds a marked sample.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="training needs PyTorch")

from heteroflow.components.core.failures import InjectedDeviceFault  # noqa: E402
from heteroflow.components.training.step import MODEL_WEIGHTS, _train_facts, _train_summary, train  # noqa: E402

_FAULT_ENV = "HETEROFLOW_INJECT_FAULT"

# A user's data module: 12 features, 3 classes; each read flips the features at random (p = 0.5), shifts them by
# 0-2 places and adds noise, drawing from torch, Python's random and NumPy's global generator (as user code does).
# Samples listed in MARKED carry a 1 in feature 12 (the AMP test's marked samples); the others a 0.
_DATA = '''
import random
import numpy as np
import torch

MARKED = (7, 50)

class Augmenting(torch.utils.data.Dataset):
    classes = ["a", "b", "c"]

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.arange(n) % 3
        self.x = torch.randn(n, 13, generator=g) * 0.5
        self.x[torch.arange(n), self.y * 4] += 2.0
        self.x[:, 12] = 0.0
        for i in MARKED:
            if i < n:
                self.x[i, 12] = 1.0

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i].clone()
        body = x[:12]
        if torch.rand(()) < 0.5:
            body = body.flip(0)
        body = torch.roll(body, random.randint(0, 2))
        body = body + 0.1 * torch.from_numpy(np.random.standard_normal(12).astype("float32"))
        return torch.cat([body, x[12:]]), int(self.y[i])

def make(split):
    return Augmenting(96 if split == "train" else 30, 0 if split == "train" else 1)
'''

# A model whose backward gives an inf gradient when its batch holds a marked sample, and a training function
# with an LR scheduler stepped through ctx.backward.
_AMP = '''
import torch
from torch import nn

class _InfIfMarked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, marked):
        ctx.marked = bool(marked.any())
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad):
        return (grad * float("inf") if ctx.marked else grad), None

class Net(nn.Module):
    def __init__(self, in_features, num_classes):
        super().__init__()
        self.l1 = nn.Linear(in_features, 16)
        self.l2 = nn.Linear(16, num_classes)

    def forward(self, x):
        h = _InfIfMarked.apply(self.l1(x), x[:, 12] > 0.5)
        return self.l2(torch.relu(h))

def make(in_features, num_classes):
    return Net(in_features, num_classes)

def loop(ctx):
    model = ctx.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=ctx.learning_rate)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    state = ctx.checkpoint.load(model=model, optimizer=opt, scheduler=sched, scaler=ctx.scaler)
    step = state["step"] if state else 0
    for epoch in range(ctx.epoch_of(step), ctx.epochs):
        last = None
        for x, y in ctx.batches(epoch, step):
            with ctx.autocast():
                loss = ctx.loss_fn(model(x), y)
            last = ctx.backward(loss, opt, scheduler=sched)
            step += 1
            ctx.step_done(step, model=model, optimizer=opt, scheduler=sched)
        ctx.report(epoch=epoch + 1, step=step, last_loss=float(last), lr=sched.get_last_lr()[0],
                   scale=ctx.scaler.get_scale())
    return model
'''


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's modules (augdata_r29, ampfn_r29) on sys.path (DataLoader workers fork from this process)."""
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "augdata_r29.py").write_text(textwrap.dedent(_DATA))
    (folder / "ampfn_r29.py").write_text(textwrap.dedent(_AMP))
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _weights(model_dir: Path) -> dict[str, Any]:
    return torch.load(model_dir / MODEL_WEIGHTS, map_location="cpu", weights_only=True)


def _interrupted_then_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, at_step: int, **kwargs: Any) -> Any:
    """train, stopped by an injected device fault after step ``at_step`` (a checkpoint step), then run again. The
    stopped training's DataLoader workers are gone when it raises, though the exception (held here) references the
    iterator they served: they were left running beside the rerun's own forked workers (TrainContext.stop_loaders)."""
    import multiprocessing

    where = dict(dataset_dir=tmp_path, model_dir=tmp_path / name, checkpoint_root=str(tmp_path / f"ck-{name}"))
    monkeypatch.setenv(_FAULT_ENV, f"train@cpu=device:after_steps={at_step}")
    before = set(multiprocessing.active_children())
    with pytest.raises(InjectedDeviceFault) as stopped:
        train(**where, **kwargs)
    assert stopped.value.__traceback__ is not None and set(multiprocessing.active_children()) - before == set()
    monkeypatch.delenv(_FAULT_ENV)
    return train(**where, **kwargs)


# --- 1. random augmentation and DataLoader workers across a resume (pytorch/pytorch#36650) ----------------------


@pytest.mark.slow  # trains a model: seconds (#32: the quick suite stays quick)
def test_a_mid_epoch_resume_with_two_loader_workers_draws_the_augmentations_of_the_uninterrupted_run(
    user_modules: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs: dict[str, Any] = dict(device="cpu", epochs=3, batch_size=16, learning_rate=1e-2, seed=5,
                                  checkpoint_every_steps=3, dataset_factory="augdata_r29:make")
    whole = train(tmp_path, tmp_path / "whole", checkpoint_root=str(tmp_path / "ck-whole"), loader_workers=2, **kwargs)
    # 96 samples in batches of 16: 6 steps an epoch; step 9 is the middle of the second epoch
    resumed = _interrupted_then_resumed(tmp_path, monkeypatch, "resumed", 9, loader_workers=2, **kwargs)

    assert (whole.num_workers, resumed.num_workers) == (2, 2)
    assert resumed.resumed_from_step == 9 and resumed.steps == whole.steps == 18
    # the right value: the uninterrupted run's losses and validation accuracies, epoch by epoch (the validation
    # split augments too: each evaluation draws the same), and its weights
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    assert [h["validation_accuracy"] for h in resumed.history] == [h["validation_accuracy"] for h in whole.history]
    w, r = _weights(tmp_path / "whole"), _weights(tmp_path / "resumed")
    assert all(torch.equal(w[k], r[k]) for k in w), {k: float((w[k] - r[k]).abs().max()) for k in w}


def test_a_batch_split_over_ranks_draws_what_one_process_draws_and_the_training_generators_stay(user_modules: Path) -> None:
    """The draws follow (seed, epoch, sample): two ranks' shares of a batch (48 + 16 samples) hold the samples one
    process reads, drawn alike, with 2 workers or none; reading in the training process leaves its generators as
    they were (dropout and initialisation draw what they drew before)."""
    import random

    import augdata_r29

    from heteroflow.components.training.batches import make_loader

    data = augdata_r29.make("train")
    cpu = torch.device("cpu")
    one = make_loader(data, batch_size=64, seed=11, shuffle=True, num_workers=2, device=cpu)
    ranks = [make_loader(data, batch_size=64, seed=11, shuffle=True, num_workers=0, device=cpu, rank=r, world_size=2,
                         parts=(48, 16)) for r in range(2)]
    for epoch in (0, 1):
        for loader in (one, *ranks):
            loader.batch_sampler.set_epoch(epoch)
        torch.manual_seed(123)
        random.seed(123)
        np.random.seed(123)
        before = torch.get_rng_state(), random.getstate(), np.random.get_state()
        parts = [list(loader) for loader in ranks]
        assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
        assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state()[1:3], before[2][1:3]))
        for b, (x, y) in enumerate(one):
            assert torch.equal(torch.cat([parts[0][b][0], parts[1][b][0]]), x)
            assert torch.equal(torch.cat([parts[0][b][1], parts[1][b][1]]), y)
    # and the draws are random: epoch 0 and epoch 1 of a sample differ (a flip, a shift, noise)
    one.batch_sampler.set_epoch(0)
    first = {int(i): row for idx, (xs, _) in zip(one.batch_sampler, one) for i, row in zip(idx, xs)}
    one.batch_sampler.set_epoch(1)
    second = {int(i): row for idx, (xs, _) in zip(one.batch_sampler, one) for i, row in zip(idx, xs)}
    assert sum(not torch.equal(first[i], second[i]) for i in first) == len(first)


def test_a_users_dataset_gets_python_int_indices_as_torchs_samplers_give() -> None:
    """A new user's dataset factory seeded a generator per sample, ``torch.Generator().manual_seed(i)``, and failed
    with "TypeError: an integer is required": the sampler handed it numpy.int64. Both ways a Dataset is read, one
    sample at a time and by ``__getitems__`` (sibling), get Python ints, with workers and without."""
    from heteroflow.components.training.batches import make_loader

    class PerSample(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 24

        def __getitem__(self, i):  # noqa: ANN001
            assert type(i) is int, type(i)
            return torch.randn(3, generator=torch.Generator().manual_seed(i)), i % 2

    class Batched(PerSample):
        def __getitems__(self, indices):  # noqa: ANN001
            assert type(indices) is list and all(type(i) is int for i in indices), [type(i) for i in indices]
            return [(torch.full((3,), float(i)), i % 2) for i in indices]

    cpu = torch.device("cpu")
    for dataset in (PerSample(), Batched()):
        for workers in (0, 2):
            loader = make_loader(dataset, batch_size=8, seed=3, shuffle=True, num_workers=workers, device=cpu)
            loader.batch_sampler.set_epoch(0)
            batches = list(loader)
            assert sum(len(y) for _, y in batches) == 24


# --- 2. GradScaler skips and the LR scheduler (pytorch/pytorch#55585) ------------------------------------------


def _context(tmp_path: Path, model_ref: str) -> Any:
    from heteroflow.components.training.loop import Checkpoint, ModelSpec, TrainContext, make_scaler

    dtype = torch.float16
    cpu = torch.device("cpu")
    return TrainContext(
        device=cpu, device_kind="cpu", autocast_dtype=dtype, scaler=make_scaler(dtype, cpu), train_loader=None,
        val_loader=None, classes=("a", "b", "c"), input_shape=(13,), epochs=1, batch_size=4, learning_rate=0.1, seed=0,
        params={}, checkpoint=Checkpoint(tmp_path / "ck", every_steps=1000, model={}, amp_dtype="float16", total_steps=10),
        model_spec=ModelSpec(ref=model_ref, args={"in_features": 13, "num_classes": 3}),
    )


def test_a_step_the_grad_scaler_skips_does_not_step_the_scheduler_and_backward_returns_the_loss(
    user_modules: Path, tmp_path: Path
) -> None:
    ctx = _context(tmp_path, "ampfn_r29:make")
    assert isinstance(ctx.scaler, torch.amp.GradScaler) and ctx.autocast_dtype is torch.float16
    model = ctx.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    g = torch.Generator().manual_seed(0)
    skipped_steps = {2, 5}  # 1-based steps whose batch holds a marked sample: inf gradients
    for step in range(1, 7):
        x = torch.randn(4, 13, generator=g)
        x[:, 12] = 1.0 if step in skipped_steps else 0.0
        y = torch.tensor([0, 1, 2, 0])
        before = [p.detach().clone() for p in model.parameters()]
        with ctx.autocast():
            loss = ctx.loss_fn(model(x), y)
        out = ctx.backward(loss, opt, scheduler=sched)
        assert isinstance(out, torch.Tensor) and not out.requires_grad and torch.equal(out, loss.detach())
        unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
        assert unchanged == (step in skipped_steps), step  # the scaler skipped exactly the inf steps
    # the right value: the scheduler stepped on the 4 taken steps only
    assert sched.last_epoch == 4 and opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 4)
    assert ctx.amp_skipped_steps == 2
    assert ctx.scaler.get_scale() == 2.0 ** 16 * 0.5 ** 2  # backed off once per skip (growth after 2000 steps)

    # the report's input, in plain PyTorch (the documented loop): the scheduler steps on a skip too
    plain = torch.nn.Linear(2, 1)
    popt = torch.optim.SGD(plain.parameters(), lr=0.1)
    psched = torch.optim.lr_scheduler.ExponentialLR(popt, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(plain(torch.tensor([[float("inf"), 1.0]])).sum()).backward()
    scaler.step(popt)
    scaler.update()
    with pytest.warns(UserWarning, match=r"lr_scheduler.step\(\)` before `optimizer.step\(\)"):  # torch sees it too
        psched.step()
    assert psched.last_epoch == 1 and scaler.get_scale() == 2.0 ** 15  # skipped, yet the LR moved on


def test_a_disabled_scaler_takes_plain_steps() -> None:
    """``GradScaler("cuda")`` without CUDA disables itself: scaled_step is then a plain step, never a skip."""
    from heteroflow.components.training.precision import scaled_step

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    if torch.cuda.is_available():
        scaler = torch.amp.GradScaler("cpu", enabled=False)
    else:
        with pytest.warns(UserWarning, match="Disabling"):
            scaler = torch.amp.GradScaler("cuda")
    assert not scaler.is_enabled()
    before = model.weight.detach().clone()
    skipped = scaled_step(scaler, model(torch.ones(1, 2)).sum(), opt)
    assert not bool(skipped) and torch.allclose(model.weight, before - 0.5)


def _marked_batches(n: int, batch_size: int, seed: int, epochs: int, marked: tuple[int, ...]) -> int:
    """Optimizer steps whose batch holds a marked sample: the steps the scaler must skip."""
    from heteroflow.components.training.batches import EpochBatches

    sampler = EpochBatches(n, batch_size, seed)
    count = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        count += sum(bool(set(marked) & {int(i) for i in batch}) for batch in sampler)
    return count


def test_an_fp16_run_counts_skipped_steps_across_a_resume_and_its_learning_rate_follows_the_taken_steps(
    user_modules: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import augdata_r29

    kwargs: dict[str, Any] = dict(device="cpu", epochs=3, batch_size=16, learning_rate=0.05, seed=2, precision="fp16",
                                  checkpoint_every_steps=3, loader_workers=0, dataset_factory="augdata_r29:make",
                                  model_factory="ampfn_r29:make", train_function="ampfn_r29:loop")
    whole = train(tmp_path, tmp_path / "whole", checkpoint_root=str(tmp_path / "ck-whole"), **kwargs)
    resumed = _interrupted_then_resumed(tmp_path, monkeypatch, "resumed", 9, **kwargs)

    skips = _marked_batches(96, 16, 2, 3, augdata_r29.MARKED)
    assert 0 < skips < 18
    assert whole.precision == resumed.precision == "float16" and resumed.resumed_from_step == 9
    assert whole.amp_skipped_steps == resumed.amp_skipped_steps == skips
    # the right value: the learning rate decayed once per taken step, never on a skipped one
    assert resumed.history[-1]["lr"] == pytest.approx(0.05 * 0.9 ** (18 - skips), rel=1e-9)
    assert [h["lr"] for h in resumed.history] == [h["lr"] for h in whole.history]
    assert [h["scale"] for h in resumed.history] == [h["scale"] for h in whole.history]
    assert all(math.isfinite(h["last_loss"]) for h in resumed.history)
    w, r = _weights(tmp_path / "whole"), _weights(tmp_path / "resumed")
    assert all(torch.equal(w[k], r[k]) for k in w)
    facts = _train_facts(resumed)
    assert facts["amp_skipped_steps"] == skips
    assert f"{skips} steps skipped by the GradScaler" in _train_summary(facts)[-1]  # the last line: the one of the steps (a factory line before it)
