"""File readers in one registry: which formats heteroflow reads, how each is recognised, and who reads it.

Each format is one reader object (:class:`Reader`): its ``name``, the ``suffixes`` it claims, the data ``kind``
it yields, a cheap ``sniff`` (does this file or folder look like mine? reads at most a few KiB), ``read`` and a
one-line ``describe``. The built-in readers:

- ``csv`` (kind ``table``): .csv, .tsv; delimiter (, ; tab |), encoding, header and decimal mark detected
  (:mod:`heteroflow.components.data.datasets`).
- ``parquet`` (``table``): .parquet, .pq; pandas with pyarrow.
- ``npz`` (``table``): .npz holding arrays ``x`` ``(n, ...)`` and ``y`` ``(n,)``.
- ``image_folder`` (``image_folder``): .png .jpg .jpeg .bmp .gif .tif .tiff .webp, one folder per class, checked
  with Pillow (:mod:`heteroflow.components.data.readers`).
- ``tensors`` (``tensors``): .pt, .pth holding ``{"x": Tensor (n, ...), "y": Tensor (n,)}`` or ``(x, y)``.

Kinds and what ``read`` takes and returns:

- ``table``: ``read(path, *, header="auto", delimiter="auto") -> RawTable``, one file, every column kept
  (:class:`heteroflow.components.data.datasets.RawTable`); preprocess checks, splits and shards the rows.
- any other kind (``image_folder``, ``tensors``, a third party's): ``read(view, *, split) -> PreparedFiles``, the
  whole data set at once (``view``: :class:`heteroflow.cache.dataset.DatasetView`; ``split``: labels ``(n,)`` ->
  row indices per split): what preprocess writes as ``meta.json``, and a writer of any further files.
  A reader of a kind of its own also has ``open_splits(dataset_dir, meta) -> DataSplits``
  (:class:`heteroflow.components.data.readers.DataSplits`): how train and evaluate open what preprocess wrote.

Third-party readers are registered through the entry-point group ``heteroflow.readers`` (each entry point names
a reader object, a class to instantiate, or a function returning a reader or a list of them), loaded once, on the
first lookup. Lookup (:meth:`ReaderRegistry.for_path`) goes by suffix; where more than one reader claims a
suffix, the readers' ``sniff`` decides (entry-point readers first, then the built-ins); a suffix no reader claims
raises :class:`UnknownFormat`, whose message lists every registered reader with its suffixes and, for a local file
some reader recognises by its content (UCI's ``.data`` tables), which reader and the rename that reads it
(:meth:`ReaderRegistry.misnamed`; the messages about a data set with no data file say the same).

The cache tier reads no format: it asks this registry (through the entry-point group ``heteroflow.data_formats``,
see :func:`heteroflow.cache.listing.data_formats`) which listed files are data, by name only.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from heteroflow.cache.errors import DatasetError

if TYPE_CHECKING:
    from heteroflow.components.data.datasets import RawTable

__all__ = [
    "ENTRY_POINT_GROUP",
    "FORMATS_HELP",
    "READERS_HELP",
    "REGISTRY",
    "PreparedFiles",
    "Reader",
    "ReaderRegistry",
    "UnknownFormat",
    "reader_for",
    "register_reader",
    "registered_readers",
]

ENTRY_POINT_GROUP = "heteroflow.readers"
"""The entry-point group third-party readers are registered under (``pyproject.toml``:
``[project.entry-points."heteroflow.readers"] feather = "mypkg.readers:FeatherReader"``)."""

FORMATS_HELP = (
    "supported formats: .csv/.tsv (delimiter, encoding and header detected), .parquet, and .npz (arrays x, y); "
    "image folders (one folder per class of .png/.jpg/... images); .pt tensors (x, y); or your own Dataset "
    "(--param dataset_factory=package.module:function)"
)
"""Today's help on formats; messages add the registered readers (:meth:`ReaderRegistry.formats_help`)."""
READERS_HELP = (
    "readers: tables (.csv, .tsv, .parquet, .npz with arrays x, y), image folders (one folder per class of "
    ".png/.jpg/... images), tensors (.pt files holding x and y), or your own Dataset (--param "
    "dataset_factory=package.module:function)"
)
"""Today's help on readers; messages add the registered readers (:meth:`ReaderRegistry.readers_help`)."""

TABLE = "table"
_SNIFF_BYTES = 4096
_log = logging.getLogger("heteroflow.components")


class UnknownFormat(DatasetError):
    """No registered reader reads a file (a permanent failure, like every :class:`DatasetError`)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PreparedFiles:
    """What a non-table reader makes of a data set (preprocess writes it).

    Attributes:
        meta: written as ``meta.json``; must hold ``data_kind``, ``classes``, ``sample_shape`` (the shape of one
            sample), ``counts`` (samples per split) and whatever the kind's Dataset needs to reopen the splits.
        write: called with the output folder (still the temporary one) to write further files, or None.
    """

    meta: dict[str, Any]
    write: Callable[[Path], None] | None = None


@runtime_checkable
class Reader(Protocol):
    """One file format (see the module docstring for what ``read`` takes per kind).

    Attributes:
        name: short unique name (``csv``), shown in messages and listings.
        suffixes: lower-case file suffixes with the dot (``(".csv", ".tsv")``).
        kind: the data kind it yields: ``table`` (one file -> a RawTable) or a folder kind.
    """

    name: str
    suffixes: tuple[str, ...]
    kind: str

    def sniff(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` (a file, or for a folder kind a folder) looks like this format; reads a few KiB at
        most and never raises for an unreadable or missing path (False)."""
        ...

    def read(self, source: Any, /, **options: Any) -> Any:
        """Read it (see the module docstring)."""
        ...

    def describe(self) -> str:
        """One line for messages and listings."""
        ...


def _head(path: str | os.PathLike[str], n: int = _SNIFF_BYTES) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


def _table_shape(path: Path) -> str:
    """``comma-separated, 5 columns, no header row`` for a text table (what :func:`sniff_csv` decides); "" when
    the sampled lines do not split into the same 2 or more columns (90% of them at least)."""
    from heteroflow.components.data.csvformat import DELIMITERS, sniff_csv

    try:
        fmt = sniff_csv(path)
    except (DatasetError, OSError):
        return ""
    share = re.search(r"columns on (\d+)% of", fmt.reasons["delimiter"])
    if fmt.columns < 2 or not share or int(share.group(1)) < 90:
        return ""
    return f"{DELIMITERS[fmt.delimiter]}-separated, {fmt.columns} columns, {'a' if fmt.header else 'no'} header row"


def _zip_names(path: str | os.PathLike[str]) -> list[str]:
    try:
        if _head(path, 4) != b"PK\x03\x04":
            return []
        with zipfile.ZipFile(path) as zf:
            return zf.namelist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return []


# --- the built-in readers ------------------------------------------------------------------------------------


class CsvReader:
    """Delimited text tables (``,`` ``;`` tab ``|``; encoding, header and decimal mark detected)."""

    name = "csv"
    suffixes = (".csv", ".tsv")
    kind = TABLE

    def sniff(self, path: str | os.PathLike[str]) -> bool:
        """Text (UTF-8, UTF-16 with a byte-order mark, or Latin-1 without NUL bytes) whose first line holds one
        of the delimiters :data:`heteroflow.components.data.datasets.DELIMITERS`."""
        head = _head(path)
        if not head or (head.startswith(b"PK\x03\x04") or head.startswith(b"PAR1")):
            return False
        if head.startswith((b"\xff\xfe", b"\xfe\xff")):
            text = head.decode("utf-16", errors="ignore")
        elif b"\x00" in head:
            return False
        else:
            text = head.decode("utf-8", errors="replace")  # Latin-1 bytes become U+FFFD; delimiters stay
        first = text.lstrip("\ufeff").splitlines()[0] if text.strip() else ""
        return any(d in first for d in (",", ";", "\t", "|"))

    def read(self, path: str | os.PathLike[str], /, *, header: str = "auto", delimiter: str = "auto") -> RawTable:
        """The file as a :class:`~heteroflow.components.data.datasets.RawTable` (see that module's docstring).

        Raises:
            DatasetError: unreadable or malformed (names the file, the line and the delimiter in use), no rows.
        """
        from heteroflow.components.data import datasets

        return datasets._read_csv(Path(path), header=header, delimiter=delimiter)

    def describe(self) -> str:
        return "delimited text tables; delimiter (, ; tab |), encoding, header and decimal mark detected"


class ParquetReader:
    """Apache Parquet tables, read by pandas with pyarrow."""

    name = "parquet"
    suffixes = (".parquet", ".pq")
    kind = TABLE

    def sniff(self, path: str | os.PathLike[str]) -> bool:
        """The Parquet magic ``PAR1`` at the start of the file."""
        return _head(path, 4) == b"PAR1"

    def read(self, path: str | os.PathLike[str], /, **_: Any) -> RawTable:
        """The file as a :class:`~heteroflow.components.data.datasets.RawTable`.

        Raises:
            DatasetError: not a readable Parquet file, or no rows (names the file).
        """
        from heteroflow.components.data import datasets

        return datasets._read_parquet(Path(path))

    def describe(self) -> str:
        return "Parquet tables; column types from the file"


class NpzReader:
    """NumPy ``.npz`` archives with arrays ``x`` (``(n, ...)``) and ``y`` (``(n,)``)."""

    name = "npz"
    suffixes = (".npz",)
    kind = TABLE

    def sniff(self, path: str | os.PathLike[str]) -> bool:
        """A zip archive of ``.npy`` members (what :func:`numpy.savez` writes)."""
        names = _zip_names(path)
        return bool(names) and all(n.endswith(".npy") for n in names)

    def read(self, path: str | os.PathLike[str], /, **_: Any) -> RawTable:
        """The file as a :class:`~heteroflow.components.data.datasets.RawTable` (features ``x0`` .., class ``label``).

        Raises:
            DatasetError: not a readable .npz, no ``x`` / ``y``, mismatched shapes (names the file).
        """
        from heteroflow.components.data import datasets

        return datasets._read_npz(Path(path))

    def describe(self) -> str:
        return "NumPy archives holding arrays x (n, ...) and y (n,)"


_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")


class ImageFolderReader:
    """One folder per class holding images, decoded with Pillow (torchvision's ``ImageFolder`` layout)."""

    name = "image_folder"
    suffixes = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
    kind = "image_folder"

    def sniff(self, path: str | os.PathLike[str]) -> bool:
        """A file: an image's magic bytes (PNG, JPEG, GIF, BMP, TIFF, WebP). A folder: some folder inside it
        holds a file with an image suffix (looks at no more than 1,000 entries)."""
        p = Path(path)
        if p.is_dir():
            try:
                for seen, child in enumerate(p.rglob("*")):
                    if seen >= 1000:
                        break
                    if child.suffix.lower() in self.suffixes and child.parent != p and child.is_file():
                        return True
            except OSError:
                return False
            return False
        head = _head(p, 16)
        return head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")

    def read(self, view: Any, /, *, split: Callable[[Any], dict[str, Any]], mixed_images: str = "convert") -> PreparedFiles:
        """Every image checked with Pillow, split by class, mode and size decided from every image (``mixed_images``:
        ``convert`` or ``error``): see :func:`heteroflow.components.data.readers.prepare_images`."""
        from heteroflow.components.data.readers import prepare_images

        return PreparedFiles(meta=prepare_images(view, split, mixed_images=mixed_images))

    def describe(self) -> str:
        return "one folder per class of images, checked and decoded with Pillow"


class TensorReader:
    """PyTorch files holding ``{"x": Tensor (n, ...), "y": Tensor (n,)}`` or a tuple ``(x, y)``."""

    name = "tensors"
    suffixes = (".pt", ".pth")
    kind = "tensors"

    def sniff(self, path: str | os.PathLike[str]) -> bool:
        """What :func:`torch.save` writes: a zip archive with a ``data.pkl`` member, or a legacy pickle."""
        names = _zip_names(path)
        if names:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in names)
        return _head(path, 2) in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")

    def read(self, view: Any, /, *, split: Callable[[Any], dict[str, Any]]) -> PreparedFiles:
        """Every file loaded with ``weights_only=True``, split: see :func:`heteroflow.components.data.readers.prepare_tensors`."""
        from heteroflow.components.data.readers import prepare_tensors, write_tensors

        meta, tensors = prepare_tensors(view, split)
        return PreparedFiles(meta=meta, write=lambda folder: write_tensors(folder, tensors))

    def describe(self) -> str:
        return "torch.save files holding tensors x (n, ...) and y (n,)"


BUILTIN_READERS: tuple[Reader, ...] = (CsvReader(), ParquetReader(), NpzReader(), ImageFolderReader(), TensorReader())


# --- the registry --------------------------------------------------------------------------------------------


def _entry_points(group: str) -> Sequence[Any]:
    from importlib.metadata import entry_points

    return tuple(entry_points(group=group))


def _check_reader(obj: Any, where: str) -> Reader:
    missing = [a for a in ("name", "suffixes", "kind", "sniff", "read", "describe") if not hasattr(obj, a)]
    if missing:
        raise TypeError(f"{where}: {obj!r} is not a reader: it lacks {', '.join(missing)} (see heteroflow.components.data.formats.Reader)")
    if not isinstance(obj.name, str) or not obj.name:
        raise TypeError(f"{where}: a reader's name must be a non-empty string, not {obj.name!r}")
    bad = [s for s in obj.suffixes if not (isinstance(s, str) and s.startswith(".") and s == s.lower())]
    if isinstance(obj.suffixes, str) or bad:
        raise TypeError(f"{where}: reader {obj.name!r}: suffixes must be a tuple of lower-case '.ext' strings, not {obj.suffixes!r}")
    return obj


class ReaderRegistry:
    """Readers by name and suffix: the built-ins (registered in code) and, loaded once on first use, the
    readers of the entry-point group ``group``.

    Args:
        builtins: readers registered at construction, in lookup order.
        group: entry-point group to load third-party readers from ("" for none).
    """

    def __init__(self, builtins: Iterable[Reader] = (), *, group: str = ENTRY_POINT_GROUP) -> None:
        self._readers: dict[str, Reader] = {}
        self._plugins: list[str] = []  # names registered from entry points (sniffed first)
        self._origins: dict[str, str] = {}
        self._suffix_cache: dict[str | None, tuple[Any, tuple[str, ...], frozenset[str]]] = {}
        self._group = group
        self._loaded = not group
        self._lock = threading.RLock()
        for reader in builtins:
            self.register(reader)

    def register(self, reader: Reader, *, replace: bool = False) -> Reader:
        """Add ``reader`` (after the readers registered before it); returns it.

        Raises:
            TypeError: not a reader (names what it lacks), or bad suffixes.
            ValueError: a reader of that name is registered already and ``replace`` is False.
        """
        _check_reader(reader, "register")
        with self._lock:
            if reader.name in self._readers and not replace:
                raise ValueError(
                    f"a reader named {reader.name!r} is registered already; registered: {', '.join(self._readers)}"
                    " (pass replace=True to replace it)"
                )
            self._readers[reader.name] = reader
            self._origins[reader.name] = "registered in code"
        return reader

    def unregister(self, name: str) -> None:
        """Remove the reader ``name`` (no error when there is none)."""
        with self._lock:
            self._readers.pop(name, None)
            self._origins.pop(name, None)
            if name in self._plugins:
                self._plugins.remove(name)

    def _load_entry_points(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            for ep in _entry_points(self._group):
                where = f"entry point {ep.name} = {ep.value} (group {self._group})"
                try:
                    obj = ep.load()
                    if isinstance(obj, type):
                        obj = obj()
                    elif callable(obj) and not hasattr(obj, "sniff"):
                        obj = obj()
                    for reader in obj if isinstance(obj, (list, tuple)) else [obj]:
                        _check_reader(reader, where)
                        if reader.name in self._readers:
                            _log.warning("%s: a reader named %r is registered already; keeping the first", where, reader.name)
                            continue
                        self._readers[reader.name] = reader
                        self._plugins.append(reader.name)
                        self._origins[reader.name] = f"entry point {ep.name} = {ep.value}"
                except Exception as exc:  # one broken plugin must not stop the built-in formats
                    _log.warning("%s: not loaded (%s: %s)", where, type(exc).__name__, exc)

    def readers(self) -> tuple[Reader, ...]:
        """Every registered reader: built-ins and code registrations in order, then entry-point readers."""
        self._load_entry_points()
        return tuple(self._readers.values())

    def get(self, name: str) -> Reader:
        """The reader called ``name``.

        Raises:
            UnknownFormat: no such reader (lists the registered ones).
        """
        self._load_entry_points()
        try:
            return self._readers[name]
        except KeyError:
            raise UnknownFormat(f"no reader is named {name!r}; {self.listing()}") from None

    def origin(self, name: str) -> str:
        """Where the reader ``name`` came from: ``registered in code`` (the built-ins) or ``entry point NAME =
        module:attr``; "" for no such reader."""
        self._load_entry_points()
        return self._origins.get(name, "")

    def _sniff_order(self) -> list[Reader]:
        readers = self.readers()
        plugins = [r for r in readers if r.name in self._plugins]
        return plugins + [r for r in readers if r.name not in self._plugins]

    def claiming(self, path: str | os.PathLike[str]) -> tuple[Reader, ...]:
        """The readers whose suffixes hold ``path``'s (lower-cased) suffix, in sniffing order."""
        suffix = os.path.splitext(os.fspath(path))[1].lower()
        return tuple(r for r in self._sniff_order() if suffix and suffix in r.suffixes)

    def find(self, path: str | os.PathLike[str], *, kind: str | None = None) -> Reader | None:
        """The reader for ``path`` by its suffix (of ``kind`` only, when given), or None. Where several claim
        the suffix, the first whose ``sniff`` says yes (entry-point readers first); none does: the first."""
        claims = [r for r in self.claiming(path) if kind is None or r.kind == kind]
        if len(claims) > 1:
            return next((r for r in claims if r.sniff(path)), claims[0])
        return claims[0] if claims else None

    def sniff(self, path: str | os.PathLike[str]) -> Reader | None:
        """The first reader (entry-point readers first) whose ``sniff`` recognises ``path``'s content, whatever
        its name; None when none does."""
        return next((r for r in self._sniff_order() if r.sniff(path)), None)

    def for_path(self, path: str | os.PathLike[str], *, kind: str | None = None) -> Reader:
        """:meth:`find`, or an error.

        Raises:
            UnknownFormat: no reader (of ``kind``) claims the suffix; the message names the suffix and lists the
                registered readers with their suffixes.
        """
        reader = self.find(path, kind=kind)
        if reader is None:
            suffix = os.path.splitext(os.fspath(path))[1].lower() or "(no suffix)"
            hint = self.misnamed([path])
            raise UnknownFormat(f"{path}: unsupported file type {suffix!r}; {hint + '; ' if hint else ''}{self.formats_help()}")
        return reader

    def suffixes(self, kind: str | None = None) -> tuple[str, ...]:
        """Every claimed suffix (of readers of ``kind``, when given), in registration order, without repeats."""
        readers = self.readers()
        key = (kind, tuple(id(r) for r in readers))
        cached = self._suffix_cache.get(kind)
        if cached is None or cached[0] != key:  # the listing asks once per file: keep the answer per set of readers
            out: dict[str, None] = {}
            for r in readers:
                if kind is None or r.kind == kind:
                    out.update(dict.fromkeys(r.suffixes))
            cached = self._suffix_cache[kind] = (key, tuple(out), frozenset(out))
        return cached[1]

    def kinds(self) -> tuple[str, ...]:
        """The data kinds of the registered readers, in registration order."""
        return tuple(dict.fromkeys(r.kind for r in self.readers()))

    def is_data_file(self, path: str, kind: str | None = None) -> bool:
        """Whether some reader (of ``kind``) claims ``path``'s suffix; by name only (the cache tier's listing
        asks this, :func:`heteroflow.cache.listing.data_formats`)."""
        self.suffixes(kind)
        return os.path.splitext(path)[1].lower() in self._suffix_cache[kind][2]

    def misnamed(self, paths: Iterable[str | os.PathLike[str]]) -> str:
        """What reads the local files no reader claims by suffix but one recognises by content (UCI's ``.data``
        tables, a ``.txt`` of tab-separated rows): ``iris.data is a table by its content (comma-separated, 5
        columns): rename it to iris.csv to read it``; "" when none is. Reads a few KiB of at most 20 files.
        """
        notes = []
        for path in list(paths)[:20]:
            p = Path(path)
            if self.find(p) is not None or not p.is_file():
                continue
            reader = self.sniff(p)
            if reader is None or not reader.suffixes:
                continue
            what = f"a {reader.kind.replace('_', ' ')} ({reader.name})"
            if reader.name == "csv":  # a first line with a comma is not yet a table (UCI's .names files)
                shape = _table_shape(p)
                if not shape:
                    continue
                what = f"a table ({shape})"
            notes.append(f"{p.name} is {what} by its content: rename it to {p.stem}{reader.suffixes[0]} to read it")
        return "; ".join(notes)

    def listing(self) -> str:
        """``registered readers: csv (.csv, .tsv), parquet (.parquet, .pq), ...``: for messages."""
        return "registered readers: " + ", ".join(f"{r.name} ({', '.join(r.suffixes)})" for r in self.readers())

    def describe_all(self) -> list[str]:
        """One line per reader: ``name  suffixes  description`` (for listings)."""
        return [f"{r.name}: {', '.join(r.suffixes)}: {r.describe()}" for r in self.readers()]

    def formats_help(self) -> str:
        """:data:`FORMATS_HELP` and :meth:`listing`: the tail of messages about files no reader reads."""
        return f"{FORMATS_HELP}; {self.listing()}"

    def readers_help(self) -> str:
        """:data:`READERS_HELP` and :meth:`listing`."""
        return f"{READERS_HELP}; {self.listing()}"

    def detect_kind(self, relative: Sequence[str]) -> str:
        """The data kind of a data set from its files' relative POSIX paths: the kind of the first registered
        reader (built-ins: tables, then image folders, then tensors) that claims some file's suffix.

        Raises:
            UnknownFormat: no reader claims any of the files; names the suffixes found and lists the readers.
        """
        suffixes = {os.path.splitext(r)[1].lower() for r in relative}
        for reader in self.readers():
            if suffixes.intersection(reader.suffixes):
                return reader.kind
        found = sorted(s or "(no suffix)" for s in suffixes)
        raise UnknownFormat(f"no reader reads {', '.join(found[:8])} files; {self.readers_help()}")

    def reader_of_kind(self, kind: str, relative: Sequence[str]) -> Reader:
        """The first registered reader of ``kind`` that claims one of ``relative``'s suffixes.

        Raises:
            UnknownFormat: none does.
        """
        suffixes = {os.path.splitext(r)[1].lower() for r in relative}
        for reader in self.readers():
            if reader.kind == kind and suffixes.intersection(reader.suffixes):
                return reader
        raise UnknownFormat(f"no {kind} reader reads these files; {self.readers_help()}")

    def reload(self) -> None:
        """Forget the entry-point readers; the next lookup loads the group again (after installing a plugin)."""
        with self._lock:
            for name in self._plugins:
                self._readers.pop(name, None)
                self._origins.pop(name, None)
            self._plugins.clear()
            self._loaded = not self._group


REGISTRY = ReaderRegistry(BUILTIN_READERS)
"""The process's readers: what preprocess, the listing's check and ``read_table`` ask."""


def register_reader(reader: Reader, *, replace: bool = False) -> Reader:
    """Register ``reader`` in :data:`REGISTRY` (see :meth:`ReaderRegistry.register`)."""
    return REGISTRY.register(reader, replace=replace)


def registered_readers() -> tuple[Reader, ...]:
    """Every reader of :data:`REGISTRY` (entry points loaded)."""
    return REGISTRY.readers()


def reader_for(path: str | os.PathLike[str], *, kind: str | None = None) -> Reader:
    """The reader of :data:`REGISTRY` for ``path`` (see :meth:`ReaderRegistry.for_path`).

    Raises:
        UnknownFormat: no reader claims the suffix (lists the registered readers).
    """
    return REGISTRY.for_path(path, kind=kind)

