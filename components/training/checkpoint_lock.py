"""The checkpoint folder's lock: an exclusive ``flock`` that keeps two identical trainings out of one checkpoint
folder, and how long train waits for it (split out of :mod:`heteroflow.components.training.step`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from heteroflow.components.errors import CheckpointLocked

__all__ = ["LOCK_WAIT_SECONDS"]

LOCK_WAIT_SECONDS: float | None = None
"""How long train waits for a checkpoint folder's lock; None: as long as its holder lives (the kernel releases a
``flock`` when its holder ends, so a held lock always has a live holder)."""


@contextlib.contextmanager
def _exclusive(ckpt_dir: Path, wait_seconds: float | None = None, *, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<ckpt_dir>/.lock``: two trainings never share one checkpoint folder.

    A second identical training waits while the first lives (it then resumes from, or finds gone, the first's
    checkpoints), saying once whom it waits for; it never fails for a lock and spends no retry on one. A lock
    file removed by its holder while we waited (the holder finished and removed the folder) is taken afresh.

    Raises:
        CheckpointLocked: only with ``wait_seconds`` (or :data:`LOCK_WAIT_SECONDS`) set and exceeded.
    """
    limit = LOCK_WAIT_SECONDS if wait_seconds is None else wait_seconds
    deadline = None if limit is None else time.monotonic() + limit
    told = False
    while True:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        fh = open(ckpt_dir / ".lock", "a+")
        try:
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    fh.seek(0)
                    holder = fh.read().strip() or "another process"
                    if deadline is not None and time.monotonic() >= deadline:
                        raise CheckpointLocked(
                            f"checkpoint folder {ckpt_dir} is in use by {holder}: the same training (same data, "
                            "parameters and model) is running already; wait for it or stop it, then rerun to resume"
                        ) from None
                    if not told and say is not None:
                        say(f"train: waiting for {holder}, which runs the same training (checkpoint folder {ckpt_dir})")
                        told = True
                    time.sleep(0.2)
            try:
                same = os.fstat(fh.fileno()).st_ino == os.stat(ckpt_dir / ".lock").st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder finished and removed the folder while we waited: lock the new one
                fcntl.flock(fh, fcntl.LOCK_UN)
                continue
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()}")
            fh.flush()
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
            return
        finally:
            fh.close()
