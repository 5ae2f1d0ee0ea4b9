"""Profile a training: N steps under ``torch.profiler``, written as a JSON profile for placement.

:func:`profile_training` builds the same model, optimizer, data loader and autocast as :func:`train
<heteroflow.components.training.step.train>`, runs ``warmup_steps`` steps, times ``steps`` steps without the profiler
(samples/s), then runs ``steps`` more under ``torch.profiler.profile`` and writes:

==========================  ===================================================================================
key                         meaning
==========================  ===================================================================================
``samples_per_second``      training throughput of the timed (unprofiled) steps, samples / s
``step_seconds``            mean wall time of one timed step, seconds
``operators``               per operator (``aten::addmm``...): ``self_seconds`` (self time over the profiled
                            steps, on the device when it has a timeline, else the CPU), ``share`` of all
                            operators' self time (0-1), ``calls``; the 30 largest, largest first
``key_operators``           the operators with ``share >= 0.10`` (:data:`KEY_SHARE`)
``peak_memory_bytes``       device memory high-water mark (``torch.cuda.max_memory_allocated``) on a GPU; the
                            process's peak resident set size (``getrusage`` ``ru_maxrss``) on the CPU
``peak_memory_of``          ``device`` or ``host_rss``
``loader_workers``          DataLoader worker processes of the profiled steps: train's count (``loader_workers``
                            -1 on files: chosen as train chooses it, from the warm-up batches' load and compute
                            times, :func:`~heteroflow.components.training.batches.choose_workers`)
``torch_threads``           torch's intra-op threads: train's (the cores less the most workers it may use, at
                            most ``OMP_NUM_THREADS``: :func:`~heteroflow.components.training.batches.train_threads`)
==========================  ===================================================================================

Shares are of operator self time (PyTorch's ``key_averages()`` ``self_cpu_time_total`` /
``self_device_time_total``), the measure torch.profiler's own tables sort by.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from heteroflow.cache.atomic import atomic_write_bytes
from heteroflow.components.errors import InvalidParameter

__all__ = ["KEY_SHARE", "check_profile_params", "profile_training", "read_profile"]

KEY_SHARE = 0.10
"""An operator is a key operator when it takes at least this share of the profiled operators' self time."""
_TOP = 30


def check_profile_params(*, steps: int = 20, warmup_steps: int = 3, **train_params: Any) -> None:
    """Check :func:`profile_training`'s parameters (the checks it makes first; ``heteroflow profile`` makes them
    before it prewarms and preprocesses the data set). Imports no torch.

    Args:
        steps / warmup_steps / train_params: as :func:`profile_training`.

    Raises:
        InvalidParameter: every problem, each named with what is valid (several in one message): ``steps`` or
            ``warmup_steps`` out of range, a name that is not one of train's, train's own checks
            (:func:`~heteroflow.components.training.step.check_train_params`).
    """
    from heteroflow.components.core.step import with_defaults
    from heteroflow.components.errors import Problems
    from heteroflow.components.training.step import TRAIN, check_train_params, train

    problems = Problems()
    for name, value, low in (("steps", steps, 1), ("warmup_steps", warmup_steps, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.add(InvalidParameter(f"{name}={value!r} is out of range; valid: an integer >= {low}"))
    unknown = sorted(set(train_params) - set(TRAIN.param_names))
    if unknown:
        problems.add(InvalidParameter(f"{', '.join(unknown)}: not a parameter of train; valid: {', '.join(TRAIN.param_names)}"))
    with problems.check():
        check_train_params(with_defaults(train, train_params))
    problems.raise_all("the profile's parameters")


def profile_training(
    dataset_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    *,
    steps: int = 20,
    warmup_steps: int = 3,
    device: str = "cpu",
    **train_params: Any,
) -> dict[str, Any]:
    """Profile ``steps`` training steps and write the JSON profile (see the module docstring) to ``output_path``.

    Args:
        dataset_dir: preprocess output.
        output_path: the JSON file to write (atomically).
        steps: steps timed, and steps profiled, >= 1 (unit: optimizer steps).
        warmup_steps: steps run first and not measured, >= 0 (unit: optimizer steps).
        device: torch device string, as :func:`heteroflow.components.training.step.train`'s.
        train_params: :func:`heteroflow.components.training.step.train`'s parameters, with its defaults for those not
            given and its checks. A step is shaped by the batch size, the model and its arguments, the data set
            factory, the precision, the loaders and the seed; the others (the number of epochs, checkpoints...)
            have no effect on a profile.

    Returns:
        The profile (the dict written).

    Raises:
        InvalidParameter: a parameter out of range or not one of train's, or a factory that cannot be imported
            (:func:`check_profile_params`: every one, in one message).
        DeviceUnavailable: the device is absent.
    """
    import statistics

    import torch

    from heteroflow.components.data.preprocess import available_cpus
    from heteroflow.components.data.readers import open_splits
    from heteroflow.components.core.step import with_defaults
    from heteroflow.components.training.batches import (
        PROBE_BATCHES,
        auto_workers,
        batch_bytes,
        choose_workers,
        make_loader,
        train_threads,
    )
    from heteroflow.components.training.device import resolve_device
    from heteroflow.components.training.params import model_spec, union_batch_size
    from heteroflow.components.training.precision import make_scaler, resolve_precision
    from heteroflow.components.training.step import train

    check_profile_params(steps=steps, warmup_steps=warmup_steps, **train_params)
    v = with_defaults(train, train_params)
    batch_size, learning_rate, seed = union_batch_size(v), v["learning_rate"], v["seed"]
    precision, loader_workers = v["precision"], v["loader_workers"]
    splits = open_splits(dataset_dir, dataset_factory=v["dataset_factory"])
    spec = model_spec(splits, v)  # the model train builds
    model_cpu = spec.build()
    dev = resolve_device(device)
    dtype = resolve_precision(precision, dev)
    scaler = make_scaler(dtype, dev)
    torch.manual_seed(seed)
    model = model_cpu.to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=learning_rate)
    # the workers and threads train uses: at most `most` workers, the threads sized by it (train.step), and with
    # loader_workers=-1 on files the count chosen from the first batches' times (TrainContext.batches)
    most = auto_workers(splits.in_memory, loader_workers)
    cpus = available_cpus()
    probing = loader_workers == -1 and not splits.in_memory and most > 0
    workers = 0 if probing else most
    threads_before, threads = torch.get_num_threads(), train_threads(most)
    autocast = (lambda: torch.autocast(device_type=dev.type, dtype=dtype)) if dtype is not None else None

    def batches(n: int) -> Any:
        loader = make_loader(splits.train, batch_size=batch_size, seed=seed, shuffle=True, num_workers=n, device=dev)
        epoch = 0
        while True:
            loader.batch_sampler.set_epoch(epoch)
            for x, y in loader:
                yield x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            epoch += 1

    stream = batches(workers)

    def one_step() -> int:
        return compute(*next(stream))

    def compute(x: Any, y: Any) -> int:
        if autocast is not None:
            with autocast():
                loss = torch.nn.functional.cross_entropy(model(x), y)
        else:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return len(y)

    from heteroflow.components.devices import for_torch_device_type

    kind = for_torch_device_type(dev.type)

    def sync() -> None:
        if kind is not None:
            kind.synchronize(dev)

    torch.set_num_threads(threads)
    try:
        if probing:  # warm-up batches loaded in this process and timed, each with the step that uses it
            times = []
            for _ in range(max(warmup_steps, PROBE_BATCHES)):
                t0 = time.perf_counter()
                batch = next(stream)
                t1 = time.perf_counter()
                compute(*batch)
                sync()
                times.append((t1 - t0, time.perf_counter() - t1, batch_bytes(batch)))
            timed_batches = times[1:] or times  # the first pays start-up costs
            workers = choose_workers(statistics.median(t[0] for t in timed_batches),
                                     statistics.median(t[1] for t in timed_batches), cpus=cpus, most=most,
                                     nbytes=max(t[2] for t in timed_batches))
            if workers:
                stream = batches(workers)  # its start-up in warm-up steps, not in the timed ones
        for _ in range(warmup_steps if not probing or workers else 0):
            one_step()
        sync()
        measured = _measure(steps=steps, one_step=one_step, sync=sync, kind=kind, dev=dev)
    finally:
        torch.set_num_threads(threads_before)
    result = {
        "format": 1,
        "device": str(dev),
        "precision": str(dtype).replace("torch.", "") if dtype is not None else "float32",
        "model": spec.to_dict(),
        "batch_size": batch_size,
        "steps": steps,
        **measured,
        "loader_workers": workers,
        "torch_threads": threads,
        "torch": torch.__version__,
    }
    out = Path(output_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, json.dumps(result, indent=2).encode())
    return result


@contextlib.contextmanager
def _without_tracepoint_lines() -> Iterator[None]:
    """Leave out of stderr the lines torch's profiler (Kineto) writes there itself as it starts and stops
    (``USDT:2026-12-05 03:37:06 11474:11474 SyncActivityProfilerHandler.cpp:52] profiler_start``: its tracepoints'
    log, which no setting of ``KINETO_LOG_LEVEL`` silences). File descriptor 2 goes to a temporary file meanwhile;
    every other line is written back to stderr after, in order."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True) if not line.startswith(b"USDT:")]
            if kept:
                os.write(2, b"".join(kept))


def _measure(*, steps: int, one_step: Any, sync: Any, kind: Any, dev: Any) -> dict[str, Any]:
    """Time ``steps`` steps, then profile ``steps`` more: the profile's measured keys."""
    from torch.profiler import ProfilerActivity, profile

    if kind is not None:
        kind.reset_peak_memory(dev)
    t0 = time.perf_counter()
    samples = sum(one_step() for _ in range(steps))
    sync()
    timed = time.perf_counter() - t0

    device_activity = kind.profiler_activity if kind is not None else None  # the host kind's: None
    activities = [ProfilerActivity.CPU] + ([getattr(ProfilerActivity, device_activity)] if device_activity else [])
    with _without_tracepoint_lines(), profile(activities=activities) as prof:
        for _ in range(steps):
            one_step()
        sync()
    on_device = device_activity is not None
    rows = []
    for evt in prof.key_averages():
        self_us = float(getattr(evt, "self_device_time_total", 0.0) if on_device else evt.self_cpu_time_total)
        if self_us > 0:
            rows.append((evt.key, self_us, int(evt.count)))
    total_us = sum(r[1] for r in rows) or 1.0
    rows.sort(key=lambda r: -r[1])
    operators = [{"name": k, "self_seconds": us / 1e6, "share": round(us / total_us, 4), "calls": n} for k, us, n in rows[:_TOP]]
    device_peak = kind.peak_memory_bytes(dev) if kind is not None else None
    if device_peak is not None:
        peak, peak_of = device_peak, "device"
    else:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak, peak_of = int(rss if sys.platform == "darwin" else rss * 1024), "host_rss"
    return {
        "samples_per_second": samples / timed if timed > 0 else 0.0,
        "step_seconds": timed / steps,
        "operators": operators,
        "key_operators": [o["name"] for o in operators if o["share"] >= KEY_SHARE],
        "time_measured_on": "device" if on_device else "cpu",
        "peak_memory_bytes": peak,
        "peak_memory_of": peak_of,
    }


def read_profile(path: str | os.PathLike[str], *, field: str = "profile") -> dict[str, Any]:
    """Read a profile :func:`profile_training` wrote.

    Raises:
        InvalidParameter: the file is missing, not JSON, or not a heteroflow profile (names ``field``).
    """
    try:
        data = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidParameter(f"{field}={str(path)!r} does not exist; write one with `heteroflow profile`") from None
    except (OSError, ValueError) as exc:
        raise InvalidParameter(f"{field}={str(path)!r} is not a JSON profile ({exc})") from None
    if not isinstance(data, dict) or "operators" not in data or "samples_per_second" not in data:
        raise InvalidParameter(f"{field}={str(path)!r} is not a heteroflow profile (no operators / samples_per_second)")
    return data
