"""Train: your model (or the built-in MLP) on the chosen device, with atomic, device-portable checkpoints.

:func:`train` is the train step. It opens the data with :mod:`heteroflow.components.data.readers` (tables, image
folders, tensors or your dataset factory), builds the model with a factory (``model=package.module:function``,
default :func:`heteroflow.components.training.loop.mlp`), and runs a training function
(``train_function=package.module:function(ctx)``, default :func:`heteroflow.components.training.loop.classifier_loop`)
with a :class:`~heteroflow.components.training.loop.TrainContext`. Every ``checkpoint_every_steps`` optimizer steps the
model, optimizer, scaler, RNG states and data position are saved from CPU copies, atomically, in a folder keyed by
data, parameters and model, never by device: a restarted train, or the next candidate after a device failure,
resumes there. Batches come from per-epoch permutations seeded by ``seed + epoch``, so a resumed run sees the
same batches and, on CPU, ends with the same weights as an uninterrupted one. The checkpoint folder is removed
once the final model is written.

A candidate with several devices (``count > 1`` on a GPU or NPU kind) trains with one worker process per device
(:func:`heteroflow.components.training.distributed.launch`, torchrun's environment, the registry's backend); each runs the
same training function on its share of every batch (see :mod:`heteroflow.components.training.loop`), so a step means
the same with any number of devices and a checkpoint resumes across them.

This module holds :func:`train`, its checks, its checkpoint folder's key, its multi-device and multi-node launch and
the step definition (:data:`TRAIN`). The rest lives beside it, and its names are re-exported here:
:mod:`~heteroflow.components.training.device` (:func:`resolve_device`, :func:`distributed_workers`),
:mod:`~heteroflow.components.training.model_files` (``model.pt`` / ``model.json``: :func:`load_model`,
:func:`build_model`), :mod:`~heteroflow.components.training.params` (``model_args``, ``batch_sizes``,
:func:`model_spec`), :mod:`~heteroflow.components.training.checkpoint_lock` (the checkpoint folder's lock,
:data:`~heteroflow.components.training.checkpoint_lock.LOCK_WAIT_SECONDS`) and
:mod:`~heteroflow.components.training.context` (one process's ``TrainContext``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.cache.locations import home_dir
from heteroflow.components.errors import InvalidParameter, Problems, make_folder
from heteroflow.components.data.parameters import SEED_MAX, check_integer
from heteroflow.components.resources import Candidates, DeviceKind, Resources, RetryPolicy
from heteroflow.components.core.step import ArtifactSpec, ArtifactType, Step, step, with_defaults
from heteroflow.components.core.telemetry import RUN_DIR_ENV
from heteroflow.components.training.checkpoint_lock import LOCK_WAIT_SECONDS, _exclusive, _take_finished_model  # noqa: F401  (set it there: _exclusive reads it there)
from heteroflow.components.training.checkpoint_lock import _take_kept_model, code_fingerprint, keep_finished
from heteroflow.components.training.context import _make_context, _trained_module, _training_function
from heteroflow.components.training.device import _kind_of_type, distributed_workers, resolve_device
from heteroflow.components.training.model_files import MODEL_CONFIG, MODEL_WEIGHTS, _write_model, build_model, load_model
from heteroflow.components.training.params import check_model_args, model_spec, parse_batch_sizes, union_batch_size

if TYPE_CHECKING:
    import torch

__all__ = [
    "MODEL_CONFIG",
    "MODEL_WEIGHTS",
    "TrainResult",
    "build_model",
    "check_train_params",
    "checkpoint_folder",
    "load_model",
    "resolve_device",
    "train",
]

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
        history: per-epoch metrics (``epoch``, ``step``, ``loss``, ``validation_accuracy``...), the epochs before
            a resume included.
        precision: the autocast dtype used (``float32``, ``bfloat16``, ``float16``).
        model: the model factory and its arguments.
        device_kind: the candidate's device kind (``npu`` even when simulated on the CPU).
        num_workers: DataLoader worker processes used (per training process).
        processes: training processes, one per device (the candidate's ``count`` on an accelerator kind, else 1),
            each its share of every batch, gradients combined by DDP with the registry's backend.
        batch_size: samples per optimizer step (the sum of ``batch_sizes`` when given, else ``batch_size``).
        accelerator: the candidate's accelerator model (``nvidia-gpu``...; empty on the CPU).
        waited_for: the identical training it waited for (``pid N``), empty when it did not wait.
        waited_seconds: how long it waited for it.
        reused_model: the model folder of that training, when it finished: this call copied its model (and
            facts: ``steps``, ``history``...) instead of training again; empty otherwise.
        amp_skipped_steps: optimizer steps the fp16 GradScaler skipped for inf/NaN gradients (the learning-rate
            scheduler was not stepped on them), those before a resume included; 0 without a scaler.
        loop_seconds: wall time of the training loop that :attr:`samples_per_second` is over (seconds; the last
            incarnation's after a resume; 0.0 where not measured): the step's :attr:`seconds` also hold starting its
            worker processes, loading the data and writing the model.
        batch_sizes: the per-worker batch sizes given (``batch_sizes``), () when none were; when their number is
            not :attr:`processes` (a fallback to a candidate with fewer devices), the union batch was split evenly.
        kept_checkpoint: the checkpoint folder that keeps this finished training's model until the run succeeds
            (in a run that records itself: a local engine's), so that a rerun after a stop or failure past train
            takes it instead of training again (:func:`~heteroflow.components.training.checkpoint_lock.keep_finished`);
            empty when none is kept (the folder was removed as training completed).
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
    history: tuple[dict[str, Any], ...] = ()
    precision: str = "float32"
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    device_kind: str = dataclasses.field(default_factory=lambda: DeviceKind.host().value)
    num_workers: int = 0
    processes: int = 1
    batch_size: int = 0
    accelerator: str = ""
    waited_for: str = ""
    waited_seconds: float = 0.0
    reused_model: str = ""
    amp_skipped_steps: int = 0
    mixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    batch_sizes: tuple[int, ...] = ()
    loop_seconds: float = 0.0
    kept_checkpoint: str = ""

def _fingerprint(meta: dict[str, Any], params: dict[str, Any]) -> str:
    """The checkpoint folder's key: a hash of the data's identity and the training parameters (the model factory
    and its arguments among them), never the device: another device kind resumes from the same folder."""
    blob = json.dumps({"data": meta, "params": params}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]

def _check_batch_sizes_fit(text: str, sizes: tuple[int, ...], candidates: Any) -> None:
    """Raise InvalidParameter when ``sizes`` lists a number of sizes no single-kind candidate has workers for
    (mixed candidates measure their shares and refuse batch_sizes when they run)."""
    workers: dict[int, str] = {}
    for res in candidates:
        if getattr(res, "replicas", None):
            continue
        kind = DeviceKind.parse(res.kind)
        workers.setdefault((res.count if kind.has_devices else 1) * res.nodes, res.describe().split(", ")[0])
    if workers and len(sizes) not in workers:
        each = "; ".join(f"{n} for {what}" for n, what in sorted(workers.items()))
        raise InvalidParameter(
            f"batch_sizes={text!r} lists {len(sizes)} size(s), and no candidate of train has {len(sizes)} worker "
            f"process(es) (one per device); valid: as many sizes as one candidate's workers ({each}), or leave "
            f"batch_sizes empty (batch_size split evenly)"
        )


def check_train_params(values: Mapping[str, Any] | None = None, /, *, candidates: Any = None, **given: Any) -> None:
    """Check train's parameters (the checks :func:`train` makes first; callers use it to fail before a run).

    Checks ranges, that the model, loss, optimizer, training function and dataset factories can be imported
    (a model factory's module is imported, not called), and ``model_args`` against the model factory's signature.

    Args:
        values / given: parameter values by name (``train``'s defaults for the others).
        candidates: the call's candidates (:class:`~heteroflow.components.resources.Candidates`), when known:
            ``batch_sizes`` must then list one size per worker process of at least one single-kind candidate
            (``count`` devices, times ``nodes``; 1 on the CPU). A candidate with another number of workers splits the
            union batch evenly (a fallback), but sizes that fit no candidate are a mistake.

    Raises:
        InvalidParameter: every parameter out of range, not a finite number, a factory that cannot be
            imported or model arguments it does not take, each named with what is valid (several in one message).
    """
    from heteroflow.components.training.loop import PRECISIONS, _import_callable

    v = with_defaults(train, values, **given)
    problems = Problems()
    learning_rate = v["learning_rate"]
    for name in ("epochs", "batch_size", "hidden_units", "checkpoint_every_steps"):
        value, low = v[name], 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.add(InvalidParameter(f"{name}={value!r} is out of range; valid: an integer >= {low}"))
    with problems.check():
        check_integer("seed", v["seed"], 0, high=SEED_MAX)  # numpy's default_rng refuses a negative seed mid-run
    workers = v["loader_workers"]
    if isinstance(workers, bool) or not isinstance(workers, int) or not -1 <= workers <= MAX_LOADER_WORKERS:
        # no bound forked a million workers until the host ran out of memory
        problems.add(InvalidParameter(f"loader_workers={workers!r} is out of range; valid: -1 (auto), 0 (load in the training "
                                      f"process) or up to {MAX_LOADER_WORKERS} worker processes"))
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) or not math.isfinite(learning_rate):
        problems.add(InvalidParameter(f"learning_rate={learning_rate!r} is not a finite number; valid: a number > 0"))
    elif not 0 < learning_rate <= FLOAT32_MAX:  # the optimizers keep it as a float32 (1e39 failed inside Adam's step)
        problems.add(InvalidParameter(f"learning_rate={learning_rate!r} is out of range; valid: a number > 0 and <= {FLOAT32_MAX:.7g} (float32's largest)"))
    if v["precision"] not in PRECISIONS:
        problems.add(InvalidParameter(f"precision={v['precision']!r} is unknown; valid: {', '.join(PRECISIONS)}"))
    with problems.check():
        sizes = parse_batch_sizes(v["batch_sizes"])
        if sizes and candidates is not None:
            _check_batch_sizes_fit(v["batch_sizes"], sizes, candidates)
    with problems.check():  # the factory imported, and model_args checked against what it takes
        check_model_args(v["model_factory"], v["model_args"])
    with problems.check():  # hidden_units set twice to different values (the data's arguments are checked in train)
        from heteroflow.components.training.factories import _check_overrides
        from heteroflow.components.training.params import _parse_model_args

        if isinstance(v["hidden_units"], int):
            _check_overrides({"hidden_units": v["hidden_units"]}, _parse_model_args(v["model_args"]))
        given = _parse_model_args(v["model_args"]).get("hidden_units")  # the same range as the parameter's
        if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
            raise InvalidParameter(f"model_args hidden_units={given!r} is out of range; valid: an integer >= 1")
    with problems.check():  # hidden_units set for a model that takes no width: it would be ignored
        from heteroflow.components.training.params import check_hidden_units_used

        if isinstance(v["hidden_units"], int) and not isinstance(v["hidden_units"], bool) and v["hidden_units"] >= 1:
            import inspect

            check_hidden_units_used(v["model_factory"], v["hidden_units"], inspect.signature(train).parameters["hidden_units"].default)
    if v["optimizer"]:
        from heteroflow.components.training.factories import check_optimizer

        with problems.check():
            check_optimizer(v["optimizer"])
    for name in ("loss", "train_function", "dataset_factory"):
        if v[name]:
            with problems.check():
                _import_callable(v[name], what=name)
    problems.raise_all("train's parameters")

MAX_LOADER_WORKERS = 256
"""The most DataLoader worker processes ``loader_workers`` may ask for (one process each; torch itself warns above
the machine's cores)."""

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32 (IEEE 754 binary32), the largest ``learning_rate`` the optimizers can hold."""


def _plan(dataset_dir: str | os.PathLike[str], values: Mapping[str, Any]) -> tuple[Any, Any, dict[str, Any], Path]:
    """Open the data, resolve the model factory's arguments, and key the checkpoint folder (no device touched)."""
    from heteroflow.components.data.readers import open_splits

    v = with_defaults(train, values)
    splits = open_splits(dataset_dir, dataset_factory=v["dataset_factory"])
    spec = model_spec(splits, v)
    keys = ("epochs", "batch_size", "learning_rate", "hidden_units", "seed", "loss", "optimizer", "train_function",
            "dataset_factory", "precision", "deterministic")
    # the union batch keys the folder, not its split over workers: the same steps resume on any number of devices
    params = {k: v[k] for k in keys} | {"model": spec.to_dict(), "batch_size": union_batch_size(v)}
    root = Path(v["checkpoint_root"]).expanduser() if v["checkpoint_root"] else home_dir() / "checkpoints"
    return splits, spec, params, root / _fingerprint({"data": splits.fingerprint}, params)

CHECKPOINT_ROOT_VALID = "a folder this process can write (shared storage on a cluster), or empty for <heteroflow home>/checkpoints"
"""What ``checkpoint_root`` may be, for the error that names a folder that cannot be made."""


def checkpoint_folder(dataset_dir: str | os.PathLike[str], **values: Any) -> Path:
    """The checkpoint folder :func:`train` uses for these arguments (``train``'s defaults for the others): keyed by
    the data, the parameters and the model, never by the device.

    Raises:
        DatasetError / InvalidParameter: as :func:`train` before it trains.
    """
    return _plan(dataset_dir, values)[3]


def train(
    dataset_dir: str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    *,
    device: str = "cpu",
    resources: Resources | None = None,
    epochs: int = 30,
    batch_size: int = 64,
    learning_rate: float = 1e-3,
    hidden_units: int = 128,
    seed: int = 0,
    checkpoint_every_steps: int = 50,
    checkpoint_root: str = "",
    model_factory: str = "",
    model_args: str = "",
    loss: str = "",
    optimizer: str = "",
    train_function: str = "",
    dataset_factory: str = "",
    precision: str = "auto",
    loader_workers: int = -1,
    deterministic: bool = False,
    batch_sizes: str = "",
    training_profile: str = "",
    compile_model: bool = False,
    progress: Callable[..., None] | None = None,
) -> TrainResult:
    """Train a model (yours, or the built-in MLP) on the preprocessed data, resumable on any device.

    Args:
        dataset_dir: preprocess output (``meta.json``: table shards, an image folder's split, or tensors).
        model_dir: folder to write; it appears complete or not at all (written beside it, then renamed).
        device: torch device string: ``cpu``, ``cuda``, ``cuda:N``, ``npu``.
        resources: the candidate it runs on (the engine passes it; its kind names the device in records and faults;
            a ``count`` above 1 on an accelerator kind trains with one worker process per device, see
            :func:`distributed_workers`).
        epochs: passes over the train split, >= 1 (unit: passes).
        batch_size: samples per optimizer step, >= 1 (unit: samples).
        learning_rate: the optimizer's step size, > 0.
        hidden_units: width of the built-in MLP's two hidden layers, >= 1; passed to a model factory that takes it (unit: neurons).
        seed: seed of the initial weights and the batch order.
        checkpoint_every_steps: optimizer steps between checkpoints, >= 1 (unit: optimizer steps).
        checkpoint_root: checkpoint folder (shared storage on a cluster); empty: <heteroflow home>/checkpoints; the folder used is <root>/<fingerprint of data, parameters and model> (not the device: a fallback resumes there).
        model_factory: model factory package.module:function returning a torch.nn.Module; empty: the built-in MLP (the default pipeline's parameter 'model').
        model_args: JSON object of keyword arguments for the model factory (besides in_features, num_classes, input_shape, hidden_units, passed when it takes them).
        loss: loss factory package.module:function() returning loss(output, target); empty: cross-entropy.
        optimizer: a built-in optimizer, adam, adamw or sgd (SGD with momentum 0.9), or a factory package.module:function(params, lr) returning a torch optimizer; empty: Adam.
        train_function: your training function package.module:function(ctx) (heteroflow.components.training.loop.TrainContext); empty: the built-in classifier loop.
        dataset_factory: package.module:function(split) returning a torch Dataset of (x, y); empty: the preprocessed data.
        precision: autocast: auto (bf16 where the device supports it, else fp16 with a GradScaler; fp32 on the CPU), fp32, bf16 or fp16.
        loader_workers: DataLoader worker processes; -1: auto (none for in-memory tables; for files to decode, chosen from the first batches' load and compute times and the cores, at most 4 and one per core, printed) (unit: processes).
        deterministic: torch.use_deterministic_algorithms for bit-identical reruns (slower on GPUs).
        batch_sizes: per-device batch sizes on a candidate with several devices, comma-separated, one per worker in rank order (e.g. '64,32' when the second device holds half as much); their sum is the optimizer step's batch and replaces batch_size, each worker's loss is weighted by its share so one update is one process's gradient over that union batch (a candidate with another number of workers splits it evenly); the learning rate applies to the union batch (scale it with it: Goyal et al. 2017, arXiv:1706.02677, linear scaling rule); empty: batch_size split evenly (unit: samples).
        training_profile: path of a training profile (JSON from heteroflow profile; the plan step's parameter of the same name): on a mixed candidate its step times per device model set the first shares of the global batch; empty or timing no model of some kind: the first steps measure them.
        compile_model: torch.compile the model (in place: checkpoints and the saved model keep their keys) where torch.compile can run; its compile time counts in the training's time, so it pays only over many steps of a large enough model: off by default (benchmarks/training.py measures it).
        progress: called after every epoch with ``epoch``, ``epochs``, ``step``, ``total_steps``, ``loss``,
            ``validation_accuracy`` and ``samples_per_second`` (the engine shows them live).

    Sets torch's intra-op thread count (process-wide) to the CPU cores this process may use
    (:func:`~heteroflow.components.data.preprocess.available_cpus`: affinity and cgroup quota) less one per DataLoader
    worker process (at least 1; at most ``OMP_NUM_THREADS`` when set: :func:`~heteroflow.components.training.batches.train_threads`).

    Returns:
        A :class:`TrainResult`.

    Raises:
        InvalidParameter: a parameter out of range, a factory that cannot be imported or returns the wrong type.
        DeviceUnavailable: the device is absent (fall back to another candidate).
        CheckpointError: the checkpoint found cannot be loaded or belongs to another model.
        NonFiniteError: a training loss is NaN or infinite (names the epoch and step).
        DatasetError: ``dataset_dir`` is not preprocess output.
    """
    import torch  # imported before the clock starts: seconds measure the training, not the import

    from heteroflow.components.training.batches import train_threads
    from heteroflow.components.training.loop import auto_workers, resolve_precision

    started = time.perf_counter()
    check_train_params(locals())
    # Everything that can be wrong with the input is checked before the device is touched.
    splits, spec, params, ckpt_dir = _plan(dataset_dir, locals())
    spec.build()  # a factory that does not return a Module fails here, before any device time
    loop = _training_function(train_function)
    make_folder(ckpt_dir.parent, param="checkpoint_root", value=checkpoint_root, valid=CHECKPOINT_ROOT_VALID)

    if getattr(resources, "replicas", None):  # a mixed candidate: replicas of several kinds in one job (#29)
        from heteroflow.components.training.mixed_step import train_mixed

        return train_mixed(resources, dataset_dir=dataset_dir, model_dir=model_dir, values=_given(locals()), splits=splits,
                           spec=spec, params=params, ckpt_dir=ckpt_dir, started=started, progress=progress)
    role = None
    if resources is not None and resources.nodes > 1:
        from heteroflow.components.training.distributed import node_role

        role = node_role()
        if role is None:  # this task launches the multi-node job and waits for it (heteroflow.components.training.trainjob)
            return _train_as_job(resources, dataset_dir=dataset_dir, model_dir=model_dir, values=_given(locals()),
                                 key=ckpt_dir.name, started=started, progress=progress)
    dev = resolve_device(device)
    kind = resources.kind if resources is not None else (_kind_of_type(dev.type) or dev.type)
    kind = getattr(kind, "value", kind)
    accel = resources.accelerator_spec if resources is not None else None
    bf16 = getattr(accel, "bf16", None)
    dtype = resolve_precision(precision, dev, bf16=bf16)
    world = distributed_workers(resources)
    workers = auto_workers(splits.in_memory, loader_workers)
    # torch sizes its thread pool by the host's cores, not by the container's CPU limit: use what we are given,
    # less one core per DataLoader worker (the training's OpenMP threads spin between operations and took the
    # cores the workers decode on: 2 workers on 2 cores went from 0.67x to 1.0x of no workers, benchmarks/training.py)
    torch.set_num_threads(train_threads(workers))  # OMP_NUM_THREADS, when set, caps it

    say = _sayer(progress)
    sizes = parse_batch_sizes(batch_sizes)
    union = sum(sizes) or batch_size  # samples per optimizer step
    workers_total = world * (role.nodes if role is not None else 1)
    if sizes and len(sizes) != workers_total:
        say(f"train: batch_sizes lists {len(sizes)} size(s) for {workers_total} worker(s) on this candidate: each optimizer "
            f"step takes the union batch of {union} samples, split evenly")
    previous_determinism = torch.are_deterministic_algorithms_enabled()
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    # the nodes of a multi-node job share one checkpoint folder: node 0 holds its lock (the others would wait for
    # it while it waits for them at the rendezvous)
    lock = _exclusive(ckpt_dir, say=say) if role is None or role.node_rank == 0 else contextlib.nullcontext()
    try:
        with lock as held:
            waited = {"waited_for": held.waited_for or "", "waited_seconds": held.waited_seconds} if held else {}
            reused = _take_finished_model(held, model_dir, say=say)
            code = code_fingerprint([params["model"].get("factory"), params.get("dataset_factory"), params.get("train_function")])
            if reused is None and held is not None:  # an earlier run finished it, then stopped or failed after train
                reused = _take_kept_model(ckpt_dir, model_dir, say=say, code=code)
            if reused is not None:  # the identical training we waited for finished: its model is ours (#28 item 10)
                return _reused_result(reused, ckpt_dir, waited=waited, started=started, device=str(dev), device_kind=str(kind),
                                      accelerator=str(getattr(resources, "accelerator", None) or ""))
            amp_name = str(dtype).replace("torch.", "") if dtype is not None else "float32"
            total_steps = epochs * math.ceil(len(splits.train) / union)
            ctx = _make_context(splits, spec, params, ckpt_dir, locals(), device=dev, kind=str(kind), dtype=dtype,
                                loader_workers=workers, progress=progress)
            loop_started = time.perf_counter()
            if world > 1 or role is not None:
                # one worker process per device (of this node, in a multi-node job); the first worker's model,
                # history and counters come back (the replicas are equal)
                raw = _train_on_workers(world, dev, dataset_dir=dataset_dir, values=_given(locals()), kind=str(kind),
                                        bf16=bf16, deterministic=deterministic, ctx=ctx, progress=progress, role=role)
                loop_seconds = ctx.loop_seconds or (time.perf_counter() - loop_started)
            else:
                try:
                    trained = loop(ctx)
                except BaseException:
                    ctx.stop_loaders()  # the stopped batch's DataLoader workers, held by the exception's frames
                    raise
                loop_seconds = ctx.loop_seconds or (time.perf_counter() - loop_started)
                raw = _trained_module(trained, ctx, train_function)
            val_acc = ctx.evaluate_accuracy(raw)
            last = ctx.history[-1] if ctx.history else {}
            steps_done = int(last.get("step", total_steps))
            out = _write_model(model_dir, raw, dataset_dir=dataset_dir, splits=splits, spec=spec, params=params,
                               steps=steps_done, precision=amp_name, device=str(dev), device_kind=str(kind))
            final_loss = last.get("loss")
            result = TrainResult(
                model_dir=out,
                device=str(dev),
                steps=steps_done,
                resumed_from_step=ctx.checkpoint.resumed_from_step,
                checkpoints_written=ctx.checkpoint.written,
                samples_per_second=ctx.samples_seen / loop_seconds if loop_seconds > 0 and ctx.samples_seen else 0.0,
                final_loss=float(final_loss) if final_loss is not None else float("nan"),
                validation_accuracy=val_acc,
                seconds=time.perf_counter() - started,
                history=tuple(ctx.history),
                precision=amp_name,
                model=spec.to_dict(),
                device_kind=str(kind),
                num_workers=ctx.loader_workers,
                processes=workers_total,
                batch_size=union,
                accelerator=str(getattr(resources, "accelerator", None) or ""),
                amp_skipped_steps=ctx.amp_skipped_steps,
                batch_sizes=sizes,
                loop_seconds=loop_seconds,
                **waited,
            )
            if held is not None:
                if os.environ.get(RUN_DIR_ENV):  # a run that records itself: kept until it (or a rerun) succeeds
                    try:
                        keep_finished(ckpt_dir, out, {**dataclasses.asdict(result), "kept_checkpoint": str(ckpt_dir), "code": code})
                        result = dataclasses.replace(result, kept_checkpoint=str(ckpt_dir))
                    except OSError as exc:
                        say(f"train: could not keep the finished model in {ckpt_dir} ({exc.strerror or exc}); a rerun "
                            "after a stop past train trains again")
                # for an identical training waiting on this lock: it takes this model instead of training again;
                # the folder goes while the lock is held (a waiter then finds these facts, never a half-removed folder)
                held.finish({**dataclasses.asdict(result), "model_dir": str(out)})
                if not result.kept_checkpoint:
                    shutil.rmtree(ckpt_dir, ignore_errors=True)
    finally:
        if deterministic:
            torch.use_deterministic_algorithms(previous_determinism)
    return result


def _reused_result(reused: dict[str, Any], ckpt_dir: Path, *, waited: dict[str, Any], started: float,
                   **where: Any) -> TrainResult:
    """The :class:`TrainResult` of a training not run again: ``reused`` is what :func:`_take_finished_model` or
    :func:`_take_kept_model` returned (its model already copied into this call's folder). ``where`` gives this
    call's ``device``, ``device_kind`` and ``accelerator`` where they differ from the finished training's. The
    checkpoint folder goes unless it keeps the model for this run (``kept_checkpoint``: released when the run
    succeeds, :func:`~heteroflow.components.training.checkpoint_lock.release_kept`)."""
    if not reused.get("kept_checkpoint"):
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    names = {f.name for f in dataclasses.fields(TrainResult)}
    return TrainResult(**{**{k: v for k, v in reused.items() if k in names}, **waited, **where, "checkpoints_written": 0,
                          "resumed_from_step": int(reused.get("steps") or 0), "samples_per_second": 0.0,
                          "history": tuple(reused.get("history") or ()), "seconds": time.perf_counter() - started})


def _sayer(progress: Callable[..., None] | None) -> Callable[[str], None]:
    """Print a line of train's to stderr (the step's log) and show it live in the steps table while it waits."""

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        if progress is not None:
            progress(waiting=line.removeprefix("train: "))

    return say


def _train_as_job(resources: Resources, *, dataset_dir: str | os.PathLike[str], model_dir: str | os.PathLike[str],
                  values: dict[str, Any], key: str, started: float, progress: Callable[..., None] | None) -> TrainResult:
    """A multi-node candidate: submit the training job, wait, and return node 0's result (its model copied into
    ``model_dir``). Raises what :func:`heteroflow.components.training.trainjob.run_training_job` raises."""
    from heteroflow.components.training.trainjob import run_training_job

    facts = run_training_job(resources, call="train", dataset_dir=dataset_dir, model_dir=model_dir, values=values,
                             key=key, say=_sayer(progress))
    return TrainResult(
        model_dir=Path(model_dir),
        device=str(facts.get("device", "")),
        steps=int(facts.get("steps", 0)),
        resumed_from_step=int(facts.get("resumed_from_step", 0)),
        checkpoints_written=int(facts.get("checkpoints_written", 0)),
        samples_per_second=float(facts.get("samples_per_second", 0.0)),
        final_loss=float(facts.get("final_loss", float("nan"))),
        validation_accuracy=facts.get("validation_accuracy"),
        seconds=time.perf_counter() - started,
        history=tuple(facts.get("history") or ()),
        precision=str(facts.get("precision", "float32")),
        model={"factory": facts.get("model"), "args": facts.get("model_args")},
        device_kind=str(facts.get("device_kind", getattr(resources.kind, "value", resources.kind))),
        num_workers=int(facts.get("num_workers", 0)),
        processes=int(facts.get("processes", resources.nodes)),
        batch_size=int(facts.get("batch_size", 0)),
        amp_skipped_steps=int(facts.get("amp_skipped_steps", 0)),
    )


def _given(values: Mapping[str, Any]) -> dict[str, Any]:
    """train's step parameters (:data:`TRAIN`'s, taken from its signature) out of its ``locals()``: picklable,
    for the workers."""
    return {name: values[name] for name in TRAIN.param_names}

_PROGRESS_FILE_ENV = "HETEROFLOW_TRAIN_PROGRESS_FILE"


def _train_worker(dctx: Any, *, dataset_dir: str, values: dict[str, Any], kind: str, bf16: bool | None) -> dict[str, Any] | None:
    """One worker of a multi-device train (run by :func:`~heteroflow.components.training.distributed.launch`): the same
    context and training function as in one process, on this rank's device and share of each batch."""
    import torch
    import torch.distributed as dist

    from heteroflow.cache.atomic import atomic_write_bytes
    from heteroflow.components.training.loop import _to_cpu, auto_workers, resolve_precision

    splits, spec, params, ckpt_dir = _plan(dataset_dir, values)
    device = dctx.device
    dtype = resolve_precision(values["precision"], device, bf16=bf16)
    progress_file = os.environ.get(_PROGRESS_FILE_ENV)

    def progress(**facts: Any) -> None:  # rank 0's live progress, read back by the launching process
        if progress_file:
            atomic_write_bytes(progress_file, json.dumps(facts, default=str).encode())

    ctx = _make_context(splits, spec, params, ckpt_dir, values, device=device, kind=kind, dtype=dtype,
                        loader_workers=auto_workers(splits.in_memory, values["loader_workers"]),
                        progress=progress if dctx.rank == 0 else None, distributed=dctx)
    loop = _training_function(values["train_function"])
    started = time.perf_counter()
    raw = _trained_module(loop(ctx), ctx, values["train_function"])
    seconds = ctx.loop_seconds or (time.perf_counter() - started)
    samples = torch.tensor([float(ctx.samples_seen)], dtype=torch.float64)
    dist.all_reduce(samples)  # samples/s of the whole candidate, every rank's share
    if dctx.local_rank != 0:  # each node's first worker answers (DDP keeps the replicas equal)
        return None
    return {"model": _to_cpu(raw.state_dict()), "history": list(ctx.history), "samples_seen": int(samples.item()),
            "loop_seconds": seconds, "resumed_from_step": ctx.checkpoint.resumed_from_step,
            "checkpoints_written": ctx.checkpoint.written, "amp_skipped_steps": ctx.amp_skipped_steps}


def _node_arguments(role: Any) -> dict[str, Any]:
    """:func:`~heteroflow.components.training.distributed.launch`'s node arguments for a pod of a multi-node job."""
    if role is None:
        return {}
    return {"nodes": role.nodes, "node_rank": role.node_rank, "master_addr": role.master_addr, "master_port": role.master_port}


def _train_on_workers(world: int, device: torch.device, *, dataset_dir: str | os.PathLike[str], values: dict[str, Any],
                      kind: str, bf16: bool | None, deterministic: bool, ctx: Any,
                      progress: Callable[..., None] | None, role: Any = None) -> torch.nn.Module:
    """Train on ``world`` devices, one worker process each, and return rank 0's model (on ``device``, plain).

    Rank 0's history, samples, loop time and checkpoint counters are copied into ``ctx`` (this process's context,
    which evaluates and writes the model). Its live progress is relayed to ``progress`` every 0.5 s.

    Raises:
        whatever :func:`heteroflow.components.training.distributed.launch` raises: a worker's own exception (classified as
        in one process: an injected device fault, a CUDA error), ``WorkerKilled`` (transient), ``WorkerError``.
    """
    import tempfile
    import threading

    from heteroflow.components.training.distributed import launch

    with tempfile.TemporaryDirectory(prefix="heteroflow-train-") as tmp:
        progress_file = Path(tmp, "progress.json")
        stop = threading.Event()

        def relay() -> None:
            seen = None
            while not stop.wait(0.5):
                with contextlib.suppress(OSError, ValueError):
                    text = progress_file.read_text(encoding="utf-8")
                    if text != seen and progress is not None:
                        seen = text
                        progress(**json.loads(text), workers=world)

        watcher = threading.Thread(target=relay, daemon=True)
        watcher.start()
        try:
            results = launch(_train_worker, world, kwargs={"dataset_dir": str(dataset_dir), "values": values, "kind": kind,
                                                          "bf16": bf16},
                             device_type=device.type, deterministic=deterministic,
                             env={_PROGRESS_FILE_ENV: str(progress_file)}, **_node_arguments(role))
        finally:
            stop.set()
            watcher.join()
    out = results[0]
    ctx.history[:] = out["history"]
    ctx.samples_seen = out["samples_seen"]
    ctx.loop_seconds = out["loop_seconds"]
    ctx.checkpoint.resumed_from_step = out["resumed_from_step"]
    ctx.checkpoint.written = out["checkpoints_written"]
    ctx.checkpoint.counters["amp_skipped_steps"] = out.get("amp_skipped_steps", 0)
    model = ctx.model_spec.build()
    model.load_state_dict(out["model"])
    return model.to(device)


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

def _trained_on_factory(model_dir: Any) -> str | None:
    """The ``dataset_factory`` a model in ``model_dir`` trained on (its ``model.json``'s data), else None."""
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        data = json.loads(Path(model_dir, MODEL_CONFIG).read_text(encoding="utf-8")).get("data") or {}
        return data.get("dataset_factory") or None
    return None


def _train_facts(result: Any) -> dict[str, Any]:
    factory = _trained_on_factory(result.model_dir)
    return {
        "device": result.device,
        "device_kind": result.device_kind,
        **({"accelerator": result.accelerator} if result.accelerator else {}),
        "precision": result.precision,
        "model": result.model.get("factory"),
        "model_args": result.model.get("args"),
        "num_workers": result.num_workers,
        "processes": result.processes,
        "batch_size": result.batch_size,
        "history": list(result.history),
        "steps": result.steps,
        "resumed_from_step": result.resumed_from_step,
        "checkpoints_written": result.checkpoints_written,
        "samples_per_second": round(result.samples_per_second, 1),
        "final_loss": result.final_loss,
        "validation_accuracy": result.validation_accuracy,
        "seconds": result.seconds,
        **({"waited_for": result.waited_for, "waited_seconds": round(result.waited_seconds, 1)} if result.waited_for else {}),
        **({"reused_model": result.reused_model} if result.reused_model else {}),
        **({"kept_checkpoint": result.kept_checkpoint} if result.kept_checkpoint else {}),
        **({"amp_skipped_steps": result.amp_skipped_steps} if result.precision == "float16" else {}),
        **({"mixed": dict(result.mixed)} if result.mixed else {}),
        **({"dataset_factory": factory} if factory else {}),
        **({"batch_sizes": list(result.batch_sizes)} if result.batch_sizes else {}),
        **({"loop_seconds": round(result.loop_seconds, 2)} if result.loop_seconds else {}),
    }


def _train_metrics(facts: dict[str, Any]) -> dict[str, Any]:
    keys = ("samples_per_second", "final_loss", "validation_accuracy", "steps", "resumed_from_step")
    out = {k: facts[k] for k in keys if facts.get(k) is not None}
    if facts.get("mixed"):  # per replica of a mixed job (#29): share, throughput, busy fraction
        from heteroflow.components.training.mixed_step import mixed_metrics

        out.update(mixed_metrics(facts["mixed"]))
    return out


def _where(f: dict[str, Any]) -> str:
    """Where train ran, worded as the steps table words it (one source: a simulated kind's torch device is the CPU)."""
    from heteroflow.components.core.telemetry import where_ran
    from heteroflow.components.devices import has_devices, is_host_device_type

    kind, device = f.get("device_kind") or "", str(f.get("device") or "")
    simulated = bool(kind) and has_devices(str(kind)) and is_host_device_type(device.split(":")[0])
    return where_ran(kind or device, device, accelerator=f.get("accelerator"), simulated=simulated)


def _loss(value: float) -> str:
    """A loss for the summary: 4 decimals, or 3 significant digits below 0.001 (``3.21e-05``, not ``0.0000``)."""
    return f"{value:.4f}" if not 0 < abs(value) < 1e-3 else f"{value:.3g}"


def _train_summary(f: dict[str, Any]) -> list[str]:
    va = f.get("validation_accuracy")
    resumed = f" (resumed from step {f['resumed_from_step']})" if f.get("resumed_from_step") else ""
    precision = f", {f['precision']}" if f.get("precision") not in (None, "float32") else ""
    if f.get("amp_skipped_steps"):  # pytorch/pytorch#55585: the scheduler did not step on them
        precision += f" ({f['amp_skipped_steps']} steps skipped by the GradScaler: inf/NaN gradients)"
    waited = [f"train: waited {f.get('waited_seconds', 0.0):.1f} s for {f['waited_for']}, which ran the same training"] if f.get("waited_for") else []
    if f.get("reused_model"):  # that training finished: its model is this run's (#28 item 10)
        whose = "it" if f.get("waited_for") else "an earlier run of this training"  # kept_finished: a rerun after a stop
        return [*waited, f"train: took the model {whose} finished ({f['steps']} steps, {f['reused_model']}), not trained again; "
                f"final loss {_loss(f['final_loss'])}" + (f", validation accuracy {va:.4f}" if va is not None else "")]
    mixed: list[str] = []
    if f.get("mixed"):
        from heteroflow.components.training.mixed_step import mixed_facts_lines

        mixed = mixed_facts_lines(f["mixed"])
    # a dataset_factory's samples, not the data set prewarm and preprocess went over (their lines say that one)
    data = [f"train: trained on dataset_factory {f['dataset_factory']}'s samples, not on the preprocessed data set"] \
        if f.get("dataset_factory") else []
    workers = f.get("processes") or 1  # a candidate with several devices: one worker process per device
    given = f.get("batch_sizes") or []
    if given and len(given) != workers:  # batch_sizes was for another candidate (this one is a fallback)
        union = f.get("batch_size") or sum(given)
        went = f"the 1 worker took each step's union batch of {union} samples" if workers == 1 else \
            f"each step's union batch of {union} samples was split evenly over the {workers} workers"
        data.append(f"train: batch_sizes {','.join(map(str, given))} lists {len(given)} sizes, for another candidate "
                    f"(this one has {workers} worker process{'es' if workers > 1 else ''}): {went}")
    together = f", {workers} worker processes (one per device; {f['batch_size']} samples per step together)" \
        if workers > 1 and not f.get("mixed") and f.get("batch_size") else (f", {workers} worker processes (one per device)" if workers > 1 and not f.get("mixed") else "")
    return [*waited, *mixed, *data,
        f"train: {f['steps']} steps on {_where(f)}{together}{precision}{resumed} in {f['seconds']:.1f} s "
        f"({f['samples_per_second']:.0f} samples/s in the training loop"
        + (f", its {f['loop_seconds']:.1f} s" if f.get("loop_seconds") else "") + f"), final loss {_loss(f['final_loss'])}"
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
    resources_param="resources",
    progress_param="progress",
    check=check_train_params,
    facts=_train_facts,
    summary=_train_summary,
    ref="heteroflow.components.training.step:TRAIN",
)
