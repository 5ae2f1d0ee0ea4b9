"""One worker process of a distributed run: the errors a worker's failure becomes (:class:`WorkerError`,
:class:`WorkerKilled`, :class:`WorkerTimeout`), the :class:`DistributedContext` its function receives (rank, device,
barrier, rank-0 checkpoints, DDP with the weighted hook), function references that travel to it, and its entry point
(``_worker_main``: joins the process group, runs the function, sends the result or the exception back). The launcher
is :func:`heteroflow.components.training.distributed.launch`.
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
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from heteroflow.components.devices.registry import cross_kind_backend, is_host_device_type
from heteroflow.components.errors import HeteroflowError, InvalidParameter
from heteroflow.components.training.gradients import comm_hook

__all__ = ["DistributedContext", "WorkerError", "WorkerKilled", "WorkerTimeout"]

_PAYLOAD_ENV = "HETEROFLOW_DIST_PAYLOAD"
_RESULT_DIR_ENV = "HETEROFLOW_DIST_RESULTS"
_PARENT_ENV = "HETEROFLOW_DIST_PARENT"
_RANKS_ENV = "HETEROFLOW_DIST_RANKS"


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

        if is_host_device_type(self.device_type):
            return torch.device(self.device_type)
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

        on_host = is_host_device_type(self.device_type)
        device_ids = None if on_host else [self.device_index]
        model = DistributedDataParallel(module, device_ids=device_ids, **ddp_kwargs)
        sizes = self.batch_sizes if (weighted or weighted is None) and self.batch_sizes else ()
        # an accelerator rank in a group of the host's backend (gloo: mixed device types) reduces CPU copies: gloo
        # cannot reduce NPU tensors
        relay = not on_host and self.backend == cross_kind_backend()
        state, hook = comm_hook(compression, batch_sizes=sizes, rank=self.rank, relay_through_cpu=relay)
        model.register_comm_hook(state, hook)
        return model


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


def _zygote_main() -> None:
    """Entry point of a launch's zygote (run by :func:`launch` on Linux): import torch once, then fork this node's
    workers from it, so ``count`` workers cost one interpreter start and one ``import torch`` (about 2 s of CPU
    each here) instead of ``count``.

    The fork happens before any tensor operation, device runtime or OpenMP pool exists in this process (the same
    point at which PyTorch's ``DataLoader`` forks its workers by default on Linux), and each child is a normal
    worker (:func:`_worker_main`) with its rank's ``torchrun`` variables added to the environment. The zygote
    writes each worker's pid (``pid.<local rank>``) and, as each one ends, its exit status as ``Popen.returncode``
    gives it (``exit.<local rank>``: the exit code, or minus the signal number), into the launch's results folder,
    and exits once all have ended. It dies with the launcher (``PR_SET_PDEATHSIG``), and its workers with it.
    """
    _die_with_parent()
    results = Path(os.environ[_RESULT_DIR_ENV])
    ranks: list[dict[str, str]] = pickle.loads(Path(os.environ[_RANKS_ENV]).read_bytes())
    payload = pickle.loads(Path(os.environ[_PAYLOAD_ENV]).read_bytes())
    with contextlib.suppress(Exception):  # what every worker imports; a failure here is reported by the worker itself
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401

        # torch.optim.Optimizer's first construction imports torch._dynamo (torch/_compile.py, _disable_dynamo):
        # about 0.8 s of CPU, paid once here instead of in every worker
        import torch._dynamo  # noqa: F401
    target = payload["function"].rpartition(":")[0]
    if not target.endswith(".py"):  # the function's module, with the caller's sys.path, as the worker resolves it
        saved = list(sys.path)
        sys.path[:] = list(payload["sys_path"]) + [p for p in sys.path if p not in payload["sys_path"]]
        try:
            importlib.import_module(target)
        except Exception:  # noqa: BLE001, S110 - each worker imports it again and reports the error itself
            pass
        finally:
            sys.path[:] = saved
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    for local, extra in enumerate(ranks):
        pid = os.fork()
        if pid == 0:
            os.environ.update(extra)
            os.environ[_PARENT_ENV] = str(os.getppid())
            _worker_main()  # ends with os._exit
            os._exit(1)  # pragma: no cover - _worker_main never returns
        children[pid] = local
        _write_atomic(results / f"pid.{local}", str(pid).encode())
    while children:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        local = children.pop(pid, None)
        if local is not None:
            _write_atomic(results / f"exit.{local}", str(os.waitstatus_to_exitcode(status)).encode())
    os._exit(0)


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
    if kind is not None:
        kind.set_device(device_index)  # nothing on the host
    elif not is_host_device_type(device_type):  # a type no kind drives as its own (Gaudi's hpu, an npu model)
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
