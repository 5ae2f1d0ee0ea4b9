"""Copying a data set's files into ``.staging``: the per-file copy (hashing on the way) and the parallel copy.

:func:`_copy_file` copies one file: a small local file in one read, a larger local one with
``copy_file_range(2)`` (then hashed through a mapping), a remote one in 8 MiB chunks; the copy gets
``0o666 & ~umask``, and a size other than listed is a :class:`~heteroflow.cache.errors.CacheIntegrityError`.
:func:`_copy_all` runs it on a thread pool over batches of small files, and records each finished file in the
staging journal, so a killed prewarm resumes file by file. :func:`default_workers` sizes the pool.
Used by :mod:`heteroflow.cache.prewarm`.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import mmap
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from heteroflow.cache.errors import CacheIntegrityError, SourceChanged, SourceUnavailable
from heteroflow.cache.layout import JOURNAL_NAME
from heteroflow.cache.listing import DatasetListing, ListedFile
from heteroflow.cache.manifest import ManifestEntry
from heteroflow.cache.progress import Reporter
from heteroflow.cache.sources import classify, filesystem_for

__all__ = ["default_workers"]

_BATCH_FILES = 64  # small files per thread-pool task (cuts per-task overhead on trees of many small files)
_BATCH_BYTES = 8 << 20


def default_workers(*, remote: bool, files: int) -> int:
    """Copy threads for ``files`` files: 4 per CPU core for a remote source (network-bound), 2 per core for a
    local one (disk-bound), at least 4 and at most 32, never more than the files."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = max(4, min(32, cpus * (4 if remote else 2)))
    return max(1, min(n, files))



def _open_source(listing: DatasetListing, source_uri: str, storage_options: Mapping[str, Any] | None) -> Callable[[ListedFile], BinaryIO] | None:
    """How to open a source file: None for a local data set (plain syscalls), else the fsspec driver's open."""
    if listing.local:
        return None
    fs, _ = filesystem_for(source_uri, storage_options)
    return lambda f: fs.open(f.source, "rb")


_SMALL_FILE = 1 << 20  # files up to this size are read in one call
_BIG_CHUNK = 8 << 20  # read/write unit for larger files (bytes); larger chunks measured 3-4x faster than 1 MiB here
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
_local_buffers = threading.local()


def _write_all(fd: int, data: memoryview | bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of dirty pages, do not wait


def _start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages now (``sync_file_range(2)``), without waiting; a
    no-op where unavailable. Durability still comes from the one ``syncfs`` before publishing."""
    global _sync_file_range
    if _sync_file_range is None:
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
            _sync_file_range = fn
        except (OSError, AttributeError):
            _sync_file_range = False
    if _sync_file_range:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


_sync_file_range: Any = None


def _kernel_copy(source: str, out: int) -> bool:
    """Copy ``source`` into the open file ``out`` with ``copy_file_range(2)``; False (nothing written) where the
    kernel or filesystem cannot, so the caller copies through user space."""
    src = os.open(source, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        total = 0
        while True:
            try:
                n = os.copy_file_range(src, out, 1 << 30)
            except OSError:
                if total:
                    raise
                return False
            if n == 0:
                return True
            total += n
    finally:
        os.close(src)


def _copy_file(f: ListedFile, dest: str, open_src: Callable[[ListedFile], BinaryIO] | None) -> tuple[int, str, int]:
    """Copy one file, hashing it on the way. ``open_src`` None: a local file, read with plain syscalls.
    Returns (bytes, sha256 hex, mtime_ns of the copy). The copy gets ``0o666 & ~umask``."""
    digest = hashlib.sha256()
    written = 0
    out = os.open(dest, _O_NEW, 0o666)
    try:
        if open_src is None and f.bytes is not None and f.bytes <= _SMALL_FILE:
            src = os.open(f.source, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                data = os.read(src, f.bytes + 1)
                while len(data) <= f.bytes:  # a short read (rare): read on to the end
                    more = os.read(src, f.bytes + 1 - len(data))
                    if not more:
                        break
                    data += more
            finally:
                os.close(src)
            digest.update(data)
            _write_all(out, data)
            written = len(data)
        elif open_src is None and hasattr(os, "copy_file_range") and _kernel_copy(f.source, out):
            # local to local: the kernel copies (as cp does), then the copy itself is hashed through a mapping,
            # so the manifest describes exactly the bytes in the cache
            written = os.fstat(out).st_size
            _start_writeback(out)  # the disk writes while the copy is hashed; the final syncfs waits for less
            if written:
                with open(dest, "rb", buffering=0) as back, mmap.mmap(
                    back.fileno(), 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ
                ) as mapped:
                    digest.update(mapped)
        else:
            buf = getattr(_local_buffers, "buf", None)
            if buf is None:
                buf = _local_buffers.buf = bytearray(_BIG_CHUNK)
            view = memoryview(buf)
            with (open(f.source, "rb", buffering=0) if open_src is None else open_src(f)) as src_fh:
                readinto = getattr(src_fh, "readinto", None)
                while True:
                    if readinto is not None:
                        n = readinto(buf)
                        if not n:
                            break
                        chunk: memoryview | bytes = view[:n]
                    else:
                        chunk = src_fh.read(_BIG_CHUNK)
                        if not chunk:
                            break
                        n = len(chunk)
                    digest.update(chunk)
                    _write_all(out, chunk)
                    written += n
        mtime_ns = os.fstat(out).st_mtime_ns
    finally:
        os.close(out)
    if f.bytes is not None and written != f.bytes:
        os.unlink(dest)
        raise CacheIntegrityError(
            f"copied {written} bytes of {f.path!r} but the source has {f.bytes}; the source changed or the read was "
            "cut short: rerun prewarm"
        )
    return written, digest.hexdigest(), mtime_ns


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:  # no hard links on this filesystem: a local copy (still no read from the source)
        shutil.copyfile(src, dest)


def _batches(files: list[ListedFile]) -> list[list[ListedFile]]:
    out: list[list[ListedFile]] = []
    cur: list[ListedFile] = []
    size = 0
    for f in files:
        if cur and (len(cur) >= _BATCH_FILES or size + (f.bytes or _BATCH_BYTES) > _BATCH_BYTES):
            out.append(cur)
            cur, size = [], 0
        cur.append(f)
        size += f.bytes or _BATCH_BYTES
    if cur:
        out.append(cur)
    return out



def _vanished(exc: BaseException) -> bool:
    """Whether a FileNotFoundError is anywhere in ``exc``'s chain (fsspec raises it for a 404 too)."""
    from heteroflow.cache.sources import _chain

    return any(isinstance(e, FileNotFoundError) for e in _chain(exc))


def _copy_all(
    files: list[ListedFile],
    staging: Path,
    open_src: Callable[[ListedFile], BinaryIO] | None,
    workers: int,
    report: Reporter,
    failed: dict[str, BaseException] | None = None,
    source_uri: str = "",
) -> Iterator[tuple[ManifestEntry, int]]:
    """Copy ``files`` into ``staging`` on ``workers`` threads; yield each finished file (on this thread).

    With ``failed``, a file whose copy found the source moving under it (a size other than listed, an object
    store's 412 to a read pinned to the listed ETag) is recorded there with its error instead of stopping the
    copy: the caller compares a fresh listing and copies it again (or raises the error when nothing changed).
    """

    journal = open(staging / JOURNAL_NAME, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    journal_lock = threading.Lock()

    base = str(staging)

    def run(batch: list[ListedFile]) -> list[tuple[ManifestEntry, int]]:
        out = []
        for f in batch:
            try:
                n, sha, mtime_ns = _copy_file(f, os.path.join(base, f.path), open_src)
            except Exception as exc:
                if failed is None:
                    raise
                mapped = exc if isinstance(exc, CacheIntegrityError) else classify(exc, source_uri)
                # a file listed moments ago and gone now (a local unlink, an object store's 404) is kept for the fresh
                # listing to judge, as a file of another size is: gone from it too, the source changed and is copied
                # again; still listed, the error stands (it was raised at once, "data set ... does not exist", and
                # the copy so far was thrown away)
                vanished = _vanished(exc) and not isinstance(mapped, SourceUnavailable)  # a refused connection has
                if not isinstance(mapped, (CacheIntegrityError, SourceChanged)) and not vanished:  # one in its chain too
                    raise
                with journal_lock:
                    failed[f.path] = mapped
                continue
            entry = ManifestEntry(path=f.path, bytes=n, sha256=sha, source_key=f.key)
            line = json.dumps({"path": f.path, "bytes": n, "sha256": sha, "source_key": f.key, "mtime_ns": mtime_ns})
            with journal_lock:  # one line per finished file: a killed prewarm resumes file by file
                journal.write(line + "\n")
                journal.flush()
            out.append((entry, mtime_ns))
        return out

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="heteroflow-prewarm") as pool:
        futures = [pool.submit(run, b) for b in _batches(files)]
        try:
            for fut in concurrent.futures.as_completed(futures):
                done = fut.result()
                for item in done:
                    yield item
                report.advance(len(done), sum(e.bytes for e, _ in done))
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            journal.close()
