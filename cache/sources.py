"""Opening a data set's source: local paths and fsspec URLs, their drivers, and what their errors mean.

Credentials are never a parameter here: each driver reads its own (s3fs: ``AWS_*`` environment variables and
``~/.aws``; gcsfs: ``GOOGLE_APPLICATION_CREDENTIALS``; adlfs: ``AZURE_STORAGE_*``; HTTP: ``~/.netrc``), and
fsspec adds its storage-option config (``FSSPEC_<PROTOCOL>_<KEY>`` environment variables and
``~/.config/fsspec/*.json``). Python callers may pass ``storage_options`` too.

:func:`source_errors` turns a driver's exceptions into heteroflow's, so the failure classifier can act:
not found (404), access denied (401/403, wrong credentials) and bad requests are permanent
(:class:`DatasetError`); unreachable hosts, resets and 5xx answers are transient (:class:`SourceUnavailable`,
:class:`SourceTimeout`). Every message is redacted (:func:`heteroflow.cache.redact.redact_url`) and the
driver's own exception is not chained (it may quote the URL with its credentials).
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from heteroflow.cache.errors import DatasetError, HeteroflowError, SourceError, SourceTimeout, SourceUnavailable
from heteroflow.cache.redact import redact_url

__all__ = ["driver_package", "filesystem_for", "is_local", "local_path", "protocol_of", "source_errors"]

# Packages that provide fsspec drivers fsspec itself only names in prose.
_PACKAGES = {
    "s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs",
    "adl": "adlfs", "http": "aiohttp", "https": "aiohttp", "hdfs": "pyarrow", "alluxiofs": "alluxiofs",
    "sftp": "paramiko", "ssh": "paramiko", "hf": "huggingface_hub", "oci": "ocifs", "webhdfs": "requests",
}
_TRANSIENT_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EHOSTUNREACH,
                     errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTDOWN, errno.ETIMEDOUT, errno.EPIPE}


def protocol_of(uri: str) -> str:
    """``"s3"`` for ``s3://b/k``; ``"file"`` for a plain path."""
    return uri.split("://", 1)[0].lower() if "://" in uri else "file"


def is_local(uri: str) -> bool:
    """True for a plain path or a ``file://`` / ``local://`` URL."""
    return protocol_of(uri) in ("file", "local")


def local_path(uri: str) -> Path:
    """The local path of a plain path or ``file://`` URL, ``~`` expanded, made absolute."""
    for prefix in ("file://", "local://"):
        if uri.startswith(prefix):
            uri = uri[len(prefix):]
    return Path(uri).expanduser().absolute()


def driver_package(protocol: str) -> str:
    """The pip package that provides the fsspec driver for ``protocol`` (best effort)."""
    return _PACKAGES.get(protocol, f"the fsspec driver for {protocol}://")


def filesystem_for(uri: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem and the path inside it for ``uri``.

    Raises:
        DatasetError: the scheme is not an fsspec protocol, or its driver is not installed (names the package).
    """
    import fsspec

    protocol = protocol_of(uri)
    shown = redact_url(uri)
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError:
        pkg = driver_package(protocol)
        raise DatasetError(
            f"cannot read {shown}: the fsspec driver for {protocol}:// is not installed; pip install {pkg}"
            + (" (or heteroflow[s3])" if pkg == "s3fs" else "")
        ) from None
    except ValueError:
        raise DatasetError(
            f"cannot read {shown}: {protocol}:// is not a known fsspec protocol; give a local folder or an fsspec "
            "URL (file://, s3://, gs://, az://, http(s)://, memory://, ...)"
        ) from None
    try:
        return fsspec.core.url_to_fs(uri, **dict(storage_options or {}))
    except ImportError as exc:
        raise DatasetError(f"cannot read {shown}: {redact_url(str(exc))}; pip install {driver_package(protocol)}") from None
    except (ValueError, TypeError) as exc:
        raise DatasetError(f"cannot read {shown}: {redact_url(str(exc))}") from None


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _status(exc: BaseException) -> int | None:
    for attr in ("status", "status_code", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(value, int):
            return value
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes / contexts, outermost first (drivers wrap, e.g. fsspec's HTTP ``info`` raises
    ``FileNotFoundError`` from a refused connection)."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out and len(out) < 10:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


_TIMEOUT_NAMES = {"ServerTimeoutError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectTimeout", "ReadTimeout",
                  "ConnectionTimeoutError", "SocketTimeoutError"}
_CONNECTION_NAMES = {"ClientConnectorError", "ClientConnectionError", "ServerDisconnectedError", "ClientOSError",
                     "EndpointConnectionError", "ConnectionClosedError", "ClientPayloadError", "ProtocolError",
                     "ConnectionError", "ClientConnectorDNSError"}


def classify(exc: BaseException, uri: str) -> BaseException | None:
    """The heteroflow error for a driver's exception (None: leave it as it is)."""
    if isinstance(exc, HeteroflowError):
        return None
    chain = _chain(exc)
    shown = redact_url(uri)
    detail = redact_url("; ".join(dict.fromkeys(f"{type(e).__name__}: {e}" for e in chain)))
    creds = "check the credentials the storage driver reads (environment variables, config files or fsspec storage options)"
    for e in chain:  # a timeout or a connection failure anywhere in the chain: transient
        names = _names(e)
        if isinstance(e, TimeoutError) or names & _TIMEOUT_NAMES:
            return SourceTimeout(f"data set {shown}: the source did not answer in time ({detail}); check the host and the "
                                 "network, then retry")
        if isinstance(e, ConnectionError) or names & _CONNECTION_NAMES or (isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS):
            return SourceUnavailable(f"data set {shown}: cannot reach the source ({detail}); check the host name, port "
                                     "and network, then retry")
    statuses = [st for st in (_status(e) for e in chain) if st is not None]
    status = statuses[-1] if statuses else None  # the innermost status: the server's own answer
    names = set().union(*(_names(e) for e in chain))
    if status == 404:
        return DatasetError(f"data set {shown} does not exist at the source ({detail}); check the URL")
    if status in (401, 403) or names & {"NoCredentialsError", "PartialCredentialsError"} or any(
        "ClientError" in _names(e) and any(c in str(e) for c in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"))
        for e in chain
    ):
        return DatasetError(f"access to data set {shown} was denied ({detail}); {creds}")
    if status is not None and status >= 500:
        return SourceUnavailable(f"data set {shown}: the source answered {status} ({detail}); retry later")
    if status is not None and 400 <= status < 500:
        return DatasetError(f"data set {shown}: the source refused the request with {status} ({detail})")
    if any(isinstance(e, PermissionError) for e in chain):
        return DatasetError(f"access to data set {shown} was denied ({detail}); {creds}")
    if any(isinstance(e, FileNotFoundError) for e in chain):
        return DatasetError(f"data set {shown} does not exist at the source ({detail}); check the URL")
    return None


@contextlib.contextmanager
def source_errors(uri: str) -> Iterator[None]:
    """Translate the source driver's exceptions inside the block (see the module docstring); others pass."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, HeteroflowError):
            raise
        mapped = classify(exc, uri)
        if mapped is None:
            text = f"{type(exc).__name__}: {exc}"
            if redact_url(text) == text:
                raise
            mapped = SourceError(f"data set {redact_url(uri)}: {redact_url(text)}")
        raise mapped from None
