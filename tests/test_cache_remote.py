"""Remote data sets (issue #11, the source side): folders over HTTP from Python's http.server on 127.0.0.1 and
S3 from moto's server mode (a local S3-compatible test server) on 127.0.0.1; credentials never written down;
404, 403 and empty listings are permanent errors, an unreachable host is transient; nothing half-cached."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from heteroflow.cache.dataset import open_dataset
from heteroflow.cache.errors import DatasetError, SourceUnavailable
from heteroflow.cache.prewarm import MANIFEST_NAME, check_source, dataset_cache_dir, prewarm_dataset
from heteroflow.cache.progress import report_progress
from heteroflow.cache.redact import redact_url
from servers import files_containing, s3_test_server, serve_folder

SECRET = "s3cretPW"


@pytest.fixture
def http_root(tmp_path: Path, digits_dir: Path) -> Iterator[tuple[Path, str, None]]:
    """The digits folder (and one without data) served on 127.0.0.1 by Python's http.server in a thread."""
    root = tmp_path / "www"
    shutil.copytree(digits_dir, root / "digits")
    (root / "notes").mkdir()
    (root / "notes" / "README.md").write_text("no data here")
    with serve_folder(root) as base:
        yield root, base, None


def _cached(result) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    return {p.relative_to(result.manifest.root).as_posix(): p.read_bytes() for p in result.manifest.local_paths()}


def _source(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("slash", ["/", ""], ids=["trailing-slash", "no-trailing-slash"])
def test_prewarm_an_http_folder(http_root, tmp_path: Path, slash: str):
    """Issue #11's input: `http://127.0.0.1:PORT/digits/` failed with IsADirectoryError; without the slash it
    "succeeded" with nothing. Both are the folder now, copied file by file."""
    root, base, _ = http_root
    url = f"{base}/digits{slash}"
    result = prewarm_dataset(url, str(tmp_path / "out"), cache_root=str(tmp_path / "tier"))
    assert _cached(result) == _source(root / "digits")
    assert result.files_copied == len(_source(root / "digits"))
    view = open_dataset(tmp_path / "out", verify="sha256")
    assert view.source_uri == url and len(view.data_files) == 4
    again = prewarm_dataset(url, str(tmp_path / "out2"), cache_root=str(tmp_path / "tier"))
    assert (again.files_copied, again.files_skipped) == (0, result.files_copied)
    assert again.version == result.version


def test_a_password_in_the_url_works_and_is_written_nowhere(http_root, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    root, _, _ = http_root
    with serve_folder(root, auth=("alice", SECRET)) as base:
        _password_run(root, base, tmp_path, caplog)


def _password_run(root: Path, base: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = base.replace("http://", f"http://alice:{SECRET}@") + "/digits/"
    seen = []
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG, logger="heteroflow"):
        warnings.simplefilter("always")
        with report_progress(seen.append):
            result = prewarm_dataset(url, str(tmp_path / "out"), cache_root=str(tmp_path / "tier"))
    assert _cached(result) == _source(root / "digits")
    [warning] = [w for w in caught if "carries credentials" in str(w.message)]
    assert "~/.netrc" in str(warning.message) and SECRET not in str(warning.message)
    # nothing heteroflow wrote or said holds the password
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "www" not in p.parts]
    assert any(p.name == MANIFEST_NAME for p in written)
    assert files_containing([tmp_path / "out", tmp_path / "tier"], SECRET) == []
    assert SECRET not in json.dumps(result.facts())
    assert SECRET not in caplog.text
    assert all(SECRET not in p.dataset for p in seen)
    assert result.manifest.source_uri == redact_url(url) == base.replace("http://", "http://***@") + "/digits/"
    assert SECRET not in str(dataset_cache_dir(url, str(tmp_path / "tier")))


@pytest.mark.filterwarnings("ignore:the data set URL")
def test_wrong_or_missing_credentials_are_permanent_and_leave_nothing(http_root, tmp_path: Path):
    root, _, _ = http_root
    with serve_folder(root, auth=("alice", SECRET)) as base:
        for url, status in ((base.replace("http://", "http://alice:wrongPW1@") + "/digits/", "403"), (f"{base}/digits/", "401")):
            with pytest.raises(DatasetError, match=rf"access to data set .* was denied .*{status}.*check the credentials") as err:
                prewarm_dataset(url, str(tmp_path / "out"), cache_root=str(tmp_path / "tier"))
            assert "wrongPW1" not in str(err.value)
    assert not (tmp_path / "tier").exists() or list((tmp_path / "tier").iterdir()) == []
    assert not (tmp_path / "out").exists()


def test_a_404_folder_is_permanent(http_root, tmp_path: Path):
    _, base, _ = http_root
    with pytest.raises(DatasetError, match=r"does not exist at the source .*404"):
        prewarm_dataset(f"{base}/nothing-here/", str(tmp_path / "out"), cache_root=str(tmp_path / "tier"))
    assert not (tmp_path / "tier").exists() or list((tmp_path / "tier").iterdir()) == []


def test_a_listing_without_data_files_is_refused_by_the_check_and_cached_by_prewarm(http_root, tmp_path: Path):
    _, base, _ = http_root
    with pytest.raises(DatasetError, match=r"has no \.csv, \.tsv, \.parquet or \.npz file \(found: README.md\)"):
        check_source(f"{base}/notes/")
    # Issue 14: the cache tier caches any files; readers judge formats
    result = prewarm_dataset(f"{base}/notes/", str(tmp_path / "out"), cache_root=str(tmp_path / "tier"))
    assert result.facts()["files"] == 1


def test_an_unreachable_host_is_transient(tmp_path: Path):
    with socket.socket() as s:  # a port on loopback that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://bob:{SECRET}@127.0.0.1:{port}/digits/"
    with pytest.warns(UserWarning, match="carries credentials"):
        with pytest.raises(SourceUnavailable, match=r"cannot reach the source .*check the host name, port and network") as err:
            prewarm_dataset(url, str(tmp_path / "out"), cache_root=str(tmp_path / "tier"))
    assert isinstance(err.value, ConnectionError)
    assert SECRET not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert not (tmp_path / "tier").exists() or list((tmp_path / "tier").iterdir()) == []


# --- S3 through moto's server mode: a local S3-compatible test server on 127.0.0.1 ------------------------


@pytest.fixture
def s3_endpoint(digits_dir: Path) -> Iterator[str]:
    """moto's server mode (a local S3-compatible test server) on 127.0.0.1 holding s3://datasets/digits/;
    credentials in the environment, as a Kubernetes Secret mounted as environment variables would give them."""
    with s3_test_server({"s3://datasets/digits": digits_dir}) as endpoint:
        yield endpoint


def test_prewarm_from_s3(s3_endpoint: str, digits_dir: Path, tmp_path: Path):
    url = "s3://datasets/digits/"
    check_source(url)
    result = prewarm_dataset(url, str(tmp_path / "out"), cache_root=str(tmp_path / "tier"))
    assert _cached(result) == _source(digits_dir)
    view = open_dataset(tmp_path / "out", verify="sha256")
    assert view.source_uri == url
    again = prewarm_dataset(url, str(tmp_path / "out2"), cache_root=str(tmp_path / "tier"))
    assert (again.files_copied, again.files_skipped) == (0, result.files_copied)
    # the same bytes from S3 and from the local folder are the same data set
    local = prewarm_dataset(str(digits_dir), str(tmp_path / "out3"), cache_root=str(tmp_path / "tier"))
    assert local.manifest.dataset_sha256 == result.manifest.dataset_sha256
    assert files_containing([tmp_path / "tier", tmp_path / "out"], "heteroflow-test-secret") == []


def test_s3_missing_prefix_and_missing_credentials(s3_endpoint: str, digits_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(DatasetError, match=r"s3://datasets/nothing/ does not exist"):
        prewarm_dataset("s3://datasets/nothing/", str(tmp_path / "out"), cache_root=str(tmp_path / "tier"))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(DatasetError, match=r"access to data set s3://datasets/digits/ was denied .*credentials"):
        check_source("s3://datasets/digits/")
    assert not (tmp_path / "tier").exists() or list((tmp_path / "tier").iterdir()) == []


def test_a_signed_url_is_redacted(tmp_path: Path):
    with socket.socket() as s:  # loopback, nothing listening: the request never leaves this machine
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = (f"http://127.0.0.1:{port}/bucket/d/x.csv?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2F2026"
           "&X-Amz-Signature=0123456789abcdef")
    with pytest.warns(UserWarning, match=r"X-Amz-Credential=\*\*\*&X-Amz-Signature=\*\*\*"):
        with pytest.raises(SourceUnavailable) as err:
            check_source(url)
    assert "0123456789abcdef" not in str(err.value) and "AKIAEXAMPLE" not in str(err.value)


def test_a_file_refused_mid_copy_leaves_nothing(tmp_path: Path, digits_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """A permanent error after the listing (one file answers 404 when fetched, and the fresh listing still lists it)
    keeps no staged file: nothing half-cached; a transient one keeps them for the resume (see test_cache.py). A file
    that is gone from the fresh listing too is a change of the source instead (test_cache_sources.py)."""
    import dataclasses

    root = tmp_path / "www"
    shutil.copytree(digits_dir, root / "digits")
    with serve_folder(root) as base:
        from heteroflow.cache import copying

        real = copying._copy_file

        def not_found(f, dest, open_src):  # type: ignore[no-untyped-def]
            if f.path == "digits-part-3.csv":  # listed, but every fetch of it answers 404
                return real(dataclasses.replace(f, source=f.source.replace("digits-part-3.csv", "no-such-file.csv")), dest, open_src)
            return real(f, dest, open_src)

        monkeypatch.setattr(copying, "_copy_file", not_found)
        with pytest.raises(DatasetError, match=r"does not exist at the source"):
            prewarm_dataset(f"{base}/digits/", str(tmp_path / "out"), cache_root=str(tmp_path / "tier"), copy_threads=1)
    assert not (tmp_path / "tier").exists() or list((tmp_path / "tier").iterdir()) == []
