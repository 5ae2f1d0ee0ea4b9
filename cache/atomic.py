"""Writes that are visible complete or not at all: a file or folder is written under a temporary name beside
its target (same filesystem), flushed, then renamed into place (``rename(2)`` is atomic on POSIX)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_directory", "atomic_file", "atomic_write_bytes"]


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, suffix: str = ".tmp", durable: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces ``path`` when the ``with`` block ends without error.

    Args:
        durable: fsync the file before the rename (survives a power cut); False: only atomic visibility.

    On an error (or an exception raised by the block itself) the temporary file is removed and ``path`` is
    left as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the complete new one
    (``durable``: fsync before the rename)."""
    with atomic_file(path, durable=durable) as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; when the block ends without error it replaces ``path``
    (an existing file or folder there, e.g. from an earlier attempt, is removed first). On an error the
    temporary folder is removed and ``path`` is left as it was."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
