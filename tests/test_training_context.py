"""Issue 14: the training context, model factories, training functions, precision, checkpoints and bad input.

The examples' module (``examples/digits_models.py``: the digits MLP, a small CNN, a training function) is a
module outside the package, imported from ``examples/`` on ``sys.path`` as a user's own module would be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from heteroflow.components.errors import CheckpointError, DeviceUnavailable, InvalidParameter
from heteroflow.components.training.step import MODEL_WEIGHTS, check_train_params, checkpoint_folder, train

torch = pytest.importorskip("torch", reason="train needs PyTorch (the 'torch' extra)")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture()
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``examples/`` and a folder of test-only user modules on sys.path (and PYTHONPATH, for child processes)."""
    mods = tmp_path / "usermods"
    mods.mkdir()
    (mods / "badfactories.py").write_text(
        "def not_a_module(num_classes):\n    return 'a string'\n\n"
        "def needs_other(num_classes, depth):\n    import torch\n    return torch.nn.Linear(64, num_classes)\n\n"
        "NOT_CALLABLE = 3\n"
    )
    for p in (str(EXAMPLES), str(mods)):
        monkeypatch.syspath_prepend(p)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLES), str(mods), os.environ.get("PYTHONPATH", "")]))
    return mods


def _weights(model_dir: Path) -> dict[str, Any]:
    return torch.load(model_dir / MODEL_WEIGHTS, map_location="cpu", weights_only=True)


def test_a_user_model_factory_trains_and_the_model_json_records_the_factory_and_its_arguments(
    digits_shards: Path, tmp_path: Path, user_modules: Path
) -> None:
    result = train(digits_shards, tmp_path / "m", epochs=4, model_factory="digits_models:mlp",
                   model_args='{"hidden_units": 32}', checkpoint_root=str(tmp_path / "ck"))
    config = json.loads((tmp_path / "m" / "model.json").read_text())
    assert config["model"] == {"factory": "digits_models:mlp", "args": {"in_features": 64, "num_classes": 10, "hidden_units": 32}}
    assert result.model == config["model"]
    assert [h["epoch"] for h in result.history] == [1, 2, 3, 4]
    assert result.history[-1]["loss"] == result.final_loss < result.history[0]["loss"]
    assert result.validation_accuracy is not None and result.validation_accuracy > 0.8
    from heteroflow.components.training.step import load_model

    model, _ = load_model(tmp_path / "m")
    assert model[1].out_features == 32  # the factory rebuilt it with its recorded arguments


def test_a_training_function_gets_the_context_and_its_reports_become_the_history(
    digits_shards: Path, tmp_path: Path, user_modules: Path
) -> None:
    seen: dict[str, Any] = {}
    (user_modules / "loops.py").write_text(
        "import torch\n"
        "SEEN = {}\n"
        "def loop(ctx):\n"
        "    SEEN.update(device=str(ctx.device), kind=ctx.device_kind, dtype=ctx.autocast_dtype, rank=ctx.rank,\n"
        "                world=ctx.world_size, classes=ctx.classes, shape=ctx.input_shape, scaler=ctx.scaler)\n"
        "    model = ctx.build_model()\n"
        "    opt = ctx.build_optimizer(model)\n"
        "    step = 0\n"
        "    for epoch in range(ctx.epochs):\n"
        "        for x, y in ctx.batches(epoch):\n"
        "            loss = ctx.loss_fn(model(x), y)\n"
        "            opt.zero_grad(); loss.backward(); opt.step(); step += 1\n"
        "            ctx.step_done(step, model=model, optimizer=opt)\n"
        "        ctx.report(epoch=epoch + 1, step=step, loss=loss.item(), custom=epoch * 10)\n"
        "    return model\n"
    )
    import loops  # type: ignore[import-not-found]

    result = train(digits_shards, tmp_path / "m", epochs=2, train_function="loops:loop", checkpoint_root=str(tmp_path / "ck"))
    seen = loops.SEEN
    assert seen["device"] == "cpu" and seen["kind"] == "cpu" and seen["dtype"] is None and seen["scaler"] is None
    assert (seen["rank"], seen["world"]) == (0, 1)
    assert seen["classes"] == tuple(str(i) for i in range(10)) and seen["shape"] == (64,)
    assert [h["custom"] for h in result.history] == [0, 10]
    assert result.steps == result.history[-1]["step"] > 0
    assert (tmp_path / "m" / MODEL_WEIGHTS).is_file()


_CHILD = """
import json, sys
from heteroflow.components.training.step import train
train(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))
"""


@pytest.mark.slow
def test_a_training_function_resumes_after_sigkill_and_ends_with_the_uninterrupted_weights(
    digits_shards: Path, tmp_path: Path, user_modules: Path
) -> None:
    kwargs = dict(epochs=12, batch_size=32, seed=1, checkpoint_every_steps=20, train_function="digits_models:train_loop",
                  checkpoint_root=str(tmp_path / "ck"))
    folder = checkpoint_folder(digits_shards, **kwargs)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(digits_shards), str(tmp_path / "resumed"), json.dumps(kwargs)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while not (folder / "checkpoint.json").is_file():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        assert time.monotonic() < deadline, "no checkpoint within 180 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and not (tmp_path / "resumed").exists()
    resumed = train(digits_shards, tmp_path / "resumed", **kwargs)
    assert resumed.resumed_from_step >= 20
    reference = train(digits_shards, tmp_path / "reference", **{**kwargs, "checkpoint_root": str(tmp_path / "ck-ref")})
    assert reference.resumed_from_step == 0 and resumed.steps == reference.steps
    a, b = _weights(tmp_path / "resumed"), _weights(tmp_path / "reference")
    assert [k for k in b if not torch.equal(a[k], b[k])] == []
    # the epochs before the kill and the partial epoch's losses come back from the checkpoint: the same history
    assert [h["epoch"] for h in resumed.history] == list(range(1, 13))
    assert resumed.history == reference.history and resumed.final_loss == reference.final_loss


@pytest.mark.slow  # trains a model: seconds (#32: the quick suite stays quick)
def test_bf16_autocast_on_the_cpu_when_asked(digits_shards: Path, tmp_path: Path) -> None:
    result = train(digits_shards, tmp_path / "m", epochs=3, precision="bf16", checkpoint_root=str(tmp_path / "ck"))
    assert result.precision == "bfloat16"
    assert result.validation_accuracy is not None and result.validation_accuracy > 0.8
    assert all(t.dtype == torch.float32 for t in _weights(tmp_path / "m").values())  # weights stay fp32


@pytest.mark.parametrize(
    ("precision", "device", "bf16", "expected"),
    [
        ("auto", "cpu", None, None),
        ("fp32", "cuda", True, None),
        ("auto", "cuda", True, "bfloat16"),
        ("auto", "cuda", False, "float16"),  # e.g. a T4 or V100 (registry: bf16=False)
        ("auto", "xpu", False, "float16"),  # any accelerator the registry marks bf16=False (Ascend 910A, 310P)
        ("bf16", "cpu", None, "bfloat16"),
        ("fp16", "cuda", True, "float16"),
    ],
)
def test_precision_follows_the_registry(precision: str, device: str, bf16: bool | None, expected: str | None) -> None:
    from heteroflow.components.training.loop import make_scaler, resolve_precision

    dtype = resolve_precision(precision, torch.device(device), bf16=bf16)
    assert (None if dtype is None else str(dtype).replace("torch.", "")) == expected
    scaler = make_scaler(dtype, torch.device(device))
    assert (scaler is not None) == (expected == "float16")  # a GradScaler exactly for fp16


def test_the_registry_says_which_chips_compute_in_bf16() -> None:
    from heteroflow.components.devices.accelerators import find_accelerator
    from heteroflow.components.training.loop import resolve_precision

    gpu = torch.device("cuda")
    assert resolve_precision("auto", gpu, bf16=find_accelerator("nvidia-t4").bf16) == torch.float16
    assert resolve_precision("auto", gpu, bf16=find_accelerator("nvidia-h100").bf16) == torch.bfloat16


def _checkpoint(folder: Path, model_spec: dict[str, Any], amp: str = "float32") -> Any:
    from heteroflow.components.training.loop import Checkpoint

    return Checkpoint(folder, every_steps=10, model=model_spec, amp_dtype=amp, total_steps=100)


def test_a_checkpoint_of_another_model_is_a_clear_error(tmp_path: Path) -> None:
    small = torch.nn.Linear(4, 2)
    _checkpoint(tmp_path, {"factory": "a:small"}).save(10, model=small)
    with pytest.raises(CheckpointError, match=r"holds another model .*a:small.* delete that folder"):
        _checkpoint(tmp_path, {"factory": "b:big"}).load(model=torch.nn.Linear(8, 2))
    # same factory name, changed code (other shapes): also named, not a raw size-mismatch traceback
    with pytest.raises(CheckpointError, match=r"holds weights of another model .*code changed.* delete that folder"):
        _checkpoint(tmp_path, {"factory": "a:small"}).load(model=torch.nn.Linear(8, 2))


def test_an_fp16_checkpoint_without_scaler_state_is_a_clear_error(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    _checkpoint(tmp_path, {"factory": "a:m"}, amp="float16").save(10, model=model)  # saved without scaler=
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(CheckpointError, match=r"fp16 run but holds no GradScaler state"):
        _checkpoint(tmp_path, {"factory": "a:m"}, amp="float16").load(model=model, scaler=scaler)
    # a bf16 run's checkpoint resumed in fp16 (an NPU's bf16 checkpoint on a T4): a fresh scaler, no error
    _checkpoint(tmp_path / "b", {"factory": "a:m"}, amp="bfloat16").save(10, model=model)
    state = _checkpoint(tmp_path / "b", {"factory": "a:m"}, amp="float16").load(model=model, scaler=scaler)
    assert state is not None and state["step"] == 10


def test_the_scaler_state_travels_in_the_checkpoint(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    _checkpoint(tmp_path, {"factory": "a:m"}, amp="float16").save(10, model=model, scaler=scaler)
    fresh = torch.amp.GradScaler("cpu", init_scale=2.0)
    _checkpoint(tmp_path, {"factory": "a:m"}, amp="float16").load(model=model, scaler=fresh)
    assert fresh.state_dict()["scale"] == 1024.0


def test_checkpoints_are_device_portable_cpu_tensors(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    _checkpoint(tmp_path, {"factory": "a:m"}).save(10, model=model, optimizer=opt)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    tensors = [t for t in state["model"].values()] + [v for s in state["optimizer"]["state"].values() for v in s.values()
                                                        if isinstance(v, torch.Tensor)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert {"torch", "numpy", "python"} <= set(state["rng"])


def test_the_checkpoint_folder_is_keyed_by_data_params_and_model_not_device(digits_shards: Path, tmp_path: Path, user_modules: Path) -> None:
    base = dict(epochs=2, checkpoint_root=str(tmp_path))
    a = checkpoint_folder(digits_shards, **base)
    assert checkpoint_folder(digits_shards, **base, device="cuda") == a  # device is not in the key
    assert checkpoint_folder(digits_shards, **base, loader_workers=2) == a  # nor how data is loaded
    assert checkpoint_folder(digits_shards, **{**base, "epochs": 3}) != a
    assert checkpoint_folder(digits_shards, **base, model_factory="digits_models:mlp") != a
    assert checkpoint_folder(digits_shards, **base, model_factory="digits_models:mlp", model_args='{"hidden_units": 8}') != \
        checkpoint_folder(digits_shards, **base, model_factory="digits_models:mlp")


def test_changed_data_in_a_plain_folder_or_a_factory_gets_its_own_checkpoint_folder(tmp_path: Path, user_modules: Path) -> None:
    """A review's input: a plain CSV folder preprocessed in Python has no prewarm checksum, and meta.json holds
    nothing of the cells, so new labels on the same rows kept the checkpoint folder and training resumed the old
    data's checkpoint ("resuming from step 4 of 27"). Sibling: a dataset factory was keyed by its name and train
    length only; its code is in the key now (its items are not read: a factory that augments at random would
    never find its checkpoint again)."""
    import numpy as np

    from heteroflow.components.data.preprocess import preprocess

    src, out = tmp_path / "csv", tmp_path / "shards"
    src.mkdir()

    def folder_of(shift: float) -> Path:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(200, 4))
        rows = "".join(",".join(f"{v:.4f}" for v in r) + f",{int(r[0] > shift)}\n" for r in x)
        (src / "d.csv").write_text("a,b,c,d,label\n" + rows)
        preprocess(src, out, num_workers=1)
        return checkpoint_folder(out, epochs=2, checkpoint_root=str(tmp_path / "ck"))

    first = folder_of(0.0)
    assert folder_of(0.0) == first  # the same data again: the same folder (a rerun resumes)
    assert folder_of(0.5) != first  # other labels on the same rows

    module = user_modules / "mydata.py"
    factory = ("import torch\nfrom torch.utils.data import TensorDataset\n"
               "def data(split):\n"
               "    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(SEED))\n"
               "    return TensorDataset(x, (x[:, 0] > 0).long())\n")
    module.write_text("SEED = 0\n" + factory)
    base = dict(epochs=2, checkpoint_root=str(tmp_path / "ck"), dataset_factory="mydata:data")
    a = checkpoint_folder(tmp_path, **base)
    assert checkpoint_folder(tmp_path, **base) == a
    module.write_text("SEED = 1\n" + factory)  # the factory edited: other samples, the same length
    import importlib

    import mydata

    importlib.reload(mydata)
    assert checkpoint_folder(tmp_path, **base) != a


def test_a_factory_class_only_validation_or_test_holds_is_one_of_the_models_classes(tmp_path: Path, user_modules: Path) -> None:
    """A review's input: labels {0, 1} in train and 2 in validation and test built a 2-class model, and evaluate
    failed after training with a bare ``IndexError: index 2 is out of bounds``. The classes come from every split;
    a label a model still lacks (a ``classes`` attribute that leaves it out) is a DatasetError naming it."""
    import numpy as np

    from heteroflow.cache.errors import DatasetError
    from heteroflow.components.data.readers import open_splits
    from heteroflow.components.models.evaluate import classification_report

    (user_modules / "threeclass.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "def data(split):\n"
        "    y = torch.tensor([0, 1] * 10) if split == 'train' else torch.tensor([0, 1, 2, 2, 2])\n"
        "    return TensorDataset(torch.randn(len(y), 3), y)\n")
    assert open_splits(tmp_path, dataset_factory="threeclass:data").classes == ("0", "1", "2")
    with pytest.raises(DatasetError, match=r"label 2 is outside the model's 2 classes \(0..1\) in 3 sample\(s\)"):
        classification_report(np.array([0, 1, 2, 2, 2]), np.array([0, 1, 1, 1, 1]), 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model_factory": "no_such_module_xyz:make"}, r"model_factory 'no_such_module_xyz:make': cannot import"),
        ({"model_factory": "badfactories:missing"}, r"has no attribute 'missing'"),
        ({"model_factory": "badfactories:NOT_CALLABLE"}, r"model_factory='badfactories:NOT_CALLABLE' is an integer, not a function"),
        ({"model_factory": "nocolon"}, r"is not 'module:attribute' \(e.g. mypkg.models:make_model\)"),
        ({"optimizer": "sdg"}, r"optimizer='sdg' \(did you mean 'sgd'\?\) is neither a built-in optimizer \(adam, adamw, sgd\) nor a "
                               r"factory 'module:function' \(e.g. mypkg.optim:sgd, a function\(params, lr\)"),
        ({"optimizer": "lbfgs"}, r"optimizer='lbfgs' is neither a built-in optimizer \(adam, adamw, sgd\)"),
        ({"optimizer": "no_such_module_xyz:sgd"}, r"optimizer 'no_such_module_xyz:sgd': cannot import"),
        ({"loss": "mse"}, r"loss 'mse' is not 'module:attribute' \(e.g. torch.nn:CrossEntropyLoss"),
        ({"train_function": "no_such_module_xyz:loop"}, r"train_function 'no_such_module_xyz:loop': cannot import"),
        ({"batch_size": 0}, r"batch_size=0 is out of range; valid: an integer >= 1"),
        ({"batch_size": -3}, r"batch_size=-3 is out of range"),
        ({"precision": "fp8"}, r"precision='fp8' is unknown; valid: auto, fp32, bf16, fp16"),
        ({"model_args": "[1]"}, r"model_args='\[1\]' is not a JSON object"),
        ({"loader_workers": -2}, r"loader_workers=-2 is out of range"),
        # a review: no upper bound forked a million workers until the host ran out of memory; a learning rate past
        # float32's largest failed inside Adam's step; model_args bypassed hidden_units' range (0: a zero-width MLP)
        ({"loader_workers": 10**6}, r"loader_workers=1000000 is out of range; valid: -1 \(auto\), 0 .* or up to 256 worker processes"),
        ({"learning_rate": 1e39}, r"learning_rate=1e\+39 is out of range; valid: a number > 0 and <= 3.402823e\+38 \(float32's largest\)"),
        ({"model_args": '{"hidden_units": 0}'}, r"model_args hidden_units=0 is out of range; valid: an integer >= 1"),
        ({"model_args": '{"hidden_units": -5}'}, r"model_args hidden_units=-5 is out of range"),
        # a fresh-user trial: hidden_units set twice was caught only inside train; now before the run
        ({"model_args": '{"hidden_units": 64}', "hidden_units": 256}, r"model_args: hidden_units=64 disagrees with train's hidden_units=256"),
    ],
)
def test_bad_training_input_is_one_clear_line_before_a_run(kwargs: dict[str, Any], match: str, user_modules: Path) -> None:
    with pytest.raises(InvalidParameter, match=match):
        check_train_params(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model_factory": "badfactories:not_a_module"}, r"returned a str, not a torch.nn.Module"),
        ({"model_factory": "badfactories:needs_other"}, r"cannot be called with"),
        ({"model_factory": "digits_models:mlp", "model_args": '{"depth": 3}'}, r"takes no argument 'depth'"),
        # a fresh-user trial: hidden_units in both places, 64 won silently
        ({"model_factory": "digits_models:mlp", "model_args": '{"hidden_units": 64}', "hidden_units": 256},
         r"model_args: hidden_units=64 disagrees with train's hidden_units=256; set it in one place"),
        # sibling: a data-derived argument replaced in model_args built a model the data cannot feed
        ({"model_factory": "digits_models:mlp", "model_args": '{"in_features": 10}'},
         r"model_args: in_features=10 disagrees with the data \(in_features=64\); leave in_features out"),
    ],
)
def test_a_factory_that_builds_no_module_fails_before_the_device_is_touched(
    digits_shards: Path, tmp_path: Path, user_modules: Path, kwargs: dict[str, Any], match: str
) -> None:
    # device="cuda" is absent here: a DeviceUnavailable would mean the device was reached first
    with pytest.raises(InvalidParameter, match=match):
        train(digits_shards, tmp_path / "m", device="cuda", checkpoint_root=str(tmp_path / "ck"), **kwargs)
    with pytest.raises(DeviceUnavailable):  # and the same call with a good factory does reach it
        train(digits_shards, tmp_path / "m", device="cuda", checkpoint_root=str(tmp_path / "ck"))


def test_the_after_steps_fault_parses_and_fires_only_after_n_steps() -> None:
    from heteroflow.components.core.failures import FAULT_ENV, fault_after_steps, injected_fault, parse_faults

    (spec,) = parse_faults("train@npu=device:after_steps=40")
    assert spec.after_steps == 40 and str(spec) == "train@npu=device:after_steps=40"
    env = {FAULT_ENV: "train@npu=device:after_steps=40"}
    assert injected_fault("train", "npu", state_dir=None, environ=env) is None  # not before the step starts
    assert fault_after_steps("train", "npu", 39, environ=env) is None
    assert fault_after_steps("train", "gpu", 40, environ=env) is None  # another kind
    fault = fault_after_steps("train", "npu", 40, environ=env)
    assert isinstance(fault, DeviceUnavailable) and "after 40 steps" in str(fault)
    with pytest.raises(InvalidParameter, match=r"after_steps=N"):
        parse_faults("train@npu=device:after=40")


def test_heteroflow_run_refuses_a_factory_it_cannot_import_before_anything_runs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from heteroflow.pipelines.cli.main import app

    result = CliRunner().invoke(app, ["run", "--param", "model=no_such_module_xyz:cnn", "--output", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "model_factory 'no_such_module_xyz:cnn': cannot import" in " ".join(result.output.split())
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_restores_every_rng_state(tmp_path: Path) -> None:
    import random

    import numpy as np

    model = torch.nn.Linear(2, 2)
    random.gauss(0, 1)  # leaves a cached gauss value in Python's RNG state
    _checkpoint(tmp_path, {"factory": "a:m"}).save(1, model=model)
    after_save = (random.gauss(0, 1), float(np.random.rand()), float(torch.rand(1)))
    _checkpoint(tmp_path, {"factory": "a:m"}).load(model=model)
    assert (random.gauss(0, 1), float(np.random.rand()), float(torch.rand(1))) == after_save


def test_the_training_leaves_a_core_to_each_loader_worker(digits_shards: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's OpenMP threads spin between operations and took the cores DataLoader workers decode on (2 workers on
    2 cores: 0.67x of no workers, benchmarks/training.py): train uses the cores it may use less one per worker,
    and no more than OMP_NUM_THREADS when it is set (the standard knob on a shared host)."""
    monkeypatch.setattr("heteroflow.components.data.preprocess.available_cpus", lambda: 3)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        result = train(digits_shards, tmp_path / "m", epochs=1, loader_workers=1, checkpoint_root=str(tmp_path / "ck"))
        assert result.num_workers == 1
        assert torch.get_num_threads() == 2
        train(digits_shards, tmp_path / "n", epochs=1, loader_workers=0, checkpoint_root=str(tmp_path / "ck"))
        assert torch.get_num_threads() == 3
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        train(digits_shards, tmp_path / "o", epochs=1, loader_workers=0, checkpoint_root=str(tmp_path / "ck"))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_loss_and_optimizer_factories_are_the_ones_used(digits_shards: Path, tmp_path: Path, user_modules: Path) -> None:
    """loss=package.module:function() and optimizer=package.module:function(params, lr) replace cross-entropy and
    Adam: the factories are called (counted), their loss is what is reported, and a factory that returns no
    optimizer is a clear error."""
    (user_modules / "myopt.py").write_text(
        "import torch\n"
        "CALLS = {'loss': 0, 'optimizer': 0}\n"
        "def half_ce():\n"
        "    CALLS['loss'] += 1\n"
        "    return lambda output, target: 0.5 * torch.nn.functional.cross_entropy(output, target)\n"
        "def sgd(params, lr):\n"
        "    CALLS['optimizer'] += 1\n"
        "    return torch.optim.SGD(params, lr=lr, momentum=0.9)\n"
        "def not_an_optimizer(params, lr):\n"
        "    return [p for p in params]\n"
        "def noargs():\n"
        "    return None\n"
    )
    import myopt  # type: ignore[import-not-found]

    kwargs = dict(epochs=2, learning_rate=0.05, checkpoint_root=str(tmp_path / "ck"))
    half = train(digits_shards, tmp_path / "a", loss="myopt:half_ce", optimizer="myopt:sgd", **kwargs)
    assert myopt.CALLS == {"loss": 1, "optimizer": 1}
    full = train(digits_shards, tmp_path / "b", optimizer="myopt:sgd", **kwargs)
    # the same SGD trajectory scaled: half the loss gives half the gradient, so a slower descent; the reported loss
    # is the factory's (half of a cross-entropy), not the default's
    assert half.history[0]["loss"] < full.history[0]["loss"]
    assert half.model["factory"] == full.model["factory"]
    # the built-in name builds the same optimizer as this factory (SGD, momentum 0.9): the same trajectory
    builtin = train(digits_shards, tmp_path / "d", optimizer="SGD", **kwargs)
    assert [h["loss"] for h in builtin.history] == [h["loss"] for h in full.history]
    adam = train(digits_shards, tmp_path / "e", optimizer="adam", **kwargs)
    assert [h["loss"] for h in adam.history] == [h["loss"] for h in train(digits_shards, tmp_path / "f", **kwargs).history]
    assert adam.history[-1]["loss"] != full.history[-1]["loss"]
    with pytest.raises(InvalidParameter, match=r"optimizer='myopt:not_an_optimizer' returned a list, not a torch.optim.Optimizer"):
        train(digits_shards, tmp_path / "c", optimizer="myopt:not_an_optimizer", **kwargs)
    # a factory that cannot take (params, lr): said before any training, with the form it must have
    with pytest.raises(InvalidParameter, match=r"optimizer='myopt:noargs' cannot be called as myopt:noargs\(params, lr=...\): "
                                               r"too many positional arguments; valid: mypkg.optim:sgd, a function\(params, lr\)"):
        check_train_params(optimizer="myopt:noargs")


_PLAIN_LOOP = (
    "import torch\n"
    "def loop(ctx):\n"  # the loop of TrainContext's docstring: it keeps no history of its own in the checkpoint
    "    model = ctx.build_model()\n"
    "    opt = ctx.build_optimizer(model)\n"
    "    state = ctx.checkpoint.load(model=model, optimizer=opt, scaler=ctx.scaler)\n"
    "    step = state['step'] if state else 0\n"
    "    for epoch in range(ctx.epoch_of(step), ctx.epochs):\n"
    "        for x, y in ctx.batches(epoch, step):\n"
    "            loss = ctx.loss_fn(model(x), y)\n"
    "            ctx.backward(loss, opt)\n"
    "            step += 1\n"
    "            ctx.step_done(step, model=model, optimizer=opt)\n"
    "        ctx.report(epoch=epoch + 1, step=step, loss=loss.item())\n"
    "    return model\n"
)


def test_a_training_function_resumed_after_a_device_failure_keeps_the_epochs_before_it(
    digits_shards: Path, tmp_path: Path, user_modules: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#28 item 11: a user's training function that keeps nothing in ``extra`` fails after 40 steps (a device
    fault, as before a fallback); the next candidate resumes from the checkpoint and its history still holds
    every epoch, those before the failure included, as an uninterrupted run's does."""
    (user_modules / "plain_loops.py").write_text(_PLAIN_LOOP)
    kwargs = dict(epochs=4, batch_size=64, seed=2, checkpoint_every_steps=10, train_function="plain_loops:loop",
                  checkpoint_root=str(tmp_path / "ck"))
    reference = train(digits_shards, tmp_path / "ref", **kwargs)
    steps_per_epoch = reference.steps // 4
    after = 2 * steps_per_epoch + 1  # two whole epochs reported, then a checkpoint, then the failure
    kwargs["checkpoint_every_steps"] = after
    monkeypatch.setenv("HETEROFLOW_INJECT_FAULT", f"train@cpu=device:after_steps={after}")
    with pytest.raises(DeviceUnavailable):
        train(digits_shards, tmp_path / "failed", **kwargs)
    monkeypatch.delenv("HETEROFLOW_INJECT_FAULT")
    resumed = train(digits_shards, tmp_path / "resumed", **kwargs)
    assert resumed.resumed_from_step == after
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3, 4]
    assert [h["step"] for h in resumed.history] == [h["step"] for h in reference.history]


def test_a_checkpoint_restores_the_history_into_the_contexts_list_in_place(tmp_path: Path) -> None:
    """Sibling: whoever loads the checkpoint (the training function, not heteroflow) gets the history back in the
    very list ``ctx.history`` is, and a checkpoint of an earlier release (history only in the built-in loop's
    ``extra``) still brings it back."""
    from heteroflow.components.training.checkpoint import Checkpoint

    model = torch.nn.Linear(2, 2)
    ck = Checkpoint(tmp_path, every_steps=1, model={"factory": "x"}, amp_dtype="float32", total_steps=10)
    ck.history.extend([{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.25}])
    ck.save(4, model=model)
    mine: list[dict[str, Any]] = [{"epoch": 9}]
    again = Checkpoint(tmp_path, every_steps=1, model={"factory": "x"}, amp_dtype="float32", total_steps=10)
    again.history = mine
    assert again.load(model=model)["step"] == 4
    assert mine == [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.25}]
    ck.history.clear()
    ck.save(5, model=model, extra={"history": [{"epoch": 1, "loss": 0.75}]})
    state = torch.load(ck.path, weights_only=True)
    del state["history"]
    torch.save(state, ck.path)
    assert again.load(model=model)["step"] == 5 and mine == [{"epoch": 1, "loss": 0.75}]


def test_model_args_equal_to_what_train_offers_is_accepted_and_wins_over_the_default_width() -> None:
    from heteroflow.components.training.factories import ModelSpec

    offered = {"in_features": 64, "num_classes": 10, "input_shape": [64], "hidden_units": 128}
    spec = ModelSpec.resolve("heteroflow.components.training.factories:mlp", offered=offered,
                             given={"in_features": 64, "hidden_units": 32})
    assert spec.args["in_features"] == 64 and spec.args["num_classes"] == 10 and spec.args["hidden_units"] == 32
    with pytest.raises(InvalidParameter, match=r"num_classes=3 disagrees with the data \(num_classes=10\)"):
        ModelSpec.resolve("heteroflow.components.training.factories:mlp", offered=offered, given={"num_classes": 3})
