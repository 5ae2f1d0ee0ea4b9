"""Readers: turn what prewarm cached into ``torch.utils.data.Dataset`` splits. The cache tier caches bytes of any
files; formats are decided here.

==================  =========================================================  ====================================
data kind           layout                                                     how it is read
==================  =========================================================  ====================================
``table``           .csv, .tsv, .parquet, .npz (arrays ``x``, ``y``)            preprocess's shards (its data
                                                                               report, split and transformation);
                                                                               samples ``(num_features,)`` float32
``image_folder``    one folder per class holding images (.png, .jpg, .jpeg,    decoded with Pillow at read time
                    .bmp, .gif, .tif, .tiff, .webp): torchvision's             (in DataLoader workers); samples
                    ``ImageFolder`` layout, at any depth below the root        ``(C, H, W)`` float32 in [0, 1]
``tensors``         .pt files holding ``{"x": Tensor (n, ...), "y": Tensor     loaded with ``torch.load(...,
                    (n,)}`` (or a tuple ``(x, y)``)                            weights_only=True)``; samples
                                                                               ``x[i]`` as float32
``factory``         your own ``package.module:function(split)`` returning a    called once per split (``train``,
                    ``torch.utils.data.Dataset`` of ``(x, y)`` samples         ``validation``, ``test``)
==================  =========================================================  ====================================

For image folders and tensors, preprocess calls :func:`prepare_files` (it writes ``meta.json`` with a seeded,
stratified train / validation / test split of the files, the classes and the sample shape); nothing is decoded
into the shards folder: the Dataset reads the cached files. Every image is checked with Pillow there, before any
device time is spent, and an undecodable one is named; the colour mode and size samples are brought to are those
most of the images have (:func:`decide_image_format`, said in one line; ``mixed_images=error`` refuses a mix).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from heteroflow.cache.errors import DatasetError
from heteroflow.components.data.parameters import MIXED_IMAGES_CHOICES  # noqa: F401 - importable here
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.data.formats import READERS_HELP, REGISTRY, ImageFolderReader, TensorReader  # noqa: F401 - READERS_HELP: kept importable here

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

__all__ = [
    "DATA_KINDS",
    "IMAGE_SUFFIXES",
    "TENSOR_SUFFIXES",
    "MIXED_IMAGES_CHOICES",
    "DataSplits",
    "ImageFolderData",
    "TensorData",
    "batch_collate",
    "decide_image_format",
    "decode_image",
    "detect_kind",
    "load_dataset_factory",
    "open_splits",
    "prepare_files",
]

DATA_KINDS = ("table", "image_folder", "tensors", "factory")
IMAGE_SUFFIXES = ImageFolderReader.suffixes
"""The image folder reader's suffixes (:class:`heteroflow.components.data.formats.ImageFolderReader`)."""
TENSOR_SUFFIXES = TensorReader.suffixes
"""The tensor reader's suffixes (:class:`heteroflow.components.data.formats.TensorReader`)."""
SPLITS = ("train", "validation", "test")


# --- datasets ---------------------------------------------------------------------------------------------


class _Batch(tuple):  # type: ignore[type-arg]
    """A batch already gathered by :meth:`TensorData.__getitems__` (collated as is)."""


def batch_collate(samples: Any, *, collate: Any = None) -> Any:
    """The DataLoader ``collate_fn`` of heteroflow's loaders: a batch gathered in one indexing operation
    (:class:`TensorData`) passes as is; anything else goes through ``collate`` (None: torch's ``default_collate``;
    a worker's slots pass one that stacks into the worker's own memory: :mod:`heteroflow.components.training.slots`)."""
    if isinstance(samples, _Batch):
        return tuple(samples)
    if collate is None:
        from torch.utils.data import default_collate as collate

    return collate(samples)


class TensorData:
    """In-memory samples ``x[i]``, labels ``y[i]`` (a ``Dataset``; a batch is gathered with one index operation).

    Args:
        x: float32 tensor ``(n, ...)``.
        y: int64 tensor ``(n,)``.
    """

    draws_random = False  # nothing random in a read: the loaders need not seed it (training.sample_seeds)

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    def __getitems__(self, indices: Sequence[int]) -> _Batch:
        import torch

        idx = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        return _Batch((self.x[idx], self.y[idx]))


def decode_image(path: str | os.PathLike[str], *, mode: str, size: tuple[int, int]) -> np.ndarray:
    """One image file as float32 ``(C, H, W)`` in [0, 1]: converted to Pillow ``mode`` (``L``: C=1, ``RGB``:
    C=3) and resized to ``size`` = (width, height) in pixels when it differs (bilinear).

    Raises:
        DatasetError: Pillow cannot decode the file (names it).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img = img.convert(mode)
            if img.size != tuple(size):
                img = img.resize(tuple(size), Image.Resampling.BILINEAR)
            arr = np.asarray(img, dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DatasetError(f"image {path} cannot be decoded ({exc}); remove it or replace it with a valid image") from None
    return arr[None] if arr.ndim == 2 else np.ascontiguousarray(arr.transpose(2, 0, 1))


class ImageFolderData:
    """Images decoded with Pillow when read (a ``Dataset`` of ``(float32 (C, H, W), int64 label)``).

    Args:
        paths: image files.
        labels: class index of each, same length.
        mode: Pillow mode (``L`` or ``RGB``).
        size: (width, height) in pixels every image is brought to.
    """

    draws_random = False  # nothing random in a read: the loaders need not seed it (training.sample_seeds)

    def __init__(self, paths: Sequence[str], labels: Sequence[int], *, mode: str, size: tuple[int, int]) -> None:
        self.paths, self.labels, self.mode, self.size = list(paths), list(labels), mode, tuple(size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        x = decode_image(self.paths[i], mode=self.mode, size=self.size)  # type: ignore[arg-type]
        return torch.from_numpy(x), torch.tensor(self.labels[i], dtype=torch.int64)


# --- what preprocess writes for files that are not tables ---------------------------------------------------


def detect_kind(relative: Sequence[str]) -> str:
    """The data kind of a data set from its files' relative POSIX paths: ``table`` (any table file),
    ``image_folder``, or ``tensors`` (or a registered reader's kind): asks the reader registry
    (:meth:`heteroflow.components.data.formats.ReaderRegistry.detect_kind`).

    Raises:
        DatasetError: no format a reader reads; names the suffixes found and lists the registered readers.
    """
    return REGISTRY.detect_kind(relative)


def prepare_files(
    view: Any,
    output_dir: str | os.PathLike[str],
    *,
    split: Callable[[np.ndarray], dict[str, np.ndarray]],
    settings: Mapping[str, Any],
    started: float | None = None,
    options: Mapping[str, Any] | None = None,
) -> Any:
    """Preprocess for image folders and tensors (any reader whose kind is not ``table``): the registered reader
    of the data set's kind checks every file and splits; this writes ``meta.json`` (and the reader's files: for
    tensors, ``<split>.pt``). Called by :func:`heteroflow.components.data.preprocess.preprocess` when the data set
    holds no table.

    Args:
        view: the :class:`~heteroflow.cache.dataset.DatasetView` of the data set (its cached files).
        output_dir: folder to write, replaced as a whole.
        split: the row indices per split (``train``, ``validation``, ``test``) of the samples' labels (shape
            ``(n,)``), as preprocess splits them (:func:`heteroflow.components.data.shards.stratified_split`).
        settings: what ``meta.json`` records of how the data set was split (preprocess's seed and fractions).
        options: preprocess's options for the reader (``mixed_images``), passed to its ``read`` when it takes them.

    Returns:
        A :class:`~heteroflow.components.data.shards.PreprocessResult` (``num_features`` = elements per sample).

    Raises:
        DatasetError: no readable format, a class folder with no images, an image Pillow cannot decode, a .pt
            file without ``x`` and ``y``.
    """
    from heteroflow.cache.atomic import atomic_directory
    from heteroflow.components.data.shards import PreprocessResult

    started = time.perf_counter() if started is None else started
    kind = detect_kind(view.relative)
    common = {
        "source_uri": view.source_uri,
        "dataset_version": view.version,
        "dataset_sha256": view.dataset_sha256,
        **settings,
    }
    out = Path(output_dir)
    reader = REGISTRY.reader_of_kind(kind, view.relative)
    accepted = inspect.signature(reader.read).parameters
    given = {k: v for k, v in (options or {}).items() if k in accepted}  # a third party's reader takes split only
    prepared = reader.read(view, split=split, **given)
    meta = {**prepared.meta, **common}
    with atomic_directory(out) as tmp:
        if prepared.write is not None:
            prepared.write(tmp)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    report = {"data_kind": kind, "classes": meta["classes"], "sample_shape": meta["sample_shape"], "counts": meta["counts"]}
    notices = (meta["image_decision"]["line"],) if "image_decision" in meta else ()
    if notices:
        report["image_decision"] = meta["image_decision"]
        report["notices"] = list(notices)
    return PreprocessResult(
        output_dir=out,
        counts=dict(meta["counts"]),
        num_features=int(np.prod(meta["sample_shape"])),
        classes=tuple(meta["classes"]),
        num_workers=1,
        seconds=time.perf_counter() - started,
        report=report,
        notices=notices,
    )


def _image_mode(pillow_mode: str) -> str:
    """``L`` for Pillow's one-channel modes (1, L, I;16, I, F), else ``RGB`` (RGBA, P, CMYK, YCbCr, ...)."""
    return "L" if pillow_mode in ("L", "1", "I;16", "I", "F") else "RGB"


def decide_image_format(found: Mapping[str, tuple[str, tuple[int, int]]]) -> tuple[str, tuple[int, int], dict[str, Any]]:
    """The colour mode and size an image folder is trained at, decided from every image, not the first one.

    Args:
        found: per image (relative path), its mode (``L`` or ``RGB``, see :func:`_image_mode`) and size
            (width, height) in pixels.

    Returns:
        ``(mode, size, facts)``: the mode most images have (a tie goes to ``RGB``: greyscale converts to it
        without loss), the size most images have (a tie goes to the larger area, then the wider), and what was
        decided: ``{"mode", "size", "images", "other_mode", "other_size"}`` (counts of images), ``examples``
        (up to 10 paths of each) and ``line``, which says it in one line.
    """
    from collections import Counter

    modes = Counter(m for m, _ in found.values())
    sizes = Counter(sz for _, sz in found.values())
    mode = max(modes, key=lambda m: (modes[m], m == "RGB"))
    size = max(sizes, key=lambda sz: (sizes[sz], sz[0] * sz[1], sz[0]))
    other_mode = sorted(p for p, (m, _) in found.items() if m != mode)
    other_size = sorted(p for p, (_, sz) in found.items() if sz != size)
    name = {"L": "greyscale (L)", "RGB": "colour (RGB)"}
    parts = [f"{len(other_mode)} {name['RGB' if mode == 'L' else 'L']} (e.g. {other_mode[0]})"] if other_mode else []
    if other_size:
        w, h = found[other_size[0]][1]
        parts.append(f"{len(other_size)} of another size (e.g. {other_size[0]}: {w}x{h})")
    line = (
        f"images: {name[mode]} {size[0]}x{size[1]}, what {modes[mode]} of {len(found)} images are "
        f"({sizes[size]} have that size); " + ("; ".join(parts) + " differ" if parts else "none differs")
    )
    facts = {
        "mode": mode, "size": list(size), "images": len(found), "other_mode": len(other_mode), "other_size": len(other_size),
        "examples": {"other_mode": other_mode[:10], "other_size": other_size[:10]}, "line": line,
    }
    return mode, size, facts


def prepare_images(
    view: Any, split: Callable[[np.ndarray], dict[str, np.ndarray]], *, mixed_images: str = "convert"
) -> dict[str, Any]:
    """The ``meta.json`` of an image folder: every image checked with Pillow (``verify``, no pixels decoded), the
    classes (folders holding images, sorted), the colour mode and size decided from every image
    (:func:`decide_image_format`, said in one line, logged and kept as ``image_decision``), and the split of the
    files.

    Args:
        view: the data set's :class:`~heteroflow.cache.dataset.DatasetView`.
        split: labels ``(n,)`` -> row indices per split.
        mixed_images: ``convert`` (images of another mode or size are converted and resized when read) or
            ``error`` (:data:`MIXED_IMAGES_CHOICES`).

    Raises:
        DatasetError: an image at the top of the data set, a class folder with no images, fewer than 2 classes,
            an image Pillow cannot read (each named); with ``mixed_images=error``, images of another mode or
            size than most (counted, the first named).
    """
    import logging

    from PIL import Image, UnidentifiedImageError

    root = Path(view.root)
    by_class: dict[str, list[str]] = {}
    others: dict[str, int] = {}
    for rel in view.relative:
        parts = rel.split("/")
        parent = "/".join(parts[:-1])
        if os.path.splitext(rel)[1].lower() in IMAGE_SUFFIXES:
            if not parent:
                raise DatasetError(
                    f"image {view.source_uri.rstrip('/')}/{rel} lies at the top of the data set; an image folder "
                    "holds one folder per class (e.g. cat/1.png, dog/2.png)"
                )
            by_class.setdefault(parent, []).append(rel)
        elif parent:
            others[parent] = others.get(parent, 0) + 1
    empty = sorted(set(others) - set(by_class))
    if empty:
        raise DatasetError(
            f"class folder {view.source_uri.rstrip('/')}/{empty[0]} has no images (.png, .jpg, ...); "
            "every class folder needs at least one image, or remove the folder"
        )
    classes = sorted(by_class)
    if len(classes) < 2:
        raise DatasetError(f"image folder {view.source_uri} has {len(classes)} class folder(s); a classifier needs at least 2")
    paths: list[str] = []
    labels: list[int] = []
    found: dict[str, tuple[str, tuple[int, int]]] = {}
    for label, cls in enumerate(classes):
        for rel in sorted(by_class[cls]):
            p = root / rel
            try:  # verify(): reads and checks the whole file without decoding pixels
                with Image.open(p) as img:
                    found[rel] = (_image_mode(img.mode), tuple(img.size))  # type: ignore[assignment]
                    img.verify()
            except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
                raise DatasetError(
                    f"image {view.source_uri.rstrip('/')}/{rel} cannot be decoded ({exc}); remove it or replace it with "
                    "a valid image"
                ) from None
            paths.append(rel)
            labels.append(label)
    mode, size, decision = decide_image_format(found)
    if mixed_images == "error" and (decision["other_mode"] or decision["other_size"]):
        raise DatasetError(
            f"image folder {view.source_uri}: {decision['line']}; mixed_images=error refuses them: make every image "
            "the same mode and size, or set mixed_images=convert to convert them when read"
        )
    if decision["other_mode"] or decision["other_size"]:
        decision["line"] += "; converted when read (mixed_images=convert; mixed_images=error refuses them)"
    logging.getLogger("heteroflow.components.data.preprocess").warning("preprocess: %s", decision["line"])
    parts = split(np.asarray(labels))
    splits = {s: [[paths[i], labels[i]] for i in idx] for s, idx in parts.items()}
    channels = 1 if mode == "L" else 3
    return {
        "data_kind": "image_folder",
        "root": str(root),
        "classes": [c.replace("/", "-") for c in classes],
        "image_mode": mode,
        "image_size": list(size),
        "image_decision": decision,
        "sample_shape": [channels, size[1], size[0]],
        "splits": splits,
        "counts": {s: len(v) for s, v in splits.items()},
        "num_features": channels * size[0] * size[1],
    }


def prepare_tensors(view: Any, split: Callable[[np.ndarray], dict[str, np.ndarray]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``meta.json`` of a data set of .pt files and its splits ``{split: (x float32 (n, ...), y int64 (n,))}``
    (class values mapped to 0..k-1 in sorted order).

    Raises:
        DatasetError: a file ``torch.load(weights_only=True)`` cannot load, or that holds no ``x`` and ``y``
            tensors of matching length.
    """
    import torch

    xs, ys = [], []
    for rel, path in zip(view.relative, view.files):
        if os.path.splitext(rel)[1].lower() not in TENSOR_SUFFIXES:
            continue
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise DatasetError(f"tensor file {view.source_uri.rstrip('/')}/{rel} cannot be loaded ({exc})") from None
        if isinstance(obj, dict) and "x" in obj and "y" in obj:
            x, y = obj["x"], obj["y"]
        elif isinstance(obj, (tuple, list)) and len(obj) == 2:
            x, y = obj
        else:
            raise DatasetError(f"tensor file {view.source_uri.rstrip('/')}/{rel} holds no x and y (save {{'x': X, 'y': Y}})")
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or y.ndim != 1 or len(x) != len(y):
            raise DatasetError(f"tensor file {view.source_uri.rstrip('/')}/{rel}: x must be a tensor (n, ...) and y a tensor (n,)")
        where = f"tensor file {view.source_uri.rstrip('/')}/{rel}"
        # as a table's cells are checked: a NaN or infinity in x went into the shards silently, a NaN in y was a bare
        # KeyError of the class lookup
        bad_x = ~torch.isfinite(x.float()).reshape(len(x), -1).all(dim=1) if x.numel() else torch.zeros(0, dtype=torch.bool)
        if bad_x.any():
            rows = torch.nonzero(bad_x).flatten()[:5].tolist()
            raise DatasetError(f"{where}: x holds missing (NaN) or infinite values in {int(bad_x.sum())} sample(s), first at "
                               f"row(s) {', '.join(map(str, rows))}; a feature must be a finite number: fill or drop those samples")
        if y.is_floating_point() and not torch.isfinite(y).all():
            rows = torch.nonzero(~torch.isfinite(y)).flatten()[:5].tolist()
            raise DatasetError(f"{where}: y (the class) is missing (NaN) or infinite in {int((~torch.isfinite(y)).sum())} "
                               f"sample(s), first at row(s) {', '.join(map(str, rows))}; every sample needs its class")
        xs.append(x.float())
        ys.append(y)
    x, y_raw = torch.cat(xs), torch.cat(ys)
    values = sorted({v.item() for v in y_raw.unique()})
    lookup = {v: i for i, v in enumerate(values)}
    y = torch.tensor([lookup[v.item()] for v in y_raw], dtype=torch.int64)
    parts = split(y.numpy())
    tensors = {s: (x[torch.from_numpy(idx)], y[torch.from_numpy(idx)]) for s, idx in parts.items()}
    meta = {
        "data_kind": "tensors",
        "classes": [str(int(v)) if float(v).is_integer() else str(v) for v in values],
        "sample_shape": list(x.shape[1:]),
        "counts": {s: len(t[1]) for s, t in tensors.items()},
        "num_features": int(np.prod(x.shape[1:])),
        "shards": {s: [f"{s}.pt"] for s in SPLITS},
    }
    return meta, tensors


def write_tensors(folder: Path, tensors: Mapping[str, Any]) -> None:
    """Write ``<split>.pt`` (``{"x": x, "y": y}``) per split of :func:`prepare_tensors` into ``folder``."""
    import torch

    for name, (x, y) in tensors.items():
        torch.save({"x": x, "y": y}, folder / f"{name}.pt")


_prepare_images = prepare_images  # the names before the reader registry
_prepare_tensors = prepare_tensors


# --- reading splits ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DataSplits:
    """The splits a training reads.

    Attributes:
        kind: one of :data:`DATA_KINDS`.
        train / validation / test: Datasets of ``(x, y)`` samples (validation and test may be None).
        classes: class names, index = label id.
        input_shape: shape of one sample ``x`` (``(num_features,)`` for tables, ``(C, H, W)`` for images).
        in_memory: the samples are tensors in memory (no DataLoader workers needed).
        info: JSON-ready facts that tell :func:`heteroflow.components.models.predict.load_archived` how raw inputs
            become samples (kind, image mode and size, the dataset factory); recorded in ``model.json``.
        fingerprint: identity of the data (for the checkpoint folder's key).
    """

    kind: str
    train: Any
    validation: Any
    test: Any
    classes: tuple[str, ...]
    input_shape: tuple[int, ...]
    in_memory: bool
    info: dict[str, Any]
    fingerprint: str


def load_dataset_factory(ref: str, *, what: str = "dataset_factory") -> Any:
    """The user's dataset factory ``package.module:function``.

    Raises:
        InvalidParameter: not importable, or not callable.
    """
    from heteroflow.components.core.step import import_object

    fn = import_object(ref, what=what, example="mypkg.data:make_dataset")
    if not callable(fn):
        from heteroflow.components.core.step import _a

        raise InvalidParameter(f"{what}={ref!r} is {_a(type(fn))}, not a function returning a torch Dataset")
    return fn


def _factory_split(fn: Any, ref: str, split: str) -> Any:
    try:
        accepts = "split" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        accepts = True
    ds = fn(split=split) if accepts else (fn() if split == "train" else None)
    if ds is None:
        return None
    if not (hasattr(ds, "__getitem__") and (hasattr(ds, "__len__") or hasattr(ds, "__iter__"))):
        raise InvalidParameter(f"dataset_factory={ref!r} returned a {type(ds).__name__} for split {split!r}, not a torch Dataset")
    return ds


def _check_factory_item(ds: Any, ref: str, split: str) -> None:
    """A dataset factory's split yields ``(input, label)`` pairs, the input a tensor or array (of any shape) and the
    label an integer class index, as a torchvision dataset does; checked on its first item, so a wrong item is one
    clear error before training rather than an unpacking error inside the loop.

    Raises:
        InvalidParameter: the split is empty, or its first item is not such a pair.
    """
    import numpy as np
    import torch

    if ds is None:
        return
    try:
        n = len(ds)
    except TypeError:
        n = None
    if n == 0:
        raise InvalidParameter(f"dataset_factory={ref!r} returned an empty Dataset for split {split!r}; valid: at least one (input, label) pair")
    item = ds[0]
    shape = "valid: a pair (input tensor or array, integer class index), e.g. (torch.zeros(4), 1)"
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise InvalidParameter(f"dataset_factory={ref!r}: item 0 of split {split!r} is {_describe(item)}; {shape}")
    x, y = item
    if not isinstance(x, (torch.Tensor, np.ndarray)):
        raise InvalidParameter(f"dataset_factory={ref!r}: item 0 of split {split!r} has input {_describe(x)}; {shape}")
    one = (isinstance(y, torch.Tensor) and y.numel() == 1) or (isinstance(y, np.ndarray) and y.size == 1)
    label = y.item() if one else y
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
        raise InvalidParameter(f"dataset_factory={ref!r}: item 0 of split {split!r} has label {_describe(y)}; {shape}")


def _describe(value: Any) -> str:
    """A short description of a value for an error message: its type and, for a tensor or array, its shape."""
    shape = getattr(value, "shape", None)
    text = f"a {type(value).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "")
    if isinstance(value, (tuple, list)):
        text += f" of {len(value)} items"
    return text


def _content_key(fingerprint: str, *splits: Any) -> str:
    """``fingerprint`` (of meta.json) and the bytes of every split's tensors: a checkpoint's key for data no prewarm
    checksum pins (a plain folder preprocessed in Python: meta.json holds nothing of the cell values, so a table
    with every feature changed kept its key and resumed the old data's checkpoint). SHA-256 over the arrays in
    memory (about 0.1 s for 1M rows x 35 float32 features)."""
    h = hashlib.sha256(fingerprint.encode())
    for data in splits:
        for t in (() if data is None else (data.x, data.y)):
            h.update(str((tuple(t.shape), str(t.dtype))).encode())
            h.update(memoryview(t.contiguous().numpy()).cast("B"))
    return h.hexdigest()[:16]


def open_splits(dataset_dir: str | os.PathLike[str], *, dataset_factory: str = "", info: dict[str, Any] | None = None) -> DataSplits:
    """Open the splits of preprocess output (any data kind), or of a user dataset factory.

    Args:
        dataset_dir: preprocess output (``meta.json``).
        dataset_factory: ``package.module:function(split=...)`` returning a Dataset; overrides ``dataset_dir``.
        info: a recorded :attr:`DataSplits.info` (evaluate reopens the data the model was trained on).

    Raises:
        DatasetError: not preprocess output, or its files are gone, or a data kind no reader opens.
        InvalidParameter: a dataset factory that cannot be imported or returns no Dataset.
    """
    import torch

    factory = dataset_factory or (info or {}).get("dataset_factory", "")
    if factory:
        fn = load_dataset_factory(factory)
        train = _factory_split(fn, factory, "train")
        if train is None:
            raise InvalidParameter(f"dataset_factory={factory!r} returned None for split 'train'")
        val, test = _factory_split(fn, factory, "validation"), _factory_split(fn, factory, "test")
        for split, ds in (("train", train), ("validation", val), ("test", test)):
            _check_factory_item(ds, factory, split)
        x0, _ = train[0]
        classes = getattr(train, "classes", None)
        if classes is None:  # every split's labels: a class only validation or test holds was out of the model's range
            labels = {int(ds[i][1]) for ds in (train, val, test) if ds is not None for i in range(len(ds))}
            classes = [str(i) for i in range(max(labels) + 1)]
        shape = tuple(torch.as_tensor(x0).shape)
        # not only the name and train length: the factory module's code, every split's length and the classes, so
        # an edited factory is not resumed from the old one's checkpoint (its items are not read: a factory that
        # augments at random gives other items at every read, and a rerun must find its checkpoint)
        from heteroflow.components.training.checkpoint_lock import code_fingerprint

        lengths = [0 if ds is None else len(ds) for ds in (train, val, test)]
        key = hashlib.sha256(json.dumps({"factory": factory, "n": len(train), "lengths": lengths, "classes": [str(c) for c in classes],
                                         "code": code_fingerprint([factory])}, sort_keys=True).encode()).hexdigest()[:16]
        return DataSplits(
            kind="factory", train=train, validation=val, test=test, classes=tuple(str(c) for c in classes),
            input_shape=shape, in_memory=False, info={"kind": "factory", "dataset_factory": factory}, fingerprint=key,
        )

    from heteroflow.components.data.shards import load_split, read_meta

    meta = read_meta(dataset_dir)
    kind = meta.get("data_kind", "table")
    fingerprint = hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()[:16]
    pinned = bool(meta.get("dataset_sha256"))  # prewarm's checksum of every file is in meta: the key names the data
    classes = tuple(str(c) for c in meta["classes"])
    if kind == "table":
        def split(name: str) -> TensorData | None:
            x, y = load_split(dataset_dir, name)
            return TensorData(torch.from_numpy(x), torch.from_numpy(y)) if len(y) else None

        train = split("train")
        if train is None:
            raise InvalidParameter(f"{dataset_dir} has an empty train split")
        val, test = split("validation"), split("test")
        return DataSplits(
            kind="table", train=train, validation=val, test=test, classes=classes,
            input_shape=(int(meta["num_features"]),), in_memory=True, info={"kind": "table"},
            fingerprint=fingerprint if pinned else _content_key(fingerprint, train, val, test),
        )
    if kind == "tensors":
        def tsplit(name: str) -> TensorData | None:
            obj = torch.load(Path(dataset_dir, f"{name}.pt"), map_location="cpu", weights_only=True)
            return TensorData(obj["x"], obj["y"]) if len(obj["y"]) else None

        train, val, test = tsplit("train"), tsplit("validation"), tsplit("test")
        return DataSplits(
            kind="tensors", train=train, validation=val, test=test, classes=classes,
            input_shape=tuple(meta["sample_shape"]), in_memory=True, info={"kind": "tensors"},
            fingerprint=fingerprint if pinned else _content_key(fingerprint, train, val, test),
        )
    if kind == "image_folder":
        root = Path(meta["root"])
        if not root.is_dir():
            raise DatasetError(f"the images of {meta.get('source_uri')} are no longer in the cache ({root}); rerun prewarm")
        size = (int(meta["image_size"][0]), int(meta["image_size"][1]))

        def isplit(name: str) -> ImageFolderData | None:
            rows = meta["splits"][name]
            if not rows:
                return None
            return ImageFolderData([str(root / p) for p, _ in rows], [int(c) for _, c in rows], mode=meta["image_mode"], size=size)

        if not pinned:  # a plain folder: each image's size and change time stand for its content (no image is read)
            h = hashlib.sha256(fingerprint.encode())
            for name in ("train", "validation", "test"):
                for p, _ in meta["splits"][name]:
                    st = (root / p).stat()
                    h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            fingerprint = h.hexdigest()[:16]

        return DataSplits(
            kind="image_folder", train=isplit("train"), validation=isplit("validation"), test=isplit("test"),
            classes=classes, input_shape=tuple(meta["sample_shape"]), in_memory=False,
            info={"kind": "image_folder", "image_mode": meta["image_mode"], "image_size": list(size)},
            fingerprint=fingerprint,
        )
    reader = next((r for r in REGISTRY.readers() if r.kind == kind and callable(getattr(r, "open_splits", None))), None)
    if reader is not None:  # a registered reader's own kind (heteroflow.components.data.formats)
        return reader.open_splits(dataset_dir, meta)  # type: ignore[attr-defined]
    kinds = dict.fromkeys([*DATA_KINDS, *REGISTRY.kinds()])
    raise DatasetError(f"{dataset_dir}: data kind {kind!r} is unknown; valid: {', '.join(kinds)}")
