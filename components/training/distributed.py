"""Several devices on one node: one worker process per device, torchrun's environment, a failure of any worker is
a failure of the step, and gradients combined weighted by per-rank batch size.

Launch
    :func:`launch` starts ``count`` worker processes (``subprocess``, each a fresh interpreter, so CUDA/NPU runtimes
    and OpenMP never cross a ``fork``) with the environment ``torchrun`` gives its workers [TR]: ``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (0), ``ROLE_RANK``, ``ROLE_WORLD_SIZE``,
    ``MASTER_ADDR`` (``127.0.0.1``), ``MASTER_PORT`` (a free port) and ``TORCHELASTIC_RUN_ID``. Each worker calls
    ``torch.distributed.init_process_group(backend, init_method="env://")``, binds its device (``cuda:<local
    rank>``, ``npu:<local rank>``), runs the function with a :class:`DistributedContext`, then
    ``destroy_process_group()``. Code written for ``torchrun`` runs unchanged inside it.

    The backend comes from the accelerator registry (:func:`backend_for`): ``nccl`` for CUDA (NVIDIA, and AMD
    through RCCL), ``hccl`` for Ascend (torch_npu), ``gloo`` on the CPU and whenever the ranks of one group use
    different device types (NCCL and HCCL cannot talk to each other; gloo reduces CPU copies).

Failures (classified by :func:`heteroflow.components.core.failures.classify`, like any step failure)
    =====================================================  ==========================================  =========
    what happened to a worker                               raised by :func:`launch`                    class
    =====================================================  ==========================================  =========
    its function raised (e.g. ``torch.OutOfMemoryError``)   the worker's own exception, re-raised        as that
                                                            (unpicklable ones: :class:`WorkerError`      exception
                                                            with the type name and traceback text)
    killed by a signal heteroflow did not send (SIGKILL     :class:`WorkerKilled` (a                    transient
    by the OOM killer, a preempted pod)                     ``BrokenProcessPool``, as rule 7 says)
    exited non-zero without an exception (``sys.exit(3)``,  :class:`WorkerError`                        permanent
    a crash in native code that is not a signal)
    all workers alive past ``timeout_seconds``              :class:`WorkerTimeout` (a ``TimeoutError``)  transient
    =====================================================  ==========================================  =========

    When one worker fails, the others are torn down (SIGTERM, then SIGKILL after
    :data:`TERMINATE_GRACE_SECONDS`); their own errors (``Connection closed by peer`` from gloo) are consequences
    and are not reported as the cause. The cause is the worker killed by an outside signal if there is one, else
    the earliest exception by wall-clock time (taken when the function raised, before the process group is
    destroyed) that is not a lost-peer error. When the launcher itself is killed, the kernel sends its workers
    SIGKILL (``PR_SET_PDEATHSIG`` on Linux), so no orphan keeps training beside a rerun.

Checkpoints
    :meth:`DistributedContext.save_checkpoint` writes on rank 0 only, atomically (``heteroflow.cache.atomic``),
    then every rank waits at a barrier, so no rank runs ahead of a checkpoint that might not exist;
    :meth:`DistributedContext.load_checkpoint` is called by every rank and loads onto the CPU (portable across
    device kinds). A rerun after a failure resumes from the last complete checkpoint.

Mixed replicas, weighted gradients (:func:`weighted_hook`)
    With per-rank batch sizes ``b_r`` (e.g. 64 on a GPU worker and 32 on an NPU worker) and a mean-reduced loss,
    the gradient over the union batch of ``B = sum(b_r)`` samples is ``g = sum_r (b_r / B) g_r``, where ``g_r`` is
    rank ``r``'s mean gradient. DDP's default hook averages (``(1/N) sum_r g_r``), which weights a sample on a
    small-batch rank more. :func:`weighted_hook` wraps any averaging DDP communication hook (torch's
    ``allreduce_hook``, ``fp16_compress_hook``, ``bf16_compress_hook``, ``powerSGD_hook`` [DH]) and first scales
    the rank's bucket by ``N * b_r / B``, so the average the hook computes is exactly ``g``: one update equals a
    single-process update over the union batch (up to float rounding; fp16/bf16/PowerSGD add their own, lossy,
    compression error).

    Learning rate: since one update is the single-process update over ``B`` samples, use the learning rate that
    batch size ``B`` needs. From a rate ``lr0`` tuned at batch ``B0``, :func:`scaled_learning_rate` applies the
    linear scaling rule, ``lr = lr0 * B / B0`` (Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training
    ImageNet in 1 Hour", arXiv:1706.02677, section 2.1; they pair it with a gradual warm-up over the first 5
    epochs for large ``B``, section 2.2). Changing one rank's batch size changes ``B`` and so the rate.

    Data: :func:`rank_slice` gives rank ``r`` the ``b_r`` samples of each global batch that follow those of the
    lower ranks, so ``N`` workers see exactly the batches one process with batch ``B`` would.

Several nodes
    ``launch(..., nodes=N, node_rank=i, master_addr=..., master_port=...)`` runs this node's ``count`` workers of an
    ``N * count``-rank group: global rank ``i * count + local rank``, ``GROUP_RANK`` ``i``, the rendezvous on node 0.
    Each pod of a training job calls it with :func:`node_role`, which reads what the job's operator set.

Sources: [TR] torchrun environment variables, https://pytorch.org/docs/stable/elastic/run.html ("Environment
Variables"); [DH] DDP communication hooks, https://pytorch.org/docs/stable/ddp_comm_hooks.html; [KT] Kubeflow
Trainer's torch plugin (``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``,
``PET_MASTER_PORT``), https://www.kubeflow.org/docs/components/trainer/; [PJ] PyTorchJob's environment
(``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``),
https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import io
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from heteroflow.components.errors import HeteroflowError, InvalidParameter

__all__ = [
    "COMPRESSIONS",
    "DistributedContext",
    "RankBatches",
    "TERMINATE_GRACE_SECONDS",
    "WorkerError",
    "WorkerKilled",
    "WorkerTimeout",
    "backend_for",
    "batch_weights",
    "comm_hook",
    "cpu_relay_hook",
    "free_port",
    "NODES_ENV",
    "NodeRole",
    "launch",
    "node_role",
    "rank_slice",
    "run_distributed",
    "scaled_learning_rate",
    "weighted_hook",
    "worker_environment",
]

TERMINATE_GRACE_SECONDS = 5.0
"""After a worker fails, how long the others get to exit on their own, then after SIGTERM, before SIGKILL (s)."""

_POLL_SECONDS = 0.05
_PAYLOAD_ENV = "HETEROFLOW_DIST_PAYLOAD"
_RESULT_DIR_ENV = "HETEROFLOW_DIST_RESULTS"
_PARENT_ENV = "HETEROFLOW_DIST_PARENT"

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
"""Gradient compression options of :func:`comm_hook`: torch's own DDP hooks [DH]."""


# --- errors ------------------------------------------------------------------------------------------------


class WorkerError(HeteroflowError, RuntimeError):
    """A worker failed in a way that carries no exception of its own (non-zero exit, or an exception that could
    not be pickled back: its type name and traceback are in the message). Classified *permanent*."""


class WorkerKilled(HeteroflowError, BrokenProcessPool):
    """A worker was killed by a signal heteroflow did not send (SIGKILL from the OOM killer, a preempted node).
    A ``BrokenProcessPool``, so :func:`~heteroflow.components.core.failures.classify` calls it *transient* (rule 7):
    rerun on the same candidate; training resumes from the last checkpoint.

    Attributes:
        rank: the rank of the killed worker.
        signal_number: the signal that ended it (9 for SIGKILL).
    """

    def __init__(self, message: str, *, rank: int = -1, signal_number: int = 0) -> None:
        super().__init__(message)
        self.rank = rank
        self.signal_number = signal_number

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_killed, (str(self), self.rank, self.signal_number))


def _rebuild_killed(message: str, rank: int, signal_number: int) -> WorkerKilled:
    return WorkerKilled(message, rank=rank, signal_number=signal_number)


class WorkerTimeout(HeteroflowError, TimeoutError):
    """The workers were still running after ``timeout_seconds`` (classified *transient*)."""


# --- backend, ports, environment ----------------------------------------------------------------------------


def backend_for(device_types: str | Sequence[str]) -> str:
    """The ``torch.distributed`` backend for ranks on the given PyTorch device types, from the registry.

    Args:
        device_types: one device type (``"cuda"``, ``"npu"``, ``"cpu"``, ``"hpu"``) for all ranks, or one per rank.

    Returns:
        The backend of the registry's accelerators of that device type (``nccl`` for ``cuda``, ``hccl`` for
        ``npu``), ``gloo`` for ``cpu``, and ``gloo`` when ranks use different device types (NCCL and HCCL groups
        cannot span each other's devices).

    Raises:
        InvalidParameter: a device type no registry accelerator uses (the message lists the valid ones).
    """
    from heteroflow.components.devices.accelerators import ACCELERATORS
    from heteroflow.components.devices import all_kinds

    types = [device_types] if isinstance(device_types, str) else list(device_types)
    if not types:
        raise InvalidParameter("device_types is empty; valid: one device type, or one per rank")
    known: dict[str, str] = {}
    for kind in all_kinds():  # the kinds' own backends first (cpu: gloo, cuda: nccl, npu: hccl)
        known.setdefault(kind.torch_device_type, kind.distributed_backend)
    for accel in ACCELERATORS.values():
        known.setdefault(accel.torch_device_type, accel.distributed_backend)
    for t in types:
        if t not in known:
            raise InvalidParameter(f"device type {t!r} is unknown; valid: {', '.join(sorted(known))}")
    if len(set(types)) > 1:
        return "gloo"
    return known[types[0]]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (bound to port 0, then released; another process could take it
    before the rendezvous, in which case rank 0 fails with ``EADDRINUSE`` and :func:`launch` retries once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def worker_environment(rank: int, world_size: int, *, master_port: int, master_addr: str = "127.0.0.1", run_id: str = "",
                       local_rank: int | None = None, local_world_size: int | None = None, group_rank: int = 0) -> dict[str, str]:
    """The environment variables ``torchrun`` sets for a worker [TR].

    Args:
        rank: global rank, 0 <= rank < world_size.
        world_size: number of workers on every node together.
        master_port: the rendezvous TCP port on ``master_addr``.
        master_addr: the rendezvous host (one node: the loopback address; several: node 0's address).
        run_id: ``TORCHELASTIC_RUN_ID``.
        local_rank / local_world_size: its rank on this node and the workers of this node (default: one node,
            ``rank`` and ``world_size``).
        group_rank: this node's rank (``GROUP_RANK``).

    Raises:
        InvalidParameter: rank out of range or world_size < 1.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise InvalidParameter(f"rank={rank}, world_size={world_size}; valid: world_size >= 1 and 0 <= rank < world_size")
    n = str(world_size)
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "GROUP_RANK": str(group_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": n,
        "LOCAL_WORLD_SIZE": str(world_size if local_world_size is None else local_world_size),
        "ROLE_WORLD_SIZE": n,
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id or "none",
    }


@dataclasses.dataclass(frozen=True, slots=True)
class NodeRole:
    """This pod's place in a multi-node job, as the job's operator told it (:func:`node_role`).

    Attributes:
        nodes: pods (nodes) in the job, >= 2.
        node_rank: this pod's index, 0 .. nodes-1 (0 hosts the rendezvous).
        master_addr / master_port: node 0's address and rendezvous port.
    """

    nodes: int
    node_rank: int
    master_addr: str
    master_port: int


NODES_ENV = "HETEROFLOW_NODES"
"""Set by heteroflow's training-job manifests on every pod: the job's node count (:func:`node_role`)."""


def node_role(environ: Mapping[str, str] | None = None) -> NodeRole | None:
    """This pod's role in a multi-node training job, or None outside one.

    Read from the variables the operators set: Kubeflow Trainer v2's torch plugin sets torchrun's ``PET_NNODES``,
    ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` [KT]; the training operator v1 (PyTorchJob) sets
    ``MASTER_ADDR``, ``MASTER_PORT`` and the pod's ``RANK`` (Master 0, Worker i+1) [PJ]. ``PET_*`` wins; the node
    count falls back to :data:`NODES_ENV`, which heteroflow's manifests set. A job of one node is None.

    Raises:
        InvalidParameter: a variable that is not a number, or a node rank out of range (names the variable).
    """
    env = os.environ if environ is None else environ

    def number(name: str, text: str) -> int:
        try:
            return int(text.split(":")[-1])  # PET_NNODES may be "2:2" (min:max, elastic)
        except ValueError:
            raise InvalidParameter(f"{name}={text!r} is not a number; valid: an integer (set by the training job's operator)") from None

    nodes_name = "PET_NNODES" if env.get("PET_NNODES") else NODES_ENV
    if not env.get(nodes_name):
        return None
    nodes = number(nodes_name, env[nodes_name])
    if nodes <= 1:
        return None
    rank_name = "PET_NODE_RANK" if env.get("PET_NODE_RANK") else "RANK"
    port_name = "PET_MASTER_PORT" if env.get("PET_MASTER_PORT") else "MASTER_PORT"
    rank = number(rank_name, env.get(rank_name, "0"))
    port = number(port_name, env.get(port_name, ""))
    addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
    if not addr:
        raise InvalidParameter("a multi-node job without PET_MASTER_ADDR or MASTER_ADDR; valid: node 0's address, set by the operator")
    if not 0 <= rank < nodes:
        raise InvalidParameter(f"{rank_name}={rank} is out of range for {nodes} nodes; valid: 0 .. {nodes - 1}")
    return NodeRole(nodes=nodes, node_rank=rank, master_addr=addr, master_port=port)


# --- the context a worker's function gets ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DistributedContext:
    """What a worker's function receives (beside its own keyword arguments).

    Attributes:
        rank: this worker's global rank (0 .. world_size-1).
        local_rank: its rank on this node.
        world_size: number of workers.
        backend: the process group's backend (``gloo``, ``nccl``, ``hccl``).
        device_type: this rank's PyTorch device type (``cpu``, ``cuda``, ``npu``).
        batch_sizes: the per-rank batch sizes (samples per optimizer step), or () when not given.
        deterministic: whether deterministic algorithms were switched on.
        device_index: the index of its device among this node's devices of its type (the local rank when every
            rank uses one device type; with ranks on ``cuda, npu``, both use device 0 of their type).
    """

    rank: int
    local_rank: int
    world_size: int
    backend: str
    device_type: str = "cpu"
    batch_sizes: tuple[int, ...] = ()
    deterministic: bool = False
    device_index: int = 0

    @property
    def is_main(self) -> bool:
        """True on rank 0 (the rank that writes checkpoints and records)."""
        return self.rank == 0

    @property
    def device(self) -> Any:
        """This rank's ``torch.device`` (``cuda:<device index>``, ``npu:<device index>``, or ``cpu``)."""
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, self.device_index)

    @property
    def batch_size(self) -> int:
        """This rank's batch size (samples per step).

        Raises:
            InvalidParameter: no per-rank batch sizes were given.
        """
        if not self.batch_sizes:
            raise InvalidParameter("batch_sizes was not given to launch(); valid: one batch size per rank")
        return self.batch_sizes[self.rank]

    def barrier(self) -> None:
        """Wait until every rank gets here (``torch.distributed.barrier``)."""
        import torch.distributed as dist

        dist.barrier()

    def save_checkpoint(self, state: Any, path: str | os.PathLike[str]) -> None:
        """Write ``state`` (``torch.save``) to ``path`` on rank 0 only, atomically and durably, then barrier.

        Tensors should be CPU copies (a checkpoint portable across device kinds). Every rank must call it.
        """
        if self.is_main:
            import torch

            from heteroflow.cache.atomic import atomic_write_bytes

            buf = io.BytesIO()
            torch.save(state, buf)
            atomic_write_bytes(path, buf.getvalue())
        self.barrier()

    def load_checkpoint(self, path: str | os.PathLike[str]) -> Any | None:
        """The checkpoint at ``path`` loaded onto the CPU by every rank, or None when there is none.

        Raises:
            CheckpointError: the file exists but cannot be loaded (names the path).
        """
        import torch

        from heteroflow.components.errors import CheckpointError

        p = Path(path)
        if not p.exists():
            return None
        try:
            return torch.load(p, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - a damaged file is named, with the reason
            raise CheckpointError(f"checkpoint {p} cannot be loaded ({type(exc).__name__}: {exc})") from None

    def ddp(self, module: Any, *, compression: str = "none", weighted: bool | None = None, **ddp_kwargs: Any) -> Any:
        """Wrap ``module`` (already on :attr:`device`) in ``DistributedDataParallel`` with :func:`comm_hook`.

        Args:
            module: the model.
            compression: one of :data:`COMPRESSIONS`.
            weighted: weight gradients by :attr:`batch_sizes` (default: whenever batch sizes were given).
            ddp_kwargs: passed to ``DistributedDataParallel``.

        Returns:
            The DDP-wrapped module.
        """
        from torch.nn.parallel import DistributedDataParallel

        device_ids = None if self.device_type == "cpu" else [self.device_index]
        model = DistributedDataParallel(module, device_ids=device_ids, **ddp_kwargs)
        sizes = self.batch_sizes if (weighted or weighted is None) and self.batch_sizes else ()
        # an accelerator rank in a gloo group (mixed device types) reduces CPU copies: gloo cannot reduce NPU tensors
        relay = self.backend == "gloo" and self.device_type != "cpu"
        state, hook = comm_hook(compression, batch_sizes=sizes, rank=self.rank, relay_through_cpu=relay)
        model.register_comm_hook(state, hook)
        return model


# --- weighted gradients, compression, learning rate ----------------------------------------------------------


def batch_weights(batch_sizes: Sequence[int]) -> tuple[float, ...]:
    """Each rank's share of the union batch, ``b_r / sum(b)``.

    Raises:
        InvalidParameter: an empty list, or a batch size that is not an integer >= 1.
    """
    sizes = list(batch_sizes)
    if not sizes:
        raise InvalidParameter("batch_sizes is empty; valid: one integer >= 1 per rank")
    for i, b in enumerate(sizes):
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InvalidParameter(f"batch_sizes[{i}]={b!r} is not a batch size; valid: an integer >= 1")
    total = sum(sizes)
    return tuple(b / total for b in sizes)


def weighted_hook(hook: Callable[[Any, Any], Any], batch_sizes: Sequence[int], rank: int) -> Callable[[Any, Any], Any]:
    """Wrap an *averaging* DDP communication hook so it computes the batch-size-weighted gradient.

    The wrapped hook multiplies rank ``r``'s gradient bucket by ``N * b_r / B`` (``N`` ranks, ``B = sum(b)``)
    and calls ``hook``, which averages over ranks; the result is ``sum_r (b_r / B) g_r``, the union-batch
    gradient of a mean-reduced loss. Works with torch's ``allreduce_hook``, ``fp16_compress_hook``,
    ``bf16_compress_hook`` and ``powerSGD_hook`` [DH], which all divide the sum by the world size.

    Args:
        hook: ``hook(state, bucket) -> Future[Tensor]``, averaging over the process group.
        batch_sizes: per-rank batch sizes (samples per step), one per rank.
        rank: this worker's rank.

    Raises:
        InvalidParameter: bad batch sizes, or ``rank`` outside them.
    """
    weights = batch_weights(batch_sizes)
    if not 0 <= rank < len(weights):
        raise InvalidParameter(f"rank={rank} has no batch size; batch_sizes has {len(weights)} entries")
    factor = len(weights) * weights[rank]

    def weighted(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects non-GradBucket annotations
        bucket.buffer().mul_(factor)
        return hook(state, bucket)

    weighted.__name__ = f"weighted_{getattr(hook, '__name__', 'hook')}"
    return weighted


def cpu_relay_hook(process_group, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations
    """A DDP communication hook that averages through CPU copies: the bucket is copied to the CPU, all-reduced
    (SUM, divided by the world size) and copied back. For a gloo group whose ranks hold tensors gloo cannot
    reduce on their device (an Ascend NPU rank beside a CUDA rank); wrap it in :func:`weighted_hook` for
    unequal batches."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    cpu = buffer.detach().to("cpu").div_(dist.get_world_size(group))
    fut = dist.all_reduce(cpu, group=group, async_op=True).get_future()

    def back(f):  # type: ignore[no-untyped-def]
        buffer.copy_(f.value()[0])
        return buffer

    return fut.then(back)


def comm_hook(
    compression: str = "none",
    *,
    batch_sizes: Sequence[int] = (),
    rank: int = 0,
    process_group: Any = None,
    relay_through_cpu: bool = False,
) -> tuple[Any, Callable[[Any, Any], Any]]:
    """The ``(state, hook)`` pair to pass to ``DistributedDataParallel.register_comm_hook``.

    Args:
        compression: ``none`` (``allreduce_hook``, fp32), ``fp16`` (``fp16_compress_hook``), ``bf16``
            (``bf16_compress_hook``), ``powersgd`` (``powerSGD_hook``, rank 1, error feedback, 10 warm-up
            iterations uncompressed: Vogels et al. 2019, "PowerSGD: Practical Low-Rank Gradient Compression for
            Distributed Optimization", NeurIPS) [DH].
        batch_sizes: per-rank batch sizes; when given, the hook weights by them (:func:`weighted_hook`).
        rank: this worker's rank (used with ``batch_sizes``).
        process_group: the group (default: the world; passed as the hook's state).
        relay_through_cpu: reduce CPU copies of the gradients (:func:`cpu_relay_hook`; no compression).

    Raises:
        InvalidParameter: an unknown compression (lists the valid ones), compression with the CPU relay, or bad
            batch sizes.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if compression not in COMPRESSIONS:
        raise InvalidParameter(f"compression={compression!r} is unknown; valid: {', '.join(COMPRESSIONS)}")
    if relay_through_cpu and compression != "none":
        raise InvalidParameter(f"compression={compression!r} with the CPU relay (ranks of mixed device types); valid: none")
    state: Any = process_group
    if relay_through_cpu:
        hook: Callable[[Any, Any], Any] = cpu_relay_hook
    elif compression == "none":
        hook = default_hooks.allreduce_hook
    elif compression == "fp16":
        hook = default_hooks.fp16_compress_hook
    elif compression == "bf16":
        hook = default_hooks.bf16_compress_hook
    else:
        state = powerSGD_hook.PowerSGDState(process_group=process_group, matrix_approximation_rank=1, start_powerSGD_iter=10)
        hook = powerSGD_hook.powerSGD_hook
    if batch_sizes:
        hook = weighted_hook(hook, batch_sizes, rank)
    return state, hook


def scaled_learning_rate(base_lr: float, base_batch_size: int, batch_sizes: Sequence[int]) -> float:
    """The linear scaling rule: ``base_lr * sum(batch_sizes) / base_batch_size``.

    Source: Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", arXiv:1706.02677,
    section 2.1 ("When the minibatch size is multiplied by k, multiply the learning rate by k"); section 2.2 adds a
    gradual warm-up for large batches. With :func:`weighted_hook` one step is one step over the union batch, so
    the rule applies to ``B = sum(batch_sizes)``.

    Args:
        base_lr: the learning rate tuned at ``base_batch_size`` (> 0).
        base_batch_size: samples per step of that tuning (>= 1).
        batch_sizes: per-rank batch sizes now.

    Raises:
        InvalidParameter: a rate <= 0, a base batch < 1 or bad batch sizes.
    """
    batch_weights(batch_sizes)
    if not base_lr > 0:
        raise InvalidParameter(f"base_lr={base_lr!r}; valid: a number > 0")
    if isinstance(base_batch_size, bool) or not isinstance(base_batch_size, int) or base_batch_size < 1:
        raise InvalidParameter(f"base_batch_size={base_batch_size!r}; valid: an integer >= 1")
    return base_lr * sum(batch_sizes) / base_batch_size


def rank_slice(batch_sizes: Sequence[int], rank: int) -> slice:
    """The part of each global batch (of ``sum(batch_sizes)`` samples, in order) that belongs to ``rank``: the
    ``b_rank`` samples after those of ranks ``0 .. rank-1``. ``N`` workers taking these slices see exactly the
    batches one process with batch ``sum(batch_sizes)`` sees.

    Raises:
        InvalidParameter: bad batch sizes or a rank outside them.
    """
    batch_weights(batch_sizes)
    if not 0 <= rank < len(batch_sizes):
        raise InvalidParameter(f"rank={rank} has no batch size; batch_sizes has {len(batch_sizes)} entries")
    start = sum(batch_sizes[:rank])
    return slice(start, start + batch_sizes[rank])


class RankBatches:
    """A batch sampler for one rank of an unequal-batch run: epoch ``e`` visits a permutation of ``n`` samples
    seeded by ``seed + e`` (numpy ``default_rng``, as heteroflow's single-process loader does), cut into global
    batches of ``B = sum(batch_sizes)``; this rank yields its :func:`rank_slice` of each. The union over ranks of
    batch ``i`` is batch ``i`` of one process with batch size ``B``. A last, partial global batch is dropped
    (every rank must take the same number of steps, or the collectives hang).

    Args:
        n: samples in the data set.
        batch_sizes: per-rank batch sizes.
        rank: this rank.
        seed: the shuffling seed.
        shuffle: False: in order.

    Raises:
        InvalidParameter: bad batch sizes or rank, or ``n`` smaller than one global batch.
    """

    def __init__(self, n: int, batch_sizes: Sequence[int], rank: int, seed: int = 0, *, shuffle: bool = True) -> None:
        self.part = rank_slice(batch_sizes, rank)
        self.global_batch = sum(batch_sizes)
        if n < self.global_batch:
            raise InvalidParameter(f"the data set has {n} samples, fewer than one global batch of {self.global_batch} ({list(batch_sizes)})")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Visit epoch ``epoch`` from global batch ``start`` on (a resume mid-epoch)."""
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return max(0, self.n // self.global_batch - self.start)

    def __iter__(self) -> Any:
        import numpy as np

        order = np.random.default_rng(self.seed + self.epoch).permutation(self.n) if self.shuffle else np.arange(self.n)
        for b in range(self.start, self.n // self.global_batch):
            yield order[b * self.global_batch : (b + 1) * self.global_batch][self.part].tolist()


# --- function references -----------------------------------------------------------------------------------


def _reference(fn: Callable[..., Any] | str) -> str:
    """``module:qualname`` for an importable function, ``/path/file.py:qualname`` for one whose module is not
    importable by name (a script, a test module); a string is returned as given."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise InvalidParameter(f"function {fn!r} is not 'package.module:function' or '/path/file.py:function'")
        return fn
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise InvalidParameter(f"function {fn!r} must be defined at the top level of a module (workers import it by name)")
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None)
    if module != "__main__":
        with contextlib.suppress(Exception):
            spec = importlib.util.find_spec(module)
            if spec is not None and (path is None or (spec.origin and os.path.samefile(spec.origin, path))):
                return f"{module}:{qualname}"
    if not path:
        raise InvalidParameter(f"function {module}:{qualname} has no importable module or source file")
    return f"{os.path.abspath(path)}:{qualname}"


def _resolve(ref: str) -> Callable[..., Any]:
    target, _, qualname = ref.rpartition(":")
    if target.endswith(".py") and os.sep in target:
        name = "_heteroflow_worker_" + secrets.token_hex(4)
        spec = importlib.util.spec_from_file_location(name, target)
        if spec is None or spec.loader is None:
            raise InvalidParameter(f"function {ref!r}: cannot load {target}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# --- the worker side ---------------------------------------------------------------------------------------


def _write_atomic(path: Path, data: bytes) -> None:
    from heteroflow.cache.atomic import atomic_write_bytes

    atomic_write_bytes(path, data, durable=False)


def _report_error(results: Path, rank: int, exc: BaseException) -> None:
    tb = "".join(traceback.format_exception(exc))
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001 - an unpicklable exception travels as text
        blob = pickle.dumps(WorkerError(f"rank {rank}: {type(exc).__module__}.{type(exc).__qualname__}: {exc}\n{tb}"))
    record = {"time": _FAILED_AT or time.time(), "exception": blob, "traceback": tb, "peer_loss": _is_peer_loss(exc)}
    _write_atomic(results / f"error.{rank}.pkl", pickle.dumps(record))


_FAILED_AT: float | None = None
_PEER_LOSS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Socket closed", "NCCL communicator was aborted")


def _is_peer_loss(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because another worker went away (a consequence, not a cause)."""
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _PEER_LOSS)


def _die_with_parent() -> None:
    """End this worker when the launcher dies (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so a killed step
    leaves no worker behind that keeps writing checkpoints beside its rerun."""
    parent = int(os.environ.get(_PARENT_ENV, "0") or 0)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1 (linux/prctl.h)
    if parent and os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)


def _worker_main() -> None:
    """Entry point of one worker process (run by :func:`launch`; reads its payload from the environment)."""
    _die_with_parent()
    payload = pickle.loads(Path(os.environ[_PAYLOAD_ENV]).read_bytes())
    results = Path(os.environ[_RESULT_DIR_ENV])
    rank = int(os.environ["RANK"])
    code = 0
    try:
        value = _run_worker(payload, rank)
        _write_atomic(results / f"result.{rank}.pkl", pickle.dumps(value))
    except SystemExit as exc:  # never re-raise SystemExit in the launcher's process
        if exc.code in (0, None):
            _write_atomic(results / f"result.{rank}.pkl", pickle.dumps(None))
        else:
            _report_error(results, rank, WorkerError(f"worker rank {rank} called sys.exit({exc.code!r})"))
            code = 1
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the launcher
        if not isinstance(exc, Exception):  # KeyboardInterrupt and the like: a failure, not the launcher's own
            exc = WorkerError(f"worker rank {rank}: {type(exc).__name__}: {exc}")
        _report_error(results, rank, exc)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no atexit handlers of CUDA/NCCL/gloo that could hang a dying worker


def _run_worker(payload: Mapping[str, Any], rank: int) -> Any:
    import torch
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    device_types = payload["device_types"]  # this node's, by local rank
    device_type = device_types[local_rank]
    if payload["deterministic"]:
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.set_num_threads(1)
    from heteroflow.components.devices import for_torch_device_type

    kind = for_torch_device_type(device_type)
    if kind is not None:
        kind.import_backend()  # e.g. torch_npu, which registers the "npu" device type with torch
    device_index = device_types[:local_rank].count(device_type)
    if device_type != "cpu":
        getattr(torch, device_type).set_device(device_index)
    sys.path[:] = list(payload["sys_path"]) + [p for p in sys.path if p not in payload["sys_path"]]
    fn = _resolve(payload["function"])
    kwargs = pickle.loads(payload["kwargs"])
    ctx = DistributedContext(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        backend=payload["backend"],
        device_type=device_type,
        batch_sizes=tuple(payload["batch_sizes"]),
        deterministic=payload["deterministic"],
        device_index=device_index,
    )
    dist.init_process_group(payload["backend"], init_method="env://", rank=rank, world_size=world)
    try:
        return fn(ctx, **kwargs)
    except BaseException:
        global _FAILED_AT
        _FAILED_AT = time.time()  # before destroy_process_group(), which the peers see as a lost connection
        raise
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


# --- the launcher side -------------------------------------------------------------------------------------


def _threads_per_worker(count: int) -> int:
    """Intra-op threads per worker: the CPUs this process may use, shared out (torchrun sets 1; on a CPU-only
    node that leaves most cores idle)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // count)


@dataclasses.dataclass(slots=True)
class _Ended:
    rank: int
    returncode: int
    by_us: bool


def _terminate(procs: Sequence[subprocess.Popen[bytes]], grace: float) -> set[int]:
    """End the still-running workers: wait ``grace`` s for them to exit on their own, SIGTERM, wait ``grace`` s,
    SIGKILL. Returns the ranks heteroflow signalled."""
    signalled: set[int] = set()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(_POLL_SECONDS)
    for rank, p in enumerate(procs):
        if p.poll() is None:
            signalled.add(rank)
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(_POLL_SECONDS)
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()
    return signalled


def _cause(ended: Sequence[_Ended], results: Path) -> BaseException:
    """The failure to report: a worker killed by an outside signal, else the earliest exception that is not a
    lost-peer error of a collective, else the earliest one, else the first non-zero exit."""
    for e in ended:
        if e.returncode < 0 and not e.by_us:
            sig = -e.returncode
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            return WorkerKilled(f"worker rank {e.rank} was killed by {name}; the other workers were stopped", rank=e.rank, signal_number=sig)
    errors = []
    for path in results.glob("error.*.pkl"):
        with contextlib.suppress(Exception):
            record = pickle.loads(path.read_bytes())
            errors.append((bool(record.get("peer_loss")), record["time"], int(path.name.split(".")[1]), record))
    if errors:
        *_, rank, record = min(errors, key=lambda e: e[:3])
        try:
            exc = pickle.loads(record["exception"])
        except Exception:  # noqa: BLE001
            exc = WorkerError(f"rank {rank} failed:\n{record['traceback']}")
        if isinstance(exc, BaseException):
            # the one-line error of the step (records, fallback reasons, summaries) names the rank; the worker's
            # traceback goes to the launching process's stderr, i.e. the step's log (kfp.log, the Airflow task log)
            with contextlib.suppress(Exception):
                exc.add_note(f"(raised in distributed worker rank {rank})")
            print(f"distributed worker rank {rank} failed; its traceback:\n{record['traceback']}", file=sys.stderr, flush=True)
            return exc
    failed = [e for e in ended if e.returncode != 0 and not e.by_us] or [e for e in ended if e.returncode != 0]
    e = failed[0] if failed else ended[0]
    return WorkerError(f"worker rank {e.rank} exited with code {e.returncode} without an exception")


def launch(
    fn: Callable[..., Any] | str,
    count: int,
    *,
    kwargs: Mapping[str, Any] | None = None,
    device_type: str | Sequence[str] = "cpu",
    backend: str | None = None,
    batch_sizes: Sequence[int] = (),
    deterministic: bool = False,
    timeout_seconds: float | None = None,
    env: Mapping[str, str] | None = None,
    nodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> list[Any]:
    """Run ``fn(ctx, **kwargs)`` in ``count`` worker processes on this node and return each rank's result.

    Args:
        fn: a top-level function, or its reference (``package.module:function`` or ``/path/file.py:function``);
            each worker imports it (with the caller's ``sys.path``). It gets a :class:`DistributedContext` and
            ``kwargs``. A function of a script run as ``__main__`` is loaded from its file, so guard the script's
            entry with ``if __name__ == "__main__":``, as multiprocessing's spawn requires.
        count: number of workers (one per device), >= 1.
        kwargs: keyword arguments for ``fn`` (picklable).
        device_type: the PyTorch device type of every rank (``cpu``, ``cuda``, ``npu``), or one per rank of this node.
        backend: the ``torch.distributed`` backend; default :func:`backend_for` of the device types.
        batch_sizes: per-rank batch sizes (samples per step), one per rank of every node, or () (then
            :attr:`DistributedContext.batch_size` is unavailable and DDP averages as usual).
        deterministic: ``torch.use_deterministic_algorithms(True)`` and one intra-op thread in every worker.
        timeout_seconds: stop the workers and raise :class:`WorkerTimeout` after this long (None: no limit).
        env: extra environment variables for the workers.
        nodes: nodes in the job (each runs ``launch`` with its ``node_rank``), >= 1; the group has
            ``nodes * count`` ranks.
        node_rank: this node's index, 0 .. nodes-1; its workers are global ranks ``node_rank * count`` on.
        master_addr / master_port: node 0's rendezvous address and port (required with ``nodes > 1``; default for
            one node: the loopback address and a free port).

    Returns:
        The return values of ``fn`` on this node, by local rank (picklable values).

    Raises:
        InvalidParameter: bad ``count``, device types, batch sizes, node rank or function reference, or several
            nodes without a master address and port.
        WorkerKilled: a worker was killed by a signal (transient).
        WorkerTimeout: the workers ran past ``timeout_seconds`` (transient).
        WorkerError: a worker exited non-zero without an exception, or raised one that could not be pickled.
        BaseException: whatever a worker's function raised first, re-raised here (classified as it would be in
            one process: ``torch.OutOfMemoryError`` is a device failure, a ``ValueError`` permanent).
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidParameter(f"count={count!r}; valid: an integer >= 1 (worker processes, one per device)")
    types = [device_type] * count if isinstance(device_type, str) else list(device_type)
    if len(types) != count:
        raise InvalidParameter(f"device_type lists {len(types)} device types for count={count}; valid: one, or one per rank")
    chosen = backend or backend_for(types)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise InvalidParameter(f"nodes={nodes!r}; valid: an integer >= 1")
    if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nodes:
        raise InvalidParameter(f"node_rank={node_rank!r} for nodes={nodes}; valid: 0 .. {nodes - 1}")
    if nodes > 1 and (not master_addr or not master_port):
        raise InvalidParameter(f"nodes={nodes} without master_addr and master_port; valid: node 0's address and rendezvous port")
    world = nodes * count
    if batch_sizes:
        batch_weights(batch_sizes)
        if len(batch_sizes) != world:
            raise InvalidParameter(f"batch_sizes has {len(batch_sizes)} entries for count={count}"
                                   + (f" on {nodes} nodes" if nodes > 1 else "") + "; valid: one per rank")
    payload = {
        "function": _reference(fn),
        "kwargs": pickle.dumps(dict(kwargs or {})),
        "device_types": types,
        "backend": chosen,
        "batch_sizes": list(batch_sizes),
        "deterministic": deterministic,
        "sys_path": list(sys.path),  # as multiprocessing's spawn does: the function's module resolves alike
    }
    where = {"nodes": nodes, "node_rank": node_rank, "master_addr": master_addr or "127.0.0.1", "master_port": master_port}
    for attempt in range(2):
        try:
            return _launch_once(payload, count, timeout_seconds=timeout_seconds, env=env, **where)
        except RuntimeError as exc:
            text = str(exc)
            if attempt == 0 and master_port is None and ("EADDRINUSE" in text or "address already in use" in text.lower()):
                continue  # the free port was taken before the rendezvous: once more with another
            raise
    raise AssertionError("unreachable")


def _launch_once(payload: Mapping[str, Any], count: int, *, timeout_seconds: float | None, env: Mapping[str, str] | None,
                 nodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1", master_port: int | None = None) -> list[Any]:
    first = node_rank * count  # this node's first global rank
    with tempfile.TemporaryDirectory(prefix="heteroflow-dist-") as tmp:
        tmp_path = Path(tmp)
        payload_file = tmp_path / "payload.pkl"
        payload_file.write_bytes(pickle.dumps(dict(payload)))
        port = master_port or free_port()
        run_id = secrets.token_hex(6) if nodes == 1 else f"{master_addr}:{port}"
        base = dict(os.environ)
        base.update(env or {})
        base[_PAYLOAD_ENV] = str(payload_file)
        base[_RESULT_DIR_ENV] = str(tmp_path)
        base[_PARENT_ENV] = str(os.getpid())
        if count > 1 and "OMP_NUM_THREADS" not in base:
            base["OMP_NUM_THREADS"] = str(_threads_per_worker(count))
        procs: list[subprocess.Popen[bytes]] = []
        code = "from heteroflow.components.training.distributed import _worker_main; _worker_main()"
        try:
            for local in range(count):
                worker_env = {**base, **worker_environment(first + local, nodes * count, master_port=port, master_addr=master_addr,
                                                            run_id=run_id, local_rank=local, local_world_size=count,
                                                            group_rank=node_rank)}
                procs.append(subprocess.Popen([sys.executable, "-c", code], env=worker_env))
            started = time.monotonic()
            while True:
                codes = [p.poll() for p in procs]
                if all(c == 0 for c in codes):
                    break
                if any(c not in (None, 0) for c in codes):
                    failed = {r for r, c in enumerate(codes) if c not in (None, 0)}
                    signalled = _terminate(procs, TERMINATE_GRACE_SECONDS)
                    ended = [_Ended(first + r, p.returncode, r in signalled) for r, p in enumerate(procs)]
                    ended.sort(key=lambda e: (e.rank - first not in failed, e.rank))
                    raise _cause(ended, tmp_path)
                if timeout_seconds is not None and time.monotonic() - started > timeout_seconds:
                    _terminate(procs, 0.0)
                    raise WorkerTimeout(f"{count} distributed workers still running after {timeout_seconds:g} s; stopped")
                time.sleep(_POLL_SECONDS)
        except BaseException:
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
                    p.wait()
            raise
        return [pickle.loads((tmp_path / f"result.{first + local}.pkl").read_bytes()) for local in range(count)]


# --- for the train step ------------------------------------------------------------------------------------


def _run_with_context(dctx: DistributedContext, *, train_fn: str, ctx_factory: str, ctx_kwargs: Mapping[str, Any]) -> Any:
    factory = _resolve(ctx_factory)
    fn = _resolve(train_fn)
    return fn(factory(dctx, **dict(ctx_kwargs)))


def run_distributed(
    train_fn: Callable[..., Any] | str,
    ctx_factory: Callable[..., Any] | str,
    count: int,
    backend: str | None = None,
    *,
    ctx_kwargs: Mapping[str, Any] | None = None,
    device_type: str | Sequence[str] = "cpu",
    batch_sizes: Sequence[int] = (),
    deterministic: bool = False,
    timeout_seconds: float | None = None,
) -> list[Any]:
    """Run a training function on ``count`` devices: in each worker, ``train_fn(ctx_factory(dctx, **ctx_kwargs))``.

    The shape the train step needs: ``ctx_factory`` builds the step's own training context (device, autocast
    dtype, loaders sharded by rank, checkpoint folder) from the worker's :class:`DistributedContext`; the
    training function is the user's, unchanged. With ``count == 1`` it still runs in one worker process with a
    one-rank process group (so code paths are the same); call ``train_fn`` directly to avoid the process.

    Args:
        train_fn: the training function (``fn(ctx)``) or its reference.
        ctx_factory: ``factory(dctx, **ctx_kwargs) -> ctx`` or its reference (top-level, importable).
        count: workers (devices), >= 1.
        backend: the process group backend (default: from the registry, :func:`backend_for`).
        ctx_kwargs: picklable keyword arguments for ``ctx_factory``.
        device_type, batch_sizes, deterministic, timeout_seconds: as in :func:`launch`.

    Returns:
        ``train_fn``'s return value by rank.

    Raises:
        as :func:`launch`.
    """
    return launch(
        _run_with_context,
        count,
        kwargs={"train_fn": _reference(train_fn), "ctx_factory": _reference(ctx_factory), "ctx_kwargs": dict(ctx_kwargs or {})},
        device_type=device_type,
        backend=backend,
        batch_sizes=batch_sizes,
        deterministic=deterministic,
        timeout_seconds=timeout_seconds,
    )
