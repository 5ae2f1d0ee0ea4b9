"""One training job on replicas of several device kinds at once (issue #29): the launch, the replicas' training
loop, and a kind's drop-out.

Launch (:func:`run_mixed`)
    Through torch's elastic launcher (``torch.distributed.launcher.api.elastic_launch``, what ``torchrun``
    runs), with c10d rendezvous [TE]: one elastic agent per device kind (its own process, ``nproc_per_node`` =
    that kind's replicas, ``--nnodes=1:K`` for ``K`` kinds), all joining one rendezvous whose c10d store
    (a ``TCPStore``) is hosted by the calling process, the train step's own; the agents join it with
    ``is_host=false``, so no kind's failure takes the store down. The workers use the agents' store for their
    process group (``TORCHELASTIC_USE_AGENT_STORE``). Each worker runs :func:`mixed_worker`; its kind reaches it in
    ``HETEROFLOW_MIXED_KIND``, its torch device type in ``HETEROFLOW_MIXED_DEVICE`` (``cuda``: ``cuda:<local
    rank>``, and the kind group uses the registry's backend, nccl) and a simulated speed in
    ``HETEROFLOW_MIXED_SPEED``; one torch thread each. Busy time (utilization) is compute, the simulated slow-down
    and the optimizer's step, in wall time; the simulated slow-down sleeps ``(1/speed - 1)`` times the compute's
    wall time (on a machine that other processes load, both kinds' compute stretches, and the slower kind's sleep
    with it, so the kinds keep their speed ratio in wall time). Throughput (for shares) is samples per second of
    compute over the speed, in wall time on every device (what a step waits for: on 2 quiet cores the slower CPU
    replica's compute took 18% more wall than CPU time, contending with the exchange's threads, so CPU-time shares
    of 44:20 left the faster replica waiting 1.5 s of a 7.7 s run; wall-time shares reached 46:18 and 82% / 82%
    busy). Under load wall time is noisier (measured at load average 8-13 on 2 cores: a 2:1 pair's wall-time
    shares ranged from 38:26 to 50:14, CPU-time shares from 42:22 to 44:20); the median step over a window
    (:class:`~heteroflow.components.training.shares.ShareEstimator`) damps it.
    In a pod of a cluster job (``rendezvous=``, :mod:`~heteroflow.components.training.mixed_launch`) the same launch
    starts one agent, for the pod's kind, on a store another process (the launcher) hosts; every pod's first worker
    keeps a copy of the result, and the one holding rank 0 is marked (``MixedResult.rank0``).

Training (:func:`mixed_worker`)
    :class:`~heteroflow.components.training.hierarchy.Hierarchy` groups by kind; DDP with
    :func:`~heteroflow.components.training.hierarchy.hierarchical_hook` (share-weighted, within kinds, across
    kinds between leaders, optional compression); one
    :class:`~heteroflow.components.training.shares.GlobalSampler` sliced by share, so the trajectory does not depend
    on the layout. Shares start from the step profile's throughput by kind when one is given, else equal, and are
    re-measured and rebalanced after ``warmup_steps`` steps, then every ``rebalance_every_steps`` steps or
    ``rebalance_every_minutes`` minutes, whichever comes first (KAITIAN rebalances every 10 minutes), and again
    ``warmup_steps`` steps after a change (until a rebalance keeps the shares; after one the measurements' noise
    held back, twice the last gap), by
    :class:`~heteroflow.components.training.shares.Rebalancer`: shares that equalize each replica's measured time
    per step before its gradients are all out (sampling, compute over the speed, the hook's own calls), from a
    line ``t(b) = a + c * b`` per replica through its measurements (at a small share a replica's time per sample
    is higher: shares proportional to throughput over-assign the slower kind), changed only when the saving is
    above the measurements' noise and pays for the new shapes' set-up. The reported throughput is
    :class:`~heteroflow.components.training.shares.ShareEstimator`'s (median step, smoothed).
    No collective runs per step besides the gradient exchange and, once half the steps the minutes take at the
    last measurement's pace have passed, rank 0's asynchronous one-value broadcast of "due" (overlapping the
    optimizer's step; steps more than twice as slow as measured can trigger late, at most by the steps' rule): each rank keeps its own
    step timings (gathered when shares are measured) and losses (gathered once, after the loop). Every
    ``checkpoint_every_steps`` steps rank 0 writes a checkpoint (atomically: model, optimizer, step, shares), and
    with top-k each kind's leader writes that kind's residual and velocity beside it (``mixed-topk-<kind>.pt``,
    used on a resume only when it holds the checkpoint's step).
    :attr:`MixedResult.phase_seconds` gives each replica's loop wall time by phase: ``sample`` (slicing the global
    batch, collating), ``compute`` (forward and backward), ``slowdown`` (the simulated kind's sleep),
    ``exchange_kind`` / ``exchange_cross`` (in the hook: within the kind, across kinds, waiting for the peers
    included), ``exchange_wait`` (DDP waiting for asynchronous exchanges after backward), ``optimizer``,
    ``rebalance`` (the "due" flag, gathering timings, new shares), ``checkpoint``, ``other``.

A kind drops out
    A replica whose step fails with a *device-class* failure
    (:func:`heteroflow.components.core.failures.classify`; injected on the CPU with
    ``HETEROFLOW_INJECT_FAULT=train@npu=device:after_steps=N``) writes a drop record and waits. The launching
    process then kills that kind's agent and workers with SIGKILL: an agent that exits normally closes the
    rendezvous for everyone (pytorch/pytorch#67616), one killed by a signal does not. The other kinds' workers
    lose their peer, their agents restart them, the rendezvous re-forms with the remaining agents (``min_nodes``
    1), and the new workers resume from the last checkpoint with shares recomputed over the replicas left. The
    result says which kind dropped, at which step, and from which step the run resumed. When every kind has
    dropped, :func:`run_mixed` raises the first kind's failure (a device failure: the train step's fallback to
    the next candidate takes over). Any other failure of a worker fails the job with that exception.

Sources: [TE] torchelastic, https://pytorch.org/docs/stable/elastic/run.html ("--rdzv-backend=c10d",
"is_host") and https://pytorch.org/docs/stable/elastic/agent.html; pytorch/pytorch#67616 (an agent that exits
closes the rendezvous).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.replicas import JOB_DEFAULTS
from heteroflow.components.training.step import TRAIN

__all__ = ["KIND_ENV", "MixedJob", "MixedResult", "ReplicaGroup", "SPEED_ENV", "mixed_worker", "run_mixed", "run_mixed_local"]

KIND_ENV = "HETEROFLOW_MIXED_KIND"
SPEED_ENV = "HETEROFLOW_MIXED_SPEED"
_JOB_ENV = "HETEROFLOW_MIXED_JOB"
_POD_ENV = "HETEROFLOW_MIXED_POD"  # "1": the agent joined a rendezvous hosted elsewhere (a pod of a cluster job)
DEVICE_ENV = "HETEROFLOW_MIXED_DEVICE"
_CHECKPOINT = "mixed-checkpoint.pt"
_TOPK_STATE = "mixed-topk-{kind}.pt"  # a kind's top-k residual and velocity at the checkpoint's step
_POWERSGD_STATE = "mixed-powersgd-{kind}.pt"  # a kind's PowerSGD error feedback, factors, iteration and generator
_CURRENT_STEP = [0]  # optimizer steps done by this replica (a drop record names it)
_SWITCH_INTERVAL = 0.0005  # seconds: the replicas' GIL switch interval (see _train)


@dataclasses.dataclass(frozen=True)
class ReplicaGroup:
    """The replicas of one kind in a launch: ``kind``, ``count`` worker processes, their torch ``device_type``
    (``cpu`` for a simulated kind) and simulated ``speed`` (1.0: full speed)."""

    kind: str
    count: int
    device_type: str = "cpu"
    speed: float = 1.0


@dataclasses.dataclass(frozen=True)
class MixedJob:
    """What every replica trains (picklable; the train step builds it from its parameters).

    A field named like a train parameter (``epochs``, ``optimizer``, ``loss``, ``seed``, ``checkpoint_every_steps``)
    defaults to that parameter's default in the step definition (:data:`~heteroflow.components.training.step.TRAIN`);
    ``rebalance_every_steps``, ``rebalance_every_minutes`` and ``compression`` default to a mixed candidate's
    (:class:`~heteroflow.components.replicas.MixedResources`).

    Attributes:
        model: ``module:function`` returning the ``torch.nn.Module`` (called after ``torch.manual_seed(seed)``).
        data: ``module:function`` returning the training ``Dataset`` of ``(x, y)``.
        global_batch: samples per optimizer step ``B`` (the user's batch size; shares split it).
        epochs: passes over the data (steps: ``epochs * ceil(n / B)``, each epoch's last global batch partial when
            ``B`` does not divide ``n``, split by the shares' proportions), or ``max_steps`` when > 0.
        learning_rate: the optimizer's rate.
        optimizer: ``""`` (Adam), a built-in name (``adam``, ``adamw``, ``sgd``: SGD with momentum 0.9;
            :data:`~heteroflow.components.training.factories.BUILTIN_OPTIMIZERS`) or ``module:function(params, lr)``.
        loss: ``""`` (cross-entropy) or ``module:function()`` returning ``loss(output, target)``.
        fixed_shares: ``{kind: [samples per replica]}`` summing to ``B``: no measuring, no rebalancing.
        profile_throughput: ``{kind: samples/s}`` from a step profile: the first shares (one replica's speed).
        equal_shares: keep equal shares (the baseline of the benchmark).
        warmup_steps / rebalance_every_steps / rebalance_every_minutes: when shares are measured.
        compression / topk_ratio / powersgd_rank: the cross-kind exchange
            (:data:`~heteroflow.components.training.hierarchy.CROSS_COMPRESSIONS`).
        checkpoint_dir / checkpoint_every_steps: where and how often rank 0 checkpoints ("" for never).
        fault_step: the step name fault injection matches (``train``).
    """

    model: str
    data: str
    global_batch: int
    learning_rate: float
    epochs: int = TRAIN.param("epochs").default
    max_steps: int = 0
    model_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    data_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    optimizer: str = TRAIN.param("optimizer").default
    loss: str = TRAIN.param("loss").default
    seed: int = TRAIN.param("seed").default
    fixed_shares: Mapping[str, Sequence[int]] = dataclasses.field(default_factory=dict)
    profile_throughput: Mapping[str, float] = dataclasses.field(default_factory=dict)
    equal_shares: bool = False
    warmup_steps: int = 3
    rebalance_every_steps: int = JOB_DEFAULTS["rebalance_every_steps"]
    rebalance_every_minutes: float = JOB_DEFAULTS["rebalance_every_minutes"]
    compression: str = JOB_DEFAULTS["compression"]
    topk_ratio: float = JOB_DEFAULTS["topk_ratio"]
    powersgd_rank: int = JOB_DEFAULTS["powersgd_rank"]
    checkpoint_dir: str = ""
    checkpoint_every_steps: int = TRAIN.param("checkpoint_every_steps").default
    fault_step: str = "train"

    def check(self) -> None:
        """Raises InvalidParameter naming a field out of range."""
        from heteroflow.components.training.factories import check_optimizer
        from heteroflow.components.training.hierarchy import check_compression

        for name in ("global_batch", "epochs", "warmup_steps", "rebalance_every_steps", "checkpoint_every_steps"):
            v = getattr(self, name)
            low = 0 if name == "warmup_steps" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise InvalidParameter(f"{name}={v!r} is out of range; valid: an integer >= {low}")
        if not self.rebalance_every_minutes > 0:
            raise InvalidParameter(f"rebalance_every_minutes={self.rebalance_every_minutes!r}; valid: a number of minutes > 0")
        check_compression(self.compression, self.topk_ratio, self.powersgd_rank)
        check_optimizer(self.optimizer)


@dataclasses.dataclass
class MixedResult:
    """What a mixed job did.

    Attributes:
        state_dict: the trained model's state (CPU tensors).
        steps: optimizer steps done in all (before a resume included).
        resumed_from_step: the step the last incarnation started from (0: never resumed).
        history: per step ``{"step", "loss"}``, of the last incarnation.
        kinds: every replica's kind, by rank, of the last incarnation.
        shares: the final samples per replica; shares_history: ``[{"step", "shares", "throughput"}]``.
        throughput: samples per busy second per replica (the last measurement).
        busy_fraction: busy time over the training loop's wall time, per replica (0-1).
        loop_seconds: wall time of the last incarnation's training loop (warm-up included).
        samples: samples trained on by the last incarnation.
        bytes_per_step / uncompressed_bytes_per_step: what a leader sent across kinds per step, and would have
            uncompressed (mean over leaders).
        compression: the cross-kind compression (``{}`` for none): ``method`` (topk, powersgd), ``topk_ratio`` and
            ``momentum_correction`` (the SGD momentum the top-k exchange took over, 0.0 for none), ``powersgd_rank``.
        dropped: ``[{"kind", "step", "reason", "resumed_from_step"}]``: kinds that dropped out.
        phase_seconds: per replica, ``{phase: wall seconds}`` of the last incarnation's loop (the module
            docstring lists the phases; they sum to :attr:`loop_seconds`).
    """

    state_dict: dict[str, Any]
    steps: int
    resumed_from_step: int
    history: list[dict[str, Any]]
    kinds: list[str]
    shares: list[int]
    shares_history: list[dict[str, Any]]
    throughput: list[float]
    busy_fraction: list[float]
    loop_seconds: float
    samples: int
    bytes_per_step: float = 0.0
    uncompressed_bytes_per_step: float = 0.0
    dropped: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    rank0: bool = True  # False: a copy another pod's agent wrote (rendezvous joined, not hosted: the pod holding rank 0 writes the model)
    phase_seconds: list[dict[str, float]] = dataclasses.field(default_factory=list)
    compression: dict[str, Any] = dataclasses.field(default_factory=dict)

    def facts(self) -> dict[str, Any]:
        """The JSON-ready summary for the run record (no weights)."""
        return {
            "kinds": self.kinds, "shares": self.shares, "throughput": [round(t, 1) for t in self.throughput],
            "busy_fraction": [round(b, 3) for b in self.busy_fraction], "shares_history": self.shares_history,
            "dropped": self.dropped, "bytes_per_step": round(self.bytes_per_step, 1),
            "uncompressed_bytes_per_step": round(self.uncompressed_bytes_per_step, 1),
            "phase_seconds": self.phase_seconds, **({"compression": self.compression} if self.compression else {}),
        }


# --- the worker --------------------------------------------------------------------------------------------


def _resolve(ref: str) -> Callable[..., Any]:
    from heteroflow.components.training.worker import _resolve as resolve

    return resolve(ref)


def _optimizer(job: MixedJob, params: Any) -> Any:
    from heteroflow.components.training.factories import build_optimizer

    return build_optimizer(job.optimizer, params, job.learning_rate)


def _compression_facts(job: MixedJob, topk_momentum: float) -> dict[str, Any]:
    """The cross-kind compression as the run record gives it (MixedResult.compression): empty for none; the method,
    and top-k's ratio and the momentum taken into the exchange (0.0: none, plain error feedback), or PowerSGD's
    rank."""
    if job.compression == "topk":
        return {"method": "topk", "topk_ratio": job.topk_ratio, "momentum_correction": topk_momentum}
    if job.compression == "powersgd":
        return {"method": "powersgd", "powersgd_rank": job.powersgd_rank}
    return {}


def _take_momentum(optimizer: Any) -> float:
    """Momentum correction for top-k (Lin et al. 2018, "Deep Gradient Compression", ICLR, section 3.2): take the
    momentum out of a plain SGD optimizer (every group's ``momentum`` the same and > 0, no dampening, not Nesterov;
    its groups are left with momentum 0) and return it, for the top-k exchange to accumulate the momentum of the
    gradient (:attr:`~heteroflow.components.training.hierarchy.HookState.topk_momentum`). Returns 0.0 (and
    changes nothing) for any other optimizer: its top-k exchange accumulates the gradient, as before."""
    import torch

    if not isinstance(optimizer, torch.optim.SGD):
        return 0.0
    groups = optimizer.param_groups
    m = {float(g.get("momentum", 0.0)) for g in groups}
    if len(m) != 1 or not next(iter(m)) > 0 or any(g.get("dampening", 0) or g.get("nesterov", False) for g in groups):
        return 0.0
    for g in groups:
        g["momentum"] = 0.0
    return m.pop()


def _collate(dataset: Any, idx: Any) -> tuple[Any, Any]:
    from heteroflow.components.data.readers import batch_collate

    getitems = getattr(dataset, "__getitems__", None)
    samples = getitems(idx.tolist()) if getitems is not None else [dataset[int(i)] for i in idx]
    x, y = batch_collate(samples)[:2]
    return x, y


def _initial_shares(job: MixedJob, kinds: list[str], rank_in_kind: list[int]) -> tuple[list[int], bool]:
    """(shares by rank, measured later?)"""
    from heteroflow.components.training.shares import equal_shares, shares_from_throughput

    if job.fixed_shares:
        try:
            shares = [int(job.fixed_shares[k][i]) for k, i in zip(kinds, rank_in_kind)]
        except (KeyError, IndexError):
            raise InvalidParameter(f"fixed_shares={dict(job.fixed_shares)!r} has no share for every replica ({kinds})") from None
        if sum(shares) != job.global_batch:
            # a kind dropped: the shares left, rescaled to the global batch
            shares = shares_from_throughput(job.global_batch, [float(s) for s in shares])
        return shares, False
    if job.equal_shares:
        return equal_shares(job.global_batch, len(kinds)), False
    if job.profile_throughput and all(k in job.profile_throughput for k in kinds):
        return shares_from_throughput(job.global_batch, [float(job.profile_throughput[k]) for k in kinds]), True
    return equal_shares(job.global_batch, len(kinds)), True


def _save(path: Path, blob: dict[str, Any]) -> None:
    import io

    import torch

    from heteroflow.cache.atomic import atomic_write_bytes

    buf = io.BytesIO()
    torch.save(blob, buf)
    atomic_write_bytes(path, buf.getvalue())


_PROGRESS_SECONDS = 0.5  # rank 0 writes its live progress after the first step, then this often, and at the last
_PROGRESS_FILE = "progress.json"


def _write_progress(results: Path, facts: dict[str, Any]) -> None:
    """Rank 0's live progress (``{"epoch", "epochs", "step", "steps", "loss" (rank 0's part of the step),
    "samples_per_second" (the whole job's, since the last write), "shares"}``; None where unknown) for the launching
    process to relay (:func:`run_mixed`'s ``progress``), written atomically."""
    from heteroflow.cache.atomic import atomic_write_bytes

    with contextlib.suppress(OSError):
        atomic_write_bytes(results / _PROGRESS_FILE, json.dumps({k: v for k, v in facts.items() if v is not None}).encode())


def _bucket_mb(model: Any) -> float:
    """DDP's bucket size for ``model``: half its gradient bytes, 0.1 to 25 MiB (DDP's default), so a model's
    gradients leave in two or three buckets and the exchange of one overlaps the backward pass of the next (every
    rank computes the same size from the same model). Two rather than four: each bucket's exchange costs the
    slower replica 0.3-1 ms of its own time on 2 cores (issuing the sends), and in paired runs of
    ``benchmarks/hetero.py``'s balanced job (150 steps, 8 rounds each, interleaved with the fastest kind alone)
    half the gradient per bucket gave a median 1.34x / 1.32x over the fastest kind alone against 1.19x / 1.20x
    with a quarter and 1.23x / 1.28x with one bucket."""
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return min(25.0, max(0.1, grad_bytes / 2 / 2**20))


def _estimate(estimator: Any, window: list[tuple[float, int, bool, float]], world: int, seconds: float = 0.0,
              rebalancer: Any = None) -> tuple[list[float], float]:
    """Every rank's timed steps since the last measurement (one collective), into ``estimator`` (busy seconds,
    samples) and ``rebalancer`` (share, seconds until the replica's gradients are all out): the throughput by
    rank (samples per busy second) and rank 0's ``seconds`` (its wall time since the last measurement); every
    rank gets the same."""
    import torch.distributed as dist

    windows: list[Any] = [None] * world
    if world > 1:
        dist.all_gather_object(windows, (window, seconds))
    else:
        windows = [(window, seconds)]
    for r, (w, _) in enumerate(windows):
        for busy, samples, first, ready in w:
            estimator.record(r, busy, samples, first)
            if rebalancer is not None:
                rebalancer.record(r, samples, ready, first)
    return estimator.estimate(), float(windows[0][1])


def _train(job: MixedJob, kind: str, speed: float, results: Path | None) -> MixedResult | None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from heteroflow.components.core.failures import fault_after_steps
    from heteroflow.components.training.hierarchy import Hierarchy, HookState, hierarchical_hook
    from heteroflow.components.training.loop import _to_cpu
    from heteroflow.components.training.shares import GlobalSampler, Rebalancer, ShareEstimator, SlowDown, shares_from_throughput

    torch.set_num_threads(1)
    from heteroflow.components.devices import DeviceKind, for_torch_device_type, host_kind
    # the cross-kind exchange's completions (the futures' callbacks of the comm hook) run on gloo's thread and
    # need the GIL: at Python's default 5 ms switch interval they waited for the training thread's Python (the
    # hook, the loop) up to 5 ms a step; 0.5 ms cut the faster replica's exchange wait from 0.86-0.90 s to
    # 0.48-0.51 s of a 3.5 s benchmark run and raised the lower busy fraction from 71-73% to 80-81% (balanced
    # shares, 2 runs each way, 2 cores at load average 4.5)
    sys.setswitchinterval(_SWITCH_INTERVAL)
    from heteroflow.components.training.rendezvous import backend_for

    # the replica's device: its kind's device at the local rank (a simulated kind's replica runs on the host;
    # an accelerator model may drive another type than its kind's own, Gaudi's hpu for npu)
    device_type = os.environ.get(DEVICE_ENV, "") or host_kind().torch_device_type
    device_kind = for_torch_device_type(device_type) or DeviceKind.parse(kind, field=KIND_ENV)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = device_kind.torch_device(local_rank, device_type=device_type)
    device_kind.set_device(local_rank, device_type=device_type)
    # the kind's own backend within a kind (nccl, hccl); gloo on the CPU and across kinds
    h = Hierarchy.build(kind, kind_backend=backend_for(device_type))
    rank, world = h.rank, h.world
    rank_in_kind = [h.kinds[:r].count(h.kinds[r]) for r in range(world)]
    dataset = _resolve(job.data)(**dict(job.data_kwargs))
    torch.manual_seed(job.seed)
    model = _resolve(job.model)(**dict(job.model_kwargs)).to(device)
    optimizer = _optimizer(job, model.parameters())
    momentum = [g.get("momentum") for g in optimizer.param_groups]  # as built (a checkpoint may hold 0: below)
    loss_fn = _resolve(job.loss)() if job.loss else torch.nn.functional.cross_entropy
    sampler = GlobalSampler(len(dataset), job.global_batch, job.seed)
    total = job.max_steps if job.max_steps > 0 else job.epochs * sampler.steps_per_epoch

    shares, measure = _initial_shares(job, h.kinds, rank_in_kind)
    start = 0
    ckpt = Path(job.checkpoint_dir) / _CHECKPOINT if job.checkpoint_dir else None
    # top-k's residual and velocity, per kind: its leader's (written beside the checkpoint at the same step)
    topk_file = Path(job.checkpoint_dir) / _TOPK_STATE.format(kind=kind) if job.checkpoint_dir else None
    powersgd_file = Path(job.checkpoint_dir) / _POWERSGD_STATE.format(kind=kind) if job.checkpoint_dir else None
    if ckpt is not None and ckpt.exists():
        blob = torch.load(ckpt, map_location="cpu", weights_only=False)
        model.load_state_dict({k: v.to(device) for k, v in blob["model"].items()})
        optimizer.load_state_dict(blob["optimizer"])
        for group, m in zip(optimizer.param_groups, momentum):
            if m is not None:  # a checkpoint of a top-k run holds momentum 0 (taken below); these kinds may not be
                group["momentum"] = m
        start = int(blob["step"])
        if rank == 0:
            print(f"train: resuming from step {start} of {total} (checkpoint {ckpt}), on {'+'.join(dict.fromkeys(h.kinds))}",
                  file=sys.stderr, flush=True)
        saved = blob.get("throughput_by_kind") or {}
        if measure and saved and all(k in saved for k in h.kinds):  # recomputed over the replicas left
            shares = shares_from_throughput(job.global_batch, [float(saved[k]) for k in h.kinds])
    # top-k runs between kinds' leaders, and every rank (leader or not) applies what it returns: every rank takes
    # the momentum out (one kind left after a drop-out: nothing to compress, the optimizer keeps its momentum)
    topk_momentum = _take_momentum(optimizer) if job.compression == "topk" and len(h.leaders) > 1 else 0.0
    # small buckets where each leaves asynchronously (every kind has one replica, no compression: the hook's
    # async path); elsewhere the hook waits per bucket, and top-k picks from the whole gradient: DDP's 25 MiB
    overlap = job.compression == "none" and len(set(h.kinds)) == len(h.kinds)
    ddp = DDP(model, device_ids=device_kind.ddp_device_ids(device), bucket_cap_mb=_bucket_mb(model) if overlap else 25.0,
              gradient_as_bucket_view=True)  # the gradients are views of the buckets: no copy back at the end
    slowdown = SlowDown(speed) if speed < 1.0 else None
    state = HookState(hierarchy=h, shares=list(shares), compression=job.compression, topk_ratio=job.topk_ratio,
                      powersgd_rank=job.powersgd_rank, slowdown=slowdown, topk_momentum=topk_momentum,
                      clock=time.perf_counter,  # wall time: what a step waits for (see the module docstring)
                      param_positions={id(p): i for i, p in enumerate(model.parameters())})
    ddp.register_comm_hook(state, hierarchical_hook)
    leads_topk = job.compression == "topk" and h.cross_group is not None and topk_file is not None
    if leads_topk and start > 0 and topk_file.exists():
        saved_topk = torch.load(topk_file, map_location="cpu", weights_only=False)
        # only the state of the checkpoint's own step: a leader that died between the two writes left an older one
        if int(saved_topk.get("step", -1)) == start and float(saved_topk.get("momentum", -1.0)) == topk_momentum:
            state.load_topk_state(saved_topk)
    leads_powersgd = job.compression == "powersgd" and h.cross_group is not None and powersgd_file is not None
    if leads_powersgd and start > 0 and powersgd_file.exists():
        saved_powersgd = torch.load(powersgd_file, map_location="cpu", weights_only=False)
        if int(saved_powersgd.get("step", -1)) == start:  # only the state of the checkpoint's own step (as top-k's)
            state.load_powersgd_state(saved_powersgd)

    shares_history = [{"step": start, "shares": list(shares), "throughput": [], "why": "start"}]
    estimator = ShareEstimator(world)
    rebalancer = Rebalancer(world, job.global_batch)
    window: list[tuple[float, int, bool, float]] = []  # this rank's timed steps since the last measurement
    busy_wall = 0.0  # this rank's busy wall time (utilization)
    losses: list[Any] = []  # this rank's share-weighted loss per step (tensors: no host sync per step)
    warm_until = start + 1 + max(1, job.warmup_steps)  # the first step is not timed
    next_measure = warm_until if measure else None
    throughput = [0.0] * world
    samples_done = 0
    first_at_share = False
    phase = state.add_phase
    loop_started = last_rebalance_time = time.perf_counter()
    # rank 0's "due by the minutes" flag is polled (a collective) only from about half the steps the minutes
    # take at the last measurement's pace; before the first measurement (the warm-up) the minutes do not count
    poll_from: int | None = None
    measured_at = start
    gap = 1 + max(1, job.warmup_steps)  # steps between share measurements (see below)
    step = start
    progress_at, progress_step = loop_started, start  # rank 0's live progress (see _write_progress)
    for step in range(start, total):
        t_sample = time.perf_counter()
        idx = sampler.part(step, state.shares, rank)
        whole = len(sampler.batch(step)) == job.global_batch  # else an epoch's last, partial batch
        state.step_weight = None if whole else sampler.weight(step, state.shares, rank)
        x, y = _collate(dataset, idx)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        sample_wall = time.perf_counter() - t_sample
        phase("sample", sample_wall)
        state.begin_step()
        out = ddp(x)
        loss = loss_fn(out, y)
        loss.backward()
        state.end_backward()
        done = step + 1
        by_minutes = None  # rebalance_every_minutes: rank 0's clock decides, sent while the optimizer steps
        if next_measure is not None and world > 1 and poll_from is not None and poll_from <= done < next_measure:
            flag = torch.tensor([1.0 if time.perf_counter() - last_rebalance_time >= job.rebalance_every_minutes * 60 else 0.0])
            by_minutes = (flag, dist.broadcast(flag, src=0, async_op=True))
        stepped_wall = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        samples_done += len(idx) if state.weight() > 0 else 0  # a stand-in sample is not trained on
        if device.type != "cpu":
            torch.accelerator.synchronize()
        update_wall = time.perf_counter() - stepped_wall  # the optimizer's step: busy, the same work whatever the share
        phase("optimizer", update_wall)
        busy_wall += state.step_busy_wall + update_wall
        losses.append(loss.detach() * state.weight())
        if step > start and whole:  # the first step of an incarnation builds buffers: not a measure of speed; a
            # partial batch's parts are not the shares the rebalancer models
            # for the shares: what this replica's part of the step takes before its gradients are all out (what
            # the others wait for): sampling, compute over the speed, the hook's own calls
            window.append((state.step_busy, len(idx), first_at_share, sample_wall + state.step_busy + state.step_hook_own))
            first_at_share = False
        _CURRENT_STEP[0] = done
        t_rebalance = time.perf_counter()
        if next_measure is not None:
            due = done >= next_measure
            if by_minutes is not None:
                by_minutes[1].wait()
                due = due or bool(by_minutes[0][0] > 0)
            elif world == 1 and done >= warm_until:
                due = due or time.perf_counter() - last_rebalance_time >= job.rebalance_every_minutes * 60
            if due:
                throughput, seconds = _estimate(estimator, window, world, time.perf_counter() - last_rebalance_time, rebalancer)
                window = []
                step_seconds_now = seconds / max(1, done - measured_at)
                poll_from = done + (int(0.5 * job.rebalance_every_minutes * 60 / step_seconds_now) if step_seconds_now > 0 else 0)
                measured_at = done
                # shares that equalize the replicas' measured time per step (a line per replica through its
                # measurements; hysteresis against noise): after a change, measure again after the warm-up's
                # steps (the second share gives the line its slope), else after rebalance_every_steps
                new = rebalancer.propose(state.shares, total - done)
                first_at_share = new[rank] != state.shares[rank]
                state.shares = new
                shares_history.append({"step": done, "shares": list(new), "throughput": [round(t, 1) for t in throughput], "why": "measured"})
                last_rebalance_time = time.perf_counter()
                # after a change, the warm-up's steps (and the first at the new shares); after a hold for noise,
                # twice the last gap (each measurement costs a collective); else rebalance_every_steps
                if rebalancer.settled:
                    gap = job.rebalance_every_steps
                elif rebalancer.held:
                    gap = min(job.rebalance_every_steps, 2 * gap)
                else:
                    gap = min(job.rebalance_every_steps, 1 + max(1, job.warmup_steps))
                next_measure = done + gap
        t_ckpt = time.perf_counter()
        phase("rebalance", t_ckpt - t_rebalance)
        if ckpt is not None and done % job.checkpoint_every_steps == 0 and done < total:
            if leads_topk:  # each kind's leader, beside rank 0's checkpoint of the same step
                _save(topk_file, {"step": done, "momentum": topk_momentum, **state.topk_state()})
            if leads_powersgd:
                _save(powersgd_file, {"step": done, **state.powersgd_state()})
            if rank == 0:
                by_kind: dict[str, float] = {}
                for r, t in enumerate(throughput):
                    if t > 0:
                        by_kind.setdefault(h.kinds[r], t)
                _save(ckpt, {"model": _to_cpu(model.state_dict()), "optimizer": optimizer.state_dict(), "step": done,
                             "shares": list(state.shares), "kinds": h.kinds, "throughput_by_kind": by_kind})
            dist.barrier()
        phase("checkpoint", time.perf_counter() - t_ckpt)
        if rank == 0 and results is not None and (done == start + 1 or done == total or time.perf_counter() - progress_at >= _PROGRESS_SECONDS):
            now = time.perf_counter()
            _write_progress(results, {
                "epoch": min(job.epochs, done // sampler.steps_per_epoch + 1) if job.max_steps <= 0 else None,
                "epochs": job.epochs if job.max_steps <= 0 else None, "step": done, "steps": total,
                "loss": float(loss.detach()), "samples_per_second": job.global_batch * (done - progress_step) / max(now - progress_at, 1e-9),
                "shares": list(state.shares)})
            progress_at, progress_step = now, done
        fault = fault_after_steps(job.fault_step, kind, done)
        if fault is not None:
            raise fault
    loop_seconds = time.perf_counter() - loop_started
    # after the loop, one exchange of what each rank kept: losses, busy time, samples, bytes sent
    steps_run = len(losses)
    loss_sum = torch.stack(losses).to("cpu", torch.float64) if losses else torch.zeros(0, dtype=torch.float64)
    dist.all_reduce(loss_sum)
    history = [{"step": start + i + 1, "loss": float(v)} for i, v in enumerate(loss_sum.tolist())]
    mine = torch.tensor([float(state.bytes_sent), float(state.bytes_uncompressed), 1.0 if h.is_leader and h.cross_group is not None else 0.0,
                         busy_wall, float(samples_done)], dtype=torch.float64)
    every = [torch.zeros(5, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(every, mine)
    sent = sum(every)
    leaders = max(1.0, float(sent[2]))
    if throughput == [0.0] * world:  # never measured (fixed or equal shares): this run's steps
        throughput = _estimate(estimator, window, world)[0]
    phases_mine = dict(state.phase_seconds)
    phases_mine["other"] = max(0.0, loop_seconds - sum(phases_mine.values()))
    phases: list[Any] = [None] * world
    dist.all_gather_object(phases, {k: round(v, 4) for k, v in phases_mine.items()})
    result = MixedResult(
        state_dict=_to_cpu(model.state_dict()), steps=total, resumed_from_step=start, history=history, kinds=h.kinds,
        shares=list(state.shares), shares_history=shares_history, throughput=throughput,
        busy_fraction=[min(1.0, float(e[3]) / loop_seconds) if loop_seconds > 0 else 0.0 for e in every],
        loop_seconds=loop_seconds, samples=int(sent[4]),
        bytes_per_step=float(sent[0]) / leaders / max(1, steps_run), uncompressed_bytes_per_step=float(sent[1]) / leaders / max(1, steps_run),
        phase_seconds=phases, compression=_compression_facts(job, topk_momentum))
    # every pod of a cluster job gets the (identical, all-gathered) result from its first worker; rank 0's is marked
    pod_copy = os.environ.get(_POD_ENV) == "1" and int(os.environ.get("LOCAL_RANK", "0")) == 0
    if (rank == 0 or pod_copy) and results is not None:
        from heteroflow.cache.atomic import atomic_write_bytes

        result.rank0 = rank == 0
        atomic_write_bytes(results / "result.pkl", pickle.dumps(result))
    return result if rank == 0 else None


def mixed_worker(job_path: str) -> Any:
    """A replica's entry point (the elastic agent's entrypoint, or :func:`run_mixed_local`'s): read the job,
    join the process group (``env://``: the agent's store), train, write rank 0's result.

    A device-class failure writes ``drop.<kind>.<rank>.pkl`` into the results folder and waits to be stopped (see
    the module docstring); any other failure writes ``error.<rank>.pkl`` and is raised, except a lost peer (a
    consequence of another replica's end), which is only raised.
    """
    import torch.distributed as dist

    from heteroflow.components.core.failures import FailureClass, classify
    from heteroflow.components.devices import cross_kind_backend, host_kind
    from heteroflow.components.training.worker import _is_peer_loss

    path = Path(job_path)
    job: MixedJob = pickle.loads(path.read_bytes())
    results = path.parent
    kind = os.environ.get(KIND_ENV, "") or host_kind().value
    speed = float(os.environ.get(SPEED_ENV, "1.0") or 1.0)
    rank = int(os.environ.get("RANK", "0"))
    try:
        if not dist.is_initialized():
            dist.init_process_group(cross_kind_backend())  # the world group spans the kinds (gloo)
        _train(job, kind, speed, results)
        return None
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) or _is_peer_loss(exc):
            raise
        record = {"kind": kind, "rank": rank, "pid": os.getpid(), "reason": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(), "time": time.time(), "step": _CURRENT_STEP[0]}
        try:
            record["exception"] = pickle.dumps(exc)
        except Exception:  # noqa: BLE001
            record["exception"] = None
        from heteroflow.cache.atomic import atomic_write_bytes

        if classify(exc).cls is FailureClass.DEVICE:
            atomic_write_bytes(results / f"drop.{kind}.{rank}.pkl", pickle.dumps(record))
            while True:  # the launcher stops this kind's agent and its workers (SIGKILL)
                time.sleep(1.0)
        atomic_write_bytes(results / f"error.{rank}.pkl", pickle.dumps(record))
        raise
    finally:
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()


# --- the launcher ------------------------------------------------------------------------------------------


_LOCAL_KEEP_ALIVE_SECONDS = 1
_LOCAL_KEEP_ALIVE_ATTEMPTS = 5
"""Heartbeats of a local mixed job's elastic agents (c10d rendezvous ``keep_alive_interval`` and
``keep_alive_max_attempt``; torch's defaults are 5 s and 3): a stopped agent is dead after 5 s."""


def _agent_main(config_path: str) -> None:
    """One kind's elastic agent (a process of its own): ``elastic_launch`` with c10d rendezvous on the
    launching process's store (``is_host=false``)."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    cfg = json.loads(Path(config_path).read_text(encoding="utf-8"))
    os.environ[KIND_ENV] = cfg["kind"]
    os.environ[SPEED_ENV] = str(cfg["speed"])
    os.environ[DEVICE_ENV] = cfg["device_type"]
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ[_POD_ENV] = "1" if cfg.get("pod") else ""
    rdzv: dict[str, Any] = {"join_timeout": cfg["join_timeout"], "last_call_timeout": cfg["last_call_timeout"]}
    if not cfg.get("pod"):
        # every agent is this host's, next to the store: an agent the launcher stopped (its kind dropped out) is
        # found dead after 5 missed 1-s heartbeats instead of torch's 3 missed 5-s ones, and the others re-form
        # 10 s sooner (the round cannot close before its dead participant is removed). Pods keep torch's defaults.
        rdzv.update(keep_alive_interval=_LOCAL_KEEP_ALIVE_SECONDS, keep_alive_max_attempt=_LOCAL_KEEP_ALIVE_ATTEMPTS)
    rdzv.update(cfg.get("rdzv_configs") or {})  # a pod's PET_RDZV_CONF (its heartbeats, timeouts), as torchrun's --rdzv-conf
    if cfg.get("is_host", False) is not None:  # None: torch decides by the endpoint's hostname (a Volcano pod 0)
        rdzv["is_host"] = bool(cfg.get("is_host", False))
    config = LaunchConfig(
        min_nodes=1, max_nodes=cfg.get("max_nodes", cfg["kinds"]), nproc_per_node=cfg["count"], run_id=cfg["run_id"],
        role=cfg["kind"], rdzv_backend="c10d", rdzv_endpoint=cfg["endpoint"], rdzv_configs=rdzv,
        max_restarts=cfg.get("max_restarts", cfg["kinds"]), monitor_interval=0.2, start_method="spawn",
    )
    elastic_launch(config, mixed_worker)(cfg["job_path"])


AGENTS_LOG = "torch-elastic.log"
"""In the run folder (``$HETEROFLOW_RUN_DIR``): the log lines torch's elastic agents of a local mixed job write (a
dropped kind's peers' ``E1205 ... api.py] failed ... Traceback`` as the group re-forms); the agents' other output
(the workers' ``train: ...`` lines) goes to this process's stderr as before."""
_TORCH_LOG_LINE = re.compile(rb"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")  # glog's prefix, which torch's logging uses


def _agents_log(joined: Mapping[str, Any]) -> Path | None:
    """Where a local mixed job's agents' torch log lines go: the run folder's :data:`AGENTS_LOG`; None (left on
    stderr) in a pod of a cluster job (its log is the pod's) or without a run folder (``heteroflow step train``
    alone)."""
    from heteroflow.components.core.telemetry import RUN_DIR_ENV

    run_dir = os.environ.get(RUN_DIR_ENV)
    if joined or not run_dir or not Path(run_dir).is_dir():
        return None
    return Path(run_dir) / AGENTS_LOG


def _forward(stream: Any, kind: str, log_path: Path) -> None:
    """Copy an agent's stderr line by line: torch's log lines to ``log_path`` (the kind in front), the rest to this
    process's stderr (in a thread, until the agent and its workers close it). It reads to the end whatever fails
    to be written (a log that cannot be opened sends torch's lines to stderr too): an agent whose pipe is not read
    blocks once the pipe's 64 KiB are full."""
    try:
        log = open(log_path, "ab")
    except OSError:
        log = None
    try:
        for line in iter(stream.readline, b""):
            with contextlib.suppress(OSError, ValueError):
                if log is not None and _TORCH_LOG_LINE.match(line):
                    log.write(f"[{kind}] ".encode() + line)
                    log.flush()
                    continue
                out = getattr(sys.stderr, "buffer", None)
                if out is not None:
                    out.write(line)
                else:
                    sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()
    except (OSError, ValueError):  # the pipe itself closed under us
        pass
    finally:
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()


def _kill_group(proc: subprocess.Popen[bytes], pids: Sequence[int] = ()) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError):
        return None


def _exception(record: Mapping[str, Any]) -> BaseException:
    from heteroflow.components.training.worker import WorkerError

    blob = record.get("exception")
    if blob:
        with contextlib.suppress(Exception):
            exc = pickle.loads(blob)
            if isinstance(exc, BaseException):
                with contextlib.suppress(Exception):
                    exc.add_note(f"(raised in mixed replica rank {record.get('rank')}, kind {record.get('kind')})")
                return exc
    return WorkerError(f"mixed replica rank {record.get('rank')} ({record.get('kind')}) failed:\n{record.get('traceback')}")


def run_mixed(job: MixedJob, groups: Sequence[ReplicaGroup], *, timeout_seconds: float | None = None,
              last_call_timeout: float = 10.0, join_timeout: float = 600.0,
              say: Callable[[str], None] | None = None, rendezvous: Mapping[str, Any] | None = None,
              progress: Callable[..., None] | None = None) -> MixedResult:
    """Train ``job`` on the replica ``groups`` (one elastic agent each; see the module docstring).

    Args:
        job: the training.
        groups: one :class:`ReplicaGroup` per kind (two or more kinds, or one).
        timeout_seconds: stop everything and raise ``WorkerTimeout`` after this long (None: no limit).
        last_call_timeout: seconds the rendezvous waits for more agents once one has joined (the re-formed
            group after a drop-out waits this long for the dropped agent) [TE].
        join_timeout: seconds an agent waits for the rendezvous to form.
        say: where to write progress lines (default: stderr).
        progress: called with rank 0's live progress as it changes (about every 0.5 s: ``epoch``, ``epochs``,
            ``step``, ``steps``, ``loss``, ``samples_per_second``, ``shares``; the step's live table shows them).
        rendezvous: join a rendezvous someone else hosts instead of hosting the store here (a pod of a mixed
            Volcano Job, :mod:`heteroflow.components.training.mixed_launch`): ``endpoint`` (``host:port``), ``run_id``,
            ``max_nodes`` (agents of the whole job), ``max_restarts``, ``is_host`` (False: the launcher hosts the
            store; None: torch decides by hostname), ``rdzv_configs`` (c10d options from the pod's
            ``PET_RDZV_CONF``, over this function's and torch's defaults).

    Returns:
        Rank 0's :class:`MixedResult`, with :attr:`MixedResult.dropped` filled in; with ``rendezvous``, this
        agent's first worker's copy when rank 0 trained in another pod (``rank0`` False: that pod writes the model).

    Raises:
        InvalidParameter: no groups, a kind twice, a bad job.
        BaseException: a replica's own failure that is not device-class (re-raised); the first dropped kind's
            device failure when every kind dropped; ``WorkerTimeout``; ``WorkerError`` when an agent ended
            without a reason.
    """
    from torch.distributed import TCPStore

    from heteroflow.components.training.worker import WorkerError, WorkerTimeout

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    job.check()
    if not groups:
        raise InvalidParameter("groups is empty; valid: one ReplicaGroup per device kind")
    kinds = [g.kind for g in groups]
    if len(set(kinds)) != len(kinds):
        raise InvalidParameter(f"kinds {kinds} repeat; valid: one ReplicaGroup per kind")
    if job.global_batch < sum(g.count for g in groups):
        raise InvalidParameter(f"batch_size={job.global_batch} is smaller than the {sum(g.count for g in groups)} replicas; valid: >= one sample per replica")
    joined = dict(rendezvous or {})
    if joined:  # another process (the launcher) hosts the store
        store, endpoint, run_id = None, str(joined["endpoint"]), str(joined["run_id"])
    else:
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
        endpoint = f"127.0.0.1:{store.port}"
        run_id = "heteroflow-mixed-" + uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="heteroflow-mixed-") as tmp:
        folder = Path(tmp)
        job_path = folder / "job.pkl"
        job_path.write_bytes(pickle.dumps(job))
        agents: dict[str, subprocess.Popen[bytes]] = {}
        forwarders: list[threading.Thread] = []
        log_path = _agents_log(joined)  # torch's own log lines (tracebacks as the group re-forms) go there
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([p for p in sys.path if p])}
        for g in groups:
            cfg = {"kind": g.kind, "count": g.count, "speed": g.speed, "device_type": g.device_type, "kinds": len(groups), "run_id": run_id,
                   "endpoint": endpoint, "job_path": str(job_path), "join_timeout": int(join_timeout),
                   "last_call_timeout": int(max(1, last_call_timeout))}
            cfg.update({k: joined[k] for k in ("max_nodes", "max_restarts", "is_host", "rdzv_configs") if k in joined})
            cfg["pod"] = bool(joined)
            cfg_path = folder / f"agent-{g.kind}.json"
            cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
            agents[g.kind] = subprocess.Popen(
                [sys.executable, "-c", "import sys; from heteroflow.components.training.mixed import _agent_main; _agent_main(sys.argv[1])", str(cfg_path)],
                env=env, start_new_session=True, stderr=subprocess.PIPE if log_path is not None else None)
            if log_path is not None:
                forwarders.append(threading.Thread(target=_forward, args=(agents[g.kind].stderr, g.kind, log_path), daemon=True))
                forwarders[-1].start()
        say(f"train: mixed job {' + '.join(f'{g.kind} x{g.count}' for g in groups)}: {len(groups)} elastic agent(s), "
            f"c10d rendezvous {run_id} on " + (f"the store at {endpoint}" if joined else f"this process's store {endpoint}"))
        dropped: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout_seconds if timeout_seconds else None
        failure: BaseException | None = None
        seen_progress = None
        try:
            while True:
                for path in sorted(folder.glob("drop.*.pkl")):
                    record = _load(path)
                    if record is None or record["kind"] in dropped:
                        continue
                    k = record["kind"]
                    pids = [r["pid"] for r in (_load(p) for p in folder.glob(f"drop.{k}.*.pkl")) if r]
                    _kill_group(agents[k], pids)
                    dropped[k] = record
                    from heteroflow.components.training.mixed_step import drop_point  # one wording with the summary's

                    say(f"train: kind {k} dropped out{drop_point(record.get('step'))} ({record['reason']}); its agent was "
                        f"stopped, the other kinds re-form and resume from the last checkpoint"
                        + (f" (torch's own log: {log_path})" if log_path is not None else ""))
                errors = [r for r in (_load(p) for p in folder.glob("error.*.pkl")) if r]
                if errors:
                    failure = _exception(min(errors, key=lambda r: r["time"]))
                    break
                if len(dropped) == len(groups):
                    first = min(dropped.values(), key=lambda r: r["time"])
                    failure = _exception(first)
                    with contextlib.suppress(Exception):
                        failure.add_note(f"every kind of the mixed job dropped out ({', '.join(dropped)})")
                    break
                live = {k: p for k, p in agents.items() if k not in dropped}
                codes = {k: p.poll() for k, p in live.items()}
                if all(c is not None for c in codes.values()):
                    bad = {k: c for k, c in codes.items() if c != 0}
                    if bad and not (folder / "result.pkl").exists():
                        time.sleep(0.5)
                        if any(folder.glob("error.*.pkl")) or any(folder.glob("drop.*.pkl")):
                            continue
                        failure = WorkerError(f"elastic agent(s) of {', '.join(bad)} exited with code(s) {list(bad.values())} without a result")
                    break
                if deadline is not None and time.monotonic() > deadline:
                    failure = WorkerTimeout(f"the mixed job ran past {timeout_seconds} s; its agents were stopped")
                    break
                if progress is not None:
                    with contextlib.suppress(OSError, ValueError):
                        text = (folder / _PROGRESS_FILE).read_text(encoding="utf-8")
                        if text != seen_progress:
                            seen_progress = text
                            progress(**json.loads(text))
                time.sleep(0.1)
        finally:
            for k, p in agents.items():
                if p.poll() is None:
                    _kill_group(p)
            for thread in forwarders:  # the agents' last lines (a worker left behind keeps its pipe open: not waited for)
                thread.join(timeout=2)
            store = None  # noqa: F841  (the store goes with the last reference)
        if failure is not None:
            raise failure
        result = _load(folder / "result.pkl")
        if result is None:
            raise WorkerError("the mixed job ended without rank 0's result")
    for k, record in dropped.items():
        result.dropped.append({"kind": k, "step": record.get("step"), "reason": record["reason"],
                               "resumed_from_step": result.resumed_from_step})
    return result


def run_mixed_local(job: MixedJob, kinds: Sequence[str], speeds: Sequence[float] | None = None, *,
                    timeout_seconds: float | None = 600) -> MixedResult:
    """Train ``job`` with one worker process per entry of ``kinds`` (rank order), without elastic agents: the
    quick path of tests and benchmarks (:func:`heteroflow.components.training.distributed.launch`). No drop-out
    handling: a failure fails the run.

    Raises:
        as :func:`heteroflow.components.training.distributed.launch`.
    """
    from heteroflow.components.training.distributed import launch

    speeds = list(speeds) if speeds is not None else [1.0] * len(kinds)
    with tempfile.TemporaryDirectory(prefix="heteroflow-mixed-") as tmp:
        job_path = Path(tmp) / "job.pkl"
        job_path.write_bytes(pickle.dumps(job))
        launch(_local_worker, len(kinds), kwargs={"job_path": str(job_path), "kinds": list(kinds), "speeds": speeds},
               timeout_seconds=timeout_seconds, deterministic=False)
        result = _load(Path(tmp) / "result.pkl")
    if result is None:
        raise InvalidParameter("the mixed run wrote no result")
    return result


def _local_worker(dctx: Any, *, job_path: str, kinds: list[str], speeds: list[float]) -> None:
    import torch

    torch.set_num_threads(1)
    os.environ[KIND_ENV] = kinds[dctx.rank]
    os.environ[SPEED_ENV] = str(speeds[dctx.rank])
    job: MixedJob = pickle.loads(Path(job_path).read_bytes())
    _train(job, kinds[dctx.rank], speeds[dctx.rank], Path(job_path).parent)
