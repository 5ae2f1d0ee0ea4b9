"""Train: a PyTorch classifier on the chosen device, with atomic checkpoints and resume.

The model is a multilayer perceptron (``in -> hidden -> ReLU -> hidden -> ReLU -> classes``) trained with
Adam on cross-entropy. Every ``checkpoint_every_steps`` optimizer steps the model, optimizer and step
counter are saved atomically (temporary file, fsync, rename). A restarted ``train`` with the same data,
parameters and device finds the checkpoint (its folder is keyed by a fingerprint of those) and resumes from
it; batches are drawn from a per-epoch permutation seeded by ``seed + epoch``, so a resumed run sees the same
batches, and on CPU ends with the same weights, as an uninterrupted one. The checkpoint folder is removed
once the final model is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from heteroflow.cache.locations import home_dir
from heteroflow.cache.atomic import atomic_directory, atomic_file, atomic_write_bytes
from heteroflow.components.errors import (
    CheckpointError,
    CheckpointLocked,
    DeviceUnavailable,
    InvalidParameter,
    NonFiniteError,
)
from heteroflow.components.preprocess import SEED_MAX, TRANSFORM_FILES, available_cpus, check_integer, load_split, read_meta
from heteroflow.components.resources import Candidates, Resources, RetryPolicy
from heteroflow.components.step import ArtifactSpec, ArtifactType, Step, step, with_defaults

if TYPE_CHECKING:
    import torch

__all__ = [
    "MODEL_CONFIG",
    "MODEL_WEIGHTS",
    "TrainResult",
    "build_model",
    "check_train_params",
    "load_model",
    "resolve_device",
    "train",
]

MODEL_WEIGHTS = "model.pt"
MODEL_CONFIG = "model.json"
_CHECKPOINT = "checkpoint.pt"
_CHECKPOINT_INFO = "checkpoint.json"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TrainResult:
    """What train did.

    Attributes:
        model_dir: folder with ``model.pt`` (state dict), ``model.json`` (architecture, classes) and the
            fitted transformation preprocess saved (``transform.joblib``, ``transform.json``).
        device: the torch device it ran on (``cpu``, ``cuda:0``...).
        steps: optimizer steps in the whole training (including steps done before a resume).
        resumed_from_step: the checkpoint step it resumed from (0 for a fresh start).
        checkpoints_written: checkpoints written by this call.
        samples_per_second: training throughput of this call (samples / s of the training loop).
        final_loss: mean train loss of the last epoch.
        validation_accuracy: accuracy on the validation split after the last epoch (None without one).
        seconds: wall time of this call, seconds.
    """

    model_dir: Path
    device: str
    steps: int
    resumed_from_step: int
    checkpoints_written: int
    samples_per_second: float
    final_loss: float
    validation_accuracy: float | None
    seconds: float


def build_model(in_features: int, num_classes: int, hidden_units: int) -> torch.nn.Module:
    """The MLP classifier: input ``(batch, in_features)`` float32, output logits ``(batch, num_classes)``."""
    from torch import nn

    return nn.Sequential(
        nn.Linear(in_features, hidden_units),
        nn.ReLU(),
        nn.Linear(hidden_units, hidden_units),
        nn.ReLU(),
        nn.Linear(hidden_units, num_classes),
    )


def resolve_device(device: str) -> torch.device:
    """Turn a device string (``cpu``, ``cuda``, ``cuda:1``, ``npu``) into a usable ``torch.device``.

    Raises:
        DeviceUnavailable: the device type is absent here (a device failure: the caller may fall back).
        InvalidParameter: not a device string torch knows.
    """
    import torch

    if isinstance(device, str) and device.partition(":")[0].strip() == "npu":
        try:  # registers the "npu" device type with torch; without it torch rejects the string
            import torch_npu  # noqa: F401
        except ImportError:
            raise DeviceUnavailable(f"device={device!r}: torch_npu is not installed (Ascend NPUs need it)") from None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidParameter(f"device={device!r} is not a torch device; valid: cpu, cuda, cuda:N, npu, npu:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(f"device={device!r}: no CUDA device is available to this process")
    if dev.type == "npu":
        if not torch.npu.is_available():  # type: ignore[attr-defined]
            raise DeviceUnavailable(f"device={device!r}: no Ascend NPU is available to this process")
    return dev


def _fingerprint(meta: dict[str, Any], params: dict[str, Any]) -> str:
    blob = json.dumps({"data": meta, "params": params}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def _atomic_torch_save(obj: Any, path: Path) -> None:
    import torch

    with atomic_file(path) as fh:
        torch.save(obj, fh)


def _accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    import torch

    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean().item())


def check_train_params(values: Mapping[str, Any] | None = None, /, **given: Any) -> None:
    """Check train's parameters (the checks :func:`train` makes first; callers use it to fail before a run).

    Args:
        values / given: parameter values by name (``train``'s defaults for the others).

    Raises:
        InvalidParameter: the first parameter out of range or not a finite number, named, with its valid range.
    """
    v = with_defaults(train, values, **given)
    learning_rate = v["learning_rate"]
    for name in ("epochs", "batch_size", "hidden_units", "checkpoint_every_steps"):
        value, low = v[name], 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidParameter(f"{name}={value!r} is out of range; valid: an integer >= {low}")
    check_integer("seed", v["seed"], 0, high=SEED_MAX)  # numpy's default_rng refuses a negative seed mid-run
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) or not math.isfinite(learning_rate):
        raise InvalidParameter(f"learning_rate={learning_rate!r} is not a finite number; valid: a number > 0")
    if not learning_rate > 0:
        raise InvalidParameter(f"learning_rate={learning_rate!r} is out of range; valid: a number > 0")


def train(
    dataset_dir: str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    *,
    device: str = "cpu",
    epochs: int = 30,
    batch_size: int = 64,
    learning_rate: float = 1e-3,
    hidden_units: int = 128,
    seed: int = 0,
    checkpoint_every_steps: int = 50,
    checkpoint_root: str = "",
    progress: Callable[..., None] | None = None,
) -> TrainResult:
    """Train the MLP classifier on the preprocessed train split.

    Args:
        dataset_dir: preprocess output (shards and ``meta.json``).
        model_dir: folder to write; it appears complete or not at all (written beside it, then renamed).
        device: torch device string: ``cpu``, ``cuda``, ``cuda:N``, ``npu``.
        epochs: passes over the train split, >= 1 (unit: passes).
        batch_size: samples per optimizer step, >= 1 (unit: samples).
        learning_rate: Adam's step size, > 0.
        hidden_units: width of the MLP's two hidden layers, >= 1 (unit: neurons).
        seed: seed of the initial weights and the batch order.
        checkpoint_every_steps: optimizer steps between checkpoints, >= 1 (unit: optimizer steps).
        checkpoint_root: checkpoint folder (shared storage on a cluster); empty: <heteroflow home>/checkpoints; the folder used is <root>/<fingerprint of data, parameters and device type>.
        progress: called after every epoch with ``epoch``, ``epochs``, ``step``, ``total_steps``, ``loss`` and
            ``samples_per_second`` (the engine shows them live).

    Sets torch's intra-op thread count (process-wide) to the CPU cores this process may use
    (:func:`~heteroflow.components.preprocess.available_cpus`: affinity and cgroup quota).

    Returns:
        A :class:`TrainResult`.

    Raises:
        InvalidParameter: a parameter out of range.
        DeviceUnavailable: the device is absent (fall back to another candidate).
        CheckpointLocked: another live process is running the same training (transient: retried).
        CheckpointError: the checkpoint found cannot be loaded, or another process is running the same
            training (same checkpoint folder) right now.
        NonFiniteError: a training loss is NaN or infinite (names the epoch and step).
        DatasetError: ``dataset_dir`` is not preprocess output.
    """
    import torch  # imported before the clock starts: seconds measure the training, not the import

    started = time.perf_counter()
    check_train_params(locals())
    dev = resolve_device(device)
    # torch sizes its thread pool by the host's cores, not by the container's CPU limit: use what we are given.
    torch.set_num_threads(available_cpus())
    meta = read_meta(dataset_dir)
    x_np, y_np = load_split(dataset_dir, "train")
    n = len(x_np)
    if n == 0:
        raise InvalidParameter(f"{dataset_dir} has an empty train split")
    params = {
        "epochs": epochs,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "hidden_units": hidden_units,
        "seed": seed,
        "device_type": dev.type,
    }
    ckpt_dir = Path(checkpoint_root).expanduser() if checkpoint_root else home_dir() / "checkpoints"
    ckpt_dir = ckpt_dir / _fingerprint(meta, params)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive(ckpt_dir):
        return _train_locked(
            dataset_dir, model_dir, ckpt_dir, dev=dev, meta=meta, params=params, x_np=x_np, y_np=y_np, started=started,
            checkpoint_every_steps=checkpoint_every_steps,
            progress=progress,
        )


LOCK_WAIT_SECONDS = 15.0
"""How long train waits for a checkpoint folder's lock before giving up (a killed run's step process needs a
moment to notice and end; see :mod:`heteroflow.components.runtime`)."""


@contextlib.contextmanager
def _exclusive(ckpt_dir: Path, wait_seconds: float | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<ckpt_dir>/.lock``: two trainings never share one checkpoint folder.

    The lock dies with its holder (the kernel releases a ``flock`` when the process ends), so a lock is never
    stale; a live holder is waited for up to ``wait_seconds``.

    Raises:
        CheckpointLocked: another live process still holds it (a transient failure: retried).
    """
    with open(ckpt_dir / ".lock", "a+") as fh:
        deadline = time.monotonic() + (LOCK_WAIT_SECONDS if wait_seconds is None else wait_seconds)
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.seek(0)
                    holder = fh.read().strip() or "another process"
                    raise CheckpointLocked(
                        f"checkpoint folder {ckpt_dir} is in use by {holder}: the same training (same data, parameters "
                        "and device) is running already; wait for it or stop it, then rerun to resume"
                    ) from None
                time.sleep(0.2)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _train_locked(
    dataset_dir: str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    ckpt_dir: Path,
    *,
    dev: torch.device,
    meta: dict[str, Any],
    params: dict[str, Any],
    x_np: np.ndarray,
    y_np: np.ndarray,
    started: float,
    checkpoint_every_steps: int,
    progress: Callable[..., None] | None = None,
) -> TrainResult:
    import torch
    import torch.nn.functional as F

    epochs, batch_size, seed = params["epochs"], params["batch_size"], params["seed"]
    hidden_units, learning_rate = params["hidden_units"], params["learning_rate"]
    n = len(x_np)

    torch.manual_seed(seed)
    model = build_model(meta["num_features"], len(meta["classes"]), hidden_units).to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    steps_per_epoch = math.ceil(n / batch_size)
    total_steps = epochs * steps_per_epoch
    step = 0
    if (ckpt_dir / _CHECKPOINT).is_file():
        try:
            state = torch.load(ckpt_dir / _CHECKPOINT, map_location=dev, weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            step = int(state["step"])
        except Exception as exc:
            raise CheckpointError(
                f"checkpoint {ckpt_dir / _CHECKPOINT} cannot be loaded ({exc}); delete that folder to start over"
            ) from exc
    resumed_from = step

    x_all = torch.from_numpy(x_np).to(dev)
    y_all = torch.from_numpy(y_np).to(dev)
    x_val_np, y_val_np = load_split(dataset_dir, "validation")
    checkpoints = 0
    samples = 0
    epoch_loss = float("nan")
    loop_started = time.perf_counter()
    model.train()
    while step < total_steps:
        epoch, offset = divmod(step, steps_per_epoch)
        order = torch.from_numpy(np.random.default_rng(seed + epoch).permutation(n)).to(dev)
        losses = []
        first_step = step  # losses[k] is the loss of step first_step + k + 1
        for b in range(offset, steps_per_epoch):
            idx = order[b * batch_size:(b + 1) * batch_size]
            loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            samples += len(idx)
            losses.append(loss.detach())
            if step % checkpoint_every_steps == 0 and step < total_steps:
                _check_losses(losses, first_step=first_step, epoch=epoch, params=params)  # never save NaN weights
                _atomic_torch_save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, ckpt_dir / _CHECKPOINT
                )
                atomic_write_bytes(
                    ckpt_dir / _CHECKPOINT_INFO, json.dumps({"step": step, "total_steps": total_steps}).encode()
                )
                checkpoints += 1
        _check_losses(losses, first_step=first_step, epoch=epoch, params=params)
        epoch_loss = float(torch.stack(losses).mean().item()) if losses else epoch_loss
        if progress is not None:
            elapsed = time.perf_counter() - loop_started
            progress(
                epoch=epoch + 1,
                epochs=epochs,
                step=step,
                total_steps=total_steps,
                loss=round(epoch_loss, 4),
                samples_per_second=round(samples / elapsed, 1) if elapsed > 0 else 0.0,
            )
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    loop_seconds = time.perf_counter() - loop_started

    model.eval()
    val_acc = None
    if len(x_val_np):
        val_acc = _accuracy(model, torch.from_numpy(x_val_np).to(dev), torch.from_numpy(y_val_np).to(dev))

    out = Path(model_dir)
    with atomic_directory(out) as tmp:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, tmp / MODEL_WEIGHTS)
        transform_files = [name for name in TRANSFORM_FILES if Path(dataset_dir, name).is_file()]
        for name in transform_files:  # the fitted transformation travels with the model (and into the archive)
            shutil.copyfile(Path(dataset_dir, name), tmp / name)
        config = {
            "architecture": "mlp",
            "in_features": meta["num_features"],
            "hidden_units": hidden_units,
            "num_classes": len(meta["classes"]),
            "classes": meta["classes"],
            "label_column": meta.get("label_column"),
            "transformation": TRANSFORM_FILES[0] if transform_files else None,
            "params": params,
            "steps": step,
        }
        (tmp / MODEL_CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    return TrainResult(
        model_dir=out,
        device=str(dev),
        steps=step,
        resumed_from_step=resumed_from,
        checkpoints_written=checkpoints,
        samples_per_second=samples / loop_seconds if loop_seconds > 0 and samples else 0.0,
        final_loss=epoch_loss,
        validation_accuracy=val_acc,
        seconds=time.perf_counter() - started,
    )


def _check_losses(losses: list[torch.Tensor], *, first_step: int, epoch: int, params: dict[str, Any]) -> None:
    """Raise at the first loss among ``losses`` (of steps ``first_step + 1`` on) that is NaN or infinite.

    Checked at each checkpoint and epoch end (one device sync each, not one per step).

    Raises:
        NonFiniteError: names the epoch and step, and suggests a lower learning rate.
    """
    import torch

    if not losses:
        return
    stacked = torch.stack(losses)
    finite = torch.isfinite(stacked)
    if bool(finite.all()):
        return
    k = int((~finite).nonzero()[0].item())
    lr = params["learning_rate"]
    raise NonFiniteError(
        f"training loss is {float(stacked[k].item())} at epoch {epoch + 1} of {params['epochs']}, step {first_step + k + 1}: "
        f"training diverged; lower learning_rate={lr:g} (e.g. learning_rate={lr / 10:g}), or check the data for "
        "extreme values"
    )


def load_model(model_dir: str | os.PathLike[str], device: str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """Load what :func:`train` wrote: the model in eval mode on ``device``, and its ``model.json`` config.

    Raises:
        CheckpointError: the folder is not a heteroflow model.
    """
    import torch

    try:
        config = json.loads(Path(model_dir, MODEL_CONFIG).read_text(encoding="utf-8"))
        state = torch.load(Path(model_dir, MODEL_WEIGHTS), map_location="cpu", weights_only=True)
    except (FileNotFoundError, ValueError) as exc:
        raise CheckpointError(f"{model_dir} is not a heteroflow model ({exc}); run train first") from None
    model = build_model(config["in_features"], config["num_classes"], config["hidden_units"])
    model.load_state_dict(state)
    return model.to(resolve_device(device)).eval(), config


# --- the step definition ----------------------------------------------------------------------------------

_HOUR = 3600.0


DEFAULT_TRAIN_CANDIDATES = Candidates(
    [
        Resources(kind="npu", accelerator="ascend-910", count=1, cpu="8", memory="32Gi"),
        Resources(kind="gpu", accelerator="nvidia-gpu", count=1, cpu="8", memory="32Gi"),
        Resources(kind="cpu", cpu="8", memory="16Gi"),
    ]
)
"""Ascend 910 x1, else NVIDIA GPU x1, else 8 CPUs."""

def _train_facts(result: Any) -> dict[str, Any]:
    return {
        "device": result.device,
        "steps": result.steps,
        "resumed_from_step": result.resumed_from_step,
        "checkpoints_written": result.checkpoints_written,
        "samples_per_second": round(result.samples_per_second, 1),
        "final_loss": result.final_loss,
        "validation_accuracy": result.validation_accuracy,
        "seconds": result.seconds,
    }


def _train_metrics(facts: dict[str, Any]) -> dict[str, Any]:
    keys = ("samples_per_second", "final_loss", "validation_accuracy", "steps", "resumed_from_step")
    return {k: facts[k] for k in keys if facts.get(k) is not None}


def _train_summary(f: dict[str, Any]) -> list[str]:
    va = f.get("validation_accuracy")
    resumed = f" (resumed from step {f['resumed_from_step']})" if f.get("resumed_from_step") else ""
    return [
        f"train: {f['steps']} steps on {f['device']}{resumed} in {f['seconds']:.1f} s "
        f"({f['samples_per_second']:.0f} samples/s in the training loop), final loss {f['final_loss']:.4f}"
        + (f", validation accuracy {va:.4f}" if va is not None else "")
    ]


TRAIN: Step = step(
    train,
    name="train",
    inputs=[ArtifactSpec(name="shards", type=ArtifactType.DATASET, param="dataset_dir")],
    outputs=[
        ArtifactSpec(
            name="model",
            type=ArtifactType.MODEL,
            param="model_dir",
            help="the trained model (model.pt, model.json)",
            metadata=lambda f: {"framework": "pytorch", "device": f["device"]},
        ),
        ArtifactSpec(name="metrics", type=ArtifactType.METRICS, help="throughput, loss, validation accuracy", metadata=_train_metrics),
    ],
    candidates=DEFAULT_TRAIN_CANDIDATES,
    # An attempt may run for hours: the total window (Argo backoff.maxDuration) must outlast the retries.
    retry=RetryPolicy(retries=2, backoff_seconds=10, max_delay_seconds=120, window_seconds=24 * _HOUR),
    device_bound=True,
    device_param="device",
    progress_param="progress",
    check=check_train_params,
    facts=_train_facts,
    summary=_train_summary,
    ref="heteroflow.components.train:TRAIN",
)
