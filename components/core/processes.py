"""Worker processes that cannot inherit a held lock (issue #28.13).

A ``fork`` copies the parent's memory, locks included, but only the thread that forked: a lock another thread held at
that moment (an import's module lock while the engine's watcher thread imports pandas, a logging handler's lock) stays
held forever in the child, and the child's first ``import pandas`` or log line deadlocks. The in-process engine runs
with several threads, so every pool of processes heteroflow starts (the preprocess readers' ``ProcessPoolExecutor``,
the training's DataLoader workers) takes its context from :func:`worker_context`: ``spawn`` (fresh interpreters).
Not ``forkserver``: its server listens on a Unix socket under ``TMPDIR``, and a run that points ``TMPDIR`` into a
deep run folder fails with "AF_UNIX path too long" (the socket path limit is 108 bytes); its children import what
they need afresh anyway. What the workers run must be importable and picklable, as multiprocessing documents.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.context import BaseContext

__all__ = ["START_METHOD", "process_pool", "worker_context"]

START_METHOD = "spawn"


def worker_context() -> BaseContext:
    """The multiprocessing context for every worker process heteroflow starts: never ``fork``."""
    return multiprocessing.get_context(START_METHOD)


def process_pool(max_workers: int) -> ProcessPoolExecutor:
    """A ``ProcessPoolExecutor`` whose workers start with :func:`worker_context`, never by ``fork``."""
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=worker_context())
