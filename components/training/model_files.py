"""The trained model's files: ``model.pt`` (the CPU state dict) and ``model.json`` (the model factory and its
arguments, classes, data, parameters), written atomically by train and loaded back for any factory-built model
(split out of :mod:`heteroflow.components.training.step`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heteroflow.cache.atomic import atomic_directory
from heteroflow.components.data.preprocess import TRANSFORM_FILES, read_meta
from heteroflow.components.errors import CheckpointError
from heteroflow.components.training.device import resolve_device

if TYPE_CHECKING:
    import torch

__all__ = ["MODEL_CONFIG", "MODEL_WEIGHTS", "build_model", "load_model"]

MODEL_WEIGHTS = "model.pt"
MODEL_CONFIG = "model.json"


def build_model(in_features: int, num_classes: int, hidden_units: int) -> torch.nn.Module:
    """The MLP classifier: input ``(batch, in_features)`` float32, output logits ``(batch, num_classes)``
    (:func:`heteroflow.components.training.loop.mlp`, the built-in model factory, for one-dimensional inputs)."""
    from heteroflow.components.training.loop import mlp

    return mlp(in_features, num_classes, hidden_units)


def _write_model(model_dir: str | os.PathLike[str], model: torch.nn.Module, *, dataset_dir: str | os.PathLike[str],
                 splits: Any, spec: Any, params: dict[str, Any], steps: int, precision: str,
                 device: str = "cpu", device_kind: str | None = None) -> Path:
    """Write ``model.pt`` (CPU state dict), ``model.json`` and the table transformation, atomically."""
    import torch

    from heteroflow.components.devices import host_kind
    from heteroflow.components.training.loop import BUILTIN_MODEL

    meta: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        meta = read_meta(dataset_dir)
    out = Path(model_dir)
    with atomic_directory(out) as tmp:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, tmp / MODEL_WEIGHTS)
        # the fitted transformation travels with the model (and into the archive); a model trained on a
        # dataset_factory's samples takes those, not the run's table: the table's transformation is not its own
        factory = (splits.info or {}).get("kind") == "factory"
        transform_files = [] if factory else [name for name in TRANSFORM_FILES if Path(dataset_dir, name).is_file()]
        for name in transform_files:
            shutil.copyfile(Path(dataset_dir, name), tmp / name)
        config = {
            "format": 2,
            "model": spec.to_dict(),
            "architecture": "mlp" if spec.ref == BUILTIN_MODEL else spec.ref,
            "in_features": math.prod(splits.input_shape),
            "input_shape": list(splits.input_shape),
            "hidden_units": spec.args.get("hidden_units", params["hidden_units"]),  # model_args wins over the default
            "num_classes": len(splits.classes),
            "classes": list(splits.classes),
            "data": splits.info,
            "label_column": None if factory else meta.get("label_column"),
            "transformation": TRANSFORM_FILES[0] if transform_files else None,
            "params": params,
            "precision": precision,
            "device": device,  # where it trained (lineage); not part of params: the checkpoint key ignores devices
            "device_kind": device_kind or host_kind().value,  # default: the host kind's (cpu)
            "steps": steps,
        }
        simulated = _simulated_kinds(config["device_kind"])
        if simulated:  # a rehearsal (--simulate-devices): the kind was simulated and the model trained on the CPU
            config["simulated"] = simulated
        (tmp / MODEL_CONFIG).write_text(json.dumps(config, indent=2, default=str), encoding="utf-8")
    return out


def _simulated_kinds(device_kind: str) -> list[str]:
    """The kinds of ``device_kind`` (``gpu``, or a mixed job's ``gpu+npu``) the run simulates
    (``HETEROFLOW_SIMULATE_DEVICES``, :func:`heteroflow.components.core.failures.simulated_devices`); [] when none
    is, or the setting cannot be read (the run checked it when it started)."""
    from heteroflow.components.core.failures import simulated_devices
    from heteroflow.components.errors import InvalidParameter

    try:
        simulated = simulated_devices()
    except InvalidParameter:
        return []
    return [k for k in str(device_kind).split("+") if k in simulated]


def load_model(model_dir: str | os.PathLike[str], device: str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """Load what :func:`train` wrote, for any factory-built model: the model in eval mode on ``device``, and its
    ``model.json`` config (the factory and its arguments rebuild the model; the state dict fills it).

    Raises:
        CheckpointError: the folder is not a heteroflow model, or its weights do not fit the factory's model.
        InvalidParameter: the model factory cannot be imported where the model is loaded.
    """
    import torch

    from heteroflow.components.training.loop import ModelSpec

    try:
        config = json.loads(Path(model_dir, MODEL_CONFIG).read_text(encoding="utf-8"))
        state = torch.load(Path(model_dir, MODEL_WEIGHTS), map_location="cpu", weights_only=True)
    except (FileNotFoundError, ValueError) as exc:
        raise CheckpointError(f"{model_dir} is not a heteroflow model ({exc}); run train first") from None
    if "model" in config:
        net = ModelSpec(ref=config["model"]["factory"], args=config["model"]["args"]).build()
    else:  # written before model factories (heteroflow <= format 1): the MLP
        net = build_model(config["in_features"], config["num_classes"], config["hidden_units"])
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{model_dir}: the weights do not fit the model its factory builds ({' '.join(str(exc).split())[:300]})") from None
    return net.to(resolve_device(device)).eval(), config
