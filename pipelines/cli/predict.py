"""``heteroflow predict MODEL INPUT``: the classes an archived model predicts for raw rows or images, with PyTorch
or its ONNX export (``--format onnx``: onnxruntime on the CPU, after heteroflow's transformation).

Registered in :mod:`heteroflow.pipelines.cli.main` with ``app.command("predict")(predict_command)``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from heteroflow.components.errors import HeteroflowError, InvalidParameter
from heteroflow.pipelines.cli.common import _fail, console

__all__ = ["predict_command"]


def _image_suffixes() -> frozenset[str]:
    from heteroflow.components.data.readers import IMAGE_SUFFIXES

    return frozenset(IMAGE_SUFFIXES)


def _inputs(path: str) -> Any:
    """What :meth:`ArchivedModel.predict` takes for ``path``: a ``.npy`` file's array (tensors), else the path
    (a table file, an image, a folder of images)."""
    if path.endswith(".npy"):
        import numpy as np

        try:
            return np.load(path, allow_pickle=False)
        except (ValueError, EOFError) as exc:  # not an array file, or one of objects (it was 'unexpected ValueError')
            raise InvalidParameter(f"{path} is not a .npy array of numbers ({' '.join(str(exc).split())[:160]}); valid: an "
                                   "array saved with numpy.save, samples along its first axis") from None
    return path


def predict_command(
    model: Annotated[str, typer.Argument(help="An archived model: MODEL or MODEL:vN (latest without :vN), or an archive version's folder.")],
    inputs: Annotated[str, typer.Argument(help="A table file (read the way training read its files), an image or a folder of images, or a .npy array of samples.")],
    format: Annotated[str, typer.Option("--format", help="pytorch (the factory rebuilds the model) or onnx (the version's ONNX export, onnxruntime on the CPU).")] = "pytorch",  # noqa: A002
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the CSV here (atomically) instead of printing it.")] = None,
    proba: Annotated[bool, typer.Option("--proba", help="Add one column per class with its probability.")] = False,
    root: Annotated[Optional[Path], typer.Option("--root", help="Archive folder. Default: $HETEROFLOW_HOME/archive.")] = None,
) -> None:
    """Predict the class of each row or image with an archived model: CSV with a `prediction` column, in input order
    (images: a `file` column first, the image's path in the folder)."""
    import numpy as np

    from heteroflow.components.models.predict import load_archived

    try:
        loaded = load_archived(model, archive_root=root, format=format.strip().lower())
        if not Path(inputs).exists():
            raise InvalidParameter(f"{inputs} does not exist; give a table file, an image, a folder of images or a .npy file")
        probabilities = loaded.predict_proba(_inputs(inputs))
    except (HeteroflowError, OSError) as exc:
        _fail(exc)
        return
    labels = np.asarray(loaded.classes, dtype=str)[probabilities.argmax(axis=1)]
    # images: a file column first, so each prediction names its image (a folder's are read in path order; the rows
    # could not be matched to the files)
    files: list[str] | None = None
    if Path(inputs).is_dir():
        from heteroflow.components.models.predict import image_files

        files = [p.relative_to(inputs).as_posix() for p in image_files(inputs)]
    elif not inputs.endswith(".npy") and Path(inputs).suffix.lower() in _image_suffixes():
        files = [inputs]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow((["file"] if files else []) + ["prediction"] + ([f"p_{c}" for c in loaded.classes] if proba else []))
    for i, (label, row) in enumerate(zip(labels, probabilities)):
        writer.writerow(([files[i]] if files else []) + [str(label)] + ([f"{p:.6g}" for p in row] if proba else []))
    if output is None:
        console.file.write(buffer.getvalue())
        return
    from heteroflow.cache.atomic import atomic_write_bytes

    try:
        atomic_write_bytes(output, buffer.getvalue().encode("utf-8"), durable=False)
    except OSError as exc:
        _fail(exc)
        return
    console.print(f"{len(labels)} predictions ({loaded.format}) written to {output}", highlight=False, markup=False)
