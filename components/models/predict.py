"""Predict with an archived (or freshly trained) model on raw rows of the original table.

An archive version ``<archive_root>/<name>/v<N>/`` holds ``model/`` (the weights, ``model.json``, and the
transformation preprocess fitted: ``transform.joblib`` and ``transform.json``), so it alone turns raw rows
into classes::

    from heteroflow.components.models.predict import load_archived

    model = load_archived("~/.cache/heteroflow/archive/titanic-mlp/v1")
    model.predict("passengers.csv")            # a file read the way training read its files
    model.predict(frame)                        # a pandas DataFrame with the input columns (others ignored)
    model.predict([{"Pclass": 3, "Sex": "male", "Age": 22}, ...])

A model trained on an image folder takes images instead (file paths, a folder of images, PIL images, or
uint8 arrays ``(n, H, W)`` / ``(n, H, W, C)``), decoded the way training decoded them; one trained on tensors or
a dataset factory takes an array or tensor of samples ``(n, *input_shape)``::

    model = load_archived("~/.cache/heteroflow/archive/digits-images-cnn/v1")
    model.predict(["3.png", "7.png"])

An archive version exported to ONNX (``export_formats=onnx``) predicts with onnxruntime on the CPU instead of
PyTorch: ``load_archived(path, format="onnx")``. The transformation (or image decoding) runs first, as above; the
ONNX model takes the preprocessed features (:mod:`heteroflow.components.models.onnx`), and the model's factory
need not be importable.

The transformation is a pickle (scikit-learn's own persistence, through joblib): load only archives you
trust, with a scikit-learn close to the one recorded in ``transform.json`` (``versions``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from heteroflow.cache.errors import DatasetError
from heteroflow.components.errors import CheckpointError, InvalidParameter

if TYPE_CHECKING:
    import pandas as pd
    import torch

__all__ = ["PREDICT_FORMATS", "ArchivedModel", "load_archived"]

PREDICT_FORMATS = ("pytorch", "onnx")
"""The formats :func:`load_archived` runs: PyTorch (the factory rebuilds the model) or ONNX (onnxruntime, CPU)."""

_MODEL_REF = re.compile(r"(?P<name>[a-z0-9][a-z0-9._-]{0,62})(?::v?(?P<version>\d+))?")
"""``name``, ``name:vN`` or ``name:N``: an archived model as the CLI names it (``heteroflow archive show``)."""


def image_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The images :meth:`ArchivedModel.predict` reads from ``folder``, in the order of its predictions: every file
    with an image suffix in it or its subfolders, sorted by path."""
    from heteroflow.components.data.readers import IMAGE_SUFFIXES

    return sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


class ArchivedModel:
    """A trained model with its transformation.

    Attributes:
        model_dir: the model folder.
        classes: class names, index = the model's output index.
        label_column: the class column of the training table.
        columns: the input columns it reads, in order.
        config: ``model.json``.
        schema: ``transform.json``.
        format: ``pytorch``, or ``onnx`` (the ONNX model runs with onnxruntime on the CPU).
    """

    def __init__(self, model_dir: Path, model: torch.nn.Module | None, config: dict[str, Any], transform: Any,
                 schema: dict[str, Any], *, onnx: Any = None) -> None:
        self.model_dir = model_dir
        self._model = model
        self._onnx = onnx
        self.format = "onnx" if onnx is not None else "pytorch"
        self._transform = transform
        self.config = config
        self.schema = schema
        self.kind: str = (config.get("data") or {}).get("kind", "table")
        self.classes: tuple[str, ...] = tuple(config["classes"])
        self.label_column: str = schema.get("label_column", "")
        self.columns: tuple[str, ...] = tuple(c["name"] for c in schema.get("columns", ()))

    @property
    def model(self) -> torch.nn.Module:
        """The ``torch.nn.Module`` (eval mode), as its factory built it.

        Raises:
            CheckpointError: loaded as ONNX (``format="onnx"``): no PyTorch module was built.
        """
        if self._model is None:
            raise CheckpointError(f"{self.model_dir} was loaded as ONNX (format='onnx'): load it with format='pytorch' for the torch module")
        return self._model

    def _image_features(self, images: Any) -> np.ndarray:
        from heteroflow.components.data.readers import IMAGE_SUFFIXES, decode_image

        data = self.config["data"]
        mode, size = data["image_mode"], tuple(data["image_size"])
        if isinstance(images, (str, os.PathLike)) and Path(images).is_dir():
            folder = images
            images = image_files(images)
            if not images:  # np.stack said "need at least one array to stack"
                raise InvalidParameter(f"{folder} is a folder without images ({', '.join(sorted(IMAGE_SUFFIXES))}, in it "
                                       "or its subfolders); give an image, or a folder of them")
        elif isinstance(images, (str, os.PathLike)):
            images = [images]
        if isinstance(images, np.ndarray) and images.dtype != object:
            arr = images.astype(np.float32) / (255.0 if images.dtype == np.uint8 else 1.0)
            if arr.ndim == 3:
                arr = arr[:, None]
            elif arr.ndim == 4 and arr.shape[-1] in (1, 3) and arr.shape[1] not in (1, 3):
                arr = arr.transpose(0, 3, 1, 2)
            return np.ascontiguousarray(arr, dtype=np.float32)
        out = []
        for img in images:
            if isinstance(img, (str, os.PathLike)):
                out.append(decode_image(img, mode=mode, size=size))  # type: ignore[arg-type]
            else:  # a PIL image
                x = np.asarray(img.convert(mode).resize(size), dtype=np.float32) / 255.0
                out.append(x[None] if x.ndim == 2 else x.transpose(2, 0, 1))
        return np.stack(out).astype(np.float32)

    def read(self, path: str | os.PathLike[str]) -> pd.DataFrame:
        """A table file read (and cleaned) the way training read its files: every column, index = row position."""
        from heteroflow.components.core.step import with_defaults
        from heteroflow.components.data.datasets import read_table
        from heteroflow.components.data.preprocess import preprocess

        read = with_defaults(preprocess, self.schema.get("read", {}))  # an archive without them: preprocess's defaults
        return read_table(path, header=read["header"], delimiter=read["delimiter"]).frame

    def features(self, rows: Any) -> np.ndarray:
        """The model's input for raw rows: float32 ``(n, num_features)``.

        Args:
            rows: a file path (read with :meth:`read`), a DataFrame, a sequence of mappings, or a 2-D
                sequence of the input columns in order (see
                :func:`heteroflow.components.data.tabular.prepare_rows`).

        Raises:
            DatasetError: a column is absent, a cell is not of its column's kind, or a value is missing that the
                transformation cannot fill.
            InvalidParameter: a file path for a model trained on samples (a dataset factory's, tensors).
        """
        if self.kind == "image_folder":
            return self._image_features(rows)
        if self.kind != "table":
            import torch

            if isinstance(rows, (str, os.PathLike)):  # a table or image file: not what this model's inputs were
                data = self.config.get("data") or {}
                source = f"dataset_factory {data['dataset_factory']}'s" if data.get("dataset_factory") else f"{self.kind}"
                raise InvalidParameter(
                    f"{rows}: this model was trained on {source} samples of shape {tuple(self.config.get('input_shape') or ())}, "
                    "not on a table's rows or images; give it an array of shape (n, *that shape): a .npy file "
                    "(heteroflow predict), a numpy array or a torch tensor (load_archived(...).predict)"
                )
            return np.asarray(rows.numpy() if isinstance(rows, torch.Tensor) else rows, dtype=np.float32)
        from heteroflow.components.data.tabular import prepare_rows

        where = "rows"
        if isinstance(rows, (str, os.PathLike)):
            if Path(rows).is_dir():  # read_table's "unsupported file type '(no suffix)'" left a folder unexplained
                raise InvalidParameter(_folder_of_tables(Path(rows)))
            where, rows = str(rows), self.read(rows)
        frame = prepare_rows(rows, self.schema, where=where)
        with np.errstate(all="ignore"):
            x = np.asarray(self._transform.transform(frame), dtype=np.float32)
        if not np.isfinite(x).all():
            r = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise DatasetError(f"{where}: row {r} gives features that are not finite numbers (a value far out of the training range)")
        return x

    def predict_proba(self, rows: Any) -> np.ndarray:
        """Class probabilities (softmax of the model's outputs), float32 ``(n, len(classes))``."""
        x = self.features(rows)
        if self._onnx is not None:
            logits = np.asarray(self._onnx.logits(x), dtype=np.float64)
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        import torch

        with torch.no_grad():
            logits = self._model(torch.from_numpy(x).to(next(self._model.parameters()).device))
            return torch.softmax(logits, dim=1).cpu().numpy()

    def predict(self, rows: Any) -> np.ndarray:
        """The predicted class of each row, shape ``(n,)``: integers (int64) when every class name is an integer
        (the class column held numbers, such as ``Survived`` 0/1), else the class names as strings."""
        labels: np.ndarray = np.asarray(self.classes, dtype=str)
        if all(c.lstrip("-").isdigit() and str(int(c)) == c for c in self.classes):
            labels = labels.astype(np.int64)
        return labels[self.predict_proba(rows).argmax(axis=1)]


def _folder_of_tables(folder: Path) -> str:
    """Why a table model does not predict ``folder``, and which of its files it would."""
    from heteroflow.components.data.formats import REGISTRY, TABLE

    try:
        tables = sorted(p for p in folder.iterdir() if p.is_file() and REGISTRY.is_data_file(p.name, TABLE))
    except OSError:
        tables = []
    if not tables:
        return (f"{folder} is a folder, and holds no table file; give one table file "
                f"({', '.join(REGISTRY.suffixes(TABLE))}) with the columns the model was trained on")
    from heteroflow.components.data.csvformat import file_not_text

    # the example is one that reads: not a .csv or .tsv that holds binary bytes (a zip saved as .csv)
    readable = [p for p in tables if p.suffix.lower() not in (".csv", ".tsv") or file_not_text(p) is None]
    many = f"it holds {len(tables)} table files: predict each in turn" if len(tables) > 1 else "it holds one"
    if not readable:
        none = "it is not text" if len(tables) == 1 else "none of them is text"
        return f"{folder} is a folder; give one table file instead ({many}, and {none}: {tables[0].name}: {file_not_text(tables[0])})"
    return f"{folder} is a folder; give one table file instead, e.g. {readable[0]} ({many})"


def load_archived(path: str | os.PathLike[str], *, device: str = "cpu", archive_root: str | os.PathLike[str] | None = None,
                  format: str = "pytorch") -> ArchivedModel:  # noqa: A002 - the CLI's --format
    """Load a model (any factory-built model: ``model.json`` names the factory and its arguments) and its
    transformation (tables) from an archive version folder (``.../<name>/v<N>``), a model folder (train's output),
    or an archived model named like the CLI does: ``name:vN`` (``name:N`` too) or ``name`` (its latest version),
    looked up under ``archive_root`` (default ``$HETEROFLOW_HOME/archive``). The factory's module must be importable
    here.

    ``format="onnx"`` runs the version's ONNX export (``onnx/model.onnx``, or a ``model.onnx`` in the model folder)
    with onnxruntime on the CPU (``device`` is then ignored), and builds no PyTorch model.

    Raises:
        InvalidParameter: ``name:version`` names no archived model or version (the message lists those there); an
            unknown ``format``; ``onnx`` without onnxruntime installed, or a version with no ONNX export (the
            message says how to make one).
        CheckpointError: the folder holds no heteroflow model.
        DatasetError: the model was saved without its transformation.
        DeviceUnavailable: ``device`` is absent.
    """
    import json

    from heteroflow.components.data.tabular import load_transform
    from heteroflow.components.errors import InvalidParameter
    from heteroflow.components.training.model_files import MODEL_CONFIG, load_model

    if format not in PREDICT_FORMATS:
        raise InvalidParameter(f"format={format!r}; valid: {', '.join(PREDICT_FORMATS)}")
    folder = Path(path).expanduser()
    if isinstance(path, str) and not folder.exists() and (ref := _MODEL_REF.fullmatch(path)):
        from heteroflow.components.models.archive import archive_root_dir, read_version

        version = int(ref["version"]) if ref["version"] else None
        folder = Path(read_version(archive_root_dir(archive_root), ref["name"], version)["path"])
    model_dir = folder / "model" if (folder / "model" / MODEL_CONFIG).is_file() else folder
    if not (model_dir / MODEL_CONFIG).is_file():
        raise CheckpointError(f"{folder} holds no heteroflow model (no {MODEL_CONFIG} in it or in its model/ folder)")
    runner = None
    if format == "onnx":
        from heteroflow.components.models.onnx import ONNX_FILE, OnnxRunner, onnx_file_of

        onnx_path = (
            onnx_file_of(folder)
            or (onnx_file_of(folder.parent) if model_dir == folder else None)  # a version's model/ folder
            or (model_dir / ONNX_FILE if (model_dir / ONNX_FILE).is_file() else None)
        )
        if onnx_path is None:
            raise InvalidParameter(
                f"{folder} holds no ONNX export; archive with --param export_formats=onnx (a new version that holds "
                "one: heteroflow run --param export_formats=onnx), or predict with --format pytorch (heteroflow archive "
                "export writes a standalone .onnx file for other runtimes; predict reads archived versions)"
            )
        runner = OnnxRunner(onnx_path)
        try:
            model, config = None, json.loads((model_dir / MODEL_CONFIG).read_text(encoding="utf-8"))
        except ValueError as exc:
            raise CheckpointError(f"{model_dir / MODEL_CONFIG} is not valid JSON ({exc})") from None
    else:
        model, config = load_model(model_dir, device)
    if (config.get("data") or {}).get("kind", "table") != "table":
        return ArchivedModel(model_dir, model, config, None, {}, onnx=runner)
    transform, schema = load_transform(model_dir)
    return ArchivedModel(model_dir, model, config, transform, schema, onnx=runner)
