"""Which files a data set holds: the one listing that the up-front check, prewarm and readers all use.

:func:`list_dataset` takes a local folder or file, or any fsspec URL (``s3://``, ``gs://``, ``az://``,
``http(s)://`` folder listings, ``memory://``, ...), and applies these rules:

- **Files.** Every regular file under the folder, at any depth, belongs to the data set (the data files are
  those some reader reads: the cache tier asks the readers, :func:`data_formats`; other files such as a README
  are carried along by prewarm and ignored by readers). A single file may be given instead of a folder.
- **Hidden.** A file or folder whose name starts with ``.`` is skipped with everything under it:
  ``.ipynb_checkpoints/x-checkpoint.csv``, ``.git/``, ``.DS_Store``, macOS ``._x.csv`` resource forks,
  ``.~lock.x.csv#``. (A hidden file named explicitly as the data set itself is taken.)
- **Symlinks (local folders).** A symlink to a file is followed: the data set holds the target's content
  under the link's name, wherever the target lies (a folder of links to files elsewhere works). A symlink to
  a folder is followed too, unless it leads back into a folder it is already inside, or to a folder the data
  set itself is inside (a loop, e.g. ``data/sub/self -> ..`` or ``data/up -> ..``), which is skipped naming
  where it leads; two links to one folder give two copies of its files, as ``cp -rL`` does. A broken symlink,
  a loop of links (``a -> b -> a``, named link by link), and anything that is not a regular file or folder (a
  FIFO, a socket, a device) is skipped. A folder that cannot be read is an error naming the link that led
  there, if one did; a data set path that is itself a broken link or a loop of links is an error naming it.
- **Reserved.** A top-level ``manifest.json`` is heteroflow's own (a prewarmed copy or an artifact folder
  has one) and is not a data set file. A name that cannot be a relative path inside the root (``..``, empty
  parts: possible in object stores) is skipped.
- **Order.** Files are sorted by their POSIX path relative to the data set root.

Every skipped entry is kept with its reason in :attr:`DatasetListing.skipped`, logged as a warning, and named
in the error raised when no data file is left.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import hashlib
import json
import logging
import os
import posixpath
import stat
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from heteroflow.cache.errors import DatasetError
from heteroflow.cache.redact import redact_url
from heteroflow.cache.sources import filesystem_for, is_local, local_path, source_errors

_log = logging.getLogger("heteroflow.cache")

__all__ = [
    "DATA_FORMATS_GROUP",
    "DataFormats",
    "DatasetListing",
    "ListedFile",
    "SkippedEntry",
    "data_formats",
    "formats_help",
    "is_data_file",
    "list_dataset",
    "misnamed_note",
    "set_data_formats",
]

DATA_FORMATS_GROUP = "heteroflow.data_formats"
"""The entry-point group naming what judges which files are data: the reader registry
(``heteroflow.components.data.formats:REGISTRY``, registered in heteroflow's own ``pyproject.toml``). The cache tier
caches bytes of any files and knows no format; it asks this, by file name only, for its checks."""


@runtime_checkable
class DataFormats(Protocol):
    """What the cache tier asks of the readers (the reader registry is one)."""

    def is_data_file(self, path: str) -> bool:
        """Whether some reader reads a file of this name (by its suffix; no content is read)."""
        ...

    def suffixes(self) -> tuple[str, ...]:
        """Every suffix some reader reads."""
        ...

    def formats_help(self) -> str:
        """What formats are read, for the tail of an error message."""
        ...


_FORMATS: list[DataFormats] | None = None
_FORMATS_LOCK = threading.Lock()


def set_data_formats(formats: DataFormats | Sequence[DataFormats] | None) -> None:
    """Use ``formats`` instead of the entry-point group's (embedding, tests); None: load the group again on
    the next check."""
    global _FORMATS
    with _FORMATS_LOCK:
        _FORMATS = None if formats is None else list(formats) if isinstance(formats, (list, tuple)) else [formats]


def data_formats() -> tuple[DataFormats, ...]:
    """The judges of :data:`DATA_FORMATS_GROUP` (loaded once; a broken entry point is logged and left out).
    Empty when none is installed: then no file counts as data, and :func:`list_dataset` checks no format."""
    global _FORMATS
    with _FORMATS_LOCK:
        if _FORMATS is None:
            from importlib.metadata import entry_points

            loaded: list[DataFormats] = []
            for ep in entry_points(group=DATA_FORMATS_GROUP):
                try:
                    loaded.append(ep.load())
                except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop listing
                    _log.warning("entry point %s = %s (group %s): not loaded (%s: %s)", ep.name, ep.value,
                                 DATA_FORMATS_GROUP, type(exc).__name__, exc)
            _FORMATS = loaded
        return tuple(_FORMATS)


def is_data_file(path: str) -> bool:
    """Whether some reader reads a file named ``path`` (asked of :func:`data_formats`; False with none)."""
    return any(f.is_data_file(path) for f in data_formats())


def misnamed_note(paths: Sequence[str]) -> str:
    """What the readers would read among local files that no reader claims by name (``iris.data is a table by
    its content ...: rename it to iris.csv``), asked of :func:`data_formats` that can tell; "" for none."""
    notes = [f.misnamed(paths) for f in data_formats() if callable(getattr(f, "misnamed", None))]
    return "; ".join(n for n in notes if n)


def formats_help() -> str:
    """The readers' help on formats, for messages ("" with none installed)."""
    return "; ".join(f.formats_help() for f in data_formats())


def __getattr__(name: str) -> Any:
    """The constants of the time before the reader registry, now asked of the readers (:func:`data_formats`):
    ``READABLE_SUFFIXES`` / ``DATA_SUFFIXES`` (every suffix some reader reads), ``FORMATS_HELP``."""
    if name in ("READABLE_SUFFIXES", "DATA_SUFFIXES"):
        return tuple(dict.fromkeys(s for f in data_formats() for s in f.suffixes()))
    if name == "FORMATS_HELP":
        return formats_help()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_MAX_DEPTH = 64
_INFO_KEYS = ("size", "ETag", "etag", "LastModified", "last_modified", "Last-Modified", "mtime", "created",
              "md5Hash", "crc32c", "generation", "VersionId", "version_id", "content_settings", "Content-MD5")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ListedFile:
    """One file of a data set.

    Attributes:
        path: POSIX path relative to the data set root (``sub/x.csv``).
        bytes: size in bytes, or None where the source does not say before reading (some HTTP servers).
        source: what to open: a local path (a symlink is opened through) or the file's fsspec path.
        key: a fingerprint of the source file's metadata (size, mtime / ETag / version); it changes when the
            source file changes, so a rerun can skip an unchanged file without reading it.
    """

    path: str
    bytes: int | None
    source: str
    key: str

    @property
    def is_data(self) -> bool:
        """True for a file some reader reads (asked of the readers by name: :func:`data_formats`)."""
        return is_data_file(self.path)


@dataclasses.dataclass(frozen=True, slots=True)
class SkippedEntry:
    """An entry under the data set root that is not part of the data set, and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path} ({self.reason})"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DatasetListing:
    """What :func:`list_dataset` found.

    Attributes:
        uri: the data set as given, redacted (no credentials).
        local: True when the data set is a local folder or file.
        files: every file of the data set, sorted by path.
        skipped: entries left out, with the reason (hidden, symlink loop, broken symlink, not a regular file).
    """

    uri: str
    local: bool
    files: tuple[ListedFile, ...]
    skipped: tuple[SkippedEntry, ...]

    @property
    def data_files(self) -> tuple[ListedFile, ...]:
        """The files some reader reads (:attr:`ListedFile.is_data`)."""
        return tuple(f for f in self.files if f.is_data)

    @property
    def total_bytes(self) -> int:
        """Sum of the known file sizes, in bytes."""
        return sum(f.bytes or 0 for f in self.files)

    def skipped_note(self, limit: int = 5) -> str:
        """``"; skipped: a (hidden), b (broken symlink)"`` or ``""``: for messages."""
        if not self.skipped:
            return ""
        shown = ", ".join(str(s) for s in self.skipped[:limit])
        more = f" and {len(self.skipped) - limit} more" if len(self.skipped) > limit else ""
        return f"; skipped: {shown}{more}"


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def _reserved(rel: str) -> str | None:
    """Why ``rel`` cannot be a data set file, or None."""
    from heteroflow.cache.manifest import MANIFEST_NAME, is_safe_relpath

    if rel == MANIFEST_NAME:
        return "heteroflow's own manifest, not a data set file"
    if not is_safe_relpath(rel):
        return "not a path inside the data set root ('..' or empty parts)"
    return None


def _local_key(st: os.stat_result) -> str:
    return f"local:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def _remote_key(info: Mapping[str, Any]) -> str:
    picked = {k: str(info[k]) for k in _INFO_KEYS if info.get(k) is not None}
    return "fsspec:" + hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:32]


def _link_target(path: str) -> str:
    """What the symlink ``path`` holds, or, for a folder reached through a symlink above it (``readlink`` says
    ``EINVAL``: it is no link itself), where it really is."""
    try:
        return os.readlink(path)
    except OSError:
        return os.path.realpath(path)


def _loop_chain(path: str, limit: int = 8) -> str:
    """``a -> b -> a``: the links a symlink loop goes through (at most ``limit``)."""
    seen, hops, here = set(), [os.path.basename(path)], path
    while os.path.islink(here) and here not in seen and len(hops) <= limit:
        seen.add(here)
        here = os.path.join(os.path.dirname(here), os.readlink(here))
        hops.append(os.path.relpath(here, os.path.dirname(path)))
    return " -> ".join(hops)


def _walk_local(root: Path) -> tuple[list[ListedFile], list[SkippedEntry]]:
    files: list[ListedFile] = []
    skipped: list[SkippedEntry] = []

    def walk(folder: Path, rel: str, chain: tuple[tuple[int, int], ...], via: str) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except PermissionError:
            raise DatasetError(
                f"cannot read folder {folder}{via} of data set {root}: permission denied; make it readable or move the "
                "data set"
            ) from None
        for entry in entries:
            child = f"{rel}{entry.name}"
            if _is_hidden(entry.name):
                skipped.append(SkippedEntry(child + ("/" if entry.is_dir() else ""), "hidden: the name starts with '.'"))
                continue
            try:
                st = entry.stat(follow_symlinks=True)
            except FileNotFoundError:
                skipped.append(SkippedEntry(child, f"broken symlink to {_link_target(entry.path)}"))
                continue
            except OSError as exc:  # ELOOP: a symlink that points at itself, or at links that lead back to it
                loop = f": a symlink loop, {_loop_chain(entry.path)}" if exc.errno == errno.ELOOP else ""
                skipped.append(SkippedEntry(child, f"unreadable symlink ({exc.strerror}{loop})"))
                continue
            if stat.S_ISDIR(st.st_mode):
                ident = (st.st_dev, st.st_ino)
                if ident in chain:
                    target = _link_target(entry.path)
                    if ident in outer:  # a folder the data set itself is inside: all of it, the data set again
                        why = f"symlink loop: leads to {os.path.realpath(entry.path)}, a folder the data set is inside ({target})"
                    else:
                        why = f"symlink loop: leads back to a folder it is inside ({target})"
                    skipped.append(SkippedEntry(child + "/", why))
                    continue
                link = via or (f" (reached through the symlink {child} -> {_link_target(entry.path)})" if entry.is_symlink() else "")
                walk(Path(entry.path), child + "/", chain + (ident,), link)
            elif stat.S_ISREG(st.st_mode):
                files.append(ListedFile(path=child, bytes=st.st_size, source=entry.path, key=_local_key(st)))
            else:
                skipped.append(SkippedEntry(child, "not a regular file"))

    top = root.stat()
    outer: set[tuple[int, int]] = set()
    for parent in Path(os.path.realpath(root)).parents:  # a link to one of these would list the data set again
        try:
            pst = parent.stat()
        except OSError:
            continue
        outer.add((pst.st_dev, pst.st_ino))
    walk(root, "", ((top.st_dev, top.st_ino), *sorted(outer)), "")
    return files, skipped


def _walk_fsspec(fs: Any, root: str) -> tuple[list[ListedFile], list[SkippedEntry], list[str]]:
    """Files under ``root`` on an fsspec filesystem; the third value lists files whose size is unknown."""
    files: list[ListedFile] = []
    skipped: list[SkippedEntry] = []
    prefix = root.rstrip("/") + "/"
    hidden_dirs: set[str] = set()

    def rel_of(name: str) -> str:
        name = name.rstrip("/")
        return name[len(prefix):] if name.startswith(prefix) else posixpath.basename(name)

    def add(info: Mapping[str, Any]) -> None:
        rel = rel_of(info["name"])
        parts = rel.split("/")
        hidden_at = next((i for i, part in enumerate(parts) if _is_hidden(part)), None)
        if hidden_at is not None:
            if hidden_at == len(parts) - 1 and info.get("type") != "directory":
                skipped.append(SkippedEntry(rel, "hidden: the name starts with '.'"))
            else:
                top = "/".join(parts[: hidden_at + 1]) + "/"
                if top not in hidden_dirs:
                    hidden_dirs.add(top)
                    skipped.append(SkippedEntry(top, "hidden: the name starts with '.'"))
            return
        size = info.get("size")
        files.append(ListedFile(path=rel, bytes=None if size is None else int(size), source=info["name"], key=_remote_key(info)))

    protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    if protocol in ("http", "https"):
        # HTTP folder listings: walk the links, never descending into hidden folders (``find`` would).
        def walk(url: str, seen: tuple[tuple[str, ...], ...]) -> None:
            infos = sorted(fs.ls(url, detail=True), key=lambda i: i["name"])
            # A server that follows a symlink loop lists the same folder again and again, one level deeper
            # each time; a folder whose listing equals one of its parents' is taken for such a loop.
            signature = tuple(posixpath.basename(i["name"].rstrip("/")) for i in infos)
            if signature in seen:
                skipped.append(SkippedEntry(rel_of(url) + "/", "looks like a symlink loop: lists the same entries as a folder it is inside"))
                return
            if len(seen) > _MAX_DEPTH:
                raise DatasetError(f"data set {redact_url(root)}: folders nested deeper than {_MAX_DEPTH} levels at {redact_url(url)}")
            for info in infos:
                name = info["name"].rstrip("/")
                if any(c in name[len(prefix):] for c in "?#"):
                    # a link that only re-queries the listing (Apache's sort links ``?C=N;O=D``), not a file
                    skipped.append(SkippedEntry(redact_url(rel_of(name)), "a link with a query string, not a file"))
                    continue
                if info.get("type") == "directory" or info["name"].endswith("/"):
                    if _is_hidden(posixpath.basename(name)):
                        add({**info, "type": "directory"})
                    elif name != url.rstrip("/"):
                        walk(name + "/", seen + (signature,))
                else:
                    add(info)

        walk(prefix, ())
    else:
        for name, info in sorted(fs.find(root, detail=True, withdirs=False).items()):
            if info.get("type", "file") == "file":
                add({**info, "name": name})
    unknown = [f.source for f in files if f.bytes is None]
    return files, skipped, unknown


def _fill_sizes(fs: Any, files: list[ListedFile], unknown: list[str]) -> tuple[list[ListedFile], list[SkippedEntry]]:
    """Ask the source for the size (and ETag / Last-Modified) of each file the listing did not size; a listed
    link the server then answers 404 for (e.g. a broken symlink behind ``http.server``) is skipped."""
    if not unknown:
        return files, []

    def info(name: str) -> Mapping[str, Any] | None:
        try:
            return fs.info(name)
        except FileNotFoundError:
            return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(unknown))) as pool:
        infos = dict(zip(unknown, pool.map(info, unknown)))
    out: list[ListedFile] = []
    skipped: list[SkippedEntry] = []
    for f in files:
        if f.source in infos:
            got = infos[f.source]
            if got is None:
                skipped.append(SkippedEntry(f.path, "listed by the server, but not found when asked (404)"))
                continue
            size = got.get("size")
            f = dataclasses.replace(f, bytes=None if size is None else int(size), key=_remote_key(got))
        out.append(f)
    return out, skipped


def list_dataset(
    uri: str,
    *,
    require_data: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    filesystem: tuple[Any, str] | None = None,
) -> DatasetListing:
    """List the files a data set holds, by the rules in this module's docstring. Reads no file content.

    Args:
        uri: a local folder or file (``~`` expanded, ``file://`` accepted), or an fsspec URL of a folder or file.
        require_data: raise when no file is one a reader reads (asked of the readers by name,
            :func:`data_formats`; with no readers installed nothing is checked); prewarm passes False (the cache
            tier caches any files; formats belong to the readers).
        storage_options: fsspec options for the source's driver (credentials, endpoint); default: the
            driver's own environment variables and config files (and fsspec's ``FSSPEC_<PROTOCOL>_<KEY>``).
        filesystem: an fsspec-like filesystem and the data set's path in it, to list through instead of the
            driver ``uri`` names (a cache tier that serves the source, e.g. Alluxio 3.x workers).

    Returns:
        A :class:`DatasetListing`; files sorted by relative path.

    Raises:
        DatasetError: unknown URL scheme, missing fsspec driver (names the package to install), the folder or
            file does not exist (404), access denied (403 / wrong credentials), the folder holds no file, or
            (``require_data``) no data file; the message lists what was skipped and why.
        SourceUnavailable: the source's host did not answer (transient; a retry may succeed).
    """
    shown = redact_url(uri)
    if is_local(uri) and filesystem is None:
        root = local_path(uri)
        if not root.exists():
            if root.is_symlink():
                try:
                    os.stat(root)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        raise DatasetError(
                            f"data set {shown} is a symlink loop ({_loop_chain(str(root))}); point it at a folder of data files"
                        ) from None
                raise DatasetError(f"data set {shown} is a broken symlink (to {_link_target(str(root))}); point it at a folder of data files")
            raise DatasetError(
                f"data set {shown} does not exist; give a folder (or fsspec URL) of data: tables (.csv, .tsv, .parquet, "
                f".npz), an image folder (one folder per class) or .pt tensors"
            )
        if root.is_dir():
            files, skipped = _walk_local(root)
        else:
            st = root.stat()
            files, skipped = [ListedFile(path=root.name, bytes=st.st_size, source=str(root), key=_local_key(st))], []
        local = True
    else:
        fs, root_path = filesystem if filesystem is not None else filesystem_for(uri, storage_options)
        with source_errors(uri):
            if filesystem is None:
                # list fresh: a driver instance lives as long as the process (an Airflow worker, the in-process
                # engine) and s3fs/gcsfs/HTTP keep folder listings; a stale one misses added or replaced files
                fs.invalidate_cache()
            info = fs.info(root_path)
            is_dir = info.get("type") == "directory"
            if not is_dir and _protocol(fs) in ("http", "https"):
                # an HTTP folder without its trailing slash: the server answers with (or redirects to) a listing
                is_dir = bool(info.get("mimetype") == "text/html" and fs.ls(root_path, detail=False))
            if is_dir:
                files, skipped, unknown = _walk_fsspec(fs, root_path)
                files, missing = _fill_sizes(fs, files, unknown)
                skipped += missing
            else:
                name = posixpath.basename(root_path.rstrip("/")) or "data"
                size = info.get("size")
                files = [ListedFile(path=name, bytes=None if size is None else int(size), source=root_path, key=_remote_key(info))]
                skipped = []
        local = False
    if len(files) > 1 or (files and files[0].path == "manifest.json"):
        kept = []
        for f in files:
            why = _reserved(f.path)
            if why is None:
                kept.append(f)
            else:
                skipped.append(SkippedEntry(f.path, why))
        files = kept
    listing = DatasetListing(uri=shown, local=local, files=tuple(sorted(files, key=lambda f: f.path)), skipped=tuple(skipped))
    if not listing.files:
        raise DatasetError(
            f"data set folder {shown} is empty; put data files (.csv, .tsv, .parquet, .npz) in it{listing.skipped_note()}"
        )
    if require_data and data_formats() and not any(is_data_file(f.path) for f in listing.files):
        names = redact_url(", ".join(f.path for f in listing.files[:5]) + (" ..." if len(listing.files) > 5 else ""))
        hint = misnamed_note([f.source for f in listing.files]) if local else ""
        raise DatasetError(
            f"data set {shown} has no .csv, .tsv, .parquet or .npz file (found: {names}){listing.skipped_note()}; "
            f"{hint + '; ' if hint else ''}{formats_help()}"
        )
    if listing.skipped:
        _log.warning("data set %s: %d entr%s not taken%s", shown, len(listing.skipped),
                     "y" if len(listing.skipped) == 1 else "ies", listing.skipped_note())
    return listing


def _protocol(fs: Any) -> str:
    return fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
