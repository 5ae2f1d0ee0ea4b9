"""The training loop's speed structure (issue #32 items 2 and 3), asserted without a clock.

- the built-in loop waits for the device (``.item()``, ``bool``/``float``/``int`` of a tensor) a fixed number of
  times per epoch, never per step, with logging off and checkpoints off;
- the loader worker count chosen from measured load and compute times (:func:`choose_workers`, and the context's
  first timed batches under a fake clock);
- the same batches in the same order with 0 workers, 2 workers and the chosen count (a mid-epoch start included);
- accelerators: pinned host memory and non-blocking copies (a ``meta`` device stands in for one);
- ``compile_model``: ``nn.Module.compile`` in place (the state dict keeps its keys), or an eager run saying why.

Speed figures themselves come from ``benchmarks/training.py`` (ratios against a plain loop in the same run).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="training needs PyTorch")

from heteroflow.components.errors import InvalidParameter  # noqa: E402
from heteroflow.components.training import loop as loop_module  # noqa: E402
from heteroflow.components.training.batches import (  # noqa: E402
    NEGLIGIBLE_LOAD,
    PROBE_BATCHES,
    RECEIVE_SECONDS,
    SHARED_COLLATE_SECONDS_PER_BYTE,
    auto_workers,
    batch_bytes,
    batch_seconds,
    choose_workers,
    make_loader,
)
from heteroflow.components.training.checkpoint import Checkpoint  # noqa: E402
from heteroflow.components.training.factories import ModelSpec  # noqa: E402
from heteroflow.components.training.loop import TrainContext  # noqa: E402
from heteroflow.components.training.step import train  # noqa: E402

# --- device waits -------------------------------------------------------------------------------------------


_SYNCS = ("item", "__bool__", "__float__", "__int__", "tolist")


def _count_device_waits(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count heteroflow's own calls that wait for a tensor's value (torch's optimizers read their step counts
    with ``.item()``, as in any plain loop: not counted)."""
    counts = dict.fromkeys(_SYNCS, 0)
    for name in _SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self: Any, *a: Any, _name: str = name, _original: Any = original, **k: Any) -> Any:
            if sys._getframe(1).f_globals.get("__name__", "").startswith("heteroflow."):
                counts[_name] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


def test_the_loop_waits_for_the_device_per_epoch_never_per_step(digits_shards: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _count_device_waits(monkeypatch)
    waits, steps = [], []
    for batch_size in (64, 16):  # four times the steps, the same epochs
        for name in counts:
            counts[name] = 0
        result = train(digits_shards, tmp_path / f"m{batch_size}", epochs=2, batch_size=batch_size,
                       checkpoint_every_steps=10**9, checkpoint_root=str(tmp_path / "ck"))
        waits.append(dict(counts))
        steps.append(result.steps)
    assert steps[1] >= 3 * steps[0] > 0
    assert waits[0] == waits[1], f"device waits grew with the number of steps: {waits} for {steps} steps"
    assert sum(waits[1].values()) < steps[1] // 2


# --- the worker count ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("load", "compute", "cpus", "most", "expected"),
    [
        (0.004, 0.050, 8, 4, 0),            # loading under NEGLIGIBLE_LOAD of a step: not worth a process
        (4.1, 3.9, 2, 1, 1),                # the example: one worker on 2 cores
        (4.1, 3.9, 2, 2, 1),                # a second worker would gain 2.5% (the cores' bound): not worth it
        (8.0, 4.8, 2, 2, 2),                # loading costs more than computing: 2 workers share the cores, 6.4 per batch, not 8
        (8.0, 8.0, 2, 2, 1),                # equal: the cores are the bound, one worker is as fast as two
        (4.1, 3.9, 8, 4, 2),                # ceil(4.1 / 3.9) workers keep up
        (30.0, 10.0, 8, 4, 3),
        (100.0, 10.0, 8, 4, 4),             # at most `most`
        (100.0, 10.0, 3, 4, 3),             # the cores are the bound: (100 + 10) / 3 per batch
        (100.0, 10.0, 1, 4, 0),             # one core: nothing to overlap with
        (5.0, 0.0, 4, 4, 4),                # a step that costs nothing: as many as the cores
        (1.0, 1.0, 8, 0, 0),                # an explicit bound of none
    ],
)
def test_the_worker_count_follows_the_measured_times(load: float, compute: float, cpus: int, most: int,
                                                    expected: int) -> None:
    assert choose_workers(load, compute, cpus=cpus, most=most) == expected


@pytest.mark.parametrize(("cpus", "expected"), [(1, 0), (2, 2), (3, 3), (16, 4)])
def test_the_most_workers_is_one_per_core_up_to_4_and_none_on_one_core(monkeypatch: pytest.MonkeyPatch, cpus: int,
                                                                         expected: int) -> None:
    monkeypatch.setattr("heteroflow.components.data.preprocess.available_cpus", lambda: cpus)
    assert auto_workers(in_memory=False, requested=-1) == expected
    assert auto_workers(in_memory=True, requested=-1) == 0  # in-memory tensors: nothing to decode
    assert auto_workers(in_memory=False, requested=3) == 3  # asked for


def test_the_predicted_time_per_batch_is_the_largest_bound() -> None:
    r = RECEIVE_SECONDS  # what the training process pays per batch from a worker
    assert batch_seconds(8.0, 4.8, workers=0, cpus=2) == pytest.approx(12.8)  # one process does both in turn
    assert batch_seconds(8.0, 4.8, workers=1, cpus=2) == pytest.approx(8.0)   # the worker's loading
    assert batch_seconds(8.0, 4.8, workers=2, cpus=2) == pytest.approx((8.0 + 4.8 + r) / 2)  # the cores
    assert batch_seconds(8.0, 4.8, workers=4, cpus=16) == pytest.approx(4.8 + r)  # the training's step


def test_the_predicted_time_counts_passing_the_batches_between_processes() -> None:
    # the figures of #32's benchmark (quiet 2 cores): a batch of 32 float32 3x80x80 crops, 2.46 MB, loads in
    # 6.9 ms and its step computes in 4.3 ms; a worker pays 1.0 ms more to stack it and copy it into a slot of
    # shared memory, the training process 1.0 ms to receive it and copy it out
    nbytes = 32 * 3 * 80 * 80 * 4
    assert nbytes * SHARED_COLLATE_SECONDS_PER_BYTE == pytest.approx(1.0e-3)
    assert RECEIVE_SECONDS == pytest.approx(1.0e-3)
    assert batch_seconds(6.9e-3, 4.3e-3, workers=1, cpus=2, nbytes=nbytes) == pytest.approx(7.9e-3)  # 6.9 + 1.0
    assert batch_seconds(6.9e-3, 4.3e-3, workers=2, cpus=2, nbytes=nbytes) == pytest.approx(13.2e-3 / 2)  # the cores
    assert choose_workers(6.9e-3, 4.3e-3, cpus=2, most=2, nbytes=nbytes) == 2
    # loading that costs less than passing the batch over: the training process loads it itself
    assert choose_workers(1.2e-3, 4.3e-3, cpus=8, most=4, nbytes=nbytes) == 0
    assert choose_workers(1.2e-3, 4.3e-3, cpus=8, most=4) == 0  # the fixed cost alone
    # a 10 MiB batch costs its worker 4.3 ms more than loading it: one worker gains nothing over none, two keep up
    big = 10 * 2**20
    assert batch_seconds(3.0e-3, 4.3e-3, workers=1, cpus=8, nbytes=big) == pytest.approx(7.27e-3, rel=1e-3)
    assert batch_seconds(3.0e-3, 4.3e-3, workers=0, cpus=8) == pytest.approx(7.3e-3)
    assert choose_workers(3.0e-3, 4.3e-3, cpus=8, most=4, nbytes=big) == 2
    assert choose_workers(3.0e-3, 4.3e-3, cpus=8, most=4) == 1  # counting the fixed cost only, one would do
    # 20 MiB: one worker is slower than none (3.0 + 8.5 ms a batch), three keep the step the bound
    huge = 20 * 2**20
    assert batch_seconds(3.0e-3, 4.3e-3, workers=1, cpus=8, nbytes=huge) > batch_seconds(3.0e-3, 4.3e-3, workers=0, cpus=8)
    assert choose_workers(3.0e-3, 4.3e-3, cpus=8, most=4, nbytes=huge) == 3
    with pytest.raises(InvalidParameter, match=r"nbytes=-1 is out of range"):
        choose_workers(1.0, 1.0, cpus=2, most=1, nbytes=-1)


def test_a_batch_counts_the_bytes_of_its_tensors_and_arrays() -> None:
    assert batch_bytes((torch.zeros(32, 3, 80, 80), torch.zeros(32, dtype=torch.int64))) == 32 * 3 * 80 * 80 * 4 + 32 * 8
    assert batch_bytes({"x": torch.zeros(4, dtype=torch.uint8), "n": np.zeros(3), "name": ["a", "b"]}) == 4 + 24
    assert batch_bytes("text") == 0


def test_the_worker_count_refuses_negative_measurements() -> None:
    with pytest.raises(InvalidParameter, match=r"load_seconds=-1.0 is out of range"):
        choose_workers(-1.0, 1.0, cpus=2, most=1)
    with pytest.raises(InvalidParameter, match=r"cpus=-2 is out of range"):
        choose_workers(1.0, 1.0, cpus=-2, most=1)
    assert NEGLIGIBLE_LOAD == pytest.approx(0.1)


class _Clock:
    """A fake ``time`` module: the dataset and the 'step' move it on by the times under test."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _Timed(torch.utils.data.Dataset):  # type: ignore[type-arg]
    draws_random = False

    def __init__(self, n: int, clock: _Clock, per_sample: float) -> None:
        self.n, self.clock, self.per_sample = n, clock, per_sample

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.clock.now += self.per_sample
        return torch.full((3,), float(i)), i % 2


def _context(tmp_path: Path, dataset: Any, *, device: str = "cpu", workers: int = 0, batch_size: int = 4) -> TrainContext:
    dev = torch.device(device)
    loader = make_loader(dataset, batch_size=batch_size, seed=3, shuffle=True, num_workers=workers, device=dev)
    return TrainContext(
        device=dev, device_kind="cpu", autocast_dtype=None, scaler=None, train_loader=loader, val_loader=None,
        classes=("a", "b"), input_shape=(3,), epochs=2, batch_size=batch_size, learning_rate=1e-3, seed=3, params={},
        checkpoint=Checkpoint(tmp_path / "ck", every_steps=10**9, model={}, amp_dtype="float32", total_steps=100),
        model_spec=ModelSpec(ref="", args={}),
        loader_workers=workers,
    )


@pytest.mark.parametrize(("per_sample", "step", "cpus", "expected"), [
    (0.010, 0.020, 4, 2),   # a batch of 4 loads in 40 ms, a step takes 20 ms: two workers keep up
    (0.0001, 0.050, 4, 0),  # loading is negligible: none
    (0.010, 0.020, 2, 2),   # two cores: two workers share them with the training (30 ms a batch, not 40)
    (0.005, 0.020, 2, 1),   # loading costs what computing does: the loader started ahead (1 worker) is kept
])
def test_the_context_chooses_the_workers_from_its_first_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str], per_sample: float,
                                                               step: float, cpus: int, expected: int) -> None:
    clock = _Clock()
    monkeypatch.setattr(loop_module, "time", clock)
    monkeypatch.setattr("heteroflow.components.data.preprocess.available_cpus", lambda: cpus)
    data = _Timed(64, clock, per_sample)
    built: list[int] = []

    def loader_with(n: int) -> Any:
        built.append(n)
        return make_loader(data, batch_size=4, seed=3, shuffle=True, num_workers=n, device=torch.device("cpu"))

    ctx = _context(tmp_path, data, workers=1)  # the loader built before the choice (train builds it with `most`)
    ctx.measure_loading(loader_with, 3)
    seen = []
    for x, _ in ctx.batches(0):
        clock.now += step  # the training step on this batch
        seen.append(x[:, 0].long().tolist())
    assert ctx.loader_workers == expected
    assert ctx.train_loader.num_workers == expected
    assert built == [0] + ([expected] if expected > 1 else [])  # the loader in use kept when it has the count
    err = capsys.readouterr().err
    assert f"train: loader_workers={expected} (chosen: a batch loads in {per_sample * 4e3:.1f} ms" in err
    assert f"a step computes in {step * 1e3:.1f} ms; a batch of 0.00 MiB costs 1.0 ms to pass from a worker; {cpus} cores, at most 3" in err
    assert len(seen) == 16 and sorted(i for b in seen for i in b) == list(range(64))  # every sample, once
    assert sum(len(b) for b in seen[:PROBE_BATCHES]) == 4 * PROBE_BATCHES
    plain = make_loader(data, batch_size=4, seed=3, shuffle=True, num_workers=0, device=torch.device("cpu"))
    plain.batch_sampler.set_epoch(0)
    assert seen == [x[:, 0].long().tolist() for x, _ in plain]  # the batches of no workers, in their order


# --- the same batches with any worker count -----------------------------------------------------------------

_DATA = '''
import random
import numpy as np
import torch

class Noisy(torch.utils.data.Dataset):
    """Reads draw from torch, random and NumPy (augmentation), and sleep a little (decoding)."""
    classes = ["a", "b", "c"]

    def __len__(self):
        return 90

    def __getitem__(self, i):
        import time
        time.sleep(0.002)
        x = torch.full((4,), float(i)) + torch.rand(4) + random.random() + float(np.random.rand())
        return x, i % 3

def make(split):
    return Noisy() if split == "train" else None

SEEN = {}

def record(ctx):
    """A training function that records the batches it sees: epoch 0 from its fourth batch (a resume: the probe
    and the loader started ahead begin mid-epoch), epoch 1 from its third, epoch 2 whole."""
    model = ctx.build_model()
    out = []
    for epoch, step in ((0, 3), (1, ctx.steps_per_epoch + 2), (2, 2 * ctx.steps_per_epoch)):
        for x, y in ctx.batches(epoch, step):
            out.append((x.clone(), y.clone()))
    SEEN["batches"] = out
    SEEN["workers"] = ctx.loader_workers
    return model
'''


def test_the_batches_and_their_order_do_not_depend_on_the_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "speeddata32.py").write_text(textwrap.dedent(_DATA))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("heteroflow.components.data.preprocess.available_cpus", lambda: 3)  # room for 3 workers
    import speeddata32  # type: ignore[import-not-found]

    runs = {}
    for workers in (0, 2, -1):
        result = train(tmp_path, tmp_path / f"m{workers}", epochs=3, batch_size=8, loader_workers=workers,
                       dataset_factory="speeddata32:make", train_function="speeddata32:record",
                       checkpoint_every_steps=10**9, checkpoint_root=str(tmp_path / f"ck{workers}"))
        runs[workers] = (speeddata32.SEEN["batches"], speeddata32.SEEN["workers"], result.num_workers)
    chosen = runs[-1][1]
    assert 1 <= chosen <= 3 and runs[-1][2] == chosen  # loading dominates these steps: workers were chosen
    assert f"train: loader_workers={chosen} (chosen:" in capsys.readouterr().err
    assert (runs[0][2], runs[2][2]) == (0, 2)
    base = runs[0][0]
    assert len(base) == 9 + 10 + 12  # 90 samples in batches of 8, 12 an epoch: 9 from the fourth, 10 from the third, 12
    for workers in (2, -1):
        other = runs[workers][0]
        assert len(other) == len(base)
        for (x0, y0), (x1, y1) in zip(base, other, strict=True):
            assert torch.equal(y0, y1)
            assert torch.equal(x0, x1)  # the same samples and the same random draws


# --- in-memory tensors: a chunk of batches gathered at once ----------------------------------------------------


@pytest.mark.parametrize("gather_bytes", [1, 200, 10**9])  # a batch per chunk, chunks of a few batches, one chunk
@pytest.mark.parametrize("shuffle", [True, False])
def test_in_memory_batches_are_the_dataloaders_gathered_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   gather_bytes: int, shuffle: bool) -> None:
    from heteroflow.components.data.readers import TensorData
    from heteroflow.components.training import batches as batches_module

    monkeypatch.setattr(batches_module, "GATHER_BYTES", gather_bytes)
    x = torch.arange(103 * 3, dtype=torch.float32).reshape(103, 3)
    data = TensorData(x, torch.arange(103) % 5)
    kept = x.clone()
    reference = make_loader(data, batch_size=8, seed=7, shuffle=shuffle, num_workers=0, device=torch.device("cpu"))
    ctx = _context(tmp_path, data, batch_size=8)
    ctx.train_loader = make_loader(data, batch_size=8, seed=7, shuffle=shuffle, num_workers=0, device=torch.device("cpu"))
    gathered: list[int] = []
    original = batches_module.tensor_batches

    def spy(*a: Any) -> Any:
        gathered.append(1)
        return original(*a)

    monkeypatch.setattr(loop_module, "tensor_batches", spy)
    for epoch, step in ((0, 0), (1, 13 + 3), (2, 2 * 13 + 12), (3, 4 * 13)):  # whole, from the 4th, the last, none
        reference.batch_sampler.set_epoch(epoch, max(0, step - epoch * 13))
        expected = list(reference)
        got = list(ctx.batches(epoch, step))
        assert len(got) == len(expected) == max(0, 13 - max(0, step - epoch * 13))
        for (x0, y0), (x1, y1) in zip(expected, got, strict=True):
            assert torch.equal(x0, x1) and torch.equal(y0, y1)
        for x1, _ in got:
            x1.mul_(0)  # a model that writes into its input
    assert len(gathered) == 4  # the context went through the chunked gather
    assert torch.equal(x, kept)  # the batches were copies: the data set is unchanged


def test_the_chunked_gather_refuses_a_sampler_split_over_ranks() -> None:
    from heteroflow.components.training.batches import EpochBatches, tensor_batches

    with pytest.raises(InvalidParameter, match=r"world_size=2 is out of range for tensor_batches; valid: 1"):
        list(tensor_batches(torch.zeros(8, 2), torch.zeros(8), EpochBatches(8, 4, 0, rank=0, world_size=2)))


def test_the_next_checkpoint_step_is_the_first_step_due(tmp_path: Path) -> None:
    for every, total, enabled in ((5, 23, True), (1, 4, True), (50, 40, True), (5, 23, False), (7, 21, True)):
        ck = Checkpoint(tmp_path, every_steps=every, model={}, amp_dtype="float32", total_steps=total, enabled=enabled)
        for step in range(total + 2):
            later = [s for s in range(step + 1, total + every + 2) if ck.due(s)]
            assert ck.next_due(step) == (later[0] if later else -1), (every, total, enabled, step)


def test_validation_runs_in_inference_mode_in_few_batches(tmp_path: Path) -> None:
    from heteroflow.components.data.readers import TensorData
    from heteroflow.components.training.batches import eval_batch_size

    assert eval_batch_size(64, (64,)) == 4096  # digits' rows: their validation split in one batch
    assert eval_batch_size(64, (3, 224, 224)) == 256  # large images: batches of 256, as before
    assert eval_batch_size(512, (3, 224, 224)) == 512  # never below the training batch
    assert eval_batch_size(8, (2000,)) == 524  # about 4 MiB of float32 samples

    class Recording(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 2)
            self.calls: list[tuple[int, bool, bool]] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.append((len(x), torch.is_inference_mode_enabled(), self.training))
            return self.linear(x)

    val = TensorData(torch.randn(300, 3), torch.arange(300) % 2)
    ctx = _context(tmp_path, val)
    ctx.val_loader = make_loader(val, batch_size=eval_batch_size(4, (3,)), seed=3, shuffle=False, num_workers=0,
                                 device=torch.device("cpu"))
    model = Recording()
    accuracy = ctx.evaluate_accuracy(model)
    with torch.inference_mode():
        expected = (model.linear(val.x).argmax(dim=1) == val.y).float().mean().item()
    assert accuracy == pytest.approx(expected)
    assert model.calls == [(300, True, False)]  # one batch, no autograd, eval mode
    assert model.training  # put back


# --- accelerators: pinned memory, non-blocking copies ---------------------------------------------------------


def test_an_accelerator_gets_pinned_batches_copied_without_blocking(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from heteroflow.components.data.readers import TensorData

    data = TensorData(torch.arange(40, dtype=torch.float32).reshape(20, 2), torch.arange(20) % 2)
    assert make_loader(data, batch_size=4, seed=0, shuffle=False, num_workers=0, device=torch.device("cuda")).pin_memory
    assert not make_loader(data, batch_size=4, seed=0, shuffle=False, num_workers=0, device=torch.device("cpu")).pin_memory
    copies: list[tuple[str, bool]] = []
    original = torch.Tensor.to

    def to(self: Any, *a: Any, **k: Any) -> Any:
        copies.append((str(a[0]) if a else str(k.get("device")), bool(k.get("non_blocking"))))
        return original(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "to", to)
    ctx = _context(tmp_path, data, device="meta")  # a device that is not the host (no accelerator needed)
    with pytest.warns(UserWarning, match="pin"):  # no accelerator here: the DataLoader says it cannot pin
        got = list(ctx.batches(0))
    assert len(got) == 5 and all(x.device.type == "meta" and y.device.type == "meta" for x, y in got)
    assert copies == [("meta", True)] * 10
    copies.clear()
    on_cpu = _context(tmp_path, data, device="cpu")
    xs = [x for x, _ in on_cpu.batches(0)]
    assert len(xs) == 5 and sorted(torch.cat(xs)[:, 0].long().tolist()) == list(range(0, 40, 2))
    assert copies == []  # on the CPU nothing is copied


# --- compile_model --------------------------------------------------------------------------------------------


def test_compile_model_compiles_in_place_and_keeps_the_state_dict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from heteroflow.components.data.readers import TensorData
    from heteroflow.components.training.factories import BUILTIN_MODEL

    data = TensorData(torch.zeros(8, 5), torch.zeros(8, dtype=torch.long))
    ctx = _context(tmp_path, data)
    ctx.model_spec = ModelSpec(ref=BUILTIN_MODEL, args={"in_features": 5, "num_classes": 2, "hidden_units": 4})
    plain_keys = list(ctx.build_model().state_dict())
    ctx.compile_model = True
    monkeypatch.setattr(loop_module, "compile_available", lambda device: "")
    model = ctx.build_model()
    assert model._compiled_call_impl is not None  # nn.Module.compile: compiled at the first call
    assert list(model.state_dict()) == plain_keys  # no _orig_mod. prefix: checkpoints and model.pt unchanged
    monkeypatch.setattr(loop_module, "compile_available", lambda device: "no C++ compiler here")
    eager = ctx.build_model()
    assert eager._compiled_call_impl is None
    assert "train: compile_model=True, but no C++ compiler here: training without torch.compile" in capsys.readouterr().err


def test_compile_availability_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_module.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    why = loop_module.compile_available(torch.device("cpu"))
    import torch._dynamo as dynamo

    if dynamo.is_dynamo_supported():
        assert why == "no C++ compiler for torch.compile's CPU kernels (set CXX or install g++)"
    else:
        assert why == "torch.compile does not support this Python or platform"


class _Strategy(torch.utils.data.Dataset):  # type: ignore[type-arg]
    draws_random = False

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        import torch.multiprocessing

        return torch.full((3,), float(i)), torch.multiprocessing.get_sharing_strategy()


def test_workers_hand_batches_over_by_file_name_and_leave_the_training_process_setting() -> None:
    import torch.multiprocessing

    before = torch.multiprocessing.get_sharing_strategy()
    loader = make_loader(_Strategy(), batch_size=4, seed=1, shuffle=True, num_workers=2, device=torch.device("cpu"))
    loader.batch_sampler.set_epoch(0)
    got = list(loader)
    assert {s for _, strategies in got for s in strategies} == {"file_system"}  # set in each worker
    assert torch.multiprocessing.get_sharing_strategy() == before  # not in this process
    plain = make_loader(_Strategy(), batch_size=4, seed=1, shuffle=True, num_workers=0, device=torch.device("cpu"))
    plain.batch_sampler.set_epoch(0)
    assert [x.tolist() for x, _ in got] == [x.tolist() for x, _ in plain]  # the same batches, in the same order
