"""Prewarm: copy a data set from a source URI into the cache tier and write its manifest.

The source is a local path or any fsspec URL (``file://``, ``s3://``, ``gs://``, ``memory://``,
``alluxiofs://`` ...). The cache tier is a local directory. Each file is written under a temporary name
and renamed into place only when complete and verified, so a partial file is never visible under its
final name; the manifest is written the same way, last. A rerun copies nothing that is already cached and
verified (the cached file's size and sha256 match the manifest, and the source file is unchanged).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import time
from pathlib import Path
from typing import Any

import fsspec

from heteroflow.cache.atomic import atomic_file, atomic_write_bytes
from heteroflow.cache.errors import CacheIntegrityError, DatasetError

__all__ = ["MANIFEST_NAME", "Manifest", "ManifestEntry", "PrewarmResult", "prewarm", "prewarm_dataset", "sha256_file"]

MANIFEST_NAME = "manifest.json"
_CHUNK_BYTES = 1 << 20
_MANIFEST_VERSION = 1


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a local file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ManifestEntry:
    """One cached file.

    Attributes:
        path: POSIX path relative to the data set root.
        bytes: size in bytes.
        sha256: hex digest of the content.
        source_key: the source file's fsspec ``ukey`` (changes when the source changes), used to skip reruns.
    """

    path: str
    bytes: int
    sha256: str
    source_key: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """The description of one cached data set.

    Attributes:
        source_uri: where the data set was copied from.
        root: the local cache directory that holds the files.
        files: one entry per file, sorted by path.
        dataset_sha256: sha256 over the sorted ``path, bytes, sha256`` triples: the data set's identity,
            independent of where it came from.
    """

    source_uri: str
    root: str
    files: tuple[ManifestEntry, ...]
    dataset_sha256: str

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": _MANIFEST_VERSION,
            "source_uri": self.source_uri,
            "root": self.root,
            "dataset_sha256": self.dataset_sha256,
            "total_bytes": self.total_bytes,
            "files": [dataclasses.asdict(f) for f in self.files],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        return cls(
            source_uri=data["source_uri"],
            root=data["root"],
            files=tuple(ManifestEntry(**f) for f in data["files"]),
            dataset_sha256=data["dataset_sha256"],
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        """Read a manifest file.

        Raises:
            DatasetError: the file is missing or not a heteroflow manifest.
        """
        try:
            with open(path, encoding="utf-8") as fh:
                return cls.from_dict(json.load(fh))
        except FileNotFoundError:
            raise DatasetError(f"manifest {path} does not exist; run prewarm on the data set first") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetError(f"manifest {path} is not a heteroflow manifest ({exc})") from None

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temporary file, fsync, rename)."""
        atomic_write_bytes(Path(path), json.dumps(self.to_dict(), indent=2, sort_keys=True).encode())

    def local_paths(self) -> list[Path]:
        """Absolute paths of the cached files, in manifest order."""
        return [Path(self.root, *f.path.split("/")) for f in self.files]


def dataset_digest(files: tuple[ManifestEntry, ...] | list[ManifestEntry]) -> str:
    """sha256 over ``path\\0bytes\\0sha256\\n`` of each file, sorted by path."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda e: e.path):
        digest.update(f"{f.path}\0{f.bytes}\0{f.sha256}\n".encode())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PrewarmResult:
    """What a prewarm did.

    Attributes:
        manifest: the data set's manifest.
        manifest_path: where it was written (``<cache dir>/manifest.json``).
        files_copied: files copied in this call.
        files_skipped: files already cached and verified.
        bytes_copied: bytes copied in this call.
        seconds: wall time of the call, in seconds.
    """

    manifest: Manifest
    manifest_path: Path
    files_copied: int
    files_skipped: int
    bytes_copied: int
    seconds: float


def cache_key(source_uri: str) -> str:
    """Directory name for a source in the cache tier: ``<basename>-<12 hex of sha256(uri)>``."""
    base = posixpath.basename(source_uri.rstrip("/")) or "dataset"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base)[:48]
    return f"{safe}-{hashlib.sha256(source_uri.encode()).hexdigest()[:12]}"


def _source_files(fs: fsspec.AbstractFileSystem, root: str, source_uri: str) -> dict[str, dict[str, Any]]:
    """Map relative POSIX path -> fsspec info for every file under ``root`` (hidden files skipped)."""
    if not fs.exists(root):
        raise DatasetError(f"data set {source_uri!r} does not exist; give a folder (or fsspec URL) of data files")
    if fs.isfile(root):
        info = fs.info(root)
        return {posixpath.basename(root): info}
    found = fs.find(root, detail=True)
    prefix = root.rstrip("/") + "/"
    out: dict[str, dict[str, Any]] = {}
    for name, info in found.items():
        if info.get("type") != "file":
            continue
        rel = name[len(prefix):] if name.startswith(prefix) else posixpath.basename(name)
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        out[rel] = info
    if not out:
        raise DatasetError(f"data set folder {source_uri!r} is empty; put data files (.csv or .npz) in it")
    return out


def prewarm(source_uri: str, cache_dir: str | os.PathLike[str], *, verify: bool = True) -> PrewarmResult:
    """Copy every file under ``source_uri`` into ``cache_dir`` and write ``cache_dir/manifest.json``.

    Args:
        source_uri: a local folder or file, or any fsspec URL.
        cache_dir: local directory of this data set in the cache tier (created if missing).
        verify: re-hash each cached file on a rerun before trusting it (sha256); False trusts size only.

    Returns:
        A :class:`PrewarmResult`; ``files_copied == 0`` on a rerun over an unchanged source.

    Raises:
        DatasetError: the source does not exist or holds no file.
        CacheIntegrityError: a copied file's size differs from the source's (a truncated read).
    """
    started = time.perf_counter()
    fs, root = fsspec.core.url_to_fs(source_uri)
    sources = _source_files(fs, root, source_uri)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    manifest_path = cache / MANIFEST_NAME
    previous: dict[str, ManifestEntry] = {}
    if manifest_path.exists():
        try:
            previous = {f.path: f for f in Manifest.load(manifest_path).files}
        except Exception:  # a foreign or damaged manifest: recopy everything
            previous = {}

    entries: list[ManifestEntry] = []
    copied = skipped = bytes_copied = 0
    for rel in sorted(sources):
        info = sources[rel]
        key = str(fs.ukey(info["name"]))
        size = int(info.get("size") or 0)
        target = cache.joinpath(*rel.split("/"))
        old = previous.get(rel)
        if (
            old is not None
            and old.source_key == key
            and old.bytes == size
            and target.is_file()
            and target.stat().st_size == size
            and (not verify or sha256_file(target) == old.sha256)
        ):
            entries.append(old)
            skipped += 1
            continue
        digest = hashlib.sha256()
        written = 0
        with atomic_file(target, suffix=".part") as out, fs.open(info["name"], "rb") as src:
            for chunk in iter(lambda: src.read(_CHUNK_BYTES), b""):
                digest.update(chunk)
                out.write(chunk)
                written += len(chunk)
            if info.get("size") is not None and written != size:
                raise CacheIntegrityError(f"copied {written} bytes of {rel!r} but the source has {size}; rerun prewarm")
        entries.append(ManifestEntry(path=rel, bytes=written, sha256=digest.hexdigest(), source_key=key))
        copied += 1
        bytes_copied += written

    manifest = Manifest(
        source_uri=source_uri,
        root=str(cache.resolve()),
        files=tuple(entries),
        dataset_sha256=dataset_digest(entries),
    )
    manifest.write(manifest_path)
    return PrewarmResult(
        manifest=manifest,
        manifest_path=manifest_path,
        files_copied=copied,
        files_skipped=skipped,
        bytes_copied=bytes_copied,
        seconds=time.perf_counter() - started,
    )


def prewarm_dataset(source_uri: str, dataset_dir: str, *, cache_root: str = "") -> PrewarmResult:
    """Copy the data set at ``source_uri`` into the cache tier; ``dataset_dir`` gets its manifest.

    Args:
        source_uri: folder (local path or fsspec URL) of data files (.csv, .npz).
        dataset_dir: output folder that receives a copy of the data set's ``manifest.json``.
        cache_root: cache tier folder; empty: the local cache (<heteroflow home>/cache).

    Returns:
        A :class:`PrewarmResult`.

    Raises:
        DatasetError: the source does not exist or holds no file.
        CacheIntegrityError: a copied file's size differs from the source's.
    """
    import shutil

    from heteroflow.cache.locations import local_cache_dir

    root = Path(cache_root).expanduser() if cache_root else local_cache_dir()
    result = prewarm(source_uri, root / cache_key(source_uri))
    out = Path(dataset_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result.manifest_path, out / MANIFEST_NAME)
    return result
