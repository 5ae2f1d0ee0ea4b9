"""Reading a data set as a run should: exactly the version prewarm published, checked against its manifest.

:func:`open_dataset` takes what a step is handed: a prewarm output folder (it holds ``manifest.json``), a
manifest file, a data set's folder in the cache tier, or a plain local folder or file (no manifest: listed by
:func:`heteroflow.cache.listing.list_dataset`, the same rules as prewarm). It checks every file against the
manifest (``verify``: ``"size"`` by default, ``"sha256"`` to re-hash, ``"none"``) and fails with a message that
names the file and the fix; the returned :class:`DatasetView` carries the version id and ``dataset_sha256``
for lineage.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from pathlib import Path

from heteroflow.cache.errors import CacheIntegrityError, DatasetError, InvalidCacheOption
from heteroflow.cache.listing import formats_help, is_data_file, list_dataset, misnamed_note
from heteroflow.cache.manifest import MANIFEST_NAME, Manifest, dataset_digest, sha256_file
from heteroflow.cache.redact import redact_url
from heteroflow.cache.sources import normalize_source, split_query

__all__ = ["READ_VERIFY_MODES", "DatasetView", "open_dataset"]

READ_VERIFY_MODES = ("none", "size", "sha256")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DatasetView:
    """A data set ready to read.

    Attributes:
        files: local paths of every file, sorted by relative path.
        relative: the files' POSIX paths relative to ``root``, same order.
        root: the folder the files are in.
        source_uri: where the data set came from (redacted; a plain local folder as its resolved absolute path,
            :func:`heteroflow.cache.sources.normalize_source`, the form prewarm records).
        manifest: the manifest checked against, or None for a plain folder.
        version: the cache version id ("" for a plain folder).
        dataset_sha256: the manifest's data set identity (None for a plain folder, unless hashed: see
            :func:`open_dataset`).
    """

    files: tuple[Path, ...]
    relative: tuple[str, ...]
    root: Path
    source_uri: str
    manifest: Manifest | None
    version: str
    dataset_sha256: str | None

    @property
    def data_files(self) -> tuple[Path, ...]:
        """The files some reader reads (asked of the readers by name: :func:`heteroflow.cache.listing.data_formats`),
        sorted by relative path."""
        return tuple(p for p in self.files if is_data_file(p.name))

    def require_data_files(self) -> tuple[Path, ...]:
        """:attr:`data_files`, or a DatasetError naming the data set when there is none."""
        if not self.data_files:
            hint = misnamed_note([str(p) for p in self.files])
            raise DatasetError(
                f"data set {self.source_uri} has no .csv, .tsv, .parquet or .npz file; {hint + '; ' if hint else ''}{formats_help()}"
            )
        return self.data_files

    def in_source_terms(self, message: str) -> str:
        """``message`` with the cached copy's folder replaced by the source URI, so errors name the user's file
        (``<folder URL>/<file>`` without the URL's query; a single-file data set's file is the source itself)."""
        if self.manifest is None:
            return message
        base = split_query(self.source_uri)[0].rstrip("/")  # a signed URL's query is not part of a file's path
        root = str(self.root).rstrip("/") + "/"
        files = self.manifest.files
        if len(files) == 1 and posixpath.basename(base) == files[0].path:  # a single-file data set: the file is the source
            return message.replace(root + files[0].path, base)
        return message.replace(root, base + "/")

    def lineage(self) -> dict[str, object]:
        """The facts a lineage record needs about what was read."""
        return {
            "source_uri": self.source_uri,
            "version": self.version,
            "dataset_sha256": self.dataset_sha256,
            "files": len(self.files),
            "total_bytes": sum(f.bytes for f in self.manifest.files) if self.manifest else None,
        }


def _find_manifest(src: Path) -> Path | None:
    if src.is_file() and (src.name == MANIFEST_NAME or src.suffix == ".json"):
        return src
    if src.is_dir() and (src / MANIFEST_NAME).is_file():
        return src / MANIFEST_NAME
    return None


def open_dataset(path: str | os.PathLike[str], *, verify: str = "size") -> DatasetView:
    """Open a data set for reading and check it (see the module docstring).

    Args:
        path: a prewarm output folder or manifest file, a cached data set folder, or a plain local folder/file.
        verify: ``"size"`` (every file exists with its manifest size; cheap), ``"sha256"`` (re-hash every
            file; for a plain folder this also computes ``dataset_sha256``), or ``"none"``.

    Returns:
        A :class:`DatasetView` of exactly the files the manifest lists (or the listing finds).

    Raises:
        DatasetError: nothing at ``path``, a damaged manifest, a version no longer in the cache, or a manifest
            without a local root (an Alluxio cache without a mount).
        CacheIntegrityError: a file is missing, or its size or sha256 differs from the manifest; the message
            names the file and says to rerun prewarm (which repairs the cache).
        InvalidCacheOption: an unknown ``verify`` mode.
    """
    if verify not in READ_VERIFY_MODES:
        raise InvalidCacheOption(f"verify={verify!r} is not a read check; valid: {', '.join(READ_VERIFY_MODES)}")
    src = Path(path).expanduser()
    manifest_path = _find_manifest(src)
    if manifest_path is None:
        listing = list_dataset(str(src))
        root = src if src.is_dir() else src.parent
        rel = tuple(f.path for f in listing.files)
        files = tuple(Path(f.source) for f in listing.files)
        digest = None
        if verify == "sha256":
            from heteroflow.cache.manifest import ManifestEntry

            digest = dataset_digest([ManifestEntry(path=r, bytes=p.stat().st_size, sha256=sha256_file(p)) for r, p in zip(rel, files)])
        return DatasetView(files=files, relative=rel, root=root.absolute(), source_uri=normalize_source(str(src)), manifest=None,
                           version="", dataset_sha256=digest)

    manifest = Manifest.load(manifest_path)
    paths = manifest.local_paths()
    root = Path(manifest.root)
    shown = redact_url(manifest.source_uri)
    if not root.is_dir():
        raise DatasetError(
            f"version {manifest.version or '?'} of data set {shown} is no longer in the cache ({root} is missing; "
            "removed to keep the newest versions, or the cache was cleared): rerun prewarm, then rerun this step"
        )
    for entry, p in zip(manifest.files, paths):
        if verify == "none":
            break
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise CacheIntegrityError(
                f"{entry.path} of data set {shown} (version {manifest.version}) is missing from the cache ({p}); "
                "rerun prewarm to repair the cache, then rerun this step"
            ) from None
        if size != entry.bytes:
            raise CacheIntegrityError(
                f"{entry.path} of data set {shown} (version {manifest.version}) has {size} bytes in the cache but "
                f"{entry.bytes} in its manifest ({p}); rerun prewarm to repair the cache, then rerun this step"
            )
        if verify == "sha256" and sha256_file(p) != entry.sha256:
            raise CacheIntegrityError(
                f"{entry.path} of data set {shown} (version {manifest.version}) differs from its manifest (sha256) in "
                f"the cache ({p}); rerun prewarm to repair the cache, re-hashing what it reuses (--verify sha256, "
                "verify_cached='sha256' in a pipeline: the file kept its size, so a size or mtime check reuses it), "
                "then rerun this step"
            )
    return DatasetView(
        files=tuple(paths), relative=tuple(f.path for f in manifest.files), root=root, source_uri=shown,
        manifest=manifest, version=manifest.version, dataset_sha256=manifest.dataset_sha256,
    )
