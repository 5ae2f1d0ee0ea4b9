"""What the cache tier holds: data sets, their versions, and how much of the current one is actually cached."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from heteroflow.cache.errors import DatasetError
from heteroflow.cache.layout import JOURNAL_NAME, STAGING_NAME, VERSIONS_DIR, _read_journal, cache_key
from heteroflow.cache.locations import local_cache_dir
from heteroflow.cache.manifest import MANIFEST_NAME, Manifest

__all__ = ["DatasetStatus", "VersionStatus", "cache_status"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class VersionStatus:
    """One version of a data set in the cache.

    Attributes:
        version: the version id.
        created: publish time (UTC, ISO 8601).
        files: files in the version.
        bytes: total bytes of the version.
        current: True for the version readers get by default.
    """

    version: str
    created: str
    files: int
    bytes: int
    current: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DatasetStatus:
    """One data set in the cache tier.

    Attributes:
        key: its folder name (``<name>-<hash>``).
        folder: its folder in the cache tier.
        source_uri: where it came from (redacted).
        backend: ``local``, ``alluxio2`` or ``alluxio3``.
        versions: newest first.
        files_cached: files of the current version present with their manifest size (local backend; for
            Alluxio the counts recorded at the last prewarm).
        files_total: files in the current version.
        bytes_cached: bytes of those files.
        bytes_total: bytes of the current version.
        staged_files: files a killed or running prewarm has copied so far (resumable), 0 when none.
    """

    key: str
    folder: Path
    source_uri: str
    backend: str
    versions: tuple[VersionStatus, ...]
    files_cached: int
    files_total: int
    bytes_cached: int
    bytes_total: int
    staged_files: int

    @property
    def cached_fraction(self) -> float:
        """Bytes cached / bytes total of the current version (1.0 for an empty one)."""
        return self.bytes_cached / self.bytes_total if self.bytes_total else 1.0


def _status_of(folder: Path) -> DatasetStatus | None:
    try:
        current = Manifest.load(folder / MANIFEST_NAME)
    except DatasetError:
        current = None
    versions: list[VersionStatus] = []
    vdir = folder / VERSIONS_DIR
    if vdir.is_dir():
        for d in vdir.iterdir():
            if not d.is_dir() or d.name.startswith("."):
                continue
            try:
                m = Manifest.load(d / MANIFEST_NAME)
            except DatasetError:
                continue
            versions.append(VersionStatus(version=m.version, created=m.created, files=len(m.files), bytes=m.total_bytes,
                                          current=current is not None and m.version == current.version))
    versions.sort(key=lambda v: v.created, reverse=True)
    # the files a killed prewarm finished, read as prewarm reads them (a torn last line ignored: the kill came
    # mid-write; json.loads of it here made `cache status` and `cache prune` fail)
    staged = len(_read_journal(folder / STAGING_NAME)) if (folder / STAGING_NAME / JOURNAL_NAME).is_file() else 0
    if current is None and not versions and not staged:
        return None
    files_cached = bytes_cached = 0
    if current is not None:
        if current.backend == "local" and current.root:
            for entry, path in zip(current.files, current.local_paths()):
                try:
                    if path.stat().st_size == entry.bytes:
                        files_cached += 1
                        bytes_cached += entry.bytes
                except OSError:
                    pass
        else:
            files_cached, bytes_cached = len(current.files), current.total_bytes
    return DatasetStatus(
        key=folder.name, folder=folder, source_uri=current.source_uri if current else "",
        backend=current.backend if current else "local", versions=tuple(versions),
        files_cached=files_cached, files_total=len(current.files) if current else 0,
        bytes_cached=bytes_cached, bytes_total=current.total_bytes if current else 0, staged_files=staged,
    )


def cache_status(cache_root: str = "", dataset: str = "") -> list[DatasetStatus]:
    """The data sets in a local cache tier (and the Alluxio versions recorded there), sorted by key.

    Args:
        cache_root: the cache tier's folder; empty: the local cache under ``HETEROFLOW_HOME``.
        dataset: only this data set: its source URI, its cache key, or a prefix of the key (``digits``).

    Returns:
        One :class:`DatasetStatus` per data set found (empty when none).
    """
    root = Path(cache_root.removeprefix("file://")).expanduser() if cache_root else local_cache_dir()
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if p.is_dir() and p.name != "alluxio"]
    alluxio = root / "alluxio"
    if alluxio.is_dir():
        folders += [p for p in alluxio.iterdir() if p.is_dir()]
    if dataset:
        key = cache_key(dataset)
        folders = [p for p in folders if p.name == key or p.name == dataset or p.name.startswith(dataset + "-")]
    out = [s for s in (_status_of(p) for p in sorted(folders)) if s is not None]
    return out
