"""Worker processes that never inherit an import lock another thread holds, and never re-run the user's script
(issue #28.13).

A ``fork`` copies the parent's memory, locks included, but only the thread that forked: if another thread is inside
``import pandas`` at that moment (the in-process engine's watcher thread, the report's background import), pandas'
module lock stays held forever in the child, and the child's own ``import pandas`` deadlocks. That is how the
in-process engine hung about one run in fifteen.

The fix here is the one the issue names, "import before forking". Each pool names the modules its workers import
(``preload``), and :func:`worker_context` imports them in the parent first. If another thread is importing one of
them, the parent's import waits until that import finishes: Python's per-module import locks make it wait. So at the
fork every preloaded module is complete in the parent, and the child finds it in ``sys.modules`` without taking any
lock. (CPython's ``os.fork`` already holds the global import lock across the fork, and ``logging`` re-creates its
locks in the child.)

``fork`` is kept rather than ``spawn`` or ``forkserver``. Both of those re-import the user's main module in every
worker, as the ``multiprocessing`` docs' "safe importing of main module" warns, so a plain script calling
``heteroflow.run(...)`` without an ``if __name__ == "__main__":`` guard ran its pipeline again in each worker
(seen while trying it as a new user). Each worker also re-imported torch (about 1 s). ``forkserver`` also fails when
``TMPDIR`` is deeper than a Unix socket path allows (108 bytes). Where ``fork`` does not exist (Windows), or is not
the platform's default (macOS), the platform's default is used, and with it the main-module rule.
"""

from __future__ import annotations

import importlib
import multiprocessing
import sys
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.context import BaseContext

__all__ = ["PRELOAD_DATALOADER", "PRELOAD_TABLE_READERS", "START_METHOD", "process_pool", "worker_context"]

START_METHOD = "fork" if sys.platform.startswith("linux") else multiprocessing.get_context().get_start_method()
"""``fork`` where the platform has it as its default (Linux), else the platform's default."""

PRELOAD_TABLE_READERS = ("pandas", "pandas.io.parsers", "pyarrow", "heteroflow.components.data.datasets")
"""What the preprocess readers' pool workers import (:func:`heteroflow.components.data.datasets.read_table`)."""

PRELOAD_DATALOADER = ("PIL.Image", "PIL.PngImagePlugin", "PIL.JpegImagePlugin", "heteroflow.components.data.readers")
"""What the training's DataLoader workers import to decode images (:mod:`heteroflow.components.data.readers`)."""


def worker_context(preload: Iterable[str] = ()) -> BaseContext:
    """The multiprocessing context for worker processes, with the modules in ``preload`` imported here first (see the
    module docstring). A module that is not installed is skipped: the worker will report that itself.

    Returns:
        The ``fork`` context on Linux; the platform's default elsewhere.
    """
    for name in preload:
        try:
            importlib.import_module(name)  # waits for another thread's import of it to finish
        except ImportError:
            pass
    return multiprocessing.get_context(START_METHOD)


def process_pool(max_workers: int, *, preload: Iterable[str] = ()) -> ProcessPoolExecutor:
    """A ``ProcessPoolExecutor`` of ``max_workers`` processes started with :func:`worker_context` (``preload``
    imported here first)."""
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=worker_context(preload))
