"""Progress of long cache operations (prewarm), reported to whoever listens: a CLI progress bar, a step runner.

A library call takes ``progress=callback``; a call that cannot take one (a pipeline step, whose parameters are
plain values) reports to the callback installed for the current context with :func:`report_progress`::

    with report_progress(lambda p: print(p.files_done, p.files_total, p.bytes_done)):
        prewarm_dataset(source, out)

Callbacks run on the calling thread, at most every :data:`MIN_INTERVAL_S` seconds plus once at the end of
each phase, and must not raise.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import time
from collections.abc import Callable, Iterator

__all__ = ["MIN_INTERVAL_S", "Progress", "ProgressCallback", "current_progress_callback", "format_bytes", "report_progress"]

MIN_INTERVAL_S = 0.1


def format_bytes(n: float) -> str:
    """A byte count (or a rate in bytes/s) for people: ``"512 B"``, ``"1.5 KiB"``, ``"3.2 GiB"``.

    Binary (IEC) units, 1 KiB = 1024 B, up to TiB (larger counts stay in TiB); whole bytes below 1 KiB, one decimal
    above. Used by every prewarm and cache message, so they agree.
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"  # pragma: no cover


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """A snapshot of a prewarm.

    Attributes:
        phase: ``"listing"``, ``"verifying"`` (checking cached files), ``"copying"``, ``"syncing"``
            (making the copy durable), ``"loading"`` (an Alluxio load job) or ``"done"``.
        dataset: the data set's source URI, redacted.
        files_done: files finished in this phase.
        files_total: files this phase will handle.
        bytes_done: bytes finished in this phase.
        bytes_total: bytes this phase will handle (0 where unknown).
        elapsed_s: seconds since the phase started.
    """

    phase: str
    dataset: str
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    elapsed_s: float

    @property
    def bytes_per_s(self) -> float:
        """Throughput of the phase so far, bytes per second."""
        return self.bytes_done / self.elapsed_s if self.elapsed_s > 0 else 0.0


ProgressCallback = Callable[[Progress], None]
_current: contextvars.ContextVar[ProgressCallback | None] = contextvars.ContextVar("heteroflow_progress", default=None)


def current_progress_callback() -> ProgressCallback | None:
    """The callback installed by :func:`report_progress` in this context, if any."""
    return _current.get()


@contextlib.contextmanager
def report_progress(callback: ProgressCallback | None) -> Iterator[None]:
    """Send the progress of cache operations started inside the block to ``callback``."""
    token = _current.set(callback)
    try:
        yield
    finally:
        _current.reset(token)


class Reporter:
    """Throttles and forwards progress of one phase (internal helper)."""

    def __init__(self, callback: ProgressCallback | None, dataset: str) -> None:
        self.callback = callback
        self.dataset = dataset
        self._phase = ""
        self._start = time.monotonic()
        self._last = 0.0
        self.files_total = self.bytes_total = self.files_done = self.bytes_done = 0

    def phase(self, name: str, *, files_total: int, bytes_total: int) -> None:
        self._phase = name
        self._start = time.monotonic()
        self.files_total, self.bytes_total = files_total, bytes_total
        self.files_done = self.bytes_done = 0
        self._emit(force=True)

    def advance(self, files: int, nbytes: int) -> None:
        self.files_done += files
        self.bytes_done += nbytes
        self._emit(force=self.files_done >= self.files_total)

    def _emit(self, *, force: bool = False) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if not force and now - self._last < MIN_INTERVAL_S:
            return
        self._last = now
        self.callback(Progress(
            phase=self._phase, dataset=self.dataset, files_done=self.files_done, files_total=self.files_total,
            bytes_done=self.bytes_done, bytes_total=self.bytes_total, elapsed_s=now - self._start,
        ))
