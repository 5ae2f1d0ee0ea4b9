"""Portable models: a trained model exported to ONNX, checked, and run with onnxruntime on the CPU.

The ONNX model takes the *preprocessed* features, float32 ``(batch, *input_shape)`` (``model.json``'s
``input_shape``; the batch axis is dynamic), and returns the logits ``(batch, num_classes)``: the same tensors the
PyTorch model takes and returns. A table's transformation (``transform.joblib``, scikit-learn) and an image's decoding
stay outside the ONNX graph; :func:`heteroflow.components.models.predict.load_archived` with ``format="onnx"``
applies them first, then runs the ONNX model, so raw rows or images predict the same classes as with PyTorch.

Export (:func:`export_onnx`) uses ``torch.onnx.export`` with the dynamo exporter (``torch.export`` plus
onnxscript: https://docs.pytorch.org/docs/stable/onnx_export.html) and falls back to the TorchScript exporter,
with a notice, where onnxscript is not installed or the dynamo exporter fails on the model. The file is checked
with ``onnx.checker.check_model(full_check=True)`` and its outputs compared with PyTorch's on a sample input
before it is moved into place; it is written to a temporary file and linked into place, so a file at the path is
complete, and an existing file is never replaced.

onnx, onnxruntime and onnxscript are the ``onnx`` extra (``pip install 'heteroflow[onnx]'``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from heteroflow.cache.atomic import current_umask
from heteroflow.components.errors import ArchiveError, InvalidParameter

__all__ = [
    "EXPORT_FORMATS",
    "ONNX_FILE",
    "ONNX_INPUT",
    "ONNX_OUTPUT",
    "OnnxExport",
    "OnnxRunner",
    "check_export_formats",
    "export_onnx",
    "missing_onnx_packages",
    "onnx_file_of",
    "parse_export_formats",
]

EXPORT_FORMATS = ("onnx",)
"""The formats a model can be exported to besides PyTorch's own (``model.pt`` + ``model.json``)."""
ONNX_FILE = "model.onnx"
ONNX_INPUT = "features"
"""The ONNX model's input: preprocessed features, float32 ``(batch, *input_shape)``."""
ONNX_OUTPUT = "logits"
"""The ONNX model's output: float32 ``(batch, num_classes)``, the PyTorch model's logits."""
_PACKAGES = ("onnx", "onnxruntime")
_EXTRA_HINT = "pip install 'heteroflow[onnx]' (onnx, onnxruntime, onnxscript)"


def missing_onnx_packages() -> list[str]:
    """The packages ONNX export and prediction need that are not installed (``onnx``, ``onnxruntime``)."""
    return [name for name in _PACKAGES if importlib.util.find_spec(name) is None]


def parse_export_formats(text: str) -> tuple[str, ...]:
    """``export_formats`` as a tuple: comma-separated names from :data:`EXPORT_FORMATS`, empty for none.

    Raises:
        InvalidParameter: a name that is not an export format (the message lists the valid ones).
    """
    names = tuple(dict.fromkeys(p.strip().lower() for p in str(text or "").split(",") if p.strip()))
    bad = [n for n in names if n not in EXPORT_FORMATS]
    if bad:
        raise InvalidParameter(
            f"export_formats={text!r}: {', '.join(map(repr, bad))} is not an export format; valid: "
            f"{', '.join(EXPORT_FORMATS)} (comma-separated), or empty for PyTorch's own files only"
        )
    return names


def check_export_formats(export_formats: str = "") -> None:
    """Check ``export_formats`` before a run: known names, and the packages each needs installed.

    Raises:
        InvalidParameter: an unknown format, or ``onnx`` without the onnx extra installed.
    """
    if "onnx" in parse_export_formats(export_formats) and (missing := missing_onnx_packages()):
        raise InvalidParameter(f"export_formats=onnx needs {', '.join(missing)} installed: {_EXTRA_HINT}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OnnxExport:
    """One ONNX export.

    Attributes:
        path: the ONNX file.
        exporter: ``dynamo`` (``torch.export`` + onnxscript) or ``torchscript`` (the fallback).
        opset: the ONNX opset of the default domain.
        input_shape: one sample's shape; the model's input is ``(batch, *input_shape)`` float32.
        max_abs_diff: the largest absolute difference between ONNX Runtime's and PyTorch's logits on the sample
            input checked at export.
        notice: why the TorchScript exporter was used, else None.
        sha256: the file's sha256.
    """

    path: Path
    exporter: str
    opset: int
    input_shape: tuple[int, ...]
    max_abs_diff: float
    notice: str | None = None
    sha256: str = ""

    def record(self, relative_to: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """The facts the archive record keeps (``formats.onnx``): JSON-ready, the path relative to ``relative_to``."""
        path = self.path.relative_to(relative_to).as_posix() if relative_to is not None else str(self.path)
        return {
            "path": path,
            "input": {"name": ONNX_INPUT, "shape": ["batch", *self.input_shape], "dtype": "float32",
                      "takes": "preprocessed features: heteroflow's transformation (model/transform.joblib) or "
                               "image decoding first; heteroflow predict --format onnx applies it"},
            "output": {"name": ONNX_OUTPUT, "shape": ["batch", "num_classes"], "dtype": "float32", "is": "logits"},
            "exporter": self.exporter,
            "opset": self.opset,
            "max_abs_diff": self.max_abs_diff,
            "sha256": self.sha256,
            **({"notice": self.notice} if self.notice else {}),
        }


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The dynamo exporter logs a warning per torchvision operator it cannot register (torchvision absent) and
    deprecation warnings of torch internals: neither is the user's concern."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.onnx._internal.exporter._registration", "torch.export")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _export_dynamo(model: Any, example: Any, target: Path, opset: int | None) -> None:
    import torch

    batch = torch.export.Dim("batch", min=1)
    kwargs: dict[str, Any] = {"opset_version": opset} if opset else {}
    program = torch.onnx.export(
        model, (example,), dynamo=True, input_names=[ONNX_INPUT], output_names=[ONNX_OUTPUT],
        dynamic_shapes=({0: batch},), verbose=False, report=False, **kwargs,
    )
    program.save(str(target))


def _export_torchscript(model: Any, example: Any, target: Path, opset: int | None) -> None:
    import torch

    kwargs: dict[str, Any] = {"opset_version": opset} if opset else {}
    torch.onnx.export(
        model, (example,), str(target), dynamo=False, input_names=[ONNX_INPUT], output_names=[ONNX_OUTPUT],
        dynamic_axes={ONNX_INPUT: {0: "batch"}, ONNX_OUTPUT: {0: "batch"}}, **kwargs,
    )


def _file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def export_onnx(
    model_dir: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    opset: int | None = None,
    exporter: str = "dynamo",
    atol: float = 1e-4,
    rtol: float = 1e-3,
) -> OnnxExport:
    """Export the model in ``model_dir`` (train's output: ``model.pt`` + ``model.json``) to ONNX at ``path``.

    Args:
        model_dir: a heteroflow model folder (train's output, or an archive version's ``model/``).
        path: the ONNX file to write; its folder is made. An existing file is never replaced.
        opset: the ONNX opset; None: the exporter's default.
        exporter: ``dynamo`` (falls back to ``torchscript`` with a notice, :class:`RuntimeWarning`) or
            ``torchscript``.
        atol / rtol: how close ONNX Runtime's logits must be to PyTorch's on the sample input
            (``|onnx - torch| <= atol + rtol * |torch|``, :func:`numpy.allclose`).

    Returns:
        An :class:`OnnxExport`.

    Raises:
        InvalidParameter: ``path`` exists, a bad ``exporter``, or onnx / onnxruntime are not installed.
        CheckpointError: ``model_dir`` holds no heteroflow model.
        ArchiveError: both exporters failed, the checker refused the file, or its outputs differ from PyTorch's.
    """
    if exporter not in ("dynamo", "torchscript"):
        raise InvalidParameter(f"exporter={exporter!r}; valid: dynamo, torchscript")
    if missing := missing_onnx_packages():
        raise InvalidParameter(f"ONNX export needs {', '.join(missing)} installed: {_EXTRA_HINT}")
    import numpy as np
    import onnx
    import torch

    from heteroflow.components.training.model_files import load_model

    target = Path(path)
    if target.exists():
        raise InvalidParameter(f"{target} exists; ONNX export never replaces a file: give another path")
    model, config = load_model(model_dir, "cpu")
    input_shape = tuple(int(d) for d in (config.get("input_shape") or [config["in_features"]]))
    generator = torch.Generator().manual_seed(0)
    example = torch.rand((2, *input_shape), generator=generator, dtype=torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.incoming-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    notice = None
    used = exporter
    try:
        with _quiet_exporter():
            if exporter == "dynamo" and importlib.util.find_spec("onnxscript") is None:
                notice = "onnxscript is not installed (the dynamo exporter needs it): used the TorchScript exporter"
            elif exporter == "dynamo":
                try:
                    _export_dynamo(model, example, tmp, opset)
                except Exception as exc:  # any exporter failure: the TorchScript exporter may still handle the model
                    reason = " ".join(str(exc).split())[:300]
                    notice = f"the dynamo exporter failed ({type(exc).__name__}: {reason}): used the TorchScript exporter"
                    tmp.unlink(missing_ok=True)
            if notice is not None or exporter == "torchscript":
                used = "torchscript"
                try:
                    _export_torchscript(model, example, tmp, opset)
                except Exception as exc:
                    raise ArchiveError(
                        f"{model_dir}: the model cannot be exported to ONNX ({notice + '; ' if notice else ''}"
                        f"TorchScript exporter: {type(exc).__name__}: {' '.join(str(exc).split())[:300]})"
                    ) from exc
        if notice is not None:
            warnings.warn(f"ONNX export of {model_dir}: {notice}", RuntimeWarning, stacklevel=2)
        try:
            onnx.checker.check_model(str(tmp), full_check=True)
        except onnx.checker.ValidationError as exc:
            raise ArchiveError(f"the ONNX export of {model_dir} fails onnx.checker: {' '.join(str(exc).split())[:300]}") from exc
        proto = onnx.load(str(tmp), load_external_data=False)
        opset_used = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
        with torch.no_grad():
            expected = model(example).numpy()
        got = OnnxRunner(tmp).logits(example.numpy())
        diff = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else float("inf")
        if got.shape != expected.shape or not np.allclose(got, expected, atol=atol, rtol=rtol):
            raise ArchiveError(
                f"the ONNX export of {model_dir} computes other outputs than PyTorch on a sample input "
                f"(shape {got.shape} vs {expected.shape}, largest difference {diff:.3g} > atol {atol} + rtol {rtol})"
            )
        digest = _file_sha256(tmp)
        os.chmod(tmp, 0o644 & ~current_umask())
        try:
            os.link(tmp, target)  # fails on an existing target: never replaces a file, even one made meanwhile
        except FileExistsError:
            raise InvalidParameter(f"{target} exists; ONNX export never replaces a file: give another path") from None
        except OSError:  # a filesystem without hard links: rename (still atomic; the exists check above stands)
            if target.exists():
                raise InvalidParameter(f"{target} exists; ONNX export never replaces a file: give another path") from None
            os.rename(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return OnnxExport(path=target, exporter=used, opset=int(opset_used), input_shape=input_shape,
                      max_abs_diff=diff, notice=notice, sha256=digest)


class OnnxRunner:
    """An ONNX model run with onnxruntime on the CPU (``CPUExecutionProvider``).

    Args:
        path: the ONNX file (written by :func:`export_onnx`: input ``features``, output ``logits``).

    Raises:
        InvalidParameter: onnxruntime is not installed.
        CheckpointError: the file is missing or not an ONNX model onnxruntime can load.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if importlib.util.find_spec("onnxruntime") is None:
            raise InvalidParameter(f"running an ONNX model needs onnxruntime installed: {_EXTRA_HINT}")
        import onnxruntime as ort

        from heteroflow.components.errors import CheckpointError

        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path} does not exist; no ONNX model there")
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only
        try:
            self.session = ort.InferenceSession(str(self.path), sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
            raise CheckpointError(f"{self.path} is not an ONNX model onnxruntime can load ({' '.join(str(exc).split())[:300]})") from None
        self.input_name = self.session.get_inputs()[0].name
        self.output_name = self.session.get_outputs()[0].name

    def logits(self, features: Any) -> Any:
        """The model's outputs for ``features``: float32 array ``(n, *input_shape)`` -> ``(n, num_classes)``."""
        import numpy as np

        x = np.ascontiguousarray(features, dtype=np.float32)
        return self.session.run([self.output_name], {self.input_name: x})[0]


def onnx_file_of(version_dir: str | os.PathLike[str]) -> Path | None:
    """The ONNX file an archive version holds (its lineage's ``formats.onnx.path``), else None."""
    folder = Path(version_dir)
    try:
        lineage = json.loads((folder / "lineage.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = (lineage.get("formats") or {}).get("onnx") if isinstance(lineage, dict) else None
    if isinstance(entry, dict) and entry.get("path") and (folder / entry["path"]).is_file():
        return folder / entry["path"]
    return None
