"""Exception root of heteroflow.

Every error heteroflow raises on purpose derives from :class:`HeteroflowError` and from the builtin that
matches it (``ValueError`` for bad input, ``RuntimeError`` for environment failures, ``ConnectionError`` /
``TimeoutError`` for a source that may answer later), so callers can catch either. The root lives in the
lowest layer (``heteroflow.cache``) because imports only go ``dags -> pipelines -> components -> cache``.

How the failure classifier should treat the cache tier's errors:

| error | builtin | class |
|---|---|---|
| :class:`DatasetError` (missing folder, 404, 403 / wrong credentials, no data files, unknown URL scheme, missing fsspec driver) | ``ValueError`` | permanent: no retry |
| :class:`CacheIntegrityError` (a cached file differs from its manifest) | ``RuntimeError`` | permanent (the message says how to repair) |
| :class:`CacheSpaceError` (not enough free disk for the copy) | ``RuntimeError`` | permanent until space is freed |
| :class:`CacheLockTimeout` (another prewarm of the data set held its lock too long) | ``TimeoutError`` | transient |
| :class:`InvalidCacheOption` (verify mode, workers, keep_versions, cache URI out of range) | ``ValueError`` | permanent |
| :class:`SourceError` (a source failure of no known kind whose message had to be redacted) | ``RuntimeError`` | permanent |
| :class:`SourceUnavailable` (host unreachable, connection reset) | ``ConnectionError`` | transient: retry with backoff |
| :class:`SourceTimeout` (the source did not answer in time) | ``TimeoutError`` (and ``ConnectionError``) | transient: retry with backoff |
| :class:`SourceChanged` (a source file kept changing while it was copied; HTTP 412 on a read) | ``ConnectionError`` | transient: retry when the writer is done |
| :class:`SourceConfigError` (the source driver's options are malformed: a wrong type or value) | ``ValueError`` | permanent |
"""

from __future__ import annotations

__all__ = [
    "CacheIntegrityError",
    "CacheLockTimeout",
    "CacheSpaceError",
    "DatasetError",
    "HeteroflowError",
    "InvalidCacheOption",
    "SourceChanged",
    "SourceConfigError",
    "SourceError",
    "SourceTimeout",
    "SourceUnavailable",
]


class HeteroflowError(Exception):
    """Root of all errors raised by heteroflow on purpose."""


class DatasetError(HeteroflowError, ValueError):
    """A data set folder or URI is missing, empty, unreadable with the given credentials, or holds no file in a
    supported format. Permanent: retrying the same input gives the same answer."""


class CacheIntegrityError(HeteroflowError, RuntimeError):
    """A cached file does not match its manifest (size or sha256)."""


class CacheSpaceError(HeteroflowError, RuntimeError):
    """The cache tier has not enough free space for a prewarm; the message gives bytes needed and free."""


class SourceUnavailable(HeteroflowError, ConnectionError):
    """The data set's source did not answer (unreachable host, refused or reset connection). Transient: a
    retry with backoff may succeed."""


class SourceTimeout(SourceUnavailable, TimeoutError):
    """The data set's source did not answer in time. Transient."""


class CacheLockTimeout(HeteroflowError, TimeoutError):
    """Another prewarm of the same data set held its lock longer than the caller would wait. Transient."""


class InvalidCacheOption(HeteroflowError, ValueError):
    """A cache-tier option is out of range (verify mode, workers, keep_versions, a cache URI); the message names it
    and lists the valid values."""


class SourceError(HeteroflowError, RuntimeError):
    """The source failed in a way heteroflow does not classify, and the driver's message carried a credential:
    it is raised with the message redacted instead of the driver's own exception."""


class SourceChanged(SourceUnavailable):
    """A source file changed while prewarm copied it (its size, mtime or ETag moved; an object store answered 412
    Precondition Failed to a read pinned to the listed ETag) and kept changing through the re-copies. Transient:
    a retry once the writer has finished copies the new content."""


class SourceConfigError(DatasetError):
    """The source driver's options (fsspec storage options, ``FSSPEC_<PROTOCOL>_<KEY>`` environment variables,
    ``~/.config/fsspec/*.json``) are malformed, e.g. a value of the wrong type. Permanent; the message names the
    option and a form that works."""
