"""Cache tiers behind one interface: a local directory and Alluxio (2.x and 3.x), each read through fsspec.

Pick one with a cache URI (``cache_root``, ``--cache``):

| cache URI | backend | the data set (source URI) | prewarm does |
|---|---|---|---|
| ``""``, a path, ``file://PATH`` | :class:`LocalDirectoryBackend` | a local folder or any fsspec URL | copies it into versioned local folders (:mod:`heteroflow.cache.prewarm`) |
| ``alluxio2://PROXY[:39999][?mount=DIR]`` | :class:`Alluxio2Backend` (PyPI ``alluxio`` 0.1.x, a client of the Alluxio 2.x REST proxy) | its path in Alluxio's namespace: ``alluxio:///datasets/d`` or ``/datasets/d`` | reads every file through the proxy with read type ``CACHE`` (2.x has no load call in that API: reading warms the workers), hashing it |
| ``alluxio3://WORKER[:28080][,WORKER2:PORT...][?mount=DIR]`` | :class:`Alluxio3Backend` (``alluxiofs``) | its under-storage URL as Alluxio 3.x names it (``s3://bucket/d``) | submits a load job for the folder, polls its progress, then verifies each file (fully cached, right size) and hashes it through the worker |

``mount=DIR`` is where the Alluxio namespace (2.x) or the data set (3.x) is mounted locally (Alluxio FUSE or a
Fluid Dataset's volume); with it, the manifest's ``root`` lets readers open the files as local paths.
``alluxio==1.0.0`` (the gRPC client) pins protobuf below 3.21 and cannot live beside kfp, hence 0.1.x.

Every backend lists the data set with the one listing (:func:`heteroflow.cache.listing.list_dataset`),
records each version's manifest in the local cache folder (so ``heteroflow cache status`` sees it), and skips
on a rerun the files whose source fingerprint is unchanged and that the cache still holds completely.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import hashlib
import io
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from heteroflow.cache.errors import (
    CacheIntegrityError,
    DatasetError,
    InvalidCacheOption,
    SourceTimeout,
    SourceUnavailable,
)
from heteroflow.cache.listing import DatasetListing, ListedFile, list_dataset
from heteroflow.cache.locations import local_cache_dir
from heteroflow.cache.manifest import MANIFEST_NAME, Manifest, ManifestEntry, dataset_digest
from heteroflow.cache.progress import ProgressCallback, Reporter, current_progress_callback
from heteroflow.cache.redact import redact_url, warn_if_credentials

__all__ = [
    "ALLUXIO2_DEFAULT_PORT",
    "ALLUXIO3_DEFAULT_PORT",
    "Alluxio2Backend",
    "Alluxio2ProxyFileSystem",
    "Alluxio3Backend",
    "CacheBackend",
    "LocalDirectoryBackend",
    "backend_for",
]

ALLUXIO2_DEFAULT_PORT = 39999  # Alluxio 2.x proxy web port (alluxio.proxy.web.port)
ALLUXIO3_DEFAULT_PORT = 28080  # Alluxio 3.x worker HTTP port (alluxio.worker.http.server.port)
_CHUNK = 1 << 20


class CacheBackend(Protocol):
    """A cache tier."""

    kind: str

    def prewarm(
        self,
        source_uri: str,
        *,
        workers: int = 0,
        verify: str = "stat",
        keep_versions: int = 3,
        lock_timeout_s: float = 3600.0,
        progress: ProgressCallback | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> Any:
        """Warm ``source_uri`` into the tier; return a :class:`heteroflow.cache.prewarm.PrewarmResult`."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class LocalDirectoryBackend:
    """The embedded default: versioned copies in a local (or shared, mounted) folder."""

    root: str = ""
    kind: str = "local"

    def prewarm(self, source_uri: str, *, workers: int = 0, verify: str = "stat", keep_versions: int = 3,
                lock_timeout_s: float = 3600.0, progress: ProgressCallback | None = None,
                storage_options: Mapping[str, Any] | None = None) -> Any:
        from heteroflow.cache.prewarm import dataset_cache_dir, prewarm

        return prewarm(source_uri, dataset_cache_dir(source_uri, self.root), verify=verify, workers=workers,
                       keep_versions=keep_versions, lock_timeout_s=lock_timeout_s, progress=progress,
                       storage_options=storage_options)


def backend_for(cache_root: str) -> CacheBackend:
    """The backend a cache URI names (see the module docstring).

    Raises:
        InvalidCacheOption: an unknown scheme, a malformed Alluxio address (the message lists the valid forms), or
            a ``timeout_s`` / ``poll_s`` that is not a number of seconds > 0.
    """
    forms = ("valid: empty (the local cache), a folder, file://FOLDER, alluxio2://PROXY_HOST[:PORT][?mount=DIR], "
             "alluxio3://WORKER_HOST[:PORT][,HOST:PORT...][?mount=DIR]")
    if not cache_root or "://" not in cache_root or cache_root.startswith("file://"):
        return LocalDirectoryBackend(cache_root)
    parts = urllib.parse.urlsplit(cache_root)
    query = dict(urllib.parse.parse_qsl(parts.query))
    unknown = set(query) - {"mount", "timeout_s", "poll_s"}
    if unknown:
        raise InvalidCacheOption(f"cache root {redact_url(cache_root)}: unknown option(s) {', '.join(sorted(unknown))}; "
                                 "valid: mount, timeout_s, poll_s")
    mount = query.get("mount", "")
    if parts.scheme == "alluxio2":
        host, port = _host_port(parts.netloc, ALLUXIO2_DEFAULT_PORT, cache_root, forms)
        return Alluxio2Backend(host=host, port=port, mount=mount, timeout_s=_seconds(query, "timeout_s", 60, cache_root))
    if parts.scheme == "alluxio3":
        workers = ",".join(f"{h}:{p}" for h, p in (_host_port(w, ALLUXIO3_DEFAULT_PORT, cache_root, forms)
                                                     for w in parts.netloc.split(",")))
        return Alluxio3Backend(workers=workers, mount=mount, timeout_s=_seconds(query, "timeout_s", 3600, cache_root),
                               poll_s=_seconds(query, "poll_s", 2, cache_root))
    raise InvalidCacheOption(f"cache root {redact_url(cache_root)}: unknown cache scheme {parts.scheme}://; {forms}")


def _seconds(query: Mapping[str, str], key: str, default: float, cache_root: str) -> float:
    """The cache URI's option ``key`` (seconds): a finite number > 0, ``default`` when not given.

    Raises:
        InvalidCacheOption: it is not such a number (``float('x')`` would raise a bare ValueError mid-prewarm).
    """
    import math

    text = query.get(key)
    if text is None:
        return float(default)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InvalidCacheOption(f"cache root {redact_url(cache_root)}: {key}={text!r} is not valid; valid: a number of "
                                 "seconds > 0")
    return value


def _host_port(netloc: str, default: int, cache_root: str, forms: str) -> tuple[str, int]:
    host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "")
    if not host or (port and not port.isdigit()):
        raise InvalidCacheOption(f"cache root {redact_url(cache_root)}: {netloc!r} is not HOST[:PORT]; {forms}")
    return host, int(port) if port else default


# --- shared by the Alluxio backends ------------------------------------------------------------------------


def _record_dir(location: str) -> Path:
    from heteroflow.cache.layout import cache_key

    return local_cache_dir() / "alluxio" / cache_key(location)


def _previous(location: str) -> Manifest | None:
    path = _record_dir(location) / MANIFEST_NAME
    try:
        return Manifest.load(path) if path.exists() else None
    except DatasetError:
        return None


def _publish_record(manifest: Manifest) -> Path:
    """Record an Alluxio version's manifest locally (``<local cache>/alluxio/<key>/versions/<v>/``)."""
    record = _record_dir(manifest.location)
    path = record / "versions" / manifest.version / MANIFEST_NAME
    manifest.write(path)
    manifest.write(record / MANIFEST_NAME)
    return path


def _hash_stream(read: Any, expected: int | None, path: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    n = 0
    while True:
        chunk = read(_CHUNK)
        if not chunk:
            break
        digest.update(chunk)
        n += len(chunk)
    if expected is not None and n != expected:
        raise CacheIntegrityError(f"read {n} bytes of {path!r} through the cache but the source lists {expected}; "
                                  "the source changed during the prewarm or the cache served a short read: rerun prewarm")
    return n, digest.hexdigest()


def _finish(listing: DatasetListing, entries: list[ManifestEntry], *, source: str, backend: str, location: str,
            root: str, copied: int, skipped: int, nbytes: int, started: float) -> Any:
    from heteroflow.cache.prewarm import PrewarmResult

    digest = dataset_digest(entries)
    manifest = Manifest(
        source_uri=redact_url(source), root=root, files=tuple(entries), dataset_sha256=digest, version=digest[:16],
        backend=backend, location=redact_url(location),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
    )
    path = _publish_record(manifest)
    return PrewarmResult(manifest=manifest, manifest_path=path, files_copied=copied, files_skipped=skipped,
                         bytes_copied=nbytes, seconds=time.perf_counter() - started, dataset_dir=path.parent.parent.parent,
                         skipped_entries=tuple(str(s) for s in listing.skipped))


def _workers(workers: int, n: int) -> int:
    from heteroflow.cache.copying import default_workers

    return workers or default_workers(remote=True, files=n)


# --- Alluxio 2.x: the REST proxy through alluxio-py 0.1.x ----------------------------------------------------


class _ProxyReader(io.RawIOBase):
    """A file of the Alluxio 2.x proxy, opened with a read type (``CACHE`` warms the workers)."""

    def __init__(self, client: Any, path: str, read_type: str) -> None:
        import alluxio

        self._client = client
        opt = alluxio.option.OpenFile(read_type=alluxio.wire.ReadType(read_type))
        self._file_id = client.open_file(path, opt)
        self._reader = client.read(self._file_id)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return self._reader.read(None if size is None or size < 0 else size) or b""

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._reader.close()
                self._client.close(self._file_id)
            finally:
                super().close()


def _alluxio2_errors(path: str) -> Any:
    import contextlib

    import alluxio

    @contextlib.contextmanager
    def mapped() -> Any:
        try:
            yield
        except alluxio.exceptions.NotFoundError:
            raise FileNotFoundError(path) from None
        except (alluxio.exceptions.PermissionDeniedError, alluxio.exceptions.UnauthenticatedError) as exc:
            raise PermissionError(f"{path}: {exc}") from None
        except (alluxio.exceptions.HTTPError, alluxio.exceptions.UnavailableError) as exc:
            raise ConnectionError(f"Alluxio proxy: {exc}") from None
        except alluxio.exceptions.DeadlineExceededError as exc:
            raise TimeoutError(f"Alluxio proxy: {exc}") from None

    return mapped()


class Alluxio2ProxyFileSystem:
    """A read-only fsspec filesystem over the Alluxio 2.x REST proxy (alluxio-py 0.1.x): ``ls``/``info`` from
    ``list-status``/``get-status``, ``open`` through ``open-file`` with a read type (default ``CACHE``).

    Registered as the ``alluxio2`` protocol: ``alluxio2://PROXY:39999/datasets/d``.
    """

    _cls: Any = None

    @classmethod
    def register(cls) -> Any:
        """Build the fsspec class (fsspec imported here, not at module import) and register it; return it."""
        if cls._cls is not None:
            return cls._cls
        import fsspec
        from fsspec.spec import AbstractFileSystem

        class _FS(AbstractFileSystem):
            protocol = ("alluxio2",)
            root_marker = "/"

            def __init__(self, host: str = "localhost", port: int = ALLUXIO2_DEFAULT_PORT, timeout_s: float = 60,
                         read_type: str = "CACHE", **kwargs: Any) -> None:
                super().__init__(**kwargs)
                import alluxio

                self.client = alluxio.Client(host, int(port), timeout=int(timeout_s))
                self.read_type = read_type

            @classmethod
            def _strip_protocol(cls, path: str) -> str:
                if isinstance(path, list):
                    return [cls._strip_protocol(p) for p in path]  # type: ignore[return-value]
                if path.startswith("alluxio2://"):
                    path = "/" + path[len("alluxio2://"):].split("/", 1)[-1] if "/" in path[len("alluxio2://"):] else "/"
                return "/" + path.strip("/") if path.strip("/") else "/"

            @staticmethod
            def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
                parts = urllib.parse.urlsplit(path)
                out: dict[str, Any] = {}
                if parts.hostname:
                    out["host"] = parts.hostname
                if parts.port:
                    out["port"] = parts.port
                return out

            def _to_info(self, fi: Any) -> dict[str, Any]:
                return {"name": fi.path, "size": fi.length, "type": "directory" if fi.folder else "file",
                        "mtime": fi.last_modification_time_ms, "in_memory_percentage": fi.in_memory_percentage}

            def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
                path = self._strip_protocol(path)
                with _alluxio2_errors(path):
                    infos = [self._to_info(fi) for fi in self.client.list_status(path)]
                return infos if detail else [i["name"] for i in infos]

            def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
                path = self._strip_protocol(path)
                with _alluxio2_errors(path):
                    return self._to_info(self.client.get_status(path))

            def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
                if mode != "rb":
                    raise PermissionError("the alluxio2 filesystem is read-only")
                path = self._strip_protocol(path)
                with _alluxio2_errors(path):
                    return _ProxyReader(self.client, path, self.read_type)

        fsspec.register_implementation("alluxio2", _FS, clobber=True)
        cls._cls = _FS
        return _FS


@dataclasses.dataclass(frozen=True, slots=True)
class Alluxio2Backend:
    """Alluxio 2.x through its REST proxy (see the module docstring)."""

    host: str
    port: int = ALLUXIO2_DEFAULT_PORT
    mount: str = ""
    timeout_s: float = 60.0
    kind: str = "alluxio2"

    def location_of(self, source_uri: str) -> tuple[str, str]:
        """(the data set's path in Alluxio, its ``alluxio2://`` URL).

        Raises:
            DatasetError: the source is not a path in Alluxio's namespace.
        """
        if source_uri.startswith("alluxio://"):
            path = "/" + urllib.parse.urlsplit(source_uri).path.strip("/")
        elif source_uri.startswith("/"):
            path = "/" + source_uri.strip("/")
        else:
            raise DatasetError(
                f"with an Alluxio 2.x cache, give the data set as its path in Alluxio's namespace (alluxio:///datasets/d "
                f"or /datasets/d), not {redact_url(source_uri)}; mount its under storage in Alluxio first "
                "(alluxio fs mount /datasets s3://bucket/datasets)"
            )
        return path, f"alluxio2://{self.host}:{self.port}{path}"

    def prewarm(self, source_uri: str, *, workers: int = 0, verify: str = "stat", keep_versions: int = 3,
                lock_timeout_s: float = 3600.0, progress: ProgressCallback | None = None,
                storage_options: Mapping[str, Any] | None = None) -> Any:
        """Read every file through the proxy with read type ``CACHE`` (warming Alluxio), hashing it; a file whose
        fingerprint is unchanged and that Alluxio holds 100% in memory is not read again unless ``verify`` is
        ``sha256``."""
        started = time.perf_counter()
        warn_if_credentials(source_uri)
        Alluxio2ProxyFileSystem.register()
        path, location = self.location_of(source_uri)
        report = Reporter(progress or current_progress_callback(), redact_url(source_uri))
        report.phase("listing", files_total=0, bytes_total=0)
        options = {"timeout_s": self.timeout_s, **dict(storage_options or {})}
        listing = list_dataset(location, storage_options=options, require_data=False)
        fs = _fsspec_instance(location, options)
        previous = _previous(location)
        before = {f.path: f for f in previous.files} if previous is not None else {}
        entries: list[ManifestEntry] = []
        to_read: list[ListedFile] = []
        for f in listing.files:
            old = before.get(f.path)
            if old is not None and old.source_key == f.key and verify != "sha256" and _in_memory(fs, f.source) >= 100:
                entries.append(old)
            else:
                to_read.append(f)
        skipped = len(entries)
        report.phase("copying", files_total=len(to_read), bytes_total=sum(f.bytes or 0 for f in to_read))

        def read(f: ListedFile) -> ManifestEntry:
            with fs.open(f.source, "rb") as fh:
                n, sha = _hash_stream(fh.read, f.bytes, f.path)
            return ManifestEntry(path=f.path, bytes=n, sha256=sha, source_key=f.key)

        nbytes = 0
        from heteroflow.cache.sources import source_errors

        with source_errors(source_uri), concurrent.futures.ThreadPoolExecutor(_workers(workers, len(to_read) or 1)) as pool:
            for entry in pool.map(read, to_read):
                entries.append(entry)
                nbytes += entry.bytes
                report.advance(1, entry.bytes)
        entries.sort(key=lambda e: e.path)
        root = str(Path(self.mount, path.lstrip("/"))) if self.mount else ""
        result = _finish(listing, entries, source=source_uri, backend=self.kind, location=location, root=root,
                         copied=len(to_read), skipped=skipped, nbytes=nbytes, started=started)
        report.phase("done", files_total=len(entries), bytes_total=result.manifest.total_bytes)
        return result


def _fsspec_instance(location: str, options: Mapping[str, Any]) -> Any:
    import fsspec

    fs, _ = fsspec.core.url_to_fs(location, **dict(options))
    return fs


def _in_memory(fs: Any, path: str) -> int:
    try:
        return int(fs.info(path).get("in_memory_percentage") or 0)
    except Exception:  # noqa: BLE001 - any failure means "read it again"
        return 0


# --- Alluxio 3.x: the worker REST API through alluxiofs ------------------------------------------------------


class _Alluxio3Lister:
    """The minimal fsspec surface :func:`list_dataset` needs, over ``AlluxioClient.listdir``/``get_file_status``
    (paths are under-storage URLs, as Alluxio 3.x names files)."""

    protocol = ("alluxio3",)

    def __init__(self, client: Any) -> None:
        self.client = client

    @staticmethod
    def _info(st: Any) -> dict[str, Any]:
        return {"name": st.ufs_path, "size": st.size, "type": "directory" if st.type == "directory" else "file",
                "mtime": st.mtime, "in_alluxio_percentage": st.in_alluxio_percentage, "content_hash": st.content_hash}

    def info(self, path: str) -> dict[str, Any]:
        try:
            return self._info(self.client.get_file_status(path))
        except FileNotFoundError:
            raise
        except Exception as exc:  # alluxiofs raises bare Exception with the worker's answer
            raise _alluxiofs_error(exc, path) from None

    def ls(self, path: str, detail: bool = True) -> list[Any]:
        try:
            infos = [self._info(st) for st in self.client.listdir(path)]
        except Exception as exc:  # noqa: BLE001
            raise _alluxiofs_error(exc, path) from None
        return infos if detail else [i["name"] for i in infos]

    def find(self, path: str, detail: bool = True, withdirs: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for info in self.ls(path):
            if info["type"] == "directory":
                out.update(self.find(info["name"]))
            else:
                out[info["name"]] = info
        return out


def _alluxiofs_error(exc: BaseException, path: str) -> BaseException:
    text = str(exc)
    if "404" in text or "not found" in text.lower() or "does not exist" in text.lower():
        return FileNotFoundError(f"{path}: {text}")
    if "403" in text or "Permission" in text:
        return PermissionError(f"{path}: {text}")
    if isinstance(exc, (ConnectionError, TimeoutError)) or "Connection" in text or "Max retries" in text:
        return ConnectionError(f"Alluxio worker: {text}")
    return exc


@dataclasses.dataclass(frozen=True, slots=True)
class Alluxio3Backend:
    """Alluxio 3.x through its workers' REST API with ``alluxiofs`` (see the module docstring)."""

    workers: str
    mount: str = ""
    timeout_s: float = 3600.0
    poll_s: float = 2.0
    kind: str = "alluxio3"

    def client(self) -> Any:
        """An ``alluxiofs`` client for the workers."""
        try:
            from alluxiofs.client import AlluxioClient
        except ImportError:
            raise DatasetError("the Alluxio 3.x cache needs alluxiofs; pip install heteroflow[alluxio]") from None
        import logging

        return AlluxioClient(worker_hosts=self.workers, logger=logging.getLogger("heteroflow.cache.alluxiofs"))

    def prewarm(self, source_uri: str, *, workers: int = 0, verify: str = "stat", keep_versions: int = 3,
                lock_timeout_s: float = 3600.0, progress: ProgressCallback | None = None,
                storage_options: Mapping[str, Any] | None = None) -> Any:
        """Submit a load job for the data set's folder, poll it to completion (``timeout_s``), check every file is
        100% in Alluxio with the listed size, and hash it through a worker. Unchanged files that are still fully
        cached are not hashed again (unless ``verify`` is ``sha256``)."""
        from heteroflow.cache.sources import source_errors

        started = time.perf_counter()
        warn_if_credentials(source_uri)
        if "://" not in source_uri:
            raise DatasetError(f"with an Alluxio 3.x cache, give the data set as its under-storage URL (s3://bucket/d, "
                               f"hdfs://..., file:///...), not {redact_url(source_uri)}")
        client = self.client()
        lister = _Alluxio3Lister(client)
        location = f"alluxio3://{self.workers}/{source_uri}"
        report = Reporter(progress or current_progress_callback(), redact_url(source_uri))
        report.phase("listing", files_total=0, bytes_total=0)
        root = source_uri.rstrip("/")
        with source_errors(source_uri):
            listing = list_dataset(source_uri, filesystem=(lister, root), require_data=False)
            previous = _previous(location)
            before = {f.path: f for f in previous.files} if previous is not None else {}
            pending = [f for f in listing.files if not (
                (old := before.get(f.path)) is not None and old.source_key == f.key and verify != "sha256"
                and _pct(lister, f.source) >= 100)]
            if pending:
                self._load(client, root, report, len(pending), sum(f.bytes or 0 for f in pending))
            report.phase("verifying", files_total=len(pending), bytes_total=sum(f.bytes or 0 for f in pending))

            def verify_one(f: ListedFile) -> ManifestEntry:
                pct = _pct(lister, f.source)
                if pct < 100:
                    raise CacheIntegrityError(f"{f.path!r} is {pct}% in Alluxio after the load job succeeded; the cache "
                                              "may be too small for the data set: grow the AlluxioRuntime tiered store")
                data = client.read_chunked(f.source)
                n, sha = _hash_stream(data.read, f.bytes, f.path)
                return ManifestEntry(path=f.path, bytes=n, sha256=sha, source_key=f.key)

            entries = [before[f.path] for f in listing.files if f not in pending]
            nbytes = 0
            with concurrent.futures.ThreadPoolExecutor(_workers(workers, len(pending) or 1)) as pool:
                for entry in pool.map(verify_one, pending):
                    entries.append(entry)
                    nbytes += entry.bytes
                    report.advance(1, entry.bytes)
        entries.sort(key=lambda e: e.path)
        mount_root = str(Path(self.mount)) if self.mount else ""
        result = _finish(listing, entries, source=source_uri, backend=self.kind, location=location, root=mount_root,
                         copied=len(pending), skipped=len(listing.files) - len(pending), nbytes=nbytes, started=started)
        report.phase("done", files_total=len(entries), bytes_total=result.manifest.total_bytes)
        return result

    def _load(self, client: Any, root: str, report: Reporter, files: int, nbytes: int) -> None:
        from alluxiofs.client.core import LoadState

        report.phase("loading", files_total=files, bytes_total=nbytes)
        try:
            submitted = client.submit_load(root)
        except Exception as exc:  # noqa: BLE001
            raise _alluxiofs_error(exc, root) from None
        if not submitted:
            raise SourceUnavailable(f"the Alluxio workers {self.workers} refused the load job for {redact_url(root)}; "
                                    "check the mount of that path in Alluxio, then retry")
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                state, content = client.load_progress(root)
            except Exception as exc:  # noqa: BLE001
                raise _alluxiofs_error(exc, root) from None
            if state == LoadState.SUCCEEDED:
                return
            if state in (LoadState.FAILED, LoadState.STOPPED):
                raise SourceUnavailable(f"the Alluxio load job for {redact_url(root)} ended {state.value}: "
                                        f"{redact_url(str(content))[:500]}")
            if time.monotonic() > deadline:
                with_stop = "stopped it" if _try(client.stop_load, root) else "could not stop it"
                raise SourceTimeout(f"the Alluxio load job for {redact_url(root)} did not finish in {self.timeout_s:.0f} s "
                                    f"({with_stop}); raise timeout_s in the cache URI, or grow the Alluxio cluster")
            time.sleep(self.poll_s)


def _pct(lister: _Alluxio3Lister, path: str) -> int:
    try:
        return int(lister.info(path).get("in_alluxio_percentage") or 0)
    except Exception:  # noqa: BLE001
        return 0


def _try(fn: Any, *args: Any) -> bool:
    try:
        return bool(fn(*args))
    except Exception:  # noqa: BLE001
        return False

