"""Several devices on one node: one worker process per device, torchrun's environment, a failure of any worker is
a failure of the step, and gradients combined weighted by per-rank batch size.

Launch
    :func:`launch` starts ``count`` worker processes with the environment ``torchrun`` gives its workers [TR]: ``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (0), ``ROLE_RANK``, ``ROLE_WORLD_SIZE``,
    ``MASTER_ADDR`` (``127.0.0.1``), ``MASTER_PORT`` (a free port) and ``TORCHELASTIC_RUN_ID``. On Linux one fresh
    interpreter (a zygote) imports torch and forks the workers before any tensor operation, device runtime or
    OpenMP pool exists in it, so ``count`` workers cost one ``import torch`` (:data:`FORK_WORKERS`); elsewhere
    each worker is a fresh interpreter. No CUDA/NPU runtime or OpenMP pool ever crosses a ``fork``. Each worker calls
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

Where the parts live: the rendezvous (:func:`backend_for`, :func:`worker_environment`, :func:`node_role`) in
:mod:`heteroflow.components.training.rendezvous`; the worker side (:class:`DistributedContext`, the worker errors,
the worker's entry point) in :mod:`heteroflow.components.training.worker`; weighted gradients, compression, the
learning rate and rank batches in :mod:`heteroflow.components.training.gradients`. This module keeps the launcher
(:func:`launch`, :func:`run_distributed`) and re-exports the others' names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.training.gradients import (
    COMPRESSIONS,
    RankBatches,
    batch_weights,
    comm_hook,
    cpu_relay_hook,
    rank_slice,
    scaled_learning_rate,
    weighted_hook,
)
from heteroflow.components.training.rendezvous import (
    NODES_ENV,
    NodeRole,
    backend_for,
    free_port,
    node_role,
    worker_environment,
)
from heteroflow.components.training.worker import (
    _PARENT_ENV,
    _PAYLOAD_ENV,
    _RANKS_ENV,
    _RESULT_DIR_ENV,
    DistributedContext,
    WorkerError,
    WorkerKilled,
    WorkerTimeout,
    _reference,
    _resolve,
    _worker_main,
)

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
# the names of gradients, rendezvous and worker above are re-exported, so `from ...training.distributed import X`
# keeps working; _worker_main too (what a worker process ran before the split)

TERMINATE_GRACE_SECONDS = 5.0
"""After a worker fails, how long the others get to exit on their own, then after SIGTERM, before SIGKILL (s)."""

_POLL_SECONDS = 0.05


# --- the launcher side -------------------------------------------------------------------------------------


def _threads_per_worker(count: int) -> int:
    """Intra-op threads per worker: the CPUs this process may use, shared out (torchrun sets 1; on a CPU-only
    node that leaves most cores idle)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // count)


FORK_WORKERS = sys.platform.startswith("linux")
"""Start a launch's workers by forking them from one interpreter that imported torch (a zygote,
:func:`heteroflow.components.training.worker._zygote_main`) instead of one interpreter each: on Linux, where
``fork`` is the default start method of ``multiprocessing`` and of PyTorch's ``DataLoader``. Elsewhere (macOS,
Windows) each worker is a fresh interpreter."""


class _ForkedWorker:
    """A worker the zygote forked (the launcher's grandchild), with the ``subprocess.Popen`` methods the launcher
    uses: its pid and exit status come from the files the zygote writes (``pid.<local>``, ``exit.<local>``). A
    worker with no exit status when the zygote has ended went down with it: ``returncode`` is then the zygote's
    (its exit code, or minus the signal that ended it), or ``-SIGKILL`` (``PR_SET_PDEATHSIG``) if it exited 0."""

    def __init__(self, zygote: subprocess.Popen[bytes], folder: Path, local: int) -> None:
        self.zygote, self.folder, self.local = zygote, folder, local
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int((self.folder / f"pid.{self.local}").read_text())
        return None

    def poll(self) -> int | None:
        if self.returncode is None:
            ended = self.zygote.poll()
            with contextlib.suppress(OSError, ValueError):
                self.returncode = int((self.folder / f"exit.{self.local}").read_text())
            if self.returncode is None and ended is not None:
                self.returncode = ended if ended != 0 else -signal.SIGKILL
        return self.returncode

    def send_signal(self, sig: int) -> None:
        pid = self.pid
        if pid is None:  # not forked yet: the zygote, and with it whatever it forks
            self.zygote.send_signal(sig)
        elif self.poll() is None:
            os.kill(pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"worker {self.local}", timeout or 0.0)
            time.sleep(_POLL_SECONDS)
        return self.returncode  # type: ignore[return-value]


@dataclasses.dataclass(slots=True)
class _Ended:
    rank: int
    returncode: int
    by_us: bool


def _terminate(procs: Sequence[Any], grace: float) -> set[int]:
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
        procs: list[Any] = []
        zygote: subprocess.Popen[bytes] | None = None
        ranks = [worker_environment(first + local, nodes * count, master_port=port, master_addr=master_addr, run_id=run_id,
                                    local_rank=local, local_world_size=count, group_rank=node_rank) for local in range(count)]
        try:
            if FORK_WORKERS:  # one interpreter imports torch, then forks the workers (worker._zygote_main)
                (tmp_path / "ranks.pkl").write_bytes(pickle.dumps(ranks))
                code = "from heteroflow.components.training.worker import _zygote_main; _zygote_main()"
                zygote = subprocess.Popen([sys.executable, "-c", code], env={**base, _RANKS_ENV: str(tmp_path / "ranks.pkl")})
                procs = [_ForkedWorker(zygote, tmp_path, local) for local in range(count)]
            else:
                code = "from heteroflow.components.training.worker import _worker_main; _worker_main()"
                procs = [subprocess.Popen([sys.executable, "-c", code], env={**base, **extra}) for extra in ranks]
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
        finally:
            if zygote is not None:  # it exits once its workers have ended (or, killed, takes them with it)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    zygote.wait(timeout=TERMINATE_GRACE_SECONDS)
                if zygote.poll() is None:
                    zygote.kill()
                    zygote.wait()
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
