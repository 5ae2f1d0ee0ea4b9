"""Train resumes from its checkpoint after being killed, and a damaged checkpoint fails with a clear message.

The kill test runs ``heteroflow.components.training.step.train`` in a child process that SIGKILLs itself right after
writing its first checkpoint at step >= 20 (an observable point, not a time: a fast machine cannot finish
training first), and reruns train in this process with the same arguments. The resumed run must start
from the checkpointed step, finish the full number of steps, remove its checkpoint folder, and end with the
same weights as an uninterrupted run (batches come from seeded per-epoch permutations, and this runs on CPU).
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from heteroflow.components.errors import CheckpointError
from heteroflow.components.data.preprocess import read_meta
from heteroflow.components.training.step import MODEL_CONFIG, MODEL_WEIGHTS, train

torch = pytest.importorskip("torch", reason="train needs PyTorch (the 'torch' extra)")

_DEADLINE_S = 120.0
_KILL_AT_STEP = 20  # the first checkpoint: one is all the test needs

# Runs in the child: train with the keyword arguments given as JSON in argv[3]; the child SIGKILLs itself right
# after checkpoint.json of a step >= argv[4] is written (like a crash at that point).
_CHILD = """
import json, os, signal, sys
import heteroflow.components.training.step as t
import heteroflow.components.training.checkpoint as checkpoints  # Checkpoint.save writes checkpoint.json with it
real = checkpoints.atomic_write_bytes
def write(path, data, **kwargs):
    real(path, data, **kwargs)
    if os.path.basename(path) == "checkpoint.json" and json.loads(data)["step"] >= int(sys.argv[4]):
        os.kill(os.getpid(), signal.SIGKILL)
checkpoints.atomic_write_bytes = write
t.train(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))
"""


def _train_kwargs(checkpoint_root: Path) -> dict[str, Any]:
    return {
        "device": "cpu",
        "epochs": 20,
        "batch_size": 64,
        "learning_rate": 1e-3,
        "hidden_units": 64,
        "seed": 3,
        "checkpoint_every_steps": 20,
        "checkpoint_root": str(checkpoint_root),
    }


def _read_info(path: Path) -> dict[str, Any] | None:
    """checkpoint.json, or None while it is absent or being written."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def _checkpoint_infos(root: Path) -> list[Path]:
    return sorted(root.glob("*/checkpoint.json")) if root.is_dir() else []


def _kill_after_checkpoint(shards: Path, model_dir: Path, kwargs: dict[str, Any], log: Path) -> tuple[int, Path]:
    """Run train in a child that SIGKILLs itself once its checkpoint at step >= 20 exists; return (returncode,
    checkpoint folder)."""
    root = Path(kwargs["checkpoint_root"])
    with open(log, "wb") as err:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(shards), str(model_dir), json.dumps(kwargs), str(_KILL_AT_STEP)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=_DEADLINE_S,
        )
    infos = _checkpoint_infos(root)
    assert len(infos) == 1, f"train exited with {proc.returncode}, checkpoints {infos}; stderr:\n{log.read_text(errors='replace')}"
    return proc.returncode, infos[0].parent


def _load_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(model_dir / MODEL_WEIGHTS, map_location="cpu", weights_only=True)


@pytest.mark.slow
def test_train_killed_by_sigkill_resumes_from_checkpoint_and_matches_uninterrupted_run(
    digits_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kwargs = _train_kwargs(tmp_path / "checkpoints")
    model_dir = tmp_path / "models" / "resumed"

    returncode, ckpt_folder = _kill_after_checkpoint(digits_shards, model_dir, kwargs, tmp_path / "child.err")

    # The child died by SIGKILL, left no model (not even a partial one) and left its checkpoint.
    assert returncode == -signal.SIGKILL
    assert not model_dir.exists()
    assert list(model_dir.parent.glob(f".{model_dir.name}.*")) == []
    assert (ckpt_folder / "checkpoint.pt").is_file()
    info = _read_info(ckpt_folder / "checkpoint.json")
    assert info is not None, "checkpoint.json is unreadable after the kill"
    # The step saved inside checkpoint.pt is what train resumes from (checkpoint.json is written just after it,
    # so a kill between the two renames may leave the json one checkpoint behind).
    import torch

    checkpoint_step = int(torch.load(ckpt_folder / "checkpoint.pt", weights_only=True)["step"])
    assert info["step"] in (checkpoint_step, checkpoint_step - kwargs["checkpoint_every_steps"])
    assert checkpoint_step >= _KILL_AT_STEP
    assert checkpoint_step % kwargs["checkpoint_every_steps"] == 0

    n_train = read_meta(digits_shards)["counts"]["train"]
    total_steps = kwargs["epochs"] * math.ceil(n_train / kwargs["batch_size"])
    assert info["total_steps"] == total_steps
    assert checkpoint_step < total_steps

    # Rerun with the same arguments: it resumes from that checkpoint and completes.
    capsys.readouterr()
    result = train(digits_shards, model_dir, **kwargs)
    assert result.resumed_from_step == checkpoint_step > 0
    # said when it resumes, not only in the summary at the end
    assert f"train: resuming from step {checkpoint_step} of {total_steps} (checkpoint " in capsys.readouterr().err
    assert result.steps == total_steps
    assert result.device == "cpu"
    every = kwargs["checkpoint_every_steps"]
    assert result.checkpoints_written == (total_steps - 1) // every - checkpoint_step // every
    assert result.model_dir == model_dir
    assert (model_dir / MODEL_WEIGHTS).is_file() and (model_dir / MODEL_CONFIG).is_file()
    assert not ckpt_folder.exists(), "the checkpoint folder must be removed once the model is written"

    # An uninterrupted run with the same arguments (its own checkpoint root, so it cannot resume).
    reference = train(digits_shards, tmp_path / "models" / "reference", **_train_kwargs(tmp_path / "checkpoints-ref"))
    assert reference.resumed_from_step == 0
    assert reference.steps == total_steps

    resumed_w, reference_w = _load_weights(model_dir), _load_weights(reference.model_dir)
    assert resumed_w.keys() == reference_w.keys()
    differing = [name for name in reference_w if not torch.equal(resumed_w[name], reference_w[name])]
    assert differing == [], f"resumed weights differ from the uninterrupted run's in {differing}"
    assert json.loads((model_dir / MODEL_CONFIG).read_text()) == json.loads(
        (reference.model_dir / MODEL_CONFIG).read_text()
    )
    assert result.validation_accuracy == reference.validation_accuracy
    # Issue 14: a resume reports the true last-epoch loss (the whole epoch's mean), and the whole history.
    assert result.final_loss == reference.final_loss
    assert result.history == reference.history and len(result.history) == kwargs["epochs"]


def _leave_checkpoint(shards: Path, tmp_path: Path, kwargs: dict[str, Any]) -> Path:
    """Train until the final model write fails (its parent folder is a file), which leaves the checkpoint."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the model's parent folder should be")
    with pytest.raises(OSError):
        train(shards, blocker / "model", **kwargs)
    infos = _checkpoint_infos(Path(kwargs["checkpoint_root"]))
    assert len(infos) == 1, f"expected one checkpoint folder, found {infos}"
    return infos[0].parent


@pytest.mark.slow  # trains a model: seconds (#32: the quick suite stays quick)
@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_checkpoint_raises_checkpoint_error_telling_to_delete_the_folder(
    digits_shards: Path, tmp_path: Path, damage: str
) -> None:
    kwargs = {**_train_kwargs(tmp_path / "checkpoints"), "epochs": 2, "checkpoint_every_steps": 5}
    folder = _leave_checkpoint(digits_shards, tmp_path, kwargs)
    ckpt = folder / "checkpoint.pt"
    assert ckpt.is_file()
    if damage == "garbage":
        ckpt.write_bytes(b"this is not a torch checkpoint\n" * 10)
    else:
        data = ckpt.read_bytes()
        ckpt.write_bytes(data[: len(data) // 2])

    model_dir = tmp_path / "model"
    with pytest.raises(CheckpointError) as excinfo:
        train(digits_shards, model_dir, **kwargs)
    message = str(excinfo.value)
    assert str(folder) in message
    assert "delete that folder" in message
    assert not model_dir.exists()

    # Doing what the message says: delete the folder, and train starts over and completes.
    shutil.rmtree(folder)
    result = train(digits_shards, model_dir, **kwargs)
    assert result.resumed_from_step == 0
    n_train = read_meta(digits_shards)["counts"]["train"]
    assert result.steps == 2 * math.ceil(n_train / kwargs["batch_size"])
    assert (model_dir / MODEL_WEIGHTS).is_file()
    assert not folder.exists()


def test_a_second_training_of_the_same_job_waits_for_the_first_then_runs(
    digits_shards: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 16 item 18: an identical run waits while the holder of the checkpoint folder lives (no transient
    retries burnt on it), says whom it waits for, and runs once the lock is released."""
    import fcntl
    import threading

    from heteroflow.components.training.step import checkpoint_folder

    kwargs = dict(epochs=1, batch_size=64, seed=0, checkpoint_every_steps=5, checkpoint_root=str(tmp_path / "ckpt"))
    folder = checkpoint_folder(digits_shards, **kwargs)
    folder.mkdir(parents=True)
    results: list[Any] = []
    errors: list[BaseException] = []

    def second() -> None:
        try:
            results.append(train(digits_shards, tmp_path / "m1", **kwargs))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    # Hold the lock the way a running train does, from another open file description.
    with open(folder / ".lock", "a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.write("pid 12345")
        holder.flush()
        worker = threading.Thread(target=second)
        worker.start()
        deadline = time.monotonic() + _DEADLINE_S
        while "waiting for pid 12345" not in capfd.readouterr().err and time.monotonic() < deadline:
            time.sleep(0.1)
        assert worker.is_alive() and not errors and not results  # waiting, not failed
        assert not (tmp_path / "m1").exists()
        fcntl.flock(holder, fcntl.LOCK_UN)
    worker.join(_DEADLINE_S)
    assert not errors, errors
    assert results and results[0].steps > 0 and (tmp_path / "m1" / MODEL_WEIGHTS).is_file()


def test_a_lock_wait_limit_refuses_with_a_clear_message(digits_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    import heteroflow.components.training.checkpoint_lock as checkpoint_lock
    from heteroflow.components.errors import CheckpointLocked
    from heteroflow.components.training.step import checkpoint_folder

    monkeypatch.setattr(checkpoint_lock, "LOCK_WAIT_SECONDS", 0.3)  # _exclusive reads it there
    kwargs = dict(epochs=1, batch_size=64, seed=0, checkpoint_root=str(tmp_path / "ckpt"))
    folder = checkpoint_folder(digits_shards, **kwargs)
    folder.mkdir(parents=True)
    with open(folder / ".lock", "a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.write("pid 12345")
        holder.flush()
        with pytest.raises(CheckpointLocked, match=r"is in use by pid 12345: the same training .* is running already"):
            train(digits_shards, tmp_path / "m1", **kwargs)
    assert not (tmp_path / "m1").exists()


def test_a_run_that_waited_for_an_identical_one_takes_the_model_it_finished(
    digits_shards: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """#28 item 10: the second of two identical trainings waits for the first (saying so), then takes the model
    the first finished (copied into its own folder, with its steps and history) instead of retraining from
    step 0; the summary says whom it waited for and that it trained nothing."""
    import os
    import threading

    from heteroflow.components.training.step import TRAIN, checkpoint_folder

    kwargs = dict(epochs=2, batch_size=64, seed=0, checkpoint_every_steps=5, checkpoint_root=str(tmp_path / "ckpt"))
    folder = checkpoint_folder(digits_shards, **kwargs)
    first_in, go_on = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def first_progress(**facts: Any) -> None:
        if facts.get("epoch") == 1:
            first_in.set()
            go_on.wait(_DEADLINE_S)  # holds the lock until the second is seen waiting

    def run(name: str, **extra: Any) -> None:
        try:
            results[name] = train(digits_shards, tmp_path / name, **kwargs, **extra)
        except BaseException as exc:  # pragma: no cover - reported below
            results[name] = exc

    first = threading.Thread(target=run, args=("m1",), kwargs={"progress": first_progress})
    first.start()
    assert first_in.wait(_DEADLINE_S)
    second = threading.Thread(target=run, args=("m2",))
    second.start()
    deadline, err = time.monotonic() + _DEADLINE_S, ""
    while f"waiting for pid {os.getpid()}" not in err and time.monotonic() < deadline:
        err += capfd.readouterr().err
        time.sleep(0.05)
    assert f"waiting for pid {os.getpid()}" in err
    go_on.set()
    first.join(_DEADLINE_S)
    second.join(_DEADLINE_S)
    one, two = results["m1"], results["m2"]
    assert not isinstance(one, BaseException), one
    assert not isinstance(two, BaseException), two
    assert one.resumed_from_step == 0 and one.checkpoints_written > 0
    assert two.reused_model == str(tmp_path / "m1") and two.waited_for == f"pid {os.getpid()}"
    assert two.steps == one.steps and two.resumed_from_step == one.steps and two.checkpoints_written == 0
    assert two.history == one.history and two.final_loss == one.final_loss
    a, b = _load_weights(tmp_path / "m1"), _load_weights(tmp_path / "m2")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "m2" / MODEL_CONFIG).read_text())["steps"] == one.steps
    assert not folder.exists()
    lines = TRAIN.summarize(TRAIN.facts(two))
    assert lines[0].startswith("train: waited ") and f"for pid {os.getpid()}, which ran the same training" in lines[0]
    assert "not trained again" in lines[1]


def test_a_run_that_waited_for_one_that_did_not_finish_resumes_from_its_checkpoint(
    digits_shards: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sibling of #28 item 10: the training waited for failed after its checkpoint at step 10 (a device fault, as
    before a fallback): the waiting one resumes from that step, not from 0, and trains the rest itself."""
    import fcntl
    import threading

    from heteroflow.components.errors import DeviceUnavailable
    from heteroflow.components.training.step import checkpoint_folder

    kwargs = dict(epochs=1, batch_size=64, seed=0, checkpoint_every_steps=10, checkpoint_root=str(tmp_path / "ckpt"))
    folder = checkpoint_folder(digits_shards, **kwargs)
    monkeypatch.setenv("HETEROFLOW_INJECT_FAULT", "train@cpu=device:after_steps=10")
    with pytest.raises(DeviceUnavailable):
        train(digits_shards, tmp_path / "m0", **kwargs)
    monkeypatch.delenv("HETEROFLOW_INJECT_FAULT")
    assert (folder / "checkpoint.pt").is_file()
    results: list[Any] = []
    with open(folder / ".lock", "a+") as holder:  # the failed one's process still holds the folder, then ends
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.seek(0)
        holder.truncate()
        holder.write("pid 12345")
        holder.flush()
        worker = threading.Thread(target=lambda: results.append(train(digits_shards, tmp_path / "m1", **kwargs)))
        worker.start()
        deadline = time.monotonic() + _DEADLINE_S
        while "waiting for pid 12345" not in capfd.readouterr().err and time.monotonic() < deadline:
            time.sleep(0.05)
        fcntl.flock(holder, fcntl.LOCK_UN)
    worker.join(_DEADLINE_S)
    (result,) = results
    assert result.resumed_from_step == 10 and result.reused_model == "" and result.waited_for == "pid 12345"
    assert result.steps > 10 and (tmp_path / "m1" / MODEL_WEIGHTS).is_file()


def test_a_checkpoint_folder_with_nothing_to_resume_is_not_left_behind(tmp_path: Path) -> None:
    """A new user found folders holding only ``.lock`` under checkpoints/ after runs that failed before their first
    checkpoint; the README says the folder goes when training completes. A folder with a checkpoint stays."""
    from heteroflow.components.training.checkpoint_lock import _exclusive

    empty, kept = tmp_path / "empty", tmp_path / "kept"
    with pytest.raises(RuntimeError):
        with _exclusive(empty):
            raise RuntimeError("the factory failed")
    assert not empty.exists()
    with _exclusive(kept):
        (kept / "ckpt.pt").write_bytes(b"state")
    assert sorted(p.name for p in kept.iterdir()) == [".lock", "ckpt.pt"]
    with _exclusive(kept):  # and it can be locked again
        pass
    assert (kept / "ckpt.pt").exists()


def test_a_kept_finished_training_is_released_only_when_no_training_holds_its_folder(tmp_path: Path) -> None:
    """The sibling of the rerun-after-a-stop case: the run that succeeds removes the kept model's folder, but not
    while an identical training holds its lock (that one takes the model or trains; it decides), and a folder
    that keeps nothing is never removed by the release."""
    import fcntl

    from heteroflow.components.training.checkpoint_lock import KEPT_FACTS, keep_finished, release_kept

    folder, model = tmp_path / "ckpt", tmp_path / "model"
    folder.mkdir()
    model.mkdir()
    (model / MODEL_WEIGHTS).write_bytes(b"w")
    (model / MODEL_CONFIG).write_text("{}")
    (folder / "checkpoint.pt").write_bytes(b"c")
    (folder / ".lock").write_text("")
    assert release_kept(folder) is False and (folder / "checkpoint.pt").is_file()  # a checkpoint, not a kept model
    kept = keep_finished(folder, model, {"steps": 56})
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "finished", KEPT_FACTS]  # the checkpoint gave way
    assert (kept / MODEL_WEIGHTS).read_bytes() == b"w" and json.loads((folder / KEPT_FACTS).read_text())["model_dir"] == str(kept)
    with open(folder / ".lock", "a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert release_kept(folder) is False and (kept / MODEL_WEIGHTS).is_file()
    assert release_kept(folder) is True and not folder.exists()


def test_a_kept_finished_model_is_not_taken_once_its_model_code_changed(
    digits_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A review of the kept models: the checkpoint key names the model factory, not its code, so a run that failed
    after train, then a fix to the model's code, then the rerun took the model trained with the old code (its
    validation accuracy, evaluated with the new code). The kept model records its factory's source hash; changed,
    it is removed and the training runs afresh. Unchanged, it is taken (the sibling: the same code)."""
    import textwrap

    from heteroflow.components.training.checkpoint_lock import KEPT_FACTS

    (tmp_path / "kept_models.py").write_text(textwrap.dedent("""
        from torch import nn

        def net(in_features, num_classes):
            return nn.Sequential(nn.Flatten(), nn.Linear(in_features, 16), nn.ReLU(), nn.Linear(16, num_classes))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HETEROFLOW_RUN_DIR", str(tmp_path / "run"))  # a run that records itself: train keeps its model
    kwargs = dict(epochs=1, batch_size=64, seed=0, model_factory="kept_models:net", checkpoint_root=str(tmp_path / "ckpt"))
    first = train(digits_shards, tmp_path / "m1", **kwargs)
    folder = Path(first.kept_checkpoint)
    assert (folder / KEPT_FACTS).is_file() and first.resumed_from_step == 0
    same = train(digits_shards, tmp_path / "m2", **kwargs)  # the same code: taken, not trained again
    assert same.reused_model == str(folder / "finished") and same.resumed_from_step == same.steps == first.steps
    (tmp_path / "kept_models.py").write_text((tmp_path / "kept_models.py").read_text().replace("nn.ReLU()", "nn.Tanh()"))
    capfd.readouterr()
    fresh = train(digits_shards, tmp_path / "m3", **kwargs)
    assert fresh.reused_model == "" and fresh.resumed_from_step == 0 and fresh.checkpoints_written >= 0
    err = " ".join(capfd.readouterr().err.split())
    assert f"train: the model an earlier run finished (kept in {folder}) was trained with other code (kept_models changed since): training afresh" in err, err
    assert json.loads((folder / KEPT_FACTS).read_text())["validation_accuracy"] == fresh.validation_accuracy  # kept anew
