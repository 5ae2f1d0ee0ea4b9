"""The manifest: exactly one complete, immutable copy of a data set, file by file (path, bytes, sha256).

A manifest is JSON (``manifest.json``)::

    {"format": 2, "source_uri": "s3://bucket/digits", "root": "/cache/digits-1a2b/versions/9f3c...",
     "version": "9f3c0d2e5b7a4c11", "backend": "local", "location": "", "created": "2026-...Z",
     "dataset_sha256": "...", "total_bytes": 123,
     "files": [{"path": "sub/a.csv", "bytes": 10, "sha256": "...", "source_key": "..."}, ...]}

``dataset_sha256`` is the sha256 over ``path\\0bytes\\0sha256\\n`` of every file, sorted by path: the data set's
identity, independent of where it came from; ``version`` is its first 16 hex digits. ``root`` is the local
folder holding the files (empty when the data set is cached in Alluxio without a local mount). ``source_uri``
never carries credentials (it is redacted before it is written).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
from pathlib import Path
from typing import Any

from heteroflow.cache.atomic import atomic_write_bytes
from heteroflow.cache.errors import DatasetError
from heteroflow.cache.redact import redact_url

__all__ = ["MANIFEST_FORMAT", "MANIFEST_NAME", "Manifest", "ManifestEntry", "dataset_digest", "is_safe_relpath", "sha256_file"]

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 2
_CHUNK_BYTES = 1 << 20


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a local file (``hashlib.file_digest``)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def is_safe_relpath(rel: str) -> bool:
    """True for a POSIX path that stays inside its root: relative, no empty, ``.`` or ``..`` part, no NUL."""
    if not rel or rel.startswith("/") or "\0" in rel or "\\" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ManifestEntry:
    """One cached file.

    Attributes:
        path: POSIX path relative to the data set root.
        bytes: size in bytes.
        sha256: hex digest of the content.
        source_key: fingerprint of the source file when it was copied (changes when the source changes).
    """

    path: str
    bytes: int
    sha256: str
    source_key: str = ""


def dataset_digest(files: tuple[ManifestEntry, ...] | list[ManifestEntry]) -> str:
    """sha256 over ``path\\0bytes\\0sha256\\n`` of each file, sorted by path."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda e: e.path):
        digest.update(f"{f.path}\0{f.bytes}\0{f.sha256}\n".encode())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """The description of one cached data set version.

    Attributes:
        source_uri: where the data set was copied from (redacted: never carries credentials).
        root: the local folder that holds the files ("" when there is no local copy or mount).
        files: one entry per file, sorted by path.
        dataset_sha256: the data set's identity (see the module docstring).
        version: the version id, ``dataset_sha256[:16]``.
        backend: the cache tier that holds it: ``local``, ``alluxio2`` or ``alluxio3``.
        location: where the cache tier serves it (an Alluxio URL; "" for ``local``), redacted.
        created: UTC time the version was published, ISO 8601.
    """

    source_uri: str
    root: str
    files: tuple[ManifestEntry, ...]
    dataset_sha256: str
    version: str = ""
    backend: str = "local"
    location: str = ""
    created: str = ""

    @property
    def total_bytes(self) -> int:
        """Sum of the file sizes, bytes."""
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (see the module docstring)."""
        return {
            "format": MANIFEST_FORMAT,
            "source_uri": redact_url(self.source_uri),
            "root": self.root,
            "version": self.version,
            "backend": self.backend,
            "location": redact_url(self.location),
            "created": self.created,
            "dataset_sha256": self.dataset_sha256,
            "total_bytes": self.total_bytes,
            "files": [{"path": f.path, "bytes": f.bytes, "sha256": f.sha256, "source_key": f.source_key} for f in self.files],
        }

    def to_json_bytes(self) -> bytes:
        """The manifest file's content: the fields, then one file per line (readable, and written with the C JSON
        encoder: a manifest of 20,000 files takes milliseconds, not the ~0.3 s of ``indent=2``)."""
        data = self.to_dict()
        files = data.pop("files")
        enc = json.JSONEncoder(sort_keys=True, separators=(", ", ": "))
        head = enc.encode(data)[1:-1]
        body = ",\n  ".join(enc.encode(f) for f in files)
        return f"{{{head},\n \"files\": [\n  {body}\n ]}}\n".encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "manifest") -> Manifest:
        """Build from JSON data; format 1 manifests (no version) are read too.

        Raises:
            DatasetError: a field is missing or a file path escapes the root (``../``, absolute).
        """
        files = tuple(ManifestEntry(**f) for f in data["files"])
        for f in files:
            if not is_safe_relpath(f.path):
                raise DatasetError(
                    f"{where}: entry {f.path!r} escapes the data set root (absolute, '..' or empty parts); the "
                    "manifest is damaged or not heteroflow's: rerun prewarm"
                )
            if not isinstance(f.bytes, int) or f.bytes < 0:
                raise DatasetError(f"{where}: entry {f.path!r} has a bad size {f.bytes!r}; rerun prewarm")
        digest = data["dataset_sha256"]
        return cls(
            source_uri=data["source_uri"],
            root=data["root"],
            files=files,
            dataset_sha256=digest,
            version=str(data.get("version") or "") if "format" in data else "",  # format 1: "version" was the format
            backend=data.get("backend", "local"),
            location=data.get("location", ""),
            created=data.get("created", ""),
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        """Read a manifest file.

        Raises:
            DatasetError: the file is missing, not a heteroflow manifest, or has an entry outside its root.
        """
        try:
            with open(path, encoding="utf-8") as fh:
                return cls.from_dict(json.load(fh), where=f"manifest {path}")
        except FileNotFoundError:
            raise DatasetError(f"manifest {path} does not exist; run prewarm on the data set first") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if isinstance(exc, DatasetError):
                raise
            raise DatasetError(f"manifest {path} is not a heteroflow manifest ({exc}); rerun prewarm") from None

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temporary file, fsync, rename)."""
        atomic_write_bytes(Path(path), self.to_json_bytes())

    def local_paths(self) -> list[Path]:
        """Absolute paths of the cached files, in manifest order.

        Raises:
            DatasetError: the manifest has no local root (an Alluxio cache without a mount).
        """
        if not self.root:
            raise DatasetError(
                f"data set {self.source_uri} (version {self.version}) is cached in {self.backend} at {self.location} "
                "without a local folder; read it through a mount of the cache (a Fluid Dataset's volume) and give "
                "the mount path"
            )
        return [Path(self.root, *posixpath.normpath(f.path).split("/")) for f in self.files]
