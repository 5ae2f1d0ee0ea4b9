"""Prewarm: copy a data set into the local cache tier as a version a run can trust.

Layout of one data set in the cache tier (``<cache root>/<cache_key(source)>/``)::

    manifest.json          the current version's manifest (replaced atomically: this is the publish step)
    versions/<version>/    one complete, immutable copy per version: the files and their manifest.json
    .staging/              the copy in progress (private; resumed by the next prewarm after a kill)
    .lock                  file lock: one prewarm of a data set at a time (others wait, then reuse)

How a prewarm runs (:func:`prewarm`):

1. List the source with :func:`heteroflow.cache.listing.list_dataset` (the one listing of a data set), fresh:
   never from a driver's listing cache. A local path is recorded resolved (:func:`heteroflow.cache.sources.normalize_source`).
2. Take the data set's file lock; clean what killed writers left (temporaries, a stale staging folder).
3. Plan each file: *reuse* it from the current version when its source fingerprint and size are unchanged and
   the cached copy passes ``verify``; *resume* it from ``.staging`` when a killed prewarm already copied it
   (its journal line and size/mtime still match); else *copy* it. Nothing changed: the current version stays.
4. Check the free disk space for the bytes to copy.
5. Copy in parallel threads (hashing while copying), hard-link reused files (no byte copied), record each
   finished file in ``.staging``'s journal.
6. List the source again and compare every file (size, and mtime / ETag / Last-Modified where the source has
   them) with what was copied: files that changed meanwhile (or whose copy came out another size than listed, or
   whose read an object store refused with 412) are copied again, up to three rounds, and named in the result
   (``changed_during_copy``) and a warning; a file still changing after that fails with ``SourceChanged``
   (transient; the current version stays). A short read of an unchanged file stays a ``CacheIntegrityError``.
7. Durability in bulk: one ``syncfs`` of the cache filesystem (not an fsync per file), then the version's
   manifest (fsync), then rename ``.staging`` to ``versions/<version>`` (an existing folder of that version is
   swapped out atomically), then replace ``manifest.json`` (fsync, folder fsync).
8. Remove versions beyond ``keep_versions``, oldest first (never the current one).

A killed prewarm therefore never changes the current version: readers keep reading the old, intact copy,
and a rerun resumes. A changed source makes a new version (new folder); an unchanged one is reused as is.
Cached files get ``0o666 & ~umask`` permissions. A published version is never written again, except that a
repaired copy of the same content may replace it as a whole.

This module holds the steps above (:func:`prewarm`, :func:`prewarm_dataset`, :func:`check_source`,
:class:`PrewarmResult`); the rest moved out and is re-exported here: the data set folder's parts, its lock,
housekeeping and :func:`cache_key` / :func:`dataset_cache_dir` to :mod:`heteroflow.cache.layout`, the file copy
(hashing, ``copy_file_range``, the thread pool, the journal) and :func:`default_workers` to
:mod:`heteroflow.cache.copying`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import logging
import math
import os
import posixpath
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from heteroflow.cache.atomic import (
    atomic_write_bytes,
    exchange_paths,
    fsync_dir,
    recover_leftovers,
    sync_filesystem,
)
from heteroflow.cache.copying import _copy_all, _link_or_copy, _open_source, default_workers
from heteroflow.cache.errors import (
    DatasetError,
    InvalidCacheOption,
    SourceChanged,
)
from heteroflow.cache.layout import (
    JOURNAL_NAME,
    LOCK_NAME,
    STAGING_NAME,
    STAT_NAME,
    VERSIONS_DIR,
    _check_space,
    _dataset_lock,
    _gc_versions,
    _journal_ok,
    _load_current,
    _prune_staging,
    _read_journal,
    _read_json,
    _remove_legacy_files,
    cache_key,
    dataset_cache_dir,
)
from heteroflow.cache.listing import DatasetListing, ListedFile, list_dataset
from heteroflow.cache.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestEntry,
    dataset_digest,
    sha256_file,
)
from heteroflow.cache.progress import ProgressCallback, Reporter, current_progress_callback
from heteroflow.cache.redact import redact_url, warn_if_credentials
from heteroflow.cache.sources import normalize_source, source_errors

__all__ = [
    "LOCK_NAME",
    "MANIFEST_NAME",
    "STAGING_NAME",
    "VERIFY_MODES",
    "VERSIONS_DIR",
    "Manifest",
    "ManifestEntry",
    "PrewarmResult",
    "cache_key",
    "check_source",
    "dataset_cache_dir",
    "default_workers",
    "prewarm",
    "prewarm_dataset",
    "prewarm_option_problems",
    "sha256_file",
]

VERIFY_MODES = ("size", "stat", "sha256")
_COPY_ROUNDS = 3  # copies of a data set whose files keep changing at the source before prewarm gives up
_log = logging.getLogger("heteroflow.cache")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PrewarmResult:
    """What a prewarm did.

    Attributes:
        manifest: the manifest of the version now current.
        manifest_path: that version's ``manifest.json`` (inside the version folder).
        files_copied: files copied from the source in this call.
        files_skipped: files reused (already cached and verified, or resumed from a killed prewarm).
        bytes_copied: bytes copied from the source in this call.
        seconds: wall time of the call, in seconds.
        dataset_dir: the data set's folder in the cache tier (holds ``versions/`` and the current manifest).
        skipped_entries: entries of the source not taken, each ``"path (reason)"`` (hidden, symlink loop...).
        changed_during_copy: files that changed at the source while the data set was copied and were copied
            again (the published version holds their new content).
    """

    manifest: Manifest
    manifest_path: Path
    files_copied: int
    files_skipped: int
    bytes_copied: int
    seconds: float
    dataset_dir: Path | None = None
    skipped_entries: tuple[str, ...] = ()
    changed_during_copy: tuple[str, ...] = ()

    @property
    def version(self) -> str:
        """The version id now current."""
        return self.manifest.version

    def facts(self) -> dict[str, Any]:
        """Small JSON-ready facts for a step record, the artifact's metadata and lineage (no credentials)."""
        return {
            "dataset_sha256": self.manifest.dataset_sha256,
            "version": self.manifest.version,
            "files": len(self.manifest.files),
            "total_bytes": self.manifest.total_bytes,
            "files_copied": self.files_copied,
            "files_skipped": self.files_skipped,
            "bytes_copied": self.bytes_copied,
            "entries_not_taken": len(self.skipped_entries),
            "changed_during_copy": len(self.changed_during_copy),
            "cache_dir": self.manifest.root,
            "backend": self.manifest.backend,
            "source_uri": redact_url(self.manifest.source_uri),
            "seconds": round(self.seconds, 3),
        }


def _verify_mode(verify: bool | str) -> str:
    if verify is True:
        return "sha256"
    if verify is False:
        return "size"
    if verify not in VERIFY_MODES:
        raise InvalidCacheOption(f"verify={verify!r} is not a verification mode; valid: {', '.join(VERIFY_MODES)}")
    return verify


def _count_problem(name: str, value: Any, low: int, valid: str) -> str | None:
    """Why ``value`` is not an integer >= ``low`` for the option ``name`` (None when it is one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name}={value!r} is not an integer; valid: {valid}"
    if value < low:
        return f"{name}={value!r} is out of range; valid: {valid}"
    return None


def _lock_timeout_problem(name: str, value: Any) -> str | None:
    """Why ``value`` is not a lock wait for the option ``name``: a finite number of seconds >= 0 (filelock waits
    forever for a negative timeout, and NaN compares as no timeout at all)."""
    valid = "a number of seconds >= 0 (0: do not wait)"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{name}={value!r} is not a finite number; valid: {valid}"
    if value < 0:
        return f"{name}={value!r} is out of range; valid: {valid}"
    return None


def prewarm_option_problems(
    *,
    cache_root: str = "",
    copy_threads: int = 0,
    verify_cached: str = "stat",
    keep_versions: int = 3,
    lock_timeout_s: float = 3600.0,
    names: Mapping[str, str] | None = None,
) -> list[str]:
    """Every problem of :func:`prewarm_dataset`'s options, each named with what is valid; empty when there is none.
    The prewarm step's check (``heteroflow run``, before anything runs), :func:`prewarm_dataset` itself and
    ``heteroflow prewarm`` use it.

    Args:
        cache_root / copy_threads / verify_cached / keep_versions / lock_timeout_s: as :func:`prewarm_dataset`.
        names: how the messages name an option, by :func:`prewarm_dataset`'s name (``{"copy_threads": "--workers"}``
            for a command's own option); default: that name.

    Returns:
        The problems' messages, in the order of the options.
    """
    from heteroflow.cache.backends import backend_for

    named = {n: n for n in ("cache_root", "copy_threads", "verify_cached", "keep_versions", "lock_timeout_s")}
    named.update(names or {})
    problems = []
    try:
        backend_for(cache_root)
    except InvalidCacheOption as exc:
        text, shown = str(exc), redact_url(cache_root)
        head = f"cache root {shown}: "
        problems.append(f"{named['cache_root']}={shown!r}: {text[len(head):]}" if text.startswith(head) else text)
    problems.append(_count_problem(named["copy_threads"], copy_threads, 0, "0 (sized to the work and the CPU cores) or more"))
    if isinstance(verify_cached, bool) or verify_cached not in VERIFY_MODES:
        problems.append(f"{named['verify_cached']}={verify_cached!r} is not a verification mode; valid: {', '.join(VERIFY_MODES)}")
    problems.append(_count_problem(named["keep_versions"], keep_versions, 1, "1 or more (the current version included)"))
    problems.append(_lock_timeout_problem(named["lock_timeout_s"], lock_timeout_s))
    return [p for p in problems if p]


# --- prewarm -----------------------------------------------------------------------------------------------


def prewarm(
    source_uri: str,
    cache_dir: str | os.PathLike[str],
    *,
    verify: bool | str = "stat",
    workers: int = 0,
    keep_versions: int = 3,
    lock_timeout_s: float = 3600.0,
    progress: ProgressCallback | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> PrewarmResult:
    """Copy the data set at ``source_uri`` into ``cache_dir`` as a trusted version (see the module docstring).

    Args:
        source_uri: a local folder or file, or an fsspec URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``
            folder listings, ``memory://``...). Credentials in the URL are accepted with a warning and never
            written (see :mod:`heteroflow.cache.redact`).
        cache_dir: this data set's folder in the cache tier (created if missing); usually
            :func:`dataset_cache_dir`.
        verify: how a cached file is checked before it is reused: ``"size"`` (size only), ``"stat"`` (size, and
            its mtime as recorded when it was verified; a file written since is re-hashed), ``"sha256"``
            (re-hash every file). ``True``/``False`` mean ``"sha256"``/``"size"``.
        workers: copy threads; 0 picks :func:`default_workers`.
        keep_versions: versions kept in the cache, the current one included (>= 1).
        lock_timeout_s: seconds to wait for another prewarm of the same data set (unit: s).
        progress: called with a :class:`heteroflow.cache.progress.Progress` as the work advances; default:
            the callback installed by :func:`heteroflow.cache.progress.report_progress`, if any.
        storage_options: fsspec options for the source's driver; default: the driver's own configuration.

    Returns:
        A :class:`PrewarmResult`; ``files_copied == 0`` on a rerun over an unchanged source.

    Raises:
        DatasetError: the source does not exist (404), access is denied (403 / credentials), it holds no data
            file (the message names the skipped entries), its driver is missing (names the package).
        SourceUnavailable: the source's host cannot be reached or timed out (transient); what was copied is kept
            in ``.staging`` and the next prewarm resumes from it.
        CacheIntegrityError: a copied file's size differs from the source's listing (a truncated read).
        CacheSpaceError: not enough free space in the cache tier for the files to copy.
        CacheLockTimeout: another prewarm of the same data set held the lock for ``lock_timeout_s``.
        InvalidCacheOption: ``verify``, ``workers``, ``keep_versions`` or ``lock_timeout_s`` out of range (a
            negative or NaN ``lock_timeout_s`` would wait forever).
    """
    started = time.perf_counter()
    mode = _verify_mode(verify)
    for problem in (_count_problem("workers", workers, 0, "0 (automatic) or more"),
                    _count_problem("keep_versions", keep_versions, 1, "1 or more"),
                    _lock_timeout_problem("lock_timeout_s", lock_timeout_s)):
        if problem:
            raise InvalidCacheOption(problem)
    warn_if_credentials(source_uri)
    source_uri = normalize_source(source_uri)  # a relative local path is recorded as the folder it names
    shown = redact_url(source_uri)
    report = Reporter(progress or current_progress_callback(), shown)
    report.phase("listing", files_total=0, bytes_total=0)
    listing = list_dataset(source_uri, storage_options=storage_options, require_data=False)  # any files: readers judge formats
    files = [f for f in listing.files]
    open_src = _open_source(listing, source_uri, storage_options)

    dataset_dir = Path(cache_dir).expanduser()
    created_dir = not dataset_dir.exists()
    dataset_dir.mkdir(parents=True, exist_ok=True)
    try:
        with _dataset_lock(dataset_dir, lock_timeout_s):
            result = _prewarm_locked(source_uri, shown, dataset_dir, files, listing, open_src, mode, workers,
                                     keep_versions, report,
                                     relist=lambda: list_dataset(source_uri, require_data=False, storage_options=storage_options))
    except BaseException as exc:
        if isinstance(exc, DatasetError):  # permanent: a resume would not help, so keep nothing of this attempt
            shutil.rmtree(dataset_dir / STAGING_NAME, ignore_errors=True)
        if created_dir and not (dataset_dir / VERSIONS_DIR).exists() and not (dataset_dir / STAGING_NAME).exists():
            shutil.rmtree(dataset_dir, ignore_errors=True)  # nothing half-cached: not even an empty folder
        raise
    return dataclasses.replace(result, seconds=time.perf_counter() - started,
                               skipped_entries=tuple(str(s) for s in listing.skipped))


def _prewarm_locked(
    source_uri: str,
    shown: str,
    dataset_dir: Path,
    files: list[ListedFile],
    listing: DatasetListing,
    open_src: Callable[[ListedFile], BinaryIO] | None,
    mode: str,
    workers: int,
    keep_versions: int,
    report: Reporter,
    relist: Callable[[], DatasetListing] | None = None,
) -> PrewarmResult:
    staging = dataset_dir / STAGING_NAME
    versions = dataset_dir / VERSIONS_DIR
    for leftover in (dataset_dir / MANIFEST_NAME, staging):
        recover_leftovers(leftover)
    current = _load_current(dataset_dir)
    legacy = current if current is not None and not current.version else None
    current_root = Path(current.root) if current is not None and current.root else None
    current_files = {f.path: f for f in current.files} if current is not None else {}
    stat_index = (_read_json(current_root / STAT_NAME) or {}) if current_root is not None else {}

    copied_paths: set[str] = set()
    bytes_copied = 0
    moved_total: list[str] = []
    for round_no in range(_COPY_ROUNDS):
        journal = _read_journal(staging) if staging.is_dir() else {}

        # --- plan: reuse from the current version, resume from staging, or copy ----------------------------
        reuse: dict[str, ManifestEntry] = {}
        to_check: list[tuple[ListedFile, ManifestEntry, Path]] = []
        resumed: dict[str, ManifestEntry] = {}
        copy: list[ListedFile] = []
        for f in files:
            old = current_files.get(f.path)
            rec = journal.get(f.path)
            if old is not None and current_root is not None and old.source_key == f.key and (f.bytes is None or old.bytes == f.bytes):
                to_check.append((f, old, current_root.joinpath(*f.path.split("/"))))
            elif rec is not None and rec.get("source_key") == f.key and _journal_ok(staging, f.path, rec):
                resumed[f.path] = ManifestEntry(path=f.path, bytes=rec["bytes"], sha256=rec["sha256"], source_key=f.key)
            else:
                copy.append(f)

        if to_check:
            report.phase("verifying", files_total=len(to_check), bytes_total=sum(o.bytes for _, o, _ in to_check))
            ok = _verify_cached(to_check, stat_index, mode, workers, report)
            for f, old, _ in to_check:
                if ok[f.path]:
                    reuse[f.path] = old
                elif (rec := journal.get(f.path)) is not None and rec.get("source_key") == f.key and _journal_ok(staging, f.path, rec):
                    resumed[f.path] = ManifestEntry(path=f.path, bytes=rec["bytes"], sha256=rec["sha256"], source_key=f.key)
                else:
                    copy.append(f)

        unchanged = (
            round_no == 0
            and current is not None
            and not legacy
            and not copy
            and not resumed
            and set(reuse) == set(current_files)
        )
        if unchanged:
            assert current is not None and current_root is not None  # for type checkers; guaranteed by `unchanged`
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
            report.phase("done", files_total=len(files), bytes_total=current.total_bytes)
            return PrewarmResult(
                manifest=current, manifest_path=current_root / MANIFEST_NAME, files_copied=0,
                files_skipped=len(reuse), bytes_copied=0, seconds=0.0, dataset_dir=dataset_dir,
            )

        # --- stage ----------------------------------------------------------------------------------------
        _check_space(dataset_dir, sum(f.bytes or 0 for f in copy))
        staging.mkdir(exist_ok=True)
        wanted = {f.path for f in files}
        _prune_staging(staging, keep=set(resumed))
        parents = {posixpath.dirname(p) for p in wanted if "/" in p}
        for parent in sorted(parents):
            staging.joinpath(*parent.split("/")).mkdir(parents=True, exist_ok=True)

        stats: dict[str, list[int]] = {}
        for path, rec in journal.items():
            if path in resumed:
                stats[path] = [rec["bytes"], rec["mtime_ns"]]
        for path, old in reuse.items():
            dest = staging.joinpath(*path.split("/"))
            dest.unlink(missing_ok=True)
            assert current_root is not None
            _link_or_copy(current_root.joinpath(*path.split("/")), dest)
            st = dest.stat()
            stats[path] = [st.st_size, st.st_mtime_ns]

        copied: dict[str, ManifestEntry] = {}
        failed: dict[str, BaseException] = {}  # copies that found the source moving under them (size, 412)
        if copy:
            report.phase("copying", files_total=len(copy), bytes_total=sum(f.bytes or 0 for f in copy))
            n_workers = workers or default_workers(remote=not listing.local, files=len(copy))
            with source_errors(source_uri):
                for entry, mtime_ns in _copy_all(copy, staging, open_src, n_workers, report, failed, source_uri):
                    copied[entry.path] = entry
                    copied_paths.add(entry.path)
                    bytes_copied += entry.bytes
                    stats[entry.path] = [entry.bytes, mtime_ns]

        # --- publish-time check: every file still as listed (size, and mtime / ETag where the source has them) -
        if relist is None:
            if failed:
                raise next(iter(failed.values()))
            break
        fresh = {f.path: f for f in relist().files}
        listed = {f.path: f for f in files}
        moved = sorted(
            p for p in set(fresh) | set(listed)
            if p not in fresh or p not in listed or (fresh[p].key, fresh[p].bytes) != (listed[p].key, listed[p].bytes)
        )
        for path, exc in failed.items():
            if path not in moved and not isinstance(exc, SourceChanged):
                raise exc  # the source is as listed, yet the read came out short: not a change, a bad read
        moved = sorted(set(moved) | set(failed))
        if not moved:
            break
        moved_total += [p for p in moved if p not in moved_total]
        if round_no == _COPY_ROUNDS - 1:
            continue  # no tries left: the else clause below fails with SourceChanged
        _log.warning("data set %s: %d file%s changed at the source while the data set was copied (%s); copying %s again",
                     shown, len(moved), "" if len(moved) == 1 else "s", redact_url(", ".join(moved[:10])),
                     "it" if len(moved) == 1 else "them")
        files = sorted(fresh.values(), key=lambda f: f.path)
        if not files:
            raise DatasetError(f"data set {shown}: every file was removed at the source while it was copied")
    else:
        raise SourceChanged(
            f"data set {shown}: {redact_url(', '.join(moved[:10]))} kept changing at the source while {'it was' if len(moved) == 1 else 'they were'} "
            f"copied ({_COPY_ROUNDS} tries; size, mtime or ETag moved each time); rerun prewarm once the writer has "
            "finished (what was copied is kept and reused)"
        )

    entries = [reuse.get(f.path) or resumed.get(f.path) or copied[f.path] for f in files]
    digest = dataset_digest(entries)
    version = digest[:16]
    target = versions / version

    # --- publish ------------------------------------------------------------------------------------------
    report.phase("syncing", files_total=len(files), bytes_total=sum(e.bytes for e in entries))
    (staging / JOURNAL_NAME).unlink(missing_ok=True)
    (staging / STAT_NAME).write_text(json.dumps(stats, sort_keys=True), encoding="utf-8")
    manifest = Manifest(
        source_uri=shown, root=str(target.resolve()), files=tuple(entries), dataset_sha256=digest, version=version,
        backend="local", created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
    )
    sync_filesystem(staging)  # every copied byte and folder entry durable, in one call
    manifest_bytes = manifest.to_json_bytes()
    atomic_write_bytes(staging / MANIFEST_NAME, manifest_bytes)
    versions.mkdir(exist_ok=True)
    if target.exists():
        # the same content is already a version (a repair, or the source changed back): swap in the verified copy
        if not exchange_paths(staging, target):
            old = versions / f".{version}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(target, old)
            os.rename(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            shutil.rmtree(staging, ignore_errors=True)
    else:
        os.rename(staging, target)
    fsync_dir(versions)
    atomic_write_bytes(dataset_dir / MANIFEST_NAME, manifest_bytes)
    if legacy is not None:
        _remove_legacy_files(dataset_dir, legacy)
    removed = _gc_versions(dataset_dir, version, keep_versions)
    if removed:
        _log.info("data set %s: removed old cache versions %s", shown, ", ".join(removed))
    report.phase("done", files_total=len(files), bytes_total=manifest.total_bytes)
    return PrewarmResult(
        manifest=manifest, manifest_path=target / MANIFEST_NAME, files_copied=len(copied_paths & {f.path for f in files}),
        files_skipped=len(files) - len(copied_paths & {f.path for f in files}), bytes_copied=bytes_copied, seconds=0.0,
        dataset_dir=dataset_dir, changed_during_copy=tuple(moved_total),
    )


def _verify_cached(
    items: list[tuple[ListedFile, ManifestEntry, Path]],
    stat_index: Mapping[str, Any],
    mode: str,
    workers: int,
    report: Reporter,
) -> dict[str, bool]:
    def check(item: tuple[ListedFile, ManifestEntry, Path]) -> bool:
        f, old, path = item
        try:
            st = path.stat()
        except OSError:
            return False
        if st.st_size != old.bytes:
            return False
        if mode == "size":
            return True
        if mode == "stat" and stat_index.get(f.path) == [st.st_size, st.st_mtime_ns]:
            return True
        return sha256_file(path) == old.sha256

    n = workers or default_workers(remote=False, files=len(items))
    out: dict[str, bool] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, n)) as pool:
        for item, ok in zip(items, pool.map(check, items)):
            out[item[0].path] = ok
            report.advance(1, item[1].bytes)
    return out


# --- the step-level function and the up-front check --------------------------------------------------------


def check_source(uri: str) -> None:
    """Check a data set source before anything runs, copying nothing: the same listing prewarm uses.

    Raises:
        DatasetError: unknown URL scheme or missing fsspec driver (names the package), missing folder or file,
            access denied, no data file (names the entries skipped and why).
        SourceUnavailable: the source's host does not answer (transient).
    """
    warn_if_credentials(uri)
    list_dataset(uri)


def prewarm_dataset(
    source_uri: str,
    dataset_dir: str,
    *,
    cache_root: str = "",
    copy_threads: int = 0,
    verify_cached: str = "stat",
    keep_versions: int = 3,
    lock_timeout_s: float = 3600.0,
) -> PrewarmResult:
    """Prewarm ``source_uri`` into the cache tier and describe the version in ``dataset_dir`` (the artifact).

    The copy lives in ``<cache_root or the local cache tier>/<cache key>/versions/<version>/``; ``dataset_dir``
    gets that version's ``manifest.json`` (root, version, per-file bytes and sha256), which is all a reader
    (:func:`heteroflow.cache.dataset.open_dataset`) needs to find and verify exactly this version. With an
    Alluxio cache root the data set is loaded into Alluxio instead (see :mod:`heteroflow.cache.backends`).
    Progress goes to the callback installed with :func:`heteroflow.cache.progress.report_progress`.

    Args:
        source_uri: the data set: a local folder or file, or an fsspec URL (credentials never in it: the storage driver reads them).
        dataset_dir: output folder that receives the version's manifest.json (created if missing).
        cache_root: cache tier: a local folder (empty: the local cache under HETEROFLOW_HOME), alluxio2://PROXY:PORT or alluxio3://WORKER:PORT.
        copy_threads: copy threads; 0 sizes them to the work and the CPU cores (unit: threads).
        verify_cached: how cached files are checked before reuse: size, stat (size and mtime; re-hash files written since) or sha256 (re-hash all).
        keep_versions: data set versions kept in the cache tier, the current one included.
        lock_timeout_s: seconds to wait for another prewarm of the same data set (unit: s).

    Returns:
        A :class:`PrewarmResult`; ``.facts()`` gives the small values for records and lineage.

    Raises:
        DatasetError: the source is missing, empty, refused (401/403/404) or holds no data file (see :func:`prewarm`).
        SourceUnavailable: the source's host cannot be reached (transient).
        SourceTimeout: the source timed out (transient).
        CacheIntegrityError: a copied file does not match the source.
        CacheSpaceError: not enough free space in the cache tier.
        CacheLockTimeout: another prewarm of the same data set held the lock for ``lock_timeout_s``.
        InvalidCacheOption: a bad ``cache_root``, ``copy_threads``, ``verify_cached``, ``keep_versions`` or
            ``lock_timeout_s`` (:func:`prewarm_option_problems`: every one, each named as here).
    """
    from heteroflow.cache.backends import backend_for

    problems = prewarm_option_problems(cache_root=cache_root, copy_threads=copy_threads, verify_cached=verify_cached,
                                       keep_versions=keep_versions, lock_timeout_s=lock_timeout_s)
    if len(problems) == 1:
        raise InvalidCacheOption(problems[0])
    if problems:
        raise InvalidCacheOption(f"{len(problems)} problems with prewarm's parameters:\n- " + "\n- ".join(problems))
    backend = backend_for(cache_root)
    result = backend.prewarm(source_uri, workers=copy_threads, verify=verify_cached, keep_versions=keep_versions,
                             lock_timeout_s=lock_timeout_s)
    out = Path(dataset_dir)
    out.mkdir(parents=True, exist_ok=True)
    result.manifest.write(out / MANIFEST_NAME)
    return result
