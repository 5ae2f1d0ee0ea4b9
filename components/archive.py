"""Archive: store a model with its metrics and lineage under an immutable, versioned path.

Layout: ``<archive_root>/<name>/v<N>/`` holding the model files, ``metrics.json`` and ``lineage.json``
(data set manifest hash, code version, parameters, device used, time). A version is assembled in a
temporary folder and renamed into place, so it is visible complete or not at all; ``os.rename`` onto an
existing non-empty version fails, and heteroflow then takes the next number, so an existing version is
never overwritten. Archived files are made read-only.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from heteroflow.components.errors import ArchiveError, InvalidParameter

__all__ = ["ArchiveResult", "archive", "check_model_name", "code_version", "list_versions"]

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_VERSION = re.compile(r"^v(\d+)$")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveResult:
    """Where the model was archived.

    Attributes:
        name: model name.
        version: the version number written (1, 2, ...).
        path: ``<archive_root>/<name>/v<version>``.
        lineage: the lineage record written to ``lineage.json``.
    """

    name: str
    version: int
    path: Path
    lineage: dict[str, Any]


def code_version() -> dict[str, str | None]:
    """heteroflow's installed version and, when run from a git checkout, its commit (``-dirty`` if modified)."""
    try:
        version = metadata.version("heteroflow")
    except metadata.PackageNotFoundError:  # pragma: no cover - always installed
        version = None
    commit = None
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        commit = sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return {"heteroflow": version, "git_commit": commit}


def list_versions(archive_root: str | os.PathLike[str], name: str) -> list[int]:
    """Version numbers archived under ``name``, ascending."""
    folder = Path(archive_root, name)
    if not folder.is_dir():
        return []
    return sorted(int(m[1]) for p in folder.iterdir() if (m := _VERSION.match(p.name)) and p.is_dir())


def _make_read_only(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def check_model_name(name: str) -> None:
    """Check an archive model name (the check :func:`archive` makes; callers use it to fail before a run).

    Raises:
        InvalidParameter: not 1-63 characters of lowercase letters, digits, ``.``, ``_``, ``-``, starting
            with a letter or digit.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidParameter(
            f"model_name={name!r} is not a valid model name; valid: [a-z0-9][a-z0-9._-]*, up to 63 characters"
        )


def archive(
    model_dir: str | os.PathLike[str],
    archive_root: str | os.PathLike[str],
    *,
    name: str,
    metrics: dict[str, Any],
    lineage: dict[str, Any],
) -> ArchiveResult:
    """Copy ``model_dir`` into the next free version ``<archive_root>/<name>/v<N>``.

    Args:
        model_dir: train output.
        archive_root: local folder of the archive.
        name: model name: lowercase letters, digits, ``.``, ``_``, ``-``; 1-63 characters.
        metrics: JSON-ready metrics (written to ``metrics.json``).
        lineage: JSON-ready lineage facts (data set hash, parameters, device...); ``code`` and
            ``archived_at`` are added.

    Returns:
        An :class:`ArchiveResult`.

    Raises:
        InvalidParameter: a bad ``name``.
        ArchiveError: ``model_dir`` is missing, or no free version could be claimed.
    """
    check_model_name(name)
    src = Path(model_dir)
    if not src.is_dir():
        raise ArchiveError(f"model folder {src} does not exist; nothing to archive")
    folder = Path(archive_root, name)
    folder.mkdir(parents=True, exist_ok=True)
    record = {**lineage, "code": code_version(), "archived_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp = Path(tempfile.mkdtemp(prefix=".incoming-", dir=folder))
    try:
        shutil.copytree(src, tmp / "model")
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True, default=str), encoding="utf-8")
        for attempt in range(100):
            # Every entry named v<N> counts, folder or not, so a stray file cannot block the numbering.
            taken = [int(m[1]) for p in folder.iterdir() if (m := _VERSION.match(p.name))]
            version = max(taken, default=0) + 1
            target = folder / f"v{version}"
            record["version"] = version
            lineage_path = tmp / "lineage.json"
            lineage_path.unlink(missing_ok=True)  # allowed on a read-only file: the folder is writable
            lineage_path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str), encoding="utf-8")
            _make_read_only(tmp)
            try:
                os.rename(tmp, target)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    continue  # another writer claimed v<version> first: take the next number
                raise
            return ArchiveResult(name=name, version=version, path=target, lineage=record)
        raise ArchiveError(f"could not claim a free version under {folder} after {attempt + 1} tries")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
