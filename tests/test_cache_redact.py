"""redact_url: credentials in URLs, anywhere in a text, are replaced by ***."""

from __future__ import annotations

import pytest

from heteroflow.cache.redact import credential_kinds, redact_url, warn_if_credentials


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://alice:s3cretPW@127.0.0.1:8765/digits/", "http://***@127.0.0.1:8765/digits/"),
        ("https://ghp_tokenOnly123@github.com/org/repo", "https://***@github.com/org/repo"),
        ("error: cannot GET http://u:p%40ss@host/x (timeout) and s3://k:v@b/y", "error: cannot GET http://***@host/x (timeout) and s3://***@b/y"),
        ("https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F1&X-Amz-Signature=ab12&X-Amz-Expires=60",
         "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=60"),
        ("https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=sa%40p&X-Goog-Signature=9f9f",
         "https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=***&X-Goog-Signature=***"),
        ("https://acct.blob.core.windows.net/c/d?sv=2022-11-02&ss=b&sig=AbC%2Bd%3D&se=2030-01-01", "https://acct.blob.core.windows.net/c/d?sv=2022-11-02&ss=b&sig=***&se=2030-01-01"),
        ("url='https://h/x?AWSAccessKeyId=AKIAOLD&Signature=zzz&Expires=1'", "url='https://h/x?AWSAccessKeyId=***&Signature=***&Expires=1'"),
        ("/home/alice/data/digits", "/home/alice/data/digits"),
        ("s3://bucket/prefix/", "s3://bucket/prefix/"),
        ("", ""),
    ],
    ids=["user-password", "bare-token", "inside-a-message", "aws-sigv4", "gcs-v4", "azure-sas", "aws-sigv2",
         "plain-path", "plain-url", "empty"],
)
def test_redact_url(text: str, expected: str):
    assert redact_url(text) == expected


def test_a_secret_seen_once_is_removed_everywhere_after():
    redact_url("http://carol:Tr0ub4dor@h/d/")
    assert redact_url("aiohttp said: BasicAuth(login='carol', password='Tr0ub4dor')") == (
        "aiohttp said: BasicAuth(login='carol', password='***')"
    )


def test_credential_kinds_and_warning():
    assert credential_kinds("http://127.0.0.1/d/") == []
    assert credential_kinds("http://a:b@h/") == ["user-info"]
    assert credential_kinds("https://h/x?sig=1&X-Amz-Signature=2") == ["query:sig", "query:X-Amz-Signature"]
    assert warn_if_credentials("s3://bucket/d") is False
    with pytest.warns(UserWarning, match=r"s3://\*\*\*@bucket/d carries credentials \(user-info\).*AWS_ACCESS_KEY_ID"):
        assert warn_if_credentials("s3://AKIA:SECRETKEY1@bucket/d") is True
