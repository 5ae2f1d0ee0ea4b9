"""Atomic, device-portable checkpoints (:class:`Checkpoint`): model, optimizer, scheduler and scaler states, RNG
states and the training function's extra values, saved from CPU copies into ``checkpoint.pt`` (with the step in
``checkpoint.json``), written atomically, and checked against the run's model and precision on load."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.cache.atomic import atomic_file, atomic_write_bytes
from heteroflow.components.errors import CheckpointError

if TYPE_CHECKING:  # torch is imported where it is used: train's parameter checks import this module
    from torch import nn

__all__ = ["CHECKPOINT_FILE", "CHECKPOINT_INFO", "Checkpoint"]

CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_INFO = "checkpoint.json"
_FORMAT = 2


def _to_cpu(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)],
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "python_gauss": random.getstate()[2],
    }


def _set_rng_state(state: Mapping[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate((state["python_version"], tuple(state["python"]), state.get("python_gauss")))


class Checkpoint:
    """Atomic, device-portable checkpoints in one folder (keyed by data, parameters and model; never device).

    Everything is saved from CPU copies (model, optimizer, scheduler and scaler states, RNG states, the data
    position, the partial epoch's loss and the per-epoch history), written to a temporary file, fsynced and
    renamed, so a checkpoint is complete or absent and loads on any device kind.

    Attributes:
        folder: the checkpoint folder.
        every_steps: optimizer steps between checkpoints.
        model: the model's :class:`ModelSpec` dict (checked on load).
        amp_dtype: the autocast dtype name of this run ("float32", "bfloat16", "float16").
        resumed_from_step: the step of the checkpoint loaded (0 before :meth:`load`, or on a fresh start).
        written: checkpoints written by this process.
        counters: the run's counters (``amp_skipped_steps``: steps the GradScaler skipped), saved with every
            checkpoint and restored in place on load, like ``history``.
    """

    def __init__(self, folder: Path, *, every_steps: int, model: Mapping[str, Any], amp_dtype: str,
                 total_steps: int, enabled: bool = True) -> None:
        self.folder = folder
        self.every_steps = every_steps
        self.model = dict(model)
        self.amp_dtype = amp_dtype
        self.total_steps = total_steps
        self.enabled = enabled
        self.resumed_from_step = 0
        self.written = 0
        self.history: list[dict[str, Any]] = []
        self.counters: dict[str, int] = {}  # run counters (``amp_skipped_steps``): saved, restored in place
        self.state: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return self.folder / CHECKPOINT_FILE

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due after optimizer step ``step`` (every ``every_steps``, not the last)."""
        return self.enabled and step % self.every_steps == 0 and step < self.total_steps

    def next_due(self, step: int) -> int:
        """The first optimizer step after ``step`` at which :meth:`due` holds, or -1 when none does (a loop compares
        its step counter with it instead of asking every step)."""
        if not self.enabled:
            return -1
        nxt = (step // self.every_steps + 1) * self.every_steps
        return nxt if nxt < self.total_steps else -1

    def save(self, step: int, *, model: nn.Module, optimizer: Any = None, scheduler: Any = None, scaler: Any = None,
             extra: Mapping[str, Any] | None = None) -> None:
        """Write a checkpoint after optimizer step ``step`` (atomically; CPU copies of every tensor).

        Args:
            step: optimizer steps done.
            model / optimizer / scheduler / scaler: their ``state_dict()`` is saved (None: left out).
            extra: JSON-like values the training function wants back (e.g. the partial epoch's loss sum).
        """
        import torch

        raw = model.module if hasattr(model, "module") else model  # DDP / DataParallel wrappers
        state = {
            "format": _FORMAT,
            "step": int(step),
            "model_spec": json.dumps(self.model, sort_keys=True, default=str),
            "amp_dtype": self.amp_dtype,
            "model": _to_cpu(raw.state_dict()),
            "rng": _rng_state(),
            "extra": _to_cpu(dict(extra or {})),
            "history": [dict(e) for e in self.history],
            "counters": {k: int(v) for k, v in self.counters.items()},
        }
        if optimizer is not None:
            state["optimizer"] = _to_cpu(optimizer.state_dict())
        if scheduler is not None:
            state["scheduler"] = _to_cpu(scheduler.state_dict())
        if scaler is not None:
            state["scaler"] = scaler.state_dict()
        with atomic_file(self.path) as fh:
            torch.save(state, fh)
        atomic_write_bytes(self.folder / CHECKPOINT_INFO,
                           json.dumps({"step": int(step), "total_steps": self.total_steps}).encode())
        self.written += 1

    def load(self, *, model: nn.Module, optimizer: Any = None, scheduler: Any = None, scaler: Any = None) -> dict[str, Any] | None:
        """Restore the last checkpoint into the objects given (on their devices) and the RNG states.

        Returns:
            None when there is no checkpoint; else ``{"step": int, "extra": dict}``.

        Raises:
            CheckpointError: the file cannot be read; it holds another model's weights; its run used fp16 (a
                GradScaler) but it has no scaler state. Each says to delete the folder to start over.
        """
        import torch

        if not self.path.is_file():
            return None
        where = f"checkpoint {self.path}"
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{where} cannot be loaded ({exc}); delete that folder to start over") from exc
        if not isinstance(state, dict) or "model" not in state or "step" not in state:
            raise CheckpointError(f"{where} is not a heteroflow checkpoint; delete that folder to start over")
        spec = state.get("model_spec")
        mine = json.dumps(self.model, sort_keys=True, default=str)
        if spec is not None and spec != mine:
            raise CheckpointError(f"{where} holds another model ({spec}, this run trains {mine}); delete that folder to start over")
        raw = model.module if hasattr(model, "module") else model
        try:
            raw.load_state_dict(state["model"])
        except RuntimeError as exc:
            first = " ".join(str(exc).split())[:300]
            raise CheckpointError(
                f"{where} holds weights of another model ({first}); the model's code changed since it was written: "
                "delete that folder to start over"
            ) from None
        if scaler is not None:
            if "scaler" in state:
                scaler.load_state_dict(state["scaler"])
            elif state.get("amp_dtype") == "float16":
                raise CheckpointError(
                    f"{where} was written by an fp16 run but holds no GradScaler state; it is damaged or was saved "
                    "without scaler=: delete that folder to start over"
                )
            # a bf16 or fp32 run's checkpoint resumed in fp16: a fresh scaler calibrates itself in a few steps
        try:
            if optimizer is not None and "optimizer" in state:
                optimizer.load_state_dict(state["optimizer"])
            if scheduler is not None and "scheduler" in state:
                scheduler.load_state_dict(state["scheduler"])
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{where}: the optimizer state does not fit ({exc}); delete that folder to start over") from None
        if "rng" in state:
            _set_rng_state(state["rng"])
        self.resumed_from_step = int(state["step"])
        self.state = state
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:  # said once, when it resumes
            total = f" of {self.total_steps}" if self.total_steps else ""
            print(f"train: resuming from step {self.resumed_from_step}{total} ({where})", file=sys.stderr, flush=True)
        saved = state.get("history")
        if not isinstance(saved, list):  # a checkpoint of an earlier release: the built-in loop kept it in extra
            saved = (state.get("extra") or {}).get("history") or []
        self.history[:] = [dict(e) for e in saved if isinstance(e, dict)]
        counters = state.get("counters")
        self.counters.clear()
        self.counters.update({str(k): int(v) for k, v in counters.items()} if isinstance(counters, dict) else {})
        return {"step": int(state["step"]), "extra": state.get("extra", {})}
