"""The folder of one data set in the cache tier: its name, its parts, and the housekeeping around them.

Layout (``<cache root>/<cache_key(source)>/``)::

    manifest.json          the current version's manifest (replaced atomically: this is the publish step)
    versions/<version>/    one complete, immutable copy per version: the files and their manifest.json
    .staging/              the copy in progress (private; resumed by the next prewarm after a kill)
    .lock                  file lock: one prewarm of a data set at a time (others wait, then reuse)

Here: the names of those parts, :func:`cache_key` and :func:`dataset_cache_dir` (where a source is cached), and
what :mod:`heteroflow.cache.prewarm` does with the parts: read the current manifest, the stat index and the
staging journal, take the data set's lock, check the free space, prune ``.staging``, remove old versions and the
files of the format-1 layout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from heteroflow.cache.errors import CacheLockTimeout, CacheSpaceError, DatasetError
from heteroflow.cache.locations import local_cache_dir
from heteroflow.cache.manifest import MANIFEST_NAME, Manifest
from heteroflow.cache.progress import format_bytes
from heteroflow.cache.sources import dataset_identity

__all__ = [
    "JOURNAL_NAME",
    "LOCK_NAME",
    "STAGING_NAME",
    "STAT_NAME",
    "VERSIONS_DIR",
    "cache_key",
    "dataset_cache_dir",
]

VERSIONS_DIR = "versions"
STAGING_NAME = ".staging"
LOCK_NAME = ".lock"
STAT_NAME = ".heteroflow-stat.json"  # per version: (bytes, mtime_ns) of each file when it was verified
JOURNAL_NAME = ".heteroflow-journal.jsonl"  # in .staging: one line per finished file
_log = logging.getLogger("heteroflow.cache")


def cache_key(source_uri: str) -> str:
    """Folder name of a source in the cache tier: ``<basename>-<12 hex of sha256(identity)>``.

    The identity is :func:`heteroflow.cache.sources.dataset_identity`: a local path absolute with symlinks
    resolved (``data/x`` from any spelling, as ``heteroflow run --dataset`` resolves it), a URL without
    credentials, signing parameters or trailing ``/``. The basename is that of the path (query and fragment
    dropped), made filesystem-safe. Every cache key (prewarm, ``cache status``, Alluxio records) is this one.
    """
    canonical = dataset_identity(source_uri)
    path = canonical.split("://", 1)[-1]
    path = path.split("?", 1)[0].split("#", 1)[0] if "://" in canonical else path
    base = posixpath.basename(path.rstrip("/")) or "dataset"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base).strip(".")[:48] or "dataset"
    return f"{safe}-{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


def dataset_cache_dir(source_uri: str, cache_root: str = "") -> Path:
    """``<cache_root or the local cache tier>/<cache_key(source_uri)>``."""
    root = Path(cache_root.removeprefix("file://")).expanduser() if cache_root else local_cache_dir()
    return root / cache_key(source_uri)



# --- the parts of a data set folder ------------------------------------------------------------------------


def _load_current(dataset_dir: Path) -> Manifest | None:
    path = dataset_dir / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        return Manifest.load(path)
    except DatasetError as exc:  # damaged or foreign: treated as no cache, everything is copied again
        _log.warning("ignoring the cached manifest %s: %s", path, exc)
        return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_journal(staging: Path) -> dict[str, dict[str, Any]]:
    """Finished files of a killed prewarm: path -> {bytes, sha256, source_key, mtime_ns}. A torn last line
    (the kill came mid-write) is ignored."""
    out: dict[str, dict[str, Any]] = {}
    try:
        lines = (staging / JOURNAL_NAME).read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
            out[rec["path"]] = rec
        except (ValueError, KeyError, TypeError):
            continue
    return out


@contextlib.contextmanager
def _dataset_lock(dataset_dir: Path, timeout_s: float) -> Iterator[None]:
    import filelock

    lock = filelock.FileLock(str(dataset_dir / LOCK_NAME), timeout=timeout_s, preserve_lock_file=True)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise CacheLockTimeout(
            f"another prewarm of this data set holds {dataset_dir / LOCK_NAME} for more than {timeout_s:.0f} s; wait "
            "for it to finish (or raise lock_timeout_s); a lock of a killed process is released by the kernel"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _journal_ok(staging: Path, path: str, rec: Mapping[str, Any]) -> bool:
    try:
        st = staging.joinpath(*path.split("/")).stat()
    except OSError:
        return False
    return st.st_size == rec.get("bytes") and st.st_mtime_ns == rec.get("mtime_ns")


def _prune_staging(staging: Path, keep: set[str]) -> None:
    """Remove every file in ``staging`` that is not a resumed one (partial files of a killed copy included)."""
    for dirpath, dirnames, filenames in os.walk(staging):
        rel_dir = os.path.relpath(dirpath, staging)
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir.replace(os.sep, '/')}/{name}"
            if rel not in keep and name != JOURNAL_NAME:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(dirpath, name))



def _check_space(dataset_dir: Path, needed: int) -> None:
    free = shutil.disk_usage(dataset_dir).free
    if needed > free:
        raise CacheSpaceError(
            f"not enough free space in the cache tier at {dataset_dir}: the copy needs {format_bytes(needed)} ({needed} bytes), "
            f"{format_bytes(free)} ({free} bytes) are free; free space there, or give another cache root (--cache / cache_root)"
        )


def _gc_versions(dataset_dir: Path, current: str, keep: int) -> list[str]:
    versions = dataset_dir / VERSIONS_DIR
    if not versions.is_dir():
        return []
    found = []
    for d in versions.iterdir():
        if d.is_dir() and not d.name.startswith("."):
            try:
                found.append(((d / MANIFEST_NAME).stat().st_mtime, d))
            except FileNotFoundError:
                found.append((0.0, d))
    found.sort(key=lambda t: t[0], reverse=True)
    kept = [d for _, d in found if d.name == current][:1] + [d for _, d in found if d.name != current]
    removed = []
    for d in kept[max(1, keep):]:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d.name)
    return removed


def _remove_legacy_files(dataset_dir: Path, legacy: Manifest) -> None:
    """Files of the format-1 layout (the data set's files directly in its cache folder), once migrated."""
    for entry in legacy.files:
        if entry.path.split("/", 1)[0] in (VERSIONS_DIR, STAGING_NAME, MANIFEST_NAME, LOCK_NAME):
            continue
        with contextlib.suppress(OSError):
            (dataset_dir / entry.path).unlink()
    for d in sorted((p for p in dataset_dir.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if d.name in (VERSIONS_DIR, STAGING_NAME) or VERSIONS_DIR in d.relative_to(dataset_dir).parts[:1]:
            continue
        with contextlib.suppress(OSError):
            d.rmdir()
    for tmp in dataset_dir.glob("**/.*.part"):
        with contextlib.suppress(OSError):
            tmp.unlink()

