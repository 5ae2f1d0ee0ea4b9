"""Opening a data set's source: local paths and fsspec URLs, their drivers, and what their errors mean.

Credentials are never a parameter here: each driver reads its own (s3fs: ``AWS_*`` environment variables and
``~/.aws``; gcsfs: ``GOOGLE_APPLICATION_CREDENTIALS``; adlfs: ``AZURE_STORAGE_*``; HTTP: ``~/.netrc``), and
fsspec adds its storage-option config (``FSSPEC_<PROTOCOL>_<KEY>`` environment variables and
``~/.config/fsspec/*.json``). Python callers may pass ``storage_options`` too.

:func:`source_errors` turns a driver's exceptions into heteroflow's, so the failure classifier can act:
not found (404), access denied (401/403, wrong credentials) and bad requests are permanent
(:class:`DatasetError`); unreachable hosts, resets and 5xx answers are transient (:class:`SourceUnavailable`,
:class:`SourceTimeout`). Every message is redacted (:func:`heteroflow.cache.redact.redact_url`) and the
driver's own exception is not chained (it may quote the URL with its credentials). A malformed driver option (a
value of the wrong type, e.g. ``FSSPEC_HTTP_CLIENT_KWARGS='{"auth": ...}'`` before it is converted) is a
:class:`SourceConfigError`, never "does not exist".

**Query strings (signed URLs).** An ``http(s)://`` URL's query (an Azure SAS ``?sv=...&sig=...``, an S3 or GCS
presigned ``?X-Amz-Signature=...``) belongs to the request, not to the path: :func:`filesystem_for` strips it
from the path and sends it with every request of that data set (the folder listing, each file's size and its
bytes), so it never becomes part of a file name, a cache path or a name on disk; messages redact it.

**Identity.** :func:`dataset_identity` is the one normal form of a source that every cache key is computed from:
a local path made absolute with symlinks resolved (``data/x``, ``./data/x/``, ``file://data/x`` and the resolved
absolute path are one data set, as ``heteroflow run --dataset`` resolves it); a URL without credentials, without
the signing parameters of its query (a re-signed URL is the same data set), without a trailing ``/``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from heteroflow.cache.errors import (
    DatasetError,
    HeteroflowError,
    SourceChanged,
    SourceConfigError,
    SourceError,
    SourceTimeout,
    SourceUnavailable,
)
from heteroflow.cache.redact import redact_url

__all__ = [
    "SIGNING_QUERY_PARAMS",
    "classify",
    "dataset_identity",
    "driver_package",
    "filesystem_for",
    "http_options",
    "is_local",
    "local_path",
    "normalize_source",
    "protocol_of",
    "source_errors",
    "split_query",
]

# Query parameters that sign a URL rather than name data (they change each time the URL is signed; matched
# case-insensitively). Sources: AWS "Authenticating Requests: Using Query Parameters (AWS Signature Version 4)"
# and the SigV2 query form; Google Cloud "Signed URLs" (V4, V2); Azure "Create a service SAS" / "Create an
# account SAS" (every SAS field); RFC 6750 section 2.3 (access_token).
SIGNING_QUERY_PARAMS = frozenset({
    "x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-expires", "x-amz-signedheaders", "x-amz-signature",
    "x-amz-security-token", "awsaccesskeyid", "expires", "signature",
    "x-goog-algorithm", "x-goog-credential", "x-goog-date", "x-goog-expires", "x-goog-signedheaders",
    "x-goog-signature", "googleaccessid",
    "sv", "ss", "srt", "sp", "se", "st", "spr", "sig", "sr", "si", "sdd", "ses", "skoid", "sktid", "skt", "ske",
    "sks", "skv", "saoid", "suoid", "scid", "rscc", "rscd", "rsce", "rscl", "rsct",
    "access_token", "token", "key",
})

# Packages that provide fsspec drivers fsspec itself only names in prose.
_PACKAGES = {
    "s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs",
    "adl": "adlfs", "http": "'heteroflow[http]' (aiohttp)", "https": "'heteroflow[http]' (aiohttp)", "hdfs": "pyarrow", "alluxiofs": "alluxiofs",
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


def split_query(uri: str) -> tuple[str, str]:
    """``(uri without its query and fragment, the raw query)`` for an ``http(s)://`` URL; other URIs (whose ``?``
    may be part of a path or key) come back whole, with an empty query.

    ``http://h/data/?sv=1&sig=S`` -> ``("http://h/data/", "sv=1&sig=S")``.
    """
    if protocol_of(uri) not in ("http", "https"):
        return uri, ""
    base, _, fragment_free = uri.partition("#")[0].partition("?")
    return base, fragment_free


def normalize_source(uri: str) -> str:
    """A source as heteroflow records it: a local path (or ``file://`` URL) as its absolute path with symlinks
    resolved (what ``heteroflow run --dataset`` passes on); any other URI unchanged."""
    if is_local(uri):
        return os.path.realpath(local_path(uri))
    return uri


def dataset_identity(uri: str) -> str:
    """The normal form every cache key is computed from (see the module docstring); never holds a credential.

    ``data/x`` -> ``/abs/path/data/x``; ``HTTP://alice:pw@Host/d/?sv=1&sig=S&format=csv`` -> ``http://host/d?format=csv``;
    ``s3://b/d/`` -> ``s3://b/d``.
    """
    if is_local(uri):
        return normalize_source(uri)
    if protocol_of(uri) in ("http", "https"):
        parts = urllib.parse.urlsplit(uri)
        host = parts.hostname or ""
        try:
            port = parts.port
        except ValueError:  # not a port number: the URL will fail when read; key it as written
            return redact_url(uri).rstrip("/") or uri
        netloc = host + (f":{port}" if port else "")
        kept = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
                if k.lower() not in SIGNING_QUERY_PARAMS]
        query = urllib.parse.urlencode(kept)
        path = parts.path.rstrip("/")
        return urllib.parse.urlunsplit((parts.scheme.lower(), netloc.lower(), path, query, "")) or uri
    return redact_url(uri).rstrip("/") or uri


def driver_package(protocol: str) -> str:
    """The pip package that provides the fsspec driver for ``protocol`` (best effort)."""
    return _PACKAGES.get(protocol, f"the fsspec driver for {protocol}://")


_AUTH_FORM = '{"auth": {"login": "USER", "password": "PASSWORD"}}'


def _auth_header(value: Any, where: str) -> str:
    """The ``Authorization`` header for an ``auth`` client option given as JSON can give it: ``{"login": U,
    "password": P}`` (aiohttp's ``BasicAuth`` field names; ``username``/``user`` accepted too) or ``[U, P]``."""
    import aiohttp

    if isinstance(value, tuple) and type(value).__name__ == "BasicAuth":  # aiohttp.BasicAuth, given in Python
        return value.encode()
    login = password = None
    if isinstance(value, Mapping):
        unknown = set(value) - {"login", "username", "user", "password", "encoding"}
        login = value.get("login", value.get("username", value.get("user")))
        password = value.get("password", "")
        if unknown:
            login = None
    elif isinstance(value, (list, tuple)) and 1 <= len(value) <= 2:
        login, password = value[0], (value[1] if len(value) == 2 else "")
    if not isinstance(login, str) or not isinstance(password, str) or ":" in login:
        raise SourceConfigError(
            f"{where}: auth must be a login and a password; valid: {_AUTH_FORM} (or [\"USER\", \"PASSWORD\"]), "
            "or a ~/.netrc entry for the host"
        )
    encoding = value.get("encoding", "latin1") if isinstance(value, Mapping) else "latin1"
    encode = getattr(aiohttp, "encode_basic_auth", None)  # aiohttp >= 3.14; BasicAuth is deprecated there
    return encode(login, password, encoding) if encode is not None else aiohttp.BasicAuth(login, password, encoding).encode()


def _client_timeout(value: Any, where: str) -> Any:
    import aiohttp

    if isinstance(value, aiohttp.ClientTimeout):
        return value
    fields = {"total", "connect", "sock_read", "sock_connect", "ceil_threshold"}
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return aiohttp.ClientTimeout(total=float(value))
    if isinstance(value, Mapping) and set(value) <= fields and all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0) for v in value.values()
    ):
        return aiohttp.ClientTimeout(**value)
    raise SourceConfigError(
        f"{where}: timeout must be seconds > 0 or an object of {', '.join(sorted(fields))} (seconds); got {value!r}"
    )


def http_options(protocol: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """fsspec's HTTP options with fsspec's configuration (``FSSPEC_HTTP_*`` / ``FSSPEC_HTTPS_*`` environment
    variables, ``~/.config/fsspec/*.json``) merged in, and the forms JSON can hold made into what aiohttp takes:
    ``client_kwargs.auth`` or ``auth`` (``{"login": U, "password": P}`` or ``[U, P]``) becomes an ``Authorization`` header
    (aiohttp wants a ``BasicAuth`` object there, and deprecates ``auth``); ``client_kwargs.timeout`` in seconds (or
    ``{"total": s, "connect": s, ...}``) becomes an ``aiohttp.ClientTimeout``.

    Raises:
        SourceConfigError: an ``auth`` or ``timeout`` of no valid form (names the option and a form that works).
    """
    import fsspec
    from fsspec.config import apply_config

    options = apply_config(fsspec.get_filesystem_class(protocol), dict(storage_options or {}))
    if "auth" in options:  # a request option (FSSPEC_HTTP_AUTH='{"login": ..}'): the same header, sent with every request
        header = _auth_header(options.pop("auth"), f"FSSPEC_{protocol.upper()}_AUTH (fsspec storage option auth)")
        options["auth"] = None  # fsspec merges its config again when it builds the filesystem: override it
        client = dict(options.get("client_kwargs") or {})
        client["headers"] = {**dict(client.get("headers") or {}), "Authorization": header}
        options["client_kwargs"] = client
    client = options.get("client_kwargs")
    where = f"FSSPEC_{protocol.upper()}_CLIENT_KWARGS (fsspec storage option client_kwargs)"
    if client is None:
        return options
    if not isinstance(client, Mapping):
        raise SourceConfigError(f"{where} must be a JSON object, e.g. {_AUTH_FORM}; got {type(client).__name__}")
    client = dict(client)
    if "auth" in client:
        header = _auth_header(client.pop("auth"), where)
        headers = dict(client.get("headers") or {})
        if not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = header
        client["headers"] = headers
    if "timeout" in client:
        client["timeout"] = _client_timeout(client["timeout"], where)
    options["client_kwargs"] = client
    return options


def filesystem_for(uri: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem and the path inside it for ``uri``.

    An ``http(s)://`` URL's query is taken off the path and sent with every request instead (see the module
    docstring); its options go through :func:`http_options`.

    Raises:
        DatasetError: the scheme is not an fsspec protocol, or its driver is not installed (names the package).
        SourceConfigError: a malformed driver option (see :func:`http_options`).
    """
    import fsspec

    protocol = protocol_of(uri)
    shown = redact_url(uri)
    options = dict(storage_options or {})
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
    if protocol in ("http", "https"):
        uri, query = split_query(uri)
        options = http_options(protocol, options)
        if query:
            # (name, value) pairs: aiohttp encodes them once (a string would be encoded again: %2B -> %252B)
            pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
            given = options.get("params")
            options["params"] = (list(given.items()) if isinstance(given, Mapping) else list(given or [])) + pairs
    try:
        return fsspec.core.url_to_fs(uri, **options)
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
    if status == 412 or names & {"FileExpired"}:
        return SourceChanged(f"data set {shown}: a file changed at the source while it was read ({detail}); retry "
                             "once the writer has finished")
    if status is not None and 400 <= status < 500:
        return DatasetError(f"data set {shown}: the source refused the request with {status} ({detail})")
    config = next((e for e in chain if isinstance(e, (TypeError, ValueError)) and not isinstance(e, HeteroflowError)), None)
    if config is not None:  # e.g. aiohttp's "BasicAuth() tuple is required" under fsspec's FileNotFoundError
        protocol = protocol_of(uri)
        return SourceConfigError(
            f"data set {shown}: the {protocol}:// driver rejected its options or the URL ({detail}); check the storage options "
            f"(FSSPEC_{protocol.upper()}_* environment variables, ~/.config/fsspec/*.json, storage_options)"
            + (f", e.g. FSSPEC_{protocol.upper()}_CLIENT_KWARGS='{_AUTH_FORM}'" if protocol in ("http", "https") else "")
        )
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
