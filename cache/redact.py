"""Credentials in URLs: find them, warn about them, and remove them from any text heteroflow writes or prints.

A data set URL may carry a secret in two places:

- the user-info part, ``scheme://user:password@host/...`` (or a bare token, ``https://TOKEN@host/...``);
- a signing token in the query string: AWS SigV4 presigned URLs (``X-Amz-Signature``, ``X-Amz-Credential``,
  ``X-Amz-Security-Token``; SigV2: ``Signature``, ``AWSAccessKeyId``), Google Cloud Storage signed URLs
  (``X-Goog-Signature``, ``X-Goog-Credential``; V2: ``GoogleAccessId``, ``Signature``), Azure shared access
  signatures (``sig``), and the generic OAuth ``access_token`` / ``token`` / ``key``.

:func:`redact_url` replaces each such secret with ``***`` wherever it stands in a text (URLs inside longer
messages included) and also removes, anywhere in the text, every secret value it has seen in a URL before
(a password that a library prints without its URL around it). The cache tier passes every source URI, error
message, log line and progress label through it before writing or printing it.
"""

from __future__ import annotations

import logging
import re
import threading
import urllib.parse
import warnings

__all__ = ["REDACTED", "credential_kinds", "redact_url", "warn_if_credentials"]

REDACTED = "***"

# Query parameters that carry a secret (matched case-insensitively). Sources: AWS "Authenticating Requests:
# Using Query Parameters (AWS Signature Version 4)" and the SigV2 query form; Google Cloud "Signed URLs"
# (V4 and V2); Azure "Create a service SAS" (the `sig` field); RFC 6750 section 2.3 (`access_token`).
SECRET_QUERY_PARAMS = (
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    "awsaccesskeyid",
    "signature",
    "x-goog-signature",
    "x-goog-credential",
    "googleaccessid",
    "sig",
    "access_token",
    "token",
    "key",
)

_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<userinfo>[^/\s?#'\"<>]*)@")
_QUERY = re.compile(
    r"(?P<lead>[?&;](?:" + "|".join(re.escape(p) for p in SECRET_QUERY_PARAMS) + r")=)(?P<value>[^&#\s'\"<>]*)",
    re.IGNORECASE,
)
_seen_lock = threading.Lock()
_seen: set[str] = set()  # secret values met in URLs, removed from any later text too
_MIN_REMEMBERED = 4  # shorter values would blank ordinary words; they are still removed inside URLs


def _remember(value: str) -> None:
    for v in {value, urllib.parse.unquote(value)}:
        if len(v) >= _MIN_REMEMBERED and v != REDACTED:
            with _seen_lock:
                _seen.add(v)


def credential_kinds(uri: str) -> list[str]:
    """The kinds of secret ``uri`` carries: ``"user-info"`` and/or ``"query:<parameter>"`` (empty: none).

    Also remembers the secret values, so a later :func:`redact_url` removes them from any text.
    """
    kinds: list[str] = []
    for m in _USERINFO.finditer(uri):
        if m.group("userinfo"):
            kinds.append("user-info")
            user, sep, password = m.group("userinfo").partition(":")
            _remember(password if sep else user)  # a bare user-info is a token; a user name alone is not secret
    for m in _QUERY.finditer(uri):
        if m.group("value"):
            kinds.append("query:" + m.group("lead")[1:-1])
            _remember(m.group("value"))
    return kinds


def redact_url(text: str) -> str:
    """``text`` with every credential in a URL replaced by ``***``.

    ``http://alice:s3cret@host/d/`` -> ``http://***@host/d/``; ``https://b.s3.amazonaws.com/k?X-Amz-Signature=ab12``
    -> ``https://b.s3.amazonaws.com/k?X-Amz-Signature=***``; secrets remembered from earlier URLs are replaced
    anywhere in ``text``. Any string is accepted (a URL, a path, a whole error message); text without
    secrets comes back unchanged.
    """
    if not text:
        return text
    credential_kinds(text)  # remember what this text carries, before it is removed
    out = _USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@" if m.group("userinfo") else m.group(0), text)
    out = _QUERY.sub(lambda m: m.group("lead") + (REDACTED if m.group("value") else ""), out)
    with _seen_lock:
        seen = sorted(_seen, key=len, reverse=True)
    for secret in seen:
        if secret in out:
            out = out.replace(secret, REDACTED)
    return out


_SAFER_WAY = {
    "s3": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL) in the environment, ~/.aws/credentials, "
    "or fsspec storage options (FSSPEC_S3_KEY / FSSPEC_S3_SECRET)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS pointing at a service-account file, or fsspec storage options (token=...)",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS pointing at a service-account file, or fsspec storage options (token=...)",
    "az": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN in the environment, "
    "or fsspec storage options",
    "abfs": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN in the environment, "
    "or fsspec storage options",
    "http": "a ~/.netrc entry for the host, or FSSPEC_HTTP_CLIENT_KWARGS='{\"auth\": {\"login\": \"USER\", "
    "\"password\": \"PASSWORD\"}}' in the environment",
    "https": "a ~/.netrc entry for the host, or FSSPEC_HTTPS_CLIENT_KWARGS='{\"auth\": {\"login\": \"USER\", "
    "\"password\": \"PASSWORD\"}}' in the environment",
}


def warn_if_credentials(uri: str, *, logger: logging.Logger | None = None) -> bool:
    """Warn (a ``UserWarning``, and an INFO log line; both redacted) when ``uri`` carries credentials; say the safer way.

    Returns:
        True when ``uri`` carries credentials (it is still accepted).
    """
    kinds = credential_kinds(uri)
    if not kinds:
        return False
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    safer = _SAFER_WAY.get(scheme, "the storage driver's own environment variables or config file, or fsspec storage options")
    message = (
        f"the data set URL {redact_url(uri)} carries credentials ({', '.join(sorted(set(kinds)))}); heteroflow "
        f"redacts them in everything it writes, but anyone who sees the command line or the pipeline parameters can "
        f"read them. Safer: {safer}; on a cluster, a Kubernetes Secret mounted as environment variables"
    )
    warnings.warn(message, UserWarning, stacklevel=3)
    (logger or logging.getLogger("heteroflow.cache")).info(message)
    return True
